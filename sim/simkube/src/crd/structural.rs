//! Custom resources against their CRD's structural schema: pruning unknown fields, defaulting and validation, as kube-apiserver does before storing them.

#[allow(clippy::wildcard_imports)]
use super::*;

// ---------------------------------------------------------------------------------------------
// Custom resources: prune, default, validate.

/// Prunes unknown fields, drops non-nullable nulls, applies defaults and validates a custom
/// resource against its type's structural schema. A type without a schema accepts anything.
/// Fails with 422 Invalid, one cause per violation, as the real server.
pub fn prune_default_validate(rt: &ResourceType, obj: &mut Value) -> Result<(), ApiError> {
    let Some(schema) = &rt.schema else {
        return Ok(());
    };
    prune(schema, obj);
    default(schema, obj);
    let causes = validate(schema, obj);
    if causes.is_empty() {
        Ok(())
    } else {
        let name = s(obj, "/metadata/name");
        let name = if name.is_empty() {
            s(obj, "/metadata/generateName")
        } else {
            name
        };
        Err(ApiError::invalid(&rt.group, &rt.kind, name, &causes))
    }
}

pub(super) fn flag(schema: &Value, key: &str) -> bool {
    schema.get(key).and_then(Value::as_bool) == Some(true)
}

/// Removes every field the structural schema does not specify, except where
/// `x-kubernetes-preserve-unknown-fields` allows them, and `apiVersion`, `kind` and `metadata` of
/// the root and of `x-kubernetes-embedded-resource` objects.
pub fn prune(schema: &Value, obj: &mut Value) {
    prune_node(schema, obj, true, "", &mut Vec::new());
}

/// [`prune`], returning the paths of the removed fields (`spec.bogus`, `items[0].x`) in the form
/// `fieldValidation=Strict` reports them: `strict decoding error: unknown field "spec.bogus"`.
pub fn prune_reporting(schema: &Value, obj: &mut Value) -> Vec<String> {
    let mut removed = Vec::new();
    prune_node(schema, obj, true, "", &mut removed);
    removed
}

/// The unknown fields of a custom resource, as [`prune_reporting`] would remove them, without
/// changing it. Empty for types without a schema.
pub fn unknown_fields(rt: &ResourceType, obj: &Value) -> Vec<String> {
    match &rt.schema {
        Some(schema) => prune_reporting(schema, &mut obj.clone()),
        None => Vec::new(),
    }
}

pub(super) fn prune_node(
    schema: &Value,
    v: &mut Value,
    resource_root: bool,
    path: &str,
    removed: &mut Vec<String>,
) {
    match v {
        Value::Object(map) => {
            let props = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties");
            let preserve = flag(schema, "x-kubernetes-preserve-unknown-fields");
            let keys: Vec<String> = map.keys().cloned().collect();
            for k in keys {
                if resource_root && matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
                    // Metadata is the server's to validate; root metadata is never pruned.
                    continue;
                }
                let child_path = child_path(path, &k);
                if let Some(p) = props.and_then(|p| p.get(&k)) {
                    if let Some(child) = map.get_mut(&k) {
                        let embedded = flag(p, "x-kubernetes-embedded-resource");
                        prune_node(p, child, embedded, &child_path, removed);
                    }
                } else if let Some(add @ Value::Object(_)) = additional {
                    if let Some(child) = map.get_mut(&k) {
                        let embedded = flag(add, "x-kubernetes-embedded-resource");
                        prune_node(add, child, embedded, &child_path, removed);
                    }
                } else if !(preserve || additional == Some(&Value::Bool(true))) {
                    map.shift_remove(&k);
                    removed.push(child_path);
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items").filter(|i| i.is_object()) {
                let embedded = flag(item_schema, "x-kubernetes-embedded-resource");
                for (i, item) in items.iter_mut().enumerate() {
                    prune_node(
                        item_schema,
                        item,
                        embedded,
                        &format!("{path}[{i}]"),
                        removed,
                    );
                }
            }
        }
        _ => {}
    }
}

