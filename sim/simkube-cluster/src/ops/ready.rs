//! Waiting until a new cluster works: its API server serves, every node is Ready, every node's
//! service proxy has applied its rules, and the cluster DNS answers on every node through its
//! ClusterIP, as a pod's lookup would go. Failures come back with their reason: the daemon's
//! last log lines when it exits, and a node agent's own report (`node-I.status.json`: a missing
//! program, a proxy whose rules the kernel refuses) as soon as it has one.

use std::collections::BTreeSet;
use std::net::SocketAddrV4;
use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use simkube_node::proxy::ProxyHealth;
use simkube_node::status::AgentStatus;

use crate::Error;
use crate::state::{ClusterRecord, DaemonRecord, StateDir};
use crate::topology::{self, NodePlan};

use super::up::{UpOptions, UpSummary};

/// Failed applies in a row after which a node's service proxy fails `up`: its rules are
/// retried after 1 s and 2 s first, so a passing hiccup is forgiven.
const PROXY_FAILURES: u32 = 3;
/// The name every cluster serves, asked on every node (the `kubernetes` Service).
const PROBE_NAME: &str = "kubernetes.default.svc.cluster.local";
/// How long one DNS question waits for its answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

pub(super) fn wait_ready(
    state: &StateDir,
    record: &ClusterRecord,
    child: Child,
    options: &UpOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<UpSummary, Error> {
    let mut waiter = Waiter {
        state,
        record,
        child,
        deadline: Instant::now() + options.timeout,
        timeout: options.timeout,
        nodes: record.plan().node_plans(),
    };
    let daemon = waiter.wait_daemon()?;
    let url = format!("https://127.0.0.1:{}", daemon.host_port);
    progress(&format!(
        "API server up: {url} (nodes and pods: https://{})",
        record.plan().api_addr()
    ));
    let kubeconfig_path = state.file(&record.name, "admin.kubeconfig");
    waiter.wait_nodes(&kubeconfig_path, progress)?;
    waiter.wait_proxies(progress)?;
    waiter.wait_dns(progress)?;
    let kubeconfig = std::fs::read(&kubeconfig_path).map_err(|source| Error::State {
        action: "reading",
        path: kubeconfig_path.clone(),
        source,
    })?;
    crate::state::write_atomic(&options.kubeconfig_out, &kubeconfig, 0o600)?;
    Ok(UpSummary {
        record: record.clone(),
        url,
        nodes: waiter.nodes.into_iter().map(|n| n.name).collect(),
        metrics_url: daemon
            .metrics_port
            .map(|port| format!("http://127.0.0.1:{port}")),
        kubeconfig: options.kubeconfig_out.clone(),
    })
}

/// The checks of one `up`, sharing its deadline and its daemon.
struct Waiter<'a> {
    state: &'a StateDir,
    record: &'a ClusterRecord,
    child: Child,
    deadline: Instant,
    timeout: Duration,
    nodes: Vec<NodePlan>,
}

