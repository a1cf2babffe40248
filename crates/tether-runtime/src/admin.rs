//! The admin HTTP server: `/metrics` (Prometheus text), `/healthz` (liveness) and `/readyz`
//! (readiness).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus_client::registry::Registry;

use crate::{Health, Readiness, Shutdown};

/// The OpenMetrics text content type `prometheus-client` renders.
const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Why the admin server failed.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// The listen address could not be bound.
    #[error("cannot listen on {addr} for the admin server: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// Serving failed after binding.
    #[error("admin server failed: {0}")]
    Serve(#[source] std::io::Error),
}

#[derive(Clone)]
struct AppState {
    registry: Arc<Mutex<Registry>>,
    health: Health,
    readiness: Readiness,
}

/// Builder and runner for the admin server.
pub struct AdminServer {
    state: AppState,
}

impl AdminServer {
    /// A server exposing `registry` on `/metrics` and `health` on `/healthz`. `/readyz` is
    /// ready until [`AdminServer::with_readiness`] gives it components to wait for.
    pub fn new(registry: Arc<Mutex<Registry>>, health: Health) -> Self {
        Self {
            state: AppState {
                registry,
                health,
                readiness: Readiness::new(),
            },
        }
    }

    /// Serves `readiness` on `/readyz`.
    pub fn with_readiness(mut self, readiness: Readiness) -> Self {
        self.state.readiness = readiness;
        self
    }

    /// The router, for in-process tests (`tower::ServiceExt::oneshot`).
    pub fn router(&self) -> Router {
        Router::new()
            .route("/metrics", get(metrics))
            .route("/healthz", get(healthz))
            .route("/readyz", get(readyz))
            .with_state(self.state.clone())
    }

    /// Binds `addr`; the returned future serves until `shutdown` fires. Binding happens
    /// before the future is returned so callers learn about a taken port at once.
    pub async fn bind(
        self,
        addr: SocketAddr,
        shutdown: Shutdown,
    ) -> Result<(SocketAddr, impl Future<Output = Result<(), AdminError>>), AdminError> {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| AdminError::Bind { addr, source })?;
        let local = listener
            .local_addr()
            .map_err(|source| AdminError::Bind { addr, source })?;
        let router = self.router();
        let fut = async move {
            axum::serve(listener, router)
                .with_graceful_shutdown(async move { shutdown.cancelled().await })
                .await
                .map_err(AdminError::Serve)
        };
        Ok((local, fut))
    }
}

async fn metrics(State(state): State<AppState>) -> Response {
    let mut body = String::with_capacity(4096);
    let registry = state
        .registry
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    match prometheus_client::encoding::text::encode(&mut body, &registry) {
        Ok(()) => ([(header::CONTENT_TYPE, METRICS_CONTENT_TYPE)], body).into_response(),
        Err(e) => {
            tracing::warn!(error = %e, "encoding metrics failed");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "metrics encoding failed\n",
            )
                .into_response()
        }
    }
}

async fn healthz(State(state): State<AppState>) -> Response {
    status_response(state.health.check())
}

async fn readyz(State(state): State<AppState>) -> Response {
    status_response(state.readiness.check())
}

/// 200 `ok`, or 503 with one `component: reason` line per failing component.
fn status_response(check: Result<(), Vec<String>>) -> Response {
    match check {
        Ok(()) => (StatusCode::OK, "ok\n").into_response(),
        Err(reasons) => {
            let mut body = reasons.join("\n");
            body.push('\n');
            (StatusCode::SERVICE_UNAVAILABLE, body).into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::Request;
    use http_body_util::BodyExt;
    use prometheus_client::metrics::counter::Counter;
    use tower::ServiceExt;

    use super::*;

    fn server() -> (AdminServer, Health, Counter) {
        let mut registry = Registry::with_prefix("tether");
        let counter = Counter::<u64>::default();
        registry.register("test_events", "Events seen by the test", counter.clone());
        let health = Health::new();
        (
            AdminServer::new(Arc::new(Mutex::new(registry)), health.clone()),
            health,
            counter,
        )
    }

    async fn get(router: Router, path: &str) -> (StatusCode, String) {
        let resp = router
            .oneshot(Request::get(path).body(Body::empty()).expect("request"))
            .await
            .expect("infallible");
        let status = resp.status();
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        (status, String::from_utf8(body.to_vec()).expect("utf8"))
    }

    #[tokio::test]
    async fn metrics_render_registered_counters() {
        let (server, _, counter) = server();
        counter.inc_by(3);
        let (status, body) = get(server.router(), "/metrics").await;
        assert_eq!(status, StatusCode::OK);
        assert!(body.contains("tether_test_events_total 3"), "{body}");
    }

    #[tokio::test]
    async fn healthz_reports_reason_with_503() {
        let (server, health, _) = server();
        assert_eq!(get(server.router(), "/healthz").await.0, StatusCode::OK);
        health.set_unhealthy("tunnel", "no handshake with peer b");
        let (status, body) = get(server.router(), "/healthz").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.contains("tunnel: no handshake with peer b"), "{body}");
    }

    #[tokio::test]
    async fn readyz_lists_every_component_not_ready() {
        let (server, health, _) = server();
        let readiness = Readiness::new();
        let router = server.with_readiness(readiness.clone()).router();
        assert_eq!(get(router.clone(), "/readyz").await.0, StatusCode::OK);
        readiness.register("caches", "not synced");
        readiness.register("leader", "standby");
        let (status, body) = get(router.clone(), "/readyz").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(body, "caches: not synced\nleader: standby\n");
        assert_eq!(
            get(router.clone(), "/healthz").await.0,
            StatusCode::OK,
            "not ready is not unhealthy"
        );
        readiness.set_ready("caches");
        readiness.set_ready("leader");
        assert_eq!(
            get(router.clone(), "/readyz").await,
            (StatusCode::OK, "ok\n".to_owned())
        );
        health.set_unhealthy("kernel", "nft failed");
        assert_eq!(
            get(router, "/readyz").await.0,
            StatusCode::OK,
            "readiness does not follow health"
        );
    }

    #[tokio::test]
    async fn real_listener_serves_and_stops_on_shutdown() {
        let (server, _, _) = server();
        let shutdown = Shutdown::new();
        let (addr, fut) = server
            .bind(SocketAddr::from(([127, 0, 0, 1], 0)), shutdown.clone())
            .await
            .expect("bind loopback");
        let task = tokio::spawn(fut);
        let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .expect("write");
        let mut resp = String::new();
        stream.read_to_string(&mut resp).await.expect("read");
        assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
        shutdown.trigger();
        tokio::time::timeout(std::time::Duration::from_secs(5), task)
            .await
            .expect("server stops")
            .expect("join")
            .expect("clean exit");
    }
}
