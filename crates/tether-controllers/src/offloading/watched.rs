//! Watched copies of what a provider holds in a namespace there (of ShadowPods, those it has
//! reported on; of Events, the Warnings: see [`config_for`]): one watch per provider,
//! namespace and kind, opened on first use with the tenant identity and kept while it is
//! used. Pod reflection and namespace reflection read these instead of asking the provider on
//! every pass, so an idle offloaded namespace costs the link between the clusters only its
//! open watches, whatever the number of pods. Every change of a ShadowPod is also announced
//! ([`Watched::subscribe`]), so a reflector acts on a provider's status as it arrives rather
//! than when it next looks.

use std::any::Any;
use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ObjectReference, PodStatus};
use k8s_openapi::api::events::v1::Event;
use kube::Resource;
use kube::api::{Api, ObjectMeta};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use serde::de::DeserializeOwned;
use tether_api::ClusterId;
use tether_api::names::labels;
use tether_api::offloading::ShadowPod;

use super::listed::{self, Listed};
use crate::Error;
use crate::providers::Access;

/// How long the first listing of a watch may take before the provider counts as unreachable.
const FIRST_LIST: Duration = Duration::from_secs(5);
/// A watch nobody read for this long is closed (its namespace was unoffloaded, its virtual
/// node removed).
const IDLE: Duration = Duration::from_secs(600);

/// A namespaced kind that can be watched into a store.
pub trait Watchable:
    Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
    + Clone
    + Debug
    + DeserializeOwned
    + Send
    + Sync
    + 'static
{
}

impl<K> Watchable for K where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + Debug
        + DeserializeOwned
        + Send
        + Sync
        + 'static
{
}

