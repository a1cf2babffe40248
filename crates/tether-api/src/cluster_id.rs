//! `ClusterId`: the validated name of a cluster, used in object names, labels and usernames.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The longest cluster ID. `tether-tenant-<id>` must stay a valid namespace name (63
/// characters), and the prefix takes 14.
pub const MAX_LEN: usize = 49;

/// The schema pattern of a cluster ID (a DNS-1123 label).
pub const PATTERN: &str = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";

/// Why a string is not a cluster ID.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid cluster ID {value:?}: {problem}; use 1-{MAX_LEN} lower-case letters, digits or '-', \
     starting and ending with a letter or digit (for example `west-1`)"
)]
pub struct InvalidClusterId {
    /// The rejected value.
    pub value: String,
    /// What is wrong with it.
    pub problem: &'static str,
}

/// A cluster's identity on the wire and in names: a DNS-1123 label of at most [`MAX_LEN`]
/// characters. Constructing one validates it, so every holder can build names from it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct ClusterId(String);

impl ClusterId {
    /// Validates `value` as a cluster ID.
    pub fn new(value: impl Into<String>) -> Result<Self, InvalidClusterId> {
        let value = value.into();
        match problem(&value) {
            Some(problem) => Err(InvalidClusterId { value, problem }),
            None => Ok(Self(value)),
        }
    }

    /// A fresh random ID (`cluster-` and ten lower-case letters and digits), for installs that
    /// were not given one.
    pub fn generate() -> Self {
        use rand::Rng;
        const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
        let mut rng = rand::rng();
        let suffix: String = (0..10)
            .map(|_| char::from(ALPHABET[rng.random_range(0..ALPHABET.len())]))
            .collect();
        Self(format!("cluster-{suffix}"))
    }

    /// The ID as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

fn problem(value: &str) -> Option<&'static str> {
    if value.is_empty() {
        Some("it is empty")
    } else if value.len() > MAX_LEN {
        Some("it is too long")
    } else if !value
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        Some("it contains a character other than a-z, 0-9 and '-'")
    } else if value.starts_with('-') || value.ends_with('-') {
        Some("it starts or ends with '-'")
    } else {
        None
    }
}

impl fmt::Display for ClusterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for ClusterId {
    type Err = InvalidClusterId;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

impl AsRef<str> for ClusterId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl<'de> Deserialize<'de> for ClusterId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::new(s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn accepts_labels_and_names_the_problem_otherwise() {
        for ok in ["a", "c1", "west-2", "0abc", &"x".repeat(MAX_LEN)] {
            assert!(ClusterId::new(ok).is_ok(), "{ok}");
        }
        let cases = [
            ("", "it is empty"),
            (
                "Upper",
                "it contains a character other than a-z, 0-9 and '-'",
            ),
            ("a.b", "it contains a character other than a-z, 0-9 and '-'"),
            ("-a", "it starts or ends with '-'"),
            ("a-", "it starts or ends with '-'"),
        ];
        for (bad, why) in cases {
            let err = ClusterId::new(bad).expect_err(bad);
            assert_eq!(err.problem, why, "{bad}");
        }
        let long = ClusterId::new("x".repeat(MAX_LEN + 1)).expect_err("too long");
        assert!(long.to_string().contains("1-49"), "{long}");
    }

    #[test]
    fn deserializing_validates() {
        assert!(serde_json::from_str::<ClusterId>("\"ok-1\"").is_ok());
        let err = serde_json::from_str::<ClusterId>("\"NO\"").expect_err("invalid");
        assert!(
            err.to_string().contains("invalid cluster ID \"NO\""),
            "{err}"
        );
    }

    proptest! {
        #[test]
        fn generated_ids_are_valid(_seed in 0u8..16) {
            let id = ClusterId::generate();
            prop_assert!(ClusterId::new(id.as_str()).is_ok());
            prop_assert!(id.as_str().starts_with("cluster-"));
        }

        #[test]
        fn the_validator_agrees_with_the_schema_pattern(s in "[a-z0-9.A-Z-]{0,52}") {
            let by_pattern = !s.is_empty()
                && s.len() <= MAX_LEN
                && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !s.starts_with('-')
                && !s.ends_with('-');
            prop_assert_eq!(ClusterId::new(s).is_ok(), by_pattern);
        }
    }
}
