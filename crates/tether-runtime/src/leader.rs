//! Leader election over a `coordination.k8s.io/v1` Lease, so that of several replicas exactly
//! one runs the controllers while the others stand by.
//!
//! The protocol is the one client-go's leader election uses, written over kube's `Api<Lease>`:
//!
//! - A candidate reads the Lease. It takes it when it does not exist (create), when nobody
//!   holds it (a holder released it), or when the holder's record has not changed for a whole
//!   lease duration *as measured on the candidate's own clock* since it first saw that record.
//!   Measuring locally makes clock skew between nodes irrelevant.
//! - Every write (take, renew, release) is a replace carrying the resourceVersion that was
//!   read, so of two candidates racing for the same record only one write succeeds; the other
//!   gets 409 Conflict and stays a candidate.
//! - The leader renews every retry period. It counts its renew deadline from the moment it
//!   *sent* its last successful renewal; when the deadline passes without another success it
//!   stops leading. A standby observed that renewal no earlier than it was sent and waits a
//!   full lease duration from then, and the renew deadline is shorter than the lease duration,
//!   so the old leader has given up before anyone else can take over.
//! - When the leader reads the Lease and finds another holder, it stops at once.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::{RuntimeError, Shutdown};

/// Timing of the election. The defaults are client-go's and kube-controller-manager's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseParams {
    /// How long a standby waits, after it last saw the Lease change, before taking it.
    pub lease_duration: Duration,
    /// How long the leader keeps leading without a successful renewal.
    pub renew_deadline: Duration,
    /// How often the leader renews and a standby retries.
    pub retry_period: Duration,
}

impl Default for LeaseParams {
    fn default() -> Self {
        Self {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

impl LeaseParams {
    /// Rejects timings under which two processes could both believe they lead, or under which
    /// a healthy leader could not renew in time.
    pub fn check(&self) -> Result<(), RuntimeError> {
        let err = |why: String| Err(RuntimeError::LeaseParams(why));
        if self.retry_period.is_zero() {
            return err("the retry period must be positive".to_owned());
        }
        if self.renew_deadline <= self.retry_period {
            return err(format!(
                "the renew deadline ({:?}) must be longer than the retry period ({:?})",
                self.renew_deadline, self.retry_period
            ));
        }
        if self.lease_duration <= self.renew_deadline {
            return err(format!(
                "the lease duration ({:?}) must be longer than the renew deadline ({:?})",
                self.lease_duration, self.renew_deadline
            ));
        }
        if self.lease_duration.subsec_nanos() != 0
            || self.lease_duration.as_secs() > i32::MAX as u64
        {
            return err(format!(
                "the lease duration ({:?}) must be whole seconds (the Lease stores seconds)",
                self.lease_duration
            ));
        }
        Ok(())
    }

    fn duration_seconds(&self) -> i32 {
        i32::try_from(self.lease_duration.as_secs()).unwrap_or(i32::MAX)
    }
}

/// This process's identity in the Lease: the pod name (`POD_NAME`, set from the downward API)
/// or else the host name, plus a random suffix so a restarted process never mistakes the
/// previous one's lease for its own.
pub fn default_identity() -> String {
    let base = std::env::var("POD_NAME")
        .ok()
        .filter(|n| !n.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
                .filter(|h| !h.is_empty())
        })
        .unwrap_or_else(|| "tether".to_owned());
    format!("{base}-{:08x}", rand::random::<u32>())
}

/// The last Lease record this process read, and when it first saw that version.
struct Observation {
    resource_version: Option<String>,
    seen_at: Instant,
}

struct Inner {
    api: Api<Lease>,
    namespace: String,
    name: String,
    identity: String,
    params: LeaseParams,
    observed: Mutex<Option<Observation>>,
    leader: Gauge,
}

/// What one attempt to take or renew the Lease found.
enum Attempt {
    /// We hold the Lease (created, taken or renewed).
    Leading,
    /// Someone else holds it and it has not expired for us.
    HeldBy(String),
    /// Someone wrote the Lease between our read and our write; try again.
    Conflict,
}

/// Competes for one Lease. Create one per process and call [`LeaderElector::acquire`].
#[derive(Clone)]
pub struct LeaderElector {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for LeaderElector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderElector")
            .field("namespace", &self.inner.namespace)
            .field("name", &self.inner.name)
            .field("identity", &self.inner.identity)
            .field("params", &self.inner.params)
            .finish_non_exhaustive()
    }
}

impl LeaderElector {
    /// An elector for the Lease `namespace/name` under `identity` (see [`default_identity`]).
    pub fn new(
        client: kube::Client,
        namespace: &str,
        name: &str,
        identity: impl Into<String>,
        params: LeaseParams,
    ) -> Result<Self, RuntimeError> {
        params.check()?;
        Ok(Self {
            inner: Arc::new(Inner {
                api: Api::namespaced(client, namespace),
                namespace: namespace.to_owned(),
                name: name.to_owned(),
                identity: identity.into(),
                params,
                observed: Mutex::new(None),
                leader: Gauge::default(),
            }),
        })
    }

