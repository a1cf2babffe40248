//! End-to-end tests of `tetherd gateway` between simulated clusters (network namespaces):
//! overlapping pod CIDRs, NAT, several peers, restarts, wrong keys, MTU and clean teardown.
//! They need root, `/dev/net/tun`, `ip` and `nft`; without them they skip loudly (or fail
//! when `CI` is set).

mod support;

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use support::*;
use tether_testkit::{ClusterSpec, TcpEchoServer, Topology, assert_eventually, tcp_echo};
use tether_wg::PrivateKey;

const HANDSHAKE: Duration = Duration::from_secs(10);

/// Two clusters, both 10.0.0.0/16; A is the client (knows B's endpoint).
struct TwoClusters {
    topo: Topology,
    a: GatewayFiles,
    b: GatewayFiles,
    /// How A sees B's pods, and how B sees A's.
    b_in_a: ipnet::Ipv4Net,
    a_in_b: ipnet::Ipv4Net,
}

fn two_clusters(a_behind_nat: bool, offloads: bool, wrong_key_for_b: bool) -> TwoClusters {
    let (ka, kb) = (PrivateKey::generate(), PrivateKey::generate());
    // The configs decide the remaps; the nodes must route those CIDRs to their gateways, so
    // compute them before building the topology. Both pod CIDRs are 10.0.0.0/16.
    let probe = Topology::builder()
        .cluster(ClusterSpec::new("p"))
        .build()
        .expect("probe topology");
    let a = GatewayFiles::new(ka.clone());
    let b = GatewayFiles::new(kb.clone());
    let pb = if wrong_key_for_b {
        PrivateKey::generate().public()
    } else {
        kb.public()
    };
    let entry = |id: &str, key, endpoint| PeerEntry {
        id: id.into(),
        public_key: key,
        endpoint,
        pod_cidr: "10.0.0.0/16".into(),
        keepalive: Some(5),
    };
    a.write(
        probe.cluster("p"),
        &[entry(
            "b",
            pb,
            Some(SocketAddr::from(([198, 18, 0, 11], PORT))),
        )],
    );
    b.write(probe.cluster("p"), &[entry("a", ka.public(), None)]);
    let b_in_a = local_view(&a, "b");
    let a_in_b = local_view(&b, "a");
    drop(probe);

    let mut spec_a = ClusterSpec::new("a").route_to_gateway(&b_in_a.to_string());
    if a_behind_nat {
        spec_a = spec_a.behind_nat();
    }
    let topo = Topology::builder()
        .cluster(spec_a)
        .cluster(ClusterSpec::new("b").route_to_gateway(&a_in_b.to_string()))
        .underlay_offloads(offloads)
        .build()
        .expect("topology");
    let b_endpoint = SocketAddr::new(IpAddr::V4(topo.cluster("b").gateway_underlay_ip()), PORT);
    a.write(topo.cluster("a"), &[entry("b", pb, Some(b_endpoint))]);
    b.write(topo.cluster("b"), &[entry("a", ka.public(), None)]);
    TwoClusters {
        topo,
        a,
        b,
        b_in_a,
        a_in_b,
    }
}

fn wait_healthy(ns: &tether_testkit::Netns) {
    assert_eventually!(
        http_get(ns, "/healthz").is_some_and(|(s, _)| s == 200),
        Duration::from_secs(10),
        "gateway never became healthy"
    );
}

