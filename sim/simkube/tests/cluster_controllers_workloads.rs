//! Deployments and ReplicaSets against a running simkube with every controller, fake nodes
//! and a stand-in kubelet, through the real kube-rs client: spreading, availability, rolling
//! updates within maxUnavailable/maxSurge, scaling through the scale subresource, Recreate,
//! revision history, ReplicaSet self-healing, and the slow-start batches in which a ReplicaSet
//! creates its pods (seen by a validating webhook that holds each creation).

mod cluster_controllers_support;
mod support;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::routing::post;
use axum::{Json, Router};
use cluster_controllers_support::{
    cluster, create_node, eventually, fake_kubelet, node, node_of, pod,
};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt as _};
use serde_json::{Value, json};
use support::webhook::{rule, serve_https, validating, webhook};

fn deployment(name: &str, replicas: i32, image: &str, strategy: Value) -> Deployment {
    serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "revisionHistoryLimit": 1,
            "selector": {"matchLabels": {"app": name}},
            "strategy": strategy,
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "c", "image": image,
                    "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]}
            }
        }
    }))
    .expect("deployment")
}

async fn two_nodes(client: &Client) {
    create_node(client, &node("n1", "4", "8Gi", json!({}))).await;
    create_node(client, &node("n2", "4", "8Gi", json!({}))).await;
}

async fn app_pods(client: &Client, app: &str) -> Vec<Pod> {
    Api::<Pod>::default_namespaced(client.clone())
        .list(&ListParams::default().labels(&format!("app={app}")))
        .await
        .expect("list pods")
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect()
}

fn is_ready(pod: &Pod) -> bool {
    cluster_controllers_support::condition(pod, "Ready").is_some_and(|c| c.0 == "True")
}

fn image_of(pod: &Pod) -> String {
    pod.spec.as_ref().expect("spec").containers[0]
        .image
        .clone()
        .unwrap_or_default()
}

fn condition_reason(d: &Deployment, type_: &str) -> Option<(String, String)> {
    cluster_controllers_support::deployment_condition(d, type_)
        .map(|(status, reason, _)| (status, reason))
}

/// Waits until the deployment reports `replicas` updated, available replicas and no others.
async fn rolled_out(api: &Api<Deployment>, name: &str, replicas: i32) -> Deployment {
    eventually(&format!("{name} rolled out"), || async {
        let d = api.get(name).await.ok()?;
        let s = d.status.clone()?;
        let done = s.observed_generation == d.metadata.generation
            && s.updated_replicas == Some(replicas)
            && s.available_replicas == Some(replicas)
            && s.replicas == Some(replicas)
            && condition_reason(&d, "Progressing").is_some_and(|c| c.1 == "NewReplicaSetAvailable");
        done.then_some(d)
    })
    .await
}

#[tokio::test]
async fn deployment_spreads_over_nodes_and_becomes_available() {
    let (_cluster, client) = cluster().await;
    two_nodes(&client).await;
    let api: Api<Deployment> = Api::default_namespaced(client.clone());
    api.create(
        &PostParams::default(),
        &deployment("web", 3, "nginx:1", json!({})),
    )
    .await
    .expect("create");
    let pods = eventually("3 bound pods", || async {
        let pods = app_pods(&client, "web").await;
        (pods.len() == 3 && pods.iter().all(|p| node_of(p).is_some())).then_some(pods)
    })
    .await;
    let nodes: BTreeSet<String> = pods.iter().filter_map(node_of).collect();
    assert_eq!(nodes, BTreeSet::from(["n1".into(), "n2".into()]));
    // The controller's writes are tracked under its name, as kube-controller-manager's are.
    let creator = pods[0]
        .managed_fields()
        .first()
        .cloned()
        .expect("managedFields");
    assert_eq!(
        (creator.manager.as_deref(), creator.operation.as_deref()),
        (Some("kube-controller-manager"), Some("Update"))
    );
    // Not available before the kubelet reports the pods ready.
    let d = api.get("web").await.expect("get");
    assert_ne!(d.status.and_then(|s| s.available_replicas), Some(3));

    let _kubelet = fake_kubelet(client.clone(), Duration::ZERO);
    let d = rolled_out(&api, "web", 3).await;
    assert_eq!(
        condition_reason(&d, "Available"),
        Some(("True".into(), "MinimumReplicasAvailable".into()))
    );
    assert_eq!(d.annotations()["deployment.kubernetes.io/revision"], "1");
    let status = d.status.expect("status");
    assert_eq!(
        (status.ready_replicas, status.unavailable_replicas),
        (Some(3), Some(0))
    );

    let sets = Api::<ReplicaSet>::default_namespaced(client.clone())
        .list(&ListParams::default())
        .await
        .expect("list");
    assert_eq!(sets.items.len(), 1);
    let rs = &sets.items[0];
    let hash = rs.labels()["pod-template-hash"].clone();
    assert_eq!(rs.name_any(), format!("web-{hash}"));
    assert_eq!(rs.annotations()["deployment.kubernetes.io/revision"], "1");
    let owner = &rs.owner_references()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.controller),
        ("Deployment", Some(true))
    );
    for p in &pods {
        assert!(
            p.name_any().starts_with(&format!("web-{hash}-")),
            "{}",
            p.name_any()
        );
        assert_eq!(p.labels()["pod-template-hash"], hash);
        assert_eq!(p.owner_references()[0].name, rs.name_any());
    }
    let rs_status = rs.status.clone().expect("rs status");
    assert_eq!(rs_status.observed_generation, rs.metadata.generation);
}

