//! Shared helpers of the cluster-controller tests: a cluster with every controller, fake Nodes
//! (no node agent yet) and a stand-in kubelet that marks pods Running and Ready.

#![allow(dead_code)]

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt as _};
use serde_json::{Value, json};
use simkube::controllers::Controllers;

/// How long a condition may take before the test fails.
pub(crate) const WAIT: Duration = Duration::from_secs(20);

/// Polls `check` until it returns `Some`, or fails the test naming `what`.
pub(crate) async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {WAIT:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A cluster running every built-in controller, and an admin client.
pub(crate) async fn cluster() -> (simkube::Cluster, Client) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let cluster = simkube::Cluster::builder()
        .controllers(Controllers::all())
        .start()
        .await
        .expect("start cluster");
    let client = cluster.client();
    (cluster, client)
}

/// A Ready node with `cpu`/`memory` allocatable and room for 110 pods; `extra` is merged in.
pub(crate) fn node(name: &str, cpu: &str, memory: &str, extra: Value) -> Node {
    let mut obj = json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "spec": {},
        "status": {
            "capacity": {"cpu": cpu, "memory": memory, "pods": "110"},
            "allocatable": {"cpu": cpu, "memory": memory, "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                "message": "kubelet is posting ready status"}]
        }
    });
    json_patch::merge(&mut obj, &extra);
    serde_json::from_value(obj).expect("node")
}

/// Creates `node` and writes its status (create ignores status, as the real server does).
pub(crate) async fn create_node(client: &Client, node: &Node) {
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .create(&PostParams::default(), node)
        .await
        .expect("create node");
    let status = json!({"status": node.status});
    nodes
        .patch_status(
            &node.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&status),
        )
        .await
        .expect("node status");
}

/// A pod of one container; `spec` is merged into its spec.
pub(crate) fn pod(name: &str, spec: Value) -> Pod {
    let mut obj = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "c", "image": "nginx"}]}
    });
    json_patch::merge(&mut obj, &json!({"spec": spec}));
    serde_json::from_value(obj).expect("pod")
}

/// The node a pod is bound to, if any.
pub(crate) fn node_of(pod: &Pod) -> Option<String> {
    pod.spec
        .as_ref()?
        .node_name
        .clone()
        .filter(|n| !n.is_empty())
}

/// The pod's condition of this type: (status, reason, message).
pub(crate) fn condition(pod: &Pod, type_: &str) -> Option<(String, String, String)> {
    let c = pod
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

/// The deployment's condition of this type: (status, reason, message).
pub(crate) fn deployment_condition(
    d: &Deployment,
    type_: &str,
) -> Option<(String, String, String)> {
    let c = d
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

/// Acts as the kubelet: marks a bound pod Running with an IP and the given readiness.
pub(crate) async fn set_pod_ready(
    client: &Client,
    namespace: &str,
    name: &str,
    ip: &str,
    ready: bool,
) {
    try_set_pod_ready(client, namespace, name, ip, ready)
        .await
        .expect("pod status");
}

/// [`set_pod_ready`] for a pod that may be gone by now: a controller can delete it between
/// the fake kubelet's list and its write, as it can under a real kubelet.
async fn try_set_pod_ready(
    client: &Client,
    namespace: &str,
    name: &str,
    ip: &str,
    ready: bool,
) -> kube::Result<Pod> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let status = if ready { "True" } else { "False" };
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let patch = json!({"status": {
        "phase": "Running",
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "startTime": now,
        "conditions": [
            {"type": "Ready", "status": status, "lastTransitionTime": now},
            {"type": "ContainersReady", "status": status, "lastTransitionTime": now},
            {"type": "Initialized", "status": "True", "lastTransitionTime": now}
        ],
        "containerStatuses": [{"name": "c", "image": "nginx", "imageID": "", "ready": ready,
            "restartCount": 0, "started": true, "state": {"running": {"startedAt": now}}}]
    }});
    pods.patch_status(name, &PatchParams::default(), &Patch::Strategic(&patch))
        .await
}

/// A stand-in for the kubelets of the fake nodes: marks bound pods Running and Ready (with a
/// pod IP) `ready_after` they were first seen bound, and completes the deletion of
/// terminating pods. Stops when dropped.
pub(crate) struct FakeKubelet(tokio::task::JoinHandle<()>);

impl Drop for FakeKubelet {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Starts a [`FakeKubelet`].
pub(crate) fn fake_kubelet(client: Client, ready_after: Duration) -> FakeKubelet {
    FakeKubelet(tokio::spawn(async move {
        let pods: Api<Pod> = Api::all(client.clone());
        let mut seen: std::collections::HashMap<String, tokio::time::Instant> =
            std::collections::HashMap::new();
        let mut next_ip = 2u32;
        loop {
            let list = pods
                .list(&kube::api::ListParams::default())
                .await
                .map(|l| l.items)
                .unwrap_or_default();
            for pod in list {
                let ns = pod.namespace().unwrap_or_default();
                let name = pod.name_any();
                let uid = pod.metadata.uid.clone().unwrap_or_default();
                let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
                if pod.metadata.deletion_timestamp.is_some() {
                    let dp = kube::api::DeleteParams {
                        grace_period_seconds: Some(0),
                        preconditions: Some(kube::api::Preconditions {
                            uid: Some(uid),
                            resource_version: None,
                        }),
                        ..kube::api::DeleteParams::default()
                    };
                    let _ = api.delete(&name, &dp).await;
                    continue;
                }
                let running =
                    pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
                if node_of(&pod).is_none() || running {
                    continue;
                }
                let first = *seen.entry(uid).or_insert_with(tokio::time::Instant::now);
                if first.elapsed() >= ready_after {
                    let ip = std::net::Ipv4Addr::from(
                        u32::from(std::net::Ipv4Addr::new(10, 244, 0, 0)) + next_ip,
                    );
                    next_ip += 1;
                    match try_set_pod_ready(&client, &ns, &name, &ip.to_string(), true).await {
                        Ok(_) => {}
                        Err(kube::Error::Api(e)) if e.code == 404 => {}
                        Err(e) => panic!("fake kubelet: status of {ns}/{name}: {e}"),
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }))
}
