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
