//! The command line without a cluster: parsing, usage errors (exit 2) that name the bad input,
//! unreachable clusters (exit 3), the kubectl plugin name, version and completion.

mod support;

use support::{run_binary, tether, unreachable_kubeconfig};

const TOKEN: &str = "east-1.abc123.0123456789abcdefghijklmnopqrstuv";
const FP: &str = "sha256:0000000000000000000000000000000000000000000000000000000000000000";

#[tokio::test]
async fn usage_errors_exit_2_and_name_the_problem() {
    let cases: &[(&[&str], &str)] = &[
        (&["install", "--bogus"], "--bogus"),
        (
            &["install", "--cluster-id", "Bad_ID"],
            "invalid cluster ID \"Bad_ID\"",
        ),
        (
            &["install", "--cluster-id", "ok", "--timeout", "soon"],
            "--timeout",
        ),
        (
            &["install", "--cluster-id", "ok", "--identity-lifetime", "5m"],
            "too short",
        ),
        (
            &[
                "install",
                "--cluster-id",
                "ok",
                "--auth-service-type",
                "ClusterIP",
            ],
            "ClusterIP",
        ),
        (&["install", "-o", "json"], "--dry-run"),
        (&["peer"], "--remote-kubeconfig"),
        (
            &["peer", "--auth-url", "https://h:443", "--token", TOKEN],
            "--ca-fingerprint",
        ),
        (
            &[
                "peer",
                "--auth-url",
                "https://h:443",
                "--token",
                "nope",
                "--ca-fingerprint",
                FP,
            ],
            "malformed peering token",
        ),
        (
            &[
                "peer",
                "--auth-url",
                "https://h:443",
                "--token",
                TOKEN,
                "--ca-fingerprint",
                "md5:00",
            ],
            "invalid --ca-fingerprint",
        ),
        (
            &[
                "peer",
                "--auth-url",
                "http://h:443",
                "--token",
                TOKEN,
                "--ca-fingerprint",
                FP,
            ],
            "must start with https://",
        ),
        (
            &[
                "peer",
                "--auth-url",
                "https://h:443",
                "--token",
                TOKEN,
                "--ca-fingerprint",
                FP,
                "--modules",
                "authentication,offloading",
            ],
            "offloading asks the provider for resources",
        ),
        (
            &[
                "peer",
                "--auth-url",
                "https://h:443",
                "--token",
                TOKEN,
                "--ca-fingerprint",
                FP,
                "--modules",
                "teleport",
            ],
            "unknown module",
        ),
        (
            &[
                "peer",
                "--in-band",
                "--auth-url",
                "https://h:443",
                "--token",
                TOKEN,
                "--ca-fingerprint",
                FP,
            ],
            "--in-band needs --remote-kubeconfig",
        ),
        (
            &[
                "peer",
                "--in-band",
                "--remote-kubeconfig",
                "/dev/null",
                "--modules",
                "authentication",
            ],
            "keep `networking` in --modules",
        ),
        (
            &[
                "install",
                "--pod-cidr",
                "10.244.0.0/16",
                "--external-cidr",
                "10.244.0.0/20",
            ],
            "overlaps this cluster's pod",
        ),
        (
            &[
                "install",
                "--pod-cidr",
                "10.244.0.0/16",
                "--external-cidr",
                "10.70.0.0/31",
            ],
            "too small",
        ),
        (
            &[
                "peer",
                "--auth-url",
                "https://h:443",
                "--token",
                TOKEN,
                "--ca-fingerprint",
                FP,
                "--gateway-server",
                "consumer",
                "--gateway-port",
                "31000",
            ],
            "--gateway-address and --gateway-port say how to dial the provider's gateway server",
        ),
        (&["unpeer"], "--remote-cluster-id"),
        (&["unpeer", "--remote-cluster-id=-x"], "invalid cluster ID"),
        (&["generate", "peer-command", "--ttl", "0s"], "--ttl"),
        (&["completion", "powershell"], "powershell"),
    ];
    for (args, needle) in cases {
        let run = tether(args).await;
        assert_eq!(run.code, 2, "{args:?}: {run:?}");
        assert!(
            run.stderr.contains(needle),
            "{args:?}: stderr lacks {needle:?}: {}",
            run.stderr
        );
    }
}

