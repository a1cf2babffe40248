//! The provisioner of the `tether` StorageClass (`tether.dev/remote`): a claim of that class
//! whose pod the scheduler put on one of this cluster's virtual nodes is served by the
//! provider behind that node. The claim gets a twin of the same name in the provider's twin
//! namespace (the provider's own class provisions it once the offloaded pod is scheduled
//! there) and, at once, a local volume pre-bound to it whose node affinity keeps every later
//! pod of the claim on that virtual node, where the data is. A released volume with reclaim
//! `Delete` takes the twin claim with it. The plans are pure functions; `run` applies them.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, Node, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    ObjectReference, PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimSpec,
    PersistentVolumeSpec, VolumeNodeAffinity, VolumeResourceRequirements,
};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use tether_api::ClusterId;
use tether_api::names::{labels, storage};
use tokio_util::sync::CancellationToken;

use super::OffCtx;
use super::pods::ORIGIN_UID;
use super::reflect::plan::{REFLECTED, REMOTE_CLUSTER_ID, is_ours};
use crate::Error;

/// The annotation the scheduler sets on a claim of a `WaitForFirstConsumer` class: the node
/// of the first pod that uses it.
pub const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
/// The annotation on a volume naming the provisioner that made it.
pub const PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";
/// The node label a volume's node affinity selects.
pub const HOSTNAME: &str = "kubernetes.io/hostname";
/// The field manager of the twin claims.
const MANAGER: &str = "tether-volumes";
/// How long one call to a provider may take.
const CALL: Duration = Duration::from_secs(5);
/// How soon a claim that waits on its provider is looked at again.
const WAITING: Duration = Duration::from_secs(5);

/// What the provisioner does about one claim, decided from the claim, its class and the node
/// the scheduler chose.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Not this provisioner's: bound already, being deleted, of another class, or no node
    /// chosen yet.
    Skip,
    /// The chosen node is no virtual node of this cluster (or names no provider): nothing
    /// here can serve the claim there.
    Refuse(String),
    /// Provision at `provider` for pods on virtual node `node`.
    Provision {
        /// The virtual node.
        node: String,
        /// The provider behind it.
        provider: ClusterId,
    },
}

/// Whether `class` is served by this provisioner.
pub fn is_ours_class(class: &StorageClass) -> bool {
    class.provisioner == storage::PROVISIONER
}

/// What to do about `claim` of `class` (`None`: the class does not exist or the claim names
/// none), whose selected node, if any, is `node` (`None`: no such Node).
pub fn decide(
    claim: &PersistentVolumeClaim,
    class: Option<&StorageClass>,
    node: Option<&Node>,
) -> Decision {
    let spec = claim.spec.as_ref();
    let bound = spec
        .and_then(|s| s.volume_name.as_deref())
        .is_some_and(|v| !v.is_empty());
    if bound || claim.metadata.deletion_timestamp.is_some() {
        return Decision::Skip;
    }
    if !class.is_some_and(is_ours_class) {
        return Decision::Skip;
    }
    let Some(selected) = claim.annotations().get(SELECTED_NODE) else {
        return Decision::Skip;
    };
    let class_name = class.map(ResourceExt::name_any).unwrap_or_default();
    let Some(node) = node else {
        return Decision::Refuse(format!(
            "the selected node {selected} does not exist; delete the pod so that the scheduler chooses again"
        ));
    };
    let virtual_node =
        node.labels().get(labels::TYPE).map(String::as_str) == Some(labels::TYPE_VIRTUAL_NODE);
    if !virtual_node {
        return Decision::Refuse(format!(
            "class {class_name} is served by providers, for pods on virtual nodes, and node {selected} is not one; \
             use another class for pods that run in this cluster"
        ));
    }
    match node
        .labels()
        .get(labels::REMOTE_CLUSTER_ID)
        .map(ClusterId::new)
    {
        Some(Ok(provider)) => Decision::Provision {
            node: selected.clone(),
            provider,
        },
        Some(Err(e)) => Decision::Refuse(format!(
            "virtual node {selected} names an invalid provider in {}: {e}",
            labels::REMOTE_CLUSTER_ID
        )),
        None => Decision::Refuse(format!(
            "virtual node {selected} has no {} label naming its provider",
            labels::REMOTE_CLUSTER_ID
        )),
    }
}

