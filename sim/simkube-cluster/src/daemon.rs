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
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::Error;
use crate::state::{ClusterRecord, DaemonRecord, StateDir, write_atomic};
use crate::topology::{self};

mod bootstrap;
mod supervisor;

pub(crate) use supervisor::STATUS_SUFFIX;

use bootstrap::{bootstrap, start_dns};
use supervisor::Supervisor;

/// How long a node's certificate is valid.
const NODE_CERT_LIFETIME: Duration = Duration::from_secs(365 * 24 * 3600);

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
    enter_netns(&record.network_netns())?;
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
        // kube-apiserver sends a watch about one bookmark a minute; the in-process default of
        // one a second keeps tests quick but would dwarf a product's own idle traffic.
        .bookmark_interval(Duration::from_secs(60))
        .node_monitor_grace_period(Duration::from_secs(record.node_grace_seconds))
        .cluster_signing_duration(Duration::from_secs(record.cluster_signing_seconds))
        // Node agents share the host's filesystem, so they mount these directories as is;
        // `down` removes them with the rest of the cluster's state.
        .volumes_dir(state.cluster_dir(&record.name).join("volumes"))
        .start()
        .await?;
    *cluster
        .state()
        .webhook_dialer
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(webhook_dialer(&plan));
    *cluster
        .state()
        .pod_proxy
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner) =
        Some(simkube::kubelet_proxy::pod_proxy(
            cluster.kubelet_client().with_dialer(kubelet_dialer(&plan)),
        ));
    tracing::info!(cluster = %record.name, api = %api_addr, host_port, "API server listening");
    let client = cluster.client();
    bootstrap(&client, &plan, record.service_cidr).await?;
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
    write_kubeconfigs(&state, &record, &cluster, host_port)?;
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

/// The admin kubeconfig (server on 127.0.0.1 in the host namespace) and one client
/// certificate kubeconfig per node (`system:node:<name>`).
fn write_kubeconfigs(
    state: &StateDir,
    record: &ClusterRecord,
    cluster: &simkube::Cluster,
    host_port: u16,
) -> Result<(), Error> {
    let plan = record.plan();
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

/// How the API server reaches a kubelet API served at a pod address (a virtual kubelet, whose
/// Node publishes its pod's IP, as in real clusters where the control plane reaches pod
/// addresses): from inside the node whose pod CIDR holds it, like [`webhook_dialer`]. Node
/// addresses are dialled directly, as before.
fn kubelet_dialer(plan: &crate::topology::Plan) -> simkube::kubelet_proxy::KubeletDialer {
    let nodes: Vec<(String, String, ipnet::Ipv4Net)> = plan
        .node_plans()
        .into_iter()
        .map(|n| (n.name, n.netns, n.pod_cidr))
        .collect();
    let dial = webhook_dialer(plan);
    std::sync::Arc::new(move |addr: SocketAddr| {
        let std::net::IpAddr::V4(ip) = addr.ip() else {
            return None;
        };
        let (node, _, _) = nodes.iter().find(|(_, _, cidr)| cidr.contains(&ip))?;
        Some(dial(simkube::admission::webhooks::WebhookEndpoint {
            ip: addr.ip(),
            port: addr.port(),
            node_name: Some(node.clone()),
        }))
    })
}

/// How the API server reaches a webhook served by a pod: pod addresses are routed between
/// the nodes but not to the underlay namespace the API server lives in, so the connection is
/// opened from inside a node's namespace (the endpoint's own node when the slice names one),
/// on a thread of its own so that the runtime's threads stay where they are.
fn webhook_dialer(plan: &crate::topology::Plan) -> simkube::admission::webhooks::WebhookDialer {
    let nodes: Vec<(String, String)> = plan
        .node_plans()
        .into_iter()
        .map(|n| (n.name, n.netns))
        .collect();
    std::sync::Arc::new(move |ep: simkube::admission::webhooks::WebhookEndpoint| {
        let netns = ep
            .node_name
            .as_ref()
            .and_then(|name| nodes.iter().find(|(n, _)| n == name))
            .or_else(|| nodes.first())
            .map(|(_, ns)| ns.clone());
        Box::pin(async move {
            let netns = netns.ok_or_else(|| std::io::Error::other("the cluster has no node"))?;
            // A thread of its own, never a pooled one: it stays in the node's namespace.
            let (tx, rx) = tokio::sync::oneshot::channel();
            std::thread::spawn(move || {
                let connect = || {
                    let path = Path::new(crate::net::NETNS_DIR).join(&netns);
                    let file = std::fs::File::open(&path)?;
                    nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
                        .map_err(std::io::Error::from)?;
                    let stream = std::net::TcpStream::connect_timeout(
                        &SocketAddr::new(ep.ip, ep.port),
                        Duration::from_secs(5),
                    )?;
                    stream.set_nonblocking(true)?;
                    Ok::<_, std::io::Error>(stream)
                };
                let _ = tx.send(connect());
            });
            let std_stream = rx
                .await
                .map_err(|_| std::io::Error::other("the connecting thread died"))??;
            tokio::net::TcpStream::from_std(std_stream)
        })
    })
}
