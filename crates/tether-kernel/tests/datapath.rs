//! Model L end to end without WireGuard: two simulated clusters with the same pod CIDR, their
//! gateways programmed by the kernel adapter from netplan plans, and a veth pair standing in for
//! the tunnel (it carries the real, overlapping addresses, exactly like the WireGuard tunnel).
//! TCP echoes prove the remap in both directions, and UDP proves that a missing tunnel never
//! leaks a peer's traffic to a local pod (root required).

#![allow(clippy::unwrap_used)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use ipnet::Ipv4Net;
use tether_kernel::{Kernel, KernelConfig};
use tether_netplan::{CidrMapping, GatewayInput, LocalNetworks, PeerInput};
use tether_testkit::{
    Cluster, ClusterSpec, TcpEchoServer, Topology, UdpEchoServer, require_tools_or_skip, tcp_echo,
    udp_echo, veth_pair,
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

/// A's input (sees B as 10.71/16) and B's input (sees A as 10.72/16).
fn inputs(a: &Cluster, b: &Cluster) -> (GatewayInput, GatewayInput) {
    (
        gateway_input(
            a,
            "cluster-b",
            "tether-b",
            "10.71.0.0/16",
            "169.254.18.1/30",
        ),
        gateway_input(
            b,
            "cluster-a",
            "tether-a",
            "10.72.0.0/16",
            "169.254.18.2/30",
        ),
    )
}

/// Creates the stand-in tunnel between the gateways of `a` and `b` and reconciles both.
fn wire_and_program(a: &Cluster, b: &Cluster) {
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
    // Each gateway applies only its own choice of remap.
    let (input_a, input_b) = inputs(a, b);
    program(a, &input_a);
    program(b, &input_b);
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
    wire_and_program(a, b);

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

#[test]
fn a_pod_with_the_address_of_the_remote_gateway_still_reaches_the_remote_cluster() {
    if !require_tools_or_skip(&["ping"]) {
        return;
    }
    let topo = Topology::builder()
        .cluster(
            ClusterSpec::new("a")
                .pod_cidr("10.0.0.0/16")
                .pods(2)
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
    // In a cluster the gateway is a pod, so with the same pod CIDR on both sides the remote
    // gateway's own address is often the address of a local pod. B's gateway takes the address
    // of A's pod 1 here (B's own pod 1 stays unused, as pod addresses are unique in a cluster):
    // A's requests arrive at it with that (real) source, and the replies are translated back
    // to it before B's gateway routes them.
    let sender = a.pod_ip(1);
    b.gateway()
        .ip(&["addr", "add", &format!("{sender}/32"), "dev", "lo"])
        .unwrap();
    wire_and_program(a, b);

    let b_from_a = view_of("10.71.0.0/16", b.pod_ip(0));
    let a_from_b = view_of("10.72.0.0/16", sender);
    assert!(a.pod(1).ping(IpAddr::V4(b_from_a)).unwrap(), "a → b ping");
    let _server = TcpEchoServer::start(b.pod(0), "0.0.0.0:7000".parse().unwrap()).unwrap();
    let reply = tcp_echo(
        a.pod(1),
        SocketAddr::new(IpAddr::V4(b_from_a), 7000),
        b"hi b",
        TIMEOUT,
    )
    .unwrap();
    assert_eq!(reply.payload, b"hi b");
    assert_eq!(reply.seen_as.ip(), IpAddr::V4(a_from_b));
}

/// An ICMP error from a socket's error queue: type, code and the address that sent it.
type IcmpError = (u8, u8, Option<Ipv4Addr>);

/// Sends `count` datagrams from inside `ns` to `to` on an unconnected socket with `IP_RECVERR`,
/// then collects the ICMP errors queued for it within `wait`: (type, code, offender) each, and
/// the errors that sends returned (a queued ICMP error fails the next send with its errno).
fn udp_send_collecting_icmp(
    ns: &tether_testkit::Netns,
    to: SocketAddr,
    count: usize,
    wait: Duration,
) -> (Vec<IcmpError>, Vec<std::io::ErrorKind>) {
    use std::io::IoSliceMut;
    use std::os::fd::AsRawFd;

    use nix::sys::socket::{
        ControlMessageOwned, MsgFlags, SockaddrIn, recvmsg, setsockopt, sockopt,
    };

    ns.run(|| {
        let socket = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
        setsockopt(&socket, sockopt::Ipv4RecvErr, &true).unwrap();
        let mut errors = Vec::new();
        let mut send_errors = Vec::new();
        for i in 0..count {
            if let Err(error) = socket.send_to(format!("datagram {i}").as_bytes(), to) {
                send_errors.push(error.kind());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let deadline = std::time::Instant::now() + wait;
        while std::time::Instant::now() < deadline {
            let mut buffer = [0u8; 512];
            let mut iov = [IoSliceMut::new(&mut buffer)];
            let mut space = nix::cmsg_space!(libc::sock_extended_err, libc::sockaddr_in);
            match recvmsg::<SockaddrIn>(
                socket.as_raw_fd(),
                &mut iov,
                Some(&mut space),
                MsgFlags::MSG_ERRQUEUE | MsgFlags::MSG_DONTWAIT,
            ) {
                Ok(message) => {
                    for cmsg in message.cmsgs().unwrap() {
                        if let ControlMessageOwned::Ipv4RecvErr(error, offender) = cmsg {
                            assert_eq!(error.ee_origin, libc::SO_EE_ORIGIN_ICMP);
                            let offender =
                                offender.map(|o| Ipv4Addr::from(u32::from_be(o.sin_addr.s_addr)));
                            errors.push((error.ee_type, error.ee_code, offender));
                        }
                    }
                }
                Err(nix::errno::Errno::EAGAIN) => std::thread::sleep(Duration::from_millis(20)),
                Err(error) => panic!("reading the error queue: {error}"),
            }
        }
        (errors, send_errors)
    })
}

/// Regression: with its tunnel device gone, a peer's marked traffic once fell through its empty
/// route table to the main table and — already translated to the peer's real CIDR, which equals
/// ours — reached a local pod with the same address. The peer table's `unreachable default`
/// must drop it and tell the sender, and restoring the device must restore the path.
#[test]
fn traffic_for_a_peer_without_its_tunnel_never_reaches_a_local_pod() {
    if !require_tools_or_skip(&[]) {
        return;
    }
    const PORT: u16 = 7100;
    const DATAGRAMS: usize = 10;
    let topo = Topology::builder()
        .cluster(
            ClusterSpec::new("a")
                .pod_cidr("10.0.0.0/16")
                .pods(2)
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
    wire_and_program(a, b);
    // A's pod 0 and B's pod 0 share 10.0.1.2; A's pod 1 (10.0.1.3) sends to B's as 10.71.1.2.
    assert_eq!(a.pod_ip(0), b.pod_ip(0), "the clusters overlap");
    let bind = SocketAddr::from((Ipv4Addr::UNSPECIFIED, PORT));
    let local_twin = UdpEchoServer::start(a.pod(0), bind).unwrap();
    let server_b = UdpEchoServer::start(b.pod(0), bind).unwrap();
    let b_from_a = SocketAddr::new(IpAddr::V4(view_of("10.71.0.0/16", b.pod_ip(0))), PORT);
    let reply = udp_echo(a.pod(1), b_from_a, b"before", TIMEOUT).unwrap();
    assert_eq!(
        reply.payload, b"before",
        "the path works before the tunnel goes"
    );

    // The tunnel device disappears (deleting one end of the veth removes both, as a gateway
    // restart removes its TUN devices); our rules, tables and nftables table stay.
    a.gateway().ip(&["link", "del", "tether-b"]).unwrap();
    let table = a.gateway().ip(&["route", "show", "table", "7700"]).unwrap();
    assert!(
        table.contains("unreachable default") && !table.contains("tether-b"),
        "A's table for B without the tunnel:\n{table}"
    );
    let twin_before = local_twin.peers().len();
    let (errors, send_errors) =
        udp_send_collecting_icmp(a.pod(1), b_from_a, DATAGRAMS, Duration::from_secs(2));
    // The wait above is also the bounded wait for leaked datagrams at A's pod 0.
    assert_eq!(
        local_twin.peers().len(),
        twin_before,
        "datagrams for B reached A's own pod with B's address: {:?}",
        local_twin.peers()
    );
    eprintln!(
        "sent {DATAGRAMS} datagrams without the tunnel: 0 reached the local twin; {} ICMP \
         errors queued {errors:?}; {} sends failed {send_errors:?}",
        errors.len(),
        send_errors.len()
    );
    // ICMP destination unreachable (3), host unreachable (1), whose source is the address the
    // sender used. The quoted header keeps B's real address (the DNAT is not undone in it), so
    // a socket connected to 10.71.1.2 does not match it; an unconnected one with IP_RECVERR
    // does, which is why the helper uses one.
    assert!(!errors.is_empty(), "the sender got no ICMP error");
    assert!(
        send_errors
            .iter()
            .all(|kind| *kind == std::io::ErrorKind::HostUnreachable),
        "sends failed only with the reported host unreachable: {send_errors:?}"
    );
    for (kind, code, offender) in &errors {
        assert_eq!((*kind, *code), (3, 1), "ICMP type/code");
        assert_eq!(
            offender.map(IpAddr::V4),
            Some(b_from_a.ip()),
            "ICMP source as the sender addressed it"
        );
    }

    // Restore the device and reconcile: traffic reaches B again, still not the twin.
    wire_and_program(a, b);
    let reply = udp_echo(a.pod(1), b_from_a, b"after", TIMEOUT).unwrap();
    assert_eq!(reply.payload, b"after");
    assert_eq!(
        reply.seen_as.ip(),
        IpAddr::V4(view_of("10.72.0.0/16", a.pod_ip(1))),
        "B sees A's pod 1 through B's own remap"
    );
    assert!(!server_b.peers().is_empty());
    assert_eq!(
        local_twin.peers().len(),
        twin_before,
        "nothing ever reached the twin"
    );
}
