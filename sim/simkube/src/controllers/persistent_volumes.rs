//! The persistent-volume controller: kube-controller-manager's persistentvolume-binder with a
//! host-path provisioner built in (what kind's local-path provisioner is to a kind cluster).
//!
//! It binds claims and volumes both ways (a volume pre-bound through `spec.claimRef`, or the
//! smallest Available volume that fits), provisions volumes of classes whose provisioner is
//! [`HOST_PATH_PROVISIONER`] (at once for `Immediate` classes, once the scheduler picked a node
//! for `WaitForFirstConsumer` ones), hands claims of other provisioners over to them through
//! the `storage-provisioner` annotations, and releases volumes whose claim is gone, deleting
//! the ones it provisioned when their reclaim policy says so. Every decision comes from
//! [`plan`], a pure function of the cached objects; the IO only carries the actions out.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt as _, StreamExt as _};
use k8s_openapi::api::core::v1::{Node, ObjectReference, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Client, Resource as _, ResourceExt as _};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::scheduler::{matches_node_selector, parse_quantity};
use super::{is_status, recorder};

/// The class every simulated cluster has, and the default one.
pub const DEFAULT_CLASS: &str = "standard";
/// The provisioner this controller serves: a directory on the (shared) host filesystem.
pub const HOST_PATH_PROVISIONER: &str = "simkube.dev/host-path";
/// The provisioner of classes for pre-created local volumes: nothing provisions them.
pub const NO_PROVISIONER: &str = "kubernetes.io/no-provisioner";
/// Marks the default StorageClass.
pub const ANN_DEFAULT_CLASS: &str = "storageclass.kubernetes.io/is-default-class";
/// The beta name of [`ANN_DEFAULT_CLASS`], still honoured upstream.
pub const ANN_DEFAULT_CLASS_BETA: &str = "storageclass.beta.kubernetes.io/is-default-class";
/// The claim's class before `spec.storageClassName` existed, still honoured upstream.
pub const ANN_CLAIM_CLASS_BETA: &str = "volume.beta.kubernetes.io/storage-class";
/// The node the scheduler chose for the first consumer of a `WaitForFirstConsumer` claim.
pub const ANN_SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
/// The provisioner expected to provision a claim.
pub const ANN_STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
/// The beta name of [`ANN_STORAGE_PROVISIONER`], still written upstream.
pub const ANN_STORAGE_PROVISIONER_BETA: &str = "volume.beta.kubernetes.io/storage-provisioner";
/// Set on a claim once its binding is complete.
pub const ANN_BIND_COMPLETED: &str = "pv.kubernetes.io/bind-completed";
/// Set on the side of a binding this controller wrote (not pre-bound by a user).
pub const ANN_BOUND_BY_CONTROLLER: &str = "pv.kubernetes.io/bound-by-controller";
/// Names the provisioner that made a volume.
pub const ANN_PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";
/// The node label provisioned volumes are pinned with.
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";
/// The controller's name in events, as kube-controller-manager reports it.
pub const CONTROLLER_NAME: &str = "persistentvolume-controller";
/// The name the resizer's events carry, as an external-resizer of this driver reports it.
pub const RESIZER_NAME: &str = "external-resizer simkube.dev/host-path";
/// The claim condition while a volume is being expanded.
pub const RESIZING: &str = "Resizing";

/// How often the whole state is examined again even when nothing changed.
const RESYNC: Duration = Duration::from_secs(5);

/// The StorageClass every simulated cluster starts with: the default class, provisioned by
/// this controller on the node the claim's first pod is scheduled to.
pub fn default_storage_class() -> StorageClass {
    serde_json::from_value(json!({
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {
            "name": DEFAULT_CLASS,
            "annotations": {ANN_DEFAULT_CLASS: "true"},
        },
        "provisioner": HOST_PATH_PROVISIONER,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "WaitForFirstConsumer",
    }))
    .expect("invariant: a valid StorageClass")
}

/// Whether a class (as JSON, as admission sees it) is marked default.
pub fn is_default_class(class: &Value) -> bool {
    [ANN_DEFAULT_CLASS, ANN_DEFAULT_CLASS_BETA]
        .iter()
        .any(|a| class["metadata"]["annotations"][*a].as_str() == Some("true"))
}

/// The default class among `classes`: of several, the newest (then the first by name), as the
/// DefaultStorageClass admission plugin picks.
pub fn default_class_name<'a>(classes: impl IntoIterator<Item = &'a Value>) -> Option<String> {
    let mut defaults: Vec<(&str, &str)> = classes
        .into_iter()
        .filter(|c| is_default_class(c))
        .filter_map(|c| {
            Some((
                c["metadata"]["creationTimestamp"].as_str().unwrap_or(""),
                c["metadata"]["name"].as_str()?,
            ))
        })
        .collect();
    // RFC 3339 timestamps of one server order as text.
    defaults.sort_by(|a, b| b.0.cmp(a.0).then(a.1.cmp(b.1)));
    defaults.first().map(|(_, name)| (*name).to_owned())
}

