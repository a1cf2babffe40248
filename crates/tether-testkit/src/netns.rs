//! Named network namespaces that cannot leak: unique names carrying the owner's PID, deletion on
//! drop (also while a failing test unwinds), and a sweep that removes what a killed run left.
//!
//! Names look like `tt<pid>-<seq>-<label>`. Before the first namespace of a process is created,
//! every `tt<pid>-…` namespace whose owner is no longer running is deleted, together with any
//! process still inside it (only the testkit starts processes there). The owner's start time is
//! recorded under `/run/tether-testkit/` so a recycled PID is not mistaken for the owner.

use std::fs::File;
use std::future::Future;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, Once};
use std::thread::JoinHandle;

use nix::sched::CloneFlags;

use crate::error::{Error, Result};
use crate::process::ProcessGuard;

/// Prefix of every namespace the testkit creates.
pub const NAME_PREFIX: &str = "tt";

const NETNS_DIR: &str = "/run/netns";
const OWNER_DIR: &str = "/run/tether-testkit";
const MAX_LABEL: usize = 40;

static SEQUENCE: AtomicU32 = AtomicU32::new(0);
static SWEEP: Once = Once::new();
// `ip netns add` mounts /run/netns on first use; concurrent first calls race on that mount.
static CREATE: Mutex<()> = Mutex::new(());

/// A network namespace owned by this test process; deleted on drop.
#[derive(Debug)]
pub struct Netns {
    name: String,
    path: PathBuf,
}

impl Netns {
    /// Creates a fresh namespace named `tt<pid>-<seq>-<label>` with `lo` up.
    ///
    /// `label` may use lowercase letters, digits and `-` (at most 40 characters).
    pub fn new(label: &str) -> Result<Self> {
        validate_label(label)?;
        SWEEP.call_once(|| {
            sweep_stale_namespaces();
        });
        let pid = std::process::id();
        let seq = SEQUENCE.fetch_add(1, Ordering::Relaxed);
        let name = format!("{NAME_PREFIX}{pid}-{seq}-{label}");
        {
            let _serialized = CREATE
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            run_checked(Command::new("ip").args(["netns", "add", &name]))?;
        }
        let ns = Self {
            path: Path::new(NETNS_DIR).join(&name),
            name,
        };
        ns.ip(&["link", "set", "lo", "up"])?;
        tracing::debug!(netns = %ns.name, "created");
        Ok(ns)
    }

