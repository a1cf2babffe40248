//! The cluster controllers around a real node agent (root; skipped with a printed reason only
//! when not root and CI is unset): taints keep pods Pending until they tolerate them, a
//! NoExecute taint evicts the running pods that do not tolerate it, a stopped agent's Node turns
//! Unknown within the grace period and its pods lose readiness, and deleting a namespace stops
//! its pods' processes, removes their network namespaces and then the namespace itself.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, Namespace, Node, Pod};
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use simkube::controllers::Controllers;
use simkube_node::sandbox;
use tether_testkit::{patience, require_root_or_skip};

mod support;
use support::{Fixture, fast_backoff, netns_exists, phase, pod, pod_condition, wait_pod};

fn is_ready(pod: &Pod) -> bool {
    pod_condition(pod, "Ready").is_some_and(|c| c.0 == "True")
}

/// The node's Ready condition: (status, reason).
fn node_ready(node: &Node) -> Option<(String, String)> {
    let c = node
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")?;
    Some((c.status.clone(), c.reason.clone().unwrap_or_default()))
}

fn taint_keys(node: &Node) -> Vec<String> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
        .iter()
        .map(|t| format!("{}:{}", t.key, t.effect))
        .collect()
}

/// Polls `check` until it yields a value; panics naming `what` after `timeout` (scaled by
/// `patience`).
async fn until<T, Fut>(what: &str, timeout: Duration, mut check: impl FnMut() -> Fut) -> T
where
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + patience(timeout);
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn wait_node_ready(client: &kube::Client, node: &str) {
    let nodes: Api<Node> = Api::all(client.clone());
    until(
        "the node to register Ready",
        Duration::from_secs(10),
        || async {
            let n = nodes.get_opt(node).await.expect("get node")?;
            (node_ready(&n)?.0 == "True").then_some(())
        },
    )
    .await;
}

/// The processes in a network namespace, each with its start time (so a reused PID is not
/// mistaken for a survivor).
fn processes_in(netns: &str) -> Vec<(u32, String)> {
    let out = std::process::Command::new("ip")
        .args(["netns", "pids", netns])
        .output()
        .expect("run ip netns pids");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .filter_map(|pid| start_time(pid).map(|t| (pid, t)))
        .collect()
}

/// Field 22 of `/proc/PID/stat` (start time in clock ticks), if the process exists.
fn start_time(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces; the fields after its ')' are plain.
    let rest = stat.rsplit_once(')')?.1;
    rest.split_whitespace().nth(19).map(str::to_owned)
}

fn still_running(processes: &[(u32, String)]) -> Vec<u32> {
    processes
        .iter()
        .filter(|(pid, started)| start_time(*pid).as_ref() == Some(started))
        .map(|(pid, _)| *pid)
        .collect()
}

/// Waits until the pods `names` run and returns, for each, its network namespace and the
/// processes in it.
async fn running_sandboxes(
    pods: &Api<Pod>,
    prefix: &str,
    names: &[&str],
) -> Vec<(String, Vec<(u32, String)>)> {
    let mut sandboxes = Vec::new();
    for name in names {
        let running = wait_pod(pods, name, Duration::from_secs(20), "Running", |p| {
            phase(p) == Some("Running")
        })
        .await;
        let netns = sandbox::names(prefix, &running.metadata.uid.expect("uid")).netns;
        assert!(netns_exists(&netns), "{netns}");
        let processes = processes_in(&netns);
        assert!(!processes.is_empty(), "no process runs in {netns}");
        sandboxes.push((netns, processes));
    }
    sandboxes
}

/// Waits until the object `name` is gone from `api`.
async fn wait_gone<K>(api: &Api<K>, name: &str, timeout: Duration)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    until(&format!("{name} to be gone"), timeout, || async {
        api.get_opt(name)
            .await
            .expect("get")
            .is_none()
            .then_some(())
    })
    .await;
}

/// Taints `node` with `dedicated=db` and `effect`.
async fn taint_dedicated(client: &kube::Client, node: &str, effect: &str) {
    let nodes: Api<Node> = Api::all(client.clone());
    let taint = json!({"spec": {"taints": [
        {"key": "dedicated", "value": "db", "effect": effect}]}});
    nodes
        .patch(node, &PatchParams::default(), &Patch::Merge(&taint))
        .await
        .expect("taint the node");
}

