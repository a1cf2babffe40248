//! Pod sandboxes: one named network namespace per pod, joined to the node's namespace (the one
//! the agent runs in) by a veth pair, with the pod's address and a default route via the node.
//!
//! The layout is point-to-point, like the CNI `ptp` plugin: the pod's `eth0` holds `podIP/32`
//! and routes everything via the pod CIDR's first address, which every node-side veth holds as
//! `/32`; the node reaches each pod through a `/32` route on that pod's veth.
//!
//! It drives `ip` (iproute2) rather than netlink: namespaces must be *named* (bind-mounted under
//! `/run/netns`, created with the same locking as `ip netns add`) so that operators can inspect
//! them with `ip netns` and `nsenter` and so that a restarted agent finds them again; iproute2 is
//! the reference implementation of that protocol, and using it for the few link and route steps
//! too keeps one tool and one error format.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::Stdio;

use tokio::process::Command;

/// Where named network namespaces live.
pub const NETNS_DIR: &str = "/run/netns";

/// Name of the pod side of the veth.
pub const POD_INTERFACE: &str = "eth0";

/// Why a sandbox step failed.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// A command could not run or failed.
    #[error("`{command}` failed: {message}")]
    Command {
        /// The command line.
        command: String,
        /// Its stderr or the OS error.
        message: String,
    },
}

/// The names of one pod's sandbox objects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxNames {
    /// The network namespace (`/run/netns/<netns>`).
    pub netns: String,
    /// The node side of the veth.
    pub host_veth: String,
}

/// The namespace prefix of every sandbox of `node`: `sk-<node>-`.
pub fn netns_prefix(node: &str) -> String {
    // Namespace names are file names (at most 255 bytes), and the UID takes 36 plus separators.
    let node: String = node.chars().take(200).collect();
    format!("sk-{node}-")
}

/// The sandbox names of pod `uid` whose namespace names start with `prefix` (see
/// [`netns_prefix`]).
pub fn names(prefix: &str, uid: &str) -> SandboxNames {
    let hex: String = uid
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(11)
        .collect();
    SandboxNames {
        netns: format!("{prefix}{uid}"),
        // Interface names are at most 15 bytes.
        host_veth: format!("sk{hex}"),
    }
}

impl SandboxNames {
    /// Path of the namespace file, for `setns`.
    pub fn netns_path(&self) -> PathBuf {
        PathBuf::from(NETNS_DIR).join(&self.netns)
    }
}

async fn ip(args: &[&str]) -> Result<String, SandboxError> {
    let command = format!("ip {}", args.join(" "));
    let output = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(|e| SandboxError::Command {
            command: command.clone(),
            message: e.to_string(),
        })?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(SandboxError::Command {
            command,
            message: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        })
    }
}

/// Creates the sandbox: namespace, veth, addresses and routes. A leftover sandbox with the same
/// names (from an agent that died) is removed first, so the result is always fresh.
pub async fn create(
    names: &SandboxNames,
    pod_ip: Ipv4Addr,
    gateway: Ipv4Addr,
) -> Result<(), SandboxError> {
    remove(names).await?;
    let result = build(names, pod_ip, gateway).await;
    if result.is_err() {
        // Nothing half-applied: a failed sandbox is torn down before the error is reported.
        let _ = remove(names).await;
    }
    result
}

async fn build(
    names: &SandboxNames,
    pod_ip: Ipv4Addr,
    gateway: Ipv4Addr,
) -> Result<(), SandboxError> {
    let ns = names.netns.as_str();
    let veth = names.host_veth.as_str();
    let pod_addr = format!("{pod_ip}/32");
    let gw = gateway.to_string();
    ip(&["netns", "add", ns]).await?;
    ip(&[
        "link",
        "add",
        veth,
        "type",
        "veth",
        "peer",
        "name",
        POD_INTERFACE,
        "netns",
        ns,
    ])
    .await?;
    ip(&["-n", ns, "link", "set", "lo", "up"]).await?;
    ip(&["-n", ns, "link", "set", POD_INTERFACE, "up"]).await?;
    ip(&["-n", ns, "addr", "add", &pod_addr, "dev", POD_INTERFACE]).await?;
    ip(&[
        "-n",
        ns,
        "route",
        "add",
        &gw,
        "dev",
        POD_INTERFACE,
        "scope",
        "link",
    ])
    .await?;
    ip(&[
        "-n",
        ns,
        "route",
        "add",
        "default",
        "via",
        &gw,
        "dev",
        POD_INTERFACE,
    ])
    .await?;
    ip(&["addr", "add", &format!("{gw}/32"), "dev", veth]).await?;
    ip(&["link", "set", veth, "up"]).await?;
    ip(&[
        "route", "replace", &pod_addr, "dev", veth, "scope", "link", "src", &gw,
    ])
    .await?;
    Ok(())
}

/// Removes the sandbox (idempotent). Processes must have been stopped first, or the namespace
/// lives on, unnamed, until they exit.
pub async fn remove(names: &SandboxNames) -> Result<(), SandboxError> {
    if link_exists(&names.host_veth).await {
        ip(&["link", "del", &names.host_veth]).await?;
    }
    if names.netns_path().exists() {
        ip(&["netns", "del", &names.netns]).await?;
    }
    Ok(())
}

async fn link_exists(name: &str) -> bool {
    ip(&["link", "show", "dev", name]).await.is_ok()
}

/// Names of the namespaces under [`NETNS_DIR`] that start with `prefix` (one node's sandboxes),
/// with the pod UID each encodes.
pub fn list(prefix: &str) -> Vec<(String, String)> {
    let Ok(entries) = std::fs::read_dir(NETNS_DIR) else {
        return Vec::new();
    };
    let mut found: Vec<(String, String)> = entries
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter_map(|name| {
            let uid = name.strip_prefix(prefix)?.to_owned();
            // Another node whose name extends ours ("n1" and "n1-b") shares the prefix; a pod
            // UID never contains the rest of a node name plus a dash before 36 UID characters.
            (uid.len() == 36).then_some((name, uid))
        })
        .collect();
    found.sort();
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_fit_kernel_limits() {
        let n = names(
            &netns_prefix("worker-1"),
            "0f6d3e0a-1b2c-4d5e-8f90-123456789abc",
        );
        assert_eq!(n.netns, "sk-worker-1-0f6d3e0a-1b2c-4d5e-8f90-123456789abc");
        assert_eq!(n.host_veth, "sk0f6d3e0a1b2");
        assert!(n.host_veth.len() <= 15);
        let long = names(
            &netns_prefix(&"n".repeat(253)),
            "0f6d3e0a-1b2c-4d5e-8f90-123456789abc",
        );
        assert!(long.netns.len() <= 255);
        assert_eq!(
            n.netns_path(),
            PathBuf::from("/run/netns/sk-worker-1-0f6d3e0a-1b2c-4d5e-8f90-123456789abc")
        );
    }
}
