//! Several peerings of one cluster on simulated clusters that all use pod CIDR
//! 10.244.0.0/16: a consumer of two providers reaches both through distinct remaps while the
//! providers stay apart, and the two directions of a two-way peering share one tunnel. Needs
//! root (pods are processes in network namespaces); in CI it must run.

mod e2e;

use std::net::Ipv4Addr;
use std::time::Duration;

use e2e::net::{echo_pod, nodes, pod_ip, remapped, talk, traffic_pod, view_of};
use e2e::{Env, Sim};

fn peer(consumer: &Sim, provider: &Sim, provider_id: &str) {
    let run = consumer.tether(&[
        "peer",
        "--remote-kubeconfig",
        provider.kubeconfig(),
        "--timeout",
        "4m",
    ]);
    run.ok();
    assert!(
        run.stderr.contains(&format!("tunnel to {provider_id} up")),
        "{}",
        run.stderr
    );
}

fn echo(sim: &Sim, name: &str, node: &str) -> Ipv4Addr {
    sim.apply_as(
        std::path::Path::new(sim.kubeconfig()),
        &echo_pod(name, node),
    )
    .ok();
    pod_ip(sim, name)
}

/// Runs a traffic pod in `from` that must not get any answer from `target`.
fn talk_fails(from: &Sim, name: &str, node: &str, target: &str) {
    from.apply_as(
        std::path::Path::new(from.kubeconfig()),
        &traffic_pod(name, node, "tcp", target),
    )
    .ok();
    from.wait(&format!("{name} finished"), Duration::from_secs(60), || {
        matches!(
            from.jsonpath(&["pod", name], "{.status.phase}").as_str(),
            "Succeeded" | "Failed"
        )
    });
    let phase = from.jsonpath(&["pod", name], "{.status.phase}");
    let logs = from.kubectl(&["logs", name]).stdout;
    from.kubectl(&["delete", "pod", name, "--wait=false"]);
    assert!(
        phase == "Failed" && !logs.contains("peer="),
        "{name} reached {target} ({phase}):\n{logs}"
    );
}

fn gateway_pods(sim: &Sim) -> Vec<String> {
    sim.names(&["pods", "-A", "-l", "tether.dev/component=gateway"])
}

fn gateway_ip(sim: &Sim, remote_id: &str) -> String {
    let mut ip = String::new();
    sim.wait(
        &format!("gateway pod for {remote_id} has an IP"),
        Duration::from_secs(30),
        || {
            ip = sim.jsonpath(
                &[
                    "pods",
                    "-n",
                    &format!("tether-tenant-{remote_id}"),
                    "-l",
                    "tether.dev/component=gateway",
                ],
                "{.items[0].status.podIP}",
            );
            !ip.is_empty()
        },
    );
    ip
}