    /// The namespace's name, usable with `ip netns exec` and `ip -n`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The bind-mounted namespace file (`/run/netns/<name>`), usable with `nsenter --net=`.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn open(&self) -> Result<File> {
        File::open(&self.path).map_err(|e| Error::io(format!("open {}", self.path.display()), e))
    }

    /// Runs `f` on a thread that has entered the namespace, and returns its result.
    ///
    /// Sockets created inside `f` belong to the namespace (for Rust-side TCP/UDP clients and
    /// servers and netlink connections). A panic in `f` is propagated to the caller.
    pub fn try_run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> Result<T> {
        let file = self.open()?;
        let name = &self.name;
        std::thread::scope(|scope| {
            let handle = scope.spawn(move || {
                nix::sched::setns(&file, CloneFlags::CLONE_NEWNET)
                    .map_err(|e| Error::io(format!("setns into {name}"), e.into()))?;
                Ok(f())
            });
            match handle.join() {
                Ok(result) => result,
                Err(panic) => std::panic::resume_unwind(panic),
            }
        })
    }

    /// Like [`Netns::try_run`], panicking if the namespace cannot be entered.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        self.try_run(f)
            .unwrap_or_else(|e| panic!("cannot run in {}: {e}", self.name))
    }

    /// Runs the future built by `f` to completion on a current-thread tokio runtime whose thread
    /// is inside the namespace.
    ///
    /// Only code on that thread is inside the namespace: `spawn_blocking` and `tokio::fs` run
    /// elsewhere, so use synchronous IO for anything namespace-scoped (such as `/proc/sys/net`).
    pub fn run_async<F, Fut, T>(&self, f: F) -> T
    where
        F: FnOnce() -> Fut + Send,
        Fut: Future<Output = T>,
        T: Send,
    {
        self.run(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("invariant: a current-thread runtime can always be built")
                .block_on(f())
        })
    }

    /// Starts a background thread inside the namespace (for servers that outlive one call).
    pub fn spawn_thread<T, F>(&self, f: F) -> Result<JoinHandle<T>>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let file = self.open()?;
        let name = self.name.clone();
        std::thread::Builder::new()
            .name(format!("in-{name}"))
            .spawn(move || {
                nix::sched::setns(&file, CloneFlags::CLONE_NEWNET)
                    .unwrap_or_else(|e| panic!("setns into {name}: {e}"));
                f()
            })
            .map_err(|e| Error::io("spawn namespace thread", e))
    }

    /// A command that will run inside the namespace (and be SIGKILLed if the spawning thread
    /// dies). Configure it further, then run it with [`Netns::spawn`] or `output()`.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Result<Command> {
        let mut command = Command::new(program);
        crate::sys::enter_netns_on_exec(&mut command, self.open()?);
        Ok(command)
    }

    /// Runs `args[0]` with the remaining arguments inside the namespace and collects its output,
    /// whatever its exit status.
    pub fn exec(&self, args: &[&str]) -> Result<Output> {
        let (program, rest) = args
            .split_first()
            .ok_or_else(|| Error::Invalid("exec needs a program".into()))?;
        let mut command = self.command(program)?;
        command.args(rest).stdin(Stdio::null());
        command
            .output()
            .map_err(|e| Error::io(format!("run `{}` in {}", args.join(" "), self.name), e))
    }

    /// Like [`Netns::exec`] but fails unless the command succeeds; returns its stdout.
    pub fn exec_ok(&self, args: &[&str]) -> Result<String> {
        let output = self.exec(args)?;
        check_output(&format!("{} (in {})", args.join(" "), self.name), output)
    }

    /// Spawns `command` inside the namespace and wraps it in a guard that stops it on drop.
    pub fn spawn(&self, mut command: Command) -> Result<ProcessGuard> {
        crate::sys::enter_netns_on_exec(&mut command, self.open()?);
        let label = format!(
            "{} (in {})",
            command.get_program().to_string_lossy(),
            self.name
        );
        let child = command
            .spawn()
            .map_err(|e| Error::io(format!("spawn {label}"), e))?;
        tracing::debug!(process = %label, pid = child.id(), "spawned");
        Ok(ProcessGuard::new(child, label))
    }

    /// Runs `ip -n <ns> <args>`; returns stdout.
    pub fn ip(&self, args: &[&str]) -> Result<String> {
        run_checked(Command::new("ip").arg("-n").arg(&self.name).args(args))
    }

    /// Applies an nft script inside the namespace (`nft -f -`).
    pub fn nft(&self, script: &str) -> Result<()> {
        let mut command = self.command("nft")?;
        command.args(["-f", "-"]);
        run_with_stdin(
            &mut command,
            script,
            &format!("nft -f - (in {})", self.name),
        )
        .map(drop)
    }

    /// Writes a sysctl inside the namespace. `key` is dotted (`net.ipv4.ip_forward`) or a path
    /// below `/proc/sys` (`net/ipv4/conf/eth0.100/rp_filter`, for names that contain dots).
    pub fn set_sysctl(&self, key: &str, value: &str) -> Result<()> {
        let path = sysctl_path(key);
        self.run(|| std::fs::write(&path, value))
            .map_err(|e| Error::io(format!("write {} in {}", path.display(), self.name), e))
    }

    /// Reads a sysctl inside the namespace (trimmed).
    pub fn sysctl(&self, key: &str) -> Result<String> {
        let path = sysctl_path(key);
        self.run(|| std::fs::read_to_string(&path))
            .map(|v| v.trim().to_owned())
            .map_err(|e| Error::io(format!("read {} in {}", path.display(), self.name), e))
    }

    /// Sends one ICMP echo (1 s timeout) from inside the namespace; `true` if it was answered.
    pub fn ping(&self, destination: IpAddr) -> Result<bool> {
        self.ping_sized(destination, 56, false)
    }

    /// Like [`Netns::ping`] with a payload of `size` bytes; `dont_fragment` sets DF
    /// (`-M do`), which is how MTU black holes are found.
    pub fn ping_sized(&self, destination: IpAddr, size: u16, dont_fragment: bool) -> Result<bool> {
        let size = size.to_string();
        let destination = destination.to_string();
        let mut args = vec!["ping", "-n", "-q", "-c", "1", "-W", "1", "-s", &size];
        if dont_fragment {
            args.extend(["-M", "do"]);
        }
        args.push(&destination);
        Ok(self.exec(&args)?.status.success())
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        match run_checked(Command::new("ip").args(["netns", "del", &self.name])) {
            Ok(_) => tracing::debug!(netns = %self.name, "deleted"),
            Err(error) => tracing::warn!(netns = %self.name, %error, "could not delete"),
        }
    }
}

fn validate_label(label: &str) -> Result<()> {
    let ok = !label.is_empty()
        && label.len() <= MAX_LABEL
        && label
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "namespace label {label:?} must be 1-{MAX_LABEL} characters of a-z, 0-9 and '-'"
        )))
    }
}

fn sysctl_path(key: &str) -> PathBuf {
    let relative = if key.contains('/') {
        key.to_owned()
    } else {
        key.replace('.', "/")
    };
    Path::new("/proc/sys").join(relative)
}

/// Runs a command to completion; errors name the command line and carry its stderr.
pub(crate) fn run_checked(command: &mut Command) -> Result<String> {
    let line = command_line(command);
    let output = command
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Error::io(format!("run `{line}`"), e))?;
    check_output(&line, output)
}

pub(crate) fn run_with_stdin(command: &mut Command, input: &str, line: &str) -> Result<String> {
    use std::io::Write as _;
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Error::io(format!("run `{line}`"), e))?;
    let mut stdin = child.stdin.take().expect("invariant: stdin was piped");
    let written = stdin.write_all(input.as_bytes());
    drop(stdin);
    let output = child
        .wait_with_output()
        .map_err(|e| Error::io(format!("wait `{line}`"), e))?;
    written.map_err(|e| Error::io(format!("write stdin of `{line}`"), e))?;
    check_output(line, output)
}

