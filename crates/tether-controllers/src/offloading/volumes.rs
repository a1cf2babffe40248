//! The provisioner of the `tether` StorageClass (`tether.dev/remote`): a claim of that class
//! whose pod the scheduler put on one of this cluster's virtual nodes is served by the
//! provider behind that node. The claim gets a twin of the same name in the provider's twin
//! namespace (the provider's own class provisions it once the offloaded pod is scheduled
//! there) and, at once, a local volume pre-bound to it whose node affinity keeps every later
//! pod of the claim on that virtual node, where the data is. A released volume with reclaim
//! `Delete` takes the twin claim with it. It is also the class's resizer: a bound claim that
//! asks for more than it has gets its twin claim's request raised at the provider, and once
//! the provider reports the twin's new capacity the local volume and the claim follow. The
//! plans are pure functions; `run` applies them.

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
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use tether_api::ClusterId;
use tether_api::names::{labels, storage};
use tether_resources::Amount;
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
/// How soon a claim whose twin the provider is growing is looked at again: the provider's
/// watch is not this cluster's, so nothing wakes the claim when the twin has grown.
const GROWING: Duration = Duration::from_secs(2);
/// The claim condition while its volume is being expanded, as Kubernetes names it.
pub const RESIZING: &str = "Resizing";
/// The first retry of a refused resize, doubled at each refusal up to [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_secs(5);
/// The longest wait between retries of a refused resize.
const RETRY_MAX: Duration = Duration::from_secs(300);

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

/// The CSI volume handle of `pv` (empty: none), which names its twin claim.
fn handle_of(pv: &PersistentVolume) -> String {
    pv.spec
        .as_ref()
        .and_then(|s| s.csi.as_ref())
        .map(|c| c.volume_handle.clone())
        .unwrap_or_default()
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

/// The storage a claim's spec asks for (`None`: none, or unreadable).
fn requested(claim: &PersistentVolumeClaim) -> Option<&Quantity> {
    claim
        .spec
        .as_ref()?
        .resources
        .as_ref()?
        .requests
        .as_ref()?
        .get("storage")
}

/// The storage a claim's status says it has.
fn held(claim: &PersistentVolumeClaim) -> Option<&Quantity> {
    claim.status.as_ref()?.capacity.as_ref()?.get("storage")
}

fn amount(q: Option<&Quantity>) -> Amount {
    q.and_then(|q| Amount::parse(&q.0).ok())
        .unwrap_or(Amount::ZERO)
}

fn phase(claim: &PersistentVolumeClaim) -> Option<&str> {
    claim.status.as_ref()?.phase.as_deref()
}

/// Whether `claim` is bound and asks for more storage than it has: a resize to carry out.
pub fn wants_resize(claim: &PersistentVolumeClaim) -> bool {
    claim.metadata.deletion_timestamp.is_none()
        && phase(claim) == Some("Bound")
        && amount(requested(claim)) > amount(held(claim))
}

/// The next step of a claim's resize.
#[derive(Debug, Clone, PartialEq)]
pub enum Resize {
    /// Nothing to do: the claim has what it asks for.
    Settled,
    /// Raise the twin claim's request to `size`.
    Ask {
        /// The claim's request.
        size: Quantity,
    },
    /// The provider has been asked for `size` and is growing the twin claim.
    Growing {
        /// The claim's request.
        size: Quantity,
    },
    /// The twin claim has grown to `capacity`: the local volume (unless it already shows as
    /// much) and then the claim's status follow.
    Follow {
        /// What the twin claim has now, at least the request.
        capacity: Quantity,
        /// Whether the local volume's capacity is below it.
        grow_volume: bool,
    },
    /// The resize cannot go on now; what is wrong and what to do.
    Refuse(String),
}

/// The next step of resizing `claim`, bound to `pv`, whose twin claim `at` (described for
/// messages) is `twin` (`None`: there is none of this claim's).
pub fn resize(
    claim: &PersistentVolumeClaim,
    pv: &PersistentVolume,
    twin: Option<&PersistentVolumeClaim>,
    at: &str,
) -> Resize {
    let Some(size) = requested(claim).filter(|_| wants_resize(claim)).cloned() else {
        return Resize::Settled;
    };
    let Some(twin) = twin else {
        return Resize::Refuse(format!(
            "the twin claim {at} is gone, so the provider holds no data of this claim to grow; \
             delete the claim and its pods and create them again"
        ));
    };
    if phase(twin) != Some("Bound") {
        return Resize::Refuse(format!(
            "the twin claim {at} is not bound yet (the provider binds it once a pod of the claim \
             runs there), and only a bound claim can grow; run a pod of the claim and the resize \
             follows"
        ));
    }
    let wanted = amount(Some(&size));
    if amount(requested(twin)) < wanted {
        return Resize::Ask { size };
    }
    match held(twin) {
        Some(capacity) if amount(Some(capacity)) >= wanted => {
            let volume = pv
                .spec
                .as_ref()
                .and_then(|s| s.capacity.as_ref())
                .and_then(|c| c.get("storage"));
            Resize::Follow {
                capacity: capacity.clone(),
                grow_volume: amount(volume) < amount(Some(capacity)),
            }
        }
        _ => Resize::Growing { size },
    }
}

/// Whether the claim's status already says it is being resized to `size`.
pub fn marked_resizing(claim: &PersistentVolumeClaim, size: &Quantity) -> bool {
    let Some(status) = claim.status.as_ref() else {
        return false;
    };
    let allocated = status
        .allocated_resources
        .as_ref()
        .and_then(|r| r.get("storage"));
    amount(allocated) == amount(Some(size))
        && status
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == RESIZING && c.status == "True")
}

