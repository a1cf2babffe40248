//! CustomResourceDefinitions: validation and acceptance of CRDs, the resource types they
//! register, and the structural-schema pipeline for custom resources (prune, default, validate).
//!
//! The order matches kube-apiserver: unknown fields are pruned, non-nullable nulls dropped,
//! defaults applied, then the object is validated against the schema, with errors worded and
//! located (`spec.replicas`, `spec.items[0].name`) as the real server words them.
//!
//! Deliberately not implemented (see [`UNSUPPORTED_SCHEMA_FEATURES`]): CEL validation rules
//! (`x-kubernetes-validations`), conversion webhooks, ratcheting of unchanged invalid values,
//! and name-conflict detection across CRDs (`NamesAccepted=False`).

// `ApiError` is the crate-wide error, built once per rejected request; boxing it buys nothing.
#![allow(clippy::result_large_err)]

use std::collections::BTreeSet;

use serde_json::{Map, Value, json};

use crate::error::{ApiError, Cause};
use crate::names::{DNS1035_LABEL_MSG, DNS1123_LABEL_MSG, is_dns1035_label, is_dns1123_subdomain};
use crate::registry::{Origin, PrinterColumn, ResourceType};

mod structural;
mod validation;
use structural::*;
pub use structural::{
    default, prune, prune_default_validate, prune_reporting, unknown_fields, validate,
};
use validation::*;
pub use validation::{default_crd, validate_crd, validate_crd_update};

const CRD_GROUP: &str = "apiextensions.k8s.io";
const CRD_KIND: &str = "CustomResourceDefinition";

/// Schema and CRD features simkube accepts but does not enforce, for FIDELITY.md.
pub const UNSUPPORTED_SCHEMA_FEATURES: &[&str] = &[
    "x-kubernetes-validations (CEL rules) are stored but not evaluated",
    "spec.conversion.strategy Webhook: versions are converted by rewriting apiVersion only",
    "validation ratcheting: unchanged invalid fields are rejected on update like new ones",
    "NamesAccepted=False on names that conflict with another CRD: every CRD is accepted",
    "x-kubernetes-map-type and list-type atomic/granular only affect server-side apply, not validation",
];

/// The constructs in a CRD schema that simkube does not enforce, as JSON paths into the schema
/// (for warnings and for tests that want to know what is silently skipped).
pub fn unsupported_constructs(schema: &Value) -> Vec<String> {
    fn walk(s: &Value, path: String, out: &mut Vec<String>) {
        let Some(m) = s.as_object() else { return };
        if m.contains_key("x-kubernetes-validations") {
            out.push(format!("{path}.x-kubernetes-validations"));
        }
        if let Some(Value::Object(props)) = m.get("properties") {
            for (k, v) in props {
                walk(v, format!("{path}.properties[{k}]"), out);
            }
        }
        for key in ["items", "additionalProperties", "not"] {
            if let Some(v) = m.get(key) {
                walk(v, format!("{path}.{key}"), out);
            }
        }
        for key in ["allOf", "anyOf", "oneOf"] {
            if let Some(Value::Array(list)) = m.get(key) {
                for (i, v) in list.iter().enumerate() {
                    walk(v, format!("{path}.{key}[{i}]"), out);
                }
            }
        }
    }
    let mut out = Vec::new();
    walk(schema, "openAPIV3Schema".to_owned(), &mut out);
    out
}

// ---------------------------------------------------------------------------------------------
// Small helpers.

fn s<'a>(v: &'a Value, ptr: &str) -> &'a str {
    v.pointer(ptr).and_then(Value::as_str).unwrap_or("")
}

fn required(field: &str) -> Cause {
    Cause {
        reason: "FieldValueRequired".into(),
        message: "Required value".into(),
        field: field.into(),
    }
}

fn required_because(field: &str, detail: &str) -> Cause {
    Cause {
        reason: "FieldValueRequired".into(),
        message: format!("Required value: {detail}"),
        field: field.into(),
    }
}

fn invalid(field: &str, value: &Value, detail: &str) -> Cause {
    Cause {
        reason: "FieldValueInvalid".into(),
        message: format!("Invalid value: {}: {detail}", render(value)),
        field: field.into(),
    }
}

fn forbidden(field: &str, detail: &str) -> Cause {
    Cause {
        reason: "FieldValueForbidden".into(),
        message: format!("Forbidden: {detail}"),
        field: field.into(),
    }
}

fn not_supported(field: &str, value: &Value, supported: &[Value]) -> Cause {
    let list: Vec<String> = supported.iter().map(render).collect();
    Cause {
        reason: "FieldValueNotSupported".into(),
        message: format!(
            "Unsupported value: {}: supported values: {}",
            render(value),
            list.join(", ")
        ),
        field: field.into(),
    }
}

/// A value as Go's field errors print it: strings quoted, numbers and booleans bare.
fn render(v: &Value) -> String {
    match v {
        Value::String(s) => format!("{s:?}"),
        Value::Null => "null".to_owned(),
        // Go prints whole float64s without a fraction (`1`, not `1.0`); typed clients send
        // schema bounds such as `minimum` as floats.
        Value::Number(n) if !n.is_i64() && !n.is_u64() => match n.as_f64() {
            Some(f) if f.fract() == 0.0 && f.abs() < 9e15 => format!("{}", f as i64),
            _ => n.to_string(),
        },
        other => other.to_string(),
    }
}

// ---------------------------------------------------------------------------------------------
// CRD → resource types.

