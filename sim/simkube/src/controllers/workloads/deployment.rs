//! The Deployment controller: one ReplicaSet per pod template (`<deployment>-<hash>`, label
//! `pod-template-hash`), rolled by the RollingUpdate (maxSurge/maxUnavailable) or Recreate
//! strategy, with revision annotations, status counts, the Available and Progressing
//! conditions, and old ReplicaSets pruned to `revisionHistoryLimit`.
//!
//! The rollout arithmetic ([`rolling_steps`], [`recreate_steps`], [`resolve_fenceposts`]) is
//! pure and mirrors the real controller's, so a rollout moves in the same steps.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentCondition, DeploymentStatus, ReplicaSet, ReplicaSetSpec,
};
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Client, ResourceExt as _};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::{
    DESIRED_REPLICAS_ANNOTATION, MAX_REPLICAS_ANNOTATION, POD_TEMPLATE_HASH, REVISION_ANNOTATION,
    controlled_by, controller_ref, selector_query,
};
use crate::controllers::is_status;

/// Errors of one reconcile pass.
#[derive(Debug, thiserror::Error)]
pub enum DeploymentError {
    /// The API server refused or failed a request.
    #[error("deployment controller: {0}")]
    Kube(#[from] kube::Error),
    /// A pod template could not be encoded for hashing.
    #[error("deployment controller: cannot encode the pod template: {0}")]
    Encode(#[from] serde_json::Error),
}

/// The alphabet of Kubernetes' "safe" encoding (no vowels, no confusable digits).
const SAFE_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
/// Old ReplicaSets kept by default.
const DEFAULT_HISTORY: i32 = 10;
/// `progressDeadlineSeconds` when unset (the API server defaults it to this).
pub const DEFAULT_PROGRESS_DEADLINE: i32 = 600;

/// The `pod-template-hash` of a template: FNV-1a (32 bit) of its canonical JSON and the
/// collision count, printed in decimal and mapped through the safe alphabet, as the real
/// controller spells it.
pub fn template_hash(
    template: &PodTemplateSpec,
    collision_count: Option<i32>,
) -> Result<String, serde_json::Error> {
    let mut bytes = serde_json::to_vec(template)?;
    if let Some(n) = collision_count {
        bytes.extend_from_slice(&n.to_le_bytes());
    }
    let mut hash: u32 = 0x811c_9dc5;
    for b in bytes {
        hash ^= u32::from(b);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    Ok(hash
        .to_string()
        .bytes()
        .map(|b| SAFE_ALPHABET[usize::from(b) % SAFE_ALPHABET.len()] as char)
        .collect())
}

/// Resolves an int-or-percent against `total`, rounding percentages up or down.
pub fn scaled_value(value: Option<&IntOrString>, total: i32, default: &str, round_up: bool) -> i32 {
    let text = match value {
        Some(IntOrString::Int(n)) => return *n,
        Some(IntOrString::String(s)) => s.as_str(),
        None => default,
    };
    let Some(percent) = text.strip_suffix('%').and_then(|p| p.parse::<i64>().ok()) else {
        return text.parse().unwrap_or(0);
    };
    let product = percent * i64::from(total);
    let value = if round_up {
        (product + 99) / 100
    } else {
        product / 100
    };
    i32::try_from(value).unwrap_or(i32::MAX)
}

/// (maxSurge, maxUnavailable) for `replicas`: surge rounds up, unavailability down, and both
/// zero becomes an unavailability of one, as in the real controller.
pub fn resolve_fenceposts(
    max_surge: Option<&IntOrString>,
    max_unavailable: Option<&IntOrString>,
    replicas: i32,
) -> (i32, i32) {
    let surge = scaled_value(max_surge, replicas, "25%", true);
    let unavailable = scaled_value(max_unavailable, replicas, "25%", false);
    if surge == 0 && unavailable == 0 {
        (0, 1)
    } else {
        (surge, unavailable)
    }
}

/// A ReplicaSet as the rollout arithmetic sees it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RsState {
    /// Name.
    pub name: String,
    /// `spec.replicas`.
    pub replicas: i32,
    /// `status.replicas` (active pods).
    pub actual: i32,
    /// `status.readyReplicas`.
    pub ready: i32,
    /// `status.availableReplicas`.
    pub available: i32,
}

/// One change a rollout pass makes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Create the new ReplicaSet with this many replicas.
    CreateNew(i32),
    /// Set a ReplicaSet's `spec.replicas`.
    Scale(String, i32),
}

/// One RollingUpdate pass. `old` is oldest first. Like the real controller, a pass that scales
/// the new ReplicaSet stops there; otherwise it first scales down unhealthy old replicas, then
/// available ones as far as `replicas - maxUnavailable` allows.
pub fn rolling_steps(
    replicas: i32,
    surge: i32,
    unavailable: i32,
    new: Option<&RsState>,
    old: &[RsState],
) -> Vec<Step> {
    let new_spec = new.map_or(0, |n| n.replicas);
    let current_total: i32 = old.iter().map(|r| r.replicas).sum::<i32>() + new_spec;
    let target_new = if new_spec >= replicas {
        replicas
    } else {
        let max_total = replicas + surge;
        if current_total >= max_total {
            new_spec
        } else {
            new_spec + (max_total - current_total).min(replicas - new_spec)
        }
    };
    match new {
        None => return vec![Step::CreateNew(target_new)],
        Some(n) if target_new != n.replicas => {
            return vec![Step::Scale(n.name.clone(), target_new)];
        }
        Some(_) => {}
    }
    if old.iter().all(|r| r.replicas == 0) {
        return Vec::new();
    }
    let min_available = replicas - unavailable;
    let new_unavailable = new.map_or(0, |n| n.replicas - n.available);
    let max_scaled_down = current_total - min_available - new_unavailable;
    if max_scaled_down <= 0 {
        return Vec::new();
    }
    let mut working: Vec<i32> = old.iter().map(|r| r.replicas).collect();
    let mut cleaned = 0;
    for (i, rs) in old.iter().enumerate() {
        if cleaned >= max_scaled_down {
            break;
        }
        let unhealthy = working[i] - rs.available;
        if working[i] == 0 || unhealthy <= 0 {
            continue;
        }
        let by = (max_scaled_down - cleaned).min(unhealthy);
        working[i] -= by;
        cleaned += by;
    }
    let available: i32 =
        old.iter().map(|r| r.available).sum::<i32>() + new.map_or(0, |n| n.available);
    if available > min_available {
        let budget = available - min_available;
        let mut done = 0;
        for count in working.iter_mut() {
            if done >= budget {
                break;
            }
            if *count == 0 {
                continue;
            }
            let by = (*count).min(budget - done);
            *count -= by;
            done += by;
        }
    }
    old.iter()
        .zip(working)
        .filter(|(rs, n)| rs.replicas != *n)
        .map(|(rs, n)| Step::Scale(rs.name.clone(), n))
        .collect()
}

/// One Recreate pass: old ReplicaSets go to zero, and only once their pods are gone does the
/// new one come up.
pub fn recreate_steps(
    replicas: i32,
    new: Option<&RsState>,
    old: &[RsState],
    old_pods_running: bool,
) -> Vec<Step> {
    let down: Vec<Step> = old
        .iter()
        .filter(|r| r.replicas > 0)
        .map(|r| Step::Scale(r.name.clone(), 0))
        .collect();
    if !down.is_empty() || old_pods_running {
        return down;
    }
    match new {
        None => vec![Step::CreateNew(replicas)],
        Some(n) if n.replicas != replicas => vec![Step::Scale(n.name.clone(), replicas)],
        Some(_) => Vec::new(),
    }
}

fn state_of(rs: &ReplicaSet) -> RsState {
    let status = rs.status.clone().unwrap_or_default();
    RsState {
        name: rs.name_any(),
        replicas: rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0),
        actual: status.replicas,
        ready: status.ready_replicas.unwrap_or(0),
        available: status.available_replicas.unwrap_or(0),
    }
}

