//! The CLI's errors and the exit code each maps to (0 ok, 1 other, 2 usage, 3 unreachable,
//! 4 a check failed).

use std::process::ExitCode;

/// Exit code of a usage error: bad flags, arguments or input.
pub const EXIT_USAGE: u8 = 2;
/// Exit code when a cluster's API server cannot be reached with the given kubeconfig.
pub const EXIT_UNREACHABLE: u8 = 3;
/// Exit code when a check failed: a timeout, a condition reporting failure, a refusal.
pub const EXIT_CHECK_FAILED: u8 = 4;

/// Everything that can stop a command. Each message names what was wrong and what to do.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bad flags, arguments or input (exit 2).
    #[error("{0}")]
    Usage(String),

    /// A kubeconfig could not be read or used (exit 2).
    #[error(
        "kubeconfig {what}: {message}; pass --kubeconfig FILE (and --context NAME) or set KUBECONFIG"
    )]
    Kubeconfig {
        /// Which kubeconfig (the file, or "default").
        what: String,
        /// Why it cannot be used.
        message: String,
    },

    /// A cluster's API server did not answer (exit 3).
    #[error(
        "cannot reach the {role} cluster's API server at {url}: {message}; check that the \
         cluster is running and that the kubeconfig and context are right"
    )]
    Unreachable {
        /// Which cluster ("local", "remote", ...).
        role: String,
        /// The API server URL from the kubeconfig.
        url: String,
        /// What went wrong.
        message: String,
    },

    /// A check failed: a timeout, a failing condition, a refusal (exit 4).
    #[error("{0}")]
    Check(String),

    /// An API request failed (exit 1).
    #[error("{action}: {}", describe(source))]
    Api {
        /// What the CLI was doing.
        action: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },

    /// Output could not be written or encoded (exit 1).
    #[error("{0}")]
    Output(String),
}

impl Error {
    /// The process exit code for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Usage(_) | Self::Kubeconfig { .. } => EXIT_USAGE,
            Self::Unreachable { .. } => EXIT_UNREACHABLE,
            Self::Check(_) => EXIT_CHECK_FAILED,
            Self::Api { .. } | Self::Output(_) => 1,
        }
    }

    /// The error as an [`ExitCode`].
    pub fn to_exit_code(&self) -> ExitCode {
        ExitCode::from(self.exit_code())
    }

    /// Wraps a client error with what the CLI was doing.
    pub fn api(action: impl Into<String>) -> impl FnOnce(kube::Error) -> Self {
        let action = action.into();
        move |source| Self::Api { action, source }
    }
}

/// A client error as a sentence: the API server's own message for API errors.
pub fn describe(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) if !s.message.is_empty() => format!("{} ({})", s.message, s.code),
        kube::Error::Api(s) => format!("the API server answered {} {}", s.code, s.reason),
        other => other.to_string(),
    }
}

/// Whether a client error is a 404 from the API server.
pub fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

/// Whether a client error is a 409 from the API server.
pub fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

/// The result type of the CLI.
pub type Result<T, E = Error> = std::result::Result<T, E>;