/// Runs `body` on a fresh node fixture (labelled `label`) whose cluster runs `controllers`, once
/// the node is Ready; `body` gets the client, the node's name and its sandbox prefix.
fn run_on_ready_node<F, Fut>(label: &str, controllers: Controllers, body: F)
where
    F: FnOnce(kube::Client, String, String) -> Fut + Send,
    Fut: std::future::Future<Output = ()>,
{
    let fixture = Fixture::new(label);
    let prefix = fixture.prefix.clone();
    fixture.run_with(
        fast_backoff(),
        |builder| builder.controllers(controllers),
        |_| {},
        |client, node| async move {
            wait_node_ready(&client, &node).await;
            body(client, node, prefix).await;
        },
    );
}

/// A sleeper pod for the scheduler to place (no `nodeName`).
fn unbound_sleeper(name: &str, tolerations: serde_json::Value) -> Pod {
    let mut p = pod(name, "", "simkube.dev/sleeper", &[], "Always");
    let spec = p.spec.as_mut().expect("spec");
    spec.node_name = None;
    spec.tolerations = serde_json::from_value(tolerations).expect("tolerations");
    p
}

#[test]
fn untolerated_taints_keep_pods_pending_until_a_toleration_lets_them_run() {
    if !require_root_or_skip() {
        return;
    }
    run_on_ready_node(
        "skn-taint",
        Controllers {
            scheduler: true,
            ..Controllers::none()
        },
        |client, node, prefix| async move {
            taint_dedicated(&client, &node, "NoSchedule").await;

            let pods: Api<Pod> = Api::default_namespaced(client.clone());
            pods.create(&PostParams::default(), &unbound_sleeper("web", json!([])))
                .await
                .expect("create");
            let (status, reason, message) =
                until("PodScheduled=False", Duration::from_secs(10), || async {
                    pod_condition(&pods.get("web").await.ok()?, "PodScheduled")
                        .filter(|c| c.0 == "False")
                })
                .await;
            assert_eq!(
                (status.as_str(), reason.as_str()),
                ("False", "Unschedulable")
            );
            assert!(
                message.starts_with("0/1 nodes are available: ")
                    && message.contains("1 node(s) had untolerated taint {dedicated: db}"),
                "{message}"
            );
            let events: Api<Event> = Api::default_namespaced(client.clone());
            let event = until(
                "the FailedScheduling event",
                Duration::from_secs(10),
                || async {
                    events
                        .list(&ListParams::default())
                        .await
                        .ok()?
                        .items
                        .into_iter()
                        .find(|e| {
                            e.reason.as_deref() == Some("FailedScheduling")
                                && e.involved_object.name.as_deref() == Some("web")
                        })
                },
            )
            .await;
            assert_eq!(event.type_.as_deref(), Some("Warning"));
            assert_eq!(event.message.as_deref(), Some(message.as_str()));

            // It stays Pending: not bound, no sandbox on the node.
            tokio::time::sleep(Duration::from_secs(1)).await;
            let waiting = pods.get("web").await.expect("get");
            assert_eq!(phase(&waiting), Some("Pending"));
            assert_eq!(
                waiting.spec.as_ref().and_then(|s| s.node_name.as_deref()),
                None
            );
            assert!(
                sandbox::list(&prefix).is_empty(),
                "a sandbox for a pending pod"
            );

            // A matching toleration (tolerations may be added to a pod) lets it schedule and
            // run on the agent's node.
            let add = json!([{"op": "add", "path": "/spec/tolerations/-", "value":
                {"key": "dedicated", "operator": "Equal", "value": "db", "effect": "NoSchedule"}}]);
            pods.patch(
                "web",
                &PatchParams::default(),
                &Patch::Json::<()>(serde_json::from_value(add).expect("json patch")),
            )
            .await
            .expect("add a toleration");
            let running = wait_pod(
                &pods,
                "web",
                Duration::from_secs(20),
                "Running and Ready",
                |p| phase(p) == Some("Running") && is_ready(p),
            )
            .await;
            assert_eq!(
                running.spec.as_ref().and_then(|s| s.node_name.as_deref()),
                Some(node.as_str())
            );
            let status = running.status.expect("status");
            assert_eq!(status.host_ip.as_deref(), Some("198.18.0.10"));
            let ip: std::net::Ipv4Addr =
                status.pod_ip.expect("pod IP").parse().expect("IPv4 pod IP");
            assert!(
                "10.244.7.0/24"
                    .parse::<ipnet::Ipv4Net>()
                    .expect("cidr")
                    .contains(&ip),
                "{ip}"
            );
            let uid = running.metadata.uid.expect("uid");
            let netns = sandbox::names(&prefix, &uid).netns;
            assert!(
                !processes_in(&netns).is_empty(),
                "no process runs in {netns}"
            );
            // A second pod tolerating the taint from the start schedules straight away.
            pods.create(
                &PostParams::default(),
                &unbound_sleeper(
                    "tolerant",
                    json!([{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}]),
                ),
            )
            .await
            .expect("create");
            wait_pod(&pods, "tolerant", Duration::from_secs(20), "Running", |p| {
                phase(p) == Some("Running")
            })
            .await;
            for name in ["web", "tolerant"] {
                pods.delete(name, &DeleteParams::default())
                    .await
                    .expect("delete");
            }
            until("the pods to go", Duration::from_secs(20), || async {
                pods.list(&ListParams::default())
                    .await
                    .ok()?
                    .items
                    .is_empty()
                    .then_some(())
            })
            .await;
        },
    );
}

