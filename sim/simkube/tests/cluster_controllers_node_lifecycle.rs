//! Node lifecycle against a running simkube with every controller, through the real kube-rs
//! client: a node whose Lease stops being renewed turns Unknown with the unreachable taints
//! within the grace period, its pods turn not Ready, and a returning kubelet clears the taints.

mod cluster_controllers_support;

use std::time::Duration;

use cluster_controllers_support::{create_node, eventually, node, node_of, pod, set_pod_ready};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use simkube::controllers::Controllers;

const GRACE: Duration = Duration::from_secs(2);

async fn renew(client: &Client, name: &str) {
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let lease = json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": name},
        "spec": {"holderIdentity": name, "leaseDurationSeconds": 40,
            "renewTime": MicroTime(Timestamp::now())}
    });
    leases
        .patch(
            name,
            &PatchParams::apply("kubelet").force(),
            &Patch::Apply(&lease),
        )
        .await
        .expect("renew lease");
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

fn ready_status(node: &Node) -> Option<(String, String)> {
    let c = node
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")?;
    Some((c.status.clone(), c.reason.clone().unwrap_or_default()))
}

#[tokio::test]
async fn stale_lease_makes_the_node_unknown_and_tainted_until_it_returns() {
    let cluster = simkube::Cluster::builder()
        .controllers(Controllers::all())
        .node_monitor_grace_period(GRACE)
        .start()
        .await
        .expect("start");
    let client = cluster.client();
    let nodes: Api<Node> = Api::all(client.clone());
    create_node(&client, &node("n1", "2", "4Gi", json!({}))).await;
    renew(&client, "n1").await;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    pods.create(&PostParams::default(), &pod("web", json!({})))
        .await
        .expect("pod");
    eventually("pod bound", || async {
        node_of(&pods.get("web").await.ok()?)
    })
    .await;
    set_pod_ready(&client, "default", "web", "10.244.0.5", true).await;

    // A kubelet renewing its Lease keeps the node Ready well past the grace period.
    let started = tokio::time::Instant::now();
    while started.elapsed() < GRACE * 2 {
        renew(&client, "n1").await;
        let n = nodes.get("n1").await.expect("node");
        assert_eq!(ready_status(&n).map(|r| r.0).as_deref(), Some("True"));
        assert!(taint_keys(&n).is_empty(), "{:?}", taint_keys(&n));
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    // Silence: Unknown and unreachable within the grace period (plus one check interval).
    let silent = tokio::time::Instant::now();
    let n = eventually("node unknown and tainted", || async {
        let n = nodes.get("n1").await.ok()?;
        (ready_status(&n)? == ("Unknown".into(), "NodeStatusUnknown".into())
            && taint_keys(&n).len() == 2)
            .then_some(n)
    })
    .await;
    assert!(
        silent.elapsed() < GRACE * 2,
        "took {:?} with a grace period of {GRACE:?}",
        silent.elapsed()
    );
    assert_eq!(
        taint_keys(&n),
        [
            "node.kubernetes.io/unreachable:NoSchedule",
            "node.kubernetes.io/unreachable:NoExecute"
        ]
    );
    let message = n.status.and_then(|s| s.conditions).and_then(|c| {
        c.into_iter()
            .find(|c| c.type_ == "Ready")
            .and_then(|c| c.message)
    });
    assert_eq!(
        message.as_deref(),
        Some("Kubelet stopped posting node status.")
    );
    eventually("pod not ready", || async {
        cluster_controllers_support::condition(&pods.get("web").await.ok()?, "Ready")
            .filter(|c| c.0 == "False")
    })
    .await;

    // The kubelet returns: renews its Lease and posts Ready; the taints go.
    renew(&client, "n1").await;
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let status = json!({"status": {"conditions": [{"type": "Ready", "status": "True",
        "reason": "KubeletReady", "message": "kubelet is posting ready status",
        "lastHeartbeatTime": now, "lastTransitionTime": now}]}});
    nodes
        .patch_status("n1", &PatchParams::default(), &Patch::Strategic(&status))
        .await
        .expect("ready again");
    eventually("taints removed", || async {
        renew(&client, "n1").await;
        taint_keys(&nodes.get("n1").await.ok()?)
            .is_empty()
            .then_some(())
    })
    .await;
}
