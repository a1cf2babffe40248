//! The cluster daemon (`simkube cluster daemon --name C`): one detached process per cluster
//! running the API server with every controller, the cluster DNS, and the node agents.
//!
//! Its admin listener is bound on 127.0.0.1 in the host namespace first; then the process moves
//! into the underlay namespace (before any thread exists, so every thread lives there) where the
//! API server listens on 198.18.X.1:6443 for nodes and pods, and the DNS on 198.18.X.1:53.
//!
//! Node agents run as children (`simkube node --netns sk.C.nI ...`), each logging to
//! `node-I.log`. An agent that exits on its own is restarted with back-off (1 s doubling to
//! 60 s, reset after a minute of running); an agent stopped by `cluster stop-node` (a
//! `node-I.stopped` marker) stays stopped until `cluster start-node` removes the marker. On
//! SIGTERM the daemon stops its agents (they remove their pods' sandboxes), then exits.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Endpoints, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::Api;
use kube::api::PostParams;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::Error;
use crate::ops::AGENT_GRACE;
use crate::state::{ClusterRecord, DaemonRecord, StateDir, open_log, write_atomic};
use crate::topology::{self, NodePlan, Plan};

/// How long a node's certificate is valid.
const NODE_CERT_LIFETIME: Duration = Duration::from_secs(365 * 24 * 3600);
/// Back-off of a crashing agent.
const RESTART_INITIAL: Duration = Duration::from_secs(1);
const RESTART_MAX: Duration = Duration::from_secs(60);
/// An agent that ran this long before exiting restarts without back-off.
const RESTART_RESET: Duration = Duration::from_secs(60);

/// Runs the daemon of cluster `name` until SIGTERM. Call it from a process with one thread.
pub fn run(state_dir: &Path, name: &str) -> Result<(), Error> {
    topology::validate_name(name)?;
    let state = StateDir::new(state_dir);
    let record = state
        .read_record(name)?
        .ok_or_else(|| Error::Unknown(name.to_owned()))?;
    // A session of its own: the terminal or test harness that ran `cluster up` may go away.
    let _ = nix::unistd::setsid();
    let host = std::net::TcpListener::bind(("127.0.0.1", 0))
        .map_err(Error::io("binding the admin listener on 127.0.0.1"))?;
    let metrics = std::net::TcpListener::bind(("127.0.0.1", 0))
        .map_err(Error::io("binding the metrics listener on 127.0.0.1"))?;
    enter_netns(&record.underlay)?;
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(Error::io("starting the async runtime"))?
        .block_on(serve(state, record, host, metrics))
}

fn enter_netns(name: &str) -> Result<(), Error> {
    let path = Path::new(crate::net::NETNS_DIR).join(name);
    let file = std::fs::File::open(&path).map_err(|source| Error::State {
        action: "opening the underlay namespace",
        path: path.clone(),
        source,
    })?;
    nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).map_err(|errno| Error::Io {
        action: format!("entering the underlay namespace {name}"),
        source: errno.into(),
    })
}

