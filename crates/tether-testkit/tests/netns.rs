//! Tests of the testkit itself, in real network namespaces (root required): topologies build and
//! route, the NAT router masquerades, and nothing leaks, not even after a panic or a killed run.

use std::net::{IpAddr, SocketAddr};
use std::os::unix::fs::MetadataExt;
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

use tether_testkit::{
    ClusterSpec, Netns, TcpEchoServer, Topology, UdpEchoServer, list_namespaces,
    require_root_or_skip, require_tools_or_skip, sweep_stale_namespaces, tcp_echo, udp_echo,
};

const TIMEOUT: Duration = Duration::from_secs(5);

fn two_clusters() -> Topology {
    Topology::builder()
        .cluster(ClusterSpec::new("a").pod_cidr("10.0.0.0/16").pods(2))
        .cluster(
            ClusterSpec::new("b")
                .pod_cidr("10.0.0.0/16")
                .pods(1)
                .behind_nat(),
        )
        .build()
        .expect("topology builds")
}

#[test]
fn two_cluster_topology_routes_pods_to_their_gateway() {
    if !require_tools_or_skip(&["ping"]) {
        return;
    }
    let topo = two_clusters();
    let (a, b) = (topo.cluster("a"), topo.cluster("b"));
    // Overlapping pod CIDRs: the same pod address exists in both clusters.
    assert_eq!(a.pod_ip(0), b.pod_ip(0));
    assert_eq!(a.pod_ip(0).to_string(), "10.0.1.2");
    assert_eq!(a.pod_ip(1).to_string(), "10.0.1.3");
    for cluster in [a, b] {
        for (i, pod) in cluster.pods().iter().enumerate() {
            let gw = IpAddr::V4(cluster.gateway_transit_ip());
            assert!(
                pod.ping(gw).unwrap(),
                "{} pod {i} cannot ping its gateway",
                cluster.name()
            );
        }
        // The gateway routes the pod CIDR back through the node.
        let pod = IpAddr::V4(cluster.pod_ip(0));
        assert!(
            cluster.gateway().ping(pod).unwrap(),
            "gateway of {} cannot reach pod",
            cluster.name()
        );
        assert_eq!(
            cluster.gateway().sysctl("net.ipv4.ip_forward").unwrap(),
            "1"
        );
    }
    // Pods of one cluster reach each other over the node bridge.
    assert!(a.pod(0).ping(IpAddr::V4(a.pod_ip(1))).unwrap());
    // Gateways reach each other over the underlay; the NATed one only outbound.
    assert!(
        b.gateway()
            .ping(IpAddr::V4(a.gateway_underlay_ip()))
            .unwrap()
    );
    assert!(
        a.gateway().ping(IpAddr::V4(b.public_ip())).unwrap(),
        "router answers on its own"
    );
    assert!(
        !a.gateway()
            .ping(IpAddr::V4(b.gateway_underlay_ip()))
            .unwrap(),
        "private side hidden"
    );
    // Nothing routes off the machine: no default route outside the pods.
    for ns in [
        a.gateway(),
        a.node(),
        b.gateway(),
        b.node(),
        topo.underlay(),
    ] {
        let routes = ns.ip(&["route", "show", "default"]).unwrap();
        assert!(
            routes.trim().is_empty(),
            "{} has a default route: {routes}",
            ns.name()
        );
    }
}

#[test]
fn nat_router_masquerades_the_gateway() {
    if !require_root_or_skip() {
        return;
    }
    let topo = two_clusters();
    let server = TcpEchoServer::start(
        topo.underlay(),
        SocketAddr::new(IpAddr::V4(topo.underlay_ip()), 0),
    )
    .unwrap();
    let (a, b) = (topo.cluster("a"), topo.cluster("b"));

    let direct = tcp_echo(a.gateway(), server.local_addr(), b"hello", TIMEOUT).unwrap();
    assert_eq!(direct.seen_as.ip(), IpAddr::V4(a.gateway_underlay_ip()));
    assert_eq!(direct.payload, b"hello");

    let natted = tcp_echo(
        b.gateway(),
        server.local_addr(),
        b"from behind nat",
        TIMEOUT,
    )
    .unwrap();
    assert_eq!(
        natted.local.ip(),
        IpAddr::V4(b.gateway_underlay_ip()),
        "client's own view"
    );
    assert_eq!(
        natted.seen_as.ip(),
        IpAddr::V4(b.public_ip()),
        "server sees the router"
    );
    assert_ne!(b.public_ip(), b.gateway_underlay_ip());
    assert_eq!(natted.payload, b"from behind nat");
    assert_eq!(server.peers().len(), 2);

    // UDP is masqueraded too (the WireGuard case), and the reply finds its way back.
    let udp = UdpEchoServer::start(
        topo.underlay(),
        SocketAddr::new(IpAddr::V4(topo.underlay_ip()), 0),
    )
    .unwrap();
    let reply = udp_echo(b.gateway(), udp.local_addr(), b"datagram", TIMEOUT).unwrap();
    assert_eq!(reply.seen_as.ip(), IpAddr::V4(b.public_ip()));
    assert_eq!(reply.payload, b"datagram");
}

