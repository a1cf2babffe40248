//! The object store: one global resourceVersion per cluster, per-type object maps, per-type
//! bounded event rings with previous objects, and a broadcast channel per type for watchers.
//!
//! Every write runs inside [`Store::transact`] under one lock, which gives a strict RV order,
//! atomic read-modify-write for the request pipeline, and events broadcast in RV order. Objects
//! are shared as `Arc<Value>`, so an event, the map entry and every watcher hold the same
//! allocation.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::Value;
use tokio::sync::broadcast;

/// Which stored type: API group and plural resource name (not the version: every served version
/// of a type shares one storage, as in the real server).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TypeKey {
    /// API group; empty for core.
    pub group: String,
    /// Plural resource name.
    pub resource: String,
}

impl TypeKey {
    /// Builds a key from borrowed parts.
    pub fn new(group: &str, resource: &str) -> Self {
        Self {
            group: group.to_owned(),
            resource: resource.to_owned(),
        }
    }
}

/// Where an object lives in its type's map: namespace (empty for cluster-scoped) and name.
pub type ObjKey = (String, String);

/// What happened to an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// The object was created.
    Added,
    /// The object changed.
    Modified,
    /// The object was removed; the event carries its last state with the deletion RV.
    Deleted,
}

impl EventType {
    /// The watch event `type` string.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One change to one object, as kept in the ring and broadcast to watchers.
#[derive(Debug)]
pub struct Event {
    /// The resourceVersion this change produced.
    pub rv: u64,
    /// What happened.
    pub kind: EventType,
    /// The object after the change (for `Deleted`: the last state, carrying `rv`).
    pub object: Arc<Value>,
    /// The object before the change; `None` for `Added`. Needed for selector transitions and
    /// to roll the store back to an older RV.
    pub prev: Option<Arc<Value>>,
}

/// A requested resourceVersion lies before the oldest event the ring still holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expired {
    /// The RV that was asked for.
    pub requested: u64,
    /// The oldest RV from which history is still complete.
    pub oldest: u64,
}

/// The start of a watch: what to replay, then the live channel.
#[derive(Debug)]
pub struct WatchStart {
    /// Current objects, for a watch that starts with a synthetic ADDED per object
    /// (resourceVersion unset or `0`, or `sendInitialEvents`). Empty otherwise.
    pub snapshot: Vec<Arc<Value>>,
    /// Ring events after the requested RV, in order.
    pub replay: Vec<Arc<Event>>,
    /// Live events with an RV above `rv`.
    pub rx: broadcast::Receiver<Arc<Event>>,
    /// The global RV at the moment of subscription: everything up to it is in `snapshot` or
    /// `replay`, everything after it arrives on `rx`.
    pub rv: u64,
}

/// One page of a list.
#[derive(Debug)]
pub struct Page {
    /// The RV of the snapshot the page was cut from.
    pub rv: u64,
    /// Matching objects in key order.
    pub items: Vec<Arc<Value>>,
    /// Key of the last item when more matching items follow.
    pub more_after: Option<ObjKey>,
    /// How many more matching items follow, when known.
    pub remaining: Option<u64>,
}

struct TypeStore {
    objects: BTreeMap<ObjKey, Arc<Value>>,
    history: VecDeque<Arc<Event>>,
    /// RV of the newest event evicted from the ring (or of a compaction): history after it is
    /// complete, so a watch or list at an RV >= this is served.
    compacted_to: u64,
    tx: broadcast::Sender<Arc<Event>>,
}

impl TypeStore {
    fn new(watch_buffer: usize) -> Self {
        let (tx, _) = broadcast::channel(watch_buffer);
        Self {
            objects: BTreeMap::new(),
            history: VecDeque::new(),
            compacted_to: 0,
            tx,
        }
    }
}

struct Inner {
    rv: u64,
    types: HashMap<TypeKey, TypeStore>,
    capacity: usize,
    watch_buffer: usize,
}

impl Inner {
    fn type_mut(&mut self, key: &TypeKey) -> &mut TypeStore {
        let buffer = self.watch_buffer;
        self.types
            .entry(key.clone())
            .or_insert_with(|| TypeStore::new(buffer))
    }
}

