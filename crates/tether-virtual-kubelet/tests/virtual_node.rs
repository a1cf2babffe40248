//! The virtual node's life cycle against in-process simkube clusters (a consumer and, as the
//! provider, a second one listening on TCP): registration and Lease, NotReady when the provider
//! stops answering (without the node-lifecycle controller's Unknown), the tunnel's condition,
//! scheduling against the taint and the capacity, spec changes, re-creation and deletion.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt as _};
use serde_json::json;
use simkube::controllers::Controllers;
use tether_virtual_kubelet::{Network, NodeSpec, Timing, VirtualNode};
use tokio::sync::watch;
use tokio::time::Instant;

const NAME: &str = "tether-provider-b";

fn init_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "tether_virtual_kubelet=debug".into()),
        )
        .with_test_writer()
        .try_init();
}

/// Polls `check` every 50 ms until it returns `Some`, or fails the test naming `what`.
/// Returns the value and how long it took.
async fn eventually<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> (T, Duration)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(value) = check().await {
            return (value, start.elapsed());
        }
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn capacity(cpu: &str) -> BTreeMap<String, Quantity> {
    BTreeMap::from([
        ("cpu".into(), Quantity(cpu.into())),
        ("memory".into(), Quantity("8Gi".into())),
        ("pods".into(), Quantity("110".into())),
    ])
}

fn spec() -> NodeSpec {
    NodeSpec {
        name: NAME.into(),
        provider: "provider-b".into(),
        capacity: capacity("2"),
        labels: BTreeMap::from([("topology.kubernetes.io/region".into(), "eu-west".into())]),
        taint: true,
        address: Some("10.244.0.9".into()),
        kubelet_port: Some(10250),
    }
}

/// Production probing, quick Lease renewal (the tests shorten the node-lifecycle grace).
fn timing() -> Timing {
    Timing {
        lease_renew: Duration::from_millis(500),
        status_refresh: Duration::from_secs(5),
        ..Timing::default()
    }
}

async fn consumer(controllers: Controllers) -> (simkube::Cluster, Client) {
    init_logs();
    let cluster = simkube::Cluster::builder()
        .name("consumer")
        .controllers(controllers)
        .node_monitor_grace_period(Duration::from_secs(3))
        .start()
        .await
        .expect("start the consumer");
    let client = cluster.client();
    (cluster, client)
}

async fn provider() -> simkube::Cluster {
    simkube::Cluster::builder()
        .name("provider")
        .start()
        .await
        .expect("start the provider")
}

struct Running {
    node: VirtualNode,
    spec: watch::Sender<NodeSpec>,
    provider: watch::Sender<Option<Client>>,
    network: watch::Sender<Network>,
}

fn spawn(local: &Client, provider: Option<Client>, network: Network) -> Running {
    let (spec_tx, spec_rx) = watch::channel(spec());
    let (provider_tx, provider_rx) = watch::channel(provider);
    let (network_tx, network_rx) = watch::channel(network);
    let node = VirtualNode::spawn(local.clone(), spec_rx, provider_rx, network_rx, timing());
    Running {
        node,
        spec: spec_tx,
        provider: provider_tx,
        network: network_tx,
    }
}

fn condition(node: &Node, type_: &str) -> Option<(String, String, String)> {
    let c = node
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)?;
    Some((
        c.status.clone(),
        c.reason.clone().unwrap_or_default(),
        c.message.clone().unwrap_or_default(),
    ))
}

fn ready(node: &Node) -> Option<(String, String, String)> {
    condition(node, "Ready")
}

fn taint_keys(node: &Node) -> Vec<String> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|t| format!("{}={}:{}", t.key, t.value.unwrap_or_default(), t.effect))
        .collect()
}

/// Waits until the Node's Ready condition has `status` (and `reason` if given).
async fn ready_becomes(
    nodes: &Api<Node>,
    status: &str,
    reason: Option<&str>,
    limit: Duration,
) -> (Node, Duration) {
    eventually(
        &format!("Ready={status} {}", reason.unwrap_or_default()),
        limit,
        || async {
            let node = nodes.get_opt(NAME).await.ok()??;
            let (s, r, _) = ready(&node)?;
            (s == status && reason.is_none_or(|want| want == r)).then_some(node)
        },
    )
    .await
}