#[test]
fn namespaces_are_removed_on_drop() {
    if !require_root_or_skip() {
        return;
    }
    let topo = two_clusters();
    let names = topo.namespace_names();
    // underlay + (gw, node, 2 pods) + (gw, node, router, 1 pod)
    assert_eq!(names.len(), 9, "{names:?}");
    let listed = list_namespaces();
    assert!(
        names.iter().all(|n| listed.contains(n)),
        "{names:?} not all in {listed:?}"
    );
    drop(topo);
    let listed = list_namespaces();
    assert!(
        names.iter().all(|n| !listed.contains(n)),
        "leaked: {listed:?}"
    );
}

#[test]
fn namespaces_are_removed_after_a_panic() {
    if !require_root_or_skip() {
        return;
    }
    let names = Mutex::new(Vec::new());
    let result = std::panic::catch_unwind(|| {
        let topo = two_clusters();
        names.lock().unwrap().extend(topo.namespace_names());
        panic!("the test failed half-way");
    });
    assert!(result.is_err());
    let names = names.into_inner().unwrap();
    assert!(!names.is_empty());
    let listed = list_namespaces();
    assert!(
        names.iter().all(|n| !listed.contains(n)),
        "leaked after panic: {listed:?}"
    );
}

#[test]
fn run_exec_and_spawn_happen_inside_the_namespace() {
    if !require_root_or_skip() {
        return;
    }
    let ns = Netns::new("probe").unwrap();
    let ns_inode = std::fs::metadata(ns.path()).unwrap().ino();

    // A thread entered with `run` sees the namespace's sysctls and links, not the host's.
    assert_eq!(
        ns.sysctl("net.ipv4.ip_forward").unwrap(),
        "0",
        "new namespaces do not forward"
    );
    ns.set_sysctl("net.ipv4.ip_forward", "1").unwrap();
    let seen_by_process = ns
        .exec_ok(&["cat", "/proc/sys/net/ipv4/ip_forward"])
        .unwrap();
    assert_eq!(
        seen_by_process.trim(),
        "1",
        "the write landed in the namespace"
    );
    let thread_ns = ns.run(|| std::fs::metadata("/proc/thread-self/ns/net").unwrap().ino());
    assert_eq!(thread_ns, ns_inode);

    // exec and spawn run their processes inside it.
    let links = ns.exec_ok(&["ip", "-o", "link", "show"]).unwrap();
    assert_eq!(links.lines().count(), 1, "only lo: {links}");
    let mut command = Command::new("sleep");
    command.arg("30");
    let guard = ns.spawn(command).unwrap();
    let pid = guard.pid();
    let child_ns = std::fs::metadata(format!("/proc/{pid}/ns/net"))
        .unwrap()
        .ino();
    assert_eq!(child_ns, ns_inode);
    drop(guard);
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "stopped and reaped"
    );

    // Errors name the command and the namespace.
    let error = ns
        .exec_ok(&["ip", "link", "set", "nosuchlink", "up"])
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("nosuchlink") && error.contains(ns.name()),
        "{error}"
    );
}

#[test]
fn sweep_removes_namespaces_of_a_killed_run() {
    if !require_root_or_skip() {
        return;
    }
    // A PID above pid_max can never be alive: this namespace looks like a killed run's leftover.
    let pid_max: u64 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let stale = format!("tt{}-0-stale", pid_max + 1);
    let status = Command::new("ip")
        .args(["netns", "add", &stale])
        .status()
        .unwrap();
    assert!(status.success());
    // Something the killed run left running inside keeps the namespace alive: it must be killed.
    let mut leftover = Command::new("ip")
        .args(["netns", "exec", &stale, "sleep", "30"])
        .spawn()
        .unwrap();
    tether_testkit::assert_eventually!(
        std::fs::read_link(format!("/proc/{}/exe", leftover.id()))
            .is_ok_and(|exe| exe.ends_with("sleep")),
        TIMEOUT,
        "leftover process did not start"
    );

    sweep_stale_namespaces();

    assert!(
        !list_namespaces().contains(&stale),
        "stale namespace survived the sweep"
    );
    let status = leftover.wait().unwrap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9)
    );
    // Our own namespaces are never swept.
    let mine = Netns::new("alive").unwrap();
    sweep_stale_namespaces();
    assert!(list_namespaces().contains(&mine.name().to_owned()));
}

#[test]
fn underlay_offloads_can_be_turned_off() {
    if !require_tools_or_skip(&["ethtool"]) {
        return;
    }
    let topo = Topology::builder()
        .cluster(ClusterSpec::new("a").pods(0))
        .cluster(ClusterSpec::new("b").pods(0).behind_nat())
        .underlay_offloads(false)
        .underlay_mtu(1400)
        .build()
        .unwrap();
    let a = topo.cluster("a");
    let features = a
        .gateway()
        .exec_ok(&["ethtool", "-k", a.underlay_interface()])
        .unwrap();
    assert!(
        features.contains("generic-segmentation-offload: off"),
        "{features}"
    );
    assert!(
        features.contains("tcp-segmentation-offload: off"),
        "{features}"
    );
    let link = a
        .gateway()
        .ip(&["link", "show", a.underlay_interface()])
        .unwrap();
    assert!(link.contains("mtu 1400"), "{link}");
    let router = topo.cluster("b").nat_router().unwrap();
    let features = router.exec_ok(&["ethtool", "-k", "ul0"]).unwrap();
    assert!(
        features.contains("generic-segmentation-offload: off"),
        "{features}"
    );
}