async fn serve(
    state: StateDir,
    record: ClusterRecord,
    host: std::net::TcpListener,
    metrics_listener: std::net::TcpListener,
) -> Result<(), Error> {
    let plan = record.plan();
    let host_port = host
        .local_addr()
        .map_err(Error::io("reading the admin listener's port"))?
        .port();
    let metrics_port = metrics_listener
        .local_addr()
        .map_err(Error::io("reading the metrics listener's port"))?
        .port();
    let api_addr = SocketAddr::V4(plan.api_addr());
    let cluster = simkube::Cluster::builder()
        .name(&record.name)
        .tls(true)
        .rbac(true)
        .bind(api_addr)
        .advertise(api_addr)
        .service_cidr(record.service_cidr)
        .tls_hosts(plan.tls_hosts())
        .extra_listener(host)
        .controllers(simkube::controllers::Controllers::all())
        .load_balancer_pool(plan.lb_pool())
        .node_monitor_grace_period(Duration::from_secs(record.node_grace_seconds))
        .start()
        .await?;
    tracing::info!(cluster = %record.name, api = %api_addr, host_port, "API server listening");
    let client = cluster.client();
    bootstrap(&client, &plan).await?;
    let shutdown = CancellationToken::new();
    let dns_metrics = simkube_dns::Metrics::default();
    let agent_metrics = crate::metrics::AgentMetrics::default();
    let metrics = crate::metrics::serve(
        metrics_listener,
        &agent_metrics,
        &dns_metrics,
        shutdown.clone(),
    )
    .map_err(Error::io("serving /metrics"))?;
    let dns = start_dns(client.clone(), &plan, dns_metrics, shutdown.clone()).await?;
    let ca_pem = cluster
        .ca_pem()
        .expect("invariant: the daemon's cluster serves TLS");
    let admin = simkube::tls::kubeconfig(
        &record.name,
        &format!("https://127.0.0.1:{host_port}"),
        Some(&ca_pem),
        cluster.admin_token(),
    );
    write_atomic(
        &state.file(&record.name, "admin.kubeconfig"),
        admin.as_bytes(),
        0o600,
    )?;
    let ca = cluster.ca().expect("invariant: TLS is on");
    for node in plan.node_plans() {
        let (cert, key) = ca.issue_client_cert(
            &format!("system:node:{}", node.name),
            &["system:nodes".to_owned()],
            NODE_CERT_LIFETIME,
        )?;
        let kubeconfig = simkube::tls::kubeconfig_with_client_cert(
            &record.name,
            &format!("https://{}", plan.api_addr()),
            &ca_pem,
            &cert,
            &key,
            &format!("system:node:{}", node.name),
        );
        write_atomic(
            &state.file(&record.name, &format!("node-{}.kubeconfig", node.number)),
            kubeconfig.as_bytes(),
            0o600,
        )?;
    }
    let exe = std::env::current_exe().map_err(Error::io("locating the simkube executable"))?;
    let mut agents = Vec::new();
    for node in plan.node_plans() {
        let supervisor = Supervisor {
            exe: exe.clone(),
            state: state.clone(),
            record: record.clone(),
            node,
            metrics: agent_metrics.clone(),
        };
        agents.push(tokio::spawn(supervisor.run(shutdown.clone())));
    }
    state.write_daemon(
        &record.name,
        &DaemonRecord {
            pid: std::process::id(),
            host_port,
            metrics_port: Some(metrics_port),
        },
    )?;
    wait_for_signal().await?;
    tracing::info!("stopping: node agents first");
    shutdown.cancel();
    for agent in agents {
        let _ = agent.await;
    }
    if let Ok(Err(error)) = dns.await {
        tracing::warn!(%error, "the DNS server ended with an error");
    }
    let _ = metrics.await;
    cluster.shutdown().await;
    tracing::info!("stopped");
    Ok(())
}

async fn wait_for_signal() -> Result<(), Error> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate =
        signal(SignalKind::terminate()).map_err(Error::io("installing the SIGTERM handler"))?;
    let mut interrupt =
        signal(SignalKind::interrupt()).map_err(Error::io("installing the SIGINT handler"))?;
    tokio::select! {
        _ = terminate.recv() => {}
        _ = interrupt.recv() => {}
    }
    Ok(())
}

