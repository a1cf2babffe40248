//! TLS for a simulated cluster: its certificate authority, serving certificates, client
//! certificates (the identity kube-apiserver reads from CN and O), the CSR signer, the HTTPS
//! server loop and kubeconfig rendering.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, DnType, DnValue,
    ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio_util::sync::CancellationToken;

/// How long the CA stays valid; long enough that no test or playground outlives it.
const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// Serving certificates, as kubeadm issues them.
const SERVER_CERT_VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);
/// The kube-controller-manager default `--cluster-signing-duration` (8760h).
const MAX_SIGNING_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);
/// The minimum `spec.expirationSeconds` a CSR may ask for.
const MIN_CSR_EXPIRATION_SECONDS: u32 = 600;
/// Certificates are backdated like the Kubernetes signer does, to absorb clock skew.
const BACKDATE: Duration = Duration::from_secs(5 * 60);
/// How long in-flight connections get to finish after shutdown before they are dropped.
const DRAIN_GRACE: Duration = Duration::from_secs(2);

/// Errors from certificate handling and TLS setup.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// Key generation, certificate encoding or signing failed.
    #[error("certificate generation failed: {0}")]
    Generate(#[from] rcgen::Error),
    /// The CSR could not be parsed, its signature did not verify, or it asks for something the
    /// signer refuses; the message says which.
    #[error("invalid certificate signing request: {0}")]
    InvalidCsr(String),
    /// A certificate or key in PEM form could not be read.
    #[error("invalid PEM input: {0}")]
    Pem(String),
    /// rustls refused the configuration.
    #[error("TLS configuration rejected: {0}")]
    Config(#[from] rustls::Error),
    /// The client-certificate verifier could not be built from the CA.
    #[error("client certificate verifier: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
}

/// A cluster's self-signed certificate authority. It signs the serving certificate, client
/// certificates and CSRs for the `kubernetes.io/kube-apiserver-client` signer.
pub struct CertAuthority {
    cert_pem: String,
    cert_der: CertificateDer<'static>,
    issuer: Issuer<'static, KeyPair>,
}

impl fmt::Debug for CertAuthority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertAuthority")
            .field("cert_pem", &format_args!("<{} bytes>", self.cert_pem.len()))
            .field("key", &"<redacted>")
            .finish()
    }
}

fn unix_now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
}

/// Sets `not_before`/`not_after` from a duration since the Unix epoch, without naming the `time`
/// crate rcgen uses: its `OffsetDateTime` adds `std::time::Duration`.
fn set_validity(params: &mut CertificateParams, from_unix: Duration, until_unix: Duration) {
    let epoch = rcgen::date_time_ymd(1970, 1, 1);
    params.not_before = epoch + from_unix;
    params.not_after = epoch + until_unix;
}

fn random_serial() -> rcgen::SerialNumber {
    let mut bytes: [u8; 16] = rand::random();
    // A positive INTEGER: clear the top bit so DER needs no sign padding surprises.
    bytes[0] &= 0x7f;
    rcgen::SerialNumber::from_slice(&bytes)
}

