//! End-to-end proof of the data-plane model with real packets: one gateway (A) serves two peers
//! (B and C) whose pod CIDR equals A's own (10.0.0.0/16 everywhere, every pod is 10.0.1.2).
//! Each plan is applied with `ip`, `nft` and `/proc/sys` in throwaway network namespaces; veth
//! pairs stand in for the WireGuard tunnels, which carry real addresses in model L exactly like
//! these links do. TCP in both directions must reach the right cluster and see the remapped
//! source, also when two peers' connections have identical tuples; a local address published
//! in the external CIDR must be reachable and must connect out under its external IP; the MSS
//! must be clamped; and a spoofed source from a peer must be dropped.
//!
//! Needs root, `ip` and `nft`; skips with a message otherwise, unless `CI` is set.

mod fixtures;

use std::fs::File;
use std::io::{Read as _, Write as _};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use fixtures::net;
use nix::sched::{CloneFlags, setns};
use nix::sys::socket::{getsockopt, sockopt};
use tether_netplan::{CidrMapping, GatewayInput, IpMapping, LocalNetworks, PeerInput, Plan, plan};

const PORT: u16 = 7070;

/// Serial for temporary veth names, so tests running in parallel never collide.
static NEXT_LINK: AtomicUsize = AtomicUsize::new(0);

fn tools_available(test: &str) -> bool {
    let is_root = nix::unistd::Uid::effective().is_root();
    let has = |tool: &str| Command::new(tool).arg("-V").output().is_ok();
    let missing = [("ip", has("ip")), ("nft", has("nft"))]
        .into_iter()
        .find(|(_, present)| !present)
        .map(|(tool, _)| tool);
    let reason = match (is_root, missing) {
        (true, None) => return true,
        (false, _) => "not running as root".to_owned(),
        (true, Some(tool)) => format!("the {tool} binary is missing"),
    };
    assert!(
        std::env::var_os("CI").is_none(),
        "{test}: {reason}, and CI must run this test"
    );
    eprintln!("skipping {test}: {reason}");
    false
}

