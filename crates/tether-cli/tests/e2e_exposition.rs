//! Issue #11's ExternalIPRemapping, NodePortExposition and LoadBalancerExposition end to end,
//! on one pair of simulated clusters (consumer `alpha` with two nodes, provider `beta`, namespace
//! `expo` offloaded with the Remote strategy): an IP object for a server on a consumer node's
//! address gets a host of the external CIDR, the gateway publishes it without a new pod or a
//! rebuilt tunnel, and an offloaded pod reaches the server at that host of the provider's view
//! of the consumer's external CIDR; an IP for a pod address is refused with what to do; a
//! NodePort and a LoadBalancer Service of the consumer whose only endpoints are offloaded pods
//! answer from the underlay at every consumer node's address and at the pool address. Needs
//! root (the clusters' pods are processes in network namespaces); in CI it must run.

mod e2e;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use e2e::net::{nodes, remapped, talk_in};
use e2e::{Env, Sim, sibling};

const CONSUMER: &str = "alpha";
const PROVIDER: &str = "beta";
const NS: &str = "expo";
/// The port of the server outside the pods (not the echo pods' 7000, which nodes do not use).
const OUTSIDE_PORT: u16 = 17000;

/// A process the test started, killed by its PID when dropped (also on a failed assertion).
struct Started(Child);

impl Drop for Started {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn pods_of(sim: &Sim, ns: &str, app: &str) -> Vec<String> {
    sim.names(&["pods", "-n", ns, "-l", &format!("app={app}")])
        .into_iter()
        .map(|p| p.trim_start_matches("pod/").to_owned())
        .collect()
}

fn ready(sim: &Sim, what: &[&str]) -> String {
    sim.jsonpath(what, "{.status.conditions[?(@.type==\"Ready\")].status}")
}

/// The gateway pod of `sim`'s peering with `remote`: name, UID and restart count.
fn gateway_pod(sim: &Sim, remote: &str) -> (String, String, String) {
    let ns = format!("tether-tenant-{remote}");
    let get = |path: &str| {
        sim.jsonpath(
            &["pods", "-n", &ns, "-l", "tether.dev/component=gateway"],
            path,
        )
    };
    (
        get("{.items[0].metadata.name}"),
        get("{.items[0].metadata.uid}"),
        get("{.items[0].status.containerStatuses[0].restartCount}"),
    )
}

/// One line sent to `ip:port` from the underlay (outside both clusters), and the echo's answer.
fn from_underlay(env: &Env, ip: &str, port: &str) -> Option<String> {
    let script =
        format!("exec 3<>/dev/tcp/{ip}/{port} && echo from-underlay >&3 && timeout 5 head -n1 <&3");
    let out = Command::new("timeout")
        .args(["10", "ip", "netns", "exec", env.underlay(), "bash", "-c"])
        .arg(&script)
        .output()
        .expect("ip netns exec runs");
    let line = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    (out.status.success() && line.contains("pod=")).then_some(line)
}

/// Waits until `ip:port` answers from the underlay; returns the pod that answered and the
/// source address it saw.
fn answered_from_underlay(
    env: &Env,
    sim: &Sim,
    what: &str,
    ip: &str,
    port: &str,
) -> (String, std::net::Ipv4Addr) {
    let mut line = String::new();
    sim.wait(what, Duration::from_secs(45), || {
        line = from_underlay(env, ip, port).unwrap_or_default();
        !line.is_empty()
    });
    println!("{what}: {line}");
    let field = |name: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name} in {line:?}"))
            .to_owned()
    };
    let peer = field("peer=");
    let peer = peer.rsplit_once(':').map_or(peer.as_str(), |(ip, _)| ip);
    (field("pod="), peer.parse().expect("the peer's address"))
}

fn service(name: &str, type_: &str) -> String {
    format!(
        "apiVersion: v1
kind: Service
metadata:
  name: {name}
  namespace: {NS}
spec:
  type: {type_}
  selector: {{app: echo}}
  ports:
  - {{name: echo, port: 7000, targetPort: 7000, protocol: TCP}}
"
    )
}

fn ip_object(name: &str, ip: &str) -> String {
    format!(
        "apiVersion: networking.tether.dev/v1alpha1
kind: IP
metadata:
  name: {name}
  namespace: {NS}
spec:
  ip: {ip}
"
    )
}

