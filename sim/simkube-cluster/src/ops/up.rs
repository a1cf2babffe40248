//! `cluster up`: validation, the record, the network, the daemon, and the clean-up when
//! anything fails.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::state::{ClusterRecord, StateDir, open_log};
use crate::topology::{self, Plan};
use crate::{Error, net};

use super::down::{clean_previous, down};
use super::ready::wait_ready;
use super::require_root;

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
    /// The longest certificate the cluster's CSR signer issues, in seconds.
    pub cluster_signing_seconds: u64,
    /// Close the cluster to other clusters' TCP (see [`ClusterRecord::private_api`]).
    pub private_api: bool,
    /// Put the cluster behind a masquerading router (see [`ClusterRecord::behind_nat`]).
    pub behind_nat: bool,
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
    tether_runtime::tools::require("simkube cluster up", super::REQUIRED_TOOLS)?;
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
        cluster_signing_seconds: options.cluster_signing_seconds,
        private_api: options.private_api,
        behind_nat: options.behind_nat,
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
    if record.behind_nat {
        net::create_router(&record.underlay, &plan)?;
    }
    // The bridge, and the routes to the LoadBalancer pool, live where the cluster's network
    // ends: the underlay, or the router of a cluster behind NAT (which the underlay cannot
    // route into).
    let network = record.network_netns();
    net::create_bridge(&network, &plan)?;
    for node in plan.node_plans() {
        net::create_node(&network, &plan, &node)?;
    }
    net::route_lb_pool(&network, &plan)?;
    if record.private_api {
        net::apply_nft(&network, &topology::private_api_rules(&plan))?;
    }
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
