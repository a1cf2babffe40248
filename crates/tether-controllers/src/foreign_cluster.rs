//! ForeignCluster reconciler: on a consumer it drives the authentication module (identity
//! issued with a token, renewed before it expires, revoked on unpeer) and checks the provider's
//! API server; on every cluster it summarises the peering in the status.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{Event, finalizer};
use tether_api::ClusterId;
use tether_api::authentication::{ResourceSlice, Tenant};
use tether_api::conditions::{self, Status, Time, types};
use tether_api::core::{
    ForeignCluster, ForeignClusterStatus, IdentityStatus, NetworkingStatus, ObjectRef, Phase,
    ProviderAccess, TenantNamespaces,
};
use tether_api::names::{self, finalizers, objects};
use tether_api::networking::{Configuration, Connection};
use tether_api::peering::TOKEN_KEY;

use crate::auth::client::{AuthClient, ClientError};
use crate::auth::csr::ClientKey;
use crate::auth::protocol::{self, IdentityRequest, RevocationRequest};
use crate::context::{Ctx, FIELD_MANAGER};
use crate::kubeconfig::Stored;
use crate::network::exchange::NetOutcome;
use crate::offloading::watched::Watched;
use crate::providers::{Access, ProviderClients};
use crate::{Error, namespaces};

pub mod status;

/// A failed first authentication: the generation tried, when, and how long to wait.
type Attempt = (Option<i64>, Instant, Duration);

/// The reconciler's state.
pub struct FcCtx {
    /// Shared controller state.
    pub ctx: Arc<Ctx>,
    /// Provider API clients, shared with the offloading module.
    pub clients: Arc<ProviderClients>,
    /// Watches of providers' tenant and twin namespaces, shared with the offloading module.
    pub watched: Arc<Watched>,
    /// Failed first authentications, so that status writes (which trigger reconciles) do not
    /// turn into a retry loop: by ForeignCluster, the generation tried, when, and how long to
    /// wait. A new generation (a new token from `tether peer`) retries at once.
    attempts: Mutex<HashMap<String, Attempt>>,
    /// The last successful ping of each provider: the identity's version and when. Passes
    /// that status writes and watched changes trigger in between reuse it, so the link
    /// carries one ping per interval.
    pings: Mutex<HashMap<String, (String, Instant)>>,
}

impl FcCtx {
    /// State for one controller.
    pub fn new(ctx: Arc<Ctx>) -> Self {
        Self {
            ctx,
            clients: Arc::new(ProviderClients::default()),
            watched: Arc::new(Watched::default()),
            attempts: Mutex::new(HashMap::new()),
            pings: Mutex::new(HashMap::new()),
        }
    }

    fn backing_off(&self, fc: &ForeignCluster) -> Option<Duration> {
        let name = fc.metadata.name.as_deref()?;
        let attempts = self.attempts.lock().unwrap_or_else(PoisonError::into_inner);
        let (generation, at, wait) = attempts.get(name)?;
        let elapsed = at.elapsed();
        (*generation == fc.metadata.generation && elapsed < *wait).then(|| *wait - elapsed)
    }

    fn record_attempt(&self, fc: &ForeignCluster, outcome: Option<&AuthOutcome>) {
        let Some(name) = fc.metadata.name.clone() else {
            return;
        };
        let mut attempts = self.attempts.lock().unwrap_or_else(PoisonError::into_inner);
        match outcome {
            Some(o) => {
                attempts.insert(name, (fc.metadata.generation, Instant::now(), o.requeue));
            }
            None => {
                attempts.remove(&name);
            }
        }
    }
}

/// How soon to look again at a peering whose tunnel is not up yet. A new tunnel connects a
/// few seconds after its gateways start, and `tether peer` waits for it, so a young peering is
/// re-read every half second (measured: re-reading every 2 s put peer times on 2 s steps,
/// p50 4.4 s); one that has been connecting for a while only every 2 s. `age_secs` is the
/// ForeignCluster's age, if known.
fn connecting_requeue(age_secs: Option<i64>) -> Duration {
    match age_secs {
        Some(age) if age < 30 => Duration::from_millis(500),
        _ => Duration::from_secs(2),
    }
}

fn unix_now() -> i64 {
    k8s_openapi::jiff::Timestamp::now().as_second()
}

fn time(secs: i64) -> Time {
    Time(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap_or_default())
}

fn now_time() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

/// Reconciles one ForeignCluster.
pub async fn reconcile(fc: Arc<ForeignCluster>, fctx: Arc<FcCtx>) -> Result<Action, Error> {
    let started = Instant::now();
    let api: Api<ForeignCluster> = Api::all(fctx.ctx.client.clone());
    let result = finalizer(&api, finalizers::PEERING, fc, |event| async {
        match event {
            Event::Apply(fc) => apply(&fc, &fctx).await,
            Event::Cleanup(fc) => cleanup(&fc, &fctx).await,
        }
    })
    .await
    .map_err(Error::finalizer("ForeignCluster"));
    // A status written from a stale view was refused: run again at once with fresh data.
    let result = match result {
        Err(e) if e.api_status() == Some(409) => Ok(Action::requeue(Duration::from_millis(100))),
        other => other,
    };
    fctx.ctx
        .metrics
        .reconciled("foreigncluster", result.as_ref().err(), started.elapsed());
    result
}

/// The outcome of one step of the authentication module, for the status.
struct AuthOutcome {
    phase: Phase,
    status: Status,
    reason: String,
    message: String,
    requeue: Duration,
}