fn check_output(line: &str, output: Output) -> Result<String> {
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(Error::Command {
            command: line.to_owned(),
            status: output.status,
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        })
    }
}

fn command_line(command: &Command) -> String {
    std::iter::once(command.get_program())
        .chain(command.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Names of all namespaces under `/run/netns` (what `ip netns list` shows).
pub fn list_namespaces() -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(NETNS_DIR) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    names.sort();
    names
}

/// Names of the namespaces this process created and has not yet deleted.
pub fn own_namespaces() -> Vec<String> {
    let own = format!("{NAME_PREFIX}{}-", std::process::id());
    list_namespaces()
        .into_iter()
        .filter(|n| n.starts_with(&own))
        .collect()
}

/// The owner PID encoded in a testkit namespace name.
fn owner_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix(NAME_PREFIX)?;
    let (digits, _) = rest.split_once('-')?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Start time of a process in clock ticks since boot (field 22 of `/proc/<pid>/stat`).
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces and parentheses; fields resume after the last ')'.
    let after_comm = &stat[stat.rfind(')')? + 1..];
    after_comm.split_whitespace().nth(19)?.parse().ok()
}

fn owner_file(pid: u32) -> PathBuf {
    Path::new(OWNER_DIR).join(pid.to_string())
}

fn owner_alive(pid: u32) -> bool {
    let Some(started) = start_time(pid) else {
        return false;
    };
    match std::fs::read_to_string(owner_file(pid)) {
        Ok(recorded) => recorded.trim().parse::<u64>().is_ok_and(|r| r == started),
        // No record: trust the PID (the owner may predate records, or the record was lost).
        Err(_) => true,
    }
}

/// Deletes the testkit namespaces whose owner process is gone (a killed test run), stopping any
/// process still inside them, and records this process as an owner. Returns the names removed.
///
/// Runs automatically before a process creates its first namespace.
pub fn sweep_stale_namespaces() -> Vec<String> {
    let me = std::process::id();
    if let Err(error) = std::fs::create_dir_all(OWNER_DIR)
        .and_then(|()| std::fs::write(owner_file(me), start_time(me).unwrap_or(0).to_string()))
    {
        tracing::warn!(%error, "cannot record the namespace owner; the sweep may miss PID reuse");
    }
    let mut removed = Vec::new();
    for name in list_namespaces() {
        let Some(pid) = owner_pid(&name) else {
            continue;
        };
        if pid == me || owner_alive(pid) {
            continue;
        }
        if remove_stale_namespace(&name) {
            removed.push(name);
        }
    }
    // Forget owners that are gone, namespaces or not, so records do not pile up in /run.
    let records = std::fs::read_dir(OWNER_DIR).into_iter().flatten().flatten();
    for record in records {
        let pid = record
            .file_name()
            .to_str()
            .and_then(|name| name.parse::<u32>().ok());
        if pid.is_some_and(|pid| pid != me && !owner_alive(pid)) {
            let _ = std::fs::remove_file(record.path());
        }
    }
    removed
}

fn remove_stale_namespace(name: &str) -> bool {
    // Whatever still runs inside was started by a killed test run of ours; it keeps the namespace
    // alive after `ip netns del`, so stop it by PID first.
    if let Ok(pids) = run_checked(Command::new("ip").args(["netns", "pids", name])) {
        for pid in pids
            .split_whitespace()
            .filter_map(|p| p.parse::<i32>().ok())
        {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
    match run_checked(Command::new("ip").args(["netns", "del", name])) {
        Ok(_) => {
            tracing::info!(netns = %name, "removed a namespace left by a killed test run");
            true
        }
        Err(error) => {
            tracing::warn!(netns = %name, %error, "could not remove a stale namespace");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_pid_parses_only_our_names() {
        assert_eq!(owner_pid("tt4242-0-gw"), Some(4242));
        assert_eq!(owner_pid("tt4242-3-a-pod0"), Some(4242));
        assert_eq!(owner_pid("ttx-0-gw"), None);
        assert_eq!(owner_pid("tt-0-gw"), None);
        assert_eq!(owner_pid("other"), None);
    }

    #[test]
    fn labels_are_validated() {
        assert!(validate_label("a-gw0").is_ok());
        assert!(validate_label("").is_err());
        assert!(validate_label("Gw").is_err());
        assert!(validate_label(&"x".repeat(41)).is_err());
    }

    #[test]
    fn own_start_time_is_readable() {
        assert!(start_time(std::process::id()).is_some());
        assert!(owner_alive(std::process::id()));
    }

    #[test]
    fn sysctl_paths() {
        assert_eq!(
            sysctl_path("net.ipv4.ip_forward"),
            Path::new("/proc/sys/net/ipv4/ip_forward")
        );
        assert_eq!(
            sysctl_path("net/ipv4/conf/eth0.100/rp_filter"),
            Path::new("/proc/sys/net/ipv4/conf/eth0.100/rp_filter")
        );
    }
}
