//! Garbage collector: cascades deletion through `metadata.ownerReferences` the way
//! kube-controller-manager's garbage collector does.
//!
//! Rules (mirroring the real collector):
//! - An owner reference is resolved by the owner's group and kind, its name, and the dependent's
//!   namespace (a namespaced owner must live in the dependent's namespace; owner references carry
//!   no namespace). The owner is *present* only if the object found there has the referenced
//!   uid, so a re-created owner with the same name does not keep old dependents alive.
//! - A namespaced dependent whose owner uid lives in another namespace therefore has an absent
//!   owner (a warning event `OwnerRefInvalidNamespace` is recorded on it) and is collected once
//!   all its owners are absent.
//! - A cluster-scoped dependent that names a namespaced owner kind is invalid: it is never
//!   collected (warning event `OwnerRefInvalidNamespace`), as in Kubernetes 1.20+.
//! - Owner references to kinds the server does not serve are left alone (the real collector
//!   retries them forever and never deletes).
//! - Background: when every owner is absent the dependent is deleted.
//! - Foreground: an owner being deleted with the `foregroundDeletion` finalizer gets its
//!   dependents deleted; once no dependent with `blockOwnerDeletion: true` remains, the
//!   finalizer is removed and the server deletes the owner.
//! - Orphan: an owner being deleted with the `orphan` finalizer has its reference removed from
//!   every dependent, then the finalizer is removed.
//! - A dependent with some present owners only loses its references to absent owners and to
//!   owners waiting in foreground deletion.
//! - Events are ignored, as the real collector ignores them.
//!
//! The graph comes from one metadata watch per served type. Decisions are taken by the pure
//! [`Graph::plan`]; before acting, each decision is re-taken on live objects read from the
//! server (watch streams of different types lag each other, exactly the race the real
//! collector's "virtual node" verification guards against).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams, Preconditions};
use kube::core::PartialObjectMeta;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::{Pace, ServedResource, discover, is_status, pause};

/// Finalizer that asks for foreground cascading deletion.
pub const FOREGROUND_FINALIZER: &str = "foregroundDeletion";
/// Finalizer that asks for dependents to be orphaned.
pub const ORPHAN_FINALIZER: &str = "orphan";

/// How often the whole graph is re-planned even without events (retries failed actions).
const RESYNC: Duration = Duration::from_secs(2);
/// How often discovery is refreshed without a CRD change.
const DISCOVERY_REFRESH: Duration = Duration::from_secs(30);
/// Events arriving within this window are planned together.
const DEBOUNCE: Duration = Duration::from_millis(20);

/// Identifies an object by group, kind, namespace and name (versions do not matter for
/// identity).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    /// API group, empty for the core group.
    pub group: String,
    /// Kind, e.g. `ConfigMap`.
    pub kind: String,
    /// Namespace, `None` for cluster-scoped objects.
    pub namespace: Option<String>,
    /// Name.
    pub name: String,
}

/// One entry of `metadata.ownerReferences`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerRef {
    /// `apiVersion` of the owner, e.g. `apps/v1`.
    pub api_version: String,
    /// Kind of the owner.
    pub kind: String,
    /// Name of the owner.
    pub name: String,
    /// uid of the owner.
    pub uid: String,
    /// `blockOwnerDeletion`.
    pub block_owner_deletion: bool,
}

impl OwnerRef {
    /// The owner's API group.
    pub fn group(&self) -> &str {
        self.api_version
            .rsplit_once('/')
            .map_or("", |(group, _version)| group)
    }
}

/// The metadata the collector needs about one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// Where the object is.
    pub key: ObjectKey,
    /// `metadata.uid`.
    pub uid: String,
    /// `metadata.ownerReferences`.
    pub owners: Vec<OwnerRef>,
    /// `metadata.finalizers`.
    pub finalizers: Vec<String>,
    /// Whether `metadata.deletionTimestamp` is set.
    pub deleting: bool,
}

impl Node {
    fn has_finalizer(&self, finalizer: &str) -> bool {
        self.finalizers.iter().any(|f| f == finalizer)
    }

    fn deleting_dependents(&self) -> bool {
        self.deleting && self.has_finalizer(FOREGROUND_FINALIZER)
    }
}

/// `propagationPolicy` of a delete the collector issues.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Propagation {
    /// Delete now, dependents later.
    Background,
    /// Delete dependents first.
    Foreground,
    /// Keep dependents.
    Orphan,
}

/// One step the collector takes. Every step names the uid it was decided for, and is applied
/// only to that incarnation of the object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Delete the object.
    Delete {
        /// The object.
        object: ObjectKey,
        /// Its uid (a delete precondition).
        uid: String,
        /// The propagation policy to delete with.
        propagation: Propagation,
    },
    /// Drop the owner references with these uids from the object.
    RemoveOwnerReferences {
        /// The object.
        object: ObjectKey,
        /// Its uid.
        uid: String,
        /// Owner uids to drop.
        owner_uids: Vec<String>,
    },
    /// Remove a finalizer that the collector is responsible for.
    RemoveFinalizer {
        /// The object.
        object: ObjectKey,
        /// Its uid.
        uid: String,
        /// `foregroundDeletion` or `orphan`.
        finalizer: &'static str,
    },
    /// Record a warning event: the owner reference can never resolve.
    InvalidOwnerReference {
        /// The dependent.
        object: ObjectKey,
        /// Its uid.
        uid: String,
        /// The reference.
        owner: OwnerRef,
        /// The event message.
        message: String,
    },
}

/// How the server scopes a kind: `Some(true)` namespaced, `Some(false)` cluster-scoped, `None`
/// not served.
pub trait KindScopes {
    /// Looks up a kind by group and kind.
    fn namespaced(&self, group: &str, kind: &str) -> Option<bool>;
}

