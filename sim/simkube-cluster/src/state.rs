//! The state directory (default `/run/simkube`): one sub-directory per cluster with its record,
//! the daemon's address, kubeconfigs, node PIDs and logs, plus a lock file that serializes
//! index allocation and up/down of clusters sharing the directory.
//!
//! ```text
//! <state>/lock                    flock(2) held while clusters are created or removed
//! <state>/<name>/cluster.json     what `cluster up` decided (ClusterRecord)
//! <state>/<name>/daemon.json      written by the daemon once the API serves (DaemonRecord)
//! <state>/<name>/admin.kubeconfig the daemon's admin kubeconfig (server on 127.0.0.1)
//! <state>/<name>/node-I.kubeconfig, node-I.pid, node-I.stopped, node-I.log, node-I/
//! <state>/<name>/node-I.status.json the agent's report: its service proxy's health, or why it
//!                                   could not run (written by the agent)
//! <state>/<name>/daemon.log
//! ```

use std::collections::BTreeSet;
use std::fs::File;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::Error;
use crate::topology::Plan;

/// The default state directory.
pub const DEFAULT_STATE_DIR: &str = "/run/simkube";
/// The default underlay namespace.
pub const DEFAULT_UNDERLAY: &str = "sk-underlay";

/// What `cluster up` decided for a cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterRecord {
    /// Cluster name.
    pub name: String,
    /// Cluster index X.
    pub index: u8,
    /// Node count.
    pub nodes: u8,
    /// Underlay namespace name.
    pub underlay: String,
    /// The cluster pod CIDR.
    pub pod_cidr: ipnet::Ipv4Net,
    /// The Service CIDR.
    pub service_cidr: ipnet::Ipv4Net,
    /// Image-table entries for every node (`reference`, program).
    pub images: Vec<(String, PathBuf)>,
    /// The daemon's PID once started.
    pub daemon_pid: Option<u32>,
    /// How long a node's Lease may go unrenewed before it turns NotReady (seconds).
    #[serde(default = "default_grace")]
    pub node_grace_seconds: u64,
    /// The longest client certificate the CSR signer issues (seconds; kube-controller-manager's
    /// `--cluster-signing-duration`).
    #[serde(default = "default_signing")]
    pub cluster_signing_seconds: u64,
    /// Other clusters can open no TCP connection to the API server or the cluster's Services
    /// (`--private-api`); UDP stays open.
    #[serde(default)]
    pub private_api: bool,
    /// The nodes reach the underlay only through a masquerading router namespace
    /// (`--behind-nat`): nothing outside the cluster opens a connection in.
    #[serde(default)]
    pub behind_nat: bool,
    /// When the cluster was created (RFC 3339).
    pub created: String,
}

impl ClusterRecord {
    /// The namespace holding the cluster's bridge, API server address and DNS: the underlay,
    /// or the router namespace of a `--behind-nat` cluster.
    pub fn network_netns(&self) -> String {
        if self.behind_nat {
            crate::topology::router_netns(&self.name)
        } else {
            self.underlay.clone()
        }
    }

    /// The topology `cluster list` shows.
    pub fn topology(&self) -> &'static str {
        match (self.behind_nat, self.private_api) {
            (true, true) => "nat+private",
            (true, false) => "behind-nat",
            (false, true) => "private-api",
            (false, false) => "open",
        }
    }

    /// The addressing plan.
    pub fn plan(&self) -> Plan {
        let mut plan = Plan::new(&self.name, self.index, self.nodes);
        plan.pod_cidr = self.pod_cidr;
        plan
    }
}

fn default_grace() -> u64 {
    DEFAULT_NODE_GRACE_SECONDS
}

/// The node monitor grace period of kube-controller-manager, and the kubelet's Lease duration.
pub const DEFAULT_NODE_GRACE_SECONDS: u64 = 40;

/// kube-controller-manager's default `--cluster-signing-duration` (8760h), in seconds.
pub const DEFAULT_CLUSTER_SIGNING_SECONDS: u64 = 365 * 24 * 3600;

fn default_signing() -> u64 {
    DEFAULT_CLUSTER_SIGNING_SECONDS
}

/// What the daemon reports once the API server serves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DaemonRecord {
    /// The daemon's PID.
    pub pid: u32,
    /// Port of the admin listener on 127.0.0.1 in the host namespace.
    pub host_port: u16,
    /// Port of the daemon's `/metrics` and `/healthz` on 127.0.0.1 in the host namespace.
    #[serde(default)]
    pub metrics_port: Option<u16>,
}

/// A state directory.
#[derive(Debug, Clone)]
pub struct StateDir {
    root: PathBuf,
}

/// The exclusive lock of a state directory, released on drop.
#[derive(Debug)]
pub struct StateLock {
    _lock: nix::fcntl::Flock<File>,
}

