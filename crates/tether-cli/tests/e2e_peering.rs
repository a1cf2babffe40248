//! Issue #9 end to end on simulated clusters: `tether install` runs the controller as a pod
//! under its ServiceAccount, `tether peer` (two kubeconfigs or a token) gets the consumer a
//! confined identity, renewal keeps it working, a controller killed mid-peering recovers, bad
//! input leaves nothing behind, and `tether unpeer` removes everything on both sides. Needs
//! root (pods are processes in network namespaces); in CI it must run.

mod e2e;

use std::time::{Duration, Instant};

use e2e::{Env, Run, Sim};

/// Every Tether object kind that must be gone after unpeering, cluster-wide.
const LEFTOVER_KINDS: &[&str] = &["foreignclusters", "tenants", "certificatesigningrequests"];

fn installed_pair(env: &mut Env, extra_b: &[&str]) -> (Sim, Sim) {
    let a = env.up("a", &[]);
    let b = env.up("b", extra_b);
    a.install("alpha", &[]);
    b.install("beta", &[]);
    (a, b)
}

fn fc_field(sim: &Sim, name: &str, path: &str) -> String {
    sim.jsonpath(&["foreignclusters.core.tether.dev", name], path)
}

fn auth_status(sim: &Sim, name: &str) -> String {
    fc_field(
        sim,
        name,
        "{.status.conditions[?(@.type==\"Authentication\")].status}",
    )
}

/// Asserts that no trace of the peering between consumer `a` (alpha) and provider `b` (beta)
/// is left: no ForeignCluster, Tenant, CSR, tenant namespace, role binding or kubeconfig.
fn assert_nothing_left(a: &Sim, b: &Sim) {
    assert_nothing_left_but_tokens(a, b, false);
}

/// As [`assert_nothing_left`]; with `tokens_kept`, the provider's admin-generated tokens may
/// remain (they outlive a peering until they expire or are revoked).
fn assert_nothing_left_but_tokens(a: &Sim, b: &Sim, tokens_kept: bool) {
    for sim in [a, b] {
        for kind in LEFTOVER_KINDS {
            assert_eq!(
                sim.names(&[kind]),
                Vec::<String>::new(),
                "{kind} left on {}",
                sim.name
            );
        }
        let namespaces = sim.names(&["namespaces"]);
        assert!(
            !namespaces
                .iter()
                .any(|n| n.ends_with("tether-tenant-alpha") || n.ends_with("tether-tenant-beta")),
            "tenant namespace left on {}: {namespaces:?}",
            sim.name
        );
        let bindings = sim.names(&["rolebindings", "-A", "-l", "tether.dev/remote-cluster-id"]);
        assert_eq!(
            bindings,
            Vec::<String>::new(),
            "role bindings left on {}",
            sim.name
        );
        let secrets = sim.names(&["secrets", "-n", "tether-system"]);
        assert!(
            !secrets.iter().any(|s| {
                s.contains("kubeconfig")
                    || s.contains("tether-peering-token")
                    || (s.contains("tether-token-") && !tokens_kept)
            }),
            "token or kubeconfig Secrets left on {}: {secrets:?}",
            sim.name
        );
    }
}

fn wait_established(sim: &Sim, name: &str) {
    sim.wait(
        &format!("ForeignCluster {name} Established"),
        Duration::from_secs(90),
        || fc_field(sim, name, "{.status.phase}") == "Established",
    );
}