/// DefaultStorageClass admission of a new claim: a claim that names no class (neither
/// `spec.storageClassName` nor the beta annotation) gets the default one, if any. An explicit
/// `storageClassName: ""` asks for no class and is kept.
pub fn admit_claim<'a>(claim: &mut Value, classes: impl IntoIterator<Item = &'a Value>) {
    if !claim["spec"].is_object() {
        return;
    }
    let named = claim["spec"]
        .get("storageClassName")
        .is_some_and(|v| !v.is_null())
        || claim["metadata"]["annotations"]
            .get(ANN_CLAIM_CLASS_BETA)
            .is_some();
    if named {
        return;
    }
    if let Some(name) = default_class_name(classes) {
        claim["spec"]["storageClassName"] = json!(name);
    }
}

/// Why kube-apiserver's PersistentVolumeClaimResize admission refuses an update of `old` into
/// `new` (claims as JSON, as admission sees them), if it does: a larger storage request needs a
/// bound claim whose class, the same before and after, exists and sets
/// `allowVolumeExpansion: true`. `class` looks a StorageClass up by name.
pub fn resize_refusal(
    old: &Value,
    new: &Value,
    class: impl Fn(&str) -> Option<Value>,
) -> Option<&'static str> {
    let storage = |c: &Value| {
        c["spec"]["resources"]["requests"]["storage"]
            .as_str()
            .and_then(parse_quantity)
            .unwrap_or(0)
    };
    if storage(new) <= storage(old) {
        return None;
    }
    if old["status"]["phase"].as_str() != Some("Bound") {
        return Some("Only bound persistent volume claims can be expanded");
    }
    let class_of = |c: &Value| {
        c["metadata"]["annotations"][ANN_CLAIM_CLASS_BETA]
            .as_str()
            .or_else(|| c["spec"]["storageClassName"].as_str())
            .unwrap_or_default()
            .to_owned()
    };
    let name = class_of(new);
    let allowed = !name.is_empty()
        && name == class_of(old)
        && class(&name).is_some_and(|c| c["allowVolumeExpansion"].as_bool() == Some(true));
    (!allowed).then_some(
        "only dynamically provisioned pvc can be resized and the storageclass that provisions the pvc must support resize",
    )
}

/// The claim's class name (`""`: none).
pub fn claim_class(claim: &PersistentVolumeClaim) -> String {
    claim
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANN_CLAIM_CLASS_BETA).cloned())
        .or_else(|| claim.spec.as_ref()?.storage_class_name.clone())
        .unwrap_or_default()
}

/// Whether a class delays binding until a pod uses the claim.
pub fn waits_for_first_consumer(class: &StorageClass) -> bool {
    class.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer")
}

/// An annotation of an object.
pub fn annotation<'a>(meta: &'a kube::api::ObjectMeta, key: &str) -> Option<&'a str> {
    meta.annotations.as_ref()?.get(key).map(String::as_str)
}

/// Whether a claim is bound as the scheduler and kubelet count it: it names its volume and
/// the controller finished the binding.
pub fn claim_fully_bound(claim: &PersistentVolumeClaim) -> bool {
    claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.as_deref())
        .is_some_and(|v| !v.is_empty())
        && annotation(&claim.metadata, ANN_BIND_COMPLETED).is_some()
}

/// The storage a claim requests, in thousandths of a byte (0 when it asks for none).
pub fn claim_request(claim: &PersistentVolumeClaim) -> i128 {
    claim
        .spec
        .as_ref()
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .and_then(|q| parse_quantity(&q.0))
        .unwrap_or(0)
}

fn volume_capacity(volume: &PersistentVolume) -> i128 {
    volume
        .spec
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .and_then(|c| c.get("storage"))
        .and_then(|q| parse_quantity(&q.0))
        .unwrap_or(0)
}

fn volume_phase(volume: &PersistentVolume) -> &str {
    volume
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

fn claim_phase(claim: &PersistentVolumeClaim) -> &str {
    claim
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

fn volume_mode(mode: Option<&String>) -> &str {
    mode.map_or("Filesystem", String::as_str)
}

/// Whether an unclaimed volume can serve a claim: same class and volume mode, every access
/// mode the claim asks for, at least its request, and the claim's `matchLabels` (a claim with
/// `matchExpressions` matches nothing here). `node`, when given, must satisfy the volume's
/// node affinity.
pub fn volume_fits(
    volume: &PersistentVolume,
    claim: &PersistentVolumeClaim,
    node: Option<&Node>,
) -> bool {
    let (Some(vspec), Some(cspec)) = (volume.spec.as_ref(), claim.spec.as_ref()) else {
        return false;
    };
    if volume.metadata.deletion_timestamp.is_some()
        || vspec.claim_ref.is_some()
        || !matches!(volume_phase(volume), "Available" | "Pending" | "")
    {
        return false;
    }
    if vspec.storage_class_name.clone().unwrap_or_default() != claim_class(claim)
        || volume_mode(vspec.volume_mode.as_ref()) != volume_mode(cspec.volume_mode.as_ref())
    {
        return false;
    }
    let modes = vspec.access_modes.clone().unwrap_or_default();
    if !cspec
        .access_modes
        .iter()
        .flatten()
        .all(|m| modes.contains(m))
    {
        return false;
    }
    if volume_capacity(volume) < claim_request(claim) {
        return false;
    }
    if let Some(selector) = &cspec.selector {
        if selector
            .match_expressions
            .as_ref()
            .is_some_and(|e| !e.is_empty())
        {
            return false;
        }
        let labels = volume.metadata.labels.clone().unwrap_or_default();
        if selector
            .match_labels
            .iter()
            .flatten()
            .any(|(k, v)| labels.get(k) != Some(v))
        {
            return false;
        }
    }
    if let Some(node) = node
        && let Some(required) = vspec
            .node_affinity
            .as_ref()
            .and_then(|a| a.required.as_ref())
        && !matches_node_selector(required, node)
    {
        return false;
    }
    true
}

/// The smallest volume of `volumes` that fits `claim` (then the first by name).
pub fn best_fit<'a>(
    volumes: impl IntoIterator<Item = &'a PersistentVolume>,
    claim: &PersistentVolumeClaim,
    node: Option<&Node>,
) -> Option<&'a PersistentVolume> {
    volumes
        .into_iter()
        .filter(|v| volume_fits(v, claim, node))
        .min_by(|a, b| {
            volume_capacity(a)
                .cmp(&volume_capacity(b))
                .then_with(|| a.metadata.name.cmp(&b.metadata.name))
        })
}

