//! A running simulated cluster: builder, listener (HTTP or HTTPS), admin credentials, kube-rs
//! clients, kubeconfigs, background controllers, and the test controls (fault injection,
//! latency, broken watches, compaction, restarts, request log).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock, RwLock, Weak};
use std::time::Duration;

use rand::Rng as _;
use serde_json::{Value, json};
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;

use crate::auth::{self, Authenticator, SecretToken, TokenIssuer};
use crate::controllers::{ControllerSettings, Controllers};
use crate::error::ApiError;
use crate::http::{self, Fault, RequestRecord, ServerConfig, ServerState};
use crate::registry::Registry;
use crate::store::{Store, StoreConfig, TypeKey};
use crate::strategy;
use crate::tls::{self, CertAuthority};

/// How long open connections get to finish when the server stops.
const DRAIN_GRACE: Duration = Duration::from_secs(2);

/// Why a cluster could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// Certificates could not be made.
    #[error("TLS setup failed: {0}")]
    Tls(#[from] tls::TlsError),
    /// The ServiceAccount token signer could not be made.
    #[error("token signer setup failed: {0}")]
    Token(String),
    /// The admin client could not be built.
    #[error("admin client: {0}")]
    Client(String),
}

/// Something started with the cluster once it listens, stopped by the token at shutdown.
pub type BackgroundTask =
    Box<dyn FnOnce(&Cluster, CancellationToken) -> Vec<JoinHandle<()>> + Send>;

/// Configures and starts a [`Cluster`].
pub struct ClusterBuilder {
    name: String,
    tls: bool,
    rbac: bool,
    history: usize,
    bookmark_interval: Duration,
    watch_timeout: Duration,
    body_limit: usize,
    watch_buffer: usize,
    bind: SocketAddr,
    rv_offset: Option<u64>,
    controllers: Controllers,
    controller_settings: ControllerSettings,
    service_cidr: ipnet::Ipv4Net,
    advertise: Option<SocketAddr>,
    background: Vec<BackgroundTask>,
    pod_proxy: Option<http::PodProxy>,
    tls_hosts: Vec<String>,
    extra_listeners: Vec<std::net::TcpListener>,
}

impl std::fmt::Debug for ClusterBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterBuilder")
            .field("name", &self.name)
            .field("tls", &self.tls)
            .field("rbac", &self.rbac)
            .field("bind", &self.bind)
            .field("controllers", &self.controllers)
            .finish_non_exhaustive()
    }
}

impl Default for ClusterBuilder {
    fn default() -> Self {
        Self {
            name: "simkube".into(),
            tls: false,
            rbac: false,
            history: 4096,
            bookmark_interval: Duration::from_secs(1),
            watch_timeout: Duration::from_secs(30 * 60),
            body_limit: http::DEFAULT_BODY_LIMIT,
            watch_buffer: 4096,
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            rv_offset: None,
            controllers: Controllers::none(),
            controller_settings: ControllerSettings::default(),
            service_cidr: crate::service_alloc::DEFAULT_SERVICE_CIDR,
            advertise: None,
            background: Vec::new(),
            pod_proxy: None,
            tls_hosts: Vec::new(),
            extra_listeners: Vec::new(),
        }
    }
}

impl ClusterBuilder {
    /// Cluster name: the kubeconfig's cluster, context and user names.
    pub fn name(mut self, name: &str) -> Self {
        self.name = name.to_owned();
        self
    }

    /// Serve HTTPS with a self-signed CA (client certificates are accepted as identities).
    pub fn tls(mut self, on: bool) -> Self {
        self.tls = on;
        self
    }

    /// Enforce RBAC; without it every authenticated user may do anything.
    pub fn rbac(mut self, on: bool) -> Self {
        self.rbac = on;
        self
    }

    /// Events kept per resource type; older resume points get 410.
    pub fn history(mut self, events: usize) -> Self {
        self.history = events;
        self
    }

    /// How often watches that allow bookmarks get one.
    pub fn bookmark_interval(mut self, every: Duration) -> Self {
        self.bookmark_interval = every;
        self
    }

    /// How long a watch lasts when the client sets no `timeoutSeconds`.
    pub fn watch_timeout(mut self, timeout: Duration) -> Self {
        self.watch_timeout = timeout;
        self
    }

