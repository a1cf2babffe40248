//! Process plumbing shared by every Tether daemon: logging, the admin server (`/metrics`,
//! `/healthz`), shutdown on signals, the clap argument groups every daemon flattens, and the
//! start-up check of the system programs a daemon runs.
//!
//! Nothing here knows about clusters, tunnels or Kubernetes objects; a daemon composes these
//! pieces in its `main`.

pub mod admin;
pub mod args;
pub mod health;
pub mod shutdown;
pub mod telemetry;
pub mod tools;

pub use admin::{AdminError, AdminServer};
pub use args::AdminArgs;
pub use health::Health;
pub use shutdown::Shutdown;
pub use telemetry::{LogArgs, LogFormat, TelemetryError};
