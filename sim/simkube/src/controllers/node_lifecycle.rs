//! Node lifecycle: a node whose kubelet stopped renewing its Lease (namespace
//! `kube-node-lease`) for longer than the grace period gets its conditions set to Unknown
//! (`NodeStatusUnknown`, "Kubelet stopped posting node status.") and the
//! `node.kubernetes.io/unreachable` taints; a node reporting `Ready=False` gets the `not-ready`
//! taints; the pods of an unreachable node are marked not Ready. When the heartbeat returns, the
//! taints go. The decision ([`assess`]) is pure.

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, NodeCondition, Pod, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt as _};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::is_status;
use super::scheduler::{TAINT_NOT_READY, TAINT_UNREACHABLE};

/// Namespace of the node heartbeat Leases.
pub const LEASE_NAMESPACE: &str = "kube-node-lease";
/// The real controller's default grace period (`--node-monitor-grace-period`).
pub const DEFAULT_GRACE: Duration = Duration::from_secs(40);
/// Conditions the kubelet owns; all of them turn Unknown when it goes silent.
const KUBELET_CONDITIONS: [&str; 4] = ["Ready", "MemoryPressure", "DiskPressure", "PIDPressure"];

/// What a node should look like after one check.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Assessment {
    /// Conditions to write (only those that change), if any.
    pub conditions: Vec<NodeCondition>,
    /// The node's full taint list, if it must change.
    pub taints: Option<Vec<Taint>>,
    /// Whether the node's pods must be marked not Ready.
    pub mark_pods_not_ready: bool,
}

fn lifecycle_taint(key: &str, effect: &str, now: Timestamp) -> Taint {
    Taint {
        key: key.into(),
        effect: effect.into(),
        time_added: (effect == "NoExecute").then_some(Time(now)),
        value: None,
    }
}

/// Decides what to do with `node` given its last heartbeat.
pub fn assess(node: &Node, heartbeat: Timestamp, now: Timestamp, grace: Duration) -> Assessment {
    let grace_secs = i64::try_from(grace.as_millis()).unwrap_or(i64::MAX);
    let silent_ms = now.as_millisecond() - heartbeat.as_millisecond();
    let stale = silent_ms > grace_secs;
    let conditions = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    let mut out = Assessment::default();
    // A node that has not reported yet is neither tainted nor untainted until its grace
    // period is over (then it is "never updated", Unknown).
    let mut ready = conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.status.clone());
    if stale {
        for type_ in KUBELET_CONDITIONS {
            let current = conditions.iter().find(|c| c.type_ == type_);
            if current.is_some_and(|c| c.status == "Unknown") {
                continue;
            }
            let (reason, message) = match current {
                Some(_) => ("NodeStatusUnknown", "Kubelet stopped posting node status."),
                None => (
                    "NodeStatusNeverUpdated",
                    "Kubelet never posted node status.",
                ),
            };
            out.conditions.push(NodeCondition {
                type_: type_.into(),
                status: "Unknown".into(),
                reason: Some(reason.into()),
                message: Some(message.into()),
                last_heartbeat_time: current.and_then(|c| c.last_heartbeat_time.clone()),
                last_transition_time: Some(Time(now)),
            });
        }
        ready = Some("Unknown".into());
        out.mark_pods_not_ready = true;
    }
    let Some(ready) = ready else {
        return out;
    };
    let wanted_key = match ready.as_str() {
        "True" => None,
        "False" => Some(TAINT_NOT_READY),
        _ => Some(TAINT_UNREACHABLE),
    };
    let current = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    let mut taints: Vec<Taint> = current
        .iter()
        .filter(|t| {
            let ours = t.key == TAINT_NOT_READY || t.key == TAINT_UNREACHABLE;
            !ours || Some(t.key.as_str()) == wanted_key
        })
        .cloned()
        .collect();
    if let Some(key) = wanted_key {
        for effect in ["NoSchedule", "NoExecute"] {
            if !taints.iter().any(|t| t.key == key && t.effect == effect) {
                taints.push(lifecycle_taint(key, effect, now));
            }
        }
    }
    if taints != current {
        out.taints = Some(taints);
    }
    out
}