/// The resource types a CRD serves: one per served version, with its schema, subresources,
/// printer columns (the real default AGE column when none are given), selectable fields, short
/// names and categories.
pub fn types_from_crd(crd: &Value) -> Result<Vec<ResourceType>, ApiError> {
    let mut crd = crd.clone();
    default_crd(&mut crd);
    validate_crd(&crd)?;
    let name = s(&crd, "/metadata/name").to_owned();
    let group = s(&crd, "/spec/group").to_owned();
    let kind = s(&crd, "/spec/names/kind").to_owned();
    let strings = |ptr: &str| -> Vec<String> {
        crd.pointer(ptr)
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default()
    };
    let short_names = strings("/spec/names/shortNames");
    let categories = strings("/spec/names/categories");
    let mut out = Vec::new();
    for v in versions(&crd) {
        if v.get("served").and_then(Value::as_bool) != Some(true) {
            continue;
        }
        let mut subresources = Vec::new();
        if v.pointer("/subresources/status")
            .is_some_and(Value::is_object)
        {
            subresources.push("status".to_owned());
        }
        if v.pointer("/subresources/scale")
            .is_some_and(Value::is_object)
        {
            subresources.push("scale".to_owned());
        }
        let mut printer_columns: Vec<PrinterColumn> = v
            .get("additionalPrinterColumns")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(|c| PrinterColumn {
                name: s(c, "/name").to_owned(),
                type_: s(c, "/type").to_owned(),
                format: s(c, "/format").to_owned(),
                description: s(c, "/description").to_owned(),
                priority: c.get("priority").and_then(Value::as_i64).unwrap_or(0) as i32,
                json_path: s(c, "/jsonPath").to_owned(),
            })
            .collect();
        if printer_columns.is_empty() {
            printer_columns.push(PrinterColumn {
                name: "Age".into(),
                type_: "date".into(),
                format: String::new(),
                description: "CreationTimestamp is a timestamp representing the server time when this object was created. It is not guaranteed to be set in happens-before order across separate operations. Clients may not set this value. It is represented in RFC3339 form and is in UTC.".into(),
                priority: 0,
                json_path: ".metadata.creationTimestamp".into(),
            });
        }
        let selectable_fields = v
            .get("selectableFields")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(|f| s(f, "/jsonPath").trim_start_matches('.').to_owned())
            .collect();
        out.push(ResourceType {
            group: group.clone(),
            version: s(v, "/name").to_owned(),
            kind: kind.clone(),
            plural: s(&crd, "/spec/names/plural").to_owned(),
            singular: s(&crd, "/spec/names/singular").to_owned(),
            list_kind: s(&crd, "/spec/names/listKind").to_owned(),
            namespaced: s(&crd, "/spec/scope") == "Namespaced",
            short_names: short_names.clone(),
            categories: categories.clone(),
            verbs: [
                "delete",
                "deletecollection",
                "get",
                "list",
                "patch",
                "create",
                "update",
                "watch",
            ]
            .map(str::to_owned)
            .to_vec(),
            subresources,
            printer_columns,
            selectable_fields,
            schema: v.pointer("/schema/openAPIV3Schema").cloned(),
            storage: v.get("storage").and_then(Value::as_bool) == Some(true),
            origin: Origin::Crd { name: name.clone() },
        });
    }
    Ok(out)
}

/// Marks a valid CRD accepted and established, as the apiextensions controllers do:
/// `status.acceptedNames`, `NamesAccepted` and `Established` conditions (transition times kept
/// when already true) and the storage version added to `status.storedVersions`.
pub fn accept(crd: &mut Value) {
    accept_at(crd, &crate::timefmt::now_rfc3339());
}

/// [`accept`] with an explicit transition time (RFC 3339).
pub fn accept_at(crd: &mut Value, now: &str) {
    default_crd(crd);
    let names = crd
        .pointer("/spec/names")
        .cloned()
        .unwrap_or_else(|| json!({}));
    let storage: Option<String> = versions(crd)
        .iter()
        .find(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
        .map(|v| s(v, "/name").to_owned());
    let Some(root) = crd.as_object_mut() else {
        return;
    };
    let status = root.entry("status").or_insert_with(|| json!({}));
    if !status.is_object() {
        *status = json!({});
    }
    let Some(status) = status.as_object_mut() else {
        return;
    };
    status.insert("acceptedNames".into(), names);
    let mut conditions: Vec<Value> = status
        .get("conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for (ty, reason, message) in [
        ("NamesAccepted", "NoConflicts", "no conflicts found"),
        (
            "Established",
            "InitialNamesAccepted",
            "the initial names have been accepted",
        ),
    ] {
        let fresh = json!({
            "type": ty,
            "status": "True",
            "lastTransitionTime": now,
            "reason": reason,
            "message": message,
        });
        match conditions.iter_mut().find(|c| s(c, "/type") == ty) {
            Some(c) if s(c, "/status") == "True" => {}
            Some(c) => *c = fresh,
            None => conditions.push(fresh),
        }
    }
    status.insert("conditions".into(), Value::Array(conditions));
    let mut stored: Vec<Value> = status
        .get("storedVersions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if let Some(v) = storage
        && !stored.iter().any(|x| x.as_str() == Some(v.as_str()))
    {
        stored.push(json!(v));
    }
    status.insert("storedVersions".into(), Value::Array(stored));
}

/// Whether the CRD's `Established` condition is `True` (what `is_crd_established` waits for).
pub fn crd_status_conditions_established(crd: &Value) -> bool {
    crd.pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|c| s(c, "/type") == "Established" && s(c, "/status") == "True")
}

#[cfg(test)]
mod tests;
