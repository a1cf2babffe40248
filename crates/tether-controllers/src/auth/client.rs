//! The consumer's client for a provider's authentication service: HTTPS with the provider's
//! certificate pinned by fingerprint, one short connection per request, every failure named
//! with the URL it concerns.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use super::protocol::{
    ErrorBody, IdentityRequest, IdentityResponse, IssuedIdentity, NonceRequest, NonceResponse,
    Reason, RevocationRequest,
};
use super::tls::PinnedVerifier;

/// How long one request may take, connection included.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a request to a provider failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The URL is not an `https://host:port` URL.
    #[error("invalid authentication URL {url:?}: {problem}")]
    InvalidUrl {
        /// The URL.
        url: String,
        /// What is wrong.
        problem: &'static str,
    },
    /// No TCP connection could be made.
    #[error("cannot connect to the authentication service at {url}: {source}")]
    Unreachable {
        /// The URL.
        url: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The request did not complete in time.
    #[error("the authentication service at {url} did not answer within {}s", REQUEST_TIMEOUT.as_secs())]
    Timeout {
        /// The URL.
        url: String,
    },
    /// The server presented another certificate than the pinned one.
    #[error(
        "the authentication service at {url} presented certificate {got}, not the expected \
         {expected}; check --ca-fingerprint (the provider's `tether generate peer-command` \
         prints it) or whether something intercepts the connection"
    )]
    FingerprintMismatch {
        /// The URL.
        url: String,
        /// The pinned fingerprint.
        expected: String,
        /// What was presented.
        got: String,
    },
    /// The TLS handshake or HTTP exchange failed.
    #[error("talking to the authentication service at {url} failed: {detail}")]
    Protocol {
        /// The URL.
        url: String,
        /// What failed.
        detail: String,
    },
    /// The provider refused the request.
    #[error("the provider refused the request ({}): {message}", reason.as_str())]
    Refused {
        /// Why, as the provider classified it.
        reason: Reason,
        /// The provider's message.
        message: String,
        /// `Retry-After`, for rate limiting.
        retry_after: Option<u64>,
    },
}

impl ClientError {
    /// Whether retrying later could succeed without anyone changing anything.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Unreachable { .. } | Self::Timeout { .. } | Self::Protocol { .. } => true,
            Self::Refused { reason, .. } => {
                matches!(
                    reason,
                    Reason::RateLimited | Reason::Internal | Reason::NonceRejected
                )
            }
            Self::InvalidUrl { .. } | Self::FingerprintMismatch { .. } => false,
        }
    }

    /// The ForeignCluster condition reason this failure shows as.
    pub fn condition_reason(&self) -> &'static str {
        match self {
            Self::InvalidUrl { .. } => "InvalidAuthURL",
            Self::Unreachable { .. } | Self::Timeout { .. } | Self::Protocol { .. } => {
                "ProviderUnreachable"
            }
            Self::FingerprintMismatch { .. } => "FingerprintMismatch",
            Self::Refused { reason, .. } => match reason {
                Reason::TokenRejected => "TokenRejected",
                Reason::SignatureRejected | Reason::NonceRejected => "SignatureRejected",
                Reason::ClusterIdConflict => "ClusterIDConflict",
                Reason::CsrRejected | Reason::BadRequest => "RequestRejected",
                Reason::UnknownTenant => "UnknownTenant",
                Reason::RateLimited => "RateLimited",
                Reason::Internal => "ProviderError",
            },
        }
    }
}

/// A client pinned to one provider.
#[derive(Clone, Debug)]
pub struct AuthClient {
    url: String,
    host: String,
    port: u16,
    fingerprint: String,
}

