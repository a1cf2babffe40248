//! The provider's ShadowPods: a consumer's pod held in its twin namespace here. Each is
//! admitted once within the consumer's grant (serialised, so two pods never share the last
//! of it), turned into a real Pod that this reconciler owns and recreates when anyone else
//! deletes it, and reported back with the Pod's status. Nothing here waits on the consumer,
//! so its pods keep running while it is unreachable.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Namespace, Pod, PodSpec, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::{self, ObjectRef, Store, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use tether_api::authentication::ResourceSlice;
use tether_api::conditions::{self, Status, Time, types};
use tether_api::names::{self, labels};
use tether_api::networking::Configuration;
use tether_api::offloading::{ShadowPod, ShadowPodStatus};
use tether_resources::{Admission, Enforcement, Resources};

use super::twins::{Refusal, tenant_refusal, twin_consumer};
use super::{OffCtx, translate};
use crate::Error;

/// `status.phase` of a ShadowPod the provider refused to run.
pub const PHASE_REJECTED: &str = "Rejected";
/// Annotation on a Pod: the digest of the ShadowPod spec it was made from, images left out
/// (images are the one thing an update of a Pod carries).
pub const SPEC_DIGEST: &str = "tether.dev/shadow-pod-spec";

/// Annotation on a Pod: the keys of the labels it carries from its ShadowPod, comma-separated.
/// A label the ShadowPod drops is taken off the Pod by it, and one someone added to the Pod
/// here (a mutating webhook, an admin) is not the ShadowPod's to remove.
pub const SHADOW_LABELS: &str = "tether.dev/shadow-pod-labels";

/// Annotation on a Pod: the keys of the annotations it carries from its ShadowPod,
/// comma-separated, as [`SHADOW_LABELS`] for labels. Absent when it carries none.
pub const SHADOW_ANNOTATIONS: &str = "tether.dev/shadow-pod-annotations";

/// Rejections that a later look may lift without the ShadowPod changing (the consumer peers
/// again, an admin makes the tenant active, the other Pod goes).
const TRANSIENT: [&str; 3] = ["UnknownConsumer", "TenantNotActive", "PodNameTaken"];

/// The provider's ShadowPods and the Pods made from them, as the reconciler's watches see
/// them, and what each consumer's admitted pods hold: admission counts from these, not from a
/// listing per pod.
pub struct Stores {
    /// Every ShadowPod of this cluster.
    pub shadow_pods: Store<ShadowPod>,
    /// Every Pod made from a ShadowPod.
    pub pods: Store<Pod>,
    writers: Mutex<Option<(Writer<ShadowPod>, Writer<Pod>)>>,
    /// Kept current by both watches (see [`Admissions`]); its lock serialises admissions, so
    /// two pods never share the last of a grant.
    admissions: Arc<Mutex<Admissions>>,
    /// ShadowPods this term has marked reported (UID → the versions that predate the mark): a
    /// second status write can come before the store shows the mark, and marking again would
    /// be one more write, sent whole to the consumer's watch. A later version without the
    /// mark (removed by hand) is marked again. Forgotten all at once when full (the price:
    /// one more mark each).
    marked: Mutex<HashMap<String, Vec<String>>>,
}

/// How many marked UIDs [`Stores`] remembers.
const MARKED_KEPT: usize = 16_384;

/// A watch feeding one of [`Stores`].
pub type Watch<K> = BoxStream<'static, Result<K, watcher::Error>>;

impl Default for Stores {
    fn default() -> Self {
        let (shadow_pods, sw) = reflector::store();
        let (pods, pw) = reflector::store();
        Self {
            shadow_pods,
            pods,
            writers: Mutex::new(Some((sw, pw))),
            admissions: Arc::default(),
            marked: Mutex::default(),
        }
    }
}

impl Stores {
    /// The watches that fill the stores, for the reconciler to run on (once per term: `None`
    /// the second time). Pods are those matching `selector`.
    pub fn streams(
        &self,
        client: &kube::Client,
        selector: &str,
    ) -> Option<(Watch<ShadowPod>, Watch<Pod>)> {
        let (sw, pw) = self
            .writers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()?;
        // Managed fields are the bulk of a stored object and nothing here reads them.
        let shadows = watcher(
            Api::<ShadowPod>::all(client.clone()),
            watcher::Config::default(),
        )
        .default_backoff()
        .modify(|o: &mut ShadowPod| o.metadata.managed_fields = None)
        .reflect(sw)
        .inspect_ok(self.observer())
        .touched_objects()
        .boxed();
        let pods = watcher(
            Api::<Pod>::all(client.clone()),
            watcher::Config::default().labels(selector),
        )
        .default_backoff()
        .modify(|o: &mut Pod| o.metadata.managed_fields = None)
        .reflect(pw)
        .inspect_ok(self.observer())
        .touched_objects()
        .boxed();
        Some((shadows, pods))
    }

    /// Brings [`Admissions`] up to date with each event of a watch, once its store shows it.
    fn observer<K: Resource>(&self) -> impl FnMut(&watcher::Event<K>) + Send + 'static {
        let admissions = self.admissions.clone();
        let (shadow_pods, pods) = (self.shadow_pods.clone(), self.pods.clone());
        move |event| {
            let mut a = admissions.lock().unwrap_or_else(PoisonError::into_inner);
            match event {
                watcher::Event::Apply(o) | watcher::Event::Delete(o) => {
                    a.observe(&Key::of(o), &shadow_pods, &pods);
                }
                // A new listing: what went meanwhile had no event of its own.
                watcher::Event::InitDone => a.recount(&shadow_pods, &pods),
                watcher::Event::Init | watcher::Event::InitApply(_) => {}
            }
        }
    }

    /// Decides on `sp` within `grant` (see [`Admissions::decide`]).
    fn decide(&self, sp: &ShadowPod, grant: &Resources, mode: Enforcement) -> Admission {
        self.admissions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .decide(sp, &self.shadow_pods, &self.pods, grant, mode)
    }

    /// Drops the admission of `sp` (its Pod could not be made).
    fn undo(&self, sp: &ShadowPod) {
        self.admissions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .undo(sp, &self.shadow_pods, &self.pods);
    }
}

/// Where a ShadowPod and the Pod made from it are: they share namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    namespace: String,
    name: String,
}

impl Key {
    fn of<K: Resource>(o: &K) -> Self {
        Self {
            namespace: o.meta().namespace.clone().unwrap_or_default(),
            name: o.meta().name.clone().unwrap_or_default(),
        }
    }

    fn shadow_pod(&self) -> ObjectRef<ShadowPod> {
        ObjectRef::new(&self.name).within(&self.namespace)
    }
}

/// One admission the ShadowPod watch has not shown yet: the ShadowPod's resource version
/// when it was admitted (a later one in the store carries the admission in its status).
struct Admitted {
    version: Option<String>,
}

/// What one stored ShadowPod holds of its consumer's grant.
struct Held {
    consumer: String,
    uid: String,
    /// The object its requests were read from: they are read again only from a new one.
    read: Arc<ShadowPod>,
    /// `None` when they do not parse.
    requests: Option<Resources>,
    /// Whether they count against the grant: the pod is admitted and in flight, or it
    /// [`holds`] its share.
    counts: bool,
}

impl Held {
    fn counted(&self) -> Option<&Resources> {
        self.counts.then_some(self.requests.as_ref()).flatten()
    }
}

/// What each consumer's pods hold here, kept as a running total per consumer that both
/// watches update, pod by pod, as their stores change. A decision reads the total: adding up
/// every pod of the consumer for each made a burst's admissions quadratic (a fifth of the
/// provider controller's CPU in a thousand-pod burst, growing a hundredfold for ten times
/// the pods).
#[derive(Default)]
pub struct Admissions {
    /// The admissions in flight, by ShadowPod UID. An admitted pod is in flight until the
    /// store shows its next version.
    in_flight: HashMap<String, Admitted>,
    /// Every stored ShadowPod.
    held: HashMap<Key, Held>,
    /// Per consumer, the requests of its ShadowPods that count.
    totals: HashMap<String, Resources>,
}

impl Admissions {
    /// Whether `sp` (as stored) was admitted and the store does not show it yet.
    fn in_flight(&self, sp: &ShadowPod) -> bool {
        sp.metadata
            .uid
            .as_ref()
            .and_then(|uid| self.in_flight.get(uid))
            .is_some_and(|a| a.version == sp.metadata.resource_version)
    }

    /// Takes what the ShadowPod at `key` holds from the stores again; called after every
    /// change either watch shows for `key`. Forgets its admission once the store has caught
    /// up with it or the ShadowPod is gone.
    fn observe(&mut self, key: &Key, shadow_pods: &Store<ShadowPod>, pods: &Store<Pod>) {
        let old = self.held.remove(key);
        if let Some(old) = &old
            && let Some(r) = old.counted()
            && let Some(total) = self.totals.get_mut(&old.consumer)
        {
            total.subtract(r);
        }
        let sp = shadow_pods.get(&key.shadow_pod());
        let uid = sp.as_ref().and_then(|sp| sp.metadata.uid.clone());
        if let Some(old) = &old
            && Some(&old.uid) != uid.as_ref()
        {
            self.in_flight.remove(&old.uid);
        }
        let (Some(sp), Some(uid)) = (sp, uid) else {
            return;
        };
        let in_flight = self.in_flight(&sp);
        if !in_flight {
            self.in_flight.remove(&uid);
        }
        let (read, requests) = match old {
            Some(old) if Arc::ptr_eq(&old.read, &sp) => (old.read, old.requests),
            _ => {
                let requests = tether_resources::pod_requests(&sp.spec.pod).ok();
                (sp, requests)
            }
        };
        let held = Held {
            consumer: read.spec.consumer_cluster_id.clone(),
            counts: in_flight || holds(&read, pods),
            uid,
            read,
            requests,
        };
        if let Some(r) = held.counted() {
            self.totals.entry(held.consumer.clone()).or_default().add(r);
        }
        self.held.insert(key.clone(), held);
    }

