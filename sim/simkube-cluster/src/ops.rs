//! `cluster up`, `down`, `list`, `stop-node` and `start-node`: the orchestration around the
//! network plumbing ([`crate::net`]), the state directory ([`crate::state`]) and the daemon
//! ([`crate::daemon`]).
//!
//! `up` creates a cluster and starts its daemon, `ready` waits until the cluster works, `down`
//! removes one (also what a crash left), `list` reads the state directory and `nodes` stops and
//! starts single node agents.

use std::time::Duration;

use crate::Error;

mod down;
mod list;
mod nodes;
mod ready;
mod up;

pub use down::down;
pub use list::{ListEntry, list};
pub use nodes::{start_node, stop_node};
pub use ready::{client_from, node_ready};
pub use up::{TETHER_IMAGE, UpOptions, UpSummary, default_images, up};

/// How long the daemon gets to stop its agents and exit before it is killed.
const DAEMON_GRACE: Duration = Duration::from_secs(30);
/// How long a node agent gets to remove its pods before it is killed.
pub const AGENT_GRACE: Duration = Duration::from_secs(20);

/// Whether this process runs with effective UID 0.
pub fn is_root() -> bool {
    // The effective UID is the second field of `Uid:` (no unsafe libc call needed).
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let euid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1).map(str::to_owned));
    euid.as_deref() == Some("0")
}

/// The system programs of a cluster: `ip` for its network, and `nft` for its nodes' service
/// proxies, checked before anything is created.
pub const REQUIRED_TOOLS: &[tether_runtime::tools::Tool] =
    &[tether_runtime::tools::IP, tether_runtime::tools::NFT];

/// Network namespaces, veths and bridges need CAP_SYS_ADMIN and CAP_NET_ADMIN.
pub(super) fn require_root() -> Result<(), Error> {
    if is_root() {
        Ok(())
    } else {
        Err(Error::Invalid(
            "simulated clusters create network namespaces and bridges: run simkube cluster as \
             root (e.g. with sudo)"
                .to_owned(),
        ))
    }
}
