//! The skip line: a skipped test's marker reaches the process's standard output even though the
//! harness captures what tests print, so a test runner can count skips.

use std::process::Command;

/// Only does something when the test below runs this binary again: then it skips, as a test
/// on a machine without the program would.
#[test]
fn child_that_skips() {
    if std::env::var_os("TETHER_TESTKIT_SKIP_CHILD").is_none() {
        return;
    }
    assert!(!tether_testkit::require_tools_or_skip(&[
        "tether-no-such-program"
    ]));
}

#[test]
fn a_skip_prints_the_marker_past_the_capture() {
    let exe = std::env::current_exe().expect("own test binary");
    let output = Command::new(exe)
        .args(["--exact", "child_that_skips", "--test-threads", "2"])
        .env("TETHER_TESTKIT_SKIP_CHILD", "1")
        .env_remove("CI")
        .output()
        .expect("the test binary runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    let line = stdout
        .lines()
        .find(|l| l.starts_with(tether_testkit::SKIP_MARKER))
        .unwrap_or_else(|| panic!("no skip line in:\n{stdout}"));
    assert!(line.contains("child_that_skips: "), "{line}");
    let reason = if tether_testkit::is_root() {
        "tether-no-such-program"
    } else {
        "root"
    };
    assert!(line.contains(reason), "{line}");
}

#[test]
fn with_ci_set_a_missing_requirement_fails_the_test() {
    let exe = std::env::current_exe().expect("own test binary");
    let output = Command::new(exe)
        .args(["--exact", "child_that_skips"])
        .env("TETHER_TESTKIT_SKIP_CHILD", "1")
        .env("CI", "true")
        .output()
        .expect("the test binary runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(!output.status.success(), "{stdout}");
    assert!(stdout.contains("CI is set"), "{stdout}");
    assert!(!stdout.contains(tether_testkit::SKIP_MARKER), "{stdout}");
}