/// The cluster objects a kubeadm cluster starts with that the API server does not seed: the
/// nodes' permissions and the DNS Service with its (selector-less) endpoints.
async fn bootstrap(client: &kube::Client, plan: &Plan) -> Result<(), Error> {
    let pp = PostParams::default();
    // The nodes authenticate with certificates (system:node:<name>, group system:nodes). The
    // API server has no Node authorizer, so the group gets what a kubelet may do by binding it
    // to cluster-admin.
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "simkube:nodes"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:nodes"}],
    }))
    .expect("invariant: a valid ClusterRoleBinding");
    Api::<ClusterRoleBinding>::all(client.clone())
        .create(&pp, &binding)
        .await
        .map_err(Error::api("creating the nodes' ClusterRoleBinding"))?;
    let dns_ip = topology::DNS_SERVICE_IP.to_string();
    let gateway = plan.gateway().to_string();
    let labels = json!({"k8s-app": "kube-dns", "kubernetes.io/name": "CoreDNS", "kubernetes.io/cluster-service": "true"});
    let service: Service = serde_json::from_value(json!({
        "metadata": {"name": "kube-dns", "namespace": "kube-system", "labels": labels},
        "spec": {"clusterIP": dns_ip, "ports": [
            {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53},
            {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 53},
        ]},
    }))
    .expect("invariant: a valid Service");
    Api::<Service>::namespaced(client.clone(), "kube-system")
        .create(&pp, &service)
        .await
        .map_err(Error::api("creating the kube-dns Service"))?;
    let endpoints: Endpoints = serde_json::from_value(json!({
        "metadata": {"name": "kube-dns", "namespace": "kube-system", "labels": labels},
        "subsets": [{"addresses": [{"ip": gateway}], "ports": [
            {"name": "dns", "port": 53, "protocol": "UDP"},
            {"name": "dns-tcp", "port": 53, "protocol": "TCP"},
        ]}],
    }))
    .expect("invariant: valid Endpoints");
    Api::<Endpoints>::namespaced(client.clone(), "kube-system")
        .create(&pp, &endpoints)
        .await
        .map_err(Error::api("creating the kube-dns Endpoints"))?;
    let slice: EndpointSlice = serde_json::from_value(json!({
        "metadata": {"name": "kube-dns-simkube", "namespace": "kube-system", "labels": {
            "kubernetes.io/service-name": "kube-dns",
            "endpointslice.kubernetes.io/managed-by": "simkube-cluster",
        }},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [gateway], "conditions": {"ready": true, "serving": true, "terminating": false}}],
        "ports": [
            {"name": "dns", "port": 53, "protocol": "UDP"},
            {"name": "dns-tcp", "port": 53, "protocol": "TCP"},
        ],
    }))
    .expect("invariant: a valid EndpointSlice");
    Api::<EndpointSlice>::namespaced(client.clone(), "kube-system")
        .create(&pp, &slice)
        .await
        .map_err(Error::api("creating the kube-dns EndpointSlice"))?;
    Ok(())
}

/// Binds 198.18.X.1:53 (UDP and TCP) and serves the cluster DNS there.
async fn start_dns(
    client: kube::Client,
    plan: &Plan,
    metrics: simkube_dns::Metrics,
    shutdown: CancellationToken,
) -> Result<tokio::task::JoinHandle<Result<(), simkube_dns::DnsError>>, Error> {
    let addr = SocketAddr::new(IpAddr::V4(plan.gateway()), 53);
    let udp = tokio::net::UdpSocket::bind(addr)
        .await
        .map_err(Error::io(format!("binding the DNS server to {addr}/udp")))?;
    let tcp = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(Error::io(format!("binding the DNS server to {addr}/tcp")))?;
    let config = simkube_dns::DnsConfig {
        domain: topology::CLUSTER_DOMAIN.to_owned(),
        metrics,
        ..simkube_dns::DnsConfig::default()
    };
    tracing::info!(%addr, "cluster DNS listening");
    Ok(tokio::spawn(simkube_dns::serve(
        client, config, udp, tcp, shutdown,
    )))
}

/// Runs and restarts the agent of one node.
struct Supervisor {
    exe: PathBuf,
    state: StateDir,
    record: ClusterRecord,
    node: NodePlan,
    metrics: crate::metrics::AgentMetrics,
}

impl Supervisor {
    fn file(&self, suffix: &str) -> PathBuf {
        self.state.file(
            &self.record.name,
            &format!("node-{}{suffix}", self.node.number),
        )
    }

    fn stopped_by_request(&self) -> bool {
        self.file(".stopped").exists()
    }

    fn command(&self) -> tokio::process::Command {
        let plan = self.record.plan();
        let mut command = tokio::process::Command::new(&self.exe);
        command
            .arg("node")
            .arg("--netns")
            .arg(&self.node.netns)
            .arg("--netns-prefix")
            .arg(&self.node.sandbox_prefix)
            .arg("--kubeconfig")
            .arg(self.file(".kubeconfig"))
            .arg("--name")
            .arg(&self.node.name)
            .arg("--pod-cidr")
            .arg(self.node.pod_cidr.to_string())
            .arg("--internal-ip")
            .arg(self.node.ip.to_string())
            .arg("--state-dir")
            .arg(self.file(""))
            .arg("--pod-api-server")
            .arg(format!("{}:443", topology::API_SERVICE_IP))
            .arg("--cluster-dns")
            .arg(topology::DNS_SERVICE_IP.to_string())
            .arg("--cluster-domain")
            .arg(topology::CLUSTER_DOMAIN)
            .arg("--cluster-cidr")
            .arg(plan.pod_cidr.to_string())
            .arg("--service-cidr")
            .arg(self.record.service_cidr.to_string())
            .arg("--lease-duration")
            .arg(self.record.node_grace_seconds.to_string())
            .arg("--exit-with-parent")
            .arg(std::process::id().to_string());
        for (image, program) in &self.record.images {
            command
                .arg("--image")
                .arg(format!("{image}={}", program.display()));
        }
        command
    }