impl Waiter<'_> {
    fn not_ready(&self, message: String) -> Error {
        Error::NotReady {
            message,
            logs: self.state.cluster_dir(&self.record.name),
        }
    }

    fn expired(&self) -> bool {
        Instant::now() > self.deadline
    }

    /// Fails when the daemon has exited, or when a node agent reported that it cannot run or
    /// that its service proxy keeps failing.
    fn check(&mut self) -> Result<(), Error> {
        if let Ok(Some(status)) = self.child.try_wait() {
            let log = self.state.file(&self.record.name, "daemon.log");
            return Err(self.not_ready(format!(
                "the cluster daemon exited ({status}): {}",
                tail(&log, 5)
            )));
        }
        for node in &self.nodes {
            let Some(status) = self.agent_status(node) else {
                continue;
            };
            if let Some(fatal) = status.fatal {
                return Err(self.not_ready(format!(
                    "node {}: the node agent cannot run: {fatal}",
                    node.name
                )));
            }
            if let Some(ProxyHealth::Failing { failures, error }) = status.proxy
                && failures >= PROXY_FAILURES
            {
                return Err(self.not_ready(format!(
                    "node {}: the service proxy failed {failures} times in a row: {error}",
                    node.name
                )));
            }
        }
        Ok(())
    }

    /// The agent's report, once it wrote one.
    fn agent_status(&self, node: &NodePlan) -> Option<AgentStatus> {
        let suffix = format!("node-{}{}", node.number, crate::daemon::STATUS_SUFFIX);
        simkube_node::status::read(&self.state.file(&self.record.name, &suffix))
            .ok()
            .flatten()
    }

    fn wait_daemon(&mut self) -> Result<DaemonRecord, Error> {
        loop {
            self.check()?;
            if let Some(daemon) = self.state.read_daemon(&self.record.name)? {
                return Ok(daemon);
            }
            if self.expired() {
                return Err(self.not_ready(format!(
                    "the API server did not start within {} s",
                    self.timeout.as_secs()
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until every node has registered and is Ready.
    fn wait_nodes(
        &mut self,
        kubeconfig: &Path,
        progress: &mut dyn FnMut(&str),
    ) -> Result<(), Error> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(Error::io("starting the async runtime"))?;
        let client = runtime.block_on(client_from(kubeconfig))?;
        let api: kube::Api<Node> = kube::Api::all(client);
        let expected: Vec<String> = self.nodes.iter().map(|n| n.name.clone()).collect();
        let mut registered = BTreeSet::new();
        let mut ready = BTreeSet::new();
        loop {
            self.check()?;
            let list = runtime.block_on(api.list(&Default::default()));
            for node in list.iter().flat_map(|l| &l.items) {
                let name = node.metadata.name.clone().unwrap_or_default();
                if !expected.contains(&name) {
                    continue;
                }
                if registered.insert(name.clone()) {
                    let (done, all) = (registered.len(), expected.len());
                    progress(&format!("node {name} registered ({done}/{all})"));
                }
                if node_ready(node) && ready.insert(name.clone()) {
                    progress(&format!(
                        "node {name} Ready ({}/{})",
                        ready.len(),
                        expected.len()
                    ));
                }
            }
            if ready.len() == expected.len() {
                return Ok(());
            }
            if self.expired() {
                let missing: Vec<&String> =
                    expected.iter().filter(|n| !ready.contains(*n)).collect();
                return Err(self.not_ready(format!(
                    "nodes {missing:?} not Ready within {} s",
                    self.timeout.as_secs()
                )));
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Waits until every node's service proxy reports its rules and routes applied.
    fn wait_proxies(&mut self, progress: &mut dyn FnMut(&str)) -> Result<(), Error> {
        let mut ready = BTreeSet::new();
        loop {
            self.check()?;
            let mut last = Vec::new();
            for node in &self.nodes {
                let proxy = self.agent_status(node).and_then(|s| s.proxy);
                if proxy == Some(ProxyHealth::Ready) {
                    if ready.insert(node.name.clone()) {
                        let (done, all) = (ready.len(), self.nodes.len());
                        progress(&format!(
                            "service proxy of {} ready ({done}/{all})",
                            node.name
                        ));
                    }
                } else if !ready.contains(&node.name) {
                    last.push(format!("{}: {proxy:?}", node.name));
                }
            }
            if ready.len() == self.nodes.len() {
                return Ok(());
            }
            if self.expired() {
                return Err(self.not_ready(format!(
                    "the service proxies of the nodes were not ready within {} s ({})",
                    self.timeout.as_secs(),
                    last.join("; ")
                )));
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Waits until the cluster DNS answers [`PROBE_NAME`] on every node, asked at the kube-dns
    /// Service's ClusterIP from the node's namespace.
    fn wait_dns(&mut self, progress: &mut dyn FnMut(&str)) -> Result<(), Error> {
        let service = SocketAddrV4::new(topology::DNS_SERVICE_IP, 53);
        let mut pending: Vec<NodePlan> = self.nodes.clone();
        loop {
            self.check()?;
            let mut failures = Vec::new();
            pending.retain(|node| match self.resolve(node, service) {
                Ok(()) => false,
                Err(error) => {
                    failures.push((node.clone(), error));
                    true
                }
            });
            if pending.is_empty() {
                progress(&format!(
                    "cluster DNS answers on every node ({PROBE_NAME} is {})",
                    topology::API_SERVICE_IP
                ));
                return Ok(());
            }
            if self.expired() {
                let (node, error) = &failures[0];
                let direct = SocketAddrV4::new(self.record.plan().gateway(), 53);
                let direct = match self.resolve(node, direct) {
                    Ok(()) => format!("asked directly at {direct}, it answers"),
                    Err(e) => format!("asked directly: {e}"),
                };
                return Err(self.not_ready(format!(
                    "the cluster DNS does not answer on node {} within {} s: asked at the \
                     kube-dns Service {service}: {error}; {direct}",
                    node.name,
                    self.timeout.as_secs()
                )));
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Asks `server` for [`PROBE_NAME`] from `node`'s namespace; it must answer the API
    /// Service's ClusterIP.
    fn resolve(&self, node: &NodePlan, server: SocketAddrV4) -> Result<(), String> {
        let netns = Path::new(crate::net::NETNS_DIR).join(&node.netns);
        let found = crate::probe::resolve_a(&netns, server, PROBE_NAME, PROBE_TIMEOUT)?;
        if found.contains(&topology::API_SERVICE_IP) {
            Ok(())
        } else {
            Err(format!(
                "{server} answered {found:?} instead of {}",
                topology::API_SERVICE_IP
            ))
        }
    }
}

/// A client from a kubeconfig file.
pub async fn client_from(path: &Path) -> Result<kube::Client, Error> {
    let kubeconfig = kube::config::Kubeconfig::read_from(path)
        .map_err(|e| Error::Invalid(format!("kubeconfig {}: {e}", path.display())))?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .map_err(|e| Error::Invalid(format!("kubeconfig {}: {e}", path.display())))?;
    kube::Client::try_from(config).map_err(Error::api("building the API client"))
}

/// Whether the Node's Ready condition is True.
pub fn node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The last `lines` lines of a file, joined by " | ".
fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    all[all.len().saturating_sub(lines)..].join(" | ")
}