impl KindScopes for HashMap<(String, String), bool> {
    fn namespaced(&self, group: &str, kind: &str) -> Option<bool> {
        self.get(&(group.to_owned(), kind.to_owned())).copied()
    }
}

/// How one owner reference resolves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OwnerState {
    /// The owner exists and is not waiting for its dependents.
    Solid,
    /// The owner is being deleted in the foreground.
    Waiting,
    /// The owner does not exist (or has another uid, or lives elsewhere).
    Dangling,
    /// The owner kind is not served: leave the dependent alone.
    Unresolvable,
}

/// A snapshot of every object the collector knows about.
#[derive(Debug, Default, Clone)]
pub struct Graph {
    nodes: BTreeMap<ObjectKey, Node>,
    by_uid: HashMap<String, ObjectKey>,
    dependents: HashMap<String, Vec<ObjectKey>>,
}

impl Graph {
    /// Builds the graph from object metadata.
    pub fn new(nodes: impl IntoIterator<Item = Node>) -> Self {
        let mut graph = Graph::default();
        for node in nodes {
            graph.by_uid.insert(node.uid.clone(), node.key.clone());
            for owner in &node.owners {
                graph
                    .dependents
                    .entry(owner.uid.clone())
                    .or_default()
                    .push(node.key.clone());
            }
            graph.nodes.insert(node.key.clone(), node);
        }
        graph
    }

    /// The object at `key`, if known.
    pub fn get(&self, key: &ObjectKey) -> Option<&Node> {
        self.nodes.get(key)
    }

    /// Every action the collector should take now, in a stable order.
    pub fn plan(&self, scopes: &dyn KindScopes) -> Vec<Action> {
        self.nodes
            .keys()
            .flat_map(|key| self.decide(key, scopes))
            .collect()
    }

    /// The actions concerning one object (as owner being deleted, and as dependent).
    pub fn decide(&self, key: &ObjectKey, scopes: &dyn KindScopes) -> Vec<Action> {
        let Some(node) = self.nodes.get(key) else {
            return Vec::new();
        };
        let mut actions = Vec::new();
        if node.deleting {
            self.decide_deleting_owner(node, scopes, &mut actions);
            // An object being deleted is left alone as a dependent, unless it is itself
            // deleting its dependents (then only its own finalizer matters, handled above).
            return actions;
        }
        self.decide_dependent(node, scopes, &mut actions);
        actions
    }

    fn decide_deleting_owner(&self, owner: &Node, scopes: &dyn KindScopes, out: &mut Vec<Action>) {
        let dependents = self.valid_dependents(owner, scopes);
        if owner.has_finalizer(ORPHAN_FINALIZER) {
            if dependents.is_empty() {
                out.push(Action::RemoveFinalizer {
                    object: owner.key.clone(),
                    uid: owner.uid.clone(),
                    finalizer: ORPHAN_FINALIZER,
                });
            }
            for dependent in dependents {
                out.push(Action::RemoveOwnerReferences {
                    object: dependent.key.clone(),
                    uid: dependent.uid.clone(),
                    owner_uids: vec![owner.uid.clone()],
                });
            }
            return;
        }
        if owner.has_finalizer(FOREGROUND_FINALIZER) {
            let blocked = dependents.iter().any(|dependent| {
                dependent
                    .owners
                    .iter()
                    .any(|r| r.uid == owner.uid && r.block_owner_deletion)
            });
            if !blocked {
                out.push(Action::RemoveFinalizer {
                    object: owner.key.clone(),
                    uid: owner.uid.clone(),
                    finalizer: FOREGROUND_FINALIZER,
                });
            }
        }
    }

    fn decide_dependent(&self, node: &Node, scopes: &dyn KindScopes, out: &mut Vec<Action>) {
        if node.owners.is_empty() {
            return;
        }
        let mut solid = Vec::new();
        let mut waiting = Vec::new();
        let mut dangling = Vec::new();
        for owner in &node.owners {
            match self.resolve(node, owner, scopes) {
                Ok(OwnerState::Solid) => solid.push(owner),
                Ok(OwnerState::Waiting) => waiting.push(owner),
                Ok(OwnerState::Dangling) => dangling.push(owner),
                // Never delete on a guess.
                Ok(OwnerState::Unresolvable) => return,
                Err(message) => {
                    out.push(Action::InvalidOwnerReference {
                        object: node.key.clone(),
                        uid: node.uid.clone(),
                        owner: owner.clone(),
                        message,
                    });
                    if node.key.namespace.is_none() {
                        // A cluster-scoped dependent of a namespaced owner is never collected.
                        return;
                    }
                    dangling.push(owner);
                }
            }
        }
        if !solid.is_empty() {
            if !dangling.is_empty() || !waiting.is_empty() {
                out.push(Action::RemoveOwnerReferences {
                    object: node.key.clone(),
                    uid: node.uid.clone(),
                    owner_uids: dangling
                        .iter()
                        .chain(&waiting)
                        .map(|r| r.uid.clone())
                        .collect(),
                });
            }
            return;
        }
        let has_dependents = !self.valid_dependents(node, scopes).is_empty();
        let propagation = if !waiting.is_empty() && has_dependents {
            Propagation::Foreground
        } else if node.has_finalizer(ORPHAN_FINALIZER) {
            Propagation::Orphan
        } else if node.has_finalizer(FOREGROUND_FINALIZER) {
            Propagation::Foreground
        } else {
            Propagation::Background
        };
        out.push(Action::Delete {
            object: node.key.clone(),
            uid: node.uid.clone(),
            propagation,
        });
    }

