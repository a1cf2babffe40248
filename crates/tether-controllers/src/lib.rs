//! Tether's control plane, run by `tetherd controller`: the cluster identity, the
//! authentication service (provider) and client (consumer), tenants, and the ForeignCluster
//! reconciler that drives peering and summarises it.
//!
//! Load → decide → apply: reconcilers read the objects they need, decide with the pure parts
//! (`auth::protocol`, `auth::ratelimit`, `auth::csr`, `kubeconfig`, `publisher`'s address
//! functions, `foreign_cluster::status`), and apply with server-side apply.

pub mod applied;
pub mod auth;
pub mod context;
pub mod foreign_cluster;
pub mod https;
pub mod identity;
pub mod kubeconfig;
pub mod metrics;
pub mod namespaces;
pub mod network;
pub mod offloading;
pub mod providers;
pub mod publisher;
pub mod run;
pub mod tenant;
pub mod tokens;
pub mod webhook;

mod error;

pub use error::Error;
