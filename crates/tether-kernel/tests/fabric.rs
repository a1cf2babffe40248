//! The fabric adapter in real network namespaces (root required): two nodes and one gateway
//! pod on a bridged underlay, a pod behind each node and a "remote" host behind the gateway.
//! Pods reach the remote CIDR through the VXLAN overlay with their own source address, a
//! second reconcile changes nothing, a removed peer takes its objects with it, a foreign route
//! is never touched, MSS clamping carries 1 MiB through a 1400-byte route MTU with ICMP
//! filtered, and teardown leaves nothing of ours.

// Helpers shared by the tests fail the test on setup errors, like the tests themselves.
#![allow(clippy::unwrap_used)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use ipnet::Ipv4Net;
use tether_kernel::{FabricConfig, FabricKernel, FabricReport};
use tether_netplan::{DEFAULT_FABRIC_TABLE, FabricInput, FabricPeer, FabricPlan, plan_fabric};
use tether_testkit::{
    Netns, TcpEchoServer, UdpEchoServer, require_tools_or_skip, tcp_echo, udp_echo, veth_pair,
};

const DEVICE: &str = "tether-fabric";
const TIMEOUT: Duration = Duration::from_secs(5);
const NODE_A: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 1);
const NODE_B: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 2);
const GATEWAY: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 3);
const REMOTE_HOST: Ipv4Addr = Ipv4Addr::new(10, 71, 0, 5);
const POD_A: Ipv4Addr = Ipv4Addr::new(10, 0, 1, 2);
const POD_B: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 2);

fn net(text: &str) -> Ipv4Net {
    text.parse().unwrap()
}

struct Lab {
    // Field order is drop order: namespaces go after nothing else references them.
    node_a: Netns,
    node_b: Netns,
    gateway: Netns,
    pod_a: Netns,
    pod_b: Netns,
    remote: Netns,
    _underlay: Netns,
}

fn attach(underlay: &Netns, port: &str, ns: &Netns, address: Ipv4Addr) {
    veth_pair(underlay, port, ns, "eth0", 1500).unwrap();
    underlay
        .ip(&["link", "set", port, "master", "br0"])
        .unwrap();
    ns.ip(&["addr", "add", &format!("{address}/24"), "dev", "eth0"])
        .unwrap();
    ns.ip(&["link", "set", "lo", "up"]).unwrap();
}

/// A host behind `router` on a point-to-point /24: `host` gets `.2` (or `address`), the router
/// `.1`, and the host's default route points at the router.
fn behind(router: &Netns, router_if: &str, host: &Netns, address: Ipv4Addr, prefix: u8) {
    veth_pair(router, router_if, host, "eth0", 1500).unwrap();
    let [a, b, c, _] = address.octets();
    let first = if prefix == 24 {
        Ipv4Addr::new(a, b, c, 1)
    } else {
        Ipv4Addr::new(a, b, 0, 1)
    };
    router
        .ip(&[
            "addr",
            "add",
            &format!("{first}/{prefix}"),
            "dev",
            router_if,
        ])
        .unwrap();
    host.ip(&["addr", "add", &format!("{address}/{prefix}"), "dev", "eth0"])
        .unwrap();
    host.ip(&["link", "set", "lo", "up"]).unwrap();
    host.ip(&["route", "add", "default", "via", &first.to_string()])
        .unwrap();
    router.set_sysctl("net/ipv4/ip_forward", "1").unwrap();
}

fn lab(tag: &str) -> Lab {
    let underlay = Netns::new(&format!("fab-{tag}-u")).unwrap();
    underlay
        .ip(&["link", "add", "br0", "type", "bridge"])
        .unwrap();
    underlay.ip(&["link", "set", "br0", "up"]).unwrap();
    let node_a = Netns::new(&format!("fab-{tag}-a")).unwrap();
    let node_b = Netns::new(&format!("fab-{tag}-b")).unwrap();
    let gateway = Netns::new(&format!("fab-{tag}-g")).unwrap();
    attach(&underlay, "va", &node_a, NODE_A);
    attach(&underlay, "vb", &node_b, NODE_B);
    attach(&underlay, "vg", &gateway, GATEWAY);
    let pod_a = Netns::new(&format!("fab-{tag}-pa")).unwrap();
    let pod_b = Netns::new(&format!("fab-{tag}-pb")).unwrap();
    let remote = Netns::new(&format!("fab-{tag}-r")).unwrap();
    behind(&node_a, "pod0", &pod_a, POD_A, 24);
    behind(&node_b, "pod0", &pod_b, POD_B, 24);
    // The gateway's tunnel, reduced to a veth: the remote host sees what the gateway forwards.
    behind(&gateway, "tun0", &remote, REMOTE_HOST, 16);
    Lab {
        node_a,
        node_b,
        gateway,
        pod_a,
        pod_b,
        remote,
        _underlay: underlay,
    }
}