/// The name of the local volume for `claim`, as external provisioners name theirs.
pub fn volume_name(claim: &PersistentVolumeClaim) -> String {
    format!("pvc-{}", claim.metadata.uid.as_deref().unwrap_or_default())
}

/// The CSI volume handle of the twin claim `name` in `twin` at `provider`.
pub fn volume_handle(provider: &ClusterId, twin: &str, name: &str) -> String {
    format!("{provider}/{twin}/{name}")
}

/// The provider, twin namespace and claim name a volume handle names.
pub fn parse_handle(handle: &str) -> Option<(ClusterId, String, String)> {
    let mut parts = handle.splitn(3, '/');
    let provider = ClusterId::new(parts.next()?).ok()?;
    let twin = parts.next().filter(|s| !s.is_empty())?;
    let name = parts.next().filter(|s| !s.is_empty() && !s.contains('/'))?;
    Some((provider, twin.to_owned(), name.to_owned()))
}

/// The annotations the Kubernetes machinery sets on a claim (binding, provisioner, selected
/// node, kubectl's last configuration): they describe the claim here and would mislead the
/// provider's scheduler and volume controller.
fn machinery(key: &str) -> bool {
    key.split_once('/')
        .is_some_and(|(prefix, _)| prefix == "kubernetes.io" || prefix.ends_with(".kubernetes.io"))
}

/// The twin of `claim` at a provider: same name, access modes, volume mode and resources; the
/// provider's class named by the class parameter, else none, so the provider's default class
/// serves it; marked as this consumer's copy and with the UID of the claim it stands for.
pub fn remote_claim(
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    consumer: &ClusterId,
) -> PersistentVolumeClaim {
    let mut lbls = claim.labels().clone();
    lbls.insert(REFLECTED.to_owned(), "true".to_owned());
    lbls.insert(REMOTE_CLUSTER_ID.to_owned(), consumer.as_str().to_owned());
    let mut annotations: BTreeMap<String, String> = claim
        .annotations()
        .iter()
        .filter(|(k, _)| !machinery(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if let Some(uid) = &claim.metadata.uid {
        annotations.insert(ORIGIN_UID.to_owned(), uid.clone());
    }
    let spec = claim.spec.clone().unwrap_or_default();
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: claim.metadata.name.clone(),
            labels: Some(lbls),
            annotations: (!annotations.is_empty()).then_some(annotations),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: spec.access_modes,
            volume_mode: spec.volume_mode,
            resources: spec.resources.map(|r| VolumeResourceRequirements {
                requests: r.requests,
                limits: r.limits,
            }),
            storage_class_name: class
                .parameters
                .as_ref()
                .and_then(|p| p.get(storage::PROVIDER_STORAGE_CLASS))
                .filter(|c| !c.is_empty())
                .cloned(),
            ..PersistentVolumeClaimSpec::default()
        }),
        status: None,
    }
}