#[test]
fn external_addresses_node_ports_and_load_balancers_reach_across_the_peering() {
    let Some(mut env) = Env::new("expo") else {
        return;
    };
    let a = env.up_nodes("a", 2, &[]);
    let b = env.up_nodes("b", 1, &[]);
    a.install(CONSUMER, &[]);
    b.install(PROVIDER, &[]);
    let kc = std::path::Path::new(a.kubeconfig());
    a.peer_and_offload_remote(&b, NS);
    a.apply_as(
        kc,
        &format!(
            "apiVersion: apps/v1
kind: Deployment
metadata:
  name: echo
  namespace: {NS}
spec:
  replicas: 1
  selector:
    matchLabels: {{app: echo}}
  template:
    metadata:
      labels: {{app: echo}}
    spec:
      containers:
      - name: echo
        image: simkube.dev/echo
        resources:
          requests: {{cpu: 100m, memory: 32Mi}}
"
        ),
    )
    .ok();
    let running = || {
        let pods = pods_of(&a, NS, "echo");
        pods.len() == 1 && a.jsonpath(&["pod", "-n", NS, &pods[0]], "{.status.phase}") == "Running"
    };
    let deadline = std::time::Instant::now() + tether_testkit::patience(Duration::from_secs(90));
    while !running() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(
        running(),
        "the offloaded echo pod is not Running:\n{}\n{}\n{}",
        a.kubectl(&["get", "pods", "-A", "-o", "wide"]).stdout,
        a.kubectl(&["get", "pods", "-n", NS, "-o", "yaml"]).stdout,
        b.kubectl(&["get", "pods,shadowpods", "-A", "-o", "wide"])
            .stdout
    );
    let echo = pods_of(&a, NS, "echo").remove(0);
    assert_eq!(
        a.jsonpath(&["pod", "-n", NS, &echo], "{.spec.nodeName}"),
        PROVIDER,
        "the echo pod is offloaded"
    );

    // a) ExternalIPRemapping. The server is a process in the namespace of the consumer node
    // that does not run the gateway, listening on the node's address: not a pod, and reached
    // from the gateway over the underlay.
    let (gw_name, gw_uid, gw_restarts) = gateway_pod(&a, PROVIDER);
    let tenant = format!("tether-tenant-{PROVIDER}");
    let gateway_log = |needle: &str| {
        a.kubectl(&["logs", "-n", &tenant, &gw_name])
            .stdout
            .matches(needle)
            .count()
    };
    let rebuilds = gateway_log("rebuilding the tunnel");
    let in_place = gateway_log("updating the running tunnel in place");
    let gw_node = a.jsonpath(&["pod", "-n", &tenant, &gw_name], "{.spec.nodeName}");
    let real_nodes: Vec<String> = nodes(&a).into_iter().filter(|n| n != PROVIDER).collect();
    assert_eq!(real_nodes.len(), 2, "{real_nodes:?}");
    let outside_node = real_nodes
        .iter()
        .find(|n| **n != gw_node)
        .expect("a node without the gateway")
        .clone();
    let outside_ip = a.jsonpath(
        &["node", &outside_node],
        "{.status.addresses[?(@.type==\"InternalIP\")].address}",
    );
    let index = outside_node.rsplit('-').next().expect("node index");
    let _server = Started(
        Command::new("ip")
            .args(["netns", "exec", &format!("sk.{}.n{index}", a.name)])
            .arg(sibling("simkube"))
            .args(["__builtin", "echo", "--tcp", &OUTSIDE_PORT.to_string()])
            .args(["--udp", &OUTSIDE_PORT.to_string(), "--http", "17001"])
            .env("POD_NAME", "outside")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("the outside server starts"),
    );
    a.apply_as(kc, &ip_object("outside", &outside_ip)).ok();
    let ip_path = ["ips.networking.tether.dev", "-n", NS, "outside"];
    a.wait("the IP published", Duration::from_secs(30), || {
        ready(&a, &ip_path) == "True"
    });
    let external = a.jsonpath(&ip_path, "{.status.ip}");
    let external_cidr = a.jsonpath(&ip_path, "{.status.cidr}");
    let external_addr: std::net::Ipv4Addr = external.parse().expect("status.ip");
    let cidr: ipnet::Ipv4Net = external_cidr.parse().expect("status.cidr");
    let host = u32::from(external_addr) - u32::from(cidr.network());
    assert!(
        cidr.contains(&external_addr) && host >= 3,
        "{external} in {external_cidr}: hosts 1 and 2 are the control plane's"
    );
    // Every peering's Configuration lists it, and the gateway took it in place.
    let conf = ["configurations.networking.tether.dev", "-n"];
    a.wait(
        "the Configuration lists the published address",
        Duration::from_secs(30),
        || {
            a.jsonpath(
                &[conf[0], conf[1], &tenant, PROVIDER],
                "{.status.published[*].external}",
            ) == external
        },
    );
    // The provider's view of the consumer's external CIDR, with the same host.
    let view = b.jsonpath(
        &[
            conf[0],
            conf[1],
            &format!("tether-tenant-{CONSUMER}"),
            CONSUMER,
        ],
        "{.status.remote.cidr.external[0]}",
    );
    assert!(
        !view.is_empty(),
        "beta has no view of alpha's external CIDR"
    );
    let target = remapped(&view, external_addr);
    let answers = talk_in(
        &a,
        NS,
        "to-outside",
        None,
        "tcp",
        &format!("{target}:{OUTSIDE_PORT}"),
    );
    assert_eq!(answers.len(), 3, "the outside server answered: {answers:?}");
    let gw_ip = a.jsonpath(&["pod", "-n", &tenant, &gw_name], "{.status.podIP}");
    // The gateway masquerades what it publishes; its node masquerades pod egress in turn.
    let gw_node_ip = a.jsonpath(
        &["node", &gw_node],
        "{.status.addresses[?(@.type==\"InternalIP\")].address}",
    );
    for line in &answers {
        let from_gateway = [&gw_ip, &gw_node_ip]
            .iter()
            .any(|ip| line.contains(&format!("peer={ip}:")));
        assert!(
            line.contains("pod=outside") && from_gateway,
            "answered by the outside server, reached from alpha's gateway ({gw_ip} on \
             {gw_node_ip}): {line}"
        );
    }
    assert_eq!(
        gateway_pod(&a, PROVIDER),
        (gw_name.clone(), gw_uid, gw_restarts),
        "publishing restarted no gateway pod"
    );
    assert!(
        gateway_log("updating the running tunnel in place") > in_place
            && gateway_log("rebuilding the tunnel") == rebuilds,
        "the gateway applied the address without rebuilding the tunnel"
    );

    // Bad input: a pod address is refused with what to do, and takes no host.
    a.apply_as(kc, &ip_object("a-pod", "10.244.1.9")).ok();
    let bad = ["ips.networking.tether.dev", "-n", NS, "a-pod"];
    a.wait("the pod address refused", Duration::from_secs(30), || {
        ready(&a, &bad) == "False"
    });
    assert_eq!(
        a.jsonpath(&bad, "{.status.conditions[0].reason}"),
        "InsidePodCIDR"
    );
    let message = a.jsonpath(&bad, "{.status.conditions[0].message}");
    assert!(
        message.contains("10.244.1.9") && message.contains("delete this IP"),
        "{message}"
    );
    assert_eq!(a.jsonpath(&bad, "{.status.ip}"), "");

    // b) NodePort: only the offloaded pod serves it, from every consumer node's address. The
    // node masquerades the connection to its own address; alpha's gateway sends it on from
    // the node's published address, or from the unknown-source address (host 0 of the
    // external CIDR) for a node that has none, and the pod sees either in beta's view.
    a.apply_as(kc, &service("echo-np", "NodePort")).ok();
    let node_port = a.jsonpath(
        &["service", "-n", NS, "echo-np"],
        "{.spec.ports[0].nodePort}",
    );
    assert!(!node_port.is_empty(), "no node port");
    for node in &real_nodes {
        let ip = a.jsonpath(
            &["node", node],
            "{.status.addresses[?(@.type==\"InternalIP\")].address}",
        );
        let (pod, seen) = answered_from_underlay(
            &env,
            &a,
            &format!("NodePort {ip}:{node_port} answers"),
            &ip,
            &node_port,
        );
        assert_eq!(pod, echo, "NodePort at {node} served by the offloaded pod");
        let source = if *node == outside_node {
            external_addr
        } else {
            cidr.network()
        };
        assert_eq!(
            seen,
            remapped(&view, source),
            "the source of the NodePort connection at {node} as beta sees it"
        );
    }

    // c) LoadBalancer: the same from the pool address.
    a.apply_as(kc, &service("echo-lb", "LoadBalancer")).ok();
    let mut lb = String::new();
    a.wait("a LoadBalancer address", Duration::from_secs(30), || {
        lb = a.jsonpath(
            &["service", "-n", NS, "echo-lb"],
            "{.status.loadBalancer.ingress[0].ip}",
        );
        !lb.is_empty()
    });
    let (pod, _) = answered_from_underlay(
        &env,
        &a,
        &format!("LoadBalancer {lb}:7000 answers"),
        &lb,
        "7000",
    );
    assert_eq!(pod, echo, "LoadBalancer served by the offloaded pod");

    // Deleting the IP withdraws it from every Configuration.
    a.kubectl(&["delete", "ips.networking.tether.dev", "-n", NS, "outside"])
        .ok();
    a.wait(
        "the published address withdrawn",
        Duration::from_secs(30),
        || {
            a.jsonpath(
                &[conf[0], conf[1], &tenant, PROVIDER],
                "{.status.published}",
            )
            .is_empty()
        },
    );
}
