//! The node task: the IO around [`crate::desired`]. It watches its Node, applies metadata and
//! spec when the spec changes or the Node drifts or vanishes, writes the status when the
//! computed status changes (else every refresh), and renews the Lease. Failed writes are
//! logged and retried with back-off; the task never ends before its stop.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, NodeStatus};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::{WatchStreamExt as _, watcher};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::Timing;
use crate::desired::{self, FIELD_MANAGER, Health, Network, NodeSpec, Probes, ProviderHealth};

/// Exponential back-off for failed writes: short first so that a blip costs little, capped so
/// that the Lease is still renewed well within its duration.
#[derive(Debug)]
pub(crate) struct Backoff {
    next: Duration,
}

const BACKOFF_FIRST: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

impl Default for Backoff {
    fn default() -> Self {
        Self {
            next: BACKOFF_FIRST,
        }
    }
}

impl Backoff {
    pub(crate) fn next_delay(&mut self) -> Duration {
        let delay = self.next;
        self.next = (self.next * 2).min(BACKOFF_MAX);
        delay
    }

    fn reset(&mut self) {
        self.next = BACKOFF_FIRST;
    }
}

/// The longest one pass of writes may take before it counts as failed.
const SYNC_TIMEOUT: Duration = Duration::from_secs(15);

pub(crate) struct Inputs {
    pub(crate) client: kube::Client,
    pub(crate) name: String,
    pub(crate) spec: watch::Receiver<NodeSpec>,
    pub(crate) network: watch::Receiver<Network>,
    pub(crate) probes: watch::Receiver<Probes>,
    pub(crate) timing: Timing,
    pub(crate) ready: Arc<AtomicBool>,
    pub(crate) stop: CancellationToken,
}

/// How long the first write waits for the Node watch's first listing and for the first verdict
/// on the provider.
const FIRST_LISTING: Duration = Duration::from_secs(2);

/// What the Node watch last said.
enum Seen {
    /// Not listed yet.
    Unknown,
    Absent,
    Present(Box<Node>),
}

struct State {
    nodes: Api<Node>,
    leases: Api<Lease>,
    name: String,
    timing: Timing,
    seen: Seen,
    /// The spec whose metadata and spec were last applied to the Node seen.
    applied: Option<NodeSpec>,
    /// The status last written to the Node seen (as sent; heartbeats included).
    written: Option<NodeStatus>,
    last_status_write: Option<Instant>,
    lease_due: Instant,
    /// The Node's UID the Lease was last renewed for.
    lease_owner: Option<String>,
    ready_reason: Option<String>,
}

