//! "Controller-manager lite": the kube-controller-manager loops a simulated cluster needs to
//! behave like a real one (namespace cleanup, garbage collection, default service accounts,
//! CSR signing, persistent volumes).
//!
//! Every controller talks to the cluster only through the public API with a kube-rs [`Client`],
//! exactly as kube-controller-manager does. So they dogfood the server and also run unchanged
//! against a real API server. Each is a tokio task that ends when the shutdown token fires. The
//! decisions they take are pure functions (in the submodules), table-tested without a server.

pub mod csr;
pub mod endpointslices;
pub mod gc;
pub mod loadbalancer;
pub mod namespace;
pub mod node_lifecycle;
pub mod persistent_volumes;
pub mod scheduler;
pub mod service_accounts;
pub mod taint_eviction;
pub mod workloads;

use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt as _};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Client;
use kube::api::Api;
use kube::discovery::{ApiCapabilities, ApiResource, Discovery, Scope, verbs};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt as _, watcher};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::tls::CertAuthority;

/// Which built-in controllers a simulated cluster runs. Each is independent.
///
/// envtest-like tests want none of them (nothing cascades, nothing is created behind their
/// back); e2e-style tests and the playground want all of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Controllers {
    /// Deletes the content of terminating namespaces, then finalizes them.
    pub namespace: bool,
    /// Cascades deletion through `ownerReferences` (background, foreground and orphan).
    pub garbage_collector: bool,
    /// Keeps a `default` ServiceAccount (and, with TLS, the `kube-root-ca.crt` ConfigMap) in
    /// every namespace.
    pub service_accounts: bool,
    /// Signs approved CSRs for the `kubernetes.io/kube-apiserver-client` and
    /// `kubernetes.io/kube-apiserver-client-kubelet` signers (needs the cluster CA).
    pub csr_signer: bool,
    /// Binds pending pods to nodes (filters, least-allocated scoring, `FailedScheduling`).
    pub scheduler: bool,
    /// Keeps ReplicaSets' pod counts, rolls Deployments and runs DaemonSets on every node.
    pub workloads: bool,
    /// Keeps EndpointSlices (and legacy Endpoints) of Services with a selector.
    pub endpoint_slices: bool,
    /// Marks nodes whose Lease went stale Unknown and taints them unreachable.
    pub node_lifecycle: bool,
    /// Gives LoadBalancer Services an ingress IP from the configured pool.
    pub load_balancer: bool,
    /// Deletes pods from nodes with `NoExecute` taints they do not tolerate (or once their
    /// `tolerationSeconds` ran out).
    pub taint_eviction: bool,
    /// Binds PersistentVolumeClaims and PersistentVolumes, provisions host-path volumes and
    /// releases (and deletes) volumes whose claim is gone.
    pub persistent_volumes: bool,
}

impl Controllers {
    /// Every controller on.
    pub fn all() -> Self {
        Self {
            namespace: true,
            garbage_collector: true,
            service_accounts: true,
            csr_signer: true,
            scheduler: true,
            workloads: true,
            endpoint_slices: true,
            node_lifecycle: true,
            load_balancer: true,
            taint_eviction: true,
            persistent_volumes: true,
        }
    }

    /// Every controller off (the default, like envtest).
    pub fn none() -> Self {
        Self::default()
    }

    /// Whether any controller is on.
    pub fn any(&self) -> bool {
        self.namespace
            || self.garbage_collector
            || self.service_accounts
            || self.csr_signer
            || self.scheduler
            || self.workloads
            || self.endpoint_slices
            || self.node_lifecycle
            || self.load_balancer
            || self.taint_eviction
            || self.persistent_volumes
    }
}

/// Settings of the controllers that need more than on or off.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControllerSettings {
    /// How long a node's Lease may go unrenewed before the node turns Unknown.
    pub node_monitor_grace_period: Duration,
    /// Addresses handed to LoadBalancer Services (empty: they stay pending).
    pub load_balancer_pool: Vec<std::net::Ipv4Addr>,
    /// The longest certificate the CSR signer issues (kube-controller-manager's
    /// `--cluster-signing-duration`).
    pub cluster_signing_duration: Duration,
    /// Where the persistent-volume controller provisions host-path volumes (one directory per
    /// volume). It must be visible at the same path to every node agent.
    pub volumes_dir: std::path::PathBuf,
}