/// A node shown NotReady only until the first probe answers is what a node-lifecycle pass can
/// catch and taint `not-ready`, keeping pods off it for a pass after it is Ready. With a
/// provider that answers at once, the first status the Node shows is already Ready=True.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reachable_provider_is_ready_from_the_first_status() {
    use futures::StreamExt as _;
    use kube::runtime::{WatchStreamExt as _, watcher};

    let (_consumer, client) = consumer(Controllers::none()).await;
    let provider = provider().await;
    let nodes: Api<Node> = Api::all(client.clone());
    let config = watcher::Config::default().fields(&format!("metadata.name={NAME}"));
    let mut events = watcher(nodes.clone(), config).applied_objects().boxed();
    // The watch lists before the node task starts, so it sees every version of the Node.
    let listed = tokio::time::timeout(Duration::from_secs(1), events.next()).await;
    assert!(
        listed.is_err(),
        "no Node yet, so nothing to list: {listed:?}"
    );
    let _running = spawn(&client, Some(provider.client()), Some(Ok(())));
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while seen.last().map(String::as_str) != Some("True") {
        let node = tokio::time::timeout_at(deadline, events.next())
            .await
            .unwrap_or_else(|_| panic!("not Ready in 10 s; Ready as seen: {seen:?}"))
            .expect("the watch goes on")
            .expect("a watch event");
        seen.push(ready(&node).map_or_else(|| "none".to_owned(), |r| r.0));
    }
    assert!(
        !seen.iter().any(|s| s == "False"),
        "the Node showed NotReady on its way to Ready: {seen:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registers_the_node_and_renews_its_lease() {
    let (consumer, client) = consumer(Controllers::none()).await;
    let provider = provider().await;
    let running = spawn(&client, Some(provider.client()), Some(Ok(())));
    let nodes: Api<Node> = Api::all(client.clone());
    let (node, took) = ready_becomes(&nodes, "True", None, Duration::from_secs(10)).await;
    println!("Ready after {took:?}");
    assert!(running.node.ready());

    let labels = node.labels();
    for (k, v) in [
        ("tether.dev/type", "virtual-node"),
        ("tether.dev/remote-cluster-id", "provider-b"),
        ("type", "virtual-kubelet"),
        ("kubernetes.io/hostname", NAME),
        ("topology.kubernetes.io/region", "eu-west"),
    ] {
        assert_eq!(labels.get(k).map(String::as_str), Some(v), "label {k}");
    }
    assert_eq!(
        taint_keys(&node),
        ["virtual-node.tether.dev/not-allowed=true:NoExecute"]
    );
    let status = node.status.clone().expect("status");
    assert_eq!(status.capacity, Some(capacity("2")));
    assert_eq!(status.allocatable, Some(capacity("2")));
    let addresses: Vec<String> = status
        .addresses
        .unwrap_or_default()
        .into_iter()
        .map(|a| format!("{}={}", a.type_, a.address))
        .collect();
    assert_eq!(
        addresses,
        ["InternalIP=10.244.0.9", &format!("Hostname={NAME}")]
    );
    let info = status.node_info.expect("nodeInfo");
    assert!(
        info.kubelet_version.contains("tether"),
        "{}",
        info.kubelet_version
    );
    assert_eq!(
        status
            .daemon_endpoints
            .and_then(|d| d.kubelet_endpoint)
            .map(|e| e.port),
        Some(10250)
    );
    for type_ in [
        "MemoryPressure",
        "DiskPressure",
        "PIDPressure",
        "NetworkUnavailable",
    ] {
        assert_eq!(
            condition(&node, type_).map(|c| c.0).as_deref(),
            Some("False"),
            "{type_}"
        );
    }
    // Metadata and spec are ours, through server-side apply.
    assert!(
        node.managed_fields()
            .iter()
            .any(|m| m.manager.as_deref() == Some("tether-virtual-kubelet")
                && m.operation.as_deref() == Some("Apply")),
        "{:?}",
        node.managed_fields()
    );

    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let renewed = |lease: &Lease| lease.spec.as_ref().and_then(|s| s.renew_time.clone());
    let (first, _) = eventually("the Lease", Duration::from_secs(5), || async {
        leases.get_opt(NAME).await.ok()?
    })
    .await;
    let spec_of = first.spec.clone().expect("lease spec");
    assert_eq!(spec_of.holder_identity.as_deref(), Some(NAME));
    assert_eq!(spec_of.lease_duration_seconds, Some(40));
    let owner = &first.owner_references()[0];
    assert_eq!((owner.kind.as_str(), owner.name.as_str()), ("Node", NAME));
    assert_eq!(Some(&owner.uid), node.metadata.uid.as_ref());
    let before = renewed(&first).expect("renewTime");
    eventually("the Lease renewed", Duration::from_secs(5), || async {
        let now = renewed(&leases.get(NAME).await.ok()?)?;
        (now.0 > before.0).then_some(())
    })
    .await;

    // At rest: the Lease every renewal, the Node not at all until its status refresh (5 s).
    consumer.clear_requests();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let writes = |path: &str| {
        consumer
            .requests()
            .iter()
            .filter(|r| r.method != "GET" && r.path == path)
            .count()
    };
    let node_writes =
        writes(&format!("/api/v1/nodes/{NAME}")) + writes(&format!("/api/v1/nodes/{NAME}/status"));
    let lease_writes = writes(&format!(
        "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{NAME}"
    ));
    println!("in 2 s at rest: {node_writes} Node writes, {lease_writes} Lease writes");
    assert_eq!(node_writes, 0);
    assert!(
        (2..=6).contains(&lease_writes),
        "{lease_writes} Lease writes"
    );

    running.node.stop(false).await.expect("stop");
    let kept = nodes.get_opt(NAME).await.expect("get");
    let kept = kept.expect("stop(false) keeps the Node");

    // A restarted controller adopts the Node: Ready keeps its transition time.
    let transition = |node: &Node| {
        let c = node.status.as_ref()?.conditions.as_ref()?;
        let ready = c.iter().find(|c| c.type_ == "Ready")?;
        Some((
            ready.last_transition_time.clone()?.0,
            ready.last_heartbeat_time.clone()?.0,
        ))
    };
    let (since, beat) = transition(&kept).expect("Ready times");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let again = spawn(&client, Some(provider.client()), Some(Ok(())));
    let (node, _) = eventually("a new heartbeat", Duration::from_secs(5), || async {
        let node = nodes.get(NAME).await.ok()?;
        (transition(&node)?.1 > beat).then_some(node)
    })
    .await;
    assert_eq!(ready(&node).map(|r| r.0).as_deref(), Some("True"));
    assert_eq!(transition(&node).map(|t| t.0), Some(since));
    assert_eq!(node.uid(), kept.uid(), "the same Node");
    again.node.stop(false).await.expect("stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transient_api_errors_are_retried() {
    let (consumer, client) = consumer(Controllers::none()).await;
    let provider = provider().await;
    let error = || simkube::error::ApiError::internal("injected");
    consumer.fail_next("patch", "nodes", 3, error());
    consumer.fail_next("patch", "leases", 3, error());
    let running = spawn(&client, Some(provider.client()), Some(Ok(())));
    let nodes: Api<Node> = Api::all(client.clone());
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let (_, took) = ready_becomes(&nodes, "True", None, Duration::from_secs(10)).await;
    println!("Ready after three failed writes: {took:?}");
    eventually("the Lease", Duration::from_secs(10), || async {
        leases.get_opt(NAME).await.ok()?
    })
    .await;
    consumer.fail_next("patch", "nodes/status", 3, error());
    running.spec.send_modify(|s| s.capacity = capacity("3"));
    let (_, took) = eventually("the new capacity", Duration::from_secs(10), || async {
        let node = nodes.get(NAME).await.ok()?;
        let cpu = node.status?.capacity?.get("cpu")?.0.clone();
        (cpu == "3").then_some(())
    })
    .await;
    println!("capacity written after three failed status writes: {took:?}");
    running.node.stop(false).await.expect("stop");
}

/// Asserts for `span` that the node stays NotReady by our own condition: never Unknown, never
/// tainted unreachable by the node-lifecycle controller.
async fn stays_not_ready_by_us(nodes: &Api<Node>, reason: &str, span: Duration) {
    let end = Instant::now() + span;
    while Instant::now() < end {
        let node = nodes.get(NAME).await.expect("get node");
        let (status, why, message) = ready(&node).expect("Ready");
        assert_eq!(
            (status.as_str(), why.as_str()),
            ("False", reason),
            "{message}"
        );
        assert!(
            !taint_keys(&node)
                .iter()
                .any(|t| t.starts_with("node.kubernetes.io/unreachable")),
            "{:?}",
            taint_keys(&node)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_outage_turns_ready_false_without_going_unknown() {
    let (_consumer, client) = consumer(Controllers {
        node_lifecycle: true,
        ..Controllers::none()
    })
    .await;
    let provider = provider().await;
    let running = spawn(&client, Some(provider.client()), None);
    let nodes: Api<Node> = Api::all(client.clone());
    ready_becomes(&nodes, "True", None, Duration::from_secs(10)).await;

    // A provider that hangs: every request waits far longer than the probe's timeout.
    provider.set_latency(Duration::from_secs(3600));
    let (node, took) = ready_becomes(
        &nodes,
        "False",
        Some("ProviderUnreachable"),
        Duration::from_secs(10),
    )
    .await;
    println!("hanging provider: NotReady after {took:?}");
    let (_, _, message) = ready(&node).expect("Ready");
    assert!(
        message.contains("provider-b") && message.contains("no answer within"),
        "{message}"
    );
    assert!(!running.node.ready());
    // Longer than the node-lifecycle grace (3 s): the Lease keeps the node ours.
    stays_not_ready_by_us(&nodes, "ProviderUnreachable", Duration::from_secs(5)).await;
    provider.set_latency(Duration::ZERO);
    let (_, took) = ready_becomes(&nodes, "True", None, Duration::from_secs(10)).await;
    println!("hanging provider back: Ready after {took:?}");
    assert!(running.node.ready());

    // A provider that is gone: connections are refused.
    let addr = provider.addr();
    provider.shutdown().await;
    let (node, took) = ready_becomes(
        &nodes,
        "False",
        Some("ProviderUnreachable"),
        Duration::from_secs(10),
    )
    .await;
    println!("stopped provider: NotReady after {took:?}");
    println!("message: {}", ready(&node).expect("Ready").2);
    stays_not_ready_by_us(&nodes, "ProviderUnreachable", Duration::from_secs(1)).await;
    // It comes back on the same address (with new credentials, as after a re-install).
    let back = simkube::Cluster::builder()
        .name("provider")
        .bind(addr)
        .start()
        .await
        .expect("restart the provider");
    running.provider.send_replace(Some(back.client()));
    let (_, took) = ready_becomes(&nodes, "True", None, Duration::from_secs(10)).await;
    println!("stopped provider back: Ready after {took:?}");

    // No client at all: NotReady, and the reason says why.
    running.provider.send_replace(None);
    let (node, _) = ready_becomes(
        &nodes,
        "False",
        Some("ProviderUnknown"),
        Duration::from_secs(5),
    )
    .await;
    assert!(ready(&node).expect("Ready").2.contains("no credentials"));
    running.node.stop(false).await.expect("stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tunnel_down_is_network_unavailable_and_not_ready() {
    let (_consumer, client) = consumer(Controllers::none()).await;
    let provider = provider().await;
    let running = spawn(&client, Some(provider.client()), Some(Ok(())));
    let nodes: Api<Node> = Api::all(client.clone());
    let (node, _) = ready_becomes(&nodes, "True", None, Duration::from_secs(10)).await;
    let network = condition(&node, "NetworkUnavailable").expect("NetworkUnavailable");
    assert_eq!(
        (network.0.as_str(), network.1.as_str()),
        ("False", "TunnelUp")
    );

    running
        .network
        .send_replace(Some(Err("no WireGuard handshake for 3m".into())));
    let (node, took) =
        ready_becomes(&nodes, "False", Some("TunnelDown"), Duration::from_secs(5)).await;
    println!("tunnel down: NotReady after {took:?}");
    let (status, reason, message) = condition(&node, "NetworkUnavailable").expect("condition");
    assert_eq!((status.as_str(), reason.as_str()), ("True", "TunnelDown"));
    assert!(
        message.contains("no WireGuard handshake for 3m"),
        "{message}"
    );
    assert!(!running.node.ready());

    running.network.send_replace(Some(Ok(())));
    let (node, _) = ready_becomes(&nodes, "True", None, Duration::from_secs(5)).await;
    assert_eq!(
        condition(&node, "NetworkUnavailable").map(|c| (c.0, c.1)),
        Some(("False".into(), "TunnelUp".into()))
    );
    running.node.stop(false).await.expect("stop");
}

fn pod(name: &str, tolerate: bool, on_virtual_node: bool) -> Pod {
    let mut spec = json!({
        "containers": [{"name": "c", "image": "nginx",
            "resources": {"requests": {"cpu": "1", "memory": "64Mi"}}}]
    });
    if tolerate {
        spec["tolerations"] = json!([{"key": "virtual-node.tether.dev/not-allowed",
            "operator": "Exists", "effect": "NoExecute"}]);
    }
    if on_virtual_node {
        spec["nodeSelector"] = json!({"tether.dev/type": "virtual-node"});
    }
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": spec,
    }))
    .expect("pod")
}

/// An ordinary Ready node with room for anything the test asks.
async fn ordinary_node(client: &Client) {
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "worker", "labels": {"kubernetes.io/hostname": "worker"}},
    }))
    .expect("node");
    nodes
        .create(&PostParams::default(), &node)
        .await
        .expect("create worker");
    let status = json!({"status": {
        "capacity": {"cpu": "8", "memory": "16Gi", "pods": "110"},
        "allocatable": {"cpu": "8", "memory": "16Gi", "pods": "110"},
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
            "message": "kubelet is posting ready status"}]
    }});
    nodes
        .patch_status("worker", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("worker status");
}

