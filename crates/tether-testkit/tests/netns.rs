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

#[test]
fn sweep_removes_namespaces_of_a_killed_owner_and_spots_pid_reuse() {
    if !require_root_or_skip() {
        return;
    }
    // The automatic sweep runs once per process, on the first namespace; get it out of the way
    // so it cannot race with the checks below.
    let _first = Netns::new("sweep").unwrap();
    // A real owner that dies without cleaning up: a shell creates a namespace named after its
    // own PID, starts something inside, and is SIGKILLed.
    let mut owner = Command::new("sh")
        .args([
            "-c",
            concat!(
                "ip netns add tt$$-0-killed && (ip netns exec tt$$-0-killed sleep 60 &) ",
                "&& echo tt$$-0-killed && exec sleep 60",
            ),
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut name = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(owner.stdout.take().unwrap()),
        &mut name,
    )
    .unwrap();
    let killed = name.trim().to_owned();
    let pids_inside = || -> Vec<u32> {
        let output = Command::new("ip")
            .args(["netns", "pids", &killed])
            .output()
            .unwrap();
        String::from_utf8_lossy(&output.stdout)
            .split_whitespace()
            .map(|p| p.parse().unwrap())
            .collect()
    };
    // The background `ip netns exec` may not have entered the namespace yet.
    tether_testkit::assert_eventually!(
        pids_inside().len() == 1,
        TIMEOUT,
        "one process should run inside {killed}"
    );
    let inside = pids_inside();
    owner.kill().unwrap();
    owner.wait().unwrap();
    assert!(
        list_namespaces().contains(&killed),
        "the killed owner left its namespace"
    );

    // A live process whose recorded start time differs: its PID was reused, the owner is gone.
    let mut reused = Command::new("sleep").arg("30").spawn().unwrap();
    let reused_ns = format!("tt{}-0-reused", reused.id());
    assert!(
        Command::new("ip")
            .args(["netns", "add", &reused_ns])
            .status()
            .unwrap()
            .success()
    );
    std::fs::write(format!("/run/tether-testkit/{}", reused.id()), "1").unwrap();
    // A live owner with a matching record keeps its namespace.
    let live = Command::new("sleep").arg("30").spawn().unwrap();
    let mut live = tether_testkit::ProcessGuard::new(live, "live owner");
    let live_ns = format!("tt{}-0-live", live.pid());
    assert!(
        Command::new("ip")
            .args(["netns", "add", &live_ns])
            .status()
            .unwrap()
            .success()
    );

    let removed = sweep_stale_namespaces();

    let listed = list_namespaces();
    assert!(!listed.contains(&killed), "{removed:?}");
    assert!(!listed.contains(&reused_ns), "{removed:?}");
    assert!(
        listed.contains(&live_ns),
        "a live owner's namespace was swept: {removed:?}"
    );
    tether_testkit::assert_eventually!(
        !std::path::Path::new(&format!("/proc/{}", inside[0])).exists(),
        TIMEOUT,
        "the process left inside the killed owner's namespace was not stopped"
    );
    reused.kill().unwrap();
    reused.wait().unwrap();
    live.stop().unwrap();
    // Now that its owner is gone, the next sweep takes the last one too.
    sweep_stale_namespaces();
    assert!(!list_namespaces().contains(&live_ns));
}

#[test]
fn children_die_with_the_thread_that_spawned_them() {
    if !require_root_or_skip() {
        return;
    }
    use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
    let ns = Netns::new("pdeath").unwrap();
    // Stands in for a test runner that is killed: the spawning thread ends without dropping
    // the child's guard.
    let pid = std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let mut command = ns.command("sleep").unwrap();
                command.arg("30");
                command.spawn().unwrap().id()
            })
            .join()
            .unwrap()
    });
    let pid = nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap());
    let deadline = std::time::Instant::now() + TIMEOUT;
    let status = loop {
        let now = waitpid(pid, Some(WaitPidFlag::WNOHANG)).unwrap();
        if now != WaitStatus::StillAlive {
            break now;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the child outlived its spawning thread"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(
        status,
        WaitStatus::Signaled(pid, nix::sys::signal::Signal::SIGKILL, false)
    );
}