    async fn run(self, shutdown: CancellationToken) {
        let mut backoff = RESTART_INITIAL;
        let node = self.node.name.clone();
        let labels = crate::metrics::AgentMetrics::labels(&node);
        loop {
            if shutdown.is_cancelled() {
                return;
            }
            let stopped = self.stopped_by_request();
            self.metrics
                .stopped
                .get_or_create(&labels)
                .set(i64::from(stopped));
            if stopped {
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(Duration::from_millis(250)) => continue,
                }
            }
            let child = match self.spawn() {
                Ok(child) => child,
                Err(error) => {
                    tracing::error!(%node, %error, "cannot start the node agent");
                    tokio::select! {
                        () = shutdown.cancelled() => return,
                        () = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(RESTART_MAX);
                    continue;
                }
            };
            let started = Instant::now();
            self.metrics.up.get_or_create(&labels).set(1);
            let exit = self.watch(child, &shutdown).await;
            self.metrics.up.get_or_create(&labels).set(0);
            match exit {
                Exit::Shutdown => return,
                Exit::Requested => {
                    tracing::info!(%node, "node agent stopped by request; not restarting");
                    backoff = RESTART_INITIAL;
                    continue;
                }
                Exit::Crashed(status) => {
                    self.metrics.restarts.get_or_create(&labels).inc();
                    if started.elapsed() > RESTART_RESET {
                        backoff = RESTART_INITIAL;
                    }
                    tracing::warn!(%node, %status, restart_in = ?backoff, "node agent exited; restarting");
                    tokio::select! {
                        () = shutdown.cancelled() => return,
                        () = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(RESTART_MAX);
                }
            }
        }
    }

    fn spawn(&self) -> Result<tokio::process::Child, Error> {
        let (log, log_err) = open_log(&self.file(".log"))?;
        let child = self
            .command()
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .spawn()
            .map_err(Error::io(format!("starting {}", self.exe.display())))?;
        let pid = child.id().unwrap_or_default();
        write_atomic(&self.file(".pid"), format!("{pid}\n").as_bytes(), 0o644)?;
        tracing::info!(node = %self.node.name, pid, netns = %self.node.netns, "node agent started");
        Ok(child)
    }

    async fn watch(&self, mut child: tokio::process::Child, shutdown: &CancellationToken) -> Exit {
        let exit = loop {
            tokio::select! {
                status = child.wait() => {
                    let status = status.map_or_else(|e| e.to_string(), |s| s.to_string());
                    break Exit::Crashed(status);
                }
                () = shutdown.cancelled() => break Exit::Shutdown,
                () = tokio::time::sleep(Duration::from_millis(250)) => {
                    if self.stopped_by_request() {
                        break Exit::Requested;
                    }
                }
            }
        };
        if !matches!(exit, Exit::Crashed(_)) {
            stop_child(&mut child, &self.node.name).await;
        }
        let _ = std::fs::remove_file(self.file(".pid"));
        exit
    }
}

enum Exit {
    Shutdown,
    Requested,
    Crashed(String),
}

/// SIGTERM, then SIGKILL after [`AGENT_GRACE`].
async fn stop_child(child: &mut tokio::process::Child, node: &str) {
    if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
    match tokio::time::timeout(AGENT_GRACE, child.wait()).await {
        Ok(_) => tracing::info!(%node, "node agent stopped"),
        Err(_) => {
            tracing::warn!(%node, "node agent did not stop in time; killing it");
            let _ = child.kill().await;
        }
    }
}