/// Runs the controller until `shutdown`, checking every quarter of the grace period.
pub async fn run(client: Client, grace: Duration, shutdown: CancellationToken) {
    let period = (grace / 4).clamp(Duration::from_millis(100), Duration::from_secs(5));
    let mut first_seen: HashMap<String, Timestamp> = HashMap::new();
    loop {
        if let Err(error) = pass(&client, grace, &mut first_seen).await {
            tracing::warn!(%error, "node lifecycle pass failed; retrying");
        }
        if !super::pause(&shutdown, period).await {
            return;
        }
    }
}

async fn pass(
    client: &Client,
    grace: Duration,
    first_seen: &mut HashMap<String, Timestamp>,
) -> Result<(), kube::Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let leases: Api<Lease> = Api::namespaced(client.clone(), LEASE_NAMESPACE);
    let leases: HashMap<String, Timestamp> = leases
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|l| Some((l.name_any(), l.spec?.renew_time?.0)))
        .collect();
    let now = Timestamp::now();
    let list = nodes.list(&ListParams::default()).await?.items;
    first_seen.retain(|name, _| list.iter().any(|n| &n.name_any() == name));
    for node in list {
        let name = node.name_any();
        // The newest sign of life: the Lease, the kubelet's own heartbeat, or (for a node
        // that never reported) when this controller first saw it.
        let reported = node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
            .and_then(|c| c.last_heartbeat_time.as_ref().map(|t| t.0));
        let seen = *first_seen.entry(name.clone()).or_insert(now);
        let heartbeat = [leases.get(&name).copied(), reported, Some(seen)]
            .into_iter()
            .flatten()
            .max()
            .unwrap_or(now);
        let plan = assess(&node, heartbeat, now, grace);
        if !plan.conditions.is_empty() {
            tracing::info!(node = %name, "kubelet stopped posting node status");
            let patch = json!({"status": {"conditions": plan.conditions}});
            tolerate(
                nodes
                    .patch_status(&name, &PatchParams::default(), &Patch::Strategic(&patch))
                    .await,
            )?;
        }
        if let Some(taints) = &plan.taints {
            let patch = json!({"spec": {"taints": taints}});
            tolerate(
                nodes
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await,
            )?;
        }
        if plan.mark_pods_not_ready {
            mark_pods_not_ready(client, &name, now).await?;
        }
    }
    Ok(())
}

async fn mark_pods_not_ready(
    client: &Client,
    node: &str,
    now: Timestamp,
) -> Result<(), kube::Error> {
    let pods: Api<Pod> = Api::all(client.clone());
    let on_node = pods
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await?
        .items;
    for pod in on_node {
        let ready = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
            .is_some_and(|c| c.status == "True");
        if !ready {
            continue;
        }
        let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace().unwrap_or_default());
        let patch = json!({"status": {"conditions": [
            {"type": "Ready", "status": "False", "lastTransitionTime": Time(now)}
        ]}});
        tolerate(
            api.patch_status(
                &pod.name_any(),
                &PatchParams::default(),
                &Patch::Strategic(&patch),
            )
            .await,
        )?;
    }
    Ok(())
}

