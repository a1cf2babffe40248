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

/// Caches of every pod and node, and a stream that yields once per change to either.
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
    let pod_events = watcher(Api::<Pod>::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .reflect(pod_writer)
        .map(|_| ());
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