/// What the controller sees: the cached objects and where provisioned volumes live.
#[derive(Debug, Clone, Copy)]
pub struct View<'a> {
    /// Every claim.
    pub claims: &'a [Arc<PersistentVolumeClaim>],
    /// Every volume.
    pub volumes: &'a [Arc<PersistentVolume>],
    /// Every StorageClass.
    pub classes: &'a [Arc<StorageClass>],
    /// Every node (for the node affinity of volumes).
    pub nodes: &'a [Arc<Node>],
    /// The directory under which host-path volumes are provisioned.
    pub volumes_dir: &'a Path,
}

/// What the object an event is about is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Subject {
    /// A claim, by namespace and name.
    Claim(String, String),
    /// A volume, by name.
    Volume(String),
}

/// One step of reconciliation, in the order the IO must take them.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Point the volume at the claim (`spec.claimRef`, with the claim's uid).
    ClaimRef {
        /// The volume.
        volume: String,
        /// The complete reference.
        claim_ref: ObjectReference,
        /// Whether to add [`ANN_BOUND_BY_CONTROLLER`] (the reference was not complete).
        by_controller: bool,
    },
    /// Set the volume's phase.
    VolumePhase {
        /// The volume.
        volume: String,
        /// `Available`, `Bound`, `Released`.
        phase: &'static str,
    },
    /// Name the volume in the claim and mark the binding complete.
    VolumeName {
        /// The claim's namespace.
        namespace: String,
        /// The claim.
        claim: String,
        /// The volume.
        volume: String,
        /// Whether to add [`ANN_BOUND_BY_CONTROLLER`] (the claim did not name the volume).
        by_controller: bool,
    },
    /// Set the claim's status.
    ClaimStatus {
        /// The claim's namespace.
        namespace: String,
        /// The claim.
        claim: String,
        /// `Pending`, `Bound`, `Lost`.
        phase: &'static str,
        /// The bound volume's capacity and access modes (Bound only).
        volume: Option<Arc<PersistentVolume>>,
    },
    /// Annotate the claim with the provisioner expected to serve it.
    Provisioner {
        /// The claim's namespace.
        namespace: String,
        /// The claim.
        claim: String,
        /// The class's provisioner.
        provisioner: String,
    },
    /// Create a host-path volume for a claim.
    Provision(Box<PersistentVolume>),
    /// Delete a released volume this controller provisioned, and its directory.
    Delete {
        /// The volume.
        volume: String,
        /// Its directory (only ever under the volumes directory).
        dir: Option<PathBuf>,
    },
    /// Expand a bound volume this controller provisioned to its claim's request, as an
    /// external-resizer does for a volume that needs no node expansion: the claim's
    /// `allocatedResources` and `Resizing` condition, the volume's capacity, then the claim's
    /// capacity, each step only once the one before it is written.
    Expand {
        /// The claim's namespace.
        namespace: String,
        /// The claim.
        claim: String,
        /// The volume.
        volume: String,
        /// The new size, as the claim requests it.
        size: String,
        /// Whether the volume's capacity is still below it.
        grow_volume: bool,
    },
    /// Record an event.
    Event {
        /// What it is about.
        subject: Subject,
        /// Normal or warning.
        warning: bool,
        /// The reason, as kube-controller-manager's.
        reason: &'static str,
        /// The message.
        message: String,
    },
}

fn reference(claim: &PersistentVolumeClaim) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("PersistentVolumeClaim".into()),
        namespace: claim.metadata.namespace.clone(),
        name: claim.metadata.name.clone(),
        uid: claim.metadata.uid.clone(),
        resource_version: claim.metadata.resource_version.clone(),
        field_path: None,
    }
}

fn key_of(claim: &PersistentVolumeClaim) -> (String, String) {
    (
        claim.metadata.namespace.clone().unwrap_or_default(),
        claim.metadata.name.clone().unwrap_or_default(),
    )
}

/// The directory of a provisioned volume: `<volumes dir>/pvc-<uid>_<namespace>_<name>`.
pub fn volume_dir(volumes_dir: &Path, claim: &PersistentVolumeClaim) -> PathBuf {
    let (namespace, name) = key_of(claim);
    let uid = claim.metadata.uid.clone().unwrap_or_default();
    volumes_dir.join(format!("pvc-{uid}_{namespace}_{name}"))
}

