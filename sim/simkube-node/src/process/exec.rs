//! Processes started inside a running container (`kubectl exec`, exec probes): they join the
//! container's network and mount namespaces, get its environment and working directory, lead
//! their own session, and are killed with their whole process group when their handle drops.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd as _, AsRawFd as _, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _};
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use nix::fcntl::OFlag;
use nix::sched::CloneFlags;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncReadExt as _};

use super::{DEFAULT_PATH, Exit};
use crate::containers::RunningContainer;

/// How the standard streams of a process started in a container are connected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecStdio {
    /// A pipe for each stream asked for; the others are `/dev/null`.
    Pipes {
        /// Give the process a stdin pipe.
        stdin: bool,
        /// Give the process a stdout pipe.
        stdout: bool,
        /// Give the process a stderr pipe.
        stderr: bool,
    },
    /// One pseudo-terminal for all three streams, made the process's controlling terminal;
    /// `TERM` defaults to `xterm` as container runtimes set it.
    Tty,
}

/// The terminal side the agent keeps of a TTY process: what the process writes is read here,
/// what is written here is the process's keyboard input.
#[derive(Debug)]
pub struct Pty {
    master: AsyncFd<OwnedFd>,
}

impl Pty {
    /// Reads output; `Ok(0)` once no process has the terminal open any more.
    pub async fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let mut guard = self.master.readable().await?;
            match guard.try_io(|fd| nix::unistd::read(fd.get_ref(), buf).map_err(io::Error::from)) {
                Ok(Ok(n)) => return Ok(n),
                // Linux reports a terminal whose other side is closed everywhere as EIO.
                Ok(Err(e)) if e.raw_os_error() == Some(libc::EIO) => return Ok(0),
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => {}
            }
        }
    }

    /// Writes all of `data` as input.
    pub async fn write_all(&self, mut data: &[u8]) -> io::Result<()> {
        while !data.is_empty() {
            let mut guard = self.master.writable().await?;
            match guard.try_io(|fd| nix::unistd::write(fd.get_ref(), data).map_err(io::Error::from))
            {
                Ok(Ok(n)) => data = &data[n..],
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => {}
            }
        }
        Ok(())
    }

    /// Sets the terminal's size (the process gets `SIGWINCH`).
    pub fn resize(&self, width: u16, height: u16) -> io::Result<()> {
        let size = libc::winsize {
            ws_row: height,
            ws_col: width,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: TIOCSWINSZ reads one `winsize` through the pointer, which is valid for the
        // call; the descriptor is the open terminal master.
        let rc = unsafe {
            libc::ioctl(
                self.master.get_ref().as_raw_fd(),
                libc::TIOCSWINSZ,
                &raw const size,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

/// A process running inside a container. Dropping it kills the process and everything in its
/// process group, so no exec session outlives its owner.
#[derive(Debug)]
pub struct ExecProcess {
    child: tokio::process::Child,
    pid: Pid,
    pty: Option<Pty>,
    reaped: bool,
}

impl ExecProcess {
    /// The process ID (also its session and process group ID).
    pub fn pid(&self) -> u32 {
        self.pid.as_raw().unsigned_abs()
    }

    /// Its stdin pipe ([`ExecStdio::Pipes`] with `stdin`), once.
    pub fn take_stdin(&mut self) -> Option<tokio::process::ChildStdin> {
        self.child.stdin.take()
    }

    /// Its stdout pipe ([`ExecStdio::Pipes`] with `stdout`), once.
    pub fn take_stdout(&mut self) -> Option<tokio::process::ChildStdout> {
        self.child.stdout.take()
    }

    /// Its stderr pipe ([`ExecStdio::Pipes`] with `stderr`), once.
    pub fn take_stderr(&mut self) -> Option<tokio::process::ChildStderr> {
        self.child.stderr.take()
    }

    /// Its terminal ([`ExecStdio::Tty`]), once.
    pub fn take_pty(&mut self) -> Option<Pty> {
        self.pty.take()
    }

    /// Waits for the process to exit (its group may live on until [`ExecProcess::kill`] or
    /// drop).
    pub async fn wait(&mut self) -> io::Result<Exit> {
        let status = self.child.wait().await?;
        self.reaped = true;
        Ok(Exit::from(status))
    }

    /// Kills the process and its process group with SIGKILL.
    pub fn kill(&self) {
        // A negative PID addresses the group; ESRCH means everything is gone already.
        let _ = kill(Pid::from_raw(-self.pid.as_raw()), Signal::SIGKILL);
    }
}

impl Drop for ExecProcess {
    fn drop(&mut self) {
        self.kill();
        if !self.reaped {
            // Reaped by tokio's orphan queue once dead; SIGKILL makes that immediate.
            let _ = self.child.start_kill();
        }
    }
}

/// Namespace files of the target, opened by the agent so the child only calls `setns`.
struct Namespaces {
    net: File,
    /// `None` when the container shares the agent's mount namespace (nothing to enter).
    mnt: Option<File>,
}

fn open_namespaces(target: &RunningContainer) -> io::Result<Namespaces> {
    let gone = |e: io::Error| {
        io::Error::new(
            e.kind(),
            format!(
                "container process {} is not running any more: {e}",
                target.pid
            ),
        )
    };
    let net = File::open(&target.netns).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("opening network namespace {}: {e}", target.netns.display()),
        )
    })?;
    let mnt = File::open(format!("/proc/{}/ns/mnt", target.pid)).map_err(gone)?;
    let own = std::fs::metadata("/proc/self/ns/mnt")?;
    let theirs = mnt.metadata().map_err(gone)?;
    let same = own.dev() == theirs.dev() && own.ino() == theirs.ino();
    Ok(Namespaces {
        net,
        mnt: (!same).then_some(mnt),
    })
}

/// A new pseudo-terminal: the master (non-blocking) and the terminal device, both close-on-exec
/// so no other child inherits them.
fn open_pty() -> io::Result<(OwnedFd, OwnedFd)> {
    let master = nix::pty::posix_openpt(
        OFlag::O_RDWR | OFlag::O_NOCTTY | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK,
    )?;
    nix::pty::grantpt(&master)?;
    nix::pty::unlockpt(&master)?;
    let name = nix::pty::ptsname_r(&master)?;
    let slave = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOCTTY | libc::O_CLOEXEC)
        .open(&name)?;
    Ok((OwnedFd::from(master), OwnedFd::from(slave)))
}

