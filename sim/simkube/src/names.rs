//! DNS names as Kubernetes validates them (RFC 1123 labels and subdomains, RFC 1035 labels),
//! with apimachinery's messages. The one implementation in the test substrate: simkube's
//! validation uses it, and so do the crates built on simkube.

/// apimachinery's message for a name that is not an RFC 1123 subdomain.
pub const DNS1123_SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
/// apimachinery's message for a name that is not an RFC 1123 label.
pub const DNS1123_LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
/// apimachinery's message for a name that is not an RFC 1035 label.
pub const DNS1035_LABEL_MSG: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')";

/// The longest RFC 1123 (and RFC 1035) label.
pub const MAX_LABEL_LEN: usize = 63;
/// The longest RFC 1123 subdomain.
pub const MAX_SUBDOMAIN_LEN: usize = 253;

/// An RFC 1123 label: lower-case alphanumerics and `-`, alphanumeric at both ends, at most 63
/// characters.
pub fn is_dns1123_label(s: &str) -> bool {
    dns1123_label_problem(s).is_none()
}

/// An RFC 1035 label: an RFC 1123 label that starts with a letter.
pub fn is_dns1035_label(s: &str) -> bool {
    dns1035_label_problem(s).is_none()
}

/// An RFC 1123 subdomain: dot-separated RFC 1123 labels, at most 253 characters.
pub fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= MAX_SUBDOMAIN_LEN && s.split('.').all(is_dns1123_label)
}

/// Why `s` is not an RFC 1123 label, in words (`is empty`, `must not end with '-'`), if it
/// is not one.
pub fn dns1123_label_problem(s: &str) -> Option<&'static str> {
    if s.is_empty() {
        Some("is empty")
    } else if s.len() > MAX_LABEL_LEN {
        Some("is longer than 63 characters")
    } else if s.starts_with('-') {
        Some("must not start with '-'")
    } else if s.ends_with('-') {
        Some("must not end with '-'")
    } else if !s
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        Some("may only contain lower-case letters, digits and '-'")
    } else {
        None
    }
}

/// Why `s` is not an RFC 1035 label, in words, if it is not one.
pub fn dns1035_label_problem(s: &str) -> Option<&'static str> {
    if !s.is_empty() && s.len() <= MAX_LABEL_LEN && !s.starts_with(|c: char| c.is_ascii_lowercase())
    {
        return Some("must start with a lower-case letter");
    }
    dns1123_label_problem(s)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn labels_subdomains_and_their_problems() {
        let cases = [
            ("web-1", None, None),
            ("1web", None, Some("must start with a lower-case letter")),
            ("", Some("is empty"), Some("is empty")),
            (
                "-a",
                Some("must not start with '-'"),
                Some("must start with a lower-case letter"),
            ),
            (
                "a-",
                Some("must not end with '-'"),
                Some("must not end with '-'"),
            ),
            (
                "a.b",
                Some("may only contain lower-case letters, digits and '-'"),
                Some("may only contain lower-case letters, digits and '-'"),
            ),
            (
                "Web",
                Some("may only contain lower-case letters, digits and '-'"),
                Some("must start with a lower-case letter"),
            ),
        ];
        for (name, label, dns1035) in cases {
            assert_eq!(
                (dns1123_label_problem(name), dns1035_label_problem(name)),
                (label, dns1035),
                "{name:?}"
            );
        }
        assert!(is_dns1123_label(&"a".repeat(63)) && !is_dns1123_label(&"a".repeat(64)));
        assert!(is_dns1123_subdomain("api.example.com"));
        assert!(!is_dns1123_subdomain("api..example.com") && !is_dns1123_subdomain(""));
        assert!(is_dns1123_subdomain(&format!("{}a", "a.".repeat(126))));
        assert!(!is_dns1123_subdomain(&format!("{}aa", "a.".repeat(126))));
        assert!(!is_dns1123_subdomain(&"a.".repeat(127)));
    }

    proptest! {
        #[test]
        fn labels_match_the_kubernetes_regex(s in "[a-z0-9.-]{0,70}") {
            let re = regex::Regex::new("^[a-z0-9]([-a-z0-9]*[a-z0-9])?$").expect("regex");
            prop_assert_eq!(is_dns1123_label(&s), s.len() <= 63 && re.is_match(&s));
            let re1035 = regex::Regex::new("^[a-z]([-a-z0-9]*[a-z0-9])?$").expect("regex");
            prop_assert_eq!(is_dns1035_label(&s), s.len() <= 63 && re1035.is_match(&s));
        }
    }
}
