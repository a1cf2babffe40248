//! DaemonSets against a running simkube with every controller, fake nodes and a stand-in
//! kubelet, through the real kube-rs client and the real kubectl: one pod per eligible node
//! (taints only when tolerated), nodes coming and going, a rolling update one node at a time
//! that `kubectl rollout status` follows to success, and garbage collection of the pods.

mod cluster_controllers_support;
mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use cluster_controllers_support::{cluster, create_node, eventually, fake_kubelet, node, node_of};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt as _};
use serde_json::json;
use simkube::controllers::workloads::daemonset::REVISION_HASH;

fn daemonset(name: &str, image: &str) -> DaemonSet {
    serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": name},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "c", "image": image}]}
            }
        }
    }))
    .expect("daemonset")
}

/// The live (not terminating) pods of the DaemonSet, by node.
async fn pods_by_node(client: &Client, app: &str) -> BTreeMap<String, Vec<Pod>> {
    let mut out: BTreeMap<String, Vec<Pod>> = BTreeMap::new();
    let pods = Api::<Pod>::default_namespaced(client.clone())
        .list(&ListParams::default().labels(&format!("app={app}")))
        .await
        .expect("list pods")
        .items;
    for pod in pods {
        if pod.metadata.deletion_timestamp.is_none() {
            out.entry(node_of(&pod).unwrap_or_default())
                .or_default()
                .push(pod);
        }
    }
    out
}

fn nodes_of(map: &BTreeMap<String, Vec<Pod>>) -> Vec<String> {
    map.iter()
        .filter(|(_, pods)| pods.len() == 1)
        .map(|(node, _)| node.clone())
        .collect()
}

fn is_ready(pod: &Pod) -> bool {
    cluster_controllers_support::condition(pod, "Ready").is_some_and(|c| c.0 == "True")
}

