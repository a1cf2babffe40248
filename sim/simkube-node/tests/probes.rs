//! Container probes and restarts end to end: the node agent probes real container processes
//! (exec, TCP, HTTP) against a real simkube API server, restarts crashing and unhealthy
//! containers with back-off, and simkube's EndpointSlice controller follows pod readiness
//! (root; skipped with a printed reason only when not root and CI is unset).

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::api::{ListParams, PostParams};
use serde_json::{Value, json};
use simkube::controllers::Controllers;
use tether_testkit::{patience, require_root_or_skip};

mod support;
use support::{Fixture, container_status, fast_backoff, wait_pod, waiting_reason};

/// A pod running the built-in echo server with extra fields merged into its one container.
fn echo_pod(name: &str, node: &str, args: &[&str], container: Value) -> Pod {
    let mut main = json!({
        "name": "main", "image": "simkube.dev/echo", "args": args,
        "ports": [{"name": "http", "containerPort": 8080}, {"name": "tcp", "containerPort": 7000}],
        "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
    });
    if let (Some(main), Some(extra)) = (main.as_object_mut(), container.as_object()) {
        main.extend(extra.clone());
    }
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": name}},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 2,
            "containers": [main]
        }
    }))
    .expect("pod")
}

fn condition(pod: &Pod, kind: &str) -> Option<String> {
    support::pod_condition(pod, kind).map(|(status, _, _)| status)
}

fn running(pod: &Pod) -> bool {
    container_status(pod)
        .and_then(|c| c.state.as_ref())
        .is_some_and(|s| s.running.is_some())
}

fn ready(pod: &Pod) -> bool {
    container_status(pod).is_some_and(|c| c.ready)
        && condition(pod, "Ready").as_deref() == Some("True")
        && condition(pod, "ContainersReady").as_deref() == Some("True")
}

fn unready(pod: &Pod) -> bool {
    running(pod)
        && container_status(pod).is_some_and(|c| !c.ready)
        && condition(pod, "Ready").as_deref() == Some("False")
        && condition(pod, "ContainersReady").as_deref() == Some("False")
}

fn restarts(pod: &Pod) -> i32 {
    container_status(pod).map_or(0, |c| c.restart_count)
}

/// The events about `pod` with `reason`, as (message, count).
async fn events(client: &kube::Client, pod: &str, reason: &str) -> Vec<(String, i32)> {
    let api: Api<Event> = Api::namespaced(client.clone(), "default");
    api.list(&ListParams::default())
        .await
        .expect("list events")
        .items
        .into_iter()
        .filter(|e| {
            e.involved_object.name.as_deref() == Some(pod) && e.reason.as_deref() == Some(reason)
        })
        .map(|e| (e.message.unwrap_or_default(), e.count.unwrap_or(0)))
        .collect()
}