impl Default for ControllerSettings {
    fn default() -> Self {
        Self {
            node_monitor_grace_period: node_lifecycle::DEFAULT_GRACE,
            load_balancer_pool: Vec::new(),
            cluster_signing_duration: crate::tls::DEFAULT_SIGNING_DURATION,
            volumes_dir: std::env::temp_dir().join("simkube-volumes"),
        }
    }
}

/// Starts the selected controllers against `client`. They stop when `shutdown` is cancelled.
///
/// `ca` is the cluster CA: the CSR signer needs it (without it the signer does not start, and a
/// warning says so) and the service-account controller publishes its certificate as
/// `kube-root-ca.crt`.
pub fn spawn(
    controllers: &Controllers,
    settings: &ControllerSettings,
    client: Client,
    ca: Option<Arc<CertAuthority>>,
    shutdown: CancellationToken,
) -> Vec<JoinHandle<()>> {
    let mut tasks = Vec::new();
    if controllers.scheduler {
        tasks.push(tokio::spawn(scheduler::run(
            client.clone(),
            shutdown.clone(),
        )));
    }
    if controllers.workloads {
        tasks.push(tokio::spawn(workloads::replicaset::run(
            client.clone(),
            shutdown.clone(),
        )));
        tasks.push(tokio::spawn(workloads::deployment::run(
            client.clone(),
            shutdown.clone(),
        )));
        tasks.push(tokio::spawn(workloads::daemonset::run(
            client.clone(),
            shutdown.clone(),
        )));
    }
    if controllers.endpoint_slices {
        tasks.push(tokio::spawn(endpointslices::run(
            client.clone(),
            shutdown.clone(),
        )));
    }
    if controllers.node_lifecycle {
        tasks.push(tokio::spawn(node_lifecycle::run(
            client.clone(),
            settings.node_monitor_grace_period,
            shutdown.clone(),
        )));
    }
    if controllers.taint_eviction {
        tasks.push(tokio::spawn(taint_eviction::run(
            client.clone(),
            shutdown.clone(),
        )));
    }
    if controllers.load_balancer {
        tasks.push(tokio::spawn(loadbalancer::run(
            client.clone(),
            settings.load_balancer_pool.clone(),
            shutdown.clone(),
        )));
    }
    if controllers.persistent_volumes {
        tasks.push(tokio::spawn(persistent_volumes::run(
            client.clone(),
            settings.volumes_dir.clone(),
            shutdown.clone(),
        )));
    }
    if controllers.namespace {
        tasks.push(tokio::spawn(namespace::run(
            client.clone(),
            shutdown.clone(),
        )));
    }
    if controllers.garbage_collector {
        tasks.push(tokio::spawn(gc::run(client.clone(), shutdown.clone())));
    }
    if controllers.service_accounts {
        let ca_pem = ca.as_ref().map(|ca| ca.ca_pem());
        tasks.push(tokio::spawn(service_accounts::run(
            client.clone(),
            ca_pem,
            shutdown.clone(),
        )));
    }
    if controllers.csr_signer {
        match ca {
            Some(ca) => tasks.push(tokio::spawn(csr::run(
                client,
                ca,
                settings.cluster_signing_duration,
                shutdown,
            ))),
            None => tracing::warn!(
                "the CSR signer is enabled but the cluster has no CA (TLS is off); \
                 approved CSRs will not be signed"
            ),
        }
    }
    tasks
}

/// A served resource type as the controllers need it.
#[derive(Debug, Clone)]
pub(crate) struct ServedResource {
    pub(crate) api: ApiResource,
    pub(crate) namespaced: bool,
    pub(crate) caps: ApiCapabilities,
}

impl ServedResource {
    fn supports(&self, verb: &str) -> bool {
        self.caps.supports_operation(verb)
    }
}