fn run(args: &[&str], stdin: Option<&str>) -> String {
    let mut child = Command::new(args[0])
        .args(&args[1..])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|error| panic!("spawning {args:?}: {error}"));
    let mut pipe = child.stdin.take().expect("piped stdin");
    pipe.write_all(stdin.unwrap_or("").as_bytes())
        .expect("writing stdin");
    drop(pipe);
    let out = child.wait_with_output().expect("waiting for child");
    assert!(
        out.status.success(),
        "{args:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        stdin.unwrap_or("")
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A named network namespace, deleted on drop (also when the test panics).
struct Netns {
    name: String,
}

impl Netns {
    fn new(suffix: &str) -> Self {
        let name = format!("np{}-{suffix}", std::process::id());
        run(&["ip", "netns", "add", &name], None);
        let netns = Self { name };
        netns.ip(&["link", "set", "lo", "up"]);
        netns
    }

    fn ip(&self, args: &[&str]) {
        let mut full = vec!["ip", "-n", &self.name];
        full.extend_from_slice(args);
        run(&full, None);
    }

    /// Packets counted by the rule whose comment is `comment` in our prerouting chain.
    fn drop_counter(&self, comment: &str) -> u64 {
        let chain = run(
            &[
                "ip",
                "netns",
                "exec",
                &self.name,
                "nft",
                "list",
                "chain",
                "ip",
                "tether",
                "prerouting",
            ],
            None,
        );
        let line = chain
            .lines()
            .find(|line| line.contains(&format!("comment \"{comment}\"")))
            .unwrap_or_else(|| panic!("no rule {comment:?} in\n{chain}"));
        let after = line
            .split("counter packets ")
            .nth(1)
            .expect("rule has a counter");
        after
            .split(' ')
            .next()
            .and_then(|n| n.parse().ok())
            .expect("packet count")
    }

    /// Runs `work` on a thread inside this namespace.
    fn spawn<T: Send + 'static>(&self, work: impl FnOnce() -> T + Send + 'static) -> JoinHandle<T> {
        let path = format!("/run/netns/{}", self.name);
        std::thread::spawn(move || {
            let file = File::open(&path).unwrap_or_else(|error| panic!("{path}: {error}"));
            setns(&file, CloneFlags::CLONE_NEWNET).expect("setns into test namespace");
            work()
        })
    }

    /// Applies a plan the way the kernel adapter would, using the plan's own `ip` syntax.
    fn apply(&self, plan: &Plan) {
        let sysctls = plan.sysctls.clone();
        self.spawn(move || {
            for sysctl in sysctls {
                let path = format!("/proc/sys/{}", sysctl.key);
                std::fs::write(&path, &sysctl.value).unwrap_or_else(|e| panic!("{path}: {e}"));
            }
        })
        .join()
        .expect("sysctl thread");
        for address in &plan.addresses {
            self.ip_line("addr add", &address.to_string());
        }
        for route in &plan.routes {
            self.ip_line("route add", &route.to_string());
        }
        for rule in &plan.rules {
            self.ip_line("rule add", &rule.to_string());
        }
        run(
            &["ip", "netns", "exec", &self.name, "nft", "-f", "-"],
            Some(&plan.nft.render()),
        );
    }

    fn ip_line(&self, verb: &str, line: &str) {
        let mut args: Vec<&str> = verb.split(' ').collect();
        args.extend(line.split(' '));
        self.ip(&args);
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// Connects a veth pair between two namespaces, addressing each end if asked.
fn link(
    a: &Netns,
    a_name: &str,
    a_addr: Option<&str>,
    b: &Netns,
    b_name: &str,
    b_addr: Option<&str>,
) {
    // Temporary names in the host namespace: unique per process and per link.
    let serial = NEXT_LINK.fetch_add(1, Ordering::Relaxed);
    let tmp_a = format!("np{}l{serial}a", std::process::id());
    let tmp_b = format!("np{}l{serial}b", std::process::id());
    let (tmp_a, tmp_b) = (tmp_a.as_str(), tmp_b.as_str());
    run(
        &[
            "ip", "link", "add", tmp_a, "type", "veth", "peer", "name", tmp_b,
        ],
        None,
    );
    run(
        &["ip", "link", "set", tmp_a, "netns", &a.name, "name", a_name],
        None,
    );
    run(
        &["ip", "link", "set", tmp_b, "netns", &b.name, "name", b_name],
        None,
    );
    for (ns, name, addr) in [(a, a_name, a_addr), (b, b_name, b_addr)] {
        if let Some(addr) = addr {
            ns.ip(&["addr", "add", addr, "dev", name]);
        }
        ns.ip(&["link", "set", name, "up"]);
    }
}

/// A veth pair that behaves like a point-to-point TUN link: no ARP, and both ends share one MAC
/// so the frames a NOARP device addresses to its own MAC are accepted by the other end.
fn tunnel(a: &Netns, a_name: &str, b: &Netns, b_name: &str, index: u8) {
    link(a, a_name, None, b, b_name, None);
    let mac = format!("02:00:00:00:00:{index:02x}");
    for (ns, name) in [(a, a_name), (b, b_name)] {
        ns.ip(&["link", "set", name, "down"]);
        ns.ip(&[
            "link", "set", name, "address", &mac, "arp", "off", "mtu", "1420",
        ]);
        ns.ip(&["link", "set", name, "up"]);
    }
}

/// One cluster: a gateway namespace and a pod at 10.0.1.2 behind it.
struct Cluster {
    gateway: Netns,
    pod: Netns,
}

fn cluster(name: &str) -> Cluster {
    let gateway = Netns::new(&format!("gw{name}"));
    let pod = Netns::new(&format!("pod{name}"));
    link(
        &pod,
        "eth0",
        Some("10.0.1.2/24"),
        &gateway,
        "eth0",
        Some("10.0.1.1/24"),
    );
    pod.ip(&["route", "add", "default", "via", "10.0.1.1"]);
    Cluster { gateway, pod }
}

fn gateway_input(pod_interfaces: &[&str], peers: Vec<(&str, &str, &str, &str)>) -> GatewayInput {
    GatewayInput {
        pod_interfaces: pod_interfaces
            .iter()
            .map(|name| (*name).to_owned())
            .collect(),
        local: LocalNetworks {
            pod_cidrs: vec![net("10.0.0.0/16")],
            external_cidr: None,
        },
        peers: peers
            .into_iter()
            .map(|(id, interface, tunnel, view)| PeerInput {
                id: id.to_owned(),
                interface: interface.to_owned(),
                tunnel_address: Some(net(tunnel)),
                pod: CidrMapping::remapped(net("10.0.0.0/16"), net(view)),
                external: None,
            })
            .collect(),
        ..GatewayInput::default()
    }
}

/// A TCP server that answers every connection with `<name> saw <peer address> mss <mss>`.
struct Server {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    fn start(netns: &Netns, name: &'static str) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = netns.spawn(move || {
            let listener = TcpListener::bind((Ipv4Addr::UNSPECIFIED, PORT)).expect("bind");
            listener
                .set_nonblocking(true)
                .expect("nonblocking listener");
            while !flag.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((mut stream, peer)) => {
                        let mss = getsockopt(&stream, sockopt::TcpMaxSeg).unwrap_or(0);
                        let _ = write!(stream, "{name} saw {} mss {mss}", peer.ip());
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        Self {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Connects from `netns` (optionally from a given source) and returns the server's answer.
fn ask(netns: &Netns, source: Option<SocketAddrV4>, to: &str) -> Result<String, String> {
    read_answer(open(netns, source, to)?)
}

/// Opens a connection from `netns` without reading, so it stays established.
fn open(netns: &Netns, source: Option<SocketAddrV4>, to: &str) -> Result<TcpStream, String> {
    let to: Ipv4Addr = to.parse().expect("address literal");
    netns
        .spawn(move || {
            let target = SocketAddr::V4(SocketAddrV4::new(to, PORT));
            match source {
                None => TcpStream::connect_timeout(&target, Duration::from_secs(2)),
                Some(source) => bound_connect(source, target),
            }
            .map_err(|error| error.to_string())
        })
        .join()
        .expect("client thread")
}

fn read_answer(mut stream: TcpStream) -> Result<String, String> {
    stream
        .set_read_timeout(Some(Duration::from_secs(2)))
        .map_err(|e| e.to_string())?;
    let mut answer = String::new();
    stream
        .read_to_string(&mut answer)
        .map_err(|error| error.to_string())?;
    Ok(answer)
}

/// `connect` from a chosen source address, with a timeout.
fn bound_connect(source: SocketAddrV4, target: SocketAddr) -> std::io::Result<TcpStream> {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, SockaddrIn, bind, socket};
    let fd = socket(
        AddressFamily::Inet,
        SockType::Stream,
        SockFlag::empty(),
        None,
    )?;
    bind(
        std::os::fd::AsRawFd::as_raw_fd(&fd),
        &SockaddrIn::from(source),
    )?;
    let stream = TcpStream::from(fd);
    // std has no connect on an existing socket; a non-blocking connect + poll would be long,
    // so use SO_SNDTIMEO, which bounds a blocking connect on Linux.
    stream.set_write_timeout(Some(Duration::from_secs(1)))?;
    let addr = match target {
        SocketAddr::V4(v4) => SockaddrIn::from(v4),
        SocketAddr::V6(_) => unreachable!("IPv4 only"),
    };
    nix::sys::socket::connect(std::os::fd::AsRawFd::as_raw_fd(&stream), &addr)?;
    Ok(stream)
}

#[test]
fn two_peers_with_our_own_pod_cidr_are_told_apart_in_both_directions() {
    if tools_available("two_peers_with_our_own_pod_cidr_are_told_apart_in_both_directions") {
        two_peers_scenario("i", &["eth0"]);
    }
}

#[test]
fn without_pod_interfaces_every_non_tunnel_interface_counts_as_local() {
    if tools_available("without_pod_interfaces_every_non_tunnel_interface_counts_as_local") {
        two_peers_scenario("n", &[]);
    }
}

/// Three clusters; `variant` keeps namespace names apart between tests running in parallel.
fn two_peers_scenario(variant: &str, pod_interfaces: &[&str]) {
    let a = cluster(&format!("{variant}a"));
    let b = cluster(&format!("{variant}b"));
    let c = cluster(&format!("{variant}c"));
    tunnel(&a.gateway, "tether-b", &b.gateway, "tun-a", 1);
    tunnel(&a.gateway, "tether-c", &c.gateway, "tun-a", 2);

    // A sees B as 10.71/16 and C as 10.72/16; B sees A as 10.81/16; C sees A as 10.91/16.
    // A also publishes a non-pod address of its pod host, 192.168.50.2, as 10.70.0.5 in its
    // external CIDR 10.70/16, which B sees as 10.80/16.
    let mut input_a = gateway_input(
        pod_interfaces,
        vec![
            ("cluster-b", "tether-b", "169.254.18.1/30", "10.71.0.0/16"),
            ("cluster-c", "tether-c", "169.254.18.5/30", "10.72.0.0/16"),
        ],
    );
    input_a.local.external_cidr = Some(net("10.70.0.0/16"));
    input_a.ip_mappings = vec![IpMapping {
        external: Ipv4Addr::new(10, 70, 0, 5),
        real: Ipv4Addr::new(192, 168, 50, 2),
    }];
    let plan_a = plan(&input_a).expect("plan A");
    let mut input_b = gateway_input(
        pod_interfaces,
        vec![("cluster-a", "tun-a", "169.254.18.2/30", "10.81.0.0/16")],
    );
    input_b.peers[0].external = Some(CidrMapping::remapped(
        net("10.70.0.0/16"),
        net("10.80.0.0/16"),
    ));
    let plan_b = plan(&input_b).expect("plan B");
    let plan_c = plan(&gateway_input(
        pod_interfaces,
        vec![("cluster-a", "tun-a", "169.254.18.6/30", "10.91.0.0/16")],
    ))
    .expect("plan C");
    a.pod.ip(&["addr", "add", "192.168.50.2/32", "dev", "eth0"]);
    a.gateway
        .ip(&["route", "add", "192.168.50.2/32", "dev", "eth0"]);
    a.gateway.apply(&plan_a);
    b.gateway.apply(&plan_b);
    c.gateway.apply(&plan_c);

    let _servers = [
        Server::start(&a.pod, "pod-a"),
        Server::start(&b.pod, "pod-b"),
        Server::start(&c.pod, "pod-c"),
    ];
    std::thread::sleep(Duration::from_millis(100));

    // A → B and A → C: the same real destination 10.0.1.2, told apart by the local view.
    // MSS: 1420 − 40 = 1380 is the clamp; the kernel reports it minus TCP options in use.
    let answers = [
        ask(&a.pod, None, "10.71.1.2"),
        ask(&a.pod, None, "10.72.1.2"),
        // Peer-initiated: the reply from A's pod must go back to the peer that asked.
        ask(&b.pod, None, "10.81.1.2"),
        ask(&c.pod, None, "10.91.1.2"),
    ];
    let text: Vec<String> = answers
        .iter()
        .map(|answer| {
            answer
                .clone()
                .unwrap_or_else(|error| format!("error: {error}"))
        })
        .collect();
    for answer in &text {
        let mss: u32 = answer
            .rsplit(' ')
            .next()
            .and_then(|m| m.parse().ok())
            .unwrap_or(0);
        assert!((1..=1380).contains(&mss), "MSS not clamped in {answer:?}");
    }
    let without_mss: Vec<&str> = text
        .iter()
        .map(|answer| answer.rsplit_once(" mss").map_or(answer.as_str(), |s| s.0))
        .collect();
    assert_eq!(
        without_mss,
        [
            "pod-b saw 10.81.1.2",
            "pod-c saw 10.91.1.2",
            "pod-a saw 10.71.1.2",
            "pod-a saw 10.72.1.2",
        ]
    );

    let strip = |answer: Result<String, String>| {
        answer.map(|text| {
            text.rsplit_once(" mss")
                .map_or(text.clone(), |s| s.0.to_owned())
        })
    };

    // The published address, both ways: B reaches it through A's external CIDR (masqueraded
    // to A's gateway, 10.0.1.1 here, since the real target may be outside the pod network and
    // B's pod address is also one of A's), and what it opens towards B leaves under its
    // external IP.
    assert_eq!(
        strip(ask(&b.pod, None, "10.80.0.5")),
        Ok("pod-a saw 10.0.1.1".to_owned())
    );
    let published = Some(SocketAddrV4::new(Ipv4Addr::new(192, 168, 50, 2), 0));
    assert_eq!(
        strip(ask(&a.pod, published, "10.71.1.2")),
        Ok("pod-b saw 10.80.0.5".to_owned())
    );

    // B's and C's pods connect from the same address and port to the same pod of A: identical
    // conntrack tuples, which only the per-peer conntrack zones keep apart.
    let same_source = Some(SocketAddrV4::new(Ipv4Addr::new(10, 0, 1, 2), 40000));
    // B's connection stays open (unread) while C connects.
    let open_from_b = open(&b.pod, same_source, "10.81.1.2");
    let from_c = ask(&c.pod, same_source, "10.91.1.2");
    let from_b = open_from_b.and_then(read_answer);
    assert_eq!(strip(from_b), Ok("pod-a saw 10.71.1.2".to_owned()));
    assert_eq!(strip(from_c), Ok("pod-a saw 10.72.1.2".to_owned()));

    // Path MTU discovery for non-TCP traffic: a 1500-byte datagram with DF towards B does not
    // fit the 1420-byte tunnel; A's gateway answers "fragmentation needed", and that ICMP
    // error must reach the pod translated back to the address it used (10.71.1.2), or the pod
    // never learns the path MTU.
    a.pod
        .spawn(|| {
            let socket = std::net::UdpSocket::bind("0.0.0.0:0").expect("udp bind");
            socket.connect("10.71.1.2:9").expect("udp connect");
            let _ = socket.send(&[0u8; 1472]);
        })
        .join()
        .expect("udp thread");
    std::thread::sleep(Duration::from_millis(200));
    let route = run(
        &["ip", "-n", &a.pod.name, "route", "get", "10.71.1.2"],
        None,
    );
    assert!(
        route.contains("mtu 1420"),
        "pod A did not learn the path MTU:\n{route}"
    );

    // B's pod spoofs a source outside B's pod CIDR: A's gateway must drop it.
    // (B's gateway gets a route back to the spoofed source so its own loose reverse-path check
    // lets the packet through to the tunnel; what is under test is A's guard.)
    b.pod.ip(&["addr", "add", "10.9.9.9/32", "dev", "eth0"]);
    b.gateway
        .ip(&["route", "add", "10.9.9.9/32", "dev", "eth0"]);
    let guard = "peer cluster-b: source outside its CIDRs";
    assert_eq!(
        a.gateway.drop_counter(guard),
        0,
        "legitimate traffic hit the guard"
    );
    let spoofed = ask(
        &b.pod,
        Some(SocketAddrV4::new(Ipv4Addr::new(10, 9, 9, 9), 0)),
        "10.81.1.2",
    );
    assert!(spoofed.is_err(), "spoofed source got through: {spoofed:?}");
    assert!(
        a.gateway.drop_counter(guard) > 0,
        "the guard did not drop the spoofed packets"
    );
}
