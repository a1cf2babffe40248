//! The agent's life cycle: register the Node, keep its Lease and status fresh, watch the pods
//! bound to it, and run one worker per pod (sandbox, container supervisors, status, deletion).

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Container, Node, Pod, PodStatus, Secret};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use serde_json::json;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::backoff::Backoff;
use crate::containers::{ContainerKey, Containers, RunningContainer};
use crate::env::{self, Sources};
use crate::error::Error;
use crate::images::ImageTable;
use crate::ipam::PodIpAllocator;
use crate::kubelet::{self, LiveLogs};
use crate::metrics::{Metrics, RestartReason};
use crate::node_status::{self, NodeIdentity};
use crate::pod_status::{self, ContainerPhase, ContainerRecord, PodRecord, Termination};
use crate::pod_volumes::{self, PodVolumes, VolumeSettings};
use crate::prober::{ContainerProber, EventRecorder, EventType, ProbeTarget, Step as ProbeStep};
use crate::process::{ContainerProcess, Launch, Mount};
use crate::sandbox::{self, SandboxNames};
use crate::volumes::NodeResources;

/// The agent thread's own network namespace (the node's), for host-network containers; opened
/// by the thread that spawns the container, so it names the node namespace.
const OWN_NETNS: &str = "/proc/thread-self/ns/net";

/// The field manager of every write the agent makes.
pub const FIELD_MANAGER: &str = "simkube-node";

/// How the agent behaves.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// What the Node object says.
    pub identity: NodeIdentity,
    /// How images become programs.
    pub images: ImageTable,
    /// Restart back-off.
    pub backoff: Backoff,
    /// Container logs live under `<state_dir>/pods/`.
    pub state_dir: PathBuf,
    /// The Lease's duration (kubelet: 40 s).
    pub lease_duration: Duration,
    /// How often the Lease is renewed (kubelet: a quarter of the duration).
    pub lease_renew: Duration,
    /// How often the Node status is re-posted without a change (kubelet: 5 min).
    pub status_interval: Duration,
    /// `KUBERNETES_SERVICE_HOST` for pods: the API server's address as a pod reaches it.
    pub pod_api_host: String,
    /// `KUBERNETES_SERVICE_PORT` for pods.
    pub pod_api_port: u16,
    /// Time a container that stops gets when the agent shuts down.
    pub shutdown_grace: Duration,
    /// Where the kubelet endpoint listens (`None`: not served); default: InternalIP and the
    /// kubelet port.
    pub kubelet_listen: Option<std::net::SocketAddr>,
    /// Turn on IPv4 forwarding in the node namespace, so pods reach each other through the
    /// node (as a CNI plugin does). Default on.
    pub enable_forwarding: bool,
    /// Names of sandbox namespaces start with this (default `sk-<node>-`); every namespace with
    /// this prefix belongs to this agent and is removed when it starts.
    pub netns_prefix: String,
    /// The service proxy and the routes to other nodes' pod CIDRs (`None`: the agent
    /// manages neither); see [`crate::proxy`].
    pub proxy: Option<crate::proxy::ProxyConfig>,
    /// Cluster DNS servers written into pods' resolv.conf (empty: pods keep the host's).
    pub cluster_dns: Vec<IpAddr>,
    /// The cluster domain (`cluster.local`).
    pub cluster_domain: String,
    /// How often ConfigMap, Secret, downward-API and token volumes are resynchronised
    /// (kubelet: about a minute).
    pub volume_sync_period: Duration,
}

impl AgentConfig {
    /// Defaults as the kubelet has them, for `identity` and `images`.
    pub fn new(identity: NodeIdentity, images: ImageTable, state_dir: PathBuf) -> Self {
        let pod_api_host = identity.internal_ip.to_string();
        Self {
            netns_prefix: sandbox::netns_prefix(&identity.name),
            enable_forwarding: true,
            kubelet_listen: Some(std::net::SocketAddr::new(
                identity.internal_ip,
                identity.kubelet_port,
            )),
            identity,
            images,
            backoff: Backoff::default(),
            state_dir,
            lease_duration: Duration::from_secs(40),
            lease_renew: Duration::from_secs(10),
            status_interval: Duration::from_secs(60),
            pod_api_host,
            pod_api_port: 443,
            shutdown_grace: Duration::from_secs(5),
            proxy: None,
            cluster_dns: Vec::new(),
            cluster_domain: "cluster.local".to_owned(),
            volume_sync_period: Duration::from_secs(60),
        }
    }
}

struct Ctx {
    client: Client,
    config: AgentConfig,
    ipam: Mutex<PodIpAllocator>,
    live_logs: LiveLogs,
    containers: Containers,
    metrics: Metrics,
}

impl Ctx {
    fn node(&self) -> &str {
        &self.config.identity.name
    }

    fn gateway(&self) -> Ipv4Addr {
        self.ipam
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .gateway()
    }
}

