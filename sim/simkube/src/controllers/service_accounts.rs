//! Keeps the per-namespace objects kube-controller-manager maintains: the `default`
//! ServiceAccount (serviceaccount controller) and, when the cluster has a CA, the
//! `kube-root-ca.crt` ConfigMap (root-ca-cert-publisher).
//!
//! Both are re-created when deleted and the ConfigMap is reset when its data drifts, as the real
//! controllers do. Terminating namespaces are left alone (creates there are refused anyway).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, ServiceAccount};
use kube::api::{Api, ObjectMeta, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use tokio_util::sync::CancellationToken;

use super::is_status;

/// Name of the ServiceAccount every namespace gets.
pub const DEFAULT_SERVICE_ACCOUNT: &str = "default";
/// Name of the ConfigMap that carries the cluster CA.
pub const ROOT_CA_CONFIGMAP: &str = "kube-root-ca.crt";
/// The annotation the real publisher puts on the ConfigMap.
const ROOT_CA_DESCRIPTION: &str = "Contains a CA bundle that can be used to verify the \
     kube-apiserver when using internal endpoints such as the internal service IP or \
     kubernetes.default.svc. No other usage is guaranteed across distributions of Kubernetes \
     clusters.";

/// Errors of one reconcile pass.
#[derive(Debug, thiserror::Error)]
pub enum ServiceAccountError {
    /// The API server refused or failed a request.
    #[error("service account controller: {0}")]
    Kube(#[from] kube::Error),
}

struct Context {
    client: Client,
    ca_pem: Option<String>,
}

/// The `kube-root-ca.crt` ConfigMap for a namespace.
pub fn root_ca_configmap(namespace: &str, ca_pem: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(ROOT_CA_CONFIGMAP.to_owned()),
            namespace: Some(namespace.to_owned()),
            annotations: Some(BTreeMap::from([(
                "kubernetes.io/description".to_owned(),
                ROOT_CA_DESCRIPTION.to_owned(),
            )])),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([("ca.crt".to_owned(), ca_pem.to_owned())])),
        ..ConfigMap::default()
    }
}

/// Runs the controller until `shutdown`. `ca_pem` is the cluster CA certificate, if any.
pub async fn run(client: Client, ca_pem: Option<String>, shutdown: CancellationToken) {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let to_namespace =
        |namespace: Option<String>| namespace.map(|ns| ObjectRef::<Namespace>::new(&ns));
    let mut controller = Controller::new(namespaces, watcher::Config::default()).watches(
        Api::<ServiceAccount>::all(client.clone()),
        watcher::Config::default(),
        move |sa| {
            (sa.metadata.name.as_deref() == Some(DEFAULT_SERVICE_ACCOUNT))
                .then(|| to_namespace(sa.metadata.namespace))
                .flatten()
        },
    );
    if ca_pem.is_some() {
        controller = controller.watches(
            Api::<ConfigMap>::all(client.clone()),
            watcher::Config::default(),
            move |cm| {
                (cm.metadata.name.as_deref() == Some(ROOT_CA_CONFIGMAP))
                    .then(|| to_namespace(cm.metadata.namespace))
                    .flatten()
            },
        );
    }
    let context = Arc::new(Context { client, ca_pem });
    controller
        .graceful_shutdown_on(shutdown.cancelled_owned())
        .run(reconcile, error_policy, context)
        .for_each(|_| async {})
        .await;
}

fn error_policy(_ns: Arc<Namespace>, error: &ServiceAccountError, _ctx: Arc<Context>) -> Action {
    tracing::warn!(%error, "service account controller pass failed; retrying");
    Action::requeue(Duration::from_secs(1))
}

async fn reconcile(ns: Arc<Namespace>, ctx: Arc<Context>) -> Result<Action, ServiceAccountError> {
    if ns.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let namespace = ns.name_any();
    let accounts: Api<ServiceAccount> = Api::namespaced(ctx.client.clone(), &namespace);
    if accounts.get_opt(DEFAULT_SERVICE_ACCOUNT).await?.is_none() {
        let sa = ServiceAccount {
            metadata: ObjectMeta {
                name: Some(DEFAULT_SERVICE_ACCOUNT.to_owned()),
                namespace: Some(namespace.clone()),
                ..ObjectMeta::default()
            },
            ..ServiceAccount::default()
        };
        tolerate_races(accounts.create(&PostParams::default(), &sa).await)?;
    }
    if let Some(ca_pem) = &ctx.ca_pem {
        let maps: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &namespace);
        let wanted = root_ca_configmap(&namespace, ca_pem);
        match maps.get_opt(ROOT_CA_CONFIGMAP).await? {
            None => tolerate_races(maps.create(&PostParams::default(), &wanted).await)?,
            Some(existing) if existing.data != wanted.data => {
                let mut fixed = existing;
                fixed.data = wanted.data;
                tolerate_races(
                    maps.replace(ROOT_CA_CONFIGMAP, &PostParams::default(), &fixed)
                        .await,
                )?;
            }
            Some(_) => {}
        }
    }
    Ok(Action::await_change())
}

/// AlreadyExists, Conflict and Forbidden (namespace started terminating) are ordinary races; the
/// watch brings the namespace back if anything is still missing.
fn tolerate_races<T>(result: Result<T, kube::Error>) -> Result<(), kube::Error> {
    match result {
        Ok(_) => Ok(()),
        Err(e) if is_status(&e, 409) || is_status(&e, 403) || is_status(&e, 404) => Ok(()),
        Err(e) => Err(e),
    }
}
