//! Taint-based eviction, as kube-controller-manager's taint eviction controller (the node
//! lifecycle controller's former "NoExecute taint manager"): a pod bound to a node with a
//! `NoExecute` taint it does not tolerate is deleted at once; a pod tolerating every such taint
//! is deleted once the shortest `tolerationSeconds` of the tolerations it uses has passed
//! (never, when none of them sets one); removing the taint in time cancels the deletion.
//!
//! Also the API server's `DefaultTolerationSeconds` admission plugin
//! ([`default_toleration_seconds`]), which gives every new pod 300 s of tolerance of the
//! `not-ready` and `unreachable` taints the node lifecycle controller puts on failing nodes, so
//! their pods move elsewhere five minutes after the node went away.
//!
//! The decisions ([`verdict`], [`Schedule`]) are pure; the loop around them watches pods and
//! nodes and deletes through the public API, as the real controller does.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{FutureExt as _, StreamExt as _};
use k8s_openapi::api::core::v1::{Node, Pod, Taint, Toleration};
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::Store;
use kube::{Client, Resource as _, ResourceExt as _};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::scheduler::{TAINT_NOT_READY, TAINT_UNREACHABLE, tolerates};
use super::{Pace, is_status, recorder, watch_pods_and_nodes};

/// The name the controller reports events under (kube-controller-manager's since 1.29).
pub const CONTROLLER_NAME: &str = "taint-eviction-controller";
/// Seconds of tolerance `DefaultTolerationSeconds` grants for `not-ready` and `unreachable`
/// (the plugin's `--default-not-ready-toleration-seconds` and
/// `--default-unreachable-toleration-seconds`).
pub const DEFAULT_TOLERATION_SECONDS: i64 = 300;
/// How long a failed deletion waits before it is tried again.
const RETRY: Duration = Duration::from_secs(1);
/// How often the state is looked at even when nothing changed.
const RESYNC: Duration = Duration::from_secs(5);

/// `DefaultTolerationSeconds` admission, applied to a pod being created or updated: unless the
/// pod already tolerates the `NoExecute` `not-ready` (`unreachable`) taint, it gets a toleration
/// of it for [`DEFAULT_TOLERATION_SECONDS`].
pub fn default_toleration_seconds(pod: &mut Value) {
    if !pod["spec"].is_object() {
        return;
    }
    let existing: Vec<Value> = pod["spec"]["tolerations"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    // The plugin's test: the key matches (or is empty) and the effect is NoExecute (or empty);
    // the operator and value are not looked at.
    let covered = |key: &str| {
        existing.iter().any(|t| {
            let k = t["key"].as_str().unwrap_or_default();
            let effect = t["effect"].as_str().unwrap_or_default();
            (k == key || k.is_empty()) && (effect == "NoExecute" || effect.is_empty())
        })
    };
    let mut tolerations = existing.clone();
    for key in [TAINT_NOT_READY, TAINT_UNREACHABLE] {
        if !covered(key) {
            tolerations.push(json!({
                "key": key,
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": DEFAULT_TOLERATION_SECONDS,
            }));
        }
    }
    if tolerations.len() != existing.len() {
        pod["spec"]["tolerations"] = Value::Array(tolerations);
    }
}

/// The node's `NoExecute` taints.
pub fn no_execute_taints(node: &Node) -> Vec<Taint> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
        .filter(|t| t.effect == "NoExecute")
        .cloned()
        .collect()
}

/// What the taints of its node mean for a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Every `NoExecute` taint is tolerated for ever (or there is none): the pod stays.
    Stay,
    /// Some taint is not tolerated, or a toleration's time is zero or less: delete now.
    EvictNow,
    /// Every taint is tolerated; the shortest `tolerationSeconds` among the tolerations used.
    EvictAfter(Duration),
}

