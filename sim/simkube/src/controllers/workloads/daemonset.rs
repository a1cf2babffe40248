//! The DaemonSet controller: one pod per eligible node, pinned there through required node
//! affinity (`matchFields metadata.name In [node]`, which the scheduler then binds), with the
//! controller's default tolerations; rolling updates one node at a time within
//! `maxUnavailable` (surge is not supported: `maxSurge` 0) or on delete; the status counts
//! kube-controller-manager reports.
//!
//! [`plan`] decides from the DaemonSet, the nodes and the pods it controls; `reconcile` reads
//! and applies.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetStatus};
use k8s_openapi::api::core::v1::{
    Affinity, Node, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, Pod,
    PodSpec, Taint, Toleration,
};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Client, ResourceExt as _};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::deployment::{scaled_value, template_hash};
use super::replicaset::{is_available, ready_since};
use super::{controlled_by, controller_ref, selector_query};
use crate::controllers::is_status;
use crate::controllers::scheduler::{TAINT_NOT_READY, TAINT_UNREACHABLE, TAINT_UNSCHEDULABLE};

/// Label telling apart the pods of each DaemonSet template.
pub const REVISION_HASH: &str = "controller-revision-hash";
/// Label with the DaemonSet's generation when the pod was created (deprecated, still set).
pub const TEMPLATE_GENERATION: &str = "pod-template-generation";

/// Errors of one reconcile pass.
#[derive(Debug, thiserror::Error)]
pub enum DaemonSetError {
    /// The API server refused or failed a request.
    #[error("daemonset controller: {0}")]
    Kube(#[from] kube::Error),
    /// The pod template could not be encoded for hashing.
    #[error("daemonset controller: cannot encode the pod template of {name}")]
    Encode {
        /// The DaemonSet.
        name: String,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
}

/// The tolerations the DaemonSet controller adds to every pod it creates
/// (`AddOrUpdateDaemonPodTolerations`), so daemons survive node conditions and cordons.
pub fn default_tolerations(host_network: bool) -> Vec<Toleration> {
    let exists = |key: &str, effect: &str| Toleration {
        key: Some(key.into()),
        operator: Some("Exists".into()),
        effect: Some(effect.into()),
        ..Toleration::default()
    };
    let mut out = vec![
        exists(TAINT_NOT_READY, "NoExecute"),
        exists(TAINT_UNREACHABLE, "NoExecute"),
        exists("node.kubernetes.io/disk-pressure", "NoSchedule"),
        exists("node.kubernetes.io/memory-pressure", "NoSchedule"),
        exists("node.kubernetes.io/pid-pressure", "NoSchedule"),
        exists(TAINT_UNSCHEDULABLE, "NoSchedule"),
    ];
    if host_network {
        out.push(exists(
            "node.kubernetes.io/network-unavailable",
            "NoSchedule",
        ));
    }
    out
}

/// The template's pod spec with the default tolerations merged in (a toleration already
/// present for the same key and effect is kept as written).
fn spec_with_tolerations(ds: &DaemonSet) -> PodSpec {
    let mut spec = ds
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.clone())
        .unwrap_or_default();
    let mut tolerations = spec.tolerations.take().unwrap_or_default();
    for t in default_tolerations(spec.host_network == Some(true)) {
        if !tolerations
            .iter()
            .any(|have| have.key == t.key && have.effect == t.effect)
        {
            tolerations.push(t);
        }
    }
    spec.tolerations = Some(tolerations);
    spec
}

/// Pins `spec` to `node` as the real controller does: every required node-affinity term gets
/// its `matchFields` replaced by `metadata.name In [node]` (a lone term when there were none).
fn pin_to_node(spec: &mut PodSpec, node: &str) {
    let field = NodeSelectorRequirement {
        key: "metadata.name".into(),
        operator: "In".into(),
        values: Some(vec![node.into()]),
    };
    let affinity = spec.affinity.get_or_insert_with(Affinity::default);
    let node_affinity = affinity
        .node_affinity
        .get_or_insert_with(NodeAffinity::default);
    let required = node_affinity
        .required_during_scheduling_ignored_during_execution
        .get_or_insert_with(NodeSelector::default);
    if required.node_selector_terms.is_empty() {
        required
            .node_selector_terms
            .push(NodeSelectorTerm::default());
    }
    for term in &mut required.node_selector_terms {
        term.match_fields = Some(vec![field.clone()]);
    }
}

/// The node a daemon pod is for: its `nodeName`, or before binding the node its affinity pins.
pub fn target_node(pod: &Pod) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    if let Some(name) = spec.node_name.as_deref().filter(|n| !n.is_empty()) {
        return Some(name.into());
    }
    let terms = &spec
        .affinity
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required_during_scheduling_ignored_during_execution
        .as_ref()?
        .node_selector_terms;
    terms.iter().find_map(|term| {
        term.match_fields.iter().flatten().find_map(|f| {
            let values = f.values.as_deref().unwrap_or_default();
            (f.key == "metadata.name" && f.operator == "In" && values.len() == 1)
                .then(|| values[0].clone())
        })
    })
}

