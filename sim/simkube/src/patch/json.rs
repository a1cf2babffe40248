//! JSON patch (RFC 6902) with the behaviour of kube-apiserver's JSON patch library.
//!
//! Differences from a strict RFC reading that real clients depend on or may observe:
//! - `test` against a missing member (or a `null` one) passes when the expected value is
//!   `null` or absent; kube-runtime's finalizer helper sends `test /metadata/finalizers null`.
//! - `replace` of a missing object member adds it; `copy` from a missing member copies `null`.
//! - Negative array indices count from the end; the root path `""` is not addressable.
//! - Any failure while applying is a 422 Invalid whose message is the generic
//!   `the server rejected our request due to an error in our request`, as the real server
//!   answers; a body that is not a list of operations is a 400 BadRequest.
//!
//! The patch is applied to a copy, so a failing operation leaves the target untouched.

use serde_json::{Value, json};

use crate::error::ApiError;

/// The real server refuses longer patches with 413.
const MAX_OPERATIONS: usize = 10_000;

/// Why an operation failed; the server hides it behind a generic message, but tests and logs
/// can see it through [`apply_ops`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OpError(pub(crate) String);

/// Applies an RFC 6902 patch to `target` with Kubernetes semantics. On error `target` is
/// unchanged.
pub fn json_patch(target: &mut Value, patch: &Value) -> Result<(), ApiError> {
    let ops = match patch {
        Value::Array(ops) => ops,
        Value::Null => return Ok(()),
        other => {
            return Err(ApiError::bad_request(format!(
                "json: cannot unmarshal {} into Go value of type jsonpatch.Patch",
                go_type_name(other)
            )));
        }
    };
    for op in ops {
        if !op.is_object() && !op.is_null() {
            return Err(ApiError::bad_request(format!(
                "json: cannot unmarshal {} into Go value of type jsonpatch.Operation",
                go_type_name(op)
            )));
        }
    }
    if ops.len() > MAX_OPERATIONS {
        return Err(ApiError::new(
            413,
            "RequestEntityTooLarge",
            format!(
                "The allowed maximum operations in a JSON patch is {MAX_OPERATIONS}, got {}",
                ops.len()
            ),
        ));
    }
    let mut doc = target.clone();
    apply_ops(&mut doc, ops).map_err(|e| {
        tracing::debug!(reason = %e.0, "JSON patch rejected");
        let mut err = ApiError::new(
            422,
            "Invalid",
            "the server rejected our request due to an error in our request",
        );
        err.details = Some(json!({}));
        err
    })?;
    *target = doc;
    Ok(())
}

fn go_type_name(v: &Value) -> &'static str {
    match v {
        Value::Object(_) => "object",
        Value::Array(_) => "array",
        Value::String(_) => "string",
        Value::Number(_) => "number",
        Value::Bool(_) => "bool",
        Value::Null => "null",
    }
}

/// Applies the operations in order, stopping at the first failure (`doc` may then be partly
/// changed; [`json_patch`] works on a copy).
pub(crate) fn apply_ops(doc: &mut Value, ops: &[Value]) -> Result<(), OpError> {
    for op in ops {
        let kind = op.get("op").and_then(Value::as_str).unwrap_or("unknown");
        match kind {
            "add" => {
                let path = path_of(op, "path", "add")?;
                let value = op.get("value").cloned().unwrap_or(Value::Null);
                let (parent, key) = find_parent(doc, &path).ok_or_else(|| {
                    OpError(format!(
                        "add operation does not apply: doc is missing path: {path:?}"
                    ))
                })?;
                add(parent, &key, value)?;
            }
            "remove" => {
                let path = path_of(op, "path", "remove")?;
                let (parent, key) = find_parent(doc, &path).ok_or_else(|| {
                    OpError(format!(
                        "remove operation does not apply: doc is missing path: {path:?}"
                    ))
                })?;
                remove(parent, &key)?;
            }
            "replace" => {
                let path = path_of(op, "path", "replace")?;
                let value = op.get("value").cloned().unwrap_or(Value::Null);
                let (parent, key) = find_parent(doc, &path).ok_or_else(|| {
                    OpError(format!(
                        "replace operation does not apply: doc is missing path: {path}"
                    ))
                })?;
                set(parent, &key, value)?;
            }
            "move" => {
                let from = path_of(op, "from", "move")?;
                let (parent, key) = find_parent(doc, &from).ok_or_else(|| {
                    OpError(format!(
                        "move operation does not apply: doc is missing from path: {from}"
                    ))
                })?;
                let value = get(parent, &key)?.cloned().unwrap_or(Value::Null);
                remove(parent, &key)?;
                let path = path_of(op, "path", "move")?;
                let (parent, key) = find_parent(doc, &path).ok_or_else(|| {
                    OpError(format!(
                        "move operation does not apply: doc is missing destination path: {path}"
                    ))
                })?;
                add(parent, &key, value)?;
            }
            "copy" => {
                let from = path_of(op, "from", "copy")?;
                let (parent, key) = find_parent(doc, &from).ok_or_else(|| {
                    OpError(format!(
                        "copy operation does not apply: doc is missing from path: {from}"
                    ))
                })?;
                let value = get(parent, &key)?.cloned().unwrap_or(Value::Null);
                let path = path_of(op, "path", "copy")?;
                let (parent, key) = find_parent(doc, &path).ok_or_else(|| {
                    OpError(format!(
                        "copy operation does not apply: doc is missing destination path: {path}"
                    ))
                })?;
                add(parent, &key, value)?;
            }
            "test" => {
                let path = path_of(op, "path", "test")?;
                let (parent, key) = find_parent(doc, &path).ok_or_else(|| {
                    OpError(format!("test operation does not apply: is nil for {path}"))
                })?;
                let have = get(parent, &key)?;
                let want = op.get("value").filter(|v| !v.is_null());
                let ok = match (have, want) {
                    (None, None) => true,
                    (None, Some(_)) | (Some(_), None) => false,
                    (Some(h), Some(w)) => h == w,
                };
                if !ok {
                    return Err(OpError(format!("testing value {path} failed")));
                }
            }
            other => return Err(OpError(format!("Unexpected kind: {other}"))),
        }
    }
    Ok(())
}

