//! The API server's HTTPS client to kubelets: one TLS connection per request (log streams and
//! exec sessions are long-lived and never shared), certificate verification off unless a CA is
//! configured, optional client certificate.

use std::fmt;
use std::io;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use futures::StreamExt;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use super::{KubeletTarget, RedactedPem};

/// Opens the TCP connection to a kubelet address when the API server's own namespace has no
/// route to it (a kubelet served from a pod address, as virtual kubelets are); `None` means
/// "connect directly".
pub type KubeletDialer = Arc<
    dyn Fn(
            std::net::SocketAddr,
        ) -> Option<futures::future::BoxFuture<'static, io::Result<TcpStream>>>
        + Send
        + Sync,
>;

/// A WebSocket to a kubelet.
pub type KubeletSocket = WebSocketStream<TlsStream<TcpStream>>;

/// A connection to a kubelet after an HTTP upgrade (SPDY/3.1).
pub type KubeletUpgraded = TokioIo<hyper::upgrade::Upgraded>;

/// The header naming the stream protocols offered in, and chosen by, a SPDY upgrade.
pub(super) const STREAM_PROTOCOL_HEADER: &str = "x-stream-protocol-version";

/// How the API server connects to kubelets.
#[derive(Debug, Clone)]
pub struct KubeletClientConfig {
    /// CA that signed the kubelets' serving certificates; `None` skips verification (the
    /// kube-apiserver default when `--kubelet-certificate-authority` is unset).
    pub ca_pem: Option<String>,
    /// Client certificate presented to kubelets (`--kubelet-client-certificate`).
    pub client_cert_pem: Option<String>,
    /// Its private key.
    pub client_key_pem: Option<RedactedPem>,
    /// How long dialling plus the TLS handshake may take.
    pub connect_timeout: Duration,
}

impl Default for KubeletClientConfig {
    fn default() -> Self {
        Self {
            ca_pem: None,
            client_cert_pem: None,
            client_key_pem: None,
            connect_timeout: Duration::from_secs(10),
        }
    }
}

/// Errors talking to a kubelet. Display texts follow kube-apiserver's (Go's) wording so a user
/// sees the familiar `dial tcp ...: connect: connection refused`.
#[derive(Debug, thiserror::Error)]
pub enum KubeletClientError {
    /// The configuration (CA or client certificate) is unusable.
    #[error("kubelet client configuration: {0}")]
    Config(String),
    /// rustls refused the protocol versions.
    #[error("kubelet client TLS protocol versions")]
    Protocols(#[source] rustls::Error),
    /// TCP connect failed or timed out.
    #[error("{method} \"{url}\": dial tcp {authority}: connect: {reason}")]
    Dial {
        /// `Get` (log) or `Upgrade` (exec).
        method: &'static str,
        /// The kubelet URL.
        url: String,
        /// `host:port`.
        authority: String,
        /// Why.
        reason: String,
    },
    /// The TLS handshake failed.
    #[error("{method} \"{url}\": tls: {reason}")]
    Tls {
        /// `Get` or `Upgrade`.
        method: &'static str,
        /// The kubelet URL.
        url: String,
        /// Why.
        reason: String,
    },
    /// The HTTP exchange failed.
    #[error("{method} \"{url}\": {reason}")]
    Http {
        /// `Get` or `Upgrade`.
        method: &'static str,
        /// The kubelet URL.
        url: String,
        /// Why.
        reason: String,
    },
    /// The kubelet answered the WebSocket upgrade with an HTTP error.
    #[error("the kubelet refused the upgrade with HTTP {code}")]
    Rejected {
        /// HTTP status.
        code: u16,
        /// Response body.
        body: Bytes,
    },
}

/// HTTPS client for the kubelet API.
#[derive(Clone)]
pub struct KubeletClient {
    connector: TlsConnector,
    connect_timeout: Duration,
    dialer: Option<KubeletDialer>,
}

impl fmt::Debug for KubeletClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KubeletClient")
            .field("connect_timeout", &self.connect_timeout)
            .finish_non_exhaustive()
    }
}

impl Default for KubeletClient {
    fn default() -> Self {
        Self::new(&KubeletClientConfig::default())
            .expect("invariant: the default kubelet client configuration is valid")
    }
}