/// The node agent.
pub struct Agent {
    ctx: Arc<Ctx>,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("node", &self.ctx.node())
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Clone)]
enum PodMsg {
    Current(Arc<Pod>),
    Gone,
}

impl Agent {
    /// An agent for `config`, talking to the API server through `client`.
    pub fn new(client: Client, config: AgentConfig) -> Result<Self, Error> {
        let ipam = PodIpAllocator::new(config.identity.pod_cidr)
            .map_err(|e| Error::Config(e.to_string()))?;
        let prefix = &config.netns_prefix;
        if prefix.is_empty() || prefix.len() > 210 || prefix.contains('/') {
            return Err(Error::Config(format!(
                "netns prefix {prefix:?} must be 1-210 characters without '/'"
            )));
        }
        if let Some(proxy) = &config.proxy {
            crate::proxy::validate(proxy).map_err(|e| Error::Config(e.to_string()))?;
        }
        Ok(Self {
            ctx: Arc::new(Ctx {
                client,
                config,
                ipam: Mutex::new(ipam),
                live_logs: LiveLogs::default(),
                containers: Containers::default(),
                metrics: Metrics::default(),
            }),
        })
    }

    /// Registers the node and runs until `shutdown` is cancelled; then stops every container,
    /// removes every sandbox and returns (the pods stay in the API, as with a stopped kubelet).
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), Error> {
        let ctx = self.ctx;
        std::fs::create_dir_all(ctx.config.state_dir.join("pods")).map_err(|source| Error::Io {
            action: format!("create {}", ctx.config.state_dir.display()),
            source,
        })?;
        // Containers die with the agent (parent-death signal), so every sandbox found now is
        // an orphan of a previous run; pods still bound here are started afresh.
        let prefix = &ctx.config.netns_prefix;
        for (netns, uid) in sandbox::list(prefix) {
            tracing::info!(%netns, "removing the sandbox of a previous agent run");
            sandbox::remove(&sandbox::names(prefix, &uid)).await?;
        }
        if ctx.config.enable_forwarding {
            // Synchronous on purpose: /proc/sys/net belongs to the namespace of the thread that
            // opens it, and this thread is in the node namespace.
            std::fs::write("/proc/sys/net/ipv4/ip_forward", "1").map_err(|source| Error::Io {
                action: "enable IPv4 forwarding in the node namespace".to_owned(),
                source,
            })?;
        }
        let kubelet_server = match ctx.config.kubelet_listen {
            Some(addr) => {
                let listener = tokio::net::TcpListener::bind(addr)
                    .await
                    .map_err(|source| Error::Io {
                        action: format!("listen on {addr} for the kubelet endpoint"),
                        source,
                    })?;
                let tls = kubelet::tls_config(ctx.node(), addr.ip())
                    .map_err(|e| Error::Config(e.to_string()))?;
                // Every part of the agent with metrics registers them here, for `/metrics`.
                let mut registry = prometheus_client::registry::Registry::default();
                ctx.metrics.register(&mut registry);
                if let Some(proxy) = &ctx.config.proxy {
                    proxy.stats.register(&mut registry);
                }
                let router = kubelet::router(kubelet::Endpoint {
                    state_dir: ctx.config.state_dir.clone(),
                    live: ctx.live_logs.clone(),
                    containers: ctx.containers.clone(),
                    metrics: ctx.metrics.clone(),
                    registry: Arc::new(registry),
                });
                Some(tokio::spawn(kubelet::serve(
                    listener,
                    router,
                    tls,
                    shutdown.clone(),
                )))
            }
            None => None,
        };
        register(&ctx).await?;
        tracing::info!(node = %ctx.node(), "node registered");
        let heartbeat = tokio::spawn(heartbeat(ctx.clone(), shutdown.clone()));
        // Spawned from this thread, so its `nft` and `ip` children run in the node namespace.
        let proxy = ctx.config.proxy.clone().map(|config| {
            let node = crate::proxy::ProxyNode {
                name: ctx.node().to_owned(),
                pod_cidr: Some(ctx.config.identity.pod_cidr),
            };
            tokio::spawn(crate::proxy::run(
                ctx.client.clone(),
                node,
                config,
                shutdown.clone(),
            ))
        });

        let pods: Api<Pod> = Api::all(ctx.client.clone());
        let config = watcher::Config::default().fields(&format!("spec.nodeName={}", ctx.node()));
        let mut events = std::pin::pin!(watcher::watcher(pods, config).default_backoff());
        let mut workers: HashMap<String, watch::Sender<PodMsg>> = HashMap::new();
        let mut tasks = JoinSet::new();
        let mut listed: Option<Vec<String>> = None;
        loop {
            let event = tokio::select! {
                () = shutdown.cancelled() => break,
                Some(_) = tasks.join_next(), if !tasks.is_empty() => continue,
                event = events.next() => event,
            };
            let event = match event {
                Some(Ok(event)) => event,
                Some(Err(error)) => {
                    tracing::warn!(%error, "pod watch failed; retrying");
                    continue;
                }
                None => break,
            };
            match event {
                Event::Init => listed = Some(Vec::new()),
                Event::InitApply(pod) | Event::Apply(pod) => {
                    let Some(uid) = pod.metadata.uid.clone() else {
                        continue;
                    };
                    if let Some(seen) = listed.as_mut() {
                        seen.push(uid.clone());
                    }
                    workers.retain(|_, tx| !tx.is_closed());
                    match workers.get(&uid) {
                        Some(tx) => {
                            let _ = tx.send(PodMsg::Current(Arc::new(pod)));
                        }
                        None => {
                            let (tx, rx) = watch::channel(PodMsg::Current(Arc::new(pod)));
                            workers.insert(uid.clone(), tx);
                            tasks.spawn(pod_worker(ctx.clone(), uid, rx, shutdown.clone()));
                        }
                    }
                }
                Event::Delete(pod) => {
                    if let Some(tx) = pod.metadata.uid.as_ref().and_then(|u| workers.get(u)) {
                        let _ = tx.send(PodMsg::Gone);
                    }
                }
                Event::InitDone => {
                    if let Some(seen) = listed.take() {
                        for (uid, tx) in &workers {
                            if !seen.contains(uid) {
                                let _ = tx.send(PodMsg::Gone);
                            }
                        }
                    }
                }
            }
        }
        shutdown.cancel();
        while tasks.join_next().await.is_some() {}
        let _ = heartbeat.await;
        // The proxy removes its table and routes before it ends.
        if let Some(proxy) = proxy {
            match proxy.await {
                Ok(Ok(())) => {}
                Ok(Err(error)) => tracing::error!(%error, "service proxy failed"),
                Err(error) => tracing::error!(%error, "service proxy task failed"),
            }
        }
        if let Some(server) = kubelet_server {
            let _ = server.await;
        }
        tracing::info!(node = %ctx.node(), "node agent stopped");
        Ok(())
    }
}