/// Applies schema `default`s to missing fields (and to `null` in non-nullable fields), and
/// removes `null` from non-nullable fields without a default, as the real server does.
pub fn default(schema: &Value, obj: &mut Value) {
    match obj {
        Value::Object(map) => {
            if let Some(Value::Object(props)) = schema.get("properties") {
                for (k, p) in props {
                    let is_null = map.get(k).is_some_and(Value::is_null);
                    let nullable = flag(p, "nullable");
                    match (map.contains_key(k), is_null, p.get("default")) {
                        (false, _, Some(d)) => {
                            map.insert(k.clone(), d.clone());
                        }
                        (true, true, Some(d)) if !nullable => {
                            map.insert(k.clone(), d.clone());
                        }
                        (true, true, None) if !nullable => {
                            map.shift_remove(k);
                        }
                        _ => {}
                    }
                    if let Some(child) = map.get_mut(k) {
                        default(p, child);
                    }
                }
            }
            if let Some(add @ Value::Object(_)) = schema.get("additionalProperties") {
                let nullable = flag(add, "nullable");
                let keys: Vec<String> = map.keys().cloned().collect();
                for k in keys {
                    if map.get(&k).is_some_and(Value::is_null) && !nullable {
                        match add.get("default") {
                            Some(d) => {
                                map.insert(k.clone(), d.clone());
                            }
                            None => {
                                map.shift_remove(&k);
                            }
                        }
                    }
                    if let Some(child) = map.get_mut(&k) {
                        default(add, child);
                    }
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items").filter(|i| i.is_object()) {
                for item in items {
                    if item.is_null()
                        && !flag(item_schema, "nullable")
                        && let Some(d) = item_schema.get("default")
                    {
                        *item = d.clone();
                    }
                    default(item_schema, item);
                }
            }
        }
        _ => {}
    }
}

/// Validates `obj` against the schema; no causes means valid. Root `apiVersion`, `kind` and
/// `metadata` are the server's business and are not checked here.
pub fn validate(schema: &Value, obj: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    validate_node(schema, obj, "", true, &mut causes);
    causes
}

pub(super) fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(n) if n.as_f64().is_some_and(|f| f.fract() == 0.0) => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

pub(super) fn child_path(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_owned()
    } else {
        format!("{parent}.{key}")
    }
}

/// The field as kube-openapi names it in messages (`spec.replicas`; `<root>` for the object).
pub(super) fn body_name(path: &str) -> &str {
    if path.is_empty() { "<root>" } else { path }
}

