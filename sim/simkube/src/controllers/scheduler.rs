//! The scheduler: binds pending pods to nodes through `pods/binding`, as kube-scheduler's
//! default profile does for the filters that matter without a real kubelet (node name,
//! unschedulable, taints, node selector and required node affinity, resource requests) and
//! least-allocated scoring, so replicas spread, and VolumeBinding ([`volume_binding`]): a pod
//! whose `WaitForFirstConsumer` claims are unbound gets its node chosen as usual, the claims
//! are annotated with it (`volume.kubernetes.io/selected-node`), and the pod is bound once the
//! claims are, within kube-scheduler's `bindTimeoutSeconds`.
//!
//! A pod that fits nowhere gets `PodScheduled=False` (reason `Unschedulable`) with the real
//! "0/N nodes are available: ..." message and a `FailedScheduling` event; it is retried whenever
//! a pod or node changes. The decisions ([`schedule`], [`filter`]) are pure.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{FutureExt as _, StreamExt as _};
use k8s_openapi::api::core::v1::{
    Binding, Node, ObjectReference, PersistentVolume, PersistentVolumeClaim, Pod, Taint, Toleration,
};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Client, Resource as _, ResourceExt as _};
use rand::Rng as _;
use serde_json::json;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::persistent_volumes::ANN_SELECTED_NODE;
use super::{Pace, is_status, recorder, watch_pods_and_nodes};

pub mod volume_binding;

use volume_binding::{PodClaims, VolumeView};

/// The scheduler name pods get by default; pods naming another scheduler are left alone.
pub const DEFAULT_SCHEDULER: &str = "default-scheduler";
/// Taint the node lifecycle controller puts on nodes whose Ready condition is False.
pub const TAINT_NOT_READY: &str = "node.kubernetes.io/not-ready";
/// Taint the node lifecycle controller puts on nodes whose Ready condition is Unknown.
pub const TAINT_UNREACHABLE: &str = "node.kubernetes.io/unreachable";
/// Taint matching `spec.unschedulable` (tolerating it bypasses the cordon).
pub const TAINT_UNSCHEDULABLE: &str = "node.kubernetes.io/unschedulable";

/// How often pending pods are retried even when nothing changed.
const RESYNC: Duration = Duration::from_secs(5);
/// How long a pod waits for its claims to be bound on the chosen node before it is scheduled
/// afresh (kube-scheduler's VolumeBinding `bindTimeoutSeconds`).
pub const BIND_TIMEOUT: Duration = Duration::from_secs(600);
/// Scoring defaults for containers without requests, as kube-scheduler's non-zero requests.
const DEFAULT_MILLI_CPU: i128 = 100;
const DEFAULT_MEMORY_MILLI: i128 = 200 * 1024 * 1024 * 1000;

/// Resource amounts in thousandths of the unit (millicores for cpu, milli-bytes for memory), so
/// every quantity the API accepts is an exact integer.
pub type Resources = BTreeMap<String, i128>;

/// Parses a Kubernetes quantity (`100m`, `1.5`, `128Mi`, `1G`, `2e3`) into thousandths.
pub fn parse_quantity(text: &str) -> Option<i128> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let (mult_num, mult_den): (i128, i128) = match suffix {
        "" => (1000, 1),
        "n" => (1, 1_000_000),
        "u" => (1, 1000),
        "m" => (1, 1),
        "k" => (1_000_000, 1),
        "M" => (1_000_000_000, 1),
        "G" => (1_000_000_000_000, 1),
        "T" => (1_000_000_000_000_000, 1),
        "P" => (1_000_000_000_000_000_000, 1),
        "E" => (1_000_000_000_000_000_000_000, 1),
        "Ki" => (1000 << 10, 1),
        "Mi" => (1000 << 20, 1),
        "Gi" => (1000 << 30, 1),
        "Ti" => (1000 << 40, 1),
        "Pi" => (1000 << 50, 1),
        "Ei" => (1000 << 60, 1),
        s if s.starts_with(['e', 'E']) => {
            let exp: u32 = s[1..].parse().ok()?;
            (1000 * 10i128.checked_pow(exp)?, 1)
        }
        _ => return None,
    };
    let (negative, number) = match number.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, number.strip_prefix('+').unwrap_or(number)),
    };
    let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && frac.is_empty() {
        return None;
    }
    let digits = format!("{whole}{frac}");
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mantissa: i128 = digits.parse().ok()?;
    let scale = 10i128.checked_pow(u32::try_from(frac.len()).ok()?)?;
    // Round up, as the API server does for sub-milli amounts.
    let value = (mantissa.checked_mul(mult_num)? + scale * mult_den - 1) / (scale * mult_den);
    Some(if negative { -value } else { value })
}