fn revision_of(rs: &ReplicaSet) -> i64 {
    rs.annotations()
        .get(REVISION_ANNOTATION)
        .and_then(|r| r.parse().ok())
        .unwrap_or(0)
}

fn condition(
    previous: Option<&Vec<DeploymentCondition>>,
    type_: &str,
    status: &str,
    reason: &str,
    message: String,
    now: Timestamp,
) -> DeploymentCondition {
    let old = previous.into_iter().flatten().find(|c| c.type_ == type_);
    if let Some(old) = old
        && old.status == status
        && old.reason.as_deref() == Some(reason)
        && old.message.as_deref() == Some(message.as_str())
    {
        return old.clone();
    }
    let transition = match old {
        Some(old) if old.status == status => old.last_transition_time.clone(),
        _ => Some(Time(now)),
    };
    DeploymentCondition {
        type_: type_.into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some(message),
        last_update_time: Some(Time(now)),
        last_transition_time: transition,
    }
}

/// The status a Deployment reports for its ReplicaSets; `created_new` says this pass created
/// the new ReplicaSet.
pub fn deployment_status(
    deploy: &Deployment,
    new: Option<&RsState>,
    old: &[RsState],
    created_new: bool,
    now: Timestamp,
) -> DeploymentStatus {
    let spec = deploy.spec.clone().unwrap_or_default();
    let replicas = spec.replicas.unwrap_or(1);
    let all: Vec<&RsState> = old.iter().chain(new).collect();
    let actual: i32 = all.iter().map(|r| r.actual).sum();
    let spec_total: i32 = all.iter().map(|r| r.replicas).sum();
    let ready: i32 = all.iter().map(|r| r.ready).sum();
    let available: i32 = all.iter().map(|r| r.available).sum();
    let updated = new.map_or(0, |n| n.actual);
    let unavailable_allowed = match spec.strategy.as_ref().and_then(|s| s.type_.as_deref()) {
        Some("Recreate") => 0,
        _ => {
            let rolling = spec
                .strategy
                .as_ref()
                .and_then(|s| s.rolling_update.clone())
                .unwrap_or_default();
            resolve_fenceposts(
                rolling.max_surge.as_ref(),
                rolling.max_unavailable.as_ref(),
                replicas,
            )
            .1
        }
    };
    let previous = deploy.status.as_ref().and_then(|s| s.conditions.as_ref());
    let available_condition = if available >= replicas - unavailable_allowed {
        condition(
            previous,
            "Available",
            "True",
            "MinimumReplicasAvailable",
            "Deployment has minimum availability.".into(),
            now,
        )
    } else {
        condition(
            previous,
            "Available",
            "False",
            "MinimumReplicasUnavailable",
            "Deployment does not have minimum availability.".into(),
            now,
        )
    };
    let mut conditions = vec![available_condition];
    let mut status = DeploymentStatus {
        observed_generation: deploy.metadata.generation,
        replicas: Some(actual),
        updated_replicas: Some(updated),
        ready_replicas: Some(ready),
        available_replicas: Some(available),
        unavailable_replicas: Some((spec_total - available).max(0)),
        conditions: None,
        collision_count: deploy.status.as_ref().and_then(|s| s.collision_count),
        ..DeploymentStatus::default()
    };
    let progressing = previous
        .into_iter()
        .flatten()
        .find(|c| c.type_ == "Progressing")
        .cloned();
    let progressing = if spec.paused == Some(true) {
        Some(condition(
            previous,
            "Progressing",
            "Unknown",
            "DeploymentPaused",
            "Deployment is paused".into(),
            now,
        ))
    } else {
        rollout_progress(deploy, &status, new, progressing, created_new, now)
    };
    conditions.extend(progressing);
    status.conditions = Some(conditions);
    status
}