/// The volume the host-path provisioner makes for `claim` of `class`, pinned to `node` (by its
/// hostname label, as local-path provisioners pin theirs).
pub fn provisioned_volume(
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    node: Option<(&str, Option<&Node>)>,
    volumes_dir: &Path,
) -> PersistentVolume {
    let spec = claim.spec.clone().unwrap_or_default();
    let request = spec
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .map_or_else(|| "0".to_owned(), |q| q.0.clone());
    let mut volume = json!({
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": format!("pvc-{}", claim.metadata.uid.clone().unwrap_or_default()),
            "annotations": {ANN_PROVISIONED_BY: HOST_PATH_PROVISIONER},
        },
        "spec": {
            "capacity": {"storage": request},
            "accessModes": spec.access_modes.clone().unwrap_or_default(),
            "persistentVolumeReclaimPolicy": class.reclaim_policy.clone().unwrap_or_else(|| "Delete".into()),
            "storageClassName": class.metadata.name.clone().unwrap_or_default(),
            "volumeMode": volume_mode(spec.volume_mode.as_ref()),
            "claimRef": reference(claim),
            "hostPath": {
                "path": volume_dir(volumes_dir, claim).display().to_string(),
                "type": "DirectoryOrCreate",
            },
        },
    });
    if let Some((name, node)) = node {
        let hostname = node
            .and_then(|n| n.metadata.labels.as_ref()?.get(HOSTNAME_LABEL).cloned())
            .unwrap_or_else(|| name.to_owned());
        volume["spec"]["nodeAffinity"] = json!({"required": {"nodeSelectorTerms": [{
            "matchExpressions": [{"key": HOSTNAME_LABEL, "operator": "In", "values": [hostname]}]
        }]}});
    }
    serde_json::from_value(volume).expect("invariant: a valid PersistentVolume")
}

/// The upstream event text while an external provisioner is expected to act.
pub fn external_provisioning_message(provisioner: &str) -> String {
    format!(
        "Waiting for a volume to be created either by the external provisioner '{provisioner}' \
         or manually by the system administrator. If volume creation is delayed, please verify \
         that the provisioner is running and correctly registered."
    )
}

