//! X25519 keys: a private key that never prints, public keys in WireGuard's base64 form.

use std::fmt;
use std::str::FromStr;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use boringtun::x25519;

/// Why a key string was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// Not base64 at all.
    #[error("not valid base64 (expected 32 bytes, as printed by `wg genkey` / `wg pubkey`)")]
    Encoding(#[source] base64::DecodeError),
    /// Decoded to a length other than 32 bytes.
    #[error("not valid base64 (expected 32 bytes, this decodes to {0})")]
    Length(usize),
    /// All zeroes: not a usable key.
    #[error("is all zeroes")]
    Zero,
}

fn decode32(s: &str) -> Result<[u8; 32], KeyError> {
    let bytes = STANDARD.decode(s.trim()).map_err(KeyError::Encoding)?;
    let arr: [u8; 32] = bytes
        .as_slice()
        .try_into()
        .map_err(|_| KeyError::Length(bytes.len()))?;
    if arr == [0; 32] {
        return Err(KeyError::Zero);
    }
    Ok(arr)
}

/// An X25519 private key. `Debug` and `Display` print `<redacted>`; only [`PrivateKey::public`]
/// leaves the type.
#[derive(Clone)]
pub struct PrivateKey(x25519::StaticSecret);

impl PrivateKey {
    /// A fresh random key from the OS RNG.
    pub fn generate() -> Self {
        let mut bytes = [0u8; 32];
        rand::fill(&mut bytes);
        Self(x25519::StaticSecret::from(bytes))
    }

    /// The matching public key.
    pub fn public(&self) -> PublicKey {
        PublicKey(x25519::PublicKey::from(&self.0))
    }

    /// The key in base64, for writing a key file. Deliberately not `Display`.
    pub fn to_base64(&self) -> String {
        STANDARD.encode(self.0.to_bytes())
    }

    pub(crate) fn secret(&self) -> &x25519::StaticSecret {
        &self.0
    }
}

impl FromStr for PrivateKey {
    type Err = KeyError;
    fn from_str(s: &str) -> Result<Self, KeyError> {
        decode32(s).map(|b| Self(x25519::StaticSecret::from(b)))
    }
}

impl fmt::Debug for PrivateKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PrivateKey(<redacted>)")
    }
}

/// An X25519 public key; `Display` is WireGuard's base64 form.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PublicKey(x25519::PublicKey);

impl PublicKey {
    /// The raw 32 bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        self.0.as_bytes()
    }

    pub(crate) fn inner(&self) -> x25519::PublicKey {
        self.0
    }
}

impl From<[u8; 32]> for PublicKey {
    fn from(b: [u8; 32]) -> Self {
        Self(x25519::PublicKey::from(b))
    }
}

impl FromStr for PublicKey {
    type Err = KeyError;
    fn from_str(s: &str) -> Result<Self, KeyError> {
        decode32(s).map(Self::from)
    }
}

impl fmt::Display for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&STANDARD.encode(self.0.as_bytes()))
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_key_never_prints() {
        let k = PrivateKey::generate();
        let shown = format!("{k:?}");
        assert_eq!(shown, "PrivateKey(<redacted>)");
        assert!(!shown.contains(&k.to_base64()));
    }

    #[test]
    fn base64_round_trip() {
        let k = PrivateKey::generate();
        let again: PrivateKey = k.to_base64().parse().expect("own encoding parses");
        assert_eq!(k.public(), again.public());
        let p: PublicKey = k.public().to_string().parse().expect("public parses");
        assert_eq!(p, k.public());
    }

    #[test]
    fn bad_keys_are_explained() {
        assert!(matches!(
            "not base64!".parse::<PublicKey>(),
            Err(KeyError::Encoding(_))
        ));
        assert_eq!("AAAA".parse::<PublicKey>(), Err(KeyError::Length(3)));
        let zero = STANDARD.encode([0u8; 32]);
        assert_eq!(zero.parse::<PublicKey>(), Err(KeyError::Zero));
    }
}
