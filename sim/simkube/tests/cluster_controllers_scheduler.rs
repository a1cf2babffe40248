//! The scheduler against a running simkube through the real kube-rs client: spreading,
//! taints and tolerations, resource requests, node selectors, the `PodScheduled` condition and
//! the `Scheduled`/`FailedScheduling` events.

mod cluster_controllers_support;

use std::collections::BTreeMap;

use cluster_controllers_support::{
    cluster, condition, create_node, eventually, node, node_of, pod,
};
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt as _};
use serde_json::json;

async fn events_for(client: &Client, pod: &str, reason: &str) -> Vec<String> {
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    events
        .list(&ListParams::default())
        .await
        .expect("list events")
        .items
        .into_iter()
        .filter(|e| {
            e.involved_object.name.as_deref() == Some(pod) && e.reason.as_deref() == Some(reason)
        })
        .map(|e| e.message.unwrap_or_default())
        .collect()
}

async fn bound_node(pods: &Api<Pod>, name: &str) -> String {
    eventually(&format!("{name} bound"), || async {
        node_of(&pods.get(name).await.ok()?)
    })
    .await
}

#[tokio::test]
async fn pods_spread_over_nodes_and_get_a_scheduled_event() {
    let (_cluster, client) = cluster().await;
    create_node(&client, &node("n1", "2", "4Gi", json!({}))).await;
    create_node(&client, &node("n2", "2", "4Gi", json!({}))).await;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let requests = json!({"containers": [{"name": "c", "image": "nginx",
        "resources": {"requests": {"cpu": "500m", "memory": "256Mi"}}}]});
    let mut per_node: BTreeMap<String, usize> = BTreeMap::new();
    for i in 0..4 {
        let name = format!("web-{i}");
        pods.create(&PostParams::default(), &pod(&name, requests.clone()))
            .await
            .expect("create pod");
        let node = bound_node(&pods, &name).await;
        *per_node.entry(node).or_default() += 1;
    }
    assert_eq!(
        per_node,
        BTreeMap::from([("n1".into(), 2), ("n2".into(), 2)])
    );
    let bound = pods.get("web-0").await.expect("get");
    let (status, _, _) = condition(&bound, "PodScheduled").expect("PodScheduled");
    assert_eq!(status, "True");
    let node = node_of(&bound).expect("bound");
    let messages = eventually("Scheduled event", || async {
        let m = events_for(&client, "web-0", "Scheduled").await;
        (!m.is_empty()).then_some(m)
    })
    .await;
    assert_eq!(
        messages,
        [format!("Successfully assigned default/web-0 to {node}")]
    );
}

#[tokio::test]
async fn untolerated_taint_keeps_pods_pending_until_tolerated_or_removed() {
    let (_cluster, client) = cluster().await;
    let taint =
        json!({"spec": {"taints": [{"key": "dedicated", "value": "db", "effect": "NoSchedule"}]}});
    create_node(&client, &node("n1", "2", "4Gi", taint)).await;
    create_node(
        &client,
        &node("n2", "2", "4Gi", json!({"spec": {"unschedulable": true}})),
    )
    .await;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    pods.create(&PostParams::default(), &pod("plain", json!({})))
        .await
        .expect("create");
    let (status, reason, message) = eventually("PodScheduled=False", || async {
        condition(&pods.get("plain").await.ok()?, "PodScheduled")
    })
    .await;
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "Unschedulable")
    );
    assert_eq!(
        message,
        "0/2 nodes are available: 1 node(s) had untolerated taint {dedicated: db}, \
         1 node(s) were unschedulable. preemption: 0/2 nodes are available: \
         2 Preemption is not helpful for scheduling."
    );
    let failed = eventually("FailedScheduling event", || async {
        let m = events_for(&client, "plain", "FailedScheduling").await;
        (!m.is_empty()).then_some(m)
    })
    .await;
    assert_eq!(failed[0], message);
    assert!(node_of(&pods.get("plain").await.expect("get")).is_none());

    let tolerant = json!({"tolerations": [{"key": "dedicated", "operator": "Equal", "value": "db", "effect": "NoSchedule"}]});
    pods.create(&PostParams::default(), &pod("tolerant", tolerant))
        .await
        .expect("create");
    assert_eq!(bound_node(&pods, "tolerant").await, "n1");
    assert!(node_of(&pods.get("plain").await.expect("get")).is_none());

    // Removing the taint is a node change: the pending pod is retried and lands.
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"taints": null}})),
        )
        .await
        .expect("untaint");
    assert_eq!(bound_node(&pods, "plain").await, "n1");
}