/// Decides every step that brings claims and volumes where kube-controller-manager would.
pub fn plan(view: &View<'_>) -> Vec<Action> {
    let mut out = Vec::new();
    let claims: BTreeMap<(String, String), &PersistentVolumeClaim> =
        view.claims.iter().map(|c| (key_of(c), &**c)).collect();
    let classes: BTreeMap<String, &StorageClass> =
        view.classes.iter().map(|c| (c.name_any(), &**c)).collect();
    let nodes: BTreeMap<String, &Node> = view.nodes.iter().map(|n| (n.name_any(), &**n)).collect();
    // Claims a volume is (being) bound to, so the claim side does not look for another.
    let mut served: BTreeSet<(String, String)> = BTreeSet::new();
    // Volumes taken by a static match in this pass.
    let mut taken: BTreeSet<String> = BTreeSet::new();
    let mut volumes: Vec<&Arc<PersistentVolume>> = view.volumes.iter().collect();
    volumes.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    for volume in &volumes {
        if volume.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let name = volume.name_any();
        let Some(claim_ref) = volume.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) else {
            if volume_phase(volume) != "Available" {
                out.push(Action::VolumePhase {
                    volume: name,
                    phase: "Available",
                });
            }
            continue;
        };
        let key = (
            claim_ref.namespace.clone().unwrap_or_default(),
            claim_ref.name.clone().unwrap_or_default(),
        );
        let ref_uid = claim_ref.uid.clone().unwrap_or_default();
        let claim = claims
            .get(&key)
            .filter(|c| ref_uid.is_empty() || c.metadata.uid.as_deref() == Some(&ref_uid));
        let Some(claim) = claim else {
            if ref_uid.is_empty() {
                // Reserved for a claim that does not exist yet.
                if volume_phase(volume) != "Available" {
                    out.push(Action::VolumePhase {
                        volume: name,
                        phase: "Available",
                    });
                }
                continue;
            }
            release(view, volume, &mut out);
            continue;
        };
        served.insert(key.clone());
        let named = claim
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.clone())
            .unwrap_or_default();
        if claim.metadata.deletion_timestamp.is_some() || (!named.is_empty() && named != name) {
            // The claim is going, or holds another volume: this one waits.
            continue;
        }
        bind(volume, claim, &named, &mut out);
        expand(volume, claim, &mut out);
    }
    let volumes_by_name: BTreeMap<String, &Arc<PersistentVolume>> =
        volumes.iter().map(|v| (v.name_any(), *v)).collect();
    let mut claim_list: Vec<&PersistentVolumeClaim> = claims.values().copied().collect();
    // Oldest first, so an earlier claim gets the better-fitting volume.
    claim_list.sort_by(|a, b| {
        a.metadata
            .creation_timestamp
            .as_ref()
            .map(|t| t.0)
            .cmp(&b.metadata.creation_timestamp.as_ref().map(|t| t.0))
            .then_with(|| key_of(a).cmp(&key_of(b)))
    });
    for claim in claim_list {
        let key = key_of(claim);
        if served.contains(&key) || claim.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let (namespace, name) = key.clone();
        let subject = Subject::Claim(namespace.clone(), name.clone());
        let named = claim
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.clone())
            .unwrap_or_default();
        if !named.is_empty() {
            let lost = annotation(&claim.metadata, ANN_BIND_COMPLETED).is_some()
                && !volumes_by_name.contains_key(&named);
            if lost && claim_phase(claim) != "Lost" {
                out.push(Action::ClaimStatus {
                    namespace,
                    claim: name,
                    phase: "Lost",
                    volume: None,
                });
                out.push(Action::Event {
                    subject,
                    warning: true,
                    reason: "ClaimLost",
                    message:
                        "Bound claim has lost its PersistentVolume. Data on the volume is lost!"
                            .into(),
                });
            } else if !lost {
                // Pre-bound by its user to a volume: claim that volume if it is free (the
                // volume side completes the binding), else wait for it.
                if let Some(volume) = volumes_by_name.get(&named)
                    && volume.spec.as_ref().is_some_and(|s| s.claim_ref.is_none())
                    && volume.metadata.deletion_timestamp.is_none()
                    && taken.insert(named.clone())
                {
                    out.push(Action::ClaimRef {
                        volume: named,
                        claim_ref: reference(claim),
                        by_controller: true,
                    });
                }
                pending(claim, &mut out);
            }
            continue;
        }
        let class_name = claim_class(claim);
        let class = classes.get(&class_name).copied();
        let delayed = class.is_some_and(waits_for_first_consumer);
        let selected = annotation(&claim.metadata, ANN_SELECTED_NODE);
        if !delayed || selected.is_some() {
            let node = selected.and_then(|n| nodes.get(n).copied());
            let candidates = volumes
                .iter()
                .filter(|v| !taken.contains(&v.name_any()))
                .map(|v| &***v);
            // A delayed claim's volume must suit the chosen node; an unknown node suits none.
            let fit = if delayed && node.is_none() {
                None
            } else {
                best_fit(candidates, claim, node)
            };
            if let Some(volume) = fit {
                let volume_name = volume.name_any();
                taken.insert(volume_name.clone());
                out.push(Action::ClaimRef {
                    volume: volume_name,
                    claim_ref: reference(claim),
                    by_controller: true,
                });
                pending(claim, &mut out);
                continue;
            }
        }
        pending(claim, &mut out);
        if class_name.is_empty() {
            out.push(Action::Event {
                subject,
                warning: false,
                reason: "FailedBinding",
                message:
                    "no persistent volumes available for this claim and no storage class is set"
                        .into(),
            });
            continue;
        }
        let Some(class) = class else {
            out.push(Action::Event {
                subject,
                warning: true,
                reason: "ProvisioningFailed",
                message: format!("storageclass.storage.k8s.io {class_name:?} not found"),
            });
            continue;
        };
        if delayed && selected.is_none() {
            out.push(Action::Event {
                subject,
                warning: false,
                reason: "WaitForFirstConsumer",
                message: "waiting for first consumer to be created before binding".into(),
            });
            continue;
        }
        let provisioner = class.provisioner.clone();
        if provisioner == NO_PROVISIONER {
            out.push(Action::Event {
                subject,
                warning: true,
                reason: "ProvisioningFailed",
                message: format!("no volume plugin matched name: {NO_PROVISIONER}"),
            });
            continue;
        }
        if annotation(&claim.metadata, ANN_STORAGE_PROVISIONER) != Some(provisioner.as_str())
            || annotation(&claim.metadata, ANN_STORAGE_PROVISIONER_BETA)
                != Some(provisioner.as_str())
        {
            out.push(Action::Provisioner {
                namespace: namespace.clone(),
                claim: name.clone(),
                provisioner: provisioner.clone(),
            });
        }
        if provisioner == HOST_PATH_PROVISIONER {
            let node = selected.map(|s| (s, nodes.get(s).copied()));
            let volume = provisioned_volume(claim, class, node, view.volumes_dir);
            if !volumes_by_name.contains_key(&volume.name_any()) {
                out.push(Action::Event {
                    subject,
                    warning: false,
                    reason: "ProvisioningSucceeded",
                    message: format!(
                        "Successfully provisioned volume {} using {HOST_PATH_PROVISIONER}",
                        volume.name_any()
                    ),
                });
                out.push(Action::Provision(Box::new(volume)));
            }
        } else {
            out.push(Action::Event {
                subject,
                warning: false,
                reason: "ExternalProvisioning",
                message: external_provisioning_message(&provisioner),
            });
        }
    }
    out
}

/// The steps that complete the binding of `volume` and `claim` (`named`: the claim's
/// `spec.volumeName`, empty or the volume).
fn bind(
    volume: &Arc<PersistentVolume>,
    claim: &PersistentVolumeClaim,
    named: &str,
    out: &mut Vec<Action>,
) {
    let name = volume.name_any();
    let (namespace, claim_name) = key_of(claim);
    let current = volume.spec.as_ref().and_then(|s| s.claim_ref.as_ref());
    let complete = current.is_some_and(|r| r.uid.is_some() && r.uid == claim.metadata.uid);
    if !complete {
        out.push(Action::ClaimRef {
            volume: name.clone(),
            claim_ref: reference(claim),
            by_controller: annotation(&volume.metadata, ANN_BOUND_BY_CONTROLLER).is_none(),
        });
    }
    if volume_phase(volume) != "Bound" {
        out.push(Action::VolumePhase {
            volume: name.clone(),
            phase: "Bound",
        });
    }
    if named.is_empty() || annotation(&claim.metadata, ANN_BIND_COMPLETED).is_none() {
        out.push(Action::VolumeName {
            namespace: namespace.clone(),
            claim: claim_name.clone(),
            volume: name,
            by_controller: named.is_empty(),
        });
    }
    let status = claim.status.clone().unwrap_or_default();
    let vspec = volume.spec.clone().unwrap_or_default();
    let becoming_bound = status.phase.as_deref() != Some("Bound");
    if becoming_bound || status.access_modes != vspec.access_modes {
        // A bound claim's capacity is the resizer's to move: the binder sets it only as the
        // claim becomes Bound, as upstream's does.
        let mut shown = (**volume).clone();
        if !becoming_bound && let Some(spec) = shown.spec.as_mut() {
            spec.capacity.clone_from(&status.capacity);
        }
        out.push(Action::ClaimStatus {
            namespace,
            claim: claim_name,
            phase: "Bound",
            volume: Some(Arc::new(shown)),
        });
    }
}