    /// Resolves one owner reference of `node`. `Err` carries the warning for a reference that
    /// points across namespaces (or from a cluster-scoped object to a namespaced kind).
    fn resolve(
        &self,
        node: &Node,
        owner: &OwnerRef,
        scopes: &dyn KindScopes,
    ) -> Result<OwnerState, String> {
        let Some(owner_namespaced) = scopes.namespaced(owner.group(), &owner.kind) else {
            return Ok(OwnerState::Unresolvable);
        };
        if owner_namespaced && node.key.namespace.is_none() {
            return Err(format!(
                "ownerRef [{}/{}, namespace: , name: {}, uid: {}] does not exist in namespace \"\"",
                owner.api_version, owner.kind, owner.name, owner.uid
            ));
        }
        let expected_namespace = if owner_namespaced {
            node.key.namespace.clone()
        } else {
            None
        };
        let Some(found) = self.by_uid.get(&owner.uid).and_then(|k| self.nodes.get(k)) else {
            return Ok(OwnerState::Dangling);
        };
        let same_kind = found.key.group == owner.group() && found.key.kind == owner.kind;
        if same_kind && found.key.name == owner.name && found.key.namespace != expected_namespace {
            return Err(format!(
                "ownerRef [{}/{}, namespace: {namespace}, name: {}, uid: {}] does not exist in \
                 namespace \"{namespace}\"",
                owner.api_version,
                owner.kind,
                owner.name,
                owner.uid,
                namespace = node.key.namespace.as_deref().unwrap_or("")
            ));
        }
        if !same_kind || found.key.name != owner.name || found.key.namespace != expected_namespace {
            return Ok(OwnerState::Dangling);
        }
        if found.deleting_dependents() {
            Ok(OwnerState::Waiting)
        } else {
            Ok(OwnerState::Solid)
        }
    }

    /// Dependents whose reference to `owner` actually resolves to it.
    fn valid_dependents(&self, owner: &Node, scopes: &dyn KindScopes) -> Vec<&Node> {
        let Some(keys) = self.dependents.get(&owner.uid) else {
            return Vec::new();
        };
        keys.iter()
            .filter_map(|key| self.nodes.get(key))
            .filter(|dependent| {
                dependent.owners.iter().any(|r| {
                    r.uid == owner.uid
                        && matches!(
                            self.resolve(dependent, r, scopes),
                            Ok(OwnerState::Solid | OwnerState::Waiting)
                        )
                })
            })
            .collect()
    }
}

/// Converts object metadata into a graph node.
pub fn node_from_meta(
    group: &str,
    kind: &str,
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Option<Node> {
    Some(Node {
        key: ObjectKey {
            group: group.to_owned(),
            kind: kind.to_owned(),
            namespace: meta.namespace.clone(),
            name: meta.name.clone()?,
        },
        uid: meta.uid.clone()?,
        owners: meta
            .owner_references
            .iter()
            .flatten()
            .map(|r| OwnerRef {
                api_version: r.api_version.clone(),
                kind: r.kind.clone(),
                name: r.name.clone(),
                uid: r.uid.clone(),
                block_owner_deletion: r.block_owner_deletion.unwrap_or(false),
            })
            .collect(),
        finalizers: meta.finalizers.clone().unwrap_or_default(),
        deleting: meta.deletion_timestamp.is_some(),
    })
}

/// Resources the real collector ignores.
fn ignored(resource: &ServedResource) -> bool {
    resource.api.plural == "events"
        && (resource.api.group.is_empty() || resource.api.group == "events.k8s.io")
}

type TypeKey = (String, String);

/// The objects of one type, as its watch reports them.
#[derive(Default)]
struct TypeObjects {
    objects: HashMap<String, Node>,
}

type SharedGraph = Arc<Mutex<HashMap<TypeKey, TypeObjects>>>;

struct Watched {
    resource: ServedResource,
    task: JoinHandle<()>,
}

/// Runs the garbage collector until `shutdown`.
pub async fn run(client: Client, shutdown: CancellationToken) {
    let shared: SharedGraph = Arc::default();
    let wake = Arc::new(Notify::new());
    let crd_changed = Arc::new(Notify::new());
    let mut watched: HashMap<TypeKey, Watched> = HashMap::new();
    let crd_task = tokio::spawn(watch_crds(client.clone(), crd_changed.clone()));
    let mut warned: HashSet<(String, String)> = HashSet::new();
    let mut next_discovery = tokio::time::Instant::now();
    let mut rediscover_soon = false;
    let mut pace = Pace::new();

    loop {
        if tokio::time::Instant::now() >= next_discovery {
            match discover(&client).await {
                Ok(resources) => {
                    sync_watches(&client, &resources, &mut watched, &shared, &wake);
                    next_discovery = tokio::time::Instant::now()
                        + if rediscover_soon {
                            Duration::from_millis(500)
                        } else {
                            DISCOVERY_REFRESH
                        };
                    rediscover_soon = false;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "garbage collector: discovery failed; retrying");
                    next_discovery = tokio::time::Instant::now() + Duration::from_secs(1);
                }
            }
        }
        pace.ready().await;
        let started = tokio::time::Instant::now();
        let scopes = scopes_of(&watched);
        let graph = snapshot(&shared);
        let actions = graph.plan(&scopes);
        // Only the planning counts: the deletions' round trips cost this process nothing.
        pace.passed(started);
        for action in actions {
            if shutdown.is_cancelled() {
                break;
            }
            execute(&client, &graph, &scopes, &watched, &action, &mut warned).await;
        }
        tokio::select! {
            () = shutdown.cancelled() => break,
            () = wake.notified() => {
                if !pause(&shutdown, DEBOUNCE).await {
                    break;
                }
            }
            () = crd_changed.notified() => {
                next_discovery = tokio::time::Instant::now();
                rediscover_soon = true;
            }
            () = tokio::time::sleep(RESYNC) => {}
        }
    }
    crd_task.abort();
    for (_, w) in watched {
        w.task.abort();
    }
}

