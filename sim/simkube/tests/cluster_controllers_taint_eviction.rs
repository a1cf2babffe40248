//! Taint-based eviction against a running simkube, through the real kube-rs client: new pods
//! get the DefaultTolerationSeconds tolerations; a NoExecute taint evicts the pods that do not
//! tolerate it at once, those tolerating it for a while once that time is up, and none that
//! tolerate it for ever; removing the taint in time cancels the eviction; a node whose Lease
//! went stale evicts pods through its unreachable taint; and the controller can be switched off.

mod cluster_controllers_support;

use std::time::Duration;

use cluster_controllers_support::{create_node, eventually, node, pod};
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use simkube::controllers::Controllers;

async fn start(controllers: Controllers) -> (simkube::Cluster, Client) {
    let cluster = simkube::Cluster::builder()
        .controllers(controllers)
        .node_monitor_grace_period(Duration::from_secs(1))
        .start()
        .await
        .expect("start");
    let client = cluster.client();
    (cluster, client)
}

/// [`start`] with node `n1` registered; also gives the default namespace's pods.
async fn start_with_n1(controllers: Controllers) -> (simkube::Cluster, Client, Api<Pod>) {
    let (cluster, client) = start(controllers).await;
    create_node(&client, &node("n1", "4", "8Gi", json!({}))).await;
    let pods = Api::default_namespaced(client.clone());
    (cluster, client, pods)
}

/// Creates `pods` through `api`.
async fn create_all(api: &Api<Pod>, pods: impl IntoIterator<Item = Pod>) {
    for p in pods {
        api.create(&PostParams::default(), &p)
            .await
            .expect("create");
    }
}

/// A pod bound to `n1` from the start, with these tolerations.
fn bound_pod(name: &str, tolerations: Value) -> Pod {
    pod(name, json!({"nodeName": "n1", "tolerations": tolerations}))
}

async fn taint(client: &Client, taints: Value) {
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"taints": taints}})),
        )
        .await
        .expect("taint n1");
}

/// Whether the pod is being deleted (no kubelet finishes the deletion here) or gone.
async fn evicted(pods: &Api<Pod>, name: &str) -> bool {
    match pods.get_opt(name).await.expect("get pod") {
        None => true,
        Some(p) => p.metadata.deletion_timestamp.is_some(),
    }
}

fn no_execute(key: &str) -> Value {
    json!([{"key": key, "value": "x", "effect": "NoExecute"}])
}

fn tolerate(key: &str, seconds: Option<i64>) -> Value {
    let mut t = json!({"key": key, "operator": "Exists", "effect": "NoExecute"});
    if let Some(s) = seconds {
        t["tolerationSeconds"] = json!(s);
    }
    json!([t])
}

#[tokio::test]
async fn new_pods_get_the_default_toleration_seconds() {
    let (_cluster, client) = start(Controllers::none()).await;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let plain = pods
        .create(&PostParams::default(), &pod("plain", json!({})))
        .await
        .expect("create");
    let summary = |p: &Pod| -> Vec<String> {
        p.spec
            .as_ref()
            .and_then(|s| s.tolerations.clone())
            .unwrap_or_default()
            .iter()
            .map(|t| {
                format!(
                    "{}:{}:{}:{:?}",
                    t.key.clone().unwrap_or_default(),
                    t.operator.clone().unwrap_or_default(),
                    t.effect.clone().unwrap_or_default(),
                    t.toleration_seconds
                )
            })
            .collect()
    };
    assert_eq!(
        summary(&plain),
        [
            "node.kubernetes.io/not-ready:Exists:NoExecute:Some(300)",
            "node.kubernetes.io/unreachable:Exists:NoExecute:Some(300)"
        ]
    );
    let own = pods
        .create(
            &PostParams::default(),
            &pod(
                "own",
                json!({"tolerations": tolerate("node.kubernetes.io/unreachable", Some(7))}),
            ),
        )
        .await
        .expect("create");
    assert_eq!(
        summary(&own),
        [
            "node.kubernetes.io/unreachable:Exists:NoExecute:Some(7)",
            "node.kubernetes.io/not-ready:Exists:NoExecute:Some(300)"
        ]
    );
}