/// The storage a bound claim has, by its `status.capacity`.
pub fn claim_capacity(claim: &PersistentVolumeClaim) -> i128 {
    claim
        .status
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .and_then(|c| c.get("storage"))
        .and_then(|q| parse_quantity(&q.0))
        .unwrap_or(0)
}

/// A bound claim of a volume provisioned here that asks for more than it has is expanded: the
/// host-path provisioner is its own resizer, and a directory needs no node expansion.
fn expand(volume: &PersistentVolume, claim: &PersistentVolumeClaim, out: &mut Vec<Action>) {
    if annotation(&volume.metadata, ANN_PROVISIONED_BY) != Some(HOST_PATH_PROVISIONER)
        || claim_phase(claim) != "Bound"
        || claim.metadata.deletion_timestamp.is_some()
        || claim_request(claim) <= claim_capacity(claim)
    {
        return;
    }
    let Some(size) = claim
        .spec
        .as_ref()
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .map(|q| q.0.clone())
    else {
        return;
    };
    let (namespace, name) = key_of(claim);
    out.push(Action::Expand {
        namespace,
        claim: name,
        volume: volume.name_any(),
        size,
        grow_volume: volume_capacity(volume) < claim_request(claim),
    });
}

fn pending(claim: &PersistentVolumeClaim, out: &mut Vec<Action>) {
    if claim_phase(claim) != "Pending" {
        let (namespace, name) = key_of(claim);
        out.push(Action::ClaimStatus {
            namespace,
            claim: name,
            phase: "Pending",
            volume: None,
        });
    }
}

/// A volume whose claim is gone: Released, then reclaimed as its policy says. Only volumes
/// this controller provisioned are deleted here; another provisioner's are left to it, and
/// `Retain` keeps the volume Released until an administrator acts.
fn release(view: &View<'_>, volume: &PersistentVolume, out: &mut Vec<Action>) {
    let name = volume.name_any();
    if volume_phase(volume) != "Released" {
        out.push(Action::VolumePhase {
            volume: name.clone(),
            phase: "Released",
        });
    }
    let spec = volume.spec.clone().unwrap_or_default();
    let policy = spec
        .persistent_volume_reclaim_policy
        .as_deref()
        .unwrap_or("Retain");
    if policy != "Delete"
        || annotation(&volume.metadata, ANN_PROVISIONED_BY) != Some(HOST_PATH_PROVISIONER)
    {
        return;
    }
    // Only a directory strictly inside the volumes directory is ever removed.
    let dir = spec
        .host_path
        .map(|h| PathBuf::from(h.path))
        .filter(|p| p.parent() == Some(view.volumes_dir) && p.is_absolute());
    out.push(Action::Delete { volume: name, dir });
}

/// Runs the controller until `shutdown`, provisioning host-path volumes under `volumes_dir`.
pub async fn run(client: Client, volumes_dir: PathBuf, shutdown: CancellationToken) {
    let (claims, claim_writer) = reflector::store::<PersistentVolumeClaim>();
    let (volumes, volume_writer) = reflector::store::<PersistentVolume>();
    let (classes, class_writer) = reflector::store::<StorageClass>();
    let (nodes, node_writer) = reflector::store::<Node>();
    let config = watcher::Config::default;
    let changes = futures::stream::select_all([
        watcher(Api::<PersistentVolumeClaim>::all(client.clone()), config())
            .default_backoff()
            .reflect(claim_writer)
            .map(|_| ())
            .boxed(),
        watcher(Api::<PersistentVolume>::all(client.clone()), config())
            .default_backoff()
            .reflect(volume_writer)
            .map(|_| ())
            .boxed(),
        watcher(Api::<StorageClass>::all(client.clone()), config())
            .default_backoff()
            .reflect(class_writer)
            .map(|_| ())
            .boxed(),
        watcher(Api::<Node>::all(client.clone()), config())
            .default_backoff()
            .reflect(node_writer)
            .map(|_| ())
            .boxed(),
    ]);
    let mut changes = std::pin::pin!(changes);
    let mut controller = Controller {
        recorder: recorder(client.clone(), CONTROLLER_NAME),
        resizer: recorder(client.clone(), RESIZER_NAME),
        client,
        evented: HashSet::new(),
        expanded: HashSet::new(),
    };
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            change = changes.next() => if change.is_none() { return },
            () = tokio::time::sleep(RESYNC) => {}
        }
        while let Some(Some(())) = changes.next().now_or_never() {}
        let ready = [
            claims.wait_until_ready().now_or_never().is_some(),
            volumes.wait_until_ready().now_or_never().is_some(),
            classes.wait_until_ready().now_or_never().is_some(),
            nodes.wait_until_ready().now_or_never().is_some(),
        ];
        if ready.iter().all(|r| *r) {
            controller
                .pass(&claims, &volumes, &classes, &nodes, &volumes_dir)
                .await;
        }
    }
}