impl AuthOutcome {
    fn failed(e: &ClientError) -> Self {
        let transient = e.is_transient();
        let retry = match e {
            ClientError::Refused {
                retry_after: Some(s),
                ..
            } => Duration::from_secs(*s),
            _ if transient => Duration::from_secs(5),
            _ => Duration::from_secs(300),
        };
        Self {
            phase: if transient {
                Phase::Authenticating
            } else {
                Phase::Failed
            },
            status: Status::False,
            reason: e.condition_reason().to_owned(),
            message: e.to_string(),
            requeue: retry,
        }
    }

    fn fatal(reason: &str, message: String) -> Self {
        Self {
            phase: Phase::Failed,
            status: Status::False,
            reason: reason.to_owned(),
            message,
            requeue: Duration::from_secs(300),
        }
    }
}

fn remote_id(fc: &ForeignCluster) -> Result<ClusterId, String> {
    let id = ClusterId::new(fc.spec.cluster_id.clone()).map_err(|e| e.to_string())?;
    if fc.metadata.name.as_deref() != Some(id.as_str()) {
        return Err(format!(
            "a ForeignCluster must be named after its spec.clusterID ({id}), not {:?}",
            fc.metadata.name.as_deref().unwrap_or_default()
        ));
    }
    Ok(id)
}

async fn apply(fc: &ForeignCluster, fctx: &FcCtx) -> Result<Action, Error> {
    // Status writes carry this copy's resourceVersion, so a reconcile working from a stale
    // cache cannot overwrite a newer status (the API server answers 409 and it runs again).
    let mut fc = fc.clone();
    let fc = &mut fc;
    let ctx = &fctx.ctx;
    let mut st = fc.status.clone().unwrap_or_default();
    let generation = fc.metadata.generation;
    let remote = match remote_id(fc) {
        Ok(id) if &id == ctx.cluster_id() => {
            let msg = format!(
                "this cluster's own ID is {id}: a cluster cannot peer with itself; if the remote \
                 cluster really has the same ID, reinstall one of them with another --cluster-id"
            );
            return finish(
                fc,
                fctx,
                st,
                AuthOutcome::fatal("ClusterIDConflict", msg),
                None,
                generation,
            )
            .await;
        }
        Ok(id) => id,
        Err(msg) => {
            return finish(
                fc,
                fctx,
                st,
                AuthOutcome::fatal("InvalidSpec", msg),
                None,
                generation,
            )
            .await;
        }
    };
    let tenant = Api::<Tenant>::all(ctx.client.clone())
        .get_opt(remote.as_str())
        .await
        .map_err(Error::kube(format!("reading Tenant {remote}")))?
        .filter(|t| t.metadata.deletion_timestamp.is_none());
    let consuming = fc.spec.provider.is_some() && fc.spec.modules.authentication.enabled;
    if fc.spec.provider.is_none() && tenant.is_none() && created_for_a_tenant(fc) {
        // Shown only because the remote was a tenant, which it no longer is.
        return delete_foreign_cluster(fctx, &remote).await;
    }
    st.role = Some(status::role(consuming, tenant.is_some()));
    let mut net = None;
    let outcome = if consuming {
        match consumer_step(fc, fctx, &remote, &mut st, &mut net).await {
            Ok(o) => o,
            // Shown in the status too, so `tether peer` and `kubectl get fc` say what is wrong
            // instead of a step that seems to hang.
            Err(e) => AuthOutcome {
                phase: Phase::Authenticating,
                status: Status::False,
                reason: "Error".into(),
                message: format!("{e}; retrying"),
                requeue: Duration::from_secs(5),
            },
        }
    } else {
        // Not (or no longer) consuming: an identity kept from before is revoked.
        drop_identity(fctx, &remote).await?;
        st.identity = None;
        st.networking = None;
        st.api_server_url = None;
        conditions_remove(&mut st, types::API_SERVER_REACHABLE);
        if tenant.is_some() {
            net = served_network(fctx, &remote).await?;
        }
        match &tenant {
            Some(t) => AuthOutcome {
                phase: Phase::Established,
                status: Status::True,
                reason: "TenantActive".into(),
                message: format!(
                    "{remote} consumes from this cluster as tenant {} (namespace {})",
                    names::consumer_username(&remote),
                    t.status
                        .as_ref()
                        .and_then(|s| s.namespace.clone())
                        .unwrap_or_default()
                ),
                requeue: Duration::from_secs(600),
            },
            None => AuthOutcome {
                phase: Phase::Pending,
                status: Status::Unknown,
                reason: "NotPeered".into(),
                message: "no peering in either direction yet; run `tether peer` on the consumer"
                    .to_owned(),
                requeue: Duration::from_secs(600),
            },
        }
    };
    st.tenant_namespace = Some(TenantNamespaces {
        local: Some(names::tenant_namespace(&remote)),
        remote: st
            .tenant_namespace
            .as_ref()
            .and_then(|t| t.remote.clone())
            .filter(|_| consuming),
    });
    offloading_condition(fctx, fc, &remote, &mut st, generation).await?;
    finish(fc, fctx, st, outcome, net, generation).await
}

