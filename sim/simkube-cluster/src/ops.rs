//! `cluster up`, `down`, `list`, `stop-node` and `start-node`: the orchestration around the
//! network plumbing ([`crate::net`]), the state directory ([`crate::state`]) and the daemon
//! ([`crate::daemon`]).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;

use crate::state::{ClusterRecord, StateDir, open_log};
use crate::topology::{self, Plan};
use crate::{Error, net, proc};

/// How long the daemon gets to stop its agents and exit before it is killed.
const DAEMON_GRACE: Duration = Duration::from_secs(30);
/// How long a node agent gets to remove its pods before it is killed.
pub const AGENT_GRACE: Duration = Duration::from_secs(20);
/// Tether's image, served by the `tetherd` executable next to `simkube` when there is one.
pub const TETHER_IMAGE: &str = "ghcr.io/tether-dev/tetherd";

/// What `cluster up` is asked for.
#[derive(Debug, Clone)]
pub struct UpOptions {
    /// Cluster name.
    pub name: String,
    /// Node count.
    pub nodes: u8,
    /// Where the admin kubeconfig goes.
    pub kubeconfig_out: PathBuf,
    /// Underlay namespace.
    pub underlay: String,
    /// State directory.
    pub state_dir: PathBuf,
    /// Cluster pod CIDR.
    pub pod_cidr: ipnet::Ipv4Net,
    /// Service CIDR.
    pub service_cidr: ipnet::Ipv4Net,
    /// Extra image-table entries (`reference`, program).
    pub images: Vec<(String, PathBuf)>,
    /// How long to wait for every node to be Ready.
    pub timeout: Duration,
    /// Node monitor grace period (and the agents' Lease duration), in seconds.
    pub node_grace_seconds: u64,
    /// The `simkube` executable (runs the daemon and the agents).
    pub exe: PathBuf,
}

/// A cluster that came up.
#[derive(Debug, Clone)]
pub struct UpSummary {
    /// The cluster record.
    pub record: ClusterRecord,
    /// The admin URL on the host (`https://127.0.0.1:<port>`).
    pub url: String,
    /// Node names.
    pub nodes: Vec<String>,
    /// The daemon's `/metrics` and `/healthz` (`http://127.0.0.1:<port>`).
    pub metrics_url: Option<String>,
    /// Where the kubeconfig was written.
    pub kubeconfig: PathBuf,
}

/// The default image table: Tether's image to `tetherd` next to `exe`, when it exists.
pub fn default_images(exe: &Path) -> Vec<(String, PathBuf)> {
    let tetherd = exe.with_file_name("tetherd");
    if tetherd.is_file() {
        vec![(TETHER_IMAGE.to_owned(), tetherd)]
    } else {
        Vec::new()
    }
}

/// Brings a cluster up: plumbing, daemon, and waiting until every node is Ready. On failure,
/// whatever was created is removed again.
pub fn up(options: &UpOptions, progress: &mut dyn FnMut(&str)) -> Result<UpSummary, Error> {
    topology::validate_name(&options.name)?;
    topology::validate_underlay(&options.underlay)?;
    topology::validate_nodes(options.nodes)?;
    if !(4..=3600).contains(&options.node_grace_seconds) {
        return Err(Error::Invalid(format!(
            "--node-grace-period {}: between 4 and 3600 seconds",
            options.node_grace_seconds
        )));
    }
    if options.service_cidr.prefix_len() > 24 {
        return Err(Error::Invalid(format!(
            "--service-cidr {}: too small (at most a /24)",
            options.service_cidr
        )));
    }
    for (image, program) in &options.images {
        if !program.is_file() {
            return Err(Error::Invalid(format!(
                "--image {image}={}: no such program (give the path of an executable)",
                program.display()
            )));
        }
    }
    require_root()?;
    let state = StateDir::new(&options.state_dir);
    let lock = state.lock()?;
    clean_previous(&state, &options.name, progress)?;
    let mut used = state.used_indices(&options.name)?;
    // A bridge without a record (another state directory, or a lost one) holds its index too.
    for index in 1..=topology::MAX_INDEX {
        if net::netns_exists(&options.underlay)
            && net::link_exists(&options.underlay, &format!("skbr{index}"))
        {
            used.insert(index);
        }
    }
    let index = topology::free_index(&used)?;
    let mut plan = Plan::new(&options.name, index, options.nodes);
    plan.pod_cidr = options.pod_cidr;
    plan.validate()?;
    let mut images = options.images.clone();
    images.extend(default_images(&options.exe));
    let mut record = ClusterRecord {
        name: options.name.clone(),
        index,
        nodes: options.nodes,
        underlay: options.underlay.clone(),
        pod_cidr: options.pod_cidr,
        service_cidr: options.service_cidr,
        images,
        daemon_pid: None,
        node_grace_seconds: options.node_grace_seconds,
        created: jiff::Timestamp::now().to_string(),
    };
    // The record goes first: whatever happens next, `down` knows what to remove.
    state.write_record(&record)?;
    let started = create_and_start(&state, &mut record, options, progress);
    drop(lock);
    let outcome = started.and_then(|child| wait_ready(&state, &record, child, options, progress));
    match outcome {
        Ok(summary) => {
            let _ = std::fs::remove_dir_all(state.root().join(format!("{}.failed", options.name)));
            Ok(summary)
        }
        Err(error) => {
            progress(&format!("bringing {} up failed; removing it", options.name));
            let kept = keep_logs(&state, &options.name);
            if let Err(e) = down(&options.state_dir, &options.name, &mut |_| {}) {
                progress(&format!("cleanup after the failure also failed: {e}"));
            }
            Err(match (error, kept) {
                (Error::NotReady { message, .. }, Some(logs)) => Error::NotReady { message, logs },
                (error, _) => error,
            })
        }
    }
}

