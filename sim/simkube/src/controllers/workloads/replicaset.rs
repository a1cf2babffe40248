//! The ReplicaSet controller: creates pods from the template (`generateName: <rs>-`, a
//! controller owner reference) until `spec.replicas` are active, in slow-start batches of 1, 2,
//! 4, ... at most 500 a pass, deletes the most expendable ones beyond it, adopts matching
//! orphans, and reports replicas, fully labeled, ready and available (after `minReadySeconds`)
//! counts.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use futures::future::join_all;
use k8s_openapi::api::apps::v1::{ReplicaSet, ReplicaSetStatus};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Client, ResourceExt as _};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::{controlled_by, controller_ref, has_controller, selector_matches, selector_query};
use crate::controllers::is_status;

/// Errors of one reconcile pass.
#[derive(Debug, thiserror::Error)]
pub enum ReplicaSetError {
    /// The API server refused or failed a request.
    #[error("replicaset controller: {0}")]
    Kube(#[from] kube::Error),
}

/// Whether a pod counts toward the replicas: not terminating and not finished.
pub fn is_active(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && !matches!(
            pod.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded" | "Failed")
        )
}

/// When the pod's Ready condition last became True, if it is Ready.
pub fn ready_since(pod: &Pod) -> Option<Timestamp> {
    let c = pod
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")?;
    (c.status == "True").then(|| {
        c.last_transition_time
            .as_ref()
            .map_or(Timestamp::UNIX_EPOCH, |t| t.0)
    })
}

/// Whether the pod has been Ready for at least `min_ready_seconds` at `now`.
pub fn is_available(pod: &Pod, min_ready_seconds: i64, now: Timestamp) -> bool {
    ready_since(pod).is_some_and(|since| {
        min_ready_seconds <= 0 || now.as_second() - since.as_second() >= min_ready_seconds
    })
}

fn phase_rank(pod: &Pod) -> u8 {
    match pod.status.as_ref().and_then(|s| s.phase.as_deref()) {
        Some("Pending") | None => 0,
        Some("Running") => 2,
        _ => 1,
    }
}

/// Sorts pods most expendable first, as the real controller picks pods to delete: unbound,
/// then pending, not ready, ready for the shortest time, most restarts, newest.
pub fn sort_for_deletion(pods: &mut [&Pod]) {
    let restarts = |p: &Pod| -> i32 {
        p.status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .map_or(0, |cs| {
                cs.iter().map(|c| c.restart_count).max().unwrap_or(0)
            })
    };
    let bound = |p: &Pod| {
        p.spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .is_some_and(|n| !n.is_empty())
    };
    pods.sort_by(|a, b| {
        bound(a)
            .cmp(&bound(b))
            .then_with(|| phase_rank(a).cmp(&phase_rank(b)))
            .then_with(|| ready_since(a).is_some().cmp(&ready_since(b).is_some()))
            .then_with(|| ready_since(b).cmp(&ready_since(a)))
            .then_with(|| restarts(b).cmp(&restarts(a)))
            .then_with(|| {
                let created = |p: &Pod| p.metadata.creation_timestamp.as_ref().map(|t| t.0);
                created(b).cmp(&created(a))
            })
    });
}

/// The most pods one pass creates, and the most it deletes, as kube-controller-manager's
/// `burstReplicas`: a larger difference is worked off over several passes.
pub const BURST_REPLICAS: usize = 500;

/// The batches in which one pass creates `missing` pods: 1, 2, 4, ... then the remainder, at
/// most [`BURST_REPLICAS`] in all. A batch's pods are created concurrently and a batch with a
/// failure ends the pass, so a server that refuses every pod (a quota, a webhook) costs one
/// call rather than hundreds, while a healthy one sees the pods quickly.
pub fn slow_start_batches(missing: usize) -> Vec<usize> {
    let mut left = missing.min(BURST_REPLICAS);
    let mut batches = Vec::new();
    let mut size = 1;
    while left > 0 {
        let batch = size.min(left);
        batches.push(batch);
        left -= batch;
        size *= 2;
    }
    batches
}

/// What one pass does to a ReplicaSet.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Plan {
    /// Pods to create from the template.
    pub create: usize,
    /// Pods to delete, by name.
    pub delete: Vec<String>,
    /// The status to report.
    pub status: ReplicaSetStatus,
    /// When to look again because a ready pod becomes available then.
    pub requeue: Option<Duration>,
}

