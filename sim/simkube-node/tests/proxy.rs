//! The node agent's service proxy and pod routes against a real simkube API server, with echo
//! pods as real processes, real nftables rules and real routes (root; skipped with a printed
//! reason only when not root and CI is unset).
//!
//! Topology: the fixture's node namespace (API server, agent, pods' veths) plus an "underlay"
//! namespace joined to it by a veth (`ul0` 198.18.99.2/24 on the node, `nd0` 198.18.99.1/24 in
//! the underlay), which routes the load-balancer pool to the node, like a cluster's gateway.

use std::io::{BufRead as _, BufReader, ErrorKind, Write as _};
use std::net::{Ipv4Addr, SocketAddr, TcpStream, UdpSocket};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use simkube::controllers::Controllers;
use simkube_node::proxy::{DEFAULT_ROUTE_PROTO, DEFAULT_TABLE, ProxyConfig, ProxyStats};
use tether_testkit::{Netns, TcpEchoServer, patience, require_root_or_skip};

mod support;
use support::{Fixture, fast_backoff};

const NODE_UNDERLAY_IP: &str = "198.18.99.2";
const UNDERLAY_IP: &str = "198.18.99.1";
const LB_IP: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 5);
/// The fixture node's pod CIDR 10.244.7.0/24 starts with the gateway every pod veth holds.
const POD_GATEWAY: &str = "10.244.7.1";

/// Joins the fixture's node namespace to a fresh underlay namespace (removed on drop, which
/// also removes the veth pair).
fn underlay(fixture: &Fixture) -> Netns {
    let underlay = Netns::new("skp-ul").expect("underlay namespace");
    let node = fixture.netns.name();
    fixture
        .netns
        .ip(&[
            "link",
            "add",
            "ul0",
            "type",
            "veth",
            "peer",
            "name",
            "nd0",
            "netns",
            underlay.name(),
        ])
        .expect("veth");
    fixture
        .netns
        .ip(&[
            "addr",
            "add",
            &format!("{NODE_UNDERLAY_IP}/24"),
            "dev",
            "ul0",
        ])
        .expect("node underlay address");
    fixture
        .netns
        .ip(&["link", "set", "ul0", "up"])
        .expect("ul0 up");
    // Like a node of a simulated cluster: everything else goes to the cluster's gateway.
    fixture
        .netns
        .ip(&["route", "add", "default", "via", UNDERLAY_IP])
        .expect("node default route");
    underlay
        .ip(&["addr", "add", &format!("{UNDERLAY_IP}/24"), "dev", "nd0"])
        .expect("underlay address");
    underlay.ip(&["link", "set", "nd0", "up"]).expect("nd0 up");
    underlay
        .ip(&["route", "add", "198.19.0.0/24", "via", NODE_UNDERLAY_IP])
        .expect("load-balancer pool route");
    eprintln!(
        "node namespace {node} joined to underlay {}",
        underlay.name()
    );
    underlay
}

fn proxy_config() -> ProxyConfig {
    let mut config = ProxyConfig::new("10.244.0.0/16".parse().expect("cidr"));
    config.service_cidr = Some("10.96.0.0/12".parse().expect("cidr"));
    config.resync = Duration::from_millis(500);
    config
}

/// Runs `f` on a thread inside the network namespace at `path` (without blocking the caller's
/// runtime, which also runs the API server and the agent).
async fn in_netns<T: Send + 'static>(path: PathBuf, f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(move || {
        std::thread::spawn(move || {
            let file = std::fs::File::open(&path).expect("open namespace");
            nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
            f()
        })
        .join()
        .expect("namespace thread")
    })
    .await
    .expect("blocking task")
}