/// What a pod asks for: the sum of its containers' requests (limits stand in for missing
/// requests), at least the largest init container's, plus the pod overhead.
pub fn pod_requests(pod: &Pod, non_zero: bool) -> Resources {
    let mut total = Resources::new();
    let Some(spec) = &pod.spec else {
        return total;
    };
    let container_requests = |c: &k8s_openapi::api::core::v1::Container| {
        let mut out = Resources::new();
        if let Some(res) = &c.resources {
            for map in [&res.limits, &res.requests].into_iter().flatten() {
                for (name, q) in map {
                    if let Some(v) = parse_quantity(&q.0) {
                        out.insert(name.clone(), v);
                    }
                }
            }
        }
        if non_zero {
            out.entry("cpu".into()).or_insert(DEFAULT_MILLI_CPU);
            out.entry("memory".into()).or_insert(DEFAULT_MEMORY_MILLI);
        }
        out
    };
    for c in &spec.containers {
        for (name, v) in container_requests(c) {
            *total.entry(name).or_default() += v;
        }
    }
    for c in spec.init_containers.iter().flatten() {
        for (name, v) in container_requests(c) {
            let slot = total.entry(name).or_default();
            *slot = (*slot).max(v);
        }
    }
    for (name, q) in spec.overhead.iter().flatten() {
        if let Some(v) = parse_quantity(&q.0) {
            *total.entry(name.clone()).or_default() += v;
        }
    }
    total
}

/// Why one node cannot take a pod, worded as kube-scheduler's filter plugins.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Unfit {
    /// The pod names another node (`spec.nodeName` set before scheduling).
    NodeName,
    /// The node is cordoned.
    Unschedulable,
    /// A NoSchedule or NoExecute taint the pod does not tolerate.
    Taint {
        /// Taint key.
        key: String,
        /// Taint value (may be empty).
        value: String,
    },
    /// `nodeSelector` or required node affinity does not match.
    Affinity,
    /// The node already runs as many pods as it allows.
    TooManyPods,
    /// Not enough of this resource is left.
    Insufficient(String),
    /// A bound claim's volume is pinned (node affinity) to other nodes.
    VolumeNodeConflict,
    /// A claim is bound to a volume that does not exist.
    VolumeBindConflict,
    /// A claim of a class without a provisioner has no Available volume for this node.
    NoMatchingVolume,
}

impl Unfit {
    /// The reason string as the real scheduler prints it.
    pub fn reason(&self) -> String {
        match self {
            Unfit::NodeName => "node(s) didn't match the requested node name".into(),
            Unfit::Unschedulable => "node(s) were unschedulable".into(),
            Unfit::Taint { key, value } => {
                format!("node(s) had untolerated taint {{{key}: {value}}}")
            }
            Unfit::Affinity => "node(s) didn't match Pod's node affinity/selector".into(),
            Unfit::TooManyPods => "Too many pods".into(),
            Unfit::Insufficient(name) => format!("Insufficient {name}"),
            Unfit::VolumeNodeConflict => "node(s) had volume node affinity conflict".into(),
            Unfit::VolumeBindConflict => {
                "node(s) unavailable due to one or more pvc(s) bound to non-existent pv(s)".into()
            }
            Unfit::NoMatchingVolume => {
                "node(s) didn't find available persistent volumes to bind".into()
            }
        }
    }

    /// Whether evicting lower-priority pods could help (resource shortage only).
    fn preemption_could_help(&self) -> bool {
        matches!(self, Unfit::TooManyPods | Unfit::Insufficient(_))
    }
}

/// Whether `toleration` tolerates `taint`.
pub fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    if let Some(effect) = toleration.effect.as_deref()
        && !effect.is_empty()
        && effect != taint.effect
    {
        return false;
    }
    let key = toleration.key.as_deref().unwrap_or_default();
    match toleration.operator.as_deref().unwrap_or("Equal") {
        "Exists" => key.is_empty() || key == taint.key,
        _ => {
            key == taint.key
                && toleration.value.as_deref().unwrap_or_default()
                    == taint.value.as_deref().unwrap_or_default()
        }
    }
}

