//! Cluster topologies (root): a `--private-api` cluster refuses other clusters' TCP to its API
//! server, NodePorts and LoadBalancer IPs while its own nodes reach them, keeps its UDP Services
//! reachable from other clusters, is listed as such, and leaves nothing when brought down; a
//! `--behind-nat` cluster accepts nothing from outside (TCP or UDP) while its pods reach other
//! clusters, seen as its router's address.

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

const LOCAL_SERVICES: &str = r#"apiVersion: v1
kind: Service
metadata: {name: local-tcp, namespace: default}
spec:
  type: LoadBalancer
  externalTrafficPolicy: Local
  selector: {app: echo}
  ports: [{name: tcp, port: 7000, targetPort: 7000}]
---
apiVersion: v1
kind: Service
metadata: {name: local-udp, namespace: default}
spec:
  type: LoadBalancer
  externalTrafficPolicy: Local
  selector: {app: echo}
  ports: [{name: udp, port: 7000, targetPort: 7000, protocol: UDP}]
"#;

/// A pod of the cluster behind `kubeconfig` sending to `target` over `proto` every 300 ms.
fn sender(proto: &str, target: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: send-{proto}, namespace: default}}
spec:
  containers:
  - name: traffic
    image: simkube.dev/traffic
    args: ["--target", "{target}", "--proto", "{proto}", "--interval-ms", "300"]
    env: [{{name: POD_NAME, valueFrom: {{fieldRef: {{fieldPath: metadata.name}}}}}}]
"#
    )
}

#[test]
fn a_cluster_behind_nat_accepts_nothing_from_outside_and_reaches_out_as_its_router() {
    let Some(mut env) = Env::new("nat") else {
        return;
    };
    let natted = env.name("na");
    let other = env.name("nb");
    let k_nat = env.up_with(&natted, 2, &["--behind-nat"]);
    let k_other = env.up(&other, 2);
    let list = String::from_utf8_lossy(&env.simkube(&["cluster", "list"]).stdout).into_owned();
    assert!(
        list.lines()
            .any(|l| l.starts_with(&natted) && l.contains(" behind-nat ")),
        "{list}"
    );
    // Echo servers in both clusters (the host reaches both API servers via their kubeconfigs).
    apply(&k_nat, WORKLOAD);
    apply(&k_other, WORKLOAD);
    let nat_tcp_lb = format!("{}:7000", lb_ip(&k_nat, "echo-lb"));
    let nat_udp_lb = format!("{}:7000", lb_ip(&k_nat, "echo-udp"));
    // The receiving Services keep the client's address (`externalTrafficPolicy: Local`, an
    // endpoint on each node), so what the echo sees is what left the NAT router.
    kubectl_ok(
        &k_other,
        &["scale", "deployment", "echo", "--replicas", "2"],
    );
    apply(&k_other, LOCAL_SERVICES);
    eventually("two echo pods", Duration::from_secs(60), || {
        let ready = jsonpath(
            &k_other,
            &["get", "deployment", "echo"],
            "{.status.availableReplicas}",
        );
        (ready == "2").then_some(()).ok_or(ready)
    });
    let other_tcp_lb = format!("{}:7000", lb_ip(&k_other, "local-tcp"));
    let other_udp_lb = format!("{}:7000", lb_ip(&k_other, "local-udp"));
    let node_port = jsonpath(
        &k_nat,
        &["get", "service", "echo-np"],
        "{.spec.ports[0].nodePort}",
    );
    let record = env.record(&natted);
    let plan = record.plan();
    let api = format!("{}:6443", plan.gateway());
    let node_port_target = format!("{}:{node_port}", plan.node(1).ip);
    let own = format!("sk.{natted}.n2");
    let foreign = format!("sk.{other}.n1");

    // Inside, everything answers (so the failures below are the router's doing).
    assert!(tcp_connects(&own, &api), "own node to the API server");
    for (target, proto) in [
        (&node_port_target, "tcp"),
        (&nat_tcp_lb, "tcp"),
        (&nat_udp_lb, "udp"),
    ] {
        eventually(
            &format!("own node to {target}/{proto}"),
            Duration::from_secs(60),
            || traffic(&own, target, proto),
        );
    }
    // From another cluster's node and from the underlay itself: nothing opens.
    for from in [foreign.as_str(), env.underlay.as_str()] {
        for target in [&api, &node_port_target, &nat_tcp_lb] {
            assert!(!tcp_connects(from, target), "{from} to {target}");
        }
        assert!(
            traffic(from, &nat_udp_lb, "udp").is_err(),
            "{from} to the UDP LoadBalancer"
        );
    }

    // Out: a pod reaches the other cluster's LoadBalancers (TCP and UDP), seen as the router.
    let (_, router) = simkube_cluster::topology::router_transit(record.index);
    for (proto, target) in [("tcp", &other_tcp_lb), ("udp", &other_udp_lb)] {
        apply(&k_nat, &sender(proto, target));
        let pod = format!("send-{proto}");
        let line = eventually(
            &format!("{pod} gets answers"),
            Duration::from_secs(60),
            || {
                let logs = kubectl_ok(&k_nat, &["logs", &pod]);
                logs.lines()
                    .find(|l| l.starts_with(&format!("{proto} pod=echo-")))
                    .map(str::to_owned)
                    .ok_or(logs)
            },
        );
        assert!(
            line.contains(&format!(" peer={router}:")),
            "the receiver sees the router's address {router}: {line}"
        );
    }

    let out = env.down(&natted);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !simkube_cluster::net::netns_exists(&simkube_cluster::topology::router_netns(&natted)),
        "the router namespace is left"
    );
    assert!(!simkube_cluster::net::link_exists(
        &env.underlay,
        &simkube_cluster::topology::router_veth(record.index)
    ));
}
