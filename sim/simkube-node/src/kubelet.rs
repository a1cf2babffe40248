//! The kubelet HTTPS endpoint the API server forwards pod subresources to, under a self-signed
//! certificate (the API server's kubelet client does not verify it, as with a default kubelet):
//!
//! - `GET /containerLogs/{namespace}/{pod}/{container}` (module `logs`): the container's output with
//!   the kubelet's options, `follow` included;
//! - `/exec/{namespace}/{pod}/{container}` and `/attach/...` (module `exec`): WebSocket sessions
//!   speaking the kubelet's channel protocol ([`channel`]);
//! - `/portForward/{namespace}/{pod}` (module `portforward`): an upgrade to SPDY/3.1
//!   ([`spdy`]) whose stream pairs become TCP connections inside the pod's network namespace;
//! - `/metrics` (the agent's Prometheus metrics) and `/healthz`.

pub mod channel;
mod exec;
mod logs;
mod portforward;
pub mod spdy;

use std::collections::HashSet;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse as _, Response};
use axum::routing::{any, get};
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use crate::containers::Containers;
use crate::metrics::Metrics;

/// Log files that a running container still writes (a follow stream ends when its file leaves).
#[derive(Debug, Clone, Default)]
pub struct LiveLogs(Arc<Mutex<HashSet<PathBuf>>>);

impl LiveLogs {
    /// Marks `path` as being written.
    pub fn insert(&self, path: PathBuf) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(path);
    }

    /// Marks `path` as finished.
    pub fn remove(&self, path: &Path) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(path);
    }

    /// Whether `path` is still being written.
    pub fn contains(&self, path: &Path) -> bool {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(path)
    }
}

/// Why the endpoint could not start.
#[derive(Debug, thiserror::Error)]
pub enum KubeletError {
    /// The certificate could not be made.
    #[error("kubelet certificate: {0}")]
    Certificate(String),
}

/// A TLS configuration with a fresh self-signed certificate for `node` at `ip`.
pub fn tls_config(node: &str, ip: IpAddr) -> Result<Arc<rustls::ServerConfig>, KubeletError> {
    let err = |e: &dyn std::fmt::Display| KubeletError::Certificate(e.to_string());
    let certified = rcgen::generate_simple_self_signed(vec![node.to_owned(), ip.to_string()])
        .map_err(|e| err(&e))?;
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(certified.signing_key.serialize_der().into());
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| err(&e))?
        .with_no_client_auth()
        .with_single_cert(vec![certified.cert.der().clone()], key)
        .map_err(|e| err(&e))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// What the endpoint serves from.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// Container logs live under `<state_dir>/pods/`.
    pub state_dir: PathBuf,
    /// Log files still being written.
    pub live: LiveLogs,
    /// The running containers, for exec and attach.
    pub containers: Containers,
    /// The agent's metrics (sessions are counted here).
    pub metrics: Metrics,
    /// What `/metrics` shows.
    pub registry: Arc<Registry>,
}

/// The endpoint's routes.
pub fn router(endpoint: Endpoint) -> Router {
    Router::new()
        .route(
            "/containerLogs/{namespace}/{pod}/{container}",
            get(logs::container_logs),
        )
        .route("/exec/{namespace}/{pod}/{container}", any(exec::exec))
        .route("/attach/{namespace}/{pod}/{container}", any(exec::attach))
        .route(
            "/portForward/{namespace}/{pod}",
            any(portforward::port_forward),
        )
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .with_state(endpoint)
}

/// Serves `router` over TLS on `listener` until `shutdown`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    tls: Arc<rustls::ServerConfig>,
    shutdown: CancellationToken,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let accepted = tokio::select! {
            () = shutdown.cancelled() => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            accepted = listener.accept() => accepted,
        };
        let Ok((tcp, peer)) = accepted else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let acceptor = acceptor.clone();
        let router = router.clone();
        let shutdown = shutdown.clone();
        connections.spawn(async move {
            let handshake = tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp));
            let Ok(Ok(tls)) = handshake.await else {
                tracing::debug!(%peer, "kubelet TLS handshake failed");
                return;
            };
            let service =
                hyper::service::service_fn(move |request: http::Request<hyper::body::Incoming>| {
                    use tower::ServiceExt as _;
                    router.clone().oneshot(request.map(Body::new))
                });
            let builder =
                hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
            let connection =
                builder.serve_connection_with_upgrades(hyper_util::rt::TokioIo::new(tls), service);
            tokio::select! {
                _ = connection => {}
                () = shutdown.cancelled() => {}
            }
        });
    }
    connections.abort_all();
}

fn text(status: StatusCode, message: String) -> Response {
    (status, [(header::CONTENT_TYPE, "text/plain")], message).into_response()
}

async fn metrics(State(endpoint): State<Endpoint>) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)],
        crate::metrics::encode(&endpoint.registry),
    )
        .into_response()
}
