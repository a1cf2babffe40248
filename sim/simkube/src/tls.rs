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
pub const DEFAULT_SIGNING_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);
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
    #[error("certificate generation failed")]
    Generate(#[from] rcgen::Error),
    /// The CSR could not be parsed, its signature did not verify, or it asks for something the
    /// signer refuses; the message says which.
    #[error("invalid certificate signing request: {0}")]
    InvalidCsr(String),
    /// A certificate or key in PEM form could not be read.
    #[error("invalid PEM input: {0}")]
    Pem(String),
    /// The PEM text could not be read.
    #[error("reading {what}")]
    PemRead {
        /// The block that was being read.
        what: String,
        /// The reader's error.
        #[source]
        source: std::io::Error,
    },
    /// The CSR's PEM, DER or signature is broken.
    #[error(
        "could not parse or verify the PEM CERTIFICATE REQUEST; send a PKCS#10 request signed by the key it names"
    )]
    UnreadableCsr(#[source] rcgen::Error),
    /// The CSR's DER does not parse.
    #[error("could not parse the certificate signing request")]
    MalformedCsr(#[source] x509_parser::nom::Err<x509_parser::error::X509Error>),
    /// rustls refused the configuration.
    #[error("TLS configuration rejected")]
    Config(#[from] rustls::Error),
    /// The client-certificate verifier could not be built from the CA.
    #[error("client certificate verifier")]
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
        // The real subject (with every group) is written by `with_subject` below.
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
        let der = with_subject(cert.der(), &subject_name(user, groups), &self.issuer)?;
        Ok((pem_certificate(&der), key.serialize_pem()))
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
        signing_duration: Duration,
    ) -> Result<String, TlsError> {
        let request =
            CertificateSigningRequestParams::from_pem(csr_pem).map_err(TlsError::UnreadableCsr)?;
        let (raw_subject, raw_spki) = {
            use x509_parser::prelude::FromDer as _;
            let der = first_pem_der(csr_pem, "CERTIFICATE REQUEST")?;
            let (_, parsed) =
                x509_parser::certification_request::X509CertificationRequest::from_der(&der)
                    .map_err(TlsError::MalformedCsr)?;
            let info = &parsed.certification_request_info;
            (
                info.subject.as_raw().to_vec(),
                info.subject_pki.raw.to_vec(),
            )
        };
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
            Some(s) => Duration::from_secs(u64::from(s)).min(signing_duration),
            None => signing_duration,
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
        // rcgen keeps one value per attribute type; copy the requested subject verbatim so
        // every O (group) survives.
        let der = with_subject_and_key(cert.der(), &raw_subject, Some(&raw_spki), &self.issuer)?;
        Ok(pem_certificate(&der))
    }
}

/// DER length octets.
fn der_length(len: usize) -> Vec<u8> {
    if len < 0x80 {
        return vec![u8::try_from(len).expect("invariant: checked < 0x80")];
    }
    let bytes: Vec<u8> = len
        .to_be_bytes()
        .into_iter()
        .skip_while(|b| *b == 0)
        .collect();
    let mut out = vec![0x80 | u8::try_from(bytes.len()).expect("invariant: usize has <= 8 bytes")];
    out.extend(bytes);
    out
}

/// A DER element with `tag` around `content`.
fn der(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    out.extend(der_length(content.len()));
    out.extend_from_slice(content);
    out
}

/// (header length, total length) of the DER element at the start of `data`.
fn der_element(data: &[u8]) -> Option<(usize, usize)> {
    let first = *data.get(1)?;
    let (header, len) = if first < 0x80 {
        (2, usize::from(first))
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 {
            return None;
        }
        let len = data
            .get(2..2 + n)?
            .iter()
            .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
        (2 + n, len)
    };
    let total = header.checked_add(len)?;
    (total <= data.len()).then_some((header, total))
}

/// The DER `Name` kube-apiserver reads identities from: one O attribute per group (rcgen keeps
/// only one value per attribute type, so the subject is encoded here), then the CN.
fn subject_name(common_name: &str, organizations: &[String]) -> Vec<u8> {
    const OID_ORGANIZATION: [u8; 5] = [0x06, 0x03, 0x55, 0x04, 0x0a];
    const OID_COMMON_NAME: [u8; 5] = [0x06, 0x03, 0x55, 0x04, 0x03];
    let rdn = |oid: &[u8], value: &str| {
        let mut attribute = oid.to_vec();
        attribute.extend(der(0x0c, value.as_bytes()));
        der(0x31, &der(0x30, &attribute))
    };
    let mut rdns = Vec::new();
    for organization in organizations {
        rdns.extend(rdn(&OID_ORGANIZATION, organization));
    }
    rdns.extend(rdn(&OID_COMMON_NAME, common_name));
    der(0x30, &rdns)
}

/// Replaces the subject of a certificate issued by `issuer` and signs it again.
fn with_subject(
    cert_der: &[u8],
    subject: &[u8],
    issuer: &Issuer<'static, KeyPair>,
) -> Result<Vec<u8>, TlsError> {
    with_subject_and_key(cert_der, subject, None, issuer)
}

/// Like [`with_subject`], also replacing the SubjectPublicKeyInfo (which follows the subject)
/// with the verbatim one from a CSR: rcgen infers the key type from the CSR's signature
/// algorithm, which is wrong for, e.g., a P-384 key signed with ecdsa-with-SHA256.
fn with_subject_and_key(
    cert_der: &[u8],
    subject: &[u8],
    spki: Option<&[u8]>,
    issuer: &Issuer<'static, KeyPair>,
) -> Result<Vec<u8>, TlsError> {
    // TBSCertificate: [0] version, serial, signature, issuer, validity, subject, spki, ...
    resign_with_subject(cert_der, subject, spki, issuer.key(), |fields| {
        if fields.first().is_some_and(|f| f.first() == Some(&0xa0)) {
            5
        } else {
            4
        }
    })
}

/// Replaces the field at `subject_index(fields)` of the signed part of a DER certificate or
/// PKCS#10 request (both are SEQUENCE { signed info, algorithm, BIT STRING signature }) and
/// signs it again with `key`.
fn resign_with_subject(
    outer_der: &[u8],
    subject: &[u8],
    spki: Option<&[u8]>,
    key: &KeyPair,
    subject_index: impl Fn(&[&[u8]]) -> usize,
) -> Result<Vec<u8>, TlsError> {
    let malformed = || TlsError::Pem("internal: could not re-encode an issued certificate".into());
    let (outer_header, _) = der_element(outer_der).ok_or_else(malformed)?;
    let body = &outer_der[outer_header..];
    let (info_header, info_total) = der_element(body).ok_or_else(malformed)?;
    let info = &body[info_header..info_total];
    let rest = &body[info_total..];
    let mut fields = Vec::new();
    let mut at = 0;
    while at < info.len() {
        let (_, total) = der_element(&info[at..]).ok_or_else(malformed)?;
        fields.push(&info[at..at + total]);
        at += total;
    }
    let index = subject_index(&fields);
    if fields.len() <= index + usize::from(spki.is_some()) {
        return Err(malformed());
    }
    let mut new_info = Vec::new();
    for (i, field) in fields.iter().enumerate() {
        let replacement = match spki {
            _ if i == index => subject,
            Some(spki) if i == index + 1 => spki,
            _ => field,
        };
        new_info.extend_from_slice(replacement);
    }
    let new_info = der(0x30, &new_info);
    // The algorithm is unchanged; the new signature covers the new content.
    let (_, alg_total) = der_element(rest).ok_or_else(malformed)?;
    let algorithm = &rest[..alg_total];
    let signature = rcgen::SigningKey::sign(key, &new_info)?;
    let mut bits = vec![0u8];
    bits.extend(signature);
    let mut content = new_info;
    content.extend_from_slice(algorithm);
    content.extend(der(0x03, &bits));
    Ok(der(0x30, &content))
}

/// A PKCS#10 certificate signing request for a client identity: CN = `common_name` and one O
/// per entry of `organizations` (groups), as kube-apiserver reads them. Returns (CSR PEM, PKCS#8
/// key PEM). Use it to ask another cluster's `kubernetes.io/kube-apiserver-client` signer for an
/// identity.
pub fn client_csr(
    common_name: &str,
    organizations: &[String],
) -> Result<(String, String), TlsError> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    let csr = params.serialize_request(&key)?;
    // CertificationRequestInfo: version, subject, subjectPKInfo, [0] attributes.
    let der = resign_with_subject(
        csr.der(),
        &subject_name(common_name, organizations),
        None,
        &key,
        |_| 1,
    )?;
    Ok((pem_block("CERTIFICATE REQUEST", &der), key.serialize_pem()))
}

