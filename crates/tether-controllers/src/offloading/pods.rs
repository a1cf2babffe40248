//! Pod reflection for one virtual node: each pod the consumer's scheduler binds to the node
//! becomes a ShadowPod in the provider's twin of its namespace, the provider's pod status
//! comes back with its addresses in this cluster's view, and deletion goes both ways (the
//! local pod is removed for good only once the provider's is gone). This is the kubelet's
//! job for a virtual node.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Pod, PodCondition, PodSpec, PodStatus};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, Preconditions};
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{WatchStreamExt, watcher};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tether_api::ClusterId;
use tether_api::names::{self, labels};
use tether_api::networking::Configuration;
use tether_api::offloading::{NamespaceOffloading, ShadowPod, ShadowPodSpec};
use tokio_util::sync::CancellationToken;

use super::translate::{self, PodView};
use super::watched::{self, Change};
use super::{OffCtx, shadow_pods, tokens};
use crate::Error;
use crate::context::FIELD_MANAGER;

/// How often a pod that is not yet running (or being deleted) is compared with its
/// provider's copy, besides whenever that copy changes.
const SETTLING: Duration = Duration::from_secs(5);
/// How often a running pod is: a change on either side brings it back sooner (its watch
/// here, [`Change`]s there), so this only bounds how long a missed change goes unnoticed.
const STEADY: Duration = Duration::from_secs(300);
/// Annotation on a ShadowPod: the UID of the consumer's pod it stands for.
pub const ORIGIN_UID: &str = "tether.dev/origin-uid";
/// How long a written ShadowPod the watch has not shown yet is trusted to be there. The watch
/// shows a ShadowPod once the provider reports on it ([`labels::STATUS_REPORTED`]): when its
/// pod is ready, or after [`shadow_pods::PROGRESS_EVERY`] of its age at the latest, later
/// when the provider is slow. A ShadowPod unseen for longer is written again, which changes
/// nothing at the provider if it is there.
const UNSEEN: Duration = Duration::from_secs(60);
/// How many pods of one node are reflected at once. The clients speak HTTP/2, so these share
/// one connection to the provider and one here. A new pod's reconcile makes one call (the
/// apply). 64 gave one thousand-pod burst of the benchmark 32 s against 36 to 37 s at 16,
/// within what its runs scatter, and left the controller about 1 MiB larger after a
/// hundred-pod burst and 2.5 MiB after a thousand-pod one.
const AT_ONCE: u16 = 16;
/// A pod whose ShadowPod was written and not reported on is shown waiting for its provider
/// once the write is this old. Most reports come sooner, and a burst's reconciles, spared
/// that status write, get its next pods to the provider sooner. `kubectl get` shows such a
/// pod Pending either way; the message is for a provider that takes its time.
const SHOWN_WAITING_AFTER: Duration = Duration::from_secs(4);
/// On a stored pod only (it is never written back as stored): its spec, and its status, as
/// JSON text, which [`compact`] puts in place of the structs.
const STORED_SPEC: &str = "tether.dev/stored-pod-spec";
const STORED_STATUS: &str = "tether.dev/stored-pod-status";

/// Keeps a watched pod in the store in a compact form: no managed fields (nothing here reads
/// them), and its spec and status as JSON text ([`STORED_SPEC`], [`STORED_STATUS`]).
/// Deserialised, a pod spec takes about 8 KiB (a volume alone is a struct of every volume
/// source) and a status about 2; as text, a fraction. They are read back only when a
/// reconcile needs them ([`spec_of`], [`status_of`]).
fn compact(p: &mut Pod) {
    p.metadata.managed_fields = None;
    if let Some(spec) = p.spec.take() {
        p.spec = stash(&mut p.metadata, STORED_SPEC, spec);
    }
    if let Some(status) = p.status.take() {
        p.status = stash(&mut p.metadata, STORED_STATUS, status);
    }
}

