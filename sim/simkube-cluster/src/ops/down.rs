//! `cluster down`, and the removal of what a crashed run of a cluster left behind.

use std::path::Path;

use crate::state::{ClusterRecord, StateDir};
use crate::topology::{self};
use crate::{Error, net, proc};

use super::{AGENT_GRACE, DAEMON_GRACE, require_root};

/// Removes what a previous run of `name` left (a crash: its daemon is gone). Refuses when its
/// daemon still runs.
pub(super) fn clean_previous(
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

/// Brings cluster `name` down. `Ok(false)`: there was no such cluster (stray namespaces of
/// that name are still removed).
pub fn down(state_dir: &Path, name: &str, progress: &mut dyn FnMut(&str)) -> Result<bool, Error> {
    topology::validate_name(name)?;
    require_root()?;
    tether_runtime::tools::require("simkube cluster down", &[tether_runtime::tools::IP])?;
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
