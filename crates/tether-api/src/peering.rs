//! Peering tokens and certificate fingerprints: the formats the CLI and the controller share.
//!
//! A peering token is `<provider cluster ID>.<token ID>.<secret>`. The provider stores only a
//! hash of it, in a Secret named after the token ID; the token ID is public (it names the
//! Secret and appears in `tether token list`), the secret is not.

use std::fmt;

use crate::ClusterId;

/// Length of a token ID.
pub const TOKEN_ID_LEN: usize = 6;
/// Length of a token's secret part (lower-case letters and digits: about 165 bits).
pub const TOKEN_SECRET_LEN: usize = 32;
/// Prefix of the Secret that stores a token's hash.
pub const TOKEN_SECRET_PREFIX: &str = "tether-token-";
/// Key of the hash in a token Secret.
pub const TOKEN_HASH_KEY: &str = "tokenHash";
/// Key of the token in a consumer-side token Secret (`spec.provider.tokenSecretRef`).
pub const TOKEN_KEY: &str = "token";
/// Prefix of the consumer-side Secret that holds a provider's token until the first identity
/// is issued.
pub const CONSUMER_TOKEN_SECRET_PREFIX: &str = "tether-peering-token-";

const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";

/// Why a string is not a peering token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "malformed peering token: {0}; a token looks like `<cluster-id>.<6 characters>.<32 \
     characters>`, as printed by `tether generate peer-command` on the provider"
)]
pub struct InvalidToken(&'static str);

/// A parsed peering token. `Debug` and `Display` never show the secret part.
#[derive(Clone, PartialEq, Eq)]
pub struct PeeringToken {
    provider: ClusterId,
    id: String,
    secret: String,
}

impl PeeringToken {
    /// A fresh random token for `provider`.
    pub fn generate(provider: ClusterId) -> Self {
        Self {
            provider,
            id: random(TOKEN_ID_LEN),
            secret: random(TOKEN_SECRET_LEN),
        }
    }

    /// Parses the printed form.
    pub fn parse(s: &str) -> Result<Self, InvalidToken> {
        let mut parts = s.trim().split('.');
        let (Some(cluster), Some(id), Some(secret), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(InvalidToken(
                "it does not have three parts separated by '.'",
            ));
        };
        let provider =
            ClusterId::new(cluster).map_err(|_| InvalidToken("its cluster ID part is invalid"))?;
        if id.len() != TOKEN_ID_LEN || !id.bytes().all(|b| ALPHABET.contains(&b)) {
            return Err(InvalidToken(
                "its ID part is not 6 lower-case letters or digits",
            ));
        }
        if secret.len() != TOKEN_SECRET_LEN || !secret.bytes().all(|b| ALPHABET.contains(&b)) {
            return Err(InvalidToken(
                "its secret part is not 32 lower-case letters or digits",
            ));
        }
        Ok(Self {
            provider,
            id: id.to_owned(),
            secret: secret.to_owned(),
        })
    }

    /// The provider that issued the token.
    pub fn provider(&self) -> &ClusterId {
        &self.provider
    }

    /// The public token ID.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The name of the provider's Secret storing this token's hash.
    pub fn secret_name(&self) -> String {
        token_secret_name(&self.id)
    }

    /// The hash the provider stores: hex SHA-256 over a domain tag, the ID and the secret.
    pub fn hash(&self) -> String {
        let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
        ctx.update(b"tether-peering-token-v1\0");
        ctx.update(self.id.as_bytes());
        ctx.update(b"\0");
        ctx.update(self.secret.as_bytes());
        hex(ctx.finish().as_ref())
    }

    /// Whether `stored` (a hash from a token Secret) matches this token, in constant time.
    pub fn matches(&self, stored: &str) -> bool {
        // Comparing hashes leaks little through timing, but the fold costs nothing.
        let ours = self.hash();
        let theirs = stored.trim().as_bytes();
        ours.len() == theirs.len()
            && ours
                .bytes()
                .zip(theirs)
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0
    }

    /// The printed form, secret included. Use only to show the token to its owner.
    pub fn expose(&self) -> String {
        format!("{}.{}.{}", self.provider, self.id, self.secret)
    }
}

impl fmt::Debug for PeeringToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PeeringToken({}.{}.<redacted>)", self.provider, self.id)
    }
}

impl fmt::Display for PeeringToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// The Secret name for token `id`.
pub fn token_secret_name(id: &str) -> String {
    format!("{TOKEN_SECRET_PREFIX}{id}")
}

/// The consumer-side Secret (in `tether-system`) holding `token`, named by the
/// ForeignCluster's `spec.provider.tokenSecretRef`. The name includes the token ID, so peering
/// again with a new token changes the ForeignCluster's spec and the controller retries at once.
pub fn consumer_token_secret_name(token: &PeeringToken) -> String {
    format!(
        "{CONSUMER_TOKEN_SECRET_PREFIX}{}-{}",
        token.provider, token.id
    )
}

/// The provider's Secret for `token`: only its hash, its expiry (whole seconds, RFC 3339) and
/// an optional description, labelled so the controller and `tether token list` find it.
pub fn token_secret(
    token: &PeeringToken,
    expires: k8s_openapi::jiff::Timestamp,
    description: Option<&str>,
) -> k8s_openapi::api::core::v1::Secret {
    use std::collections::BTreeMap;

    use crate::names::{SYSTEM_NAMESPACE, annotations, labels};
    let whole = k8s_openapi::jiff::Timestamp::from_second(expires.as_second()).unwrap_or(expires);
    let mut notes = BTreeMap::from([(annotations::TOKEN_EXPIRES.to_owned(), whole.to_string())]);
    if let Some(d) = description.filter(|d| !d.is_empty()) {
        notes.insert(annotations::TOKEN_DESCRIPTION.to_owned(), d.to_owned());
    }
    let mut secret_labels = BTreeMap::from([(labels::PEERING_TOKEN.to_owned(), "true".to_owned())]);
    secret_labels.insert(
        labels::PART_OF.to_owned(),
        labels::MANAGED_BY_VALUE.to_owned(),
    );
    k8s_openapi::api::core::v1::Secret {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some(token.secret_name()),
            namespace: Some(SYSTEM_NAMESPACE.to_owned()),
            labels: Some(secret_labels),
            annotations: Some(notes),
            ..Default::default()
        },
        type_: Some("Opaque".to_owned()),
        data: Some(BTreeMap::from([(
            TOKEN_HASH_KEY.to_owned(),
            k8s_openapi::ByteString(token.hash().into_bytes()),
        )])),
        ..Default::default()
    }
}

/// `sha256:<hex>` of a DER certificate, as `--ca-fingerprint` expects it.
pub fn fingerprint(der: &[u8]) -> String {
    format!(
        "sha256:{}",
        hex(ring::digest::digest(&ring::digest::SHA256, der).as_ref())
    )
}

/// Checks the form of a fingerprint given by a user, normalising upper-case hex and colons
/// (`openssl x509 -fingerprint` style) to the canonical form.
pub fn normalize_fingerprint(s: &str) -> Result<String, String> {
    let rest = s.trim().strip_prefix("sha256:").ok_or_else(|| {
        format!("certificate fingerprint {s:?} must start with `sha256:` followed by 64 hex digits")
    })?;
    let hexdigits: String = rest
        .chars()
        .filter(|c| *c != ':')
        .map(|c| c.to_ascii_lowercase())
        .collect();
    if hexdigits.len() != 64 || !hexdigits.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(format!(
            "certificate fingerprint {s:?} must be `sha256:` followed by 64 hex digits"
        ));
    }
    Ok(format!("sha256:{hexdigits}"))
}

fn random(len: usize) -> String {
    use rand::Rng;
    let mut rng = rand::rng();
    (0..len)
        .map(|_| char::from(ALPHABET[rng.random_range(0..ALPHABET.len())]))
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    use fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn provider() -> ClusterId {
        ClusterId::new("prov-1").expect("valid")
    }

    #[test]
    fn a_generated_token_round_trips_and_matches_only_its_hash() {
        let t = PeeringToken::generate(provider());
        let parsed = PeeringToken::parse(&t.expose()).expect("round trip");
        assert_eq!(parsed, t);
        assert!(parsed.matches(&t.hash()));
        let other = PeeringToken::generate(provider());
        assert!(!other.matches(&t.hash()));
        assert_eq!(t.secret_name(), format!("tether-token-{}", t.id()));
        assert_eq!(
            consumer_token_secret_name(&t),
            format!("tether-peering-token-prov-1-{}", t.id())
        );
    }

    #[test]
    fn debug_and_display_hide_the_secret() {
        let t =
            PeeringToken::parse("prov-1.abc123.0123456789abcdefghijklmnopqrstuv").expect("valid");
        for shown in [format!("{t:?}"), t.to_string()] {
            assert!(!shown.contains("0123456789abcdef"), "{shown}");
            assert!(shown.contains("prov-1.abc123"), "{shown}");
        }
    }

    #[test]
    fn malformed_tokens_say_what_is_wrong() {
        let cases = [
            ("nonsense", "three parts"),
            (
                "Bad_Id.abc123.0123456789abcdefghijklmnopqrstuv",
                "cluster ID part",
            ),
            ("p.ABC123.0123456789abcdefghijklmnopqrstuv", "ID part"),
            ("p.abc123.short", "secret part"),
            ("p.abc123.0123456789abcdefghijklmnopqrstuv.x", "three parts"),
        ];
        for (input, needle) in cases {
            let err = PeeringToken::parse(input).expect_err(input).to_string();
            assert!(err.contains(needle), "{input}: {err}");
            assert!(err.contains("tether generate peer-command"), "{err}");
        }
    }

    #[test]
    fn the_hash_is_stable() {
        let t =
            PeeringToken::parse("prov-1.abc123.0123456789abcdefghijklmnopqrstuv").expect("valid");
        expect_test::expect!["3ebd6ca5c73af8415779c7bd2c8bc938ee290d3a8cf59dd0d9263fdee30bf416"]
            .assert_eq(&t.hash());
    }

    #[test]
    fn fingerprints_normalise_case_and_colons() {
        let fp = fingerprint(b"certificate");
        assert!(fp.starts_with("sha256:") && fp.len() == 71, "{fp}");
        let upper_colons = {
            let hexpart = fp.trim_start_matches("sha256:").to_ascii_uppercase();
            let pairs: Vec<String> = hexpart
                .as_bytes()
                .chunks(2)
                .map(|c| String::from_utf8_lossy(c).into_owned())
                .collect();
            format!("sha256:{}", pairs.join(":"))
        };
        assert_eq!(
            normalize_fingerprint(&upper_colons).as_deref(),
            Ok(fp.as_str())
        );
        assert!(normalize_fingerprint("md5:abcd").is_err());
        assert!(normalize_fingerprint("sha256:abcd").is_err());
    }
}
