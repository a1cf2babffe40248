//! Checks every rendered ruleset against the real `nft` binary: syntax and kernel acceptance
//! with `nft -c`, then a real apply (twice, as the applier would) inside a throwaway network
//! namespace, reading the fingerprint back from the table comment.
//!
//! Needs root and `nft`. Without them the tests print why they skip, unless `CI` is set, in
//! which case they fail.

mod fixtures;

use std::io::Write as _;
use std::process::{Command, Stdio};

use tether_netplan::{Ruleset, fingerprint_from_comment, plan};

/// Whether the tools are there; panics under CI when they are not.
fn nft_available(test: &str) -> bool {
    let is_root = Command::new("id")
        .arg("-u")
        .output()
        .map(|out| String::from_utf8_lossy(&out.stdout).trim() == "0")
        .unwrap_or(false);
    let has_nft = Command::new("nft")
        .arg("--version")
        .output()
        .is_ok_and(|out| out.status.success());
    if is_root && has_nft {
        return true;
    }
    let reason = if has_nft {
        "not running as root"
    } else {
        "the nft binary is missing"
    };
    assert!(
        std::env::var_os("CI").is_none(),
        "{test}: {reason}, and CI must run this test"
    );
    eprintln!("skipping {test}: {reason} (set up root + nftables to run it)");
    false
}

/// Runs `program args` with `stdin`, returning stdout or panicking with stderr.
fn run(program: &str, args: &[&str], stdin: &str) -> String {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|error| panic!("spawning {program}: {error}"));
    child
        .stdin
        .take()
        .expect("piped stdin")
        .write_all(stdin.as_bytes())
        .expect("writing stdin");
    let out = child.wait_with_output().expect("waiting for child");
    assert!(
        out.status.success(),
        "{program} {args:?} failed: {}\ninput:\n{stdin}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}

#[test]
fn every_rendered_ruleset_passes_nft_check() {
    if !nft_available("every_rendered_ruleset_passes_nft_check") {
        return;
    }
    for (name, input) in fixtures::scenarios() {
        let ruleset = plan(&input).expect("scenario is valid").nft;
        let script = ruleset.render();
        let _ = run("nft", &["-c", "-f", "-"], &script);
        eprintln!("nft -c accepted scenario {name}");
    }
}

#[test]
fn applied_ruleset_reports_its_fingerprint_and_reapplies_atomically() {
    if !nft_available("applied_ruleset_reports_its_fingerprint_and_reapplies_atomically") {
        return;
    }
    for (name, input) in fixtures::scenarios() {
        let ruleset = plan(&input).expect("scenario is valid").nft;
        // `unshare -n` gives the shell a fresh network namespace that dies with it, so nothing
        // can leak into the host's ruleset. Applying twice proves the script also replaces an
        // existing table; the stale table from the first apply must not survive the second.
        let script = format!(
            "{render}{stale}{render}",
            render = ruleset.render(),
            stale = "add chain ip tether stale\n",
        );
        let listing = run(
            "unshare",
            &["-n", "sh", "-c", "nft -f - && nft list table ip tether"],
            &script,
        );
        let comment = listing
            .lines()
            .find_map(|line| line.trim().strip_prefix("comment \""))
            .and_then(|rest| rest.strip_suffix('"'))
            .unwrap_or_else(|| panic!("{name}: no table comment in\n{listing}"));
        assert_eq!(
            fingerprint_from_comment(comment),
            Some(ruleset.fingerprint().as_str())
        );
        assert!(
            !listing.contains("chain stale"),
            "{name}: stale chain survived:\n{listing}"
        );
        for chain in &ruleset.chains {
            assert!(
                listing.contains(&format!("chain {} {{", chain.name)),
                "{name}: {listing}"
            );
        }
    }
}

#[test]
fn delete_script_removes_the_table() {
    if !nft_available("delete_script_removes_the_table") {
        return;
    }
    let (_, input) = fixtures::scenarios().swap_remove(1);
    let ruleset = plan(&input).expect("scenario is valid").nft;
    let script = format!(
        "{}{}",
        ruleset.render(),
        Ruleset::render_delete(&ruleset.table)
    );
    let listing = run(
        "unshare",
        &["-n", "sh", "-c", "nft -f - && nft list tables"],
        &script,
    );
    assert_eq!(listing.trim(), "", "table left behind");
}
