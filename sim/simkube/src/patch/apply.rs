//! Server-side apply and managed-fields bookkeeping: an honest subset of structured-merge-diff.
//!
//! What is modelled, as the real server does it:
//! - Ownership per manager in `metadata.managedFields` (`FieldsV1`), one entry per
//!   (manager, operation, subresource) for appliers and per (manager, apiVersion, subresource)
//!   for updaters, sorted as the server sorts them.
//! - Apply merges the configuration into the live object: objects by field, map lists by their
//!   keys, set lists by value, atomic lists and atomic structs/maps replaced whole.
//! - Fields the applier owned before but no longer sends are removed unless another manager owns
//!   them (the "prune" step, with struct fields owning their parents as upstream does).
//! - Another manager owning a field whose value the apply changes (or adds) is a conflict: 409
//!   with one `FieldManagerConflict` cause per path, unless `force`, which moves ownership.
//!   Fields whose value does not change become shared.
//! - Updates (PUT, non-apply PATCH, create) make their manager own what they changed or added;
//!   other managers lose what they changed or removed.
//! - `apiVersion`, `kind` and the server-set metadata fields are never owned; `.status` is not
//!   owned, merged or compared through the main resource of a type with a status subresource,
//!   nor `.spec` through `/status`, so those never conflict.
//! - More than ten Update entries fold, oldest first, into `ancient-changes` entries.
//! - Applying to an object that has no managed fields first gives its current fields to a
//!   `before-first-apply` updater, so changing them conflicts.
//!
//! Deliberate approximations: list element order follows upstream's merge order rules but
//! duplicate keys in a list are not diagnosed, and a map-list element that lacks a key field
//! without a schema default is addressed by its index instead of being refused; no schema
//! validation happens here; an updater's newly created intermediate *struct* fields are not
//! recorded as members (upstream records pointer structs but not value structs, which JSON
//! alone cannot tell apart); the client-side-apply upgrade path of the real field manager
//! (`kubectl.kubernetes.io/last-applied-configuration` kept in step with apply) is not modelled.

use serde_json::{Map, Value, json};

use super::fieldset::{FieldSet, Path, PathElement};
use super::schema::{ListType, Node, ObjKind};
use crate::error::{ApiError, Cause};
use crate::registry::ResourceType;

/// One `managedFields` entry.
#[derive(Debug, Clone, PartialEq)]
struct Entry {
    manager: String,
    operation: String,
    api_version: String,
    time: Option<String>,
    subresource: String,
    set: FieldSet,
}

impl Entry {
    fn is(&self, manager: &str, operation: &str, subresource: &str, api_version: &str) -> bool {
        self.manager == manager
            && self.operation == operation
            && self.subresource == subresource
            && (operation == "Apply" || self.api_version == api_version)
    }

    /// The manager as conflict messages name it (`printManager` upstream).
    fn describe(&self) -> String {
        let mut s = format!("{:?}", self.manager);
        if !self.subresource.is_empty() {
            s.push_str(&format!(" with subresource {:?}", self.subresource));
        }
        if self.operation == "Update" {
            s.push_str(&format!(" using {}", self.api_version));
        }
        s
    }

    /// The identifier upstream sorts conflicting managers by.
    fn identity(&self) -> String {
        let mut m = Map::new();
        m.insert("manager".into(), json!(self.manager));
        m.insert("operation".into(), json!(self.operation));
        if self.operation != "Apply" {
            m.insert("apiVersion".into(), json!(self.api_version));
        }
        if !self.subresource.is_empty() {
            m.insert("subresource".into(), json!(self.subresource));
        }
        Value::Object(m).to_string()
    }

    fn encode(&self) -> Value {
        let mut m = Map::new();
        m.insert("manager".into(), json!(self.manager));
        m.insert("operation".into(), json!(self.operation));
        m.insert("apiVersion".into(), json!(self.api_version));
        if let Some(t) = &self.time {
            m.insert("time".into(), json!(t));
        }
        m.insert("fieldsType".into(), json!("FieldsV1"));
        m.insert("fieldsV1".into(), self.set.to_fields_v1());
        if !self.subresource.is_empty() {
            m.insert("subresource".into(), json!(self.subresource));
        }
        Value::Object(m)
    }