/// Whether a pod of this DaemonSet should run on `node`, and whether one already there may
/// stay (it may while only `NoSchedule` taints are untolerated), as `NodeShouldRunDaemonPod`.
pub fn node_should_run(ds: &DaemonSet, node: &Node) -> (bool, bool) {
    let mut spec = spec_with_tolerations(ds);
    let name = node.metadata.name.clone().unwrap_or_default();
    if spec
        .node_name
        .as_deref()
        .is_some_and(|n| !n.is_empty() && n != name)
    {
        return (false, false);
    }
    spec.node_name = None;
    let probe = Pod {
        spec: Some(spec),
        ..Pod::default()
    };
    if !crate::controllers::scheduler::matches_node_affinity(&probe, node) {
        return (false, false);
    }
    let tolerations = probe
        .spec
        .as_ref()
        .and_then(|s| s.tolerations.clone())
        .unwrap_or_default();
    let untolerated = |effect: &str| {
        node.spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .into_iter()
            .flatten()
            .any(|taint: &Taint| {
                taint.effect == effect
                    && !tolerations
                        .iter()
                        .any(|t| crate::controllers::scheduler::tolerates(t, taint))
            })
    };
    let continue_running = !untolerated("NoExecute");
    (
        continue_running && !untolerated("NoSchedule"),
        continue_running,
    )
}

/// What one pass does to a DaemonSet.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Plan {
    /// Nodes that need a pod, by name.
    pub create: Vec<String>,
    /// Pods to delete, by name.
    pub delete: Vec<String>,
    /// Pods to delete at once (grace 0) because their node is gone, as pod GC would.
    pub force_delete: Vec<String>,
    /// The status to report.
    pub status: DaemonSetStatus,
    /// When to look again because a ready pod becomes available then.
    pub requeue: Option<Duration>,
}

fn is_failed(pod: &Pod) -> bool {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Failed")
}

fn created(pod: &Pod) -> Option<Timestamp> {
    pod.metadata.creation_timestamp.as_ref().map(|t| t.0)
}

fn hash_of(pod: &Pod) -> Option<&str> {
    pod.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(REVISION_HASH))
        .map(String::as_str)
}

