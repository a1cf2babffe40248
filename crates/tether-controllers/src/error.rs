//! The crate's error type: each variant names the object or operation that failed.

/// Why a control-plane operation failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Kubernetes API call failed.
    #[error("{context}: {source}")]
    Kube {
        /// What was being done.
        context: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// A cryptographic operation failed.
    #[error("{0} failed")]
    Crypto(&'static str),
    /// Stored or received data is not what it must be.
    #[error("{0}")]
    Invalid(String),
    /// A certificate or key could not be built or read.
    #[error("{context}: {source}")]
    Certificate {
        /// What was being done.
        context: String,
        /// The certificate library's error.
        #[source]
        source: rcgen::Error,
    },
    /// Listening or serving failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A request to a peer's authentication service failed.
    #[error(transparent)]
    Peer(#[from] crate::auth::client::ClientError),
    /// Waiting for something took too long.
    #[error("timed out {0}")]
    Timeout(String),
}

impl Error {
    /// A `map_err` adapter for kube-runtime's `finalizer()` helper on a `kind`: the
    /// reconciler's own error as it is, a failed finalizer update as a kube error.
    pub fn finalizer(
        kind: &'static str,
    ) -> impl FnOnce(kube::runtime::finalizer::Error<Error>) -> Error {
        move |e| match e {
            kube::runtime::finalizer::Error::ApplyFailed(e)
            | kube::runtime::finalizer::Error::CleanupFailed(e) => e,
            kube::runtime::finalizer::Error::AddFinalizer(e)
            | kube::runtime::finalizer::Error::RemoveFinalizer(e) => {
                Error::kube(format!("updating the {kind}'s finalizers"))(e)
            }
            other => Error::Invalid(format!("{kind} finalizer: {other}")),
        }
    }

    /// A `map_err` adapter for kube calls: `api.get(n).await.map_err(Error::kube("reading x"))`.
    pub fn kube(context: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
        let context = context.into();
        move |source| Error::Kube { context, source }
    }

    /// A `map_err` adapter for certificate work.
    pub fn cert(context: impl Into<String>) -> impl FnOnce(rcgen::Error) -> Error {
        let context = context.into();
        move |source| Error::Certificate { context, source }
    }

    /// A `map_err` adapter for IO.
    pub fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
        let context = context.into();
        move |source| Error::Io { context, source }
    }

    /// The HTTP status of a Kubernetes API error, if this is one.
    pub fn api_status(&self) -> Option<u16> {
        match self {
            Error::Kube {
                source: kube::Error::Api(s),
                ..
            } => Some(s.code),
            _ => None,
        }
    }

    /// A bounded label for metrics.
    pub fn metric_reason(&self) -> &'static str {
        match self {
            Error::Kube { .. } => "kube",
            Error::Crypto(_) => "crypto",
            Error::Invalid(_) => "invalid",
            Error::Certificate { .. } => "certificate",
            Error::Io { .. } => "io",
            Error::Peer(_) => "peer",
            Error::Timeout(_) => "timeout",
        }
    }
}