#[test]
fn overlapping_pod_cidrs_reach_each_other_through_the_remap() {
    if !tether_testkit::require_tools_or_skip(&["ping"]) {
        return;
    }
    let t = two_clusters(false, true, false);
    let (ca, cb) = (t.topo.cluster("a"), t.topo.cluster("b"));
    let _ga = start_gateway(ca, &t.a);
    let _gb = start_gateway(cb, &t.b);
    wait_healthy(ca.gateway());
    wait_healthy(cb.gateway());

    let a_pod = ca.pod_ip(0);
    let b_pod = cb.pod_ip(0);
    assert_eq!(
        a_pod, b_pod,
        "the point of the test: identical pod addresses"
    );
    let b_pod_from_a = translate(b_pod, t.b_in_a);
    let a_pod_from_b = translate(a_pod, t.a_in_b);
    assert_ne!(b_pod_from_a, b_pod);

    // ICMP.
    assert_eventually!(
        ca.pod(0).ping(IpAddr::V4(b_pod_from_a)).unwrap_or(false),
        HANDSHAKE,
        "A's pod cannot ping B's pod at {b_pod_from_a}"
    );
    // TCP: B's echo server sees A's pod under B's remap of A.
    let server =
        TcpEchoServer::start(cb.pod(0), SocketAddr::new(IpAddr::V4(b_pod), 0)).expect("echo");
    let to = SocketAddr::new(IpAddr::V4(b_pod_from_a), server.local_addr().port());
    let reply =
        tcp_echo(ca.pod(0), to, b"over the tunnel", Duration::from_secs(5)).expect("tcp echo");
    assert_eq!(reply.payload, b"over the tunnel");
    assert_eq!(
        reply.seen_as.ip(),
        IpAddr::V4(a_pod_from_b),
        "B must see A's pod remapped"
    );
    // UDP, both directions.
    let echo_b = UdpEcho::start(cb.pod(0), b_pod);
    let seen = udp_probe(
        ca.pod(0),
        SocketAddr::new(IpAddr::V4(b_pod_from_a), echo_b.addr.port()),
        Duration::from_secs(2),
    );
    assert_eq!(seen.map(|s| s.ip()), Some(IpAddr::V4(a_pod_from_b)));
    let echo_a = UdpEcho::start(ca.pod(0), a_pod);
    let seen = udp_probe(
        cb.pod(0),
        SocketAddr::new(IpAddr::V4(a_pod_from_b), echo_a.addr.port()),
        Duration::from_secs(2),
    );
    assert_eq!(
        seen.map(|s| s.ip()),
        Some(IpAddr::V4(b_pod_from_a)),
        "and A sees B's pod remapped"
    );

    let (_, m) = http_get(ca.gateway(), "/metrics").expect("metrics");
    assert!(
        metric(&m, "tether_gateway_peer_handshakes_total{peer=\"b\"}").unwrap_or(0.0) >= 1.0,
        "{m}"
    );
    assert!(
        metric(&m, "tether_gateway_peer_rx_packets_total{peer=\"b\"}").unwrap_or(0.0) >= 3.0,
        "{m}"
    );
    assert!(
        metric(&m, "tether_gateway_peer_rtt_seconds{peer=\"b\"}").is_some(),
        "{m}"
    );
}

#[test]
fn client_behind_nat_reaches_the_server_both_ways() {
    if !tether_testkit::require_root_or_skip() {
        return;
    }
    let t = two_clusters(true, true, false);
    let (ca, cb) = (t.topo.cluster("a"), t.topo.cluster("b"));
    assert!(ca.behind_nat());
    let _ga = start_gateway(ca, &t.a);
    let _gb = start_gateway(cb, &t.b);
    wait_healthy(ca.gateway());
    wait_healthy(cb.gateway());
    let echo_b = UdpEcho::start(cb.pod(0), cb.pod_ip(0));
    let to_b = SocketAddr::new(
        IpAddr::V4(translate(cb.pod_ip(0), t.b_in_a)),
        echo_b.addr.port(),
    );
    assert!(
        wait_udp(ca.pod(0), to_b, HANDSHAKE).is_some(),
        "A (behind NAT) cannot reach B"
    );
    // The server learned the client's public (NATed) endpoint and can now initiate traffic.
    let echo_a = UdpEcho::start(ca.pod(0), ca.pod_ip(0));
    let to_a = SocketAddr::new(
        IpAddr::V4(translate(ca.pod_ip(0), t.a_in_b)),
        echo_a.addr.port(),
    );
    assert!(
        udp_probe(cb.pod(0), to_a, Duration::from_secs(2)).is_some(),
        "B cannot reach A"
    );
    let (_, m) = http_get(cb.gateway(), "/metrics").expect("metrics");
    assert!(
        metric(&m, "tether_gateway_peer_session_up{peer=\"a\"}") == Some(1.0),
        "{m}"
    );
}

