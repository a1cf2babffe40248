//! How the gateway server is exposed and who can dial it, end to end on simulated clusters
//! that both use pod CIDR 10.244.0.0/16: a token-only peering (`tether generate peer-command`)
//! with a NodePort gateway Service, and a consumer behind NAT dialing out to the provider's
//! gateway. Traffic must pass both ways between pods on different nodes, with the receiver
//! seeing the caller's remapped address. Needs root; in CI it must run.

mod e2e;

use std::net::Ipv4Addr;
use std::path::Path;
use std::time::Duration;

use e2e::net::{echo_pod, nodes, pod_ip, remapped, talk, view_of};
use e2e::{Env, Sim};

/// The Connection of `sim` towards `remote_id`.
fn connection(sim: &Sim, remote_id: &str) -> String {
    sim.jsonpath(
        &[
            "connections.networking.tether.dev",
            "-n",
            &format!("tether-tenant-{remote_id}"),
            "tether-gateway",
        ],
        "{.status.value}",
    )
}

/// Echo pods on every node of `a` and `b`; then from the first node of each cluster to the
/// pod on the last node of the other (so traffic crosses nodes on both sides), TCP and UDP,
/// the receiver seeing an address of its remap of the caller's cluster.
fn traffic_passes_both_ways(a: &Sim, a_id: &str, b: &Sim, b_id: &str, tag: &str) {
    let a_view = view_of(a, b_id);
    let b_view = view_of(b, a_id);
    for v in [&a_view, &b_view] {
        assert!(!v.is_empty() && v != "10.244.0.0/16", "remap {v:?}");
    }
    let (a_nodes, b_nodes) = (nodes(a), nodes(b));
    let last_ip = |sim: &Sim, sim_nodes: &[String], label: &str| -> Ipv4Addr {
        let name = format!("echo-{tag}-{label}");
        let node = sim_nodes.last().expect("a node");
        sim.apply_as(Path::new(sim.kubeconfig()), &echo_pod(&name, node))
            .ok();
        pod_ip(sim, &name)
    };
    let a_ip = last_ip(a, &a_nodes, "a");
    let b_ip = last_ip(b, &b_nodes, "b");
    let mut n = 0;
    for (from, from_node, to_ip, to_view, back_view) in [
        (a, &a_nodes[0], b_ip, &a_view, &b_view),
        (b, &b_nodes[0], a_ip, &b_view, &a_view),
    ] {
        for proto in ["tcp", "udp"] {
            n += 1;
            let target = format!("{}:7000", remapped(to_view, to_ip));
            let seen = talk(
                from,
                &format!("traffic-{tag}-{n}"),
                from_node,
                proto,
                &target,
            );
            assert_eq!(seen.len(), 3, "{proto} to {target}: {seen:?}");
            let caller_net: ipnet::Ipv4Net = back_view.parse().expect("view");
            for s in &seen {
                let s: Ipv4Addr = s.parse().expect("peer address");
                assert!(
                    caller_net.contains(&s),
                    "{proto} to {target} from {from_node}: the receiver saw {s}, not an \
                     address of {back_view}"
                );
            }
        }
    }
}

#[test]
fn a_token_only_peering_with_a_nodeport_gateway_carries_traffic() {
    let Some(mut env) = Env::new("gwnp") else {
        return;
    };
    let a = env.up_nodes("a", 2, &[]);
    let b = env.up_nodes("b", 2, &[]);
    a.install("alpha", &[]);
    b.install("beta", &[]);

    // The provider's admin hands over a command; the consumer holds no provider kubeconfig.
    let cmd = b.tether(&["generate", "peer-command", "--ttl", "10m"]);
    cmd.ok();
    let line = cmd
        .stdout
        .lines()
        .find(|l| l.trim_start().starts_with("tether peer"))
        .expect("a tether peer line");
    let mut args: Vec<&str> = line.split_whitespace().skip(1).collect();
    assert!(!args.contains(&"--remote-kubeconfig"), "{line}");
    args.extend_from_slice(&["--gateway-service-type", "NodePort", "--timeout", "4m"]);
    let peer = a.tether(&args);
    peer.ok();
    assert!(peer.stderr.contains("tunnel to beta up"), "{}", peer.stderr);
    assert_eq!(connection(&a, "beta"), "Connected");
    // `peer` returns on the consumer's view of the tunnel; the provider's gateway writes its
    // own Connection once its probes are answered, at most about a second later.
    b.wait(
        "the provider's gateway reports the tunnel",
        Duration::from_secs(30),
        || connection(&b, "alpha") == "Connected",
    );

    // The provider serves: its Service is a NodePort and the endpoint it publishes is its
    // nodes' addresses with the node port.
    let ns = "tether-tenant-alpha";
    let svc_type = b.jsonpath(&["services", "-n", ns, "tether-gateway"], "{.spec.type}");
    assert_eq!(svc_type, "NodePort");
    let node_port = b.jsonpath(
        &["services", "-n", ns, "tether-gateway"],
        "{.spec.ports[0].nodePort}",
    );
    let mut node_ips: Vec<String> = b
        .jsonpath(
            &["nodes"],
            "{.items[*].status.addresses[?(@.type==\"InternalIP\")].address}",
        )
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    node_ips.sort();
    assert_eq!(node_ips.len(), 2, "{node_ips:?}");
    let endpoint = |path: &str| {
        b.jsonpath(
            &[
                "gatewayservers.networking.tether.dev",
                "-n",
                ns,
                "tether-gateway",
            ],
            path,
        )
    };
    assert_eq!(endpoint("{.status.endpoint.port}"), node_port);
    let mut published: Vec<String> = endpoint("{.status.endpoint.addresses[*]}")
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    published.sort();
    assert_eq!(published, node_ips);

    traffic_passes_both_ways(&a, "alpha", &b, "beta", "np");
}

#[test]
fn a_consumer_behind_nat_dials_the_providers_gateway_and_traffic_passes_both_ways() {
    let Some(mut env) = Env::new("gwnat") else {
        return;
    };
    let a = env.up_nodes("a", 2, &["--behind-nat"]);
    let b = env.up_nodes("b", 2, &[]);
    a.install("alpha", &[]);
    b.install("beta", &[]);
    // Default `--gateway-server provider`: the consumer's gateway is the client, so only
    // outbound UDP from behind the NAT is needed.
    let peer = a.tether(&[
        "peer",
        "--remote-kubeconfig",
        b.kubeconfig(),
        "--timeout",
        "4m",
    ]);
    peer.ok();
    assert!(peer.stderr.contains("tunnel to beta up"), "{}", peer.stderr);
    assert_eq!(connection(&a, "beta"), "Connected");
    // `peer` returns on the consumer's view of the tunnel; the provider's gateway writes its
    // own Connection once its probes are answered, at most about a second later.
    b.wait(
        "the provider's gateway reports the tunnel",
        Duration::from_secs(30),
        || connection(&b, "alpha") == "Connected",
    );
    traffic_passes_both_ways(&a, "alpha", &b, "beta", "nat");
}
