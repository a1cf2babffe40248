//! Why one fabric reconcile failed. Each variant names the object or step involved.

use tether_kernel::KernelError;
use tether_netplan::FabricError;

/// Why the fabric could not be brought to its desired state this time (the loop retries).
#[derive(Debug, thiserror::Error)]
pub enum FabricRunError {
    /// The kernel could not be read or programmed.
    #[error("fabric kernel step {step}: {source}")]
    Kernel {
        /// What was being done (`open`, `uplink MTU`, `reconcile`, `teardown`).
        step: &'static str,
        /// The adapter's error.
        #[source]
        source: KernelError,
    },
    /// Some operations failed; the first failure is the source.
    #[error("{failed} fabric operation(s) failed, first: {op}")]
    Apply {
        /// How many failed.
        failed: usize,
        /// The first failed operation.
        op: String,
        /// Its error.
        #[source]
        source: KernelError,
    },
    /// The built input was refused by the planner.
    #[error("fabric plan refused: {0}")]
    Plan(#[source] FabricError),
    /// This node's Node object is not (yet) in the cache.
    #[error("node {node}: no Node object seen (is NODE_NAME right?)")]
    NodeMissing {
        /// The node name.
        node: String,
    },
    /// The Node has no IPv4 InternalIP to carry VXLAN.
    #[error("node {node}: no IPv4 InternalIP in status.addresses")]
    NoNodeAddress {
        /// The node name.
        node: String,
    },
}

impl FabricRunError {
    /// A bounded metric label for this error.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Kernel { .. } => "kernel",
            Self::Apply { .. } => "apply",
            Self::Plan(_) => "plan",
            Self::NodeMissing { .. } | Self::NoNodeAddress { .. } => "node",
        }
    }
}