    fn decode(v: &Value) -> Result<Entry, String> {
        let s = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
        let set = match v.get("fieldsV1") {
            Some(f) if !f.is_null() => FieldSet::from_fields_v1(f)?,
            _ => FieldSet::new(),
        };
        Ok(Entry {
            manager: s("manager").unwrap_or_default(),
            operation: s("operation").unwrap_or_default(),
            api_version: s("apiVersion").unwrap_or_default(),
            time: s("time"),
            subresource: s("subresource").unwrap_or_default(),
            set,
        })
    }
}

fn decode_entries(list: Option<&Value>) -> Result<Vec<Entry>, String> {
    let Some(Value::Array(items)) = list else {
        return Ok(Vec::new());
    };
    let mut out: Vec<Entry> = Vec::new();
    for item in items {
        let e = Entry::decode(item)?;
        match out
            .iter_mut()
            .find(|o| o.is(&e.manager, &e.operation, &e.subresource, &e.api_version))
        {
            Some(existing) => existing.set = existing.set.union(&e.set),
            None => out.push(e),
        }
    }
    Ok(out)
}

fn managed_fields_of(obj: &Value) -> Option<&Value> {
    obj.get("metadata").and_then(|m| m.get("managedFields"))
}

fn without_managed_fields(obj: &Value) -> Value {
    let mut o = obj.clone();
    if let Some(m) = o.get_mut("metadata").and_then(Value::as_object_mut) {
        m.shift_remove("managedFields");
    }
    o
}

/// Sorts entries as the server stores them and writes them into `obj.metadata.managedFields`
/// (removing the key when there are none).
fn write_entries(obj: &mut Value, mut entries: Vec<Entry>) {
    entries.retain(|e| !e.set.is_empty());
    cap_update_managers(&mut entries);
    entries.sort_by(|p, q| {
        p.operation
            .cmp(&q.operation)
            .then_with(|| {
                p.time
                    .as_deref()
                    .unwrap_or("")
                    .cmp(q.time.as_deref().unwrap_or(""))
            })
            .then_with(|| p.manager.cmp(&q.manager))
            .then_with(|| p.api_version.cmp(&q.api_version))
            .then_with(|| p.subresource.cmp(&q.subresource))
    });
    let Some(root) = obj.as_object_mut() else {
        return;
    };
    let meta = root.entry("metadata").or_insert_with(|| json!({}));
    let Some(meta) = meta.as_object_mut() else {
        return;
    };
    if entries.is_empty() {
        meta.shift_remove("managedFields");
    } else {
        meta.insert(
            "managedFields".into(),
            Value::Array(entries.iter().map(Entry::encode).collect()),
        );
    }
}

/// The most Update entries an object keeps (upstream `DefaultMaxUpdateManagers`).
const MAX_UPDATE_MANAGERS: usize = 10;

/// Folds the oldest Update entries into `ancient-changes` entries (one per apiVersion) until at
/// most [`MAX_UPDATE_MANAGERS`] Update entries remain, as upstream `capManagersManager` does.
fn cap_update_managers(entries: &mut Vec<Entry>) {
    let mut updaters: Vec<usize> = (0..entries.len())
        .filter(|i| entries[*i].operation != "Apply")
        .collect();
    if updaters.len() <= MAX_UPDATE_MANAGERS {
        return;
    }
    updaters.sort_by(|a, b| {
        let (x, y) = (&entries[*a], &entries[*b]);
        x.time
            .as_deref()
            .unwrap_or("")
            .cmp(y.time.as_deref().unwrap_or(""))
            .then_with(|| x.identity().cmp(&y.identity()))
    });
    let mut remaining = updaters.len();
    let mut first_of_version: Vec<(String, usize)> = Vec::new();
    let mut dropped: Vec<usize> = Vec::new();
    for i in updaters {
        if remaining <= MAX_UPDATE_MANAGERS {
            break;
        }
        let version = entries[i].api_version.clone();
        match first_of_version
            .iter()
            .find(|(v, _)| *v == version)
            .map(|(_, f)| *f)
        {
            Some(bucket) => {
                let (set, time) = (entries[i].set.clone(), entries[i].time.clone());
                let b = &mut entries[bucket];
                b.manager = "ancient-changes".into();
                b.set = b.set.union(&set);
                b.time = time;
                dropped.push(i);
                remaining -= 1;
            }
            None => first_of_version.push((version, i)),
        }
    }
    dropped.sort_unstable();
    for i in dropped.into_iter().rev() {
        entries.remove(i);
    }
}

