//! A running simulated cluster: builder, listener (HTTP or HTTPS), admin credentials, kube-rs
//! clients, kubeconfigs, background controllers, and the test controls (fault injection,
//! latency, broken watches, compaction, restarts, request log).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock, RwLock, Weak};
use std::time::Duration;

use rand::Rng as _;
use serde_json::{Value, json};
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;

use crate::auth::{self, Authenticator, SecretToken, TokenIssuer};
use crate::controllers::{ControllerSettings, Controllers};
use crate::error::ApiError;
use crate::http::{self, Fault, RequestRecord, ServerConfig, ServerState};
use crate::registry::Registry;
use crate::store::{Store, StoreConfig, TypeKey};
use crate::strategy;
use crate::tls::{self, CertAuthority};

mod builder;
mod startup;
pub use builder::ClusterBuilder;
use startup::*;
pub use startup::{CLIENT_CA_CONFIGMAP, CLIENT_CA_KEY};

/// How long open connections get to finish when the server stops.
const DRAIN_GRACE: Duration = Duration::from_secs(2);
/// What the built-in controllers send as User-Agent: the part before the `/` is the field
/// manager of their writes, as for the real kube-controller-manager.
const CONTROLLER_USER_AGENT: &str = "kube-controller-manager/simkube";

/// Why a cluster could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// Certificates could not be made.
    #[error("TLS setup failed")]
    Tls(#[from] tls::TlsError),
    /// The ServiceAccount token signer could not be made.
    #[error("token signer setup failed")]
    Token(#[source] crate::auth::TokenError),
    /// The admin client could not be built.
    #[error("admin client")]
    Client(#[source] kube::Error),
    /// The client that calls kubelets could not be built.
    #[error("kubelet client")]
    KubeletClient(#[from] crate::kubelet_proxy::KubeletClientError),
}

/// Something started with the cluster once it listens, stopped by the token at shutdown.
pub type BackgroundTask =
    Box<dyn FnOnce(&Cluster, CancellationToken) -> Vec<JoinHandle<()>> + Send>;

struct Running {
    shutdown: CancellationToken,
    task: JoinHandle<()>,
}

/// A running simulated cluster. Dropping it stops accepting connections; call
/// [`Cluster::shutdown`] to also wait for in-flight requests and background tasks.
pub struct Cluster {
    name: String,
    url: String,
    addr: SocketAddr,
    state: Arc<ServerState>,
    ca: Option<Arc<CertAuthority>>,
    kubelet_client: crate::kubelet_proxy::KubeletClient,
    tls_config: Option<Arc<rustls::ServerConfig>>,
    admin_token: SecretToken,
    advertise: SocketAddr,
    running: Mutex<Option<Running>>,
    background_stop: CancellationToken,
    background: Mutex<Vec<JoinHandle<()>>>,
    /// Kept open across restarts (only clones are served), so their ports never change.
    extra_listeners: Vec<std::net::TcpListener>,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("name", &self.name)
            .field("url", &self.url)
            .field("admin_token", &self.admin_token)
            .finish_non_exhaustive()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.background_stop.cancel();
        if let Some(r) = self
            .running
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            r.shutdown.cancel();
        }
        self.state.watch_breaker.send_modify(|g| *g += 1);
    }
}

impl Cluster {
    /// A builder with defaults: plain HTTP on 127.0.0.1:0, no RBAC, history 4096, bookmarks
    /// every second, no controllers.
    pub fn builder() -> ClusterBuilder {
        ClusterBuilder::default()
    }

    fn serve(&self, listener: tokio::net::TcpListener) {
        let shutdown = CancellationToken::new();
        let router = http::router(self.state.clone());
        let mut listeners = vec![listener];
        for extra in &self.extra_listeners {
            match extra
                .try_clone()
                .and_then(tokio::net::TcpListener::from_std)
            {
                Ok(l) => listeners.push(l),
                Err(error) => tracing::error!(%error, "cannot serve an extra listener"),
            }
        }
        let serving: Vec<_> = listeners
            .into_iter()
            .map(|listener| match &self.tls_config {
                Some(config) => tokio::spawn(tls::serve_https(
                    listener,
                    router.clone(),
                    config.clone(),
                    shutdown.clone(),
                )),
                None => tokio::spawn(serve_plain(listener, router.clone(), shutdown.clone())),
            })
            .collect();
        let task = tokio::spawn(async move {
            for handle in serving {
                let _ = handle.await;
            }
        });
        *self.running.lock().unwrap_or_else(|e| e.into_inner()) = Some(Running { shutdown, task });
    }

    async fn stop_serving(&self) {
        let running = self
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        self.break_watches();
        if let Some(r) = running {
            r.shutdown.cancel();
            let abort = r.task.abort_handle();
            if tokio::time::timeout(DRAIN_GRACE * 2, r.task).await.is_err() {
                abort.abort();
            }
        }
    }

    /// The cluster name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `http://127.0.0.1:PORT` or `https://...`.
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The admin bearer token (user `admin`, group `system:masters`).
    pub fn admin_token(&self) -> &str {
        self.admin_token.expose()
    }

    /// The CA certificate (PEM) when TLS is on.
    pub fn ca_pem(&self) -> Option<String> {
        self.ca.as_ref().map(|ca| ca.ca_pem())
    }

    /// The cluster CA when TLS is on (signs client certificates and CSRs).
    pub fn ca(&self) -> Option<Arc<CertAuthority>> {
        self.ca.clone()
    }

    /// The client the default pod proxy calls kubelets with: with TLS on it presents the
    /// cluster's kubelet client certificate
    /// ([`crate::kubelet_proxy::KUBELET_CLIENT_USER`]), as kube-apiserver's
    /// `--kubelet-client-certificate`. A proxy installed in `ServerState::pod_proxy` with
    /// another dialer starts from it.
    pub fn kubelet_client(&self) -> crate::kubelet_proxy::KubeletClient {
        self.kubelet_client.clone()
    }

    /// Shared server state (store, registry, hooks) for in-crate extensions.
    pub fn state(&self) -> &Arc<ServerState> {
        &self.state
    }

    /// A kube-rs client configured for this cluster with the given bearer token.
    pub fn client_with_token(&self, token: &str) -> Result<kube::Client, kube::Error> {
        kube::Client::try_from(self.config_with_token(token))
    }

    /// The client of the built-in controllers: it names itself as kube-controller-manager
    /// does, so the objects they write are tracked under its name in `managedFields`.
    pub(crate) fn controller_client(&self) -> Result<kube::Client, kube::Error> {
        let mut config = self.config_with_token(self.admin_token.expose());
        config.headers.push((
            ::http::header::USER_AGENT,
            ::http::HeaderValue::from_static(CONTROLLER_USER_AGENT),
        ));
        kube::Client::try_from(config)
    }

    fn config_with_token(&self, token: &str) -> kube::Config {
        let url: ::http::Uri = self
            .url
            .parse()
            .expect("invariant: the URL is built from a socket address");
        let mut config = kube::Config::new(url);
        config.default_namespace = "default".into();
        if let Some(ca) = &self.ca {
            config.root_cert = Some(vec![ca.ca_der().to_vec()]);
        }
        config.auth_info.token = Some(secrecy::SecretString::from(token.to_owned()));
        config
    }

    /// An admin kube-rs client over the real listener (TLS when on), default namespace `default`.
    pub fn client(&self) -> kube::Client {
        self.client_with_token(self.admin_token.expose())
            .expect("invariant: a client for our own URL and CA always builds")
    }

    /// The admin kubeconfig (YAML): server URL, CA data with TLS, the admin token.
    pub fn kubeconfig(&self) -> String {
        tls::kubeconfig(
            &self.name,
            &self.url,
            self.ca_pem().as_deref(),
            self.admin_token.expose(),
        )
    }

    /// Writes [`Cluster::kubeconfig`] to a file readable only by its owner.
    pub fn write_kubeconfig(&self, path: &Path) -> std::io::Result<()> {
        std::fs::write(path, self.kubeconfig())?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        }
        Ok(())
    }

    /// The API as an in-process tower service, authenticated as admin:
    /// `kube::Client::new(cluster.service(), "default")` skips TCP.
    pub fn service(&self) -> axum::Router {
        let header =
            ::http::HeaderValue::from_str(&format!("Bearer {}", self.admin_token.expose()))
                .expect("invariant: the token is alphanumeric");
        http::router(self.state.clone()).layer(tower::util::MapRequestLayer::new(
            move |mut req: axum::http::Request<axum::body::Body>| {
                if !req
                    .headers()
                    .contains_key(axum::http::header::AUTHORIZATION)
                {
                    req.headers_mut()
                        .insert(axum::http::header::AUTHORIZATION, header.clone());
                }
                req
            },
        ))
    }

    /// Answers the next `n` requests with this verb (`get`, `list`, `watch`, `create`,
    /// `update`, `patch`, `delete`, `deletecollection`, or `*`) on this resource (plural,
    /// `plural/subresource`, or `*`) with `status`.
    pub fn fail_next(&self, verb: &str, resource: &str, n: usize, status: ApiError) {
        if n == 0 {
            return;
        }
        self.state
            .faults
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Fault {
                verb: verb.to_owned(),
                resource: resource.to_owned(),
                remaining: n,
                error: status,
            });
    }

    /// Adds `latency` before every request is handled.
    pub fn set_latency(&self, latency: Duration) {
        *self.state.latency.lock().unwrap_or_else(|e| e.into_inner()) = latency;
    }

    /// Ends every open watch stream (clients see the stream close and resume).
    pub fn break_watches(&self) {
        self.state.watch_breaker.send_modify(|g| *g += 1);
    }

    /// Drops all event history: resuming a watch from any earlier RV gets 410 Expired.
    pub fn compact(&self) {
        self.state.store.compact();
    }

    /// Stops listening, then listens again on the same port. With `keep_state = false` the
    /// cluster comes back empty except for its default objects (as after losing etcd); the RV
    /// keeps counting up so clients notice through 410s.
    pub async fn restart(&self, keep_state: bool) {
        self.stop_serving().await;
        if !keep_state {
            self.state.store.reset();
            self.state.set_registry(Registry::with_builtins());
            seed(&self.state, self.advertise, self.ca.as_deref());
        }
        let mut attempt = 0;
        let listener = loop {
            match bind(self.addr).await {
                Ok(l) => break l,
                Err(e) if attempt < 100 => {
                    attempt += 1;
                    tracing::debug!(error = %e, "rebinding after restart");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => {
                    tracing::error!(error = %e, "cannot listen again after restart");
                    return;
                }
            }
        };
        self.serve(listener);
    }

    /// The request log, oldest first.
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.state
            .requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .cloned()
            .collect()
    }

    /// Empties the request log.
    pub fn clear_requests(&self) {
        self.state
            .requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    /// Stops background tasks and the listener and waits for them.
    pub async fn shutdown(self) {
        self.background_stop.cancel();
        let handles =
            std::mem::take(&mut *self.background.lock().unwrap_or_else(|e| e.into_inner()));
        for h in handles {
            let abort = h.abort_handle();
            if tokio::time::timeout(DRAIN_GRACE, h).await.is_err() {
                abort.abort();
            }
        }
        self.stop_serving().await;
    }
}