fn routes(sim: &Sim, node_index: usize) -> String {
    let out = std::process::Command::new("ip")
        .args([
            "-n",
            &format!("sk.{}.n{node_index}", sim.name),
            "route",
            "show",
        ])
        .output()
        .expect("ip runs");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_consumer_of_two_providers_reaches_both_and_they_stay_apart() {
    let Some(mut env) = Env::new("multi") else {
        return;
    };
    let a = env.up_nodes("a", 2, &[]);
    let b = env.up_nodes("b", 1, &[]);
    let d = env.up_nodes("d", 1, &[]);
    a.install("alpha", &[]);
    b.install("beta", &[]);
    d.install("delta", &[]);
    peer(&a, &b, "beta");
    peer(&a, &d, "delta");

    let (to_b, to_d) = (view_of(&a, "beta"), view_of(&a, "delta"));
    for v in [&to_b, &to_d] {
        assert!(!v.is_empty() && v != "10.244.0.0/16", "remap {v:?}");
    }
    assert_ne!(to_b, to_d, "both providers got the same remap");

    // Every node of the consumer routes each provider's remap to that provider's gateway pod.
    let (gw_b, gw_d) = (gateway_ip(&a, "beta"), gateway_ip(&a, "delta"));
    let a_nodes = nodes(&a);
    for i in 1..=a_nodes.len() {
        let mut seen = String::new();
        a.wait(
            "fabric routes to both providers",
            Duration::from_secs(30),
            || {
                seen = routes(&a, i);
                [(&to_b, &gw_b), (&to_d, &gw_d)].iter().all(|(cidr, gw)| {
                    seen.lines().any(|l| {
                        l.starts_with(cidr.as_str())
                            && l.contains(&format!("via {gw} "))
                            && l.contains("dev tether-fabric")
                    })
                })
            },
        );
        eprintln!("routes of {}.n{i}:\n{seen}", a.name);
    }

    let b_ip = echo(&b, "echo-b", &nodes(&b)[0]);
    let d_ip = echo(&d, "echo-d", &nodes(&d)[0]);
    let mut n = 0;
    for node in &a_nodes {
        for (view, ip) in [(&to_b, b_ip), (&to_d, d_ip)] {
            n += 1;
            let target = format!("{}:7000", remapped(view, ip));
            let seen = talk(&a, &format!("traffic-{n}"), node, "tcp", &target);
            assert_eq!(seen.len(), 3, "tcp to {target} from {node}: {seen:?}");
        }
    }

    // beta reaches no pod of delta: neither by the addresses alpha uses for it, nor by its
    // real address unless that is one of beta's own pods.
    let b_node = nodes(&b)[0].clone();
    let b_own: Vec<String> = b
        .jsonpath(&["pods", "-A"], "{.items[*].status.podIP}")
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    let mut targets = vec![remapped(&to_d, d_ip), remapped(&to_b, d_ip)];
    if !b_own.contains(&d_ip.to_string()) {
        targets.push(d_ip);
    }
    for (i, t) in targets.iter().enumerate() {
        talk_fails(&b, &format!("stray-{i}"), &b_node, &format!("{t}:7000"));
    }

    for p in [&b, &d] {
        a.tether(&["unpeer", "--remote-kubeconfig", p.kubeconfig()])
            .ok();
    }
    for sim in [&a, &b, &d] {
        sim.wait("gateway pods gone", Duration::from_secs(60), || {
            gateway_pods(sim).is_empty()
        });
    }
}

#[test]
fn both_directions_of_a_two_way_peering_share_one_tunnel() {
    let Some(mut env) = Env::new("both") else {
        return;
    };
    let a = env.up_nodes("a", 1, &[]);
    let b = env.up_nodes("b", 1, &[]);
    a.install("alpha", &[]);
    b.install("beta", &[]);
    peer(&a, &b, "beta");
    peer(&b, &a, "alpha");

    for sim in [&a, &b] {
        // Long enough for a second gateway pair to have been started, had it been.
        for _ in 0..10 {
            let pods = gateway_pods(sim);
            assert_eq!(pods.len(), 1, "gateway pods in {}: {pods:?}", sim.name);
            std::thread::sleep(Duration::from_millis(500));
        }
        for kind in [
            "gatewayservers.networking.tether.dev",
            "gatewayclients.networking.tether.dev",
        ] {
            assert!(
                sim.names(&[kind, "-A"]).len() <= 1,
                "{kind} in {}",
                sim.name
            );
        }
    }
    for (sim, fc) in [(&a, "beta"), (&b, "alpha")] {
        let networking = || {
            sim.jsonpath(
                &["foreignclusters.core.tether.dev", fc],
                "{.status.conditions[?(@.type==\"Networking\")].reason}",
            )
        };
        if networking() != "Connected" {
            eprintln!(
                "{}",
                sim.kubectl(&["get", "foreignclusters.core.tether.dev", fc, "-o", "yaml"])
                    .stdout
            );
        }
        assert_eq!(
            networking(),
            "Connected",
            "Networking of {fc} in {}",
            sim.name
        );
    }

    let a_ip = echo(&a, "echo-a", &nodes(&a)[0]);
    let b_ip = echo(&b, "echo-b", &nodes(&b)[0]);
    let (to_b, to_a) = (view_of(&a, "beta"), view_of(&b, "alpha"));
    for (n, (from, view, ip)) in [(&a, &to_b, b_ip), (&b, &to_a, a_ip)]
        .into_iter()
        .enumerate()
    {
        let target = format!("{}:7000", remapped(view, ip));
        let seen = talk(
            from,
            &format!("traffic-{n}"),
            &nodes(from)[0],
            "tcp",
            &target,
        );
        assert_eq!(seen.len(), 3, "tcp to {target}: {seen:?}");
    }

    // Unpeering on one side ends both directions there (they share its tenant namespace);
    // once the other side has unpeered too, nothing is left.
    b.tether(&["unpeer", "--remote-kubeconfig", a.kubeconfig()])
        .ok();
    a.tether(&["unpeer", "--remote-kubeconfig", b.kubeconfig()])
        .ok();
    for sim in [&a, &b] {
        sim.wait("gateway pods gone", Duration::from_secs(60), || {
            gateway_pods(sim).is_empty()
        });
        for kind in [
            "configurations.networking.tether.dev",
            "gatewayservers.networking.tether.dev",
            "gatewayclients.networking.tether.dev",
            "connections.networking.tether.dev",
        ] {
            assert_eq!(
                sim.names(&[kind, "-A"]),
                Vec::<String>::new(),
                "{kind} left on {}",
                sim.name
            );
        }
    }
}