struct Controller {
    client: Client,
    recorder: Recorder,
    /// Events of the resizer, under its own name.
    resizer: Recorder,
    /// Events already recorded (subject, reason, message), so a resync does not repeat them.
    evented: HashSet<String>,
    /// Expansions carried out (claim uid, size): a pass over a cache that has not seen the
    /// last one yet must not start it again.
    expanded: HashSet<String>,
}

impl Controller {
    async fn pass(
        &mut self,
        claims: &Store<PersistentVolumeClaim>,
        volumes: &Store<PersistentVolume>,
        classes: &Store<StorageClass>,
        nodes: &Store<Node>,
        volumes_dir: &Path,
    ) {
        let (claims, volumes, classes, nodes) = (
            claims.state(),
            volumes.state(),
            classes.state(),
            nodes.state(),
        );
        let view = View {
            claims: &claims,
            volumes: &volumes,
            classes: &classes,
            nodes: &nodes,
            volumes_dir,
        };
        let by_key: BTreeMap<(String, String), &Arc<PersistentVolumeClaim>> =
            claims.iter().map(|c| (key_of(c), c)).collect();
        let by_name: BTreeMap<String, &Arc<PersistentVolume>> =
            volumes.iter().map(|v| (v.name_any(), v)).collect();
        for action in plan(&view) {
            let what = format!("{action:?}");
            if let Err(error) = self.apply(action, &by_key, &by_name).await {
                // Conflicts and vanished objects resolve on the next pass.
                tracing::debug!(%error, action = %what, "persistent volume step failed");
            }
        }
    }