    /// Counts every stored ShadowPod again: after a watch listed anew, objects may have gone
    /// without an event.
    fn recount(&mut self, shadow_pods: &Store<ShadowPod>, pods: &Store<Pod>) {
        self.totals.clear();
        let mut old = std::mem::take(&mut self.held);
        let stored = shadow_pods.state();
        let live: HashSet<&str> = stored
            .iter()
            .filter_map(|s| s.metadata.uid.as_deref())
            .collect();
        self.in_flight.retain(|uid, _| live.contains(uid.as_str()));
        for sp in &stored {
            let key = Key::of(sp.as_ref());
            // Requests already read stay read.
            if let Some(mut h) = old.remove(&key) {
                h.counts = false;
                self.held.insert(key.clone(), h);
            }
            self.observe(&key, shadow_pods, pods);
        }
    }

    /// Decides on `sp` with what `consumer`'s other pods hold: the stored ShadowPods that were
    /// admitted (their Pod, or else their status, says so) and the admissions in flight.
    fn decide(
        &mut self,
        sp: &ShadowPod,
        shadow_pods: &Store<ShadowPod>,
        pods: &Store<Pod>,
        grant: &Resources,
        mode: Enforcement,
    ) -> Admission {
        let consumer = sp.spec.consumer_cluster_id.as_str();
        let key = Key::of(sp);
        let mut in_use = self.totals.get(consumer).cloned().unwrap_or_default();
        // A pod never counts against itself.
        if let Some(own) = self.held.get(&key)
            && own.consumer == consumer
            && sp.metadata.uid.as_ref() == Some(&own.uid)
            && let Some(r) = own.counted()
        {
            in_use.subtract(r);
        }
        let decision = tether_resources::admit(&sp.spec.pod, &in_use, grant, mode);
        if decision == Admission::Allow
            && let Some(uid) = sp.metadata.uid.clone()
        {
            let version = sp.metadata.resource_version.clone();
            self.in_flight.insert(uid, Admitted { version });
            self.observe(&key, shadow_pods, pods);
        }
        decision
    }

    /// Drops the admission of `sp` (its Pod could not be made).
    fn undo(&mut self, sp: &ShadowPod, shadow_pods: &Store<ShadowPod>, pods: &Store<Pod>) {
        if let Some(uid) = &sp.metadata.uid {
            self.in_flight.remove(uid);
            self.observe(&Key::of(sp), shadow_pods, pods);
        }
    }
}

/// Whether a stored ShadowPod holds part of its consumer's grant: its Pod exists and has not
/// finished, or, with no Pod seen, its status says it was admitted and has not finished.
fn holds(sp: &ShadowPod, pods: &Store<Pod>) -> bool {
    let key = ObjectRef::new(&sp.name_any()).within(&sp.namespace().unwrap_or_default());
    let pod = pods.get(&key).filter(|p| {
        p.owner_references()
            .iter()
            .any(|o| Some(&o.uid) == sp.metadata.uid.as_ref())
    });
    match pod {
        Some(p) => !p
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .is_some_and(terminal),
        None => sp
            .status
            .as_ref()
            .and_then(|st| st.phase.as_deref())
            .is_some_and(|p| p != PHASE_REJECTED && !terminal(p)),
    }
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

fn terminal(phase: &str) -> bool {
    phase == "Succeeded" || phase == "Failed"
}

/// What in a pod spec a consumer may not ask of this cluster: the host's namespaces, files
/// and privileges, or a node of its choosing.
pub fn forbidden(spec: &PodSpec) -> Vec<String> {
    let mut out = Vec::new();
    for (set, field) in [
        (spec.host_network, "spec.hostNetwork"),
        (spec.host_pid, "spec.hostPID"),
        (spec.host_ipc, "spec.hostIPC"),
    ] {
        if set == Some(true) {
            out.push(field.to_owned());
        }
    }
    if spec.node_name.as_deref().is_some_and(|n| !n.is_empty()) {
        out.push("spec.nodeName".to_owned());
    }
    for v in spec.volumes.iter().flatten() {
        if v.host_path.is_some() {
            out.push(format!("volume {:?}: hostPath", v.name));
        }
    }
    let containers = spec
        .init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter());
    for c in containers {
        if c.security_context
            .as_ref()
            .and_then(|s| s.privileged)
            .unwrap_or(false)
        {
            out.push(format!("container {:?}: privileged", c.name));
        }
    }
    out
}

/// The digest of a pod spec with its images left out: two specs with the same digest differ
/// at most in what a Pod update may change.
pub fn spec_digest(spec: &PodSpec) -> String {
    let mut s = spec.clone();
    for c in s.init_containers.iter_mut().flatten() {
        c.image = None;
    }
    for c in &mut s.containers {
        c.image = None;
    }
    whole_spec_digest(&s)
}

/// The digest of a whole pod spec: equal for equal specs (fields serialise in one order, maps
/// sorted).
pub fn whole_spec_digest(spec: &PodSpec) -> String {
    digest(spec)
}