pub(super) fn validate_node(
    schema: &Value,
    v: &Value,
    path: &str,
    resource_root: bool,
    causes: &mut Vec<Cause>,
) {
    let Some(sm) = schema.as_object() else { return };
    let ty = sm.get("type").and_then(Value::as_str).unwrap_or("");
    let int_or_string = flag(schema, "x-kubernetes-int-or-string");
    let actual = json_type(v);
    let field = body_name(path);

    if v.is_null() {
        if flag(schema, "nullable") {
            return;
        }
        if !ty.is_empty() || int_or_string {
            let want = if int_or_string { "integer,string" } else { ty };
            causes.push(invalid(
                field,
                &json!("null"),
                &format!("{field} in body must be of type {want}: \"null\""),
            ));
            return;
        }
    }

    let type_ok = if int_or_string {
        matches!(actual, "integer" | "string")
    } else {
        match ty {
            "" => true,
            "number" => matches!(actual, "number" | "integer"),
            t => t == actual,
        }
    };
    if !type_ok {
        let want = if int_or_string { "integer,string" } else { ty };
        causes.push(invalid(
            field,
            &json!(actual),
            &format!("{field} in body must be of type {want}: {actual:?}"),
        ));
        return;
    }

    if let Some(Value::Array(allowed)) = sm.get("enum")
        && !allowed.iter().any(|a| values_equal(a, v))
    {
        causes.push(not_supported(field, v, allowed));
    }

    match v {
        Value::String(text) => validate_string(sm, text, v, field, causes),
        Value::Number(_) => validate_number(sm, v, field, causes),
        Value::Array(items) => {
            let n = items.len() as u64;
            if let Some(min) = sm.get("minItems").and_then(Value::as_u64)
                && n < min
            {
                causes.push(invalid(
                    field,
                    &json!(n),
                    &format!("{field} in body should have at least {min} items"),
                ));
            }
            if let Some(max) = sm.get("maxItems").and_then(Value::as_u64)
                && n > max
            {
                causes.push(Cause {
                    reason: "FieldValueTooMany".into(),
                    message: format!("Too many: {n}: must have at most {max} items"),
                    field: field.into(),
                });
            }
            let list_type = sm
                .get("x-kubernetes-list-type")
                .and_then(Value::as_str)
                .unwrap_or("");
            if flag(schema, "uniqueItems") || list_type == "set" {
                for (i, item) in items.iter().enumerate() {
                    if items[..i].iter().any(|prev| values_equal(prev, item)) {
                        causes.push(Cause {
                            reason: "FieldValueDuplicate".into(),
                            message: format!("Duplicate value: {}", render(item)),
                            field: format!("{field}[{i}]"),
                        });
                    }
                }
            }
            if list_type == "map" {
                let keys: Vec<&str> = sm
                    .get("x-kubernetes-list-map-keys")
                    .and_then(Value::as_array)
                    .map(|a| a.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                let key_of = |item: &Value| -> Value {
                    Value::Object(
                        keys.iter()
                            .map(|k| {
                                (
                                    (*k).to_owned(),
                                    item.get(*k).cloned().unwrap_or(Value::Null),
                                )
                            })
                            .collect(),
                    )
                };
                for (i, item) in items.iter().enumerate() {
                    let key = key_of(item);
                    if items[..i].iter().any(|prev| key_of(prev) == key) {
                        causes.push(Cause {
                            reason: "FieldValueDuplicate".into(),
                            message: format!("Duplicate value: {key}"),
                            field: format!("{field}[{i}]"),
                        });
                    }
                }
            }
            if let Some(item_schema) = sm.get("items") {
                let embedded = flag(item_schema, "x-kubernetes-embedded-resource");
                for (i, item) in items.iter().enumerate() {
                    validate_node(item_schema, item, &format!("{path}[{i}]"), embedded, causes);
                }
            }
        }
        Value::Object(map) => {
            for req in sm
                .get("required")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                if let Some(k) = req.as_str()
                    && !map.contains_key(k)
                {
                    causes.push(required(&child_path(path, k)));
                }
            }
            let n = map.len() as u64;
            if let Some(min) = sm.get("minProperties").and_then(Value::as_u64)
                && n < min
            {
                causes.push(invalid(
                    field,
                    &json!(n),
                    &format!("{field} in body should have at least {min} properties"),
                ));
            }
            if let Some(max) = sm.get("maxProperties").and_then(Value::as_u64)
                && n > max
            {
                causes.push(Cause {
                    reason: "FieldValueTooMany".into(),
                    message: format!("Too many: {n}: must have at most {max} items"),
                    field: field.into(),
                });
            }
            if flag(schema, "x-kubernetes-embedded-resource") {
                for k in ["apiVersion", "kind"] {
                    if !flag(schema, "x-kubernetes-preserve-unknown-fields")
                        && map.get(k).and_then(Value::as_str).unwrap_or("").is_empty()
                    {
                        causes.push(required(&child_path(path, k)));
                    }
                }
            }
            let props = sm.get("properties").and_then(Value::as_object);
            for (k, child) in map {
                if resource_root && matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
                    continue;
                }
                let cpath = child_path(path, k);
                if let Some(p) = props.and_then(|p| p.get(k)) {
                    validate_node(
                        p,
                        child,
                        &cpath,
                        flag(p, "x-kubernetes-embedded-resource"),
                        causes,
                    );
                } else if let Some(add @ Value::Object(_)) = sm.get("additionalProperties") {
                    validate_node(
                        add,
                        child,
                        &cpath,
                        flag(add, "x-kubernetes-embedded-resource"),
                        causes,
                    );
                }
            }
        }
        _ => {}
    }

    for (key, combine) in [("allOf", 0u8), ("anyOf", 1), ("oneOf", 2)] {
        let Some(Value::Array(subs)) = sm.get(key) else {
            continue;
        };
        let results: Vec<Vec<Cause>> = subs
            .iter()
            .map(|sub| {
                let mut c = Vec::new();
                validate_node(sub, v, path, resource_root, &mut c);
                c
            })
            .collect();
        let passing = results.iter().filter(|r| r.is_empty()).count();
        match combine {
            0 => causes.extend(results.into_iter().flatten()),
            1 if passing == 0 => {
                causes.extend(results.into_iter().flatten());
            }
            2 if passing != 1 => {
                let detail = if passing == 0 {
                    format!("{field} in body must validate one and only one schema (oneOf)")
                } else {
                    format!(
                        "{field} in body must validate one and only one schema (oneOf). Found {passing} valid alternatives"
                    )
                };
                causes.push(invalid(field, v, &detail));
            }
            _ => {}
        }
    }
    if let Some(not) = sm.get("not") {
        let mut c = Vec::new();
        validate_node(not, v, path, resource_root, &mut c);
        if c.is_empty() {
            causes.push(invalid(
                field,
                v,
                &format!("{field} in body should not validate the schema"),
            ));
        }
    }
}

pub(super) fn values_equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        _ => a == b,
    }
}

