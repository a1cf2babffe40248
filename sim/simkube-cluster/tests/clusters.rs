//! Whole simulated clusters through the real `simkube` binary and real kubectl: up and down,
//! recovery after a crash, node agent supervision, and the issue's traffic tests (a Deployment
//! reached by ClusterIP and DNS name from a pod; NodePort and LoadBalancer Services of one
//! cluster reached from another cluster's node). Needs root; each test uses its own underlay
//! namespace (`tt<pid>-<label>`, swept by the testkit if this process dies) and state directory,
//! and always brings its clusters down.

mod support;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use simkube_cluster::state::StateDir;
use support::{
    Env, SIMKUBE, apply, eventually, http_get, kubectl, kubectl_ok, pid_alive, ready_nodes,
};

#[test]
fn a_cluster_comes_up_with_ready_nodes_and_goes_down_without_a_trace() {
    let Some(mut env) = Env::new("life") else {
        return;
    };
    let name = env.name("life");
    let kubeconfig = env.up_with(&name, 2, &["--node-grace-period", "6"]);
    let mut nodes = ready_nodes(&kubeconfig);
    nodes.sort();
    assert_eq!(
        nodes,
        vec![format!("{name}-node-1"), format!("{name}-node-2")]
    );
    let dns = kubectl_ok(
        &kubeconfig,
        &[
            "get",
            "service",
            "-n",
            "kube-system",
            "kube-dns",
            "-o",
            "jsonpath={.spec.clusterIP}",
        ],
    );
    assert_eq!(dns, "10.96.0.10");
    // Networking published as kubeadm does, and every node's pod CIDR set.
    let kubeadm = kubectl_ok(
        &kubeconfig,
        &[
            "get",
            "configmap",
            "-n",
            "kube-system",
            "kubeadm-config",
            "-o",
            "jsonpath={.data.ClusterConfiguration}",
        ],
    );
    for line in [
        "apiVersion: kubeadm.k8s.io/v1beta3",
        "kind: ClusterConfiguration",
        &format!("clusterName: {name}"),
        "kubernetesVersion: v1.33.1",
        "  podSubnet: 10.244.0.0/16",
        "  serviceSubnet: 10.96.0.0/12",
        "  dnsDomain: cluster.local",
    ] {
        assert!(
            kubeadm.lines().any(|l| l == line),
            "{line:?} in:\n{kubeadm}"
        );
    }
    let cidrs = kubectl_ok(
        &kubeconfig,
        &[
            "get",
            "nodes",
            "-o",
            "jsonpath={range .items[*]}{.spec.podCIDR} {.spec.podCIDRs[0]}{\"\\n\"}{end}",
        ],
    );
    let mut cidrs: Vec<&str> = cidrs.lines().collect();
    cidrs.sort_unstable();
    assert_eq!(
        cidrs,
        ["10.244.1.0/24 10.244.1.0/24", "10.244.2.0/24 10.244.2.0/24"]
    );
    // The default StorageClass, provisioned by the host-path provisioner.
    let class = kubectl_ok(
        &kubeconfig,
        &[
            "get",
            "storageclass",
            "standard",
            "-o",
            "jsonpath={.metadata.annotations.storageclass\\.kubernetes\\.io/is-default-class} \
             {.provisioner} {.volumeBindingMode} {.reclaimPolicy}",
        ],
    );
    assert_eq!(
        class,
        "true simkube.dev/host-path WaitForFirstConsumer Delete"
    );
    let record = env.record(&name);
    let list = String::from_utf8_lossy(&env.simkube(&["cluster", "list"]).stdout).into_owned();
    assert!(
        list.lines()
            .any(|l| l.starts_with(&name) && l.ends_with("running")),
        "{list}"
    );

    // A crashed agent is restarted; a stopped one stays stopped until started again.
    let agent = env.agent_pid(&name, 1).expect("agent 1 runs");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(agent).expect("pid")),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill the agent");
    let metrics = StateDir::new(env.state_dir())
        .read_daemon(&name)
        .expect("readable")
        .and_then(|d| d.metrics_port)
        .expect("the daemon serves metrics");
    let restarts = format!("simkube_cluster_node_agent_restarts_total{{node=\"{name}-node-1\"}} 1");
    eventually("the restart is counted", Duration::from_secs(20), || {
        let body = http_get(metrics, "/metrics")?;
        body.contains(&restarts).then_some(()).ok_or(body)
    });
    assert!(http_get(metrics, "/healthz").is_ok_and(|b| b.ends_with("ok")));
    let restarted = eventually(
        "the crashed agent is restarted",
        Duration::from_secs(20),
        || {
            env.agent_pid(&name, 1)
                .filter(|p| *p != agent && pid_alive(*p))
                .ok_or_else(|| format!("pid file: {:?}", env.agent_pid(&name, 1)))
        },
    );
    let node2 = format!("{name}-node-2");
    let stopped = env.agent_pid(&name, 2).expect("agent 2 runs");
    let out = env.simkube(&["cluster", "stop-node", "--name", &name, "--node", &node2]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!pid_alive(stopped), "stop-node waits for the agent to exit");
    // Its Node turns NotReady once the grace period (6 s here) passes without a heartbeat.
    let stopped_at = Instant::now();
    eventually(
        "the stopped node turns NotReady",
        Duration::from_secs(20),
        || {
            let ready = ready_nodes(&kubeconfig);
            (!ready.contains(&node2))
                .then_some(())
                .ok_or(format!("{ready:?}"))
        },
    );
    assert!(
        stopped_at.elapsed() >= Duration::from_secs(4),
        "NotReady only after the grace period, not at once"
    );
    assert_eq!(
        env.agent_pid(&name, 2),
        None,
        "a stopped agent is not restarted"
    );
    let out = env.simkube(&["cluster", "start-node", "--name", &name, "--node", &node2]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let started = env.agent_pid(&name, 2).expect("agent 2 runs again");
    assert!(pid_alive(started));
    eventually(
        "the restarted node is Ready again",
        Duration::from_secs(20),
        || {
            let ready = ready_nodes(&kubeconfig);
            ready
                .contains(&node2)
                .then_some(())
                .ok_or(format!("{ready:?}"))
        },
    );

    let daemon = record.daemon_pid.expect("daemon recorded");
    let out = env.down(&name);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!pid_alive(daemon), "daemon gone");
    assert!(!pid_alive(restarted) && !pid_alive(started), "agents gone");
    let prefix = format!("sk.{name}.");
    assert_eq!(
        simkube_cluster::net::netns_with_prefix(&prefix),
        Vec::<String>::new()
    );
    assert!(
        !simkube_cluster::net::netns_exists(&env.underlay),
        "the underlay goes with its last cluster"
    );
    assert!(!env.state_dir().join(&name).exists(), "state removed");
    // Down again: nothing to do, and that is no error.
    let out = env.down(&name);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("no cluster named"));
}