fn node_of(pod: &Pod) -> Option<String> {
    pod.spec
        .as_ref()?
        .node_name
        .clone()
        .filter(|n| !n.is_empty())
}

/// The pod's `PodScheduled=False` message, once the scheduler gave up on it.
async fn unschedulable(pods: &Api<Pod>, name: &str) -> String {
    eventually(
        &format!("{name} unschedulable"),
        Duration::from_secs(10),
        || async {
            let pod = pods.get(name).await.ok()?;
            let c = pod
                .status?
                .conditions?
                .into_iter()
                .find(|c| c.type_ == "PodScheduled" && c.status == "False")?;
            c.message
        },
    )
    .await
    .0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduler_respects_the_taint_and_the_capacity() {
    let (_consumer, client) = consumer(Controllers {
        scheduler: true,
        ..Controllers::none()
    })
    .await;
    let provider = provider().await;
    let running = spawn(&client, Some(provider.client()), Some(Ok(())));
    let nodes: Api<Node> = Api::all(client.clone());
    ready_becomes(&nodes, "True", None, Duration::from_secs(10)).await;
    ordinary_node(&client).await;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());

    // Without the toleration: the ordinary node, and never the virtual node even when asked.
    pods.create(&PostParams::default(), &pod("plain", false, false))
        .await
        .expect("create");
    let (bound, _) = eventually("plain bound", Duration::from_secs(10), || async {
        node_of(&pods.get("plain").await.ok()?)
    })
    .await;
    assert_eq!(bound, "worker");
    pods.create(&PostParams::default(), &pod("intolerant", false, true))
        .await
        .expect("create");
    let message = unschedulable(&pods, "intolerant").await;
    assert!(
        message.contains("virtual-node.tether.dev/not-allowed"),
        "{message}"
    );

    // With it: two of 1 CPU fit the virtual node's 2 CPUs, the third does not.
    for name in ["offloaded-1", "offloaded-2"] {
        pods.create(&PostParams::default(), &pod(name, true, true))
            .await
            .expect("create");
        let (bound, _) = eventually(
            &format!("{name} bound"),
            Duration::from_secs(10),
            || async { node_of(&pods.get(name).await.ok()?) },
        )
        .await;
        assert_eq!(bound, NAME);
    }
    pods.create(&PostParams::default(), &pod("offloaded-3", true, true))
        .await
        .expect("create");
    let message = unschedulable(&pods, "offloaded-3").await;
    assert!(message.contains("Insufficient cpu"), "{message}");
    let events: Api<Event> = Api::default_namespaced(client.clone());
    let (failed, _) = eventually(
        "a FailedScheduling event",
        Duration::from_secs(5),
        || async {
            events
                .list(&ListParams::default())
                .await
                .ok()?
                .items
                .into_iter()
                .find(|e| {
                    e.involved_object.name.as_deref() == Some("offloaded-3")
                        && e.reason.as_deref() == Some("FailedScheduling")
                })
        },
    )
    .await;
    assert!(
        failed
            .message
            .unwrap_or_default()
            .contains("Insufficient cpu"),
        "the event names the short resource"
    );
    assert!(node_of(&pods.get("intolerant").await.expect("get")).is_none());
    running.node.stop(false).await.expect("stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spec_changes_recreation_and_deletion() {
    let (_consumer, client) = consumer(Controllers {
        garbage_collector: true,
        ..Controllers::none()
    })
    .await;
    let provider = provider().await;
    let running = spawn(&client, Some(provider.client()), Some(Ok(())));
    let nodes: Api<Node> = Api::all(client.clone());
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let (node, _) = ready_becomes(&nodes, "True", None, Duration::from_secs(10)).await;
    let first_uid = node.uid().expect("uid");

    // Capacity, labels and taint follow the spec.
    running.spec.send_modify(|s| {
        s.capacity = capacity("8");
        s.labels.insert("tether.dev/test".into(), "changed".into());
        s.taint = false;
    });
    let (node, took) = eventually(
        "the new spec on the Node",
        Duration::from_secs(5),
        || async {
            let node = nodes.get(NAME).await.ok()?;
            let cpu = node
                .status
                .as_ref()?
                .capacity
                .as_ref()?
                .get("cpu")?
                .0
                .clone();
            (cpu == "8"
                && node.labels().get("tether.dev/test").map(String::as_str) == Some("changed"))
            .then_some(node)
        },
    )
    .await;
    println!("spec change applied after {took:?}");
    assert!(took < Duration::from_secs(2), "{took:?}");
    assert!(taint_keys(&node).is_empty(), "{:?}", taint_keys(&node));
    assert_eq!(
        node.status
            .as_ref()
            .and_then(|s| s.allocatable.as_ref())
            .and_then(|a| a.get("cpu")),
        Some(&Quantity("8".into()))
    );

    // Someone deletes the Node: it comes back, with a Lease that names the new one.
    nodes
        .delete(NAME, &DeleteParams::default())
        .await
        .expect("delete by hand");
    let (node, took) = eventually("the Node re-created", Duration::from_secs(5), || async {
        let node = nodes.get_opt(NAME).await.ok()??;
        (node.uid().as_deref() != Some(first_uid.as_str()) && ready(&node)?.0 == "True")
            .then_some(node)
    })
    .await;
    println!("deleted Node re-created and Ready after {took:?}");
    assert_eq!(
        node.status
            .as_ref()
            .and_then(|s| s.capacity.as_ref())
            .and_then(|c| c.get("cpu")),
        Some(&Quantity("8".into()))
    );
    let new_uid = node.uid().expect("uid");
    eventually(
        "the Lease owned by the new Node",
        Duration::from_secs(5),
        || async {
            let lease = leases.get_opt(NAME).await.ok()??;
            (lease.owner_references().first()?.uid == new_uid).then_some(())
        },
    )
    .await;

    // stop(true) removes both, and nothing brings them back.
    running.node.stop(true).await.expect("stop and delete");
    assert!(nodes.get_opt(NAME).await.expect("get").is_none());
    assert!(leases.get_opt(NAME).await.expect("get").is_none());
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        nodes.get_opt(NAME).await.expect("get").is_none(),
        "re-created after stop"
    );
}
