//! `cluster stop-node` and `cluster start-node`: one node agent stopped and started again
//! through the daemon's markers.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::state::{ClusterRecord, StateDir};
use crate::topology::{self};
use crate::{Error, proc};

use super::AGENT_GRACE;

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
