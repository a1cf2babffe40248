//! Watched copies of this cluster's own objects that offloading reads on every pass (its
//! NamespaceOffloadings, networking Configurations, Tenants, ResourceSlices, Namespaces):
//! one watch per kind, opened on first use and kept for the leader's term, so reflecting a
//! burst of pods reads memory rather than asking the API server the same thing per pod.

use std::any::Any;
use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use kube::Resource;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use serde::de::DeserializeOwned;

use super::listed::{self, Listed};
use crate::Error;

/// How long the first listing of a kind may take before a read fails.
const FIRST_LIST: Duration = Duration::from_secs(10);

/// A kind this cluster's stores can hold.
pub trait Cached:
    Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static
{
}

impl<K> Cached for K where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static
{
}

struct Entry {
    /// A `Store<K>` for the entry's kind.
    store: Box<dyn Any + Send + Sync>,
    /// Whether the store has had its first listing.
    listed: Listed,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Entry {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The store key of `name`, in namespace `ns` for a namespaced kind.
fn key<K: Cached>(ns: Option<&str>, name: &str) -> ObjectRef<K> {
    match ns {
        Some(ns) => ObjectRef::new(name).within(ns),
        None => ObjectRef::new(name),
    }
}

/// The open watches of this cluster; dropping it closes them (a leader's term ends).
pub struct Local {
    client: kube::Client,
    entries: Mutex<HashMap<&'static str, Entry>>,
}

impl Local {
    /// No watch open yet.
    pub fn new(client: kube::Client) -> Self {
        Self {
            client,
            entries: Mutex::new(HashMap::new()),
        }
    }

    /// Every `K` of the cluster as the watch last saw it, once it listed them.
    pub async fn list<K: Cached>(&self) -> Result<Vec<Arc<K>>, Error> {
        let store = self.ready::<K>().await?;
        Ok(store.state())
    }

    /// The `K` named `name` (in namespace `ns` for a namespaced kind), as the watch last saw
    /// it. A miss can be an object created a moment ago: callers that must not act on a miss
    /// ask the API server.
    pub async fn get<K: Cached>(
        &self,
        ns: Option<&str>,
        name: &str,
    ) -> Result<Option<Arc<K>>, Error> {
        let store = self.ready::<K>().await?;
        Ok(store.get(&key(ns, name)))
    }

    /// Like [`Local::get`], but without waiting for the first listing: `None` also while the
    /// watch has not listed yet, for callers that must answer at once (and ask the API server
    /// on a miss).
    pub async fn get_if_listed<K: Cached>(&self, ns: Option<&str>, name: &str) -> Option<Arc<K>> {
        let (store, listed) = self.store::<K>();
        if !listed.wait(Duration::ZERO).await {
            return None;
        }
        store.get(&key(ns, name))
    }

    async fn ready<K: Cached>(&self) -> Result<Store<K>, Error> {
        let (store, listed) = self.store::<K>();
        if listed.wait(FIRST_LIST).await {
            Ok(store)
        } else {
            Err(Error::Timeout(format!(
                "listing {} of this cluster",
                K::plural(&())
            )))
        }
    }

    fn store<K: Cached>(&self) -> (Store<K>, Listed) {
        let kind: &'static str = std::any::type_name::<K>();
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((store, listed)) = entries.get(kind).and_then(|e| {
            e.store
                .downcast_ref::<Store<K>>()
                .map(|s| (s.clone(), e.listed.clone()))
        }) {
            return (store, listed);
        }
        let (store, writer) = reflector::store::<K>();
        let (lister, listed) = listed::pair();
        // Managed fields are the bulk of a stored object and nothing here reads them.
        let stream = watcher(
            Api::<K>::all(self.client.clone()),
            watcher::Config::default(),
        )
        .default_backoff()
        .modify(|o: &mut K| o.meta_mut().managed_fields = None)
        .reflect(writer);
        let task = tokio::spawn(async move {
            futures::pin_mut!(stream);
            while let Some(event) = stream.next().await {
                lister.saw(&event);
                if let Err(e) = event {
                    tracing::warn!(kind, error = %e, "watching this cluster failed; retrying");
                }
            }
        });
        entries.insert(
            kind,
            Entry {
                store: Box::new(store.clone()),
                listed: listed.clone(),
                task,
            },
        );
        (store, listed)
    }
}