impl KubeletClient {
    /// Builds a client.
    pub fn new(config: &KubeletClientConfig) -> Result<Self, KubeletClientError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(KubeletClientError::Protocols)?;
        let builder = match &config.ca_pem {
            Some(pem) => {
                let mut roots = rustls::RootCertStore::empty();
                for cert in read_certs(pem)? {
                    roots
                        .add(cert)
                        .map_err(|e| KubeletClientError::Config(format!("kubelet CA: {e}")))?;
                }
                builder.with_root_certificates(roots)
            }
            None => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(NoVerification(provider))),
        };
        let mut tls = match (&config.client_cert_pem, &config.client_key_pem) {
            (Some(cert), Some(key)) => {
                let key = rustls_pemfile::private_key(&mut key.0.as_bytes())
                    .map_err(|e| KubeletClientError::Config(format!("client key: {e}")))?
                    .ok_or_else(|| {
                        KubeletClientError::Config("client key: no PEM private key found".into())
                    })?;
                builder
                    .with_client_auth_cert(read_certs(cert)?, key)
                    .map_err(|e| KubeletClientError::Config(format!("client certificate: {e}")))?
            }
            (None, None) => builder.with_no_client_auth(),
            _ => {
                return Err(KubeletClientError::Config(
                    "a kubelet client certificate needs both the certificate and its key".into(),
                ));
            }
        };
        // WebSocket upgrades need HTTP/1.1.
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Self {
            connector: TlsConnector::from(Arc::new(tls)),
            connect_timeout: config.connect_timeout,
            dialer: None,
        })
    }

    /// This client, connecting through `dialer` where it takes an address.
    #[must_use]
    pub fn with_dialer(mut self, dialer: KubeletDialer) -> Self {
        self.dialer = Some(dialer);
        self
    }

    async fn dial(
        &self,
        method: &'static str,
        target: &KubeletTarget,
        url: &str,
    ) -> Result<TlsStream<TcpStream>, KubeletClientError> {
        let authority = target.authority();
        let dial_error = |reason: String| KubeletClientError::Dial {
            method,
            url: url.to_owned(),
            authority: authority.clone(),
            reason,
        };
        let routed = match (&self.dialer, target.host.parse::<IpAddr>()) {
            (Some(dialer), Ok(ip)) => dialer(std::net::SocketAddr::new(ip, target.port)),
            _ => None,
        };
        let connect = async {
            match routed {
                Some(dialing) => dialing.await,
                None => TcpStream::connect(&authority).await,
            }
        };
        let tcp = tokio::time::timeout(self.connect_timeout, connect)
            .await
            .map_err(|_| dial_error("i/o timeout".to_owned()))?
            .map_err(|e| dial_error(go_io_error(&e)))?;
        let _ = tcp.set_nodelay(true);
        let server_name = match target.host.parse::<IpAddr>() {
            Ok(ip) => ServerName::IpAddress(ip.into()),
            Err(_) => {
                ServerName::try_from(target.host.clone()).map_err(|e| KubeletClientError::Tls {
                    method,
                    url: url.to_owned(),
                    reason: format!("invalid server name {:?}: {e}", target.host),
                })?
            }
        };
        tokio::time::timeout(
            self.connect_timeout,
            self.connector.connect(server_name, tcp),
        )
        .await
        .map_err(|_| KubeletClientError::Tls {
            method,
            url: url.to_owned(),
            reason: "handshake timeout".to_owned(),
        })?
        .map_err(|e| KubeletClientError::Tls {
            method,
            url: url.to_owned(),
            reason: e.to_string(),
        })
    }

    /// `GET https://{target}{path_and_query}`; the body streams as the kubelet writes it.
    pub async fn get(
        &self,
        target: &KubeletTarget,
        path_and_query: &str,
    ) -> Result<http::Response<Body>, KubeletClientError> {
        let url = format!("https://{}{path_and_query}", target.authority());
        let stream = self.dial("Get", target, &url).await?;
        let http_error = |reason: String| KubeletClientError::Http {
            method: "Get",
            url: url.clone(),
            reason,
        };
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| http_error(e.to_string()))?;
        let driver = AbortOnDrop(tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "kubelet connection ended");
            }
        }));
        let request = http::Request::get(path_and_query)
            .header(http::header::HOST, target.authority())
            .body(Empty::<Bytes>::new())
            .map_err(|e| http_error(e.to_string()))?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| http_error(e.to_string()))?;
        let (parts, incoming) = response.into_parts();
        // The connection lives as long as the body is read; dropping the body (the client went
        // away) tears it down.
        let stream = incoming.into_data_stream().map(move |chunk| {
            let _keep = &driver;
            chunk
        });
        Ok(http::Response::from_parts(parts, Body::from_stream(stream)))
    }

    /// Upgrades `method https://{target}{path_and_query}` to SPDY/3.1 offering the stream
    /// `protocols`; returns the raw connection with the protocol the kubelet chose.
    pub async fn spdy_upgrade(
        &self,
        target: &KubeletTarget,
        path_and_query: &str,
        method: http::Method,
        protocols: &[String],
    ) -> Result<(KubeletUpgraded, Option<String>), KubeletClientError> {
        let url = format!("https://{}{path_and_query}", target.authority());
        let http_error = |reason: String| KubeletClientError::Http {
            method: "Upgrade",
            url: url.clone(),
            reason,
        };
        let stream = self.dial("Upgrade", target, &url).await?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| http_error(e.to_string()))?;
        tokio::spawn(async move {
            if let Err(e) = connection.with_upgrades().await {
                tracing::debug!(error = %e, "kubelet upgrade connection ended");
            }
        });
        let mut request = http::Request::builder()
            .method(method)
            .uri(path_and_query)
            .header(http::header::HOST, target.authority())
            .header(http::header::CONNECTION, "Upgrade")
            .header(http::header::UPGRADE, "SPDY/3.1");
        for protocol in protocols {
            request = request.header(STREAM_PROTOCOL_HEADER, protocol);
        }
        let request = request
            .body(Empty::<Bytes>::new())
            .map_err(|e| http_error(e.to_string()))?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| http_error(e.to_string()))?;
        if response.status() != http::StatusCode::SWITCHING_PROTOCOLS {
            let code = response.status().as_u16();
            let body = response
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            return Err(KubeletClientError::Rejected { code, body });
        }
        let chosen = response
            .headers()
            .get(STREAM_PROTOCOL_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let upgraded = hyper::upgrade::on(response)
            .await
            .map_err(|e| http_error(e.to_string()))?;
        Ok((TokioIo::new(upgraded), chosen))
    }

    /// Opens a WebSocket to `https://{target}{path_and_query}` offering `protocols`; returns it
    /// with the subprotocol the kubelet chose.
    pub async fn websocket(
        &self,
        target: &KubeletTarget,
        path_and_query: &str,
        protocols: &[String],
    ) -> Result<(KubeletSocket, Option<String>), KubeletClientError> {
        let url = format!("https://{}{path_and_query}", target.authority());
        let http_error = |reason: String| KubeletClientError::Http {
            method: "Upgrade",
            url: url.clone(),
            reason,
        };
        let mut request = format!("wss://{}{path_and_query}", target.authority())
            .into_client_request()
            .map_err(|e| http_error(e.to_string()))?;
        if !protocols.is_empty() {
            let value = http::HeaderValue::from_str(&protocols.join(", "))
                .map_err(|e| http_error(e.to_string()))?;
            request
                .headers_mut()
                .insert(http::header::SEC_WEBSOCKET_PROTOCOL, value);
        }
        let stream = self.dial("Upgrade", target, &url).await?;
        let (socket, response) = tokio_tungstenite::client_async(request, stream)
            .await
            .map_err(|e| match e {
                tokio_tungstenite::tungstenite::Error::Http(response) => {
                    KubeletClientError::Rejected {
                        code: response.status().as_u16(),
                        body: Bytes::from(response.body().clone().unwrap_or_default()),
                    }
                }
                other => http_error(other.to_string()),
            })?;
        let chosen = response
            .headers()
            .get(http::header::SEC_WEBSOCKET_PROTOCOL)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        Ok((socket, chosen))
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn read_certs(pem: &str) -> Result<Vec<CertificateDer<'static>>, KubeletClientError> {
    let certs: Vec<_> = rustls_pemfile::certs(&mut pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| KubeletClientError::Config(format!("certificate PEM: {e}")))?;
    if certs.is_empty() {
        return Err(KubeletClientError::Config(
            "no PEM CERTIFICATE block found".to_owned(),
        ));
    }
    Ok(certs)
}

/// Go's wording for the common connect errors.
fn go_io_error(e: &io::Error) -> String {
    match e.kind() {
        io::ErrorKind::ConnectionRefused => "connection refused".to_owned(),
        io::ErrorKind::TimedOut => "i/o timeout".to_owned(),
        _ => e.to_string(),
    }
}

/// Accepts any kubelet certificate (still checking handshake signatures), as kube-apiserver
/// does without `--kubelet-certificate-authority`.
#[derive(Debug)]
struct NoVerification(Arc<CryptoProvider>);

impl ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