fn path_of(op: &Value, field: &str, kind: &str) -> Result<String, OpError> {
    match op.get(field) {
        Some(Value::String(s)) => Ok(s.clone()),
        _ => Err(OpError(format!("{kind} operation missing {field} field"))),
    }
}

/// RFC 6901 unescaping: `~1` is `/`, `~0` is `~`, in one pass.
fn decode_token(t: &str) -> String {
    let mut out = String::with_capacity(t.len());
    let mut chars = t.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '~' {
            match chars.peek() {
                Some('1') => {
                    out.push('/');
                    chars.next();
                }
                Some('0') => {
                    out.push('~');
                    chars.next();
                }
                _ => out.push(c),
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The container holding the last token of `path`, and that token, decoded. `None` when an
/// intermediate member is missing, `null` or a scalar, or the path has no token at all.
fn find_parent<'a>(doc: &'a mut Value, path: &str) -> Option<(&'a mut Value, String)> {
    let parts: Vec<&str> = path.split('/').collect();
    if parts.len() < 2 {
        return None;
    }
    let mut cur = doc;
    for raw in &parts[1..parts.len() - 1] {
        let key = decode_token(raw);
        let next = match cur {
            Value::Object(m) => m.get_mut(&key)?,
            Value::Array(a) => {
                let idx = resolve_index(&key, a.len())?;
                a.get_mut(idx)?
            }
            _ => return None,
        };
        if !(next.is_object() || next.is_array()) {
            return None;
        }
        cur = next;
    }
    let last = decode_token(parts[parts.len() - 1]);
    Some((cur, last))
}

/// Go's `strconv.Atoi`: optional sign, decimal digits.
fn atoi(s: &str) -> Option<i64> {
    let digits = s.strip_prefix(['+', '-']).unwrap_or(s);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// An existing element's index; negative counts from the end.
fn resolve_index(key: &str, len: usize) -> Option<usize> {
    let idx = atoi(key)?;
    let len = i64::try_from(len).ok()?;
    let idx = if idx < 0 { idx + len } else { idx };
    if idx < 0 || idx >= len {
        None
    } else {
        usize::try_from(idx).ok()
    }
}

fn get<'a>(container: &'a Value, key: &str) -> Result<Option<&'a Value>, OpError> {
    match container {
        Value::Object(m) => Ok(m.get(key).filter(|v| !v.is_null())),
        Value::Array(a) => match resolve_index(key, a.len()) {
            Some(i) => Ok(a.get(i).filter(|v| !v.is_null())),
            None => Err(OpError(format!("Unable to access invalid index: {key}"))),
        },
        _ => Err(OpError("container is not an object or array".into())),
    }
}

fn add(container: &mut Value, key: &str, value: Value) -> Result<(), OpError> {
    match container {
        Value::Object(m) => {
            m.insert(key.to_owned(), value);
            Ok(())
        }
        Value::Array(a) => {
            if key == "-" {
                a.push(value);
                return Ok(());
            }
            let idx = atoi(key)
                .ok_or_else(|| OpError(format!("value was not a proper array index: '{key}'")))?;
            let new_len = i64::try_from(a.len() + 1).unwrap_or(i64::MAX);
            let idx = if idx < 0 { idx + new_len } else { idx };
            if idx < 0 || idx >= new_len {
                return Err(OpError(format!("Unable to access invalid index: {key}")));
            }
            let idx = usize::try_from(idx).map_err(|_| OpError("bad index".into()))?;
            a.insert(idx, value);
            Ok(())
        }
        _ => Err(OpError("container is not an object or array".into())),
    }
}

fn set(container: &mut Value, key: &str, value: Value) -> Result<(), OpError> {
    match container {
        Value::Object(m) => {
            m.insert(key.to_owned(), value);
            Ok(())
        }
        Value::Array(a) => {
            let idx = resolve_index(key, a.len()).ok_or_else(|| {
                OpError(format!(
                    "replace operation does not apply: doc is missing key: {key}"
                ))
            })?;
            a[idx] = value;
            Ok(())
        }
        _ => Err(OpError("container is not an object or array".into())),
    }
}

fn remove(container: &mut Value, key: &str) -> Result<(), OpError> {
    match container {
        Value::Object(m) => m.shift_remove(key).map(|_| ()).ok_or_else(|| {
            OpError(format!(
                "Unable to remove nonexistent key: {key}: missing value"
            ))
        }),
        Value::Array(a) => {
            let idx = resolve_index(key, a.len())
                .ok_or_else(|| OpError(format!("Unable to access invalid index: {key}")))?;
            a.remove(idx);
            Ok(())
        }
        _ => Err(OpError("container is not an object or array".into())),
    }
}