impl CertAuthority {
    /// Generates a fresh CA (ECDSA P-256) named after the cluster.
    pub fn generate(cluster_name: &str) -> Result<CertAuthority, TlsError> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, format!("{cluster_name}-ca"));
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
        ];
        params.serial_number = Some(random_serial());
        let now = unix_now();
        set_validity(&mut params, now.saturating_sub(BACKDATE), now + CA_VALIDITY);
        let cert = params.self_signed(&key)?;
        Ok(CertAuthority {
            cert_pem: cert.pem(),
            cert_der: cert.der().clone(),
            issuer: Issuer::new(params, key),
        })
    }

    /// The CA certificate in PEM form, as kubeconfigs and `kube-root-ca.crt` carry it.
    pub fn ca_pem(&self) -> String {
        self.cert_pem.clone()
    }

    /// The CA certificate in DER form.
    pub fn ca_der(&self) -> &CertificateDer<'static> {
        &self.cert_der
    }

    /// Issues a serving certificate valid for `hosts` plus `127.0.0.1`, `::1` and `localhost`,
    /// and the in-cluster service names. Returns (certificate PEM, PKCS#8 key PEM).
    pub fn issue_server_cert(&self, hosts: &[String]) -> Result<(String, String), TlsError> {
        let mut names: Vec<String> = hosts.to_vec();
        for extra in [
            "127.0.0.1",
            "::1",
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ] {
            if !names.iter().any(|n| n == extra) {
                names.push(extra.to_owned());
            }
        }
        let mut params = CertificateParams::new(names)?;
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        params.serial_number = Some(random_serial());
        let now = unix_now();
        set_validity(
            &mut params,
            now.saturating_sub(BACKDATE),
            now + SERVER_CERT_VALIDITY,
        );
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok((cert.pem(), key.serialize_pem()))
    }

    /// Issues a client certificate: CN = `user`, one O per group, EKU clientAuth. This is the
    /// identity kube-apiserver's x509 authenticator reads. Returns (certificate PEM, key PEM).
    pub fn issue_client_cert(
        &self,
        user: &str,
        groups: &[String],
        valid_for: Duration,
    ) -> Result<(String, String), TlsError> {
        let mut params = CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        for group in groups {
            params
                .distinguished_name
                .push(DnType::OrganizationName, group.as_str());
        }
        params.distinguished_name.push(DnType::CommonName, user);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.use_authority_key_identifier_extension = true;
        params.serial_number = Some(random_serial());
        let now = unix_now();
        set_validity(&mut params, now.saturating_sub(BACKDATE), now + valid_for);
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok((cert.pem(), key.serialize_pem()))
    }

    /// Signs a PEM CSR as the `kubernetes.io/kube-apiserver-client` signer does: the subject is
    /// copied from the request, requested extensions are ignored, usages come from the CSR
    /// object's `spec.usages` and must include `client auth` and otherwise only `digital
    /// signature` and `key encipherment`; subject alternative names are refused. The lifetime is
    /// `expiration_seconds` (at least 600) capped at one year and at the CA's own expiry.
    pub fn sign_csr(
        &self,
        csr_pem: &str,
        usages: &[String],
        expiration_seconds: Option<u32>,
    ) -> Result<String, TlsError> {
        let request = CertificateSigningRequestParams::from_pem(csr_pem).map_err(|e| {
            TlsError::InvalidCsr(format!(
                "could not parse or verify the PEM CERTIFICATE REQUEST ({e}); send a PKCS#10 request \
                 signed by the key it names"
            ))
        })?;
        let (key_usages, extended) = client_usages(usages)?;
        if !request.params.subject_alt_names.is_empty() {
            return Err(TlsError::InvalidCsr(
                "DNS, email, IP and URI subjectAltNames are not allowed for signer \
                 kubernetes.io/kube-apiserver-client"
                    .into(),
            ));
        }
        let has_cn = request
            .params
            .distinguished_name
            .iter()
            .any(|(ty, value)| *ty == DnType::CommonName && !dn_text(value).is_empty());
        if !has_cn {
            return Err(TlsError::InvalidCsr(
                "subject common name (the user name) must not be empty".into(),
            ));
        }
        let lifetime = match expiration_seconds {
            Some(s) if s < MIN_CSR_EXPIRATION_SECONDS => {
                return Err(TlsError::InvalidCsr(format!(
                    "spec.expirationSeconds: Invalid value: {s}: may not specify a duration less \
                     than 600 seconds (10 minutes)"
                )));
            }
            Some(s) => Duration::from_secs(u64::from(s)).min(MAX_SIGNING_DURATION),
            None => MAX_SIGNING_DURATION,
        };
        let mut params = CertificateParams::default();
        params.distinguished_name = request.params.distinguished_name.clone();
        params.key_usages = key_usages;
        params.extended_key_usages = extended;
        params.use_authority_key_identifier_extension = true;
        params.serial_number = Some(random_serial());
        let now = unix_now();
        set_validity(&mut params, now.saturating_sub(BACKDATE), now + lifetime);
        let signing = CertificateSigningRequestParams {
            params,
            public_key: request.public_key,
        };
        let cert = signing.signed_by(&self.issuer)?;
        Ok(cert.pem())
    }
}