#[test]
fn install_runs_the_controller_as_a_pod_and_reinstalling_or_applying_the_dry_run_agree() {
    let Some(mut env) = Env::new("install") else {
        return;
    };
    let a = env.up("a", &[]);
    let run = a.install("alpha", &[]);
    assert!(
        run.stdout.contains("cluster ID:") && run.stdout.contains("alpha"),
        "{}",
        run.stdout
    );

    // The controller is a pod under its ServiceAccount, and a real process on the node.
    let sa = a.jsonpath(
        &[
            "pods",
            "-n",
            "tether-system",
            "-l",
            "app.kubernetes.io/name=tether-controller",
        ],
        "{.items[0].spec.serviceAccountName}",
    );
    assert_eq!(sa, "tether-controller");
    assert_eq!(
        a.controller_pids("alpha").len(),
        1,
        "one controller process"
    );
    // It talked to the API server with that account: it holds the Lease and published.
    let pod = a.jsonpath(
        &[
            "pods",
            "-n",
            "tether-system",
            "-l",
            "app.kubernetes.io/name=tether-controller",
        ],
        "{.items[0].metadata.name}",
    );
    let holder = a.jsonpath(
        &["lease", "-n", "tether-system", "tether-controller"],
        "{.spec.holderIdentity}",
    );
    assert!(
        holder.starts_with(&pod),
        "lease holder {holder:?}, pod {pod:?}"
    );
    let published = a.jsonpath(
        &["configmap", "-n", "tether-system", "tether-public-identity"],
        "{.data}",
    );
    for key in [
        "clusterID",
        "publicKey",
        "authFingerprint",
        "authURL",
        "apiServerURL",
    ] {
        assert!(published.contains(key), "{key} not published: {published}");
    }
    // Metrics, health and readiness are on by default.
    let ip = a.jsonpath(&["pods", "-n", "tether-system", &pod], "{.status.podIP}");
    let metrics = a.http_from_node(&ip, 9090, "/metrics");
    for series in ["tether_leader 1", "tether_peers{phase=\"Established\"} 0"] {
        assert!(
            metrics.contains(series),
            "{series} missing from /metrics:\n{metrics}"
        );
    }
    assert!(a.http_from_node(&ip, 9090, "/readyz").contains(" 200 OK"));
    assert!(a.http_from_node(&ip, 9090, "/healthz").contains(" 200 OK"));

    // A second install is a no-op: no object changes.
    let versions = |sim: &Sim| {
        [
            sim.jsonpath(
                &["deployment", "-n", "tether-system", "tether-controller"],
                "{.metadata.resourceVersion}",
            ),
            sim.jsonpath(
                &["configmap", "-n", "tether-system", "tether-cluster-id"],
                "{.metadata.resourceVersion}",
            ),
            sim.jsonpath(
                &["clusterrole", "tether-controller"],
                "{.metadata.resourceVersion}",
            ),
            sim.jsonpath(
                &["service", "-n", "tether-system", "tether-auth"],
                "{.metadata.resourceVersion}",
            ),
        ]
    };
    let before = versions(&a);
    a.install("alpha", &[]);
    assert_eq!(versions(&a), before, "a second install changed objects");

    // The dry run, applied with kubectl, gives a working install that `install` then finds
    // unchanged. Two replicas share the work: both serve, one leads.
    let b = env.up("b", &[]);
    let yaml = b.tether(&[
        "install",
        "--dry-run",
        "-o",
        "yaml",
        "--cluster-id",
        "beta",
        "--replicas",
        "2",
    ]);
    yaml.ok();
    let file = env.file("dry-run.yaml");
    std::fs::write(&file, &yaml.stdout).expect("write manifests");
    b.kubectl(&[
        "apply",
        "--server-side",
        "--field-manager",
        "tether",
        "-f",
        file.to_str().expect("path"),
    ])
    .ok();
    let _ = std::fs::remove_file(&file);
    b.kubectl(&[
        "rollout",
        "status",
        "-n",
        "tether-system",
        "deployment/tether-controller",
        "--timeout=120s",
    ])
    .ok();
    let before = versions(&b);
    let run = b.install("beta", &["--replicas", "2"]);
    assert!(run.stdout.contains("beta"), "{}", run.stdout);
    assert_eq!(
        versions(&b),
        before,
        "install after the applied dry run changed objects"
    );
    let pids = b.controller_pids("beta");
    assert_eq!(pids.len(), 2, "two controller processes");

    // The leader dies: the standby takes the Lease.
    let old_holder = b.jsonpath(
        &["lease", "-n", "tether-system", "tether-controller"],
        "{.spec.holderIdentity}",
    );
    let leader_pod = old_holder
        .rsplit_once('-')
        .map(|(p, _)| p.to_owned())
        .expect("holder names a pod");
    b.kubectl(&[
        "delete",
        "pod",
        "-n",
        "tether-system",
        &leader_pod,
        "--grace-period=0",
        "--force",
    ]);
    b.wait("another replica leads", Duration::from_secs(40), || {
        let h = b.jsonpath(
            &["lease", "-n", "tether-system", "tether-controller"],
            "{.spec.holderIdentity}",
        );
        !h.is_empty() && h != old_holder
    });
}

