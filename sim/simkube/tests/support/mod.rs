//! Helpers shared by the test files that drive the real kubectl.

#![allow(dead_code)]

pub(crate) mod crd;
pub(crate) mod https;
pub(crate) mod webhook;

use std::path::PathBuf;
use std::process::{Command, Stdio};

/// Whether kubectl can run here. Without it a test skips and says so; in CI (`CI` set) a
/// missing kubectl is a failure, because the contract tests exist to run the real binary.
pub(crate) fn kubectl_available() -> bool {
    let found = Command::new("kubectl")
        .args(["version", "--client"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        assert!(
            std::env::var_os("CI").is_none(),
            "kubectl is required in CI but was not found on PATH"
        );
        eprintln!("skipping: kubectl not found on PATH (set CI to make this a failure)");
    }
    found
}

/// The version-specific kubectl binaries installed beside the `kubectl` on PATH
/// (`kubectl.1.27` to `kubectl.1.33`), by minor version, oldest first. The `kubectl` on PATH is
/// a dispatcher that runs the one matching the server's reported version (1.33), so a test
/// that needs another client version runs that binary directly. Empty when there are none:
/// callers skip then, except in CI (`CI` set), where that is a failure.
pub(crate) fn kubectl_binaries() -> Vec<(u32, PathBuf)> {
    let dispatcher = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .map(|dir| dir.join("kubectl"))
        .find(|p| p.is_file())
        .and_then(|p| std::fs::canonicalize(p).ok());
    let mut found: Vec<(u32, PathBuf)> = dispatcher
        .as_deref()
        .and_then(std::path::Path::parent)
        .and_then(|dir| std::fs::read_dir(dir).ok())
        .into_iter()
        .flatten()
        .filter_map(|entry| {
            let path = entry.ok()?.path();
            let minor = path.file_name()?.to_str()?.strip_prefix("kubectl.1.")?;
            Some((minor.parse().ok()?, path))
        })
        .collect();
    found.sort();
    if found.is_empty() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI needs the version-specific kubectl binaries (kubectl.1.27 ... kubectl.1.33) beside the kubectl dispatcher"
        );
        eprintln!("skipping: no version-specific kubectl binaries beside kubectl on PATH");
    }
    found
}

/// One kubeconfig file and one discovery cache directory, both private to a test, so that no
/// test sees another's cached discovery.
pub(crate) struct Kubectl {
    dir: tempfile::TempDir,
    kubeconfig: std::path::PathBuf,
    binary: PathBuf,
}

impl Kubectl {
    pub(crate) fn new(cluster: &simkube::Cluster) -> Self {
        Self::with_binary(cluster, PathBuf::from("kubectl"))
    }

    /// Runs the given kubectl binary instead of the dispatcher on PATH.
    pub(crate) fn with_binary(cluster: &simkube::Cluster, binary: PathBuf) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let kubeconfig = dir.path().join("kubeconfig");
        cluster
            .write_kubeconfig(&kubeconfig)
            .expect("write kubeconfig");
        Self {
            dir,
            kubeconfig,
            binary,
        }
    }

    /// Writes a manifest into the test's directory and returns its path for `-f`.
    pub(crate) fn file(&self, name: &str, body: &str) -> String {
        let p = self.dir.path().join(name);
        std::fs::write(&p, body).expect("manifest");
        p.to_str().expect("utf-8 path").to_owned()
    }

    /// A kubectl command using the shared cache (for commands a test streams, like `get -w`).
    pub(crate) fn command(&self, args: &[&str]) -> Command {
        self.command_with_cache("cache", args)
    }

    /// A kubectl command with its own cache directory (to observe a cold discovery).
    pub(crate) fn command_with_cache(&self, cache: &str, args: &[&str]) -> Command {
        let mut cmd = Command::new(&self.binary);
        cmd.arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(self.dir.path().join(cache))
            .args(args);
        cmd
    }

    /// Runs a command off the async runtime, so the in-process server keeps serving.
    pub(crate) async fn output(mut cmd: Command) -> std::process::Output {
        tokio::task::spawn_blocking(move || cmd.output().expect("run kubectl"))
            .await
            .expect("join")
    }

    pub(crate) async fn run(&self, args: &[&str]) -> std::process::Output {
        Self::output(self.command(args)).await
    }

    /// Runs kubectl, asserts success and returns stdout.
    pub(crate) async fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args).await;
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs kubectl, asserts failure and returns stderr.
    pub(crate) async fn fails(&self, args: &[&str]) -> String {
        let out = self.run(args).await;
        assert!(
            !out.status.success(),
            "kubectl {args:?} should fail: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    }
}
