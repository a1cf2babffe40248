//! Errors of the node agent.

/// Why the agent could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An API call failed.
    #[error("{action}: {source}")]
    Api {
        /// What the agent was doing.
        action: String,
        /// The client error.
        source: kube::Error,
    },
    /// The configuration is invalid.
    #[error("invalid node configuration: {0}")]
    Config(String),
    /// A sandbox could not be created or removed.
    #[error(transparent)]
    Sandbox(#[from] crate::sandbox::SandboxError),
    /// A system program the agent runs is missing or broken.
    #[error(transparent)]
    Tool(#[from] tether_runtime::tools::ToolError),
    /// Local IO failed.
    #[error("{action}: {source}")]
    Io {
        /// What the agent was doing.
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
}
