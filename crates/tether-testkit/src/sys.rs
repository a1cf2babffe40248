//! The one place the testkit needs `unsafe`: a `pre_exec` hook that moves a child process into a
//! network namespace and ties its life to the test process before it executes.
#![allow(unsafe_code)]

use std::fs::File;
use std::io;
use std::os::unix::process::CommandExt;
use std::process::Command;

use nix::sched::CloneFlags;
use nix::sys::signal::Signal;

/// Makes `command` enter the network namespace `ns` between fork and exec, and asks the kernel to
/// SIGKILL it when the thread that spawns it dies, so a killed test run leaves no daemons behind.
///
/// The parent-death signal fires when the *spawning thread* exits: spawn long-lived children from
/// the test's own thread, not from a short-lived helper thread.
pub(crate) fn enter_netns_on_exec(command: &mut Command, ns: File) {
    let parent = nix::unistd::getpid();
    // SAFETY: the hook runs in the forked child before exec. It only issues the setns, prctl and
    // getppid system calls (async-signal-safe), allocates nothing and touches no locks; `ns` was
    // opened by the parent, so the file descriptor is valid in the child.
    unsafe {
        command.pre_exec(move || {
            nix::sched::setns(&ns, CloneFlags::CLONE_NEWNET)?;
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
            // The parent may have died between fork and prctl; then nobody would ever kill us.
            if nix::unistd::getppid() != parent {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}
