//! Workload controllers: ReplicaSets keep their pod count, Deployments roll ReplicaSets,
//! DaemonSets run one pod per eligible node.
//!
//! Both follow kube-controller-manager's behaviour as users observe it (names, labels, owner
//! references, annotations, status fields, conditions and their reasons). Each reconcile reads
//! fresh state through the API, asks a pure planner what to do, then applies it.

pub mod daemonset;
pub mod deployment;
pub mod replicaset;

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, OwnerReference};
use kube::Resource;
use serde_json::{Map, Value};

/// Annotation carrying a Deployment's (and its ReplicaSets') revision number.
pub const REVISION_ANNOTATION: &str = "deployment.kubernetes.io/revision";
/// Annotation on a ReplicaSet with its Deployment's desired replicas.
pub const DESIRED_REPLICAS_ANNOTATION: &str = "deployment.kubernetes.io/desired-replicas";
/// Annotation on a ReplicaSet with replicas + maxSurge of its Deployment.
pub const MAX_REPLICAS_ANNOTATION: &str = "deployment.kubernetes.io/max-replicas";
/// Label telling apart the pods (and ReplicaSets) of each Deployment template.
pub const POD_TEMPLATE_HASH: &str = "pod-template-hash";

/// A `labelSelector` query string for a `metav1.LabelSelector`.
pub fn selector_query(selector: &LabelSelector) -> String {
    let mut parts = Vec::new();
    for (k, v) in selector.match_labels.iter().flatten() {
        parts.push(format!("{k}={v}"));
    }
    for e in selector.match_expressions.iter().flatten() {
        let values = e.values.clone().unwrap_or_default().join(",");
        parts.push(match e.operator.as_str() {
            "In" => format!("{} in ({values})", e.key),
            "NotIn" => format!("{} notin ({values})", e.key),
            "Exists" => e.key.clone(),
            _ => format!("!{}", e.key),
        });
    }
    parts.join(",")
}

/// Whether `labels` match a `metav1.LabelSelector` (an empty selector matches everything).
pub fn selector_matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let Ok(value) = serde_json::to_value(selector) else {
        return false;
    };
    let Ok(parsed) = crate::selectors::LabelSelector::from_object(&value) else {
        return false;
    };
    let labels: Map<String, Value> = labels
        .iter()
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect();
    parsed.matches(&labels)
}

/// The controller owner reference pointing at `owner`.
pub fn controller_ref<K: Resource<DynamicType = ()>>(owner: &K) -> Option<OwnerReference> {
    let meta = owner.meta();
    Some(OwnerReference {
        api_version: K::api_version(&()).into_owned(),
        kind: K::kind(&()).into_owned(),
        name: meta.name.clone()?,
        uid: meta.uid.clone()?,
        controller: Some(true),
        block_owner_deletion: Some(true),
    })
}

/// Whether `meta`'s controller reference is the object with `uid`.
pub fn controlled_by(refs: Option<&Vec<OwnerReference>>, uid: &str) -> bool {
    refs.into_iter()
        .flatten()
        .any(|r| r.controller == Some(true) && r.uid == uid)
}

/// Whether the object has any controller reference at all.
pub fn has_controller(refs: Option<&Vec<OwnerReference>>) -> bool {
    refs.into_iter()
        .flatten()
        .any(|r| r.controller == Some(true))
}