#[test]
fn up_after_a_crashed_daemon_cleans_up_and_works() {
    let Some(mut env) = Env::new("crash") else {
        return;
    };
    let name = env.name("crash");
    env.up(&name, 1);
    let first = env.record(&name).daemon_pid.expect("daemon recorded");
    // While it runs, a second up of the same name is refused and changes nothing.
    let again = env.simkube(&[
        "cluster",
        "up",
        "--name",
        &name,
        "--underlay",
        &env.underlay.clone(),
        "--kubeconfig-out",
        "/nonexistent/k",
    ]);
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(
        !again.status.success() && stderr.contains("already running"),
        "{stderr}"
    );
    assert_eq!(env.record(&name).daemon_pid, Some(first));
    assert!(pid_alive(first));
    let agent = env.agent_pid(&name, 1).expect("the agent runs");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(first).expect("pid")),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill the daemon");
    eventually("the daemon is gone", Duration::from_secs(10), || {
        (!pid_alive(first))
            .then_some(())
            .ok_or_else(|| "alive".to_owned())
    });
    // The agents are the daemon's children and stop with it (parent-death signal).
    eventually(
        "the agent stops with its daemon",
        Duration::from_secs(30),
        || {
            (!pid_alive(agent))
                .then_some(())
                .ok_or_else(|| "alive".to_owned())
        },
    );
    let list = String::from_utf8_lossy(&env.simkube(&["cluster", "list"]).stdout).into_owned();
    assert!(list.contains("dead"), "{list}");
    // The namespaces and bridge of the crashed run are still there; up must clear them.
    assert!(simkube_cluster::net::netns_exists(&format!("sk.{name}.n1")));
    let kubeconfig = env.up(&name, 1);
    let second = env.record(&name).daemon_pid.expect("daemon recorded");
    assert_ne!(first, second);
    assert_eq!(ready_nodes(&kubeconfig), vec![format!("{name}-node-1")]);
}

