//! The gateway's configuration file (YAML or JSON): what it means once read. Every error names
//! the field that is wrong (`peers[1].publicKey: ...`), and nothing is applied before the whole
//! file has been checked.
//!
//! The concepts live apart: [`file`] is the file as written, `validate` turns it into a
//! [`Config`], [`defaults`] is what holds when the file is silent, and [`error`] names the field
//! behind every error, including errors of the lower crates whose rules the gateway relies on.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use ipnet::Ipv4Net;
use tether_wg::{PrivateKey, PublicKey};

pub mod defaults;
pub mod error;
mod file;
mod validate;

pub use defaults::{
    DEFAULT_LISTEN_PORT, DEFAULT_RECONCILE_INTERVAL, DEFAULT_UNDERLAY_MTU, TUNNEL_ADDRESS_NET,
    TUNNEL_OVERHEAD, default_interface,
};
pub use error::{ConfigError, Problem};

/// A validated configuration.
#[derive(Clone, Debug)]
pub struct Config {
    /// Our WireGuard private key.
    pub private_key: PrivateKey,
    /// UDP listen address.
    pub listen: SocketAddr,
    /// Tunnel (inner) MTU.
    pub mtu: u32,
    /// This cluster's pod CIDRs.
    pub pod_cidrs: Vec<Ipv4Net>,
    /// This cluster's external CIDR, if any.
    pub external_cidr: Option<Ipv4Net>,
    /// Other local networks remaps must avoid (service CIDR, node network).
    pub reserved_cidrs: Vec<Ipv4Net>,
    /// Interfaces where local traffic enters the gateway (empty: all non-tunnel interfaces).
    pub pod_interfaces: Vec<String>,
    /// Admin server address (`/metrics`, `/healthz`).
    pub metrics_address: SocketAddr,
    /// Drift repair period.
    pub reconcile_interval: Duration,
    /// Where remapped local views come from.
    pub remap_pools: Vec<Ipv4Net>,
    /// The peers, sorted by id (marks and route tables follow this order).
    pub peers: Vec<PeerSpec>,
    /// Local addresses published to peers under addresses of the external CIDR (the
    /// control plane of an in-band peering; `tetherd gateway --publish`).
    pub ip_mappings: Vec<tether_netplan::IpMapping>,
}

/// One validated peer.
#[derive(Clone, Debug)]
pub struct PeerSpec {
    /// Peer cluster id.
    pub id: String,
    /// Where the peer stands in the file's `peers` list (errors name it: `peers[2].id`).
    pub position: usize,
    /// The peer's public key.
    pub public_key: PublicKey,
    /// Where to reach it (client side); learned otherwise.
    pub endpoint: Option<SocketAddr>,
    /// Keepalive interval in seconds.
    pub persistent_keepalive: Option<u16>,
    /// The peer's real pod CIDR.
    pub pod_cidr: Ipv4Net,
    /// Explicit local view of the pod CIDR (else chosen by the IPAM).
    pub pod_local_view: Option<Ipv4Net>,
    /// The peer's real external CIDR.
    pub external_cidr: Option<Ipv4Net>,
    /// Explicit local view of the external CIDR.
    pub external_local_view: Option<Ipv4Net>,
    /// The peer's TUN interface.
    pub interface: String,
    /// Our address on the tunnel network (defaults to a free `169.254.18.x/32`).
    pub tunnel_address: Option<Ipv4Net>,
}

impl Config {
    /// Reads and validates a file. YAML is a superset of JSON, so both parse.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| {
            ConfigError::new(
                "config",
                Problem::Read {
                    path: path.to_owned(),
                    source,
                },
            )
        })?;
        Self::parse(&text, path.parent())
    }

    /// Parses and validates configuration text; `base` resolves a relative key file.
    ///
    /// Rules that span the peers and belong to the planner or the WireGuard device (unique
    /// ids, interfaces and keys) are checked by [`crate::Prepared::new`].
    pub fn parse(text: &str, base: Option<&Path>) -> Result<Self, ConfigError> {
        validate::validate(file::parse(text)?, base)
    }
}

#[cfg(test)]
mod tests;
