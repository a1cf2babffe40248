//! The IO around the pure model: [`Applier`] plans and applies one input (what the gateway
//! uses for its side), and [`run_node`] is `tetherd fabric`'s loop: reflectors on gateway pods,
//! Configurations, Connections and this Node; a reconcile on every change (debounced) and every
//! resync period (which repairs drift); a teardown when shutdown is requested.

use std::fmt::Debug;
use std::hash::Hash;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::serde::de::DeserializeOwned;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, Client, Resource, ResourceExt as _};
use tether_api::names::labels;
use tether_api::networking::{Configuration, Connection};
use tether_kernel::{FabricConfig, FabricKernel, FabricReport};
use tether_netplan::{FabricInput, FabricPlan, plan_fabric};
use tether_runtime::{Readiness, ReconcileResult};
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::error::FabricRunError;
use crate::metrics::FabricMetrics;
use crate::model::{Settings, device_mtu, node_input, node_internal_ip};

/// The readiness component the loop registers: ready after the first successful reconcile.
pub const READINESS: &str = "fabric";

/// Plans and applies fabric inputs in the calling thread's network namespace.
#[derive(Debug)]
pub struct Applier {
    kernel: FabricKernel,
    metrics: Option<FabricMetrics>,
}

impl Applier {
    /// Opens the kernel adapter for `device` and `table` (within a tokio runtime).
    pub fn new(
        device: &str,
        table: &str,
        metrics: Option<FabricMetrics>,
    ) -> Result<Self, FabricRunError> {
        let kernel = FabricKernel::new(FabricConfig::new(device, table)).map_err(|source| {
            FabricRunError::Kernel {
                step: "open",
                source,
            }
        })?;
        Ok(Self { kernel, metrics })
    }

    /// The device MTU over the uplink that holds `local_ip`.
    pub async fn device_mtu_for(
        &self,
        local_ip: std::net::Ipv4Addr,
    ) -> Result<u32, FabricRunError> {
        let uplink =
            self.kernel
                .uplink_mtu(local_ip)
                .await
                .map_err(|source| FabricRunError::Kernel {
                    step: "uplink MTU",
                    source,
                })?;
        Ok(device_mtu(uplink))
    }

    /// Plans `input` and makes the kernel match it; every operation is attempted, and the
    /// first failure is reported.
    pub async fn apply(&mut self, input: &FabricInput) -> Result<FabricPlan, FabricRunError> {
        let start = Instant::now();
        let result = self.apply_inner(input).await;
        if let Some(metrics) = &self.metrics {
            let outcome = match &result {
                Ok(plan) => {
                    metrics.set_plan(plan);
                    ReconcileResult::Ok
                }
                Err(error) => ReconcileResult::Error {
                    reason: error.reason(),
                },
            };
            metrics.observe(outcome, start.elapsed());
        }
        result
    }

    async fn apply_inner(&mut self, input: &FabricInput) -> Result<FabricPlan, FabricRunError> {
        let plan = plan_fabric(input).map_err(FabricRunError::Plan)?;
        let report =
            self.kernel
                .reconcile(&plan)
                .await
                .map_err(|source| FabricRunError::Kernel {
                    step: "reconcile",
                    source,
                })?;
        for op in &report.applied {
            tracing::info!(%op, "fabric changed");
        }
        check(report)?;
        Ok(plan)
    }

    /// Removes the device, our routes and our table.
    pub async fn teardown(&mut self) -> Result<(), FabricRunError> {
        let report = self
            .kernel
            .teardown()
            .await
            .map_err(|source| FabricRunError::Kernel {
                step: "teardown",
                source,
            })?;
        check(report)
    }
}

fn check(report: FabricReport) -> Result<(), FabricRunError> {
    let failed = report.failed.len();
    match report.failed.into_iter().next() {
        None => Ok(()),
        Some(first) => Err(FabricRunError::Apply {
            failed,
            op: first.op.to_string(),
            source: first.error,
        }),
    }
}

/// What `tetherd fabric` needs besides the API client.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// This node's name (the downward API's `spec.nodeName`).
    pub node_name: String,
    /// Device, VNI, port and table; `local_ip` and `mtu` are filled in from the Node and the
    /// uplink on every reconcile.
    pub template: Settings,
    /// A fixed device MTU instead of the uplink's minus the VXLAN overhead.
    pub mtu: Option<u32>,
    /// Reconcile at least this often, to repair drift.
    pub resync: Duration,
    /// Wait this long after a change for more changes before reconciling.
    pub debounce: Duration,
}