/// Puts `value` as JSON text in annotation `key` of `meta`; gives it back if it cannot be.
pub(super) fn stash<T: Serialize>(meta: &mut ObjectMeta, key: &str, value: T) -> Option<T> {
    match serde_json::to_string(&value) {
        Ok(json) => {
            meta.annotations
                .get_or_insert_default()
                .insert(key.to_owned(), json);
            None
        }
        Err(_) => Some(value),
    }
}

/// What [`stash`] put in annotation `key` of `meta`.
pub(super) fn unstash<T: DeserializeOwned>(meta: &ObjectMeta, key: &str) -> Option<T> {
    serde_json::from_str(meta.annotations.as_ref()?.get(key)?).ok()
}

/// The spec of a stored pod ([`compact`]).
fn spec_of(p: &Pod) -> Option<PodSpec> {
    p.spec.clone().or_else(|| unstash(&p.metadata, STORED_SPEC))
}

/// The status of a stored pod ([`compact`]).
fn status_of(p: &Pod) -> Option<PodStatus> {
    p.status
        .clone()
        .or_else(|| unstash(&p.metadata, STORED_STATUS))
}

/// A stored pod as the API server has it: spec and status restored, the stored form's
/// annotations gone.
fn restored(p: &Pod) -> Pod {
    let mut whole = p.clone();
    whole.spec = spec_of(p);
    whole.status = status_of(p);
    if let Some(a) = whole.metadata.annotations.as_mut() {
        a.remove(STORED_SPEC);
        a.remove(STORED_STATUS);
        if a.is_empty() {
            whole.metadata.annotations = None;
        }
    }
    whole
}

/// What one node's reflector works with.
struct Node {
    octx: Arc<OffCtx>,
    name: String,
    provider: ClusterId,
    /// This cluster's namespace of each twin namespace at the provider that holds the
    /// node's ShadowPods.
    twins: Mutex<HashMap<String, String>>,
    /// ShadowPods written that the watch has not shown yet.
    unseen: Mutex<Unseen>,
}

/// ShadowPods written that the watch has not shown yet, by namespace/name: the digest of what
/// was written and when. A pod reconciled again meanwhile (its own status write brings it
/// back, and it is looked at every [`SETTLING`] until the provider reports) would write the
/// same ShadowPod again, each time a whole ShadowPod over the link.
#[derive(Debug, Default)]
struct Unseen(HashMap<String, (String, Instant)>);

impl Unseen {
    /// How much longer the write of `digest` for `key` is trusted to be there though the
    /// watch does not show it: some of [`UNSEEN`] after the write, none if it was not written
    /// or `seen` (the watch shows the ShadowPod, which ends the wait).
    fn awaiting(&mut self, key: &str, digest: &str, seen: bool, now: Instant) -> Option<Duration> {
        if seen {
            self.0.remove(key);
            return None;
        }
        let (d, at) = self.0.get(key)?;
        if d != digest {
            return None;
        }
        UNSEEN
            .checked_sub(now.duration_since(*at))
            .filter(|left| !left.is_zero())
    }

    /// Records a write at `now`, and forgets those too old to be waited for.
    fn wrote(&mut self, key: String, digest: String, now: Instant) {
        self.0.retain(|_, (_, at)| now.duration_since(*at) < UNSEEN);
        self.0.insert(key, (digest, now));
    }
}

/// The local pods whose ShadowPods at `node`'s provider changed: each is reconciled as the
/// change arrives, not at its next periodic look.
fn shadow_pod_changes(
    changes: tokio::sync::broadcast::Receiver<Arc<Change>>,
    node: Arc<Node>,
) -> impl futures::Stream<Item = ObjectRef<Pod>> + Send + 'static {
    let received = futures::stream::unfold(changes, |mut rx| async move {
        loop {
            match rx.recv().await {
                Ok(change) => return Some((change, rx)),
                // Fell behind: what it missed is found on the next periodic pass.
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
            }
        }
    });
    received.filter_map(move |change| {
        let node = node.clone();
        async move {
            if !change.is::<ShadowPod>() || change.provider != node.provider.as_str() {
                return None;
            }
            let twins = node.twins.lock().unwrap_or_else(PoisonError::into_inner);
            let local = twins.get(&change.namespace)?;
            Some(ObjectRef::new(&change.name).within(local))
        }
    })
}

