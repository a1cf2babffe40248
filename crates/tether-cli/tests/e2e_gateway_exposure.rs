//! How the gateway server is exposed and who can dial it, end to end on simulated clusters
//! that both use pod CIDR 10.244.0.0/16: a token-only peering (`tether generate peer-command`)
//! with a NodePort gateway Service; a consumer behind NAT, for which the automatic choice of
//! the gateway server keeps the provider's; and a provider behind NAT, for which it moves the
//! server to the consumer (then both asked for explicitly). Traffic must pass both ways
//! between pods on different nodes, with the receiver seeing the caller's remapped address.
//! Needs root; in CI it must run.

mod e2e;

use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Command;
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

/// The gateway server side `sim`'s ForeignCluster of `remote_id` records, and why.
fn recorded_side(sim: &Sim, remote_id: &str) -> (String, String) {
    let get = |field: &str| {
        sim.jsonpath(
            &["foreignclusters.core.tether.dev", remote_id],
            &format!("{{.status.networking.{field}}}"),
        )
    };
    (get("gatewayServer"), get("gatewayServerChoice"))
}

/// The names of the gateway objects of `kind` in `sim`'s tenant namespace of `remote_id`.
fn gateways(sim: &Sim, kind: &str, remote_id: &str) -> Vec<String> {
    sim.names(&[
        &format!("{kind}.networking.tether.dev"),
        "-n",
        &format!("tether-tenant-{remote_id}"),
    ])
    .iter()
    .map(|n| n.rsplit('/').next().unwrap_or_default().to_owned())
    .collect()
}

/// Peers `a` (consumer `alpha`) with `b` (provider `beta`) with `extra` flags; returns the
/// progress output once both gateways report the tunnel.
fn peer(a: &Sim, b: &Sim, extra: &[&str]) -> String {
    let mut args = vec![
        "peer",
        "--remote-kubeconfig",
        b.kubeconfig(),
        "--timeout",
        "4m",
    ];
    args.extend_from_slice(extra);
    let peer = a.tether(&args);
    peer.ok();
    assert!(peer.stderr.contains("tunnel to beta up"), "{}", peer.stderr);
    assert_eq!(connection(a, "beta"), "Connected");
    // `peer` returns on the consumer's view of the tunnel; the provider's gateway writes its
    // own Connection once its probes are answered, at most about a second later.
    b.wait(
        "the provider's gateway reports the tunnel",
        Duration::from_secs(30),
        || connection(b, "alpha") == "Connected",
    );
    peer.stderr
}

fn unpeer(a: &Sim, b: &Sim) {
    a.tether(&[
        "unpeer",
        "--remote-kubeconfig",
        b.kubeconfig(),
        "--timeout",
        "3m",
    ])
    .ok();
}

/// The `[ seconds]` stamp and the duration of the progress line that says the tunnel is up.
fn tunnel_line(stderr: &str) -> &str {
    stderr
        .lines()
        .find(|l| l.contains("tunnel to beta up"))
        .unwrap_or_default()
}

#[test]
fn a_consumer_behind_nat_gets_the_provider_as_server_automatically_or_when_asked() {
    let Some(mut env) = Env::new("gwnat") else {
        return;
    };
    let a = env.up_nodes("a", 2, &["--behind-nat"]);
    let b = env.up_nodes("b", 2, &[]);
    a.install("alpha", &[]);
    b.install("beta", &[]);

    // The automatic choice tries the provider first; the consumer's gateway dials out of its
    // NAT, so that first attempt connects and stays.
    let stderr = peer(&a, &b, &[]);
    assert!(
        stderr.contains(
            "gateway server: provider (chosen automatically: the provider's gateway was reachable)"
        ),
        "{stderr}"
    );
    assert_eq!(
        recorded_side(&a, "beta"),
        ("Provider".to_owned(), "Automatic".to_owned())
    );
    assert_eq!(gateways(&b, "gatewayservers", "alpha"), ["tether-gateway"]);
    assert!(gateways(&a, "gatewayservers", "beta").is_empty());
    traffic_passes_both_ways(&a, "alpha", &b, "beta", "nat");

    unpeer(&a, &b);
    let stderr = peer(&a, &b, &["--gateway-server", "provider"]);
    assert!(
        stderr.contains("gateway server: provider (as requested)"),
        "{stderr}"
    );
    assert_eq!(
        recorded_side(&a, "beta"),
        ("Provider".to_owned(), "Requested".to_owned())
    );
    traffic_passes_both_ways(&a, "alpha", &b, "beta", "nat2");
}

