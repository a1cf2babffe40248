//! The Tether gateway: a userspace WireGuard endpoint with one TUN device per peer, the
//! kernel state (routes, rules, nftables remap) that makes overlapping pod CIDRs reachable,
//! and per-peer metrics.
//!
//! `tetherd gateway --config FILE` loads a [`Config`], turns it into a [`Prepared`] gateway
//! (all validation and planning, nothing applied) and runs it.

pub mod cluster;
pub mod config;
pub mod dataplane;
pub mod gateway;
pub mod metrics;
pub mod probe;
pub mod remap;

pub use config::{Config, ConfigError, PeerSpec};
pub use gateway::{GatewayError, Prepared};