/// The local volume for `claim`, pre-bound to it: the requested capacity, the claim's access
/// modes and volume mode, reclaim policy from `class`, node affinity to virtual node `node`,
/// and a CSI source whose handle names the twin claim at `provider`. `Err` says what the
/// claim lacks.
pub fn local_volume(
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    node: &str,
    provider: &ClusterId,
    twin: &str,
) -> Result<PersistentVolume, String> {
    let name = claim.name_any();
    let spec = claim.spec.clone().unwrap_or_default();
    let Some(request) = spec
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .cloned()
    else {
        return Err(format!(
            "claim {name} requests no storage (spec.resources.requests.storage); set how much it needs"
        ));
    };
    let access_modes = spec.access_modes.clone().filter(|m| !m.is_empty());
    if access_modes.is_none() {
        return Err(format!(
            "claim {name} names no access mode (spec.accessModes); add one, such as ReadWriteOnce"
        ));
    }
    let Some(uid) = claim.metadata.uid.clone() else {
        return Err(format!("claim {name} has no UID yet"));
    };
    Ok(PersistentVolume {
        metadata: ObjectMeta {
            name: Some(volume_name(claim)),
            labels: Some(BTreeMap::from([
                (labels::REMOTE_CLUSTER_ID.to_owned(), provider.to_string()),
                (labels::VIRTUAL_NODE.to_owned(), node.to_owned()),
            ])),
            annotations: Some(BTreeMap::from([(
                PROVISIONED_BY.to_owned(),
                storage::PROVISIONER.to_owned(),
            )])),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeSpec {
            capacity: Some(BTreeMap::from([("storage".to_owned(), request)])),
            access_modes,
            volume_mode: spec.volume_mode,
            storage_class_name: Some(class.name_any()),
            persistent_volume_reclaim_policy: Some(
                class
                    .reclaim_policy
                    .clone()
                    .unwrap_or_else(|| "Delete".to_owned()),
            ),
            claim_ref: Some(ObjectReference {
                api_version: Some("v1".to_owned()),
                kind: Some("PersistentVolumeClaim".to_owned()),
                namespace: claim.metadata.namespace.clone(),
                name: Some(name.clone()),
                uid: Some(uid),
                ..ObjectReference::default()
            }),
            node_affinity: Some(VolumeNodeAffinity {
                required: Some(NodeSelector {
                    node_selector_terms: vec![NodeSelectorTerm {
                        match_expressions: Some(vec![NodeSelectorRequirement {
                            key: HOSTNAME.to_owned(),
                            operator: "In".to_owned(),
                            values: Some(vec![node.to_owned()]),
                        }]),
                        match_fields: None,
                    }],
                }),
            }),
            csi: Some(CSIPersistentVolumeSource {
                driver: storage::PROVISIONER.to_owned(),
                volume_handle: volume_handle(provider, twin, &name),
                ..CSIPersistentVolumeSource::default()
            }),
            ..PersistentVolumeSpec::default()
        }),
        status: None,
    })
}

/// Whether `pv` is a volume this provisioner made.
pub fn provisioned_here(pv: &PersistentVolume) -> bool {
    pv.annotations().get(PROVISIONED_BY).map(String::as_str) == Some(storage::PROVISIONER)
}

/// Whether `pv` was released by its claim and is to be deleted with what it stands for.
pub fn to_reclaim(pv: &PersistentVolume) -> bool {
    provisioned_here(pv)
        && pv.metadata.deletion_timestamp.is_none()
        && pv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Released")
        && pv
            .spec
            .as_ref()
            .and_then(|s| s.persistent_volume_reclaim_policy.as_deref())
            == Some("Delete")
}

/// What the provisioner works with.
struct Vols {
    octx: Arc<OffCtx>,
    recorder: Recorder,
    /// The last Event published per object UID, so a claim that keeps waiting for the same
    /// reason is not told again at every look.
    told: Mutex<HashMap<String, String>>,
}

impl Vols {
    /// Publishes an Event about `obj` unless the last one about it said the same.
    async fn tell<K: Resource<DynamicType = ()>>(
        &self,
        obj: &K,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        let uid = obj.meta().uid.clone().unwrap_or_default();
        let said = format!("{reason}: {note}");
        {
            let mut told = self.told.lock().unwrap_or_else(PoisonError::into_inner);
            if told.get(&uid) == Some(&said) {
                return;
            }
            told.insert(uid, said);
        }
        let event = Event {
            type_,
            reason: reason.to_owned(),
            note: Some(note),
            action: "Provisioning".to_owned(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, &obj.object_ref(&())).await {
            tracing::debug!(reason, error = %e, "publishing an Event failed");
        }
    }

    fn forget(&self, uid: Option<&str>) {
        if let Some(uid) = uid {
            self.told
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(uid);
        }
    }
}

/// Runs the provisioner until `stop`: claims are provisioned, released volumes reclaimed.
pub async fn run(octx: Arc<OffCtx>, stop: CancellationToken) {
    let client = octx.ctx.client.clone();
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: storage::PROVISIONER.to_owned(),
            instance: None,
        },
    );
    let vols = Arc::new(Vols {
        octx,
        recorder,
        told: Mutex::default(),
    });
    let claims = Controller::new(
        Api::<PersistentVolumeClaim>::all(client.clone()),
        watcher::Config::default(),
    )
    .graceful_shutdown_on(stop.clone().cancelled_owned())
    .run(provision, claim_error, vols.clone())
    .for_each(|_| async {});
    let volumes = Controller::new(
        Api::<PersistentVolume>::all(client),
        watcher::Config::default(),
    )
    .graceful_shutdown_on(stop.cancelled_owned())
    .run(reclaim, volume_error, vols)
    .for_each(|_| async {});
    tokio::join!(claims, volumes);
}

