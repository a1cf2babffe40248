//! Timestamps as Kubernetes writes them in JSON: RFC 3339 in UTC, whole seconds for
//! `metav1.Time` (`2025-05-15T10:00:00Z`) and microseconds for `metav1.MicroTime`
//! (`2025-05-15T10:00:00.123456Z`). Every timestamp the server writes goes through here.

/// `metav1.Time` of a Unix time in seconds. Times outside the representable range (year 9999)
/// print as the empty string, which no client would accept, rather than panicking.
pub fn rfc3339(unix_seconds: i64) -> String {
    jiff::Timestamp::from_second(unix_seconds)
        .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_default()
}

/// `metav1.MicroTime` of a Unix time in seconds and nanoseconds (cut to microseconds).
pub fn rfc3339_micros(unix_seconds: i64, nanos: i64) -> String {
    let nanos = i32::try_from(nanos.clamp(0, 999_999_999)).unwrap_or_default();
    jiff::Timestamp::new(unix_seconds, nanos)
        .map(|t| t.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string())
        .unwrap_or_default()
}

/// The current time as [`rfc3339`] writes it.
pub fn now_rfc3339() -> String {
    rfc3339_after(0)
}

/// Now plus `secs` seconds, as [`rfc3339`] writes it.
pub fn rfc3339_after(secs: i64) -> String {
    rfc3339(jiff::Timestamp::now().as_second().saturating_add(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_and_microseconds_in_utc() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_747_303_200), "2025-05-15T10:00:00Z");
        assert_eq!(
            rfc3339_micros(1_747_303_200, 123_456_789),
            "2025-05-15T10:00:00.123456Z"
        );
        assert_eq!(rfc3339_micros(0, 0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(rfc3339(i64::MAX), "");
    }

    #[test]
    fn now_parses_back_and_moves_forward() {
        let now: jiff::Timestamp = now_rfc3339().parse().expect("rfc3339");
        let later: jiff::Timestamp = rfc3339_after(60).parse().expect("rfc3339");
        let delta = later.as_second() - now.as_second();
        assert!((59..=61).contains(&delta), "{delta}");
    }
}
