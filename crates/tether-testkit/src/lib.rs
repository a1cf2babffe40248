//! Test fixtures for Tether's privileged tests: network namespaces that cannot leak, guards for
//! processes started in them, simulated-cluster topologies (pods, node, gateway, underlay, NAT
//! router), TCP echo helpers and `assert_eventually!`.
//!
//! This crate is a dev-dependency only; production code never depends on it.

mod echo;
mod error;
mod eventually;
mod netns;
mod preflight;
mod process;
mod sys;
mod topology;

pub use echo::{EchoReply, TcpEchoServer, UdpEchoServer, tcp_echo, udp_echo};
pub use error::{Error, Result};
pub use eventually::{POLL_INTERVAL, patience};
pub use netns::{NAME_PREFIX, Netns, list_namespaces, own_namespaces, sweep_stale_namespaces};
pub use preflight::{
    find_in_path, is_root, missing_requirement, require_root_or_skip, require_tools_or_skip,
};
pub use process::{DEFAULT_STOP_TIMEOUT, ProcessGuard};
pub use topology::{
    Cluster, ClusterSpec, GATEWAY_POD_INTERFACE, GATEWAY_UNDERLAY_INTERFACE, POD_INTERFACE,
    Topology, TopologyBuilder, veth_pair,
};

#[doc(hidden)]
pub mod __private {
    pub use tokio;
}