/// Paths the server never records as owned (upstream `stripMetaManager`).
fn strip_set() -> FieldSet {
    let mut s = FieldSet::new();
    for p in [&["apiVersion"][..], &["kind"], &["metadata"]] {
        s.insert(&fields(p));
    }
    for f in [
        "name",
        "namespace",
        "creationTimestamp",
        "selfLink",
        "uid",
        "clusterName",
        "generation",
        "managedFields",
        "resourceVersion",
    ] {
        s.insert(&fields(&["metadata", f]));
    }
    s
}

fn fields(names: &[&str]) -> Vec<PathElement> {
    names
        .iter()
        .map(|n| PathElement::Field((*n).to_owned()))
        .collect()
}

/// Top-level fields a write through this endpoint may not own (the strategy resets them).
fn reset_fields(rt: Option<&ResourceType>, subresource: &str) -> &'static [&'static str] {
    match (rt.is_some_and(ResourceType::has_status), subresource) {
        (_, "status") => &["spec"],
        (true, "") => &["status"],
        _ => &[],
    }
}

/// Removes top-level fields and everything below them.
fn without_top_level(mut set: FieldSet, names: &[&str]) -> FieldSet {
    let mut drop = FieldSet::new();
    for n in names {
        let pe = PathElement::Field((*n).to_owned());
        if let Some(c) = set.child(&pe) {
            let mut sub = FieldSet::new();
            *sub.child_mut(pe.clone()) = c.clone();
            drop = drop.union(&sub);
        }
        drop.insert_member(pe);
    }
    set = set.difference(&drop);
    set
}

/// The path element of a list item.
fn item_pe(lt: &ListType, index: usize, item: &Value) -> PathElement {
    match lt {
        ListType::Atomic => PathElement::Index(index),
        ListType::Set => PathElement::value(item),
        ListType::Map(keys) => {
            let fields: Vec<(String, Value)> = keys
                .iter()
                .filter_map(|(k, default)| {
                    item.get(k)
                        .or(default.as_ref())
                        .map(|v| (k.clone(), v.clone()))
                })
                .collect();
            if fields.is_empty() {
                PathElement::Index(index)
            } else {
                PathElement::key(&fields)
            }
        }
    }
}

/// The ownership set of a value. With `all_nodes`, every node a change touches is included
/// (the "added"/"removed" sets of a comparison); otherwise only what applying the value claims.
fn collect(
    v: &Value,
    node: Node<'_>,
    top: bool,
    path: &mut Vec<PathElement>,
    set: &mut FieldSet,
    all_nodes: bool,
) {
    match v {
        Value::Object(m) => {
            let kind = node.obj_kind();
            if kind == ObjKind::Atomic {
                set.insert(path);
                return;
            }
            if all_nodes && (kind == ObjKind::Map || m.is_empty()) {
                set.insert(path);
            }
            for (k, cv) in m {
                let (child, declared) = node.child(k, top);
                path.push(PathElement::Field(k.clone()));
                collect(cv, child, false, path, set, all_nodes);
                let empty = cv.is_null() || cv.as_object().is_some_and(Map::is_empty);
                if empty || !declared {
                    set.insert(path);
                }
                path.pop();
            }
        }
        Value::Array(a) => {
            let (lt, elem) = node.list();
            if lt == ListType::Atomic || all_nodes {
                set.insert(path);
            }
            if lt == ListType::Atomic {
                return;
            }
            for (i, item) in a.iter().enumerate() {
                path.push(item_pe(&lt, i, item));
                if matches!(lt, ListType::Map(_)) {
                    collect(item, elem, false, path, set, all_nodes);
                }
                set.insert(path);
                path.pop();
            }
        }
        _ => set.insert(path),
    }
}

