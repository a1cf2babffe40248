//! simkube: an in-memory Kubernetes API server that speaks the real HTTP/JSON protocol.
//!
//! The unmodified kube-rs client and the real `kubectl` talk to it, in process (as a tower
//! `Service`) or over HTTP/HTTPS. Several servers side by side are several clusters. What it does
//! and deliberately does not do is listed in `FIDELITY.md` at the repository root.

pub mod auth;
pub mod controllers;
pub mod crd;
pub mod discovery;
pub mod error;
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

pub use error::ApiError;
pub use registry::{Gvr, Registry, ResourceType};