pub(super) fn validate_string(
    sm: &Map<String, Value>,
    text: &str,
    v: &Value,
    field: &str,
    causes: &mut Vec<Cause>,
) {
    let chars = text.chars().count() as u64;
    if let Some(max) = sm.get("maxLength").and_then(Value::as_u64)
        && chars > max
    {
        causes.push(Cause {
            reason: "FieldValueTooLong".into(),
            message: format!("Too long: may not be more than {max} bytes"),
            field: field.into(),
        });
    }
    if let Some(min) = sm.get("minLength").and_then(Value::as_u64)
        && chars < min
    {
        causes.push(invalid(
            field,
            v,
            &format!("{field} in body should be at least {min} chars long"),
        ));
    }
    if let Some(pattern) = sm.get("pattern").and_then(Value::as_str) {
        match regex::Regex::new(pattern) {
            Ok(re) if !re.is_match(text) => {
                causes.push(invalid(
                    field,
                    v,
                    &format!("{field} in body should match '{pattern}'"),
                ));
            }
            Ok(_) => {}
            Err(_) => causes.push(invalid(
                field,
                v,
                &format!("{field} has an invalid pattern '{pattern}'"),
            )),
        }
    }
    if let Some(format) = sm.get("format").and_then(Value::as_str)
        && !format_ok(format, text)
    {
        causes.push(invalid(
            field,
            v,
            &format!("{field} in body must be of type {format}: {text:?}"),
        ));
    }
}

/// The string formats kube-apiserver checks; unknown formats pass, as upstream.
pub(super) fn format_ok(format: &str, text: &str) -> bool {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    match format {
        "date-time" | "datetime" => text.parse::<jiff::Timestamp>().is_ok(),
        "date" => text.parse::<jiff::civil::Date>().is_ok() && text.len() == 10,
        "uuid" => {
            let parts: Vec<&str> = text.split('-').collect();
            parts.iter().map(|p| p.len()).collect::<Vec<_>>() == [8, 4, 4, 4, 12]
                && parts
                    .iter()
                    .all(|p| p.chars().all(|c| c.is_ascii_hexdigit()))
        }
        "ipv4" => text.parse::<Ipv4Addr>().is_ok(),
        "ipv6" => text.parse::<Ipv6Addr>().is_ok(),
        "cidr" => text.split_once('/').is_some_and(|(ip, len)| {
            let max = match ip.parse::<IpAddr>() {
                Ok(IpAddr::V4(_)) => 32,
                Ok(IpAddr::V6(_)) => 128,
                Err(_) => return false,
            };
            len.parse::<u8>().is_ok_and(|l| l <= max)
        }),
        "byte" => {
            use base64::Engine as _;
            base64::engine::general_purpose::STANDARD
                .decode(text)
                .is_ok()
        }
        "hostname" => {
            !text.is_empty()
                && text.len() <= 253
                && text.split('.').all(|l| {
                    !l.is_empty()
                        && l.len() <= 63
                        && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                        && !l.starts_with('-')
                        && !l.ends_with('-')
                })
        }
        "email" => text
            .split_once('@')
            .is_some_and(|(u, d)| !u.is_empty() && d.contains('.')),
        _ => true,
    }
}

pub(super) fn validate_number(
    sm: &Map<String, Value>,
    v: &Value,
    field: &str,
    causes: &mut Vec<Cause>,
) {
    let Some(x) = v.as_f64() else { return };
    let show = |n: &Value| render(n);
    if let Some(min) = sm.get("minimum") {
        let m = min.as_f64().unwrap_or(f64::MIN);
        let exclusive = sm.get("exclusiveMinimum").and_then(Value::as_bool) == Some(true);
        if exclusive && x <= m {
            causes.push(invalid(
                field,
                v,
                &format!("{field} in body should be greater than {}", show(min)),
            ));
        } else if !exclusive && x < m {
            causes.push(invalid(
                field,
                v,
                &format!(
                    "{field} in body should be greater than or equal to {}",
                    show(min)
                ),
            ));
        }
    }
    if let Some(max) = sm.get("maximum") {
        let m = max.as_f64().unwrap_or(f64::MAX);
        let exclusive = sm.get("exclusiveMaximum").and_then(Value::as_bool) == Some(true);
        if exclusive && x >= m {
            causes.push(invalid(
                field,
                v,
                &format!("{field} in body should be less than {}", show(max)),
            ));
        } else if !exclusive && x > m {
            causes.push(invalid(
                field,
                v,
                &format!(
                    "{field} in body should be less than or equal to {}",
                    show(max)
                ),
            ));
        }
    }
    if let Some(step) = sm.get("multipleOf").and_then(Value::as_f64)
        && step > 0.0
    {
        let q = x / step;
        if (q - q.round()).abs() > 1e-9 {
            causes.push(invalid(
                field,
                v,
                &format!(
                    "{field} in body should be a multiple of {}",
                    show(&sm["multipleOf"])
                ),
            ));
        }
    }
}