    /// Largest request body (413 beyond).
    pub fn body_limit(mut self, bytes: usize) -> Self {
        self.body_limit = bytes;
        self
    }

    /// Events a watcher may fall behind before it is cut off.
    pub fn watch_buffer(mut self, events: usize) -> Self {
        self.watch_buffer = events;
        self
    }

    /// Listen address (port 0 picks a free port).
    pub fn bind(mut self, addr: SocketAddr) -> Self {
        self.bind = addr;
        self
    }

    /// First resourceVersion minus one (random by default, so RVs of different clusters differ).
    pub fn rv_offset(mut self, offset: u64) -> Self {
        self.rv_offset = Some(offset);
        self
    }

    /// Built-in controllers to run (none by default, like envtest).
    pub fn controllers(mut self, controllers: Controllers) -> Self {
        self.controllers = controllers;
        self
    }

    /// How long a node's Lease may go unrenewed before the node lifecycle controller marks it
    /// Unknown and unreachable (40s by default, as kube-controller-manager).
    pub fn node_monitor_grace_period(mut self, grace: Duration) -> Self {
        self.controller_settings.node_monitor_grace_period = grace;
        self
    }

    /// Addresses the load-balancer controller gives LoadBalancer Services (none by default:
    /// they stay pending, as on a cluster without a load-balancer provider).
    pub fn load_balancer_pool(
        mut self,
        pool: impl IntoIterator<Item = std::net::Ipv4Addr>,
    ) -> Self {
        self.controller_settings.load_balancer_pool = pool.into_iter().collect();
        self
    }

    /// The longest certificate the CSR signer issues, as kube-controller-manager's
    /// `--cluster-signing-duration` (one year by default): a CSR asking for longer, or for
    /// nothing, gets this lifetime.
    pub fn cluster_signing_duration(mut self, duration: Duration) -> Self {
        self.controller_settings.cluster_signing_duration = duration;
        self
    }

    /// The range ClusterIPs come from (10.96.0.0/12 by default). The `kubernetes` Service gets
    /// its first address; requests outside it are refused with the real server's 422.
    pub fn service_cidr(mut self, cidr: ipnet::Ipv4Net) -> Self {
        self.service_cidr = cidr.trunc();
        self
    }

    /// The address the `kubernetes` Service's endpoints name, as kube-apiserver's
    /// `--advertise-address` and `--secure-port` (by default the address the server listens on).
    pub fn advertise(mut self, addr: SocketAddr) -> Self {
        self.advertise = Some(addr);
        self
    }

    /// Replaces the handler of `pods/{name}/log` and `exec` (by default they are forwarded to
    /// the kubelet endpoint the pod's Node reports, without verifying its certificate).
    pub fn pod_proxy(mut self, proxy: http::PodProxy) -> Self {
        self.pod_proxy = Some(proxy);
        self
    }

    /// Extra names and addresses the serving certificate is valid for (besides 127.0.0.1,
    /// localhost and the bound address), e.g. the in-cluster `kubernetes.default.svc` names.
    pub fn tls_hosts(mut self, hosts: Vec<String>) -> Self {
        self.tls_hosts.extend(hosts);
        self
    }

    /// Also serves the API on an already bound listener (for example one bound in another
    /// network namespace before the process left it), exactly like the primary listener.
    pub fn extra_listener(mut self, listener: std::net::TcpListener) -> Self {
        self.extra_listeners.push(listener);
        self
    }

    /// Runs `task` once the cluster listens; it gets the cluster and a token cancelled at
    /// shutdown, and returns the handles to await then.
    pub fn background(
        mut self,
        task: impl FnOnce(&Cluster, CancellationToken) -> Vec<JoinHandle<()>> + Send + 'static,
    ) -> Self {
        self.background.push(Box::new(task));
        self
    }

