//! Several peerings of one cluster on simulated clusters that all use pod CIDR 10.244.0.0/16:
//! the two directions of a two-way peering share one tunnel. Needs root (pods are processes in
//! network namespaces); in CI it must run.

mod e2e;

use std::net::Ipv4Addr;
use std::time::Duration;

use e2e::net::{echo_pod, nodes, pod_ip, remapped, talk, view_of};
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

fn gateway_pods(sim: &Sim) -> Vec<String> {
    sim.names(&["pods", "-A", "-l", "tether.dev/component=gateway"])
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
