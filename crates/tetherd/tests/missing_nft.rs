//! `tetherd gateway` on a machine without a working `nft`: it stops before it touches the
//! kernel and names the program and its Debian package. `nft` is hidden in a private mount
//! namespace around the command, which runs in a network namespace of its own (root).

use std::process::Output;

use tether_testkit::{HiddenTool, Netns, Stand, require_tools_or_skip};
use tether_wg::PrivateKey;

/// A valid configuration with one peer: everything but `nft` is fine.
fn config(dir: &std::path::Path) -> std::path::PathBuf {
    let peer = PrivateKey::generate().public();
    let yaml = format!(
        "privateKey: {}\nlisten: 0.0.0.0:51820\nmetricsAddress: 127.0.0.1:0\n\
         local:\n  podCidrs: [10.0.0.0/16]\npodInterfaces: [eth0]\npeers:\n\
         \x20 - id: b\n    publicKey: {peer}\n    podCidr: 10.0.0.0/16\n",
        PrivateKey::generate().to_base64()
    );
    let path = dir.join("gateway.yaml");
    std::fs::write(&path, yaml).expect("write config");
    path
}

fn gateway_without_nft(stand: Stand) -> (Output, Vec<String>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = config(dir.path());
    let ns = Netns::new("nonft").expect("namespace");
    let hidden = HiddenTool::new("nft", stand).expect("stand-in");
    let output = hidden
        .command("ip")
        .args(["netns", "exec", ns.name(), env!("CARGO_BIN_EXE_tetherd")])
        .args(["gateway", "--config"])
        .arg(&path)
        .output()
        .expect("tetherd runs");
    let links = ns.ip(&["-o", "link", "show"]).expect("links");
    (output, links.lines().map(str::to_owned).collect())
}

#[test]
fn the_gateway_refuses_to_start_without_nft() {
    if !require_tools_or_skip(&["unshare", "mount"]) {
        return;
    }
    for (stand, what) in [
        (Stand::Missing, "apt-get install nftables"),
        (Stand::Failing, "apt-get install --reinstall nftables"),
    ] {
        let (output, links) = gateway_without_nft(stand);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{stderr}");
        assert!(
            stderr.contains("tetherd gateway needs `nft`") && stderr.contains(what),
            "{stand:?}: {stderr}"
        );
        assert_eq!(links.len(), 1, "only lo, no tunnel device: {links:?}");
    }
}