    /// Binds the listener, seeds the default objects and starts serving.
    pub async fn start(self) -> Result<Cluster, Error> {
        let ca = if self.tls {
            Some(Arc::new(CertAuthority::generate(&self.name)?))
        } else {
            None
        };
        let issuer = Arc::new(TokenIssuer::generate().map_err(|e| Error::Token(e.to_string()))?);
        let admin_token = random_token();
        let slot: Arc<OnceLock<Weak<ServerState>>> = Arc::new(OnceLock::new());
        let sa_slot = slot.clone();
        let sa_lookup: auth::ServiceAccountLookup = Arc::new(move |ns: &str, name: &str| {
            let state = sa_slot.get()?.upgrade()?;
            let sa = state
                .store
                .get(&TypeKey::new("", "serviceaccounts"), ns, name)?;
            sa["metadata"]["uid"].as_str().map(str::to_owned)
        });
        let bound_slot = slot.clone();
        let bound_lookup: auth::BoundObjectLookup =
            Arc::new(move |kind: &str, ns: &str, name: &str| {
                let state = bound_slot.get()?.upgrade()?;
                let plural = match kind {
                    "Pod" => "pods",
                    "Secret" => "secrets",
                    "Node" => "nodes",
                    _ => return None,
                };
                let obj = state.store.get(&TypeKey::new("", plural), ns, name)?;
                obj["metadata"]["uid"].as_str().map(str::to_owned)
            });
        let authenticator =
            Authenticator::new(admin_token.clone(), ca.as_deref(), issuer, sa_lookup)
                .with_anonymous(true)
                .with_bound_object_lookup(bound_lookup);
        let rv_offset = self.rv_offset.unwrap_or_else(default_rv_offset);
        let (watch_breaker, _) = tokio::sync::watch::channel(0u64);
        let state = Arc::new(ServerState {
            config: ServerConfig {
                name: self.name.clone(),
                rbac: self.rbac,
                body_limit: self.body_limit,
                bookmark_interval: self.bookmark_interval,
                default_watch_timeout: self.watch_timeout,
                anonymous_is_admin: !self.tls && !self.rbac,
                service_cidr: self.service_cidr,
            },
            store: Store::new(StoreConfig {
                history: self.history,
                watch_buffer: self.watch_buffer,
                rv_offset,
            }),
            registry: RwLock::new(Arc::new(Registry::with_builtins())),
            authenticator,
            faults: Mutex::new(Vec::new()),
            latency: Mutex::new(Duration::ZERO),
            metrics: crate::metrics::Metrics::new(),
            requests: Mutex::new(std::collections::VecDeque::new()),
            watch_breaker,
            pod_proxy: RwLock::new(Some(crate::kubelet_proxy::pod_proxy(
                crate::kubelet_proxy::KubeletClient::default(),
            ))),
            rbac_cache: Mutex::new(None),
        });
        let _ = slot.set(Arc::downgrade(&state));
        let listener = bind(self.bind).await?;
        let addr = listener.local_addr().map_err(|source| Error::Bind {
            addr: self.bind,
            source,
        })?;
        let tls_config = match &ca {
            Some(ca) => {
                let mut hosts = vec![
                    "127.0.0.1".to_owned(),
                    "localhost".to_owned(),
                    addr.ip().to_string(),
                ];
                for host in self.tls_hosts {
                    if !hosts.contains(&host) {
                        hosts.push(host);
                    }
                }
                Some(tls::server_config(ca, &hosts)?)
            }
            None => None,
        };
        for listener in &self.extra_listeners {
            listener
                .set_nonblocking(true)
                .map_err(|source| Error::Bind {
                    addr: listener
                        .local_addr()
                        .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0))),
                    source,
                })?;
        }
        let scheme = if self.tls { "https" } else { "http" };
        let host = if addr.ip().is_unspecified() {
            "127.0.0.1".to_owned()
        } else {
            addr.ip().to_string()
        };
        let url = format!("{scheme}://{host}:{}", addr.port());
        let advertise = self.advertise.unwrap_or_else(|| {
            let ip = if addr.ip().is_unspecified() {
                std::net::IpAddr::from([127, 0, 0, 1])
            } else {
                addr.ip()
            };
            SocketAddr::new(ip, addr.port())
        });
        seed(&state, advertise);
        let cluster = Cluster {
            name: self.name,
            url,
            addr,
            state,
            ca,
            tls_config,
            admin_token: SecretToken::new(admin_token),
            advertise,
            running: Mutex::new(None),
            background_stop: CancellationToken::new(),
            background: Mutex::new(Vec::new()),
            extra_listeners: self.extra_listeners,
        };
        cluster.serve(listener);
        let mut handles = Vec::new();
        if self.controllers.any() {
            let client = cluster
                .client_with_token(cluster.admin_token())
                .map_err(|e| Error::Client(e.to_string()))?;
            handles.extend(crate::controllers::spawn(
                &self.controllers,
                &self.controller_settings,
                client,
                cluster.ca.clone(),
                cluster.background_stop.clone(),
            ));
        }
        handles.push(tokio::spawn(keep_kubernetes_service(
            cluster.state.clone(),
            advertise,
            cluster.background_stop.clone(),
        )));
        for task in self.background {
            handles.extend(task(&cluster, cluster.background_stop.clone()));
        }
        *cluster.background.lock().unwrap_or_else(|e| e.into_inner()) = handles;
        tracing::info!(name = %cluster.name, url = %cluster.url, "simulated cluster listening");
        Ok(cluster)
    }
}