#[test]
fn a_stopped_agent_makes_its_node_unknown_within_the_grace_period() {
    if !require_root_or_skip() {
        return;
    }
    const GRACE: Duration = Duration::from_secs(2);
    let fixture = Fixture::new("skn-stop");
    fixture.run_stoppable(
        fast_backoff(),
        |builder| {
            builder
                .controllers(Controllers {
                    node_lifecycle: true,
                    ..Controllers::none()
                })
                .node_monitor_grace_period(GRACE)
        },
        |_| {},
        |client, node, mut agent| async move {
            wait_node_ready(&client, &node).await;
            let pods: Api<Pod> = Api::default_namespaced(client.clone());
            pods.create(
                &PostParams::default(),
                &pod("web", &node, "simkube.dev/sleeper", &[], "Always"),
            )
            .await
            .expect("create");
            wait_pod(&pods, "web", Duration::from_secs(20), "Ready", is_ready).await;

            // While the agent renews its Lease the node stays Ready, well past the grace period.
            let nodes: Api<Node> = Api::all(client.clone());
            let watched = Instant::now();
            while watched.elapsed() < GRACE * 2 {
                let n = nodes.get(&node).await.expect("node");
                assert_eq!(node_ready(&n).map(|r| r.0).as_deref(), Some("True"));
                assert!(taint_keys(&n).is_empty(), "{:?}", taint_keys(&n));
                tokio::time::sleep(Duration::from_millis(200)).await;
            }

            let stopped = Instant::now();
            agent.stop().await;
            let n = until("the node to turn Unknown", GRACE * 5, || async {
                let n = nodes.get(&node).await.ok()?;
                (node_ready(&n)? == ("Unknown".into(), "NodeStatusUnknown".into())).then_some(n)
            })
            .await;
            let took = stopped.elapsed();
            eprintln!(
                "node {node} turned Unknown {took:?} after its agent stopped (grace period {GRACE:?})"
            );
            // The last renewal came about one renew interval (300 ms) before the stop (half the
            // grace period leaves room for a late renewal on a loaded machine); the controller
            // looks every quarter of the grace period.
            assert!(
                took >= GRACE / 2,
                "Unknown after {took:?}, before the {GRACE:?} grace period could pass"
            );
            assert!(
                took <= patience(GRACE + GRACE / 4 + Duration::from_millis(700)),
                "Unknown only after {took:?} with a grace period of {GRACE:?}"
            );
            assert_eq!(
                taint_keys(&n),
                [
                    "node.kubernetes.io/unreachable:NoSchedule",
                    "node.kubernetes.io/unreachable:NoExecute"
                ]
            );
            let not_ready = wait_pod(&pods, "web", Duration::from_secs(5), "not Ready", |p| {
                pod_condition(p, "Ready").is_some_and(|c| c.0 == "False")
            })
            .await;
            eprintln!(
                "pod web lost readiness {:?} after the agent stopped",
                stopped.elapsed()
            );
            // The pod stays bound to the node (as with a dead kubelet); only its readiness went.
            assert_eq!(
                not_ready.spec.and_then(|s| s.node_name).as_deref(),
                Some(node.as_str())
            );
            agent
        },
    );
}