/// Starts `argv` inside the running container `target`: in its network namespace and (when it
/// has its own) mount namespace, with its environment (`PATH` defaulted as for the container,
/// `TERM=xterm` added for a TTY when unset) and working directory, in a new session, killed if
/// the calling thread dies. Call it from a long-lived thread (a runtime worker), as with
/// [`super::ContainerProcess::spawn`].
///
/// Errors: `argv` empty (`InvalidInput`), the container's process gone or its namespace
/// missing (`NotFound`, naming which), the program or working directory not found in the
/// container (`NotFound` from the exec itself).
pub fn spawn_in_container(
    target: &RunningContainer,
    argv: &[String],
    stdio: ExecStdio,
) -> io::Result<ExecProcess> {
    let (program, args) = argv
        .split_first()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "empty command"))?;
    let namespaces = open_namespaces(target)?;
    // The container's file system as its processes see it, to name a missing working directory
    // here rather than as a bare ENOENT from the child.
    let seen = Path::new("/proc")
        .join(target.pid.to_string())
        .join("root")
        .join(
            target
                .working_dir
                .strip_prefix("/")
                .unwrap_or(&target.working_dir),
        );
    if !seen.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "working directory {} does not exist in the container",
                target.working_dir.display()
            ),
        ));
    }
    let working_dir = CString::new(target.working_dir.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "working dir has a NUL byte"))?;
    let mut command = std::process::Command::new(program);
    command.args(args).env_clear();
    if !target.env.iter().any(|(k, _)| k == "PATH") {
        command.env("PATH", DEFAULT_PATH);
    }
    let tty = stdio == ExecStdio::Tty;
    if tty && !target.env.iter().any(|(k, _)| k == "TERM") {
        command.env("TERM", "xterm");
    }
    command.envs(target.env.iter().map(|(k, v)| (k, v)));
    let mut master = None;
    match stdio {
        ExecStdio::Pipes {
            stdin,
            stdout,
            stderr,
        } => {
            let pipe = |on: bool| if on { Stdio::piped() } else { Stdio::null() };
            command
                .stdin(pipe(stdin))
                .stdout(pipe(stdout))
                .stderr(pipe(stderr));
        }
        ExecStdio::Tty => {
            let (m, slave) = open_pty()?;
            command
                .stdin(Stdio::from(slave.try_clone()?))
                .stdout(Stdio::from(slave.try_clone()?))
                .stderr(Stdio::from(slave));
            master = Some(m);
        }
    }
    let parent = nix::unistd::getpid();
    // SAFETY: the hook runs in the forked child before exec. It only makes the setns, chdir,
    // setsid, ioctl, prctl and getppid system calls (async-signal-safe), allocates nothing and
    // takes no locks; the namespace files and the working-directory string were made by the
    // parent and stay valid in the child. The working directory is entered here, after the
    // mount namespace, because `setns` resets it (so `Command::current_dir` cannot be used).
    unsafe {
        command.pre_exec(move || {
            nix::sched::setns(namespaces.net.as_fd(), CloneFlags::CLONE_NEWNET)?;
            if let Some(mnt) = &namespaces.mnt {
                nix::sched::setns(mnt.as_fd(), CloneFlags::CLONE_NEWNS)?;
            }
            if libc::chdir(working_dir.as_ptr()) != 0 {
                return Err(io::Error::last_os_error());
            }
            nix::unistd::setsid()?;
            if tty && libc::ioctl(libc::STDIN_FILENO, libc::TIOCSCTTY, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
            // The agent may have died between fork and prctl; nobody would ever stop us.
            if nix::unistd::getppid() != parent {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
    let mut command = tokio::process::Command::from(command);
    let child = command.spawn().map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("cannot start {program:?} in the container: {e}"),
        )
    })?;
    // The terminal device must be open only in the child, or reads never see its end.
    drop(command);
    let raw = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .ok_or_else(|| io::Error::other("spawned process has no PID"))?;
    let pty = match master {
        Some(m) => {
            // SAFETY: an `OwnedFd` is a valid open descriptor that stays open and the same until
            // the `AsyncFd` owning it drops.
            let master = unsafe { AsyncFd::register(m) }.map_err(io::Error::from)?;
            Some(Pty { master })
        }
        None => None,
    };
    Ok(ExecProcess {
        child,
        pid: Pid::from_raw(raw),
        pty,
        reaped: false,
    })
}

/// What [`run_in_container`] saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOutput {
    /// How the command ended; `None` when it was killed at the timeout.
    pub exit: Option<Exit>,
    /// Its stdout and stderr as they came, cut at the limit.
    pub output: Vec<u8>,
}