/// Random across processes and a billion apart within one, so clusters side by side never hand
/// out the same resourceVersion (a random multiple of 1000 alone collides one time in 999).
fn default_rv_offset() -> u64 {
    static STARTED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let nth = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    nth * 1_000_000_000 + rand::rng().random_range(1..1000) * 1000
}

fn random_token() -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    let mut rng = rand::rng();
    (0..48)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect()
}

async fn bind(addr: SocketAddr) -> Result<tokio::net::TcpListener, Error> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()
    } else {
        tokio::net::TcpSocket::new_v6()
    }
    .map_err(|source| Error::Bind { addr, source })?;
    socket
        .set_reuseaddr(true)
        .map_err(|source| Error::Bind { addr, source })?;
    socket
        .bind(addr)
        .map_err(|source| Error::Bind { addr, source })?;
    socket
        .listen(1024)
        .map_err(|source| Error::Bind { addr, source })
}

/// The objects a fresh cluster has: system namespaces, the `kubernetes` Service with its
/// endpoints, and the default RBAC policy.
fn seed(state: &ServerState, advertise: SocketAddr) {
    let registry = state.registry();
    let mut objects: Vec<(&str, &str, Value)> = Vec::new();
    for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        objects.push((
            "",
            "namespaces",
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
        ));
    }
    for role in auth::default_cluster_roles() {
        objects.push((auth::RBAC_GROUP, "clusterroles", role));
    }
    for binding in auth::default_cluster_role_bindings() {
        objects.push((auth::RBAC_GROUP, "clusterrolebindings", binding));
    }
    state.store.transact(|txn| {
        for (group, plural, mut obj) in objects {
            let Some(rt) = registry
                .types
                .iter()
                .find(|t| t.group == group && t.plural == plural)
            else {
                continue;
            };
            if strategy::prepare_create(rt, &mut obj).is_ok() {
                txn.put(&TypeKey::new(group, plural), obj);
            }
        }
    });
    reconcile_kubernetes_service(state, advertise);
}

/// How often the server re-asserts the `kubernetes` Service and its endpoints (kube-apiserver
/// does every 10 s; in-process this costs three map lookups, so repairs show sooner).
const KUBERNETES_SERVICE_INTERVAL: Duration = Duration::from_secs(1);

/// kube-apiserver's bootstrap controller and endpoint reconciler: the `kubernetes` Service in
/// `default` exists with its https port, and its Endpoints and EndpointSlice name the
/// advertised address, whatever clients did to them.
async fn keep_kubernetes_service(
    state: Arc<ServerState>,
    advertise: SocketAddr,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(KUBERNETES_SERVICE_INTERVAL) => {}
        }
        reconcile_kubernetes_service(&state, advertise);
    }
}