/// Plans a pass from the ReplicaSet and the pods it controls.
pub fn plan(rs: &ReplicaSet, owned: &[Pod], now: Timestamp) -> Plan {
    let spec = rs.spec.clone().unwrap_or_default();
    let want = usize::try_from(spec.replicas.unwrap_or(1).max(0)).unwrap_or(0);
    let min_ready = i64::from(spec.min_ready_seconds.unwrap_or(0));
    let mut active: Vec<&Pod> = owned.iter().filter(|p| is_active(p)).collect();
    let mut out = Plan::default();
    if rs.metadata.deletion_timestamp.is_none() {
        if active.len() < want {
            out.create = want - active.len();
        } else if active.len() > want {
            sort_for_deletion(&mut active);
            out.delete = active[..active.len() - want]
                .iter()
                .map(|p| p.name_any())
                .collect();
        }
    }
    let template_labels = spec
        .template
        .as_ref()
        .and_then(|t| t.metadata.as_ref())
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    let count = |f: &dyn Fn(&Pod) -> bool| {
        i32::try_from(active.iter().filter(|p| f(p)).count()).unwrap_or(i32::MAX)
    };
    let fully_labeled = count(&|p: &Pod| {
        let labels = p.metadata.labels.clone().unwrap_or_default();
        template_labels
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
    });
    let ready = count(&|p: &Pod| ready_since(p).is_some());
    let available = count(&|p: &Pod| is_available(p, min_ready, now));
    if min_ready > 0 {
        out.requeue = active
            .iter()
            .filter_map(|p| ready_since(p))
            .map(|since| min_ready - (now.as_second() - since.as_second()))
            .filter(|left| *left > 0)
            .min()
            .map(|left| Duration::from_secs(u64::try_from(left).unwrap_or(1)));
    }
    out.status = ReplicaSetStatus {
        replicas: i32::try_from(active.len()).unwrap_or(i32::MAX),
        fully_labeled_replicas: Some(fully_labeled),
        ready_replicas: Some(ready),
        available_replicas: Some(available),
        observed_generation: rs.metadata.generation,
        conditions: rs.status.as_ref().and_then(|s| s.conditions.clone()),
        ..ReplicaSetStatus::default()
    };
    out
}

/// The pod a ReplicaSet creates from its template.
pub fn pod_from_template(rs: &ReplicaSet) -> Pod {
    let template = rs
        .spec
        .as_ref()
        .and_then(|s| s.template.clone())
        .unwrap_or_default();
    let tmeta = template.metadata.unwrap_or_default();
    Pod {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}-", rs.name_any())),
            namespace: rs.namespace(),
            labels: tmeta.labels,
            annotations: tmeta.annotations,
            finalizers: tmeta.finalizers,
            owner_references: controller_ref(rs).map(|r| vec![r]),
            ..ObjectMeta::default()
        },
        spec: template.spec,
        status: None,
    }
}

struct Context {
    client: Client,
}

/// Runs the controller until `shutdown`.
pub async fn run(client: Client, shutdown: CancellationToken) {
    let sets: Api<ReplicaSet> = Api::all(client.clone());
    let pods: Api<Pod> = Api::all(client.clone());
    Controller::new(sets, watcher::Config::default())
        .owns(pods, watcher::Config::default())
        .graceful_shutdown_on(shutdown.cancelled_owned())
        .run(reconcile, error_policy, Arc::new(Context { client }))
        .for_each(|_| async {})
        .await;
}

fn error_policy(_rs: Arc<ReplicaSet>, error: &ReplicaSetError, _ctx: Arc<Context>) -> Action {
    tracing::warn!(%error, "replicaset pass failed; retrying");
    Action::requeue(Duration::from_secs(1))
}

