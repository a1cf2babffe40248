//! `cluster up` on a machine that cannot run a cluster: a missing program, a service proxy
//! whose rules fail, a cluster DNS that cannot start. Each time `up` fails with the reason
//! and leaves nothing behind. The programs are hidden in a private mount namespace around the
//! `simkube` command (and so around its daemon and node agents), as on a machine without them.
//! Needs root.

mod support;

use std::process::Output;

use support::{Env, SIMKUBE};
use tether_testkit::{HiddenTool, STAND_IN_ERROR, Stand};

fn up_args<'a>(env: &'a Env, name: &'a str, kubeconfig: &'a str) -> Vec<&'a str> {
    vec![
        "cluster",
        "up",
        "--name",
        name,
        "--nodes",
        "2",
        "--underlay",
        &env.underlay,
        "--kubeconfig-out",
        kubeconfig,
        "--timeout",
        "60",
    ]
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn up_refuses_to_start_without_nft_and_creates_nothing() {
    let Some(mut env) = Env::new("nonft") else {
        return;
    };
    let name = env.name("nonft");
    env.clusters.push(name.clone());
    let kubeconfig = env.state_dir().join("k").to_string_lossy().into_owned();
    let hidden = HiddenTool::new("nft", Stand::Missing).expect("stand-in");
    let output = env.simkube_as(hidden.command(SIMKUBE), &up_args(&env, &name, &kubeconfig));
    let stderr = stderr(&output);
    assert!(!output.status.success(), "{stderr}");
    assert!(
        stderr.contains("simkube cluster up needs `nft`")
            && stderr.contains("apt-get install nftables"),
        "{stderr}"
    );
    assert!(
        !env.state_dir().join(&name).exists(),
        "nothing is created before the check"
    );
    env.assert_nothing_left(&name);
}

#[test]
fn up_fails_with_the_reason_and_cleans_up_when_a_service_proxy_cannot_apply_its_rules() {
    let Some(mut env) = Env::new("noproxy") else {
        return;
    };
    let name = env.name("noproxy");
    env.clusters.push(name.clone());
    let kubeconfig = env.state_dir().join("k").to_string_lossy().into_owned();
    // `nft --version` works, so every start-up check passes; applying rules fails.
    let hidden = HiddenTool::new("nft", Stand::VersionOnly).expect("stand-in");
    let output = env.simkube_as(hidden.command(SIMKUBE), &up_args(&env, &name, &kubeconfig));
    let stderr = stderr(&output);
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("network created"), "it got going: {stderr}");
    assert!(
        stderr.contains("the service proxy failed") && stderr.contains(STAND_IN_ERROR),
        "{stderr}"
    );
    assert!(!stderr.contains("is up"), "{stderr}");
    assert!(!std::path::Path::new(&kubeconfig).exists());
    assert!(
        env.state_dir()
            .join(format!("{name}.failed"))
            .join("daemon.log")
            .exists(),
        "the logs are kept"
    );
    env.assert_nothing_left(&name);
}

#[test]
fn up_fails_with_the_reason_and_cleans_up_when_the_cluster_dns_cannot_start() {
    let Some(mut env) = Env::new("nodns") else {
        return;
    };
    let name = env.name("nodns");
    env.clusters.push(name.clone());
    let kubeconfig = env.state_dir().join("k").to_string_lossy().into_owned();
    // Port 53 of every address of the underlay is taken before the cluster comes.
    let taken = take_dns_port(&env.underlay);
    let output = env.simkube(&up_args(&env, &name, &kubeconfig));
    drop(taken);
    let stderr = stderr(&output);
    assert!(!output.status.success(), "{stderr}");
    assert!(
        stderr.contains("the cluster daemon exited") && stderr.contains("DNS server"),
        "{stderr}"
    );
    env.assert_nothing_left(&name);
}

/// Creates the named namespace `underlay` and binds UDP port 53 on all its addresses, from a
/// thread that enters it; the socket holds the port until dropped.
fn take_dns_port(underlay: &str) -> std::net::UdpSocket {
    let status = std::process::Command::new("ip")
        .args(["netns", "add", underlay])
        .status()
        .expect("ip runs");
    assert!(status.success(), "ip netns add {underlay}");
    let path = format!("/run/netns/{underlay}");
    std::thread::spawn(move || {
        let netns = std::fs::File::open(&path).expect("the namespace");
        nix::sched::setns(&netns, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
        std::net::UdpSocket::bind(("0.0.0.0", 53)).expect("port 53 is free in a new namespace")
    })
    .join()
    .expect("the thread")
}

#[test]
fn a_node_agent_without_nft_stops_at_once_and_reports_why_in_its_status_file() {
    if !tether_testkit::require_tools_or_skip(&["unshare", "mount"]) {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let status = dir.path().join("status.json");
    let hidden = HiddenTool::new("nft", Stand::Missing).expect("stand-in");
    let output = hidden
        .command(SIMKUBE)
        .args([
            "node",
            "--kubeconfig",
            "/nonexistent/kubeconfig",
            "--name",
            "n1",
        ])
        .args([
            "--pod-cidr",
            "10.244.1.0/24",
            "--internal-ip",
            "198.18.250.11",
        ])
        .args(["--cluster-cidr", "10.244.0.0/16", "--status-file"])
        .arg(&status)
        .output()
        .expect("simkube node runs");
    let stderr = stderr(&output);
    assert!(!output.status.success(), "{stderr}");
    assert!(
        stderr.contains("the node agent needs `nft`") && stderr.contains("nftables"),
        "{stderr}"
    );
    let report = simkube_node::status::read(&status)
        .expect("readable")
        .expect("the agent wrote its status");
    let fatal = report.fatal.expect("the reason");
    assert!(fatal.contains("needs `nft`"), "{fatal}");
}