/// A running reflector; stops when dropped or stopped.
pub struct Reflector {
    stop: CancellationToken,
}

impl Reflector {
    /// Starts reflecting the pods bound to `node`, which `provider` runs.
    pub fn spawn(octx: Arc<OffCtx>, node: &str, provider: ClusterId) -> Self {
        let stop = CancellationToken::new();
        let api: Api<Pod> = Api::all(octx.ctx.client.clone());
        let changes = octx.watched.subscribe();
        let ctx = Arc::new(Node {
            octx,
            name: node.to_owned(),
            provider,
            twins: Mutex::default(),
            unseen: Mutex::default(),
        });
        let config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
        let (store, writer) = reflector::store();
        let pods = watcher(api, config)
            .default_backoff()
            .modify(compact)
            .reflect(writer)
            .touched_objects();
        let run = Controller::for_stream(pods, store)
            .with_config(controller::Config::default().concurrency(AT_ONCE))
            .reconcile_on(shadow_pod_changes(changes, ctx.clone()))
            .graceful_shutdown_on(stop.clone().cancelled_owned())
            .run(reflect, error_policy, ctx)
            .for_each(|_| async {});
        tokio::spawn(run);
        Self { stop }
    }

    /// Stops the reflector; the pods stay as they are.
    pub fn stop(&self) {
        self.stop.cancel();
    }
}

