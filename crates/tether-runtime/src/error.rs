//! The error of the Kubernetes-facing plumbing: the client set-up and leader election. Each
//! variant names the source or object that failed and keeps kube's error as its source.

/// Why a Kubernetes client could not be built or the leader lease could not be used.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The in-cluster configuration was chosen (no kubeconfig given, `KUBERNETES_SERVICE_HOST`
    /// set) but could not be loaded.
    #[error(
        "cannot use the in-cluster configuration (the service account token and CA under \
         /var/run/secrets/kubernetes.io/serviceaccount, and KUBERNETES_SERVICE_HOST/PORT); \
         pass --kubeconfig to use a file instead: {source}"
    )]
    InCluster {
        /// kube's reason.
        #[source]
        source: kube::config::InClusterError,
    },
    /// A kubeconfig was chosen but could not be read or does not name a usable context.
    #[error("cannot use kubeconfig {files}{}: {source}", context_suffix(.context.as_deref()))]
    Kubeconfig {
        /// The file or files (as given, or the default path).
        files: String,
        /// The context asked for with `--context`, if any.
        context: Option<String>,
        /// kube's reason.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// The configuration loaded, but no client could be built from it (bad TLS material).
    #[error("cannot build a Kubernetes client from {from}: {source}")]
    Client {
        /// Where the configuration came from: `in-cluster` or the kubeconfig files.
        from: String,
        /// kube's reason.
        #[source]
        source: kube::Error,
    },
    /// Leader election parameters that could let two processes lead at once.
    #[error("invalid leader election parameters: {0}")]
    LeaseParams(String),
    /// A request on the leader lease failed.
    #[error("lease {namespace}/{name}: {source}")]
    Lease {
        /// The lease's namespace.
        namespace: String,
        /// The lease's name.
        name: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
}

fn context_suffix(context: Option<&str>) -> String {
    context.map_or_else(String::new, |c| format!(" (context {c:?})"))
}
