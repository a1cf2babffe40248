//! The life cycle of a gateway driven by objects: reflectors on its GatewayServer or
//! GatewayClient, the Configurations and the key Secret of its namespace (and the Nodes, for
//! the fabric); on every change, translate, and when the configuration differs, stop the
//! running tunnel and start the new one in the same process (the WireGuard device and the TUN
//! devices are fixed for a run). A change of the published addresses alone (the
//! Configuration's `status.published`) is applied to the running tunnel in place. Once a
//! second, the Connection `tether-gateway` gets the assessment, written only when it changed.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource, ResourceExt};
use prometheus_client::registry::Registry;
use tether_api::conditions::{self, Status, Time};
use tether_api::names::objects;
use tether_api::networking::{
    Configuration, Connection, ConnectionSpec, ConnectionState, ConnectionStatus, GatewayClient,
    GatewayServer, Latency,
};
use tether_runtime::{Health, Shutdown};
use tokio::sync::Notify;

use super::status::{self, Assessment, Context, Sample, Tracker};
use super::translate::{self, Gateway, NotReady, Objects, Settings};
use crate::config::Config;
use crate::gateway::{GatewayError, Observer, Prepared};

/// How often the Connection is re-assessed (and at most how often it is written).
const STATUS_PERIOD: Duration = Duration::from_secs(1);

/// Which gateway object this process serves.
#[derive(Clone, Debug)]
pub enum Target {
    /// `--gateway-server NAME`.
    Server(String),
    /// `--gateway-client NAME`.
    Client(String),
}

/// Why the object-driven gateway stopped.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// A write to the API server failed in a way a retry will not fix.
    #[error("cannot write Connection {namespace}/{name}: {source}")]
    Connection {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// kube's error.
        #[source]
        source: kube::Error,
    },
}

/// The reflectors' views of the namespace.
struct Views {
    servers: Store<GatewayServer>,
    clients: Store<GatewayClient>,
    configurations: Store<Configuration>,
    secrets: Store<Secret>,
    nodes: Store<Node>,
}

/// The tunnel of the current configuration.
struct Running {
    config: Config,
    observer: Observer,
    stop: Shutdown,
    task: tokio::task::JoinHandle<Result<(), GatewayError>>,
    started: Instant,
    tracker: Tracker,
    context: Context,
    mappings: tokio::sync::watch::Sender<Vec<tether_netplan::IpMapping>>,
}

impl Running {
    async fn stop(self) {
        self.stop.trigger();
        match self.task.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "the previous tunnel stopped with an error"),
            Err(e) => tracing::warn!(error = %e, "the previous tunnel task failed"),
        }
    }
}

