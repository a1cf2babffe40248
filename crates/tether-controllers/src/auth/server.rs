//! The authentication service: HTTPS (rustls) in front of the protocol, with per-source
//! failure limiting and request metrics. Every replica serves it; nonces are stateless, so a
//! consumer may reach a different replica on each request.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};

use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use tokio_util::sync::CancellationToken;

use super::issuer::{self, Refusal};
use super::protocol::{
    ErrorBody, IdentityRequest, IdentityResponse, NonceRequest, NonceSealer, Reason,
    RevocationRequest,
};
use super::ratelimit::FailureLimiter;
use super::tls::AuthCert;
use crate::Error;
use crate::context::Ctx;

/// Failures allowed per source address and window before 429.
pub const MAX_FAILURES: u32 = 5;
/// The failure window, seconds.
pub const FAILURE_WINDOW_SECS: i64 = 60;

struct AppState {
    ctx: Arc<Ctx>,
    sealer: NonceSealer,
    limiter: Mutex<FailureLimiter>,
}

/// The service's router, for in-process tests and for [`serve`].
pub fn router(ctx: Arc<Ctx>) -> Router {
    let sealer = NonceSealer::new(&ctx.identity.keys.derive("auth-nonce"));
    let state = Arc::new(AppState {
        ctx,
        sealer,
        limiter: Mutex::new(FailureLimiter::new(MAX_FAILURES, FAILURE_WINDOW_SECS)),
    });
    Router::new()
        .route("/v1/identity", get(identity))
        .route("/v1/nonces", post(nonce))
        .route("/v1/identities", post(identities))
        .route("/v1/revocations", post(revocations))
        .with_state(state)
}

fn now() -> i64 {
    k8s_openapi::jiff::Timestamp::now().as_second()
}

fn refusal_response(r: &Refusal, retry_after: Option<i64>) -> Response {
    let status =
        StatusCode::from_u16(r.reason.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = ErrorBody {
        reason: r.reason.as_str().to_owned(),
        message: r.message.clone(),
    };
    let mut resp = (status, Json(body)).into_response();
    if let Some(secs) = retry_after
        && let Ok(v) = HeaderValue::from_str(&secs.max(1).to_string())
    {
        resp.headers_mut().insert(header::RETRY_AFTER, v);
    }
    resp
}

impl AppState {
    /// Runs `f` unless the source is rate limited; records its outcome.
    async fn guarded<T, F>(&self, endpoint: &'static str, peer: SocketAddr, f: F) -> Response
    where
        T: serde::Serialize,
        F: Future<Output = Result<T, Refusal>>,
    {
        let blocked = self
            .limiter
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .check(peer.ip(), now());
        if let Err(wait) = blocked {
            self.ctx
                .metrics
                .auth_request(endpoint, Reason::RateLimited.metric_label());
            let r = Refusal {
                reason: Reason::RateLimited,
                message: format!(
                    "too many failed attempts from {}; retry in {wait}s",
                    peer.ip()
                ),
            };
            return refusal_response(&r, Some(wait));
        }
        match f.await {
            Ok(v) => {
                self.ctx.metrics.auth_request(endpoint, "ok");
                Json(v).into_response()
            }
            Err(r) => {
                if r.reason.counts_as_failure() {
                    self.limiter
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .record_failure(peer.ip(), now());
                }
                tracing::info!(endpoint, peer = %peer, reason = r.reason.as_str(), message = %r.message,
                    "authentication request refused");
                self.ctx
                    .metrics
                    .auth_request(endpoint, r.reason.metric_label());
                refusal_response(&r, None)
            }
        }
    }
}

async fn identity(State(s): State<Arc<AppState>>) -> Response {
    s.ctx.metrics.auth_request("identity", "ok");
    Json(IdentityResponse {
        cluster_id: s.ctx.cluster_id().to_string(),
        public_key: s.ctx.identity.keys.public_key_b64(),
    })
    .into_response()
}

async fn nonce(
    State(s): State<Arc<AppState>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Json(req): Json<NonceRequest>,
) -> Response {
    let st = s.clone();
    s.guarded("nonces", peer, async move {
        tether_api::ClusterId::new(&req.cluster_id).map_err(|e| Refusal {
            reason: Reason::BadRequest,
            message: e.to_string(),
        })?;
        Ok(st.sealer.issue(&req.cluster_id, now(), rand::random()))
    })
    .await
}

async fn identities(
    State(s): State<Arc<AppState>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Json(req): Json<IdentityRequest>,
) -> Response {
    let st = s.clone();
    s.guarded("identities", peer, async move {
        issuer::issue(&st.ctx, &st.sealer, &req).await
    })
    .await
}

async fn revocations(
    State(s): State<Arc<AppState>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Json(req): Json<RevocationRequest>,
) -> Response {
    let st = s.clone();
    s.guarded("revocations", peer, async move {
        issuer::revoke(&st.ctx, &st.sealer, &req)
            .await
            .map(|()| serde_json::json!({}))
    })
    .await
}

/// Binds `addr` and returns the bound address and the serving future, which runs until
/// `shutdown` is cancelled.
pub async fn serve(
    ctx: Arc<Ctx>,
    cert: &AuthCert,
    addr: SocketAddr,
    shutdown: CancellationToken,
) -> Result<(SocketAddr, impl Future<Output = ()> + use<>), Error> {
    crate::https::serve(
        "the authentication service",
        addr,
        cert.server_config()?,
        router(ctx),
        shutdown,
    )
    .await
}
