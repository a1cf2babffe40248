//! Process plumbing shared by every Tether daemon: logging, the admin server (`/metrics`,
//! `/healthz`, `/readyz`), shutdown on signals, the Kubernetes client set-up, leader election
//! over a Lease, reconcile metrics, the clap argument groups every daemon flattens, and the
//! start-up check of the system programs a daemon runs.
//!
//! Nothing here knows about clusters, tunnels or Tether's own resources; a daemon composes
//! these pieces in its `main`.

pub mod admin;
pub mod args;
pub mod client;
pub mod error;
pub mod health;
pub mod leader;
pub mod metrics;
pub mod shutdown;
pub mod telemetry;
pub mod tools;
pub mod transport;

pub use admin::{AdminError, AdminServer};
pub use args::{AdminArgs, parse_duration};
pub use client::{ConfigSource, KubeArgs, client_from, kube_client};
pub use error::RuntimeError;
pub use health::{Health, Readiness};
pub use leader::{LeaderElector, Leadership, LeaseParams, default_identity};
pub use metrics::{ControllerMetrics, ReconcileResult};
pub use shutdown::Shutdown;
pub use telemetry::{LogArgs, LogFormat, TelemetryError};