/// The `Offloading` condition: this cluster's requests to `remote` and their virtual nodes.
/// Absent while the module is off and nothing was asked.
async fn offloading_condition(
    fctx: &FcCtx,
    fc: &ForeignCluster,
    remote: &ClusterId,
    st: &mut ForeignClusterStatus,
    generation: Option<i64>,
) -> Result<(), Error> {
    let ns = names::tenant_namespace(remote);
    let client = fctx.ctx.client.clone();
    let this = fctx.ctx.cluster_id().as_str();
    let slices: Vec<ResourceSlice> = match Api::<ResourceSlice>::namespaced(client.clone(), &ns)
        .list(&ListParams::default())
        .await
    {
        Ok(l) => l.items,
        Err(kube::Error::Api(e)) if e.code == 403 || e.code == 404 => Vec::new(),
        Err(e) => return Err(Error::kube(format!("listing ResourceSlices in {ns}"))(e)),
    }
    .into_iter()
    .filter(|s| s.spec.consumer_cluster_id == this && s.metadata.deletion_timestamp.is_none())
    .collect();
    if slices.is_empty() {
        if fc.spec.modules.offloading.enabled {
            conditions::set(
                &mut st.conditions,
                types::OFFLOADING,
                Status::Unknown,
                "NoRequest",
                format!(
                    "nothing asked of {remote} yet; `tether offload resources add {remote} --cpu N` asks"
                ),
                generation,
                now_time(),
            );
        } else {
            conditions::set(
                &mut st.conditions,
                types::OFFLOADING,
                Status::Unknown,
                "ModuleDisabled",
                "the offloading module is off for this peering",
                generation,
                now_time(),
            );
        }
        return Ok(());
    }
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client);
    let mut ready = Vec::new();
    let mut waiting = Vec::new();
    let mut refused = Vec::new();
    for slice in &slices {
        let name = slice.metadata.name.clone().unwrap_or_default();
        let answer = slice
            .status
            .as_ref()
            .and_then(|s| conditions::find(&s.conditions, types::RESOURCES));
        let granted = slice
            .status
            .as_ref()
            .is_some_and(|s| !s.resources.is_empty());
        if !granted {
            match answer {
                Some(c) if c.status == "False" => refused.push(format!("{name}: {}", c.message)),
                Some(c) => waiting.push(format!("{name}: {}", c.message)),
                None => waiting.push(format!("{name}: waiting for {remote} to answer")),
            }
            continue;
        }
        let node_ready = nodes
            .get_opt(&name)
            .await
            .map_err(Error::kube(format!("reading Node {name}")))?
            .and_then(|n| n.status)
            .and_then(|s| s.conditions)
            .and_then(|cs| cs.into_iter().find(|c| c.type_ == "Ready"));
        match node_ready {
            Some(c) if c.status == "True" => ready.push(name),
            Some(c) => waiting.push(format!(
                "virtual node {name} not Ready: {}",
                c.message.unwrap_or_default()
            )),
            None => waiting.push(format!("virtual node {name} not registered yet")),
        }
    }
    let (status, reason, message) = if !refused.is_empty() {
        (Status::False, "Refused", refused.join("; "))
    } else if !waiting.is_empty() {
        (Status::False, "VirtualNodesNotReady", waiting.join("; "))
    } else {
        (
            Status::True,
            "VirtualNodesReady",
            format!("virtual node(s) {} Ready", ready.join(", ")),
        )
    };
    conditions::set(
        &mut st.conditions,
        types::OFFLOADING,
        status,
        reason,
        message,
        generation,
        now_time(),
    );
    Ok(())
}

/// The networking state of a peering in which the remote consumes from here: what the
/// local gateway reports, or `None` while no gateway reports (the consumer did not ask for a
/// tunnel, or it is not running yet).
async fn served_network(fctx: &FcCtx, remote: &ClusterId) -> Result<Option<NetOutcome>, Error> {
    let ns = names::tenant_namespace(remote);
    let conn = Api::<Connection>::namespaced(fctx.ctx.client.clone(), &ns)
        .get_opt(objects::GATEWAY)
        .await;
    match conn {
        Ok(Some(c)) => Ok(Some(crate::network::exchange::connection_outcome(
            remote,
            Some(&c),
        ))),
        Ok(None) => Ok(None),
        // The tenant namespace is not there yet (or not bound): nothing is running.
        Err(kube::Error::Api(e)) if e.code == 403 || e.code == 404 => Ok(None),
        Err(e) => Err(Error::kube(format!(
            "reading Connection {ns}/{}",
            objects::GATEWAY
        ))(e)),
    }
}

/// Whether the controller created this ForeignCluster to show a tenant (the provider side),
/// rather than a user or `tether peer`.
fn created_for_a_tenant(fc: &ForeignCluster) -> bool {
    fc.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(tether_api::names::labels::MANAGED_BY))
        .is_some_and(|v| v == tether_api::names::labels::MANAGED_BY_VALUE)
}