/// Polls until `check` accepts the events of `pod` with `reason`.
async fn wait_events(
    client: &kube::Client,
    pod: &str,
    reason: &str,
    what: &str,
    check: impl Fn(&[(String, i32)]) -> bool,
) -> Vec<(String, i32)> {
    let deadline = Instant::now() + patience(Duration::from_secs(20));
    loop {
        let seen = events(client, pod, reason).await;
        if check(&seen) {
            return seen;
        }
        assert!(
            Instant::now() < deadline,
            "{what}; {reason} events: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Whether the address `ip` is in an EndpointSlice of Service `service` with `ready` as given.
async fn endpoint_ready(client: &kube::Client, service: &str, ip: &str) -> Option<bool> {
    let api: Api<EndpointSlice> = Api::namespaced(client.clone(), "default");
    let selector = format!("kubernetes.io/service-name={service}");
    let slices = api
        .list(&ListParams::default().labels(&selector))
        .await
        .expect("list slices");
    slices
        .items
        .iter()
        .flat_map(|s| &s.endpoints)
        .find(|e| e.addresses.iter().any(|a| a == ip))
        .map(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
}

async fn wait_endpoint(client: &kube::Client, service: &str, ip: &str, want: bool) {
    let deadline = Instant::now() + patience(Duration::from_secs(20));
    loop {
        let now = endpoint_ready(client, service, ip).await;
        if now == Some(want) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "endpoint {ip} of service {service}: want ready={want}, have {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn with_endpoint_slices(builder: simkube::ClusterBuilder) -> simkube::ClusterBuilder {
    builder.controllers(Controllers {
        endpoint_slices: true,
        ..Controllers::none()
    })
}

#[test]
fn crashing_container_backs_off_longer_each_time_and_counts_restarts() {
    if !require_root_or_skip() {
        return;
    }
    let fixture = Fixture::new("skp-crash");
    fixture.run(fast_backoff(), |client, node| async move {
        let pods_client = &client;
        let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
        support::create_exiting_sleeper(&pods, "crasher", &node, "3", "Always").await;
        // When each restart count first shows, and the back-off messages seen meanwhile.
        let mut seen_at: Vec<(i32, Instant)> = Vec::new();
        let mut messages: Vec<String> = Vec::new();
        let deadline = Instant::now() + patience(Duration::from_secs(30));
        while seen_at.last().is_none_or(|(count, _)| *count < 5) {
            assert!(Instant::now() < deadline, "restarts seen: {seen_at:?}");
            let pod = pods.get("crasher").await.expect("get");
            let count = restarts(&pod);
            if seen_at.last().is_none_or(|(last, _)| count > *last) {
                seen_at.push((count, Instant::now()));
            }
            if waiting_reason(&pod).as_deref() == Some("CrashLoopBackOff")
                && let Some(message) = container_status(&pod)
                    .and_then(|c| c.state.as_ref()?.waiting.as_ref()?.message.clone())
                && !messages.contains(&message)
            {
                messages.push(message);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Back-off 300 ms, 600 ms, 1.2 s, then capped at 2 s: the gaps between successive
        // restart counts grow, then stop growing.
        let at = |count: i32| {
            seen_at
                .iter()
                .find(|(c, _)| *c == count)
                .map(|(_, t)| *t)
                .unwrap_or_else(|| panic!("restart count {count} never showed: {seen_at:?}"))
        };
        let gap = |n: i32| at(n + 1) - at(n);
        let (g1, g2, g3, g4) = (gap(1), gap(2), gap(3), gap(4));
        eprintln!("gaps between restarts: {g1:?} {g2:?} {g3:?} {g4:?}");
        assert!(g1 >= Duration::from_millis(550), "gap 1->2 {g1:?}");
        assert!(g2 >= Duration::from_millis(1150), "gap 2->3 {g2:?}");
        assert!(g3 >= Duration::from_millis(1900), "gap 3->4 {g3:?}");
        assert!(g2 > g1 + Duration::from_millis(400), "{g1:?} then {g2:?}");
        assert!(g3 > g2 + Duration::from_millis(500), "{g2:?} then {g3:?}");
        assert!(
            g4 >= Duration::from_millis(1900) && g4 < g3 + Duration::from_millis(1500),
            "the back-off is capped at 2 s: {g3:?} then {g4:?}"
        );
        // One message per back-off step, each naming the wait.
        assert!(
            messages.len() >= 3
                && messages.iter().all(|m| m.starts_with("back-off ")
                    && m.ends_with(" restarting failed container=main pod=crasher")),
            "{messages:?}"
        );
        let pod = pods.get("crasher").await.expect("get");
        assert!(restarts(&pod) >= 5);
        let last = container_status(&pod)
            .and_then(|c| c.last_state.as_ref()?.terminated.clone())
            .expect("last termination");
        assert_eq!(last.exit_code, 3);
        // One BackOff warning, counted at every back-off.
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let backoff = events(pods_client, "crasher", "BackOff").await;
        assert_eq!(
            backoff.first().map(|(m, _)| m.clone()),
            Some(format!(
                "Back-off restarting failed container main in pod crasher_default({uid})"
            )),
            "{backoff:?}"
        );
        assert_eq!(backoff.len(), 1, "{backoff:?}");
        assert!(backoff[0].1 >= 4, "{backoff:?}");
    });
}

#[test]
fn failing_readiness_takes_the_pod_out_of_its_endpoint_slice_until_it_passes() {
    if !require_root_or_skip() {
        return;
    }
    let fixture = Fixture::new("skp-ready");
    let healthy = fixture.state.path().join("web-healthy");
    std::fs::write(&healthy, "").expect("health file");
    let healthy_arg = healthy.to_str().expect("utf-8 path").to_owned();
    fixture.run_with(
        fast_backoff(),
        with_endpoint_slices,
        |_| {},
        |client, node| async move {
            let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
            let services: Api<Service> = Api::namespaced(client.clone(), "default");
            let service: Service = serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "Service",
                "metadata": {"name": "web", "namespace": "default"},
                "spec": {"selector": {"app": "web"},
                         "ports": [{"port": 80, "targetPort": "http"}]}
            }))
            .expect("service");
            services
                .create(&PostParams::default(), &service)
                .await
                .expect("create service");
            let probe = json!({"readinessProbe": {
                "httpGet": {"path": "/healthz", "port": "http"},
                "periodSeconds": 1, "failureThreshold": 2
            }});
            let spec = echo_pod("web", &node, &["--healthz-file", &healthy_arg], probe);
            pods.create(&PostParams::default(), &spec)
                .await
                .expect("create pod");
            let pod = wait_pod(&pods, "web", Duration::from_secs(20), "Ready", ready).await;
            let ip = pod
                .status
                .as_ref()
                .and_then(|s| s.pod_ip.clone())
                .expect("pod IP");
            wait_endpoint(&client, "web", &ip, true).await;

            // The health check starts failing: after two failed probes the pod is unready and
            // its endpoint is no longer ready (the service proxy drops it).
            std::fs::remove_file(&healthy).expect("remove health file");
            let failing = Instant::now();
            wait_pod(&pods, "web", Duration::from_secs(20), "unready", unready).await;
            eprintln!("pod unready {:?} after the check failed", failing.elapsed());
            wait_endpoint(&client, "web", &ip, false).await;
            eprintln!(
                "endpoint not ready {:?} after the check failed",
                failing.elapsed()
            );
            // (A first probe may have run before the echo listened: refused, another event.)
            let unhealthy = "Readiness probe failed: HTTP probe failed with statuscode: 503";
            let failed = wait_events(&client, "web", "Unhealthy", "repeated failures", |seen| {
                seen.iter().any(|(m, count)| m == unhealthy && *count >= 2)
            })
            .await;
            assert_eq!(
                failed.iter().filter(|(m, _)| m == unhealthy).count(),
                1,
                "repeats are counted, not re-created: {failed:?}"
            );

            // Healthy again: back in the slice; a readiness failure never restarts anything.
            std::fs::write(&healthy, "").expect("health file");
            let passing = Instant::now();
            let pod = wait_pod(&pods, "web", Duration::from_secs(20), "Ready again", ready).await;
            wait_endpoint(&client, "web", &ip, true).await;
            eprintln!(
                "endpoint ready {:?} after the check passed",
                passing.elapsed()
            );
            assert_eq!(restarts(&pod), 0);
        },
    );
}

#[test]
fn failing_liveness_restarts_the_container() {
    if !require_root_or_skip() {
        return;
    }
    let fixture = Fixture::new("skp-live");
    let alive = fixture.state.path().join("alive");
    std::fs::write(&alive, "").expect("liveness file");
    let alive_arg = alive.to_str().expect("utf-8 path").to_owned();
    fixture.run(fast_backoff(), |client, node| async move {
        let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
        let probe = json!({"livenessProbe": {
            "exec": {"command": ["test", "-e", alive_arg]},
            "periodSeconds": 1, "failureThreshold": 2
        }});
        let spec = echo_pod("live", &node, &[], probe);
        pods.create(&PostParams::default(), &spec)
            .await
            .expect("create pod");
        wait_pod(&pods, "live", Duration::from_secs(20), "Ready", ready).await;
        // Passing probes keep it running.
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(restarts(&pods.get("live").await.expect("get")), 0);

        std::fs::remove_file(&alive).expect("remove liveness file");
        let restarted = wait_pod(&pods, "live", Duration::from_secs(20), "a restart", |p| {
            restarts(p) >= 1
        })
        .await;
        let last = container_status(&restarted)
            .and_then(|c| c.last_state.as_ref()?.terminated.clone())
            .expect("last termination");
        // The echo server does not handle SIGTERM: it dies of it (128 + 15).
        assert_eq!(last.exit_code, 143, "{last:?}");
        let killing = wait_events(&client, "live", "Killing", "a Killing event", |seen| {
            !seen.is_empty()
        })
        .await;
        assert_eq!(
            killing[0].0,
            "Container main failed liveness probe, will be restarted"
        );
        let unhealthy = events(&client, "live", "Unhealthy").await;
        assert!(
            unhealthy.iter().any(|(m, _)| m
                == &format!(
                    "Liveness probe failed: command \"test -e {alive_arg}\" exited with code 1"
                )),
            "{unhealthy:?}"
        );

        // Healthy again: the restarted container stays up.
        std::fs::write(&alive, "").expect("liveness file");
        let pod = wait_pod(&pods, "live", Duration::from_secs(20), "Ready", ready).await;
        let count = restarts(&pod);
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(restarts(&pods.get("live").await.expect("get")), count);
    });
}

#[test]
fn tcp_probe_on_a_closed_port_keeps_the_pod_unready() {
    if !require_root_or_skip() {
        return;
    }
    let fixture = Fixture::new("skp-tcp");
    fixture.run(fast_backoff(), |client, node| async move {
        let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
        let closed = json!({"readinessProbe": {
            "tcpSocket": {"port": 9999}, "periodSeconds": 1, "failureThreshold": 1
        }});
        // The control: the echo's TCP port, by name.
        let open = json!({"readinessProbe": {
            "tcpSocket": {"port": "tcp"}, "periodSeconds": 1
        }});
        for spec in [
            echo_pod("closed", &node, &[], closed),
            echo_pod("open", &node, &[], open),
        ] {
            pods.create(&PostParams::default(), &spec)
                .await
                .expect("create pod");
        }
        wait_pod(&pods, "open", Duration::from_secs(20), "Ready", ready).await;
        let pod = wait_pod(&pods, "closed", Duration::from_secs(20), "running", unready).await;
        let ip = pod
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.clone())
            .expect("pod IP");
        let failed = wait_events(&client, "closed", "Unhealthy", "failures", |seen| {
            seen.iter().any(|(_, count)| *count >= 3)
        })
        .await;
        assert_eq!(
            failed[0].0,
            format!("Readiness probe failed: dial tcp {ip}:9999: connect: connection refused")
        );
        let pod = pods.get("closed").await.expect("get");
        assert!(unready(&pod), "still unready after several probes");
        assert_eq!(restarts(&pod), 0);
        assert_eq!(
            pod.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Running")
        );
    });
}

#[test]
fn startup_probe_holds_back_readiness_and_liveness() {
    if !require_root_or_skip() {
        return;
    }
    let fixture = Fixture::new("skp-start");
    let started_file = fixture.state.path().join("started");
    let started_arg = started_file.to_str().expect("utf-8 path").to_owned();
    fixture.run(fast_backoff(), |client, node| async move {
        let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
        // Liveness checks the same file with a threshold of 1: run before the startup probe
        // passed, it would kill the container at once.
        let probes = json!({
            "startupProbe": {
                "exec": {"command": ["test", "-e", started_arg]},
                "periodSeconds": 1, "failureThreshold": 60
            },
            "livenessProbe": {
                "exec": {"command": ["test", "-e", started_arg]},
                "periodSeconds": 1, "failureThreshold": 1
            },
            "readinessProbe": {"httpGet": {"path": "/", "port": 8080}, "periodSeconds": 1}
        });
        let spec = echo_pod("slow", &node, &[], probes);
        pods.create(&PostParams::default(), &spec)
            .await
            .expect("create pod");
        let not_started =
            |p: &Pod| unready(p) && container_status(p).is_some_and(|c| c.started == Some(false));
        wait_pod(
            &pods,
            "slow",
            Duration::from_secs(20),
            "running, not started",
            not_started,
        )
        .await;
        // The echo answers HTTP at once, yet the pod stays unready while starting up.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let pod = pods.get("slow").await.expect("get");
        assert!(not_started(&pod), "{:?}", pod.status);
        assert_eq!(
            restarts(&pod),
            0,
            "liveness must not run before startup passed"
        );
        assert!(
            events(&client, "slow", "Unhealthy")
                .await
                .iter()
                .all(|(m, _)| m.starts_with("Startup probe failed: "))
        );

        std::fs::write(&started_file, "").expect("started file");
        let pod = wait_pod(&pods, "slow", Duration::from_secs(20), "Ready", |p| {
            ready(p) && container_status(p).is_some_and(|c| c.started == Some(true))
        })
        .await;
        assert_eq!(restarts(&pod), 0);
    });
}

#[test]
fn startup_probe_failing_past_its_threshold_restarts_the_container() {
    if !require_root_or_skip() {
        return;
    }
    let fixture = Fixture::new("skp-nostart");
    fixture.run(fast_backoff(), |client, node| async move {
        let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
        let probes = json!({"startupProbe": {
            "httpGet": {"path": "/", "port": 9998}, "periodSeconds": 1, "failureThreshold": 2
        }});
        let spec = echo_pod("never", &node, &[], probes);
        pods.create(&PostParams::default(), &spec)
            .await
            .expect("create pod");
        let pod = wait_pod(&pods, "never", Duration::from_secs(20), "a restart", |p| {
            restarts(p) >= 1
        })
        .await;
        assert!(container_status(&pod).is_some_and(|c| !c.ready));
        let killing = wait_events(&client, "never", "Killing", "a Killing event", |seen| {
            !seen.is_empty()
        })
        .await;
        assert_eq!(
            killing[0].0,
            "Container main failed startup probe, will be restarted"
        );
        let unhealthy = events(&client, "never", "Unhealthy").await;
        assert!(
            unhealthy.iter().any(|(m, _)| m
                .starts_with("Startup probe failed: Get \"http://10.244.7.")
                && m.ends_with(":9998: connect: connection refused")),
            "{unhealthy:?}"
        );
    });
}
