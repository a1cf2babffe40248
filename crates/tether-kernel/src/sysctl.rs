//! Sysctls through `/proc/sys`, read and written synchronously on the calling thread.
//!
//! `/proc/sys/net` shows the network namespace of the *thread* that opens it, so these must not
//! move to a blocking pool (`tokio::fs` would): a pool thread may sit in another namespace.

use std::path::PathBuf;

use crate::error::KernelError;

fn path(key: &str) -> PathBuf {
    PathBuf::from("/proc/sys").join(key)
}

/// Reads a sysctl (`key` uses `/` separators, as in netplan's [`tether_netplan::Sysctl`]).
pub(crate) fn read(key: &str) -> Result<String, KernelError> {
    std::fs::read_to_string(path(key))
        .map(|value| value.trim().to_owned())
        .map_err(|source| KernelError::Sysctl {
            key: key.to_owned(),
            source,
        })
}

/// Writes a sysctl.
pub(crate) fn write(key: &str, value: &str) -> Result<(), KernelError> {
    if key.split('/').any(|part| part == ".." || part.is_empty()) {
        return Err(KernelError::Sysctl {
            key: key.to_owned(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a sysctl key"),
        });
    }
    std::fs::write(path(key), value).map_err(|source| KernelError::Sysctl {
        key: key.to_owned(),
        source,
    })
}