    async fn apply(
        &mut self,
        action: Action,
        claims: &BTreeMap<(String, String), &Arc<PersistentVolumeClaim>>,
        volumes: &BTreeMap<String, &Arc<PersistentVolume>>,
    ) -> Result<(), kube::Error> {
        let pp = PatchParams::default();
        let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
        match action {
            Action::ClaimRef {
                volume,
                claim_ref,
                by_controller,
            } => {
                let mut patch = json!({"spec": {"claimRef": claim_ref}});
                if by_controller {
                    patch["metadata"] = json!({"annotations": {ANN_BOUND_BY_CONTROLLER: "yes"}});
                }
                pvs.patch(&volume, &pp, &Patch::Merge(&patch)).await?;
            }
            Action::VolumePhase { volume, phase } => {
                let patch = json!({"status": {"phase": phase}});
                pvs.patch_status(&volume, &pp, &Patch::Merge(&patch))
                    .await?;
            }
            Action::VolumeName {
                namespace,
                claim,
                volume,
                by_controller,
            } => {
                let mut annotations = json!({ANN_BIND_COMPLETED: "yes"});
                if by_controller {
                    annotations[ANN_BOUND_BY_CONTROLLER] = json!("yes");
                }
                let patch = json!({"metadata": {"annotations": annotations}, "spec": {"volumeName": volume}});
                Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), &namespace)
                    .patch(&claim, &pp, &Patch::Merge(&patch))
                    .await?;
            }
            Action::ClaimStatus {
                namespace,
                claim,
                phase,
                volume,
            } => {
                let spec = volume.and_then(|v| v.spec.clone()).unwrap_or_default();
                let patch = json!({"status": {
                    "phase": phase,
                    "capacity": spec.capacity,
                    "accessModes": spec.access_modes,
                }});
                Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), &namespace)
                    .patch_status(&claim, &pp, &Patch::Merge(&patch))
                    .await?;
            }
            Action::Provisioner {
                namespace,
                claim,
                provisioner,
            } => {
                let patch = json!({"metadata": {"annotations": {
                    ANN_STORAGE_PROVISIONER: provisioner,
                    ANN_STORAGE_PROVISIONER_BETA: provisioner,
                }}});
                Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), &namespace)
                    .patch(&claim, &pp, &Patch::Merge(&patch))
                    .await?;
            }
            Action::Provision(volume) => match pvs.create(&PostParams::default(), &*volume).await {
                Ok(_) => {
                    tracing::info!(volume = %volume.name_any(), "provisioned a host-path volume");
                }
                Err(e) if is_status(&e, 409) => {}
                Err(e) => return Err(e),
            },
            Action::Delete { volume, dir } => {
                if let Some(dir) = &dir
                    && let Err(error) = std::fs::remove_dir_all(dir)
                    && error.kind() != std::io::ErrorKind::NotFound
                {
                    let message = format!("cannot remove {}: {error}", dir.display());
                    self.event(
                        Subject::Volume(volume.clone()),
                        true,
                        "VolumeFailedDelete",
                        message,
                        claims,
                        volumes,
                    )
                    .await;
                    return Ok(());
                }
                match pvs.delete(&volume, &DeleteParams::default()).await {
                    Ok(_) => tracing::info!(%volume, "deleted a released volume"),
                    Err(e) if is_status(&e, 404) => {}
                    Err(e) => return Err(e),
                }
            }
            Action::Expand {
                namespace,
                claim,
                volume,
                size,
                grow_volume,
            } => {
                let uid = claims
                    .get(&(namespace.clone(), claim.clone()))
                    .and_then(|c| c.metadata.uid.clone())
                    .unwrap_or_default();
                let done = format!("{uid}/{size}");
                if !self.expanded.contains(&done) {
                    self.expand(
                        &namespace,
                        &claim,
                        &volume,
                        &size,
                        grow_volume,
                        claims,
                        volumes,
                    )
                    .await?;
                    self.expanded.insert(done);
                }
            }
            Action::Event {
                subject,
                warning,
                reason,
                message,
            } => {
                self.event(subject, warning, reason, message, claims, volumes)
                    .await;
            }
        }
        Ok(())
    }

    /// Carries an [`Action::Expand`] out, stopping at the first step that fails so that the
    /// next pass starts again from what was written.
    #[allow(clippy::too_many_arguments)]
    async fn expand(
        &mut self,
        namespace: &str,
        claim: &str,
        volume: &str,
        size: &str,
        grow_volume: bool,
        claims: &BTreeMap<(String, String), &Arc<PersistentVolumeClaim>>,
        volumes: &BTreeMap<String, &Arc<PersistentVolume>>,
    ) -> Result<(), kube::Error> {
        let pp = PatchParams::default();
        let api = Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), namespace);
        let subject = Subject::Claim(namespace.to_owned(), claim.to_owned());
        let started = json!({"status": {
            "allocatedResources": {"storage": size},
            "allocatedResourceStatuses": {"storage": "ControllerResizeInProgress"},
            "conditions": [{
                "type": RESIZING,
                "status": "True",
                "lastProbeTime": null,
                "lastTransitionTime": crate::timefmt::now_rfc3339(),
            }],
        }});
        api.patch_status(claim, &pp, &Patch::Merge(&started))
            .await?;
        let resizing = format!("External resizer is resizing volume {volume}");
        self.resizer_event(&subject, false, "Resizing", resizing, claims, volumes)
            .await;
        if grow_volume {
            let grown = json!({"spec": {"capacity": {"storage": size}}});
            if let Err(e) = Api::<PersistentVolume>::all(self.client.clone())
                .patch(volume, &pp, &Patch::Merge(&grown))
                .await
            {
                let failed = format!("resize volume {volume} failed: {e}");
                self.resizer_event(
                    &subject,
                    true,
                    "VolumeResizeFailed",
                    failed,
                    claims,
                    volumes,
                )
                .await;
                return Err(e);
            }
        }
        let finished = json!({"status": {
            "capacity": {"storage": size},
            "conditions": null,
            "allocatedResourceStatuses": null,
        }});
        api.patch_status(claim, &pp, &Patch::Merge(&finished))
            .await?;
        tracing::info!(%namespace, %claim, %volume, %size, "expanded a host-path volume");
        let done = "Resize volume succeeded".to_owned();
        self.resizer_event(
            &subject,
            false,
            "VolumeResizeSuccessful",
            done,
            claims,
            volumes,
        )
        .await;
        Ok(())
    }

    async fn resizer_event(
        &mut self,
        subject: &Subject,
        warning: bool,
        reason: &str,
        message: String,
        claims: &BTreeMap<(String, String), &Arc<PersistentVolumeClaim>>,
        volumes: &BTreeMap<String, &Arc<PersistentVolume>>,
    ) {
        // Not deduplicated like the binder's: `expanded` already keeps a resize from repeating,
        // and a later resize of the same claim says the same words again.
        let recorder = self.resizer.clone();
        let dedup = false;
        self.publish(
            &recorder,
            subject.clone(),
            warning,
            reason,
            "Resizing",
            message,
            dedup,
            claims,
            volumes,
        )
        .await;
    }

    async fn event(
        &mut self,
        subject: Subject,
        warning: bool,
        reason: &str,
        message: String,
        claims: &BTreeMap<(String, String), &Arc<PersistentVolumeClaim>>,
        volumes: &BTreeMap<String, &Arc<PersistentVolume>>,
    ) {
        let recorder = self.recorder.clone();
        self.publish(
            &recorder, subject, warning, reason, "Binding", message, true, claims, volumes,
        )
        .await;
    }

    #[allow(clippy::too_many_arguments)]
    async fn publish(
        &mut self,
        recorder: &Recorder,
        subject: Subject,
        warning: bool,
        reason: &str,
        action: &str,
        message: String,
        dedup: bool,
        claims: &BTreeMap<(String, String), &Arc<PersistentVolumeClaim>>,
        volumes: &BTreeMap<String, &Arc<PersistentVolume>>,
    ) {
        let object = match &subject {
            Subject::Claim(namespace, name) => claims
                .get(&(namespace.clone(), name.clone()))
                .map(|c| (c.object_ref(&()), c.metadata.uid.clone())),
            Subject::Volume(name) => volumes
                .get(name)
                .map(|v| (v.object_ref(&()), v.metadata.uid.clone())),
        };
        let Some((object, uid)) = object else {
            return;
        };
        let key = format!("{}/{reason}/{message}", uid.unwrap_or_default());
        if dedup && !self.evented.insert(key) {
            return;
        }
        let event = Event {
            type_: if warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: reason.into(),
            note: Some(message),
            action: action.into(),
            secondary: None,
        };
        if let Err(error) = recorder.publish(&event, &object).await {
            tracing::debug!(%error, "cannot record a persistent volume event");
        }
    }
}

#[cfg(test)]
mod tests;
