//! The configuration file as written: serde structures that mirror its YAML (or JSON) keys,
//! with no meaning attached yet. Unknown keys are errors, so a typo never silently falls back
//! to a default.

use std::path::PathBuf;

use serde::Deserialize;

use super::{ConfigError, Problem};

/// The whole file.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct RawConfig {
    pub(super) private_key: Option<String>,
    pub(super) private_key_file: Option<PathBuf>,
    pub(super) listen: Option<String>,
    pub(super) mtu: Option<u32>,
    pub(super) underlay_mtu: Option<u32>,
    pub(super) local: RawLocal,
    #[serde(default)]
    pub(super) pod_interfaces: Vec<String>,
    pub(super) metrics_address: Option<String>,
    pub(super) reconcile_interval_seconds: Option<u64>,
    pub(super) remap_pools: Option<Vec<String>>,
    #[serde(default)]
    pub(super) peers: Vec<RawPeer>,
}

/// `local:`, this cluster's own networks.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct RawLocal {
    #[serde(default)]
    pub(super) pod_cidrs: Vec<String>,
    pub(super) external_cidr: Option<String>,
    #[serde(default)]
    pub(super) reserved_cidrs: Vec<String>,
}

/// One entry of `peers:`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct RawPeer {
    pub(super) id: String,
    pub(super) public_key: String,
    pub(super) endpoint: Option<String>,
    pub(super) persistent_keepalive: Option<u16>,
    pub(super) pod_cidr: String,
    pub(super) pod_local_view: Option<String>,
    pub(super) external_cidr: Option<String>,
    pub(super) external_local_view: Option<String>,
    pub(super) interface: Option<String>,
    pub(super) tunnel_address: Option<String>,
}

/// Reads the text into [`RawConfig`]. YAML is a superset of JSON, so both parse; a syntax or
/// shape error names its line and column.
pub(super) fn parse(text: &str) -> Result<RawConfig, ConfigError> {
    serde_yaml::from_str(text).map_err(|e| {
        let field = e.location().map_or_else(
            || "config".to_owned(),
            |l| format!("config (line {}, column {})", l.line(), l.column()),
        );
        ConfigError::new(field, Problem::Syntax(e))
    })
}