fn dn_text(value: &DnValue) -> String {
    match value {
        DnValue::Utf8String(s) => s.clone(),
        DnValue::PrintableString(s) => s.as_str().to_owned(),
        DnValue::Ia5String(s) => s.as_str().to_owned(),
        // Other string types are legal but unusual for a CN; treat them as present.
        _ => "?".to_owned(),
    }
}

/// Maps CSR `spec.usages` to certificate extensions, enforcing the client signer's policy.
fn client_usages(
    usages: &[String],
) -> Result<(Vec<KeyUsagePurpose>, Vec<ExtendedKeyUsagePurpose>), TlsError> {
    let mut key_usages = Vec::new();
    let mut extended = Vec::new();
    for usage in usages {
        match usage.as_str() {
            "digital signature" => key_usages.push(KeyUsagePurpose::DigitalSignature),
            "key encipherment" => key_usages.push(KeyUsagePurpose::KeyEncipherment),
            "client auth" => extended.push(ExtendedKeyUsagePurpose::ClientAuth),
            other => {
                return Err(TlsError::InvalidCsr(format!(
                    "usage {other:?} is not allowed for signer \
                     kubernetes.io/kube-apiserver-client; allowed: \"digital signature\", \
                     \"key encipherment\", \"client auth\""
                )));
            }
        }
    }
    if extended.is_empty() {
        return Err(TlsError::InvalidCsr(
            "usages must include \"client auth\" for signer kubernetes.io/kube-apiserver-client"
                .into(),
        ));
    }
    key_usages.dedup();
    extended.dedup();
    Ok((key_usages, extended))
}

/// The identity a verified client certificate carries: kube-apiserver's x509 authenticator makes
/// the common name the user name and each organization a group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientIdentity {
    /// Subject CN.
    pub common_name: String,
    /// Subject O values, in certificate order.
    pub organizations: Vec<String>,
}

impl ClientIdentity {
    /// Reads CN and O from a DER certificate.
    pub fn from_der(der: &[u8]) -> Option<ClientIdentity> {
        let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
        let subject = cert.subject();
        let common_name = subject.iter_common_name().next()?.as_str().ok()?.to_owned();
        let organizations = subject
            .iter_organization()
            .filter_map(|o| o.as_str().ok().map(str::to_owned))
            .collect();
        Some(ClientIdentity {
            common_name,
            organizations,
        })
    }
}

fn first_pem_der(pem: &str, what: &str) -> Result<Vec<u8>, TlsError> {
    let mut reader = pem.as_bytes();
    match rustls_pemfile::read_one(&mut reader) {
        Ok(Some(rustls_pemfile::Item::X509Certificate(der))) => Ok(der.to_vec()),
        Ok(Some(rustls_pemfile::Item::Pkcs8Key(der))) => Ok(der.secret_pkcs8_der().to_vec()),
        Ok(_) => Err(TlsError::Pem(format!("no {what} block found"))),
        Err(e) => Err(TlsError::Pem(format!("reading {what}: {e}"))),
    }
}

fn crypto_provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A rustls server configuration presenting a certificate for `hosts` signed by `ca`. Client
/// certificates are optional but, when presented, must chain to `ca` (otherwise the handshake
/// fails, which a client sees as a TLS error rather than a 401). ALPN offers h2 and http/1.1 like
/// kube-apiserver.
pub fn server_config(
    ca: &CertAuthority,
    hosts: &[String],
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let (cert_pem, key_pem) = ca.issue_server_cert(hosts)?;
    let cert = CertificateDer::from(first_pem_der(&cert_pem, "CERTIFICATE")?);
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(first_pem_der(
        &key_pem,
        "PRIVATE KEY",
    )?));
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.ca_der().clone())?;
    let provider = crypto_provider();
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .allow_unauthenticated()
    .build()?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_single_cert(vec![cert, ca.ca_der().clone()], key)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Serves `router` over TLS on `listener` until `shutdown` fires. Each request of a connection