#[test]
fn peering_issues_a_confined_identity_and_unpeering_leaves_nothing() {
    let Some(mut env) = Env::new("peer") else {
        return;
    };
    let (a, b) = installed_pair(&mut env, &[]);

    let started = Instant::now();
    let run = a.tether(&[
        "peer",
        "--modules",
        "authentication",
        "--remote-kubeconfig",
        b.kubeconfig(),
        "--timeout",
        "90s",
    ]);
    run.ok();
    eprintln!("peered in {:?}", started.elapsed());
    assert!(run.stderr.contains("Authentication True"), "{}", run.stderr);
    assert_eq!(auth_status(&a, "beta"), "True");
    assert_eq!(fc_field(&a, "beta", "{.status.role}"), "Provider");
    assert_eq!(
        fc_field(
            &a,
            "beta",
            "{.status.conditions[?(@.type==\"APIServerReachable\")].status}"
        ),
        "True"
    );
    b.wait(
        "the provider shows its consumer",
        Duration::from_secs(30),
        || {
            auth_status(&b, "alpha") == "True"
                && fc_field(&b, "alpha", "{.status.role}") == "Consumer"
        },
    );
    // The controllers count what they did.
    let consumer_metrics = a.controller_metrics();
    assert!(
        consumer_metrics
            .contains("tether_reconcile_total{controller=\"foreigncluster\",result=\"ok\"}"),
        "{consumer_metrics}"
    );
    // Peers by phase are counted every 10 s.
    a.wait(
        "one Established peer in the metrics",
        Duration::from_secs(30),
        || {
            a.controller_metrics()
                .contains("tether_peers{phase=\"Established\"} 1")
        },
    );
    let provider_metrics = b.controller_metrics();
    assert!(
        provider_metrics
            .contains("tether_auth_requests_total{endpoint=\"identities\",outcome=\"ok\"} 1"),
        "{provider_metrics}"
    );
    // `kubectl get fc` shows the modules as columns.
    let table = a.kubectl(&["get", "fc"]);
    table.ok();
    for column in [
        "ROLE",
        "AUTHENTICATION",
        "NETWORKING",
        "OFFLOADING",
        "API SERVER",
        "Established",
    ] {
        assert!(table.stdout.contains(column), "{column}: {}", table.stdout);
    }

    // Re-running changes nothing.
    let rv = fc_field(&a, "beta", "{.metadata.resourceVersion}");
    let issued = b.jsonpath(&["tenant", "alpha"], "{.status.identitiesIssued}");
    let again = a.tether(&[
        "peer",
        "--modules",
        "authentication",
        "--remote-kubeconfig",
        b.kubeconfig(),
    ]);
    again.ok();
    assert!(again.stdout.contains("nothing changed"), "{}", again.stdout);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(fc_field(&a, "beta", "{.metadata.resourceVersion}"), rv);
    assert_eq!(
        b.jsonpath(&["tenant", "alpha"], "{.status.identitiesIssued}"),
        issued
    );

    // The issued identity: Tether kinds in its tenant namespace, and nothing else.
    let issued_kc = env.file("issued.kubeconfig");
    a.issued_kubeconfig(&b, "beta", &issued_kc);
    let who = b.kubectl_as(
        &issued_kc,
        &[
            "auth",
            "whoami",
            "-o",
            "jsonpath={.status.userInfo.username}",
        ],
    );
    assert_eq!(who.stdout, "tether:consumer:alpha");
    b.kubectl_as(
        &issued_kc,
        &["get", "resourceslices", "-n", "tether-tenant-alpha"],
    )
    .ok();
    b.apply_as(
        &b.kubeconfig,
        "apiVersion: v1
kind: Namespace
metadata:
  name: tether-tenant-gamma
",
    )
    .ok();
    let denied: &[&[&str]] = &[
        &["get", "secrets", "-n", "kube-system"],
        &["get", "secrets", "-n", "tether-system"],
        &["get", "secrets", "-n", "tether-tenant-alpha"],
        &["get", "pods", "-n", "default"],
        &["get", "clusterroles"],
        &["get", "resourceslices", "-n", "tether-tenant-gamma"],
        &[
            "patch",
            "clusterrole",
            "tether-tenant",
            "--type=json",
            "-p",
            "[{\"op\":\"add\",\"path\":\"/rules/0/resources/-\",\"value\":\"secrets\"}]",
        ],
    ];
    // Escalating its own rights: binding itself to `admin` in its namespace.
    let escalate = b.apply_as(
        &issued_kc,
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata:\n  name: escalate\n  namespace: tether-tenant-alpha\nroleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: ClusterRole\n  name: admin\nsubjects:\n- apiGroup: rbac.authorization.k8s.io\n  kind: User\n  name: tether:consumer:alpha\n",
    );
    assert_ne!(escalate.code, 0, "the identity bound itself to admin");
    assert!(escalate.stderr.contains("forbidden"), "{}", escalate.stderr);
    for args in denied {
        let run = b.kubectl_as(&issued_kc, args);
        assert_ne!(run.code, 0, "{args:?} was allowed");
        assert!(
            run.stderr.contains("Forbidden") || run.stderr.contains("forbidden"),
            "{args:?}: {}",
            run.stderr
        );
    }

    // Unpeer: everything goes on both sides, and the old identity is refused.
    a.tether(&[
        "unpeer",
        "--remote-kubeconfig",
        b.kubeconfig(),
        "--timeout",
        "90s",
    ])
    .ok();
    assert_nothing_left(&a, &b);
    let after = b.kubectl_as(
        &issued_kc,
        &["get", "resourceslices", "-n", "tether-tenant-alpha"],
    );
    assert_ne!(after.code, 0, "the revoked identity still works");
    assert!(
        after.stderr.contains("Forbidden") || after.stderr.contains("Unauthorized"),
        "{}",
        after.stderr
    );

    // Token-only: the provider's admin prints the command, the consumer's admin runs it.
    let cmd = b.tether(&["generate", "peer-command", "--ttl", "10m"]);
    cmd.ok();
    let line = cmd
        .stdout
        .lines()
        .find(|l| l.trim_start().starts_with("tether peer"))
        .expect("a tether peer line");
    let args: Vec<&str> = line.split_whitespace().skip(1).collect();
    assert!(
        args.contains(&"--token") && args.contains(&"--ca-fingerprint"),
        "{line}"
    );
    a.tether(&args).ok();
    wait_established(&a, "beta");
    a.tether(&[
        "unpeer",
        "--remote-kubeconfig",
        b.kubeconfig(),
        "--timeout",
        "90s",
    ])
    .ok();
    // The admin's token outlives the peering (it may serve other consumers) until it expires
    // or is revoked.
    let token = args[args.iter().position(|a| *a == "--token").expect("--token") + 1];
    let id = token.split('.').nth(1).expect("token id");
    assert!(b.tether(&["token", "list"]).stdout.contains(id));
    b.tether(&["token", "revoke", id]).ok();
    assert_nothing_left(&a, &b);

    // Uninstall: nothing of Tether stays in either cluster.
    for sim in [&a, &b] {
        sim.tether(&["uninstall", "--timeout", "120s"]).ok();
        assert!(
            !sim.names(&["namespaces"])
                .iter()
                .any(|n| n.ends_with("/tether-system")),
            "tether-system left on {}",
            sim.name
        );
        let crds = sim.names(&["customresourcedefinitions"]);
        assert!(
            !crds.iter().any(|c| c.contains("tether.dev")),
            "CRDs left: {crds:?}"
        );
        let roles = sim.names(&["clusterroles"]);
        assert!(
            !roles.iter().any(|r| r.contains("tether")),
            "cluster roles left: {roles:?}"
        );
        // The pods went with the namespace; their processes end within the grace period.
        let id = if sim.name == a.name { "alpha" } else { "beta" };
        sim.wait(
            "the controller processes to end",
            Duration::from_secs(60),
            || sim.controller_pids(id).is_empty(),
        );
    }
}

