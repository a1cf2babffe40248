//! Strategic merge patch for built-in kinds, with the merge rules of apimachinery's
//! `strategicpatch` package as the server applies it (`MergeParallelList` and
//! `IgnoreUnmatchedNulls` on).
//!
//! Lists with `patchStrategy: merge` merge element-wise by their merge key (or as a set for
//! scalars); other lists are replaced. Directives: `$patch: replace | delete` on maps and list
//! elements, `$deleteFromPrimitiveList/<field>`, `$setElementOrder/<field>` and `$retainKeys`.
//! Element order follows the upstream rules: `$setElementOrder` first, then the patch's order,
//! then the live order.

use serde_json::{Map, Value, json};

use super::schema::{self, Field, Smp, Ty};
use crate::error::ApiError;

const DIRECTIVE: &str = "$patch";
const RETAIN_KEYS: &str = "$retainKeys";
const SET_ORDER: &str = "$setElementOrder/";
const DELETE_PRIMITIVE: &str = "$deleteFromPrimitiveList/";

/// How the real server classifies a strategic-merge failure.
#[derive(Debug, Clone, PartialEq, Eq)]
enum SmpError {
    /// A malformed directive: 400 BadRequest with the library's message.
    BadRequest(&'static str),
    /// Lists of lists: 422 with the generic Invalid message.
    Invalid,
    /// Anything else surfaces as a 500 carrying the library's message.
    Other(String),
}

impl From<SmpError> for ApiError {
    fn from(e: SmpError) -> Self {
        match e {
            SmpError::BadRequest(m) => ApiError::bad_request(m),
            SmpError::Invalid => {
                let mut err = ApiError::new(
                    422,
                    "Invalid",
                    "the server rejected our request due to an error in our request",
                );
                err.details = Some(serde_json::json!({}));
                err
            }
            SmpError::Other(m) => ApiError::new(500, "", m),
        }
    }
}

type Res<T> = Result<T, SmpError>;

/// Applies a strategic merge patch to a built-in object and returns the result.
///
/// `api_version` and `kind` pick the merge keys. Custom resources (any group the API server
/// does not serve itself) get the real server's 415; a patch that is not a JSON object is a 400.
/// Errors leave nothing half-applied: the input is not modified.
pub fn strategic_merge_patch(
    original: &Value,
    patch: &Value,
    api_version: &str,
    kind: &str,
) -> Result<Value, ApiError> {
    let Some(ty) = schema::root(api_version, kind) else {
        return Err(ApiError::unsupported_media_type(
            "the body of the request was in an unknown format - accepted media types include: \
             application/json-patch+json, application/merge-patch+json, \
             application/apply-patch+yaml",
        ));
    };
    let Value::Object(patch) = patch else {
        let what = match patch {
            Value::Array(_) => "array",
            Value::String(_) => "string",
            Value::Number(_) => "number",
            Value::Bool(_) => "bool",
            _ => "null",
        };
        return Err(ApiError::bad_request(format!(
            "json: cannot unmarshal {what} into Go value of type map[string]interface {{}}"
        )));
    };
    let original = original.as_object().cloned().unwrap_or_default();
    let merged = merge_map(original, patch.clone(), Field::Struct(ty))?;
    // The real server decodes the result into the Go type and encodes it again, which drops
    // every `null` and any directive left inside elements that were taken whole.
    Ok(fresh(Value::Object(merged)).unwrap_or_else(|| json!({})))
}

/// The metadata of member `key` of an object described by `at`.
fn child(at: Field, key: &str) -> Field {
    match at {
        Field::Struct(ty) => schema::field(ty, key),
        Field::Plain => schema::field(Ty::Generic, key),
        _ => Field::Plain,
    }
}

/// The element metadata of a list field.
fn element(list: Field) -> Field {
    match list {
        Field::List { elem: Some(t), .. } => Field::Struct(t),
        _ => Field::Plain,
    }
}

fn merge_key(list: Field) -> Option<&'static str> {
    match list {
        Field::List {
            smp: Smp::Merge(k), ..
        } => k,
        _ => None,
    }
}

