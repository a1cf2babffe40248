//! TLS of the authentication service: its self-signed certificate (created once in a Secret;
//! consumers pin its fingerprint, so no CA is involved) and the client-side verifier that
//! accepts exactly the pinned certificate.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, PostParams};
use rustls::DigitallySignedStruct;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use tether_api::ClusterId;
use tether_api::names::{labels, objects};
use tether_api::peering::fingerprint;

use crate::Error;

/// The authentication service's certificate and key.
#[derive(Clone)]
pub struct AuthCert {
    /// The certificate (DER).
    pub cert_der: Vec<u8>,
    key_der: Vec<u8>,
}

impl std::fmt::Debug for AuthCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AuthCert({}, key <redacted>)", self.fingerprint())
    }
}

impl AuthCert {
    /// A fresh self-signed certificate naming the cluster.
    pub fn generate(cluster_id: &ClusterId) -> Result<Self, Error> {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
            .map_err(Error::cert("generating the authentication service key"))?;
        let mut params = rcgen::CertificateParams::new(vec![format!(
            "{}.{}.svc",
            objects::AUTH_SERVICE,
            tether_api::names::SYSTEM_NAMESPACE
        )])
        .map_err(Error::cert("naming the authentication service certificate"))?;
        params.distinguished_name.push(
            rcgen::DnType::CommonName,
            format!("tether-auth {cluster_id}"),
        );
        // Pinning by fingerprint makes expiry meaningless for trust; a long validity keeps
        // strict TLS stacks from refusing the handshake.
        params.not_before = rcgen::date_time_ymd(2024, 1, 1);
        params.not_after = rcgen::date_time_ymd(2124, 1, 1);
        let cert = params.self_signed(&key).map_err(Error::cert(
            "self-signing the authentication service certificate",
        ))?;
        Ok(Self {
            cert_der: cert.der().to_vec(),
            key_der: key.serialize_der(),
        })
    }

    /// `sha256:<hex>` of the certificate.
    pub fn fingerprint(&self) -> String {
        fingerprint(&self.cert_der)
    }

    /// Loads the Secret, creating it on first start (another replica's is read if it won).
    pub async fn load_or_create(
        client: kube::Client,
        namespace: &str,
        cluster_id: &ClusterId,
    ) -> Result<Self, Error> {
        let api: Api<Secret> = Api::namespaced(client, namespace);
        let what = format!("Secret {namespace}/{}", objects::AUTH_TLS_SECRET);
        for _ in 0..3 {
            if let Some(s) = api
                .get_opt(objects::AUTH_TLS_SECRET)
                .await
                .map_err(Error::kube(format!("reading {what}")))?
            {
                return Self::from_secret(&s)
                    .ok_or_else(|| Error::Invalid(format!("{what} lacks tls.crt or tls.key")));
            }
            let fresh = Self::generate(cluster_id)?;
            match api.create(&PostParams::default(), &fresh.to_secret()).await {
                Ok(_) => return Ok(fresh),
                Err(kube::Error::Api(e)) if e.code == 409 => continue,
                Err(e) => return Err(Error::kube(format!("creating {what}"))(e)),
            }
        }
        Err(Error::Invalid(format!(
            "{what} kept changing while it was read"
        )))
    }

    fn to_secret(&self) -> Secret {
        Secret {
            metadata: ObjectMeta {
                name: Some(objects::AUTH_TLS_SECRET.to_owned()),
                labels: Some(labels::managed()),
                ..Default::default()
            },
            type_: Some("kubernetes.io/tls".to_owned()),
            immutable: Some(true),
            data: Some(BTreeMap::from([
                (
                    "tls.crt".to_owned(),
                    ByteString(pem("CERTIFICATE", &self.cert_der).into_bytes()),
                ),
                (
                    "tls.key".to_owned(),
                    ByteString(pem("PRIVATE KEY", &self.key_der).into_bytes()),
                ),
            ])),
            ..Default::default()
        }
    }

    fn from_secret(s: &Secret) -> Option<Self> {
        let data = s.data.as_ref()?;
        let cert = first_der(&data.get("tls.crt")?.0)?;
        let key = first_der(&data.get("tls.key")?.0)?;
        Some(Self {
            cert_der: cert,
            key_der: key,
        })
    }

    /// A rustls server configuration presenting this certificate.
    pub fn server_config(&self) -> Result<rustls::ServerConfig, Error> {
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key_der.clone()));
        rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::Invalid(format!("TLS versions: {e}")))?
            .with_no_client_auth()
            .with_single_cert(vec![CertificateDer::from(self.cert_der.clone())], key)
            .map_err(|e| Error::Invalid(format!("the authentication certificate is unusable: {e}")))
    }
}

fn first_der(pem_bytes: &[u8]) -> Option<Vec<u8>> {
    let mut reader = std::io::BufReader::new(pem_bytes);
    match rustls_pemfile::read_one(&mut reader).ok()?? {
        rustls_pemfile::Item::X509Certificate(d) => Some(d.to_vec()),
        rustls_pemfile::Item::Pkcs8Key(d) => Some(d.secret_pkcs8_der().to_vec()),
        _ => None,
    }
}

/// PEM encoding of `der` under `label`.
pub fn pem(label: &str, der: &[u8]) -> String {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(chunk).unwrap_or_default());
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

/// The one crypto provider (ring), as the workspace decided.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Accepts exactly the certificate whose fingerprint was pinned, whatever its names or
/// dates; the handshake signature is still verified, so the server must hold its key. The
/// fingerprint actually presented is remembered for the error message.
#[derive(Debug)]
pub struct PinnedVerifier {
    pinned: String,
    provider: Arc<CryptoProvider>,
    seen: Mutex<Option<String>>,
}

impl PinnedVerifier {
    /// A verifier pinned to `fingerprint` (`sha256:<hex>`).
    pub fn new(fingerprint: &str) -> Self {
        Self {
            pinned: fingerprint.to_owned(),
            provider: provider(),
            seen: Mutex::new(None),
        }
    }

    /// The fingerprint the server presented, if a handshake got that far.
    pub fn seen(&self) -> Option<String> {
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl ServerCertVerifier for PinnedVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let got = fingerprint(end_entity.as_ref());
        *self.seen.lock().unwrap_or_else(PoisonError::into_inner) = Some(got.clone());
        if got == self.pinned {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::General(format!(
                "certificate fingerprint {got} does not match the pinned {}",
                self.pinned
            )))
        }
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
            &self.provider.signature_verification_algorithms,
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
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_round_trips_the_certificate() {
        let c = AuthCert::generate(&ClusterId::new("p1").expect("id")).expect("cert");
        let back = AuthCert::from_secret(&c.to_secret()).expect("parse");
        assert_eq!(back.fingerprint(), c.fingerprint());
        assert!(c.server_config().is_ok());
        assert!(!format!("{c:?}").contains("PRIVATE"));
    }
}
