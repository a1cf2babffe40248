//! Tether's Kubernetes API: the `v1alpha1` custom resources of the groups `core.tether.dev`,
//! `authentication.tether.dev`, `networking.tether.dev` and `offloading.tether.dev`; the
//! names every component agrees on; cluster IDs; and the peering-token format.
//!
//! No client, no runtime, no IO: the controller, the CLI and the tests all build on these types.

// kube-derive's repeated `printcolumn(type_ = ...)` arguments look like duplicated attributes
// to clippy.
#![allow(clippy::duplicated_attributes)]

pub mod authentication;
pub mod cluster_id;
pub mod conditions;
pub mod core;
pub mod crds;
pub mod names;
pub mod networking;
pub mod offloading;
pub mod peering;
pub mod rbac;

pub use cluster_id::{ClusterId, InvalidClusterId};