fn field_set(v: &Value, node: Node<'_>) -> FieldSet {
    let mut set = FieldSet::new();
    collect(v, node, true, &mut Vec::new(), &mut set, false);
    set
}

/// What changed between two versions of an object.
#[derive(Debug, Default)]
struct Comparison {
    added: FieldSet,
    modified: FieldSet,
    removed: FieldSet,
}

fn compare(
    l: Option<&Value>,
    r: Option<&Value>,
    node: Node<'_>,
    top: bool,
    path: &mut Vec<PathElement>,
    out: &mut Comparison,
) {
    match (l, r) {
        (None, None) => {}
        (None, Some(b)) => {
            out.added.insert(path);
            collect(b, node, top, path, &mut out.added, true);
        }
        (Some(a), None) => {
            out.removed.insert(path);
            collect(a, node, top, path, &mut out.removed, true);
        }
        (Some(Value::Object(a)), Some(Value::Object(b))) if node.obj_kind() != ObjKind::Atomic => {
            let keys: Vec<&String> = a
                .keys()
                .chain(b.keys().filter(|k| !a.contains_key(*k)))
                .collect();
            for k in keys {
                let (child, _) = node.child(k, top);
                path.push(PathElement::Field(k.clone()));
                compare(a.get(k), b.get(k), child, false, path, out);
                path.pop();
            }
        }
        (Some(Value::Array(a)), Some(Value::Array(b))) if node.list().0 != ListType::Atomic => {
            let (lt, elem) = node.list();
            let la: Vec<(PathElement, &Value)> = a
                .iter()
                .enumerate()
                .map(|(i, v)| (item_pe(&lt, i, v), v))
                .collect();
            let lb: Vec<(PathElement, &Value)> = b
                .iter()
                .enumerate()
                .map(|(i, v)| (item_pe(&lt, i, v), v))
                .collect();
            let mut seen: Vec<&PathElement> = Vec::new();
            for (pe, _) in la.iter().chain(lb.iter()) {
                if seen.contains(&pe) {
                    continue;
                }
                seen.push(pe);
                path.push(pe.clone());
                let (x, y) = (find_item(&la, pe), find_item(&lb, pe));
                if matches!(lt, ListType::Map(_)) {
                    compare(x, y, elem, false, path, out);
                } else {
                    compare(x, y, Node::Deduced, false, path, out);
                }
                path.pop();
            }
        }
        (Some(a), Some(b)) => {
            if a != b {
                out.modified.insert(path);
            }
        }
    }
}

impl Comparison {
    /// The comparison with the given top-level fields (and everything below) left out.
    fn without(self, top_level: &[&str]) -> Comparison {
        Comparison {
            added: without_top_level(self.added, top_level),
            modified: without_top_level(self.modified, top_level),
            removed: without_top_level(self.removed, top_level),
        }
    }
}

fn find_item<'v>(l: &[(PathElement, &'v Value)], pe: &PathElement) -> Option<&'v Value> {
    l.iter().find(|(p, _)| p == pe).map(|(_, v)| *v)
}

fn comparison(l: &Value, r: &Value, node: Node<'_>) -> Comparison {
    let mut out = Comparison::default();
    compare(Some(l), Some(r), node, true, &mut Vec::new(), &mut out);
    out
}