#[tokio::test]
async fn rolling_update_keeps_availability_within_max_unavailable() {
    let (_cluster, client) = cluster().await;
    two_nodes(&client).await;
    let _kubelet = fake_kubelet(client.clone(), Duration::from_millis(300));
    let api: Api<Deployment> = Api::default_namespaced(client.clone());
    let strategy =
        json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 1}});
    api.create(
        &PostParams::default(),
        &deployment("web", 4, "nginx:1", strategy),
    )
    .await
    .expect("create");
    rolled_out(&api, "web", 4).await;

    let patch = json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "nginx:2"}]}}}});
    api.patch("web", &PatchParams::default(), &Patch::Strategic(&patch))
        .await
        .expect("update image");
    let mut steps = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let pods = app_pods(&client, "web").await;
        let ready = pods.iter().filter(|p| is_ready(p)).count();
        assert!(
            ready >= 3,
            "only {ready} ready pods during the rollout (maxUnavailable 1)"
        );
        assert!(
            pods.len() <= 5,
            "{} pods during the rollout (maxSurge 1)",
            pods.len()
        );
        if pods.len() == 4 && pods.iter().all(|p| image_of(p) == "nginx:2" && is_ready(p)) {
            break;
        }
        steps += 1;
        assert!(
            tokio::time::Instant::now() < deadline,
            "rollout did not finish"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(steps > 0);
    let d = rolled_out(&api, "web", 4).await;
    assert_eq!(d.annotations()["deployment.kubernetes.io/revision"], "2");
    let sets = Api::<ReplicaSet>::default_namespaced(client.clone())
        .list(&ListParams::default())
        .await
        .expect("list")
        .items;
    let mut by_revision: Vec<(String, i32)> = sets
        .iter()
        .map(|rs| {
            (
                rs.annotations()["deployment.kubernetes.io/revision"].clone(),
                rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(-1),
            )
        })
        .collect();
    by_revision.sort();
    assert_eq!(by_revision, [("1".into(), 0), ("2".into(), 4)]);

    // A third template leaves only one old ReplicaSet (revisionHistoryLimit 1).
    let patch = json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "nginx:3"}]}}}});
    api.patch("web", &PatchParams::default(), &Patch::Strategic(&patch))
        .await
        .expect("update image");
    eventually("history pruned to one old set", || async {
        let d = api.get("web").await.ok()?;
        let sets = Api::<ReplicaSet>::default_namespaced(client.clone())
            .list(&ListParams::default())
            .await
            .ok()?
            .items;
        let revisions: BTreeSet<String> = sets
            .iter()
            .map(|rs| rs.annotations()["deployment.kubernetes.io/revision"].clone())
            .collect();
        (d.annotations()
            .get("deployment.kubernetes.io/revision")
            .map(String::as_str)
            == Some("3")
            && revisions == BTreeSet::from(["2".into(), "3".into()]))
        .then_some(())
    })
    .await;
}

