//! kube-scheduler's VolumeBinding plugin, pure: which of a pod's claims are bound, which wait
//! for their first consumer, which make the pod unschedulable everywhere ([`pre_filter`]), and
//! which nodes a pod's volumes allow ([`PodClaims::filter`]), with the plugin's messages.

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::ResourceExt as _;

use super::{Unfit, matches_node_selector};
use crate::controllers::persistent_volumes::{
    NO_PROVISIONER, best_fit, claim_class, claim_fully_bound, waits_for_first_consumer,
};

/// The cached claims, volumes and classes the plugin reads.
#[derive(Debug, Default, Clone)]
pub struct VolumeView {
    /// Claims by (namespace, name).
    pub claims: HashMap<(String, String), Arc<PersistentVolumeClaim>>,
    /// Volumes by name.
    pub volumes: HashMap<String, Arc<PersistentVolume>>,
    /// Classes by name.
    pub classes: HashMap<String, Arc<StorageClass>>,
}

impl VolumeView {
    /// Indexes the caches' contents.
    pub fn new(
        claims: Vec<Arc<PersistentVolumeClaim>>,
        volumes: Vec<Arc<PersistentVolume>>,
        classes: Vec<Arc<StorageClass>>,
    ) -> Self {
        Self {
            claims: claims
                .into_iter()
                .map(|c| ((c.namespace().unwrap_or_default(), c.name_any()), c))
                .collect(),
            volumes: volumes.into_iter().map(|v| (v.name_any(), v)).collect(),
            classes: classes.into_iter().map(|c| (c.name_any(), c)).collect(),
        }
    }
}

/// One claim of a pod, as the plugin sees it.
#[derive(Debug, Clone)]
pub enum Claim {
    /// Bound; the volume, when it exists.
    Bound(Option<Arc<PersistentVolume>>),
    /// Unbound, of a `WaitForFirstConsumer` class: bound once a node is chosen.
    Delayed {
        /// The claim.
        claim: Arc<PersistentVolumeClaim>,
        /// Whether its class provisions volumes (else it needs an Available volume).
        provisions: bool,
        /// The Available volumes of its class, for a static match.
        candidates: Vec<Arc<PersistentVolume>>,
    },
}

/// A pod's claims (empty: the pod uses none and the plugin lets every node pass).
#[derive(Debug, Clone, Default)]
pub struct PodClaims(pub Vec<Claim>);

impl PodClaims {
    /// Claims that still wait for their first consumer.
    pub fn delayed(&self) -> Vec<&Arc<PersistentVolumeClaim>> {
        self.0
            .iter()
            .filter_map(|c| match c {
                Claim::Delayed { claim, .. } => Some(claim),
                Claim::Bound(_) => None,
            })
            .collect()
    }

    /// Whether every claim is bound (the pod may be bound to its node).
    pub fn all_bound(&self) -> bool {
        self.0.iter().all(|c| matches!(c, Claim::Bound(_)))
    }

    /// Why `node` cannot serve the pod's volumes, if it cannot.
    pub fn filter(&self, node: &Node) -> Option<Unfit> {
        for claim in &self.0 {
            match claim {
                Claim::Bound(None) => return Some(Unfit::VolumeBindConflict),
                Claim::Bound(Some(volume)) => {
                    if let Some(required) = volume
                        .spec
                        .as_ref()
                        .and_then(|s| s.node_affinity.as_ref())
                        .and_then(|a| a.required.as_ref())
                        && !matches_node_selector(required, node)
                    {
                        return Some(Unfit::VolumeNodeConflict);
                    }
                }
                Claim::Delayed {
                    claim,
                    provisions,
                    candidates,
                } => {
                    if !provisions
                        && best_fit(candidates.iter().map(|v| &**v), claim, Some(node)).is_none()
                    {
                        return Some(Unfit::NoMatchingVolume);
                    }
                }
            }
        }
        None
    }
}