fn is_merge_list(list: Field) -> bool {
    matches!(
        list,
        Field::List {
            smp: Smp::Merge(_),
            ..
        }
    )
}

fn merge_map(
    mut original: Map<String, Value>,
    mut patch: Map<String, Value>,
    at: Field,
) -> Res<Map<String, Value>> {
    if let Some(d) = patch.get(DIRECTIVE) {
        return match d.as_str() {
            Some("replace") => {
                patch.remove(DIRECTIVE);
                Ok(patch)
            }
            Some("delete") => Ok(Map::new()),
            _ => Err(SmpError::Other(format!(
                "unknown patch type: {} in map: {}",
                go_fmt(d),
                go_fmt(&Value::Object(patch.clone()))
            ))),
        };
    }
    apply_retain_keys(&mut original, &mut patch)?;
    merge_set_element_order(&mut original, &mut patch, at)?;

    for (key, pv) in patch {
        let (key, delete_list) = match key.strip_prefix(DELETE_PRIMITIVE) {
            Some(rest) => (rest.to_owned(), true),
            None => (key, false),
        };
        if pv.is_null() {
            original.shift_remove(&key);
            continue;
        }
        let Some(ov) = original.get_mut(&key) else {
            if !delete_list && let Some(v) = fresh(pv) {
                original.insert(key, v);
            }
            continue;
        };
        match (ov, pv) {
            (Value::Object(om), Value::Object(pm)) => {
                let merged = merge_map(std::mem::take(om), pm, child(at, &key))?;
                *om = merged;
            }
            (Value::Array(oa), Value::Array(pa)) => {
                let merged =
                    merge_slice_handler(std::mem::take(oa), pa, child(at, &key), delete_list)?;
                *oa = merged;
            }
            (ov, pv) if same_type(ov, &pv) => *ov = pv,
            (_, pv) => {
                if !delete_list {
                    match fresh(pv) {
                        Some(v) => {
                            original.insert(key, v);
                        }
                        None => {
                            original.shift_remove(&key);
                        }
                    }
                }
            }
        }
    }
    Ok(original)
}

/// A patch value taken whole (nothing to merge with): its `null`s and directives go, and an
/// object carrying `$patch` disappears (`None`), as upstream's `removeDirectives` does.
fn fresh(mut v: Value) -> Option<Value> {
    super::prune_nulls(&mut v);
    remove_directives(v)
}

/// Strips directive keys; an object carrying `$patch` disappears (`None`).
fn remove_directives(v: Value) -> Option<Value> {
    match v {
        Value::Object(m) => {
            if m.contains_key(DIRECTIVE) {
                return None;
            }
            let out = m
                .into_iter()
                .filter(|(k, _)| !is_directive_key(k))
                .filter_map(|(k, v)| remove_directives(v).map(|v| (k, v)))
                .collect();
            Some(Value::Object(out))
        }
        Value::Array(a) => Some(Value::Array(
            a.into_iter().filter_map(remove_directives).collect(),
        )),
        other => Some(other),
    }
}

fn is_directive_key(k: &str) -> bool {
    k == RETAIN_KEYS || k.starts_with(SET_ORDER) || k.starts_with(DELETE_PRIMITIVE)
}

fn same_type(a: &Value, b: &Value) -> bool {
    std::mem::discriminant(a) == std::mem::discriminant(b)
}

fn apply_retain_keys(original: &mut Map<String, Value>, patch: &mut Map<String, Value>) -> Res<()> {
    let Some(retain) = patch.shift_remove(RETAIN_KEYS) else {
        return Ok(());
    };
    let Value::Array(retain) = retain else {
        return Err(SmpError::BadRequest("invalid patch format of retainKeys"));
    };
    let keep = |k: &str| retain.iter().any(|r| r.as_str() == Some(k));
    for (k, v) in patch.iter() {
        if v.is_null() || k.starts_with(DELETE_PRIMITIVE) || k.starts_with(SET_ORDER) {
            continue;
        }
        if !keep(k) {
            return Err(SmpError::BadRequest("invalid patch format of retainKeys"));
        }
    }
    original.retain(|k, _| keep(k));
    Ok(())
}

