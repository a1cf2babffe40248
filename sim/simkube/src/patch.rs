//! The four patch types of kube-apiserver, as pure functions on JSON values.
//!
//! - [`merge_patch`]: JSON merge patch (RFC 7386) with the pruning quirks of the Go library the
//!   real server uses.
//! - [`json_patch`]: JSON patch (RFC 6902) with kube-apiserver's behaviour, including `test` of a
//!   missing member against `null` passing (kube-runtime's finalizer helper depends on it).
//! - [`strategic_merge_patch`]: strategic merge patch for built-in kinds, driven by the upstream
//!   `patchMergeKey` / `patchStrategy` table in [`schema`].
//! - [`server_side_apply`] and [`update_managed_fields`]: server-side apply with field ownership
//!   recorded in `metadata.managedFields` (a documented subset of structured-merge-diff).
//!
//! Callers own everything around the patch: decoding the body, preconditions, status rules,
//! defaulting and validation. One rule belongs to the caller in particular: the Go server never
//! stores an empty `metadata.finalizers: []` (its JSON encoding omits it), so a write whose result
//! holds an empty finalizer list must drop the key before comparing or storing.

// `ApiError` is the crate's Status value; boxing it would only move the allocation to callers.
#![allow(clippy::result_large_err)]

mod apply;
mod fieldset;
mod json;
pub mod schema;
mod strategic;

use serde_json::Value;

pub use apply::{
    ApplyRequest, server_side_apply, server_side_apply_with, update_managed_fields,
    update_managed_fields_with,
};
pub use fieldset::{FieldSet, PathElement};
pub use json::json_patch;
pub use strategic::strategic_merge_patch;

use crate::error::ApiError;

/// Applies a JSON merge patch (RFC 7386) to `target` in place.
///
/// Objects merge recursively and `null` deletes a member; anything else replaces. New values
/// lose their `null` members, also inside objects nested in arrays, as the Go library does.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch_map) = patch else {
        *target = pruned(patch.clone());
        return;
    };
    if !target.is_object() {
        *target = Value::Object(serde_json::Map::new());
    }
    let Value::Object(doc) = target else {
        return;
    };
    for (key, pv) in patch_map {
        if pv.is_null() {
            doc.remove(key);
            continue;
        }
        match doc.get_mut(key) {
            Some(cur) if cur.is_object() => {
                if pv.is_object() {
                    merge_patch(cur, pv);
                } else {
                    // The Go library replaces an object by a non-object without pruning it.
                    *cur = pv.clone();
                }
            }
            Some(cur) if !cur.is_null() => *cur = pruned(pv.clone()),
            _ => {
                doc.insert(key.clone(), pruned(pv.clone()));
            }
        }
    }
}

/// [`merge_patch`] with the body checks of the real server: a patch that is not a JSON object
/// is a 400 BadRequest `Invalid JSON Patch`, and nothing is changed.
pub fn merge_patch_checked(target: &mut Value, patch: &Value) -> Result<(), ApiError> {
    if !patch.is_object() {
        return Err(ApiError::bad_request("Invalid JSON Patch"));
    }
    merge_patch(target, patch);
    Ok(())
}

/// Removes `null` members of objects, recursing into objects and arrays (array elements that
/// are `null` stay).
fn pruned(mut v: Value) -> Value {
    prune_nulls(&mut v);
    v
}

fn prune_nulls(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.retain(|_, x| !x.is_null());
            m.values_mut().for_each(prune_nulls);
        }
        Value::Array(a) => a.iter_mut().for_each(prune_nulls),
        _ => {}
    }
}

#[cfg(test)]
mod tests;
