//! Query-string parsing as the apiserver tolerates it: empty pairs (kube-rs sends `?&limit=1`),
//! percent-encoding, `+` as space, repeated keys.

use crate::error::ApiError;

/// Decoded query parameters in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Query {
    pairs: Vec<(String, String)>,
}

fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                match std::str::from_utf8(&bytes[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl Query {
    /// Parses a raw query string (without the leading `?`).
    pub fn parse(raw: &str) -> Self {
        let pairs = raw
            .split('&')
            .filter(|p| !p.is_empty())
            .map(|p| {
                let (k, v) = p.split_once('=').unwrap_or((p, ""));
                (decode(k), decode(v))
            })
            .collect();
        Self { pairs }
    }

    /// The first value of a key.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.pairs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Every value of a key.
    pub fn all(&self, key: &str) -> Vec<&str> {
        self.pairs
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .collect()
    }

    /// A boolean flag as Go's `strconv.ParseBool` reads it; absent is false.
    pub fn flag(&self, key: &str) -> Result<bool, ApiError> {
        match self.get(key) {
            None | Some("") => Ok(false),
            Some("1" | "t" | "T" | "true" | "TRUE" | "True") => Ok(true),
            Some("0" | "f" | "F" | "false" | "FALSE" | "False") => Ok(false),
            Some(other) => Err(ApiError::bad_request(format!(
                "invalid value for {key}: strconv.ParseBool: parsing \"{other}\": invalid syntax"
            ))),
        }
    }

    /// A non-negative integer parameter.
    pub fn int(&self, key: &str) -> Result<Option<i64>, ApiError> {
        match self.get(key) {
            None | Some("") => Ok(None),
            Some(v) => v.parse::<i64>().map(Some).map_err(|_| {
                ApiError::bad_request(format!("invalid value for {key}: {v:?} is not an integer"))
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tolerates_empty_pairs_and_decodes() {
        let q = Query::parse(
            "&limit=500&&fieldSelector=spec.nodeName%3Dn1&labelSelector=app%21%3Dx&x=a+b",
        );
        assert_eq!(q.get("limit"), Some("500"));
        assert_eq!(q.get("fieldSelector"), Some("spec.nodeName=n1"));
        assert_eq!(q.get("labelSelector"), Some("app!=x"));
        assert_eq!(q.get("x"), Some("a b"));
        assert_eq!(q.int("limit").expect("int"), Some(500));
        assert!(q.flag("watch").is_ok_and(|w| !w));
    }
}