fn pem_certificate(der_bytes: &[u8]) -> String {
    pem_block("CERTIFICATE", der_bytes)
}

fn pem_block(label: &str, der_bytes: &[u8]) -> String {
    let encoded = base64::engine::general_purpose::STANDARD.encode(der_bytes);
    let mut out = format!("-----BEGIN {label}-----\n");
    for chunk in encoded.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(chunk).expect("invariant: base64 is ASCII"));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
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
        Ok(Some(rustls_pemfile::Item::Csr(der))) => Ok(der.to_vec()),
        Ok(_) => Err(TlsError::Pem(format!("no {what} block found"))),
        Err(source) => Err(TlsError::PemRead {
            what: what.to_owned(),
            source,
        }),
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

#[cfg(test)]
mod tests {
    use x509_parser::extensions::ParsedExtension;

    use super::*;

    fn parse(
        pem: &str,
    ) -> (
        String,
        Vec<String>,
        x509_parser::time::ASN1Time,
        x509_parser::time::ASN1Time,
        bool,
        bool,
        bool,
    ) {
        let der = first_pem_der(pem, "CERTIFICATE").expect("pem");
        let (_, cert) = x509_parser::parse_x509_certificate(&der).expect("der");
        let cn = cert
            .subject()
            .iter_common_name()
            .next()
            .expect("cn")
            .as_str()
            .expect("utf8")
            .to_owned();
        let orgs = cert
            .subject()
            .iter_organization()
            .map(|o| o.as_str().expect("utf8").to_owned())
            .collect();
        let mut client = false;
        let mut server = false;
        let mut digital = false;
        for ext in cert.extensions() {
            match ext.parsed_extension() {
                ParsedExtension::ExtendedKeyUsage(eku) => {
                    client = eku.client_auth;
                    server = eku.server_auth;
                }
                ParsedExtension::KeyUsage(ku) => digital = ku.digital_signature(),
                _ => {}
            }
        }
        (
            cn,
            orgs,
            cert.validity().not_before,
            cert.validity().not_after,
            client,
            server,
            digital,
        )
    }