/// Processes every `$setElementOrder/<field>` of this map: merges that list now and orders
/// it by the directive, removing both from the patch.
fn merge_set_element_order(
    original: &mut Map<String, Value>,
    patch: &mut Map<String, Value>,
    at: Field,
) -> Res<()> {
    let keys: Vec<String> = patch
        .keys()
        .filter(|k| k.starts_with(SET_ORDER))
        .cloned()
        .collect();
    for key in keys {
        let order = patch.shift_remove(&key).unwrap_or(Value::Null);
        let Value::Array(order) = order else {
            return Err(SmpError::Other(format!(
                "expected a []interface{{}}, but got a {}",
                go_fmt(&order)
            )));
        };
        let field_name = &key[SET_ORDER.len()..];
        let list_meta = child(at, field_name);
        let mkey = merge_key(list_meta);
        let orig_list = match original.get(field_name) {
            Some(Value::Array(a)) => Some(a.clone()),
            Some(other) => {
                return Err(SmpError::Other(format!(
                    "expected a []interface{{}}, but got a {}",
                    go_fmt(other)
                )));
            }
            None => None,
        };
        let patch_list = match patch.get(field_name) {
            Some(Value::Array(a)) => Some(a.clone()),
            Some(other) => {
                return Err(SmpError::Other(format!(
                    "expected a []interface{{}}, but got a {}",
                    go_fmt(other)
                )));
            }
            None => None,
        };
        validate_patch_with_order(patch_list.as_deref().unwrap_or_default(), &order, mkey)?;
        let merged = match (&orig_list, &patch_list) {
            (Some(o), None) => o.clone(),
            (None, Some(p)) => match remove_directives(Value::Array(p.clone())) {
                Some(Value::Array(a)) => a,
                _ => Vec::new(),
            },
            (Some(o), Some(p)) => merge_slice_handler(o.clone(), p.clone(), list_meta, false)?,
            (None, None) => continue,
        };
        let is_map = merged.first().is_some_and(Value::is_object)
            || order.first().is_some_and(Value::is_object);
        let (in_order, server_only) = partition(&merged, &order, if is_map { mkey } else { None })?;
        let orig_ref = orig_list.unwrap_or_default();
        let both = normalize_element_order(in_order, server_only, &order, &orig_ref, mkey, is_map)?;
        original.insert(field_name.to_owned(), Value::Array(both));
        patch.shift_remove(field_name);
    }
    Ok(())
}

fn validate_patch_with_order(patch: &[Value], order: &[Value], key: Option<&str>) -> Res<()> {
    if patch.is_empty() || order.is_empty() {
        return Ok(());
    }
    let non_delete: Vec<&Value> = if key.is_some() {
        patch
            .iter()
            .filter(|v| v.get(DIRECTIVE).and_then(Value::as_str) != Some("delete"))
            .collect()
    } else {
        patch.iter().collect()
    };
    let (mut pi, mut oi) = (0, 0);
    while pi < non_delete.len() && oi < order.len() {
        if non_delete[pi].get(DIRECTIVE).is_some() {
            pi += 1;
            continue;
        }
        if same_item(non_delete[pi], &order[oi], key) {
            pi += 1;
        }
        oi += 1;
    }
    if pi < non_delete.len() && oi >= order.len() {
        return Err(SmpError::Other(format!(
            "The order in patch list:\n{}\n doesn't match $setElementOrder list:\n{}\n",
            go_fmt(&Value::Array(patch.to_vec())),
            go_fmt(&Value::Array(order.to_vec()))
        )));
    }
    Ok(())
}

fn merge_slice_handler(
    original: Vec<Value>,
    patch: Vec<Value>,
    list: Field,
    delete_list: bool,
) -> Res<Vec<Value>> {
    if is_merge_list(list) || delete_list {
        merge_slice(original, patch, list, delete_list)
    } else {
        Ok(patch)
    }
}

