//! Container processes: started inside the pod's network namespace, in their own session (so a
//! stop reaches the container's whole process group), with output copied line by line into a
//! CRI-format log file ([`crate::container_log`]), and killed by the kernel if the agent thread
//! that started them dies. [`spawn_in_container`] starts further processes inside a running
//! container (exec sessions, exec probes).
#![allow(unsafe_code)]

use std::fs::File;
use std::io;
use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use nix::sched::CloneFlags;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

mod exec;
mod mounts;
pub use exec::{ExecOutput, ExecProcess, ExecStdio, Pty, run_in_container, spawn_in_container};
pub use mounts::Mount;

/// `PATH` for containers whose environment sets none (the usual image default).
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// What to start.
#[derive(Debug)]
pub struct Launch<'a> {
    /// Program and arguments.
    pub argv: &'a [String],
    /// The complete environment (values may be secrets: never log them).
    pub env: &'a [(String, String)],
    /// Working directory (`/` when the container sets none).
    pub working_dir: &'a Path,
    /// The pod's network namespace file.
    pub netns: &'a Path,
    /// The log file stdout and stderr go to (appended, as CRI log entries).
    pub log: &'a Path,
    /// Bind mounts (volumes, resolv.conf, hosts). When there are any, the container gets its
    /// own mount namespace (the one `/proc/<pid>/ns/mnt` names), private to it.
    pub mounts: &'a [Mount],
}

/// A running container process.
#[derive(Debug)]
pub struct ContainerProcess {
    child: tokio::process::Child,
    pid: Pid,
    /// Copies the container's output into its log file (see [`crate::container_log`]).
    log_writer: Option<tokio::task::JoinHandle<()>>,
}

/// How long a finished container's last output may take to reach its log file; processes it
/// left behind may hold its pipes open for longer, and their output still goes to the file.
const LOG_DRAIN: Duration = Duration::from_secs(2);

/// How a process ended: exit code in Kubernetes terms and the signal, if one killed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exit {
    /// The exit code, 128 + signal number for a signal.
    pub code: i32,
    /// The signal that killed it.
    pub signal: Option<i32>,
}

impl From<std::process::ExitStatus> for Exit {
    /// Kubernetes' reading of a wait status: the exit code, or 128 + the signal that killed it;
    /// 255 when the status is neither (a stopped process, which `wait` does not report).
    fn from(status: std::process::ExitStatus) -> Self {
        match (status.code(), status.signal()) {
            (Some(code), _) => Exit { code, signal: None },
            (None, Some(signal)) => Exit {
                code: 128 + signal,
                signal: Some(signal),
            },
            (None, None) => Exit {
                code: 255,
                signal: None,
            },
        }
    }
}

impl ContainerProcess {
    /// Starts the process. Must be called from a long-lived thread (a runtime worker), since the
    /// kernel kills the process when the thread that started it exits.
    pub fn spawn(launch: &Launch<'_>) -> io::Result<Self> {
        let (program, args) = launch
            .argv
            .split_first()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "empty argv"))?;
        let netns = File::open(launch.netns)?;
        let (log_sink, stdout, stderr) = crate::container_log::LogSink::open(launch.log)?;
        let mounts = mounts::Prepared::new(launch.mounts, launch.working_dir)?;
        let mut command = std::process::Command::new(program);
        command
            .args(args)
            .env_clear()
            .current_dir(launch.working_dir)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr);
        if !launch.env.iter().any(|(k, _)| k == "PATH") {
            command.env("PATH", DEFAULT_PATH);
        }
        command.envs(launch.env.iter().map(|(k, v)| (k, v)));
        let parent = nix::unistd::getpid();
        if !mounts.is_empty() {
            // The working directory may lie inside a volume: the hook enters it after mounting,
            // so the one `Command` sets must exist before the mounts (the root always does).
            command.current_dir("/");
        }
        // SAFETY: the hook runs in the forked child before exec. It only makes the setns, setsid,
        // prctl and getppid system calls and, with mounts, unshare, mkdir, open, close, mount and
        // chdir on paths the parent prepared (all async-signal-safe); it allocates nothing and
        // takes no locks; `netns` was opened by the parent, so its descriptor is valid in the
        // child.
        unsafe {
            command.pre_exec(move || {
                nix::sched::setns(&netns, CloneFlags::CLONE_NEWNET)?;
                if !mounts.is_empty() {
                    mounts.apply()?;
                }
                nix::unistd::setsid()?;
                nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
                // The agent may have died between fork and prctl; nobody would ever stop us.
                if nix::unistd::getppid() != parent {
                    return Err(io::Error::from_raw_os_error(libc::ESRCH));
                }
                Ok(())
            });
        }
        let child = tokio::process::Command::from(command)
            .kill_on_drop(true)
            .spawn()?;
        let raw = child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .ok_or_else(|| io::Error::other("spawned process has no PID"))?;
        // The pipes' write ends went with the `Command`: the writer sees their end when the
        // container (and whatever inherited them) is gone.
        let log_writer = Some(log_sink.start()?);
        Ok(Self {
            child,
            pid: Pid::from_raw(raw),
            log_writer,
        })
    }

    /// The process ID (also its process group ID).
    pub fn pid(&self) -> u32 {
        self.pid.as_raw().unsigned_abs()
    }

    /// Waits for the process to exit and its output to reach the log file.
    pub async fn wait(&mut self) -> io::Result<Exit> {
        let status = self.child.wait().await?;
        if let Some(writer) = self.log_writer.as_mut() {
            let _ = tokio::time::timeout(LOG_DRAIN, writer).await;
            self.log_writer = None;
        }
        Ok(Exit::from(status))
    }

    /// Stops the container: SIGTERM to its process group, SIGKILL after `grace`.
    pub async fn stop(&mut self, grace: Duration) -> io::Result<Exit> {
        self.signal_group(Signal::SIGTERM);
        if let Ok(exit) = tokio::time::timeout(grace, self.wait()).await {
            self.signal_group(Signal::SIGKILL);
            return exit;
        }
        self.signal_group(Signal::SIGKILL);
        self.wait().await
    }

    fn signal_group(&self, signal: Signal) {
        // The container leads its own session, so its group ID is its PID; a negative PID
        // addresses the group (the container and whatever it forked). ESRCH means all gone.
        let _ = kill(Pid::from_raw(-self.pid.as_raw()), signal);
    }
}