/// The claim's conditions once a resize is over: those of the resize go, any other stays
/// (`None`: none is left, and the list goes).
pub fn settled_conditions(
    claim: &PersistentVolumeClaim,
) -> Option<Vec<k8s_openapi::api::core::v1::PersistentVolumeClaimCondition>> {
    let kept: Vec<_> = claim
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|c| c.type_ != RESIZING && c.type_ != "FileSystemResizePending")
        .collect();
    (!kept.is_empty()).then_some(kept)
}

/// What a refused or failed request to grow the twin claim `at` to `size` tells the claim's
/// user: the provider's answer (`code`, `message`), and what to do about it. `class` is the
/// local claim's class, whose `providerStorageClass` parameter picks the provider's class.
pub fn resize_failure(
    provider: &ClusterId,
    at: &str,
    size: &str,
    code: Option<u16>,
    message: &str,
    class: &str,
) -> String {
    match code {
        Some(403) if message.contains("must support resize") => format!(
            "provider {provider} refused to grow {at} to {size}: {message}; ask {provider}'s \
             administrator to set allowVolumeExpansion: true on the twin claim's StorageClass \
             there, or set parameter {} of class {class} to a class of {provider} that allows \
             it (for new claims); retrying with backoff",
            storage::PROVIDER_STORAGE_CLASS
        ),
        Some(403) => format!(
            "provider {provider} refused to grow {at} to {size}: {message}; this cluster's \
             identity there needs patch on persistentvolumeclaims in the twin namespace; \
             retrying with backoff"
        ),
        Some(422) => format!(
            "provider {provider} found the request to grow {at} to {size} invalid: {message}; \
             retrying with backoff"
        ),
        _ => format!(
            "growing {at} to {size} failed: {message}; retrying with backoff until provider \
             {provider} answers"
        ),
    }
}

/// How long to wait before the next attempt after `failures` refusals in a row.
pub fn retry_after(failures: u32) -> Duration {
    let doubled = RETRY_FIRST.saturating_mul(1 << failures.saturating_sub(1).min(10));
    doubled.min(RETRY_MAX)
}

/// What a provider's error says, without the client's wrapping.
fn server_says(e: &Error) -> String {
    match e {
        Error::Kube {
            source: kube::Error::Api(s),
            ..
        } => s.message.clone(),
        other => other.to_string(),
    }
}