/// Runs the gateway for `target` in `namespace` until `shutdown`. Must run inside a
/// [`tokio::task::LocalSet`]: the tunnel's life cycle holds the kernel adapter, which is not
/// `Send`.
pub async fn run(
    client: kube::Client,
    namespace: String,
    target: Target,
    mut settings: Settings,
    registry: Arc<Mutex<Registry>>,
    health: Health,
    shutdown: Shutdown,
) -> Result<(), ClusterError> {
    if settings.underlay_mtu.is_none() {
        settings.underlay_mtu = default_route_mtu();
    }
    tracing::info!(underlay_mtu = ?settings.underlay_mtu, "underlay MTU of the default route");
    let changed = Arc::new(Notify::new());
    let (views, watchers) = start_reflectors(&client, &namespace, &target, &changed);
    let connections: Api<Connection> = Api::namespaced(client, &namespace);

    let mut running: Option<Running> = None;
    let mut last_written: Option<ConnectionStatus> = None;
    let mut last_write = Instant::now() - STATUS_PERIOD;
    let mut conditions_now: Vec<conditions::Condition> = Vec::new();
    let mut first_run = true;
    let mut fabric = settings.fabric_ip.map(Fabric::new);
    let mut last_handshakes = 0u64;
    let mut last_handshake: Option<Time> = None;
    let mut latency: Option<Latency> = None;
    let mut tick = tokio::time::interval(STATUS_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let result = loop {
        tokio::select! {
            () = shutdown.cancelled() => break Ok(()),
            () = changed.notified() => {}
            _ = tick.tick() => {}
        }
        if let Some(f) = fabric.as_mut() {
            f.sync(&views.nodes).await;
        }
        let Some(gateway) = current_gateway(&views, &target) else {
            // Without the gateway object there is no Connection to own; wait.
            if let Some(r) = running.take() {
                tracing::info!("the gateway object is gone: stopping the tunnel");
                r.stop().await;
            }
            continue;
        };
        let secret = views
            .secrets
            .state()
            .into_iter()
            .find(|s| s.name_any() == gateway.secret_name());
        let configurations: Vec<Configuration> = views
            .configurations
            .state()
            .iter()
            .map(|c| (**c).clone())
            .collect();
        let objects = Objects {
            namespace: &namespace,
            gateway: &gateway,
            secret: secret.as_deref(),
            configurations: &configurations,
        };
        let wanted = translate::translate(&objects, &settings);
        let mut problem: Option<NotReady> = None;
        match wanted {
            Ok(config) => {
                let changes = running
                    .as_ref()
                    .map(|r| translate::changed_fields(&r.config, &config));
                if let Some(r) = running.as_mut()
                    && changes.as_ref().is_some_and(Vec::is_empty)
                    && r.config.ip_mappings != config.ip_mappings
                {
                    tracing::info!(
                        published = config.ip_mappings.len(),
                        "published addresses changed (Configuration status.published): \
                         updating the running tunnel in place"
                    );
                    r.config.ip_mappings = config.ip_mappings.clone();
                    r.mappings.send_replace(config.ip_mappings);
                } else if changes.as_ref().is_none_or(|c| !c.is_empty()) {
                    if let Some(r) = running.take() {
                        tracing::info!(
                            changed = %changes.unwrap_or_default().join(", "),
                            "configuration changed: rebuilding the tunnel in this process"
                        );
                        r.stop().await;
                    }
                    match Prepared::new(config.clone()) {
                        Ok(prepared) => {
                            let registry = if first_run {
                                registry.clone()
                            } else {
                                // Collectors cannot be unregistered: the first run's metrics
                                // stay registered and later runs report only through logs.
                                Arc::new(Mutex::new(Registry::default()))
                            };
                            first_run = false;
                            running = Some(start(prepared, &gateway, registry, &health));
                            last_handshakes = 0;
                        }
                        Err(e) => problem = Some(translate::planning_error(&objects, &e)),
                    }
                }
            }
            Err(nr) => {
                if let Some(r) = running.take() {
                    tracing::info!(why = %nr, "the objects no longer describe a tunnel: stopping it");
                    r.stop().await;
                }
                problem = Some(nr);
            }
        }
        if let Some(r) = &running
            && r.task.is_finished()
        {
            let r = running.take().expect("just checked");
            let message = match r.task.await {
                Ok(Err(e)) => e.to_string(),
                Ok(Ok(())) => "the tunnel stopped".to_owned(),
                Err(e) => e.to_string(),
            };
            tracing::warn!(error = %message, "tunnel failed; retrying with the next change or tick");
            problem = Some(NotReady::Invalid {
                object: format!("{} {namespace}/{}", gateway.kind(), gateway.name()),
                field: "spec".into(),
                message,
            });
        }
        let (assessment, mtu) = match (&mut running, &problem) {
            (Some(r), None) => {
                let now = Instant::now();
                let stats = r.observer.device.stats(tether_wg::PeerIndex(0), now);
                let counters = r.observer.device.counters();
                let sample = Sample {
                    at: now.saturating_duration_since(r.started),
                    last_handshake_age: stats.last_handshake_age,
                    probe: r.observer.probes.snapshot(0, now),
                    rejected_handshakes: counters.invalid_mac() + counters.unknown_key(),
                };
                if stats.handshakes != last_handshakes {
                    last_handshakes = stats.handshakes;
                    last_handshake = stats.last_handshake_age.map(|age| {
                        let at = k8s_openapi::jiff::Timestamp::now()
                            - k8s_openapi::jiff::SignedDuration::from_secs(
                                i64::try_from(age.as_secs()).unwrap_or(0),
                            );
                        Time(
                            k8s_openapi::jiff::Timestamp::from_second(at.as_second()).unwrap_or(at),
                        )
                    });
                }
                (r.tracker.observe(&r.context, &sample), Some(r.config.mtu))
            }
            (_, Some(p)) => (status::not_ready(p), None),
            (None, None) => continue,
        };
        if latency.as_ref().map(|l| &l.value) != assessment.latency.as_ref() {
            latency = assessment.latency.clone().map(|value| Latency {
                value,
                timestamp: Time(k8s_openapi::jiff::Timestamp::now()),
            });
        }
        let wanted = desired_status(
            &assessment,
            &mut conditions_now,
            latency.clone(),
            last_handshake.clone(),
            mtu,
        );
        if last_written.as_ref() == Some(&wanted) || last_write.elapsed() < STATUS_PERIOD / 2 {
            continue;
        }
        match write_connection(&connections, &gateway, &wanted).await {
            Ok(()) => {
                if last_written.as_ref().map(|s| s.value) != Some(wanted.value) {
                    tracing::info!(
                        state = ?assessment.state,
                        reason = assessment.reason,
                        message = %assessment.message,
                        "connection state"
                    );
                }
                last_written = Some(wanted);
                last_write = Instant::now();
            }
            Err(e) => tracing::warn!(error = %e, "cannot write the Connection; retrying"),
        }
    };
    if let Some(r) = running.take() {
        r.stop().await;
    }
    for w in watchers {
        w.abort();
    }
    result
}

fn start(
    prepared: Prepared,
    gateway: &Gateway,
    registry: Arc<Mutex<Registry>>,
    health: &Health,
) -> Running {
    let config = prepared.config().clone();
    let observer = prepared.observer();
    let stop = Shutdown::new();
    let peer = &config.peers[0];
    tracing::info!(
        remote = %peer.id,
        real = %peer.pod_cidr,
        local_view = ?peer.pod_local_view,
        endpoint = ?peer.endpoint,
        mtu = config.mtu,
        "starting the tunnel"
    );
    let context = Context {
        type_: gateway.type_(),
        endpoint: peer.endpoint,
        object: format!(
            "{} {}/{}",
            gateway.kind(),
            match gateway {
                Gateway::Server(s) => s.namespace().unwrap_or_default(),
                Gateway::Client(c) => c.namespace().unwrap_or_default(),
            },
            gateway.name()
        ),
    };
    let (mappings, updates) = tokio::sync::watch::channel(config.ip_mappings.clone());
    let task = tokio::task::spawn_local(prepared.follow_ip_mappings(updates).run(
        registry,
        health.clone(),
        stop.clone(),
    ));
    Running {
        config,
        observer,
        stop,
        task,
        started: Instant::now(),
        tracker: Tracker::default(),
        context,
        mappings,
    }
}

fn desired_status(
    a: &Assessment,
    conds: &mut Vec<conditions::Condition>,
    latency: Option<Latency>,
    last_handshake: Option<Time>,
    mtu: Option<u32>,
) -> ConnectionStatus {
    let status = match a.state {
        ConnectionState::Connected => Status::True,
        _ => Status::False,
    };
    conditions::set(
        conds,
        conditions::types::READY,
        status,
        a.reason,
        a.message.clone(),
        None,
        Time(k8s_openapi::jiff::Timestamp::now()),
    );
    ConnectionStatus {
        value: Some(a.state),
        latency: if a.state == ConnectionState::Connected {
            latency
        } else {
            None
        },
        last_handshake,
        mtu,
        conditions: conds.clone(),
    }
}

/// Creates the Connection when absent (owned by the gateway object) and writes its status.
async fn write_connection(
    api: &Api<Connection>,
    gateway: &Gateway,
    status: &ConnectionStatus,
) -> Result<(), kube::Error> {
    let name = objects::GATEWAY;
    if api.get_opt(name).await?.is_none() {
        let owner = match gateway {
            Gateway::Server(s) => s.controller_owner_ref(&()),
            Gateway::Client(c) => c.controller_owner_ref(&()),
        };
        let mut labels = tether_api::names::labels::managed();
        labels.insert(
            tether_api::names::labels::REMOTE_CLUSTER_ID.to_owned(),
            gateway.remote_cluster_id().to_owned(),
        );
        let conn = Connection {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                labels: Some(labels),
                owner_references: owner.map(|o: OwnerReference| vec![o]),
                ..Default::default()
            },
            spec: ConnectionSpec {
                remote_cluster_id: gateway.remote_cluster_id().to_owned(),
                type_: gateway.type_(),
                gateway_ref: tether_api::core::LocalObjectRef {
                    name: gateway.name().to_owned(),
                },
            },
            status: None,
        };
        match api.create(&PostParams::default(), &conn).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(e),
        }
    }
    // A merge patch replaces the lists it names (conditions) and leaves out what is absent,
    // so absent fields are written as null to clear them.
    let mut body = serde_json::to_value(status).unwrap_or_default();
    if let Some(map) = body.as_object_mut() {
        for key in ["latency", "lastHandshake", "mtu"] {
            map.entry(key).or_insert(serde_json::Value::Null);
        }
    }
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({ "status": body })),
    )
    .await?;
    Ok(())
}