impl AuthClient {
    /// A client for `url` (`https://host[:port]`), accepting only the certificate with
    /// `fingerprint`.
    pub fn new(url: &str, fingerprint: &str) -> Result<Self, ClientError> {
        let invalid = |problem| ClientError::InvalidUrl {
            url: url.to_owned(),
            problem,
        };
        let rest = url
            .strip_prefix("https://")
            .ok_or_else(|| invalid("it must start with https://"))?;
        let authority = rest.trim_end_matches('/');
        if authority.is_empty() || authority.contains('/') {
            return Err(invalid("it must be https://HOST[:PORT] without a path"));
        }
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) if !h.ends_with(']') || h.starts_with('[') => (
                h.trim_start_matches('[').trim_end_matches(']').to_owned(),
                p.parse().map_err(|_| invalid("its port is not a number"))?,
            ),
            _ => (authority.to_owned(), 443),
        };
        Ok(Self {
            url: format!("https://{authority}"),
            host,
            port,
            fingerprint: fingerprint.to_owned(),
        })
    }

    /// The URL, for messages.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// `GET /v1/identity`.
    pub async fn identity(&self) -> Result<IdentityResponse, ClientError> {
        self.call::<(), _>(Method::GET, "/v1/identity", None).await
    }

    /// `POST /v1/nonces`.
    pub async fn nonce(&self, consumer: &str) -> Result<NonceResponse, ClientError> {
        let body = NonceRequest {
            cluster_id: consumer.to_owned(),
        };
        self.call(Method::POST, "/v1/nonces", Some(&body)).await
    }

    /// `POST /v1/identities`.
    pub async fn issue(&self, req: &IdentityRequest) -> Result<IssuedIdentity, ClientError> {
        self.call(Method::POST, "/v1/identities", Some(req)).await
    }

    /// `POST /v1/revocations`.
    pub async fn revoke(&self, req: &RevocationRequest) -> Result<(), ClientError> {
        self.call::<_, serde_json::Value>(Method::POST, "/v1/revocations", Some(req))
            .await
            .map(drop)
    }

    async fn call<B: Serialize, R: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
    ) -> Result<R, ClientError> {
        let verifier = Arc::new(PinnedVerifier::new(&self.fingerprint));
        let exchange = self.exchange(method, path, body, verifier.clone());
        let (status, headers, bytes) = match tokio::time::timeout(REQUEST_TIMEOUT, exchange).await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => {
                // A failed handshake after a mismatching certificate is the mismatch.
                if let Some(got) = verifier.seen().filter(|g| g != &self.fingerprint) {
                    return Err(ClientError::FingerprintMismatch {
                        url: self.url.clone(),
                        expected: self.fingerprint.clone(),
                        got,
                    });
                }
                return Err(e);
            }
            Err(_) => {
                return Err(ClientError::Timeout {
                    url: self.url.clone(),
                });
            }
        };
        if status.is_success() {
            return serde_json::from_slice(&bytes).map_err(|e| ClientError::Protocol {
                url: self.url.clone(),
                detail: format!("unexpected answer to {path}: {e}"),
            });
        }
        let retry_after = headers
            .get(http::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok());
        match serde_json::from_slice::<ErrorBody>(&bytes) {
            Ok(e) => Err(ClientError::Refused {
                reason: Reason::parse(&e.reason).unwrap_or(Reason::Internal),
                message: e.message,
                retry_after,
            }),
            Err(_) => Err(ClientError::Protocol {
                url: self.url.clone(),
                detail: format!(
                    "{path} answered {status} without an error body; is {} a Tether \
                     authentication service?",
                    self.url
                ),
            }),
        }
    }

    async fn exchange<B: Serialize>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
        verifier: Arc<PinnedVerifier>,
    ) -> Result<(StatusCode, http::HeaderMap, Bytes), ClientError> {
        let protocol = |detail: String| ClientError::Protocol {
            url: self.url.clone(),
            detail,
        };
        let tcp = TcpStream::connect((self.host.as_str(), self.port))
            .await
            .map_err(|source| ClientError::Unreachable {
                url: self.url.clone(),
                source,
            })?;
        let config = rustls::ClientConfig::builder_with_provider(super::tls::provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| protocol(e.to_string()))?
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_no_client_auth();
        // The name only feeds SNI; trust comes from the pinned fingerprint.
        let name =
            rustls::pki_types::ServerName::try_from(self.host.clone()).unwrap_or_else(|_| {
                rustls::pki_types::ServerName::try_from("tether-auth").expect("static name")
            });
        let tls = TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await
            .map_err(|e| protocol(format!("TLS handshake: {e}")))?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
                .await
                .map_err(|e| protocol(format!("HTTP handshake: {e}")))?;
        let driver = tokio::spawn(conn);
        let payload = match body {
            Some(b) => Bytes::from(serde_json::to_vec(b).map_err(|e| protocol(e.to_string()))?),
            None => Bytes::new(),
        };
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header(http::header::HOST, format!("{}:{}", self.host, self.port))
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(http::header::ACCEPT, "application/json")
            .body(Full::new(payload))
            .map_err(|e| protocol(e.to_string()))?;
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| protocol(format!("request: {e}")))?;
        let status = resp.status();
        let headers = resp.headers().clone();
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| protocol(format!("reading the answer: {e}")))?
            .to_bytes();
        driver.abort();
        Ok((status, headers, bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_parsed_or_refused_with_the_reason() {
        let c = AuthClient::new("https://198.51.100.7:8443/", "sha256:x").expect("url");
        assert_eq!(
            (c.host.as_str(), c.port, c.url()),
            ("198.51.100.7", 8443, "https://198.51.100.7:8443")
        );
        let c = AuthClient::new("https://auth.example", "sha256:x").expect("url");
        assert_eq!((c.host.as_str(), c.port), ("auth.example", 443));
        for (bad, why) in [
            ("http://x:1", "https://"),
            ("https://x:1/path", "without a path"),
            ("https://x:port", "port"),
        ] {
            let e = AuthClient::new(bad, "f").expect_err(bad).to_string();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }
}