fn tolerate<T>(result: Result<T, kube::Error>) -> Result<(), kube::Error> {
    match result {
        Ok(_) => Ok(()),
        Err(e) if is_status(&e, 404) || is_status(&e, 409) => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;

    fn node(ready: &str, taints: Value) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": "n1"},
            "spec": {"taints": taints},
            "status": {"conditions": [
                {"type": "Ready", "status": ready},
                {"type": "MemoryPressure", "status": "False"}
            ]}
        }))
        .expect("node")
    }

    fn at(s: &str) -> Timestamp {
        s.parse().expect("time")
    }

    fn keys(taints: &[Taint]) -> Vec<String> {
        taints
            .iter()
            .map(|t| format!("{}:{}", t.key, t.effect))
            .collect()
    }

    #[test]
    fn fresh_ready_node_is_left_alone() {
        let a = assess(
            &node("True", json!([])),
            at("2024-01-01T00:00:00Z"),
            at("2024-01-01T00:00:30Z"),
            DEFAULT_GRACE,
        );
        assert_eq!(a, Assessment::default());
    }

    #[test]
    fn silent_node_turns_unknown_and_unreachable() {
        let custom = json!([{"key": "dedicated", "value": "db", "effect": "NoSchedule"}]);
        let a = assess(
            &node("True", custom),
            at("2024-01-01T00:00:00Z"),
            at("2024-01-01T00:00:41Z"),
            DEFAULT_GRACE,
        );
        let conds: Vec<(String, String, Option<String>)> = a
            .conditions
            .iter()
            .map(|c| (c.type_.clone(), c.status.clone(), c.reason.clone()))
            .collect();
        assert_eq!(conds.len(), 4);
        assert!(conds.iter().all(|c| c.1 == "Unknown"));
        let reasons: Vec<&str> = conds.iter().filter_map(|c| c.2.as_deref()).collect();
        assert_eq!(
            reasons,
            [
                "NodeStatusUnknown",
                "NodeStatusUnknown",
                "NodeStatusNeverUpdated",
                "NodeStatusNeverUpdated"
            ]
        );
        assert_eq!(
            a.conditions[0].message.as_deref(),
            Some("Kubelet stopped posting node status.")
        );
        assert_eq!(
            keys(&a.taints.expect("taints")),
            [
                "dedicated:NoSchedule",
                "node.kubernetes.io/unreachable:NoSchedule",
                "node.kubernetes.io/unreachable:NoExecute"
            ]
        );
        assert!(a.mark_pods_not_ready);
    }

    #[test]
    fn unreported_node_waits_for_the_grace_period() {
        let mut n = node("True", json!([]));
        n.status = None;
        let (t0, t1) = (at("2024-01-01T00:00:00Z"), at("2024-01-01T00:00:10Z"));
        assert_eq!(assess(&n, t0, t1, DEFAULT_GRACE), Assessment::default());
        let late = assess(&n, t0, at("2024-01-01T00:01:00Z"), DEFAULT_GRACE);
        assert_eq!(
            late.conditions[0].reason.as_deref(),
            Some("NodeStatusNeverUpdated")
        );
        assert_eq!(late.taints.map(|t| t.len()), Some(2));
    }

    #[test]
    fn already_unknown_node_is_not_rewritten() {
        let taints = json!([
            {"key": TAINT_UNREACHABLE, "effect": "NoSchedule"},
            {"key": TAINT_UNREACHABLE, "effect": "NoExecute", "timeAdded": "2024-01-01T00:00:41Z"}
        ]);
        let mut n = node("Unknown", taints);
        n.status.as_mut().expect("status").conditions = Some(
            KUBELET_CONDITIONS
                .iter()
                .map(|t| NodeCondition {
                    type_: (*t).into(),
                    status: "Unknown".into(),
                    ..NodeCondition::default()
                })
                .collect(),
        );
        let a = assess(
            &n,
            at("2024-01-01T00:00:00Z"),
            at("2024-01-01T00:05:00Z"),
            DEFAULT_GRACE,
        );
        assert!(a.conditions.is_empty() && a.taints.is_none());
    }

    #[test]
    fn not_ready_gets_not_ready_taints_and_recovery_clears_them() {
        let a = assess(
            &node("False", json!([])),
            at("2024-01-01T00:00:00Z"),
            at("2024-01-01T00:00:01Z"),
            DEFAULT_GRACE,
        );
        assert_eq!(
            keys(&a.taints.expect("taints")),
            [
                "node.kubernetes.io/not-ready:NoSchedule",
                "node.kubernetes.io/not-ready:NoExecute"
            ]
        );
        assert!(!a.mark_pods_not_ready);
        let tainted = json!([
            {"key": TAINT_UNREACHABLE, "effect": "NoSchedule"},
            {"key": "keep", "effect": "NoSchedule"}
        ]);
        let a = assess(
            &node("True", tainted),
            at("2024-01-01T00:00:00Z"),
            at("2024-01-01T00:00:01Z"),
            DEFAULT_GRACE,
        );
        assert_eq!(keys(&a.taints.expect("taints")), ["keep:NoSchedule"]);
    }
}