/// whose client presented a verified certificate carries a [`ClientIdentity`] extension. HTTP/1.1
/// upgrades (WebSocket) and HTTP/2 are supported. After shutdown, open connections get a short
/// grace period, then are dropped, so long watches do not hold the server up.
pub async fn serve_https(
    listener: tokio::net::TcpListener,
    router: axum::Router,
    config: Arc<rustls::ServerConfig>,
    shutdown: CancellationToken,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let accepted = tokio::select! {
            () = shutdown.cancelled() => break,
            // Reap finished connections so the set does not grow with the server's lifetime.
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            accepted = listener.accept() => accepted,
        };
        let (tcp, peer_addr) = match accepted {
            Ok(pair) => pair,
            Err(error) => {
                // Out of file descriptors and similar: back off instead of spinning.
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let acceptor = acceptor.clone();
        let router = router.clone();
        let shutdown = shutdown.clone();
        connections.spawn(async move {
            let handshake = tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp));
            let tls = match handshake.await {
                Ok(Ok(tls)) => tls,
                Ok(Err(error)) => {
                    tracing::debug!(%peer_addr, %error, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer_addr, "TLS handshake timed out");
                    return;
                }
            };
            let identity = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|chain| chain.first())
                .and_then(|leaf| ClientIdentity::from_der(leaf));
            serve_connection(tls, router, identity, shutdown).await;
        });
    }
    let drain = async { while connections.join_next().await.is_some() {} };
    if tokio::time::timeout(DRAIN_GRACE + Duration::from_secs(1), drain)
        .await
        .is_err()
    {
        tracing::debug!("connections still open after shutdown grace; dropping them");
        connections.abort_all();
    }
}

async fn serve_connection<S>(
    stream: S,
    router: axum::Router,
    identity: Option<ClientIdentity>,
    shutdown: CancellationToken,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    use tower::ServiceExt as _;
    let service =
        hyper::service::service_fn(move |mut request: http::Request<hyper::body::Incoming>| {
            if let Some(identity) = &identity {
                request.extensions_mut().insert(identity.clone());
            }
            router.clone().oneshot(request.map(axum::body::Body::new))
        });
    let builder =
        hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
    let connection =
        builder.serve_connection_with_upgrades(hyper_util::rt::TokioIo::new(stream), service);
    tokio::pin!(connection);
    tokio::select! {
        result = connection.as_mut() => {
            if let Err(error) = result {
                tracing::debug!(%error, "connection ended with an error");
            }
        }
        () = shutdown.cancelled() => {
            connection.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(DRAIN_GRACE, connection.as_mut()).await;
        }
    }
}

fn b64(text: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(text.as_bytes())
}

fn render_kubeconfig(
    cluster_name: &str,
    server_url: &str,
    ca_pem: Option<&str>,
    user_name: &str,
    user: serde_json::Value,
) -> String {
    let mut cluster = serde_json::json!({ "server": server_url });
    if let Some(ca) = ca_pem {
        cluster["certificate-authority-data"] = serde_json::Value::String(b64(ca));
    }
    let config = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{ "name": cluster_name, "cluster": cluster }],
        "users": [{ "name": user_name, "user": user }],
        "contexts": [{
            "name": cluster_name,
            "context": { "cluster": cluster_name, "user": user_name },
        }],
        "current-context": cluster_name,
        "preferences": {},
    });
    serde_yaml::to_string(&config).expect("invariant: a JSON value always renders as YAML")
}

/// A kubeconfig (YAML) for `server_url` authenticating with a bearer `token`, trusting `ca_pem`
/// when given. kubectl and `kube::Config::from_custom_kubeconfig` accept it.
pub fn kubeconfig(
    cluster_name: &str,
    server_url: &str,
    ca_pem: Option<&str>,
    token: &str,
) -> String {
    render_kubeconfig(
        cluster_name,
        server_url,
        ca_pem,
        &format!("{cluster_name}-user"),
        serde_json::json!({ "token": token }),
    )
}

/// A kubeconfig (YAML) authenticating with a client certificate and key (both PEM), under the
/// user entry named `user`.
pub fn kubeconfig_with_client_cert(
    cluster_name: &str,
    server_url: &str,
    ca_pem: &str,
    cert_pem: &str,
    key_pem: &str,
    user: &str,
) -> String {
    render_kubeconfig(
        cluster_name,
        server_url,
        Some(ca_pem),
        user,
        serde_json::json!({
            "client-certificate-data": b64(cert_pem),
            "client-key-data": b64(key_pem),
        }),
    )
}