/// Lets other clusters open TCP connections to the control plane of `sim`, a cluster behind
/// NAT (its API server and authentication Service), as a provider's admin publishing them
/// through the router would; UDP from outside still opens nothing, so its gateway cannot be
/// dialled.
fn publish_control_plane(env: &Env, sim: &Sim) {
    let rtr = format!("sk.{}.rtr", sim.name);
    let sh = |args: &[&str]| {
        let out = Command::new(args[0])
            .args(&args[1..])
            .output()
            .expect("the command runs");
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let uplink = sh(&[
        "ip", "-n", &rtr, "-4", "-o", "addr", "show", "dev", "uplink",
    ]);
    let router = uplink
        .split_whitespace()
        .skip_while(|w| *w != "inet")
        .nth(1)
        .and_then(|a| a.split('/').next())
        .expect("the router's uplink address")
        .to_owned();
    let api = sim.jsonpath(
        &["endpointslices", "-n", "default", "kubernetes"],
        "{.endpoints[0].addresses[0]}",
    );
    let auth = sim.jsonpath(
        &["services", "-n", "tether-system", "tether-auth"],
        "{.status.loadBalancer.ingress[0].ip}",
    );
    for addr in [&api, &auth] {
        assert!(addr.parse::<Ipv4Addr>().is_ok(), "{addr:?}");
        sh(&[
            "ip",
            "-n",
            env.underlay(),
            "route",
            "replace",
            &format!("{addr}/32"),
            "via",
            &router,
        ]);
    }
    for chain in ["forward", "input"] {
        sh(&[
            "ip",
            "netns",
            "exec",
            &rtr,
            "nft",
            "insert",
            "rule",
            "ip",
            "sk-router",
            chain,
            "iifname",
            "uplink",
            "meta",
            "l4proto",
            "tcp",
            "accept",
        ]);
    }
}

#[test]
fn a_provider_behind_nat_gets_the_consumer_as_server_automatically_or_when_asked() {
    let Some(mut env) = Env::new("gwpnat") else {
        return;
    };
    let a = env.up_nodes("a", 2, &[]);
    let b = env.up_nodes("b", 2, &["--behind-nat"]);
    a.install("alpha", &[]);
    b.install("beta", &[]);
    publish_control_plane(&env, &b);

    // The provider's gateway cannot be dialled through its NAT: after the attempt window the
    // consumer listens and the provider's gateway dials out to it.
    let stderr = peer(&a, &b, &[]);
    eprintln!(
        "automatic choice, provider behind NAT: {}",
        tunnel_line(&stderr)
    );
    assert!(
        stderr.contains(
            "gateway server: consumer (chosen automatically: the provider's gateway was not \
             reachable)"
        ),
        "{stderr}"
    );
    assert_eq!(
        recorded_side(&a, "beta"),
        ("Consumer".to_owned(), "Automatic".to_owned())
    );
    let switches = a.jsonpath(
        &["foreignclusters.core.tether.dev", "beta"],
        "{.status.networking.switches}",
    );
    assert_eq!(switches, "1");
    assert_eq!(gateways(&a, "gatewayservers", "beta"), ["tether-gateway"]);
    assert_eq!(gateways(&b, "gatewayclients", "alpha"), ["tether-gateway"]);
    assert!(gateways(&b, "gatewayservers", "alpha").is_empty());
    assert!(gateways(&a, "gatewayclients", "beta").is_empty());
    traffic_passes_both_ways(&a, "alpha", &b, "beta", "pnat");

    unpeer(&a, &b);
    let stderr = peer(&a, &b, &["--gateway-server", "consumer"]);
    eprintln!(
        "explicit consumer, provider behind NAT: {}",
        tunnel_line(&stderr)
    );
    assert!(
        stderr.contains("gateway server: consumer (as requested)"),
        "{stderr}"
    );
    assert_eq!(
        recorded_side(&a, "beta"),
        ("Consumer".to_owned(), "Requested".to_owned())
    );
    assert_eq!(gateways(&a, "gatewayservers", "beta"), ["tether-gateway"]);
    traffic_passes_both_ways(&a, "alpha", &b, "beta", "pnat2");
}