#[test]
fn one_gateway_serves_two_peers_with_the_same_pod_cidr() {
    if !tether_testkit::require_root_or_skip() {
        return;
    }
    let keys: Vec<PrivateKey> = (0..3).map(|_| PrivateKey::generate()).collect();
    let files: Vec<GatewayFiles> = keys.iter().cloned().map(GatewayFiles::new).collect();
    let entry = |id: &str, k: &PrivateKey, endpoint| PeerEntry {
        id: id.into(),
        public_key: k.public(),
        endpoint,
        pod_cidr: "10.0.0.0/16".into(),
        keepalive: None,
    };
    // A serves B and C; B and C are clients of A. All three use 10.0.0.0/16.
    let write_all = |topo: &Topology| {
        let a_ep = SocketAddr::new(IpAddr::V4(topo.cluster("a").gateway_underlay_ip()), PORT);
        files[0].write(
            topo.cluster("a"),
            &[entry("b", &keys[1], None), entry("c", &keys[2], None)],
        );
        files[1].write(topo.cluster("b"), &[entry("a", &keys[0], Some(a_ep))]);
        files[2].write(topo.cluster("c"), &[entry("a", &keys[0], Some(a_ep))]);
    };
    let probe = Topology::builder()
        .cluster(ClusterSpec::new("a"))
        .cluster(ClusterSpec::new("b"))
        .cluster(ClusterSpec::new("c"))
        .build()
        .expect("probe");
    write_all(&probe);
    let (b_in_a, c_in_a) = (local_view(&files[0], "b"), local_view(&files[0], "c"));
    let a_in_b = local_view(&files[1], "a");
    let a_in_c = local_view(&files[2], "a");
    drop(probe);
    assert_ne!(b_in_a, c_in_a, "A must see B and C under different CIDRs");
    let topo = Topology::builder()
        .cluster(
            ClusterSpec::new("a")
                .route_to_gateway(&b_in_a.to_string())
                .route_to_gateway(&c_in_a.to_string()),
        )
        .cluster(ClusterSpec::new("b").route_to_gateway(&a_in_b.to_string()))
        .cluster(ClusterSpec::new("c").route_to_gateway(&a_in_c.to_string()))
        .build()
        .expect("topology");
    write_all(&topo);
    let (ca, cb, cc) = (topo.cluster("a"), topo.cluster("b"), topo.cluster("c"));
    let _g: Vec<_> = [(ca, &files[0]), (cb, &files[1]), (cc, &files[2])]
        .into_iter()
        .map(|(c, f)| start_gateway(c, f))
        .collect();
    for c in [ca, cb, cc] {
        wait_healthy(c.gateway());
    }
    let sb = TcpEchoServer::start(cb.pod(0), SocketAddr::new(IpAddr::V4(cb.pod_ip(0)), 7000))
        .expect("echo b");
    let sc = TcpEchoServer::start(cc.pod(0), SocketAddr::new(IpAddr::V4(cc.pod_ip(0)), 7000))
        .expect("echo c");
    let to_b = SocketAddr::new(IpAddr::V4(translate(cb.pod_ip(0), b_in_a)), 7000);
    let to_c = SocketAddr::new(IpAddr::V4(translate(cc.pod_ip(0), c_in_a)), 7000);
    assert_eventually!(
        tcp_echo(ca.pod(0), to_b, b"b?", Duration::from_secs(1)).is_ok(),
        HANDSHAKE,
        "A cannot reach B at {to_b}"
    );
    assert_eventually!(
        tcp_echo(ca.pod(0), to_c, b"c?", Duration::from_secs(1)).is_ok(),
        HANDSHAKE,
        "A cannot reach C at {to_c}"
    );
    let rb = tcp_echo(ca.pod(0), to_b, b"to b", Duration::from_secs(2)).expect("b");
    let rc = tcp_echo(ca.pod(0), to_c, b"to c", Duration::from_secs(2)).expect("c");
    assert_eq!(rb.seen_as.ip(), IpAddr::V4(translate(ca.pod_ip(0), a_in_b)));
    assert_eq!(rc.seen_as.ip(), IpAddr::V4(translate(ca.pod_ip(0), a_in_c)));
    // Each reached the right cluster: B's server saw only connections to b, C's only to c.
    assert!(!sb.peers().is_empty() && !sc.peers().is_empty());
    assert_eq!(
        sb.peers().len(),
        2,
        "B got exactly the two connections meant for B"
    );
    assert_eq!(
        sc.peers().len(),
        2,
        "C got exactly the two connections meant for C"
    );
}