/// The plugin's PreFilter: the pod's claims, or the message that makes it unschedulable on
/// every node (a missing or deleting claim, an unbound claim of an `Immediate` class, a
/// missing class).
pub fn pre_filter(pod: &Pod, view: &VolumeView) -> Result<PodClaims, String> {
    let namespace = pod.namespace().unwrap_or_default();
    let mut claims = Vec::new();
    let mut immediate = false;
    for volume in pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .into_iter()
        .flatten()
    {
        let Some(source) = &volume.persistent_volume_claim else {
            continue;
        };
        let name = &source.claim_name;
        let Some(claim) = view.claims.get(&(namespace.clone(), name.clone())) else {
            return Err(format!("persistentvolumeclaim {name:?} not found"));
        };
        if claim.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Lost") {
            let volume = claim
                .spec
                .as_ref()
                .and_then(|s| s.volume_name.clone())
                .unwrap_or_default();
            return Err(format!(
                "persistentvolumeclaim {name:?} bound to non-existent persistentvolume {volume:?}"
            ));
        }
        if claim.metadata.deletion_timestamp.is_some() {
            return Err(format!("persistentvolumeclaim {name:?} is being deleted"));
        }
        if claim_fully_bound(claim) {
            let volume = claim
                .spec
                .as_ref()
                .and_then(|s| s.volume_name.as_ref())
                .and_then(|v| view.volumes.get(v))
                .cloned();
            claims.push(Claim::Bound(volume));
            continue;
        }
        let class_name = claim_class(claim);
        let class =
            if class_name.is_empty() {
                None
            } else {
                Some(view.classes.get(&class_name).ok_or_else(|| {
                    format!("storageclass.storage.k8s.io {class_name:?} not found")
                })?)
            };
        match class {
            Some(class) if waits_for_first_consumer(class) => {
                let mut candidates: Vec<Arc<PersistentVolume>> = view
                    .volumes
                    .values()
                    .filter(|v| {
                        v.spec
                            .as_ref()
                            .and_then(|s| s.storage_class_name.as_deref())
                            .unwrap_or_default()
                            == class_name
                    })
                    .cloned()
                    .collect();
                candidates.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
                claims.push(Claim::Delayed {
                    claim: claim.clone(),
                    provisions: class.provisioner != NO_PROVISIONER,
                    candidates,
                });
            }
            _ => immediate = true,
        }
    }
    if immediate {
        return Err("pod has unbound immediate PersistentVolumeClaims".into());
    }
    Ok(PodClaims(claims))
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn claim(name: &str, class: Option<&str>, extra: Value) -> Arc<PersistentVolumeClaim> {
        let mut obj = json!({
            "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
        });
        if let Some(class) = class {
            obj["spec"]["storageClassName"] = json!(class);
        }
        json_patch::merge(&mut obj, &extra);
        Arc::new(serde_json::from_value(obj).expect("claim"))
    }

    fn class(name: &str, mode: &str, provisioner: &str) -> Arc<StorageClass> {
        Arc::new(
            serde_json::from_value(json!({"metadata": {"name": name},
                "provisioner": provisioner, "volumeBindingMode": mode}))
            .expect("class"),
        )
    }

    fn volume(name: &str, extra: Value) -> Arc<PersistentVolume> {
        let mut obj = json!({"metadata": {"name": name}, "spec": {
            "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
            "storageClassName": "local", "hostPath": {"path": "/x"}},
            "status": {"phase": "Available"}});
        json_patch::merge(&mut obj, &extra);
        Arc::new(serde_json::from_value(obj).expect("volume"))
    }

    fn node(name: &str) -> Node {
        serde_json::from_value(json!({"metadata": {"name": name,
            "labels": {"kubernetes.io/hostname": name}}}))
        .expect("node")
    }

    fn pod(claims: &[&str]) -> Pod {
        let volumes: Vec<Value> = claims
            .iter()
            .map(|c| json!({"name": c, "persistentVolumeClaim": {"claimName": c}}))
            .collect();
        serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "default"},
            "spec": {"containers": [{"name": "c"}], "volumes": volumes}}))
        .expect("pod")
    }

    fn pinned(to: &str) -> Value {
        json!({"spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": [to]}]}]}}}})
    }

    fn view() -> VolumeView {
        let bound =
            json!({"metadata": {"annotations": {"pv.kubernetes.io/bind-completed": "yes"}}});
        let mut on_n1 = bound.clone();
        on_n1["spec"] = json!({"volumeName": "pv-n1"});
        let mut ghost = bound;
        ghost["spec"] = json!({"volumeName": "pv-gone"});
        VolumeView::new(
            vec![
                claim("on-n1", Some("standard"), on_n1),
                claim("ghost", Some("standard"), ghost),
                claim("wffc", Some("standard"), json!({})),
                claim("now", Some("fast"), json!({})),
                claim("classless", None, json!({})),
                claim("missing-class", Some("nope"), json!({})),
                claim("local", Some("local"), json!({})),
                claim(
                    "lost",
                    Some("standard"),
                    json!({"status": {"phase": "Lost"},
                    "spec": {"volumeName": "pv-lost"}}),
                ),
                claim(
                    "going",
                    Some("standard"),
                    json!({"metadata": {
                    "deletionTimestamp": "2026-01-01T00:00:00Z", "finalizers": ["x"]}}),
                ),
            ],
            vec![
                volume("pv-n1", {
                    let mut v = pinned("n1");
                    v["spec"]["storageClassName"] = json!("standard");
                    v
                }),
                volume("pv-local-n2", pinned("n2")),
            ],
            vec![
                class("standard", "WaitForFirstConsumer", "simkube.dev/host-path"),
                class("fast", "Immediate", "simkube.dev/host-path"),
                class("local", "WaitForFirstConsumer", NO_PROVISIONER),
            ],
        )
    }

    #[test]
    fn pre_filter_rejects_what_no_node_can_fix_with_upstream_messages() {
        let view = view();
        let err = |claims: &[&str]| pre_filter(&pod(claims), &view).expect_err("unschedulable");
        assert_eq!(
            err(&["absent"]),
            r#"persistentvolumeclaim "absent" not found"#
        );
        assert_eq!(
            err(&["now"]),
            "pod has unbound immediate PersistentVolumeClaims"
        );
        assert_eq!(
            err(&["classless"]),
            "pod has unbound immediate PersistentVolumeClaims"
        );
        assert_eq!(
            err(&["missing-class"]),
            r#"storageclass.storage.k8s.io "nope" not found"#
        );
        assert_eq!(
            err(&["lost"]),
            r#"persistentvolumeclaim "lost" bound to non-existent persistentvolume "pv-lost""#
        );
        assert_eq!(
            err(&["going"]),
            r#"persistentvolumeclaim "going" is being deleted"#
        );
        let none = pre_filter(&pod(&[]), &view).expect("no claims");
        assert!(none.0.is_empty() && none.all_bound());
    }

    #[test]
    fn filter_follows_volume_affinity_provisioning_and_static_volumes() {
        let view = view();
        let (n1, n2) = (node("n1"), node("n2"));
        let claims = pre_filter(&pod(&["on-n1"]), &view).expect("bound");
        assert!(claims.all_bound());
        assert_eq!(claims.filter(&n1), None);
        assert_eq!(claims.filter(&n2), Some(Unfit::VolumeNodeConflict));

        let ghost = pre_filter(&pod(&["ghost"]), &view).expect("bound");
        assert_eq!(ghost.filter(&n1), Some(Unfit::VolumeBindConflict));

        let delayed = pre_filter(&pod(&["wffc", "on-n1"]), &view).expect("delayed");
        assert!(!delayed.all_bound());
        assert_eq!(delayed.delayed().len(), 1);
        assert_eq!(
            delayed.filter(&n1),
            None,
            "a provisioning class fits anywhere"
        );
        assert_eq!(delayed.filter(&n2), Some(Unfit::VolumeNodeConflict));

        let local = pre_filter(&pod(&["local"]), &view).expect("delayed");
        assert_eq!(local.filter(&n2), None, "the local volume on n2 fits");
        assert_eq!(local.filter(&n1), Some(Unfit::NoMatchingVolume));
    }
}