/// Every top-level resource the server serves, at each group's preferred version, found through
/// the discovery API (so custom resources are included).
pub(crate) async fn discover(client: &Client) -> Result<Vec<ServedResource>, kube::Error> {
    let discovery = Discovery::new(client.clone()).run().await?;
    let mut out = Vec::new();
    for group in discovery.groups() {
        for (api, caps) in group.recommended_resources() {
            if api.plural.contains('/') {
                continue;
            }
            out.push(ServedResource {
                namespaced: caps.scope == Scope::Namespaced,
                api,
                caps,
            });
        }
    }
    Ok(out)
}

/// Resources the controllers can enumerate and delete.
pub(crate) fn deletable(resources: &[ServedResource]) -> Vec<ServedResource> {
    resources
        .iter()
        .filter(|r| r.supports(verbs::LIST) && r.supports(verbs::DELETE))
        .cloned()
        .collect()
}

/// Sleeps for `delay` unless shutdown comes first; returns false on shutdown.
pub(crate) async fn pause(shutdown: &CancellationToken, delay: Duration) -> bool {
    tokio::select! {
        () = shutdown.cancelled() => false,
        () = tokio::time::sleep(delay) => true,
    }
}

/// Spaces out the full passes of a controller that re-examines everything on each change (the
/// scheduler, taint eviction, the garbage collector), so that under a steady stream of changes
/// it takes at most a fifth of a core: after a pass that took `t`, the next starts no sooner
/// than `PASS_SPACING * t` later. A pass over a few objects takes microseconds, so small
/// clusters see no delay; at a thousand pods a pass takes milliseconds, and changes arriving
/// meanwhile are handled together by the next one. kube-controller-manager's loops work per
/// object from queues and need no such bound.
#[derive(Debug)]
pub(crate) struct Pace {
    next: tokio::time::Instant,
}

/// See [`Pace`].
const PASS_SPACING: u32 = 4;

impl Pace {
    pub(crate) fn new() -> Self {
        Self {
            next: tokio::time::Instant::now(),
        }
    }

    /// Waits until the next pass may start.
    pub(crate) async fn ready(&self) {
        tokio::time::sleep_until(self.next).await;
    }

    /// Notes a pass that began at `started` and has just ended.
    pub(crate) fn passed(&mut self, started: tokio::time::Instant) {
        let now = tokio::time::Instant::now();
        self.next = now + (now - started) * PASS_SPACING;
    }
}

/// What of a pod the scheduler and the taint-eviction controller decide on, as a digest: its
/// spec (where it runs, what it asks, tolerates and waits for), its labels (inter-pod
/// affinity), whether it has finished and whether it is going. The rest of its status
/// (conditions, container states, addresses) moves neither.
fn placement_digest(pod: &Pod) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    serde_json::to_string(&pod.spec)
        .unwrap_or_default()
        .hash(&mut h);
    pod.metadata.labels.hash(&mut h);
    pod.metadata.deletion_timestamp.is_some().hash(&mut h);
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
    .hash(&mut h);
    h.finish()
}

/// Which pod events change what the pass-based controllers decide on
/// ([`placement_digest`]): a pod appearing or going, or its digest changing. A burst's pods
/// change status several times each on their way to Ready, and every one of those changes
/// started a pass over every pod.
#[derive(Default)]
struct PlacementChanges {
    /// uid → digest of every pod seen.
    seen: std::collections::HashMap<String, u64>,
    /// A relisting under way: what it has shown so far.
    relisting: Option<std::collections::HashMap<String, u64>>,
}