async fn watch_crds(client: Client, changed: Arc<Notify>) {
    let api: Api<
        PartialObjectMeta<
            k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
        >,
    > = Api::all(client);
    let mut stream = watcher::watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    while let Some(event) = stream.next().await {
        if matches!(event, Ok(Event::Apply(_) | Event::Delete(_))) {
            changed.notify_one();
        }
    }
}

fn scopes_of(watched: &HashMap<TypeKey, Watched>) -> HashMap<(String, String), bool> {
    watched
        .iter()
        .map(|(key, w)| (key.clone(), w.resource.namespaced))
        .collect()
}

fn snapshot(shared: &SharedGraph) -> Graph {
    let guard = shared
        .lock()
        .expect("invariant: the graph lock is never poisoned");
    Graph::new(
        guard
            .values()
            .flat_map(|t| t.objects.values().cloned())
            .collect::<Vec<_>>(),
    )
}

fn sync_watches(
    client: &Client,
    resources: &[ServedResource],
    watched: &mut HashMap<TypeKey, Watched>,
    shared: &SharedGraph,
    wake: &Arc<Notify>,
) {
    let wanted: HashMap<TypeKey, &ServedResource> = resources
        .iter()
        .filter(|r| {
            r.supports(kube::discovery::verbs::LIST)
                && r.supports(kube::discovery::verbs::WATCH)
                && r.supports(kube::discovery::verbs::DELETE)
                && !ignored(r)
        })
        .map(|r| ((r.api.group.clone(), r.api.kind.clone()), r))
        .collect();
    watched.retain(|key, w| {
        let keep = wanted.contains_key(key);
        if !keep {
            w.task.abort();
            shared
                .lock()
                .expect("invariant: the graph lock is never poisoned")
                .remove(key);
        }
        keep
    });
    for (key, resource) in wanted {
        if watched.contains_key(&key) {
            continue;
        }
        let task = tokio::spawn(watch_type(
            client.clone(),
            resource.clone(),
            shared.clone(),
            wake.clone(),
        ));
        watched.insert(
            key,
            Watched {
                resource: resource.clone(),
                task,
            },
        );
    }
}

async fn watch_type(
    client: Client,
    resource: ServedResource,
    shared: SharedGraph,
    wake: Arc<Notify>,
) {
    let api: Api<PartialObjectMeta<DynamicObject>> = Api::all_with(client, &resource.api);
    let key: TypeKey = (resource.api.group.clone(), resource.api.kind.clone());
    let mut stream = watcher::watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    let mut relist: Option<HashMap<String, Node>> = None;
    let to_node = |obj: &PartialObjectMeta<DynamicObject>| {
        node_from_meta(&resource.api.group, &resource.api.kind, &obj.metadata)
    };
    while let Some(event) = stream.next().await {
        let event = match event {
            Ok(event) => event,
            Err(e) => {
                tracing::debug!(kind = %resource.api.kind, error = %e, "garbage collector watch error");
                continue;
            }
        };
        let mut guard = shared
            .lock()
            .expect("invariant: the graph lock is never poisoned");
        let objects = &mut guard.entry(key.clone()).or_default().objects;
        // Whether the graph changed. Most changes of an object touch nothing the collector
        // reads (a pod's status, a Deployment's replicas): like the real collector's graph
        // builder, which acts on changed references, finalizers and deletion only, they do
        // not start a pass. In a burst of a thousand pods they were most of the changes, and
        // each started a pass over every object.
        let changed = match event {
            Event::Init => {
                relist = Some(HashMap::new());
                false
            }
            Event::InitApply(obj) => {
                if let (Some(buffer), Some(node)) = (relist.as_mut(), to_node(&obj)) {
                    buffer.insert(node.uid.clone(), node);
                }
                false
            }
            Event::InitDone => {
                if let Some(buffer) = relist.take() {
                    *objects = buffer;
                }
                true
            }
            Event::Apply(obj) => match to_node(&obj) {
                Some(node) if objects.get(&node.uid) != Some(&node) => {
                    objects.insert(node.uid.clone(), node);
                    true
                }
                _ => false,
            },
            Event::Delete(obj) => obj
                .metadata
                .uid
                .as_ref()
                .is_some_and(|uid| objects.remove(uid).is_some()),
        };
        drop(guard);
        if changed {
            wake.notify_one();
        }
    }
}

fn api_for(
    client: &Client,
    resource: &ServedResource,
    namespace: Option<&str>,
) -> Api<DynamicObject> {
    match (resource.namespaced, namespace) {
        (true, Some(ns)) => Api::namespaced_with(client.clone(), ns, &resource.api),
        _ => Api::all_with(client.clone(), &resource.api),
    }
}

/// Reads an object live; `None` if it is gone.
async fn fetch(
    client: &Client,
    watched: &HashMap<TypeKey, Watched>,
    key: &ObjectKey,
) -> Result<Option<DynamicObject>, kube::Error> {
    let Some(w) = watched.get(&(key.group.clone(), key.kind.clone())) else {
        return Ok(None);
    };
    api_for(client, &w.resource, key.namespace.as_deref())
        .get_opt(&key.name)
        .await
}

