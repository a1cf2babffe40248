//! The agent's life cycle: register the Node, keep its Lease and status fresh, watch the pods
//! bound to it, and run one worker per pod (sandbox, container supervisors, status, deletion).
//!
//! `node` keeps the Node object (registration, status, Lease); `pod` runs one pod from
//! sandbox to deletion, `reporter` writes its status, and `container` supervises each of its
//! containers.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::backoff::Backoff;
use crate::containers::Containers;
use crate::error::Error;
use crate::images::ImageTable;
use crate::ipam::PodIpAllocator;
use crate::kubelet::{self, LiveLogs};
use crate::metrics::Metrics;
use crate::node_status::NodeIdentity;
use crate::sandbox;

mod container;
mod node;
mod pod;
mod reporter;

pub use container::{log_dir, log_file};

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
    /// Where the agent reports its service proxy's health ([`crate::status`]); `None`: nowhere.
    pub status_file: Option<PathBuf>,
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
            status_file: None,
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
        prepare_node(&ctx).await?;
        let kubelet_server = match ctx.config.kubelet_listen {
            Some(addr) => Some(start_kubelet(&ctx, addr, &shutdown).await?),
            None => None,
        };
        node::register(&ctx).await?;
        tracing::info!(node = %ctx.node(), "node registered");
        let heartbeat = tokio::spawn(node::heartbeat(ctx.clone(), shutdown.clone()));
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
        let reporter = ctx
            .config
            .status_file
            .clone()
            .map(|path| tokio::spawn(report_status(ctx.clone(), path, shutdown.clone())));
        run_pods(&ctx, &shutdown).await;
        shutdown.cancel();
        let _ = heartbeat.await;
        // The proxy removes its table and routes before it ends.
        if let Some(proxy) = proxy {
            match proxy.await {
                Ok(Ok(())) => {}
                Ok(Err(error)) => tracing::error!(%error, "service proxy failed"),
                Err(error) => tracing::error!(%error, "service proxy task failed"),
            }
        }
        if let Some(reporter) = reporter {
            let _ = reporter.await;
        }
        if let Some(server) = kubelet_server {
            let _ = server.await;
        }
        tracing::info!(node = %ctx.node(), "node agent stopped");
        Ok(())
    }
}

/// The state directory, no sandbox left from a previous run, and forwarding in the node.
async fn prepare_node(ctx: &Ctx) -> Result<(), Error> {
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
    Ok(())
}

/// Binds the kubelet endpoint on `addr` and serves it until `shutdown`.
async fn start_kubelet(
    ctx: &Ctx,
    addr: std::net::SocketAddr,
    shutdown: &CancellationToken,
) -> Result<tokio::task::JoinHandle<()>, Error> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Io {
            action: format!("listen on {addr} for the kubelet endpoint"),
            source,
        })?;
    let tls =
        kubelet::tls_config(ctx.node(), addr.ip()).map_err(|e| Error::Config(e.to_string()))?;
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
    Ok(tokio::spawn(kubelet::serve(
        listener,
        router,
        tls,
        shutdown.clone(),
    )))
}

/// Keeps the status file current with the proxy's health until `shutdown`.
async fn report_status(ctx: Arc<Ctx>, path: std::path::PathBuf, shutdown: CancellationToken) {
    let mut health = ctx.config.proxy.as_ref().map(|p| p.stats.watch_health());
    loop {
        let status = crate::status::AgentStatus {
            proxy: health.as_mut().map(|h| h.borrow_and_update().clone()),
            ..crate::status::AgentStatus::own()
        };
        if let Err(error) = crate::status::write(&path, &status) {
            tracing::warn!(%error, path = %path.display(), "cannot write the status file");
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            changed = async {
                match health.as_mut() {
                    Some(h) => h.changed().await.is_ok(),
                    None => std::future::pending().await,
                }
            } => if !changed { return },
        }
    }
}

/// Watches the pods bound to this node and runs one worker per pod until `shutdown`; returns
/// once every worker has stopped.
async fn run_pods(ctx: &Arc<Ctx>, shutdown: &CancellationToken) {
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
                        tasks.spawn(pod::pod_worker(ctx.clone(), uid, rx, shutdown.clone()));
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
}