/// What the `kubernetes` Service, Endpoints and EndpointSlice must say (the Service's
/// ClusterIP, the first address of the service range, is set only at creation).
fn kubernetes_service_objects(
    cidr: ipnet::Ipv4Net,
    advertise: SocketAddr,
) -> [(&'static str, &'static str, Value); 3] {
    let cluster_ip = std::net::Ipv4Addr::from(u32::from(cidr.network()).saturating_add(1));
    let port = json!({"name": "https", "port": advertise.port(), "protocol": "TCP"});
    let address_type = if advertise.is_ipv4() { "IPv4" } else { "IPv6" };
    let ip = advertise.ip().to_string();
    [
        (
            "",
            "services",
            json!({"apiVersion": "v1", "kind": "Service",
                "metadata": {"name": "kubernetes", "namespace": "default",
                    "labels": {"component": "apiserver", "provider": "kubernetes"}},
                "spec": {"clusterIP": cluster_ip.to_string(), "clusterIPs": [cluster_ip.to_string()],
                    "type": "ClusterIP", "sessionAffinity": "None",
                    "ports": [{"name": "https", "port": 443, "protocol": "TCP",
                        "targetPort": advertise.port()}]}}),
        ),
        (
            "",
            "endpoints",
            json!({"apiVersion": "v1", "kind": "Endpoints",
                "metadata": {"name": "kubernetes", "namespace": "default",
                    "labels": {"endpointslice.kubernetes.io/skip-mirror": "true"}},
                "subsets": [{"addresses": [{"ip": ip}], "ports": [port]}]}),
        ),
        (
            "discovery.k8s.io",
            "endpointslices",
            json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"name": "kubernetes", "namespace": "default",
                    "labels": {"kubernetes.io/service-name": "kubernetes"}},
                "addressType": address_type,
                "endpoints": [{"addresses": [ip], "conditions": {"ready": true}}],
                "ports": [port]}),
        ),
    ]
}

/// Creates whichever of the three objects is missing and puts back the fields the server
/// owns (the Service's ports, the endpoints' addresses and ports) where they were changed.
fn reconcile_kubernetes_service(state: &ServerState, advertise: SocketAddr) {
    let registry = state.registry();
    let objects = kubernetes_service_objects(state.config.service_cidr, advertise);
    state.store.transact(|txn| {
        if txn
            .get(&TypeKey::new("", "namespaces"), "", "default")
            .is_none()
        {
            return;
        }
        for (group, plural, want) in objects {
            let Some(rt) = registry
                .types
                .iter()
                .find(|t| t.group == group && t.plural == plural)
            else {
                continue;
            };
            let key = TypeKey::new(group, plural);
            match txn.get(&key, "default", "kubernetes") {
                None => {
                    let mut obj = want;
                    // Recreating the Service needs its address back; like the real bootstrap
                    // controller, wait (and retry) while another Service holds it.
                    let ip = &obj["spec"]["clusterIP"];
                    if plural == "services"
                        && txn
                            .list(&key, None)
                            .iter()
                            .any(|s| &s["spec"]["clusterIP"] == ip)
                    {
                        tracing::warn!(%ip, "the kubernetes Service's address is taken");
                        continue;
                    }
                    if strategy::prepare_create(rt, &mut obj).is_ok() {
                        txn.put(&key, obj);
                    }
                }
                Some(have) => {
                    let mut fixed = (*have).clone();
                    if plural == "services" {
                        if fixed["spec"].is_object() {
                            fixed["spec"]["ports"] = want["spec"]["ports"].clone();
                        }
                    } else {
                        for field in ["subsets", "addressType", "endpoints", "ports"] {
                            if let Some(value) = want.get(field) {
                                fixed[field] = value.clone();
                            }
                        }
                    }
                    // `put` leaves an object that comes out unchanged alone.
                    if strategy::prepare_update(rt, &have, &mut fixed, None).is_ok() {
                        txn.put(&key, fixed);
                    }
                }
            }
        }
    });
}

struct Running {
    shutdown: CancellationToken,
    task: JoinHandle<()>,
}

/// A running simulated cluster. Dropping it stops accepting connections; call
/// [`Cluster::shutdown`] to also wait for in-flight requests and background tasks.
pub struct Cluster {
    name: String,
    url: String,
    addr: SocketAddr,
    state: Arc<ServerState>,
    ca: Option<Arc<CertAuthority>>,
    tls_config: Option<Arc<rustls::ServerConfig>>,
    admin_token: SecretToken,
    advertise: SocketAddr,
    running: Mutex<Option<Running>>,
    background_stop: CancellationToken,
    background: Mutex<Vec<JoinHandle<()>>>,
    /// Kept open across restarts (only clones are served), so their ports never change.
    extra_listeners: Vec<std::net::TcpListener>,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("name", &self.name)
            .field("url", &self.url)
            .field("admin_token", &self.admin_token)
            .finish_non_exhaustive()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.background_stop.cancel();
        if let Some(r) = self
            .running
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            r.shutdown.cancel();
        }
        self.state.watch_breaker.send_modify(|g| *g += 1);
    }
}