/// (provider, namespace, kind).
type Key = (String, String, &'static str);

struct Entry {
    /// The identity the watch was opened with ([`Access::version`]).
    version: String,
    /// A `Store<K>` for the entry's kind.
    store: Box<dyn Any + Send + Sync>,
    /// Whether the store has had its first listing.
    listed: Listed,
    last_used: Instant,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Entry {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// How many changes a slow subscriber may fall behind before it misses some (it then finds
/// them on its next periodic pass). Every slot is allocated up front and holds its last
/// change until overwritten, so this is memory the process keeps: a slot holds a pointer,
/// not the change. Only ShadowPod changes are sent, three or four per pod on its way to
/// Ready, so a burst of a thousand pods fits.
const CHANGES: usize = 4096;

/// One object a provider's watch saw change (applied or deleted).
#[derive(Clone, Debug)]
pub struct Change {
    /// The provider.
    pub provider: String,
    /// The object's namespace there.
    pub namespace: String,
    /// The object's name.
    pub name: String,
    /// The object's type (`std::any::type_name` of it: [`Change::is`] compares).
    pub kind: &'static str,
}

impl Change {
    /// Whether the changed object is a `K`.
    pub fn is<K>(&self) -> bool {
        self.kind == std::any::type_name::<K>()
    }
}

/// The open watches; dropping it closes them all (a leader's term ends).
pub struct Watched {
    entries: Mutex<HashMap<Key, Entry>>,
    changes: tokio::sync::broadcast::Sender<Arc<Change>>,
}

impl Default for Watched {
    fn default() -> Self {
        Self {
            entries: Mutex::default(),
            changes: tokio::sync::broadcast::channel(CHANGES).0,
        }
    }
}

/// On a watched ShadowPod only (it is never written back): the digest
/// ([`super::shadow_pods::whole_spec_digest`]) of the `spec.pod` the provider holds, which the
/// copy no longer carries.
pub const POD_SPEC_DIGEST: &str = "tether.dev/watched-pod-spec-digest";

/// On a watched ShadowPod only (it is never written back): the `status.pod` the provider
/// reported, as JSON text, which the copy no longer carries as a struct (see [`trim`]).
pub const POD_STATUS: &str = "tether.dev/watched-pod-status";

/// The pod status a ShadowPod carries, whether watched ([`POD_STATUS`]) or as written.
pub fn pod_status(sp: &ShadowPod) -> Option<PodStatus> {
    let status = sp.status.as_ref()?;
    status
        .pod
        .clone()
        .or_else(|| super::pods::unstash(&sp.metadata, POD_STATUS))
}

/// The digest of the pod spec a watched ShadowPod had at the provider.
pub fn pod_spec_digest(sp: &ShadowPod) -> Option<&str> {
    sp.metadata
        .annotations
        .as_ref()?
        .get(POD_SPEC_DIGEST)
        .map(String::as_str)
}

/// Drops from a watched object what no reader of the store uses: managed fields, the bulk of
/// any object; of a ShadowPod, its pod spec, which the pod reflector only compares with the
/// one it wants (the digest stands for it, see [`POD_SPEC_DIGEST`]), and the struct of its
/// pod status, kept as text instead ([`POD_STATUS`]: a deserialised status takes about twice
/// its JSON, and it is read only when its pod is reconciled); and of an Event (a burst leaves
/// several per pod in a twin), all but what [`super::reflect`] copies back and compares.
fn trim<K: Watchable>(o: &mut K) {
    o.meta_mut().managed_fields = None;
    let any: &mut dyn Any = o;
    if let Some(sp) = any.downcast_mut::<ShadowPod>() {
        let mut spec = std::mem::take(&mut sp.spec.pod);
        // A ShadowPod written before its defaults were left out compares equal to its new
        // form, so an upgraded consumer does not rewrite it (and restart the pod) for nothing.
        super::translate::drop_defaults(&mut spec);
        sp.metadata.annotations.get_or_insert_default().insert(
            POD_SPEC_DIGEST.to_owned(),
            super::shadow_pods::whole_spec_digest(&spec),
        );
        if let Some(status) = sp.status.as_mut()
            && let Some(pod) = status.pod.take()
        {
            status.pod = super::pods::stash(&mut sp.metadata, POD_STATUS, pod);
        }
        return;
    }
    let Some(e) = any.downcast_mut::<Event>() else {
        return;
    };
    let meta = std::mem::take(&mut e.metadata);
    e.metadata = ObjectMeta {
        name: meta.name,
        namespace: meta.namespace,
        resource_version: meta.resource_version,
        ..ObjectMeta::default()
    };
    e.regarding = e.regarding.take().map(|r| ObjectReference {
        kind: r.kind,
        name: r.name,
        uid: r.uid,
        ..ObjectReference::default()
    });
    e.related = None;
    e.reporting_controller = None;
    e.reporting_instance = None;
    e.deprecated_source = None;
    e.deprecated_first_timestamp = None;
    e.deprecated_last_timestamp = None;
    e.deprecated_count = None;
}

/// Only the provider's Warning Events come back ([`WARNINGS_ONLY`]).
pub const WARNINGS_ONLY: &str = "type=Warning";

/// How the watch of `kind` is opened.
///
/// Of the provider's Events only the Warnings are watched: the Normal ones of a starting pod
/// (its scheduling at the provider, the kubelet's pulled, created, started) repeat what the
/// pod's status already brings back, name the provider's nodes, and at four or so per pod
/// would be the largest share of a burst's traffic between the clusters. A Warning (a failed
/// mount, a crash loop, a failing probe) says what no status field does.
///
/// Of the ShadowPods only those the provider has reported on ([`labels::STATUS_REPORTED`]):
/// one just written would otherwise come straight back, whole, telling nothing the write did
/// not. A ShadowPod the watch does not show may therefore still exist: the pod reflector
/// trusts its own writes meanwhile and deletes without looking.
fn config_for(kind: &str) -> watcher::Config {
    let config = watcher::Config::default();
    if kind == std::any::type_name::<Event>() {
        config.fields(WARNINGS_ONLY)
    } else if kind == std::any::type_name::<ShadowPod>() {
        config.labels(labels::STATUS_REPORTED)
    } else {
        config
    }
}

impl Watched {
    /// The ShadowPod changes every watch sees from now on.
    pub fn subscribe(&self) -> tokio::sync::broadcast::Receiver<Arc<Change>> {
        self.changes.subscribe()
    }

    /// Every `K` in `ns` at `provider`, as the watch last saw them. Waits for the first
    /// listing of a new watch; an error means the provider did not answer it in time.
    pub async fn list<K: Watchable>(
        &self,
        provider: &ClusterId,
        access: &Access,
        ns: &str,
    ) -> Result<Vec<Arc<K>>, Error> {
        let (store, listed) = self.store::<K>(provider, access, ns);
        if listed.wait(FIRST_LIST).await {
            Ok(store.state())
        } else {
            Err(Error::Timeout(format!(
                "listing {} in {ns} at {provider}",
                K::plural(&())
            )))
        }
    }

    /// The `K` named `name` in `ns` at `provider`, as [`Watched::list`] sees it.
    pub async fn get<K: Watchable>(
        &self,
        provider: &ClusterId,
        access: &Access,
        ns: &str,
        name: &str,
    ) -> Result<Option<Arc<K>>, Error> {
        let (store, listed) = self.store::<K>(provider, access, ns);
        if listed.wait(FIRST_LIST).await {
            Ok(store.get(&reflector::ObjectRef::new(name).within(ns)))
        } else {
            Err(Error::Timeout(format!(
                "reading {} {ns}/{name} at {provider}",
                K::kind(&())
            )))
        }
    }

    fn store<K: Watchable>(
        &self,
        provider: &ClusterId,
        access: &Access,
        ns: &str,
    ) -> (Store<K>, Listed) {
        let kind: &'static str = std::any::type_name::<K>();
        let key = (provider.as_str().to_owned(), ns.to_owned(), kind);
        let now = Instant::now();
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        entries.retain(|_, e| now.duration_since(e.last_used) < IDLE);
        if let Some(e) = entries.get_mut(&key)
            && e.version == access.version
            && let Some(store) = e.store.downcast_ref::<Store<K>>()
        {
            e.last_used = now;
            return (store.clone(), e.listed.clone());
        }
        let (store, writer) = reflector::store::<K>();
        let (lister, listed) = listed::pair();
        let api: Api<K> = Api::namespaced(access.client.clone(), ns);
        // Managed fields are the bulk of a stored object and nothing here reads them.
        let stream = watcher(api, config_for(kind))
            .default_backoff()
            .modify(trim::<K>)
            .reflect(writer);
        let (p, n) = (provider.to_string(), ns.to_owned());
        let changes = self.changes.clone();
        let task = tokio::spawn(async move {
            futures::pin_mut!(stream);
            while let Some(event) = stream.next().await {
                lister.saw(&event);
                match event {
                    // Only ShadowPods are reacted to; a burst's Events, several per pod,
                    // would push their changes out of the channel.
                    Ok(watcher::Event::Apply(o) | watcher::Event::Delete(o))
                        if kind == std::any::type_name::<ShadowPod>() =>
                    {
                        // Nobody listening is fine: readers still find it in the store.
                        let _ = changes.send(Arc::new(Change {
                            provider: p.clone(),
                            namespace: n.clone(),
                            name: o.meta().name.clone().unwrap_or_default(),
                            kind,
                        }));
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(provider = %p, namespace = %n, kind, error = %e, "watching the provider failed; retrying");
                    }
                }
            }
        });
        // Replacing an entry drops (and so aborts) the watch opened with an older identity.
        entries.insert(
            key,
            Entry {
                version: access.version.clone(),
                store: Box::new(store.clone()),
                listed: listed.clone(),
                last_used: now,
                task,
            },
        );
        (store, listed)
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{Container, PodSpec};
    use tether_api::offloading::{ShadowPodSpec, ShadowPodStatus};

    use super::*;

    fn shadow_pod(image: &str) -> ShadowPod {
        ShadowPod {
            metadata: ObjectMeta {
                name: Some("web-0".into()),
                annotations: Some([("tether.dev/origin-uid".to_owned(), "u1".to_owned())].into()),
                ..ObjectMeta::default()
            },
            spec: ShadowPodSpec {
                consumer_cluster_id: "alpha".into(),
                pod: PodSpec {
                    containers: vec![Container {
                        name: "app".into(),
                        image: Some(image.into()),
                        ..Container::default()
                    }],
                    ..PodSpec::default()
                },
            },
            status: None,
        }
    }

    #[test]
    fn a_watched_shadow_pod_keeps_a_digest_of_its_pod_spec_instead_of_the_spec() {
        let mut v1 = shadow_pod("app:1");
        let spec = v1.spec.pod.clone();
        trim(&mut v1);
        assert_eq!(v1.spec.pod, PodSpec::default());
        assert_eq!(v1.spec.consumer_cluster_id, "alpha");
        assert_eq!(
            pod_spec_digest(&v1),
            Some(super::super::shadow_pods::whole_spec_digest(&spec).as_str())
        );
        // Other annotations stay.
        let annotations = v1.metadata.annotations.clone().unwrap_or_default();
        assert_eq!(
            annotations.get("tether.dev/origin-uid").map(String::as_str),
            Some("u1")
        );

        // An image is part of the spec: a changed one is a different digest.
        let mut v2 = shadow_pod("app:2");
        trim(&mut v2);
        assert_ne!(pod_spec_digest(&v1), pod_spec_digest(&v2));
        // One written with the defaults the provider adds anyway is the same spec.
        let mut defaulted = shadow_pod("app:1");
        defaulted.spec.pod.dns_policy = Some("ClusterFirst".into());
        defaulted.spec.pod.containers[0].termination_message_policy = Some("File".into());
        trim(&mut defaulted);
        assert_eq!(pod_spec_digest(&defaulted), pod_spec_digest(&v1));
        // An untrimmed ShadowPod has none (the reflector then writes it).
        assert_eq!(pod_spec_digest(&shadow_pod("app:1")), None);
    }

    #[test]
    fn a_watched_shadow_pod_keeps_its_pod_status_as_text_and_gives_it_back() {
        let status: PodStatus = serde_json::from_value(serde_json::json!({
            "phase": "Running",
            "podIP": "10.0.0.7",
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{
                "name": "app", "image": "app:1", "imageID": "", "ready": true,
                "restartCount": 2, "state": {"running": {"startedAt": "2026-11-28T05:00:00Z"}},
            }],
        }))
        .expect("status");
        let mut sp = shadow_pod("app:1");
        sp.status = Some(ShadowPodStatus {
            phase: Some("Running".into()),
            conditions: Vec::new(),
            pod: Some(status.clone()),
        });
        assert_eq!(pod_status(&sp).as_ref(), Some(&status), "as written");
        trim(&mut sp);
        let kept = sp.status.as_ref().expect("status");
        assert_eq!(kept.pod, None, "no struct kept");
        assert_eq!(kept.phase.as_deref(), Some("Running"));
        assert_eq!(pod_status(&sp), Some(status), "as watched");

        // No status yet: none, before and after.
        let mut fresh = shadow_pod("app:1");
        trim(&mut fresh);
        assert_eq!(pod_status(&fresh), None);
    }
}
