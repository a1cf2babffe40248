//! Which Kubernetes API a daemon talks to: `--kubeconfig` and `--context`, or the in-cluster
//! service account when the process runs in a pod and was given no kubeconfig.

use std::path::PathBuf;

use clap::Args;
use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::RuntimeError;

/// The environment variable whose presence means "running in a pod".
pub const IN_CLUSTER_ENV: &str = "KUBERNETES_SERVICE_HOST";

/// Kubernetes connection flags shared by daemons (`#[command(flatten)]`).
#[derive(Clone, Debug, Default, Args)]
pub struct KubeArgs {
    /// Kubeconfig file (a `:`-separated list is merged, as kubectl does). Without it, a
    /// process in a pod uses its service account, and any other uses ~/.kube/config.
    #[arg(long, env = "KUBECONFIG", value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context to use instead of the current one.
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,
}

/// Where the client configuration comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConfigSource {
    /// The pod's service account and the `KUBERNETES_SERVICE_*` variables.
    InCluster,
    /// These kubeconfig files, merged in order.
    Kubeconfig(Vec<PathBuf>),
    /// `~/.kube/config`.
    DefaultKubeconfig,
}

impl KubeArgs {
    /// The source these flags select, given whether the in-cluster environment is present. A
    /// `--context` means a kubeconfig even in a pod: the service account has no contexts.
    pub fn source(&self, in_cluster_env: bool) -> ConfigSource {
        if let Some(path) = &self.kubeconfig {
            let files: Vec<PathBuf> = std::env::split_paths(path.as_os_str())
                .filter(|p| !p.as_os_str().is_empty())
                .collect();
            if !files.is_empty() {
                return ConfigSource::Kubeconfig(files);
            }
        }
        if in_cluster_env && self.context.is_none() {
            ConfigSource::InCluster
        } else {
            ConfigSource::DefaultKubeconfig
        }
    }
}

/// A client for the API server the flags select (see [`KubeArgs::source`]). The error names
/// the source that failed and why.
pub async fn kube_client(args: &KubeArgs) -> Result<kube::Client, RuntimeError> {
    let in_cluster = std::env::var_os(IN_CLUSTER_ENV).is_some_and(|v| !v.is_empty());
    client_from(&args.source(in_cluster), args.context.as_deref()).await
}

/// A client from an explicit source; `context` applies to kubeconfig sources.
pub async fn client_from(
    source: &ConfigSource,
    context: Option<&str>,
) -> Result<kube::Client, RuntimeError> {
    let (config, from) = match source {
        ConfigSource::InCluster => {
            let config =
                kube::Config::incluster().map_err(|source| RuntimeError::InCluster { source })?;
            (config, "in-cluster".to_owned())
        }
        ConfigSource::Kubeconfig(files) => {
            let names = files
                .iter()
                .map(|f| f.display().to_string())
                .collect::<Vec<_>>()
                .join(":");
            let fail = |source| RuntimeError::Kubeconfig {
                files: names.clone(),
                context: context.map(str::to_owned),
                source,
            };
            let mut merged = Kubeconfig::default();
            for file in files {
                merged = merged
                    .merge(Kubeconfig::read_from(file).map_err(fail)?)
                    .map_err(fail)?;
            }
            let config = kube::Config::from_custom_kubeconfig(merged, &options(context))
                .await
                .map_err(fail)?;
            (config, names)
        }
        ConfigSource::DefaultKubeconfig => {
            let fail = |source| RuntimeError::Kubeconfig {
                files: "~/.kube/config".to_owned(),
                context: context.map(str::to_owned),
                source,
            };
            let kubeconfig = Kubeconfig::read_from(default_path()).map_err(fail)?;
            let config = kube::Config::from_custom_kubeconfig(kubeconfig, &options(context))
                .await
                .map_err(fail)?;
            (config, "~/.kube/config".to_owned())
        }
    };
    crate::transport::client(&config, crate::transport::Protocols::Negotiated)
        .map_err(|source| RuntimeError::Client { from, source })
}

fn options(context: Option<&str>) -> KubeConfigOptions {
    KubeConfigOptions {
        context: context.map(str::to_owned),
        ..KubeConfigOptions::default()
    }
}

fn default_path() -> PathBuf {
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default()
        .join(".kube")
        .join("config")
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        kube: KubeArgs,
    }

    fn args(argv: &[&str]) -> KubeArgs {
        Cli::try_parse_from(std::iter::once("daemon").chain(argv.iter().copied()))
            .expect("flags parse")
            .kube
    }

    #[test]
    fn a_kubeconfig_wins_over_the_in_cluster_environment() {
        let a = args(&["--kubeconfig", "/etc/k/one:/etc/k/two", "--context", "c1"]);
        assert_eq!(
            a.source(true),
            ConfigSource::Kubeconfig(vec!["/etc/k/one".into(), "/etc/k/two".into()])
        );
        assert_eq!(a.context.as_deref(), Some("c1"));
    }

    #[test]
    fn without_a_kubeconfig_a_pod_uses_its_service_account() {
        let a = KubeArgs::default();
        assert_eq!(a.source(true), ConfigSource::InCluster);
        assert_eq!(a.source(false), ConfigSource::DefaultKubeconfig);
        let with_context = KubeArgs {
            context: Some("c1".into()),
            ..KubeArgs::default()
        };
        assert_eq!(
            with_context.source(true),
            ConfigSource::DefaultKubeconfig,
            "a context only exists in a kubeconfig"
        );
    }

    #[tokio::test]
    async fn a_missing_kubeconfig_is_named_with_kubes_reason() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("nope.yaml");
        let source = ConfigSource::Kubeconfig(vec![path.clone()]);
        let err = client_from(&source, Some("c1"))
            .await
            .err()
            .expect("no file");
        let text = err.to_string();
        assert!(text.contains(&path.display().to_string()), "{text}");
        assert!(text.contains("(context \"c1\")"), "{text}");
        assert!(matches!(err, RuntimeError::Kubeconfig { .. }), "{err:?}");
        assert!(
            std::error::Error::source(&err).is_some(),
            "kube's error is kept"
        );
    }

    #[tokio::test]
    async fn in_cluster_failures_say_so() {
        // Outside a pod the service account files do not exist.
        let err = client_from(&ConfigSource::InCluster, None)
            .await
            .err()
            .expect("not in a pod");
        assert!(matches!(err, RuntimeError::InCluster { .. }), "{err:?}");
        assert!(err.to_string().contains("in-cluster"), "{err}");
    }
}