#[test]
fn deleting_a_namespace_stops_its_pods_and_removes_their_sandboxes() {
    if !require_root_or_skip() {
        return;
    }
    run_on_ready_node(
        "skn-nsdel",
        Controllers {
            namespace: true,
            garbage_collector: true,
            ..Controllers::none()
        },
        |client, node, prefix| async move {
            let namespaces: Api<Namespace> = Api::all(client.clone());
            namespaces
                .create(
                    &PostParams::default(),
                    &serde_json::from_value(json!({"metadata": {"name": "doomed"}}))
                        .expect("namespace"),
                )
                .await
                .expect("create namespace");
            let pods: Api<Pod> = Api::namespaced(client.clone(), "doomed");
            for name in ["a", "b"] {
                let mut p = pod(name, &node, "simkube.dev/sleeper", &[], "Always");
                p.metadata.namespace = Some("doomed".into());
                pods.create(&PostParams::default(), &p)
                    .await
                    .expect("create pod");
            }
            let sandboxes = running_sandboxes(&pods, &prefix, &["a", "b"]).await;
            // A pod of another namespace is left alone.
            let others: Api<Pod> = Api::default_namespaced(client.clone());
            others
                .create(
                    &PostParams::default(),
                    &pod("bystander", &node, "simkube.dev/sleeper", &[], "Always"),
                )
                .await
                .expect("create bystander");
            let bystander = wait_pod(
                &others,
                "bystander",
                Duration::from_secs(20),
                "Running",
                |p| phase(p) == Some("Running"),
            )
            .await;

            let deleted = Instant::now();
            namespaces
                .delete("doomed", &DeleteParams::default())
                .await
                .expect("delete namespace");
            wait_gone(&namespaces, "doomed", Duration::from_secs(30)).await;
            eprintln!(
                "namespace doomed gone {:?} after its deletion",
                deleted.elapsed()
            );
            // The namespace is finalized only once its pods are gone, and the agent confirms a
            // pod's deletion only after stopping its containers and removing its sandbox.
            for (netns, processes) in &sandboxes {
                assert!(!netns_exists(netns), "{netns} is left behind");
                assert_eq!(
                    still_running(processes),
                    Vec::<u32>::new(),
                    "processes of {netns} survived"
                );
            }
            let still = others.get("bystander").await.expect("bystander");
            assert_eq!(still.metadata.uid, bystander.metadata.uid);
            assert_eq!(phase(&still), Some("Running"));
            others
                .delete("bystander", &DeleteParams::default())
                .await
                .expect("delete bystander");
            wait_gone(&others, "bystander", Duration::from_secs(20)).await;
        },
    );
}

#[test]
fn a_no_execute_taint_evicts_running_pods_that_do_not_tolerate_it() {
    if !require_root_or_skip() {
        return;
    }
    run_on_ready_node(
        "skn-noexec",
        Controllers {
            scheduler: true,
            taint_eviction: true,
            ..Controllers::none()
        },
        |client, node, prefix| async move {
            let pods: Api<Pod> = Api::default_namespaced(client.clone());
            pods.create(&PostParams::default(), &unbound_sleeper("web", json!([])))
                .await
                .expect("create");
            pods.create(
                &PostParams::default(),
                &unbound_sleeper(
                    "guard",
                    json!([{"key": "dedicated", "operator": "Exists", "effect": "NoExecute"}]),
                ),
            )
            .await
            .expect("create");
            let sandboxes = running_sandboxes(&pods, &prefix, &["web", "guard"]).await;

            let tainted = Instant::now();
            taint_dedicated(&client, &node, "NoExecute").await;
            // The taint manager deletes `web`; the agent stops it and finishes the deletion.
            wait_gone(&pods, "web", Duration::from_secs(20)).await;
            eprintln!(
                "web evicted and stopped {:?} after the NoExecute taint",
                tainted.elapsed()
            );
            let (web_netns, web_processes) = &sandboxes[0];
            assert!(!netns_exists(web_netns), "{web_netns} is left behind");
            assert_eq!(still_running(web_processes), Vec::<u32>::new());
            let events: Api<Event> = Api::default_namespaced(client.clone());
            let marked = events
                .list(&ListParams::default())
                .await
                .expect("events")
                .items
                .into_iter()
                .any(|e| {
                    e.reason.as_deref() == Some("TaintManagerEviction")
                        && e.message.as_deref() == Some("Marking for deletion Pod default/web")
                });
            assert!(marked, "no TaintManagerEviction event for web");

            // `guard` tolerates the taint for ever and keeps running.
            tokio::time::sleep(Duration::from_secs(1)).await;
            let guard = pods.get("guard").await.expect("guard");
            assert!(guard.metadata.deletion_timestamp.is_none());
            assert_eq!(phase(&guard), Some("Running"));
            let (guard_netns, guard_processes) = &sandboxes[1];
            assert_eq!(
                still_running(guard_processes).len(),
                guard_processes.len(),
                "{guard_netns} lost processes"
            );
            pods.delete("guard", &DeleteParams::default())
                .await
                .expect("delete guard");
            wait_gone(&pods, "guard", Duration::from_secs(20)).await;
        },
    );
}