fn claim_error(claim: Arc<PersistentVolumeClaim>, e: &Error, _: Arc<Vols>) -> Action {
    tracing::warn!(namespace = %claim.namespace().unwrap_or_default(), claim = %claim.name_any(), error = %e, "provisioning a claim failed; retrying");
    Action::requeue(Duration::from_secs(3))
}

fn volume_error(pv: Arc<PersistentVolume>, e: &Error, _: Arc<Vols>) -> Action {
    tracing::warn!(volume = %pv.name_any(), error = %e, "reclaiming a volume failed; retrying");
    Action::requeue(Duration::from_secs(3))
}

async fn provision(claim: Arc<PersistentVolumeClaim>, vols: Arc<Vols>) -> Result<Action, Error> {
    let started = Instant::now();
    let result = provision_one(&claim, &vols).await;
    vols.octx.ctx.metrics.reconciled(
        "volume-provisioning",
        result.as_ref().err(),
        started.elapsed(),
    );
    result
}

/// Bounds a call to a provider, so that an unreachable one holds up nothing for long.
async fn bounded<T>(
    what: String,
    call: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, Error> {
    match tokio::time::timeout(CALL, call).await {
        Ok(r) => r.map_err(Error::kube(what)),
        Err(_) => Err(Error::Timeout(what)),
    }
}

async fn provision_one(claim: &PersistentVolumeClaim, vols: &Vols) -> Result<Action, Error> {
    let octx = &vols.octx;
    let client = &octx.ctx.client;
    // The cheap checks first: most claims in a cluster are not this class's.
    let bound = claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.as_deref())
        .is_some_and(|v| !v.is_empty());
    if bound || claim.metadata.deletion_timestamp.is_some() {
        vols.forget(claim.metadata.uid.as_deref());
        return Ok(Action::await_change());
    }
    let Some(class_name) = claim
        .spec
        .as_ref()
        .and_then(|s| s.storage_class_name.clone())
        .filter(|c| !c.is_empty())
    else {
        return Ok(Action::await_change());
    };
    let class = Api::<StorageClass>::all(client.clone())
        .get_opt(&class_name)
        .await
        .map_err(Error::kube(format!("reading StorageClass {class_name}")))?;
    let Some(class) = class.filter(is_ours_class) else {
        return Ok(Action::await_change());
    };
    let node = match claim.annotations().get(SELECTED_NODE) {
        Some(n) => Api::<Node>::all(client.clone())
            .get_opt(n)
            .await
            .map_err(Error::kube(format!("reading Node {n}")))?,
        None => None,
    };
    let (node, provider) = match decide(claim, Some(&class), node.as_ref()) {
        Decision::Skip => return Ok(Action::await_change()),
        Decision::Refuse(why) => {
            vols.tell(claim, EventType::Warning, "ProvisioningFailed", why)
                .await;
            return Ok(Action::await_change());
        }
        Decision::Provision { node, provider } => (node, provider),
    };
    let ns = claim.namespace().unwrap_or_default();
    let name = claim.name_any();
    let waiting = |why: String| async move {
        vols.tell(claim, EventType::Warning, "ProvisioningWaiting", why)
            .await;
        Ok::<Action, Error>(Action::requeue(WAITING))
    };
    let Some(access) = octx.providers.access(client, &provider).await? else {
        return waiting(format!(
            "no identity issued by {provider}, the provider of virtual node {node} (not peered?)"
        ))
        .await;
    };
    let twin = match super::pods::twin_of(client, &ns, &provider).await? {
        Ok(t) => t,
        Err(why) => return waiting(why).await,
    };
    let wanted_pv = match local_volume(claim, &class, &node, &provider, &twin) {
        Ok(pv) => pv,
        Err(why) => {
            vols.tell(claim, EventType::Warning, "ProvisioningFailed", why)
                .await;
            return Ok(Action::await_change());
        }
    };
    let metrics = &octx.ctx.metrics;
    let consumer = octx.ctx.cluster_id();
    let remote: Api<PersistentVolumeClaim> = Api::namespaced(access.client.clone(), &twin);
    let at = format!("claim {twin}/{name} at {provider}");
    let existing = match bounded(format!("reading {at}"), remote.get_opt(&name)).await {
        Ok(e) => e,
        Err(e) => {
            return waiting(format!(
                "provider {provider} is unreachable or refused ({e}); the claim is provisioned once it answers"
            ))
            .await;
        }
    };
    match existing {
        Some(r) if !is_ours(&r.metadata, consumer.as_str()) => {
            metrics.reflected("PersistentVolumeClaim", "conflict");
            return waiting(format!(
                "a claim named {name} that this cluster did not make exists in {twin} at {provider}; remove it there or rename this claim"
            ))
            .await;
        }
        Some(r)
            if r.metadata.deletion_timestamp.is_some()
                || r.annotations().get(ORIGIN_UID) != claim.metadata.uid.as_ref() =>
        {
            // The twin of an earlier claim of this name, not yet reclaimed.
            return waiting(format!(
                "the twin claim {twin}/{name} at {provider} still belongs to an earlier claim of this name and goes once that one's volume is reclaimed"
            ))
            .await;
        }
        Some(_) => {}
        None => {
            let wanted = remote_claim(claim, &class, consumer);
            let written = bounded(
                format!("writing {at}"),
                remote.patch(
                    &name,
                    &PatchParams::apply(MANAGER).force(),
                    &Patch::Apply(&wanted),
                ),
            )
            .await;
            if let Err(e) = written {
                metrics.reflected("PersistentVolumeClaim", "error");
                return waiting(format!(
                    "writing the twin claim at {provider} failed ({e}); retrying"
                ))
                .await;
            }
            metrics.reflected("PersistentVolumeClaim", "applied");
            tracing::info!(namespace = %ns, claim = %name, %provider, twin = %twin, "twin claim written");
        }
    }
    // The volume now, not once the twin is bound: the provider binds the twin only once the
    // offloaded pod runs there, and that pod waits for this binding.
    let pv_name = volume_name(claim);
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    match pvs.create(&PostParams::default(), &wanted_pv).await {
        Ok(_) => {
            metrics.reflected("PersistentVolume", "applied");
            tracing::info!(namespace = %ns, claim = %name, volume = %pv_name, node = %node, "volume provisioned");
            vols.tell(
                claim,
                EventType::Normal,
                "ProvisioningSucceeded",
                format!(
                    "provisioned volume {pv_name} at {provider} (claim {twin}/{name}), for pods on virtual node {node}"
                ),
            )
            .await;
        }
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => {
            metrics.reflected("PersistentVolume", "error");
            return Err(Error::kube(format!("creating PersistentVolume {pv_name}"))(
                e,
            ));
        }
    }
    Ok(Action::await_change())
}

