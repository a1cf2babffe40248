//! The only code in Tether that programs the kernel: it applies a `tether-netplan` [`Plan`]
//! (sysctls, tunnel addresses, per-peer routes and policy rules, one nftables table) to the
//! current network namespace, idempotently, and prepares the gateway's tunnel devices.
//!
//! Load → pure plan → apply: [`Kernel::reconcile`] observes only the objects we own
//! ([`Kernel::observe`]), lets `tether_netplan::diff` compute the operations, applies them and
//! returns a [`ReconcileReport`]. Routes, rules and addresses travel over rtnetlink and carry our
//! protocol tag; the nftables table is replaced atomically through `nft -f -` (see the `nft`
//! module for why a command), with its fingerprint in the table comment so drift is visible.
//!
//! Routes are unicast through a tunnel device or, for the catch-all that ends every peer table,
//! `RTN_UNREACHABLE` / `RTN_BLACKHOLE` without an output interface; these outlive the device,
//! so a deleted tunnel leaves its table answering "unreachable" instead of empty.
//!
//! [`FabricKernel`] does the same for the fabric overlay's netplan `FabricPlan`: the VXLAN
//! device, its static FDB entries and permanent neighbours, `onlink` and `unreachable` routes in
//! the main table (tagged [`FABRIC_PROTOCOL`]) and the `tether-fabric` table.
//!
//! [`Plan`]: tether_netplan::Plan

mod error;
mod fabric;
mod kernel;
mod link;
mod netlink;
mod nft;
mod sysctl;

pub use error::KernelError;
pub use fabric::{FABRIC_PROTOCOL, FabricConfig, FabricKernel, FabricOpFailure, FabricReport};
pub use kernel::{DEFAULT_PROTOCOL, Kernel, KernelConfig, OpFailure, ReconcileReport};
pub use link::{LinkSettings, TUNNEL_TXQUEUELEN};