/// Re-takes the decision for `subject` on live objects: the subject itself and each owner it
/// names are read from the server; its dependents come from the graph.
async fn live_graph(
    client: &Client,
    graph: &Graph,
    scopes: &HashMap<(String, String), bool>,
    watched: &HashMap<TypeKey, Watched>,
    subject: &ObjectKey,
) -> Result<Option<(Graph, DynamicObject)>, kube::Error> {
    let Some(live) = fetch(client, watched, subject).await? else {
        return Ok(None);
    };
    let Some(node) = node_from_meta(&subject.group, &subject.kind, &live.metadata) else {
        return Ok(None);
    };
    let mut nodes = vec![node.clone()];
    for owner in &node.owners {
        let Some(namespaced) = scopes.namespaced(owner.group(), &owner.kind) else {
            continue;
        };
        let owner_key = ObjectKey {
            group: owner.group().to_owned(),
            kind: owner.kind.clone(),
            namespace: if namespaced {
                subject.namespace.clone()
            } else {
                None
            },
            name: owner.name.clone(),
        };
        if owner_key == *subject {
            continue;
        }
        if let Some(obj) = fetch(client, watched, &owner_key).await?
            && let Some(n) = node_from_meta(&owner_key.group, &owner_key.kind, &obj.metadata)
        {
            nodes.push(n);
        }
        // The owner's uid may live elsewhere (a cross-namespace reference): keep the graph's
        // view of it so the warning is still recognised.
        if let Some(other) = graph
            .by_uid
            .get(&owner.uid)
            .and_then(|k| graph.nodes.get(k))
            && other.key != owner_key
        {
            nodes.push(other.clone());
        }
    }
    if let Some(deps) = graph.dependents.get(&node.uid) {
        nodes.extend(deps.iter().filter_map(|k| graph.nodes.get(k)).cloned());
    }
    Ok(Some((Graph::new(nodes), live)))
}

async fn execute(
    client: &Client,
    graph: &Graph,
    scopes: &HashMap<(String, String), bool>,
    watched: &HashMap<TypeKey, Watched>,
    action: &Action,
    warned: &mut HashSet<(String, String)>,
) {
    let subject = match action {
        Action::Delete { object, .. }
        | Action::RemoveOwnerReferences { object, .. }
        | Action::RemoveFinalizer { object, .. }
        | Action::InvalidOwnerReference { object, .. } => object,
    };
    if let Action::InvalidOwnerReference {
        object,
        uid,
        owner,
        message,
    } = action
    {
        if warned.insert((uid.clone(), owner.uid.clone())) {
            let api_version = watched
                .get(&(object.group.clone(), object.kind.clone()))
                .map(|w| w.resource.api.api_version.clone());
            record_warning(client, object, api_version, uid, message).await;
        }
        return;
    }
    let result = async {
        let Some((live, obj)) = live_graph(client, graph, scopes, watched, subject).await? else {
            return Ok(());
        };
        // Planning the whole small graph covers decisions taken from the subject's side and
        // from its owners' side (orphaning strips references from the dependent).
        if !live.plan(scopes).contains(action) {
            tracing::debug!(
                ?action,
                "garbage collector: decision changed on live data; skipped"
            );
            return Ok(());
        }
        let Some(w) = watched.get(&(subject.group.clone(), subject.kind.clone())) else {
            return Ok(());
        };
        let api = api_for(client, &w.resource, subject.namespace.as_deref());
        apply(&api, action, &obj).await
    }
    .await;
    match result {
        Ok(()) => {}
        Err(e) if is_status(&e, 404) || is_status(&e, 409) || is_status(&e, 422) => {
            tracing::debug!(?action, error = %e, "garbage collector: raced; will re-plan");
        }
        Err(e) => tracing::warn!(?action, error = %e, "garbage collector action failed"),
    }
}