async fn register(ctx: &Ctx) -> Result<(), Error> {
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    let node = node_status::node_object(&ctx.config.identity);
    match nodes.create(&PostParams::default(), &node).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 409 => {
            tracing::info!(node = %ctx.node(), "node already registered; taking it over");
        }
        Err(e) => return Err(Error::api(format!("register node {}", ctx.node()))(e)),
    }
    post_node_status(ctx, None).await.map(drop)
}

async fn post_node_status(
    ctx: &Ctx,
    previous: Option<&k8s_openapi::api::core::v1::NodeStatus>,
) -> Result<k8s_openapi::api::core::v1::NodeStatus, Error> {
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    let status =
        node_status::node_status(&ctx.config.identity, previous, true, "", Timestamp::now());
    nodes
        .patch_status(
            ctx.node(),
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": status })),
        )
        .await
        .map_err(Error::api(format!("update status of node {}", ctx.node())))?;
    Ok(status)
}

async fn heartbeat(ctx: Arc<Ctx>, shutdown: CancellationToken) {
    let leases: Api<Lease> = Api::namespaced(ctx.client.clone(), node_status::LEASE_NAMESPACE);
    let duration = i32::try_from(ctx.config.lease_duration.as_secs()).unwrap_or(i32::MAX);
    let mut status: Option<k8s_openapi::api::core::v1::NodeStatus> = None;
    let mut last_status = Instant::now();
    loop {
        let lease = node_status::lease(ctx.node(), duration, Timestamp::now());
        let params = PatchParams::apply(FIELD_MANAGER).force();
        if let Err(error) = leases
            .patch(ctx.node(), &params, &Patch::Apply(&lease))
            .await
        {
            tracing::warn!(node = %ctx.node(), %error, "cannot renew the node lease");
        }
        if status.is_none() || last_status.elapsed() >= ctx.config.status_interval {
            match post_node_status(&ctx, status.as_ref()).await {
                Ok(s) => {
                    status = Some(s);
                    last_status = Instant::now();
                }
                Err(Error::Api {
                    source: kube::Error::Api(s),
                    ..
                }) if s.code == 404 => {
                    // Someone deleted the Node: register again, as the kubelet does.
                    tracing::warn!(node = %ctx.node(), "node object deleted; registering again");
                    if let Err(error) = register(&ctx).await {
                        tracing::warn!(%error, "cannot register the node again");
                    }
                }
                Err(error) => tracing::warn!(%error, "cannot post node status"),
            }
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(ctx.config.lease_renew) => {}
        }
    }
}

fn pod_key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

fn grace_of(pod: &Pod) -> Duration {
    let seconds = pod
        .metadata
        .deletion_grace_period_seconds
        .or_else(|| {
            pod.spec
                .as_ref()
                .and_then(|s| s.termination_grace_period_seconds)
        })
        .unwrap_or(30);
    Duration::from_secs(u64::try_from(seconds).unwrap_or(0))
}

