//! Test fixtures for Tether's privileged tests: network namespaces that cannot leak, guards for
//! processes started in them, simulated-cluster topologies (pods, node, gateway, underlay, NAT
//! router), TCP echo helpers, `assert_eventually!`, the root/CI preflight with its skip marker,
//! and system programs hidden from one command ([`HiddenTool`]).
//!
//! This crate is a dev-dependency only; production code never depends on it.
//!
//! ```no_run
//! use std::net::{IpAddr, SocketAddr};
//! use std::time::Duration;
//! use tether_testkit::{ClusterSpec, TcpEchoServer, Topology, require_root_or_skip, tcp_echo};
//!
//! # fn main() -> tether_testkit::Result<()> {
//! if !require_root_or_skip() {
//!     return Ok(()); // printed why; with CI set it would have panicked instead
//! }
//! let topo = Topology::builder()
//!     .cluster(ClusterSpec::new("a").pod_cidr("10.0.0.0/16").pods(1))
//!     .cluster(ClusterSpec::new("b").pod_cidr("10.0.0.0/16").pods(1).behind_nat())
//!     .build()?; // every namespace is deleted when `topo` drops, also on panic
//! let (a, b) = (topo.cluster("a"), topo.cluster("b"));
//! let listen = SocketAddr::new(IpAddr::V4(a.gateway_underlay_ip()), 0);
//! let server = TcpEchoServer::start(a.gateway(), listen)?;
//! let reply = tcp_echo(b.gateway(), server.local_addr(), b"hello", Duration::from_secs(5))?;
//! assert_eq!(reply.seen_as.ip(), IpAddr::V4(b.public_ip())); // masqueraded by b's NAT router
//! # Ok(())
//! # }
//! ```

mod echo;
mod error;
mod eventually;
mod hide;
mod netns;
mod preflight;
mod process;
mod sys;
mod topology;

pub use echo::{EchoReply, TcpEchoServer, UdpEchoServer, tcp_echo, udp_echo};
pub use error::{Error, Result};
pub use eventually::{POLL_INTERVAL, patience};
pub use hide::{HiddenTool, STAND_IN_ERROR, Stand};
pub use netns::{NAME_PREFIX, Netns, list_namespaces, own_namespaces, sweep_stale_namespaces};
pub use preflight::{
    SKIP_MARKER, find_in_path, is_root, missing_requirement, require_kubectl_or_skip,
    require_root_or_skip, require_tools_or_skip,
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
