//! `cluster list`: the clusters of a state directory and whether their daemons run.

use std::path::Path;

use crate::state::{ClusterRecord, StateDir};
use crate::{Error, proc};

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
