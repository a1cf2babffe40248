//! The admission webhooks of tests: an HTTPS server for them (see [`super::https`]) and the
//! webhook entries and configurations that register it.

use axum::Router;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

pub(crate) use super::https::TlsServer;

/// Serves `app` over HTTPS on 127.0.0.1 with a certificate for `127.0.0.1` and
/// `hooks.webhooks.svc`, until the runtime ends.
pub(crate) async fn serve_https(app: Router) -> TlsServer {
    super::https::serve(app, &["127.0.0.1", "hooks.webhooks.svc"], "test webhook CA").await
}

/// One webhook entry; `extra` overrides or adds fields.
pub(crate) fn webhook(name: &str, client: Value, rules: Value, extra: Value) -> Value {
    let mut hook = json!({
        "name": name,
        "clientConfig": client,
        "rules": rules,
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
    });
    for (k, v) in extra.as_object().into_iter().flatten() {
        hook[k] = v.clone();
    }
    hook
}

/// The `rules` of a webhook entry: these operations on these resources, any version.
pub(crate) fn rule(operations: &[&str], groups: &[&str], resources: &[&str]) -> Value {
    json!([{"operations": operations, "apiGroups": groups, "apiVersions": ["*"], "resources": resources}])
}

/// Creates a `ValidatingWebhookConfiguration` named `name` holding `hooks`.
pub(crate) async fn validating(client: &kube::Client, name: &str, hooks: Value) {
    let api: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let config = serde_json::from_value(json!({"metadata": {"name": name}, "webhooks": hooks}))
        .expect("configuration");
    api.create(&PostParams::default(), &config)
        .await
        .expect("create validating configuration");
}