/// The `Progressing` condition after one pass, as the real controller's `syncRolloutStatus`
/// decides it: `NewReplicaSetCreated` when this pass created the new ReplicaSet,
/// `NewReplicaSetAvailable` once the rollout completed, `ReplicaSetUpdated` (with a fresh
/// `lastUpdateTime`) whenever it made progress since the last status, and `False` with
/// `ProgressDeadlineExceeded` once `progressDeadlineSeconds` passed since the last progress.
pub fn rollout_progress(
    deploy: &Deployment,
    status: &DeploymentStatus,
    new: Option<&RsState>,
    current: Option<DeploymentCondition>,
    created_new: bool,
    now: Timestamp,
) -> Option<DeploymentCondition> {
    let Some(n) = new else {
        return current;
    };
    let spec = deploy.spec.clone().unwrap_or_default();
    let deadline = spec
        .progress_deadline_seconds
        .unwrap_or(DEFAULT_PROGRESS_DEADLINE);
    let has_deadline = deadline != i32::MAX;
    let fresh = |status: &str, reason: &str, message: String| DeploymentCondition {
        type_: "Progressing".into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some(message),
        last_update_time: Some(Time(now)),
        last_transition_time: Some(Time(now)),
    };
    // `SetDeploymentCondition`: the same status and reason leave the condition alone; the same
    // status keeps its transition time.
    let set = |current: Option<DeploymentCondition>, mut want: DeploymentCondition| match current {
        Some(c) if c.status == want.status && c.reason == want.reason => c,
        Some(c) if c.status == want.status => {
            want.last_transition_time = c.last_transition_time;
            want
        }
        _ => want,
    };
    let mut current = current;
    if has_deadline {
        if created_new {
            let created = fresh(
                "True",
                "NewReplicaSetCreated",
                format!("Created new replica set \"{}\"", n.name),
            );
            current = Some(set(current, created));
        } else if current.is_none() {
            let found = fresh(
                "True",
                "FoundNewReplicaSet",
                format!("Found new replica set \"{}\"", n.name),
            );
            current = Some(found);
        }
    }
    let replicas = spec.replicas.unwrap_or(1);
    let reason_is = |c: &Option<DeploymentCondition>, reason: &str| {
        c.as_ref().and_then(|c| c.reason.as_deref()) == Some(reason)
    };
    let complete_before =
        status.replicas == status.updated_replicas && reason_is(&current, "NewReplicaSetAvailable");
    if !has_deadline || complete_before {
        return current;
    }
    let complete = status.updated_replicas == Some(replicas)
        && status.replicas == Some(replicas)
        && status.available_replicas == Some(replicas)
        && status.observed_generation >= deploy.metadata.generation;
    let before = deploy.status.clone().unwrap_or_default();
    let old_replicas =
        |s: &DeploymentStatus| s.replicas.unwrap_or(0) - s.updated_replicas.unwrap_or(0);
    let progressed = status.updated_replicas.unwrap_or(0) > before.updated_replicas.unwrap_or(0)
        || old_replicas(status) < old_replicas(&before)
        || status.ready_replicas.unwrap_or(0) > before.ready_replicas.unwrap_or(0)
        || status.available_replicas.unwrap_or(0) > before.available_replicas.unwrap_or(0);
    if complete {
        let done = fresh(
            "True",
            "NewReplicaSetAvailable",
            format!("ReplicaSet \"{}\" has successfully progressed.", n.name),
        );
        return Some(set(current, done));
    }
    if progressed {
        // Progress refreshes `lastUpdateTime` even when the reason stays the same: the
        // deadline counts from the last progress.
        let mut updated = fresh(
            "True",
            "ReplicaSetUpdated",
            format!("ReplicaSet \"{}\" is progressing.", n.name),
        );
        if let Some(c) = &current
            && c.status == "True"
        {
            updated.last_transition_time = c.last_transition_time.clone();
        }
        return Some(updated);
    }
    if let Some(since) = progress_deadline(deploy, current.as_ref())
        && since <= now
    {
        let timed_out = fresh(
            "False",
            "ProgressDeadlineExceeded",
            format!("ReplicaSet \"{}\" has timed out progressing.", n.name),
        );
        return Some(set(current, timed_out));
    }
    current
}

