//! Clap argument groups shared by daemons.

use std::net::SocketAddr;

use clap::Args;

/// Where the admin server (`/metrics`, `/healthz`) listens.
#[derive(Clone, Debug, Args)]
pub struct AdminArgs {
    /// Listen address of the admin server (metrics and health).
    #[arg(
        long = "admin-addr",
        env = "TETHER_ADMIN_ADDR",
        default_value = "0.0.0.0:9090"
    )]
    pub admin_addr: SocketAddr,
}

impl Default for AdminArgs {
    fn default() -> Self {
        Self {
            admin_addr: SocketAddr::from(([0, 0, 0, 0], 9090)),
        }
    }
}

/// Parses a duration such as `90s`, `10m`, `24h`, `7d` or a plain number of seconds, for
/// flags like `--identity-lifetime` and `--ttl`.
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    let n: u64 = digits.parse().map_err(|_| {
        format!("{s:?} is not a duration; use a number with s, m, h or d (e.g. 30s, 10m, 24h)")
    })?;
    let secs = match unit {
        "" | "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        "d" => n * 86_400,
        _ => {
            return Err(format!(
                "{s:?} has an unknown unit {unit:?}; use s, m, h or d"
            ));
        }
    };
    Ok(std::time::Duration::from_secs(secs))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::parse_duration;

    #[test]
    fn durations_take_units_and_refuse_nonsense() {
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("24h"), Ok(Duration::from_secs(86_400)));
        assert_eq!(parse_duration("2d"), Ok(Duration::from_secs(172_800)));
        assert!(
            parse_duration("1w")
                .expect_err("unit")
                .contains("unknown unit")
        );
        assert!(parse_duration("h").is_err());
    }
}