#[tokio::test]
async fn scale_subresource_and_recreate_strategy() {
    let (_cluster, client) = cluster().await;
    two_nodes(&client).await;
    let _kubelet = fake_kubelet(client.clone(), Duration::ZERO);
    let api: Api<Deployment> = Api::default_namespaced(client.clone());
    api.create(
        &PostParams::default(),
        &deployment("db", 2, "postgres:1", json!({"type": "Recreate"})),
    )
    .await
    .expect("create");
    rolled_out(&api, "db", 2).await;
    api.patch_scale(
        "db",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": 5}})),
    )
    .await
    .expect("scale");
    rolled_out(&api, "db", 5).await;
    let scale = api.get_scale("db").await.expect("scale");
    assert_eq!(scale.status.expect("status").replicas, 5);
    assert_eq!(app_pods(&client, "db").await.len(), 5);

    // Recreate: no new pod exists while an old one is still there.
    let patch = json!({"spec": {"replicas": 2, "template": {"spec": {"containers": [{"name": "c", "image": "postgres:2"}]}}}});
    api.patch("db", &PatchParams::default(), &Patch::Strategic(&patch))
        .await
        .expect("update");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let all: Vec<Pod> = Api::<Pod>::default_namespaced(client.clone())
            .list(&ListParams::default().labels("app=db"))
            .await
            .expect("list")
            .items;
        let images: BTreeSet<String> = all.iter().map(image_of).collect();
        assert!(
            images.len() <= 1,
            "old and new pods at once under Recreate: {images:?}"
        );
        if all.len() == 2 && images.contains("postgres:2") && all.iter().all(is_ready) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "recreate did not finish: {:?}",
            all.iter()
                .map(|p| (p.name_any(), image_of(p), is_ready(p), node_of(p)))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    rolled_out(&api, "db", 2).await;
}

#[tokio::test]
async fn replica_set_replaces_deleted_pods_and_adopts_orphans() {
    let (_cluster, client) = cluster().await;
    two_nodes(&client).await;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    // An orphan that matches the selector is adopted instead of creating a third pod.
    pods.create(&PostParams::default(), &pod("orphan", json!({})))
        .await
        .expect("orphan");
    let rs: ReplicaSet = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": "web"},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "c", "image": "nginx"}]}}}
    }))
    .expect("rs");
    let sets: Api<ReplicaSet> = Api::default_namespaced(client.clone());
    sets.create(&PostParams::default(), &rs)
        .await
        .expect("create");
    let names = eventually("two pods", || async {
        let p = app_pods(&client, "web").await;
        (p.len() == 2 && p.iter().all(|p| !p.owner_references().is_empty()))
            .then(|| p.iter().map(|p| p.name_any()).collect::<BTreeSet<_>>())
    })
    .await;
    assert!(names.contains("orphan"), "{names:?}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        app_pods(&client, "web").await.len(),
        2,
        "no extra pod beyond replicas"
    );

    // Unbound pods are deleted at once; a replacement appears.
    let victim = names
        .iter()
        .find(|n| *n != "orphan")
        .expect("created pod")
        .clone();
    let _kubelet = fake_kubelet(client.clone(), Duration::ZERO);
    pods.delete(&victim, &DeleteParams::default())
        .await
        .expect("delete");
    eventually("replacement ready", || async {
        let p = app_pods(&client, "web").await;
        (p.len() == 2 && !p.iter().any(|p| p.name_any() == victim) && p.iter().all(is_ready))
            .then_some(())
    })
    .await;
    let status = eventually("status", || async {
        let s = sets.get("web").await.ok()?.status?;
        (s.ready_replicas == Some(2) && s.available_replicas == Some(2)).then_some(s)
    })
    .await;
    assert_eq!(
        (status.replicas, status.fully_labeled_replicas),
        (2, Some(2))
    );
}

/// How long the gate webhook holds each pod creation: long enough that the creations of one
/// batch overlap despite scheduling skew on a busy machine.
const HOLD: Duration = Duration::from_millis(400);

/// A validating webhook on pod creations that holds each call for [`HOLD`], records when each
/// was in flight and how many were at once, and refuses every call after the first `allow`.
struct Gate {
    allow: usize,
    in_flight: AtomicUsize,
    most_in_flight: AtomicUsize,
    calls: Mutex<Vec<(Instant, Option<Instant>)>>,
}

impl Gate {
    /// Serves the gate and registers it for pod CREATE in the cluster.
    async fn install(client: &Client, allow: usize) -> Arc<Self> {
        let gate = Arc::new(Self {
            allow,
            in_flight: AtomicUsize::new(0),
            most_in_flight: AtomicUsize::new(0),
            calls: Mutex::new(Vec::new()),
        });
        let app = Router::new()
            .route("/pods", post(gate_call))
            .with_state(gate.clone());
        let server = serve_https(app).await;
        validating(
            client,
            "gate",
            json!([webhook(
                "gate.tether.test",
                server.url("pods"),
                rule(&["CREATE"], &[""], &["pods"]),
                json!({}),
            )]),
        )
        .await;
        gate
    }