/// When a rollout without progress since its `Progressing` condition's `lastUpdateTime` runs
/// out of time (`None` when there is no deadline to watch: none set, complete, or timed out).
pub fn progress_deadline(
    deploy: &Deployment,
    progressing: Option<&DeploymentCondition>,
) -> Option<Timestamp> {
    let deadline = deploy
        .spec
        .as_ref()
        .and_then(|s| s.progress_deadline_seconds)
        .unwrap_or(DEFAULT_PROGRESS_DEADLINE);
    let c = progressing?;
    if deadline == i32::MAX
        || deploy.spec.as_ref().and_then(|s| s.paused) == Some(true)
        || matches!(
            c.reason.as_deref(),
            Some("NewReplicaSetAvailable" | "ProgressDeadlineExceeded")
        )
    {
        return None;
    }
    let from = c.last_update_time.as_ref()?.0;
    from.checked_add(k8s_openapi::jiff::SignedDuration::from_secs(i64::from(
        deadline,
    )))
    .ok()
}

/// Old ReplicaSets beyond the history limit, oldest revision first: the ones to delete.
pub fn history_to_prune(old: &[ReplicaSet], limit: i32) -> Vec<String> {
    let mut idle: Vec<&ReplicaSet> = old
        .iter()
        .filter(|rs| {
            let s = state_of(rs);
            s.replicas == 0 && s.actual == 0 && rs.metadata.deletion_timestamp.is_none()
        })
        .collect();
    let keep = usize::try_from(limit.max(0)).unwrap_or(0);
    if idle.len() <= keep {
        return Vec::new();
    }
    idle.sort_by_key(|rs| revision_of(rs));
    idle[..idle.len() - keep]
        .iter()
        .map(|rs| rs.name_any())
        .collect()
}

