//! Model L end to end without WireGuard: two simulated clusters with the same pod CIDR, their
//! gateways programmed by the kernel adapter from netplan plans, and a veth pair standing in for
//! the tunnel (it carries the real, overlapping addresses, exactly like the WireGuard tunnel).
//! TCP echoes prove the remap in both directions (root required).

#![allow(clippy::unwrap_used)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use ipnet::Ipv4Net;
use tether_kernel::{Kernel, KernelConfig};
use tether_netplan::{CidrMapping, GatewayInput, LocalNetworks, PeerInput};
use tether_testkit::{
    Cluster, ClusterSpec, TcpEchoServer, Topology, require_tools_or_skip, tcp_echo, veth_pair,
};

const TIMEOUT: Duration = Duration::from_secs(5);

fn net(text: &str) -> Ipv4Net {
    text.parse().unwrap()
}

/// The gateway input of `cluster`, which sees its one peer's 10.0.0.0/16 as `view`.
fn gateway_input(
    cluster: &Cluster,
    peer: &str,
    tunnel: &str,
    view: &str,
    addr: &str,
) -> GatewayInput {
    GatewayInput {
        pod_interfaces: vec![cluster.pod_facing_interface().to_owned()],
        local: LocalNetworks {
            pod_cidrs: vec![cluster.pod_cidr()],
            external_cidr: None,
        },
        peers: vec![PeerInput {
            id: peer.to_owned(),
            interface: tunnel.to_owned(),
            tunnel_address: Some(net(addr)),
            pod: CidrMapping::remapped(net("10.0.0.0/16"), net(view)),
            external: None,
        }],
        ..GatewayInput::default()
    }
}

fn program(cluster: &Cluster, input: &GatewayInput) {
    let plan = tether_netplan::plan(input).unwrap();
    cluster.gateway().run_async(|| async {
        let mut kernel = Kernel::new(KernelConfig::new(input.ownership())).unwrap();
        let report = kernel.reconcile(&plan).await.unwrap();
        assert!(report.is_success(), "{:#?}", report.failed);
    });
}

fn view_of(view: &str, real: Ipv4Addr) -> Ipv4Addr {
    // Same host part, other /16: 10.0.1.2 seen through 10.71.0.0/16 is 10.71.1.2.
    let view = net(view);
    Ipv4Addr::from(u32::from(view.network()) | (u32::from(real) & !u32::from(view.netmask())))
}

#[test]
fn overlapping_clusters_reach_each_other_through_their_own_remaps() {
    if !require_tools_or_skip(&["ping"]) {
        return;
    }
    let topo = Topology::builder()
        .cluster(
            ClusterSpec::new("a")
                .pod_cidr("10.0.0.0/16")
                .route_to_gateway("10.71.0.0/16"),
        )
        .cluster(
            ClusterSpec::new("b")
                .pod_cidr("10.0.0.0/16")
                .route_to_gateway("10.72.0.0/16"),
        )
        .build()
        .unwrap();
    let (a, b) = (topo.cluster("a"), topo.cluster("b"));
    assert_eq!(a.pod_ip(0), b.pod_ip(0), "the clusters overlap");
    // The stand-in tunnel. A real tunnel has no link layer; on veth the far gateway must answer
    // ARP for the peer pods it routes elsewhere.
    veth_pair(a.gateway(), "tether-b", b.gateway(), "tether-a", 1420).unwrap();
    for (gateway, stand_in) in [(a.gateway(), "tether-b"), (b.gateway(), "tether-a")] {
        gateway
            .set_sysctl(&format!("net/ipv4/conf/{stand_in}/proxy_arp"), "1")
            .unwrap();
        // Proxy ARP answers after a random delay of up to 0.8 s by default; a tunnel has none.
        gateway
            .set_sysctl(&format!("net/ipv4/neigh/{stand_in}/proxy_delay"), "0")
            .unwrap();
    }

    // A sees B as 10.71/16, B sees A as 10.72/16; each gateway applies only its own choice.
    program(
        a,
        &gateway_input(
            a,
            "cluster-b",
            "tether-b",
            "10.71.0.0/16",
            "169.254.18.1/30",
        ),
    );
    program(
        b,
        &gateway_input(
            b,
            "cluster-a",
            "tether-a",
            "10.72.0.0/16",
            "169.254.18.2/30",
        ),
    );

    let b_from_a = view_of("10.71.0.0/16", b.pod_ip(0));
    let a_from_b = view_of("10.72.0.0/16", a.pod_ip(0));
    assert_eq!(b_from_a.to_string(), "10.71.1.2");
    assert!(a.pod(0).ping(IpAddr::V4(b_from_a)).unwrap(), "a → b ping");
    assert!(b.pod(0).ping(IpAddr::V4(a_from_b)).unwrap(), "b → a ping");

    let server_b = TcpEchoServer::start(b.pod(0), "0.0.0.0:7000".parse().unwrap()).unwrap();
    let reply = tcp_echo(
        a.pod(0),
        SocketAddr::new(IpAddr::V4(b_from_a), 7000),
        b"hi b",
        TIMEOUT,
    )
    .unwrap();
    assert_eq!(reply.payload, b"hi b");
    assert_eq!(
        reply.local.ip(),
        IpAddr::V4(a.pod_ip(0)),
        "a's pod uses its real address"
    );
    assert_eq!(
        reply.seen_as.ip(),
        IpAddr::V4(a_from_b),
        "b sees a through b's own remap"
    );

    let server_a = TcpEchoServer::start(a.pod(0), "0.0.0.0:7000".parse().unwrap()).unwrap();
    // A payload bigger than the tunnel MTU: the MSS clamp keeps segments inside it.
    let big = vec![b'x'; 64 * 1024];
    let reply = tcp_echo(
        b.pod(0),
        SocketAddr::new(IpAddr::V4(a_from_b), 7000),
        &big,
        TIMEOUT,
    )
    .unwrap();
    assert_eq!(reply.payload.len(), big.len());
    assert_eq!(
        reply.seen_as.ip(),
        IpAddr::V4(b_from_a),
        "a sees b through a's own remap"
    );
    assert_eq!(server_a.peers().len(), 1);
    assert_eq!(server_b.peers().len(), 1);
}
