//! `cargo xtask test`: the set-up, then the workspace's tests, with every skipped test counted.
//! A test that cannot run here prints one line starting with [`SKIP_MARKER`] (the testkit's
//! preflight does it); the lines pass through to the output as they come, and are listed again
//! at the end. With `CI` set, any skip fails the run: CI must run every test.

use std::io::BufReader;
use std::process::{Command, Stdio};

use crate::Result;

/// The testkit's `tether_testkit::SKIP_MARKER` (xtask stays free of dependencies; a test below
/// checks that the two agree).
const SKIP_MARKER: &str = "TETHER-TEST-SKIPPED:";

/// Sets up the machine and runs `cargo test --workspace --locked --no-fail-fast <args>`.
pub(crate) fn run(args: &[String]) -> Result {
    crate::setup::ensure(crate::setup::BASE)?;
    preflight()?;
    let mut command = Command::new(crate::cargo_program());
    command
        .args(["test", "--workspace", "--locked", "--no-fail-fast"])
        .args(args)
        .current_dir(crate::workspace_root())
        .stdout(Stdio::piped());
    let line = crate::command_line(&command);
    println!("xtask: $ {line}");
    let mut child = command
        .spawn()
        .map_err(|e| format!("cannot run `{line}`: {e}"))?;
    let stdout = child.stdout.take().ok_or("no pipe from cargo test")?;
    let skipped = forward(BufReader::new(stdout), &mut std::io::stdout().lock())
        .map_err(|e| format!("reading the output of `{line}`: {e}"))?;
    let status = child
        .wait()
        .map_err(|e| format!("waiting for `{line}`: {e}"))?;
    report(&skipped);
    if !status.success() {
        return Err(format!("`{line}` failed ({status})"));
    }
    if crate::in_ci() && !skipped.is_empty() {
        return Err(format!(
            "{} test(s) skipped, but CI is set and every test must run here",
            skipped.len()
        ));
    }
    Ok(())
}

/// Root and kubectl: without them the privileged and kubectl tests skip, which CI forbids.
fn preflight() -> Result {
    let kubectl = Command::new("kubectl")
        .args(["version", "--client"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    let mut problems = Vec::new();
    if !crate::is_root() {
        problems.push("not root: the network-namespace tests will skip");
    }
    if !kubectl {
        problems.push(
            "kubectl does not run: the kubectl tests will skip (they need kubectl 1.27 to \
             1.33, which Debian does not package; install it from the Kubernetes project)",
        );
    }
    if problems.is_empty() {
        return Ok(());
    }
    if crate::in_ci() {
        return Err(format!(
            "CI is set, so every test must run, but {}",
            problems.join("; ")
        ));
    }
    for problem in problems {
        println!("xtask: warning: {problem}");
    }
    Ok(())
}

/// Copies `input` to `output` line by line and returns the skip lines.
fn forward(
    input: impl std::io::BufRead,
    output: &mut impl std::io::Write,
) -> std::io::Result<Vec<String>> {
    let mut skipped = Vec::new();
    for line in input.lines() {
        let line = line?;
        writeln!(output, "{line}")?;
        output.flush()?;
        if let Some(rest) = line.trim_start().strip_prefix(SKIP_MARKER) {
            skipped.push(rest.trim().to_owned());
        }
    }
    Ok(skipped)
}

fn report(skipped: &[String]) {
    if skipped.is_empty() {
        println!("xtask: no test skipped");
        return;
    }
    println!("xtask: {} test(s) skipped:", skipped.len());
    for line in skipped {
        println!("xtask:   {line}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skip_lines_are_passed_on_and_collected() {
        let input = "running 2 tests\n\
                     TETHER-TEST-SKIPPED: agent::a: not running as root; run as root\n\
                     test agent::a ... ok\n\
                     test agent::b ... ok\n";
        let mut output = Vec::new();
        let skipped = forward(BufReader::new(input.as_bytes()), &mut output).expect("forward");
        assert_eq!(String::from_utf8(output).expect("utf-8"), input);
        assert_eq!(skipped, vec!["agent::a: not running as root; run as root"]);
    }

    #[test]
    fn the_marker_is_the_testkits() {
        let preflight = crate::workspace_root().join("crates/tether-testkit/src/preflight.rs");
        let text = std::fs::read_to_string(&preflight).expect("the testkit's preflight");
        assert!(
            text.contains(&format!("pub const SKIP_MARKER: &str = \"{SKIP_MARKER}\";")),
            "xtask and the testkit disagree on the skip marker"
        );
    }
}