fn current_gateway(views: &Views, target: &Target) -> Option<Gateway> {
    match target {
        Target::Server(name) => views
            .servers
            .state()
            .into_iter()
            .find(|s| s.name_any() == *name)
            .map(|s| Gateway::Server((*s).clone())),
        Target::Client(name) => views
            .clients
            .state()
            .into_iter()
            .find(|c| c.name_any() == *name)
            .map(|c| Gateway::Client((*c).clone())),
    }
}

fn start_reflectors(
    client: &kube::Client,
    namespace: &str,
    target: &Target,
    changed: &Arc<Notify>,
) -> (Views, Vec<tokio::task::JoinHandle<()>>) {
    let mut handles = Vec::new();
    let name = match target {
        Target::Server(n) | Target::Client(n) => n.clone(),
    };
    let by_name = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let servers = spawn_reflector(
        Api::<GatewayServer>::namespaced(client.clone(), namespace),
        if matches!(target, Target::Server(_)) {
            by_name.clone()
        } else {
            // Not served: an impossible name keeps the store empty without a second type.
            watcher::Config::default().fields("metadata.name=-")
        },
        changed,
        &mut handles,
    );
    let clients = spawn_reflector(
        Api::<GatewayClient>::namespaced(client.clone(), namespace),
        if matches!(target, Target::Client(_)) {
            by_name
        } else {
            watcher::Config::default().fields("metadata.name=-")
        },
        changed,
        &mut handles,
    );
    let configurations = spawn_reflector(
        Api::<Configuration>::namespaced(client.clone(), namespace),
        watcher::Config::default(),
        changed,
        &mut handles,
    );
    // Named: the namespace holds other Secrets the gateway must not read.
    let secrets = spawn_reflector(
        Api::<Secret>::namespaced(client.clone(), namespace),
        watcher::Config::default()
            .fields(&format!("metadata.name={}", objects::GATEWAY_KEY_SECRET)),
        changed,
        &mut handles,
    );
    // For the fabric: which node routes which pod CIDRs. Not waited for.
    let nodes = spawn_reflector(
        Api::<Node>::all(client.clone()),
        watcher::Config::default(),
        &Arc::new(Notify::new()),
        &mut handles,
    );
    (
        Views {
            servers,
            clients,
            configurations,
            secrets,
            nodes,
        },
        handles,
    )
}