impl PlacementChanges {
    fn matters(&mut self, event: &watcher::Event<Pod>) -> bool {
        let entry = |pod: &Pod| {
            (
                pod.metadata.uid.clone().unwrap_or_default(),
                placement_digest(pod),
            )
        };
        match event {
            watcher::Event::Init => {
                self.relisting = Some(std::collections::HashMap::new());
                false
            }
            watcher::Event::InitApply(pod) => {
                let (uid, digest) = entry(pod);
                self.relisting.get_or_insert_default().insert(uid, digest);
                false
            }
            watcher::Event::InitDone => {
                self.seen = self.relisting.take().unwrap_or_default();
                true
            }
            watcher::Event::Apply(pod) => {
                let (uid, digest) = entry(pod);
                self.seen.insert(uid, digest) != Some(digest)
            }
            watcher::Event::Delete(pod) => {
                self.seen
                    .remove(pod.metadata.uid.as_deref().unwrap_or_default());
                true
            }
        }
    }
}

/// Caches of every pod and node, and a stream that yields once per change to either that can
/// matter to a scheduling or eviction decision (for pods, see [`PlacementChanges`]).
///
/// The scheduler and the taint-eviction controller both decide from this pair of caches and
/// re-examine the cluster on each change.
pub(crate) fn watch_pods_and_nodes(
    client: &Client,
) -> (
    Store<Pod>,
    Store<Node>,
    impl Stream<Item = ()> + Send + 'static,
) {
    let (pods, pod_writer) = reflector::store::<Pod>();
    let (nodes, node_writer) = reflector::store::<Node>();
    let mut placements = PlacementChanges::default();
    let pod_events = watcher(Api::<Pod>::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .reflect(pod_writer)
        .filter_map(move |event| {
            let matters = event.as_ref().is_ok_and(|e| placements.matters(e));
            futures::future::ready(matters.then_some(()))
        });
    let node_events = watcher(Api::<Node>::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .reflect(node_writer)
        .map(|_| ());
    (
        pods,
        nodes,
        futures::stream::select(pod_events, node_events),
    )
}

/// An event recorder reporting as `controller`.
pub(crate) fn recorder(client: Client, controller: &str) -> Recorder {
    Recorder::new(
        client,
        Reporter {
            controller: controller.into(),
            instance: None,
        },
    )
}

/// Whether a kube-rs error is an API answer with this HTTP code.
pub(crate) fn is_status(err: &kube::Error, code: u16) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == code)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(node: Option<&str>, phase: &str, ready: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "web-0", "namespace": "default", "uid": "u-1", "labels": {"app": "web"}},
            "spec": {"nodeName": node, "containers": [{"name": "app", "image": "nginx"}]},
            "status": {"phase": phase, "conditions": [{"type": "Ready", "status": ready}]},
        }))
        .expect("pod")
    }

    #[test]
    fn only_changes_of_placement_start_a_pass() {
        let mut changes = PlacementChanges::default();
        let apply = |p: Pod| watcher::Event::Apply(p);
        assert!(
            changes.matters(&apply(pod(None, "Pending", "False"))),
            "a new pod"
        );
        assert!(
            !changes.matters(&apply(pod(None, "Pending", "False"))),
            "the same again"
        );
        assert!(
            changes.matters(&apply(pod(Some("n1"), "Pending", "False"))),
            "bound"
        );
        assert!(
            !changes.matters(&apply(pod(Some("n1"), "Running", "True"))),
            "running and ready: its status only"
        );
        let mut relabelled = pod(Some("n1"), "Running", "True");
        relabelled
            .metadata
            .labels
            .get_or_insert_default()
            .insert("tier".into(), "front".into());
        assert!(changes.matters(&apply(relabelled)), "labels: affinity");
        assert!(
            changes.matters(&apply(pod(Some("n1"), "Succeeded", "False"))),
            "finished: its requests are free"
        );
        let mut going = pod(Some("n1"), "Succeeded", "False");
        going.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        assert!(changes.matters(&apply(going.clone())), "going");
        assert!(changes.matters(&watcher::Event::Delete(going)), "gone");

        // A relisting replaces what was seen, and ends with one pass.
        assert!(!changes.matters(&watcher::Event::Init));
        assert!(!changes.matters(&watcher::Event::InitApply(pod(None, "Pending", "False"))));
        assert!(changes.matters(&watcher::Event::InitDone));
        assert_eq!(changes.seen.len(), 1);
        assert!(!changes.matters(&apply(pod(None, "Pending", "False"))));
    }
}