#[test]
fn traffic_resumes_within_a_second_after_a_gateway_restart() {
    if !tether_testkit::require_root_or_skip() {
        return;
    }
    let t = two_clusters(false, true, false);
    let (ca, cb) = (t.topo.cluster("a"), t.topo.cluster("b"));
    let mut ga = start_gateway(ca, &t.a);
    let mut gb = start_gateway(cb, &t.b);
    let echo_b = UdpEcho::start(cb.pod(0), cb.pod_ip(0));
    let to_b = SocketAddr::new(
        IpAddr::V4(translate(cb.pod_ip(0), t.b_in_a)),
        echo_b.addr.port(),
    );
    assert!(
        wait_udp(ca.pod(0), to_b, HANDSHAKE).is_some(),
        "no initial connectivity"
    );

    // The server (which does not know the client's endpoint) crashes and comes back; the
    // client still holds the old session.
    gb.signal(Signal::SIGKILL).expect("kill b");
    gb.wait_timeout(Duration::from_secs(5))
        .expect("wait")
        .expect("b exited");
    let restarted = Instant::now();
    let _gb2 = start_gateway(cb, &t.b);
    let server_restart =
        wait_udp(ca.pod(0), to_b, Duration::from_secs(5)).map(|_| restarted.elapsed());
    println!("traffic resumed {server_restart:?} after restarting the server gateway");

    // Now the client restarts (gracefully this time).
    ga.stop().expect("stop a");
    let restarted = Instant::now();
    let _ga2 = start_gateway(ca, &t.a);
    let client_restart =
        wait_udp(ca.pod(0), to_b, Duration::from_secs(5)).map(|_| restarted.elapsed());
    println!("traffic resumed {client_restart:?} after restarting the client gateway");

    let limit = Duration::from_secs(1);
    assert!(
        server_restart.is_some_and(|d| d < limit),
        "server restart: {server_restart:?}"
    );
    assert!(
        client_restart.is_some_and(|d| d < limit),
        "client restart: {client_restart:?}"
    );
}

#[test]
fn wrong_key_gets_nothing_through_and_shows_in_metrics() {
    if !tether_testkit::require_root_or_skip() {
        return;
    }
    let t = two_clusters(false, true, true);
    let (ca, cb) = (t.topo.cluster("a"), t.topo.cluster("b"));
    let _ga = start_gateway(ca, &t.a);
    let _gb = start_gateway(cb, &t.b);
    wait_healthy(ca.gateway());
    wait_healthy(cb.gateway());
    let echo_b = UdpEcho::start(cb.pod(0), cb.pod_ip(0));
    let to_b = SocketAddr::new(
        IpAddr::V4(translate(cb.pod_ip(0), t.b_in_a)),
        echo_b.addr.port(),
    );
    assert!(
        wait_udp(ca.pod(0), to_b, Duration::from_secs(3)).is_none(),
        "a wrong key let traffic through"
    );
    // B rejects A's initiations (MAC1 made with a key that is not B's); A counts each
    // unanswered initiation as a failed handshake once its retry timer (5 s) fires.
    assert_eventually!(
        http_get(cb.gateway(), "/metrics")
            .and_then(|(_, m)| metric(
                &m,
                "tether_gateway_rejected_datagrams_total{reason=\"invalid_mac\"}"
            ))
            .is_some_and(|v| v >= 1.0),
        Duration::from_secs(10),
        "B does not count the rejected handshakes"
    );
    assert_eventually!(
        http_get(ca.gateway(), "/metrics")
            .and_then(|(_, m)| metric(
                &m,
                "tether_gateway_peer_handshake_failures_total{peer=\"b\"}"
            ))
            .is_some_and(|v| v >= 1.0),
        Duration::from_secs(15),
        "A does not count failed handshakes"
    );
    let (_, m) = http_get(ca.gateway(), "/metrics").expect("metrics");
    assert_eq!(
        metric(&m, "tether_gateway_peer_handshakes_total{peer=\"b\"}"),
        Some(0.0),
        "{m}"
    );
    assert_eq!(
        metric(&m, "tether_gateway_peer_session_up{peer=\"b\"}"),
        Some(0.0),
        "{m}"
    );
}

#[test]
fn no_mtu_black_hole_with_default_settings() {
    if !tether_testkit::require_tools_or_skip(&["ping", "ethtool"]) {
        return;
    }
    let t = two_clusters(false, false, false);
    let (ca, cb) = (t.topo.cluster("a"), t.topo.cluster("b"));
    let _ga = start_gateway(ca, &t.a);
    let _gb = start_gateway(cb, &t.b);
    let b_pod = IpAddr::V4(translate(cb.pod_ip(0), t.b_in_a));
    assert_eventually!(
        ca.pod(0).ping(b_pod).unwrap_or(false),
        HANDSHAKE,
        "no connectivity"
    );

    // A DF ping bigger than the tunnel MTU (1420) gets "fragmentation needed" back.
    let out = ca
        .pod(0)
        .exec(&[
            "ping",
            "-n",
            "-c",
            "2",
            "-W",
            "1",
            "-M",
            "do",
            "-s",
            "1450",
            &b_pod.to_string(),
        ])
        .expect("ping");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !out.status.success(),
        "a 1478-byte DF packet cannot fit a 1420 tunnel: {text}"
    );
    assert!(
        text.contains("mtu = 1420") || text.contains("mtu=1420"),
        "expected ICMP fragmentation-needed with mtu 1420, got: {text}"
    );
    // A DF ping that fits goes through.
    assert!(
        ca.pod(0).ping_sized(b_pod, 1392, true).expect("ping"),
        "1420-byte DF ping lost"
    );

    // 50 MB of TCP each way with the pods' default 1500 MTU: MSS clamping and PMTU must work.
    let server = TcpEchoServer::start(cb.pod(0), SocketAddr::new(IpAddr::V4(cb.pod_ip(0)), 0))
        .expect("echo");
    let to = SocketAddr::new(b_pod, server.local_addr().port());
    let payload: Vec<u8> = (0..50 * 1024 * 1024)
        .map(|i: usize| (i % 251) as u8)
        .collect();
    let started = Instant::now();
    let reply = tcp_echo(ca.pod(0), to, &payload, Duration::from_secs(45)).expect("50 MB echo");
    println!("50 MB echoed in {:?}", started.elapsed());
    assert!(
        reply.payload == payload,
        "payload corrupted or truncated ({} bytes)",
        reply.payload.len()
    );
}