fn spawn_reflector<K>(
    api: Api<K>,
    config: watcher::Config,
    changed: &Arc<Notify>,
    handles: &mut Vec<tokio::task::JoinHandle<()>>,
) -> Store<K>
where
    K: Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (store, writer) = reflector::store();
    let changed = changed.clone();
    let kind = K::kind(&()).into_owned();
    let stream = reflector::reflector(writer, watcher(api, config))
        .default_backoff()
        .touched_objects();
    handles.push(tokio::spawn(async move {
        futures::pin_mut!(stream);
        while let Some(event) = stream.next().await {
            match event {
                Ok(_) => changed.notify_one(),
                Err(e) => tracing::warn!(kind = %kind, error = %e, "watch failed; retrying"),
            }
        }
    }));
    store
}

/// This gateway pod's end of the fabric: a VXLAN device routing each node's pod CIDRs to that
/// node, kept in step with the Nodes (on change, and every [`FABRIC_REPAIR`] to undo drift).
struct Fabric {
    local_ip: std::net::Ipv4Addr,
    applier: Option<tether_fabric::Applier>,
    applied: Option<Vec<(std::net::Ipv4Addr, Vec<ipnet::Ipv4Net>)>>,
    last_apply: Instant,
}

/// How often the fabric is re-applied although the Nodes did not change.
const FABRIC_REPAIR: Duration = Duration::from_secs(10);