/// The ReplicaSet a Deployment creates for its current template.
pub fn new_replica_set(
    deploy: &Deployment,
    hash: &str,
    replicas: i32,
    revision: i64,
    max_replicas: i32,
) -> ReplicaSet {
    let spec = deploy.spec.clone().unwrap_or_default();
    let mut template = spec.template.clone();
    let tmeta = template.metadata.get_or_insert_with(ObjectMeta::default);
    tmeta
        .labels
        .get_or_insert_with(BTreeMap::new)
        .insert(POD_TEMPLATE_HASH.into(), hash.into());
    let labels = tmeta.labels.clone();
    let mut selector = spec.selector.clone();
    selector
        .match_labels
        .get_or_insert_with(BTreeMap::new)
        .insert(POD_TEMPLATE_HASH.into(), hash.into());
    let mut annotations: BTreeMap<String, String> = deploy
        .annotations()
        .iter()
        .filter(|(k, _)| {
            k.as_str() != "kubectl.kubernetes.io/last-applied-configuration"
                && k.as_str() != REVISION_ANNOTATION
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    annotations.insert(REVISION_ANNOTATION.into(), revision.to_string());
    annotations.insert(
        DESIRED_REPLICAS_ANNOTATION.into(),
        spec.replicas.unwrap_or(1).to_string(),
    );
    annotations.insert(MAX_REPLICAS_ANNOTATION.into(), max_replicas.to_string());
    ReplicaSet {
        metadata: ObjectMeta {
            name: Some(format!("{}-{hash}", deploy.name_any())),
            namespace: deploy.namespace(),
            labels,
            annotations: Some(annotations),
            owner_references: controller_ref(deploy).map(|r| vec![r]),
            ..ObjectMeta::default()
        },
        spec: Some(ReplicaSetSpec {
            replicas: Some(replicas),
            min_ready_seconds: spec.min_ready_seconds,
            selector,
            template: Some(template),
        }),
        status: None,
    }
}

struct Context {
    client: Client,
}

/// Runs the controller until `shutdown`.
pub async fn run(client: Client, shutdown: CancellationToken) {
    let deployments: Api<Deployment> = Api::all(client.clone());
    let sets: Api<ReplicaSet> = Api::all(client.clone());
    Controller::new(deployments, watcher::Config::default())
        .owns(sets, watcher::Config::default())
        .graceful_shutdown_on(shutdown.cancelled_owned())
        .run(reconcile, error_policy, Arc::new(Context { client }))
        .for_each(|_| async {})
        .await;
}

fn error_policy(_d: Arc<Deployment>, error: &DeploymentError, _ctx: Arc<Context>) -> Action {
    tracing::warn!(%error, "deployment pass failed; retrying");
    Action::requeue(Duration::from_secs(1))
}

async fn reconcile(cached: Arc<Deployment>, ctx: Arc<Context>) -> Result<Action, DeploymentError> {
    let namespace = cached.namespace().unwrap_or_default();
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &namespace);
    let Some(deploy) = deployments.get_opt(&cached.name_any()).await? else {
        return Ok(Action::await_change());
    };
    if deploy.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let uid = deploy.metadata.uid.clone().unwrap_or_default();
    let spec = deploy.spec.clone().unwrap_or_default();
    let replicas = spec.replicas.unwrap_or(1);
    let sets_api: Api<ReplicaSet> = Api::namespaced(ctx.client.clone(), &namespace);
    let mut sets: Vec<ReplicaSet> = sets_api
        .list(&ListParams::default().labels(&selector_query(&spec.selector)))
        .await?
        .items
        .into_iter()
        .filter(|rs| controlled_by(rs.metadata.owner_references.as_ref(), &uid))
        .collect();
    sets.sort_by(|a, b| {
        a.metadata
            .creation_timestamp
            .as_ref()
            .map(|t| t.0)
            .cmp(&b.metadata.creation_timestamp.as_ref().map(|t| t.0))
            .then_with(|| a.name_any().cmp(&b.name_any()))
    });
    let collision = deploy.status.as_ref().and_then(|s| s.collision_count);
    let hash = template_hash(&spec.template, collision)?;
    let (new_sets, old_sets): (Vec<ReplicaSet>, Vec<ReplicaSet>) = sets
        .into_iter()
        .partition(|rs| rs.labels().get(POD_TEMPLATE_HASH) == Some(&hash));
    let mut new_rs = new_sets.into_iter().next();
    let old: Vec<RsState> = old_sets.iter().map(state_of).collect();
    let max_old_revision = old_sets.iter().map(revision_of).max().unwrap_or(0);
    let recreate = spec.strategy.as_ref().and_then(|s| s.type_.as_deref()) == Some("Recreate");
    let rolling = spec
        .strategy
        .as_ref()
        .and_then(|s| s.rolling_update.clone())
        .unwrap_or_default();
    let (surge, unavailable) = if recreate {
        (0, 0)
    } else {
        resolve_fenceposts(
            rolling.max_surge.as_ref(),
            rolling.max_unavailable.as_ref(),
            replicas,
        )
    };
    // A rollback to an older template makes that ReplicaSet the newest revision again.
    if let Some(rs) = &new_rs
        && revision_of(rs) <= max_old_revision
    {
        let patch = json!({"metadata": {"annotations": {
            REVISION_ANNOTATION: (max_old_revision + 1).to_string()}}});
        new_rs = Some(
            sets_api
                .patch(
                    &rs.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await?,
        );
    }
    let new_state = new_rs.as_ref().map(state_of);
    // Pods going away change no ReplicaSet, so nothing would wake a Recreate rollout that waits
    // for them: it polls instead.
    let mut waiting_for_pods = false;
    let steps = if spec.paused == Some(true) {
        Vec::new()
    } else if recreate {
        waiting_for_pods = old_pods_running(&ctx.client, &namespace, &old_sets).await?;
        recreate_steps(replicas, new_state.as_ref(), &old, waiting_for_pods)
    } else {
        rolling_steps(replicas, surge, unavailable, new_state.as_ref(), &old)
    };
    let mut changed = false;
    let mut created_new = false;
    for step in steps {
        changed = true;
        match step {
            Step::CreateNew(n) => {
                let rs = new_replica_set(&deploy, &hash, n, max_old_revision + 1, replicas + surge);
                match sets_api.create(&PostParams::default(), &rs).await {
                    Ok(created) => {
                        new_rs = Some(created);
                        created_new = true;
                    }
                    Err(e) if is_status(&e, 409) || is_status(&e, 403) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            Step::Scale(name, n) => {
                let patch = json!({
                    "metadata": {"annotations": {
                        DESIRED_REPLICAS_ANNOTATION: replicas.to_string(),
                        MAX_REPLICAS_ANNOTATION: (replicas + surge).to_string()}},
                    "spec": {"replicas": n}});
                match sets_api
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    Ok(_) => {}
                    Err(e) if is_status(&e, 404) || is_status(&e, 409) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
    }
    let new_state = new_rs.as_ref().map(state_of);
    if !changed
        && new_state
            .as_ref()
            .is_some_and(|n| n.available == replicas && n.replicas == replicas)
    {
        let limit = spec.revision_history_limit.unwrap_or(DEFAULT_HISTORY);
        for name in history_to_prune(&old_sets, limit) {
            match sets_api.delete(&name, &DeleteParams::background()).await {
                Ok(_) => {}
                Err(e) if is_status(&e, 404) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    if let Some(rs) = &new_rs {
        let revision = revision_of(rs).to_string();
        if deploy.annotations().get(REVISION_ANNOTATION) != Some(&revision) {
            let patch = json!({"metadata": {"annotations": {REVISION_ANNOTATION: revision}}});
            deployments
                .patch(
                    &deploy.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await?;
        }
    }
    let now = Timestamp::now();
    let status = deployment_status(&deploy, new_state.as_ref(), &old, created_new, now);
    if deploy.status.as_ref() != Some(&status) {
        let patch = json!({"status": status});
        match deployments
            .patch_status(
                &deploy.name_any(),
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
    // A stuck rollout changes nothing that would wake the controller: come back when its
    // progress deadline passes (the real controller's `requeueStuckDeployment`).
    let progressing = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "Progressing");
    let stuck_check = progress_deadline(&deploy, progressing).map(|at| {
        let wait_ms = at.as_millisecond() - now.as_millisecond();
        Duration::from_millis(u64::try_from(wait_ms).unwrap_or(0)) + Duration::from_millis(50)
    });
    Ok(if changed || waiting_for_pods {
        Action::requeue(Duration::from_millis(200))
    } else if let Some(wait) = stuck_check {
        Action::requeue(wait)
    } else {
        Action::await_change()
    })
}

/// Whether pods of the old ReplicaSets still exist and have not finished (terminating ones
/// count: Recreate waits until they are gone).
async fn old_pods_running(
    client: &Client,
    namespace: &str,
    old: &[ReplicaSet],
) -> Result<bool, kube::Error> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    for rs in old {
        let uid = rs.metadata.uid.clone().unwrap_or_default();
        let selector = rs
            .spec
            .as_ref()
            .map(|s| s.selector.clone())
            .unwrap_or_default();
        let listed = pods
            .list(&ListParams::default().labels(&selector_query(&selector)))
            .await?;
        if listed.items.iter().any(|p| {
            controlled_by(p.metadata.owner_references.as_ref(), &uid)
                && !matches!(
                    p.status.as_ref().and_then(|s| s.phase.as_deref()),
                    Some("Succeeded" | "Failed")
                )
        }) {
            return Ok(true);
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests;