    fn calls(&self) -> usize {
        self.calls.lock().expect("lock").len()
    }

    /// The sizes of the groups of calls that overlapped in time, in order: calls of one group
    /// were in flight together; a group starts only after the previous one ended.
    fn bursts(&self) -> Vec<usize> {
        let mut calls: Vec<(Instant, Instant)> = self
            .calls
            .lock()
            .expect("lock")
            .iter()
            .map(|(start, end)| (*start, end.expect("every call answered")))
            .collect();
        calls.sort();
        let mut bursts: Vec<usize> = Vec::new();
        let mut until: Option<Instant> = None;
        for (start, end) in calls {
            match until {
                Some(u) if start < u => {
                    *bursts.last_mut().expect("a burst") += 1;
                    until = Some(u.max(end));
                }
                _ => {
                    bursts.push(1);
                    until = Some(end);
                }
            }
        }
        bursts
    }
}

async fn gate_call(State(gate): State<Arc<Gate>>, Json(review): Json<Value>) -> Json<Value> {
    let index = {
        let mut calls = gate.calls.lock().expect("lock");
        calls.push((Instant::now(), None));
        calls.len() - 1
    };
    let now = gate.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    gate.most_in_flight.fetch_max(now, Ordering::SeqCst);
    tokio::time::sleep(HOLD).await;
    gate.in_flight.fetch_sub(1, Ordering::SeqCst);
    gate.calls.lock().expect("lock")[index].1 = Some(Instant::now());
    let response = if index < gate.allow {
        json!({"uid": review["request"]["uid"], "allowed": true})
    } else {
        json!({"uid": review["request"]["uid"], "allowed": false,
            "status": {"code": 403, "reason": "Forbidden",
                "message": format!("the gate admits only {} pods", gate.allow)}})
    };
    Json(
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}),
    )
}

fn replica_set(name: &str, replicas: i32) -> ReplicaSet {
    serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "c", "image": "nginx"}]}}}
    }))
    .expect("rs")
}

/// Waits until the gate has seen no new call for a while, and returns how many it saw.
async fn quiet(gate: &Gate) -> usize {
    let mut seen = gate.calls();
    let mut still = 0;
    eventually("the creations to stop", || {
        let now = gate.calls();
        if now == seen {
            still += 1;
        } else {
            (seen, still) = (now, 0);
        }
        async move { (still >= 20).then_some(now) }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn replica_set_creates_pods_in_slow_start_batches() {
    let (_cluster, client) = cluster().await;
    let gate = Gate::install(&client, usize::MAX).await;
    Api::<ReplicaSet>::default_namespaced(client.clone())
        .create(&PostParams::default(), &replica_set("wide", 15))
        .await
        .expect("create");
    eventually("15 pods", || async {
        (app_pods(&client, "wide").await.len() == 15).then_some(())
    })
    .await;
    // One pass made them all: 1, then 2, 4 and 8 at once, each batch after the previous one.
    assert_eq!(quiet(&gate).await, 15);
    assert_eq!(gate.bursts(), [1, 2, 4, 8]);
    assert_eq!(gate.most_in_flight.load(Ordering::SeqCst), 8);
    assert_eq!(app_pods(&client, "wide").await.len(), 15);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_refused_creation_ends_the_pass() {
    let (_cluster, client) = cluster().await;
    let gate = Gate::install(&client, 3).await;
    let sets: Api<ReplicaSet> = Api::default_namespaced(client.clone());
    sets.create(&PostParams::default(), &replica_set("capped", 10))
        .await
        .expect("create");
    let status = eventually("status of 3 replicas", || async {
        let s = sets.get("capped").await.ok()?.status?;
        (s.replicas == 3).then_some(s)
    })
    .await;
    assert_eq!(status.fully_labeled_replicas, Some(3));
    quiet(&gate).await;
    // The batch of 4 had refusals, so the pass ended there instead of trying the other 3; each
    // later pass (a pod or the status changed) tries one pod, is refused, and waits again.
    let bursts = gate.bursts();
    assert_eq!(bursts[..3], [1, 2, 4], "{bursts:?}");
    assert!(bursts[3..].iter().all(|b| *b == 1), "{bursts:?}");
    assert_eq!(app_pods(&client, "capped").await.len(), 3);
}
