//! Tracing subscriber set-up: one call from `main`, never from a library.

use clap::{Args, ValueEnum};
use tracing_subscriber::EnvFilter;

/// The environment variable read when `--log-level` is not given.
pub const LOG_ENV: &str = "TETHER_LOG";

/// The filter used when neither `--log-level` nor `TETHER_LOG` is set.
pub const DEFAULT_FILTER: &str = "warn,tether=info,tetherd=info";

/// How log lines are rendered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines for terminals.
    #[default]
    Plain,
    /// One JSON object per line, for log collectors.
    Json,
}

/// Logging flags shared by every daemon (`#[command(flatten)]`).
#[derive(Clone, Debug, Default, Args)]
pub struct LogArgs {
    /// Log filter in `tracing` directive syntax, e.g. `info` or `warn,tether_gateway=debug`.
    #[arg(long = "log-level", env = LOG_ENV)]
    pub level: Option<String>,
    /// Log line format.
    #[arg(long = "log-format", value_enum, default_value_t = LogFormat::Plain)]
    pub format: LogFormat,
}

/// Why the subscriber could not be installed.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// The filter directive did not parse.
    #[error("invalid log filter {filter:?}: {source}")]
    Filter {
        /// The directive as given.
        filter: String,
        /// What the parser rejected.
        source: tracing_subscriber::filter::ParseError,
    },
    /// A global subscriber was already installed (tests call `init` more than once).
    #[error("a tracing subscriber is already installed")]
    AlreadyInstalled(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// Builds the filter from the flag (which clap already fell back to `TETHER_LOG` for).
pub fn filter(args: &LogArgs) -> Result<EnvFilter, TelemetryError> {
    let directive = args.level.as_deref().unwrap_or(DEFAULT_FILTER);
    // Crate names use underscores in targets; accept the dashed spelling users copy from
    // Cargo.toml so `tether-gateway=debug` does what it says.
    let directive = directive.replace("tether-", "tether_");
    EnvFilter::try_new(&directive).map_err(|source| TelemetryError::Filter {
        filter: directive.clone(),
        source,
    })
}

/// Installs the global subscriber: plain or JSON lines on stderr.
pub fn init(args: &LogArgs) -> Result<(), TelemetryError> {
    let filter = filter(args)?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let result = match args.format {
        LogFormat::Plain => builder.try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .try_init(),
    };
    result.map_err(TelemetryError::AlreadyInstalled)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_filter_parses() {
        let args = LogArgs::default();
        assert!(filter(&args).is_ok());
    }

    #[test]
    fn bad_filter_is_named() {
        let args = LogArgs {
            level: Some("tether=[".into()),
            format: LogFormat::Plain,
        };
        let err = filter(&args).expect_err("an unbalanced bracket must be rejected");
        assert!(err.to_string().contains("tether=["), "{err}");
    }

    #[test]
    fn dashed_crate_names_are_accepted() {
        let args = LogArgs {
            level: Some("tether-gateway=debug".into()),
            format: LogFormat::Json,
        };
        let f = filter(&args).expect("dashed names are rewritten");
        assert!(f.to_string().contains("tether_gateway=debug"), "{f}");
    }
}
