//! Decides whether a privileged test may run here, following the project's CI rule: without
//! root (or a needed tool) a local run skips loudly, while a run with `CI` set fails instead.
//!
//! A skip prints one line starting with [`SKIP_MARKER`] straight to the process's standard
//! output, past the test harness's capture, so whoever runs the tests (`cargo xtask test`) sees
//! every skip and can count them.

use std::io::Write as _;
use std::path::Path;

/// The start of the line a skipped test prints: `TETHER-TEST-SKIPPED: <test>: <reason>`.
pub const SKIP_MARKER: &str = "TETHER-TEST-SKIPPED:";

/// Tools every namespace test needs: `ip` builds namespaces and links, `nft` programs NAT.
const BASE_TOOLS: &[&str] = &["ip", "nft"];

/// Returns `true` when the calling test can use network namespaces, TUN devices, `ip` and `nft`.
///
/// When something is missing and the `CI` environment variable is unset, prints why the test is
/// skipped and returns `false`; the test should then return early. When `CI` is set, panics with
/// the reason instead, because CI must never skip a privileged test silently.
pub fn require_root_or_skip() -> bool {
    require_tools_or_skip(&[])
}

/// Like [`require_root_or_skip`], and additionally requires each of `extra_tools` on `PATH`
/// (for example `ethtool` or `ping`).
pub fn require_tools_or_skip(extra_tools: &[&str]) -> bool {
    match missing_requirement(extra_tools) {
        None => true,
        Some(reason) => skip_or_fail(&reason),
    }
}

/// Why this machine cannot run a namespace test, or `None` when it can.
pub fn missing_requirement(extra_tools: &[&str]) -> Option<String> {
    if !is_root() {
        return Some("not running as root (network namespaces need CAP_SYS_ADMIN)".to_owned());
    }
    if !Path::new("/dev/net/tun").exists() {
        return Some("/dev/net/tun is missing (load the tun module)".to_owned());
    }
    BASE_TOOLS
        .iter()
        .chain(extra_tools)
        .find(|tool| find_in_path(tool).is_none())
        .map(|tool| format!("the `{tool}` command is not on PATH (install it)"))
}

/// Returns `true` when `kubectl` runs here (`kubectl version --client`). Otherwise skips as
/// [`require_root_or_skip`] does: loudly without `CI`, with a panic when `CI` is set.
pub fn require_kubectl_or_skip() -> bool {
    let runs = std::process::Command::new("kubectl")
        .args(["version", "--client"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    runs || skip_or_fail("`kubectl version --client` does not run (install kubectl 1.27 to 1.33)")
}

fn skip_or_fail(reason: &str) -> bool {
    if std::env::var_os("CI").is_some() {
        panic!("CI is set, so this privileged test must run, but {reason}");
    }
    print_skip(reason);
    false
}

/// Prints the skip line to file descriptor 1 itself: the harness captures what a test prints
/// with `println!`, and shows it only for failed tests.
fn print_skip(reason: &str) {
    let thread = std::thread::current();
    let test = match thread.name() {
        Some(name) if name != "main" => name.to_owned(),
        _ => std::env::args().next().unwrap_or_default(),
    };
    let line = format!(
        "{SKIP_MARKER} {test}: {reason}; run as root on a prepared machine (`cargo xtask test`) to run it\n"
    );
    let written = nix::unistd::dup(std::io::stdout())
        .is_ok_and(|fd| std::fs::File::from(fd).write_all(line.as_bytes()).is_ok());
    if !written {
        eprint!("{line}");
    }
}

/// Whether the effective user is root, read from `/proc/self/status` (no libc call needed).
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|ids| ids.split_whitespace().nth(1).map(|euid| euid == "0"))
        })
        .unwrap_or(false)
}

/// Looks `tool` up on `PATH`, like `command -v`.
pub fn find_in_path(tool: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(tool))
        .find(|candidate| candidate.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_sh_but_not_nonsense() {
        assert!(find_in_path("sh").is_some());
        assert!(find_in_path("definitely-not-a-tool-xyz").is_none());
    }

    #[test]
    fn names_what_is_missing() {
        let reason = missing_requirement(&["definitely-not-a-tool-xyz"]).expect("tool is missing");
        // Without root the privilege check comes first; with root the tool is named.
        let expected = if is_root() {
            "definitely-not-a-tool-xyz"
        } else {
            "root"
        };
        assert!(reason.contains(expected), "{reason}");
    }
}