async fn delete_foreign_cluster(fctx: &FcCtx, remote: &ClusterId) -> Result<Action, Error> {
    match Api::<ForeignCluster>::all(fctx.ctx.client.clone())
        .delete(remote.as_str(), &DeleteParams::default())
        .await
    {
        Ok(_) => Ok(Action::await_change()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(Action::await_change()),
        Err(e) => Err(Error::kube(format!("deleting ForeignCluster {remote}"))(e)),
    }
}

fn conditions_remove(st: &mut ForeignClusterStatus, type_: &str) {
    st.conditions.retain(|c| c.type_ != type_);
}

async fn finish(
    fc: &mut ForeignCluster,
    fctx: &FcCtx,
    mut st: ForeignClusterStatus,
    mut outcome: AuthOutcome,
    net: Option<NetOutcome>,
    generation: Option<i64>,
) -> Result<Action, Error> {
    let now = now_time();
    conditions::set(
        &mut st.conditions,
        types::AUTHENTICATION,
        outcome.status,
        &outcome.reason,
        outcome.message,
        generation,
        now.clone(),
    );
    match &net {
        Some(n) => {
            conditions::set(
                &mut st.conditions,
                types::NETWORKING,
                n.status,
                n.reason,
                n.message.clone(),
                generation,
                now.clone(),
            );
            // A peering is established when every module it uses is.
            if n.status != Status::True && outcome.phase == Phase::Established {
                outcome.phase = Phase::Connecting;
                let age = fc
                    .metadata
                    .creation_timestamp
                    .as_ref()
                    .map(|t| unix_now().saturating_sub(t.0.as_second()));
                outcome.requeue = outcome.requeue.min(connecting_requeue(age));
            }
        }
        None => {
            let message = if fc.spec.modules.networking.enabled && fc.spec.provider.is_some() {
                "waiting for authentication, which networking builds on".to_owned()
            } else if fc.spec.provider.is_none() {
                "no tunnel with this cluster is running".to_owned()
            } else {
                "the networking module is off for this peering".to_owned()
            };
            conditions::set(
                &mut st.conditions,
                types::NETWORKING,
                Status::Unknown,
                "ModuleDisabled",
                message,
                generation,
                now.clone(),
            );
        }
    }
    let previous = fc.status.as_ref().and_then(|s| s.phase);
    if previous != Some(outcome.phase) {
        tracing::info!(
            remote = %fc.spec.cluster_id,
            phase = outcome.phase.as_str(),
            reason = %outcome.reason,
            "peering phase changed"
        );
    }
    st.phase = Some(outcome.phase);
    if fc.status.as_ref() != Some(&st) {
        patch_status(fctx, fc, &st).await?;
    }
    Ok(Action::requeue(outcome.requeue))
}

async fn patch_status(
    fctx: &FcCtx,
    fc: &mut ForeignCluster,
    st: &ForeignClusterStatus,
) -> Result<(), Error> {
    let name = fc.metadata.name.clone().unwrap_or_default();
    let mut next = fc.clone();
    next.status = Some(st.clone());
    let written = Api::<ForeignCluster>::all(fctx.ctx.client.clone())
        .replace_status(&name, &PostParams::default(), &next)
        .await
        .map_err(Error::kube(format!(
            "updating ForeignCluster {name} status"
        )))?;
    fc.metadata.resource_version = written.metadata.resource_version;
    fc.status = written.status;
    Ok(())
}

/// Sets the phase shown while a long step runs, so that `tether peer` can report it.
async fn show_phase(
    fctx: &FcCtx,
    fc: &mut ForeignCluster,
    st: &mut ForeignClusterStatus,
    phase: Phase,
    message: &str,
) -> Result<(), Error> {
    if st.phase == Some(phase)
        && conditions::find(&st.conditions, types::AUTHENTICATION)
            .is_some_and(|c| c.message == message)
    {
        return Ok(());
    }
    st.phase = Some(phase);
    conditions::set(
        &mut st.conditions,
        types::AUTHENTICATION,
        Status::False,
        "InProgress",
        message,
        fc.metadata.generation,
        now_time(),
    );
    patch_status(fctx, fc, st).await
}

fn kubeconfig_api(fctx: &FcCtx, remote: &ClusterId) -> Api<Secret> {
    Api::namespaced(fctx.ctx.client.clone(), &names::tenant_namespace(remote))
}

async fn namespace_terminating(fctx: &FcCtx, name: &str) -> Result<bool, Error> {
    let ns = Api::<Namespace>::all(fctx.ctx.client.clone())
        .get_opt(name)
        .await
        .map_err(Error::kube(format!("reading namespace {name}")))?;
    Ok(ns.is_some_and(|n| n.metadata.deletion_timestamp.is_some()))
}

/// Whether the tenant namespace of `remote` is gone or terminating (then the controller's
/// access to it, bound inside it, is gone too).
async fn tenant_namespace_gone(fctx: &FcCtx, remote: &ClusterId) -> Result<bool, Error> {
    let name = names::tenant_namespace(remote);
    let ns = Api::<Namespace>::all(fctx.ctx.client.clone())
        .get_opt(&name)
        .await
        .map_err(Error::kube(format!("reading namespace {name}")))?;
    Ok(ns.is_none_or(|n| n.metadata.deletion_timestamp.is_some()))
}

async fn stored_identity(
    fctx: &FcCtx,
    remote: &ClusterId,
) -> Result<Option<(Stored, String)>, Error> {
    let context = format!("reading the kubeconfig Secret for {remote}");
    let secret = match kubeconfig_api(fctx, remote)
        .get_opt(objects::PROVIDER_KUBECONFIG_SECRET)
        .await
    {
        Ok(s) => s,
        // The controller's access to a tenant namespace is bound inside it, so it ends when
        // the namespace goes: a namespace that is gone or terminating holds no usable identity.
        Err(kube::Error::Api(e)) if e.code == 403 => {
            if tenant_namespace_gone(fctx, remote).await? {
                return Ok(None);
            }
            return Err(Error::kube(context)(kube::Error::Api(e)));
        }
        Err(e) => return Err(Error::kube(context)(e)),
    };
    Ok(secret.and_then(|s| {
        let version = s.metadata.resource_version.clone().unwrap_or_default();
        Stored::from_secret(&s).map(|st| (st, version))
    }))
}

async fn consumer_step(
    fc: &mut ForeignCluster,
    fctx: &FcCtx,
    remote: &ClusterId,
    st: &mut ForeignClusterStatus,
    net: &mut Option<NetOutcome>,
) -> Result<AuthOutcome, Error> {
    let ctx = &fctx.ctx;
    let Some(access) = fc.spec.provider.as_ref() else {
        return Ok(AuthOutcome::fatal(
            "InvalidSpec",
            "spec.provider is missing".into(),
        ));
    };
    let client = match AuthClient::new(&access.auth_url, &access.ca_fingerprint) {
        Ok(c) => c,
        Err(e) => return Ok(AuthOutcome::failed(&e)),
    };
    // The tenant namespace is created only once an identity is in hand, so a failed first
    // authentication leaves nothing here; one still terminating from an earlier peering is
    // waited for.
    let local_ns = names::tenant_namespace(remote);
    if namespace_terminating(fctx, &local_ns).await? {
        return Ok(AuthOutcome {
            phase: Phase::Authenticating,
            status: Status::False,
            reason: "NamespaceTerminating".into(),
            message: format!(
                "waiting for namespace {local_ns}, left by an earlier peering, to be deleted"
            ),
            requeue: Duration::from_secs(2),
        });
    }
    let now = unix_now();
    let stored = stored_identity(fctx, remote).await?;
    let (stored, version) = match stored {
        Some((s, v)) if now < s.renew_at => (s, v),
        Some((old, old_version)) => {
            // Renewal: no token needed, the signature is the credential.
            match issue(fctx, &client, remote, None).await {
                Ok((issued, key)) => {
                    let auth = (access.auth_url.as_str(), access.ca_fingerprint.as_str());
                    let s = Stored::new(remote, &issued, &key.key_pem, now, old.renewals + 1, auth);
                    let s = placed(fctx, access, remote, s).await?;
                    let v = write_identity(fctx, remote, &local_ns, &s).await?;
                    tracing::info!(provider = %remote, renewals = s.renewals, expires_at = s.expires_at, "identity renewed");
                    (s, v)
                }
                Err(e) if now < old.expires_at => {
                    tracing::warn!(provider = %remote, error = %e, "renewing the identity failed; the current one is still valid");
                    st.identity = Some(identity_status(&old, &local_ns));
                    let api_ok = ping(fctx, remote, &old, &old_version, st).await;
                    return Ok(AuthOutcome {
                        phase: if api_ok {
                            Phase::Established
                        } else {
                            Phase::Authenticating
                        },
                        status: Status::True,
                        reason: "RenewalFailing".into(),
                        message: format!(
                            "renewing the identity failed ({e}); the current one stays valid until {} and renewal is retried",
                            time(old.expires_at).0
                        ),
                        requeue: Duration::from_secs(10),
                    });
                }
                Err(e) => {
                    let mut o = AuthOutcome::failed(&e);
                    o.message =
                        format!("the identity expired and renewing it failed: {}", o.message);
                    return Ok(o);
                }
            }
        }
        None => {
            if let Some(wait) = fctx.backing_off(fc)
                && let Some(c) = conditions::find(&st.conditions, types::AUTHENTICATION)
            {
                return Ok(AuthOutcome {
                    phase: st.phase.unwrap_or(Phase::Authenticating),
                    status: Status::False,
                    reason: c.reason.clone(),
                    message: c.message.clone(),
                    requeue: wait,
                });
            }
            let outcome = first_identity(fc, fctx, remote, st, &client, &local_ns, now).await?;
            match outcome {
                Ok(pair) => {
                    fctx.record_attempt(fc, None);
                    pair
                }
                Err(o) => {
                    fctx.record_attempt(fc, Some(&o));
                    return Ok(o);
                }
            }
        }
    };
    st.identity = Some(identity_status(&stored, &local_ns));
    st.api_server_url = Some(stored.api_server.clone());
    if let Some(t) = st.tenant_namespace.as_mut() {
        t.remote = Some(stored.remote_namespace.clone());
    } else {
        st.tenant_namespace = Some(TenantNamespaces {
            local: Some(local_ns.clone()),
            remote: Some(stored.remote_namespace.clone()),
        });
    }
    let api_ok = ping(fctx, remote, &stored, &version, st).await;
    if api_ok && fc.spec.modules.networking.enabled {
        *net = Some(network_step(fctx, fc, remote, &stored, &version, &mut st.networking).await);
    } else if !fc.spec.modules.networking.enabled {
        st.networking = None;
    }
    let until_renewal = u64::try_from(stored.renew_at - unix_now())
        .unwrap_or(0)
        .max(1);
    Ok(AuthOutcome {
        phase: if api_ok {
            Phase::Established
        } else {
            Phase::Authenticating
        },
        status: Status::True,
        reason: "IdentityIssued".into(),
        message: format!(
            "{remote} issued identity {} in namespace {}; valid until {}, renewed at {}",
            stored.username,
            stored.remote_namespace,
            time(stored.expires_at).0,
            time(stored.renew_at).0
        ),
        requeue: Duration::from_secs(until_renewal).min(ctx.settings.ping_interval),
    })
}

/// One pass of the networking module with the provider's API server; its errors become the
/// condition's message, since authentication itself is fine. `record` is
/// `status.networking`, which keeps the side that listens across passes and restarts.
async fn network_step(
    fctx: &FcCtx,
    fc: &ForeignCluster,
    remote: &ClusterId,
    s: &Stored,
    version: &str,
    record: &mut Option<NetworkingStatus>,
) -> NetOutcome {
    let provider = match fctx
        .clients
        .clients(remote.as_str(), version, &s.kubeconfig)
        .await
    {
        Ok(c) => c,
        Err(e) => {
            return NetOutcome {
                status: Status::False,
                reason: "Error",
                message: e,
            };
        }
    };
    let in_band = fc.spec.provider.as_ref().is_some_and(|p| p.in_band);
    let access = Access {
        client: provider.api,
        upgrades: provider.upgrades,
        namespace: s.remote_namespace.clone(),
        version: version.to_owned(),
    };
    match crate::network::exchange::consumer_step(
        &crate::network::exchange::Consumer::of(&fctx.ctx, in_band),
        crate::providers::Remote::Watched {
            watched: &fctx.watched,
            id: remote,
            access: &access,
        },
        remote,
        &s.remote_namespace,
        &fc.spec.networking,
        record,
    )
    .await
    {
        Ok(o) => o,
        Err(e) => NetOutcome {
            status: Status::False,
            reason: "Error",
            message: format!("{e}; retrying"),
        },
    }
}

fn identity_status(s: &Stored, local_ns: &str) -> IdentityStatus {
    IdentityStatus {
        secret_ref: ObjectRef {
            namespace: local_ns.to_owned(),
            name: objects::PROVIDER_KUBECONFIG_SECRET.to_owned(),
        },
        username: s.username.clone(),
        expires_at: time(s.expires_at),
        renew_at: time(s.renew_at),
        renewals: s.renewals,
    }
}

/// A label no object carries: the ping's list proves the identity is accepted and allowed
/// without sending any object back.
const PING_SELECTOR: &str = "tether.dev/ping-matches-nothing";

/// A pass this close to a full ping interval after the last ping pings again: the pass the
/// interval's requeue brings must not find the last answer still fresh.
const PING_SLACK: Duration = Duration::from_secs(1);

/// Checks the provider's API server with the identity: lists ResourceSlices in the tenant
/// namespace, which the tenant role allows, with a selector no object matches, so that the
/// answer (every ping interval, over the link) carries no object. Sets APIServerReachable.
/// A pass within a ping interval of the last successful ping reuses its answer.
async fn ping(
    fctx: &FcCtx,
    remote: &ClusterId,
    s: &Stored,
    version: &str,
    st: &mut ForeignClusterStatus,
) -> bool {
    let fresh = fctx.ctx.settings.ping_interval.saturating_sub(PING_SLACK);
    let reachable = conditions::find(&st.conditions, types::API_SERVER_REACHABLE)
        .is_some_and(|c| c.status == Status::True.as_str());
    if reachable
        && fctx
            .pings
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(remote.as_str())
            .is_some_and(|(v, at)| v == version && at.elapsed() < fresh)
    {
        return true;
    }
    let result = match fctx
        .clients
        .get(remote.as_str(), version, &s.kubeconfig)
        .await
    {
        Err(e) => Err(("Unusable", e)),
        Ok(client) => {
            let api: Api<ResourceSlice> = Api::namespaced(client, &s.remote_namespace);
            match tokio::time::timeout(
                Duration::from_secs(5),
                api.list(&ListParams::default().labels(PING_SELECTOR).limit(1)),
            )
            .await
            {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(kube::Error::Api(e))) => Err((
                    match e.code {
                        401 => "Unauthorized",
                        403 => "Forbidden",
                        _ => "Error",
                    },
                    format!(
                        "{} refuses this cluster's identity ({} {}): {}",
                        s.api_server, e.code, e.reason, e.message
                    ),
                )),
                Ok(Err(e)) => Err(("Unreachable", format!("cannot reach {}: {e}", s.api_server))),
                Err(_) => Err((
                    "Unreachable",
                    format!("{} did not answer within 5s", s.api_server),
                )),
            }
        }
    };
    let (status, reason, message) = match &result {
        Ok(()) => (
            Status::True,
            "Reachable",
            format!("{} answers with this cluster's identity", s.api_server),
        ),
        Err((reason, e)) => (Status::False, *reason, e.clone()),
    };
    let mut pings = fctx.pings.lock().unwrap_or_else(PoisonError::into_inner);
    if result.is_ok() {
        pings.insert(
            remote.as_str().to_owned(),
            (version.to_owned(), Instant::now()),
        );
    } else {
        pings.remove(remote.as_str());
    }
    drop(pings);
    conditions::set(
        &mut st.conditions,
        types::API_SERVER_REACHABLE,
        status,
        reason,
        message,
        None,
        now_time(),
    );
    result.is_ok()
}