/// Merges an applied configuration into a live value (the configuration wins).
fn merge(lhs: Option<&Value>, rhs: &Value, node: Node<'_>, top: bool) -> Value {
    match (lhs, rhs) {
        (Some(Value::Object(l)), Value::Object(r)) if node.obj_kind() != ObjKind::Atomic => {
            let mut out = l.clone();
            for (k, rv) in r {
                let (child, _) = node.child(k, top);
                let merged = merge(l.get(k), rv, child, false);
                out.insert(k.clone(), merged);
            }
            Value::Object(out)
        }
        (Some(Value::Array(l)), Value::Array(r)) => {
            let (lt, elem) = node.list();
            match lt {
                ListType::Atomic => rhs.clone(),
                _ => Value::Array(merge_list(l, r, &lt, elem)),
            }
        }
        _ => rhs.clone(),
    }
}

/// Merges associative lists with upstream's ordering: live-only items stay where they were,
/// applied items follow the applied order, shared items move to the applied order.
fn merge_list(l: &[Value], r: &[Value], lt: &ListType, elem: Node<'_>) -> Vec<Value> {
    let lpe: Vec<PathElement> = l
        .iter()
        .enumerate()
        .map(|(i, v)| item_pe(lt, i, v))
        .collect();
    let rpe: Vec<PathElement> = r
        .iter()
        .enumerate()
        .map(|(i, v)| item_pe(lt, i, v))
        .collect();
    let l_at = |pe: &PathElement| lpe.iter().position(|p| p == pe).map(|i| &l[i]);
    let r_has = |pe: &PathElement| rpe.contains(pe);
    let mut shared: std::collections::VecDeque<&PathElement> =
        rpe.iter().filter(|pe| lpe.contains(pe)).collect();
    let mut next_shared = shared.pop_front();
    let mut merged_r: Vec<PathElement> = Vec::new();
    let item = |lv: Option<&Value>, rv: &Value| match lt {
        ListType::Map(_) => merge(lv, rv, elem, false),
        _ => rv.clone(),
    };
    let mut out = Vec::with_capacity(l.len().max(r.len()));
    let (mut li, mut ri) = (0, 0);
    while li < l.len() || ri < r.len() {
        if li < l.len() && ri < r.len() {
            let pe = &lpe[li];
            if *pe == rpe[ri] {
                merged_r.push(pe.clone());
                out.push(item(Some(&l[li]), &r[ri]));
                li += 1;
                ri += 1;
                next_shared = shared.pop_front();
                continue;
            }
            if r_has(pe) && next_shared.is_some_and(|n| n != pe) {
                li += 1;
                continue;
            }
        }
        if li < l.len() {
            let pe = &lpe[li];
            if !r_has(pe) {
                out.push(l[li].clone());
                li += 1;
                continue;
            } else if merged_r.contains(pe) || ri >= r.len() {
                // The second condition cannot hold (every applied item is merged by the time
                // `ri` ends) but guarantees progress.
                li += 1;
                continue;
            }
        }
        if ri < r.len() {
            let pe = &rpe[ri];
            merged_r.push(pe.clone());
            out.push(item(l_at(pe), &r[ri]));
            ri += 1;
            if next_shared == Some(pe) {
                next_shared = shared.pop_front();
            }
        }
    }
    out
}

/// Adds, as members, the declared struct fields on the way to every path of `set` (upstream
/// `EnsureNamedFieldsAreMembers`), so dropping the last owned field of a struct drops the struct.
fn ensure_named(set: &FieldSet, node: Node<'_>, top: bool) -> FieldSet {
    let mut out = FieldSet::new();
    for m in set.members() {
        out.insert_member(m.clone());
    }
    for (pe, sub) in set.children() {
        let child = match pe {
            PathElement::Field(name) => {
                let (child, declared) = node.child(name, top);
                if declared && node.obj_kind() == ObjKind::Struct && !sub.is_empty() {
                    out.insert_member(pe.clone());
                }
                child
            }
            _ => node.list().1,
        };
        *out.child_mut(pe.clone()) = ensure_named(sub, child, false);
    }
    out.normalized()
}

