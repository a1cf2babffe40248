//! A Deployment's `progressDeadlineSeconds` against a running simkube with every controller
//! and fake nodes, through the real kube-rs client: a rollout whose pods never become ready
//! reports `Progressing=False` (`ProgressDeadlineExceeded`) once the deadline passed without
//! progress, not before, and turns `True` (`NewReplicaSetAvailable`) when the pods come up.

mod cluster_controllers_support;

use std::time::Duration;

use cluster_controllers_support::{
    cluster, create_node, deployment_condition, eventually, fake_kubelet, node,
};
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, PostParams};
use serde_json::json;

const DEADLINE_SECS: u64 = 3;

fn progressing(d: &Deployment) -> Option<(String, String, String)> {
    deployment_condition(d, "Progressing")
}

#[tokio::test]
async fn a_stuck_rollout_exceeds_its_progress_deadline_then_completes() {
    let (_cluster, client) = cluster().await;
    create_node(&client, &node("n1", "4", "8Gi", json!({}))).await;
    let api: Api<Deployment> = Api::default_namespaced(client.clone());
    let deploy: Deployment = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "stuck"},
        "spec": {
            "replicas": 2,
            "progressDeadlineSeconds": DEADLINE_SECS,
            "selector": {"matchLabels": {"app": "stuck"}},
            "template": {"metadata": {"labels": {"app": "stuck"}},
                "spec": {"containers": [{"name": "c", "image": "nginx"}]}}
        }
    }))
    .expect("deployment");
    let created = tokio::time::Instant::now();
    api.create(&PostParams::default(), &deploy)
        .await
        .expect("create");

    // No kubelet: the pods are bound but never become ready, so the rollout stalls.
    let progressing_true = eventually("Progressing=True", || async {
        progressing(&api.get("stuck").await.ok()?).filter(|c| c.0 == "True")
    })
    .await;
    assert!(
        ["NewReplicaSetCreated", "ReplicaSetUpdated"].contains(&progressing_true.1.as_str()),
        "{progressing_true:?}"
    );
    let timed_out = eventually("ProgressDeadlineExceeded", || async {
        let c = progressing(&api.get("stuck").await.ok()?)?;
        if c.0 != "False" {
            assert!(
                created.elapsed() < Duration::from_secs(DEADLINE_SECS + 3),
                "still {c:?} long after the deadline"
            );
            return None;
        }
        Some(c)
    })
    .await;
    let took = created.elapsed();
    assert_eq!(timed_out.1, "ProgressDeadlineExceeded");
    assert!(
        timed_out.2.starts_with("ReplicaSet \"stuck-")
            && timed_out.2.ends_with("\" has timed out progressing."),
        "{}",
        timed_out.2
    );
    // Condition times have whole seconds (as every metav1.Time), so the deadline counted from
    // the last progress may end up to a second early, as on a real cluster.
    assert!(
        took >= Duration::from_secs(DEADLINE_SECS - 1),
        "timed out after {took:?}, before the {DEADLINE_SECS}s deadline"
    );

    // The pods come up: the rollout completes and says so.
    let _kubelet = fake_kubelet(client.clone(), Duration::ZERO);
    let done = eventually("NewReplicaSetAvailable", || async {
        progressing(&api.get("stuck").await.ok()?).filter(|c| c.1 == "NewReplicaSetAvailable")
    })
    .await;
    assert_eq!(done.0, "True");
}