async fn issue(
    fctx: &FcCtx,
    client: &AuthClient,
    remote: &ClusterId,
    token: Option<String>,
) -> Result<(protocol::IssuedIdentity, ClientKey), ClientError> {
    let ctx = &fctx.ctx;
    let own = ctx.cluster_id().as_str();
    let nonce = client.nonce(own).await?;
    let key = ClientKey::generate(&names::consumer_username(ctx.cluster_id())).map_err(|e| {
        ClientError::Protocol {
            url: client.url().to_owned(),
            detail: format!("preparing the certificate request: {e}"),
        }
    })?;
    let payload = protocol::identity_payload(&nonce.nonce, own, remote.as_str(), &key.csr_pem);
    let req = IdentityRequest {
        cluster_id: own.to_owned(),
        public_key: ctx.identity.keys.public_key_b64(),
        nonce: nonce.nonce,
        csr: key.csr_pem.clone(),
        signature: ctx.identity.keys.sign_b64(&payload),
        token,
    };
    let issued = client.issue(&req).await?;
    if issued.provider_cluster_id != remote.as_str() {
        return Err(ClientError::Protocol {
            url: client.url().to_owned(),
            detail: format!(
                "the provider answered as cluster {}, not {remote}",
                issued.provider_cluster_id
            ),
        });
    }
    Ok((issued, key))
}