/// Judges `tolerations` against a node's `NoExecute` `taints`, as the real controller: each
/// taint is matched by the first toleration that tolerates it, and the time the pod may stay is
/// the smallest `tolerationSeconds` of the matched tolerations.
pub fn verdict(taints: &[Taint], tolerations: &[Toleration]) -> Verdict {
    if taints.is_empty() {
        return Verdict::Stay;
    }
    let mut least: Option<i64> = None;
    for taint in taints {
        let Some(used) = tolerations.iter().find(|t| tolerates(t, taint)) else {
            return Verdict::EvictNow;
        };
        if let Some(secs) = used.toleration_seconds {
            if secs <= 0 {
                return Verdict::EvictNow;
            }
            least = Some(least.map_or(secs, |l| l.min(secs)));
        }
    }
    match least {
        None => Verdict::Stay,
        Some(secs) => Verdict::EvictAfter(Duration::from_secs(secs.unsigned_abs())),
    }
}

/// A pod the controller tracks: where to find it and the uid it had.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodRef {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID (a pod recreated under the same name is another pod).
    pub uid: String,
}

/// A deletion waiting for its time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scheduled {
    /// When the countdown began (kept when a later taint shortens it).
    pub since: Instant,
    /// When the pod is deleted.
    pub due: Instant,
}

/// What changed in the plan after one look at a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Nothing.
    None,
    /// A deletion was planned (or moved).
    Planned,
    /// A planned deletion was cancelled (the taint went or is tolerated for ever now).
    Cancelled,
}

/// The planned deletions (the real controller's timed work queue).
#[derive(Debug, Default)]
pub struct Schedule {
    planned: HashMap<PodRef, Scheduled>,
}

impl Schedule {
    /// Whether no deletion is planned.
    pub fn is_empty(&self) -> bool {
        self.planned.is_empty()
    }

    /// Applies the verdict for `pod` seen at `now`. A countdown already running is left as it
    /// is (as upstream: re-reading the node, even with another taint, never moves it), unless
    /// the pod must go now or may stay for ever.
    pub fn observe(&mut self, pod: &PodRef, verdict: Verdict, now: Instant) -> Change {
        match verdict {
            Verdict::Stay => {
                if self.planned.remove(pod).is_some() {
                    Change::Cancelled
                } else {
                    Change::None
                }
            }
            Verdict::EvictNow => self.plan(pod, now, now),
            Verdict::EvictAfter(_) if self.planned.contains_key(pod) => Change::None,
            Verdict::EvictAfter(wait) => self.plan(pod, now, now + wait),
        }
    }

    fn plan(&mut self, pod: &PodRef, since: Instant, due: Instant) -> Change {
        let next = Scheduled { since, due };
        match self.planned.insert(pod.clone(), next) {
            Some(previous) if previous == next => Change::None,
            _ => Change::Planned,
        }
    }

    /// Forgets pods not in `live` (deleted, terminating, or moved off tainted nodes); returns
    /// the ones forgotten whose deletion was still pending.
    pub fn retain(&mut self, live: &std::collections::HashSet<PodRef>) -> Vec<PodRef> {
        let gone: Vec<PodRef> = self
            .planned
            .keys()
            .filter(|p| !live.contains(*p))
            .cloned()
            .collect();
        for p in &gone {
            self.planned.remove(p);
        }
        gone
    }

    /// Takes the deletions due at `now`.
    pub fn take_due(&mut self, now: Instant) -> Vec<PodRef> {
        let mut due: Vec<PodRef> = self
            .planned
            .iter()
            .filter(|(_, s)| s.due <= now)
            .map(|(p, _)| p.clone())
            .collect();
        due.sort();
        for p in &due {
            self.planned.remove(p);
        }
        due
    }

    /// Plans a deletion that failed again after [`RETRY`].
    pub fn retry(&mut self, pod: PodRef, now: Instant) {
        self.planned.insert(
            pod,
            Scheduled {
                since: now,
                due: now + RETRY,
            },
        );
    }

    /// The earliest planned deletion.
    pub fn next_due(&self) -> Option<Instant> {
        self.planned.values().map(|s| s.due).min()
    }

    /// The plan for `pod`, if any.
    pub fn get(&self, pod: &PodRef) -> Option<Scheduled> {
        self.planned.get(pod).copied()
    }
}