fn input(local: Ipv4Addr, peers: Vec<FabricPeer>, unreachable: &[&str]) -> FabricInput {
    FabricInput {
        device: DEVICE.to_owned(),
        vni: 7700,
        port: 4789,
        local_ip: local,
        mtu: 1450,
        table: DEFAULT_FABRIC_TABLE.to_owned(),
        peers,
        unreachable: unreachable.iter().map(|c| net(c)).collect(),
    }
}

/// A node: the remote cluster's CIDR behind the gateway pod at a 1400-byte tunnel MTU, and a
/// second remote cluster without a gateway.
fn node_plan(local: Ipv4Addr) -> FabricPlan {
    let gateway = FabricPeer {
        ip: GATEWAY,
        cidrs: vec![net("10.71.0.0/16")],
        mtu: Some(1400),
    };
    plan_fabric(&input(local, vec![gateway], &["10.73.0.0/16"])).unwrap()
}

fn gateway_plan() -> FabricPlan {
    let node = |ip, cidr| FabricPeer {
        ip,
        cidrs: vec![net(cidr)],
        mtu: None,
    };
    let peers = vec![node(NODE_A, "10.0.1.0/24"), node(NODE_B, "10.0.2.0/24")];
    plan_fabric(&input(GATEWAY, peers, &[])).unwrap()
}

fn reconcile(ns: &Netns, plan: &FabricPlan) -> FabricReport {
    ns.run_async(|| async {
        let mut kernel =
            FabricKernel::new(FabricConfig::new(DEVICE, DEFAULT_FABRIC_TABLE)).unwrap();
        kernel.reconcile(plan).await.unwrap()
    })
}

fn teardown(ns: &Netns) -> FabricReport {
    ns.run_async(|| async {
        let mut kernel =
            FabricKernel::new(FabricConfig::new(DEVICE, DEFAULT_FABRIC_TABLE)).unwrap();
        kernel.teardown().await.unwrap()
    })
}

fn assert_clean(report: &FabricReport) {
    assert!(report.is_success(), "failures: {:#?}", report.failed);
}