#[test]
fn restart_leaves_no_duplicates_and_stop_leaves_nothing() {
    if !tether_testkit::require_root_or_skip() {
        return;
    }
    let t = two_clusters(false, true, false);
    let ca = t.topo.cluster("a");
    let ns = ca.gateway();
    let mut g = start_gateway(ca, &t.a);
    wait_healthy(ns);
    let first = owned_kernel_state(ns);
    assert!(
        first.iter().any(|l| l.starts_with("rule ")),
        "no policy rule: {first:?}"
    );
    assert!(
        first.iter().any(|l| l.starts_with("route ")),
        "no route: {first:?}"
    );
    assert!(
        first.contains(&"nft table ip tether".to_owned()),
        "{first:?}"
    );

    // A crash leaves state behind; the next start must converge to exactly the same set.
    g.signal(Signal::SIGKILL).expect("kill");
    g.wait_timeout(Duration::from_secs(5))
        .expect("wait")
        .expect("exited");
    let mut g = start_gateway(ca, &t.a);
    wait_healthy(ns);
    assert_eventually!(
        owned_kernel_state(ns) == first,
        Duration::from_secs(5),
        "state after crash+restart differs: {:?} vs {first:?}",
        owned_kernel_state(ns)
    );
    // A graceful restart too.
    g.stop().expect("stop");
    let mut g = start_gateway(ca, &t.a);
    wait_healthy(ns);
    assert_eventually!(
        owned_kernel_state(ns) == first,
        Duration::from_secs(5),
        "state after restart differs"
    );
    // Stopping removes everything the gateway owns.
    let status = g.stop().expect("stop");
    assert!(status.success(), "graceful stop must exit 0: {status:?}");
    assert_eq!(owned_kernel_state(ns), Vec::<String>::new());
    assert!(
        ns.ip(&["link", "show", "tth-b"]).is_err(),
        "tunnel device left behind"
    );
}

#[test]
fn bad_config_exits_2_naming_the_field_and_applies_nothing() {
    if !tether_testkit::require_root_or_skip() {
        return;
    }
    let topo = Topology::builder()
        .cluster(ClusterSpec::new("a"))
        .build()
        .expect("topology");
    let ca = topo.cluster("a");
    let files = GatewayFiles::new(PrivateKey::generate());
    let good = PrivateKey::generate().public();
    files.write(
        ca,
        &[
            PeerEntry {
                id: "b".into(),
                public_key: good,
                endpoint: None,
                pod_cidr: "10.0.0.0/16".into(),
                keepalive: None,
            },
            PeerEntry {
                id: "c".into(),
                public_key: good,
                endpoint: None,
                pod_cidr: "10.0.0.0/16".into(),
                keepalive: None,
            },
        ],
    );
    let text = std::fs::read_to_string(&files.path).expect("read");
    // Corrupt the second peer's key.
    let idx = text.rfind(&good.to_string()).expect("key present");
    let bad = format!(
        "{}not-a-key{}",
        &text[..idx],
        &text[idx + good.to_string().len()..]
    );
    std::fs::write(&files.path, bad).expect("write");
    let out = ca
        .gateway()
        .command(env!("CARGO_BIN_EXE_tetherd"))
        .expect("command")
        .args(["gateway", "--config"])
        .arg(&files.path)
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("peers[1].publicKey: not valid base64 (expected 32 bytes"),
        "{stderr}"
    );
    assert_eq!(owned_kernel_state(ca.gateway()), Vec::<String>::new());
}