impl Drop for Reflector {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

fn error_policy(pod: Arc<Pod>, e: &Error, node: Arc<Node>) -> Action {
    tracing::warn!(node = %node.name, pod = %pod.name_any(), error = %e, "reflecting a pod failed; retrying");
    Action::requeue(Duration::from_secs(3))
}

async fn reflect(pod: Arc<Pod>, node: Arc<Node>) -> Result<Action, Error> {
    let started = Instant::now();
    let result = reflect_one(&pod, &node).await;
    node.octx
        .ctx
        .metrics
        .reconciled("pod-reflection", result.as_ref().err(), started.elapsed());
    result
}

/// The twin of `ns` at `provider`, once the provider made it.
pub(super) async fn twin_of(
    client: &kube::Client,
    ns: &str,
    provider: &ClusterId,
) -> Result<Result<String, String>, Error> {
    let no = Api::<NamespaceOffloading>::namespaced(client.clone(), ns)
        .get_opt(super::namespaces::NAME)
        .await
        .map_err(Error::kube(format!(
            "reading the NamespaceOffloading of {ns}"
        )))?;
    Ok(twin_in(no.as_ref(), ns, provider))
}

/// The twin of `ns` at `provider` as `ns`'s NamespaceOffloading (`no`) reports it, or why
/// there is none.
fn twin_in(
    no: Option<&NamespaceOffloading>,
    ns: &str,
    provider: &ClusterId,
) -> Result<String, String> {
    let Some(no) = no else {
        return Err(format!(
            "namespace {ns} is not offloaded; `tether offload namespace {ns}` does it"
        ));
    };
    let st = no.status.as_ref();
    let ready = st
        .and_then(|st| st.remote_namespaces_conditions.get(provider.as_str()))
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"));
    match (ready, st.and_then(|st| st.remote_namespace_name.clone())) {
        (Some(c), Some(name)) if c.status == "True" => Ok(name),
        (Some(c), _) => Err(format!(
            "namespace {ns} is not ready at {provider}: {}",
            c.message
        )),
        (None, _) => Err(format!(
            "namespace {ns} is not offloaded to {provider} (its cluster selector leaves it out)"
        )),
    }
}

async fn reflect_one(pod: &Pod, node: &Node) -> Result<Action, Error> {
    let ctx = &node.octx.ctx;
    let ns = pod.namespace().unwrap_or_default();
    let name = pod.name_any();
    let local: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let access = node
        .octx
        .providers
        .recent_access(&ctx.client, &node.provider)
        .await?;
    let offloading = node
        .octx
        .local
        .get::<NamespaceOffloading>(Some(&ns), super::namespaces::NAME)
        .await?;
    let twin = twin_in(offloading.as_deref(), &ns, &node.provider);
    if let Ok(twin) = &twin {
        node.twins
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(twin.clone(), ns.clone());
    }
    if pod.metadata.deletion_timestamp.is_some() {
        // Gone at the provider first (or never there), then here for good.
        if let (Some(access), Ok(twin)) = (&access, &twin) {
            let remote: Api<ShadowPod> = Api::namespaced(access.client.clone(), twin);
            let watched = node
                .octx
                .watched
                .get::<ShadowPod>(&node.provider, access, twin, &name);
            match watched.await {
                Ok(Some(sp)) => {
                    if sp.metadata.deletion_timestamp.is_none() {
                        remote
                            .delete(&name, &DeleteParams::foreground())
                            .await
                            .map_err(Error::kube(format!(
                                "deleting ShadowPod {twin}/{name} at {}",
                                node.provider
                            )))?;
                    }
                    return Ok(Action::requeue(Duration::from_millis(500)));
                }
                // Not reported on yet (the watch does not show it), or gone: the provider
                // says which.
                Ok(None) => match remote.delete(&name, &DeleteParams::foreground()).await {
                    Ok(_) => return Ok(Action::requeue(Duration::from_secs(1))),
                    Err(kube::Error::Api(e)) if e.code == 404 => {}
                    Err(e) => {
                        return Err(Error::kube(format!(
                            "deleting ShadowPod {twin}/{name} at {}",
                            node.provider
                        ))(e));
                    }
                },
                // The provider is unreachable: the pod goes once it answers again.
                Err(e) => return Err(e),
            }
        }
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: pod.metadata.uid.clone().map(|uid| Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match local.delete(&name, &params).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
            Err(e) => return Err(Error::kube(format!("deleting pod {ns}/{name}"))(e)),
        }
        return Ok(Action::await_change());
    }
    let (access, twin) = match (access, twin) {
        (Some(a), Ok(t)) => (a, t),
        (None, _) => {
            let why = format!("no identity issued by {} (not peered?)", node.provider);
            set_waiting(&local, pod, "OffloadingBackOff", &why).await?;
            return Ok(Action::requeue(Duration::from_secs(5)));
        }
        (_, Err(why)) => {
            set_waiting(&local, pod, "OffloadingBackOff", &why).await?;
            return Ok(Action::requeue(Duration::from_secs(5)));
        }
    };
    let remote: Api<ShadowPod> = Api::namespaced(access.client.clone(), &twin);
    // Every pod has one: none here is a stored form that could not be read back, and a
    // ShadowPod written from an empty spec would be refused or run nothing.
    let Some(spec) = spec_of(pod) else {
        return Err(Error::Invalid(format!(
            "pod {ns}/{name}: its stored spec is unreadable"
        )));
    };
    let token = if translate::mounts_token(&spec) {
        let sa = translate::service_account(&spec);
        Some(tokens::ensure(&node.octx, &node.provider, &access, &ns, &twin, sa).await?)
    } else {
        None
    };
    let wanted = shadow_pod(pod, &spec, node, ctx.cluster_id(), token.as_deref());
    let watched = node
        .octx
        .watched
        .get::<ShadowPod>(&node.provider, &access, &twin, &name);
    let current = match watched.await {
        Ok(c) => c.map(|c| (*c).clone()),
        Err(_) => {
            // The provider is unreachable: the pod keeps its last known status (it keeps
            // running there); the virtual node's Ready condition says what is wrong.
            return Ok(Action::requeue(Duration::from_secs(5)));
        }
    };
    let stale = current.as_ref().is_none_or(|c| {
        c.spec.consumer_cluster_id != wanted.spec.consumer_cluster_id
            || watched::pod_spec_digest(c)
                != Some(shadow_pods::whole_spec_digest(&wanted.spec.pod).as_str())
            || !same_labels(c, &wanted)
            || held_annotations(c) != wanted.annotations().clone()
    });
    let key = format!("{ns}/{name}");
    let digest = shadow_pods::digest(&wanted);
    let awaited = stale
        .then(|| unseen(node).awaiting(&key, &digest, current.is_some(), Instant::now()))
        .flatten();
    if let Some(left) = awaited {
        // Written, and not reported on yet: the report reconciles this pod again.
        if UNSEEN.saturating_sub(left) >= SHOWN_WAITING_AFTER {
            show_waiting_for(&local, pod, &node.provider).await?;
        }
        return Ok(Action::requeue(left.min(SETTLING)));
    }
    let current = if stale {
        // Only the metadata comes back: the rest is what was sent and the provider's status,
        // which this write does not change, and the whole object would cross the link once
        // more for nothing (its watch event brings it anyway).
        let written = remote
            .patch_metadata(
                &name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&wanted),
            )
            .await
            .map_err(Error::kube(format!(
                "writing ShadowPod {twin}/{name} at {}",
                node.provider
            )))?;
        let (labels, annotations) = current
            .as_ref()
            .map(|held| dropped_metadata(held, &wanted))
            .unwrap_or_default();
        if !labels.is_empty() || !annotations.is_empty() {
            let removal =
                serde_json::json!({"metadata": {"labels": labels, "annotations": annotations}});
            remote
                .patch_metadata(&name, &PatchParams::default(), &Patch::Merge(&removal))
                .await
                .map_err(Error::kube(format!(
                    "removing dropped labels and annotations of ShadowPod {twin}/{name} at {}",
                    node.provider
                )))?;
        }
        tracing::debug!(pod = %name, namespace = %ns, twin = %twin, "shadow pod written");
        unseen(node).wrote(key, digest, Instant::now());
        ShadowPod {
            metadata: written.metadata,
            spec: wanted.spec,
            status: current.and_then(|c| c.status),
        }
    } else {
        current.expect("not stale, so present")
    };
    let remote_status = watched::pod_status(&current);
    let st = current.status.unwrap_or_default();
    if st.phase.as_deref() == Some("Rejected") {
        let c = st.conditions.iter().find(|c| c.type_ == "Ready");
        let reason = c.map_or("Rejected", |c| c.reason.as_str());
        let message = format!(
            "{} refused to run this pod: {}",
            node.provider,
            c.map_or("", |c| c.message.as_str())
        );
        set_waiting(&local, pod, reason, &message).await?;
        return Ok(Action::requeue(Duration::from_secs(10)));
    }
    let Some(remote_status) = remote_status else {
        // Just written: the next look, if the report has not come first, shows it waiting.
        if !stale {
            show_waiting_for(&local, pod, &node.provider).await?;
        }
        return Ok(Action::requeue(SETTLING));
    };
    let view = pod_view(&node.octx, &node.provider).await?;
    let status = translate::local_status(&remote_status, &view, ctx.settings.pod_ip.as_deref());
    write_status(&local, pod, status.clone()).await?;
    let ready = status
        .conditions
        .as_ref()
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True");
    Ok(Action::requeue(if ready { STEADY } else { SETTLING }))
}