    /// This elector's identity, as written into the Lease.
    pub fn identity(&self) -> &str {
        &self.inner.identity
    }

    /// Registers the `leader` gauge (1 while this process leads, else 0) in `registry`.
    pub fn register_metrics(&self, registry: &mut Registry) {
        registry.register(
            "leader",
            "Whether this process holds the leader lease (1) or not (0)",
            self.inner.leader.clone(),
        );
    }

    /// Whether this process leads right now (the gauge's value).
    pub fn is_leader(&self) -> bool {
        self.inner.leader.get() == 1
    }

    /// Waits until this process leads, retrying every retry period (API errors are logged and
    /// retried). Returns `None` if `shutdown` fires first.
    pub async fn acquire(&self, shutdown: &Shutdown) -> Option<Leadership> {
        let inner = &self.inner;
        loop {
            if shutdown.is_triggered() {
                return None;
            }
            let sent = Instant::now();
            let attempt =
                tokio::time::timeout(inner.params.renew_deadline, inner.try_acquire_or_renew())
                    .await;
            match attempt {
                Ok(Ok(Attempt::Leading)) => {
                    inner.leader.set(1);
                    tracing::info!(
                        lease = %format!("{}/{}", inner.namespace, inner.name),
                        identity = %inner.identity,
                        "became leader"
                    );
                    return Some(Leadership::start(inner.clone(), sent));
                }
                Ok(Ok(Attempt::HeldBy(holder))) => {
                    tracing::debug!(%holder, "lease held by another process; standing by");
                }
                Ok(Ok(Attempt::Conflict)) => {
                    tracing::debug!("lease changed while we tried to take it; retrying");
                }
                Ok(Err(e)) => {
                    tracing::warn!(
                        error = &e as &dyn std::error::Error,
                        "cannot read or take the leader lease; retrying"
                    );
                }
                Err(_) => tracing::warn!("leader lease request timed out; retrying"),
            }
            tokio::select! {
                () = tokio::time::sleep(jittered(inner.params.retry_period)) => {}
                () = shutdown.cancelled() => return None,
            }
        }
    }
}

/// The retry period stretched by up to 20 %, so standbys started together do not retry in
/// lockstep.
fn jittered(period: Duration) -> Duration {
    period.mul_f64(1.0 + rand::random::<f64>() * 0.2)
}

impl Inner {
    fn lease_ref(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// The instant we first saw this version of the Lease.
    fn observe(&self, lease: &Lease, now: Instant) -> Instant {
        let mut observed = self.observed.lock().unwrap_or_else(PoisonError::into_inner);
        let version = lease.metadata.resource_version.clone();
        match observed.as_ref() {
            Some(o) if o.resource_version == version => o.seen_at,
            _ => {
                *observed = Some(Observation {
                    resource_version: version,
                    seen_at: now,
                });
                now
            }
        }
    }

    async fn try_acquire_or_renew(&self) -> Result<Attempt, kube::Error> {
        let now = Instant::now();
        let wall = MicroTime(Timestamp::now());
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    namespace: Some(self.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.identity.clone()),
                    lease_duration_seconds: Some(self.params.duration_seconds()),
                    acquire_time: Some(wall.clone()),
                    renew_time: Some(wall),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(created) => {
                    self.observe(&created, now);
                    Ok(Attempt::Leading)
                }
                Err(kube::Error::Api(status)) if status.is_already_exists() => {
                    Ok(Attempt::Conflict)
                }
                Err(e) => Err(e),
            };
        };
        let seen_at = self.observe(&lease, now);
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
        if let Some(holder) = &holder
            && *holder != self.identity
        {
            let duration = spec
                .lease_duration_seconds
                .and_then(|s| u64::try_from(s).ok())
                .map_or(self.params.lease_duration, Duration::from_secs);
            if now < seen_at + duration {
                return Ok(Attempt::HeldBy(holder.clone()));
            }
            tracing::info!(%holder, "leader lease expired; taking it over");
        }
        if holder.as_deref() != Some(self.identity.as_str()) {
            spec.acquire_time = Some(wall.clone());
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
        }
        spec.holder_identity = Some(self.identity.clone());
        spec.renew_time = Some(wall);
        spec.lease_duration_seconds = Some(self.params.duration_seconds());
        // The resourceVersion read above travels with the object: a concurrent writer makes
        // this a 409.
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(updated) => {
                self.observe(&updated, now);
                Ok(Attempt::Leading)
            }
            Err(kube::Error::Api(status)) if status.is_conflict() => Ok(Attempt::Conflict),
            Err(e) => Err(e),
        }
    }

    /// Clears the holder if it is still us, so a standby takes over at its next retry.
    async fn release(&self) -> Result<(), RuntimeError> {
        let fail = |source| RuntimeError::Lease {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            source,
        };
        // A conflict means the Lease changed under us; read it again and decide anew.
        for _ in 0..3 {
            let Some(mut lease) = self.api.get_opt(&self.name).await.map_err(fail)? else {
                return Ok(());
            };
            let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
            if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
                return Ok(());
            }
            spec.holder_identity = None;
            spec.renew_time = Some(MicroTime(Timestamp::now()));
            spec.lease_duration_seconds = Some(1);
            match self
                .api
                .replace(&self.name, &PostParams::default(), &lease)
                .await
            {
                Ok(_) => return Ok(()),
                Err(kube::Error::Api(status)) if status.is_conflict() => continue,
                Err(e) => return Err(fail(e)),
            }
        }
        Ok(())
    }
}

