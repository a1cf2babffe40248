//! Issue #10 end to end on simulated clusters that all use pod CIDR 10.244.0.0/16: after
//! `tether peer`, pods on every node of each cluster reach pods on every node of the other
//! through the gateways and the fabric, over TCP, UDP and ICMP, and the receiver sees the
//! caller's (remapped) address; `tether unpeer` leaves no object, route or link behind. Needs
//! root (pods are processes in network namespaces); in CI it must run.

mod e2e;

use std::net::Ipv4Addr;
use std::time::Duration;

use e2e::Env;
use e2e::net::{echo_pod, nodes, pod_ip, remapped, talk, view_of};

#[test]
fn peered_clusters_with_the_same_pod_cidr_reach_each_others_pods_from_every_node() {
    let Some(mut env) = Env::new("net") else {
        return;
    };
    let a = env.up_nodes("a", 2, &[]);
    let b = env.up_nodes("b", 2, &[]);
    a.install("alpha", &[]);
    b.install("beta", &[]);
    let peer = a.tether(&[
        "peer",
        "--remote-kubeconfig",
        b.kubeconfig(),
        "--timeout",
        "4m",
    ]);
    peer.ok();
    assert!(peer.stderr.contains("tunnel to beta up"), "{}", peer.stderr);

    // Both sides remapped the other's 10.244.0.0/16, which collides with their own.
    let a_view = view_of(&a, "beta");
    let b_view = view_of(&b, "alpha");
    for v in [&a_view, &b_view] {
        assert!(!v.is_empty() && v != "10.244.0.0/16", "remap {v:?}");
    }
    let conn = a.jsonpath(
        &[
            "connections.networking.tether.dev",
            "-n",
            "tether-tenant-beta",
            "tether-gateway",
        ],
        "{.status.value}",
    );
    assert_eq!(conn, "Connected");

    let (a_nodes, b_nodes) = (nodes(&a), nodes(&b));
    let mut a_pods = Vec::new();
    let mut b_pods = Vec::new();
    for (i, node) in a_nodes.iter().enumerate() {
        let name = format!("echo-a{i}");
        a.apply_as(std::path::Path::new(a.kubeconfig()), &echo_pod(&name, node))
            .ok();
        a_pods.push(name);
    }
    for (i, node) in b_nodes.iter().enumerate() {
        let name = format!("echo-b{i}");
        b.apply_as(std::path::Path::new(b.kubeconfig()), &echo_pod(&name, node))
            .ok();
        b_pods.push(name);
    }
    let a_ips: Vec<Ipv4Addr> = a_pods.iter().map(|p| pod_ip(&a, p)).collect();
    let b_ips: Vec<Ipv4Addr> = b_pods.iter().map(|p| pod_ip(&b, p)).collect();

    // Every node of a to every pod of b, and back, over TCP and UDP; the receiver sees the
    // caller's address through its own remap of the caller's cluster (no masquerade).
    let mut n = 0;
    for (from, from_nodes, to_ips, to_view, back_view) in [
        (&a, &a_nodes, &b_ips, &a_view, &b_view),
        (&b, &b_nodes, &a_ips, &b_view, &a_view),
    ] {
        for node in from_nodes.iter() {
            for ip in to_ips.iter() {
                for (proto, port) in [("tcp", 7000), ("udp", 7000)] {
                    n += 1;
                    let target = format!("{}:{port}", remapped(to_view, *ip));
                    let seen = talk(from, &format!("traffic-{n}"), node, proto, &target);
                    assert_eq!(seen.len(), 3, "{proto} to {target}: {seen:?}");
                    let caller_net: ipnet::Ipv4Net = back_view.parse().expect("view");
                    for s in &seen {
                        let s: Ipv4Addr = s.parse().expect("peer address");
                        assert!(
                            caller_net.contains(&s),
                            "{proto} to {target} from {node}: the receiver saw {s}, not an \
                             address of {back_view}"
                        );
                    }
                }
            }
        }
    }

    // ICMP from a pod of a (in its sandbox namespace) to a pod of b on each node.
    let uid = a.jsonpath(&["pod", &a_pods[0]], "{.metadata.uid}");
    let sandbox = simkube_cluster::net::netns_with_prefix(&format!("sk.{}.", a.name))
        .into_iter()
        .find(|ns| ns.ends_with(&uid))
        .unwrap_or_else(|| panic!("no sandbox namespace for pod {} ({uid})", a_pods[0]));
    for ip in &b_ips {
        let target = remapped(&a_view, *ip).to_string();
        let ping = std::process::Command::new("ip")
            .args([
                "netns", "exec", &sandbox, "ping", "-c", "2", "-W", "2", &target,
            ])
            .output()
            .expect("ping runs");
        assert!(
            ping.status.success(),
            "ping {target} from pod {}: {}",
            a_pods[0],
            String::from_utf8_lossy(&ping.stdout)
        );
    }

    // Unpeer: no Tether object, gateway, route or link left on either side.
    a.tether(&["unpeer", "--remote-kubeconfig", b.kubeconfig()])
        .ok();
    for sim in [&a, &b] {
        sim.wait("gateway pods gone", Duration::from_secs(60), || {
            sim.names(&["pods", "-A", "-l", "tether.dev/component=gateway"])
                .is_empty()
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
        for i in 1..=2 {
            let ns = format!("sk.{}.n{i}", sim.name);
            let mut routes = String::new();
            sim.wait("fabric routes gone", Duration::from_secs(30), || {
                let out = std::process::Command::new("ip")
                    .args(["-n", &ns, "route", "show"])
                    .output()
                    .expect("ip runs");
                routes = String::from_utf8_lossy(&out.stdout).into_owned();
                !routes.contains("tether-fabric") && !routes.contains("unreachable")
            });
        }
    }
}