pub(crate) async fn run(inputs: Inputs) {
    let Inputs {
        client,
        name,
        mut spec,
        mut network,
        mut probes,
        timing,
        ready,
        stop,
    } = inputs;
    let nodes: Api<Node> = Api::all(client.clone());
    let watch_config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = watcher(nodes.clone(), watch_config)
        .default_backoff()
        .boxed();
    let mut state = State {
        nodes,
        leases: Api::namespaced(client, desired::LEASE_NAMESPACE),
        name,
        timing: timing.clone(),
        seen: Seen::Unknown,
        applied: None,
        written: None,
        last_status_write: None,
        lease_due: Instant::now(),
        lease_owner: None,
        ready_reason: None,
    };
    let mut listing: Option<Node> = None;
    let started = Instant::now();
    let mut backoff = Backoff::default();
    let mut retry_at: Option<Instant> = None;
    let (mut spec_open, mut network_open, mut probes_open) = (true, true, true);
    let mut warned_rename = false;
    loop {
        let current = spec.borrow_and_update().clone();
        if current.name != state.name && !warned_rename {
            warned_rename = true;
            tracing::warn!(node = %state.name, new_name = %current.name,
                "a virtual node cannot be renamed; stop it and spawn one with the new name");
        }
        let health = Health {
            provider: probes
                .borrow_and_update()
                .health(Timestamp::now(), timing.unreachable_after),
            network: network.borrow_and_update().clone(),
        };
        // Until the watch has listed the Node, what a write would keep of it (a restarted
        // controller adopting it) is unknown: wait for the listing a little, so that an
        // adopted node does not flap NotReady. Wait as long for the first probe's verdict:
        // a node shown NotReady only until that answer gets the lifecycle controller's
        // not-ready taint if one of its passes falls in the gap, and keeps it seconds after.
        let undecided = matches!(
            health.provider,
            ProviderHealth::NoClient | ProviderHealth::Unknown
        );
        let listing_due =
            (matches!(state.seen, Seen::Unknown) || undecided) && started.elapsed() < FIRST_LISTING;
        if !listing_due && retry_at.is_none_or(|at| Instant::now() >= at) {
            // A hanging API server must neither hold up the stop nor this task for good.
            let outcome = tokio::select! {
                () = stop.cancelled() => return,
                outcome = tokio::time::timeout(SYNC_TIMEOUT, state.sync(&current, &health, &ready)) => outcome,
            };
            match outcome.map_err(|_| format!("no answer within {}s", SYNC_TIMEOUT.as_secs())) {
                Ok(Ok(())) => {
                    backoff.reset();
                    retry_at = None;
                }
                Ok(Err(error)) | Err(error) => {
                    let delay = backoff.next_delay();
                    tracing::warn!(node = %state.name, %error, retry_in_ms = delay.as_millis(),
                        "writing the virtual node failed");
                    retry_at = Some(Instant::now() + delay);
                }
            }
        }
        let mut wake = Instant::now() + timing.probe_interval;
        if let Some(left) = probes
            .borrow()
            .unreachable_in(Timestamp::now(), timing.unreachable_after)
        {
            wake = wake.min(Instant::now() + left);
        }
        if listing_due {
            wake = wake.min(started + FIRST_LISTING);
        }
        if state.uid().is_some() {
            wake = wake.min(state.lease_due);
        }
        if let Some(at) = state.last_status_write {
            wake = wake.min(at + timing.status_refresh);
        }
        if let Some(at) = retry_at {
            // Nothing is written before then; the inputs are read again when it comes.
            wake = at;
        }
        tokio::select! {
            () = stop.cancelled() => return,
            changed = spec.changed(), if spec_open => spec_open = changed.is_ok(),
            changed = network.changed(), if network_open => network_open = changed.is_ok(),
            changed = probes.changed(), if probes_open => probes_open = changed.is_ok(),
            event = events.next() => match event {
                Some(Ok(event)) => state.observe(event, &mut listing),
                Some(Err(error)) => {
                    tracing::warn!(node = %state.name, %error, "watching the Node failed; retrying");
                }
                None => {
                    // The watcher never ends by itself; if it did, the periodic writes still
                    // re-create a deleted Node (its status write finds it gone).
                    tracing::warn!(node = %state.name, "the Node watch ended");
                    events = futures::stream::pending().boxed();
                }
            },
            () = tokio::time::sleep_until(wake) => {}
        }
    }
}

impl State {
    fn observe(&mut self, event: watcher::Event<Node>, listing: &mut Option<Node>) {
        match event {
            watcher::Event::Init => *listing = None,
            watcher::Event::InitApply(node) => *listing = Some(node),
            watcher::Event::InitDone => match listing.take() {
                Some(node) => self.seen_node(node),
                None => self.seen_absent(None),
            },
            watcher::Event::Apply(node) => self.seen_node(node),
            watcher::Event::Delete(node) => self.seen_absent(node.metadata.uid.as_deref()),
        }
    }

    fn seen_node(&mut self, node: Node) {
        if self.uid() != node.metadata.uid.as_deref() {
            // Another object than the one written to: write everything again.
            self.applied = None;
            self.written = None;
        }
        self.seen = Seen::Present(Box::new(node));
    }

    /// The Node is gone (if `uid` is given: only when it is the one seen).
    fn seen_absent(&mut self, uid: Option<&str>) {
        if uid.is_some() && uid != self.uid() {
            return;
        }
        if matches!(self.seen, Seen::Present(_)) {
            tracing::info!(node = %self.name, "the Node was deleted; registering it again");
        }
        self.seen = Seen::Absent;
        self.applied = None;
        self.written = None;
    }

    fn uid(&self) -> Option<&str> {
        match &self.seen {
            Seen::Present(n) => n.metadata.uid.as_deref(),
            _ => None,
        }
    }