fn token_args(b: &Sim, extra: &[&str]) -> (String, String, String) {
    let mut args = vec!["generate", "peer-command", "-o", "json"];
    args.extend_from_slice(extra);
    let run = b.tether(&args);
    run.ok();
    let v: serde_json::Value = serde_json::from_str(&run.stdout).expect("json");
    let field = |k: &str| {
        v[k].as_str()
            .unwrap_or_else(|| panic!("{k} in {v}"))
            .to_owned()
    };
    (field("authURL"), field("token"), field("caFingerprint"))
}

fn peer_with_token(a: &Sim, url: &str, token: &str, fingerprint: &str, timeout: &str) -> Run {
    a.tether(&[
        "peer",
        "--modules",
        "authentication",
        "--auth-url",
        url,
        "--token",
        token,
        "--ca-fingerprint",
        fingerprint,
        "--timeout",
        timeout,
    ])
}

#[test]
fn bad_tokens_fingerprints_and_unreachable_providers_fail_clearly_and_leave_nothing() {
    let Some(mut env) = Env::new("bad") else {
        return;
    };
    let (a, b) = installed_pair(&mut env, &[]);
    let (url, good, fingerprint) = token_args(&b, &[]);

    // A wrong fingerprint: refused before any credential is sent.
    let wrong = format!("sha256:{}", "0".repeat(64));
    peer_with_token(&a, &url, &good, &wrong, "60s").fails(4, &["FingerprintMismatch", &url]);
    assert_nothing_left_but_tokens(&a, &b, true);

    // A token the provider never issued.
    let forged = format!("beta.zzzzzz.{}", "a".repeat(32));
    peer_with_token(&a, &url, &forged, &fingerprint, "60s").fails(4, &["TokenRejected", "unknown"]);
    assert_nothing_left_but_tokens(&a, &b, true);

    // An expired token.
    let (_, short, _) = token_args(&b, &["--ttl", "1s"]);
    std::thread::sleep(Duration::from_secs(2));
    peer_with_token(&a, &url, &short, &fingerprint, "60s").fails(4, &["expired"]);

    // A revoked token.
    let (_, revoked, _) = token_args(&b, &[]);
    let id = revoked.split('.').nth(1).expect("token id");
    b.tether(&["token", "revoke", id]).ok();
    peer_with_token(&a, &url, &revoked, &fingerprint, "60s").fails(4, &["TokenRejected"]);
    assert_nothing_left_but_tokens(&a, &b, true);

    // Three credential failures so far from alpha's node; two more reach the limit of five,
    // and the next attempt is turned away with 429 before its token is even checked. Being
    // limited is transient (the controller retries after Retry-After), so `tether peer`
    // reports it when its own timeout ends first.
    for _ in 0..2 {
        peer_with_token(&a, &url, &forged, &fingerprint, "60s").fails(4, &["TokenRejected"]);
    }
    peer_with_token(&a, &url, &good, &fingerprint, "15s")
        .fails(4, &["RateLimited", "too many failed attempts", "retry in"]);
    assert_nothing_left_but_tokens(&a, &b, true);

    // A provider address where nothing answers: the failure names the URL.
    let dead = url
        .rsplit_once('.')
        .map(|(net, _)| format!("{net}.250:443"))
        .expect("url");
    peer_with_token(&a, &dead, &good, &fingerprint, "30s").fails(4, &[dead.as_str()]);
    assert_nothing_left_but_tokens(&a, &b, true);
}

