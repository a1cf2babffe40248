//! simkube: an in-memory Kubernetes API server that speaks the real HTTP/JSON protocol.
//!
//! The unmodified kube-rs client and the real `kubectl` talk to it, in process (as a tower
//! `Service`) or over HTTP/HTTPS. Several servers side by side are several clusters. What it does
//! and deliberately does not do is listed in `FIDELITY.md` at the repository root.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube::api::{Api, ListParams};
//!
//! let cluster = simkube::Cluster::builder().name("c1").start().await?;
//! let cms: Api<ConfigMap> = Api::default_namespaced(cluster.client());
//! assert!(cms.list(&ListParams::default()).await?.items.is_empty());
//! cluster.compact(); // resuming watches from older RVs now get 410 Expired
//! cluster.shutdown().await;
//! # Ok(())
//! # }
//! ```
//!
//! Authentication: every cluster has a random admin token (user `admin`, group
//! `system:masters`) in its kubeconfig. With TLS or RBAC on, requests without credentials are
//! 401. In plain HTTP without RBAC they act as the admin, because kubectl never sends a bearer
//! token over plain HTTP; wrong credentials are 401 either way. `/healthz`, `/livez`, `/readyz`
//! and `/version` need no credentials.

// `ApiError` is a whole Status (several strings). It is returned at most once per request, never
// in a hot loop, so boxing it would only add noise at every call site.
#![allow(clippy::result_large_err)]

pub mod admission;
pub mod auth;
pub mod cluster;
pub mod controllers;
pub mod crd;
pub mod discovery;
pub mod error;
pub mod fuzzing;
pub mod http;
pub mod kubelet_proxy;
pub mod metrics;
pub mod names;
pub mod patch;
pub mod protobuf;
pub mod registry;
pub mod selectors;
pub mod service_alloc;
pub mod store;
pub mod strategy;
pub mod table;
pub mod timefmt;
pub mod tls;
pub mod watch;

pub use cluster::{Cluster, ClusterBuilder, Error};
pub use error::ApiError;
pub use registry::{Gvr, Registry, ResourceType};