    /// One pass: metadata and spec, status, Lease, each when due. Every step is tried even if
    /// an earlier one failed (the Lease matters most); the first error is returned.
    async fn sync(
        &mut self,
        spec: &NodeSpec,
        health: &Health,
        ready: &AtomicBool,
    ) -> Result<(), String> {
        let mut spec = spec.clone();
        spec.name.clone_from(&self.name);
        let mut first_error = None;
        // A status write can find the Node gone before the watch says so: register again at
        // once, once.
        for _ in 0..2 {
            match self.write_node(&spec, health, ready).await {
                Ok(()) => break,
                Err(kube::Error::Api(s)) if s.code == 404 => self.seen_absent(None),
                Err(e) => {
                    first_error = Some(e);
                    break;
                }
            }
        }
        if let Err(e) = self.renew_lease().await {
            first_error.get_or_insert(e);
        }
        first_error.map_or(Ok(()), |e| Err(e.to_string()))
    }

    async fn write_node(
        &mut self,
        spec: &NodeSpec,
        health: &Health,
        ready: &AtomicBool,
    ) -> Result<(), kube::Error> {
        let now = Timestamp::now();
        let desired = self.desired(spec, health, now);
        let is_ready = desired::is_ready(&desired);
        ready.store(is_ready, Ordering::Relaxed);
        self.log_readiness(&desired);

        let params = PatchParams::apply(FIELD_MANAGER).force();
        let spec_due = match (&self.seen, &self.applied) {
            (Seen::Present(node), Some(applied)) => {
                applied != spec || desired::spec_drift(&desired, node)
            }
            _ => true,
        };
        if spec_due {
            let body = desired::apply_body(&desired);
            let node = self
                .nodes
                .patch(&self.name, &params, &Patch::Apply(&body))
                .await?;
            if self.uid() != node.metadata.uid.as_deref() {
                tracing::info!(node = %self.name, provider = %spec.provider, "registered the Node");
                self.written = None;
                // A new Node needs a Lease that names it as owner.
                self.lease_due = Instant::now();
            }
            self.seen = Seen::Present(Box::new(node));
            self.applied = Some(spec.clone());
        }
        // What the apply returned carries the status already there (after a restart of the
        // controller): its transition times are kept.
        let desired = self.desired(spec, health, now);

        let status = desired.status.clone().unwrap_or_default();
        let refresh_due = self
            .last_status_write
            .is_none_or(|at| at.elapsed() >= self.timing.status_refresh);
        if refresh_due || desired::status_changed(self.written.as_ref(), &status) {
            let node = self
                .nodes
                .patch_status(
                    &self.name,
                    &params,
                    &Patch::Apply(&desired::status_body(&desired)),
                )
                .await?;
            self.seen = Seen::Present(Box::new(node));
            self.written = Some(status);
            self.last_status_write = Some(Instant::now());
        }
        Ok(())
    }

    /// The desired Node, from the Node seen with the status last written (or, before any
    /// write, the status found).
    fn desired(&self, spec: &NodeSpec, health: &Health, now: Timestamp) -> Node {
        let previous = match (&self.seen, &self.written) {
            (Seen::Present(node), Some(written)) => Some(Node {
                status: Some(written.clone()),
                ..(**node).clone()
            }),
            (Seen::Present(node), None) => Some((**node).clone()),
            _ => None,
        };
        desired::node(spec, health, previous.as_ref(), now)
    }

    async fn renew_lease(&mut self) -> Result<(), kube::Error> {
        let Some(uid) = self.uid().map(str::to_owned) else {
            // No Node yet: the Lease must name its owner's UID, so it waits for the Node.
            return Ok(());
        };
        if Instant::now() < self.lease_due && self.lease_owner.as_deref() == Some(uid.as_str()) {
            return Ok(());
        }
        let lease = desired::lease(
            &self.name,
            &uid,
            self.timing.lease_duration_seconds,
            Timestamp::now(),
        );
        self.leases
            .patch(
                &self.name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&lease),
            )
            .await?;
        self.lease_owner = Some(uid);
        self.lease_due = Instant::now() + self.timing.lease_renew;
        Ok(())
    }

    fn log_readiness(&mut self, node: &Node) {
        let (reason, message) = desired::ready_reason(node);
        if self.ready_reason.as_deref() == Some(reason.as_str()) {
            return;
        }
        if desired::is_ready(node) {
            tracing::info!(node = %self.name, "the virtual node is Ready");
        } else if self.ready_reason.is_none() {
            // Starting NotReady (waiting for the first probe) is expected, not a warning.
            tracing::info!(node = %self.name, %reason, %message, "the virtual node is not Ready yet");
        } else {
            tracing::warn!(node = %self.name, %reason, %message, "the virtual node is not Ready");
        }
        self.ready_reason = Some(reason);
    }
}