/// The identity as the consumer keeps it: for an in-band peering the kubeconfig points at the
/// provider's API server through the tunnel, host 1 of the provider's external CIDR as this
/// cluster sees it (the local view in our Configuration's status), since the address the
/// provider reports is not reachable from here.
async fn placed(
    fctx: &FcCtx,
    access: &ProviderAccess,
    remote: &ClusterId,
    s: Stored,
) -> Result<Stored, Error> {
    if !access.in_band {
        return Ok(s);
    }
    let ns = names::tenant_namespace(remote);
    let conf = Api::<Configuration>::namespaced(fctx.ctx.client.clone(), &ns)
        .get_opt(remote.as_str())
        .await
        .map_err(Error::kube(format!("reading Configuration {ns}/{remote}")))?;
    let view = conf
        .and_then(|c| c.status?.remote?.cidr.external.into_iter().next())
        .ok_or_else(|| {
            Error::Invalid(format!(
                "in-band peering: Configuration {ns}/{remote} has no local view of {remote}'s \
                 external CIDR, so its API server has no in-band address; check that {remote} \
                 was installed with an external CIDR and run `tether peer --in-band` again"
            ))
        })?;
    let url = names::in_band::api_server_url(&view).ok_or_else(|| {
        Error::Invalid(format!(
            "in-band peering: the external CIDR view {view} has no host {}",
            names::in_band::API_SERVER_HOST
        ))
    })?;
    s.in_band(&url).map_err(Error::Invalid)
}

