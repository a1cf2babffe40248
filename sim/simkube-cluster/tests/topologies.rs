//! Cluster topologies (root): a `--private-api` cluster refuses other clusters' TCP to its API
//! server, NodePorts and LoadBalancer IPs while its own nodes reach them, keeps its UDP Services
//! reachable from other clusters, is listed as such, and leaves nothing when brought down.

mod support;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use support::{Env, SIMKUBE, apply, eventually, kubectl_ok};

/// Whether a TCP connection from namespace `netns` to `target` is accepted within 3 s.
fn tcp_connects(netns: &str, target: &str) -> bool {
    let (host, port) = target.rsplit_once(':').expect("host:port");
    Command::new("ip")
        .args(["netns", "exec", netns, "timeout", "3", "bash", "-c"])
        .arg(format!("exec 3<>/dev/tcp/{host}/{port}"))
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Runs the traffic built-in once from `netns` against `target` over `proto`; its answer.
fn traffic(netns: &str, target: &str, proto: &str) -> Result<String, String> {
    let output = Command::new("ip")
        .args(["netns", "exec", netns, SIMKUBE, "__builtin", "traffic"])
        .args(["--target", target, "--count", "1", "--proto", proto])
        .output()
        .map_err(|e| e.to_string())?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    if output.status.success() && stdout.contains("pod=echo-") {
        Ok(stdout)
    } else {
        Err(format!(
            "{stdout}{}",
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

fn jsonpath(kubeconfig: &Path, args: &[&str], path: &str) -> String {
    let mut all = args.to_vec();
    let expr = format!("jsonpath={path}");
    all.extend(["-o", &expr]);
    kubectl_ok(kubeconfig, &all)
}

const WORKLOAD: &str = r#"apiVersion: apps/v1
kind: Deployment
metadata: {name: echo, namespace: default}
spec:
  replicas: 1
  selector: {matchLabels: {app: echo}}
  template:
    metadata: {labels: {app: echo}}
    spec:
      containers:
      - name: echo
        image: simkube.dev/echo
        env: [{name: POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}]
---
apiVersion: v1
kind: Service
metadata: {name: echo-np, namespace: default}
spec:
  type: NodePort
  selector: {app: echo}
  ports: [{name: tcp, port: 7000, targetPort: 7000}]
---
apiVersion: v1
kind: Service
metadata: {name: echo-lb, namespace: default}
spec:
  type: LoadBalancer
  selector: {app: echo}
  ports: [{name: tcp, port: 7000, targetPort: 7000}]
---
apiVersion: v1
kind: Service
metadata: {name: echo-udp, namespace: default}
spec:
  type: LoadBalancer
  selector: {app: echo}
  ports: [{name: udp, port: 7000, targetPort: 7000, protocol: UDP}]
"#;

fn lb_ip(kubeconfig: &Path, service: &str) -> String {
    eventually(
        &format!("{service} gets an address"),
        Duration::from_secs(30),
        || {
            let ip = jsonpath(
                kubeconfig,
                &["get", "service", service],
                "{.status.loadBalancer.ingress[0].ip}",
            );
            (!ip.is_empty())
                .then_some(ip)
                .ok_or_else(|| "no ingress yet".to_owned())
        },
    )
}

#[test]
fn a_private_api_cluster_refuses_other_clusters_tcp_but_not_udp() {
    let Some(mut env) = Env::new("priv") else {
        return;
    };
    let private = env.name("pa");
    let other = env.name("pb");
    let kubeconfig = env.up_with(&private, 2, &["--private-api"]);
    env.up(&other, 2);
    let list = String::from_utf8_lossy(&env.simkube(&["cluster", "list"]).stdout).into_owned();
    assert!(
        list.lines()
            .any(|l| l.starts_with(&private) && l.contains(" private-api ")),
        "{list}"
    );
    assert!(
        list.lines()
            .any(|l| l.starts_with(&other) && l.contains(" open ")),
        "{list}"
    );
    // The host still reaches the API server through the kubeconfig.
    apply(&kubeconfig, WORKLOAD);
    eventually(
        "the Deployment is Available",
        Duration::from_secs(60),
        || {
            let available = jsonpath(
                &kubeconfig,
                &["get", "deployment", "echo"],
                "{.status.availableReplicas}",
            );
            (available == "1").then_some(()).ok_or(available)
        },
    );
    let node_port = jsonpath(
        &kubeconfig,
        &["get", "service", "echo-np"],
        "{.spec.ports[0].nodePort}",
    );
    let tcp_lb = format!("{}:7000", lb_ip(&kubeconfig, "echo-lb"));
    let udp_lb = format!("{}:7000", lb_ip(&kubeconfig, "echo-udp"));
    let plan = env.record(&private).plan();
    let api = format!("{}:6443", plan.gateway());
    let node_port_target = format!("{}:{node_port}", plan.node(1).ip);
    let own = format!("sk.{private}.n2");
    let foreign = format!("sk.{other}.n1");

    // Its own nodes reach all of it (so the refusals below are the firewall's doing).
    assert!(tcp_connects(&own, &api), "own node to the API server");
    eventually("own node to the NodePort", Duration::from_secs(30), || {
        traffic(&own, &node_port_target, "tcp")
    });
    eventually(
        "own node to the TCP LoadBalancer",
        Duration::from_secs(30),
        || traffic(&own, &tcp_lb, "tcp"),
    );

    // Another cluster's node opens no TCP connection to any of it.
    assert!(
        !tcp_connects(&foreign, &api),
        "foreign node to the API server"
    );
    assert!(
        !tcp_connects(&foreign, &node_port_target),
        "foreign node to the NodePort"
    );
    assert!(
        !tcp_connects(&foreign, &tcp_lb),
        "foreign node to the TCP LB"
    );
    // ... but its UDP LoadBalancer answers.
    let answer = eventually(
        "foreign node to the UDP LoadBalancer",
        Duration::from_secs(30),
        || traffic(&foreign, &udp_lb, "udp"),
    );
    assert!(answer.starts_with("udp pod=echo-"), "{answer}");

    // Down removes the firewall table with the rest.
    let out = env.down(&private);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tables = Command::new("ip")
        .args(["netns", "exec", &env.underlay, "nft", "list", "tables"])
        .output()
        .expect("nft");
    let tables = String::from_utf8_lossy(&tables.stdout);
    assert!(
        !tables.contains(&simkube_cluster::topology::firewall_table(&private)),
        "{tables}"
    );
}