/// Runs the controller until `shutdown`.
pub async fn run(client: Client, shutdown: CancellationToken) {
    let (pods, nodes, changes) = watch_pods_and_nodes(&client);
    let mut changes = std::pin::pin!(changes);
    let mut controller = Controller {
        recorder: recorder(client.clone(), CONTROLLER_NAME),
        client,
        schedule: Schedule::default(),
    };
    let mut pace = Pace::new();
    loop {
        let wake = controller
            .schedule
            .next_due()
            .map_or(RESYNC, |due| due.saturating_duration_since(Instant::now()))
            .min(RESYNC);
        tokio::select! {
            () = shutdown.cancelled() => return,
            change = changes.next() => if change.is_none() { return },
            () = tokio::time::sleep(wake) => {}
        }
        pace.ready().await;
        while let Some(Some(())) = changes.next().now_or_never() {}
        let ready = pods.wait_until_ready().now_or_never().is_some()
            && nodes.wait_until_ready().now_or_never().is_some();
        if ready {
            let started = tokio::time::Instant::now();
            controller.pass(&pods, &nodes).await;
            pace.passed(started);
        }
    }
}

struct Controller {
    client: Client,
    recorder: Recorder,
    schedule: Schedule,
}

impl Controller {
    async fn pass(&mut self, pods: &Store<Pod>, nodes: &Store<Node>) {
        let tainted: HashMap<String, Vec<Taint>> = nodes
            .state()
            .iter()
            .map(|n| (n.name_any(), no_execute_taints(n)))
            .filter(|(_, taints)| !taints.is_empty())
            .collect();
        let now = Instant::now();
        let mut live = std::collections::HashSet::new();
        let mut by_ref: HashMap<PodRef, Arc<Pod>> = HashMap::new();
        for pod in pods.state() {
            let spec = pod.spec.as_ref();
            let node = spec
                .and_then(|s| s.node_name.as_deref())
                .unwrap_or_default();
            let Some(taints) = tainted.get(node) else {
                continue;
            };
            if pod.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let tolerations = spec
                .and_then(|s| s.tolerations.as_deref())
                .unwrap_or_default();
            let judged = verdict(taints, tolerations);
            // Nothing planned and nothing to plan: a node whose thousand pods all tolerate its
            // taint for good (a virtual node) costs no allocation per pod and pass.
            if judged == Verdict::Stay && self.schedule.is_empty() {
                continue;
            }
            let key = PodRef {
                namespace: pod.namespace().unwrap_or_default(),
                name: pod.name_any(),
                uid: pod.metadata.uid.clone().unwrap_or_default(),
            };
            match self.schedule.observe(&key, judged, now) {
                Change::Cancelled => self.cancelled(&pod).await,
                Change::Planned => {
                    let due = self.schedule.get(&key).map(|s| s.due);
                    tracing::debug!(pod = %key.name, namespace = %key.namespace, %node,
                        in_ms = due.map(|d| d.saturating_duration_since(now).as_millis()),
                        "eviction planned");
                }
                Change::None => {}
            }
            live.insert(key.clone());
            by_ref.insert(key, pod);
        }
        // Pods whose node lost its NoExecute taints are spared, and told so (as upstream);
        // deleted ones are just forgotten.
        let remaining = self.schedule.retain(&live);
        if !remaining.is_empty() {
            let all: HashMap<String, Arc<Pod>> = pods
                .state()
                .into_iter()
                .map(|p| (p.metadata.uid.clone().unwrap_or_default(), p))
                .collect();
            for gone in remaining {
                if let Some(pod) = all.get(&gone.uid)
                    && pod.metadata.deletion_timestamp.is_none()
                {
                    self.cancelled(pod).await;
                }
            }
        }
        for key in self.schedule.take_due(now) {
            let Some(pod) = by_ref.get(&key) else {
                continue;
            };
            if !self.evict(pod, &key).await {
                self.schedule.retry(key, now);
            }
        }
    }

