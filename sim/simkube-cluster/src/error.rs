//! Errors of bringing simulated clusters up and down.

use std::path::PathBuf;

/// Why a cluster operation failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request itself is invalid (bad name, too many nodes, ...).
    #[error("{0}")]
    Invalid(String),
    /// An `ip` (iproute2) or other command failed.
    #[error("`{command}` failed: {message}")]
    Command {
        /// The command line.
        command: String,
        /// Its error output.
        message: String,
    },
    /// A file of the state directory could not be read or written.
    #[error("{action} {}: {source}", path.display())]
    State {
        /// What was being done.
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A state file is not what this version writes.
    #[error("state file {} is corrupt ({message}); remove it by hand after checking no cluster runs", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// Every cluster index is taken.
    #[error("no free cluster index (1..={max}): bring a cluster down first")]
    NoIndex {
        /// The largest index.
        max: u8,
    },
    /// A cluster of that name is running.
    #[error(
        "cluster {name:?} is already running (daemon PID {pid}); bring it down first with `simkube cluster down --name {name}`"
    )]
    AlreadyRunning {
        /// The cluster.
        name: String,
        /// Its daemon.
        pid: u32,
    },
    /// The cluster did not come up in time or its daemon died.
    #[error("{message}; see the logs in {}", logs.display())]
    NotReady {
        /// What did not happen.
        message: String,
        /// Where the daemon and node logs are.
        logs: PathBuf,
    },
    /// No cluster of that name.
    #[error("no cluster named {0:?} (see `simkube cluster list`)")]
    Unknown(String),
    /// The API server could not be started.
    #[error("API server: {0}")]
    Server(#[from] simkube::Error),
    /// A call to the API server failed.
    #[error("{action}: {source}")]
    Api {
        /// What was being done.
        action: String,
        /// The client error.
        source: kube::Error,
    },
    /// Certificates could not be made.
    #[error("certificates: {0}")]
    Tls(#[from] simkube::tls::TlsError),
    /// A system program the cluster needs is missing or broken.
    #[error(transparent)]
    Tool(#[from] tether_runtime::tools::ToolError),
    /// Other local IO failed.
    #[error("{action}: {source}")]
    Io {
        /// What was being done.
        action: String,
        /// The OS error.
        source: std::io::Error,
    },
}

impl Error {
    pub(crate) fn api(action: impl Into<String>) -> impl FnOnce(kube::Error) -> Self {
        let action = action.into();
        move |source| Self::Api { action, source }
    }

    pub(crate) fn io(action: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let action = action.into();
        move |source| Self::Io { action, source }
    }
}
