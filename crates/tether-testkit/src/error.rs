//! The testkit's error type: every variant names the namespace, command or object involved.

use std::io;
use std::process::ExitStatus;

/// Everything that can go wrong while building namespaces and topologies.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A system call or file operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done, naming the object (namespace, file, interface).
        what: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// A helper command ran but exited unsuccessfully.
    #[error("`{command}` failed ({status}): {stderr}")]
    Command {
        /// The command line, for copy-pasting into a shell.
        command: String,
        /// How it exited.
        status: ExitStatus,
        /// What it printed on stderr (trimmed).
        stderr: String,
    },
    /// The requested topology or namespace is invalid; the message says what to change.
    #[error("invalid test setup: {0}")]
    Invalid(String),
}

impl Error {
    pub(crate) fn io(what: impl Into<String>, source: io::Error) -> Self {
        Self::Io {
            what: what.into(),
            source,
        }
    }
}

/// Result alias for the testkit.
pub type Result<T, E = Error> = std::result::Result<T, E>;
