//! The authentication protocol between a consumer and its provider: wire messages, the bytes a
//! consumer signs, stateless nonces, and the error body. Pure: time is passed in.
//!
//! ```text
//! consumer                                   provider (HTTPS, certificate pinned by fingerprint)
//!   GET  /v1/identity            ──────────► { clusterID, publicKey }
//!   POST /v1/nonces {clusterID}  ──────────► { nonce, expiresAt }        (HMAC-sealed, 60 s)
//!   POST /v1/identities {clusterID, publicKey, nonce, csr, token?,
//!        signature = Ed25519(payload(nonce, consumer, provider, sha256(csr)))}
//!                                ──────────► { certificate, caData, apiServerURL, namespace, ... }
//!   POST /v1/revocations {clusterID, nonce, signature} ──► {}
//! ```
//!
//! A first `identities` request needs a peering token; later ones (renewals) are authorised by
//! the signature alone, checked against the public key the Tenant recorded the first time.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64URL;
use serde::{Deserialize, Serialize};

/// How long a nonce stays valid.
pub const NONCE_TTL_SECS: i64 = 60;

/// `GET /v1/identity`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IdentityResponse {
    /// The provider's cluster ID.
    #[serde(rename = "clusterID")]
    pub cluster_id: String,
    /// The provider's Ed25519 public key, base64.
    pub public_key: String,
}

/// `POST /v1/nonces`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NonceRequest {
    /// The consumer asking.
    #[serde(rename = "clusterID")]
    pub cluster_id: String,
}

/// The answer to [`NonceRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NonceResponse {
    /// The nonce to sign.
    pub nonce: String,
    /// Unix seconds after which the provider refuses it.
    pub expires_at: i64,
}

/// `POST /v1/identities`: issue (or renew) the consumer's identity.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IdentityRequest {
    /// The consumer.
    #[serde(rename = "clusterID")]
    pub cluster_id: String,
    /// The consumer's Ed25519 public key, base64.
    pub public_key: String,
    /// A nonce from `/v1/nonces`.
    pub nonce: String,
    /// PKCS#10 request (PEM) for the client certificate; its key never leaves the consumer.
    pub csr: String,
    /// Base64 Ed25519 signature of [`identity_payload`].
    pub signature: String,
    /// The peering token; required unless the provider already has a Tenant with this key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
}

impl std::fmt::Debug for IdentityRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdentityRequest")
            .field("cluster_id", &self.cluster_id)
            .field("public_key", &self.public_key)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .finish_non_exhaustive()
    }
}

/// The answer to [`IdentityRequest`]: everything a kubeconfig needs except the private key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IssuedIdentity {
    /// The provider's cluster ID.
    #[serde(rename = "providerClusterID")]
    pub provider_cluster_id: String,
    /// The provider's API server.
    #[serde(rename = "apiServerURL")]
    pub api_server_url: String,
    /// PEM bundle of the CAs that sign the provider API server's certificate.
    pub ca_data: String,
    /// The issued client certificate (PEM).
    pub certificate: String,
    /// The tenant namespace the identity is confined to.
    pub namespace: String,
    /// The identity's Kubernetes username.
    pub username: String,
    /// Unix seconds when the certificate expires.
    pub expires_at: i64,
}

/// `POST /v1/revocations`: the consumer ends its peering.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RevocationRequest {
    /// The consumer.
    #[serde(rename = "clusterID")]
    pub cluster_id: String,
    /// A nonce from `/v1/nonces`.
    pub nonce: String,
    /// Base64 Ed25519 signature of [`revocation_payload`].
    pub signature: String,
}

/// Every error answer: a stable machine reason and a message for humans.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// A stable reason, one of [`Reason`]'s strings.
    pub reason: String,
    /// What went wrong and what to do.
    pub message: String,
}

/// Why the provider refused a request. Each maps to an HTTP status and a ForeignCluster
/// condition reason on the consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// The body is malformed (400).
    BadRequest,
    /// The token is missing, unknown, wrong, expired or revoked (401).
    TokenRejected,
    /// The nonce is forged, for another cluster, or expired (401).
    NonceRejected,
    /// The signature does not verify (401).
    SignatureRejected,
    /// The CSR asks for something other than the consumer's identity (400).
    CsrRejected,
    /// Consumer and provider have the same cluster ID, or the ID is taken by another key (409).
    ClusterIdConflict,
    /// The consumer is not a tenant (404, revocations).
    UnknownTenant,
    /// Too many failures from this source (429).
    RateLimited,
    /// Something failed inside the provider (500); retrying may help.
    Internal,
}