#[test]
fn renewal_keeps_the_peering_working_across_several_certificates() {
    let Some(mut env) = Env::new("renew") else {
        return;
    };
    // The provider's signer issues 30 s certificates; renewal comes at two thirds.
    let (a, b) = installed_pair(&mut env, &["--cluster-signing-duration", "30"]);
    a.tether(&[
        "peer",
        "--modules",
        "authentication",
        "--remote-kubeconfig",
        b.kubeconfig(),
        "--timeout",
        "90s",
    ])
    .ok();
    let issued_kc = env.file("renewed.kubeconfig");
    let deadline = Instant::now() + tether_testkit::patience(Duration::from_secs(120));
    let mut expiries = Vec::new();
    loop {
        // One read, so the expiry and the renewal count belong to the same credential.
        let both = fc_field(
            &a,
            "beta",
            "{.status.conditions[?(@.type==\"Authentication\")].status} {.status.identity.expiresAt} {.status.identity.renewals}",
        );
        let fields: Vec<&str> = both.split_whitespace().collect();
        assert_eq!(fields.first(), Some(&"True"), "authentication held: {both}");
        let exp = fields.get(1).copied().unwrap_or_default().to_owned();
        let renewals: u32 = fields.get(2).and_then(|r| r.parse().ok()).unwrap_or(0);
        if !expiries.contains(&exp) {
            expiries.push(exp);
            // Each new credential works.
            a.issued_kubeconfig(&b, "beta", &issued_kc);
            b.kubectl_as(
                &issued_kc,
                &["get", "resourceslices", "-n", "tether-tenant-alpha"],
            )
            .ok();
        }
        if renewals >= 3 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "only {renewals} renewals; expiries seen {expiries:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(expiries.len() >= 4, "{expiries:?}");
    assert_eq!(
        fc_field(
            &a,
            "beta",
            "{.status.conditions[?(@.type==\"APIServerReachable\")].status}"
        ),
        "True"
    );
}

#[test]
fn a_controller_killed_mid_peering_finishes_it_after_its_restart() {
    let Some(mut env) = Env::new("kill") else {
        return;
    };
    let (a, b) = installed_pair(&mut env, &[]);
    let (url, token, fingerprint) = token_args(&b, &[]);
    // The provider's controller is down: the consumer authenticates, fails to reach it and
    // keeps the peering in Authenticating.
    b.kubectl(&[
        "scale",
        "-n",
        "tether-system",
        "deployment/tether-controller",
        "--replicas=0",
    ])
    .ok();
    b.wait(
        "the provider's controller stopped",
        Duration::from_secs(30),
        || b.controller_pids("beta").is_empty(),
    );
    let peer = std::process::Command::new(e2e::TETHER)
        .args([
            "--kubeconfig",
            a.kubeconfig(),
            "peer",
            "--modules",
            "authentication",
            "--auth-url",
            &url,
            "--token",
            &token,
            "--ca-fingerprint",
            &fingerprint,
            "--timeout",
            "180s",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("tether peer starts");
    a.wait(
        "the consumer is authenticating",
        Duration::from_secs(60),
        || {
            fc_field(&a, "beta", "{.status.phase}") == "Authenticating"
                && fc_field(
                    &a,
                    "beta",
                    "{.status.conditions[?(@.type==\"Authentication\")].reason}",
                ) == "ProviderUnreachable"
        },
    );
    // Kill the consumer's controller between phases; its Deployment replaces it.
    for pid in a.controller_pids("alpha") {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .expect("kill");
    }
    b.kubectl(&[
        "scale",
        "-n",
        "tether-system",
        "deployment/tether-controller",
        "--replicas=1",
    ])
    .ok();
    let output = peer.wait_with_output().expect("tether peer ends");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    wait_established(&a, "beta");
    assert_eq!(
        b.names(&["tenants"]),
        vec!["tenant.authentication.tether.dev/alpha".to_owned()]
    );
    assert_eq!(
        b.jsonpath(&["tenant", "alpha"], "{.status.identitiesIssued}"),
        "1"
    );
}