/// Tuning for a store.
#[derive(Debug, Clone, Copy)]
pub struct StoreConfig {
    /// Events kept per type; older resume points get 410.
    pub history: usize,
    /// Events a watcher may fall behind before it is cut off.
    pub watch_buffer: usize,
    /// The first RV handed out is `rv_offset + 1`; clusters use different offsets so RVs from
    /// one cluster are meaningless in another.
    pub rv_offset: u64,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            history: 4096,
            watch_buffer: 4096,
            rv_offset: 0,
        }
    }
}

/// The store of one simulated cluster.
pub struct Store {
    inner: Mutex<Inner>,
    /// Mirror of `Inner::rv`, published after the broadcast of the write that produced it, so a
    /// watcher that reads it and then drains its channel has seen every event up to it.
    published_rv: AtomicU64,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("rv", &self.current_rv())
            .finish_non_exhaustive()
    }
}

/// Namespace and name of an object, from its metadata.
pub fn obj_key(obj: &Value) -> ObjKey {
    let meta = &obj["metadata"];
    (
        meta["namespace"].as_str().unwrap_or_default().to_owned(),
        meta["name"].as_str().unwrap_or_default().to_owned(),
    )
}

/// The numeric resourceVersion of a stored object (0 when absent or not numeric).
pub fn object_rv(obj: &Value) -> u64 {
    obj["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

fn set_rv(obj: &mut Value, rv: u64) {
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.insert("resourceVersion".into(), Value::String(rv.to_string()));
    }
}

/// Whether two objects are the same write, ignoring resourceVersion and managedFields
/// timestamps (the real server skips such no-op writes: no RV bump, no event).
fn same_object(old: &Value, new: &Value) -> bool {
    let (Some(o), Some(n)) = (old.as_object(), new.as_object()) else {
        return old == new;
    };
    if o.len() != n.len() {
        return false;
    }
    for (k, ov) in o {
        let Some(nv) = n.get(k) else { return false };
        if k == "metadata" {
            let (Some(om), Some(nm)) = (ov.as_object(), nv.as_object()) else {
                if ov != nv {
                    return false;
                }
                continue;
            };
            let skip = |key: &str| key == "resourceVersion";
            let ok = om
                .iter()
                .filter(|(k, _)| !skip(k))
                .all(|(k, v)| nm.get(k).is_some_and(|nv| meta_field_eq(k, v, nv)))
                && nm.keys().filter(|k| !skip(k)).count() == om.keys().filter(|k| !skip(k)).count();
            if !ok {
                return false;
            }
        } else if ov != nv {
            return false;
        }
    }
    true
}

fn meta_field_eq(key: &str, a: &Value, b: &Value) -> bool {
    if key != "managedFields" {
        return a == b;
    }
    let strip = |v: &Value| -> Value {
        let mut v = v.clone();
        if let Some(list) = v.as_array_mut() {
            for entry in list {
                if let Some(m) = entry.as_object_mut() {
                    m.remove("time");
                }
            }
        }
        v
    };
    a == b || strip(a) == strip(b)
}

impl Store {
    /// An empty store.
    pub fn new(config: StoreConfig) -> Self {
        Self {
            inner: Mutex::new(Inner {
                rv: config.rv_offset,
                types: HashMap::new(),
                capacity: config.history.max(1),
                watch_buffer: config.watch_buffer.max(16),
            }),
            published_rv: AtomicU64::new(config.rv_offset),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves consistent data (every mutation is a single
        // map insert plus a ring push), so a poisoned lock is still usable.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The newest resourceVersion whose events have been broadcast.
    pub fn current_rv(&self) -> u64 {
        self.published_rv.load(Ordering::Acquire)
    }

    /// Runs `f` with exclusive access; every write inside is persisted and broadcast in order.
    pub fn transact<R>(&self, f: impl FnOnce(&mut Txn<'_>) -> R) -> R {
        let mut inner = self.lock();
        let mut txn = Txn { inner: &mut inner };
        let out = f(&mut txn);
        let rv = inner.rv;
        self.published_rv.store(rv, Ordering::Release);
        out
    }

    /// One object, if present.
    pub fn get(&self, key: &TypeKey, ns: &str, name: &str) -> Option<Arc<Value>> {
        let inner = self.lock();
        inner
            .types
            .get(key)?
            .objects
            .get(&(ns.to_owned(), name.to_owned()))
            .cloned()
    }

    /// The RV of the newest write to a type (0 if never written): a cheap change detector for
    /// caches derived from a type's objects.
    pub fn type_version(&self, key: &TypeKey) -> u64 {
        let inner = self.lock();
        inner
            .types
            .get(key)
            .map_or(0, |t| t.history.back().map_or(t.compacted_to, |e| e.rv))
    }

    /// Every object of a type, in key order.
    pub fn all(&self, key: &TypeKey) -> Vec<Arc<Value>> {
        self.lock()
            .types
            .get(key)
            .map(|t| t.objects.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Number of objects of a type (all namespaces).
    pub fn count(&self, key: &TypeKey) -> usize {
        self.lock().types.get(key).map_or(0, |t| t.objects.len())
    }

    /// A page of objects of a type, optionally in one namespace, as of `at` (None = now), after
    /// the key `after`, at most `limit` (0 = all) of those accepted by `filter`. An `at` older
    /// than the ring's history yields [`Expired`].
    pub fn list(
        &self,
        key: &TypeKey,
        ns: Option<&str>,
        at: Option<u64>,
        after: Option<&ObjKey>,
        limit: usize,
        filter: &dyn Fn(&Value) -> bool,
    ) -> Result<Page, Expired> {
        let inner = self.lock();
        let current = inner.rv;
        let Some(ts) = inner.types.get(key) else {
            // A type never written has a complete, empty history.
            return Ok(Page {
                rv: at.unwrap_or(current),
                items: Vec::new(),
                more_after: None,
                remaining: None,
            });
        };
        let at = at.unwrap_or(current);
        let in_range =
            |k: &ObjKey| -> bool { ns.is_none_or(|n| k.0 == n) && after.is_none_or(|a| k > a) };
        let start: std::ops::Bound<ObjKey> = match (after, ns) {
            (Some(a), _) => std::ops::Bound::Excluded(a.clone()),
            (None, Some(n)) => std::ops::Bound::Included((n.to_owned(), String::new())),
            (None, None) => std::ops::Bound::Unbounded,
        };
        let mut items = Vec::new();
        let mut more_after = None;
        let mut remaining = 0u64;
        if at >= current {
            for (k, obj) in ts.objects.range((start, std::ops::Bound::Unbounded)) {
                if let Some(n) = ns
                    && k.0 != n
                {
                    break;
                }
                if !filter(obj) {
                    continue;
                }
                if limit > 0 && items.len() >= limit {
                    remaining += 1;
                    continue;
                }
                items.push(obj.clone());
                if limit > 0 && items.len() == limit {
                    more_after = Some(k.clone());
                }
            }
            if remaining == 0 {
                more_after = None;
            }
            return Ok(Page {
                rv: current,
                items,
                more_after,
                remaining: (remaining > 0).then_some(remaining),
            });
        }
        if at < ts.compacted_to {
            return Err(Expired {
                requested: at,
                oldest: ts.compacted_to,
            });
        }
        // Roll back: for every event after `at`, newest first, the object at `at` is the
        // event's `prev` (the oldest such event wins because it is applied last).
        let mut overrides: BTreeMap<ObjKey, Option<Arc<Value>>> = BTreeMap::new();
        for ev in ts.history.iter().rev().take_while(|e| e.rv > at) {
            let k = obj_key(&ev.object);
            if in_range(&k) {
                overrides.insert(k, ev.prev.clone());
            }
        }
        let mut merged: BTreeMap<ObjKey, Arc<Value>> = BTreeMap::new();
        for (k, obj) in ts.objects.range((start, std::ops::Bound::Unbounded)) {
            if let Some(n) = ns
                && k.0 != n
            {
                break;
            }
            merged.insert(k.clone(), obj.clone());
        }
        for (k, v) in overrides {
            match v {
                Some(obj) => merged.insert(k, obj),
                None => merged.remove(&k),
            };
        }
        for (k, obj) in merged {
            if !filter(&obj) {
                continue;
            }
            if limit > 0 && items.len() >= limit {
                remaining += 1;
                continue;
            }
            items.push(obj);
            if limit > 0 && items.len() == limit {
                more_after = Some(k);
            }
        }
        if remaining == 0 {
            more_after = None;
        }
        Ok(Page {
            rv: at,
            items,
            more_after,
            remaining: (remaining > 0).then_some(remaining),
        })
    }

    /// Starts a watch. `since = None` starts with a snapshot of current objects (synthetic
    /// ADDED); `Some(rv)` replays ring events after `rv`, or fails with [`Expired`].
    pub fn watch(&self, key: &TypeKey, since: Option<u64>) -> Result<WatchStart, Expired> {
        let mut inner = self.lock();
        let current = inner.rv;
        let ts = inner.type_mut(key);
        // Subscribing under the same lock as reading the state: no gap, no duplicate.
        let rx = ts.tx.subscribe();
        match since {
            None => Ok(WatchStart {
                snapshot: ts.objects.values().cloned().collect(),
                replay: Vec::new(),
                rx,
                rv: current,
            }),
            Some(from) => {
                if from < ts.compacted_to {
                    return Err(Expired {
                        requested: from,
                        oldest: ts.compacted_to,
                    });
                }
                let first = ts.history.partition_point(|e| e.rv <= from);
                let replay = ts.history.range(first..).cloned().collect();
                Ok(WatchStart {
                    snapshot: Vec::new(),
                    replay,
                    rx,
                    rv: current,
                })
            }
        }
    }

    /// Drops all event history: every resume point before now gets 410.
    pub fn compact(&self) {
        let mut inner = self.lock();
        let rv = inner.rv;
        for ts in inner.types.values_mut() {
            ts.history.clear();
            ts.compacted_to = rv;
        }
    }

    /// Forgets every object and all history, as a server that lost its storage. The RV counter
    /// keeps counting, so every old resume point gets 410 and clients re-list.
    pub fn reset(&self) {
        let mut inner = self.lock();
        // One step past every RV handed out so far: a watcher resuming from the very last RV
        // (bookmarks keep it current) must get 410 too, or it would keep objects that are gone.
        inner.rv += 1;
        let rv = inner.rv;
        for ts in inner.types.values_mut() {
            ts.objects.clear();
            ts.history.clear();
            ts.compacted_to = rv;
        }
    }

    /// Sets the per-type ring capacity (existing rings shrink on their next write).
    pub fn set_history(&self, capacity: usize) {
        self.lock().capacity = capacity.max(1);
    }

    /// Every type key that has ever been written.
    pub fn type_keys(&self) -> Vec<TypeKey> {
        self.lock().types.keys().cloned().collect()
    }
}

/// Exclusive access to the store during [`Store::transact`].
pub struct Txn<'a> {
    inner: &'a mut Inner,
}

impl Txn<'_> {
    /// The current global RV.
    pub fn rv(&self) -> u64 {
        self.inner.rv
    }

    /// One object, if present.
    pub fn get(&self, key: &TypeKey, ns: &str, name: &str) -> Option<Arc<Value>> {
        self.inner
            .types
            .get(key)?
            .objects
            .get(&(ns.to_owned(), name.to_owned()))
            .cloned()
    }

    /// All objects of a type in a namespace (or everywhere with `None`), in key order.
    pub fn list(&self, key: &TypeKey, ns: Option<&str>) -> Vec<Arc<Value>> {
        let Some(ts) = self.inner.types.get(key) else {
            return Vec::new();
        };
        ts.objects
            .iter()
            .filter(|(k, _)| ns.is_none_or(|n| k.0 == n))
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// Whether any object of a type lives in the namespace.
    pub fn any_in_namespace(&self, key: &TypeKey, ns: &str) -> bool {
        self.inner.types.get(key).is_some_and(|ts| {
            ts.objects
                .range((ns.to_owned(), String::new())..)
                .next()
                .is_some_and(|(k, _)| k.0 == ns)
        })
    }

    /// Stores `obj` (created or replacing the object with the same namespace/name), assigns the
    /// next RV and emits ADDED or MODIFIED. If it equals the stored object apart from
    /// resourceVersion, nothing happens and the stored object is returned.
    pub fn put(&mut self, key: &TypeKey, mut obj: Value) -> Arc<Value> {
        let k = obj_key(&obj);
        let prev = self.get(key, &k.0, &k.1);
        if let Some(prev) = &prev
            && same_object(prev, &obj)
        {
            return prev.clone();
        }
        self.inner.rv += 1;
        let rv = self.inner.rv;
        set_rv(&mut obj, rv);
        let obj = Arc::new(obj);
        let kind = if prev.is_some() {
            EventType::Modified
        } else {
            EventType::Added
        };
        let capacity = self.inner.capacity;
        let ts = self.inner.type_mut(key);
        ts.objects.insert(k, obj.clone());
        push_event(
            ts,
            capacity,
            Event {
                rv,
                kind,
                object: obj.clone(),
                prev,
            },
        );
        obj
    }

    /// Removes the object `last` names, emitting one DELETED event whose object is `last` (a
    /// final state the write that finished the deletion produced, e.g. its finalizers emptied)
    /// at the new RV. Returns that state, or `None` when nothing was stored under the key.
    pub fn remove_as(&mut self, key: &TypeKey, mut last: Value) -> Option<Arc<Value>> {
        let k = obj_key(&last);
        let capacity = self.inner.capacity;
        let ts = self.inner.types.get_mut(key)?;
        let prev = ts.objects.remove(&k)?;
        self.inner.rv += 1;
        let rv = self.inner.rv;
        set_rv(&mut last, rv);
        let last = Arc::new(last);
        let ts = self.inner.type_mut(key);
        push_event(
            ts,
            capacity,
            Event {
                rv,
                kind: EventType::Deleted,
                object: last.clone(),
                prev: Some(prev),
            },
        );
        Some(last)
    }

    /// Removes an object, emitting DELETED with its last state at the new RV. Returns that
    /// last state.
    pub fn remove(&mut self, key: &TypeKey, ns: &str, name: &str) -> Option<Arc<Value>> {
        let capacity = self.inner.capacity;
        let ts = self.inner.types.get_mut(key)?;
        let prev = ts.objects.remove(&(ns.to_owned(), name.to_owned()))?;
        self.inner.rv += 1;
        let rv = self.inner.rv;
        let mut last = (*prev).clone();
        set_rv(&mut last, rv);
        let last = Arc::new(last);
        let ts = self.inner.type_mut(key);
        push_event(
            ts,
            capacity,
            Event {
                rv,
                kind: EventType::Deleted,
                object: last.clone(),
                prev: Some(prev),
            },
        );
        Some(last)
    }
}

fn push_event(ts: &mut TypeStore, capacity: usize, event: Event) {
    let event = Arc::new(event);
    while ts.history.len() >= capacity {
        if let Some(old) = ts.history.pop_front() {
            ts.compacted_to = old.rv;
        }
    }
    ts.history.push_back(event.clone());
    // No receivers is fine: nobody watches this type right now.
    let _ = ts.tx.send(event);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cm(ns: &str, name: &str, v: &str) -> Value {
        json!({"apiVersion":"v1","kind":"ConfigMap","metadata":{"namespace":ns,"name":name},"data":{"k":v}})
    }

    fn key() -> TypeKey {
        TypeKey::new("", "configmaps")
    }

    fn all(_: &Value) -> bool {
        true
    }

    #[test]
    fn rv_is_global_and_monotonic_across_types() {
        let s = Store::new(StoreConfig {
            rv_offset: 100,
            ..Default::default()
        });
        let a = s.transact(|t| t.put(&key(), cm("d", "a", "1")));
        let b = s.transact(|t| t.put(&TypeKey::new("", "secrets"), cm("d", "a", "1")));
        assert_eq!(object_rv(&a), 101);
        assert_eq!(object_rv(&b), 102);
        assert_eq!(s.current_rv(), 102);
    }

    #[test]
    fn noop_update_keeps_rv_and_emits_nothing() {
        let s = Store::new(StoreConfig::default());
        let a = s.transact(|t| t.put(&key(), cm("d", "a", "1")));
        let w = s.watch(&key(), Some(object_rv(&a))).expect("watch");
        let mut again = cm("d", "a", "1");
        again["metadata"]["resourceVersion"] = json!("999");
        let b = s.transact(|t| t.put(&key(), again));
        assert_eq!(object_rv(&b), object_rv(&a));
        let mut rx = w.rx;
        assert!(rx.try_recv().is_err(), "no event for a no-op write");
    }

    #[test]
    fn list_at_older_rv_rolls_back_and_expires_after_eviction() {
        let s = Store::new(StoreConfig {
            history: 3,
            ..Default::default()
        });
        s.transact(|t| t.put(&key(), cm("d", "a", "1")));
        let at = s.transact(|t| object_rv(&t.put(&key(), cm("d", "b", "1"))));
        s.transact(|t| t.put(&key(), cm("d", "a", "2")));
        s.transact(|t| t.remove(&key(), "d", "b"));
        s.transact(|t| t.put(&key(), cm("d", "c", "1")));
        let page = s
            .list(&key(), Some("d"), Some(at), None, 0, &all)
            .expect("in history");
        let names: Vec<_> = page.items.iter().map(|o| obj_key(o).1).collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(page.items[0]["data"]["k"], "1", "a as it was at the old RV");
        s.transact(|t| t.put(&key(), cm("d", "e", "1")));
        let err = s
            .list(&key(), Some("d"), Some(at), None, 0, &all)
            .expect_err("evicted");
        assert_eq!(err.requested, at);
    }

    #[test]
    fn paging_with_limit_and_remaining_count() {
        let s = Store::new(StoreConfig::default());
        for n in ["a", "b", "c"] {
            s.transact(|t| t.put(&key(), cm("d", n, "1")));
        }
        s.transact(|t| t.put(&key(), cm("e", "z", "1")));
        let p1 = s
            .list(&key(), Some("d"), None, None, 2, &all)
            .expect("page");
        assert_eq!(p1.items.len(), 2);
        assert_eq!(p1.remaining, Some(1));
        let after = p1.more_after.expect("more");
        let p2 = s
            .list(&key(), Some("d"), Some(p1.rv), Some(&after), 2, &all)
            .expect("page");
        assert_eq!(p2.items.len(), 1);
        assert!(p2.more_after.is_none());
    }

    #[test]
    fn watch_replays_after_rv_and_rejects_compacted() {
        let s = Store::new(StoreConfig::default());
        let a = s.transact(|t| object_rv(&t.put(&key(), cm("d", "a", "1"))));
        s.transact(|t| t.put(&key(), cm("d", "a", "2")));
        s.transact(|t| t.remove(&key(), "d", "a"));
        let w = s.watch(&key(), Some(a)).expect("in history");
        let kinds: Vec<_> = w.replay.iter().map(|e| e.kind).collect();
        assert_eq!(kinds, [EventType::Modified, EventType::Deleted]);
        assert_eq!(
            object_rv(&w.replay[1].object),
            w.replay[1].rv,
            "DELETED carries its RV"
        );
        s.compact();
        assert!(s.watch(&key(), Some(a)).is_err());
        assert!(
            s.watch(&key(), Some(s.current_rv())).is_ok(),
            "watch at the boundary"
        );
    }

    #[test]
    fn live_events_follow_the_subscription_without_gap() {
        let s = Store::new(StoreConfig::default());
        let w = s.watch(&key(), None).expect("watch");
        s.transact(|t| t.put(&key(), cm("d", "a", "1")));
        let mut rx = w.rx;
        let ev = rx.try_recv().expect("live event");
        assert_eq!(ev.kind, EventType::Added);
        assert!(ev.rv > w.rv);
    }

    proptest::proptest! {
        /// Any RV still in history lists exactly what a model of the writes held at that RV,
        /// and a watch from it replays exactly the later writes.
        #[test]
        fn list_and_watch_at_any_retained_rv_match_a_model(
            ops in proptest::collection::vec((0u8..3, 0u8..6, 0u8..4), 1..60),
            history in 1usize..40,
        ) {
            let s = Store::new(StoreConfig { history, ..Default::default() });
            let k = key();
            let mut model: BTreeMap<String, String> = BTreeMap::new();
            let mut snapshots: Vec<(u64, BTreeMap<String, String>)> = vec![(0, BTreeMap::new())];
            for (op, name, val) in ops {
                let name = format!("o{name}");
                let changed = s.transact(|t| match op {
                    0 | 1 => {
                        let before = t.rv();
                        t.put(&k, cm("d", &name, &val.to_string()));
                        t.rv() != before
                    }
                    _ => t.remove(&k, "d", &name).is_some(),
                });
                if changed {
                    if op < 2 { model.insert(name, val.to_string()); } else { model.remove(&name); }
                    snapshots.push((s.current_rv(), model.clone()));
                }
            }
            for (rv, want) in &snapshots {
                match s.list(&k, Some("d"), Some(*rv), None, 0, &all) {
                    Ok(page) => {
                        let got: BTreeMap<String, String> = page
                            .items
                            .iter()
                            .map(|o| (obj_key(o).1, o["data"]["k"].as_str().unwrap_or_default().to_owned()))
                            .collect();
                        proptest::prop_assert_eq!(&got, want, "list at {}", rv);
                        let w = s.watch(&k, Some(*rv)).expect("retained for lists is retained for watches");
                        let later = snapshots.iter().filter(|(r, _)| r > rv).count();
                        proptest::prop_assert_eq!(w.replay.len(), later);
                    }
                    Err(e) => proptest::prop_assert!(e.requested < e.oldest),
                }
            }
        }
    }
}
