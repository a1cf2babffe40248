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

    // While peered, the kernel checks below do see Tether's state: they look in the right
    // places.
    let gateways = gateway_pods(&[&a, &b]);
    assert_eq!(
        gateways.len(),
        2,
        "one gateway pod per cluster: {gateways:?}"
    );
    assert!(
        !gateway_pids(&gateways).is_empty(),
        "no gateway process of {gateways:?}"
    );
    let links = ip_netns(&format!("sk.{}.n1", a.name), &["ip", "-o", "link", "show"]);
    assert!(
        links.contains(": tether-fabric"),
        "no fabric device:\n{links}"
    );

    // Unpeer: no Tether object, gateway, route, rule, table, link or process left on either
    // side.
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
            assert_no_tether_kernel_state(sim, &ns);
        }
    }
    a.wait("gateway processes gone", Duration::from_secs(30), || {
        gateway_pids(&gateways).is_empty()
    });
}

fn ip_netns(ns: &str, args: &[&str]) -> String {
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", ns])
        .args(args)
        .output()
        .expect("ip netns exec runs");
    assert!(
        out.status.success(),
        "{args:?} in {ns}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// No policy rule at the gateway's priorities (tether-netplan's 7700 and the local-table copy
/// at 7701), no nftables table of the gateway or the fabric, no fabric or tunnel device.
fn assert_no_tether_kernel_state(sim: &e2e::Sim, ns: &str) {
    let rules = ip_netns(ns, &["ip", "rule", "show"]);
    assert!(
        !rules
            .lines()
            .any(|l| l.starts_with("7700:") || l.starts_with("7701:")),
        "tether policy rules left in {ns} of {}:\n{rules}",
        sim.name
    );
    let tables = ip_netns(ns, &["nft", "list", "tables"]);
    assert!(
        !tables
            .lines()
            .any(|l| l.trim() == "table ip tether" || l.trim() == "table ip tether-fabric"),
        "tether nftables tables left in {ns} of {}:\n{tables}",
        sim.name
    );
    let links = ip_netns(ns, &["ip", "-o", "link", "show"]);
    assert!(
        !links
            .lines()
            .any(|l| l.contains(": tether-fabric") || l.contains(": tth-")),
        "tether links left in {ns} of {}:\n{links}",
        sim.name
    );
}

/// The names of the gateway pods of both clusters.
fn gateway_pods(sims: &[&e2e::Sim]) -> Vec<String> {
    sims.iter()
        .flat_map(|sim| sim.names(&["pods", "-A", "-l", "tether.dev/component=gateway"]))
        .map(|p| p.trim_start_matches("pod/").to_owned())
        .collect()
}

/// `tetherd gateway` processes of the pods named, found as `Sim::controller_pids` finds
/// controllers (pods are processes here, with `POD_NAME` in their environment); also after
/// their pods are gone.
fn gateway_pids(pods: &[String]) -> Vec<u32> {
    let wanted: Vec<String> = pods.iter().map(|p| format!("POD_NAME={p}")).collect();
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let is_gateway = args.first().is_some_and(|a| a.ends_with(b"tetherd"))
            && args.get(1).is_some_and(|a| *a == b"gateway");
        let environ = std::fs::read(entry.path().join("environ")).unwrap_or_default();
        if is_gateway
            && environ
                .split(|b| *b == 0)
                .any(|v| wanted.iter().any(|w| v == w.as_bytes()))
        {
            pids.push(pid);
        }
    }
    pids
}