fn count(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// Plans a pass from the DaemonSet, every node, the pods it controls and its template's hash.
pub fn plan(ds: &DaemonSet, nodes: &[Node], owned: &[Pod], hash: &str, now: Timestamp) -> Plan {
    let spec = ds.spec.clone().unwrap_or_default();
    let min_ready = i64::from(spec.min_ready_seconds.unwrap_or(0));
    let mut by_node: BTreeMap<String, Vec<&Pod>> = BTreeMap::new();
    let mut out = Plan::default();
    for pod in owned {
        match target_node(pod) {
            Some(node) => by_node.entry(node).or_default().push(pod),
            None => out.delete.push(pod.name_any()),
        }
    }
    for pods in by_node.values_mut() {
        pods.sort_by_key(|p| (created(p), p.name_any()));
    }
    let deleting = ds.metadata.deletion_timestamp.is_some();
    let mut should_run_on = BTreeMap::new();
    for node in nodes {
        let name = node.metadata.name.clone().unwrap_or_default();
        let (run, stay) = node_should_run(ds, node);
        should_run_on.insert(name.clone(), run);
        let pods = by_node.get(&name).map(Vec::as_slice).unwrap_or_default();
        let live: Vec<&&Pod> = pods
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect();
        if deleting {
            continue;
        }
        if run || stay {
            let mut running = Vec::new();
            for pod in live {
                if is_failed(pod) {
                    out.delete.push(pod.name_any());
                } else {
                    running.push(pod);
                }
            }
            if running.is_empty() && run {
                out.create.push(name);
            }
            // Without surge one pod per node: the oldest stays.
            out.delete
                .extend(running.iter().skip(1).map(|p| p.name_any()));
        } else {
            out.delete.extend(live.iter().map(|p| p.name_any()));
        }
    }
    for (node, pods) in &by_node {
        if !should_run_on.contains_key(node) {
            out.force_delete.extend(pods.iter().map(|p| p.name_any()));
        }
    }

    let desired = should_run_on.values().filter(|run| **run).count();
    let rolling = spec
        .update_strategy
        .as_ref()
        .and_then(|s| s.type_.as_deref())
        .is_none_or(|t| t == "RollingUpdate");
    if rolling && !deleting {
        let max_unavailable = spec
            .update_strategy
            .as_ref()
            .and_then(|s| s.rolling_update.as_ref())
            .and_then(|r| r.max_unavailable.as_ref());
        let mut budget =
            usize::try_from(scaled_value(max_unavailable, count(desired), "1", true)).unwrap_or(0);
        if budget == 0 {
            budget = 1;
        }
        // A node that should run a daemon but has no pod at all (its old one already gone, the
        // new one not yet created) is unavailable too, as upstream's `updatedDesiredNodeCounts`
        // counts it; otherwise a pass in that gap would take a second node down.
        for (node, run) in &should_run_on {
            if *run {
                by_node.entry(node.clone()).or_default();
            }
        }
        out.delete
            .extend(rolling_deletions(&by_node, hash, min_ready, now, budget));
    }
    out.delete.sort();
    out.delete.dedup();

    let mut status = DaemonSetStatus {
        desired_number_scheduled: count(desired),
        observed_generation: ds.metadata.generation,
        collision_count: ds.status.as_ref().and_then(|s| s.collision_count),
        conditions: ds.status.as_ref().and_then(|s| s.conditions.clone()),
        ..DaemonSetStatus::default()
    };
    let (mut ready, mut available, mut updated) = (0, 0, 0);
    for (node, run) in &should_run_on {
        let first = by_node.get(node).and_then(|pods| pods.first());
        match (run, first) {
            (true, Some(pod)) => {
                status.current_number_scheduled += 1;
                ready += usize::from(ready_since(pod).is_some());
                available += usize::from(is_available(pod, min_ready, now));
                updated += usize::from(hash_of(pod) == Some(hash));
            }
            (false, Some(_)) => status.number_misscheduled += 1,
            _ => {}
        }
    }
    status.number_ready = count(ready);
    status.number_available = Some(count(available));
    status.updated_number_scheduled = Some(count(updated));
    status.number_unavailable = Some(count(desired.saturating_sub(available)));
    out.status = status;
    if min_ready > 0 {
        out.requeue = owned
            .iter()
            .filter_map(ready_since)
            .map(|since| min_ready - (now.as_second() - since.as_second()))
            .filter(|left| *left > 0)
            .min()
            .map(|left| Duration::from_secs(u64::try_from(left).unwrap_or(1)));
    }
    out
}

/// The old pods a RollingUpdate without surge deletes now (`rollingUpdate` with `maxSurge` 0):
/// unavailable old pods always, available ones while fewer than `budget` nodes are unavailable.
fn rolling_deletions(
    by_node: &BTreeMap<String, Vec<&Pod>>,
    hash: &str,
    min_ready: i64,
    now: Timestamp,
    budget: usize,
) -> Vec<String> {
    let mut unavailable = 0;
    let mut replace = Vec::new();
    let mut candidates = Vec::new();
    for pods in by_node.values() {
        let live: Vec<&&Pod> = pods
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect();
        let (new, old): (Vec<&&Pod>, Vec<&&Pod>) =
            live.iter().partition(|p| hash_of(p) == Some(hash));
        match (new.as_slice(), old.as_slice()) {
            ([new], []) => {
                if !is_available(new, min_ready, now) {
                    unavailable += 1;
                }
            }
            ([], [old]) => {
                if !is_available(old, min_ready, now) {
                    replace.push(old.name_any());
                } else if unavailable < budget {
                    candidates.push(old.name_any());
                }
            }
            // Nothing live, or both or several: the manage step settles it; it counts as
            // unavailable meanwhile.
            _ => unavailable += 1,
        }
    }
    let room = budget.saturating_sub(unavailable).min(candidates.len());
    replace.extend(candidates.into_iter().take(room));
    replace
}

/// The pod the DaemonSet runs on `node`.
pub fn pod_for_node(ds: &DaemonSet, node: &str, hash: &str) -> Pod {
    let template = ds
        .spec
        .as_ref()
        .map(|s| s.template.clone())
        .unwrap_or_default();
    let tmeta = template.metadata.unwrap_or_default();
    let mut labels = tmeta.labels.unwrap_or_default();
    labels.insert(REVISION_HASH.into(), hash.into());
    labels.insert(
        TEMPLATE_GENERATION.into(),
        ds.metadata.generation.unwrap_or(1).to_string(),
    );
    let mut spec = spec_with_tolerations(ds);
    pin_to_node(&mut spec, node);
    Pod {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}-", ds.name_any())),
            namespace: ds.namespace(),
            labels: Some(labels),
            annotations: tmeta.annotations,
            finalizers: tmeta.finalizers,
            owner_references: controller_ref(ds).map(|r| vec![r]),
            ..ObjectMeta::default()
        },
        spec: Some(spec),
        status: None,
    }
}

