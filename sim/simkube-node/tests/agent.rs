//! The node agent against a real simkube API server, with pods as real processes in real
//! network namespaces (root; skipped with a printed reason only when not root and CI is unset).

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use futures::{AsyncBufReadExt as _, TryStreamExt as _};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{DeleteParams, LogParams, PostParams};
use serde_json::json;
use simkube_node::sandbox;
use tether_testkit::{patience, require_root_or_skip};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _};

mod support;
use support::{
    Fixture, container_status, create_exiting_sleeper, fast_backoff, netns_exists, pod, wait_pod,
    waiting_reason,
};

#[test]
fn node_registers_ready_and_renews_its_lease() {
    if !require_root_or_skip() {
        return;
    }
    let fixture = Fixture::new("skn-lease");
    fixture.run(fast_backoff(), |client, node| async move {
        let nodes: Api<Node> = Api::all(client.clone());
        let leases: Api<Lease> = Api::namespaced(client, "kube-node-lease");
        let deadline = Instant::now() + patience(Duration::from_secs(10));
        let first = loop {
            if let Some(lease) = leases.get_opt(&node).await.expect("get lease") {
                break lease;
            }
            assert!(Instant::now() < deadline, "no lease for {node}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let n = nodes.get(&node).await.expect("node registered");
        assert_eq!(
            n.spec.and_then(|s| s.pod_cidr).as_deref(),
            Some("10.244.7.0/24")
        );
        let status = n.status.expect("node status");
        let ready = status
            .conditions
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.type_ == "Ready")
            .expect("Ready condition");
        assert_eq!(ready.status, "True");
        assert_eq!(
            status
                .daemon_endpoints
                .and_then(|d| d.kubelet_endpoint)
                .map(|k| k.port),
            Some(10250)
        );
        let renewed = |l: &Lease| l.spec.as_ref().and_then(|s| s.renew_time.clone());
        let t0 = renewed(&first).expect("renewTime");
        let deadline = Instant::now() + patience(Duration::from_secs(5));
        loop {
            let lease = leases.get(&node).await.expect("lease");
            if renewed(&lease).is_some_and(|t| t.0 > t0.0) {
                assert_eq!(
                    lease.spec.and_then(|s| s.holder_identity).as_deref(),
                    Some(node.as_str())
                );
                break;
            }
            assert!(Instant::now() < deadline, "lease of {node} was not renewed");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
}

#[test]
fn echo_pod_runs_answers_and_is_removed_on_delete() {
    if !require_root_or_skip() {
        return;
    }
    let fixture = Fixture::new("skn-echo");
    let prefix = fixture.prefix.clone();
    fixture.run(fast_backoff(), |client, node| async move {
        let pods: Api<Pod> = Api::namespaced(client, "default");
        let spec = pod(
            "echo",
            &node,
            "simkube.dev/echo:latest",
            &["--tcp", "7000"],
            "Always",
        );
        let created = pods
            .create(&PostParams::default(), &spec)
            .await
            .expect("create");
        let uid = created.metadata.uid.expect("uid");
        let running = wait_pod(
            &pods,
            "echo",
            Duration::from_secs(20),
            "Running and Ready",
            |p| {
                let s = p.status.as_ref();
                s.and_then(|s| s.phase.as_deref()) == Some("Running")
                    && container_status(p).is_some_and(|c| c.ready)
            },
        )
        .await;
        let pod_ip: Ipv4Addr = running
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.as_deref())
            .expect("podIP")
            .parse()
            .expect("IPv4 podIP");
        assert!(
            "10.244.7.0/24"
                .parse::<ipnet::Ipv4Net>()
                .expect("cidr")
                .contains(&pod_ip)
        );
        let netns = format!("{prefix}{uid}");
        assert!(
            netns_exists(&netns),
            "sandbox {netns} exists while the pod runs"
        );

        // The echo server may still be binding when the status says Running: retry briefly.
        let target = SocketAddr::from((pod_ip, 7000));
        let deadline = Instant::now() + patience(Duration::from_secs(5));
        let reply = loop {
            let attempt = tokio::time::timeout(Duration::from_secs(2), async {
                let mut stream = tokio::net::TcpStream::connect(target).await?;
                stream.write_all(b"hello\n").await?;
                let mut line = String::new();
                tokio::io::BufReader::new(stream)
                    .read_line(&mut line)
                    .await?;
                Ok::<_, std::io::Error>(line)
            })
            .await
            .unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into()));
            match attempt {
                Ok(line) => break line,
                Err(e) => assert!(Instant::now() < deadline, "no echo from {target}: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        // The node reaches pods from the gateway address, which the pod sees as the peer.
        assert!(reply.starts_with("pod=echo peer=10.244.7.1:"), "{reply}");
        assert!(reply.trim_end().ends_with(" hello"), "{reply}");

        // Pod to pod through the node: the traffic client's one exchange succeeds or it fails.
        let client_pod = pod(
            "client",
            &node,
            "simkube.dev/traffic",
            &["--target", "$(ECHO):7000", "--proto", "udp", "--count", "1"],
            "Never",
        );
        let mut client_pod = client_pod;
        client_pod.spec.as_mut().expect("spec").containers[0]
            .env
            .get_or_insert_with(Vec::new)
            .push(
                serde_json::from_value(json!({"name": "ECHO", "value": pod_ip.to_string()}))
                    .expect("env"),
            );
        pods.create(&PostParams::default(), &client_pod)
            .await
            .expect("create client");
        let done = wait_pod(&pods, "client", Duration::from_secs(20), "Succeeded", |p| {
            matches!(
                p.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Succeeded" | "Failed")
            )
        })
        .await;
        let client_logs = pods
            .logs("client", &LogParams::default())
            .await
            .expect("client logs");
        let client_ip = done
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.clone())
            .expect("client IP");
        assert_eq!(
            done.status.and_then(|s| s.phase).as_deref(),
            Some("Succeeded"),
            "{client_logs}"
        );
        assert!(
            client_logs.contains(&format!("udp pod=echo peer={client_ip}:")),
            "the echo saw the client pod's own address: {client_logs}"
        );

        // Logs come through the API server's kubelet proxy from the agent's kubelet endpoint.
        let logs = pods
            .logs("echo", &LogParams::default())
            .await
            .expect("logs");
        assert!(
            logs.starts_with("echo echo serving tcp 0.0.0.0:7000"),
            "{logs}"
        );
        assert!(logs.contains("tcp connection from 10.244.7.1:"), "{logs}");
        let follow = LogParams {
            follow: true,
            tail_lines: Some(1),
            ..LogParams::default()
        };
        let mut lines = pods
            .log_stream("echo", &follow)
            .await
            .expect("follow")
            .lines();
        let first = lines.try_next().await.expect("read").expect("a line");
        assert!(
            first.starts_with("tcp connection from"),
            "tail 1 gives the last line: {first}"
        );
        let second = tokio::net::TcpStream::connect(target)
            .await
            .expect("connect again");
        let local = second.local_addr().expect("local addr");
        let next = tokio::time::timeout(patience(Duration::from_secs(5)), lines.try_next())
            .await
            .expect("followed line in time")
            .expect("read")
            .expect("a line");
        assert_eq!(next, format!("tcp connection from {local}"));
        drop(second);

        let started = Instant::now();
        pods.delete("echo", &DeleteParams::default())
            .await
            .expect("delete");
        let deadline = Instant::now() + patience(Duration::from_secs(15));
        while pods.get_opt("echo").await.expect("get").is_some() {
            assert!(
                Instant::now() < deadline,
                "pod was not removed after its grace period"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // SIGTERM ends the echo server at once: no need to wait for the 2 s grace period.
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "took {:?}",
            started.elapsed()
        );
        assert!(
            !netns_exists(&netns),
            "sandbox {netns} removed with the pod"
        );
        // The followed stream ends with the container.
        let end = tokio::time::timeout(patience(Duration::from_secs(5)), lines.try_next()).await;
        assert!(
            matches!(end, Ok(Ok(None)) | Ok(Err(_))),
            "follow ended: {end:?}"
        );
        let refused = tokio::time::timeout(
            Duration::from_millis(300),
            tokio::net::TcpStream::connect(target),
        )
        .await;
        assert!(
            !matches!(refused, Ok(Ok(_))),
            "nothing answers at {target} any more"
        );
    });
}

#[test]
fn crashing_container_restarts_with_back_off() {
    if !require_root_or_skip() {
        return;
    }
    let fixture = Fixture::new("skn-crash");
    fixture.run(fast_backoff(), |client, node| async move {
        let pods: Api<Pod> = Api::namespaced(client, "default");
        create_exiting_sleeper(&pods, "crasher", &node, "3", "Always").await;
        let started = Instant::now();
        let looping = wait_pod(
            &pods,
            "crasher",
            Duration::from_secs(20),
            "restartCount 3",
            |p| container_status(p).is_some_and(|c| c.restart_count >= 3),
        )
        .await;
        // Back-off 300 ms, 600 ms, 1.2 s before the third restart.
        let elapsed = started.elapsed();
        assert!(
            elapsed >= Duration::from_millis(2100),
            "restarted too fast: {elapsed:?}"
        );
        let status = container_status(&looping).expect("status");
        let last = status
            .last_state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .expect("last termination");
        assert_eq!(last.exit_code, 3);
        assert_eq!(last.reason.as_deref(), Some("Error"));
        assert_eq!(
            looping.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Running")
        );
        let previous = LogParams {
            previous: true,
            ..LogParams::default()
        };
        let logs = pods
            .logs("crasher", &previous)
            .await
            .expect("previous logs");
        assert!(logs.starts_with("sleeper crasher sleeping"), "{logs}");
        wait_pod(
            &pods,
            "crasher",
            Duration::from_secs(10),
            "CrashLoopBackOff",
            |p| waiting_reason(p).as_deref() == Some("CrashLoopBackOff"),
        )
        .await;

        // restartPolicy Never: one run, then Failed with the exit code.
        create_exiting_sleeper(&pods, "once", &node, "4", "Never").await;
        let failed = wait_pod(&pods, "once", Duration::from_secs(20), "Failed", |p| {
            p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Failed")
        })
        .await;
        let status = container_status(&failed).expect("status");
        assert_eq!(status.restart_count, 0);
        let terminated = status
            .state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .expect("terminated");
        assert_eq!(terminated.exit_code, 4);
    });
}

#[test]
fn unknown_image_is_err_image_pull() {
    if !require_root_or_skip() {
        return;
    }
    let fixture = Fixture::new("skn-image");
    fixture.run(fast_backoff(), |client, node| async move {
        let pods: Api<Pod> = Api::namespaced(client, "default");
        let spec = pod("ghost", &node, "registry.example/ghost:v1", &[], "Always");
        pods.create(&PostParams::default(), &spec)
            .await
            .expect("create");
        let pending = wait_pod(
            &pods,
            "ghost",
            Duration::from_secs(20),
            "ErrImagePull",
            |p| waiting_reason(p).as_deref() == Some("ErrImagePull"),
        )
        .await;
        let status = container_status(&pending).expect("status");
        let message = status
            .state
            .as_ref()
            .and_then(|s| s.waiting.as_ref())
            .and_then(|w| w.message.clone())
            .expect("message");
        assert!(message.contains("registry.example/ghost:v1"), "{message}");
        assert!(message.contains("image table"), "{message}");
        assert_eq!(
            pending.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Pending")
        );
        assert!(!status.ready);
    });
}

#[test]
fn host_network_pod_shares_the_node_address() {
    if !require_root_or_skip() {
        return;
    }
    let fixture = Fixture::new("skn-hostnet");
    let prefix = fixture.prefix.clone();
    fixture.run(fast_backoff(), |client, node| async move {
        let pods: Api<Pod> = Api::namespaced(client, "default");
        let mut spec = pod(
            "hostecho",
            &node,
            "simkube.dev/echo",
            &["--tcp", "7101", "--udp", "7101", "--http", "7102"],
            "Always",
        );
        spec.spec.as_mut().expect("spec").host_network = Some(true);
        pods.create(&PostParams::default(), &spec)
            .await
            .expect("create");
        let running = wait_pod(&pods, "hostecho", Duration::from_secs(20), "Running", |p| {
            container_status(p).is_some_and(|c| c.ready)
        })
        .await;
        let status = running.status.expect("status");
        assert_eq!(status.pod_ip.as_deref(), Some("198.18.0.10"));
        assert!(
            sandbox::list(&prefix).is_empty(),
            "no sandbox for a host-network pod"
        );
        // HTTP on the node's own address: the server saw the node address as the peer.
        let deadline = Instant::now() + patience(Duration::from_secs(5));
        let body = loop {
            let attempt = tokio::time::timeout(Duration::from_secs(2), async {
                let mut stream = tokio::net::TcpStream::connect("198.18.0.10:7102").await?;
                stream
                    .write_all(b"GET /hello HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
                    .await?;
                let mut response = String::new();
                tokio::io::AsyncReadExt::read_to_string(&mut stream, &mut response).await?;
                Ok::<_, std::io::Error>(response)
            })
            .await
            .unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into()));
            match attempt {
                Ok(response) => break response,
                Err(e) => assert!(Instant::now() < deadline, "no HTTP echo: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert!(body.starts_with("HTTP/1.1 200 OK"), "{body}");
        assert!(body.contains("pod=hostecho peer=198.18.0.10:"), "{body}");
        assert!(body.trim_end().ends_with("path=/hello"), "{body}");
    });
}

#[test]
fn binary_runs_inside_its_node_namespace_and_cleans_up_on_sigterm() {
    if !require_root_or_skip() {
        return;
    }
    let fixture = Fixture::new("skn-bin");
    let prefix = fixture.prefix.clone();
    let netns_name = fixture.netns.name().to_owned();
    let node = fixture.node.clone();
    let state = fixture.state.path().to_owned();
    fixture.netns.run_async(|| async move {
        let cluster = simkube::Cluster::builder().start().await.expect("cluster");
        let kubeconfig = state.join("kubeconfig");
        cluster.write_kubeconfig(&kubeconfig).expect("kubeconfig");
        // The binary enters the node namespace itself (`--netns`), so it starts from here
        // like any host process would.
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_simkube-node"));
        command.args([
            "--kubeconfig",
            &kubeconfig.display().to_string(),
            "--name",
            &node,
            "--pod-cidr",
            "10.244.9.0/24",
            "--internal-ip",
            "198.18.0.10",
            "--netns",
            &netns_name,
            "--state-dir",
            &state.join("agent").display().to_string(),
            "--log",
            "warn",
        ]);
        let child = command.spawn().expect("spawn the agent binary");
        let mut agent = tether_testkit::ProcessGuard::new(child, "simkube-node");
        let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
        let spec = pod("binecho", &node, "simkube.dev/echo", &[], "Always");
        let created = pods
            .create(&PostParams::default(), &spec)
            .await
            .expect("create");
        let uid = created.metadata.uid.expect("uid");
        let running = wait_pod(&pods, "binecho", Duration::from_secs(20), "Ready", |p| {
            container_status(p).is_some_and(|c| c.ready)
        })
        .await;
        let ip = running.status.and_then(|s| s.pod_ip).expect("podIP");
        assert!(ip.starts_with("10.244.9."), "{ip}");
        // Default sandbox names: `sk-<node>-<uid>`.
        let netns = format!("sk-{node}-{uid}");
        assert!(netns_exists(&netns), "{netns}");
        let status = tokio::task::spawn_blocking(move || agent.stop())
            .await
            .expect("join")
            .expect("stop the agent");
        assert!(
            status.success(),
            "agent exits cleanly on SIGTERM: {status:?}"
        );
        assert!(
            !netns_exists(&netns),
            "the agent removed {netns} on shutdown"
        );
        assert!(sandbox::list(&prefix).is_empty());
        cluster.shutdown().await;
    });
}

#[test]
fn init_containers_run_in_order_before_the_main_container() {
    if !require_root_or_skip() {
        return;
    }
    let fixture = Fixture::new("skn-init");
    fixture.run(fast_backoff(), |client, node| async move {
        let pods: Api<Pod> = Api::namespaced(client, "default");
        let mut spec = pod("inits", &node, "simkube.dev/sleeper", &[], "Always");
        let init = |name: &str, seconds: &str| {
            serde_json::from_value(json!({
                "name": name, "image": "simkube.dev/sleeper",
                "args": ["--seconds", seconds, "--exit-code", "0"]
            }))
            .expect("init container")
        };
        spec.spec.as_mut().expect("spec").init_containers =
            Some(vec![init("first", "0.3"), init("second", "0")]);
        pods.create(&PostParams::default(), &spec)
            .await
            .expect("create");
        let pending = wait_pod(
            &pods,
            "inits",
            Duration::from_secs(10),
            "initializing",
            |p| waiting_reason(p).as_deref() == Some("PodInitializing"),
        )
        .await;
        assert_eq!(
            pending.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Pending")
        );
        let running = wait_pod(&pods, "inits", Duration::from_secs(20), "Ready", |p| {
            container_status(p).is_some_and(|c| c.ready)
        })
        .await;
        let status = running.status.expect("status");
        let inits = status.init_container_statuses.expect("init statuses");
        let finished = |i: usize| {
            inits[i]
                .state
                .as_ref()
                .and_then(|s| s.terminated.as_ref())
                .map(|t| (t.exit_code, t.started_at.clone(), t.finished_at.clone()))
                .expect("terminated")
        };
        let (first_code, _, first_end) = finished(0);
        let (second_code, second_start, _) = finished(1);
        assert_eq!((first_code, second_code), (0, 0));
        assert!(
            second_start.expect("start").0 >= first_end.expect("end").0,
            "in order"
        );
        let initialized = status
            .conditions
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.type_ == "Initialized")
            .expect("Initialized");
        assert_eq!(initialized.status, "True");
    });
}