/// Serves plain HTTP/1.1 and h2c until `shutdown`, then gives connections a short grace and
/// drops the rest (long watches must not hold a restart up).
async fn serve_plain(
    listener: tokio::net::TcpListener,
    router: axum::Router,
    shutdown: CancellationToken,
) {
    let mut connections = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            () = shutdown.cancelled() => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            accepted = listener.accept() => accepted,
        };
        let tcp = match accepted {
            Ok((tcp, _)) => tcp,
            Err(error) => {
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let router = router.clone();
        let shutdown = shutdown.clone();
        connections.spawn(async move {
            use tower::ServiceExt as _;
            let service =
                hyper::service::service_fn(move |req: ::http::Request<hyper::body::Incoming>| {
                    router.clone().oneshot(req.map(axum::body::Body::new))
                });
            let builder =
                hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
            let conn =
                builder.serve_connection_with_upgrades(hyper_util::rt::TokioIo::new(tcp), service);
            tokio::pin!(conn);
            tokio::select! {
                result = conn.as_mut() => {
                    if let Err(error) = result {
                        tracing::debug!(%error, "connection ended with an error");
                    }
                }
                () = shutdown.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = tokio::time::timeout(DRAIN_GRACE, conn.as_mut()).await;
                }
            }
        });
    }
    drop(listener);
    let drain = async { while connections.join_next().await.is_some() {} };
    if tokio::time::timeout(DRAIN_GRACE + Duration::from_secs(1), drain)
        .await
        .is_err()
    {
        connections.abort_all();
    }
}