impl Reason {
    /// The stable wire string.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::BadRequest => "BadRequest",
            Self::TokenRejected => "TokenRejected",
            Self::NonceRejected => "NonceRejected",
            Self::SignatureRejected => "SignatureRejected",
            Self::CsrRejected => "CsrRejected",
            Self::ClusterIdConflict => "ClusterIDConflict",
            Self::UnknownTenant => "UnknownTenant",
            Self::RateLimited => "RateLimited",
            Self::Internal => "Internal",
        }
    }

    /// Parses the wire string.
    pub fn parse(s: &str) -> Option<Self> {
        [
            Self::BadRequest,
            Self::TokenRejected,
            Self::NonceRejected,
            Self::SignatureRejected,
            Self::CsrRejected,
            Self::ClusterIdConflict,
            Self::UnknownTenant,
            Self::RateLimited,
            Self::Internal,
        ]
        .into_iter()
        .find(|r| r.as_str() == s)
    }

    /// The HTTP status.
    pub fn http_status(self) -> u16 {
        match self {
            Self::BadRequest | Self::CsrRejected => 400,
            Self::TokenRejected | Self::NonceRejected | Self::SignatureRejected => 401,
            Self::UnknownTenant => 404,
            Self::ClusterIdConflict => 409,
            Self::RateLimited => 429,
            Self::Internal => 500,
        }
    }

    /// Whether the failure counts towards the per-source rate limit (guessing credentials).
    pub fn counts_as_failure(self) -> bool {
        matches!(
            self,
            Self::TokenRejected | Self::NonceRejected | Self::SignatureRejected
        )
    }

    /// A bounded label for metrics.
    pub fn metric_label(self) -> &'static str {
        match self {
            Self::BadRequest | Self::CsrRejected => "bad_request",
            Self::TokenRejected | Self::NonceRejected | Self::SignatureRejected => "unauthorized",
            Self::UnknownTenant => "unknown_tenant",
            Self::ClusterIdConflict => "conflict",
            Self::RateLimited => "rate_limited",
            Self::Internal => "error",
        }
    }
}

/// The bytes a consumer signs to obtain an identity: a domain tag and every value the
/// provider must bind together, so a signature cannot be replayed for another CSR, another
/// provider or another purpose.
pub fn identity_payload(nonce: &str, consumer: &str, provider: &str, csr_pem: &str) -> Vec<u8> {
    let csr_hash = ring::digest::digest(&ring::digest::SHA256, csr_pem.as_bytes());
    let mut out = b"tether-identity-v1\n".to_vec();
    for part in [nonce, consumer, provider] {
        out.extend_from_slice(part.as_bytes());
        out.push(b'\n');
    }
    out.extend_from_slice(B64URL.encode(csr_hash.as_ref()).as_bytes());
    out
}

/// The bytes a consumer signs to revoke its identity.
pub fn revocation_payload(nonce: &str, consumer: &str, provider: &str) -> Vec<u8> {
    format!("tether-revocation-v1\n{nonce}\n{consumer}\n{provider}").into_bytes()
}

/// Seals and opens stateless nonces with an HMAC key, so every replica of the provider's
/// authentication service accepts a nonce any replica issued.
pub struct NonceSealer {
    key: ring::hmac::Key,
}

