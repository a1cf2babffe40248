//! The fabric overlay's control loop: which namespaces are fabric peers, from Kubernetes
//! objects ([`model`], pure), and the loop that keeps one namespace's fabric at that state
//! ([`run`]): `tetherd fabric` on every node, and the gateway for its own side.
//!
//! Load → pure plan → apply: the reflectors' objects become a `tether_netplan::FabricInput`
//! ([`node_input`] on a node, [`gateway_input`] in a gateway pod), netplan plans it, and
//! `tether_kernel::FabricKernel` applies it.

mod error;
mod metrics;
pub mod model;
pub mod run;

pub use error::FabricRunError;
pub use metrics::{CONTROLLER, FabricMetrics};
pub use model::{Built, Settings, device_mtu, gateway_input, node_input, node_internal_ip};
pub use run::{Applier, NodeConfig, READINESS, run_node};