async fn apply(
    api: &Api<DynamicObject>,
    action: &Action,
    obj: &DynamicObject,
) -> Result<(), kube::Error> {
    let name = obj.name_any();
    let rv = obj.metadata.resource_version.clone().unwrap_or_default();
    match action {
        Action::Delete {
            uid, propagation, ..
        } => {
            let params = DeleteParams {
                propagation_policy: Some(match propagation {
                    Propagation::Background => kube::api::PropagationPolicy::Background,
                    Propagation::Foreground => kube::api::PropagationPolicy::Foreground,
                    Propagation::Orphan => kube::api::PropagationPolicy::Orphan,
                }),
                preconditions: Some(Preconditions {
                    uid: Some(uid.clone()),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            // Per object, so debug: kube-controller-manager logs these at verbosity 2.
            tracing::debug!(
                kind = %obj.types.as_ref().map_or("", |t| t.kind.as_str()),
                %name,
                ?propagation,
                "garbage collector: deleting dependent"
            );
            api.delete(&name, &params).await?;
        }
        Action::RemoveOwnerReferences { owner_uids, .. } => {
            let kept: Vec<_> = obj
                .metadata
                .owner_references
                .iter()
                .flatten()
                .filter(|r| !owner_uids.contains(&r.uid))
                .collect();
            let op = if kept.is_empty() {
                json!({"op": "remove", "path": "/metadata/ownerReferences"})
            } else {
                json!({"op": "replace", "path": "/metadata/ownerReferences", "value": kept})
            };
            let patch =
                json!([{"op": "test", "path": "/metadata/resourceVersion", "value": rv}, op]);
            api.patch(
                &name,
                &PatchParams::default(),
                &Patch::Json::<()>(json_patch_of(patch)?),
            )
            .await?;
        }
        Action::RemoveFinalizer { finalizer, .. } => {
            let kept: Vec<&String> = obj
                .metadata
                .finalizers
                .iter()
                .flatten()
                .filter(|f| f.as_str() != *finalizer)
                .collect();
            let op = if kept.is_empty() {
                json!({"op": "remove", "path": "/metadata/finalizers"})
            } else {
                json!({"op": "replace", "path": "/metadata/finalizers", "value": kept})
            };
            let patch =
                json!([{"op": "test", "path": "/metadata/resourceVersion", "value": rv}, op]);
            api.patch(
                &name,
                &PatchParams::default(),
                &Patch::Json::<()>(json_patch_of(patch)?),
            )
            .await?;
        }
        Action::InvalidOwnerReference { .. } => {}
    }
    Ok(())
}

fn json_patch_of(value: serde_json::Value) -> Result<json_patch::Patch, kube::Error> {
    serde_json::from_value(value).map_err(kube::Error::SerdeError)
}

/// Records the `OwnerRefInvalidNamespace` warning event on the dependent, as the real collector
/// does. Best effort: an event that cannot be written is only logged.
async fn record_warning(
    client: &Client,
    object: &ObjectKey,
    api_version: Option<String>,
    uid: &str,
    message: &str,
) {
    use k8s_openapi::api::core::v1::{Event as CoreEvent, EventSource, ObjectReference};
    let namespace = object
        .namespace
        .clone()
        .unwrap_or_else(|| "default".to_owned());
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::now());
    let event = CoreEvent {
        metadata: kube::api::ObjectMeta {
            generate_name: Some(format!("{}.", object.name)),
            namespace: Some(namespace.clone()),
            ..Default::default()
        },
        involved_object: ObjectReference {
            api_version,
            kind: Some(object.kind.clone()),
            name: Some(object.name.clone()),
            namespace: object.namespace.clone(),
            uid: Some(uid.to_owned()),
            ..Default::default()
        },
        reason: Some("OwnerRefInvalidNamespace".to_owned()),
        message: Some(message.to_owned()),
        type_: Some("Warning".to_owned()),
        source: Some(EventSource {
            component: Some("garbage-collector-controller".to_owned()),
            host: None,
        }),
        first_timestamp: Some(now.clone()),
        last_timestamp: Some(now),
        count: Some(1),
        ..Default::default()
    };
    let api: Api<CoreEvent> = Api::namespaced(client.clone(), &namespace);
    if let Err(e) = api.create(&PostParams::default(), &event).await {
        tracing::debug!(error = %e, "garbage collector: could not record a warning event");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scopes() -> HashMap<(String, String), bool> {
        [
            (("", "ConfigMap"), true),
            (("", "Secret"), true),
            (("", "Namespace"), false),
            (("", "Node"), false),
            (("apps", "ReplicaSet"), true),
            (("rbac.authorization.k8s.io", "ClusterRole"), false),
        ]
        .into_iter()
        .map(|((g, k), n)| ((g.to_owned(), k.to_owned()), n))
        .collect()
    }

    fn key(kind: &str, ns: Option<&str>, name: &str) -> ObjectKey {
        let (group, kind) = match kind.split_once('/') {
            Some((g, k)) => (g.to_owned(), k.to_owned()),
            None => (String::new(), kind.to_owned()),
        };
        ObjectKey {
            group,
            kind,
            namespace: ns.map(str::to_owned),
            name: name.to_owned(),
        }
    }

    fn node(kind: &str, ns: Option<&str>, name: &str, uid: &str) -> Node {
        Node {
            key: key(kind, ns, name),
            uid: uid.to_owned(),
            owners: Vec::new(),
            finalizers: Vec::new(),
            deleting: false,
        }
    }

    fn owned_by(mut n: Node, owner: &Node, block: bool) -> Node {
        let api_version = if owner.key.group.is_empty() {
            "v1".to_owned()
        } else {
            format!("{}/v1", owner.key.group)
        };
        n.owners.push(OwnerRef {
            api_version,
            kind: owner.key.kind.clone(),
            name: owner.key.name.clone(),
            uid: owner.uid.clone(),
            block_owner_deletion: block,
        });
        n
    }

    fn deleting(mut n: Node, finalizer: &str) -> Node {
        n.deleting = true;
        n.finalizers.push(finalizer.to_owned());
        n
    }

    fn plan(nodes: Vec<Node>) -> Vec<Action> {
        Graph::new(nodes).plan(&scopes())
    }

    #[test]
    fn present_owner_keeps_dependent() {
        let owner = node("apps/ReplicaSet", Some("a"), "rs", "u-rs");
        let dep = owned_by(node("ConfigMap", Some("a"), "cm", "u-cm"), &owner, false);
        assert_eq!(plan(vec![owner, dep]), vec![]);
    }

    #[test]
    fn background_deletes_dependent_of_absent_owner() {
        let owner = node("apps/ReplicaSet", Some("a"), "rs", "u-rs");
        let dep = owned_by(node("ConfigMap", Some("a"), "cm", "u-cm"), &owner, false);
        assert_eq!(
            plan(vec![dep]),
            vec![Action::Delete {
                object: key("ConfigMap", Some("a"), "cm"),
                uid: "u-cm".into(),
                propagation: Propagation::Background
            }]
        );
    }

    #[test]
    fn recreated_owner_with_new_uid_does_not_keep_dependent() {
        let old = node("apps/ReplicaSet", Some("a"), "rs", "u-old");
        let dep = owned_by(node("ConfigMap", Some("a"), "cm", "u-cm"), &old, false);
        let new = node("apps/ReplicaSet", Some("a"), "rs", "u-new");
        assert!(matches!(
            plan(vec![new, dep]).as_slice(),
            [Action::Delete { uid, .. }] if uid == "u-cm"
        ));
    }

    #[test]
    fn one_present_owner_keeps_dependent_and_drops_dangling_refs() {
        let a = node("ConfigMap", Some("a"), "a", "u-a");
        let b = node("ConfigMap", Some("a"), "b", "u-b");
        let dep = owned_by(
            owned_by(node("Secret", Some("a"), "s", "u-s"), &a, false),
            &b,
            false,
        );
        assert_eq!(
            plan(vec![a, dep]),
            vec![Action::RemoveOwnerReferences {
                object: key("Secret", Some("a"), "s"),
                uid: "u-s".into(),
                owner_uids: vec!["u-b".into()]
            }]
        );
    }

    #[test]
    fn foreground_deletes_dependents_then_releases_owner() {
        let owner = deleting(
            node("apps/ReplicaSet", Some("a"), "rs", "u-rs"),
            FOREGROUND_FINALIZER,
        );
        let blocking = owned_by(node("ConfigMap", Some("a"), "b", "u-b"), &owner, true);
        let loose = owned_by(node("ConfigMap", Some("a"), "l", "u-l"), &owner, false);
        assert_eq!(
            plan(vec![owner.clone(), blocking.clone(), loose.clone()]),
            vec![
                Action::Delete {
                    object: key("ConfigMap", Some("a"), "b"),
                    uid: "u-b".into(),
                    propagation: Propagation::Background
                },
                Action::Delete {
                    object: key("ConfigMap", Some("a"), "l"),
                    uid: "u-l".into(),
                    propagation: Propagation::Background
                },
            ]
        );
        // A blocking dependent that is itself still terminating keeps the owner waiting.
        let terminating = deleting(blocking, "example.com/hold");
        assert_eq!(plan(vec![owner.clone(), terminating]), vec![]);
        // Only non-blocking dependents left: the finalizer goes (actions sort by object).
        assert_eq!(
            plan(vec![owner, loose]),
            vec![
                Action::Delete {
                    object: key("ConfigMap", Some("a"), "l"),
                    uid: "u-l".into(),
                    propagation: Propagation::Background
                },
                Action::RemoveFinalizer {
                    object: key("apps/ReplicaSet", Some("a"), "rs"),
                    uid: "u-rs".into(),
                    finalizer: FOREGROUND_FINALIZER
                },
            ]
        );
    }

    #[test]
    fn foreground_cascades_foreground_through_dependents_with_dependents() {
        let owner = deleting(
            node("apps/ReplicaSet", Some("a"), "rs", "u-rs"),
            FOREGROUND_FINALIZER,
        );
        let middle = owned_by(node("ConfigMap", Some("a"), "m", "u-m"), &owner, true);
        let leaf = owned_by(node("Secret", Some("a"), "s", "u-s"), &middle, true);
        assert_eq!(
            plan(vec![owner, middle, leaf]),
            vec![Action::Delete {
                object: key("ConfigMap", Some("a"), "m"),
                uid: "u-m".into(),
                propagation: Propagation::Foreground
            }]
        );
    }

    #[test]
    fn orphan_strips_references_then_releases_owner() {
        let owner = deleting(
            node("apps/ReplicaSet", Some("a"), "rs", "u-rs"),
            ORPHAN_FINALIZER,
        );
        let dep = owned_by(node("ConfigMap", Some("a"), "cm", "u-cm"), &owner, true);
        assert_eq!(
            plan(vec![owner.clone(), dep]),
            vec![Action::RemoveOwnerReferences {
                object: key("ConfigMap", Some("a"), "cm"),
                uid: "u-cm".into(),
                owner_uids: vec!["u-rs".into()]
            }]
        );
        assert_eq!(
            plan(vec![owner]),
            vec![Action::RemoveFinalizer {
                object: key("apps/ReplicaSet", Some("a"), "rs"),
                uid: "u-rs".into(),
                finalizer: ORPHAN_FINALIZER
            }]
        );
    }

    #[test]
    fn cross_namespace_owner_counts_as_absent_and_warns() {
        let owner = node("ConfigMap", Some("a"), "owner", "u-o");
        let dep = owned_by(node("ConfigMap", Some("b"), "dep", "u-d"), &owner, false);
        let actions = plan(vec![owner, dep]);
        assert_eq!(actions.len(), 2, "{actions:?}");
        assert!(
            matches!(&actions[0], Action::InvalidOwnerReference { uid, message, .. }
            if uid == "u-d" && message == "ownerRef [v1/ConfigMap, namespace: b, name: owner, uid: u-o] does not exist in namespace \"b\"")
        );
        assert!(matches!(&actions[1], Action::Delete { uid, .. } if uid == "u-d"));
    }

    #[test]
    fn cross_namespace_dependent_is_not_orphaned_or_waited_for() {
        let owner = deleting(
            node("ConfigMap", Some("a"), "owner", "u-o"),
            FOREGROUND_FINALIZER,
        );
        let elsewhere = owned_by(node("ConfigMap", Some("b"), "dep", "u-d"), &owner, true);
        let actions = plan(vec![owner, elsewhere]);
        assert!(actions.contains(&Action::RemoveFinalizer {
            object: key("ConfigMap", Some("a"), "owner"),
            uid: "u-o".into(),
            finalizer: FOREGROUND_FINALIZER
        }));
    }

    #[test]
    fn cluster_scoped_dependent_of_namespaced_kind_is_never_collected() {
        let dep = owned_by(
            node("rbac.authorization.k8s.io/ClusterRole", None, "cr", "u-cr"),
            &node("ConfigMap", Some("a"), "cm", "u-cm"),
            false,
        );
        let actions = plan(vec![dep]);
        assert!(
            matches!(actions.as_slice(), [Action::InvalidOwnerReference { uid, .. }] if uid == "u-cr"),
            "{actions:?}"
        );
    }

    #[test]
    fn namespaced_dependent_of_cluster_scoped_owner() {
        let ns_owner = node("Node", None, "n1", "u-n1");
        let dep = owned_by(node("ConfigMap", Some("a"), "cm", "u-cm"), &ns_owner, false);
        assert_eq!(plan(vec![ns_owner, dep.clone()]), vec![]);
        assert!(matches!(
            plan(vec![dep]).as_slice(),
            [Action::Delete { .. }]
        ));
    }

    #[test]
    fn unknown_owner_kind_is_left_alone() {
        let mut dep = node("ConfigMap", Some("a"), "cm", "u-cm");
        dep.owners.push(OwnerRef {
            api_version: "example.com/v1".into(),
            kind: "Widget".into(),
            name: "w".into(),
            uid: "u-w".into(),
            block_owner_deletion: false,
        });
        assert_eq!(plan(vec![dep]), vec![]);
    }

    #[test]
    fn terminating_dependent_is_not_deleted_again() {
        let owner = node("apps/ReplicaSet", Some("a"), "rs", "u-rs");
        let dep = deleting(
            owned_by(node("ConfigMap", Some("a"), "cm", "u-cm"), &owner, false),
            "example.com/hold",
        );
        assert_eq!(plan(vec![dep]), vec![]);
    }

    #[test]
    fn owner_with_same_uid_but_other_kind_is_absent() {
        let owner = node("Secret", Some("a"), "rs", "u-rs");
        let mut dep = node("ConfigMap", Some("a"), "cm", "u-cm");
        dep.owners.push(OwnerRef {
            api_version: "apps/v1".into(),
            kind: "ReplicaSet".into(),
            name: "rs".into(),
            uid: "u-rs".into(),
            block_owner_deletion: false,
        });
        assert!(matches!(
            plan(vec![owner, dep]).as_slice(),
            [Action::Delete { .. }]
        ));
    }

    mod properties {
        use proptest::prelude::*;

        use super::*;

        /// One generated object: its namespace (0 or 1), owner references as (target index,
        /// uid matches?, blockOwnerDeletion), whether it is being deleted and with which of
        /// the collector's finalizers.
        #[derive(Debug, Clone)]
        struct Spec {
            namespace: u8,
            owners: Vec<(usize, bool, bool)>,
            deleting: bool,
            finalizer: u8,
        }

        fn spec() -> impl Strategy<Value = Spec> {
            (
                0u8..2,
                proptest::collection::vec(
                    (0usize..8, proptest::bool::weighted(0.8), any::<bool>()),
                    0..3,
                ),
                proptest::bool::weighted(0.3),
                0u8..3,
            )
                .prop_map(|(namespace, owners, deleting, finalizer)| Spec {
                    namespace,
                    owners,
                    deleting,
                    finalizer,
                })
        }

        fn build(specs: &[Spec]) -> Vec<Node> {
            specs
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    let mut n = node(
                        "ConfigMap",
                        Some(if s.namespace == 0 { "a" } else { "b" }),
                        &format!("cm{i}"),
                        &format!("u{i}"),
                    );
                    for &(target, uid_matches, block) in &s.owners {
                        let target = target % specs.len();
                        n.owners.push(OwnerRef {
                            api_version: "v1".into(),
                            kind: "ConfigMap".into(),
                            name: format!("cm{target}"),
                            uid: if uid_matches {
                                format!("u{target}")
                            } else {
                                format!("stale{target}")
                            },
                            block_owner_deletion: block,
                        });
                    }
                    if s.deleting {
                        n.deleting = true;
                        match s.finalizer {
                            1 => n.finalizers.push(FOREGROUND_FINALIZER.into()),
                            2 => n.finalizers.push(ORPHAN_FINALIZER.into()),
                            _ => n.finalizers.push("example.com/hold".into()),
                        }
                    }
                    n
                })
                .collect()
        }

        /// The oracle: an owner reference keeps its dependent alive when an object with that
        /// uid exists under that name in the dependent's namespace and is not waiting in
        /// foreground deletion.
        fn solid(nodes: &[Node], dependent: &Node, r: &OwnerRef) -> bool {
            nodes.iter().any(|o| {
                o.uid == r.uid
                    && o.key.name == r.name
                    && o.key.namespace == dependent.key.namespace
                    && !(o.deleting && o.finalizers.iter().any(|f| f == FOREGROUND_FINALIZER))
            })
        }

        proptest! {
            #[test]
            fn collector_never_breaks_a_live_ownership(specs in proptest::collection::vec(spec(), 1..8)) {
                let nodes = build(&specs);
                let graph = Graph::new(nodes.clone());
                let actions = graph.plan(&scopes());
                prop_assert_eq!(&actions, &graph.plan(&scopes()), "planning is deterministic");
                let by_uid = |uid: &str| nodes.iter().find(|n| n.uid == uid).expect("known uid");
                for action in &actions {
                    match action {
                        Action::Delete { uid, .. } => {
                            let n = by_uid(uid);
                            prop_assert!(!n.deleting, "{uid} is already being deleted");
                            prop_assert!(!n.owners.is_empty());
                            prop_assert!(
                                n.owners.iter().all(|r| !solid(&nodes, n, r)),
                                "{uid} still has a live owner"
                            );
                        }
                        Action::RemoveOwnerReferences { uid, owner_uids, .. } => {
                            let n = by_uid(uid);
                            for owner in owner_uids {
                                let r = n.owners.iter().find(|r| &r.uid == owner).expect("ref exists");
                                let orphaning = nodes.iter().any(|o| {
                                    &o.uid == owner
                                        && o.deleting
                                        && o.finalizers.iter().any(|f| f == ORPHAN_FINALIZER)
                                });
                                prop_assert!(
                                    orphaning || !solid(&nodes, n, r),
                                    "dropped a live reference from {uid} to {owner}"
                                );
                            }
                        }
                        Action::RemoveFinalizer { uid, finalizer, .. } => {
                            let owner = by_uid(uid);
                            prop_assert!(owner.deleting);
                            let blocking = nodes.iter().any(|d| {
                                d.key.namespace == owner.key.namespace
                                    && d.owners.iter().any(|r| {
                                        r.uid == owner.uid
                                            && r.name == owner.key.name
                                            && (r.block_owner_deletion
                                                || *finalizer == ORPHAN_FINALIZER)
                                    })
                            });
                            prop_assert!(!blocking, "{uid} released while dependents remain");
                        }
                        Action::InvalidOwnerReference { .. } => {}
                    }
                }
            }
        }
    }
}