impl StateDir {
    /// The state directory at `root` (created on first use).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// Its path.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Takes the directory's lock, waiting for other `simkube` commands to finish with it.
    pub fn lock(&self) -> Result<StateLock, Error> {
        std::fs::create_dir_all(&self.root).map_err(|source| Error::State {
            action: "creating",
            path: self.root.clone(),
            source,
        })?;
        let path = self.root.join("lock");
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|source| Error::State {
                action: "opening",
                path: path.clone(),
                source,
            })?;
        let lock = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive).map_err(
            |(_, errno)| Error::State {
                action: "locking",
                path,
                source: errno.into(),
            },
        )?;
        Ok(StateLock { _lock: lock })
    }

    /// The directory of cluster `name`.
    pub fn cluster_dir(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    /// Path of a file of cluster `name`.
    pub fn file(&self, name: &str, file: &str) -> PathBuf {
        self.cluster_dir(name).join(file)
    }

    /// The record of cluster `name`, if there is one.
    pub fn read_record(&self, name: &str) -> Result<Option<ClusterRecord>, Error> {
        read_json(&self.file(name, "cluster.json"))
    }

    /// Writes the record of its cluster (atomically).
    pub fn write_record(&self, record: &ClusterRecord) -> Result<(), Error> {
        write_json(&self.file(&record.name, "cluster.json"), record)
    }

    /// The daemon's record of cluster `name`, if written.
    pub fn read_daemon(&self, name: &str) -> Result<Option<DaemonRecord>, Error> {
        read_json(&self.file(name, "daemon.json"))
    }

    /// Writes the daemon's record (atomically).
    pub fn write_daemon(&self, name: &str, record: &DaemonRecord) -> Result<(), Error> {
        write_json(&self.file(name, "daemon.json"), record)
    }

    /// Every cluster record, by name. Unreadable ones are reported, not skipped silently.
    pub fn records(&self) -> Result<Vec<ClusterRecord>, Error> {
        let entries = match std::fs::read_dir(&self.root) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => {
                return Err(Error::State {
                    action: "listing",
                    path: self.root.clone(),
                    source,
                });
            }
        };
        let mut records = Vec::new();
        for entry in entries.flatten() {
            if !entry.path().is_dir() {
                continue;
            }
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(record) = self.read_record(&name)? {
                records.push(record);
            }
        }
        records.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(records)
    }

    /// Indices taken by clusters of this directory (other than `except`).
    pub fn used_indices(&self, except: &str) -> Result<BTreeSet<u8>, Error> {
        Ok(self
            .records()?
            .into_iter()
            .filter(|r| r.name != except)
            .map(|r| r.index)
            .collect())
    }

    /// Removes the directory of cluster `name`.
    pub fn remove_cluster(&self, name: &str) -> Result<(), Error> {
        let dir = self.cluster_dir(name);
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(Error::State {
                action: "removing",
                path: dir,
                source,
            }),
        }
    }
}

/// Reads a JSON file; `None` when it does not exist.
pub fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<Option<T>, Error> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(Error::State {
                action: "reading",
                path: path.to_owned(),
                source,
            });
        }
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| Error::Corrupt {
            path: path.to_owned(),
            message: e.to_string(),
        })
}

/// Writes a JSON file through a temporary file and a rename, so readers never see half of it.
pub fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<(), Error> {
    let text = serde_json::to_string_pretty(value).expect("invariant: records serialize");
    write_atomic(path, text.as_bytes(), 0o644)
}

/// Opens the log file at `path` for appending, twice: one handle for a child's stdout, one for
/// its stderr, so both streams land in the same file in the order they are written.
pub fn open_log(path: &Path) -> Result<(File, File), Error> {
    let log = File::options()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|source| Error::State {
            action: "opening",
            path: path.to_owned(),
            source,
        })?;
    let log_err = log.try_clone().map_err(Error::io(format!(
        "duplicating log file {}",
        path.display()
    )))?;
    Ok((log, log_err))
}

/// Writes `bytes` to `path` atomically with permissions `mode`.
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> Result<(), Error> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let err = |action| {
        move |source| Error::State {
            action,
            path: path.to_owned(),
            source,
        }
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(err("creating the directory of"))?;
    }
    let tmp = path.with_extension("tmp");
    let mut file = File::options()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(mode)
        .open(&tmp)
        .map_err(err("writing"))?;
    file.write_all(bytes).map_err(err("writing"))?;
    file.sync_all().map_err(err("writing"))?;
    std::fs::rename(&tmp, path).map_err(err("renaming into"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(name: &str, index: u8) -> ClusterRecord {
        ClusterRecord {
            name: name.into(),
            index,
            nodes: 2,
            underlay: DEFAULT_UNDERLAY.into(),
            pod_cidr: "10.244.0.0/16".parse().expect("cidr"),
            service_cidr: "10.96.0.0/12".parse().expect("cidr"),
            images: vec![("ghcr.io/x/y".into(), "/bin/y".into())],
            daemon_pid: Some(42),
            node_grace_seconds: 40,
            cluster_signing_seconds: DEFAULT_CLUSTER_SIGNING_SECONDS,
            private_api: false,
            behind_nat: false,
            created: "2026-01-01T00:00:00Z".into(),
        }
    }

    #[test]
    fn records_round_trip_and_indices_are_collected() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state = StateDir::new(dir.path().join("state"));
        let _lock = state.lock().expect("lock");
        assert!(state.records().expect("empty").is_empty());
        state.write_record(&record("b", 2)).expect("write");
        state.write_record(&record("a", 1)).expect("write");
        let records = state.records().expect("records");
        assert_eq!(records, vec![record("a", 1), record("b", 2)]);
        assert_eq!(state.used_indices("a").expect("used"), [2].into());
        state.remove_cluster("a").expect("remove");
        state.remove_cluster("a").expect("removing twice is fine");
        assert_eq!(state.used_indices("").expect("used"), [2].into());
    }

    #[test]
    fn a_corrupt_record_is_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state = StateDir::new(dir.path());
        std::fs::create_dir_all(state.cluster_dir("x")).expect("mkdir");
        std::fs::write(state.file("x", "cluster.json"), "{").expect("write");
        let error = state.records().expect_err("corrupt");
        assert!(
            error.to_string().contains("cluster.json is corrupt"),
            "{error}"
        );
    }
}