/// The node's taints, plus the ones its conditions imply (a node that does not report
/// `Ready=True` counts as tainted not-ready/unreachable even before the lifecycle controller
/// writes the taint, so no pod lands on a node that never came up).
fn effective_taints(node: &Node) -> Vec<Taint> {
    let mut taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    let ready = node_ready_status(node);
    let implied = match ready.as_deref() {
        Some("True") => None,
        Some("False") => Some(TAINT_NOT_READY),
        _ => Some(TAINT_UNREACHABLE),
    };
    if let Some(key) = implied
        && !taints
            .iter()
            .any(|t| t.key == TAINT_NOT_READY || t.key == TAINT_UNREACHABLE)
    {
        taints.push(Taint {
            key: key.into(),
            effect: "NoSchedule".into(),
            ..Taint::default()
        });
    }
    taints
}

/// The status of the node's `Ready` condition, if it reports one.
pub fn node_ready_status(node: &Node) -> Option<String> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.status.clone())
}

fn requirement_matches(key_value: Option<&str>, operator: &str, values: &[String]) -> bool {
    match operator {
        "In" => key_value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => key_value.is_none_or(|v| !values.iter().any(|x| x == v)),
        "Exists" => key_value.is_some(),
        "DoesNotExist" => key_value.is_none(),
        "Gt" | "Lt" => {
            let (Some(actual), Some(bound)) = (
                key_value.and_then(|v| v.parse::<i64>().ok()),
                values.first().and_then(|v| v.parse::<i64>().ok()),
            ) else {
                return false;
            };
            if operator == "Gt" {
                actual > bound
            } else {
                actual < bound
            }
        }
        _ => false,
    }
}

/// Whether the node satisfies the pod's `nodeSelector` and required node affinity.
pub fn matches_node_affinity(pod: &Pod, node: &Node) -> bool {
    let Some(spec) = &pod.spec else {
        return true;
    };
    let empty = BTreeMap::new();
    let labels = node.metadata.labels.as_ref().unwrap_or(&empty);
    if let Some(selector) = &spec.node_selector
        && selector.iter().any(|(k, v)| labels.get(k) != Some(v))
    {
        return false;
    }
    let Some(required) = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
    else {
        return true;
    };
    matches_node_selector(required, node)
}

/// Whether the node satisfies a required node selector (a pod's required node affinity, or a
/// PersistentVolume's `nodeAffinity.required`).
pub fn matches_node_selector(
    required: &k8s_openapi::api::core::v1::NodeSelector,
    node: &Node,
) -> bool {
    let empty = BTreeMap::new();
    let labels = node.metadata.labels.as_ref().unwrap_or(&empty);
    let name = node.metadata.name.as_deref().unwrap_or_default();
    // Terms are ORed; a term without any requirement matches nothing.
    required.node_selector_terms.iter().any(|term| {
        let exprs = term.match_expressions.as_deref().unwrap_or_default();
        let fields = term.match_fields.as_deref().unwrap_or_default();
        if exprs.is_empty() && fields.is_empty() {
            return false;
        }
        let values = |r: &k8s_openapi::api::core::v1::NodeSelectorRequirement| {
            r.values.clone().unwrap_or_default()
        };
        exprs.iter().all(|r| {
            requirement_matches(
                labels.get(&r.key).map(String::as_str),
                &r.operator,
                &values(r),
            )
        }) && fields.iter().all(|r| {
            r.key == "metadata.name" && requirement_matches(Some(name), &r.operator, &values(r))
        })
    })
}

/// A node with what is already committed on it.
#[derive(Debug, Clone)]
pub struct NodeUsage<'a> {
    /// The node.
    pub node: &'a Node,
    /// Sum of the requests of the pods bound to it.
    pub requested: Resources,
    /// Same, with the scoring defaults for containers without requests.
    pub requested_non_zero: Resources,
    /// Number of pods bound to it.
    pub pods: i128,
}

impl<'a> NodeUsage<'a> {
    /// An empty node.
    pub fn new(node: &'a Node) -> Self {
        Self {
            node,
            requested: Resources::new(),
            requested_non_zero: Resources::new(),
            pods: 0,
        }
    }

    /// Accounts for `pod` being bound here.
    pub fn add(&mut self, pod: &Pod) {
        self.add_requests(&PodRequests::of(pod));
    }