/// One TCP exchange with an echo server: its answer line, or the error and how long it took.
fn tcp_echo(addr: SocketAddr) -> Result<String, (ErrorKind, Duration)> {
    let started = Instant::now();
    let fail = |e: std::io::Error| (e.kind(), started.elapsed());
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).map_err(fail)?;
    stream
        .set_read_timeout(Some(Duration::from_secs(2)))
        .map_err(fail)?;
    stream.write_all(b"hello\n").map_err(fail)?;
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line).map_err(fail)?;
    if line.is_empty() {
        return Err((ErrorKind::UnexpectedEof, started.elapsed()));
    }
    Ok(line.trim_end().to_owned())
}

/// Sends from `socket` to `addr` every 100 ms (one flow: same socket, same source port) until
/// an answer comes from a pod `accept` likes; returns that answer.
fn udp_until(socket: &UdpSocket, addr: SocketAddr, accept: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + patience(Duration::from_secs(20));
    let mut last = None;
    loop {
        socket.send_to(b"ping", addr).expect("send UDP");
        let mut buf = [0u8; 2048];
        match socket.recv(&mut buf) {
            Ok(n) => {
                let answer = String::from_utf8_lossy(&buf[..n]).into_owned();
                if accept(&answer_parts(&answer).0) {
                    return answer;
                }
                last = Some(answer);
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) => panic!("UDP receive: {e}"),
        }
        assert!(
            Instant::now() < deadline,
            "UDP to {addr}: no acceptable answer; last {last:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn udp_echo(addr: SocketAddr) -> std::io::Result<String> {
    let socket = UdpSocket::bind("0.0.0.0:0")?;
    socket.set_read_timeout(Some(Duration::from_secs(1)))?;
    socket.send_to(b"ping", addr)?;
    let mut buf = [0u8; 2048];
    let n = socket.recv(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
}

/// `pod=NAME peer=ADDR ...` → (NAME, ADDR).
fn answer_parts(line: &str) -> (String, String) {
    let field = |key: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(key))
            .unwrap_or_default()
            .to_owned()
    };
    (field("pod="), field("peer="))
}

/// Connects to `addr` from the namespace at `ns` until the answers came from `want` distinct
/// pods (and `also` holds for one of them); returns every answer seen.
async fn answers_from(
    ns: PathBuf,
    addr: SocketAddr,
    want: usize,
    what: &str,
    also: impl Fn(&str) -> bool + Send + 'static,
) -> Vec<String> {
    let what = what.to_owned();
    in_netns(ns, move || {
        let deadline = Instant::now() + patience(Duration::from_secs(30));
        let mut seen: Vec<String> = Vec::new();
        let mut last_error = None;
        loop {
            match tcp_echo(addr) {
                Ok(line) => seen.push(line),
                Err(e) => last_error = Some(e),
            }
            let mut pods: Vec<String> = seen.iter().map(|l| answer_parts(l).0).collect();
            pods.sort();
            pods.dedup();
            if pods.len() >= want && seen.iter().any(|l| also(l)) {
                return seen;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: {addr} did not answer from {want} pods; answers {seen:?}, last error \
                 {last_error:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    })
    .await
}

/// Connects to `addr` from `ns` until the connection is refused (while the last pods go, an
/// attempt may still reach one, or be lost with it), then three more times; returns the
/// longest of those three refusals.
async fn refused(ns: PathBuf, addr: SocketAddr, what: &str) -> Duration {
    let what = what.to_owned();
    in_netns(ns, move || {
        let deadline = Instant::now() + patience(Duration::from_secs(30));
        loop {
            let outcome = tcp_echo(addr);
            if let Err((ErrorKind::ConnectionRefused, _)) = outcome {
                return (0..3)
                    .map(|_| match tcp_echo(addr) {
                        Err((ErrorKind::ConnectionRefused, took)) => took,
                        other => panic!("{what}: {addr} refused once, then {other:?}"),
                    })
                    .max()
                    .unwrap_or_default();
            }
            assert!(
                Instant::now() < deadline,
                "{what}: {addr} was never refused; last outcome {outcome:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    })
    .await
}

async fn wait_service(api: &Api<Service>, name: &str) -> (Ipv4Addr, u16, Ipv4Addr) {
    let deadline = Instant::now() + patience(Duration::from_secs(20));
    loop {
        let svc = api.get(name).await.expect("get service");
        let spec = svc.spec.clone().unwrap_or_default();
        let cluster_ip = spec.cluster_ip.and_then(|ip| ip.parse().ok());
        let node_port = spec
            .ports
            .unwrap_or_default()
            .first()
            .and_then(|p| p.node_port)
            .and_then(|p| u16::try_from(p).ok());
        let lb = simkube::controllers::loadbalancer::ingress_ips(&svc)
            .first()
            .and_then(|ip| ip.parse().ok());
        if let (Some(c), Some(n), Some(l)) = (cluster_ip, node_port, lb) {
            return (c, n, l);
        }
        assert!(
            Instant::now() < deadline,
            "service {name} got no cluster IP, node port and LB IP: {:?}",
            svc.status
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn echo_deployment(replicas: i32) -> Deployment {
    serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "echo", "namespace": "default"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "echo"}},
            "template": {
                "metadata": {"labels": {"app": "echo"}},
                "spec": {
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{
                        "name": "echo", "image": "simkube.dev/echo",
                        "args": ["--tcp", "7000", "--udp", "7000"],
                        "ports": [{"name": "echo", "containerPort": 7000},
                                  {"name": "echo-udp", "containerPort": 7000, "protocol": "UDP"}],
                        "env": [{"name": "POD_NAME",
                                 "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
                    }]
                }
            }
        }
    }))
    .expect("deployment")
}

fn echo_service() -> Service {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "echo", "namespace": "default"},
        "spec": {
            "type": "LoadBalancer",
            "selector": {"app": "echo"},
            "ports": [
                // Named target ports: the EndpointSlice controller resolves them per pod.
                {"name": "tcp", "port": 80, "targetPort": "echo", "protocol": "TCP"},
                {"name": "udp", "port": 53, "targetPort": "echo-udp", "protocol": "UDP"}
            ]
        }
    }))
    .expect("service")
}

/// A node port the API server is asked for explicitly (the echo Service gets its own first).
const LATE_NODE_PORT: u16 = 32_099;

fn late_service() -> Service {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "late", "namespace": "default"},
        "spec": {
            "type": "NodePort",
            "selector": {"app": "echo"},
            "ports": [{"name": "udp", "port": 53, "targetPort": "echo-udp", "protocol": "UDP",
                       "nodePort": LATE_NODE_PORT}]
        }
    }))
    .expect("service")
}