impl Cluster {
    /// A builder with defaults: plain HTTP on 127.0.0.1:0, no RBAC, history 4096, bookmarks
    /// every second, no controllers.
    pub fn builder() -> ClusterBuilder {
        ClusterBuilder::default()
    }

    fn serve(&self, listener: tokio::net::TcpListener) {
        let shutdown = CancellationToken::new();
        let router = http::router(self.state.clone());
        let mut listeners = vec![listener];
        for extra in &self.extra_listeners {
            match extra
                .try_clone()
                .and_then(tokio::net::TcpListener::from_std)
            {
                Ok(l) => listeners.push(l),
                Err(error) => tracing::error!(%error, "cannot serve an extra listener"),
            }
        }
        let serving: Vec<_> = listeners
            .into_iter()
            .map(|listener| match &self.tls_config {
                Some(config) => tokio::spawn(tls::serve_https(
                    listener,
                    router.clone(),
                    config.clone(),
                    shutdown.clone(),
                )),
                None => tokio::spawn(serve_plain(listener, router.clone(), shutdown.clone())),
            })
            .collect();
        let task = tokio::spawn(async move {
            for handle in serving {
                let _ = handle.await;
            }
        });
        *self.running.lock().unwrap_or_else(|e| e.into_inner()) = Some(Running { shutdown, task });
    }

    async fn stop_serving(&self) {
        let running = self
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        self.break_watches();
        if let Some(r) = running {
            r.shutdown.cancel();
            let abort = r.task.abort_handle();
            if tokio::time::timeout(DRAIN_GRACE * 2, r.task).await.is_err() {
                abort.abort();
            }
        }
    }

    /// The cluster name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `http://127.0.0.1:PORT` or `https://...`.
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The admin bearer token (user `admin`, group `system:masters`).
    pub fn admin_token(&self) -> &str {
        self.admin_token.expose()
    }

    /// The CA certificate (PEM) when TLS is on.
    pub fn ca_pem(&self) -> Option<String> {
        self.ca.as_ref().map(|ca| ca.ca_pem())
    }

    /// The cluster CA when TLS is on (signs client certificates and CSRs).
    pub fn ca(&self) -> Option<Arc<CertAuthority>> {
        self.ca.clone()
    }

    /// Shared server state (store, registry, hooks) for in-crate extensions.
    pub fn state(&self) -> &Arc<ServerState> {
        &self.state
    }

    /// A kube-rs client configured for this cluster with the given bearer token.
    pub fn client_with_token(&self, token: &str) -> Result<kube::Client, kube::Error> {
        let url: ::http::Uri = self
            .url
            .parse()
            .expect("invariant: the URL is built from a socket address");
        let mut config = kube::Config::new(url);
        config.default_namespace = "default".into();
        if let Some(ca) = &self.ca {
            config.root_cert = Some(vec![ca.ca_der().to_vec()]);
        }
        config.auth_info.token = Some(secrecy::SecretString::from(token.to_owned()));
        kube::Client::try_from(config)
    }

    /// An admin kube-rs client over the real listener (TLS when on), default namespace `default`.
    pub fn client(&self) -> kube::Client {
        self.client_with_token(self.admin_token.expose())
            .expect("invariant: a client for our own URL and CA always builds")
    }

    /// The admin kubeconfig (YAML): server URL, CA data with TLS, the admin token.
    pub fn kubeconfig(&self) -> String {
        tls::kubeconfig(
            &self.name,
            &self.url,
            self.ca_pem().as_deref(),
            self.admin_token.expose(),
        )
    }

