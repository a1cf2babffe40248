//! `ClusterBuilder`: the options of a simulated cluster and `start`, which builds its state, seeds it, binds the listeners and spawns the server and controllers.

#[allow(clippy::wildcard_imports)]
use super::*;

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

    /// Where the persistent-volume controller provisions host-path volumes (by default
    /// `simkube-volumes` in the temporary directory). Node agents must see the same path.
    pub fn volumes_dir(mut self, dir: impl Into<std::path::PathBuf>) -> Self {
        self.controller_settings.volumes_dir = dir.into();
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
        // kube-apiserver's `--kubelet-client-certificate`: kubelets that check callers
        // (`--client-ca-file`) accept it; the others ignore it.
        let kubelet_client = match &ca {
            Some(ca) => crate::kubelet_proxy::KubeletClient::with_client_certificate_from(ca)?,
            None => crate::kubelet_proxy::KubeletClient::default(),
        };
        let issuer = Arc::new(TokenIssuer::generate().map_err(Error::Token)?);
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
            pod_proxy: RwLock::new(Some(
                self.pod_proxy
                    .unwrap_or_else(|| crate::kubelet_proxy::pod_proxy(kubelet_client.clone())),
            )),
            rbac_cache: Mutex::new(None),
            webhook_dialer: RwLock::new(None),
            webhook_connections: Default::default(),
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
        seed(&state, advertise, ca.as_deref());
        let cluster = Cluster {
            name: self.name,
            url,
            addr,
            state,
            ca,
            kubelet_client,
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
            let client = cluster.controller_client().map_err(Error::Client)?;
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
