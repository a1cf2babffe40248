//! The cluster's identity: its ID and an Ed25519 key pair, created once in a Secret and never
//! overwritten. Consumers sign provider nonces with it; providers verify with the public key.

use std::collections::BTreeMap;
use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, PostParams};
use ring::signature::{self, Ed25519KeyPair, KeyPair as _};
use tether_api::ClusterId;
use tether_api::names::{identity_secret, labels, objects};

use crate::Error;

/// An Ed25519 key pair. `Debug` never prints the private key.
pub struct Keys {
    pair: Ed25519KeyPair,
    pkcs8: Vec<u8>,
}

impl Keys {
    /// A fresh key pair.
    pub fn generate() -> Result<Self, Error> {
        let rng = ring::rand::SystemRandom::new();
        let doc = Ed25519KeyPair::generate_pkcs8(&rng)
            .map_err(|_| Error::Crypto("generating an Ed25519 key pair"))?;
        Self::from_pkcs8(doc.as_ref())
    }

    /// A key pair from its PKCS#8 document.
    pub fn from_pkcs8(pkcs8: &[u8]) -> Result<Self, Error> {
        let pair = Ed25519KeyPair::from_pkcs8(pkcs8)
            .map_err(|_| Error::Crypto("reading the Ed25519 key pair (PKCS#8)"))?;
        Ok(Self {
            pair,
            pkcs8: pkcs8.to_vec(),
        })
    }

    /// The public key, base64.
    pub fn public_key_b64(&self) -> String {
        B64.encode(self.pair.public_key().as_ref())
    }

    /// Signs `message`; the signature is base64.
    pub fn sign_b64(&self, message: &[u8]) -> String {
        B64.encode(self.pair.sign(message).as_ref())
    }

    /// A key derived from the private key for `purpose` (for example the HMAC key of stateless
    /// nonces), so that every replica holding the identity derives the same one.
    pub fn derive(&self, purpose: &str) -> [u8; 32] {
        let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
        ctx.update(b"tether-derive-v1\0");
        ctx.update(purpose.as_bytes());
        ctx.update(b"\0");
        ctx.update(&self.pkcs8);
        let mut out = [0u8; 32];
        out.copy_from_slice(ctx.finish().as_ref());
        out
    }
}

impl fmt::Debug for Keys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Keys(public {}, private <redacted>)",
            self.public_key_b64()
        )
    }
}

/// Verifies a base64 Ed25519 `signature` of `message` by base64 `public_key`.
pub fn verify_b64(public_key: &str, message: &[u8], signature: &str) -> bool {
    let (Ok(key), Ok(sig)) = (B64.decode(public_key), B64.decode(signature)) else {
        return false;
    };
    key.len() == 32
        && signature::UnparsedPublicKey::new(&signature::ED25519, key)
            .verify(message, &sig)
            .is_ok()
}

/// Whether `s` is a base64 Ed25519 public key.
pub fn is_public_key(s: &str) -> bool {
    B64.decode(s).is_ok_and(|k| k.len() == 32)
}

/// The cluster ID and its key pair.
#[derive(Debug)]
pub struct Identity {
    /// This cluster's ID.
    pub cluster_id: ClusterId,
    /// Its key pair.
    pub keys: Keys,
}

impl Identity {
    /// Loads the identity Secret from `namespace`, creating it on first start. An existing
    /// Secret is never overwritten: when it names another cluster ID the controller refuses to
    /// start, because peers know this cluster by the key it holds.
    pub async fn load_or_create(
        client: kube::Client,
        namespace: &str,
        cluster_id: ClusterId,
    ) -> Result<Self, Error> {
        let api: Api<Secret> = Api::namespaced(client, namespace);
        for _ in 0..3 {
            if let Some(secret) =
                api.get_opt(objects::IDENTITY_SECRET)
                    .await
                    .map_err(Error::kube(format!(
                        "reading Secret {namespace}/{}",
                        objects::IDENTITY_SECRET
                    )))?
            {
                return Self::from_secret(&secret, namespace, cluster_id);
            }
            let keys = Keys::generate()?;
            let secret = identity_secret(&cluster_id, &keys);
            match api.create(&PostParams::default(), &secret).await {
                Ok(_) => {
                    tracing::info!(cluster_id = %cluster_id, public_key = %keys.public_key_b64(),
                        "created the cluster identity");
                    return Ok(Self { cluster_id, keys });
                }
                // Another replica created it first: read theirs.
                Err(kube::Error::Api(e)) if e.code == 409 => continue,
                Err(e) => {
                    return Err(Error::kube(format!(
                        "creating Secret {namespace}/{}",
                        objects::IDENTITY_SECRET
                    ))(e));
                }
            }
        }
        Err(Error::Invalid(format!(
            "Secret {namespace}/{} kept changing while it was read",
            objects::IDENTITY_SECRET
        )))
    }