struct Context {
    client: Client,
}

/// Runs the controller until `shutdown`.
pub async fn run(client: Client, shutdown: CancellationToken) {
    let sets: Api<DaemonSet> = Api::all(client.clone());
    let pods: Api<Pod> = Api::all(client.clone());
    let nodes: Api<Node> = Api::all(client.clone());
    let controller =
        Controller::new(sets, watcher::Config::default()).owns(pods, watcher::Config::default());
    // Any node change may change where every DaemonSet runs.
    let store = controller.store();
    controller
        .watches(nodes, watcher::Config::default(), move |_node| {
            store
                .state()
                .iter()
                .map(|ds| ObjectRef::from_obj(ds.as_ref()))
                .collect::<Vec<_>>()
        })
        .graceful_shutdown_on(shutdown.cancelled_owned())
        .run(reconcile, error_policy, Arc::new(Context { client }))
        .for_each(|_| async {})
        .await;
}

fn error_policy(_ds: Arc<DaemonSet>, error: &DaemonSetError, _ctx: Arc<Context>) -> Action {
    tracing::warn!(%error, "daemonset pass failed; retrying");
    Action::requeue(Duration::from_secs(1))
}

async fn reconcile(cached: Arc<DaemonSet>, ctx: Arc<Context>) -> Result<Action, DaemonSetError> {
    let namespace = cached.namespace().unwrap_or_default();
    let sets: Api<DaemonSet> = Api::namespaced(ctx.client.clone(), &namespace);
    let Some(ds) = sets.get_opt(&cached.name_any()).await? else {
        return Ok(Action::await_change());
    };
    let uid = ds.metadata.uid.clone().unwrap_or_default();
    let spec = ds.spec.clone().unwrap_or_default();
    let hash = template_hash(
        &spec.template,
        ds.status.as_ref().and_then(|s| s.collision_count),
    )
    .map_err(|source| DaemonSetError::Encode {
        name: ds.name_any(),
        source,
    })?;
    let pods_api: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
    let owned: Vec<Pod> = pods_api
        .list(&ListParams::default().labels(&selector_query(&spec.selector)))
        .await?
        .items
        .into_iter()
        .filter(|p| controlled_by(p.metadata.owner_references.as_ref(), &uid))
        .collect();
    let nodes = Api::<Node>::all(ctx.client.clone())
        .list(&ListParams::default())
        .await?
        .items;
    let plan = plan(&ds, &nodes, &owned, &hash, Timestamp::now());
    for node in &plan.create {
        match pods_api
            .create(&PostParams::default(), &pod_for_node(&ds, node, &hash))
            .await
        {
            Ok(_) => {}
            // The namespace is terminating, or a quota refuses: the next change retries.
            Err(e) if is_status(&e, 403) || is_status(&e, 409) => break,
            Err(e) => return Err(e.into()),
        }
    }
    let force = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    };
    let deletions = plan
        .delete
        .iter()
        .map(|n| (n, DeleteParams::default()))
        .chain(plan.force_delete.iter().map(|n| (n, force.clone())));
    for (name, params) in deletions {
        match pods_api.delete(name, &params).await {
            Ok(_) => {}
            Err(e) if is_status(&e, 404) => {}
            Err(e) => return Err(e.into()),
        }
    }
    if ds.status.as_ref() != Some(&plan.status) {
        let patch = json!({"status": plan.status});
        match sets
            .patch_status(
                &ds.name_any(),
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
    Ok(match plan.requeue {
        Some(after) => Action::requeue(after),
        None => Action::await_change(),
    })
}

#[cfg(test)]
mod tests;
