//! The system programs a binary runs (`nft`, `ip`), checked once at start so that a missing or
//! broken one fails the command at once with the program and its Debian package named, instead
//! of failing later in a log file.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A program found through `PATH`, and where it comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tool {
    /// The program name as it is run.
    pub program: &'static str,
    /// The Debian package that installs it.
    pub package: &'static str,
    /// An argument that makes it print its version and exit 0, to show that it runs.
    pub version_arg: &'static str,
}

/// `nft`: nftables rule sets (the gateway's NAT, the simulated nodes' service proxy).
pub const NFT: Tool = Tool {
    program: "nft",
    package: "nftables",
    version_arg: "--version",
};

/// `ip`: named network namespaces, links, addresses and routes.
pub const IP: Tool = Tool {
    program: "ip",
    package: "iproute2",
    version_arg: "-V",
};

/// Why a required program cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    /// No executable file of that name on `PATH`.
    #[error(
        "{needed_by} needs `{program}`, which is not installed (no executable `{program}` on \
         PATH); install the Debian package {package}: `apt-get install {package}`"
    )]
    Missing {
        /// What needs it.
        needed_by: String,
        /// The program.
        program: &'static str,
        /// Its Debian package.
        package: &'static str,
    },
    /// It is there but does not run.
    #[error(
        "{needed_by} needs `{program}`, but {} does not work (`{program} {version_arg}`: \
         {message}); reinstall the Debian package {package}: `apt-get install --reinstall \
         {package}`",
        path.display()
    )]
    Broken {
        /// What needs it.
        needed_by: String,
        /// The program.
        program: &'static str,
        /// Its Debian package.
        package: &'static str,
        /// Where it was found.
        path: PathBuf,
        /// The argument it was run with.
        version_arg: &'static str,
        /// What went wrong.
        message: String,
    },
}

/// Checks that every tool in `tools` is on `PATH` and runs; `needed_by` names the command in
/// the error ("simkube cluster up", "tetherd gateway").
pub fn require(needed_by: &str, tools: &[Tool]) -> Result<(), ToolError> {
    for tool in tools {
        check(needed_by, tool)?;
    }
    Ok(())
}

fn check(needed_by: &str, tool: &Tool) -> Result<(), ToolError> {
    let Some(path) = find_in_path(tool.program) else {
        return Err(ToolError::Missing {
            needed_by: needed_by.to_owned(),
            program: tool.program,
            package: tool.package,
        });
    };
    let broken = |message: String| ToolError::Broken {
        needed_by: needed_by.to_owned(),
        program: tool.program,
        package: tool.package,
        path: path.clone(),
        version_arg: tool.version_arg,
        message,
    };
    let output = Command::new(&path)
        .arg(tool.version_arg)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| broken(e.to_string()))?;
    if output.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    let first = stderr.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    Err(broken(format!("{}: {}", output.status, first.trim())))
}

/// The first executable regular file named `program` in a directory of `PATH`, as the shell
/// would run it.
pub fn find_in_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| is_executable_file(candidate))
}

fn is_executable_file(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_program_is_named_with_its_package() {
        let tool = Tool {
            program: "tether-no-such-program",
            package: "tether-no-such-package",
            version_arg: "--version",
        };
        let error = require("the test", &[tool])
            .expect_err("missing")
            .to_string();
        assert!(
            error.contains("`tether-no-such-program`")
                && error.contains("apt-get install tether-no-such-package")
                && error.starts_with("the test needs"),
            "{error}"
        );
    }

    #[test]
    fn a_program_that_fails_to_run_is_broken() {
        // `false` is on every PATH and exits 1 whatever its argument.
        let tool = Tool {
            program: "false",
            package: "coreutils",
            version_arg: "--version",
        };
        match require("the test", &[tool]) {
            Err(ToolError::Broken { path, message, .. }) => {
                assert!(path.ends_with("false"), "{}", path.display());
                assert!(message.contains("exit status: 1"), "{message}");
            }
            other => panic!("expected Broken, got {other:?}"),
        }
        let working = Tool {
            program: "true",
            package: "coreutils",
            version_arg: "--version",
        };
        require("the test", &[working]).expect("true runs");
    }

    #[test]
    fn only_executable_files_are_found() {
        assert!(find_in_path("sh").is_some());
        let dir = tempfile_dir();
        let plain = dir.join("tether-plain");
        std::fs::write(&plain, "not a program").expect("write");
        assert!(!is_executable_file(&plain));
        assert!(!is_executable_file(&dir), "a directory is no program");
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn tempfile_dir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!("tether-tools-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("mkdir");
        dir
    }
}