/// How a pod worker ends.
enum Ending {
    /// The pod is being deleted: stop with its grace period, then finish the deletion.
    Deleted(Duration),
    /// The pod is gone from the API already.
    Gone,
    /// The agent is shutting down.
    Shutdown,
}

async fn pod_worker(
    ctx: Arc<Ctx>,
    uid: String,
    mut rx: watch::Receiver<PodMsg>,
    shutdown: CancellationToken,
) {
    let PodMsg::Current(pod) = rx.borrow_and_update().clone() else {
        return;
    };
    let key = pod_key(&pod);
    let names = sandbox::names(&ctx.config.netns_prefix, &uid);
    let mut reporter = Reporter::new(&ctx, &pod);
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    let ending = if pod.metadata.deletion_timestamp.is_some() {
        Ending::Deleted(grace_of(&pod))
    } else if matches!(phase, Some("Succeeded" | "Failed")) {
        // A finished pod never runs again (an agent restart must not revive it); it only
        // waits for its deletion.
        tokio::select! {
            () = shutdown.cancelled() => Ending::Shutdown,
            end = async { loop { if let Some(end) = next_msg(&mut rx).await { break end } } } => end,
        }
    } else {
        let _running = ctx.metrics.pod_running();
        run_pod(&ctx, &uid, &pod, &names, &mut rx, &mut reporter, &shutdown).await
    };
    if let Err(error) = pod_volumes::remove(&log_dir(&ctx.config.state_dir, &pod)) {
        tracing::warn!(pod = %key, %error, "cannot remove the pod's volumes");
    }
    if let Err(error) = sandbox::remove(&names).await {
        tracing::warn!(pod = %key, %error, "cannot remove the pod sandbox");
    }
    ctx.ipam
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .release(&uid);
    if let Ending::Deleted(_) = ending {
        let pods: Api<Pod> = Api::namespaced(
            ctx.client.clone(),
            pod.metadata.namespace.as_deref().unwrap_or_default(),
        );
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        let logs = log_dir(&ctx.config.state_dir, &pod);
        if let Err(error) = std::fs::remove_dir_all(&logs)
            && error.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(pod = %key, %error, "cannot remove the pod's logs");
        }
        match pods
            .delete(pod.metadata.name.as_deref().unwrap_or_default(), &params)
            .await
        {
            Ok(_) => tracing::info!(pod = %key, "pod stopped and deleted"),
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
            Err(error) => tracing::warn!(pod = %key, %error, "cannot finish the pod's deletion"),
        }
    }
}

async fn run_pod(
    ctx: &Arc<Ctx>,
    uid: &str,
    pod: &Arc<Pod>,
    names: &SandboxNames,
    rx: &mut watch::Receiver<PodMsg>,
    reporter: &mut Reporter,
    shutdown: &CancellationToken,
) -> Ending {
    let key = pod_key(pod);
    let host_network = pod
        .spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false);
    // The sandbox first: containers need the namespace, and the env needs the pod IP.
    let (pod_ip, netns) = if host_network {
        // Host-network pods share the node's namespace, which is the agent's own.
        (ctx.config.identity.internal_ip, PathBuf::from(OWN_NETNS))
    } else {
        match create_sandbox(ctx, uid, &key, names, rx, reporter, shutdown).await {
            Ok(ip) => (IpAddr::V4(ip), names.netns_path()),
            Err(end) => return end,
        }
    };
    tracing::info!(pod = %key, %pod_ip, netns = %netns.display(), "sandbox ready");
    reporter.record.pod_ip = Some(pod_ip);
    reporter.report().await;
    let volumes = Arc::new(PodVolumes::new(
        ctx.client.clone(),
        VolumeSettings {
            sync_period: ctx.config.volume_sync_period,
            cluster_dns: ctx.config.cluster_dns.clone(),
            cluster_domain: ctx.config.cluster_domain.clone(),
            node: NodeResources {
                cpu: ctx.config.identity.cpu.clone(),
                memory: ctx.config.identity.memory.clone(),
            },
        },
        pod.clone(),
        log_dir(&ctx.config.state_dir, pod),
        pod_ip,
        ctx.node(),
    ));

    let spec = pod.spec.clone().unwrap_or_default();
    let inits = spec.init_containers.unwrap_or_default();
    let mains = spec.containers;
    let (events_tx, mut events) = mpsc::channel::<(Slot, ContainerRecord)>(64);
    let stop = CancellationToken::new();
    let (grace_tx, grace_rx) = watch::channel(ctx.config.shutdown_grace);
    let mut supervisors = JoinSet::new();
    let latest = rx.clone();
    supervisors.spawn(volumes.clone().run(
        move || match &*latest.borrow() {
            PodMsg::Current(pod) => Some(pod.clone()),
            PodMsg::Gone => None,
        },
        stop.clone(),
    ));
    let mut start = |slot: Slot, container: Container| {
        supervisors.spawn(supervise(Supervisor {
            ctx: ctx.clone(),
            pod: pod.clone(),
            slot,
            container,
            netns: netns.clone(),
            pod_ip,
            events: events_tx.clone(),
            stop: stop.clone(),
            grace: grace_rx.clone(),
            volumes: volumes.clone(),
        }));
    };
    // Init containers run one at a time, each to success, before any regular container starts.
    match inits.first() {
        Some(first) => start(Slot::Init(0), first.clone()),
        None => {
            for (index, container) in mains.iter().enumerate() {
                start(Slot::Main(index), container.clone());
            }
        }
    }
    let ending = loop {
        tokio::select! {
            () = shutdown.cancelled() => break Ending::Shutdown,
            msg = next_msg(rx) => if let Some(end) = msg { break end },
            Some((slot, record)) = events.recv() => {
                let succeeded =
                    matches!(&record.phase, ContainerPhase::Terminated(t) if t.exit_code == 0);
                let target = match slot {
                    Slot::Init(index) => reporter.record.init_containers.get_mut(index),
                    Slot::Main(index) => reporter.record.containers.get_mut(index),
                };
                if let Some(target) = target {
                    *target = record;
                }
                reporter.report().await;
                if let (Slot::Init(index), true) = (slot, succeeded) {
                    match inits.get(index + 1) {
                        Some(next) => start(Slot::Init(index + 1), next.clone()),
                        None => {
                            for (index, container) in mains.iter().enumerate() {
                                start(Slot::Main(index), container.clone());
                            }
                        }
                    }
                }
            }
        }
    };
    let grace = match ending {
        Ending::Deleted(grace) => grace,
        Ending::Gone => Duration::ZERO,
        Ending::Shutdown => ctx.config.shutdown_grace,
    };
    let _ = grace_tx.send(grace);
    stop.cancel();
    while supervisors.join_next().await.is_some() {}
    ending
}