    /// Accounts for a pod that asks for `requests` being bound here.
    pub fn add_requests(&mut self, requests: &PodRequests) {
        add_into(&mut self.requested, &requests.plain);
        add_into(&mut self.requested_non_zero, &requests.non_zero);
        self.pods += 1;
    }

    fn allocatable(&self) -> Resources {
        let status = self.node.status.as_ref();
        let map = status
            .and_then(|s| s.allocatable.as_ref())
            .or_else(|| status.and_then(|s| s.capacity.as_ref()));
        map.into_iter()
            .flatten()
            .filter_map(|(k, q)| Some((k.clone(), parse_quantity(&q.0)?)))
            .collect()
    }
}

/// Adds `more` to `sum`. A key is copied only the first time a node sees it: a pass adds
/// every bound pod's requests, and copying the names each time was most of its cost.
fn add_into(sum: &mut Resources, more: &Resources) {
    for (name, v) in more {
        match sum.get_mut(name) {
            Some(total) => *total += v,
            None => {
                sum.insert(name.clone(), *v);
            }
        }
    }
}

/// Runs the filters in kube-scheduler's order; a node fails at the first failing plugin (the
/// resource plugin lists every short resource).
pub fn filter(pod: &Pod, usage: &NodeUsage<'_>) -> Vec<Unfit> {
    let node = usage.node;
    let spec = pod.spec.clone().unwrap_or_default();
    let tolerations = spec.tolerations.clone().unwrap_or_default();
    let unschedulable = node
        .spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false);
    let cordon = Taint {
        key: TAINT_UNSCHEDULABLE.into(),
        effect: "NoSchedule".into(),
        ..Taint::default()
    };
    if unschedulable && !tolerations.iter().any(|t| tolerates(t, &cordon)) {
        return vec![Unfit::Unschedulable];
    }
    if let Some(wanted) = spec.node_name.as_deref().filter(|n| !n.is_empty())
        && node.metadata.name.as_deref() != Some(wanted)
    {
        return vec![Unfit::NodeName];
    }
    if let Some(taint) = effective_taints(node).into_iter().find(|taint| {
        matches!(taint.effect.as_str(), "NoSchedule" | "NoExecute")
            && !tolerations.iter().any(|t| tolerates(t, taint))
    }) {
        return vec![Unfit::Taint {
            key: taint.key,
            value: taint.value.unwrap_or_default(),
        }];
    }
    if !matches_node_affinity(pod, node) {
        return vec![Unfit::Affinity];
    }
    let allocatable = usage.allocatable();
    let mut out = Vec::new();
    let max_pods = allocatable.get("pods").copied().unwrap_or(0) / 1000;
    if usage.pods + 1 > max_pods {
        out.push(Unfit::TooManyPods);
    }
    for (name, want) in pod_requests(pod, false) {
        if want <= 0 || name == "pods" {
            continue;
        }
        let have = allocatable.get(&name).copied().unwrap_or(0)
            - usage.requested.get(&name).copied().unwrap_or(0);
        if want > have {
            out.push(Unfit::Insufficient(name));
        }
    }
    out
}

/// Least-allocated score (0..=100): the mean free share of cpu and memory after placing `pod`.
pub fn score(pod: &Pod, usage: &NodeUsage<'_>) -> i128 {
    let allocatable = usage.allocatable();
    let want = pod_requests(pod, true);
    let mut total = 0;
    for name in ["cpu", "memory"] {
        let cap = allocatable.get(name).copied().unwrap_or(0);
        let used = usage.requested_non_zero.get(name).copied().unwrap_or(0)
            + want.get(name).copied().unwrap_or(0);
        if cap > 0 && used <= cap {
            total += (cap - used) * 100 / cap;
        }
    }
    total / 2
}

/// The outcome of one scheduling attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Bind to this node.
    Bind(String),
    /// No node fits; the `PodScheduled` message.
    Unschedulable(String),
}

/// What a pod asks for, as [`pod_requests`] gives it without and with the scoring defaults.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodRequests {
    /// The requests.
    pub plain: Resources,
    /// The requests with the scoring defaults for containers without requests.
    pub non_zero: Resources,
}

impl PodRequests {
    /// Reads them from the pod's spec.
    pub fn of(pod: &Pod) -> Self {
        Self {
            plain: pod_requests(pod, false),
            non_zero: pod_requests(pod, true),
        }
    }
}