    /// The real controller's `deletePodHandler`: an event, the `DisruptionTarget` condition,
    /// then a plain delete (the pod's own grace period applies). Returns false to retry.
    async fn evict(&self, pod: &Pod, key: &PodRef) -> bool {
        tracing::info!(pod = %key.name, namespace = %key.namespace, "evicting pod for a NoExecute taint");
        self.event(
            pod,
            format!("Marking for deletion Pod {}/{}", key.namespace, key.name),
        )
        .await;
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &key.namespace);
        let condition = json!({"status": {"conditions": [{
            "type": "DisruptionTarget",
            "status": "True",
            "reason": "DeletionByTaintManager",
            "message": "Taint manager: deleting due to NoExecute taint",
            "lastTransitionTime": crate::timefmt::now_rfc3339(),
        }]}});
        match api
            .patch_status(
                &key.name,
                &PatchParams::apply(CONTROLLER_NAME),
                &Patch::Strategic(&condition),
            )
            .await
        {
            Ok(_) => {}
            Err(e) if is_status(&e, 404) => return true,
            Err(error) => tracing::debug!(%error, pod = %key.name, "cannot mark the disruption"),
        }
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(key.uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(&key.name, &params).await {
            Ok(_) => true,
            Err(e) if is_status(&e, 404) || is_status(&e, 409) => true,
            Err(error) => {
                tracing::warn!(%error, pod = %key.name, "eviction failed; retrying");
                false
            }
        }
    }

    async fn cancelled(&self, pod: &Pod) {
        let note = format!(
            "Cancelling deletion of Pod {}/{}",
            pod.namespace().unwrap_or_default(),
            pod.name_any()
        );
        self.event(pod, note).await;
    }

