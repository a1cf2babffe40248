//! The kernel adapter's errors. Each one names the kernel object or command involved, so a log
//! line or a status condition says what to look at.

use std::io;
use std::time::Duration;

/// What can go wrong while reading or programming the kernel.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// The rtnetlink socket could not be opened.
    #[error("cannot open an rtnetlink socket: {0}")]
    Connect(#[source] io::Error),
    /// A netlink request was refused; `object` names what was being done.
    #[error("{object}: {source}")]
    Netlink {
        /// The operation and the object, e.g. `add route 10.0.0.0/16 dev tun0 table 7700`.
        object: String,
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },
    /// An interface named by the plan or the caller does not exist (yet).
    #[error("{object}: no interface named {interface:?} (is the tunnel device up yet?)")]
    NoSuchLink {
        /// What needed the interface.
        object: String,
        /// The missing interface.
        interface: String,
    },
    /// An interface did not appear in time.
    #[error("interface {interface:?} did not appear within {waited:?}")]
    LinkTimeout {
        /// The interface waited for.
        interface: String,
        /// How long we waited.
        waited: Duration,
    },
    /// A sysctl could not be read or written.
    #[error("sysctl {key}: {source}")]
    Sysctl {
        /// Path below `/proc/sys`.
        key: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// The `nft` command could not be run at all (missing binary: install nftables).
    #[error("cannot run `{command}` (is the nftables package installed?): {source}")]
    NftSpawn {
        /// The command line.
        command: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// `nft` ran and refused the request; nothing of that transaction was applied.
    #[error("`{command}` for table {table:?} failed: {stderr}")]
    Nft {
        /// The command line.
        command: String,
        /// Our table.
        table: String,
        /// What nft printed.
        stderr: String,
    },
    /// The plan names an object outside what this adapter owns; applying it would create
    /// objects that observation never sees again (duplicates on every reconcile).
    #[error(
        "plan object {object} is outside our ownership ({why}); fix the ownership or the input"
    )]
    NotOwned {
        /// The offending object.
        object: String,
        /// Which ownership rule it breaks.
        why: String,
    },
    /// A route's kind and output interface disagree: unicast routes need one, unreachable and
    /// blackhole routes have none.
    #[error("cannot {object}: {why}; fix the plan's route")]
    InvalidRoute {
        /// The operation and route.
        object: String,
        /// What is inconsistent.
        why: String,
    },
}

impl KernelError {
    pub(crate) fn netlink(object: impl Into<String>, error: rtnetlink::Error) -> Self {
        Self::Netlink {
            object: object.into(),
            source: netlink_io_error(error),
        }
    }

    /// The OS error number behind this error, if there is one (e.g. `EEXIST`).
    pub fn errno(&self) -> Option<i32> {
        match self {
            Self::Connect(source)
            | Self::Netlink { source, .. }
            | Self::Sysctl { source, .. }
            | Self::NftSpawn { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }
}

/// rtnetlink errors carry a negative errno; turn them into `io::Error`s that print as
/// "File exists (os error 17)". Any other rtnetlink error is wrapped whole, so its own source
/// chain stays reachable.
pub(crate) fn netlink_io_error(error: rtnetlink::Error) -> io::Error {
    match error {
        rtnetlink::Error::NetlinkError(message) => {
            io::Error::from_raw_os_error(message.raw_code().abs())
        }
        other => io::Error::other(other),
    }
}

/// The errno of an rtnetlink error, if the kernel sent one.
pub(crate) fn netlink_errno(error: &rtnetlink::Error) -> Option<i32> {
    match error {
        rtnetlink::Error::NetlinkError(message) => Some(message.raw_code().abs()),
        _ => None,
    }
}