/// Allocates the pod's address and creates its sandbox, retrying until it works or the pod
/// ends.
async fn create_sandbox(
    ctx: &Arc<Ctx>,
    uid: &str,
    key: &str,
    names: &SandboxNames,
    rx: &mut watch::Receiver<PodMsg>,
    reporter: &mut Reporter,
    shutdown: &CancellationToken,
) -> Result<Ipv4Addr, Ending> {
    loop {
        let allocated = ctx
            .ipam
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .allocate(uid);
        let attempt = match allocated {
            Ok(ip) => {
                let started = Instant::now();
                let created = sandbox::create(names, ip, ctx.gateway()).await;
                if created.is_ok() {
                    let seconds = started.elapsed().as_secs_f64();
                    ctx.metrics.sandbox_setup_seconds.observe(seconds);
                }
                created.map(|()| ip).map_err(|e| e.to_string())
            }
            Err(e) => Err(e.to_string()),
        };
        match attempt {
            Ok(ip) => return Ok(ip),
            Err(error) => {
                tracing::warn!(pod = %key, %error, "cannot create the pod sandbox; retrying");
                reporter.sandbox_error(&error).await;
            }
        }
        tokio::select! {
            () = shutdown.cancelled() => return Err(Ending::Shutdown),
            msg = next_msg(rx) => if let Some(end) = msg { return Err(end) },
            () = tokio::time::sleep(Duration::from_secs(2)) => {}
        }
    }
}

/// Waits for the next pod update that ends the pod's life; `None` for other updates.
async fn next_msg(rx: &mut watch::Receiver<PodMsg>) -> Option<Ending> {
    if rx.changed().await.is_err() {
        // The agent dropped the sender: it is shutting down.
        return Some(Ending::Shutdown);
    }
    match &*rx.borrow_and_update() {
        PodMsg::Gone => Some(Ending::Gone),
        PodMsg::Current(pod) if pod.metadata.deletion_timestamp.is_some() => {
            Some(Ending::Deleted(grace_of(pod)))
        }
        PodMsg::Current(_) => None,
    }
}

/// Writes the pod's status whenever the agent's record of it changes.
struct Reporter {
    api: Api<Pod>,
    name: String,
    record: PodRecord,
    last: Option<PodStatus>,
}