/// Whether the ShadowPod the provider holds (`held`) has the labels of the one wanted, but
/// for the mark of the provider's report, which only the provider writes.
fn same_labels(held: &ShadowPod, wanted: &ShadowPod) -> bool {
    let mut labels = held.labels().clone();
    labels.remove(labels::STATUS_REPORTED);
    Some(&labels) == wanted.metadata.labels.as_ref()
}

/// The annotations of the ShadowPod the provider holds (`held`) as the provider has them: the
/// watched copy also carries what its watch stashed there ([`watched::POD_SPEC_DIGEST`],
/// [`watched::POD_STATUS`]).
fn held_annotations(held: &ShadowPod) -> BTreeMap<String, String> {
    let mut a = held.annotations().clone();
    a.remove(watched::POD_SPEC_DIGEST);
    a.remove(watched::POD_STATUS);
    a
}

/// The labels (but the provider's mark) and annotations of the ShadowPod the provider holds
/// (`held`) that the one wanted no longer has, each set to null: a JSON merge patch of them
/// removes them. The apply cannot: the provider clears the managed fields when it marks a
/// ShadowPod reported, so the consumer's apply no longer owns, and so no longer prunes, what
/// it wrote before; and what someone added at the provider was never its own.
type Dropped = BTreeMap<String, serde_json::Value>;
fn dropped_metadata(held: &ShadowPod, wanted: &ShadowPod) -> (Dropped, Dropped) {
    let gone = |have: Vec<&String>, keep: &BTreeMap<String, String>| -> Dropped {
        have.into_iter()
            .filter(|k| !keep.contains_key(*k))
            .map(|k| (k.clone(), serde_json::Value::Null))
            .collect()
    };
    let labels = held
        .labels()
        .keys()
        .filter(|k| *k != labels::STATUS_REPORTED)
        .collect();
    let annotations = held_annotations(held);
    (
        gone(labels, wanted.labels()),
        gone(annotations.keys().collect(), wanted.annotations()),
    )
}