fn create_and_start(
    state: &StateDir,
    record: &mut ClusterRecord,
    options: &UpOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<Child, Error> {
    let plan = record.plan();
    net::ensure_underlay(&record.underlay)?;
    net::create_bridge(&record.underlay, &plan)?;
    for node in plan.node_plans() {
        net::create_node(&record.underlay, &plan, &node)?;
    }
    net::route_lb_pool(&record.underlay, &plan)?;
    progress(&format!(
        "network created: underlay {}, bridge {} {}, node namespaces {}n1..n{}",
        record.underlay,
        plan.bridge(),
        plan.bridge_net(),
        topology::cluster_netns_prefix(&plan.name),
        plan.nodes,
    ));
    let (log, log_err) = open_log(&state.file(&record.name, "daemon.log"))?;
    let child = Command::new(&options.exe)
        .args(["cluster", "daemon", "--name", &record.name, "--state-dir"])
        .arg(&options.state_dir)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err)
        .spawn()
        .map_err(Error::io(format!(
            "starting the cluster daemon {}",
            options.exe.display()
        )))?;
    record.daemon_pid = Some(child.id());
    state.write_record(record)?;
    Ok(child)
}

fn wait_ready(
    state: &StateDir,
    record: &ClusterRecord,
    mut child: Child,
    options: &UpOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<UpSummary, Error> {
    let logs = state.cluster_dir(&record.name);
    let deadline = Instant::now() + options.timeout;
    let not_ready = |message: String| Error::NotReady {
        message,
        logs: logs.clone(),
    };
    let check_daemon = |child: &mut Child| -> Result<(), Error> {
        match child.try_wait() {
            Ok(Some(status)) => Err(not_ready(format!(
                "the cluster daemon exited ({status}): {}",
                tail(&state.file(&record.name, "daemon.log"), 5)
            ))),
            _ => Ok(()),
        }
    };
    let daemon = loop {
        check_daemon(&mut child)?;
        if let Some(daemon) = state.read_daemon(&record.name)? {
            break daemon;
        }
        if Instant::now() > deadline {
            return Err(not_ready(format!(
                "the API server did not start within {} s",
                options.timeout.as_secs()
            )));
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let url = format!("https://127.0.0.1:{}", daemon.host_port);
    progress(&format!(
        "API server up: {url} (nodes and pods: https://{})",
        record.plan().api_addr()
    ));
    let kubeconfig_path = state.file(&record.name, "admin.kubeconfig");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(Error::io("starting the async runtime"))?;
    let client = runtime.block_on(client_from(&kubeconfig_path))?;
    let api: kube::Api<Node> = kube::Api::all(client);
    let mut reported_registered = std::collections::BTreeSet::new();
    let mut reported_ready = std::collections::BTreeSet::new();
    let expected: Vec<String> = record
        .plan()
        .node_plans()
        .into_iter()
        .map(|n| n.name)
        .collect();
    loop {
        check_daemon(&mut child)?;
        if let Ok(list) = runtime.block_on(api.list(&Default::default())) {
            for node in &list.items {
                let name = node.metadata.name.clone().unwrap_or_default();
                if !expected.contains(&name) {
                    continue;
                }
                if reported_registered.insert(name.clone()) {
                    progress(&format!(
                        "node {name} registered ({}/{})",
                        reported_registered.len(),
                        expected.len()
                    ));
                }
                if node_ready(node) && reported_ready.insert(name.clone()) {
                    progress(&format!(
                        "node {name} Ready ({}/{})",
                        reported_ready.len(),
                        expected.len()
                    ));
                }
            }
        }
        if reported_ready.len() == expected.len() {
            break;
        }
        if Instant::now() > deadline {
            let missing: Vec<&String> = expected
                .iter()
                .filter(|n| !reported_ready.contains(*n))
                .collect();
            return Err(not_ready(format!(
                "nodes {missing:?} not Ready within {} s",
                options.timeout.as_secs()
            )));
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let kubeconfig = std::fs::read(&kubeconfig_path).map_err(|source| Error::State {
        action: "reading",
        path: kubeconfig_path.clone(),
        source,
    })?;
    crate::state::write_atomic(&options.kubeconfig_out, &kubeconfig, 0o600)?;
    Ok(UpSummary {
        record: record.clone(),
        url,
        nodes: expected,
        metrics_url: daemon
            .metrics_port
            .map(|port| format!("http://127.0.0.1:{port}")),
        kubeconfig: options.kubeconfig_out.clone(),
    })
}

/// Copies the logs of cluster `name` to `<state>/<name>.failed/` (replacing an older copy), so
/// they outlive the cleanup after a failed `up`.
fn keep_logs(state: &StateDir, name: &str) -> Option<PathBuf> {
    let from = state.cluster_dir(name);
    let to = state.root().join(format!("{name}.failed"));
    let _ = std::fs::remove_dir_all(&to);
    std::fs::create_dir_all(&to).ok()?;
    for entry in std::fs::read_dir(&from).ok()?.flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "log") {
            let _ = std::fs::copy(&path, to.join(entry.file_name()));
        }
    }
    Some(to)
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

/// Removes what a previous run of `name` left (a crash: its daemon is gone). Refuses when its
/// daemon still runs.
fn clean_previous(
    state: &StateDir,
    name: &str,
    progress: &mut dyn FnMut(&str),
) -> Result<(), Error> {
    if let Some(record) = state.read_record(name)? {
        if let Some(pid) = record.daemon_pid.filter(|pid| proc::is_daemon(*pid, name)) {
            return Err(Error::AlreadyRunning {
                name: name.to_owned(),
                pid,
            });
        }
        progress(&format!(
            "removing the leftovers of a previous run of {name} (its daemon is gone)"
        ));
        teardown(state, &record, progress)?;
    }
    let stray = net::netns_with_prefix(&topology::cluster_netns_prefix(name));
    if !stray.is_empty() {
        progress(&format!("removing leftover namespaces {stray:?}"));
        if let Some(error) = net::remove_cluster_namespaces(name).into_iter().next() {
            return Err(error);
        }
    }
    Ok(())
}

/// Stops the daemon and the agents of `record`, removes its network and its state directory.
fn teardown(
    state: &StateDir,
    record: &ClusterRecord,
    progress: &mut dyn FnMut(&str),
) -> Result<(), Error> {
    if let Some(pid) = record
        .daemon_pid
        .filter(|pid| proc::is_daemon(*pid, &record.name))
    {
        progress(&format!("stopping the daemon (PID {pid})"));
        if proc::terminate(pid, DAEMON_GRACE, || proc::is_daemon(pid, &record.name)) {
            progress("the daemon did not stop in time and was killed");
        }
    }
    let plan = record.plan();
    for node in plan.node_plans() {
        let pid_file = state.file(&record.name, &format!("node-{}.pid", node.number));
        let pid = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok());
        if let Some(pid) = pid.filter(|pid| proc::is_agent(*pid, &node.netns)) {
            progress(&format!("stopping the agent of {} (PID {pid})", node.name));
            proc::terminate(pid, AGENT_GRACE, || proc::is_agent(pid, &node.netns));
        }
    }
    let errors = net::remove_cluster(&record.underlay, &plan);
    if let Some(error) = errors.into_iter().next() {
        return Err(error);
    }
    if net::remove_underlay_if_unused(&record.underlay)? {
        progress(&format!(
            "removed the underlay namespace {} (no cluster left on it)",
            record.underlay
        ));
    }
    state.remove_cluster(&record.name)
}

/// Whether this process runs with effective UID 0.
pub fn is_root() -> bool {
    // The effective UID is the second field of `Uid:` (no unsafe libc call needed).
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let euid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1).map(str::to_owned));
    euid.as_deref() == Some("0")
}

/// Network namespaces, veths and bridges need CAP_SYS_ADMIN and CAP_NET_ADMIN.
fn require_root() -> Result<(), Error> {
    if is_root() {
        Ok(())
    } else {
        Err(Error::Invalid(
            "simulated clusters create network namespaces and bridges: run simkube cluster as \
             root (e.g. with sudo)"
                .to_owned(),
        ))
    }
}

/// Brings cluster `name` down. `Ok(false)`: there was no such cluster (stray namespaces of
/// that name are still removed).
pub fn down(state_dir: &Path, name: &str, progress: &mut dyn FnMut(&str)) -> Result<bool, Error> {
    topology::validate_name(name)?;
    require_root()?;
    let state = StateDir::new(state_dir);
    let _lock = state.lock()?;
    let Some(record) = state.read_record(name)? else {
        let stray = net::netns_with_prefix(&topology::cluster_netns_prefix(name));
        if !stray.is_empty() {
            progress(&format!("removing leftover namespaces {stray:?}"));
            if let Some(error) = net::remove_cluster_namespaces(name).into_iter().next() {
                return Err(error);
            }
        }
        state.remove_cluster(name)?;
        return Ok(false);
    };
    teardown(&state, &record, progress)?;
    Ok(true)
}

/// One line of `cluster list`.
#[derive(Debug, Clone)]
pub struct ListEntry {
    /// The record.
    pub record: ClusterRecord,
    /// The admin URL, once the daemon reported it.
    pub url: Option<String>,
    /// Whether the recorded daemon runs.
    pub alive: bool,
}

/// Every cluster of the state directory.
pub fn list(state_dir: &Path) -> Result<Vec<ListEntry>, Error> {
    let state = StateDir::new(state_dir);
    let mut entries = Vec::new();
    for record in state.records()? {
        let url = state
            .read_daemon(&record.name)?
            .map(|d| format!("https://127.0.0.1:{}", d.host_port));
        let alive = record
            .daemon_pid
            .is_some_and(|pid| proc::is_daemon(pid, &record.name));
        entries.push(ListEntry { record, url, alive });
    }
    Ok(entries)
}

/// The node number of `node` (`<cluster>-node-<I>`) in `record`.
fn node_number(record: &ClusterRecord, node: &str) -> Result<u8, Error> {
    record
        .plan()
        .node_plans()
        .into_iter()
        .find(|n| n.name == node)
        .map(|n| n.number)
        .ok_or_else(|| {
            Error::Invalid(format!(
                "cluster {} has no node {node:?} (its nodes are {}-node-1..{})",
                record.name, record.name, record.nodes
            ))
        })
}

fn running_record(state: &StateDir, name: &str) -> Result<ClusterRecord, Error> {
    topology::validate_name(name)?;
    let record = state
        .read_record(name)?
        .ok_or_else(|| Error::Unknown(name.to_owned()))?;
    if !record
        .daemon_pid
        .is_some_and(|pid| proc::is_daemon(pid, name))
    {
        return Err(Error::Invalid(format!(
            "the daemon of cluster {name} is not running; bring it down and up again"
        )));
    }
    Ok(record)
}

/// Reads the PID the daemon recorded for node `number`, when that agent runs.
fn agent_pid(state: &StateDir, record: &ClusterRecord, number: u8) -> Option<u32> {
    let netns = record.plan().node(number).netns;
    std::fs::read_to_string(state.file(&record.name, &format!("node-{number}.pid")))
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .filter(|pid| proc::is_agent(*pid, &netns))
}

/// Stops the agent of one node and keeps it stopped (the daemon does not restart it) until
/// [`start_node`]. Waits until the agent has exited.
pub fn stop_node(state_dir: &Path, name: &str, node: &str) -> Result<(), Error> {
    let state = StateDir::new(state_dir);
    let record = running_record(&state, name)?;
    let number = node_number(&record, node)?;
    crate::state::write_atomic(
        &state.file(name, &format!("node-{number}.stopped")),
        b"stopped by request\n",
        0o644,
    )?;
    let deadline = Instant::now() + AGENT_GRACE + Duration::from_secs(10);
    while agent_pid(&state, &record, number).is_some() {
        if Instant::now() > deadline {
            return Err(Error::NotReady {
                message: format!("the agent of {node} did not stop"),
                logs: state.cluster_dir(name),
            });
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// Lets the daemon start the agent of a node stopped by [`stop_node`] again; waits until it
/// runs (not until the Node is Ready again).
pub fn start_node(state_dir: &Path, name: &str, node: &str) -> Result<u32, Error> {
    let state = StateDir::new(state_dir);
    let record = running_record(&state, name)?;
    let number = node_number(&record, node)?;
    let marker = state.file(name, &format!("node-{number}.stopped"));
    match std::fs::remove_file(&marker) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(Error::State {
                action: "removing",
                path: marker,
                source,
            });
        }
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(pid) = agent_pid(&state, &record, number) {
            return Ok(pid);
        }
        if Instant::now() > deadline {
            return Err(Error::NotReady {
                message: format!("the agent of {node} did not start"),
                logs: state.cluster_dir(name),
            });
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