fn merge_slice(
    original: Vec<Value>,
    patch: Vec<Value>,
    list: Field,
    delete_list: bool,
) -> Res<Vec<Value>> {
    if original.is_empty() && patch.is_empty() {
        return Ok(original);
    }
    let is_map = element_kind(&original, &patch)?;
    let key = merge_key(list);
    if !is_map {
        if delete_list {
            return Ok(original
                .into_iter()
                .filter(|v| !patch.contains(v))
                .collect());
        }
        let mut merged: Vec<Value> = Vec::with_capacity(original.len() + patch.len());
        for v in original.iter().chain(patch.iter()) {
            if !merged.contains(v) {
                merged.push(v.clone());
            }
        }
        let (in_patch, server_only) = partition(&merged, &patch, None)?;
        return normalize_element_order(in_patch, server_only, &patch, &original, None, false);
    }
    let Some(key) = key else {
        return Err(SmpError::Other(
            "cannot merge lists without merge key".into(),
        ));
    };
    let (original, patch) = with_special_elements(original, patch, key)?;
    let merged = without_special_elements(original.clone(), &patch, key, element(list))?;
    let (in_patch, server_only) = partition(&merged, &patch, Some(key))?;
    normalize_element_order(in_patch, server_only, &patch, &original, Some(key), true)
}

/// Whether the elements are objects; all elements must share one JSON type.
fn element_kind(a: &[Value], b: &[Value]) -> Res<bool> {
    let mut first: Option<&Value> = None;
    for v in a.iter().chain(b) {
        match first {
            None => {
                if v.is_array() {
                    return Err(SmpError::Invalid);
                }
                first = Some(v);
            }
            Some(f) if !same_type(f, v) => {
                return Err(SmpError::Other(format!(
                    "list element types are not identical: {}",
                    go_fmt(&Value::Array(a.iter().chain(b).cloned().collect()))
                )));
            }
            Some(_) => {}
        }
    }
    Ok(first.is_some_and(Value::is_object))
}

fn no_merge_key(item: &Value, key: &str) -> SmpError {
    SmpError::Other(format!(
        "map: {} does not contain declared merge key: {key}",
        go_fmt(item)
    ))
}

/// Handles `$patch` elements of a keyed list: `delete` removes matching live elements,
/// `replace` makes the rest of the patch the whole list.
fn with_special_elements(
    mut original: Vec<Value>,
    patch: Vec<Value>,
    key: &str,
) -> Res<(Vec<Value>, Vec<Value>)> {
    let mut plain = Vec::new();
    let mut replace = false;
    for v in patch {
        let Some(directive) = v.get(DIRECTIVE) else {
            plain.push(v);
            continue;
        };
        match directive.as_str() {
            Some("delete") => {
                let Some(kv) = v.get(key) else {
                    return Err(no_merge_key(&v, key));
                };
                original.retain(|o| o.get(key) != Some(kv));
            }
            Some("replace") => replace = true,
            Some("merge") => {
                return Err(SmpError::Other(
                    "merging lists cannot yet be specified in the patch".into(),
                ));
            }
            _ => {
                return Err(SmpError::Other(format!(
                    "unknown patch type: {} in map: {}",
                    go_fmt(directive),
                    go_fmt(&v)
                )));
            }
        }
    }
    if replace {
        Ok((plain, Vec::new()))
    } else {
        Ok((original, plain))
    }
}

fn without_special_elements(
    mut original: Vec<Value>,
    patch: &[Value],
    key: &str,
    elem: Field,
) -> Res<Vec<Value>> {
    for pv in patch {
        let Some(kv) = pv.get(key) else {
            return Err(no_merge_key(pv, key));
        };
        match original.iter().position(|o| o.get(key) == Some(kv)) {
            Some(i) => {
                let om = match std::mem::take(&mut original[i]) {
                    Value::Object(m) => m,
                    _ => Map::new(),
                };
                let pm = pv.as_object().cloned().unwrap_or_default();
                original[i] = Value::Object(merge_map(om, pm, elem)?);
            }
            None => original.push(pv.clone()),
        }
    }
    Ok(original)
}

fn same_item(a: &Value, b: &Value, key: Option<&str>) -> bool {
    match key {
        Some(k) => a.is_object() && a.get(k).is_some() && a.get(k) == b.get(k),
        None => a == b,
    }
}