impl Reporter {
    fn new(ctx: &Ctx, pod: &Pod) -> Self {
        let spec = pod.spec.as_ref();
        let mut reporter = Self {
            api: Api::namespaced(
                ctx.client.clone(),
                pod.metadata.namespace.as_deref().unwrap_or_default(),
            ),
            name: pod.metadata.name.clone().unwrap_or_default(),
            record: PodRecord {
                restart_policy: spec
                    .and_then(|s| s.restart_policy.clone())
                    .unwrap_or_else(|| "Always".to_owned()),
                pod_ip: None,
                host_ip: ctx.config.identity.internal_ip.to_string(),
                start_time: Timestamp::now(),
                init_containers: spec
                    .and_then(|s| s.init_containers.as_ref())
                    .map(|list| {
                        list.iter()
                            .map(|c| {
                                ContainerRecord::new(&c.name, c.image.as_deref().unwrap_or(""))
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
                containers: spec
                    .map(|s| {
                        s.containers
                            .iter()
                            .map(|c| {
                                ContainerRecord::new(&c.name, c.image.as_deref().unwrap_or(""))
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
            },
            last: None,
        };
        if !reporter.record.init_containers.is_empty() {
            for c in &mut reporter.record.containers {
                c.phase = ContainerPhase::Waiting {
                    reason: "PodInitializing".to_owned(),
                    message: None,
                };
            }
        }
        reporter
    }

    async fn report(&mut self) {
        let status = pod_status::pod_status(&self.record, self.last.as_ref(), Timestamp::now());
        self.write(status).await;
    }

    async fn sandbox_error(&mut self, message: &str) {
        let mut status = pod_status::pod_status(&self.record, self.last.as_ref(), Timestamp::now());
        status.message = Some(format!("cannot create the pod sandbox: {message}"));
        status.reason = Some("SandboxCreateFailed".to_owned());
        self.write(status).await;
    }

    async fn write(&mut self, status: PodStatus) {
        if self.last.as_ref() == Some(&status) {
            return;
        }
        let mut body = json!({ "status": status });
        // A merge patch keeps fields it does not mention: clear a past sandbox error explicitly.
        if let Some(fields) = body["status"].as_object_mut() {
            for field in ["reason", "message"] {
                fields.entry(field).or_insert(serde_json::Value::Null);
            }
        }
        let patch = Patch::Merge(body);
        match self
            .api
            .patch_status(&self.name, &PatchParams::default(), &patch)
            .await
        {
            Ok(_) => self.last = Some(status),
            Err(error) => tracing::warn!(pod = %self.name, %error, "cannot update pod status"),
        }
    }
}

/// Which container of the pod a supervisor runs.
#[derive(Debug, Clone, Copy)]
enum Slot {
    Init(usize),
    Main(usize),
}

struct Supervisor {
    ctx: Arc<Ctx>,
    pod: Arc<Pod>,
    slot: Slot,
    container: Container,
    netns: PathBuf,
    pod_ip: IpAddr,
    events: mpsc::Sender<(Slot, ContainerRecord)>,
    stop: CancellationToken,
    grace: watch::Receiver<Duration>,
    volumes: Arc<PodVolumes>,
}

impl Supervisor {
    fn log_path(&self, restart: i32) -> Result<PathBuf, std::io::Error> {
        let path = log_file(
            &self.ctx.config.state_dir,
            &self.pod,
            &self.container.name,
            restart,
        );
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
            // The logs of this run and the previous one are kept, as by the kubelet.
            if let Err(error) = crate::container_log::prune(dir, restart - 1) {
                tracing::warn!(dir = %dir.display(), %error, "cannot remove old container logs");
            }
        }
        Ok(path)
    }

    async fn send(&self, record: &ContainerRecord) {
        let _ = self.events.send((self.slot, record.clone())).await;
    }

    /// Sleeps `delay` unless told to stop first; `true` when stopping.
    async fn pause(&self, delay: Duration) -> bool {
        tokio::select! {
            () = self.stop.cancelled() => true,
            () = tokio::time::sleep(delay) => false,
        }
    }

    async fn sources(&self) -> Result<Sources, String> {
        let namespace = self.pod.metadata.namespace.as_deref().unwrap_or_default();
        let (config_maps, secrets) = env::referenced(&self.container);
        let mut sources = Sources::default();
        let cms: Api<ConfigMap> = Api::namespaced(self.ctx.client.clone(), namespace);
        for name in config_maps {
            match cms.get_opt(&name).await {
                Ok(Some(cm)) => {
                    sources
                        .config_maps
                        .insert(name, cm.data.unwrap_or_default());
                }
                Ok(None) => {}
                Err(e) => return Err(format!("cannot read configmap {name:?}: {e}")),
            }
        }
        let api: Api<Secret> = Api::namespaced(self.ctx.client.clone(), namespace);
        for name in secrets {
            match api.get_opt(&name).await {
                Ok(Some(secret)) => {
                    let data: BTreeMap<String, String> = secret
                        .data
                        .unwrap_or_default()
                        .into_iter()
                        .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
                        .collect();
                    sources.secrets.insert(name, data);
                }
                Ok(None) => {}
                Err(e) => return Err(format!("cannot read secret {name:?}: {e}")),
            }
        }
        Ok(sources)
    }

    /// Everything needed to start the container, or the waiting reason and message.
    async fn prepare(
        &self,
    ) -> Result<(Vec<String>, Vec<(String, String)>, Vec<Mount>), (&'static str, String)> {
        let image = self.container.image.as_deref().unwrap_or("");
        let resolved = self
            .ctx
            .config
            .images
            .resolve(image)
            .map_err(|e| ("ErrImagePull", e.to_string()))?;
        let sources = self
            .sources()
            .await
            .map_err(|e| ("CreateContainerConfigError", e))?;
        let runtime = env::Runtime {
            pod_ip: self.pod_ip.to_string(),
            host_ip: self.ctx.config.identity.internal_ip.to_string(),
            api_host: self.ctx.config.pod_api_host.clone(),
            api_port: self.ctx.config.pod_api_port,
        };
        let vars = env::resolve(&self.pod, &self.container, &runtime, &sources)
            .map_err(|e| ("CreateContainerConfigError", e.to_string()))?;
        let expand = |v: &Option<Vec<String>>| {
            v.as_ref().map(|list| {
                list.iter()
                    .map(|s| env::expand(s, &vars))
                    .collect::<Vec<_>>()
            })
        };
        let argv = resolved
            .argv(
                image,
                expand(&self.container.command).as_deref(),
                expand(&self.container.args).as_deref(),
            )
            .map_err(|e| ("CreateContainerError", e.to_string()))?;
        let mounts = self
            .volumes
            .mounts_for(&self.container, &vars)
            .await
            .map_err(|e| ("CreateContainerConfigError", e))?;
        Ok((argv, vars, mounts))
    }
}

async fn supervise(s: Supervisor) {
    let policy = s
        .pod
        .spec
        .as_ref()
        .and_then(|p| p.restart_policy.clone())
        .unwrap_or_else(|| "Always".to_owned());
    let key = format!("{}/{}", pod_key(&s.pod), s.container.name);
    let backoff = s.ctx.config.backoff;
    let image = s.container.image.clone().unwrap_or_default();
    let mut record = ContainerRecord::new(&s.container.name, &image);
    let mut crashes = 0u32;
    let mut failures = 0u32;
    let kubelet_events = EventRecorder::new(s.ctx.client.clone(), s.ctx.node());
    loop {
        let (argv, vars, mounts) = match s.prepare().await {
            Ok(ready) => ready,
            Err((reason, message)) => {
                failures = failures.saturating_add(1);
                tracing::warn!(container = %key, reason, %message, "cannot start container");
                record.phase = ContainerPhase::Waiting {
                    reason: reason.to_owned(),
                    message: Some(message),
                };
                s.send(&record).await;
                if s.pause(backoff.delay(failures)).await {
                    return;
                }
                continue;
            }
        };
        failures = 0;
        let container_id = format!(
            "simkube://{}/{}/{}",
            s.pod.metadata.uid.as_deref().unwrap_or_default(),
            s.container.name,
            record.restart_count
        );
        let working_dir = PathBuf::from(s.container.working_dir.as_deref().unwrap_or("/"));
        let started_at = Timestamp::now();
        let started = Instant::now();
        let log = s.log_path(record.restart_count);
        let spawned = log
            .as_ref()
            .map_err(|e| std::io::Error::new(e.kind(), e.to_string()))
            .and_then(|log| {
                s.ctx.live_logs.insert(log.clone());
                ContainerProcess::spawn(&Launch {
                    argv: &argv,
                    env: &vars,
                    working_dir: &working_dir,
                    netns: &s.netns,
                    log,
                    mounts: &mounts,
                })
            });
        let live = log.ok().map(|path| LiveGuard {
            logs: s.ctx.live_logs.clone(),
            path,
        });
        record.container_id = Some(container_id.clone());
        let exit = match spawned {
            Ok(mut process) => {
                tracing::info!(container = %key, pid = process.pid(), "container started");
                let _running = s.ctx.metrics.container_running();
                let registered = ContainerKey::new(
                    s.pod.metadata.namespace.as_deref().unwrap_or_default(),
                    s.pod.metadata.name.as_deref().unwrap_or_default(),
                    &s.container.name,
                );
                let running = RunningContainer {
                    pod_uid: s.pod.metadata.uid.clone().unwrap_or_default(),
                    pid: process.pid(),
                    netns: s.netns.clone(),
                    env: vars.clone(),
                    working_dir: working_dir.clone(),
                };
                s.ctx.containers.insert(registered.clone(), running.clone());
                let _registration = Registration {
                    containers: s.ctx.containers.clone(),
                    key: registered,
                    pid: process.pid(),
                };
                record.phase = ContainerPhase::Running { started_at };
                // Init containers are not probed (as the kubelet, sidecars aside); each run of a
                // regular container gets fresh probes.
                let mut prober = matches!(s.slot, Slot::Main(_)).then(|| {
                    let target = ProbeTarget {
                        pod_ip: s.pod_ip,
                        container: s.container.clone(),
                        running,
                    };
                    ContainerProber::new(s.pod.clone(), target, kubelet_events.clone())
                });
                record.startup_passed = prober.as_ref().is_none_or(ContainerProber::started);
                record.readiness_passed = prober.as_ref().is_none_or(ContainerProber::ready);
                s.send(&record).await;
                loop {
                    tokio::select! {
                        exit = process.wait() => break exit,
                        () = s.stop.cancelled() => {
                            let grace = *s.grace.borrow();
                            let exit = process.stop(grace).await;
                            tracing::info!(container = %key, ?exit, "container stopped");
                            return;
                        }
                        step = async {
                            match prober.as_mut() {
                                Some(prober) => prober.next().await,
                                None => std::future::pending().await,
                            }
                        } => match step {
                            ProbeStep::Status { started, ready } => {
                                record.startup_passed = started;
                                record.readiness_passed = ready;
                                s.send(&record).await;
                            }
                            ProbeStep::Kill { grace, kind } => {
                                record.readiness_passed = false;
                                s.send(&record).await;
                                let exit = process.stop(grace).await;
                                tracing::info!(
                                    container = %key,
                                    ?exit,
                                    probe = kind.lower(),
                                    "container killed by its probe"
                                );
                                break exit;
                            }
                        },
                    }
                }
            }
            Err(error) => {
                tracing::warn!(container = %key, %error, program = %argv[0], "cannot start container");
                Err(error)
            }
        };
        drop(live);
        let (code, signal, reason) = match exit {
            Ok(e) if e.code == 0 => (0, None, "Completed"),
            Ok(e) => (e.code, e.signal, "Error"),
            Err(_) => (128, None, "StartError"),
        };
        let termination = Termination {
            exit_code: code,
            signal,
            reason: reason.to_owned(),
            started_at,
            finished_at: Timestamp::now(),
            container_id,
        };
        tracing::info!(container = %key, code, "container exited");
        let init = matches!(s.slot, Slot::Init(_));
        let restart = match policy.as_str() {
            // An init container is retried until it succeeds unless the pod never restarts.
            "Always" if init => code != 0,
            "Never" => false,
            "OnFailure" => code != 0,
            _ => true,
        };
        if !restart {
            record.phase = ContainerPhase::Terminated(termination);
            s.send(&record).await;
            if !init {
                s.stop.cancelled().await;
            }
            return;
        }
        crashes = backoff.next_crash_count(crashes, started.elapsed());
        let delay = backoff.delay(crashes);
        record.last_termination = Some(termination);
        record.phase = ContainerPhase::Waiting {
            reason: "CrashLoopBackOff".to_owned(),
            message: Some(format!(
                "back-off {} restarting failed container={} pod={}",
                format_delay(delay),
                s.container.name,
                s.pod.metadata.name.as_deref().unwrap_or_default()
            )),
        };
        s.send(&record).await;
        // The kubelet's warning for a crash loop, counted per container like its others.
        let field_path = match s.slot {
            Slot::Init(_) => format!("spec.initContainers{{{}}}", s.container.name),
            Slot::Main(_) => format!("spec.containers{{{}}}", s.container.name),
        };
        let meta = &s.pod.metadata;
        let message = format!(
            "Back-off restarting failed container {} in pod {}_{}({})",
            s.container.name,
            meta.name.as_deref().unwrap_or_default(),
            meta.namespace.as_deref().unwrap_or_default(),
            meta.uid.as_deref().unwrap_or_default()
        );
        kubelet_events
            .record(
                &s.pod,
                Some(field_path),
                EventType::Warning,
                "BackOff",
                &message,
            )
            .await;
        if s.pause(delay).await {
            return;
        }
        s.ctx.metrics.restarted(match reason {
            "Completed" => RestartReason::Completed,
            "Error" => RestartReason::Error,
            _ => RestartReason::StartError,
        });
        record.restart_count += 1;
    }
}

/// Removes a container run from the registry when it ends, however it ends.
struct Registration {
    containers: Containers,
    key: ContainerKey,
    pid: u32,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.containers.remove(&self.key, self.pid);
    }
}

/// Unmarks a log file as live when its container run ends, however it ends.
struct LiveGuard {
    logs: LiveLogs,
    path: PathBuf,
}

impl Drop for LiveGuard {
    fn drop(&mut self) {
        self.logs.remove(&self.path);
    }
}

fn format_delay(delay: Duration) -> String {
    let secs = delay.as_secs();
    if secs >= 60 {
        format!("{}m{}s", secs / 60, secs % 60)
    } else if secs > 0 {
        format!("{secs}s")
    } else {
        format!("{}ms", delay.as_millis())
    }
}

/// The directory of a pod's container logs: `<state>/pods/<namespace>_<name>_<uid>`.
pub fn log_dir(state_dir: &Path, pod: &Pod) -> PathBuf {
    let meta = &pod.metadata;
    state_dir.join("pods").join(format!(
        "{}_{}_{}",
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default(),
        meta.uid.as_deref().unwrap_or_default()
    ))
}

/// The log file of one container run: `<log_dir>/<container>/<restart>.log`.
pub fn log_file(state_dir: &Path, pod: &Pod, container: &str, restart: i32) -> PathBuf {
    log_dir(state_dir, pod)
        .join(container)
        .join(format!("{restart}.log"))
}