/// Removes the member paths of `set` from `v`.
fn remove_items(v: &mut Value, set: &FieldSet, node: Node<'_>, top: bool) {
    match v {
        Value::Object(m) => {
            for pe in set.members() {
                if let PathElement::Field(name) = pe {
                    m.shift_remove(name);
                }
            }
            for (pe, sub) in set.children() {
                if let PathElement::Field(name) = pe
                    && let Some(cv) = m.get_mut(name)
                {
                    let (child, _) = node.child(name, top);
                    remove_items(cv, sub, child, false);
                }
            }
        }
        Value::Array(a) => {
            let (lt, elem) = node.list();
            let items = std::mem::take(a);
            for (i, mut item) in items.into_iter().enumerate() {
                let pe = item_pe(&lt, i, &item);
                if set.has_member(&pe) {
                    continue;
                }
                if let Some(sub) = set.child(&pe) {
                    remove_items(&mut item, sub, elem, false);
                }
                a.push(item);
            }
        }
        _ => {}
    }
}

/// A server-side apply request with every option.
#[derive(Debug, Clone, Copy)]
pub struct ApplyRequest<'a> {
    /// The stored object, `None` when the apply creates it.
    pub live: Option<&'a Value>,
    /// The applied configuration (the request body, decoded from YAML or JSON).
    pub applied: &'a Value,
    /// The `fieldManager` query parameter (required by the caller).
    pub manager: &'a str,
    /// The `force` query parameter.
    pub force: bool,
    /// The current time, RFC 3339 with seconds precision, for `managedFields[].time`.
    pub now: &'a str,
    /// The resource type; its `schema` gives CRD list types.
    pub rt: &'a ResourceType,
    /// `Some("status")` for an apply sent to the `/status` subresource.
    pub subresource: Option<&'a str>,
}

/// Server-side apply on the main resource. See [`server_side_apply_with`].
pub fn server_side_apply(
    live: Option<&Value>,
    applied: &Value,
    manager: &str,
    force: bool,
    now: &str,
    rt: &ResourceType,
) -> Result<Value, ApiError> {
    server_side_apply_with(ApplyRequest {
        live,
        applied,
        manager,
        force,
        now,
        rt,
        subresource: None,
    })
}