    async fn event(&self, pod: &Pod, note: String) {
        let event = Event {
            type_: EventType::Normal,
            reason: "TaintManagerEviction".into(),
            note: Some(note),
            action: "Evicting".into(),
            secondary: None,
        };
        if let Err(error) = self.recorder.publish(&event, &pod.object_ref(&())).await {
            tracing::debug!(%error, "cannot record a taint eviction event");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    fn taint(key: &str) -> Taint {
        Taint {
            key: key.into(),
            effect: "NoExecute".into(),
            ..Taint::default()
        }
    }

    fn toleration(key: &str, seconds: Option<i64>) -> Toleration {
        Toleration {
            key: Some(key.into()),
            operator: Some("Exists".into()),
            effect: Some("NoExecute".into()),
            toleration_seconds: seconds,
            value: None,
        }
    }

    #[test]
    fn verdicts_follow_the_matching_tolerations() {
        let secs = Duration::from_secs;
        let cases: Vec<(Vec<Taint>, Vec<Toleration>, Verdict)> = vec![
            (vec![], vec![], Verdict::Stay),
            (vec![taint("a")], vec![], Verdict::EvictNow),
            (vec![taint("a")], vec![toleration("a", None)], Verdict::Stay),
            (
                vec![taint("a")],
                vec![toleration("a", Some(30))],
                Verdict::EvictAfter(secs(30)),
            ),
            (
                vec![taint("a")],
                vec![toleration("a", Some(0))],
                Verdict::EvictNow,
            ),
            (
                vec![taint("a"), taint("b")],
                vec![toleration("a", Some(30)), toleration("b", Some(10))],
                Verdict::EvictAfter(secs(10)),
            ),
            (
                vec![taint("a"), taint("b")],
                vec![toleration("a", None)],
                Verdict::EvictNow,
            ),
            // The first matching toleration is the one used: a later, longer one is ignored.
            (
                vec![taint("a")],
                vec![toleration("a", Some(5)), toleration("a", None)],
                Verdict::EvictAfter(secs(5)),
            ),
            // An empty key with Exists tolerates every taint.
            (
                vec![taint("a"), taint("b")],
                vec![toleration("", None)],
                Verdict::Stay,
            ),
        ];
        for (taints, tolerations, want) in cases {
            assert_eq!(
                verdict(&taints, &tolerations),
                want,
                "{taints:?} {tolerations:?}"
            );
        }
    }

    #[test]
    fn default_tolerations_are_added_unless_already_tolerated() {
        let mut plain = json!({"spec": {"containers": [{"name": "c"}]}});
        default_toleration_seconds(&mut plain);
        expect_test::expect![[r#"[{"key":"node.kubernetes.io/not-ready","operator":"Exists","effect":"NoExecute","tolerationSeconds":300},{"key":"node.kubernetes.io/unreachable","operator":"Exists","effect":"NoExecute","tolerationSeconds":300}]"#]]
        .assert_eq(&plain["spec"]["tolerations"].to_string());

        let mut own = json!({"spec": {"tolerations": [
            {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
             "tolerationSeconds": 5}]}});
        default_toleration_seconds(&mut own);
        let keys: Vec<(&str, i64)> = own["spec"]["tolerations"]
            .as_array()
            .expect("list")
            .iter()
            .map(|t| {
                (
                    t["key"].as_str().unwrap_or_default(),
                    t["tolerationSeconds"].as_i64().unwrap_or(-1),
                )
            })
            .collect();
        assert_eq!(
            keys,
            [
                ("node.kubernetes.io/unreachable", 5),
                ("node.kubernetes.io/not-ready", 300)
            ]
        );

        // A toleration of everything (empty key, any effect) covers both.
        let mut all = json!({"spec": {"tolerations": [{"operator": "Exists"}]}});
        default_toleration_seconds(&mut all);
        assert_eq!(all["spec"]["tolerations"].as_array().map(Vec::len), Some(1));
        // A NoSchedule toleration of not-ready does not.
        let mut no_schedule = json!({"spec": {"tolerations": [
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoSchedule"}]}});
        default_toleration_seconds(&mut no_schedule);
        assert_eq!(
            no_schedule["spec"]["tolerations"].as_array().map(Vec::len),
            Some(3)
        );
    }

    fn pod(name: &str) -> PodRef {
        PodRef {
            namespace: "default".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
        }
    }

    #[test]
    fn a_running_countdown_keeps_its_deadline_and_cancels_when_tolerated() {
        let t0 = Instant::now();
        let s10 = Duration::from_secs(10);
        let mut plan = Schedule::default();
        let p = pod("a");
        assert_eq!(
            plan.observe(&p, Verdict::EvictAfter(s10), t0),
            Change::Planned
        );
        // Seen again later with the same taints: the deadline does not move.
        assert_eq!(
            plan.observe(&p, Verdict::EvictAfter(s10), t0 + Duration::from_secs(4)),
            Change::None
        );
        assert_eq!(plan.get(&p).map(|s| s.due), Some(t0 + s10));
        // Another taint with a shorter toleration does not move it either.
        let s3 = Duration::from_secs(3);
        plan.observe(&p, Verdict::EvictAfter(s3), t0 + Duration::from_secs(5));
        assert_eq!(plan.get(&p).map(|s| s.due), Some(t0 + s10));
        assert!(plan.take_due(t0 + Duration::from_secs(9)).is_empty());
        assert_eq!(plan.take_due(t0 + s10), std::slice::from_ref(&p));
        assert_eq!(plan.next_due(), None);
        // An untolerated taint cuts it short.
        plan.observe(&p, Verdict::EvictAfter(s10), t0);
        assert_eq!(
            plan.observe(&p, Verdict::EvictNow, t0 + s3),
            Change::Planned
        );
        assert_eq!(plan.take_due(t0 + s3), std::slice::from_ref(&p));

        let q = pod("b");
        plan.observe(&q, Verdict::EvictAfter(s10), t0);
        assert_eq!(plan.observe(&q, Verdict::Stay, t0), Change::Cancelled);
        assert_eq!(plan.observe(&q, Verdict::Stay, t0), Change::None);
        plan.observe(&q, Verdict::EvictNow, t0);
        assert_eq!(plan.next_due(), Some(t0));
        assert_eq!(plan.retain(&HashSet::new()), [q]);
        assert_eq!(plan.next_due(), None);
    }
}
