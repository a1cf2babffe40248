//! An HTTPS server for the admission webhooks of tests (any axum router behind rustls, with an
//! rcgen certificate from its own CA) and the webhook entries and configurations that register it.

use std::sync::Arc;

use axum::Router;
use base64::Engine as _;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use tokio::net::TcpListener;

/// A running HTTPS server: where it listens and the CA bundle a webhook entry needs to trust it.
pub(crate) struct TlsServer {
    pub(crate) port: u16,
    pub(crate) ca_bundle: String,
}

impl TlsServer {
    /// The `clientConfig` of a webhook entry calling `path` on this server by URL.
    pub(crate) fn url(&self, path: &str) -> Value {
        json!({"url": format!("https://127.0.0.1:{}/{path}", self.port), "caBundle": self.ca_bundle})
    }
}

/// Serves `app` over HTTPS on 127.0.0.1 with a certificate for `127.0.0.1` and
/// `hooks.webhooks.svc`, until the runtime ends.
pub(crate) async fn serve_https(app: Router) -> TlsServer {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let ca_key = rcgen::KeyPair::generate().expect("CA key");
    let mut ca_params = rcgen::CertificateParams::default();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "test webhook CA");
    let ca_cert = ca_params.self_signed(&ca_key).expect("CA");
    let ca_bundle = base64::engine::general_purpose::STANDARD.encode(ca_cert.pem());
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let key = rcgen::KeyPair::generate().expect("key");
    let params = rcgen::CertificateParams::new(vec![
        "127.0.0.1".to_owned(),
        "hooks.webhooks.svc".to_owned(),
    ])
    .expect("params");
    let cert = params.signed_by(&key, &issuer).expect("certificate");
    let config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
        .expect("tls config");
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let (acceptor, app) = (acceptor.clone(), app.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), TowerToHyperService::new(app))
                    .await;
            });
        }
    });
    TlsServer { port, ca_bundle }
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
