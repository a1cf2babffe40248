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
//!   other managers lose what they changed or removed. `managedFields: []` or `[{}]` in an
//!   update clears them, and an existing object without managed fields stays without through
//!   updates: only a create or an apply starts tracking again.
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

mod managed_fields;
mod merge;
use managed_fields::*;
use merge::*;

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
/// `[{}]` resets them), otherwise from `old`'s, as the real server does; an update that
/// starts from none records nothing (only a create does).
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

    let new_obj = without_managed_fields(new);
    if entries.is_empty() && old.is_some() {
        // An existing object nobody manages (its fields were cleared, or it predates
        // tracking) stays untracked through updates until an apply, as upstream's
        // skip-non-applied manager keeps it: only a create starts tracking.
        *new = new_obj;
        return;
    }
    let old_obj = old.map_or_else(|| json!({}), without_managed_fields);
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