/// What the provisioner works with.
struct Vols {
    octx: Arc<OffCtx>,
    recorder: Recorder,
    /// The last Event published per object UID, so a claim that keeps waiting for the same
    /// reason is not told again at every look.
    told: Mutex<HashMap<String, String>>,
    /// Refused resizes in a row per claim UID, for the backoff.
    refusals: Mutex<HashMap<String, u32>>,
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
        self.tell_as(obj, type_, reason, "Provisioning", note).await;
    }

    /// [`Vols::tell`] about `action` (`Provisioning`, `Resizing`).
    async fn tell_as<K: Resource<DynamicType = ()>>(
        &self,
        obj: &K,
        type_: EventType,
        reason: &str,
        action: &str,
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
            action: action.to_owned(),
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
            self.refusals
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(uid);
        }
    }

    /// Counts one more refusal of `claim`'s resize; returns when to try again.
    fn refused(&self, claim: &PersistentVolumeClaim) -> Duration {
        let uid = claim.metadata.uid.clone().unwrap_or_default();
        let mut refusals = self.refusals.lock().unwrap_or_else(PoisonError::into_inner);
        let n = refusals.entry(uid).or_default();
        *n = n.saturating_add(1);
        retry_after(*n)
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
        refusals: Mutex::default(),
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

/// Applies `wanted` as the twin claim at the provider (`remote`), with this provisioner's
/// field manager, forced: the twin is this provisioner's alone.
async fn apply_twin(
    remote: &Api<PersistentVolumeClaim>,
    wanted: &PersistentVolumeClaim,
    what: String,
) -> Result<PersistentVolumeClaim, Error> {
    let name = wanted.name_any();
    bounded(
        what,
        remote.patch(
            &name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(wanted),
        ),
    )
    .await
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
    if claim.metadata.deletion_timestamp.is_some() {
        vols.forget(claim.metadata.uid.as_deref());
        return Ok(Action::await_change());
    }
    if bound {
        if !wants_resize(claim) {
            vols.forget(claim.metadata.uid.as_deref());
            return Ok(Action::await_change());
        }
        return resize_one(claim, vols).await;
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
            let written = apply_twin(&remote, &wanted, format!("writing {at}")).await;
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

/// Carries a bound claim's resize one step on. The twin claim at the provider is asked first;
/// nothing here changes until the provider has accepted, and the local volume and claim show
/// the new size only once the twin claim has it.
async fn resize_one(claim: &PersistentVolumeClaim, vols: &Vols) -> Result<Action, Error> {
    let octx = &vols.octx;
    let client = &octx.ctx.client;
    let Some(pv_name) = claim.spec.as_ref().and_then(|s| s.volume_name.clone()) else {
        return Ok(Action::await_change());
    };
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let pv = pvs
        .get_opt(&pv_name)
        .await
        .map_err(Error::kube(format!("reading PersistentVolume {pv_name}")))?;
    let Some(pv) = pv.filter(provisioned_here) else {
        // Another provisioner's volume: its resizer's to grow.
        return Ok(Action::await_change());
    };
    let failed = |why: String| async move {
        vols.tell_as(
            claim,
            EventType::Warning,
            "VolumeResizeFailed",
            "Resizing",
            why,
        )
        .await;
        Ok::<Action, Error>(Action::requeue(vols.refused(claim)))
    };
    let handle = handle_of(&pv);
    let Some((provider, twin_ns, name)) = parse_handle(&handle) else {
        return failed(format!(
            "volume {pv_name} names no twin claim (handle {handle:?}), so there is nothing to grow; \
             recreate the claim to have it provisioned again"
        ))
        .await;
    };
    let at = format!("claim {twin_ns}/{name} at {provider}");
    let Some(access) = octx.providers.access(client, &provider).await? else {
        return failed(format!(
            "no identity issued by {provider}, which holds {at} (not peered any more?); peer again"
        ))
        .await;
    };
    let remote: Api<PersistentVolumeClaim> = Api::namespaced(access.client.clone(), &twin_ns);
    let twin = match bounded(format!("reading {at}"), remote.get_opt(&name)).await {
        Ok(t) => t.filter(|t| {
            is_ours(&t.metadata, octx.ctx.cluster_id().as_str())
                && t.annotations().get(ORIGIN_UID) == claim.metadata.uid.as_ref()
        }),
        Err(e) => {
            return failed(format!(
                "provider {provider} is unreachable or refused to show {at} ({}); retrying with backoff",
                server_says(&e)
            ))
            .await;
        }
    };
    let ns = claim.namespace().unwrap_or_default();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    let claim_name = claim.name_any();
    let mark = |size: Quantity| {
        let asked = Asked {
            provider: &provider,
            at: &at,
            volume: &pv_name,
        };
        mark_resizing(vols, &claims, claim, size, asked)
    };
    match resize(claim, &pv, twin.as_ref(), &at) {
        Resize::Settled => Ok(Action::await_change()),
        Resize::Refuse(why) => failed(why).await,
        Resize::Ask { size } => {
            let class_name = claim
                .spec
                .as_ref()
                .and_then(|s| s.storage_class_name.clone())
                .unwrap_or_default();
            let class = Api::<StorageClass>::all(client.clone())
                .get_opt(&class_name)
                .await
                .map_err(Error::kube(format!("reading StorageClass {class_name}")))?;
            let Some(class) = class else {
                return failed(format!(
                    "class {class_name} is gone, and the twin claim is written from it; create it again"
                ))
                .await;
            };
            // The whole twin again, with the field manager that wrote it: an apply that left
            // out fields it owns would remove them, and a bound claim's spec may not change.
            let wanted = remote_claim(claim, &class, octx.ctx.cluster_id());
            let written = apply_twin(&remote, &wanted, format!("growing {at}")).await;
            if let Err(e) = written {
                octx.ctx.metrics.reflected("PersistentVolumeClaim", "error");
                let why = resize_failure(
                    &provider,
                    &at,
                    &size.0,
                    e.api_status(),
                    &server_says(&e),
                    &class_name,
                );
                return failed(why).await;
            }
            octx.ctx
                .metrics
                .reflected("PersistentVolumeClaim", "applied");
            tracing::info!(namespace = %ns, claim = %claim_name, %provider, size = %size.0, "asked the provider to grow the twin claim");
            mark(size).await?;
            Ok(Action::requeue(GROWING))
        }
        Resize::Growing { size } => {
            mark(size).await?;
            Ok(Action::requeue(GROWING))
        }
        Resize::Follow {
            capacity,
            grow_volume,
        } => {
            if grow_volume {
                let grown = serde_json::json!({"spec": {"capacity": {"storage": capacity}}});
                pvs.patch(&pv_name, &PatchParams::default(), &Patch::Merge(&grown))
                    .await
                    .map_err(Error::kube(format!("growing PersistentVolume {pv_name}")))?;
            }
            let done = serde_json::json!({"status": {
                "capacity": {"storage": capacity},
                "allocatedResources": {"storage": capacity},
                "allocatedResourceStatuses": null,
                "conditions": settled_conditions(claim),
            }});
            claims
                .patch_status(&claim_name, &PatchParams::default(), &Patch::Merge(&done))
                .await
                .map_err(Error::kube(format!(
                    "recording the capacity of claim {ns}/{claim_name}"
                )))?;
            tracing::info!(namespace = %ns, claim = %claim_name, volume = %pv_name, capacity = %capacity.0, "claim resized");
            vols.tell_as(
                claim,
                EventType::Normal,
                "VolumeResizeSuccessful",
                "Resizing",
                format!(
                    "Resize volume succeeded: {at} and volume {pv_name} have {}",
                    capacity.0
                ),
            )
            .await;
            vols.refusals
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(claim.metadata.uid.as_deref().unwrap_or_default());
            Ok(Action::await_change())
        }
    }
}

/// Who was asked to grow what, for what a resizing claim says.
struct Asked<'a> {
    provider: &'a ClusterId,
    at: &'a str,
    volume: &'a str,
}

/// Marks `claim` as being resized to `size` (allocation, in-progress status, condition
/// `Resizing`) and says so in an Event, unless its status already does.
async fn mark_resizing(
    vols: &Vols,
    claims: &Api<PersistentVolumeClaim>,
    claim: &PersistentVolumeClaim,
    size: Quantity,
    asked: Asked<'_>,
) -> Result<(), Error> {
    if marked_resizing(claim, &size) {
        return Ok(());
    }
    let Asked {
        provider,
        at,
        volume,
    } = asked;
    let status = serde_json::json!({"status": {
        "allocatedResources": {"storage": size},
        "allocatedResourceStatuses": {"storage": "ControllerResizeInProgress"},
        "conditions": [{
            "type": RESIZING,
            "status": "True",
            "lastTransitionTime": Time(k8s_openapi::jiff::Timestamp::now()),
            "message": format!("waiting for provider {provider} to grow {at} to {}", size.0),
        }],
    }});
    let name = claim.name_any();
    claims
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .map_err(Error::kube(format!("marking claim {name} as resizing")))?;
    vols.tell_as(
        claim,
        EventType::Normal,
        "Resizing",
        "Resizing",
        format!(
            "External resizer is resizing volume {volume}: asked provider {provider} to grow {at} to {}",
            size.0
        ),
    )
    .await;
    Ok(())
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
    let handle = handle_of(pv);
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

    fn bound(request: &str, capacity: &str) -> PersistentVolumeClaim {
        let mut c = claim();
        let spec = c.spec.as_mut().expect("spec");
        spec.volume_name = Some("pvc-u-1".to_owned());
        spec.resources = Some(VolumeResourceRequirements {
            requests: Some(BTreeMap::from([(
                "storage".to_owned(),
                Quantity(request.to_owned()),
            )])),
            limits: None,
        });
        c.status = Some(k8s_openapi::api::core::v1::PersistentVolumeClaimStatus {
            phase: Some("Bound".to_owned()),
            capacity: Some(BTreeMap::from([(
                "storage".to_owned(),
                Quantity(capacity.to_owned()),
            )])),
            ..Default::default()
        });
        c
    }

    fn pv_of(capacity: &str) -> PersistentVolume {
        let mut pv = local_volume(
            &claim(),
            &class(None, None),
            "beta",
            &id("beta"),
            "shop-alpha",
        )
        .expect("a volume");
        pv.spec.as_mut().expect("spec").capacity = Some(BTreeMap::from([(
            "storage".to_owned(),
            Quantity(capacity.to_owned()),
        )]));
        pv
    }

    const AT: &str = "claim shop-alpha/data at beta";

    #[test]
    fn a_resize_asks_the_provider_first_and_follows_the_twin_once_it_has_grown() {
        let local = bound("2Gi", "1Gi");
        assert!(wants_resize(&local));
        let q = |s: &str| Quantity(s.to_owned());
        assert_eq!(
            resize(&local, &pv_of("1Gi"), Some(&bound("1Gi", "1Gi")), AT),
            Resize::Ask { size: q("2Gi") }
        );
        assert_eq!(
            resize(&local, &pv_of("1Gi"), Some(&bound("2Gi", "1Gi")), AT),
            Resize::Growing { size: q("2Gi") }
        );
        assert_eq!(
            resize(&local, &pv_of("1Gi"), Some(&bound("2Gi", "2Gi")), AT),
            Resize::Follow {
                capacity: q("2Gi"),
                grow_volume: true
            }
        );
        // A provider that rounds up gives more than asked, and that is what is recorded.
        assert_eq!(
            resize(&local, &pv_of("2Gi"), Some(&bound("2Gi", "3Gi")), AT),
            Resize::Follow {
                capacity: q("3Gi"),
                grow_volume: true
            }
        );
        // The volume already grew (the claim's status write failed last time): the claim only.
        assert_eq!(
            resize(&local, &pv_of("2Gi"), Some(&bound("2Gi", "2Gi")), AT),
            Resize::Follow {
                capacity: q("2Gi"),
                grow_volume: false
            }
        );
        // Settled, also when the same size is written another way.
        for settled in [bound("2Gi", "2Gi"), bound("2048Mi", "2Gi")] {
            assert!(!wants_resize(&settled));
            assert_eq!(
                resize(&settled, &pv_of("2Gi"), Some(&bound("2Gi", "2Gi")), AT),
                Resize::Settled
            );
        }
        let mut pending = bound("2Gi", "1Gi");
        pending.status.as_mut().expect("status").phase = Some("Pending".to_owned());
        assert!(!wants_resize(&pending), "only bound claims are resized");
    }

    #[test]
    fn a_resize_without_a_bound_twin_is_refused_with_what_to_do() {
        let local = bound("2Gi", "1Gi");
        let Resize::Refuse(why) = resize(&local, &pv_of("1Gi"), None, AT) else {
            panic!("no twin");
        };
        assert!(
            why.contains(AT) && why.contains("create them again"),
            "{why}"
        );
        let mut unbound = bound("1Gi", "1Gi");
        unbound.status = None;
        let Resize::Refuse(why) = resize(&local, &pv_of("1Gi"), Some(&unbound), AT) else {
            panic!("an unbound twin");
        };
        assert!(
            why.contains("not bound yet") && why.contains("run a pod"),
            "{why}"
        );
    }

    #[test]
    fn the_claim_is_marked_resizing_once_and_the_marks_go_when_it_is_done() {
        let size = Quantity("2Gi".to_owned());
        let mut c = bound("2Gi", "1Gi");
        assert!(!marked_resizing(&c, &size));
        let status = c.status.as_mut().expect("status");
        status.allocated_resources = Some(BTreeMap::from([(
            "storage".to_owned(),
            Quantity("2048Mi".to_owned()),
        )]));
        let condition = |type_: &str| k8s_openapi::api::core::v1::PersistentVolumeClaimCondition {
            type_: type_.to_owned(),
            status: "True".to_owned(),
            ..Default::default()
        };
        status.conditions = Some(vec![condition(RESIZING)]);
        assert!(marked_resizing(&c, &size));
        assert!(
            !marked_resizing(&c, &Quantity("3Gi".to_owned())),
            "a newer size"
        );
        assert_eq!(settled_conditions(&c), None);
        c.status.as_mut().expect("status").conditions =
            Some(vec![condition(RESIZING), condition("ModifyingVolume")]);
        assert_eq!(
            settled_conditions(&c),
            Some(vec![condition("ModifyingVolume")])
        );
    }

    #[test]
    fn refused_resizes_say_why_and_what_to_do_and_back_off() {
        let upstream = "persistentvolumeclaims \"data\" is forbidden: only dynamically provisioned pvc can be resized and the storageclass that provisions the pvc must support resize";
        let why = resize_failure(&id("beta"), AT, "2Gi", Some(403), upstream, "tether");
        assert!(
            why.contains(upstream)
                && why.contains("allowVolumeExpansion: true")
                && why.contains("providerStorageClass")
                && why.contains("retrying"),
            "{why}"
        );
        let why = resize_failure(&id("beta"), AT, "2Gi", Some(403), "denied", "tether");
        assert!(
            why.contains("needs patch on persistentvolumeclaims"),
            "{why}"
        );
        let why = resize_failure(&id("beta"), AT, "2Gi", None, "timed out", "tether");
        assert!(why.contains("until provider beta answers"), "{why}");
        assert_eq!(retry_after(1), Duration::from_secs(5));
        assert_eq!(retry_after(2), Duration::from_secs(10));
        assert_eq!(retry_after(4), Duration::from_secs(40));
        assert_eq!(retry_after(7), Duration::from_secs(300));
        assert_eq!(retry_after(u32::MAX), Duration::from_secs(300));
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