fn nft_tables(fixture: &Fixture) -> String {
    let out = fixture
        .netns
        .exec(&["nft", "list", "tables", "ip"])
        .expect("nft list tables");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn own_routes(fixture: &Fixture) -> String {
    fixture
        .netns
        .ip(&[
            "-4",
            "route",
            "show",
            "proto",
            &DEFAULT_ROUTE_PROTO.to_string(),
        ])
        .expect("ip route show")
}

#[test]
fn services_reach_ready_endpoints_from_node_pods_and_underlay() {
    if !require_root_or_skip() {
        return;
    }
    let fixture = Fixture::new("skp-svc");
    let underlay = underlay(&fixture);
    let node_ns = fixture.netns.path().to_owned();
    let underlay_ns = underlay.path().to_owned();
    let prefix = fixture.prefix.clone();
    let stats = ProxyStats::default();
    let config = {
        let mut config = proxy_config();
        config.stats = stats.clone();
        config
    };
    let stats_udp = stats.clone();
    // A server outside the cluster, for pod egress.
    let outside = TcpEchoServer::start(&underlay, SocketAddr::from(([198, 18, 99, 1], 0)))
        .expect("underlay echo server");
    let outside_addr = outside.local_addr();
    // A fabric device beside the uplink (as a VXLAN link would be), to a namespace routing the
    // pod CIDR back: traffic leaving through it is not masqueraded.
    let fabric = Netns::new("skp-fab").expect("fabric namespace");
    fixture
        .netns
        .ip(&[
            "link",
            "add",
            "fab0",
            "type",
            "veth",
            "peer",
            "name",
            "fab1",
            "netns",
            fabric.name(),
        ])
        .expect("fabric veth");
    fixture
        .netns
        .ip(&["addr", "add", "198.51.100.2/24", "dev", "fab0"])
        .expect("fab0 address");
    fixture
        .netns
        .ip(&["link", "set", "fab0", "up"])
        .expect("fab0 up");
    fabric
        .ip(&["addr", "add", "198.51.100.1/24", "dev", "fab1"])
        .expect("fab1 address");
    fabric.ip(&["link", "set", "fab1", "up"]).expect("fab1 up");
    fabric
        .ip(&["route", "add", "10.244.0.0/16", "via", "198.51.100.2"])
        .expect("route back to the pods");
    let remote = TcpEchoServer::start(&fabric, SocketAddr::from(([198, 51, 100, 1], 0)))
        .expect("fabric echo server");
    let remote_addr = remote.local_addr();
    fixture.run_with(
        fast_backoff(),
        |builder| {
            builder
                .controllers(Controllers {
                    scheduler: true,
                    workloads: true,
                    endpoint_slices: true,
                    load_balancer: true,
                    ..Controllers::none()
                })
                .load_balancer_pool([LB_IP])
        },
        |agent| agent.proxy = Some(config),
        |client, _node| async move {
            let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");
            let services: Api<Service> = Api::namespaced(client.clone(), "default");
            let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
            deployments
                .create(&PostParams::default(), &echo_deployment(2))
                .await
                .expect("create deployment");
            services
                .create(&PostParams::default(), &echo_service())
                .await
                .expect("create service");
            let (cluster_ip, node_port, lb_ip) = wait_service(&services, "echo").await;
            assert_eq!(lb_ip, LB_IP);

            // From the node namespace: both endpoints answer over several connections.
            let vip = SocketAddr::from((cluster_ip, 80));
            let seen = answers_from(node_ns.clone(), vip, 2, "cluster IP from the node", |_| {
                true
            })
            .await;
            assert!(
                seen.iter()
                    .all(|l| answer_parts(l).1.starts_with(POD_GATEWAY)),
                "the node's own traffic to a cluster IP is masqueraded: {seen:?}"
            );
            eprintln!("cluster IP {vip} from the node: {seen:?}");
            // UDP through the named UDP target port.
            let udp = in_netns(node_ns.clone(), move || {
                let deadline = Instant::now() + patience(Duration::from_secs(10));
                loop {
                    match udp_echo(SocketAddr::from((cluster_ip, 53))) {
                        Ok(answer) => return answer,
                        Err(e) => assert!(Instant::now() < deadline, "no UDP answer: {e}"),
                    }
                }
            })
            .await;
            assert!(
                udp.starts_with("pod=echo-") && udp.ends_with(" ping"),
                "{udp}"
            );

            // From inside a pod: both endpoints, including the pod itself (hairpin).
            let list = pods
                .list(&ListParams::default().labels("app=echo"))
                .await
                .expect("list pods");
            let first = list.items.first().expect("an echo pod");
            let first_name = first.metadata.name.clone().expect("name");
            let first_uid = first.metadata.uid.clone().expect("uid");
            let pod_ns = PathBuf::from(simkube_node::sandbox::NETNS_DIR)
                .join(format!("{prefix}{first_uid}"));
            let me = first_name.clone();
            let seen = answers_from(pod_ns.clone(), vip, 2, "cluster IP from a pod", move |l| {
                answer_parts(l).0 == me
            })
            .await;
            let hairpin = seen
                .iter()
                .find(|l| answer_parts(l).0 == first_name)
                .expect("hairpin answer");
            assert!(
                answer_parts(hairpin).1.starts_with(POD_GATEWAY),
                "a pod reaching itself through its Service sees the node as the peer: {hairpin}"
            );

            // Pod egress out of the cluster CIDR leaves as the node (ip-masq-agent).
            let seen_as = in_netns(pod_ns.clone(), move || {
                let mut stream = TcpStream::connect_timeout(&outside_addr, Duration::from_secs(2))
                    .expect("pod reaches the underlay");
                stream.write_all(b"egress").expect("write");
                stream
                    .shutdown(std::net::Shutdown::Write)
                    .expect("shutdown");
                let mut answer = String::new();
                std::io::Read::read_to_string(&mut stream, &mut answer).expect("read");
                answer
            })
            .await;
            assert!(
                seen_as.starts_with(&format!("{NODE_UNDERLAY_IP}:")),
                "pod egress is masqueraded to the node: {seen_as:?}"
            );
            // Out of another device than the uplink, the pod keeps its address.
            let seen_as = in_netns(pod_ns, move || {
                let mut stream = TcpStream::connect_timeout(&remote_addr, Duration::from_secs(2))
                    .expect("pod reaches the fabric namespace");
                stream.write_all(b"fabric").expect("write");
                stream
                    .shutdown(std::net::Shutdown::Write)
                    .expect("shutdown");
                let mut answer = String::new();
                std::io::Read::read_to_string(&mut stream, &mut answer).expect("read");
                answer
            })
            .await;
            assert!(
                seen_as.starts_with("10.244.7."),
                "traffic leaving through a non-uplink device is not masqueraded: {seen_as:?}"
            );

            // From the underlay: the node port on the node's address and the LB IP.
            let node_addr: Ipv4Addr = NODE_UNDERLAY_IP.parse().expect("ip");
            let via_node_port = SocketAddr::from((node_addr, node_port));
            answers_from(
                underlay_ns.clone(),
                via_node_port,
                2,
                "node port from the underlay",
                |l| answer_parts(l).1.starts_with(POD_GATEWAY),
            )
            .await;
            let via_lb = SocketAddr::from((lb_ip, 80));
            answers_from(
                underlay_ns.clone(),
                via_lb,
                2,
                "LB IP from the underlay",
                |l| answer_parts(l).1.starts_with(POD_GATEWAY),
            )
            .await;

            // externalTrafficPolicy: Local keeps the client's address.
            services
                .patch(
                    "echo",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"externalTrafficPolicy": "Local"}})),
                )
                .await
                .expect("patch policy");
            answers_from(
                underlay_ns.clone(),
                via_lb,
                1,
                "LB IP with policy Local",
                |l| answer_parts(l).1.starts_with(&format!("{UNDERLAY_IP}:")),
            )
            .await;

            // loadBalancerSourceRanges without the underlay: its connections are dropped
            // (a time-out, not a refusal); with it, answered again.
            let ranges = |r: &str| Patch::Merge(json!({"spec": {"loadBalancerSourceRanges": [r]}}));
            services
                .patch("echo", &PatchParams::default(), &ranges("198.18.98.0/24"))
                .await
                .expect("restrict sources");
            in_netns(underlay_ns.clone(), move || {
                let deadline = Instant::now() + patience(Duration::from_secs(20));
                loop {
                    match tcp_echo(via_lb) {
                        Err((ErrorKind::TimedOut | ErrorKind::WouldBlock, _)) => return,
                        other => assert!(
                            Instant::now() < deadline,
                            "a source outside the ranges still got {other:?}"
                        ),
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            })
            .await;
            services
                .patch("echo", &PatchParams::default(), &ranges("198.18.99.0/24"))
                .await
                .expect("allow the underlay");
            answers_from(
                underlay_ns.clone(),
                via_lb,
                1,
                "LB IP inside the ranges",
                |_| true,
            )
            .await;

            // A UDP client that never stops sending (like WireGuard) moves on when its endpoint
            // goes: the stale conntrack entry is removed with the endpoint.
            let via_lb_udp = SocketAddr::from((lb_ip, 53));
            let (socket, first) = in_netns(underlay_ns.clone(), move || {
                let socket = UdpSocket::bind("0.0.0.0:41053").expect("bind UDP client");
                socket
                    .set_read_timeout(Some(Duration::from_millis(200)))
                    .expect("timeout");
                let first = udp_until(&socket, via_lb_udp, |_| true);
                (socket, first)
            })
            .await;
            let gone = answer_parts(&first).0;
            pods.delete(&gone, &DeleteParams::default())
                .await
                .expect("delete the answering pod");
            let other = tokio::task::spawn_blocking(move || {
                udp_until(&socket, via_lb_udp, |name| name != gone)
            })
            .await
            .expect("UDP client");
            eprintln!("UDP flow moved from {first:?} to {other:?}");
            assert!(
                stats_udp.conntrack_cleared() >= 1,
                "no conntrack entry was removed"
            );

            // A UDP client that sent to a node port before any Service had it (its flow set up
            // untranslated) reaches the Service once it exists, without changing its socket.
            let late_addr = SocketAddr::from((node_addr, LATE_NODE_PORT));
            let early = in_netns(underlay_ns.clone(), move || {
                let socket = UdpSocket::bind("0.0.0.0:41099").expect("bind UDP client");
                socket
                    .set_read_timeout(Some(Duration::from_millis(100)))
                    .expect("timeout");
                for _ in 0..5 {
                    socket.send_to(b"early", late_addr).expect("send");
                    let mut buf = [0u8; 512];
                    assert!(socket.recv(&mut buf).is_err(), "nothing answers yet");
                }
                socket
            })
            .await;
            services
                .create(&PostParams::default(), &late_service())
                .await
                .expect("create the late service");
            let answer =
                tokio::task::spawn_blocking(move || udp_until(&early, late_addr, |_| true))
                    .await
                    .expect("UDP client");
            assert!(answer.starts_with("pod=echo-"), "{answer}");

            // No endpoints: refused at once, not a time-out.
            deployments
                .patch(
                    "echo",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"replicas": 0}})),
                )
                .await
                .expect("scale to zero");
            let took = refused(node_ns.clone(), vip, "cluster IP without endpoints").await;
            eprintln!("cluster IP without endpoints refused in {took:?}");
            assert!(took < Duration::from_secs(1), "refusal took {took:?}");
            let took = refused(
                underlay_ns.clone(),
                via_node_port,
                "node port without endpoints",
            )
            .await;
            assert!(took < Duration::from_secs(1), "refusal took {took:?}");
            let took = refused(underlay_ns.clone(), via_lb, "LB IP without endpoints").await;
            assert!(took < Duration::from_secs(1), "refusal took {took:?}");
        },
    );
    assert!(stats.applies() >= 3, "applies: {}", stats.applies());
    assert_eq!(stats.apply_failures(), 0);
    eprintln!(
        "proxy applies {}, failures {}",
        stats.applies(),
        stats.apply_failures()
    );
    let tables = nft_tables(&fixture);
    assert!(
        !tables.contains(DEFAULT_TABLE),
        "the stopped agent removed its table: {tables}"
    );
    drop(outside);
    drop(underlay);
}