#[tokio::test]
async fn no_execute_taints_evict_by_toleration() {
    let (_cluster, client, pods) = start_with_n1(Controllers {
        taint_eviction: true,
        ..Controllers::none()
    })
    .await;
    create_all(
        &pods,
        [
            bound_pod("intolerant", json!([])),
            bound_pod("brief", tolerate("dedicated", Some(2))),
            bound_pod("forever", tolerate("dedicated", None)),
        ],
    )
    .await;
    // Untainted: nobody moves.
    tokio::time::sleep(Duration::from_millis(500)).await;
    for name in ["intolerant", "brief", "forever"] {
        assert!(
            !evicted(&pods, name).await,
            "{name} evicted without a taint"
        );
    }

    let tainted = tokio::time::Instant::now();
    taint(&client, no_execute("dedicated")).await;
    eventually("the intolerant pod evicted", || async {
        evicted(&pods, "intolerant").await.then_some(())
    })
    .await;
    assert!(
        tainted.elapsed() < Duration::from_secs(2),
        "immediate eviction took {:?}",
        tainted.elapsed()
    );
    let gone = pods.get("intolerant").await.expect("terminating pod");
    let disruption = cluster_controllers_support::condition(&gone, "DisruptionTarget");
    assert_eq!(
        disruption,
        Some((
            "True".into(),
            "DeletionByTaintManager".into(),
            "Taint manager: deleting due to NoExecute taint".into()
        ))
    );
    assert!(!evicted(&pods, "brief").await, "brief still has time");
    eventually("the briefly tolerating pod evicted", || async {
        evicted(&pods, "brief").await.then_some(())
    })
    .await;
    let waited = tainted.elapsed();
    assert!(
        waited >= Duration::from_millis(1900) && waited < Duration::from_secs(5),
        "tolerationSeconds 2 evicted after {waited:?}"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!evicted(&pods, "forever").await, "tolerated for ever");

    let events: Api<Event> = Api::default_namespaced(client.clone());
    let notes: Vec<String> = events
        .list(&ListParams::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("TaintManagerEviction"))
        .filter_map(|e| e.message)
        .collect();
    assert!(
        notes
            .iter()
            .any(|n| n == "Marking for deletion Pod default/intolerant"),
        "{notes:?}"
    );
}

#[tokio::test]
async fn removing_the_taint_in_time_cancels_the_eviction() {
    let (_cluster, client, pods) = start_with_n1(Controllers {
        taint_eviction: true,
        ..Controllers::none()
    })
    .await;
    create_all(&pods, [bound_pod("spared", tolerate("dedicated", Some(2)))]).await;
    taint(&client, no_execute("dedicated")).await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    taint(&client, json!([])).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        !evicted(&pods, "spared").await,
        "the eviction was cancelled"
    );
    let events: Api<Event> = Api::default_namespaced(client.clone());
    let cancelled = eventually("the cancellation event", || async {
        events
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .into_iter()
            .find(|e| e.message.as_deref() == Some("Cancelling deletion of Pod default/spared"))
    })
    .await;
    assert_eq!(cancelled.reason.as_deref(), Some("TaintManagerEviction"));
}

#[tokio::test]
async fn an_unreachable_node_evicts_pods_after_their_toleration() {
    // No Lease is ever renewed: the node lifecycle controller marks the node unreachable after
    // its grace period (1 s) and the unreachable NoExecute taint starts the countdowns.
    let (_cluster, _client, pods) = start_with_n1(Controllers {
        taint_eviction: true,
        node_lifecycle: true,
        ..Controllers::none()
    })
    .await;
    create_all(
        &pods,
        [
            bound_pod("short", tolerate("node.kubernetes.io/unreachable", Some(1))),
            bound_pod("default", json!([])),
        ],
    )
    .await;
    eventually("the short-tolerance pod evicted", || async {
        evicted(&pods, "short").await.then_some(())
    })
    .await;
    // The default 300 s keep the other one for now.
    assert!(!evicted(&pods, "default").await);
}

#[tokio::test]
async fn switched_off_it_evicts_nothing() {
    let (_cluster, client, pods) = start_with_n1(Controllers {
        scheduler: true,
        ..Controllers::none()
    })
    .await;
    create_all(&pods, [bound_pod("stays", json!([]))]).await;
    taint(&client, no_execute("dedicated")).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!evicted(&pods, "stays").await);
}

#[tokio::test]
async fn a_replaced_pod_keeps_its_default_tolerations() {
    let (_cluster, client) = start(Controllers::none()).await;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let created = pods
        .create(&PostParams::default(), &pod("replaced", json!({})))
        .await
        .expect("create");
    // The stored pod written back without its tolerations: the plugin admits updates too, so
    // they come back (and the update is no forbidden removal of tolerations).
    let mut manifest = created.clone();
    manifest.spec.as_mut().expect("spec").tolerations = None;
    let replaced = pods
        .replace("replaced", &PostParams::default(), &manifest)
        .await
        .expect("replace");
    assert_eq!(
        replaced.spec.and_then(|s| s.tolerations).map(|t| t.len()),
        Some(2)
    );
}
