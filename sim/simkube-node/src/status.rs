//! The agent's report to whoever supervises it (`--status-file`): its PID, its service proxy's
//! health, and why it stopped when it could not run. The cluster daemon starts agents with it
//! and `simkube cluster up` reads it, so a node that cannot serve Services fails `up` with the
//! reason instead of leaving it in a log file.

use std::io::Write as _;
use std::path::Path;

use crate::proxy::ProxyHealth;

/// What the status file holds (JSON).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentStatus {
    /// The agent's PID.
    pub pid: u32,
    /// The service proxy's health; `None` when the agent runs no proxy.
    #[serde(default)]
    pub proxy: Option<ProxyHealth>,
    /// Why the agent stopped on its own (it could not start, or failed for good).
    #[serde(default)]
    pub fatal: Option<String>,
}

impl AgentStatus {
    /// The status of this process.
    pub fn own() -> Self {
        Self {
            pid: std::process::id(),
            ..Self::default()
        }
    }
}

/// Writes `status` to `path` through a temporary file and a rename, so a reader never sees
/// half of it.
pub fn write(path: &Path, status: &AgentStatus) -> std::io::Result<()> {
    let text = serde_json::to_vec_pretty(status).map_err(std::io::Error::other)?;
    let tmp = path.with_extension("tmp");
    let mut file = std::fs::File::create(&tmp)?;
    file.write_all(&text)?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// Reads the status at `path`; `None` when there is none yet.
pub fn read(path: &Path) -> std::io::Result<Option<AgentStatus>> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(std::io::Error::other),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_round_trips_in_its_json_shape() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("status.json");
        assert_eq!(read(&path).expect("no file yet"), None);
        let status = AgentStatus {
            pid: 7,
            proxy: Some(ProxyHealth::Failing {
                failures: 3,
                error: "nft: no".into(),
            }),
            fatal: None,
        };
        write(&path, &status).expect("write");
        assert_eq!(read(&path).expect("read"), Some(status));
        let text = std::fs::read_to_string(&path).expect("text");
        expect_test::expect![[r#"
            {
              "pid": 7,
              "proxy": {
                "state": "failing",
                "failures": 3,
                "error": "nft: no"
              },
              "fatal": null
            }"#]]
        .assert_eq(&text);
    }
}
