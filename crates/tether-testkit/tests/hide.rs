//! Hidden programs: a command in a private mount namespace sees the stand-in, the rest of the
//! machine keeps the real program (root).

use std::process::Command;

use tether_testkit::{HiddenTool, STAND_IN_ERROR, Stand, require_tools_or_skip};

fn real_nft_runs() -> bool {
    Command::new("nft")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn a_missing_program_is_gone_only_for_the_command() {
    if !require_tools_or_skip(&["unshare", "mount"]) {
        return;
    }
    let hidden = HiddenTool::new("nft", Stand::Missing).expect("stand-in");
    let output = hidden
        .command("sh")
        .args(["-c", "nft --version; echo status=$?"])
        .output()
        .expect("runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("status=126") || stdout.contains("status=127"),
        "nft must not run: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(real_nft_runs(), "the mount must not leak out");
}

#[test]
fn a_version_only_stand_in_passes_a_version_check_and_fails_work() {
    if !require_tools_or_skip(&["unshare", "mount"]) {
        return;
    }
    let hidden = HiddenTool::new("nft", Stand::VersionOnly).expect("stand-in");
    let version = hidden
        .command("nft")
        .arg("--version")
        .output()
        .expect("runs");
    assert!(version.status.success());
    assert!(String::from_utf8_lossy(&version.stdout).contains("stand-in"));
    let work = hidden
        .command("nft")
        .args(["list", "tables"])
        .output()
        .expect("runs");
    assert!(!work.status.success());
    assert!(String::from_utf8_lossy(&work.stderr).contains(STAND_IN_ERROR));
    let failing = HiddenTool::new("nft", Stand::Failing).expect("stand-in");
    let version = failing
        .command("nft")
        .arg("--version")
        .output()
        .expect("runs");
    assert!(!version.status.success());
    assert!(real_nft_runs(), "the mount must not leak out");
}
