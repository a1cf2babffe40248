//! Clap argument groups shared by daemons.

use std::net::SocketAddr;

use clap::Args;

/// Where the admin server (`/metrics`, `/healthz`) listens.
#[derive(Clone, Debug, Args)]
pub struct AdminArgs {
    /// Listen address of the admin server (metrics and health).
    #[arg(
        long = "admin-addr",
        env = "TETHER_ADMIN_ADDR",
        default_value = "0.0.0.0:9090"
    )]
    pub admin_addr: SocketAddr,
}

impl Default for AdminArgs {
    fn default() -> Self {
        Self {
            admin_addr: SocketAddr::from(([0, 0, 0, 0], 9090)),
        }
    }
}