impl NonceSealer {
    /// A sealer with a 32-byte key.
    pub fn new(key: &[u8; 32]) -> Self {
        Self {
            key: ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key),
        }
    }

    /// A nonce for `consumer`, valid until `now + NONCE_TTL_SECS`. `random` makes each one
    /// unique.
    pub fn issue(&self, consumer: &str, now: i64, random: [u8; 16]) -> NonceResponse {
        let expires_at = now + NONCE_TTL_SECS;
        let body = format!("{consumer}|{expires_at}|{}", B64URL.encode(random));
        let tag = ring::hmac::sign(&self.key, body.as_bytes());
        NonceResponse {
            nonce: format!("{}.{}", B64URL.encode(&body), B64URL.encode(tag.as_ref())),
            expires_at,
        }
    }

    /// Whether `nonce` was issued by a holder of this key for `consumer` and has not expired.
    pub fn verify(&self, nonce: &str, consumer: &str, now: i64) -> Result<(), &'static str> {
        let (body_b64, tag_b64) = nonce.split_once('.').ok_or("the nonce is malformed")?;
        let body = B64URL
            .decode(body_b64)
            .map_err(|_| "the nonce is malformed")?;
        let tag = B64URL
            .decode(tag_b64)
            .map_err(|_| "the nonce is malformed")?;
        ring::hmac::verify(&self.key, &body, &tag).map_err(|_| "the nonce was not issued here")?;
        let body = String::from_utf8(body).map_err(|_| "the nonce is malformed")?;
        let mut parts = body.split('|');
        let (Some(who), Some(expiry)) = (parts.next(), parts.next()) else {
            return Err("the nonce is malformed");
        };
        if who != consumer {
            return Err("the nonce was issued to another cluster");
        }
        let expiry: i64 = expiry.parse().map_err(|_| "the nonce is malformed")?;
        if now > expiry {
            return Err("the nonce has expired; ask for a new one");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn sealer(byte: u8) -> NonceSealer {
        NonceSealer::new(&[byte; 32])
    }

    #[test]
    fn a_nonce_is_valid_for_its_cluster_until_it_expires() {
        let s = sealer(1);
        let n = s.issue("c1", 1000, [7; 16]);
        assert_eq!(n.expires_at, 1060);
        assert_eq!(s.verify(&n.nonce, "c1", 1000), Ok(()));
        assert_eq!(s.verify(&n.nonce, "c1", 1060), Ok(()));
        assert_eq!(
            s.verify(&n.nonce, "c1", 1061),
            Err("the nonce has expired; ask for a new one")
        );
        assert_eq!(
            s.verify(&n.nonce, "c2", 1000),
            Err("the nonce was issued to another cluster")
        );
        assert_eq!(
            sealer(2).verify(&n.nonce, "c1", 1000),
            Err("the nonce was not issued here")
        );
        assert_eq!(
            s.verify("garbage", "c1", 1000),
            Err("the nonce is malformed")
        );
    }

    #[test]
    fn payloads_bind_every_value() {
        let base = identity_payload("n", "c1", "p1", "csr");
        assert_ne!(base, identity_payload("n2", "c1", "p1", "csr"));
        assert_ne!(base, identity_payload("n", "c2", "p1", "csr"));
        assert_ne!(base, identity_payload("n", "c1", "p2", "csr"));
        assert_ne!(base, identity_payload("n", "c1", "p1", "csr2"));
        assert_ne!(base, revocation_payload("n", "c1", "p1"));
        expect_test::expect![[r#"
            "tether-identity-v1\nn\nc1\np1\nwnM4xFMGe0N0ca-855JwTYFhEsYDG7mWtixpjqWZ74A"
        "#]]
        .assert_debug_eq(&String::from_utf8(base).expect("utf8"));
    }

    #[test]
    fn reasons_round_trip_and_map_to_statuses() {
        for r in [
            Reason::BadRequest,
            Reason::TokenRejected,
            Reason::NonceRejected,
            Reason::SignatureRejected,
            Reason::CsrRejected,
            Reason::ClusterIdConflict,
            Reason::UnknownTenant,
            Reason::RateLimited,
            Reason::Internal,
        ] {
            assert_eq!(Reason::parse(r.as_str()), Some(r));
            assert!((400..600).contains(&r.http_status()));
        }
        assert_eq!(Reason::parse("nope"), None);
    }

    #[test]
    fn debug_of_an_identity_request_hides_the_token() {
        let req = IdentityRequest {
            cluster_id: "c1".into(),
            public_key: "pk".into(),
            nonce: "n".into(),
            csr: "csr".into(),
            signature: "sig".into(),
            token: Some("p.abc123.secretsecretsecretsecretsecretse".into()),
        };
        let shown = format!("{req:?}");
        assert!(!shown.contains("secret"), "{shown}");
    }

    proptest! {
        #[test]
        fn tampering_with_any_byte_of_a_nonce_is_detected(pos in 0usize..200, flip in 1u8..=255) {
            let s = sealer(9);
            let n = s.issue("consumer-1", 50, [3; 16]).nonce;
            let mut bytes = n.into_bytes();
            let i = pos % bytes.len();
            bytes[i] ^= flip;
            if let Ok(tampered) = String::from_utf8(bytes) {
                prop_assert!(s.verify(&tampered, "consumer-1", 50).is_err());
            }
        }
    }
}