/// Server-side apply: returns the new object with `metadata.managedFields` updated.
///
/// Errors: 400 when `apiVersion`/`kind` do not match the resource or `managedFields` is set in
/// the configuration; 409 Conflict with `FieldManagerConflict` causes when another manager owns
/// a field this apply changes and `force` is off. The caller keeps its own rules for what comes
/// after: name/namespace/uid on create, the status reset of the main resource (the result still
/// carries any `.status` the configuration had), defaulting and validation.
pub fn server_side_apply_with(req: ApplyRequest<'_>) -> Result<Value, ApiError> {
    let ApplyRequest {
        live,
        applied,
        manager,
        force,
        now,
        rt,
        subresource,
    } = req;
    let subresource = subresource.unwrap_or("");
    let Value::Object(cfg) = applied else {
        return Err(ApiError::bad_request(
            "the applied configuration must be an object",
        ));
    };
    let expected = rt.api_version();
    let given = cfg.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    if given != expected {
        return Err(ApiError::bad_request(format!(
            "Incorrect version specified in apply patch. Specified patch version: {given}, \
             expected: {expected}"
        )));
    }
    match cfg.get("kind").and_then(Value::as_str) {
        Some(k) if k == rt.kind => {}
        Some(k) => {
            return Err(ApiError::bad_request(format!(
                "Incorrect kind specified in apply patch. Specified patch kind: {k}, expected: {}",
                rt.kind
            )));
        }
        None => {
            return Err(ApiError::bad_request(format!(
                "Object 'Kind' is missing in '{applied}'"
            )));
        }
    }
    if managed_fields_of(applied).is_some_and(|m| !m.is_null()) {
        return Err(ApiError::bad_request("metadata.managedFields must be nil"));
    }

    let node = Node::root(&expected, &rt.kind, rt.schema.as_ref());
    let live_obj = live.map_or_else(|| json!({}), without_managed_fields);
    let reset = reset_fields(Some(rt), subresource);
    // Fields the strategy resets are neither merged, owned nor compared (upstream ignores them
    // in the field manager), so they can never conflict.
    let mut config = without_managed_fields(applied);
    if let Some(m) = config.as_object_mut() {
        m.retain(|k, _| !reset.contains(&k.as_str()));
    }
    let mut entries = decode_entries(live.and_then(managed_fields_of)).unwrap_or_else(|e| {
        tracing::debug!(error = %e, "ignoring undecodable managedFields");
        Vec::new()
    });

    if let Some(existing) = live.filter(|_| entries.is_empty()) {
        // An object nobody manages yet: its current fields become the `before-first-apply`
        // updater's, so an apply that changes them conflicts as on the real server.
        let write = Write {
            manager: "before-first-apply",
            operation: "Update",
            api_version: &expected,
            subresource,
            now,
            reset: reset_fields(Some(rt), subresource),
        };
        let current = without_managed_fields(existing);
        record_update(&json!({}), &current, node, &mut entries, &write);
    }
    let mine = entries
        .iter()
        .position(|e| e.is(manager, "Apply", subresource, &expected));
    let last = mine.map(|i| entries[i].set.clone());
    let previous_time = mine.and_then(|i| entries[i].time.clone());
    let applied_set = without_top_level(
        field_set(&config, node),
        reset_fields(Some(rt), subresource),
    );
    let me = Entry {
        manager: manager.to_owned(),
        operation: "Apply".into(),
        api_version: expected.clone(),
        time: previous_time,
        subresource: subresource.to_owned(),
        set: applied_set,
    };
    let mine = match mine {
        Some(i) => {
            entries[i] = me;
            i
        }
        None => {
            entries.push(me);
            entries.len() - 1
        }
    };

    let mut new_obj = merge(Some(&live_obj), &config, node, true);
    if let Some(last) = last.filter(|l| !l.is_empty()) {
        let keep = entries
            .iter()
            .fold(FieldSet::new(), |acc, e| acc.union(&e.set));
        let remove = ensure_named(&last, node, true).difference(&ensure_named(&keep, node, true));
        remove_items(&mut new_obj, &remove, node, true);
    }
    super::prune_nulls(&mut new_obj);

    let cmp = comparison(&live_obj, &new_obj, node).without(reset);
    let changed_or_added = cmp.modified.union(&cmp.added);
    let mut conflicts: Vec<(usize, FieldSet)> = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        if i == mine {
            continue;
        }
        let c = e.set.intersection(&changed_or_added);
        if !c.is_empty() {
            conflicts.push((i, c));
        }
    }
    if !force && !conflicts.is_empty() {
        return Err(conflict_error(&entries, &conflicts));
    }
    for (i, c) in &conflicts {
        entries[*i].set = entries[*i].set.difference(c);
    }
    for (i, e) in entries.iter_mut().enumerate() {
        if i != mine {
            e.set = e.set.difference(&cmp.removed);
        }
    }
    let strip = strip_set();
    entries[mine].set = entries[mine].set.difference(&strip);
    if new_obj != live_obj || entries[mine].time.is_none() {
        entries[mine].time = Some(now.to_owned());
    }
    write_entries(&mut new_obj, entries);
    Ok(new_obj)
}

fn conflict_error(entries: &[Entry], conflicts: &[(usize, FieldSet)]) -> ApiError {
    let mut by_manager: Vec<(&Entry, Vec<Path>)> = conflicts
        .iter()
        .map(|(i, set)| (&entries[*i], set.paths()))
        .collect();
    by_manager.sort_by_key(|(e, _)| e.identity());
    let causes: Vec<Cause> = by_manager
        .iter()
        .flat_map(|(e, paths)| {
            paths.iter().map(|p| Cause {
                reason: "FieldManagerConflict".into(),
                message: format!("conflict with {}", e.describe()),
                field: p.to_string(),
            })
        })
        .collect();
    let message = if causes.len() == 1 {
        format!(
            "Apply failed with 1 conflict: {}: {}",
            causes[0].message, causes[0].field
        )
    } else {
        let mut lines = Vec::new();
        for (e, paths) in &by_manager {
            lines.push(format!("conflicts with {}:", e.describe()));
            lines.extend(paths.iter().map(|p| format!("- {p}")));
        }
        format!(
            "Apply failed with {} conflicts: {}",
            causes.len(),
            lines.join("\n")
        )
    };
    ApiError::new(409, "Conflict", message).with_causes(&causes)
}