async fn reconcile(cached: Arc<ReplicaSet>, ctx: Arc<Context>) -> Result<Action, ReplicaSetError> {
    let namespace = cached.namespace().unwrap_or_default();
    let sets: Api<ReplicaSet> = Api::namespaced(ctx.client.clone(), &namespace);
    let Some(rs) = sets.get_opt(&cached.name_any()).await? else {
        return Ok(Action::await_change());
    };
    let uid = rs.metadata.uid.clone().unwrap_or_default();
    let selector = rs
        .spec
        .as_ref()
        .map(|s| s.selector.clone())
        .unwrap_or_default();
    let pods_api: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
    let listed = pods_api
        .list(&ListParams::default().labels(&selector_query(&selector)))
        .await?;
    let mut owned = Vec::new();
    for pod in listed.items {
        if controlled_by(pod.metadata.owner_references.as_ref(), &uid) {
            owned.push(pod);
        } else if rs.metadata.deletion_timestamp.is_none()
            && !has_controller(pod.metadata.owner_references.as_ref())
            && is_active(&pod)
            && selector_matches(
                &selector,
                pod.metadata.labels.as_ref().unwrap_or(&Default::default()),
            )
            && let Some(adopted) = adopt(&pods_api, &rs, &pod).await?
        {
            owned.push(adopted);
        }
    }
    let plan = plan(&rs, &owned, Timestamp::now());
    let template = pod_from_template(&rs);
    // Beyond the burst cap, the rest is for the next pass, which need not wait for a change.
    let mut capped = plan.create > BURST_REPLICAS || plan.delete.len() > BURST_REPLICAS;
    let (post, delete) = (PostParams::default(), DeleteParams::default());
    for size in slow_start_batches(plan.create) {
        let created = join_all((0..size).map(|_| pods_api.create(&post, &template))).await;
        let mut refused = false;
        for result in created {
            match result {
                Ok(_) => {}
                // The namespace is terminating, or a quota or webhook refuses: the next
                // change retries.
                Err(e) if is_status(&e, 403) || is_status(&e, 409) => refused = true,
                Err(e) => return Err(e.into()),
            }
        }
        if refused {
            capped = false;
            break;
        }
    }
    let doomed = &plan.delete[..plan.delete.len().min(BURST_REPLICAS)];
    let deleted = join_all(doomed.iter().map(|name| pods_api.delete(name, &delete))).await;
    for result in deleted {
        match result {
            Ok(_) => {}
            Err(e) if is_status(&e, 404) => {}
            Err(e) => return Err(e.into()),
        }
    }
    if rs.status.as_ref() != Some(&plan.status) {
        let patch = json!({"status": plan.status});
        match sets
            .patch_status(
                &rs.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            Ok(_) => {}
            Err(e) if is_status(&e, 404) || is_status(&e, 409) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let soon = capped.then_some(Duration::ZERO);
    Ok(match soon.into_iter().chain(plan.requeue).min() {
        Some(after) => Action::requeue(after),
        None => Action::await_change(),
    })
}

/// Sets the ReplicaSet as controller of an orphan pod its selector matches.
async fn adopt(api: &Api<Pod>, rs: &ReplicaSet, pod: &Pod) -> Result<Option<Pod>, kube::Error> {
    let mut refs = pod.metadata.owner_references.clone().unwrap_or_default();
    refs.extend(controller_ref(rs));
    let patch = json!({"metadata": {"ownerReferences": refs, "uid": pod.metadata.uid}});
    match api
        .patch(
            &pod.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(p) => Ok(Some(p)),
        Err(e) if is_status(&e, 404) || is_status(&e, 409) => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::apps::v1::ReplicaSet;
    use serde_json::{Value, json};

    use super::*;

    fn rs(replicas: i32, min_ready: i32) -> ReplicaSet {
        serde_json::from_value(json!({
            "metadata": {"name": "web-abc", "namespace": "default", "uid": "u1", "generation": 3},
            "spec": {"replicas": replicas, "minReadySeconds": min_ready,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web", "tier": "front"}},
                    "spec": {"containers": [{"name": "c", "image": "nginx"}]}}}
        }))
        .expect("rs")
    }

    fn pod(name: &str, extra: Value) -> Pod {
        let mut base = json!({"metadata": {"name": name, "labels": {"app": "web", "tier": "front"},
            "creationTimestamp": "2024-01-01T00:00:00Z"}, "spec": {"containers": []}});
        json_patch::merge(&mut base, &extra);
        serde_json::from_value(base).expect("pod")
    }

    fn ready_at(time: &str) -> Value {
        json!({"spec": {"nodeName": "n1"}, "status": {"phase": "Running",
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": time}]}})
    }

    fn now() -> Timestamp {
        "2024-01-01T00:01:00Z".parse().expect("time")
    }

    #[test]
    fn creates_the_missing_pods() {
        let p = plan(&rs(3, 0), &[pod("a", json!({}))], now());
        assert_eq!((p.create, p.delete.len()), (2, 0));
        assert_eq!(p.status.replicas, 1);
        assert_eq!(p.status.observed_generation, Some(3));
    }

    #[test]
    fn terminating_and_finished_pods_do_not_count() {
        let pods = [
            pod(
                "gone",
                json!({"metadata": {"deletionTimestamp": "2024-01-01T00:00:30Z"}}),
            ),
            pod("done", json!({"status": {"phase": "Succeeded"}})),
        ];
        let p = plan(&rs(2, 0), &pods, now());
        assert_eq!(p.create, 2);
        assert_eq!(p.status.replicas, 0);
    }

    #[test]
    fn deletes_the_most_expendable_first() {
        let pods = [
            pod("ready-old", ready_at("2024-01-01T00:00:10Z")),
            pod(
                "pending",
                json!({"spec": {"nodeName": "n1"}, "status": {"phase": "Pending"}}),
            ),
            pod("unbound", json!({})),
            pod("ready-new", ready_at("2024-01-01T00:00:50Z")),
            pod(
                "running-unready",
                json!({"spec": {"nodeName": "n1"}, "status": {"phase": "Running"}}),
            ),
        ];
        let p = plan(&rs(1, 0), &pods, now());
        assert_eq!(
            p.delete,
            ["unbound", "pending", "running-unready", "ready-new"]
        );
    }

    #[test]
    fn status_counts_ready_available_and_fully_labeled() {
        let pods = [
            pod("a", ready_at("2024-01-01T00:00:00Z")),
            pod("b", ready_at("2024-01-01T00:00:55Z")),
            pod("c", json!({"metadata": {"labels": {"tier": null}}})),
        ];
        let p = plan(&rs(3, 30), &pods, now());
        assert_eq!(p.status.replicas, 3);
        assert_eq!(p.status.ready_replicas, Some(2));
        assert_eq!(p.status.available_replicas, Some(1));
        assert_eq!(p.status.fully_labeled_replicas, Some(2));
        assert_eq!(p.requeue, Some(Duration::from_secs(25)));
    }

    #[test]
    fn creations_go_in_doubling_batches_capped_per_pass() {
        assert_eq!(slow_start_batches(0), Vec::<usize>::new());
        assert_eq!(slow_start_batches(1), [1]);
        assert_eq!(slow_start_batches(7), [1, 2, 4]);
        assert_eq!(slow_start_batches(10), [1, 2, 4, 3]);
        assert_eq!(slow_start_batches(1000), [1, 2, 4, 8, 16, 32, 64, 128, 245]);
        assert_eq!(
            slow_start_batches(1000).iter().sum::<usize>(),
            BURST_REPLICAS
        );
    }

    #[test]
    fn template_pods_are_owned_and_named_after_the_set() {
        let p = pod_from_template(&rs(1, 0));
        assert_eq!(p.metadata.generate_name.as_deref(), Some("web-abc-"));
        let owner = &p.metadata.owner_references.expect("owner")[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("ReplicaSet", "u1")
        );
        assert_eq!(owner.controller, Some(true));
        assert_eq!(owner.block_owner_deletion, Some(true));
        assert_eq!(p.metadata.labels.expect("labels")["tier"], "front");
    }
}
