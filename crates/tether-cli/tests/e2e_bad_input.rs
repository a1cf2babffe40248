//! Issue #10's bad input end to end, on one pair of simulated clusters: a remap pool too small
//! for the provider's pod CIDR, a gateway address nobody answers on, and a wrong server key in
//! the GatewayClient each fail with a message that says what is wrong and what to do, and a
//! failed `tether peer` leaves nothing behind. Needs root; in CI it must run.

mod e2e;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use e2e::net::{echo_pod, nodes, pod_ip, remapped, talk, traffic_pod, view_of};
use e2e::{Env, Run, Sim};

const GATEWAY_LABEL: &str = "tether.dev/component=gateway";
const NETWORKING_KINDS: &[&str] = &[
    "configurations.networking.tether.dev",
    "gatewayservers.networking.tether.dev",
    "gatewayclients.networking.tether.dev",
    "connections.networking.tether.dev",
];

fn network_configmap(sim: &Sim, key: &str) -> String {
    sim.jsonpath(
        &["configmap", "-n", "tether-system", "tether-network"],
        &format!("{{.data.{key}}}"),
    )
}

fn gateway_deployments(sim: &Sim) -> Vec<String> {
    sim.names(&["deployments", "-A", "-l", GATEWAY_LABEL])
}

/// `a`'s Connection to beta: `status.value` and the `Ready` condition's message, read in one
/// call so that a Connection deleted between two reads cannot give a state without its message.
fn connection(sim: &Sim, ns: &str) -> (String, String) {
    let args = [
        "connections.networking.tether.dev",
        "-n",
        ns,
        "tether-gateway",
    ];
    let both = sim.jsonpath(
        &args,
        "{.status.value}{\"\\n\"}{.status.conditions[?(@.type==\"Ready\")].message}",
    );
    let (state, message) = both.split_once('\n').unwrap_or((both.as_str(), ""));
    (state.to_owned(), message.to_owned())
}

/// Runs `tether peer` from `a` while `watch` samples both clusters every half second; returns
/// the run and every sample `watch` made.
fn peer_watching<T: Send>(a: &Sim, args: &[&str], watch: impl Fn() -> T + Sync) -> (Run, Vec<T>) {
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        let sampler = s.spawn(|| {
            let mut seen = Vec::new();
            while !done.load(Ordering::Relaxed) {
                seen.push(watch());
                std::thread::sleep(Duration::from_millis(500));
            }
            seen
        });
        let run = a.tether(args);
        done.store(true, Ordering::Relaxed);
        (run, sampler.join().expect("sampler"))
    })
}

/// Waits until neither cluster holds anything of the peering between alpha and beta.
fn wait_nothing_left(a: &Sim, b: &Sim) {
    for sim in [a, b] {
        sim.wait(
            "the failed peering torn down",
            Duration::from_secs(90),
            || {
                let mut left = sim.names(&["foreignclusters.core.tether.dev"]);
                left.extend(sim.names(&["tenants"]));
                left.extend(gateway_deployments(sim));
                for kind in NETWORKING_KINDS {
                    left.extend(sim.names(&[kind, "-A"]));
                }
                left.extend(
                    sim.names(&["namespaces"])
                        .into_iter()
                        .filter(|n| n.contains("tether-tenant-")),
                );
                left.is_empty()
            },
        );
    }
}

/// A traffic pod in `from` that must fail: the tunnel is down.
fn talk_fails(from: &Sim, name: &str, node: &str, target: &str) {
    from.apply_as(
        std::path::Path::new(from.kubeconfig()),
        &traffic_pod(name, node, "udp", target),
    )
    .ok();
    let mut phase = String::new();
    from.wait(&format!("{name} finished"), Duration::from_secs(60), || {
        phase = from.jsonpath(&["pod", name], "{.status.phase}");
        matches!(phase.as_str(), "Succeeded" | "Failed")
    });
    let logs = from.kubectl(&["logs", name]).stdout;
    from.kubectl(&["delete", "pod", name, "--wait=false"]);
    assert_eq!(
        phase, "Failed",
        "{name}: traffic to {target} passed a broken tunnel:\n{logs}"
    );
}

