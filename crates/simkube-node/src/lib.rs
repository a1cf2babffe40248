//! The node agent of simulated clusters (`simkube node`): it registers a Node with an API server,
//! renews its heartbeat Lease, and runs the pods bound to it as ordinary processes, each pod in
//! its own network namespace with a veth to the node and an address from the node's pod CIDR.
//!
//! Pure decisions live in their own modules ([`ipam`], [`backoff`], [`images`], [`env`],
//! [`node_status`], [`pod_status`]); the agent applies them.

pub mod agent;
pub mod backoff;
pub mod builtin;
pub mod env;
mod error;
pub mod images;
pub mod ipam;
pub mod kubelet;
pub mod node_status;
pub mod pod_status;
pub mod process;
pub mod sandbox;

pub use agent::{Agent, AgentConfig};
pub use error::Error;