async fn reclaim(pv: Arc<PersistentVolume>, vols: Arc<Vols>) -> Result<Action, Error> {
    if !provisioned_here(&pv) {
        return Ok(Action::await_change());
    }
    let started = Instant::now();
    let result = reclaim_one(&pv, &vols).await;
    vols.octx
        .ctx
        .metrics
        .reconciled("volume-reclaim", result.as_ref().err(), started.elapsed());
    result
}

async fn reclaim_one(pv: &PersistentVolume, vols: &Vols) -> Result<Action, Error> {
    if !to_reclaim(pv) {
        return Ok(Action::await_change());
    }
    let octx = &vols.octx;
    let client = &octx.ctx.client;
    let name = pv.name_any();
    let handle = pv
        .spec
        .as_ref()
        .and_then(|s| s.csi.as_ref())
        .map(|c| c.volume_handle.clone())
        .unwrap_or_default();
    let metrics = &octx.ctx.metrics;
    if let Some((provider, twin, claim)) = parse_handle(&handle) {
        match octx.providers.access(client, &provider).await? {
            Some(access) => {
                let remote: Api<PersistentVolumeClaim> =
                    Api::namespaced(access.client.clone(), &twin);
                let at = format!("claim {twin}/{claim} at {provider}");
                let gone = match bounded(format!("reading {at}"), remote.get_opt(&claim)).await {
                    Ok(Some(r)) if is_ours(&r.metadata, octx.ctx.cluster_id().as_str()) => bounded(
                        format!("deleting {at}"),
                        remote.delete(&claim, &DeleteParams::background()),
                    )
                    .await
                    .map(|_| ())
                    .or_else(|e| match e.api_status() {
                        Some(404) => Ok(()),
                        _ => Err(e),
                    }),
                    // Nothing of ours there (gone, or another's: not ours to delete).
                    Ok(_) => Ok(()),
                    Err(e) => Err(e),
                };
                if let Err(e) = gone {
                    metrics.reflected("PersistentVolumeClaim", "error");
                    vols.tell(
                        pv,
                        EventType::Warning,
                        "VolumeFailedDelete",
                        format!(
                            "the twin claim {twin}/{claim} at {provider} could not be deleted ({e}); the volume goes once it is"
                        ),
                    )
                    .await;
                    return Ok(Action::requeue(WAITING));
                }
                metrics.reflected("PersistentVolumeClaim", "deleted");
                tracing::info!(volume = %name, %provider, twin = %twin, claim = %claim, "twin claim deleted");
            }
            // Unpeered: the twin namespaces went with the peering, their claims with them.
            None => {
                tracing::info!(volume = %name, %provider, "no identity for the provider any more; deleting the volume only");
            }
        }
    } else {
        tracing::warn!(volume = %name, handle = %handle, "a volume of this provisioner without a readable handle; deleting it only here");
    }
    match Api::<PersistentVolume>::all(client.clone())
        .delete(&name, &DeleteParams::background())
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(e) => return Err(Error::kube(format!("deleting PersistentVolume {name}"))(e)),
    }
    metrics.reflected("PersistentVolume", "deleted");
    vols.forget(pv.metadata.uid.as_deref());
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{PodSpec, Volume};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;

    fn id(s: &str) -> ClusterId {
        ClusterId::new(s).expect("valid cluster ID")
    }

    fn claim() -> PersistentVolumeClaim {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {
                "name": "data",
                "namespace": "shop",
                "uid": "u-1",
                "labels": {"app": "db"},
                "annotations": {
                    "team": "storage",
                    "volume.kubernetes.io/selected-node": "beta",
                    "volume.kubernetes.io/storage-provisioner": "tether.dev/remote",
                    "volume.beta.kubernetes.io/storage-provisioner": "tether.dev/remote",
                    "kubectl.kubernetes.io/last-applied-configuration": "{}"
                }
            },
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "volumeMode": "Filesystem",
                "storageClassName": "tether",
                "resources": {"requests": {"storage": "1Gi"}}
            }
        }))
        .expect("a claim")
    }

    fn class(parameters: Option<&str>, reclaim: Option<&str>) -> StorageClass {
        StorageClass {
            metadata: ObjectMeta {
                name: Some("tether".to_owned()),
                ..ObjectMeta::default()
            },
            provisioner: storage::PROVISIONER.to_owned(),
            parameters: parameters.map(|p| {
                BTreeMap::from([(storage::PROVIDER_STORAGE_CLASS.to_owned(), p.to_owned())])
            }),
            reclaim_policy: reclaim.map(str::to_owned),
            volume_binding_mode: Some("WaitForFirstConsumer".to_owned()),
            ..StorageClass::default()
        }
    }

    fn node(name: &str, virtual_of: Option<&str>) -> Node {
        let mut l = BTreeMap::new();
        if let Some(p) = virtual_of {
            l.insert(
                labels::TYPE.to_owned(),
                labels::TYPE_VIRTUAL_NODE.to_owned(),
            );
            l.insert(labels::REMOTE_CLUSTER_ID.to_owned(), p.to_owned());
        }
        Node {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                labels: Some(l),
                ..ObjectMeta::default()
            },
            ..Node::default()
        }
    }

    #[test]
    fn a_claim_of_the_class_on_a_virtual_node_is_provisioned_at_its_provider() {
        let c = claim();
        assert_eq!(
            decide(
                &c,
                Some(&class(None, None)),
                Some(&node("beta", Some("beta-id")))
            ),
            Decision::Provision {
                node: "beta".to_owned(),
                provider: id("beta-id"),
            }
        );
    }

    #[test]
    fn claims_that_are_not_this_provisioners_are_left_alone() {
        let virtual_node = node("beta", Some("beta"));
        let ours = class(None, None);
        let mut other = ours.clone();
        other.provisioner = "simkube.dev/host-path".to_owned();
        assert_eq!(
            decide(&claim(), Some(&other), Some(&virtual_node)),
            Decision::Skip
        );
        assert_eq!(decide(&claim(), None, Some(&virtual_node)), Decision::Skip);
        let mut bound = claim();
        bound.spec.as_mut().expect("spec").volume_name = Some("pv-1".to_owned());
        assert_eq!(
            decide(&bound, Some(&ours), Some(&virtual_node)),
            Decision::Skip
        );
        let mut unscheduled = claim();
        unscheduled
            .metadata
            .annotations
            .as_mut()
            .expect("annotations")
            .remove(SELECTED_NODE);
        assert_eq!(
            decide(&unscheduled, Some(&ours), Some(&virtual_node)),
            Decision::Skip
        );
        let mut going = claim();
        going.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        assert_eq!(
            decide(&going, Some(&ours), Some(&virtual_node)),
            Decision::Skip
        );
    }

    #[test]
    fn a_claim_on_a_real_node_is_refused_with_what_to_do() {
        let ours = class(None, None);
        let Decision::Refuse(why) = decide(&claim(), Some(&ours), Some(&node("beta", None))) else {
            panic!("a real node is refused");
        };
        assert!(
            why.contains("not one") && why.contains("another class"),
            "{why}"
        );
        let Decision::Refuse(why) = decide(&claim(), Some(&ours), None) else {
            panic!("a missing node is refused");
        };
        assert!(why.contains("does not exist"), "{why}");
        let mut nameless = node("beta", Some("beta"));
        nameless
            .metadata
            .labels
            .as_mut()
            .expect("labels")
            .remove(labels::REMOTE_CLUSTER_ID);
        assert!(matches!(
            decide(&claim(), Some(&ours), Some(&nameless)),
            Decision::Refuse(_)
        ));
    }

    #[test]
    fn the_twin_claim_asks_the_same_of_the_providers_class_without_the_binding_marks() {
        let twin = remote_claim(&claim(), &class(None, None), &id("alpha"));
        let json = serde_json::to_value(&twin).expect("json");
        assert_eq!(
            json,
            serde_json::json!({
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {
                    "name": "data",
                    "labels": {
                        "app": "db",
                        "tether.dev/reflected": "true",
                        "tether.dev/remote-cluster-id": "alpha"
                    },
                    "annotations": {
                        "team": "storage",
                        "tether.dev/origin-uid": "u-1"
                    }
                },
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "volumeMode": "Filesystem",
                    "resources": {"requests": {"storage": "1Gi"}}
                }
            })
        );
        assert!(is_ours(&twin.metadata, "alpha"));
        assert!(!is_ours(&twin.metadata, "gamma"));
    }

    #[test]
    fn the_class_parameter_names_the_providers_class() {
        let twin = remote_claim(&claim(), &class(Some("fast"), None), &id("alpha"));
        assert_eq!(
            twin.spec.and_then(|s| s.storage_class_name).as_deref(),
            Some("fast")
        );
        let twin = remote_claim(&claim(), &class(Some(""), None), &id("alpha"));
        assert_eq!(twin.spec.and_then(|s| s.storage_class_name), None);
    }

    #[test]
    fn the_local_volume_is_pre_bound_and_pinned_to_the_virtual_node() {
        let pv = local_volume(
            &claim(),
            &class(None, Some("Retain")),
            "beta",
            &id("beta-id"),
            "shop-alpha",
        )
        .expect("a volume");
        let json = serde_json::to_value(&pv).expect("json");
        assert_eq!(
            json,
            serde_json::json!({
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {
                    "name": "pvc-u-1",
                    "labels": {
                        "tether.dev/remote-cluster-id": "beta-id",
                        "tether.dev/virtual-node": "beta"
                    },
                    "annotations": {"pv.kubernetes.io/provisioned-by": "tether.dev/remote"}
                },
                "spec": {
                    "capacity": {"storage": "1Gi"},
                    "accessModes": ["ReadWriteOnce"],
                    "volumeMode": "Filesystem",
                    "storageClassName": "tether",
                    "persistentVolumeReclaimPolicy": "Retain",
                    "claimRef": {
                        "apiVersion": "v1",
                        "kind": "PersistentVolumeClaim",
                        "namespace": "shop",
                        "name": "data",
                        "uid": "u-1"
                    },
                    "nodeAffinity": {"required": {"nodeSelectorTerms": [{
                        "matchExpressions": [
                            {"key": "kubernetes.io/hostname", "operator": "In", "values": ["beta"]}
                        ]
                    }]}},
                    "csi": {"driver": "tether.dev/remote", "volumeHandle": "beta-id/shop-alpha/data"}
                }
            })
        );
        assert!(provisioned_here(&pv));
        // Without a policy in the class, Kubernetes' default.
        let pv =
            local_volume(&claim(), &class(None, None), "beta", &id("b"), "t").expect("a volume");
        assert_eq!(
            pv.spec
                .and_then(|s| s.persistent_volume_reclaim_policy)
                .as_deref(),
            Some("Delete")
        );
    }

    #[test]
    fn a_claim_without_a_size_or_access_mode_gets_no_volume_and_is_told_why() {
        let mut c = claim();
        c.spec.as_mut().expect("spec").resources = None;
        let why = local_volume(&c, &class(None, None), "n", &id("p"), "t").expect_err("no size");
        assert!(why.contains("requests.storage"), "{why}");
        let mut c = claim();
        c.spec.as_mut().expect("spec").access_modes = Some(vec![]);
        let why = local_volume(&c, &class(None, None), "n", &id("p"), "t").expect_err("no mode");
        assert!(why.contains("accessModes"), "{why}");
    }

    #[test]
    fn handles_round_trip_and_bad_ones_are_refused() {
        let h = volume_handle(&id("beta"), "shop-alpha", "data");
        assert_eq!(
            parse_handle(&h),
            Some((id("beta"), "shop-alpha".to_owned(), "data".to_owned()))
        );
        for bad in [
            "",
            "beta",
            "beta/shop",
            "beta//data",
            "beta/shop/",
            "beta/a/b/c",
        ] {
            assert_eq!(parse_handle(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn only_released_volumes_of_this_provisioner_with_reclaim_delete_are_reclaimed() {
        let mut pv =
            local_volume(&claim(), &class(None, None), "beta", &id("b"), "t").expect("a volume");
        assert!(!to_reclaim(&pv), "no status yet");
        pv.status = Some(k8s_openapi::api::core::v1::PersistentVolumeStatus {
            phase: Some("Bound".to_owned()),
            ..Default::default()
        });
        assert!(!to_reclaim(&pv), "still bound");
        pv.status.as_mut().expect("status").phase = Some("Released".to_owned());
        assert!(to_reclaim(&pv));
        let mut retained = pv.clone();
        retained
            .spec
            .as_mut()
            .expect("spec")
            .persistent_volume_reclaim_policy = Some("Retain".to_owned());
        assert!(!to_reclaim(&retained));
        let mut anothers = pv.clone();
        anothers.metadata.annotations = Some(BTreeMap::from([(
            PROVISIONED_BY.to_owned(),
            "simkube.dev/host-path".to_owned(),
        )]));
        assert!(!to_reclaim(&anothers));
    }

    #[test]
    fn offloaded_pods_keep_their_claims_and_the_provider_admits_them() {
        let spec: PodSpec = serde_json::from_value(serde_json::json!({
            "containers": [{
                "name": "app",
                "image": "simkube.dev/echo",
                "volumeMounts": [{"name": "data", "mountPath": "/data"}]
            }],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]
        }))
        .expect("a pod spec");
        let shadow = super::super::translate::shadow_spec(&spec, None);
        let volumes: Vec<Volume> = shadow.volumes.clone().unwrap_or_default();
        assert_eq!(
            volumes
                .iter()
                .filter_map(|v| v.persistent_volume_claim.as_ref())
                .map(|c| c.claim_name.as_str())
                .collect::<Vec<_>>(),
            vec!["data"]
        );
        assert_eq!(
            shadow.containers[0]
                .volume_mounts
                .as_ref()
                .map(|m| m[0].mount_path.as_str()),
            Some("/data")
        );
        assert_eq!(
            super::super::shadow_pods::forbidden(&shadow),
            Vec::<String>::new()
        );
    }

    #[test]
    fn machinery_annotations_are_recognised_by_their_domain() {
        for k in [
            "volume.kubernetes.io/selected-node",
            "pv.kubernetes.io/bind-completed",
            "kubectl.kubernetes.io/last-applied-configuration",
            "kubernetes.io/description",
        ] {
            assert!(machinery(k), "{k}");
        }
        for k in ["team", "example.com/owner", "notkubernetes.io/x"] {
            assert!(!machinery(k), "{k}");
        }
    }
}