/// The output of a command that must succeed.
fn text(ns: &Netns, args: &[&str]) -> String {
    let output = ns.exec(args).unwrap();
    assert!(
        output.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn has_table(ns: &Netns) -> bool {
    ns.exec(&["nft", "list", "table", "ip", DEFAULT_FABRIC_TABLE])
        .unwrap()
        .status
        .success()
}

#[test]
fn pods_reach_the_remote_cidr_through_the_overlay_without_nat() {
    if !require_tools_or_skip(&["bridge"]) {
        return;
    }
    let lab = lab("t");
    for (ns, plan) in [
        (&lab.node_a, node_plan(NODE_A)),
        (&lab.node_b, node_plan(NODE_B)),
        (&lab.gateway, gateway_plan()),
    ] {
        let report = reconcile(ns, &plan);
        assert_clean(&report);
        assert!(!report.is_noop());
        let again = reconcile(ns, &plan);
        assert!(again.is_noop(), "second reconcile did {:?}", again.applied);
    }
    let fdb = text(&lab.node_a, &["bridge", "fdb", "show", "dev", DEVICE]);
    assert!(fdb.contains("02:74:cb:00:71:03 dst 203.0.113.3"), "{fdb}");
    let routes = text(&lab.node_a, &["ip", "route", "show", "proto", "117"]);
    assert!(
        routes.contains("10.71.0.0/16 via 203.0.113.3 dev tether-fabric onlink mtu 1400")
            && routes.contains("unreachable 10.73.0.0/16"),
        "{routes}"
    );

    let tcp = TcpEchoServer::start(&lab.remote, SocketAddr::from((REMOTE_HOST, 0))).unwrap();
    let udp = UdpEchoServer::start(&lab.remote, SocketAddr::from((REMOTE_HOST, 0))).unwrap();
    for (pod, source) in [(&lab.pod_a, POD_A), (&lab.pod_b, POD_B)] {
        let reply = tcp_echo(pod, tcp.local_addr(), b"hello", TIMEOUT).unwrap();
        assert_eq!(reply.payload, b"hello");
        assert_eq!(reply.seen_as.ip(), IpAddr::V4(source), "no NAT on the way");
        let reply = udp_echo(pod, udp.local_addr(), b"datagram", TIMEOUT).unwrap();
        assert_eq!(reply.seen_as.ip(), IpAddr::V4(source), "no NAT on the way");
        assert!(
            pod.ping(IpAddr::V4(REMOTE_HOST)).unwrap(),
            "ICMP through the overlay"
        );
    }
    // A remote cluster without a gateway fails at once instead of taking the default route.
    let start = std::time::Instant::now();
    let ping = lab
        .pod_a
        .exec(&["ping", "-n", "-c", "1", "-W", "3", "10.73.0.1"])
        .unwrap();
    assert!(!ping.status.success());
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "unreachable answers at once, not after a timeout"
    );
    // The remote host needs no route back to the pods except through the gateway: the gateway
    // pod routes each node's pod CIDR into the overlay.
    let back = text(&lab.gateway, &["ip", "route", "show", "proto", "117"]);
    assert!(
        back.contains("10.0.1.0/24 via 203.0.113.1 dev tether-fabric onlink"),
        "{back}"
    );
    drop((tcp, udp));
    for ns in [&lab.node_a, &lab.node_b, &lab.gateway] {
        assert_clean(&teardown(ns));
    }
}

#[test]
fn mss_clamping_carries_a_large_transfer_through_a_narrow_route_with_icmp_filtered() {
    if !require_tools_or_skip(&["bridge"]) {
        return;
    }
    let lab = lab("m");
    assert_clean(&reconcile(&lab.node_a, &node_plan(NODE_A)));
    assert_clean(&reconcile(&lab.gateway, &gateway_plan()));
    // Without "fragmentation needed" the pod cannot discover the 1400-byte route MTU: only the
    // clamp keeps its segments small enough.
    lab.pod_a
        .nft(
            "table ip blackhole {\n\tchain input {\n\t\ttype filter hook input priority 0; policy accept;\n\t\ticmp type destination-unreachable drop\n\t}\n}\n",
        )
        .unwrap();
    let tcp = TcpEchoServer::start(&lab.remote, SocketAddr::from((REMOTE_HOST, 0))).unwrap();
    let payload: Vec<u8> = (0..1 << 20).map(|i: u32| (i % 251) as u8).collect();
    // First without our table: the test must be able to fail.
    lab.node_a
        .nft(&format!("delete table ip {DEFAULT_FABRIC_TABLE}\n"))
        .unwrap();
    let short = Duration::from_secs(3);
    assert!(
        tcp_echo(&lab.pod_a, tcp.local_addr(), &payload, short).is_err(),
        "without the clamp the transfer must stall in the black hole"
    );
    // A reconcile notices the missing table and restores it.
    let repair = reconcile(&lab.node_a, &node_plan(NODE_A));
    assert_clean(&repair);
    assert_eq!(
        repair.applied.len(),
        1,
        "only the table: {:?}",
        repair.applied
    );
    let reply = tcp_echo(
        &lab.pod_a,
        tcp.local_addr(),
        &payload,
        Duration::from_secs(20),
    )
    .unwrap();
    assert_eq!(reply.payload.len(), payload.len());
    assert!(reply.payload == payload, "the echoed bytes differ");
    drop(tcp);
    assert_clean(&teardown(&lab.node_a));
    assert_clean(&teardown(&lab.gateway));
}

#[test]
fn removed_peers_and_teardown_take_only_our_objects() {
    if !require_tools_or_skip(&["bridge"]) {
        return;
    }
    let lab = lab("r");
    let node = &lab.node_a;
    assert_clean(&reconcile(node, &node_plan(NODE_A)));
    // Foreign routes: one through our device, one unreachable like ours but not tagged.
    node.ip(&["route", "add", "10.98.0.0/16", "dev", DEVICE])
        .unwrap();
    node.ip(&["route", "add", "unreachable", "10.97.0.0/16"])
        .unwrap();
    assert!(reconcile(node, &node_plan(NODE_A)).is_noop());

    // The gateway pod went away: its CIDR becomes unreachable, its FDB entry and neighbour go.
    let without = plan_fabric(&input(
        NODE_A,
        Vec::new(),
        &["10.71.0.0/16", "10.73.0.0/16"],
    ))
    .unwrap();
    assert_clean(&reconcile(node, &without));
    let fdb = text(node, &["bridge", "fdb", "show", "dev", DEVICE]);
    assert!(!fdb.contains("203.0.113.3"), "{fdb}");
    let neighbours = text(node, &["ip", "neigh", "show", "dev", DEVICE]);
    assert!(!neighbours.contains("203.0.113.3"), "{neighbours}");
    let routes = text(node, &["ip", "route", "show", "proto", "117"]);
    assert_eq!(
        routes.lines().collect::<Vec<_>>(),
        ["unreachable 10.71.0.0/16 ", "unreachable 10.73.0.0/16 "],
        "{routes}"
    );
    let all = text(node, &["ip", "route", "show"]);
    assert!(all.contains("10.98.0.0/16 dev tether-fabric"), "{all}");

    assert_clean(&teardown(node));
    assert!(!text(node, &["ip", "link", "show"]).contains(DEVICE));
    assert_eq!(text(node, &["ip", "route", "show", "proto", "117"]), "");
    assert!(!has_table(node));
    assert!(text(node, &["ip", "route", "show"]).contains("unreachable 10.97.0.0/16"));
    assert!(teardown(node).is_noop(), "a second teardown finds nothing");
}