async fn write_identity(
    fctx: &FcCtx,
    remote: &ClusterId,
    ns: &str,
    s: &Stored,
) -> Result<String, Error> {
    let secret = s.to_secret(ns, namespaces::peer_labels(remote));
    let written = kubeconfig_api(fctx, remote)
        .patch(
            objects::PROVIDER_KUBECONFIG_SECRET,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&secret),
        )
        .await
        .map_err(Error::kube(format!("storing the kubeconfig for {remote}")))?;
    fctx.clients.forget(remote.as_str());
    Ok(written.metadata.resource_version.unwrap_or_default())
}

async fn read_token(fctx: &FcCtx, fc: &ForeignCluster) -> Result<Option<String>, Error> {
    let Some(r) = fc
        .spec
        .provider
        .as_ref()
        .and_then(|p| p.token_secret_ref.as_ref())
    else {
        return Ok(None);
    };
    let api: Api<Secret> = Api::namespaced(fctx.ctx.client.clone(), &fctx.ctx.settings.namespace);
    let secret = api
        .get_opt(&r.name)
        .await
        .map_err(Error::kube(format!("reading token Secret {}", r.name)))?;
    Ok(secret
        .and_then(|s| s.data?.get(TOKEN_KEY).cloned())
        .map(|b| String::from_utf8_lossy(&b.0).trim().to_owned()))
}

async fn delete_token(fctx: &FcCtx, fc: &ForeignCluster) -> Result<(), Error> {
    let Some(r) = fc
        .spec
        .provider
        .as_ref()
        .and_then(|p| p.token_secret_ref.as_ref())
    else {
        return Ok(());
    };
    let api: Api<Secret> = Api::namespaced(fctx.ctx.client.clone(), &fctx.ctx.settings.namespace);
    match api.delete(&r.name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(Error::kube(format!("deleting token Secret {}", r.name))(e)),
    }
}

/// Revokes the identity held for `remote` at the provider, then forgets it. A provider that
/// cannot be reached makes the caller retry.
async fn drop_identity(fctx: &FcCtx, remote: &ClusterId) -> Result<(), Error> {
    let Some((stored, _)) = stored_identity(fctx, remote).await? else {
        return Ok(());
    };
    revoke_at_provider(fctx, &stored, remote).await?;
    forget_identity(fctx, remote).await
}

async fn forget_identity(fctx: &FcCtx, remote: &ClusterId) -> Result<(), Error> {
    match kubeconfig_api(fctx, remote)
        .delete(
            objects::PROVIDER_KUBECONFIG_SECRET,
            &DeleteParams::default(),
        )
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(kube::Error::Api(e))
            if e.code == 403 && tenant_namespace_gone(fctx, remote).await? => {}
        Err(e) => return Err(Error::kube(format!("deleting the kubeconfig for {remote}"))(e)),
    }
    fctx.clients.forget(remote.as_str());
    namespaces::release(&fctx.ctx, remote).await
}

async fn revoke_at_provider(
    fctx: &FcCtx,
    stored: &Stored,
    remote: &ClusterId,
) -> Result<(), ClientError> {
    let client = AuthClient::new(&stored.auth_url, &stored.auth_fingerprint)?;
    let own = fctx.ctx.cluster_id().as_str();
    let nonce = client.nonce(own).await?;
    let payload = protocol::revocation_payload(&nonce.nonce, own, remote.as_str());
    let req = RevocationRequest {
        cluster_id: own.to_owned(),
        nonce: nonce.nonce,
        signature: fctx.ctx.identity.keys.sign_b64(&payload),
    };
    match client.revoke(&req).await {
        Ok(()) => Ok(()),
        Err(ClientError::Refused {
            reason: protocol::Reason::UnknownTenant,
            ..
        }) => Ok(()),
        Err(e) => Err(e),
    }
}

