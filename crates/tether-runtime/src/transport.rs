//! The HTTP stack under every Kubernetes client of the daemons: HTTP/2 where the API server
//! offers it, and connections that close when idle.
//!
//! kube's default stack speaks only HTTP/1.1 and never reaps idle connections: a burst of
//! concurrent requests leaves one open connection per request in flight (each with its
//! buffers and TLS state), and every request repeats its headers in full. client-go, like
//! this stack, negotiates HTTP/2 by ALPN, so one connection carries every watch and request
//! to a server with compressed headers, and pings it when it has been silent. Upgrades
//! (exec, attach, port-forward) need HTTP/1.1, hence [`Protocols::Http1`].

use std::time::Duration;

use hyper_timeout::TimeoutConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::retry::RetryPolicy;
use kube::client::{Body, ClientBuilder, ConfigExt};
use tower::{BoxError, ServiceBuilder};

/// How long a connection with nothing to do stays open.
const IDLE: Duration = Duration::from_secs(30);
/// At most this many idle HTTP/1.1 connections per server are kept (an HTTP/2 connection is
/// one whatever it carries).
const IDLE_PER_HOST: usize = 4;
/// Silence after which an HTTP/2 connection is pinged, and how long the answer may take
/// before the connection counts as dead (client-go's `ReadIdleTimeout` and `PingTimeout`).
const PING_AFTER: Duration = Duration::from_secs(30);
const PING_TIMEOUT: Duration = Duration::from_secs(15);

/// Which HTTP versions a client offers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocols {
    /// HTTP/2 if the server agrees by ALPN, HTTP/1.1 otherwise: for API requests and watches.
    Negotiated,
    /// HTTP/1.1 only: for requests upgraded to WebSocket or SPDY, which HTTP/2 cannot carry.
    Http1,
}

/// The User-Agent of every request, formed as client-go forms its default
/// (`<program>/<version> (<os>/<arch>)`): kube-apiserver names the field manager of a write
/// that names none after the part before the `/`, so every write shows in `managedFields`.
pub fn user_agent() -> String {
    let program = std::env::args_os()
        .next()
        .and_then(|p| {
            std::path::Path::new(&p)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
        })
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "tether".to_owned());
    format!(
        "{program}/v{} ({}/{})",
        env!("CARGO_PKG_VERSION"),
        std::env::consts::OS,
        std::env::consts::ARCH
    )
}

/// A client for `config` over the stack described above: the same authentication, TLS
/// verification, timeouts and retries as `kube::Client::try_from`, another connection pool,
/// and [`user_agent`] unless `config` sets one.
pub fn client(config: &kube::Config, protocols: Protocols) -> Result<kube::Client, kube::Error> {
    let mut config = config.clone();
    let agent = axum::http::header::USER_AGENT;
    if !config.headers.iter().any(|(name, _)| *name == agent)
        && let Ok(value) = axum::http::HeaderValue::from_str(&user_agent())
    {
        config.headers.push((agent, value));
    }
    let config = &config;
    let tls = config.rustls_client_config()?;
    let mut connector = HttpConnector::new();
    connector.enforce_http(false);
    let mut https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http();
    if let Some(name) = &config.tls_server_name {
        let name = rustls::pki_types::ServerName::try_from(name.clone()).map_err(|e| {
            kube::Error::RustlsTls(kube::client::RustlsTlsError::InvalidServerName(e))
        })?;
        https = https.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name));
    }
    let https = match protocols {
        Protocols::Negotiated => https.enable_all_versions().wrap_connector(connector),
        Protocols::Http1 => https.enable_http1().wrap_connector(connector),
    };
    let mut timed = TimeoutConnector::new(https);
    timed.set_connect_timeout(config.connect_timeout);
    timed.set_read_timeout(config.read_timeout);
    timed.set_write_timeout(config.write_timeout);
    timed.set_reset_reader_on_write(config.reset_reader_on_write);

    let mut builder = hyper_util::client::legacy::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        .pool_idle_timeout(IDLE)
        .pool_max_idle_per_host(IDLE_PER_HOST)
        .http2_keep_alive_interval(PING_AFTER)
        .http2_keep_alive_timeout(PING_TIMEOUT);
    let http: hyper_util::client::legacy::Client<_, Body> = builder.build(timed);

    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(
            config
                .default_retry
                .then(|| tower::retry::RetryLayer::new(RetryPolicy::server_retry())),
        )
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(BoxError::from)
        .service(http);
    Ok(ClientBuilder::new(service, config.default_namespace.clone()).build())
}