/// Who makes a non-apply write, for [`record_update`].
struct Write<'a> {
    manager: &'a str,
    operation: &'a str,
    api_version: &'a str,
    subresource: &'a str,
    now: &'a str,
    reset: &'a [&'a str],
}

/// Upstream's update step: the writer owns what it changed or added; everyone (the writer's
/// own earlier entry included) loses what changed or went away.
fn record_update(
    old: &Value,
    new: &Value,
    node: Node<'_>,
    entries: &mut Vec<Entry>,
    w: &Write<'_>,
) {
    let cmp = comparison(old, new, node).without(w.reset);
    let changed_or_added = cmp.modified.union(&cmp.added);
    for e in entries.iter_mut() {
        e.set = e.set.difference(&changed_or_added).difference(&cmp.removed);
    }
    let mine = without_top_level(changed_or_added, w.reset).difference(&strip_set());
    if mine.is_empty() {
        return;
    }
    match entries
        .iter_mut()
        .find(|e| e.is(w.manager, w.operation, w.subresource, w.api_version))
    {
        Some(e) => {
            e.set = e.set.union(&mine);
            e.time = Some(w.now.to_owned());
        }
        None => entries.push(Entry {
            manager: w.manager.to_owned(),
            operation: w.operation.to_owned(),
            api_version: w.api_version.to_owned(),
            time: Some(w.now.to_owned()),
            subresource: w.subresource.to_owned(),
            set: mine,
        }),
    }
}

/// Records a non-apply write (create, update, non-apply patch) in `new.metadata.managedFields`:
/// `manager` (with `operation`, normally `Update`) comes to own what the write changed or
/// added, and other managers lose what it changed or removed.
///
/// The managed fields start from `new`'s own when the client sent a non-empty list (`[]` or
/// `[{}]` resets them), otherwise from `old`'s, as the real server does.
pub fn update_managed_fields(
    old: Option<&Value>,
    new: &mut Value,
    manager: &str,
    operation: &str,
    now: &str,
) {
    update_managed_fields_with(old, new, manager, operation, now, None, None);
}

/// [`update_managed_fields`] knowing the resource type (CRD list types, status subresource
/// rules) and the subresource written (`Some("status")`).
pub fn update_managed_fields_with(
    old: Option<&Value>,
    new: &mut Value,
    manager: &str,
    operation: &str,
    now: &str,
    rt: Option<&ResourceType>,
    subresource: Option<&str>,
) {
    let subresource = subresource.unwrap_or("");
    let api_version = new
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    let kind = new
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    let node = Node::root(&api_version, &kind, rt.and_then(|r| r.schema.as_ref()));

    let sent = managed_fields_of(new);
    let reset = match sent {
        Some(Value::Array(a)) => {
            a.is_empty() || (a.len() == 1 && a[0].as_object().is_some_and(Map::is_empty))
        }
        _ => false,
    };
    let mut entries = if reset {
        Vec::new()
    } else {
        match (subresource.is_empty(), decode_entries(sent)) {
            (true, Ok(e)) if !e.is_empty() => e,
            _ => decode_entries(old.and_then(managed_fields_of)).unwrap_or_default(),
        }
    };

    let old_obj = old.map_or_else(|| json!({}), without_managed_fields);
    let new_obj = without_managed_fields(new);
    let write = Write {
        manager,
        operation,
        api_version: &api_version,
        subresource,
        now,
        reset: reset_fields(rt, subresource),
    };
    record_update(&old_obj, &new_obj, node, &mut entries, &write);
    *new = new_obj;
    write_entries(new, entries);
}
