//! Processes of a cluster found by PID: checking that a recorded PID still is the process we
//! started (PIDs are reused), and stopping it politely, then firmly.

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use nix::unistd::Pid;

/// The command line of `pid`, split at NULs; `None` when there is no such process.
pub fn cmdline(pid: u32) -> Option<Vec<String>> {
    let bytes = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    if bytes.is_empty() {
        // A zombie: it has exited and only waits for its parent.
        return None;
    }
    Some(
        bytes
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect(),
    )
}

/// Whether `args` contain `needle` as consecutive arguments.
fn contains_seq(args: &[String], needle: &[&str]) -> bool {
    args.windows(needle.len())
        .any(|w| w.iter().zip(needle).all(|(a, b)| a == b))
}

/// Whether `pid` is the daemon of cluster `name` (`... cluster daemon --name <name> ...`).
pub fn is_daemon(pid: u32, name: &str) -> bool {
    cmdline(pid).is_some_and(|args| {
        contains_seq(&args, &["cluster", "daemon"]) && contains_seq(&args, &["--name", name])
    })
}

/// Whether `pid` is a node agent running in namespace `netns` (`... node --netns <netns> ...`).
pub fn is_agent(pid: u32, netns: &str) -> bool {
    cmdline(pid).is_some_and(|args| contains_seq(&args, &["--netns", netns]))
}

/// Sends SIGTERM, waits up to `grace` for the process to go (as seen by `alive`), then sends
/// SIGKILL and waits a little more. Returns whether it had to be killed.
pub fn terminate(pid: u32, grace: Duration, alive: impl Fn() -> bool) -> bool {
    let Ok(raw) = i32::try_from(pid) else {
        return false;
    };
    let target = Pid::from_raw(raw);
    if nix::sys::signal::kill(target, Signal::SIGTERM).is_err() {
        return false;
    }
    if wait_gone(grace, &alive) {
        return false;
    }
    let _ = nix::sys::signal::kill(target, Signal::SIGKILL);
    wait_gone(Duration::from_secs(5), &alive);
    true
}

fn wait_gone(timeout: Duration, alive: &impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if !alive() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    !alive()
}

/// Resident set size of `pid` in KiB.
pub fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_own_command_line_is_read() {
        let own = cmdline(std::process::id()).expect("we exist");
        assert!(!own.is_empty());
        assert!(!is_daemon(std::process::id(), "c1"));
        assert!(rss_kib(std::process::id()).expect("rss") > 0);
    }

    #[test]
    fn sequences_match_consecutive_arguments_only() {
        let args: Vec<String> = ["simkube", "cluster", "daemon", "--name", "c1"]
            .map(String::from)
            .into();
        assert!(contains_seq(&args, &["cluster", "daemon"]));
        assert!(contains_seq(&args, &["--name", "c1"]));
        assert!(!contains_seq(&args, &["--name", "c"]));
        assert!(!contains_seq(&args, &["daemon", "cluster"]));
    }

    #[test]
    fn a_child_is_terminated() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep runs");
        let pid = child.id();
        let (tx, rx) = std::sync::mpsc::channel();
        let waiter = std::thread::spawn(move || {
            let status = child.wait().expect("wait");
            tx.send(status).expect("send");
        });
        let exited = std::sync::Mutex::new(None);
        let killed = terminate(pid, Duration::from_secs(5), || {
            let mut slot = exited.lock().expect("lock");
            if slot.is_none() {
                *slot = rx.try_recv().ok();
            }
            slot.is_none()
        });
        waiter.join().expect("waiter");
        assert!(!killed, "sleep stops on SIGTERM");
        let status = exited.lock().expect("lock").take().expect("exited");
        assert!(!status.success());
    }
}
