//! simkube: an in-memory Kubernetes API server that speaks the real HTTP/JSON protocol.
//!
//! The unmodified kube-rs client and the real `kubectl` talk to it, in process (as a tower
//! `Service`) or over HTTP/HTTPS. Several servers side by side are several clusters. What it does
//! and deliberately does not do is listed in `FIDELITY.md` at the repository root.

// `ApiError` is a whole Status (several strings). It is returned at most once per request, never
// in a hot loop, so boxing it would only add noise at every call site.
#![allow(clippy::result_large_err)]

pub mod auth;
pub mod cluster;
pub mod controllers;
pub mod crd;
pub mod discovery;
pub mod error;
pub mod fuzzing;
pub mod http;
pub mod kubelet_proxy;
pub mod patch;
pub mod registry;
pub mod selectors;
pub mod store;
pub mod strategy;
pub mod table;
pub mod tls;
pub mod watch;

pub use cluster::{Cluster, ClusterBuilder, Error};
pub use error::ApiError;
pub use registry::{Gvr, Registry, ResourceType};