async fn three_nodes_one_tainted(client: &Client) {
    create_node(client, &node("n1", "4", "8Gi", json!({}))).await;
    create_node(client, &node("n2", "4", "8Gi", json!({}))).await;
    let taint = json!({"spec": {"taints": [
        {"key": "dedicated", "value": "gateway", "effect": "NoSchedule"}]}});
    create_node(client, &node("n3", "4", "8Gi", taint)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_run_on_every_eligible_node_and_follow_nodes() {
    let (_cluster, client) = cluster().await;
    let _kubelet = fake_kubelet(client.clone(), Duration::ZERO);
    three_nodes_one_tainted(&client).await;
    let sets: Api<DaemonSet> = Api::default_namespaced(client.clone());
    let created = sets
        .create(&PostParams::default(), &daemonset("agent", "agent:1"))
        .await
        .expect("create");
    // The server defaults the strategy as kube-apiserver does.
    let strategy = created
        .spec
        .expect("spec")
        .update_strategy
        .expect("strategy");
    assert_eq!(strategy.type_.as_deref(), Some("RollingUpdate"));
    let rolling = strategy.rolling_update.expect("rollingUpdate");
    assert_eq!(
        serde_json::to_value((&rolling.max_unavailable, &rolling.max_surge)).expect("json"),
        json!([1, 0])
    );

    let on = eventually("pods on n1 and n2", || async {
        let map = pods_by_node(&client, "agent").await;
        let ready = map.values().flatten().all(is_ready);
        (ready && nodes_of(&map) == ["n1", "n2"] && map.len() == 2).then_some(map)
    })
    .await;
    let pod = &on["n1"][0];
    let owner = &pod.metadata.owner_references.as_ref().expect("owner")[0];
    assert_eq!(
        (owner.kind.as_str(), owner.controller),
        ("DaemonSet", Some(true))
    );
    assert!(pod.labels().contains_key(REVISION_HASH));
    let terms =
        serde_json::to_value(pod.spec.as_ref().expect("spec").affinity.as_ref()).expect("json");
    assert_eq!(
        terms["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
            [0]["matchFields"],
        json!([{"key": "metadata.name", "operator": "In", "values": ["n1"]}])
    );
    let tolerations: Vec<String> = pod
        .spec
        .as_ref()
        .and_then(|s| s.tolerations.clone())
        .unwrap_or_default()
        .into_iter()
        .filter_map(|t| Some(format!("{}:{}", t.key?, t.effect?)))
        .collect();
    assert!(tolerations.contains(&"node.kubernetes.io/unschedulable:NoSchedule".into()));
    assert!(tolerations.contains(&"node.kubernetes.io/not-ready:NoExecute".into()));

    let status = eventually("status settles", || async {
        let s = sets.get("agent").await.ok()?.status?;
        (s.number_available == Some(2)).then_some(s)
    })
    .await;
    assert_eq!(
        (
            status.desired_number_scheduled,
            status.current_number_scheduled,
            status.number_ready,
            status.updated_number_scheduled,
            status.number_unavailable,
            status.number_misscheduled,
            status.observed_generation,
        ),
        (2, 2, 2, Some(2), Some(0), 0, Some(1))
    );

    // Tolerating the taint brings the pod to n3 too.
    let tolerate = json!({"spec": {"template": {"spec": {"tolerations": [
        {"key": "dedicated", "operator": "Equal", "value": "gateway", "effect": "NoSchedule"}]}}}});
    sets.patch("agent", &PatchParams::default(), &Patch::Merge(&tolerate))
        .await
        .expect("tolerate");
    eventually("pods on all three nodes", || async {
        let map = pods_by_node(&client, "agent").await;
        (nodes_of(&map) == ["n1", "n2", "n3"] && map.len() == 3).then_some(())
    })
    .await;

    // A new node gets a pod; a deleted one loses it.
    create_node(&client, &node("n4", "4", "8Gi", json!({}))).await;
    eventually("a pod on the new node", || async {
        nodes_of(&pods_by_node(&client, "agent").await)
            .contains(&"n4".to_owned())
            .then_some(())
    })
    .await;
    Api::<Node>::all(client.clone())
        .delete("n4", &DeleteParams::default())
        .await
        .expect("delete node");
    eventually("the deleted node's pod is gone", || async {
        let map = pods_by_node(&client, "agent").await;
        (!map.contains_key("n4")).then_some(())
    })
    .await;

    // A node that stops being eligible (a NoExecute taint the pods do not tolerate) loses it.
    let taint = json!({"spec": {"taints": [
        {"key": "dedicated", "value": "gateway", "effect": "NoSchedule"},
        {"key": "drain", "effect": "NoExecute"}]}});
    Api::<Node>::all(client.clone())
        .patch("n3", &PatchParams::default(), &Patch::Merge(&taint))
        .await
        .expect("taint n3");
    eventually("the ineligible node's pod is gone", || async {
        let map = pods_by_node(&client, "agent").await;
        (nodes_of(&map) == ["n1", "n2"] && map.len() == 2).then_some(())
    })
    .await;
    // The terminating pod counts as misscheduled until it is gone, as upstream.
    eventually("desired drops to two, nothing misscheduled", || async {
        let s = sets.get("agent").await.ok()?.status?;
        (s.desired_number_scheduled == 2
            && s.current_number_scheduled == 2
            && s.number_misscheduled == 0)
            .then_some(s)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_change_rolls_one_node_at_a_time_and_kubectl_sees_it_done() {
    if !support::kubectl_available() {
        return;
    }
    let (cluster, client) = cluster().await;
    let _kubelet = fake_kubelet(client.clone(), Duration::from_millis(400));
    three_nodes_one_tainted(&client).await;
    let sets: Api<DaemonSet> = Api::default_namespaced(client.clone());
    sets.create(&PostParams::default(), &daemonset("agent", "agent:1"))
        .await
        .expect("create");
    let kubectl = support::Kubectl::new(&cluster);
    let out = kubectl
        .ok(&["rollout", "status", "daemonset/agent", "--timeout=30s"])
        .await;
    assert!(out.contains("successfully rolled out"), "{out}");

    let image = json!({"spec": {"template": {"spec": {"containers": [
        {"name": "c", "image": "agent:2"}]}}}});
    sets.patch("agent", &PatchParams::default(), &Patch::Strategic(&image))
        .await
        .expect("new image");
    let status = tokio::spawn({
        let cmd = kubectl.command(&["rollout", "status", "daemonset/agent", "--timeout=60s"]);
        support::Kubectl::output(cmd)
    });
    // Sample while the rollout runs: never more than one of the two nodes without a ready pod.
    let mut worst = 0;
    let mut samples = 0;
    let images = loop {
        let map = pods_by_node(&client, "agent").await;
        let ready_nodes = ["n1", "n2"]
            .iter()
            .filter(|n| map.get(**n).is_some_and(|pods| pods.iter().any(is_ready)))
            .count();
        worst = worst.max(2 - ready_nodes);
        samples += 1;
        let images: Vec<String> = map
            .values()
            .flatten()
            .filter(|p| is_ready(p))
            .filter_map(|p| p.spec.as_ref()?.containers[0].image.clone())
            .collect();
        if images == ["agent:2", "agent:2"] || samples > 600 {
            break images;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    };
    assert_eq!(images, ["agent:2", "agent:2"]);
    assert_eq!(worst, 1, "exactly one node at a time is without its daemon");
    let out = status.await.expect("join");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("daemon set \"agent\" successfully rolled out"),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = sets
        .get("agent")
        .await
        .expect("get")
        .status
        .expect("status");
    assert_eq!(
        (
            s.updated_number_scheduled,
            s.number_available,
            s.observed_generation
        ),
        (Some(2), Some(2), Some(2))
    );

    // Deleting the DaemonSet removes its pods (garbage collection through the owner).
    kubectl.ok(&["delete", "daemonset", "agent"]).await;
    eventually("the pods are gone", || async {
        let left = Api::<Pod>::default_namespaced(client.clone())
            .list(&ListParams::default().labels("app=agent"))
            .await
            .ok()?
            .items;
        left.is_empty().then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_delete_keeps_old_pods_until_they_are_deleted() {
    let (_cluster, client) = cluster().await;
    let _kubelet = fake_kubelet(client.clone(), Duration::ZERO);
    create_node(&client, &node("n1", "4", "8Gi", json!({}))).await;
    let mut set = daemonset("agent", "agent:1");
    set.spec.as_mut().expect("spec").update_strategy =
        serde_json::from_value(json!({"type": "OnDelete"})).expect("strategy");
    let sets: Api<DaemonSet> = Api::default_namespaced(client.clone());
    sets.create(&PostParams::default(), &set)
        .await
        .expect("create");
    let first = eventually("the pod", || async {
        pods_by_node(&client, "agent").await.remove("n1")?.pop()
    })
    .await;
    let image = json!({"spec": {"template": {"spec": {"containers": [
        {"name": "c", "image": "agent:2"}]}}}});
    sets.patch("agent", &PatchParams::default(), &Patch::Strategic(&image))
        .await
        .expect("new image");
    eventually("observed, not updated", || async {
        let s = sets.get("agent").await.ok()?.status?;
        (s.observed_generation == Some(2) && s.updated_number_scheduled == Some(0)).then_some(())
    })
    .await;
    let still = pods_by_node(&client, "agent").await;
    assert_eq!(still["n1"][0].name_any(), first.name_any());
    Api::<Pod>::default_namespaced(client.clone())
        .delete(&first.name_any(), &DeleteParams::default())
        .await
        .expect("delete pod");
    eventually("the replacement runs the new template", || async {
        let pod = pods_by_node(&client, "agent").await.remove("n1")?.pop()?;
        (pod.spec.as_ref()?.containers[0].image.as_deref() == Some("agent:2")).then_some(())
    })
    .await;
}