    /// Writes [`Cluster::kubeconfig`] to a file readable only by its owner.
    pub fn write_kubeconfig(&self, path: &Path) -> std::io::Result<()> {
        std::fs::write(path, self.kubeconfig())?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        }
        Ok(())
    }

    /// The API as an in-process tower service, authenticated as admin:
    /// `kube::Client::new(cluster.service(), "default")` skips TCP.
    pub fn service(&self) -> axum::Router {
        let header =
            ::http::HeaderValue::from_str(&format!("Bearer {}", self.admin_token.expose()))
                .expect("invariant: the token is alphanumeric");
        http::router(self.state.clone()).layer(tower::util::MapRequestLayer::new(
            move |mut req: axum::http::Request<axum::body::Body>| {
                if !req
                    .headers()
                    .contains_key(axum::http::header::AUTHORIZATION)
                {
                    req.headers_mut()
                        .insert(axum::http::header::AUTHORIZATION, header.clone());
                }
                req
            },
        ))
    }

    /// Answers the next `n` requests with this verb (`get`, `list`, `watch`, `create`,
    /// `update`, `patch`, `delete`, `deletecollection`, or `*`) on this resource (plural,
    /// `plural/subresource`, or `*`) with `status`.
    pub fn fail_next(&self, verb: &str, resource: &str, n: usize, status: ApiError) {
        if n == 0 {
            return;
        }
        self.state
            .faults
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Fault {
                verb: verb.to_owned(),
                resource: resource.to_owned(),
                remaining: n,
                error: status,
            });
    }

    /// Adds `latency` before every request is handled.
    pub fn set_latency(&self, latency: Duration) {
        *self.state.latency.lock().unwrap_or_else(|e| e.into_inner()) = latency;
    }

    /// Ends every open watch stream (clients see the stream close and resume).
    pub fn break_watches(&self) {
        self.state.watch_breaker.send_modify(|g| *g += 1);
    }

    /// Drops all event history: resuming a watch from any earlier RV gets 410 Expired.
    pub fn compact(&self) {
        self.state.store.compact();
    }

    /// Stops listening, then listens again on the same port. With `keep_state = false` the
    /// cluster comes back empty except for its default objects (as after losing etcd); the RV
    /// keeps counting up so clients notice through 410s.
    pub async fn restart(&self, keep_state: bool) {
        self.stop_serving().await;
        if !keep_state {
            self.state.store.reset();
            self.state.set_registry(Registry::with_builtins());
            seed(&self.state, self.advertise);
        }
        let mut attempt = 0;
        let listener = loop {
            match bind(self.addr).await {
                Ok(l) => break l,
                Err(e) if attempt < 100 => {
                    attempt += 1;
                    tracing::debug!(error = %e, "rebinding after restart");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => {
                    tracing::error!(error = %e, "cannot listen again after restart");
                    return;
                }
            }
        };
        self.serve(listener);
    }

    /// The request log, oldest first.
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.state
            .requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .cloned()
            .collect()
    }

    /// Empties the request log.
    pub fn clear_requests(&self) {
        self.state
            .requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    /// Stops background tasks and the listener and waits for them.
    pub async fn shutdown(self) {
        self.background_stop.cancel();
        let handles =
            std::mem::take(&mut *self.background.lock().unwrap_or_else(|e| e.into_inner()));
        for h in handles {
            let abort = h.abort_handle();
            if tokio::time::timeout(DRAIN_GRACE, h).await.is_err() {
                abort.abort();
            }
        }
        self.stop_serving().await;
    }
}

/// Serves plain HTTP/1.1 and h2c until `shutdown`, then gives connections a short grace and
/// drops the rest (long watches must not hold a restart up).
async fn serve_plain(
    listener: tokio::net::TcpListener,
    router: axum::Router,
    shutdown: CancellationToken,
) {
    let mut connections = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            () = shutdown.cancelled() => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            accepted = listener.accept() => accepted,
        };
        let tcp = match accepted {
            Ok((tcp, _)) => tcp,
            Err(error) => {
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let router = router.clone();
        let shutdown = shutdown.clone();
        connections.spawn(async move {
            use tower::ServiceExt as _;
            let service =
                hyper::service::service_fn(move |req: ::http::Request<hyper::body::Incoming>| {
                    router.clone().oneshot(req.map(axum::body::Body::new))
                });
            let builder =
                hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
            let conn =
                builder.serve_connection_with_upgrades(hyper_util::rt::TokioIo::new(tcp), service);
            tokio::pin!(conn);
            tokio::select! {
                result = conn.as_mut() => {
                    if let Err(error) = result {
                        tracing::debug!(%error, "connection ended with an error");
                    }
                }
                () = shutdown.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = tokio::time::timeout(DRAIN_GRACE, conn.as_mut()).await;
                }
            }
        });
    }
    drop(listener);
    let drain = async { while connections.join_next().await.is_some() {} };
    if tokio::time::timeout(DRAIN_GRACE + Duration::from_secs(1), drain)
        .await
        .is_err()
    {
        connections.abort_all();
    }
}