    fn from_secret(secret: &Secret, namespace: &str, expected: ClusterId) -> Result<Self, Error> {
        let data = secret.data.clone().unwrap_or_default();
        let field = |key: &str| {
            data.get(key).map(|b| b.0.clone()).ok_or_else(|| {
                Error::Invalid(format!(
                    "Secret {namespace}/{} lacks the key {key}; delete it only if this cluster \
                     has no peers, and restart the controller to create a new identity",
                    objects::IDENTITY_SECRET
                ))
            })
        };
        let stored = String::from_utf8_lossy(&field(identity_secret::CLUSTER_ID)?).into_owned();
        if stored != expected.as_str() {
            return Err(Error::Invalid(format!(
                "this cluster's identity (Secret {namespace}/{}) belongs to cluster ID {stored:?}, \
                 but the controller was started as {expected:?}; reinstall with \
                 `--cluster-id {stored}` or uninstall Tether first",
                objects::IDENTITY_SECRET
            )));
        }
        let keys = Keys::from_pkcs8(&field(identity_secret::PRIVATE_KEY)?)?;
        Ok(Self {
            cluster_id: expected,
            keys,
        })
    }
}

fn identity_secret(cluster_id: &ClusterId, keys: &Keys) -> Secret {
    let data = BTreeMap::from([
        (
            identity_secret::CLUSTER_ID.to_owned(),
            ByteString(cluster_id.as_str().as_bytes().to_vec()),
        ),
        (
            identity_secret::PRIVATE_KEY.to_owned(),
            ByteString(keys.pkcs8.clone()),
        ),
        (
            identity_secret::PUBLIC_KEY.to_owned(),
            ByteString(keys.public_key_b64().into_bytes()),
        ),
    ]);
    Secret {
        metadata: ObjectMeta {
            name: Some(objects::IDENTITY_SECRET.to_owned()),
            labels: Some(labels::managed()),
            ..Default::default()
        },
        immutable: Some(true),
        data: Some(data),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_verify_only_for_the_signed_message_and_key() {
        let a = Keys::generate().expect("keys");
        let b = Keys::generate().expect("keys");
        let sig = a.sign_b64(b"nonce-1");
        assert!(verify_b64(&a.public_key_b64(), b"nonce-1", &sig));
        assert!(!verify_b64(&a.public_key_b64(), b"nonce-2", &sig));
        assert!(!verify_b64(&b.public_key_b64(), b"nonce-1", &sig));
        assert!(!verify_b64("not base64!", b"nonce-1", &sig));
        assert!(!verify_b64(&a.public_key_b64(), b"nonce-1", "AAAA"));
        assert!(is_public_key(&a.public_key_b64()));
        assert!(!is_public_key("AAAA"));
    }

    #[test]
    fn keys_round_trip_through_pkcs8_and_debug_hides_the_private_key() {
        let a = Keys::generate().expect("keys");
        let b = Keys::from_pkcs8(&a.pkcs8).expect("reload");
        assert_eq!(a.public_key_b64(), b.public_key_b64());
        assert_eq!(a.derive("nonce"), b.derive("nonce"));
        assert_ne!(a.derive("nonce"), a.derive("other"));
        let shown = format!("{a:?}");
        assert!(
            shown.contains("<redacted>") && !shown.contains(&B64.encode(&a.pkcs8)),
            "{shown}"
        );
    }

    #[test]
    fn a_secret_of_another_cluster_is_refused_with_what_to_do() {
        let keys = Keys::generate().expect("keys");
        let secret = identity_secret(&ClusterId::new("east").expect("id"), &keys);
        let err = Identity::from_secret(
            &secret,
            "tether-system",
            ClusterId::new("west").expect("id"),
        )
        .expect_err("mismatch");
        let msg = err.to_string();
        assert!(
            msg.contains("\"east\"") && msg.contains("--cluster-id east"),
            "{msg}"
        );
        let ok = Identity::from_secret(
            &secret,
            "tether-system",
            ClusterId::new("east").expect("id"),
        )
        .expect("match");
        assert_eq!(ok.keys.public_key_b64(), keys.public_key_b64());
    }
}