fn unseen(node: &Node) -> std::sync::MutexGuard<'_, Unseen> {
    node.unseen.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The ShadowPod standing for `pod`, whose spec is `spec`.
fn shadow_pod(
    pod: &Pod,
    spec: &PodSpec,
    node: &Node,
    consumer: &ClusterId,
    token: Option<&str>,
) -> ShadowPod {
    let mut lbls = pod.labels().clone();
    lbls.insert(labels::VIRTUAL_NODE.to_owned(), node.name.clone());
    let mut annotations = translate::shadow_annotations(pod.annotations());
    if let Some(uid) = pod.metadata.uid.clone() {
        annotations.insert(ORIGIN_UID.to_owned(), uid);
    }
    ShadowPod {
        metadata: kube::api::ObjectMeta {
            name: Some(pod.name_any()),
            labels: Some(lbls),
            annotations: (!annotations.is_empty()).then_some(annotations),
            ..Default::default()
        },
        spec: ShadowPodSpec {
            consumer_cluster_id: consumer.as_str().to_owned(),
            pod: translate::shadow_spec(spec, token),
        },
        status: None,
    }
}

/// How this cluster addresses `provider`'s pods, from the networking module's Configuration
/// (no remap known: addresses are shown as the provider has them).
async fn pod_view(octx: &OffCtx, provider: &ClusterId) -> Result<PodView, Error> {
    let ns = names::tenant_namespace(provider);
    let conf = octx
        .local
        .get::<Configuration>(Some(&ns), provider.as_str())
        .await?;
    Ok(match conf {
        Some(c) => {
            let real = c.spec.remote.cidr.pod.clone();
            let view = c
                .status
                .as_ref()
                .and_then(|s| s.remote.as_ref())
                .map(|r| r.cidr.pod.clone())
                .unwrap_or_else(|| real.clone());
            PodView::new(&real, &view)
        }
        None => PodView::default(),
    })
}

/// Shows a pod as Pending until `provider` has started it.
async fn show_waiting_for(local: &Api<Pod>, pod: &Pod, provider: &ClusterId) -> Result<(), Error> {
    let message = format!("waiting for {provider} to start the pod");
    set_waiting(local, pod, "", &message).await
}

