//! The ReplicaSet controller: creates pods from the template (`generateName: <rs>-`, a
//! controller owner reference) until `spec.replicas` are active, in slow-start batches of 1, 2,
//! 4, ... at most 500 a pass, deletes the most expendable ones beyond it, adopts matching
//! orphans, and reports replicas, fully labeled, ready and available (after `minReadySeconds`)
//! counts.
//!
//! Like kube-controller-manager's, it reads pods from a watch cache rather than listing them at
//! every pass (a list of a burst's thousand pods per pass was most of an API server's work),
//! and keeps expectations: after it creates or deletes pods it changes nothing more for that
//! ReplicaSet until its cache has seen those changes, so a lagging cache never doubles them.

use std::borrow::Borrow;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::future::join_all;
use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::apps::v1::{ReplicaSet, ReplicaSetStatus};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Client, ResourceExt as _};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::{controlled_by, controller_ref, has_controller, selector_matches};
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
pub fn plan<P: Borrow<Pod>>(rs: &ReplicaSet, owned: &[P], now: Timestamp) -> Plan {
    let spec = rs.spec.clone().unwrap_or_default();
    let want = usize::try_from(spec.replicas.unwrap_or(1).max(0)).unwrap_or(0);
    let min_ready = i64::from(spec.min_ready_seconds.unwrap_or(0));
    let mut active: Vec<&Pod> = owned
        .iter()
        .map(Borrow::borrow)
        .filter(|p| is_active(p))
        .collect();
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
    // Borrowed, not cloned: a ReplicaSet's every status change counts all its pods, and a
    // burst's thousand pods made the label maps' copies most of the ReplicaSet controller's time.
    let fully_labeled = count(&|p: &Pod| {
        let labels = p.metadata.labels.as_ref();
        template_labels
            .iter()
            .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
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

/// How long a ReplicaSet waits at most for its cache to see the pods it created or deleted
/// (kube-controller-manager's `ExpectationsTimeout`): a change the watch never reports does not
/// stall it for good.
pub const EXPECTATIONS_TIMEOUT: Duration = Duration::from_secs(300);

/// The creations and deletions each ReplicaSet (by uid) made and its cache has not shown yet.
#[derive(Debug, Default)]
pub struct Expectations {
    by_set: HashMap<String, Pending>,
}

#[derive(Debug)]
struct Pending {
    creations: usize,
    deletions: HashSet<String>,
    since: Instant,
}

impl Expectations {
    /// Records that `set` is about to create `creations` pods and delete `deletions`.
    pub fn expect(&mut self, set: &str, creations: usize, deletions: &[String], now: Instant) {
        let p = self.by_set.entry(set.to_owned()).or_insert(Pending {
            creations: 0,
            deletions: HashSet::new(),
            since: now,
        });
        p.creations += creations;
        p.deletions.extend(deletions.iter().cloned());
        p.since = now;
    }

    /// The cache showed a new pod of `set`, or a creation failed.
    pub fn created(&mut self, set: &str) {
        if let Some(p) = self.by_set.get_mut(set) {
            p.creations = p.creations.saturating_sub(1);
        }
    }

    /// The cache showed pod `name` of `set` terminating or gone, or its deletion failed.
    pub fn deleted(&mut self, set: &str, name: &str) {
        if let Some(p) = self.by_set.get_mut(set) {
            p.deletions.remove(name);
        }
    }

    /// Whether `set` may create or delete pods: nothing it did is unseen, or it waited too long.
    pub fn satisfied(&mut self, set: &str, now: Instant) -> bool {
        let done = self.by_set.get(set).is_none_or(|p| {
            (p.creations == 0 && p.deletions.is_empty())
                || now.duration_since(p.since) >= EXPECTATIONS_TIMEOUT
        });
        if done {
            self.by_set.remove(set);
        }
        done
    }

    /// How long until `set`'s expectations time out, if it has any.
    pub fn left(&self, set: &str, now: Instant) -> Option<Duration> {
        self.by_set
            .get(set)
            .map(|p| EXPECTATIONS_TIMEOUT.saturating_sub(now.duration_since(p.since)))
    }

    /// Forgets everything: after a relist, the cache is the truth again.
    pub fn clear(&mut self) {
        self.by_set.clear();
    }
}

/// The uid of the pod's controller, if any.
fn controller_uid(pod: &Pod) -> Option<&str> {
    pod.metadata
        .owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true))
        .map(|r| r.uid.as_str())
}

struct Context {
    client: Client,
    pods: Store<Pod>,
    /// Turns true once the pod cache has its first listing (every waiter sees it).
    listed: tokio::sync::watch::Receiver<bool>,
    expectations: Mutex<Expectations>,
}

impl Context {
    fn expectations(&self) -> std::sync::MutexGuard<'_, Expectations> {
        self.expectations
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Lowers the expectations a pod event fulfils. Runs before the event reaches the cache, so
    /// a pod missing from the cache is new to it.
    fn observe(&self, event: &watcher::Event<Pod>) {
        match event {
            watcher::Event::Apply(pod) | watcher::Event::InitApply(pod) => {
                let Some(set) = controller_uid(pod) else {
                    return;
                };
                if pod.metadata.deletion_timestamp.is_some() {
                    self.expectations().deleted(set, &pod.name_any());
                } else if self.pods.get(&ObjectRef::from_obj(pod)).is_none() {
                    self.expectations().created(set);
                }
            }
            watcher::Event::Delete(pod) => {
                if let Some(set) = controller_uid(pod) {
                    self.expectations().deleted(set, &pod.name_any());
                }
            }
            watcher::Event::Init => {}
            watcher::Event::InitDone => self.expectations().clear(),
        }
    }
}

/// Runs the controller until `shutdown`.
pub async fn run(client: Client, shutdown: CancellationToken) {
    let sets: Api<ReplicaSet> = Api::all(client.clone());
    let (pods, writer) = reflector::store::<Pod>();
    let (listed_tx, listed) = tokio::sync::watch::channel(false);
    let ctx = Arc::new(Context {
        client: client.clone(),
        pods,
        listed,
        expectations: Mutex::default(),
    });
    let seen = ctx.clone();
    let pod_events = watcher(Api::<Pod>::all(client), watcher::Config::default())
        .default_backoff()
        .map_ok(move |event| {
            seen.observe(&event);
            if matches!(event, watcher::Event::InitDone) {
                listed_tx.send_replace(true);
            }
            event
        })
        .reflect(writer)
        .touched_objects();
    Controller::new(sets, watcher::Config::default())
        .owns_stream(pod_events)
        .graceful_shutdown_on(shutdown.cancelled_owned())
        .run(reconcile, error_policy, ctx)
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
    // Until the cache has listed, it would show no pod and every set would create them all.
    if ctx.listed.clone().wait_for(|l| *l).await.is_err() {
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    let uid = rs.metadata.uid.clone().unwrap_or_default();
    let selector = rs
        .spec
        .as_ref()
        .map(|s| s.selector.clone())
        .unwrap_or_default();
    let pods_api: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
    let mut owned: Vec<Arc<Pod>> = Vec::new();
    for pod in ctx.pods.state() {
        if pod.metadata.namespace.as_deref() != Some(namespace.as_str()) {
            continue;
        }
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
            owned.push(Arc::new(adopted));
        }
    }
    let plan = plan(&rs, &owned, Timestamp::now());
    let now = Instant::now();
    let manage = ctx.expectations().satisfied(&uid, now);
    let template = pod_from_template(&rs);
    // Beyond the burst cap, the rest is for the next pass, which need not wait for a change.
    let mut capped = manage && (plan.create > BURST_REPLICAS || plan.delete.len() > BURST_REPLICAS);
    let (post, delete) = (PostParams::default(), DeleteParams::default());
    let doomed = &plan.delete[..plan.delete.len().min(BURST_REPLICAS)];
    if manage {
        ctx.expectations()
            .expect(&uid, plan.create.min(BURST_REPLICAS), doomed, now);
        let mut batches = slow_start_batches(plan.create).into_iter();
        while let Some(size) = batches.next() {
            let created = join_all((0..size).map(|_| pods_api.create(&post, &template))).await;
            let (mut refused, mut failed, mut missing) = (false, None, 0);
            for result in created {
                let Err(e) = result else { continue };
                missing += 1;
                // The namespace is terminating, or a quota or webhook refuses: the next
                // change retries.
                if is_status(&e, 403) || is_status(&e, 409) {
                    refused = true;
                } else {
                    failed = Some(e);
                }
            }
            if missing > 0 {
                // What failed, and what this pass will not send, never shows up in the cache.
                let unsent: usize = batches.clone().sum();
                let mut ex = ctx.expectations();
                for _ in 0..missing + unsent {
                    ex.created(&uid);
                }
            }
            if let Some(e) = failed {
                return Err(e.into());
            }
            if refused {
                capped = false;
                break;
            }
        }
        let deleted = join_all(doomed.iter().map(|name| pods_api.delete(name, &delete))).await;
        let mut failed = None;
        for (name, result) in doomed.iter().zip(deleted) {
            match result {
                Ok(_) => {}
                Err(e) => {
                    ctx.expectations().deleted(&uid, name);
                    if !is_status(&e, 404) {
                        failed = Some(e);
                    }
                }
            }
        }
        if let Some(e) = failed {
            return Err(e.into());
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
    // Waiting on expectations: the pod events that meet them trigger the next pass, and the
    // timeout ends the wait if they never come.
    let expiry = (!manage)
        .then(|| ctx.expectations().left(&uid, now))
        .flatten();
    Ok(
        match soon.into_iter().chain(plan.requeue).chain(expiry).min() {
            Some(after) => Action::requeue(after),
            None => Action::await_change(),
        },
    )
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
    fn expectations_hold_a_set_until_its_cache_shows_what_it_did() {
        let t0 = Instant::now();
        let mut ex = Expectations::default();
        assert!(ex.satisfied("u1", t0), "a set that did nothing is free");
        ex.expect("u1", 2, &["old".to_owned()], t0);
        assert!(!ex.satisfied("u1", t0));
        assert!(ex.satisfied("u2", t0), "another set is not held");
        ex.created("u1");
        ex.deleted("u1", "old");
        assert!(!ex.satisfied("u1", t0), "one creation is still unseen");
        // Seeing more than was expected (an adopted or unrelated pod) does not go negative.
        ex.created("u1");
        ex.created("u1");
        assert!(ex.satisfied("u1", t0));
        ex.expect("u1", 1, &[], t0);
        assert!(!ex.satisfied("u1", t0), "the surplus was not banked");
    }

    #[test]
    fn expectations_time_out_and_a_relist_clears_them() {
        let t0 = Instant::now();
        let mut ex = Expectations::default();
        ex.expect("u1", 1, &[], t0);
        let later = t0 + Duration::from_secs(100);
        assert!(!ex.satisfied("u1", later));
        assert_eq!(
            ex.left("u1", later),
            Some(EXPECTATIONS_TIMEOUT - Duration::from_secs(100))
        );
        assert!(ex.satisfied("u1", t0 + EXPECTATIONS_TIMEOUT));
        assert_eq!(ex.left("u1", t0), None, "met expectations are forgotten");
        ex.expect("u1", 3, &["a".to_owned()], t0);
        ex.clear();
        assert!(ex.satisfied("u1", t0));
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
