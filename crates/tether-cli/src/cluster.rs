//! Connecting to a cluster from a kubeconfig, with a reachability probe so that an unreachable
//! API server is reported as such (exit 3) before anything else happens.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::Api;
use kube::config::{KubeConfigOptions, Kubeconfig};
use tether_api::ClusterId;
use tether_api::names::{SYSTEM_NAMESPACE, objects, public_identity};

use crate::error::{Error, Result, describe, is_not_found};

/// How long the reachability probe waits for the API server's `/version`.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// Which kubeconfig and context name a cluster.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Target {
    /// The kubeconfig file; `None` means `$KUBECONFIG`, then `~/.kube/config`.
    pub kubeconfig: Option<PathBuf>,
    /// The context; `None` means the kubeconfig's current context.
    pub context: Option<String>,
}

impl Target {
    /// A target from a kubeconfig file and an optional context.
    pub fn new(kubeconfig: Option<&Path>, context: Option<&str>) -> Self {
        Self {
            kubeconfig: kubeconfig.map(Path::to_path_buf),
            context: context.map(str::to_owned),
        }
    }

    fn describe(&self) -> String {
        match &self.kubeconfig {
            Some(p) => p.display().to_string(),
            None => "(default: $KUBECONFIG or ~/.kube/config)".to_owned(),
        }
    }
}

/// A reachable cluster: a client and where it points.
#[derive(Clone)]
pub struct Conn {
    /// The client.
    pub client: kube::Client,
    /// The API server URL from the kubeconfig.
    pub url: String,
    /// Which side this is, for messages ("local", "remote").
    pub role: String,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("url", &self.url)
            .field("role", &self.role)
            .finish_non_exhaustive()
    }
}

/// Builds a client for `target` and checks that its API server answers. `role` names the
/// cluster in messages.
pub async fn connect(target: &Target, role: &str) -> Result<Conn> {
    let what = target.describe();
    let bad = |message: String| Error::Kubeconfig {
        what: what.clone(),
        message,
    };
    let kubeconfig = match &target.kubeconfig {
        Some(path) => Kubeconfig::read_from(path).map_err(|e| bad(e.to_string()))?,
        None => Kubeconfig::read().map_err(|e| bad(e.to_string()))?,
    };
    let options = KubeConfigOptions {
        context: target.context.clone(),
        ..Default::default()
    };
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &options)
        .await
        .map_err(|e| bad(e.to_string()))?;
    config.connect_timeout = Some(Duration::from_secs(5));
    let url = config.cluster_url.to_string();
    let client = kube::Client::try_from(config).map_err(|e| bad(e.to_string()))?;
    let unreachable = |message: String| Error::Unreachable {
        role: role.to_owned(),
        url: url.clone(),
        message,
    };
    match tokio::time::timeout(PROBE_TIMEOUT, client.apiserver_version()).await {
        Err(_) => return Err(unreachable(format!("no answer within {PROBE_TIMEOUT:?}"))),
        Ok(Err(e)) => return Err(unreachable(describe(&e))),
        Ok(Ok(_)) => {}
    }
    Ok(Conn {
        client,
        url: url.trim_end_matches('/').to_owned(),
        role: role.to_owned(),
    })
}

/// The cluster ID stored by `tether install`, if Tether is installed.
pub async fn stored_cluster_id(client: &kube::Client) -> Result<Option<ClusterId>> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), SYSTEM_NAMESPACE);
    let cm = match api.get_opt(objects::CLUSTER_ID_CONFIGMAP).await {
        Ok(cm) => cm,
        Err(e) => {
            return Err(Error::api(format!(
                "reading ConfigMap {SYSTEM_NAMESPACE}/{}",
                objects::CLUSTER_ID_CONFIGMAP
            ))(e));
        }
    };
    let Some(value) = cm.and_then(|cm| cm.data?.remove(objects::CLUSTER_ID_KEY)) else {
        return Ok(None);
    };
    ClusterId::new(value).map(Some).map_err(|e| {
        Error::Check(format!(
            "ConfigMap {SYSTEM_NAMESPACE}/{} holds {e}; reinstall Tether",
            objects::CLUSTER_ID_CONFIGMAP
        ))
    })
}

/// The cluster ID of an installed cluster, or a check failure telling to install Tether.
pub async fn installed_cluster_id(conn: &Conn) -> Result<ClusterId> {
    stored_cluster_id(&conn.client).await?.ok_or_else(|| {
        Error::Check(format!(
            "Tether is not installed in the {} cluster ({}): there is no ConfigMap {SYSTEM_NAMESPACE}/{}; run `tether install` there first",
            conn.role,
            conn.url,
            objects::CLUSTER_ID_CONFIGMAP
        ))
    })
}

/// What the controller publishes in `tether-public-identity`.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PublicIdentity {
    /// The cluster ID.
    #[serde(rename = "clusterID")]
    pub cluster_id: Option<String>,
    /// `sha256:<hex>` of the authentication service's certificate.
    pub auth_fingerprint: Option<String>,
    /// The authentication service's URL.
    #[serde(rename = "authURL")]
    pub auth_url: Option<String>,
    /// The API server URL peers use.
    #[serde(rename = "apiServerURL")]
    pub api_server_url: Option<String>,
}

impl PublicIdentity {
    /// Whether the controller has published what peers need.
    pub fn is_complete(&self) -> bool {
        self.auth_fingerprint
            .as_deref()
            .is_some_and(|s| !s.is_empty())
            && self.auth_url.as_deref().is_some_and(|s| !s.is_empty())
    }
}

/// Reads `tether-public-identity`; `None` when the controller has not written it yet.
pub async fn public_identity(client: &kube::Client) -> Result<Option<PublicIdentity>> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), SYSTEM_NAMESPACE);
    let cm = api
        .get_opt(objects::PUBLIC_IDENTITY_CONFIGMAP)
        .await
        .map_err(Error::api(format!(
            "reading ConfigMap {SYSTEM_NAMESPACE}/{}",
            objects::PUBLIC_IDENTITY_CONFIGMAP
        )))?;
    Ok(cm.map(|cm| {
        let data = cm.data.unwrap_or_default();
        let get = |k: &str| data.get(k).filter(|v| !v.is_empty()).cloned();
        PublicIdentity {
            cluster_id: get(public_identity::CLUSTER_ID),
            auth_fingerprint: get(public_identity::AUTH_FINGERPRINT),
            auth_url: get(public_identity::AUTH_URL),
            api_server_url: get(public_identity::API_SERVER_URL),
        }
    }))
}

/// The UID of `kube-system`: what tells two clusters apart when their Tether IDs are equal.
pub async fn kube_system_uid(client: &kube::Client) -> Result<Option<String>> {
    let api: Api<Namespace> = Api::all(client.clone());
    match api.get("kube-system").await {
        Ok(ns) => Ok(ns.metadata.uid),
        Err(e) if is_not_found(&e) => Ok(None),
        Err(e) => Err(Error::api("reading Namespace kube-system")(e)),
    }
}

/// How long undoing a failed run waits for what it deleted to be gone: the controller's
/// finalizers first undo what the object reached.
pub const UNDO_PATIENCE: Duration = Duration::from_secs(30);

/// Waits up to `patience` for object `name` to be gone (finalizers done), so that a run which
/// reports it removed has left nothing behind. Returns whether it is gone.
pub async fn gone_within<K>(api: &Api<K>, name: &str, patience: Duration) -> bool
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let gone_by = tokio::time::Instant::now() + patience;
    while tokio::time::Instant::now() < gone_by {
        if matches!(api.get_opt(name).await, Ok(None)) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    false
}