#[test]
fn a_failed_up_removes_what_it_created_and_keeps_the_logs() {
    let Some(mut env) = Env::new("fail") else {
        return;
    };
    let name = env.name("fail");
    env.clusters.push(name.clone());
    let underlay = env.underlay.clone();
    let kubeconfig = env.state_dir().join("never.kubeconfig");
    let output = env.simkube(&[
        "cluster",
        "up",
        "--name",
        &name,
        "--nodes",
        "1",
        "--underlay",
        &underlay,
        "--kubeconfig-out",
        kubeconfig.to_str().expect("utf-8"),
        "--timeout",
        "0",
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("did not start within 0 s"), "{stderr}");
    let kept = env.state_dir().join(format!("{name}.failed"));
    assert!(stderr.contains(kept.to_str().expect("utf-8")), "{stderr}");
    assert!(kept.join("daemon.log").exists(), "the daemon's log is kept");
    assert!(!kubeconfig.exists());
    assert!(!env.state_dir().join(&name).exists());
    assert_eq!(
        simkube_cluster::net::netns_with_prefix(&format!("sk.{name}.")),
        Vec::<String>::new()
    );
    assert!(!simkube_cluster::net::netns_exists(&underlay));
    // The next up of that name works and drops the old logs.
    env.up(&name, 1);
    assert!(!kept.exists());
}

/// Echo pods behind Services, in `namespace` default.
fn echo_workload(replicas: u8, service_yaml: &str) -> String {
    format!(
        r#"apiVersion: apps/v1
kind: Deployment
metadata: {{name: echo, namespace: default}}
spec:
  replicas: {replicas}
  selector: {{matchLabels: {{app: echo}}}}
  template:
    metadata: {{labels: {{app: echo}}}}
    spec:
      containers:
      - name: echo
        image: simkube.dev/echo
        env: [{{name: POD_NAME, valueFrom: {{fieldRef: {{fieldPath: metadata.name}}}}}}]
{service_yaml}"#
    )
}

fn jsonpath(kubeconfig: &Path, args: &[&str], path: &str) -> String {
    let mut all = args.to_vec();
    let expr = format!("jsonpath={path}");
    all.extend(["-o", &expr]);
    kubectl_ok(kubeconfig, &all)
}

fn wait_available(kubeconfig: &Path, replicas: u8) {
    eventually(
        "the Deployment is Available",
        Duration::from_secs(60),
        || {
            let available = jsonpath(
                kubeconfig,
                &["get", "deployment", "echo"],
                "{.status.availableReplicas}",
            );
            (available == replicas.to_string())
                .then_some(())
                .ok_or(available)
        },
    );
}

/// Runs the traffic built-in once from namespace `netns` against `target`; its answer line.
fn traffic_from(netns: &str, target: &str) -> Result<String, String> {
    let output = Command::new("ip")
        .args(["netns", "exec", netns, SIMKUBE, "__builtin", "traffic"])
        .args(["--target", target, "--count", "1"])
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

#[test]
fn a_deployment_spreads_over_nodes_and_a_pod_reaches_it_by_cluster_ip_and_dns_name() {
    let Some(mut env) = Env::new("svc") else {
        return;
    };
    let name = env.name("svc");
    let kubeconfig = env.up(&name, 2);
    let service = r#"---
apiVersion: v1
kind: Service
metadata: {name: echo, namespace: default}
spec:
  selector: {app: echo}
  ports: [{name: tcp, port: 7000, targetPort: 7000}]
"#;
    apply(&kubeconfig, &echo_workload(3, service));
    wait_available(&kubeconfig, 3);
    let nodes = jsonpath(
        &kubeconfig,
        &["get", "pods", "-l", "app=echo"],
        "{.items[*].spec.nodeName}",
    );
    let distinct: std::collections::BTreeSet<&str> = nodes.split_whitespace().collect();
    assert_eq!(
        distinct.len(),
        2,
        "3 replicas spread over both nodes: {nodes}"
    );
    // Who wrote what, as in a real cluster: the ReplicaSet controller made the pods, their
    // node's agent reported their status, each under its name.
    let managers = jsonpath(
        &kubeconfig,
        &["get", "pods", "-l", "app=echo"],
        "{.items[0].metadata.managedFields[*].manager}/{.items[0].metadata.managedFields[*].subresource}",
    );
    assert_eq!(
        managers, "kube-controller-manager kubelet/status",
        "{managers}"
    );
    let cluster_ip = jsonpath(
        &kubeconfig,
        &["get", "service", "echo"],
        "{.spec.clusterIP}",
    );
    // Clients are pods: their resolv.conf points at the cluster DNS through its ClusterIP.
    for (client, target) in [
        ("by-ip", format!("{cluster_ip}:7000")),
        ("by-name", "echo.default.svc.cluster.local:7000".to_owned()),
    ] {
        let pod = format!(
            r#"apiVersion: v1
kind: Pod
metadata: {{name: {client}, namespace: default}}
spec:
  containers:
  - name: traffic
    image: simkube.dev/traffic
    args: ["--target", "{target}", "--interval-ms", "500"]
"#
        );
        apply(&kubeconfig, &pod);
    }
    for client in ["by-ip", "by-name"] {
        eventually(
            &format!("pod {client} gets answers from the echo pods"),
            Duration::from_secs(60),
            || {
                let logs = kubectl(&kubeconfig, &["logs", client]);
                let text = String::from_utf8_lossy(&logs.stdout).into_owned();
                text.lines()
                    .any(|l| l.starts_with("tcp pod=echo-"))
                    .then_some(())
                    .ok_or_else(|| format!("{text}{}", String::from_utf8_lossy(&logs.stderr)))
            },
        );
    }
}

#[test]
fn node_port_and_load_balancer_services_are_reachable_from_another_clusters_node() {
    let Some(mut env) = Env::new("x") else {
        return;
    };
    let c1 = env.name("xa");
    let c2 = env.name("xb");
    let k1 = env.up(&c1, 2);
    env.up(&c2, 2);
    let services = r#"---
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
"#;
    apply(&k1, &echo_workload(2, services));
    wait_available(&k1, 2);
    let node_port = jsonpath(
        &k1,
        &["get", "service", "echo-np"],
        "{.spec.ports[0].nodePort}",
    );
    let lb_ip = eventually(
        "the LoadBalancer gets an address",
        Duration::from_secs(30),
        || {
            let ip = jsonpath(
                &k1,
                &["get", "service", "echo-lb"],
                "{.status.loadBalancer.ingress[0].ip}",
            );
            (!ip.is_empty())
                .then_some(ip)
                .ok_or_else(|| "no ingress yet".to_owned())
        },
    );
    let plan = env.record(&c1).plan();
    assert!(
        plan.lb_net()
            .contains(&lb_ip.parse::<std::net::Ipv4Addr>().expect("an IPv4")),
        "{lb_ip} from the cluster's pool {}",
        plan.lb_net()
    );
    let from = format!("sk.{c2}.n1");
    for node in plan.node_plans() {
        let target = format!("{}:{node_port}", node.ip);
        let answer = eventually(
            &format!("NodePort {target} answers from {from}"),
            Duration::from_secs(30),
            || traffic_from(&from, &target),
        );
        assert!(answer.starts_with("tcp pod=echo-"), "{answer}");
    }
    let target = format!("{lb_ip}:7000");
    eventually(
        &format!("LoadBalancer {target} answers from {from}"),
        Duration::from_secs(30),
        || traffic_from(&from, &target),
    );
}

#[test]
fn bad_requests_are_refused_before_anything_is_created() {
    // Validation comes before any privileged step, so this runs without root too.
    let state = tempfile::tempdir().expect("tempdir");
    let state_dir = state.path().join("state");
    let cases: [(&[&str], &str); 5] = [
        (&["--name", "Bad_Name"], "cluster name \"Bad_Name\""),
        (&["--name", "ok", "--nodes", "0"], "--nodes 0"),
        (
            &["--name", "ok", "--underlay", "sk.x"],
            "underlay namespace name",
        ),
        (
            &["--name", "ok", "--image", "no-program"],
            "REFERENCE=PROGRAM",
        ),
        (
            &["--name", "ok", "--image", "a/b=/nonexistent/b"],
            "no such program",
        ),
    ];
    for (args, expected) in cases {
        let output = Command::new(SIMKUBE)
            .args(["cluster", "up", "--kubeconfig-out", "/nonexistent/k"])
            .args(args)
            .arg("--state-dir")
            .arg(&state_dir)
            .output()
            .expect("simkube runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{args:?} must fail");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
        assert!(!state_dir.exists(), "{args:?} created the state directory");
    }
    let output = Command::new(SIMKUBE)
        .args(["cluster", "down", "--name", "Nope!"])
        .arg("--state-dir")
        .arg(&state_dir)
        .output()
        .expect("simkube runs");
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("cluster name \"Nope!\""));
}
