//! Hides a system program (`nft`, `ip`) from one command, the way a machine without it would:
//! the command runs in a private mount namespace in which every copy of the program on `PATH`
//! is covered by a bind mount, so absolute paths and `PATH` lookups both see the stand-in. The
//! rest of the machine, other tests included, keeps the real program.
//!
//! ```no_run
//! use tether_testkit::{HiddenTool, Stand};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let hidden = HiddenTool::new("nft", Stand::Missing)?;
//! let output = hidden.command("nft").arg("--version").output()?;
//! assert!(!output.status.success());
//! # Ok(())
//! # }
//! ```

use std::ffi::OsStr;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{Error, Result};

/// What a hidden program is replaced with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stand {
    /// Nothing that runs (`/dev/null`): as if the package were not installed.
    Missing,
    /// A program that fails whatever it is asked: installed but broken.
    Failing,
    /// A program that prints a version for `--version`, `-V` or `-v` and fails everything else:
    /// it passes a start-up check and fails at work.
    VersionOnly,
}

/// The message every stand-in program prints on failure, for tests to look for.
pub const STAND_IN_ERROR: &str = "simulated failure of a hidden program";

/// A program hidden from the commands built by [`HiddenTool::command`].
#[derive(Debug)]
pub struct HiddenTool {
    _dir: tempfile::TempDir,
    replacement: PathBuf,
    targets: Vec<PathBuf>,
}

impl HiddenTool {
    /// Prepares the stand-in for `program`, which must be on `PATH`. Needs root to be used
    /// (mount namespaces), plus `unshare` and `mount` from util-linux.
    pub fn new(program: &str, stand: Stand) -> Result<Self> {
        let targets = copies_on_path(program);
        if targets.is_empty() {
            return Err(Error::Invalid(format!(
                "cannot hide `{program}`: it is not on PATH to begin with"
            )));
        }
        let dir = tempfile::tempdir().map_err(io("creating the stand-in directory"))?;
        let replacement = match stand {
            Stand::Missing => PathBuf::from("/dev/null"),
            Stand::Failing => write_script(dir.path(), program, "")?,
            Stand::VersionOnly => write_script(
                dir.path(),
                program,
                &format!(
                    "case \"$1\" in --version|-V|-v) echo \"{program} (stand-in) v0.0.0\"; exit 0;; esac\n"
                ),
            )?,
        };
        Ok(Self {
            _dir: dir,
            replacement,
            targets,
        })
    }

    /// A command running `program` in a private mount namespace with the program hidden; add
    /// arguments, environment and redirections as usual. The mounts never propagate back.
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut command = Command::new("unshare");
        command
            .args(["--mount", "--propagation", "slave", "--", "sh", "-c"])
            .arg(
                "r=$1; n=$2; shift 2; \
                 while [ \"$n\" -gt 0 ]; do mount --bind \"$r\" \"$1\" || exit 125; shift; n=$((n-1)); done; \
                 exec \"$@\"",
            )
            .arg("sh")
            .arg(&self.replacement)
            .arg(self.targets.len().to_string())
            .args(&self.targets)
            .arg(program);
        command
    }
}

/// Every distinct file that `PATH` resolves `program` to (through symlinked directories).
fn copies_on_path(program: &str) -> Vec<PathBuf> {
    let Some(path) = std::env::var_os("PATH") else {
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = Vec::new();
    for dir in std::env::split_paths(&path) {
        let Ok(real) = dir.join(program).canonicalize() else {
            continue;
        };
        if real.is_file() && !found.contains(&real) {
            found.push(real);
        }
    }
    found
}

fn write_script(dir: &Path, program: &str, prelude: &str) -> Result<PathBuf> {
    let path = dir.join(program);
    let script =
        format!("#!/bin/sh\n{prelude}echo \"{program}: {STAND_IN_ERROR} ($*)\" >&2\nexit 1\n");
    std::fs::write(&path, script).map_err(io("writing the stand-in"))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
        .map_err(io("making the stand-in executable"))?;
    Ok(path)
}

fn io(action: &'static str) -> impl FnOnce(std::io::Error) -> Error {
    move |source| Error::io(action, source)
}