/// Keeps this node's fabric at the state the API describes (none at all without remote
/// clusters) until `shutdown`, then tears it down. Returns an error only when the kernel adapter cannot be opened or the final teardown
/// fails; reconcile errors are logged, counted and retried.
pub async fn run_node(
    client: Client,
    config: NodeConfig,
    metrics: FabricMetrics,
    readiness: Readiness,
    shutdown: CancellationToken,
) -> Result<(), FabricRunError> {
    readiness.register(READINESS, "waiting for the first fabric reconcile");
    let changed = Arc::new(Notify::new());
    let mut watches = JoinSet::new();
    let (pods, synced_pods) = spawn_watch(
        &mut watches,
        Api::<Pod>::all(client.clone()),
        watcher::Config::default().labels(&format!(
            "{}={}",
            labels::COMPONENT,
            labels::COMPONENT_GATEWAY
        )),
        "pods",
        changed.clone(),
    );
    let (configurations, synced_configurations) = spawn_watch(
        &mut watches,
        Api::<Configuration>::all(client.clone()),
        watcher::Config::default().labels(labels::REMOTE_CLUSTER_ID),
        "configurations",
        changed.clone(),
    );
    let (connections, synced_connections) = spawn_watch(
        &mut watches,
        Api::<Connection>::all(client.clone()),
        watcher::Config::default().labels(labels::REMOTE_CLUSTER_ID),
        "connections",
        changed.clone(),
    );
    let (nodes, synced_nodes) = spawn_watch(
        &mut watches,
        Api::<Node>::all(client),
        watcher::Config::default().fields(&format!("metadata.name={}", config.node_name)),
        "nodes",
        changed.clone(),
    );
    let synced = [
        synced_pods,
        synced_configurations,
        synced_connections,
        synced_nodes,
    ];
    let mut applier = Applier::new(
        &config.template.device,
        &config.template.table,
        Some(metrics),
    )?;
    let mut tick = tokio::time::interval(config.resync);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_notes = Vec::new();
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            () = changed.notified() => {
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    () = tokio::time::sleep(config.debounce) => {}
                }
            }
            _ = tick.tick() => {}
        }
        // Before every cache has listed once, an empty cache would read as "no remote
        // clusters" and tear routes down.
        if !synced.iter().all(|s| s.load(Ordering::Acquire)) {
            continue;
        }
        let view = View {
            pods: cloned(&pods),
            configurations: cloned(&configurations),
            connections: cloned(&connections),
            nodes: cloned(&nodes),
        };
        match reconcile_node(&mut applier, &config, &view, &mut last_notes).await {
            Ok(routes) => {
                readiness.set_ready(READINESS);
                tracing::debug!(routes, "fabric reconciled");
            }
            Err(error) => {
                readiness.set_not_ready(READINESS, error.to_string());
                tracing::warn!(error = %error, "fabric reconcile failed; retrying");
            }
        }
    }
    watches.abort_all();
    tracing::info!("shutting down: removing the fabric");
    applier.teardown().await
}

struct View {
    pods: Vec<Pod>,
    configurations: Vec<Configuration>,
    connections: Vec<Connection>,
    nodes: Vec<Node>,
}

async fn reconcile_node(
    applier: &mut Applier,
    config: &NodeConfig,
    view: &View,
    last_notes: &mut Vec<String>,
) -> Result<usize, FabricRunError> {
    let node = view
        .nodes
        .iter()
        .find(|n| n.metadata.name.as_deref() == Some(config.node_name.as_str()))
        .ok_or_else(|| FabricRunError::NodeMissing {
            node: config.node_name.clone(),
        })?;
    let local_ip = node_internal_ip(node).ok_or_else(|| FabricRunError::NoNodeAddress {
        node: config.node_name.clone(),
    })?;
    let mtu = match config.mtu {
        Some(mtu) => mtu,
        None => applier.device_mtu_for(local_ip).await?,
    };
    let settings = Settings {
        local_ip,
        mtu,
        ..config.template.clone()
    };
    let built = node_input(
        &settings,
        &view.pods,
        &view.configurations,
        &view.connections,
    );
    // Say why something is left out once, not on every resync.
    if built.notes != *last_notes {
        for note in &built.notes {
            tracing::info!(note = %note, "fabric input");
        }
        last_notes.clone_from(&built.notes);
    }
    // With no remote cluster a node needs no device, table or route: after the last unpeer
    // (or before the first peering) nothing of Tether stays in its network namespace.
    if built.input.peers.is_empty() && built.input.unreachable.is_empty() {
        applier.teardown().await?;
        return Ok(0);
    }
    Ok(applier.apply(&built.input).await?.routes.len())
}

fn cloned<K: Resource + Clone>(store: &Store<K>) -> Vec<K>
where
    K::DynamicType: Eq + Hash + Clone,
{
    store.state().iter().map(|k| (**k).clone()).collect()
}

/// Starts a reflector for `api` that wakes `changed` on every event; returns its store and a
/// flag set once it has listed.
fn spawn_watch<K>(
    set: &mut JoinSet<()>,
    api: Api<K>,
    config: watcher::Config,
    resource: &'static str,
    changed: Arc<Notify>,
) -> (Store<K>, Arc<AtomicBool>)
where
    K: Resource + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone,
{
    let (store, writer) = reflector::store::<K>();
    let synced = Arc::new(AtomicBool::new(false));
    let flag = synced.clone();
    set.spawn(async move {
        let stream = watcher(api, config)
            .default_backoff()
            .modify(|object: &mut K| {
                object.managed_fields_mut().clear();
                object.annotations_mut().clear();
            })
            .reflect(writer);
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            match event {
                Ok(watcher::Event::InitDone) => {
                    if !flag.swap(true, Ordering::Release) {
                        tracing::info!(resource, "watch synced");
                    }
                    changed.notify_one();
                }
                Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_)) => changed.notify_one(),
                Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => {}
                Err(error) => tracing::warn!(resource, %error, "watch failed; retrying"),
            }
        }
    });
    (store, synced)
}