fn index_of(list: &[Value], v: &Value, key: Option<&str>) -> Option<usize> {
    list.iter().position(|x| same_item(x, v, key))
}

/// Splits `merged` into the elements present in `by` and the others, keeping order.
fn partition(merged: &[Value], by: &[Value], key: Option<&str>) -> Res<(Vec<Value>, Vec<Value>)> {
    let mut present = Vec::new();
    let mut others = Vec::new();
    for v in merged {
        if let Some(k) = key
            && v.get(k).is_none()
        {
            return Err(no_merge_key(v, k));
        }
        if index_of(by, v, key).is_some() {
            present.push(v.clone());
        } else {
            others.push(v.clone());
        }
    }
    Ok((present, others))
}

fn normalize_element_order(
    patch_items: Vec<Value>,
    server_only: Vec<Value>,
    patch_order: &[Value],
    server_order: &[Value],
    key: Option<&str>,
    is_map: bool,
) -> Res<Vec<Value>> {
    let patch_items = normalize_slice_order(patch_items, patch_order, key, is_map)?;
    let server_only = normalize_slice_order(server_only, server_order, key, is_map)?;
    Ok(merge_sorted(server_only, patch_items, server_order, key))
}

/// Sorts `items` by their position in `order` (stable; elements absent from `order` keep
/// their relative place at the end); elements marked `$patch: delete` go last, as upstream
/// keeps them.
fn normalize_slice_order(
    items: Vec<Value>,
    order: &[Value],
    key: Option<&str>,
    is_map: bool,
) -> Res<Vec<Value>> {
    let mut to_delete = Vec::new();
    let mut items = items;
    if is_map {
        let k =
            key.ok_or_else(|| SmpError::Other("cannot merge lists without merge key".into()))?;
        for v in items.iter().chain(order) {
            if v.get(k).is_none() {
                return Err(no_merge_key(v, k));
            }
        }
        let (keep, delete): (Vec<Value>, Vec<Value>) = items
            .into_iter()
            .partition(|v| v.get(DIRECTIVE).and_then(Value::as_str) != Some("delete"));
        items = keep;
        to_delete = delete;
    }
    let mut keyed: Vec<(usize, Value)> = items
        .into_iter()
        .map(|v| (index_of(order, &v, key).unwrap_or(usize::MAX), v))
        .collect();
    keyed.sort_by_key(|(i, _)| *i);
    let mut out: Vec<Value> = keyed.into_iter().map(|(_, v)| v).collect();
    out.extend(to_delete);
    Ok(out)
}

/// Interleaves server-only items (`left`) into patch items (`right`), both already sorted,
/// using the live order to decide where a server-only item goes.
fn merge_sorted(
    left: Vec<Value>,
    right: Vec<Value>,
    server_order: &[Value],
    key: Option<&str>,
) -> Vec<Value> {
    let mut out = Vec::with_capacity(left.len() + right.len());
    let (mut i, mut j) = (0, 0);
    while i < left.len() || j < right.len() {
        if i >= left.len() {
            out.push(right[j].clone());
            j += 1;
        } else if j >= right.len() {
            out.push(left[i].clone());
            i += 1;
        } else {
            let li = index_of(server_order, &left[i], key);
            let ri = index_of(server_order, &right[j], key);
            if matches!((li, ri), (Some(l), Some(r)) if l < r) {
                out.push(left[i].clone());
                i += 1;
            } else {
                out.push(right[j].clone());
                j += 1;
            }
        }
    }
    out
}

/// Renders a value the way Go's `%v` prints decoded JSON, for error messages.
fn go_fmt(v: &Value) -> String {
    match v {
        Value::Null => "<nil>".into(),
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::Array(a) => format!("[{}]", a.iter().map(go_fmt).collect::<Vec<_>>().join(" ")),
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            let parts: Vec<String> = keys
                .iter()
                .map(|k| format!("{k}:{}", go_fmt(&m[*k])))
                .collect();
            format!("map[{}]", parts.join(" "))
        }
    }
}