#[tokio::test]
async fn a_missing_kubeconfig_is_a_usage_error() {
    let run = tether(&["--kubeconfig", "/nonexistent/kubeconfig", "status"]).await;
    run.assert_fails(2, &["/nonexistent/kubeconfig", "--kubeconfig"]);
}

#[tokio::test]
async fn an_unreachable_cluster_exits_3_naming_its_url() {
    let dir = tempfile::tempdir().expect("tempdir");
    let kc = unreachable_kubeconfig(dir.path());
    let kc = kc.to_str().expect("utf-8");
    for args in [
        vec!["status"],
        vec!["install", "--no-wait"],
        vec!["token", "list"],
        vec![
            "peer",
            "--auth-url",
            "https://h:443",
            "--token",
            TOKEN,
            "--ca-fingerprint",
            FP,
        ],
    ] {
        let mut all = vec!["--kubeconfig", kc];
        all.extend(args.iter().copied());
        let run = tether(&all).await;
        run.assert_fails(
            3,
            &["cannot reach the local cluster's API server at https://127.0.0.1:"],
        );
    }
}

#[tokio::test]
async fn dry_run_with_a_cluster_id_needs_no_cluster() {
    let dir = tempfile::tempdir().expect("tempdir");
    let kc = unreachable_kubeconfig(dir.path());
    let run = tether(&[
        "--kubeconfig",
        kc.to_str().expect("utf-8"),
        "install",
        "--dry-run",
        "--cluster-id",
        "west-1",
        "--pod-cidr",
        "10.244.0.0/16",
    ])
    .await;
    run.assert_code(0);
    assert_eq!(
        run.stdout.matches("\n---\n").count() + 1,
        39,
        "{}",
        run.stdout
    );
    assert!(run.stdout.contains("clusterID: west-1"), "{}", run.stdout);
    assert!(
        run.stdout.contains("podCIDRs: 10.244.0.0/16"),
        "{}",
        run.stdout
    );
    // Without --cluster-id the stored ID must be read, so the cluster must answer.
    let run = tether(&[
        "--kubeconfig",
        kc.to_str().expect("utf-8"),
        "install",
        "--dry-run",
    ])
    .await;
    run.assert_fails(3, &["pass --cluster-id to render without a cluster"]);
}

#[tokio::test]
async fn version_and_completion() {
    let run = tether(&["version", "--client"]).await;
    run.assert_code(0);
    assert_eq!(
        run.stdout,
        format!("tether CLI: v{}\n", env!("CARGO_PKG_VERSION"))
    );
    let run = tether(&["--version"]).await;
    run.assert_code(0);
    for (shell, needle) in [
        ("bash", "_tether()"),
        ("zsh", "#compdef tether"),
        ("fish", "complete -c tether"),
    ] {
        let run = tether(&["completion", shell]).await;
        run.assert_code(0);
        assert!(
            run.stdout.contains(needle),
            "{shell}: {}",
            &run.stdout[..200.min(run.stdout.len())]
        );
        assert!(run.stdout.contains("peer-command"), "{shell}");
    }
}

#[tokio::test]
async fn the_kubectl_plugin_is_the_same_command_under_its_plugin_name() {
    let run = run_binary(env!("CARGO_BIN_EXE_kubectl-tether"), &["--help"]).await;
    run.assert_code(0);
    assert!(
        run.stdout.contains("Usage: kubectl tether"),
        "{}",
        run.stdout
    );
    let run = run_binary(
        env!("CARGO_BIN_EXE_kubectl-tether"),
        &["install", "--cluster-id", "x_"],
    )
    .await;
    run.assert_fails(2, &["invalid cluster ID"]);
}