#[tokio::test]
async fn requests_beyond_allocatable_stay_pending_until_a_node_fits() {
    let (_cluster, client) = cluster().await;
    create_node(&client, &node("small", "1", "1Gi", json!({}))).await;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let big = json!({"containers": [{"name": "c", "image": "nginx",
        "resources": {"requests": {"cpu": "3", "memory": "512Mi"}}}]});
    pods.create(&PostParams::default(), &pod("big", big))
        .await
        .expect("create");
    let (_, _, message) = eventually("unschedulable", || async {
        condition(&pods.get("big").await.ok()?, "PodScheduled").filter(|c| c.0 == "False")
    })
    .await;
    assert_eq!(
        message,
        "0/1 nodes are available: 1 Insufficient cpu. preemption: 0/1 nodes are available: \
         1 No preemption victims found for incoming pod."
    );
    create_node(&client, &node("large", "4", "8Gi", json!({}))).await;
    assert_eq!(bound_node(&pods, "big").await, "large");
}

#[tokio::test]
async fn node_selector_and_affinity_pick_the_matching_node() {
    let (_cluster, client) = cluster().await;
    create_node(
        &client,
        &node(
            "a",
            "2",
            "4Gi",
            json!({"metadata": {"labels": {"zone": "a"}}}),
        ),
    )
    .await;
    create_node(
        &client,
        &node(
            "b",
            "2",
            "4Gi",
            json!({"metadata": {"labels": {"zone": "b"}}}),
        ),
    )
    .await;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    pods.create(
        &PostParams::default(),
        &pod("sel", json!({"nodeSelector": {"zone": "b"}})),
    )
    .await
    .expect("create");
    let affinity = json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["b"]}]}]}}}});
    pods.create(&PostParams::default(), &pod("aff", affinity))
        .await
        .expect("create");
    assert_eq!(bound_node(&pods, "sel").await, "b");
    assert_eq!(bound_node(&pods, "aff").await, "a");
    let other = pod("other", json!({"schedulerName": "my-scheduler"}));
    pods.create(&PostParams::default(), &other)
        .await
        .expect("create");
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let other = pods.get("other").await.expect("get");
    assert!(
        node_of(&other).is_none(),
        "another scheduler's pod was bound"
    );
    assert_eq!(other.name_any(), "other");
}

/// Bindings run in the background while the next pods are placed, so a burst is only right if
/// each pod counts on its node from the moment it is chosen: two 1-CPU nodes take exactly ten
/// 100m pods each, and the rest stay pending with the real message.
#[tokio::test]
async fn a_burst_fills_nodes_to_allocatable_while_bindings_are_in_flight() {
    let (_cluster, client) = cluster().await;
    create_node(&client, &node("n1", "1", "4Gi", json!({}))).await;
    create_node(&client, &node("n2", "1", "4Gi", json!({}))).await;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let requests = json!({"containers": [{"name": "c", "image": "nginx",
        "resources": {"requests": {"cpu": "100m", "memory": "16Mi"}}}]});
    let creates = (0..25).map(|i| {
        let (pods, p) = (pods.clone(), pod(&format!("burst-{i}"), requests.clone()));
        async move { pods.create(&PostParams::default(), &p).await }
    });
    for created in futures::future::join_all(creates).await {
        created.expect("create pod");
    }
    let (per_node, pending) = eventually("20 bound and 5 unschedulable", || async {
        let listed = pods.list(&ListParams::default()).await.ok()?;
        let mut per_node: BTreeMap<String, usize> = BTreeMap::new();
        let mut pending = Vec::new();
        for p in &listed.items {
            match node_of(p) {
                Some(n) => *per_node.entry(n).or_default() += 1,
                None => pending.push(condition(p, "PodScheduled").filter(|c| c.0 == "False")?),
            }
        }
        (per_node.values().sum::<usize>() == 20 && pending.len() == 5)
            .then_some((per_node, pending))
    })
    .await;
    assert_eq!(
        per_node,
        BTreeMap::from([("n1".into(), 10), ("n2".into(), 10)])
    );
    for (_, reason, message) in pending {
        assert_eq!(reason, "Unschedulable");
        assert_eq!(
            message,
            "0/2 nodes are available: 2 Insufficient cpu. preemption: 0/2 nodes are available: \
             2 No preemption victims found for incoming pod."
        );
    }
    // Every bound pod got its Scheduled event from its binding.
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    eventually("20 Scheduled events", || async {
        let listed = events.list(&ListParams::default()).await.ok()?;
        let scheduled = listed
            .items
            .iter()
            .filter(|e| e.reason.as_deref() == Some("Scheduled"))
            .count();
        (scheduled == 20).then_some(())
    })
    .await;
}