/// Runs `argv` in the container to completion (an exec probe): stdin is `/dev/null`, stdout
/// and stderr are collected together up to `limit` bytes (the kubelet keeps 10 KiB of probe
/// output), and the command with its whole process group is killed after `timeout`.
pub async fn run_in_container(
    target: &RunningContainer,
    argv: &[String],
    timeout: Duration,
    limit: usize,
) -> io::Result<ExecOutput> {
    let mut process = spawn_in_container(
        target,
        argv,
        ExecStdio::Pipes {
            stdin: false,
            stdout: true,
            stderr: true,
        },
    )?;
    let stdout = process.take_stdout();
    let stderr = process.take_stderr();
    let mut output = Vec::new();
    let run = async {
        collect(stdout, stderr, &mut output, limit).await;
        process.wait().await
    };
    match tokio::time::timeout(timeout, run).await {
        Ok(exit) => {
            let exit = exit?;
            // Whatever the command left behind in its group goes with it.
            process.kill();
            Ok(ExecOutput {
                exit: Some(exit),
                output,
            })
        }
        Err(_elapsed) => {
            process.kill();
            Ok(ExecOutput { exit: None, output })
        }
    }
}

/// Reads both streams to their end into `out`, keeping at most `limit` bytes.
async fn collect(
    stdout: Option<impl AsyncRead + Unpin>,
    stderr: Option<impl AsyncRead + Unpin>,
    out: &mut Vec<u8>,
    limit: usize,
) {
    let mut a = stdout;
    let mut b = stderr;
    let mut buf_a = [0u8; 4096];
    let mut buf_b = [0u8; 4096];
    while a.is_some() || b.is_some() {
        let read = tokio::select! {
            n = async { a.as_mut().expect("guarded").read(&mut buf_a).await }, if a.is_some() => {
                (0, n)
            }
            n = async { b.as_mut().expect("guarded").read(&mut buf_b).await }, if b.is_some() => {
                (1, n)
            }
        };
        match read {
            (0, Ok(n)) if n > 0 => keep(out, &buf_a[..n], limit),
            (1, Ok(n)) if n > 0 => keep(out, &buf_b[..n], limit),
            (0, _) => a = None,
            _ => b = None,
        }
    }
}

fn keep(out: &mut Vec<u8>, data: &[u8], limit: usize) {
    let room = limit.saturating_sub(out.len());
    out.extend_from_slice(&data[..data.len().min(room)]);
}