    fn csr(cn: &str, orgs: &[&str], sans: Vec<String>) -> String {
        let key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::new(sans).expect("params");
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, cn);
        for o in orgs {
            params.distinguished_name.push(DnType::OrganizationName, *o);
        }
        params
            .serialize_request(&key)
            .expect("csr")
            .pem()
            .expect("pem")
    }

    fn now() -> i64 {
        i64::try_from(unix_now().as_secs()).expect("time")
    }

    #[test]
    fn client_certificates_carry_user_and_groups() {
        let ca = CertAuthority::generate("c1").expect("ca");
        let groups = vec!["tenants".to_owned(), "consumers".to_owned()];
        let (cert, key) = ca
            .issue_client_cert("alice", &groups, Duration::from_secs(3600))
            .expect("cert");
        assert!(key.contains("PRIVATE KEY"));
        let (cn, orgs, _, not_after, client, server, _) = parse(&cert);
        assert_eq!((cn.as_str(), orgs), ("alice", groups));
        assert!(client && !server);
        assert!((not_after.timestamp() - now() - 3600).abs() < 5);
        let der = first_pem_der(&cert, "CERTIFICATE").expect("der");
        assert_eq!(
            ClientIdentity::from_der(&der),
            Some(ClientIdentity {
                common_name: "alice".into(),
                organizations: vec!["tenants".into(), "consumers".into()]
            })
        );
        let debug = format!("{ca:?}");
        assert!(
            debug.contains("<redacted>") && !debug.contains("PRIVATE"),
            "{debug}"
        );
    }

    #[test]
    fn csr_signing_follows_the_client_signer() {
        let ca = CertAuthority::generate("c1").expect("ca");
        let usages: Vec<String> = ["digital signature", "key encipherment", "client auth"]
            .map(String::from)
            .to_vec();
        let signed = ca
            .sign_csr(
                &csr("bob", &["org-a"], vec![]),
                &usages,
                Some(1800),
                DEFAULT_SIGNING_DURATION,
            )
            .expect("signed");
        let (cn, orgs, not_before, not_after, client, server, digital) = parse(&signed);
        assert_eq!((cn.as_str(), orgs), ("bob", vec!["org-a".to_owned()]));
        assert!(client && !server && digital);
        assert!((not_after.timestamp() - now() - 1800).abs() < 5);
        assert!(not_before.timestamp() <= now() - 290, "backdated");
        // Every group of a multi-O request survives signing.
        let groups = vec!["tether:consumers".to_owned(), "tenant-a".to_owned()];
        let (request, key) = client_csr("cluster-a", &groups).expect("csr");
        assert!(key.contains("PRIVATE KEY"));
        let signed = ca
            .sign_csr(&request, &usages, None, DEFAULT_SIGNING_DURATION)
            .expect("signed");
        assert_eq!(parse(&signed).1, groups);
        // Without an expiration: the one-year signing duration.
        let year = ca
            .sign_csr(
                &csr("bob", &[], vec![]),
                &usages,
                None,
                DEFAULT_SIGNING_DURATION,
            )
            .expect("signed");
        assert!((parse(&year).3.timestamp() - now() - 365 * 24 * 3600).abs() < 5);
        // The signed certificate chains to the CA: rustls' verifier accepts it.
        let roots = {
            let mut r = rustls::RootCertStore::empty();
            r.add(ca.ca_der().clone()).expect("root");
            Arc::new(r)
        };
        let verifier =
            rustls::server::WebPkiClientVerifier::builder_with_provider(roots, crypto_provider())
                .build()
                .expect("verifier");
        let leaf = CertificateDer::from(first_pem_der(&signed, "CERTIFICATE").expect("der"));
        verifier
            .verify_client_cert(&leaf, &[], rustls::pki_types::UnixTime::now())
            .expect("chains to the CA");
        let other = CertAuthority::generate("c2").expect("ca");
        let foreign = other
            .sign_csr(
                &csr("mallory", &[], vec![]),
                &usages,
                None,
                DEFAULT_SIGNING_DURATION,
            )
            .expect("signed");
        let foreign = CertificateDer::from(first_pem_der(&foreign, "CERTIFICATE").expect("der"));
        assert!(
            verifier
                .verify_client_cert(&foreign, &[], rustls::pki_types::UnixTime::now())
                .is_err()
        );
    }

    /// Requests made by OpenSSL (`openssl req -new -subj "/O=tenants/O=consumers/CN=cluster-b"`
    /// with an RSA-2048 key, and `-subj "/O=g1/CN=u384"` with a P-384 key signed with
    /// ecdsa-with-SHA256), as other tools send them.
    const OPENSSL_RSA_CSR: &str = "-----BEGIN CERTIFICATE REQUEST-----\n\
MIICfzCCAWcCAQAwOjEQMA4GA1UECgwHdGVuYW50czESMBAGA1UECgwJY29uc3Vt\n\
ZXJzMRIwEAYDVQQDDAljbHVzdGVyLWIwggEiMA0GCSqGSIb3DQEBAQUAA4IBDwAw\n\
ggEKAoIBAQDDQk0lVKZSENISEkLf99RGds4ajwlCKPo2NGrCXX+lJEpqGjEe1b5V\n\
Uct0RtBblJVTqsMQG82OvF1H+X4pbyaV8324yc2a+96izgI4eT25y41ID307xupB\n\
k+hrrK4TciIh0f3ar9+v2/suIj0LbjshMs/mQ8q2WmSuY7vmyCcf2o1xGO3HbfAu\n\
vM1Dv8fDem3A0vk68tsC1+jR+rX7iVSRxamZtOjMufpRrRJ3nzZbKRV6LvQehnwA\n\
leZk0VM15I8uzEcIyEkQmIY+9+8adX+JwuUcq+mw9/S1r0c4eWA9LIEndv1e3Md/\n\
so/93BvRfUmwgtmzDmWnkP9Vi27lQBUdAgMBAAGgADANBgkqhkiG9w0BAQsFAAOC\n\
AQEAaJ9Q13Tzr3HWWBQwH0XmHB4rwyB6QeYMRkk5JV8pL1Q84HIv/jcfcrWMdl2w\n\
JL2+sM0+KkEnUxVIQ3oIB1F4zT9sJyR4VGNmIPt5krYPZhi3GFIQURZbg3Ooi1ZG\n\
NUyPqvRsDWiJ0qjYZiuWghuxtvYYdXEX2m8sKsXuakBt4wKpcAiVqhllltmOtvBh\n\
RsV0G+jk0titgPpUiCObzYwvt3HQEain4GX/2tUto9VBKsujSYIrFVH3w5pHNG3C\n\
4RX5McQbyupfiECsRBla6z/GwIOl5+5FndzWlkgD1k/so8nG201vQ4TlbqCgImbA\n\
rCRIdm0LdGxJHSDde1/sNOS9dw==\n\
-----END CERTIFICATE REQUEST-----\n";
    const OPENSSL_P384_CSR: &str = "-----BEGIN CERTIFICATE REQUEST-----\n\
MIIBFDCBmwIBADAcMQswCQYDVQQKDAJnMTENMAsGA1UEAwwEdTM4NDB2MBAGByqG\n\
SM49AgEGBSuBBAAiA2IABM4zypnj+LVJ7TZf67VRmnFebeCurw2d1Tkhvx9Hrsih\n\
mRdNLo+O4qOmZGUwVsGVk+p0ZnL6hnamVO8/NA6zbNacnaQGb4FEuunZmLw/2iil\n\
BN/sR3VGI9V9UTGRRnfXHaAAMAoGCCqGSM49BAMCA2gAMGUCMQDU/0SWyA6SQjhV\n\
xELotFCQQi0fcbKIzJ/soT/fQCw2eNM9SvBxBes/VPhGuQ+JQe0CMBToJAq4t+4M\n\
g8PZcTu0Ww26LihTXj7Vx8Vg7/1SGjzyoPgOCNc39T5885GWGzJVog==\n\
-----END CERTIFICATE REQUEST-----\n";

    #[test]
    fn csrs_from_other_tools_keep_their_subject_and_key() {
        use x509_parser::prelude::FromDer as _;
        let ca = CertAuthority::generate("c1").expect("ca");
        let usages = vec!["client auth".to_owned(), "key encipherment".to_owned()];
        let roots = {
            let mut r = rustls::RootCertStore::empty();
            r.add(ca.ca_der().clone()).expect("root");
            Arc::new(r)
        };
        let verifier =
            rustls::server::WebPkiClientVerifier::builder_with_provider(roots, crypto_provider())
                .build()
                .expect("verifier");
        for (pem, cn, orgs) in [
            (OPENSSL_RSA_CSR, "cluster-b", vec!["tenants", "consumers"]),
            (OPENSSL_P384_CSR, "u384", vec!["g1"]),
        ] {
            let signed = ca
                .sign_csr(pem, &usages, Some(3600), DEFAULT_SIGNING_DURATION)
                .expect("signed");
            let (got_cn, got_orgs, ..) = parse(&signed);
            assert_eq!(
                (got_cn.as_str(), got_orgs),
                (cn, orgs.iter().map(|o| o.to_string()).collect())
            );
            let csr_der = first_pem_der(pem, "CERTIFICATE REQUEST").expect("csr");
            let (_, csr) =
                x509_parser::certification_request::X509CertificationRequest::from_der(&csr_der)
                    .expect("csr");
            let cert_der = first_pem_der(&signed, "CERTIFICATE").expect("der");
            let (_, cert) = x509_parser::parse_x509_certificate(&cert_der).expect("cert");
            assert_eq!(
                cert.public_key().raw,
                csr.certification_request_info.subject_pki.raw
            );
            verifier
                .verify_client_cert(
                    &CertificateDer::from(cert_der.clone()),
                    &[],
                    rustls::pki_types::UnixTime::now(),
                )
                .expect("chains to the CA");
        }
    }

    #[test]
    fn csr_signing_refusals() {
        let ca = CertAuthority::generate("c1").expect("ca");
        let client = vec!["client auth".to_owned()];
        let cases: Vec<(String, Vec<String>, Option<u32>, &str)> = vec![
            (
                csr("a", &[], vec![]),
                vec!["digital signature".into()],
                None,
                "must include \"client auth\"",
            ),
            (
                csr("a", &[], vec![]),
                vec!["client auth".into(), "server auth".into()],
                None,
                "\"server auth\" is not allowed",
            ),
            (
                csr("a", &[], vec!["a.example".into()]),
                client.clone(),
                None,
                "subjectAltNames are not allowed",
            ),
            (csr("", &[], vec![]), client.clone(), None, "common name"),
            (
                csr("a", &[], vec![]),
                client.clone(),
                Some(599),
                "less than 600 seconds",
            ),
            (
                "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n"
                    .into(),
                client,
                None,
                "could not parse",
            ),
        ];
        for (pem, usages, expiration, want) in cases {
            let error = ca
                .sign_csr(&pem, &usages, expiration, DEFAULT_SIGNING_DURATION)
                .expect_err(want)
                .to_string();
            assert!(error.contains(want), "{error} should mention {want}");
        }
    }

    #[test]
    fn server_certificates_and_config() {
        let ca = CertAuthority::generate("c1").expect("ca");
        let (cert, _) = ca
            .issue_server_cert(&["api.c1.test".into(), "198.18.0.1".into()])
            .expect("cert");
        let der = first_pem_der(&cert, "CERTIFICATE").expect("der");
        let (_, parsed) = x509_parser::parse_x509_certificate(&der).expect("parse");
        let sans = parsed
            .subject_alternative_name()
            .expect("ext")
            .expect("present")
            .value;
        let names: Vec<String> = sans.general_names.iter().map(|n| n.to_string()).collect();
        for want in [
            "DNSName(api.c1.test)",
            "DNSName(localhost)",
            "DNSName(kubernetes.default.svc)",
        ] {
            assert!(names.iter().any(|n| n == want), "{want} in {names:?}");
        }
        assert!(
            names.iter().any(|n| n == "IPAddress(c6:12:00:01)"),
            "198.18.0.1 in {names:?}"
        );
        assert!(
            names.iter().any(|n| n == "IPAddress(7f:00:00:01)"),
            "127.0.0.1 in {names:?}"
        );
        let config = server_config(&ca, &["api.c1.test".into()]).expect("config");
        assert_eq!(
            config.alpn_protocols,
            vec![b"h2".to_vec(), b"http/1.1".to_vec()]
        );
    }

    #[test]
    fn kubeconfigs_parse_as_kubeconfig() {
        let ca = CertAuthority::generate("c1").expect("ca");
        let text = kubeconfig("c1", "https://127.0.0.1:6443", Some(&ca.ca_pem()), "tok");
        let parsed: kube::config::Kubeconfig = serde_yaml::from_str(&text).expect("kubeconfig");
        assert_eq!(parsed.current_context.as_deref(), Some("c1"));
        let cluster = parsed.clusters[0].cluster.as_ref().expect("cluster");
        assert_eq!(cluster.server.as_deref(), Some("https://127.0.0.1:6443"));
        let ca_data = cluster
            .certificate_authority_data
            .as_deref()
            .expect("ca data");
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(ca_data)
            .expect("b64");
        assert_eq!(String::from_utf8(decoded).expect("utf8"), ca.ca_pem());
        assert!(
            parsed.auth_infos[0]
                .auth_info
                .as_ref()
                .expect("user")
                .token
                .is_some()
        );
        let raw: serde_json::Value = serde_yaml::from_str(&text).expect("yaml");
        assert_eq!(raw["users"][0]["user"]["token"], "tok");
        assert_eq!(
            raw["contexts"][0]["context"]["user"],
            raw["users"][0]["name"]
        );
        let (cert, key) = ca
            .issue_client_cert("u", &[], Duration::from_secs(60))
            .expect("cert");
        let text = kubeconfig_with_client_cert(
            "c1",
            "https://127.0.0.1:6443",
            &ca.ca_pem(),
            &cert,
            &key,
            "u",
        );
        let parsed: kube::config::Kubeconfig = serde_yaml::from_str(&text).expect("kubeconfig");
        assert_eq!(parsed.auth_infos[0].name, "u");
        assert!(
            parsed.auth_infos[0]
                .auth_info
                .as_ref()
                .expect("user")
                .client_certificate_data
                .is_some()
        );
        let plain = kubeconfig("c1", "http://127.0.0.1:8080", None, "tok");
        assert!(!plain.contains("certificate-authority-data"));
    }
}