/// Picks the best node for `pod`: the highest least-allocated score among the nodes that pass
/// every filter, ties broken by name (see [`schedule_with`] for kube-scheduler's random pick).
pub fn schedule(pod: &Pod, nodes: &[NodeUsage<'_>]) -> Decision {
    schedule_with(pod, nodes, |_| 0)
}

/// [`schedule`], with `choose(n)` picking one of the `n` best-scoring nodes (in name order).
/// kube-scheduler picks uniformly at random among them; without that, equally scored nodes
/// (pods without requests quickly score 0 everywhere) would fill up in name order.
pub fn schedule_with(
    pod: &Pod,
    nodes: &[NodeUsage<'_>],
    choose: impl FnMut(usize) -> usize,
) -> Decision {
    schedule_with_claims(pod, &PodClaims::default(), nodes, choose)
}

/// [`schedule_with`] for a pod whose claims passed VolumeBinding's PreFilter: after the other
/// filters, a node must also suit the claims (VolumeBinding filters after the resources).
pub fn schedule_with_claims(
    pod: &Pod,
    claims: &PodClaims,
    nodes: &[NodeUsage<'_>],
    mut choose: impl FnMut(usize) -> usize,
) -> Decision {
    let mut best: Option<i128> = None;
    let mut tied: Vec<&str> = Vec::new();
    let mut failures: Vec<Vec<Unfit>> = Vec::new();
    for usage in nodes {
        let mut unfit = filter(pod, usage);
        if unfit.is_empty()
            && let Some(volumes) = claims.filter(usage.node)
        {
            unfit.push(volumes);
        }
        if unfit.is_empty() {
            let s = score(pod, usage);
            let name = usage.node.metadata.name.as_deref().unwrap_or_default();
            if best.is_none_or(|b| s > b) {
                best = Some(s);
                tied.clear();
            }
            if best == Some(s) {
                tied.push(name);
            }
        } else {
            failures.push(unfit);
        }
    }
    if tied.is_empty() {
        return Decision::Unschedulable(fit_error_message(nodes.len(), &failures));
    }
    tied.sort_unstable();
    let pick = choose(tied.len()).min(tied.len() - 1);
    Decision::Bind(tied[pick].to_owned())
}

/// "0/N nodes are available: ..." with the per-reason counts sorted as the real scheduler
/// does, then the preemption verdict (this scheduler never preempts).
pub fn fit_error_message(total: usize, failures: &[Vec<Unfit>]) -> String {
    if total == 0 {
        return "no nodes available to schedule pods".into();
    }
    let mut counts: HashMap<String, usize> = HashMap::new();
    let (mut victims, mut unhelpful) = (0, 0);
    for node in failures {
        for unfit in node {
            *counts.entry(unfit.reason()).or_default() += 1;
        }
        if node.iter().all(Unfit::preemption_could_help) {
            victims += 1;
        } else {
            unhelpful += 1;
        }
    }
    let mut reasons: Vec<String> = counts
        .into_iter()
        .map(|(reason, n)| format!("{n} {reason}"))
        .collect();
    reasons.sort();
    let mut preemption = Vec::new();
    if victims > 0 {
        preemption.push(format!(
            "{victims} No preemption victims found for incoming pod"
        ));
    }
    if unhelpful > 0 {
        preemption.push(format!(
            "{unhelpful} Preemption is not helpful for scheduling"
        ));
    }
    preemption.sort();
    format!(
        "0/{total} nodes are available: {}. preemption: 0/{total} nodes are available: {}.",
        reasons.join(", "),
        preemption.join(", ")
    )
}

/// The message of a pod a PreFilter plugin rejected (`reason`: the plugin's): no node was
/// examined, and preemption cannot help on any.
pub fn pre_filter_error_message(total: usize, reason: &str) -> String {
    if total == 0 {
        return "no nodes available to schedule pods".into();
    }
    format!(
        "0/{total} nodes are available: {reason}. preemption: 0/{total} nodes are available: \
         {total} Preemption is not helpful for scheduling."
    )
}

/// Whether the scheduler should place this pod now.
pub fn wants_scheduling(pod: &Pod) -> bool {
    let Some(spec) = &pod.spec else {
        return false;
    };
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    spec.node_name.as_deref().unwrap_or_default().is_empty()
        && spec.scheduler_name.as_deref().unwrap_or(DEFAULT_SCHEDULER) == DEFAULT_SCHEDULER
        && pod.metadata.deletion_timestamp.is_none()
        && !matches!(phase, Some("Succeeded" | "Failed"))
}

fn is_terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// Runs the scheduler until `shutdown`.
pub async fn run(client: Client, shutdown: CancellationToken) {
    let (pods, nodes, pod_node_changes) = watch_pods_and_nodes(&client);
    let (claims, claim_writer) = reflector::store::<PersistentVolumeClaim>();
    let (volumes, volume_writer) = reflector::store::<PersistentVolume>();
    let (classes, class_writer) = reflector::store::<StorageClass>();
    let volume_changes = futures::stream::select_all([
        watcher(
            Api::<PersistentVolumeClaim>::all(client.clone()),
            watcher::Config::default(),
        )
        .default_backoff()
        .reflect(claim_writer)
        .map(|_| ())
        .boxed(),
        watcher(
            Api::<PersistentVolume>::all(client.clone()),
            watcher::Config::default(),
        )
        .default_backoff()
        .reflect(volume_writer)
        .map(|_| ())
        .boxed(),
        watcher(
            Api::<StorageClass>::all(client.clone()),
            watcher::Config::default(),
        )
        .default_backoff()
        .reflect(class_writer)
        .map(|_| ())
        .boxed(),
    ]);
    let changes = futures::stream::select(pod_node_changes, volume_changes);
    let mut changes = std::pin::pin!(changes);
    let mut scheduler = Scheduler {
        binder: Binder {
            recorder: recorder(client.clone(), DEFAULT_SCHEDULER),
            client,
            slots: Arc::new(Semaphore::new(BINDINGS_IN_FLIGHT)),
        },
        assumed: Assumed::default(),
        waiting: HashMap::new(),
        requests: HashMap::new(),
    };
    let mut pace = Pace::new();
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            change = changes.next() => if change.is_none() { return },
            () = tokio::time::sleep(RESYNC) => {}
        }
        pace.ready().await;
        while let Some(Some(())) = changes.next().now_or_never() {}
        let ready = pods.wait_until_ready().now_or_never().is_some()
            && nodes.wait_until_ready().now_or_never().is_some()
            && claims.wait_until_ready().now_or_never().is_some()
            && volumes.wait_until_ready().now_or_never().is_some()
            && classes.wait_until_ready().now_or_never().is_some();
        if ready {
            let view = VolumeView::new(claims.state(), volumes.state(), classes.state());
            scheduler.pass(&pods, &nodes, &view, &mut pace).await;
        }
    }
}

struct Scheduler {
    binder: Binder,
    /// Pods bound by this scheduler, or being bound, that the watch has not shown bound yet
    /// (uid → node), so a second pass in between neither binds them twice nor forgets their
    /// requests. A binding that fails takes its pod out again.
    assumed: Assumed,
    /// Pods whose node is chosen but whose `WaitForFirstConsumer` claims are not bound yet
    /// (uid → node, when chosen): bound once the claims are, or scheduled afresh after
    /// [`BIND_TIMEOUT`].
    waiting: HashMap<String, (String, Instant)>,
    /// Each pod's requests as last read (uid → the pod object read and what it asks for): a
    /// pass counts every bound pod, and a pod's object changes far less often than passes run.
    requests: HashMap<String, (Arc<Pod>, Arc<PodRequests>)>,
}

impl Scheduler {
    /// `pod`'s requests, read again only when the store holds a new object for it.
    fn requests_of(&mut self, pod: &Arc<Pod>) -> Arc<PodRequests> {
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        if let Some((seen, requests)) = self.requests.get(uid)
            && Arc::ptr_eq(seen, pod)
        {
            return requests.clone();
        }
        let requests = Arc::new(PodRequests::of(pod));
        self.requests
            .insert(uid.to_owned(), (pod.clone(), requests.clone()));
        requests
    }

    async fn pass(
        &mut self,
        pods: &Store<Pod>,
        nodes: &Store<Node>,
        view: &VolumeView,
        pace: &mut Pace,
    ) {
        let started = tokio::time::Instant::now();
        let pods = pods.state();
        let mut nodes: Vec<Arc<Node>> = nodes.state();
        nodes.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        let mut usage: Vec<NodeUsage<'_>> = nodes.iter().map(|n| NodeUsage::new(n)).collect();
        let index: HashMap<String, usize> = nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.name_any(), i))
            .collect();
        // Borrowed from the pods of this pass: the loop below runs over every pod, every pass,
        // and copying each uid and node name was what a pass spent most on.
        let mut pending = Vec::new();
        {
            let live: std::collections::HashSet<&str> = pods
                .iter()
                .filter_map(|p| p.metadata.uid.as_deref())
                .collect();
            let assumed = self.assumed.clone();
            let mut assumed = assumed.lock();
            assumed.retain(|uid, _| live.contains(uid.as_str()));
            self.waiting.retain(|uid, _| live.contains(uid.as_str()));
            self.requests.retain(|uid, _| live.contains(uid.as_str()));
            for pod in &pods {
                let uid = pod.metadata.uid.as_deref().unwrap_or_default();
                let bound = pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.node_name.as_deref())
                    .filter(|n| !n.is_empty());
                if bound.is_some() {
                    assumed.remove(uid);
                }
                match bound.or_else(|| assumed.get(uid).map(String::as_str)) {
                    Some(node) => {
                        if !is_terminal(pod)
                            && let Some(&i) = index.get(node)
                        {
                            let requests = self.requests_of(pod);
                            usage[i].add_requests(&requests);
                        }
                    }
                    None if wants_scheduling(pod) => {
                        // A pod waiting for its claims holds its place on the chosen node.
                        if let Some(&i) = self.waiting.get(uid).and_then(|(n, _)| index.get(n)) {
                            let requests = self.requests_of(pod);
                            usage[i].add_requests(&requests);
                        }
                        pending.push(pod.clone());
                    }
                    None => {}
                }
            }
        }
        // Oldest first, as the real queue orders pods of equal priority.
        pending.sort_by(|a, b| {
            let prio = |p: &Pod| p.spec.as_ref().and_then(|s| s.priority).unwrap_or(0);
            prio(b).cmp(&prio(a)).then_with(|| {
                a.metadata
                    .creation_timestamp
                    .as_ref()
                    .map(|t| t.0)
                    .cmp(&b.metadata.creation_timestamp.as_ref().map(|t| t.0))
            })
        });
        // What follows is per pending pod, and waits on the API server; the accounting above
        // is what grows with the cluster.
        pace.passed(started);
        for pod in pending {
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            let claims = match volume_binding::pre_filter(&pod, view) {
                Ok(claims) => claims,
                Err(reason) => {
                    self.waiting.remove(&uid);
                    let message = pre_filter_error_message(nodes.len(), &reason);
                    self.mark_unschedulable(&pod, &message).await;
                    continue;
                }
            };
            if let Some((node, since)) = self.waiting.get(&uid).cloned() {
                if claims.all_bound() {
                    self.waiting.remove(&uid);
                    let fits = index
                        .get(&node)
                        .is_some_and(|&i| claims.filter(usage[i].node).is_none());
                    if fits {
                        // Its place on the node is already counted (it was waiting there).
                        self.bind(pod, node).await;
                        continue;
                    }
                } else if since.elapsed() < BIND_TIMEOUT {
                    continue;
                } else {
                    tracing::info!(pod = %pod.name_any(), %node, "claims not bound in time; scheduling afresh");
                    self.waiting.remove(&uid);
                }
            }
            let choose = |n: usize| rand::rng().random_range(0..n);
            match schedule_with_claims(&pod, &claims, &usage, choose) {
                Decision::Bind(node) if !claims.all_bound() => {
                    if self.select_node(&claims, &node).await {
                        if let Some(&i) = index.get(&node) {
                            let requests = self.requests_of(&pod);
                            usage[i].add_requests(&requests);
                        }
                        self.waiting.insert(uid, (node, Instant::now()));
                    }
                }
                Decision::Bind(node) => {
                    if let Some(&i) = index.get(&node) {
                        let requests = self.requests_of(&pod);
                        usage[i].add_requests(&requests);
                    }
                    self.bind(pod, node).await;
                }
                Decision::Unschedulable(message) => self.mark_unschedulable(&pod, &message).await,
            }
        }
    }

    /// Annotates the pod's unbound `WaitForFirstConsumer` claims with the chosen node, for the
    /// provisioner (VolumeBinding's PreBind); true when every claim carries it.
    async fn select_node(&self, claims: &PodClaims, node: &str) -> bool {
        let mut all = true;
        for claim in claims.delayed() {
            let current = claim
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(ANN_SELECTED_NODE));
            if current.map(String::as_str) == Some(node) {
                continue;
            }
            let api: Api<PersistentVolumeClaim> = Api::namespaced(
                self.binder.client.clone(),
                &claim.namespace().unwrap_or_default(),
            );
            let patch = json!({"metadata": {"annotations": {ANN_SELECTED_NODE: node}}});
            if let Err(error) = api
                .patch(
                    &claim.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
            {
                tracing::debug!(%error, claim = %claim.name_any(), "cannot select a node for a claim");
                all = false;
            }
        }
        all
    }

    /// Assumes `pod` on `node` and binds it in the background, as kube-scheduler's binding
    /// cycle runs apart from its scheduling cycle: the next pod is placed while this one's
    /// binding is on its way. Waits only for a free binding slot.
    async fn bind(&self, pod: Arc<Pod>, node: String) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        self.assumed.lock().insert(uid.clone(), node.clone());
        let Ok(slot) = self.binder.slots.clone().acquire_owned().await else {
            return;
        };
        let (binder, assumed) = (self.binder.clone(), self.assumed.clone());
        tokio::spawn(async move {
            let bound = binder.bind(&pod, &node).await;
            // The slot is the binding's only: the event below goes out as kube-scheduler's
            // event broadcaster sends it, apart from the binding cycle, so a slow event
            // write does not hold up the next pod's binding.
            drop(slot);
            if bound {
                let namespace = pod.namespace().unwrap_or_default();
                let note = format!(
                    "Successfully assigned {namespace}/{} to {node}",
                    pod.name_any()
                );
                binder
                    .event(&pod, EventType::Normal, "Scheduled", note)
                    .await;
            } else {
                // Forgotten: the next pass places it afresh (or finds it gone).
                assumed.lock().remove(&uid);
            }
        });
    }

    async fn mark_unschedulable(&self, pod: &Pod, message: &str) {
        let current = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "PodScheduled"));
        if current.is_some_and(|c| c.status == "False" && c.message.as_deref() == Some(message)) {
            return;
        }
        let namespace = pod.namespace().unwrap_or_default();
        let api: Api<Pod> = Api::namespaced(self.binder.client.clone(), &namespace);
        let patch = json!({"status": {"conditions": [{
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": message,
            "lastProbeTime": null,
            "lastTransitionTime": crate::timefmt::now_rfc3339(),
        }]}});
        match api
            .patch_status(
                &pod.name_any(),
                &PatchParams::default(),
                &Patch::Strategic(&patch),
            )
            .await
        {
            Ok(_) => {}
            Err(e) if is_status(&e, 404) => return,
            Err(error) => tracing::warn!(%error, pod = %pod.name_any(), "cannot set PodScheduled"),
        }
        self.binder
            .event(
                pod,
                EventType::Warning,
                "FailedScheduling",
                message.to_owned(),
            )
            .await;
    }
}