/// The digest of an API object's JSON (for its equality, not for security).
pub fn digest<T: serde::Serialize>(value: &T) -> String {
    // Kubernetes objects always serialise (string keys, no non-finite floats).
    let bytes = serde_json::to_vec(value).unwrap_or_default();
    let digest = ring::digest::digest(&ring::digest::SHA256, &bytes);
    digest.as_ref()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `spec`'s containers' images by container name, init containers included.
fn images(spec: &PodSpec) -> BTreeMap<String, Option<String>> {
    spec.init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
        .map(|c| (c.name.clone(), c.image.clone()))
        .collect()
}

/// The Pod for `sp`: same name and namespace, its labels (but for the mark of its report)
/// plus the provider's marker and its annotations (but Tether's own), owned by it, with the
/// spec it carries, pointed at the consumer's API server where this cluster reaches it
/// (`consumer_api`, see [`translate::point_at_consumer_api`]).
pub fn pod_for(sp: &ShadowPod, consumer_api: Option<Ipv4Addr>) -> Pod {
    let mut spec = sp.spec.pod.clone();
    if let Some(ip) = consumer_api {
        translate::point_at_consumer_api(&mut spec, ip);
    }
    let l = pod_labels(sp);
    let mut a = pod_annotations(sp);
    if !a.is_empty() {
        a.insert(SHADOW_ANNOTATIONS.to_owned(), keys_of(&a));
    }
    a.insert(SPEC_DIGEST.to_owned(), spec_digest(&sp.spec.pod));
    a.insert(SHADOW_LABELS.to_owned(), keys_of(&l));
    Pod {
        metadata: ObjectMeta {
            name: Some(sp.name_any()),
            namespace: sp.namespace(),
            annotations: Some(a),
            labels: Some(l),
            owner_references: sp.meta().uid.clone().map(|uid| {
                vec![OwnerReference {
                    api_version: "offloading.tether.dev/v1alpha1".into(),
                    kind: "ShadowPod".into(),
                    name: sp.name_any(),
                    uid,
                    controller: Some(true),
                    block_owner_deletion: Some(true),
                }]
            }),
            ..Default::default()
        },
        spec: Some(spec),
        status: None,
    }
}

/// The labels `sp` gives its Pod: its own but for the mark of its report, and the provider's
/// marker.
fn pod_labels(sp: &ShadowPod) -> BTreeMap<String, String> {
    let mut l = sp.labels().clone();
    l.remove(labels::STATUS_REPORTED);
    l.insert(
        labels::TETHER_MANAGED_BY.to_owned(),
        labels::SHADOW_POD.to_owned(),
    );
    l
}

/// The annotations `sp` gives its Pod: its own but Tether's ([`translate::is_tethers`]:
/// the consumer's origin, and what a watch stashes on its copy).
fn pod_annotations(sp: &ShadowPod) -> BTreeMap<String, String> {
    let mut a = sp.annotations().clone();
    a.retain(|k, _| !translate::is_tethers(k));
    a
}

fn keys_of(m: &BTreeMap<String, String>) -> String {
    m.keys().map(String::as_str).collect::<Vec<_>>().join(",")
}

/// The JSON merge patch that brings the labels and annotations of `pod`, running, in line
/// with `sp`'s: those set or changed, those it had from `sp` before ([`SHADOW_LABELS`],
/// [`SHADOW_ANNOTATIONS`]) and `sp` no longer has removed, the rest left alone. `None` when
/// nothing differs. A Pod made before the key annotations existed loses nothing, and gets
/// them.
pub fn metadata_patch(sp: &ShadowPod, pod: &Pod) -> Option<serde_json::Value> {
    let labels = pod_labels(sp);
    let annotations = pod_annotations(sp);
    let (label_changes, label_keys) = map_patch(&labels, pod.labels(), pod, SHADOW_LABELS);
    let (mut changes, keys) = map_patch(&annotations, pod.annotations(), pod, SHADOW_ANNOTATIONS);
    if label_keys.is_none() && keys.is_none() && label_changes.is_empty() && changes.is_empty() {
        return None;
    }
    changes.extend(label_keys.map(|k| (SHADOW_LABELS.to_owned(), k)));
    changes.extend(keys.map(|k| (SHADOW_ANNOTATIONS.to_owned(), k)));
    Some(serde_json::json!({"metadata": {
        "labels": label_changes,
        "annotations": changes,
    }}))
}

/// The merge patch of one map of `pod` (`have`) to `want`, and the new value of the key
/// annotation `keys` (`Some(null)` to remove it) if it changes.
fn map_patch(
    want: &BTreeMap<String, String>,
    have: &BTreeMap<String, String>,
    pod: &Pod,
    keys: &str,
) -> (
    serde_json::Map<String, serde_json::Value>,
    Option<serde_json::Value>,
) {
    let carried = pod.annotations().get(keys);
    let mut patch = serde_json::Map::new();
    for (k, v) in want {
        if have.get(k) != Some(v) {
            patch.insert(k.clone(), v.clone().into());
        }
    }
    for k in carried.into_iter().flat_map(|c| c.split(',')) {
        if !want.contains_key(k) && have.contains_key(k) {
            patch.insert(k.to_owned(), serde_json::Value::Null);
        }
    }
    let now = (!want.is_empty()).then(|| keys_of(want));
    let changed =
        (carried != now.as_ref()).then(|| now.map_or(serde_json::Value::Null, Into::into));
    (patch, changed)
}

/// The strategic merge patch that gives the containers of `pod` the images `sp` names (by
/// container name, init containers too), or `None` when they have them. A patch, not an
/// update: the controller may patch Pods, and an update would also race the kubelet.
pub fn image_patch(sp: &ShadowPod, pod: &Pod) -> Option<serde_json::Value> {
    let want = images(&sp.spec.pod);
    let spec = pod.spec.as_ref()?;
    let changed = |list: &[k8s_openapi::api::core::v1::Container]| -> Vec<serde_json::Value> {
        list.iter()
            .filter_map(|c| {
                let image = want.get(&c.name)?;
                (image != &c.image).then(|| serde_json::json!({"name": c.name, "image": image}))
            })
            .collect()
    };
    let mut patch = serde_json::Map::new();
    let init = changed(spec.init_containers.as_deref().unwrap_or_default());
    if !init.is_empty() {
        patch.insert("initContainers".into(), init.into());
    }
    let main = changed(&spec.containers);
    if !main.is_empty() {
        patch.insert("containers".into(), main.into());
    }
    (!patch.is_empty()).then(|| serde_json::json!({ "spec": patch }))
}

/// Where this cluster reaches `consumer`'s API server: the host the consumer's gateway
/// publishes it under, in this cluster's view of the consumer's external CIDR (the
/// networking Configuration's status). `None` without networking or before the remap.
async fn consumer_api(octx: &OffCtx, consumer: &str) -> Result<Option<Ipv4Addr>, Error> {
    let Ok(id) = tether_api::ClusterId::new(consumer) else {
        return Ok(None);
    };
    let ns = names::tenant_namespace(&id);
    let conf = octx.local.get::<Configuration>(Some(&ns), consumer).await?;
    Ok(conf
        .and_then(|c| {
            c.status
                .as_ref()?
                .remote
                .as_ref()?
                .cidr
                .external
                .first()
                .cloned()
        })
        .and_then(|cidr| names::in_band::address(&cidr, names::in_band::API_SERVER_HOST)))
}

/// The ShadowPod's status once refused: phase `Rejected`, no Pod, `Ready` False with why.
pub fn rejected(
    previous: Option<&ShadowPodStatus>,
    (reason, message): (&str, String),
    generation: Option<i64>,
    at: Time,
) -> ShadowPodStatus {
    let mut next = previous.cloned().unwrap_or_default();
    next.phase = Some(PHASE_REJECTED.to_owned());
    next.pod = None;
    conditions::set(
        &mut next.conditions,
        types::READY,
        Status::False,
        reason,
        message,
        generation,
        at,
    );
    next
}

/// The ShadowPod's status mirroring its Pod's: the phase, the Pod status, and `Ready` as the
/// Pod's `Ready` condition says. The Pod status leaves out its node's addresses: the consumer
/// shows its virtual node's instead, and they need not cross the link (nor leave the
/// provider).
pub fn mirrored(
    previous: Option<&ShadowPodStatus>,
    pod: Option<&PodStatus>,
    generation: Option<i64>,
    at: Time,
) -> ShadowPodStatus {
    let mut next = previous.cloned().unwrap_or_default();
    let phase = pod
        .and_then(|p| p.phase.clone())
        .unwrap_or_else(|| "Pending".to_owned());
    let ready = pod
        .and_then(|p| p.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"));
    let (status, reason, message) = match ready {
        Some(c) => {
            let status = match c.status.as_str() {
                "True" => Status::True,
                "False" => Status::False,
                _ => Status::Unknown,
            };
            let reason = match (c.reason.as_deref(), status) {
                (Some(r), _) if !r.is_empty() => r.to_owned(),
                (_, Status::True) => "PodReady".to_owned(),
                _ => "PodNotReady".to_owned(),
            };
            let message = c
                .message
                .clone()
                .filter(|m| !m.is_empty())
                .unwrap_or_else(|| format!("the pod is {phase}"));
            (status, reason, message)
        }
        None => (
            Status::False,
            "PodNotReady".to_owned(),
            format!("the pod is {phase} and reports no readiness yet"),
        ),
    };
    next.phase = Some(phase);
    next.pod = pod.map(|p| PodStatus {
        host_ip: None,
        host_ips: None,
        ..p.clone()
    });
    conditions::set(
        &mut next.conditions,
        types::READY,
        status,
        &reason,
        message,
        generation,
        at,
    );
    next
}

/// Reconciles one ShadowPod.
pub async fn reconcile(sp: Arc<ShadowPod>, octx: Arc<OffCtx>) -> Result<Action, Error> {
    let started = Instant::now();
    let result = sync(&sp, &octx).await;
    octx.ctx
        .metrics
        .reconciled("shadowpod", result.as_ref().err(), started.elapsed());
    match result {
        Err(e) if e.api_status() == Some(409) => Ok(Action::requeue(Duration::from_millis(200))),
        other => other,
    }
}

async fn sync(sp: &ShadowPod, octx: &OffCtx) -> Result<Action, Error> {
    // Its Pod goes with it (owner reference).
    if sp.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let client = &octx.ctx.client;
    let ns = sp.namespace().unwrap_or_default();
    let name = sp.name_any();
    let consumer = sp.spec.consumer_cluster_id.as_str();
    let namespace = match octx.local.get::<Namespace>(None, &ns).await? {
        Some(n) => Some(n),
        // Made a moment ago, or not at all: the API server says which.
        None => Api::<Namespace>::all(client.clone())
            .get_opt(&ns)
            .await
            .map_err(Error::kube(format!("reading namespace {ns}")))?
            .map(Arc::new),
    };
    match namespace.as_deref().and_then(twin_consumer) {
        None => {
            let message = format!(
                "namespace {ns} is not a twin namespace; a consumer's ShadowPods belong in the \
                 namespace its NamespaceOffloading request got (status.remoteNamespaceName)"
            );
            return reject(octx, sp, ("WrongNamespace", message)).await;
        }
        Some(owner) if owner != consumer => {
            let message = format!(
                "namespace {ns} is the twin namespace of {owner}, not of spec.consumerClusterID \
                 {consumer}"
            );
            return reject(octx, sp, ("WrongNamespace", message)).await;
        }
        Some(_) => {}
    }
    if namespace.is_some_and(|n| n.metadata.deletion_timestamp.is_some()) {
        return Ok(Action::await_change());
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    // A Pod made a moment ago and not in the store yet: creating it again gets a conflict
    // and a second look.
    let pod = octx
        .shadow_pods
        .pods
        .get(&ObjectRef::new(&name).within(&ns));
    let Some(pod) = pod else {
        return create(octx, sp).await;
    };
    let controller = pod
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true));
    match controller {
        Some(o) if Some(&o.uid) == sp.meta().uid.as_ref() => {}
        // The Pod of an earlier ShadowPod of that name: the garbage collector removes it.
        Some(o) if o.kind == "ShadowPod" => return Ok(Action::requeue(Duration::from_secs(1))),
        _ => {
            let message = format!(
                "a Pod {ns}/{name} exists that no ShadowPod owns; it stays, and this ShadowPod \
                 runs once it is gone"
            );
            reject(octx, sp, ("PodNameTaken", message)).await?;
            return Ok(Action::requeue(Duration::from_secs(10)));
        }
    }
    let next = mirrored(
        sp.status.as_ref(),
        pod.status.as_ref(),
        sp.metadata.generation,
        now(),
    );
    let created = pod.metadata.creation_timestamp.as_ref().map(|t| t.0);
    let hold = held(sp.status.as_ref(), &next, created, now().0);
    if hold.is_none() {
        report(octx, sp, next).await?;
    }
    if pod.metadata.deletion_timestamp.is_some() {
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    let wanted = spec_digest(&sp.spec.pod);
    if pod.annotations().get(SPEC_DIGEST) != Some(&wanted) {
        // More changed than a Pod update carries: a new Pod, admitted again once this is gone.
        tracing::info!(pod = %name, namespace = %ns, "the ShadowPod's spec changed; recreating its Pod");
        match pods.delete(&name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(Error::kube(format!("deleting Pod {ns}/{name}"))(e)),
        }
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    // The consumer's label and annotation changes reach the ShadowPod; selectors here (a
    // Service of the reflection, a PodDisruptionBudget) read labels on the Pod, and the pod's
    // programs read both through the downward API.
    if let Some(patch) = metadata_patch(sp, &pod) {
        pods.patch_metadata(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(Error::kube(format!(
                "updating the labels and annotations of Pod {ns}/{name}"
            )))?;
    }
    // Images are the one part of a running Pod's spec an update may change.
    if let Some(patch) = image_patch(sp, &pod) {
        pods.patch(&name, &PatchParams::default(), &Patch::Strategic(&patch))
            .await
            .map_err(Error::kube(format!(
                "updating the images of Pod {ns}/{name}"
            )))?;
    }
    Ok(hold.map_or_else(Action::await_change, Action::requeue))
}

/// How often a starting pod's routine progress is written to its ShadowPod, counted from the
/// Pod's creation. Every status write goes whole to the consumer's watch, over the link, so
/// the steps a pod takes while it starts (scheduled, containers created, running but not
/// ready) are batched: a step waits for the next multiple of this age, and the status then
/// written says where the pod has got to. A pod Ready within it costs one write, not one
/// per step: in a 1,000-pod burst, where pods spent p50 16 s and p99 27 s at the provider
/// before Ready, progress written at 3, 15 and 60 s still left 2 writes per pod. The price:
/// the consumer sees a starting pod's step up to this late ("waiting for the provider to
/// start the pod" until the first). Readiness, the end, trouble (unschedulable, a container
/// waiting for another reason than its creation, a restart) and a new spec generation are
/// never held, nor is anything once the Pod is older than [`PROGRESS_BATCHED_FOR`].
pub const PROGRESS_EVERY: Duration = Duration::from_secs(30);

/// The age after which a Pod's status changes are written as they come.
pub const PROGRESS_BATCHED_FOR: Duration = Duration::from_secs(120);

/// How long the status change from `previous` to `next` waits, if it does (see
/// [`PROGRESS_EVERY`]). `created` is the Pod's creation. `None`: write it now (or there is
/// nothing to write).
pub fn held(
    previous: Option<&ShadowPodStatus>,
    next: &ShadowPodStatus,
    created: Option<k8s_openapi::jiff::Timestamp>,
    now: k8s_openapi::jiff::Timestamp,
) -> Option<Duration> {
    if previous == Some(next) {
        return None;
    }
    let ready = |s: Option<&ShadowPodStatus>| {
        s.and_then(|s| conditions::find(&s.conditions, types::READY))
            .is_some_and(|c| c.status == Status::True.as_str())
    };
    let generation = |s: Option<&ShadowPodStatus>| {
        s.and_then(|s| conditions::find(&s.conditions, types::READY))
            .and_then(|c| c.observed_generation)
    };
    let finished = next.phase.as_deref().is_some_and(terminal);
    if ready(previous) != ready(Some(next))
        || finished
        || generation(previous).is_some_and(|g| Some(g) != generation(Some(next)))
        || trouble(previous.and_then(|p| p.pod.as_ref()), next.pod.as_ref())
    {
        return None;
    }
    let created = created?;
    let since = |t: k8s_openapi::jiff::Timestamp| {
        Duration::try_from(t.duration_since(created)).unwrap_or(Duration::ZERO)
    };
    let news = next
        .pod
        .as_ref()
        .and_then(last_step)
        .map_or(Duration::ZERO, since);
    if news > PROGRESS_BATCHED_FOR {
        return None;
    }
    let every = PROGRESS_EVERY.as_millis();
    let due = news.as_millis().div_ceil(every).max(1) * every;
    let due = Duration::from_millis(u64::try_from(due).unwrap_or(u64::MAX));
    due.checked_sub(since(now)).filter(|left| !left.is_zero())
}

/// Whether `next` shows something wrong that `previous` did not already say: the pod cannot
/// be scheduled, a container waits for another reason than its creation (an image that cannot
/// be pulled, a crash loop), or a container restarted.
fn trouble(previous: Option<&PodStatus>, next: Option<&PodStatus>) -> bool {
    let Some(next) = next else { return false };
    let containers = |p: &PodStatus| {
        let all = [
            p.init_container_statuses.as_deref(),
            p.container_statuses.as_deref(),
            p.ephemeral_container_statuses.as_deref(),
        ];
        all.into_iter()
            .flatten()
            .flatten()
            .cloned()
            .collect::<Vec<_>>()
    };
    let restarts = |p: &PodStatus| {
        containers(p)
            .iter()
            .map(|c| i64::from(c.restart_count))
            .sum::<i64>()
    };
    let unschedulable = next
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "PodScheduled" && c.status == "False");
    let stuck = containers(next).iter().any(|c| {
        c.state
            .as_ref()
            .and_then(|s| s.waiting.as_ref())
            .and_then(|w| w.reason.as_deref())
            .is_some_and(|r| !matches!(r, "ContainerCreating" | "PodInitializing"))
    });
    unschedulable || stuck || restarts(next) > previous.map_or(0, restarts)
}

/// When the pod took its latest step, as far as its status says (whole seconds).
fn last_step(pod: &PodStatus) -> Option<k8s_openapi::jiff::Timestamp> {
    let conditions = pod
        .conditions
        .iter()
        .flatten()
        .filter_map(|c| c.last_transition_time.as_ref());
    let states = [
        pod.init_container_statuses.as_deref(),
        pod.container_statuses.as_deref(),
    ]
    .into_iter()
    .flatten()
    .flatten()
    .filter_map(|c| c.state.as_ref())
    .flat_map(|s| {
        [
            s.running.as_ref().and_then(|r| r.started_at.as_ref()),
            s.terminated.as_ref().and_then(|t| t.finished_at.as_ref()),
        ]
    })
    .flatten();
    conditions
        .chain(states)
        .chain(pod.start_time.as_ref())
        .map(|t| t.0)
        .max()
}

/// Admits `sp` within its consumer's grant and creates its Pod, or rejects it. Decisions
/// are serialised and each counts every earlier one (see [`Admissions::decide`]).
async fn create(octx: &OffCtx, sp: &ShadowPod) -> Result<Action, Error> {
    let client = &octx.ctx.client;
    let ns = sp.namespace().unwrap_or_default();
    let name = sp.name_any();
    let status = sp.status.as_ref();
    // A finished pod is not run again because its Pod was removed.
    if status
        .and_then(|s| s.phase.as_deref())
        .is_some_and(terminal)
    {
        return Ok(Action::await_change());
    }
    // A refusal of this very spec stands until the spec changes.
    if status.and_then(|s| s.phase.as_deref()) == Some(PHASE_REJECTED)
        && let Some(c) = status.and_then(|s| conditions::find(&s.conditions, types::READY))
        && c.observed_generation == sp.metadata.generation
        && !TRANSIENT.contains(&c.reason.as_str())
    {
        return Ok(Action::await_change());
    }
    let consumer = sp.spec.consumer_cluster_id.as_str();
    if let Some(refusal) = tenant_refusal(octx, consumer, true).await? {
        reject(octx, sp, refusal).await?;
        return Ok(Action::requeue(Duration::from_secs(10)));
    }
    let bad = forbidden(&sp.spec.pod);
    if !bad.is_empty() {
        let message = format!(
            "{} not allowed for an offloaded pod; remove it from the pod",
            bad.join(", ")
        );
        return reject(octx, sp, ("ForbiddenSpec", message)).await;
    }
    let mode = octx.ctx.settings.resource_enforcement;
    let grant = grant_of(octx, consumer).await?;
    if mode != Enforcement::None && grant.is_empty() {
        let message = format!(
            "{consumer} holds no granted resources on this cluster; ask for some with a \
             ResourceSlice first"
        );
        return reject(octx, sp, ("NoGrant", message)).await;
    }
    let consumer_api = consumer_api(octx, consumer).await?;
    // Deciding again on a pod admitted a moment ago is harmless: a pod never counts against
    // itself, and its Pod, if made, answers the second create with a conflict.
    let decision = octx.shadow_pods.decide(sp, &grant, mode);
    if let Admission::Deny { reason, message } = decision {
        return reject(octx, sp, (reason, message)).await;
    }
    match Api::<Pod>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &pod_for(sp, consumer_api))
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {
            return Ok(Action::requeue(Duration::from_millis(200)));
        }
        // The API server's own validation of the spec: the consumer's to fix.
        Err(kube::Error::Api(e)) if e.code == 422 || e.code == 400 => {
            octx.shadow_pods.undo(sp);
            let message = format!("the Pod was refused: {}; fix the pod's spec", e.message);
            return reject(octx, sp, ("InvalidPod", message)).await;
        }
        Err(e) => {
            octx.shadow_pods.undo(sp);
            return Err(Error::kube(format!("creating Pod {ns}/{name}"))(e));
        }
    }
    tracing::info!(pod = %name, namespace = %ns, %consumer, "offloaded pod admitted");
    // The status follows from the Pod's own watch event, which brings this ShadowPod back;
    // until the store shows that write, the admission counts as in flight.
    Ok(Action::await_change())
}

/// What `consumer` holds here: the resources of its ResourceSlices this cluster granted
/// (accepted, or kept from before a denied change).
async fn grant_of(octx: &OffCtx, consumer: &str) -> Result<Resources, Error> {
    let Ok(id) = tether_api::ClusterId::new(consumer) else {
        return Ok(Resources::default());
    };
    let ns = names::tenant_namespace(&id);
    let slices = octx.local.list::<ResourceSlice>().await?;
    let this = octx.ctx.cluster_id().as_str();
    let granted: Vec<Resources> = slices
        .iter()
        .filter(|s| {
            s.namespace().as_deref() == Some(ns.as_str())
                && s.spec.provider_cluster_id == this
                && s.spec.consumer_cluster_id == consumer
                && s.metadata.deletion_timestamp.is_none()
        })
        .filter_map(|s| Resources::from_quantities(&s.status.as_ref()?.resources).ok())
        .collect();
    Ok(Resources::sum(&granted))
}

async fn reject(
    octx: &OffCtx,
    sp: &ShadowPod,
    (reason, message): Refusal,
) -> Result<Action, Error> {
    let already = sp
        .status
        .as_ref()
        .and_then(|s| conditions::find(&s.conditions, types::READY))
        .is_some_and(|c| c.reason == reason && c.message == message);
    if !already {
        tracing::info!(pod = %sp.name_any(), namespace = ?sp.namespace(), %reason, %message, "offloaded pod rejected");
    }
    let next = rejected(
        sp.status.as_ref(),
        (reason, message),
        sp.metadata.generation,
        now(),
    );
    report(octx, sp, next).await?;
    Ok(Action::await_change())
}

/// Writes `next` as the status of `sp`, then marks `sp` reported ([`labels::STATUS_REPORTED`])
/// and clears its managed fields if it is not marked yet. In that order: the consumer's
/// watch, which selects reported ShadowPods, first sees one with the status it waits for,
/// not before it has one.
async fn report(octx: &OffCtx, sp: &ShadowPod, next: ShadowPodStatus) -> Result<(), Error> {
    let ns = sp.namespace().unwrap_or_default();
    let name = sp.name_any();
    let api = Api::<ShadowPod>::namespaced(octx.ctx.client.clone(), &ns);
    // The versions of `sp` that have no mark because they predate it.
    let mut unmarked = vec![sp.metadata.resource_version.clone().unwrap_or_default()];
    if sp.status.as_ref() != Some(&next) {
        let mut obj = sp.clone();
        obj.status = Some(next);
        let written = api
            .replace_status(&name, &PostParams::default(), &obj)
            .await
            .map_err(Error::kube(format!(
                "writing the status of ShadowPod {ns}/{name}"
            )))?;
        unmarked.extend(written.metadata.resource_version);
    }
    if sp.labels().contains_key(labels::STATUS_REPORTED) {
        return Ok(());
    }
    let uid = sp.metadata.uid.clone().unwrap_or_default();
    let marked = || {
        octx.shadow_pods
            .marked
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    };
    let seen_version = sp.metadata.resource_version.as_deref().unwrap_or_default();
    if marked()
        .get(&uid)
        .is_some_and(|before| before.iter().any(|v| v == seen_version))
    {
        // Marked already; the store has not shown it yet.
        return Ok(());
    }
    // Only the mark, and the managed fields cleared: a merge patch of the main resource
    // leaves the consumer's fields alone. Who wrote which field is bookkeeping of this API
    // server that the consumer never reads, yet it crossed the link with every report (some
    // 800 bytes a pod, a sixth of a burst's traffic); cleared, it stays so through the status
    // writes that follow. The consumer removes a label it dropped by name
    // (`pods::dropped_labels`), since its apply no longer owns what it wrote before.
    let mark = serde_json::json!({"metadata": {
        "labels": {labels::STATUS_REPORTED: "true"},
        "managedFields": [{}],
    }});
    api.patch_metadata(&name, &PatchParams::default(), &Patch::Merge(&mark))
        .await
        .map_err(Error::kube(format!(
            "marking ShadowPod {ns}/{name} reported"
        )))?;
    let mut marked = marked();
    if marked.len() >= MARKED_KEPT {
        marked.clear();
    }
    marked.insert(uid, unmarked);
    Ok(())
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{
        Container, ContainerState, ContainerStateWaiting, ContainerStatus, HostPathVolumeSource,
        PodCondition, SecurityContext, Volume,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    use super::*;

    fn t(s: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(s).expect("time"))
    }

    fn spec(image: &str) -> PodSpec {
        PodSpec {
            containers: vec![Container {
                name: "app".into(),
                image: Some(image.into()),
                args: Some(vec!["serve".into()]),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn the_digest_ignores_images_only() {
        let a = spec("app:v1");
        assert_eq!(spec_digest(&a), spec_digest(&spec("app:v2")));
        let mut b = spec("app:v1");
        b.containers[0].args = Some(vec!["other".into()]);
        assert_ne!(spec_digest(&a), spec_digest(&b));
        assert_ne!(images(&a), images(&spec("app:v2")));
    }

    #[test]
    fn host_access_and_pinned_nodes_are_forbidden() {
        assert!(forbidden(&spec("app")).is_empty());
        let mut s = spec("app");
        s.host_network = Some(true);
        s.host_pid = Some(false);
        s.node_name = Some("node-1".into());
        s.volumes = Some(vec![Volume {
            name: "root".into(),
            host_path: Some(HostPathVolumeSource {
                path: "/".into(),
                type_: None,
            }),
            ..Default::default()
        }]);
        s.containers[0].security_context = Some(SecurityContext {
            privileged: Some(true),
            ..Default::default()
        });
        assert_eq!(
            forbidden(&s),
            vec![
                "spec.hostNetwork".to_owned(),
                "spec.nodeName".to_owned(),
                "volume \"root\": hostPath".to_owned(),
                "container \"app\": privileged".to_owned(),
            ]
        );
    }

    /// One line per case: the step a pod takes at the provider (and when, in seconds of its
    /// age), the age at which its ShadowPod's status is computed, and whether it is written
    /// now or held for how long.
    #[test]
    fn routine_steps_wait_for_the_next_progress_age() {
        let created = t(100);
        let at = |secs: i64| Time(created.0 + k8s_openapi::jiff::SignedDuration::from_secs(secs));
        let ms = |n: i64| created.0 + k8s_openapi::jiff::SignedDuration::from_millis(n);
        let condition = |type_: &str, status: &str, when: i64| PodCondition {
            type_: type_.into(),
            status: status.into(),
            last_transition_time: Some(at(when)),
            ..Default::default()
        };
        let container = |waiting: Option<&str>, restarts: i32| ContainerStatus {
            name: "app".into(),
            restart_count: restarts,
            state: Some(ContainerState {
                waiting: waiting.map(|r| ContainerStateWaiting {
                    reason: Some(r.into()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        // Scheduled at `when`; Ready True/False at `when` if given; the container's state.
        let pod = |phase: &str, when: i64, ready: Option<&str>, c: ContainerStatus| PodStatus {
            phase: Some(phase.into()),
            conditions: Some(
                std::iter::once(condition("PodScheduled", "True", 0))
                    .chain(ready.map(|r| condition("Ready", r, when)))
                    .chain((when > 0).then(|| condition("Initialized", "True", when)))
                    .collect(),
            ),
            container_statuses: Some(vec![c]),
            ..Default::default()
        };
        let status = |prev: Option<&ShadowPodStatus>, p: PodStatus, generation: i64| {
            mirrored(prev, Some(&p), Some(generation), at(0))
        };
        let creating = |when| {
            pod(
                "Pending",
                when,
                None,
                container(Some("ContainerCreating"), 0),
            )
        };
        let none = mirrored(None, None, Some(1), at(0));
        let scheduled = status(Some(&none), creating(0), 1);
        let unready = |when| {
            status(
                Some(&scheduled),
                pod("Running", when, Some("False"), container(None, 0)),
                1,
            )
        };
        let ready = status(
            Some(&scheduled),
            pod("Running", 1, Some("True"), container(None, 0)),
            1,
        );
        let done = mirrored(
            Some(&ready),
            Some(&PodStatus {
                phase: Some("Succeeded".into()),
                ..Default::default()
            }),
            Some(1),
            at(0),
        );
        let pull = status(
            Some(&scheduled),
            pod("Pending", 0, None, container(Some("ImagePullBackOff"), 0)),
            1,
        );
        let restarted = status(
            Some(&ready),
            pod("Running", 40, Some("True"), container(None, 1)),
            1,
        );
        let unschedulable = mirrored(
            Some(&none),
            Some(&PodStatus {
                phase: Some("Pending".into()),
                conditions: Some(vec![condition("PodScheduled", "False", 0)]),
                ..Default::default()
            }),
            Some(1),
            at(0),
        );
        let respecified = status(
            Some(&ready),
            pod("Running", 1, Some("True"), container(None, 0)),
            2,
        );
        let cases = [
            ("first report, at 0.2 s", None, &scheduled, ms(200)),
            ("scheduled, at 30.0 s", None, &scheduled, ms(30_000)),
            (
                "started at 1 s, not ready, at 1.5 s",
                Some(&scheduled),
                &unready(1),
                ms(1500),
            ),
            (
                "started at 1 s, not ready, at 30.0 s",
                Some(&scheduled),
                &unready(1),
                ms(30000),
            ),
            (
                "started at 31 s, not ready, at 31.5 s",
                Some(&scheduled),
                &unready(31),
                ms(31500),
            ),
            (
                "started at 31 s, not ready, at 60.0 s",
                Some(&scheduled),
                &unready(31),
                ms(60000),
            ),
            (
                "started at 119 s, not ready, at 119.5 s",
                Some(&scheduled),
                &unready(119),
                ms(119500),
            ),
            (
                "started at 125 s, not ready, at 125.1 s",
                Some(&scheduled),
                &unready(125),
                ms(125100),
            ),
            ("ready at 0.3 s", Some(&scheduled), &ready, ms(300)),
            (
                "no longer ready at 0.3 s",
                Some(&ready),
                &unready(0),
                ms(300),
            ),
            ("finished at 0.3 s", Some(&ready), &done, ms(300)),
            (
                "image pull backing off, at 0.3 s",
                Some(&scheduled),
                &pull,
                ms(300),
            ),
            (
                "restarted, ready again, at 40.5 s",
                Some(&ready),
                &restarted,
                ms(40_500),
            ),
            (
                "unschedulable, at 0.3 s",
                Some(&none),
                &unschedulable,
                ms(300),
            ),
            (
                "a new generation, at 0.3 s",
                Some(&ready),
                &respecified,
                ms(300),
            ),
            ("unchanged at 0.3 s", Some(&ready), &ready, ms(300)),
        ];
        let out: String = cases
            .iter()
            .map(|(what, prev, next, now)| {
                format!("{what}: {:?}\n", held(*prev, next, Some(created.0), *now))
            })
            .collect();
        expect_test::expect![[r#"
            first report, at 0.2 s: Some(29.8s)
            scheduled, at 30.0 s: None
            started at 1 s, not ready, at 1.5 s: Some(28.5s)
            started at 1 s, not ready, at 30.0 s: None
            started at 31 s, not ready, at 31.5 s: Some(28.5s)
            started at 31 s, not ready, at 60.0 s: None
            started at 119 s, not ready, at 119.5 s: Some(500ms)
            started at 125 s, not ready, at 125.1 s: None
            ready at 0.3 s: None
            no longer ready at 0.3 s: None
            finished at 0.3 s: None
            image pull backing off, at 0.3 s: None
            restarted, ready again, at 40.5 s: None
            unschedulable, at 0.3 s: None
            a new generation, at 0.3 s: None
            unchanged at 0.3 s: None
        "#]]
        .assert_eq(&out);
        // Without a creation time nothing is held.
        assert_eq!(held(Some(&scheduled), &unready(1), None, ms(100)), None);
    }

    #[test]
    fn status_mirrors_the_pod_and_a_rejection_drops_it() {
        let running = PodStatus {
            phase: Some("Running".into()),
            pod_ip: Some("10.244.1.5".into()),
            conditions: Some(vec![PodCondition {
                type_: "Ready".into(),
                status: "True".into(),
                ..Default::default()
            }]),
            ..Default::default()
        };
        let on_node = PodStatus {
            host_ip: Some("198.18.2.11".into()),
            host_ips: Some(vec![k8s_openapi::api::core::v1::HostIP {
                ip: "198.18.2.11".into(),
            }]),
            ..running.clone()
        };
        let s = mirrored(None, Some(&on_node), Some(1), t(10));
        assert_eq!(s.phase.as_deref(), Some("Running"));
        assert_eq!(
            s.pod.as_ref(),
            Some(&running),
            "all but the node's addresses"
        );
        let c = conditions::find(&s.conditions, types::READY).expect("ready");
        assert_eq!((c.status.as_str(), c.reason.as_str()), ("True", "PodReady"));

        let fresh = mirrored(None, None, Some(1), t(10));
        assert_eq!(fresh.phase.as_deref(), Some("Pending"));
        assert!(!conditions::is_true(&fresh.conditions, types::READY));

        let mut unready = running;
        unready.conditions = Some(vec![PodCondition {
            type_: "Ready".into(),
            status: "False".into(),
            reason: Some("ContainersNotReady".into()),
            message: Some("containers with unready status: [app]".into()),
            ..Default::default()
        }]);
        let s2 = mirrored(Some(&s), Some(&unready), Some(1), t(20));
        let c = conditions::find(&s2.conditions, types::READY).expect("ready");
        assert_eq!(
            (c.status.as_str(), c.reason.as_str(), c.message.as_str()),
            (
                "False",
                "ContainersNotReady",
                "containers with unready status: [app]"
            )
        );
        assert_eq!(c.last_transition_time, t(20));

        let r = rejected(
            Some(&s2),
            ("QuotaExceeded", "cpu: asked 2, in use 1, granted 2".into()),
            Some(1),
            t(30),
        );
        assert_eq!(r.phase.as_deref(), Some(PHASE_REJECTED));
        assert_eq!(r.pod, None);
        let c = conditions::find(&r.conditions, types::READY).expect("ready");
        assert_eq!(c.reason, "QuotaExceeded");
    }

    /// A ShadowPod of `consumer` asking 1 CPU and 1Mi, at resource version `rv`.
    fn asking_one_cpu(name: &str, consumer: &str, rv: &str, phase: Option<&str>) -> ShadowPod {
        let mut pod = spec("app:v1");
        pod.containers[0].resources = Some(k8s_openapi::api::core::v1::ResourceRequirements {
            requests: Some(BTreeMap::from([
                ("cpu".to_owned(), Quantity("1".into())),
                ("memory".to_owned(), Quantity("1Mi".into())),
            ])),
            ..Default::default()
        });
        ShadowPod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("shop-c1".into()),
                uid: Some(format!("uid-{name}")),
                resource_version: Some(rv.into()),
                ..Default::default()
            },
            spec: tether_api::offloading::ShadowPodSpec {
                consumer_cluster_id: consumer.into(),
                pod,
            },
            status: phase.map(|p| ShadowPodStatus {
                phase: Some(p.into()),
                ..Default::default()
            }),
        }
    }

    /// Stores fed as the watches feed them: each event reaches the store, then the
    /// admissions through the same observer the watches use.
    struct Fed {
        stores: Stores,
        sw: Writer<ShadowPod>,
        pw: Writer<Pod>,
    }

    impl Fed {
        /// Stores holding `shadows` and no Pods.
        fn new(shadows: &[&ShadowPod]) -> Self {
            let stores = Stores::default();
            let (sw, pw) = stores
                .writers
                .lock()
                .expect("lock")
                .take()
                .expect("writers");
            let mut fed = Self { stores, sw, pw };
            for sp in shadows {
                fed.shadow(watcher::Event::Apply((*sp).clone()));
            }
            fed
        }

        fn shadow(&mut self, event: watcher::Event<ShadowPod>) {
            self.sw.apply_watcher_event(&event);
            self.stores.observer::<ShadowPod>()(&event);
        }

        fn pod(&mut self, event: watcher::Event<Pod>) {
            self.pw.apply_watcher_event(&event);
            self.stores.observer::<Pod>()(&event);
        }

        fn decide(&self, sp: &ShadowPod) -> Admission {
            self.stores.decide(sp, &two_cpus(), Enforcement::Soft)
        }

        fn admissions(&self) -> std::sync::MutexGuard<'_, Admissions> {
            self.stores.admissions.lock().expect("lock")
        }

        /// What `consumer`'s pods hold, added up from the stores as they are now.
        fn counted_afresh(&self, consumer: &str) -> Resources {
            let a = self.admissions();
            let mut total = Resources::default();
            for sp in self.stores.shadow_pods.state() {
                if sp.spec.consumer_cluster_id == consumer
                    && (a.in_flight(&sp) || holds(&sp, &self.stores.pods))
                    && let Ok(r) = tether_resources::pod_requests(&sp.spec.pod)
                {
                    total.add(&r);
                }
            }
            total
        }
    }

    /// The Pod made from `sp`, in `phase`.
    fn pod_of(sp: &ShadowPod, phase: &str) -> Pod {
        let mut pod = pod_for(sp, None);
        pod.metadata.uid = Some(format!("pod-{}", sp.name_any()));
        pod.status = Some(PodStatus {
            phase: Some(phase.into()),
            ..Default::default()
        });
        pod
    }

    fn two_cpus() -> Resources {
        Resources::from_quantities(&BTreeMap::from([
            ("cpu".to_owned(), Quantity("2".into())),
            ("memory".to_owned(), Quantity("1Gi".into())),
        ]))
        .expect("grant")
    }

    fn denied(a: &Admission) -> bool {
        matches!(
            a,
            Admission::Deny {
                reason: "QuotaExceeded",
                ..
            }
        )
    }

    #[test]
    fn admissions_count_what_the_store_has_not_shown_yet() {
        let (a, b, c) = (
            asking_one_cpu("a", "c1", "1", None),
            asking_one_cpu("b", "c1", "2", None),
            asking_one_cpu("c", "c1", "3", None),
        );
        let fed = Fed::new(&[&a, &b, &c]);
        assert_eq!(fed.decide(&a), Admission::Allow);
        // Deciding on the same pod again never counts it against itself.
        assert_eq!(fed.decide(&a), Admission::Allow);
        assert_eq!(fed.decide(&b), Admission::Allow);
        // Neither a nor b shows an admission in the store yet, and still c is over the grant.
        assert!(denied(&fed.decide(&c)));
    }

    #[test]
    fn a_pod_whose_requests_change_counts_with_its_new_ones() {
        let (a, c) = (
            asking_one_cpu("a", "c1", "1", Some("Running")),
            asking_one_cpu("c", "c1", "3", None),
        );
        let mut fed = Fed::new(&[&a, &c]);
        assert_eq!(fed.decide(&c), Admission::Allow);
        fed.stores.undo(&c);
        // a now asks for two CPUs: the requests read for its earlier version no longer count.
        let mut bigger = asking_one_cpu("a", "c1", "4", Some("Running"));
        if let Some(r) = bigger.spec.pod.containers[0].resources.as_mut() {
            r.requests
                .get_or_insert_default()
                .insert("cpu".to_owned(), Quantity("2".into()));
        }
        fed.shadow(watcher::Event::Apply(bigger));
        assert!(denied(&fed.decide(&c)));
        // Gone, it frees its share and is forgotten.
        fed.shadow(watcher::Event::Delete(a));
        assert_eq!(fed.decide(&c), Admission::Allow);
        assert!(!fed.admissions().held.keys().any(|k| k.name == "a"));
    }

    #[test]
    fn the_store_takes_over_and_finished_or_gone_pods_free_their_share() {
        let (a, b, c) = (
            asking_one_cpu("a", "c1", "1", None),
            asking_one_cpu("b", "c1", "2", None),
            asking_one_cpu("c", "c1", "3", None),
        );
        let other = asking_one_cpu("x", "c2", "4", Some("Running"));
        let mut fed = Fed::new(&[&a, &b, &c, &other]);
        for sp in [&a, &b] {
            assert_eq!(fed.decide(sp), Admission::Allow);
        }
        // The store shows a's admission (its next version, Running): counted from there.
        let a_running = asking_one_cpu("a", "c1", "5", Some("Running"));
        fed.shadow(watcher::Event::Apply(a_running));
        assert!(!fed.admissions().in_flight.contains_key("uid-a"));
        assert!(denied(&fed.decide(&c)));
        // a finished, and b's ShadowPod went: c fits, and another consumer's pod never
        // counted.
        fed.shadow(watcher::Event::Apply(asking_one_cpu(
            "a",
            "c1",
            "6",
            Some("Succeeded"),
        )));
        fed.shadow(watcher::Event::Delete(b));
        assert_eq!(fed.decide(&c), Admission::Allow);
        assert!(!fed.admissions().in_flight.contains_key("uid-b"));
        // A refused pod holds nothing; a running one does.
        let rejected = asking_one_cpu("d", "c1", "7", Some(PHASE_REJECTED));
        fed.shadow(watcher::Event::Apply(rejected));
        let running = asking_one_cpu("f", "c1", "9", Some("Running"));
        fed.shadow(watcher::Event::Apply(running));
        let e = asking_one_cpu("e", "c1", "8", None);
        fed.shadow(watcher::Event::Apply(e.clone()));
        assert!(denied(&fed.decide(&e)));
        fed.stores.undo(&c);
        assert_eq!(fed.decide(&e), Admission::Allow);
    }

    #[test]
    fn a_pod_holds_its_share_while_its_pod_runs_whatever_its_status_says() {
        let (a, b, c) = (
            asking_one_cpu("a", "c1", "1", None),
            asking_one_cpu("b", "c1", "2", None),
            asking_one_cpu("c", "c1", "3", None),
        );
        let mut fed = Fed::new(&[&a, &b, &c]);
        // Pods made by an earlier term: no admission in flight, no status yet.
        fed.pod(watcher::Event::Apply(pod_of(&a, "Pending")));
        fed.pod(watcher::Event::Apply(pod_of(&b, "Running")));
        assert!(denied(&fed.decide(&c)));
        // b's Pod finished: its share is free although b's status says nothing yet.
        fed.pod(watcher::Event::Apply(pod_of(&b, "Succeeded")));
        assert_eq!(fed.decide(&c), Admission::Allow);
        fed.stores.undo(&c);
        // A Pod of another ShadowPod by that name (another UID) holds nothing for this one.
        let mut stranger = pod_of(&b, "Running");
        if let Some(o) = stranger.metadata.owner_references.as_mut() {
            o[0].uid = "someone-else".into();
        }
        fed.pod(watcher::Event::Apply(stranger));
        assert_eq!(fed.decide(&c), Admission::Allow);
    }

    #[test]
    fn a_new_listing_forgets_what_went_while_the_watch_was_away() {
        let (a, b, c) = (
            asking_one_cpu("a", "c1", "1", Some("Running")),
            asking_one_cpu("b", "c1", "2", Some("Running")),
            asking_one_cpu("c", "c1", "3", None),
        );
        let mut fed = Fed::new(&[&a, &b, &c]);
        assert!(denied(&fed.decide(&c)));
        // The watch lists again and b is not there: no Delete event came for it.
        fed.shadow(watcher::Event::Init);
        for sp in [&a, &c] {
            fed.shadow(watcher::Event::InitApply((*sp).clone()));
        }
        fed.shadow(watcher::Event::InitDone);
        assert_eq!(fed.decide(&c), Admission::Allow);
        assert_eq!(fed.counted_afresh("c1"), fed.admissions().totals["c1"]);
    }

    /// One change a watch or the reconciler makes, over five pod names, two consumers.
    #[derive(Clone, Debug)]
    enum Step {
        Shadow {
            name: usize,
            consumer: usize,
            cpu: u8,
            phase: Option<&'static str>,
        },
        DeleteShadow {
            name: usize,
        },
        Pod {
            name: usize,
            phase: &'static str,
        },
        DeletePod {
            name: usize,
        },
        Decide {
            name: usize,
        },
        Undo {
            name: usize,
        },
        Relist {
            keep: Vec<bool>,
        },
    }

    fn step() -> impl proptest::strategy::Strategy<Value = Step> {
        use proptest::prelude::*;
        let name = 0usize..5;
        let phase = prop_oneof![
            Just(None),
            Just(Some("Pending")),
            Just(Some("Running")),
            Just(Some("Succeeded")),
            Just(Some(PHASE_REJECTED)),
        ];
        prop_oneof![
            (name.clone(), 0usize..2, 0u8..3, phase).prop_map(|(name, consumer, cpu, phase)| {
                Step::Shadow {
                    name,
                    consumer,
                    cpu,
                    phase,
                }
            }),
            name.clone().prop_map(|name| Step::DeleteShadow { name }),
            (
                name.clone(),
                prop_oneof![Just("Pending"), Just("Running"), Just("Failed")]
            )
                .prop_map(|(name, phase)| Step::Pod { name, phase }),
            name.clone().prop_map(|name| Step::DeletePod { name }),
            name.clone().prop_map(|name| Step::Decide { name }),
            name.prop_map(|name| Step::Undo { name }),
            proptest::collection::vec(any::<bool>(), 5).prop_map(|keep| Step::Relist { keep }),
        ]
    }

    proptest::proptest! {
        /// Whatever the watches show and in whatever order, each consumer's running total is
        /// what adding up its stored pods again gives.
        #[test]
        fn running_totals_match_a_count_from_scratch(
            steps in proptest::collection::vec(step(), 1..40)
        ) {
            let mut fed = Fed::new(&[]);
            let mut version = 0u32;
            for step in steps {
                version += 1;
                let stored = |fed: &Fed, name: usize| {
                    fed.stores
                        .shadow_pods
                        .get(&ObjectRef::new(&format!("p{name}")).within("shop-c1"))
                };
                match step {
                    Step::Shadow { name, consumer, cpu, phase } => {
                        let mut sp = asking_one_cpu(
                            &format!("p{name}"),
                            &format!("c{consumer}"),
                            &version.to_string(),
                            phase,
                        );
                        if let Some(r) = sp.spec.pod.containers[0].resources.as_mut() {
                            r.requests
                                .get_or_insert_default()
                                .insert("cpu".to_owned(), Quantity(cpu.to_string()));
                        }
                        fed.shadow(watcher::Event::Apply(sp));
                    }
                    Step::DeleteShadow { name } => {
                        if let Some(sp) = stored(&fed, name) {
                            fed.shadow(watcher::Event::Delete((*sp).clone()));
                        }
                    }
                    Step::Pod { name, phase } => {
                        if let Some(sp) = stored(&fed, name) {
                            fed.pod(watcher::Event::Apply(pod_of(&sp, phase)));
                        }
                    }
                    Step::DeletePod { name } => {
                        let key = ObjectRef::new(&format!("p{name}")).within("shop-c1");
                        if let Some(pod) = fed.stores.pods.get(&key) {
                            fed.pod(watcher::Event::Delete((*pod).clone()));
                        }
                    }
                    Step::Decide { name } => {
                        if let Some(sp) = stored(&fed, name) {
                            fed.decide(&sp);
                        }
                    }
                    Step::Undo { name } => {
                        if let Some(sp) = stored(&fed, name) {
                            fed.stores.undo(&sp);
                        }
                    }
                    Step::Relist { keep } => {
                        let all = fed.stores.shadow_pods.state();
                        fed.shadow(watcher::Event::Init);
                        for sp in all {
                            let n: usize = sp.name_any()[1..].parse().expect("name");
                            if keep[n] {
                                fed.shadow(watcher::Event::InitApply((*sp).clone()));
                            }
                        }
                        fed.shadow(watcher::Event::InitDone);
                    }
                }
                for consumer in ["c0", "c1"] {
                    let kept = fed.admissions().totals.get(consumer).cloned().unwrap_or_default();
                    let fresh = fed.counted_afresh(consumer);
                    for name in ["cpu", "memory", "pods"] {
                        proptest::prop_assert_eq!(kept.get(name), fresh.get(name), "{} of {}", name, consumer);
                    }
                }
            }
        }
    }

    #[test]
    fn the_pod_carries_labels_owner_and_digest() {
        let sp = ShadowPod {
            metadata: ObjectMeta {
                name: Some("web-0".into()),
                namespace: Some("shop-c1".into()),
                uid: Some("uid-1".into()),
                labels: Some(BTreeMap::from([("app".into(), "web".into())])),
                ..Default::default()
            },
            spec: tether_api::offloading::ShadowPodSpec {
                consumer_cluster_id: "c1".into(),
                pod: spec("app:v1"),
            },
            status: None,
        };
        let pod = pod_for(&sp, None);
        let l = pod.metadata.labels.clone().expect("labels");
        assert_eq!(l.get("app").map(String::as_str), Some("web"));
        assert_eq!(
            l.get(labels::TETHER_MANAGED_BY).map(String::as_str),
            Some("shadowpod")
        );
        let owner = &pod.metadata.owner_references.as_ref().expect("owner")[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
            ("ShadowPod", "uid-1", Some(true))
        );
        assert_eq!(owner.block_owner_deletion, Some(true));
        assert_eq!(
            pod.annotations().get(SPEC_DIGEST),
            Some(&spec_digest(&sp.spec.pod))
        );
        assert_eq!(pod.spec.as_ref(), Some(&sp.spec.pod));
    }

    fn shadow(pairs: &[(&str, &str)], pod: PodSpec) -> ShadowPod {
        ShadowPod {
            metadata: ObjectMeta {
                name: Some("web-0".into()),
                namespace: Some("shop-c1".into()),
                uid: Some("uid-1".into()),
                labels: Some(
                    pairs
                        .iter()
                        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                        .collect(),
                ),
                ..Default::default()
            },
            spec: tether_api::offloading::ShadowPodSpec {
                consumer_cluster_id: "c1".into(),
                pod,
            },
            status: None,
        }
    }

    /// `pod` with a JSON merge patch of its metadata applied, as the API server would.
    fn merged(pod: &Pod, patch: &serde_json::Value) -> Pod {
        let mut meta = serde_json::to_value(&pod.metadata).expect("metadata");
        for field in ["labels", "annotations"] {
            for (k, v) in patch["metadata"][field].as_object().into_iter().flatten() {
                let map = meta[field].as_object_mut().expect("a map");
                if v.is_null() {
                    map.remove(k);
                } else {
                    map.insert(k.clone(), v.clone());
                }
            }
        }
        Pod {
            metadata: serde_json::from_value(meta).expect("metadata"),
            ..pod.clone()
        }
    }

    #[test]
    fn label_changes_reach_the_running_pod_and_labels_added_here_stay() {
        let before = shadow(&[("app", "web"), ("tier", "front")], spec("app:v1"));
        let mut pod = pod_for(&before, None);
        assert_eq!(metadata_patch(&before, &pod), None);
        pod.labels_mut().insert("sidecar".into(), "on".into());
        assert_eq!(
            metadata_patch(&before, &pod),
            None,
            "a label added here stays"
        );

        // The consumer changed one, dropped one and added one; the provider marked it.
        let after = shadow(
            &[
                ("app", "shop"),
                ("canary", "yes"),
                (labels::STATUS_REPORTED, "true"),
            ],
            spec("app:v1"),
        );
        let patch = metadata_patch(&after, &pod).expect("a patch");
        let keys = format!("app,canary,{}", labels::TETHER_MANAGED_BY);
        assert_eq!(
            patch,
            serde_json::json!({"metadata": {
                "labels": {"app": "shop", "canary": "yes", "tier": null},
                "annotations": {SHADOW_LABELS: keys},
            }})
        );
        let pod = merged(&pod, &patch);
        assert_eq!(
            metadata_patch(&after, &pod),
            None,
            "once applied, nothing to do"
        );
        assert_eq!(
            pod.labels().keys().map(String::as_str).collect::<Vec<_>>(),
            ["app", "canary", "sidecar", labels::TETHER_MANAGED_BY]
        );
    }

    #[test]
    fn a_pod_made_before_the_label_keys_were_kept_loses_no_label() {
        let sp = shadow(&[("app", "web"), ("tier", "front")], spec("app:v1"));
        let mut pod = pod_for(&sp, None);
        pod.annotations_mut().remove(SHADOW_LABELS);
        let now = shadow(&[("app", "web")], spec("app:v1"));
        let keys = format!("app,{}", labels::TETHER_MANAGED_BY);
        assert_eq!(
            metadata_patch(&now, &pod),
            Some(serde_json::json!({"metadata": {
                "labels": {},
                "annotations": {SHADOW_LABELS: keys},
            }}))
        );
    }

    #[test]
    fn annotation_changes_reach_the_running_pod_and_tethers_own_stay_home() {
        let mut before = shadow(&[("app", "web")], spec("app:v1"));
        before.metadata.annotations = Some(BTreeMap::from([
            ("prometheus.io/port".to_owned(), "9090".to_owned()),
            ("team".to_owned(), "shop".to_owned()),
            (super::super::pods::ORIGIN_UID.to_owned(), "u-9".to_owned()),
        ]));
        let mut pod = pod_for(&before, None);
        let carried: Vec<_> = pod.annotations().keys().map(String::as_str).collect();
        assert_eq!(
            carried,
            [
                "prometheus.io/port",
                "team",
                SHADOW_ANNOTATIONS,
                SHADOW_LABELS,
                SPEC_DIGEST,
            ],
            "the origin UID is the consumer's bookkeeping"
        );
        assert_eq!(
            pod.annotations()
                .get(SHADOW_ANNOTATIONS)
                .map(String::as_str),
            Some("prometheus.io/port,team")
        );
        assert_eq!(metadata_patch(&before, &pod), None);
        pod.annotations_mut()
            .insert("mesh/injected".into(), "yes".into());

        let mut after = before;
        let a = after.annotations_mut();
        a.remove("team");
        a.insert("prometheus.io/port".into(), "9100".into());
        let patch = metadata_patch(&after, &pod).expect("a patch");
        assert_eq!(
            patch,
            serde_json::json!({"metadata": {
                "labels": {},
                "annotations": {
                    "prometheus.io/port": "9100",
                    "team": null,
                    SHADOW_ANNOTATIONS: "prometheus.io/port",
                },
            }})
        );
        let pod = merged(&pod, &patch);
        assert_eq!(
            metadata_patch(&after, &pod),
            None,
            "once applied, nothing to do"
        );
        assert_eq!(
            pod.annotations().get("mesh/injected").map(String::as_str),
            Some("yes"),
            "an annotation added here stays"
        );

        // The last one dropped: the key list goes too.
        after.annotations_mut().remove("prometheus.io/port");
        let patch = metadata_patch(&after, &pod).expect("a patch");
        assert_eq!(
            patch["metadata"]["annotations"],
            serde_json::json!({"prometheus.io/port": null, SHADOW_ANNOTATIONS: null})
        );
        let pod = merged(&pod, &patch);
        assert_eq!(metadata_patch(&after, &pod), None);
        assert_eq!(pod.annotations().get(SHADOW_ANNOTATIONS), None);
    }

    #[test]
    fn only_changed_images_are_patched_by_container_name() {
        let mut two = spec("app:v1");
        two.init_containers = Some(vec![Container {
            name: "init".into(),
            image: Some("setup:v1".into()),
            ..Default::default()
        }]);
        let sp = shadow(&[], two.clone());
        let pod = pod_for(&sp, None);
        assert_eq!(image_patch(&sp, &pod), None);
        two.containers[0].image = Some("app:v2".into());
        assert_eq!(
            image_patch(&shadow(&[], two.clone()), &pod),
            Some(serde_json::json!({"spec": {"containers": [{"name": "app", "image": "app:v2"}]}}))
        );
        two.init_containers.as_mut().expect("init")[0].image = Some("setup:v2".into());
        assert_eq!(
            image_patch(&shadow(&[], two), &pod),
            Some(serde_json::json!({"spec": {
                "initContainers": [{"name": "init", "image": "setup:v2"}],
                "containers": [{"name": "app", "image": "app:v2"}],
            }}))
        );
    }
}