#[test]
fn pod_routes_follow_nodes_and_the_table_comes_back() {
    if !require_root_or_skip() {
        return;
    }
    let fixture = Fixture::new("skp-routes");
    let underlay = underlay(&fixture);
    let node_name = fixture.netns.name().to_owned();
    let stats = ProxyStats::default();
    let config = {
        let mut config = proxy_config();
        config.stats = stats.clone();
        config
    };
    let routes_of = move || {
        let out = std::process::Command::new("ip")
            .args(["-n", &node_name, "-4", "route", "show", "proto"])
            .arg(DEFAULT_ROUTE_PROTO.to_string())
            .output()
            .expect("ip route show");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let table_ns = fixture.netns.name().to_owned();
    let has_table = move || {
        let out = std::process::Command::new("ip")
            .args(["netns", "exec", &table_ns, "nft", "list", "tables", "ip"])
            .output()
            .expect("nft list tables");
        String::from_utf8_lossy(&out.stdout).contains(&format!("table ip {DEFAULT_TABLE}"))
    };
    let delete_ns = fixture.netns.name().to_owned();
    let inner_stats = stats.clone();
    fixture.run_with(
        fast_backoff(),
        |builder| builder,
        |agent| agent.proxy = Some(config),
        |client, _node| async move {
            let nodes: Api<Node> = Api::all(client);
            let eventually = |what: &'static str, check: Box<dyn Fn() -> bool>| async move {
                let deadline = Instant::now() + patience(Duration::from_secs(10));
                while !check() {
                    assert!(Instant::now() < deadline, "{what}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            };
            let has = has_table.clone();
            eventually("the proxy table appears", Box::new(has)).await;

            let add_node = |name: &'static str, cidr: &'static str, ip: &'static str| {
                let nodes = nodes.clone();
                async move {
                    let node: Node = serde_json::from_value(json!({
                        "apiVersion": "v1", "kind": "Node",
                        "metadata": {"name": name},
                        "spec": {"podCIDR": cidr, "podCIDRs": [cidr]}
                    }))
                    .expect("node");
                    nodes
                        .create(&PostParams::default(), &node)
                        .await
                        .expect("create node");
                    nodes
                        .patch_status(
                            name,
                            &PatchParams::default(),
                            &Patch::Merge(json!({"status": {"addresses": [
                                {"type": "InternalIP", "address": ip}]}})),
                        )
                        .await
                        .expect("node address");
                }
            };
            add_node("other-a", "10.244.8.0/24", "198.18.99.3").await;
            let routes = routes_of.clone();
            eventually(
                "a route to the second node's pod CIDR",
                Box::new(move || routes().contains("10.244.8.0/24 via 198.18.99.3 dev ul0")),
            )
            .await;

            // Someone deletes the table: the next resync puts it back.
            let status = std::process::Command::new("ip")
                .args([
                    "netns",
                    "exec",
                    &delete_ns,
                    "nft",
                    "delete",
                    "table",
                    "ip",
                    DEFAULT_TABLE,
                ])
                .status()
                .expect("nft delete");
            assert!(status.success());
            let has = has_table.clone();
            eventually("the deleted table comes back", Box::new(has)).await;
            assert!(inner_stats.table_restores() >= 1);

            nodes
                .delete("other-a", &DeleteParams::default())
                .await
                .expect("delete node");
            let routes = routes_of.clone();
            eventually(
                "the route of a deleted node goes",
                Box::new(move || !routes().contains("10.244.8.0/24")),
            )
            .await;
            add_node("other-b", "10.244.9.0/24", "198.18.99.4").await;
            let routes = routes_of.clone();
            eventually(
                "a route to the third node's pod CIDR",
                Box::new(move || routes().contains("10.244.9.0/24 via 198.18.99.4")),
            )
            .await;
            assert!(
                !routes_of().contains("10.244.7.0/24"),
                "the node's own pod CIDR is never routed away"
            );
        },
    );
    assert!(
        stats.route_changes() >= 3,
        "route changes: {}",
        stats.route_changes()
    );
    assert_eq!(stats.route_failures(), 0);
    assert_eq!(
        own_routes(&fixture).trim(),
        "",
        "the stopped agent removed its routes"
    );
    let tables = nft_tables(&fixture);
    assert!(
        !tables.contains(DEFAULT_TABLE),
        "table left behind: {tables}"
    );
    drop(underlay);
}