/// Processes stopped with SIGSTOP until dropped (also on panic, so that teardown finds them
/// running).
struct Frozen(Vec<u32>);

impl Frozen {
    fn new(pids: Vec<u32>) -> Frozen {
        assert!(!pids.is_empty(), "no process to freeze");
        let frozen = Frozen(pids);
        frozen.signal("-STOP");
        frozen
    }

    fn signal(&self, sig: &str) {
        for pid in &self.0 {
            let ok = std::process::Command::new("kill")
                .args([sig, &pid.to_string()])
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok || std::thread::panicking(), "kill {sig} {pid} failed");
        }
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        self.signal("-CONT");
    }
}

#[test]
fn bad_networking_input_fails_clearly_and_leaves_nothing() {
    let Some(mut env) = Env::new("badin") else {
        return;
    };
    let a = env.up("a", &[]);
    let b = env.up("b", &[]);
    // Both clusters use pod CIDR 10.244.0.0/16, so alpha must remap beta's: a /17 pool cannot
    // hold a /16.
    a.install("alpha", &["--remap-pool", "10.200.0.0/17"]);
    b.install("beta", &[]);
    assert_eq!(network_configmap(&a, "remapPool"), "10.200.0.0/17");
    a.tether(&["install", "--remap-pool", "10.244.128.0/17"])
        .fails(
            2,
            &["--remap-pool 10.244.128.0/17 overlaps this cluster's pod CIDR 10.244.0.0/16"],
        );
    assert_eq!(network_configmap(&a, "remapPool"), "10.200.0.0/17");

    // 1. The exhausted pool: the peering stops at the remap, before any gateway.
    let (run, seen) = peer_watching(
        &a,
        &[
            "peer",
            "--remote-kubeconfig",
            b.kubeconfig(),
            "--timeout",
            "45s",
        ],
        || {
            let fc = a.jsonpath(
                &["foreignclusters.core.tether.dev", "beta"],
                "{.status.conditions[?(@.type==\"Networking\")].message}",
            );
            let mut gateways = gateway_deployments(&a);
            gateways.extend(gateway_deployments(&b));
            (fc, gateways)
        },
    );
    let wanted = [
        "remap pool 10.200.0.0/17 is exhausted",
        "10.244.0.0/16",
        "tether install --remap-pool",
    ];
    run.fails(4, &wanted);
    assert!(
        seen.iter()
            .any(|(fc, _)| wanted.iter().all(|w| fc.contains(w))),
        "the Networking condition never said {wanted:?}: {:?}",
        seen.iter().map(|(fc, _)| fc).collect::<Vec<_>>()
    );
    let gateways: Vec<&String> = seen.iter().flat_map(|(_, g)| g).collect();
    assert!(gateways.is_empty(), "gateways were created: {gateways:?}");
    wait_nothing_left(&a, &b);

    // The advice works: a wider pool, kept by a later install without the flag. Beta's
    // external CIDR collides with alpha's as well, so the pool needs two /16 blocks.
    a.install("alpha", &["--remap-pool", "10.200.0.0/15"]);
    a.install("alpha", &[]);
    assert_eq!(network_configmap(&a, "remapPool"), "10.200.0.0/15");

    // 2. A gateway address nobody answers on: beta's bridge network, past its nodes.
    let node_ip = b.jsonpath(
        &["nodes"],
        "{.items[0].status.addresses[?(@.type==\"InternalIP\")].address}",
    );
    let (prefix, _) = node_ip.rsplit_once('.').expect("an IPv4 node address");
    let nobody = format!("{prefix}.250");
    let (run, seen) = peer_watching(
        &a,
        &[
            "peer",
            "--remote-kubeconfig",
            b.kubeconfig(),
            "--gateway-address",
            &nobody,
            "--timeout",
            "75s",
        ],
        || connection(&a, "tether-tenant-beta"),
    );
    run.fails(4, &["no handshake answer from", &nobody, "UDP to"]);
    let (state, message) = seen
        .iter()
        .rev()
        .find(|(state, _)| !state.is_empty())
        .cloned()
        .unwrap_or_default();
    assert!(
        matches!(state.as_str(), "Connecting" | "Error")
            && message.contains(&format!("no handshake answer from {nobody}:"))
            && message.contains("check that the remote gateway runs"),
        "the Connection said {state}: {message}"
    );
    assert!(
        !seen.iter().any(|(state, _)| state == "Connected"),
        "connected through {nobody}?"
    );
    // The run removed its ForeignCluster; the controllers remove what hung from it, on both
    // sides: tenants, tenant namespaces, gateways, networking objects.
    assert!(
        run.stderr.contains("removed ForeignCluster beta"),
        "{}",
        run.stderr
    );
    wait_nothing_left(&a, &b);

    // 3. A good peering, remapped inside the widened pool.
    a.tether(&[
        "peer",
        "--remote-kubeconfig",
        b.kubeconfig(),
        "--timeout",
        "3m",
    ])
    .ok();
    let view = view_of(&a, "beta");
    assert_eq!(
        view, "10.200.0.0/16",
        "beta's pods are addressed outside the pool"
    );
    let node_a = nodes(&a).remove(0);
    let node_b = nodes(&b).remove(0);
    b.apply_as(
        std::path::Path::new(b.kubeconfig()),
        &echo_pod("echo", &node_b),
    )
    .ok();
    let target = format!("{}:7000", remapped(&view, pod_ip(&b, "echo")));
    assert_eq!(talk(&a, "before", &node_a, "udp", &target).len(), 3);

    // A wrong server key, with alpha's controller frozen so that it cannot re-copy the right
    // one while we look: the server's key with one bit flipped, valid but nobody's, as a bad
    // copy would give. (Alpha's own key would not do: its gateway refuses that outright as an
    // invalid object, before any handshake.)
    let client = [
        "gatewayclients.networking.tether.dev",
        "-n",
        "tether-tenant-beta",
        "tether-gateway",
    ];
    let good_key = a.jsonpath(&client, "{.spec.serverPublicKey}");
    let wrong_key = {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD;
        let mut bytes = b64
            .decode(&good_key)
            .expect("spec.serverPublicKey is base64");
        bytes[0] ^= 1;
        b64.encode(bytes)
    };
    let frozen = Frozen::new(a.controller_pids("alpha"));
    let patch = format!("{{\"spec\":{{\"serverPublicKey\":\"{wrong_key}\"}}}}");
    let patched = a.kubectl(&[
        "patch", client[0], "-n", client[2], client[3], "--type", "merge", "-p", &patch,
    ]);
    patched.ok();
    // The client rebuilds its tunnel for the new key, so the old session goes with it: it
    // says no handshake is answered, or (once the server tries its own handshake) that the
    // server's were refused; either way it names the field to check.
    let mut said = (String::new(), String::new());
    a.wait(
        "the Connection reports the failing handshake",
        Duration::from_secs(30),
        || {
            let now = connection(&a, "tether-tenant-beta");
            if now != said {
                // The wait's own panic cannot say what the Connection said; this can.
                eprintln!("alpha's Connection: {}: {}", now.0, now.1);
                said = now;
            }
            said.0 != "Connected"
                && said.1.contains("handshake")
                && said.1.contains("spec.serverPublicKey")
        },
    );
    assert!(
        said.1
            .contains("GatewayClient tether-tenant-beta/tether-gateway"),
        "{said:?}"
    );
    // The server refuses the handshakes made to a key it does not hold, and says so.
    b.wait(
        "the server reports refused handshakes",
        Duration::from_secs(30),
        || {
            let (_, m) = connection(&b, "tether-tenant-alpha");
            m.contains("the keys do not match")
        },
    );
    talk_fails(&a, "broken", &node_a, &target);
    drop(frozen);

    // Alpha's controller re-copies the server's key on its next pass (it owns the field), and
    // the tunnel comes back by itself.
    a.wait(
        "the controller restores spec.serverPublicKey",
        Duration::from_secs(45),
        || a.jsonpath(&client, "{.spec.serverPublicKey}") == good_key,
    );
    a.wait("the tunnel back up", Duration::from_secs(30), || {
        connection(&a, "tether-tenant-beta").0 == "Connected"
    });
    assert_eq!(talk(&a, "after", &node_a, "udp", &target).len(), 3);
}