async fn cleanup(fc: &ForeignCluster, fctx: &FcCtx) -> Result<Action, Error> {
    let mut fc = fc.clone();
    let fc = &mut fc;
    let Ok(remote) = remote_id(fc) else {
        return Ok(Action::await_change());
    };
    let mut st = fc.status.clone().unwrap_or_default();
    // The finalizer is released as soon as this returns Ok, so waiting is done here, and a
    // wait that runs out is an error (retried), never an Ok.
    if let Some(n) = withdraw_slices(fctx, &remote).await? {
        let msg = format!(
            "withdrawing {n} resource slice(s): their virtual nodes drain and {remote} releases the grants"
        );
        show_phase(fctx, fc, &mut st, Phase::Unpeering, &msg).await?;
        let until = Instant::now() + Duration::from_secs(20);
        while let Some(n) = withdraw_slices(fctx, &remote).await? {
            if Instant::now() >= until {
                return Err(Error::Timeout(format!(
                    "withdrawing {n} resource slice(s) from {remote}; retrying"
                )));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    if let Some((stored, _)) = stored_identity(fctx, &remote).await? {
        show_phase(
            fctx,
            fc,
            &mut st,
            Phase::Unpeering,
            "revoking this cluster's identity at the provider",
        )
        .await?;
        if let Err(e) = revoke_at_provider(fctx, &stored, &remote).await {
            let msg = format!(
                "cannot revoke the identity at the provider: {e}; retrying. `tether unpeer --force` removes the local side only"
            );
            show_phase(fctx, fc, &mut st, Phase::Unpeering, &msg).await?;
            return Err(Error::Peer(e));
        }
    }
    forget_identity(fctx, &remote).await?;
    // The remote also consumed from here: unpeering removes that direction too.
    match Api::<Tenant>::all(fctx.ctx.client.clone())
        .delete(remote.as_str(), &DeleteParams::default())
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(e) => return Err(Error::kube(format!("deleting Tenant {remote}"))(e)),
    }
    tracing::info!(remote = %remote, "unpeered");
    Ok(Action::await_change())
}

/// Offloading goes before the identity: deletes this cluster's ResourceSlices for `remote`
/// (their reconciler removes the virtual nodes and the provider's copies while the identity
/// still works) and says how many are left, `None` once there are none.
async fn withdraw_slices(fctx: &FcCtx, remote: &ClusterId) -> Result<Option<usize>, Error> {
    let ns = names::tenant_namespace(remote);
    let api: Api<ResourceSlice> = Api::namespaced(fctx.ctx.client.clone(), &ns);
    let this = fctx.ctx.cluster_id().as_str();
    let slices = match api.list(&ListParams::default()).await {
        Ok(l) => l.items,
        Err(kube::Error::Api(e)) if e.code == 403 || e.code == 404 => return Ok(None),
        Err(e) => return Err(Error::kube(format!("listing ResourceSlices in {ns}"))(e)),
    };
    let ours: Vec<&ResourceSlice> = slices
        .iter()
        .filter(|s| s.spec.consumer_cluster_id == this)
        .collect();
    if ours.is_empty() {
        return Ok(None);
    }
    for s in &ours {
        if s.metadata.deletion_timestamp.is_none() {
            let name = s.metadata.name.clone().unwrap_or_default();
            match api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => {
                    return Err(Error::kube(format!("deleting ResourceSlice {ns}/{name}"))(
                        e,
                    ));
                }
            }
        }
    }
    Ok(Some(ours.len()))
}

/// The first identity: authenticate with the token. `Err` carries the outcome to report.
async fn first_identity(
    fc: &mut ForeignCluster,
    fctx: &FcCtx,
    remote: &ClusterId,
    st: &mut ForeignClusterStatus,
    client: &AuthClient,
    local_ns: &str,
    now: i64,
) -> Result<Result<(Stored, String), AuthOutcome>, Error> {
    let ctx = &fctx.ctx;
    let Some(access) = fc.spec.provider.clone() else {
        return Ok(Err(AuthOutcome::fatal(
            "InvalidSpec",
            "spec.provider is missing".into(),
        )));
    };
    let Some(token) = read_token(fctx, fc).await? else {
        return Ok(Err(AuthOutcome::fatal(
            "TokenMissing",
            format!(
                "no identity yet and no token Secret {}/{}; run `tether peer` again with a fresh token from the provider (`tether generate peer-command`)",
                ctx.settings.namespace,
                access
                    .token_secret_ref
                    .as_ref()
                    .map(|r| r.name.as_str())
                    .unwrap_or("<unset>")
            ),
        )));
    };
    show_phase(
        fctx,
        fc,
        st,
        Phase::Authenticating,
        &format!("authenticating to {}", client.url()),
    )
    .await?;
    match client.identity().await {
        Ok(id) if id.cluster_id != remote.as_str() => {
            return Ok(Err(AuthOutcome::fatal(
                "ClusterIDMismatch",
                format!(
                    "the authentication service at {} belongs to cluster {}, not {remote}; check --auth-url and the token",
                    client.url(),
                    id.cluster_id
                ),
            )));
        }
        Ok(_) => {}
        Err(e) => return Ok(Err(AuthOutcome::failed(&e))),
    }
    match issue(fctx, client, remote, Some(token)).await {
        Ok((issued, key)) => {
            let auth = (access.auth_url.as_str(), access.ca_fingerprint.as_str());
            let s = Stored::new(remote, &issued, &key.key_pem, now, 0, auth);
            namespaces::ensure(ctx, remote).await?;
            let s = placed(fctx, &access, remote, s).await?;
            let v = write_identity(fctx, remote, local_ns, &s).await?;
            delete_token(fctx, fc).await?;
            tracing::info!(provider = %remote, expires_at = s.expires_at, "identity issued");
            Ok(Ok((s, v)))
        }
        Err(e) => Ok(Err(AuthOutcome::failed(&e))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_young_peering_is_reread_often_and_an_old_or_unknown_one_less() {
        let cases = [
            (Some(0), 500),
            (Some(29), 500),
            (Some(30), 2000),
            (Some(3600), 2000),
            (None, 2000),
            // A creation time in the future (clock skew) counts as young.
            (Some(-5), 500),
        ];
        for (age, ms) in cases {
            assert_eq!(
                connecting_requeue(age),
                Duration::from_millis(ms),
                "age {age:?}"
            );
        }
    }
}