/// Up to this many bindings are on their way at once (kube-scheduler's binding goroutines
/// are bounded only by its client's rate limit, which simkube does not model).
const BINDINGS_IN_FLIGHT: usize = 16;

/// The pods assumed on a node ahead of the watch showing them bound (uid → node).
#[derive(Clone, Default)]
struct Assumed(Arc<std::sync::Mutex<HashMap<String, String>>>);

impl Assumed {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// What a binding in the background needs.
#[derive(Clone)]
struct Binder {
    client: Client,
    recorder: Recorder,
    slots: Arc<Semaphore>,
}

impl Binder {
    async fn bind(&self, pod: &Pod, node: &str) -> bool {
        let namespace = pod.namespace().unwrap_or_default();
        let name = pod.name_any();
        let binding = Binding {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(namespace.clone()),
                uid: pod.metadata.uid.clone(),
                ..ObjectMeta::default()
            },
            target: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(node.to_owned()),
                ..ObjectReference::default()
            },
        };
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &namespace);
        match api
            .create_subresource::<_, serde_json::Value>(
                "binding",
                &name,
                &PostParams::default(),
                &binding,
            )
            .await
        {
            Ok(_) => {
                tracing::debug!(pod = %name, %namespace, %node, "bound");
                true
            }
            Err(e) if is_status(&e, 409) || is_status(&e, 404) => false,
            Err(error) => {
                tracing::warn!(%error, pod = %name, "binding failed");
                false
            }
        }
    }

    async fn event(&self, pod: &Pod, type_: EventType, reason: &str, note: String) {
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(note),
            action: "Scheduling".into(),
            secondary: None,
        };
        if let Err(error) = self.recorder.publish(&event, &pod.object_ref(&())).await {
            tracing::debug!(%error, "cannot record a scheduler event");
        }
    }
}

#[cfg(test)]
mod tests;