/// Proof of leadership, renewed in the background until it is lost, released or dropped.
/// Dropping it stops the renewals without clearing the Lease (a standby then waits out the
/// lease duration); prefer [`Leadership::release`].
pub struct Leadership {
    inner: Arc<Inner>,
    lost: CancellationToken,
    stop: CancellationToken,
    reason: Arc<Mutex<Option<String>>>,
    task: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Leadership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leadership")
            .field("lease", &self.inner.lease_ref())
            .field("identity", &self.inner.identity)
            .field("lost", &self.lost.is_cancelled())
            .finish_non_exhaustive()
    }
}

impl Leadership {
    fn start(inner: Arc<Inner>, last_renewal: Instant) -> Self {
        let lost = CancellationToken::new();
        let stop = CancellationToken::new();
        let reason = Arc::new(Mutex::new(None));
        let task = tokio::spawn(renew_loop(
            inner.clone(),
            last_renewal,
            lost.clone(),
            stop.clone(),
            reason.clone(),
        ));
        Self {
            inner,
            lost,
            stop,
            reason,
            task: Some(task),
        }
    }

    /// Resolves once leadership is lost: renewals failed until the renew deadline, or another
    /// process holds the Lease. Stop every leader-only task when it does.
    pub async fn lost(&self) {
        self.lost.cancelled().await;
    }

    /// Whether leadership has been lost.
    pub fn is_lost(&self) -> bool {
        self.lost.is_cancelled()
    }

