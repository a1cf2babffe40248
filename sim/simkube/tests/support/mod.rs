//! Helpers shared by the test files that drive the real kubectl.

#![allow(dead_code)]

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

/// One kubeconfig file and one discovery cache directory, both private to a test, so that no
/// test sees another's cached discovery.
pub(crate) struct Kubectl {
    dir: tempfile::TempDir,
    kubeconfig: std::path::PathBuf,
}

impl Kubectl {
    pub(crate) fn new(cluster: &simkube::Cluster) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let kubeconfig = dir.path().join("kubeconfig");
        cluster
            .write_kubeconfig(&kubeconfig)
            .expect("write kubeconfig");
        Self { dir, kubeconfig }
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
        let mut cmd = Command::new("kubectl");
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