impl Fabric {
    fn new(local_ip: std::net::Ipv4Addr) -> Self {
        Self {
            local_ip,
            applier: None,
            applied: None,
            last_apply: Instant::now(),
        }
    }

    async fn sync(&mut self, nodes: &Store<Node>) {
        let peers = fabric_peers_of(nodes);
        if self.applied.as_ref() == Some(&peers) && self.last_apply.elapsed() < FABRIC_REPAIR {
            return;
        }
        if self.applier.is_none() {
            match tether_fabric::Applier::new(
                tether_api::names::fabric::DEVICE,
                tether_netplan::DEFAULT_FABRIC_TABLE,
                None,
            ) {
                Ok(a) => self.applier = Some(a),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot open the fabric's kernel adapter");
                    return;
                }
            }
        }
        let applier = self.applier.as_mut().expect("just set");
        let mtu = match applier.device_mtu_for(self.local_ip).await {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the uplink MTU for the fabric");
                return;
            }
        };
        let nodes: Vec<Node> = nodes.state().iter().map(|n| (**n).clone()).collect();
        let built =
            tether_fabric::gateway_input(&tether_fabric::Settings::new(self.local_ip, mtu), &nodes);
        for note in &built.notes {
            tracing::debug!(note = %note, "fabric input");
        }
        self.last_apply = Instant::now();
        match applier.apply(&built.input).await {
            Ok(_) => {
                if self.applied.as_ref() != Some(&peers) {
                    tracing::info!(nodes = peers.len(), "fabric to the nodes applied");
                }
                self.applied = Some(peers);
            }
            Err(e) => tracing::warn!(error = %e, "applying the fabric failed; retrying"),
        }
    }
}

/// The Node reflector's current fabric peers (for the fabric device).
pub fn fabric_peers_of(nodes: &Store<Node>) -> Vec<(std::net::Ipv4Addr, Vec<ipnet::Ipv4Net>)> {
    let nodes: Vec<Node> = nodes.state().iter().map(|n| (**n).clone()).collect();
    super::fabric::fabric_peers(&nodes)
}

/// The MTU of the interface the default route leaves through, when it can be read: the
/// route from this network namespace's `/proc/self/net/route`, the MTU from sysfs (which a
/// container runtime mounts for the pod's namespace).
pub fn default_route_mtu() -> Option<u32> {
    let routes = std::fs::read_to_string("/proc/self/net/route").ok()?;
    let interface = routes.lines().skip(1).find_map(|l| {
        let mut f = l.split_whitespace();
        let name = f.next()?;
        (f.next()? == "00000000").then(|| name.to_owned())
    })?;
    std::fs::read_to_string(format!("/sys/class/net/{interface}/mtu"))
        .ok()?
        .trim()
        .parse()
        .ok()
}