/// Shows a pod that cannot run remotely yet as Pending, with why.
async fn set_waiting(
    local: &Api<Pod>,
    pod: &Pod,
    reason: &str,
    message: &str,
) -> Result<(), Error> {
    let old = status_of(pod).unwrap_or_default();
    let mut st = PodStatus {
        phase: Some("Pending".into()),
        conditions: Some(vec![PodCondition {
            type_: "PodScheduled".into(),
            status: "True".into(),
            ..Default::default()
        }]),
        ..Default::default()
    };
    if !reason.is_empty() {
        st.reason = Some(reason.to_owned());
    }
    st.message = Some(message.to_owned());
    if old.phase == st.phase && old.reason == st.reason && old.message == st.message {
        return Ok(());
    }
    // Keep the transition time the scheduler wrote.
    if let Some(prev) = old
        .conditions
        .as_ref()
        .and_then(|cs| cs.iter().find(|c| c.type_ == "PodScheduled"))
        && let Some(cs) = st.conditions.as_mut()
    {
        cs[0] = prev.clone();
    }
    write_status(local, pod, st).await
}

async fn write_status(local: &Api<Pod>, pod: &Pod, status: PodStatus) -> Result<(), Error> {
    if status_of(pod).as_ref() == Some(&status) {
        return Ok(());
    }
    let name = pod.name_any();
    let mut next = restored(pod);
    next.status = Some(status);
    // Managed fields are the server's to keep.
    next.metadata.managed_fields = None;
    match local
        .replace_status(&name, &kube::api::PostParams::default(), &next)
        .await
    {
        Ok(_) => Ok(()),
        // Changed meanwhile (its next version is reconciled) or gone.
        Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => Ok(()),
        Err(e) => Err(Error::kube(format!(
            "writing the status of pod {}/{name}",
            pod.namespace().unwrap_or_default()
        ))(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_compact_pod_gives_back_its_spec_and_restores_to_what_the_server_has() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "web-1", "namespace": "shop", "uid": "u-1", "resourceVersion": "7",
                "labels": {"app": "web"},
                "managedFields": [{"manager": "kubectl", "operation": "Apply"}],
            },
            "spec": {
                "nodeName": "tether-b",
                "containers": [{"name": "web", "image": "nginx", "ports": [{"containerPort": 80}]}],
                "volumes": [{"name": "data", "emptyDir": {}}],
                "tolerations": [{"key": "tether.dev/virtual-node", "operator": "Exists"}],
            },
            "status": {"phase": "Pending"},
        }))
        .expect("pod");
        let mut stored = pod.clone();
        compact(&mut stored);
        assert_eq!(stored.spec, None, "the spec is kept as text");
        assert_eq!(stored.status, None, "so is the status");
        assert_eq!(stored.metadata.managed_fields, None);
        assert_eq!(spec_of(&stored), pod.spec);
        assert_eq!(status_of(&stored), pod.status);

        let mut expected = pod.clone();
        expected.metadata.managed_fields = None;
        assert_eq!(
            restored(&stored),
            expected,
            "no annotation of its own is left"
        );

        // A pod with annotations of its own keeps them.
        let mut annotated = pod.clone();
        annotated.metadata.annotations = Some(BTreeMap::from([("a".into(), "b".into())]));
        let mut stored = annotated.clone();
        compact(&mut stored);
        assert_eq!(
            restored(&stored).metadata.annotations,
            annotated.metadata.annotations
        );
        // An uncompacted pod (nothing stored as text) is read as it is.
        assert_eq!(spec_of(&pod), pod.spec);
        assert_eq!(status_of(&pod), pod.status);
    }

    #[test]
    fn a_written_shadow_pod_is_awaited_until_seen_changed_or_a_minute_old() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut unseen = Unseen::default();
        assert_eq!(
            unseen.awaiting("shop/a", "d1", false, t0),
            None,
            "nothing written"
        );

        unseen.wrote("shop/a".into(), "d1".into(), t0);
        assert_eq!(
            unseen.awaiting("shop/a", "d1", false, at(500)),
            Some(Duration::from_millis(59_500))
        );
        assert_eq!(
            unseen.awaiting("shop/a", "d1", false, at(59_999)),
            Some(Duration::from_millis(1))
        );
        assert_eq!(
            unseen.awaiting("shop/a", "d1", false, at(60_000)),
            None,
            "too old: written again"
        );
        assert_eq!(
            unseen.awaiting("shop/a", "d2", false, at(500)),
            None,
            "wants another"
        );
        assert_eq!(
            unseen.awaiting("shop/b", "d1", false, at(500)),
            None,
            "another pod"
        );

        // Seen by the watch: the wait ends for good.
        assert_eq!(unseen.awaiting("shop/a", "d1", true, at(600)), None);
        assert_eq!(unseen.awaiting("shop/a", "d1", false, at(700)), None);

        // A write forgets what is too old to be waited for.
        unseen.wrote("shop/b".into(), "d1".into(), t0);
        unseen.wrote("shop/c".into(), "d1".into(), at(60_000));
        assert_eq!(unseen.0.len(), 1);
        assert!(unseen.awaiting("shop/c", "d1", false, at(60_001)).is_some());
    }

    fn sp(labels: &[(&str, &str)]) -> ShadowPod {
        ShadowPod {
            metadata: ObjectMeta {
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                        .collect(),
                ),
                ..ObjectMeta::default()
            },
            spec: ShadowPodSpec {
                consumer_cluster_id: "alpha".into(),
                pod: PodSpec::default(),
            },
            status: None,
        }
    }

    #[test]
    fn labels_the_pod_dropped_are_removed_by_name_but_the_mark() {
        let wanted = sp(&[("app", "web"), ("tier", "front")]);
        let held = sp(&[
            ("app", "db"),
            ("old", "x"),
            ("added-there", "y"),
            (labels::STATUS_REPORTED, "true"),
        ]);
        let labels = |h: &ShadowPod, w: &ShadowPod| dropped_metadata(h, w).0;
        assert_eq!(
            serde_json::to_value(labels(&held, &wanted)).unwrap(),
            serde_json::json!({"added-there": null, "old": null})
        );
        assert!(labels(&sp(&[("app", "web")]), &wanted).is_empty());
        let mut none_wanted = sp(&[]);
        none_wanted.metadata.labels = None;
        assert_eq!(labels(&held, &none_wanted).len(), 3);
    }

    #[test]
    fn annotations_are_compared_and_dropped_as_the_provider_holds_them() {
        let mut wanted = sp(&[]);
        wanted.metadata.annotations = Some(BTreeMap::from([
            (ORIGIN_UID.to_owned(), "u-1".to_owned()),
            ("team".to_owned(), "shop".to_owned()),
        ]));
        // The watched copy: what the provider holds, plus what the watch stashed on it.
        let mut held = wanted.clone();
        let a = held.annotations_mut();
        a.insert(watched::POD_SPEC_DIGEST.into(), "d".into());
        a.insert(watched::POD_STATUS.into(), "{}".into());
        assert_eq!(&held_annotations(&held), wanted.annotations());
        assert!(dropped_metadata(&held, &wanted).1.is_empty());

        held.annotations_mut().insert("old".into(), "x".into());
        assert_ne!(&held_annotations(&held), wanted.annotations());
        assert_eq!(
            serde_json::to_value(dropped_metadata(&held, &wanted).1).unwrap(),
            serde_json::json!({"old": null})
        );
    }

    #[test]
    fn the_mark_of_a_report_is_not_a_difference_in_labels() {
        let wanted = sp(&[("app", "web")]);
        assert!(same_labels(
            &sp(&[("app", "web"), (labels::STATUS_REPORTED, "true")]),
            &wanted
        ));
        assert!(same_labels(&sp(&[("app", "web")]), &wanted));
        assert!(!same_labels(
            &sp(&[("app", "db"), (labels::STATUS_REPORTED, "true")]),
            &wanted
        ));
        assert!(!same_labels(&sp(&[]), &wanted));
    }
}
