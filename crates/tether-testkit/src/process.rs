//! A guard around a child process started in a test namespace: it is stopped by PID (SIGTERM,
//! then SIGKILL) and reaped when the guard drops, also while a failing test unwinds.

use std::io;
use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// How long a process gets to exit after SIGTERM before it is killed.
pub const DEFAULT_STOP_TIMEOUT: Duration = Duration::from_secs(5);

const POLL: Duration = Duration::from_millis(10);

/// Owns a child process; dropping the guard stops and reaps it.
#[derive(Debug)]
pub struct ProcessGuard {
    child: Child,
    label: String,
    stop_timeout: Duration,
    status: Option<ExitStatus>,
}

impl ProcessGuard {
    /// Wraps an already spawned child. `label` names it in logs and errors.
    pub fn new(child: Child, label: impl Into<String>) -> Self {
        Self {
            child,
            label: label.into(),
            stop_timeout: DEFAULT_STOP_TIMEOUT,
            status: None,
        }
    }

    /// Changes how long [`ProcessGuard::stop`] waits after SIGTERM before sending SIGKILL.
    pub fn with_stop_timeout(mut self, timeout: Duration) -> Self {
        self.stop_timeout = timeout;
        self
    }

    /// The process ID.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The label given at spawn time.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The underlying child, for taking its stdout/stderr pipes.
    pub fn child_mut(&mut self) -> &mut Child {
        &mut self.child
    }

    /// The exit status if the process has exited, without blocking.
    pub fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        if self.status.is_none() {
            self.status = self.child.try_wait()?;
        }
        Ok(self.status)
    }

    /// Waits up to `timeout` for the process to exit on its own.
    pub fn wait_timeout(&mut self, timeout: Duration) -> io::Result<Option<ExitStatus>> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.try_wait()? {
                return Ok(Some(status));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            std::thread::sleep(POLL);
        }
    }

    /// Sends `signal` to the process (by PID) unless it already exited.
    pub fn signal(&mut self, signal: Signal) -> io::Result<()> {
        if self.try_wait()?.is_some() {
            return Ok(());
        }
        kill(self.pid_t(), signal).map_err(io::Error::from)
    }

    /// Stops the process: SIGTERM, then SIGKILL after the stop timeout; returns how it exited.
    pub fn stop(&mut self) -> io::Result<ExitStatus> {
        if let Some(status) = self.try_wait()? {
            return Ok(status);
        }
        self.signal(Signal::SIGTERM)?;
        if let Some(status) = self.wait_timeout(self.stop_timeout)? {
            return Ok(status);
        }
        let pid = self.pid();
        tracing::warn!(process = %self.label, pid, "did not exit after SIGTERM, killing");
        self.signal(Signal::SIGKILL)?;
        let status = self.child.wait()?;
        self.status = Some(status);
        Ok(status)
    }

    fn pid_t(&self) -> Pid {
        // Linux PIDs fit in i32 (pid_max is at most 2^22).
        Pid::from_raw(i32::try_from(self.child.id()).expect("invariant: Linux PIDs fit in i32"))
    }
}

impl Drop for ProcessGuard {
    fn drop(&mut self) {
        if let Err(error) = self.stop() {
            tracing::warn!(process = %self.label, pid = self.pid(), %error, "could not stop");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn drop_terminates_and_reaps() {
        let child = Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id();
        drop(ProcessGuard::new(child, "sleep"));
        // Reaped: the PID no longer names our child (a zombie would still have /proc/<pid>).
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
    }

    #[test]
    fn sigkill_after_timeout_when_term_is_ignored() {
        let child = Command::new("sh")
            .args(["-c", "trap '' TERM; echo ready; exec sleep 30"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut guard =
            ProcessGuard::new(child, "stubborn").with_stop_timeout(Duration::from_millis(200));
        // Wait until the trap is installed, or SIGTERM would win the race.
        let mut line = String::new();
        let stdout = guard.child_mut().stdout.take().unwrap();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line).unwrap();
        let started = Instant::now();
        let status = guard.stop().unwrap();
        assert!(started.elapsed() >= Duration::from_millis(200));
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(9)
        );
    }
}
