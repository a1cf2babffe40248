//! An HTTPS server for tests that stand in for what the API server calls out to (admission
//! webhooks, a node's kubelet): any axum router behind rustls, with an rcgen certificate from
//! a CA of its own.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use base64::Engine as _;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use serde_json::{Value, json};
use tokio::net::TcpListener;

/// A running HTTPS server: where it listens and the CA that signed its certificate.
pub(crate) struct TlsServer {
    pub(crate) port: u16,
    /// The CA certificate, PEM.
    pub(crate) ca_pem: String,
    /// The same, base64 as a webhook's `caBundle` carries it.
    pub(crate) ca_bundle: String,
    /// How many TLS connections it has accepted.
    pub(crate) accepted: Arc<AtomicUsize>,
}

impl TlsServer {
    /// The `clientConfig` of a webhook entry calling `path` on this server by URL.
    pub(crate) fn url(&self, path: &str) -> Value {
        json!({"url": format!("https://127.0.0.1:{}/{path}", self.port), "caBundle": self.ca_bundle})
    }
}

/// Serves `app` over HTTPS on 127.0.0.1, with a certificate for `names` from a new CA called
/// `ca_name`, until the runtime ends. Connections may upgrade (exec, attach, port-forward).
pub(crate) async fn serve(app: Router, names: &[&str], ca_name: &str) -> TlsServer {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let ca_key = rcgen::KeyPair::generate().expect("CA key");
    let mut ca_params = rcgen::CertificateParams::default();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, ca_name);
    let ca_cert = ca_params.self_signed(&ca_key).expect("CA");
    let ca_pem = ca_cert.pem();
    let ca_bundle = base64::engine::general_purpose::STANDARD.encode(&ca_pem);
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let key = rcgen::KeyPair::generate().expect("key");
    let params =
        rcgen::CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>())
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
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let (acceptor, app, count) = (acceptor.clone(), app.clone(), count.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                count.fetch_add(1, Ordering::SeqCst);
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection_with_upgrades(
                        TokioIo::new(tls),
                        TowerToHyperService::new(app),
                    )
                    .await;
            });
        }
    });
    TlsServer {
        port,
        ca_pem,
        ca_bundle,
        accepted,
    }
}