    /// Why leadership was lost, once it has been.
    pub fn lost_reason(&self) -> Option<String> {
        self.reason
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// A token cancelled when leadership is lost, for tasks that take one.
    pub fn lost_token(&self) -> CancellationToken {
        self.lost.clone()
    }

    /// Stops renewing and clears the holder, so a standby takes over at its next retry
    /// instead of waiting out the lease duration. Call it after the leader-only work stopped.
    pub async fn release(mut self) -> Result<(), RuntimeError> {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
        if self.lost.is_cancelled() {
            // The renew loop already reset the gauge, and the elector may lead again by now.
            return Ok(());
        }
        self.inner.leader.set(0);
        let result = self.inner.release().await;
        if result.is_ok() {
            tracing::info!(lease = %self.inner.lease_ref(), "released leadership");
        }
        result
    }
}

impl Drop for Leadership {
    fn drop(&mut self) {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            task.abort();
            // Only a leadership still held counts; a lost one already reset the gauge, and the
            // elector may lead again under a newer `Leadership`.
            if !self.lost.is_cancelled() {
                self.inner.leader.set(0);
            }
        }
    }
}

async fn renew_loop(
    inner: Arc<Inner>,
    mut last_renewal: Instant,
    lost: CancellationToken,
    stop: CancellationToken,
    reason: Arc<Mutex<Option<String>>>,
) {
    let params = inner.params;
    let lose = |why: String| {
        tracing::warn!(lease = %inner.lease_ref(), reason = %why, "lost leadership");
        *reason.lock().unwrap_or_else(PoisonError::into_inner) = Some(why);
        inner.leader.set(0);
        lost.cancel();
    };
    loop {
        let deadline = last_renewal + params.renew_deadline;
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(params.retry_period) => {}
            () = tokio::time::sleep_until(deadline) => {
                lose(format!("no successful renewal within the renew deadline ({:?})", params.renew_deadline));
                return;
            }
        }
        let sent = Instant::now();
        let attempt = tokio::select! {
            () = stop.cancelled() => return,
            attempt = tokio::time::timeout_at(deadline, inner.try_acquire_or_renew()) => attempt,
        };
        match attempt {
            Ok(Ok(Attempt::Leading)) => last_renewal = sent,
            Ok(Ok(Attempt::HeldBy(holder))) => {
                lose(format!("the lease is held by {holder}"));
                return;
            }
            Ok(Ok(Attempt::Conflict)) => {
                tracing::debug!("lease changed during renewal; retrying");
            }
            Ok(Err(e)) => {
                tracing::warn!(
                    error = &e as &dyn std::error::Error,
                    "cannot renew the leader lease; retrying until the renew deadline"
                );
            }
            Err(_) => {
                lose(format!(
                    "renewal still pending at the renew deadline ({:?})",
                    params.renew_deadline
                ));
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_client_gos() {
        let p = LeaseParams::default();
        assert_eq!(
            (p.lease_duration, p.renew_deadline, p.retry_period),
            (
                Duration::from_secs(15),
                Duration::from_secs(10),
                Duration::from_secs(2)
            )
        );
        p.check().expect("the defaults are safe");
    }

    #[test]
    fn unsafe_timings_are_refused() {
        let s = Duration::from_secs;
        let bad = [
            (s(10), s(10), s(2), "lease duration"),
            (s(15), s(2), s(2), "renew deadline"),
            (s(15), s(10), s(0), "retry period"),
            (Duration::from_millis(15_500), s(10), s(2), "whole seconds"),
        ];
        for (lease_duration, renew_deadline, retry_period, needle) in bad {
            let err = LeaseParams {
                lease_duration,
                renew_deadline,
                retry_period,
            }
            .check()
            .expect_err("unsafe");
            assert!(err.to_string().contains(needle), "{err}");
        }
    }

    #[test]
    fn identities_carry_a_random_suffix() {
        let (a, b) = (default_identity(), default_identity());
        assert_ne!(a, b);
        let (base_a, suffix) = a.rsplit_once('-').expect("suffix");
        assert_eq!(suffix.len(), 8);
        assert_eq!(Some(base_a), b.rsplit_once('-').map(|(base, _)| base));
    }
}
