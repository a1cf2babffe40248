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
use crate::registry::{Origin, PrinterColumn, ResourceType};

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

/// RFC 1123 label: lower-case alphanumerics and `-`, at most 63 characters.
fn is_dns1123_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// RFC 1035 label: an RFC 1123 label that starts with a letter.
fn is_dns1035_label(s: &str) -> bool {
    is_dns1123_label(s) && s.starts_with(|c: char| c.is_ascii_lowercase())
}

fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns1123_label)
}

const DNS1123_LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric \
    characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or \
    '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";

const DNS1035_LABEL_MSG: &str = "a DNS-1035 label must consist of lower case alphanumeric characters \
    or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. \
    'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')";

// ---------------------------------------------------------------------------------------------
// CRD defaulting and validation.

/// Applies the API defaults of a v1 CRD, as the server does before validating it:
/// `names.singular` (lower-case kind), `names.listKind` (`<Kind>List`), `conversion.strategy`.
pub fn default_crd(crd: &mut Value) {
    let kind = s(crd, "/spec/names/kind").to_owned();
    if let Some(names) = crd
        .pointer_mut("/spec/names")
        .and_then(Value::as_object_mut)
        && !kind.is_empty()
    {
        if names
            .get("singular")
            .and_then(Value::as_str)
            .unwrap_or("")
            .is_empty()
        {
            names.insert("singular".into(), json!(kind.to_ascii_lowercase()));
        }
        if names
            .get("listKind")
            .and_then(Value::as_str)
            .unwrap_or("")
            .is_empty()
        {
            names.insert("listKind".into(), json!(format!("{kind}List")));
        }
    }
    if let Some(spec) = crd.get_mut("spec").and_then(Value::as_object_mut) {
        let conversion = spec.entry("conversion").or_insert_with(|| json!({}));
        if let Some(c) = conversion.as_object_mut() {
            c.entry("strategy").or_insert_with(|| json!("None"));
        }
    }
}

/// Validates a CRD as kube-apiserver does (on a copy with [`default_crd`] applied), answering 422 Invalid with
/// one cause per problem.
pub fn validate_crd(crd: &Value) -> Result<(), ApiError> {
    let mut crd = crd.clone();
    default_crd(&mut crd);
    let name = s(&crd, "/metadata/name");
    let causes = crd_causes(&crd);
    if causes.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(CRD_GROUP, CRD_KIND, name, &causes))
    }
}

/// Validates a CRD update: [`validate_crd`] plus the immutable fields (`spec.scope` once set,
/// `spec.group` and `spec.names.plural` would rename the resource and are immutable too).
pub fn validate_crd_update(old: &Value, new: &Value) -> Result<(), ApiError> {
    let mut new = new.clone();
    default_crd(&mut new);
    let new = &new;
    let name = s(new, "/metadata/name");
    let mut causes = crd_causes(new);
    for (ptr, field) in [("/spec/scope", "spec.scope"), ("/spec/group", "spec.group")] {
        let (o, n) = (old.pointer(ptr), new.pointer(ptr));
        if o.is_some() && o != n {
            causes.push(invalid(
                field,
                n.unwrap_or(&Value::Null),
                "field is immutable",
            ));
        }
    }
    // A version still in status.storedVersions must stay in spec.versions.
    let versions: BTreeSet<&str> = versions(new).iter().map(|v| s(v, "/name")).collect();
    for stored in old
        .pointer("/status/storedVersions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if let Some(v) = stored.as_str()
            && !versions.contains(v)
        {
            causes.push(invalid(
                "status.storedVersions",
                stored,
                &format!("must appear in spec.versions: stored version {v:?} is missing"),
            ));
        }
    }
    if causes.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(CRD_GROUP, CRD_KIND, name, &causes))
    }
}

fn versions(crd: &Value) -> &[Value] {
    crd.pointer("/spec/versions")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

fn crd_causes(crd: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    let name = s(crd, "/metadata/name");
    let group = s(crd, "/spec/group");
    let plural = s(crd, "/spec/names/plural");

    if group.is_empty() {
        causes.push(required("spec.group"));
    } else if !group.contains('.') {
        causes.push(invalid(
            "spec.group",
            &json!(group),
            "should be a domain with at least one dot",
        ));
    } else if !is_dns1123_subdomain(group) {
        causes.push(invalid(
            "spec.group",
            &json!(group),
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character",
        ));
    }
    if !plural.is_empty() && !group.is_empty() && name != format!("{plural}.{group}") {
        causes.push(invalid(
            "metadata.name",
            &json!(name),
            "must be spec.names.plural+\".\"+spec.group",
        ));
    }

    match s(crd, "/spec/scope") {
        "Namespaced" | "Cluster" => {}
        "" => causes.push(required("spec.scope")),
        other => causes.push(not_supported(
            "spec.scope",
            &json!(other),
            &[json!("Cluster"), json!("Namespaced")],
        )),
    }

    // Names.
    let kind = s(crd, "/spec/names/kind");
    if plural.is_empty() {
        causes.push(required("spec.names.plural"));
    } else if !is_dns1035_label(plural) {
        causes.push(invalid(
            "spec.names.plural",
            &json!(plural),
            DNS1123_LABEL_MSG,
        ));
    }
    let singular = s(crd, "/spec/names/singular");
    if !singular.is_empty() && !is_dns1035_label(singular) {
        causes.push(invalid(
            "spec.names.singular",
            &json!(singular),
            DNS1123_LABEL_MSG,
        ));
    }
    if kind.is_empty() {
        causes.push(required("spec.names.kind"));
    } else if !is_dns1035_label(&kind.to_ascii_lowercase()) {
        causes.push(invalid("spec.names.kind", &json!(kind), DNS1035_LABEL_MSG));
    }
    let list_kind = s(crd, "/spec/names/listKind");
    if list_kind.is_empty() {
        causes.push(required("spec.names.listKind"));
    } else if !is_dns1035_label(&list_kind.to_ascii_lowercase()) {
        causes.push(invalid(
            "spec.names.listKind",
            &json!(list_kind),
            DNS1035_LABEL_MSG,
        ));
    } else if list_kind == kind {
        causes.push(invalid(
            "spec.names.listKind",
            &json!(list_kind),
            "kind and listKind may not be the same",
        ));
    }
    for (i, short) in crd
        .pointer("/spec/names/shortNames")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        let sn = short.as_str().unwrap_or("");
        if !is_dns1035_label(sn) {
            causes.push(invalid(
                &format!("spec.names.shortNames[{i}]"),
                short,
                DNS1123_LABEL_MSG,
            ));
        }
    }
    for (i, cat) in crd
        .pointer("/spec/names/categories")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        if !cat.as_str().is_some_and(is_dns1035_label) {
            causes.push(invalid(
                &format!("spec.names.categories[{i}]"),
                cat,
                DNS1123_LABEL_MSG,
            ));
        }
    }

    // Versions.
    let versions = versions(crd);
    if versions.is_empty() {
        causes.push(required_because(
            "spec.versions",
            "must have exactly one version marked as storage version",
        ));
        return causes;
    }
    let storage = versions
        .iter()
        .filter(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
        .count();
    if storage != 1 {
        causes.push(invalid(
            "spec.versions",
            &json!(format!("{storage} storage versions")),
            "must have exactly one version marked as storage version",
        ));
    }
    if !versions
        .iter()
        .any(|v| v.get("served").and_then(Value::as_bool) == Some(true))
    {
        causes.push(invalid(
            "spec.versions",
            &json!("no served versions"),
            "must have at least one version marked as served",
        ));
    }
    let mut seen = BTreeSet::new();
    for (i, v) in versions.iter().enumerate() {
        let base = format!("spec.versions[{i}]");
        let vname = s(v, "/name");
        if vname.is_empty() {
            causes.push(required(&format!("{base}.name")));
        } else if !is_dns1035_label(vname) {
            causes.push(invalid(
                &format!("{base}.name"),
                &json!(vname),
                DNS1035_LABEL_MSG,
            ));
        } else if !seen.insert(vname) {
            causes.push(Cause {
                reason: "FieldValueDuplicate".into(),
                message: format!("Duplicate value: {vname:?}"),
                field: format!("{base}.name"),
            });
        }
        for flag in ["served", "storage"] {
            if !v.get(flag).is_some_and(Value::is_boolean) {
                causes.push(required(&format!("{base}.{flag}")));
            }
        }
        let schema_field = format!("{base}.schema.openAPIV3Schema");
        match v.pointer("/schema/openAPIV3Schema") {
            None | Some(Value::Null) => {
                causes.push(required_because(&schema_field, "schemas are required"))
            }
            Some(schema) => structural_causes(schema, &schema_field, "", true, &mut causes),
        }
        for (j, c) in v
            .get("additionalPrinterColumns")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            let cbase = format!("{base}.additionalPrinterColumns[{j}]");
            if s(c, "/name").is_empty() {
                causes.push(required(&format!("{cbase}.name")));
            }
            match s(c, "/type") {
                "integer" | "number" | "string" | "boolean" | "date" => {}
                "" => causes.push(required(&format!("{cbase}.type"))),
                t => causes.push(not_supported(
                    &format!("{cbase}.type"),
                    &json!(t),
                    &["boolean", "date", "integer", "number", "string"].map(|x| json!(x)),
                )),
            }
            if s(c, "/jsonPath").is_empty() {
                causes.push(required(&format!("{cbase}.JSONPath")));
            }
        }
        let fields = v
            .get("selectableFields")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        if fields.len() > 8 {
            causes.push(Cause {
                reason: "FieldValueTooMany".into(),
                message: format!("Too many: {}: must have at most 8 items", fields.len()),
                field: format!("{base}.selectableFields"),
            });
        }
        for (j, f) in fields.iter().enumerate() {
            let path = s(f, "/jsonPath");
            let field = format!("{base}.selectableFields[{j}].jsonPath");
            if path.is_empty() {
                causes.push(required(&field));
                continue;
            }
            match v.pointer("/schema/openAPIV3Schema").and_then(|sch| schema_at(sch, path)) {
                None => causes.push(invalid(&field, &json!(path), "is an invalid path: does not refer to a valid field")),
                Some(sch) if !matches!(s(sch, "/type"), "string" | "integer" | "boolean") => causes.push(invalid(
                    &field,
                    &json!(path),
                    "must point to a field of type string, boolean or integer. Enum string fields and strings with formats are allowed.",
                )),
                Some(_) => {}
            }
        }
    }
    let protected = ["k8s.io", "kubernetes.io"]
        .iter()
        .any(|g| group == *g || group.ends_with(&format!(".{g}")));
    let approval = crd
        .pointer("/metadata/annotations/api-approved.kubernetes.io")
        .and_then(Value::as_str)
        .unwrap_or("");
    if protected && approval.is_empty() {
        causes.push(required_because(
            "metadata.annotations[api-approved.kubernetes.io]",
            "protected groups must have approval annotation \"api-approved.kubernetes.io\", see https://github.com/kubernetes/enhancements/pull/1111",
        ));
    }
    if crd
        .pointer("/spec/preserveUnknownFields")
        .and_then(Value::as_bool)
        == Some(true)
    {
        causes.push(invalid(
            "spec.preserveUnknownFields",
            &json!(true),
            "cannot set to true, set x-kubernetes-preserve-unknown-fields to true in spec.versions[*].schema instead",
        ));
    }
    let subs = crd.pointer("/spec/versions/0/subresources");
    if let Some(scale) = subs.and_then(|v| v.get("scale")).filter(|v| v.is_object()) {
        for key in ["specReplicasPath", "statusReplicasPath"] {
            if s(scale, &format!("/{key}")).is_empty() {
                causes.push(required(&format!(
                    "spec.versions[0].subresources.scale.{key}"
                )));
            }
        }
    }
    causes
}

/// The schema of the field a simple path (`.spec.color`) names, through `properties`.
fn schema_at<'a>(schema: &'a Value, path: &str) -> Option<&'a Value> {
    path.trim_start_matches('.')
        .split('.')
        .try_fold(schema, |sch, k| {
            sch.get("properties").and_then(|p| p.get(k))
        })
}

const TYPES: &[&str] = &["array", "boolean", "integer", "number", "object", "string"];

/// Structural-schema rules (KEP-1002) for `openAPIV3Schema`, with the real messages.
/// `path` locates the schema node in the CRD, `obj_path` the field it describes in objects
/// (`spec.replicas`), for the messages about invalid defaults.
fn structural_causes(
    schema: &Value,
    path: &str,
    obj_path: &str,
    root: bool,
    causes: &mut Vec<Cause>,
) {
    let Some(m) = schema.as_object() else {
        causes.push(invalid(path, schema, "must be a schema object"));
        return;
    };
    let ty = m.get("type").and_then(Value::as_str).unwrap_or("");
    let int_or_string = m.get("x-kubernetes-int-or-string").and_then(Value::as_bool) == Some(true);
    if let Some(d) = m.get("default") {
        // A default must itself be valid (and survive pruning) under its schema.
        let mut pruned = d.clone();
        prune_node(schema, &mut pruned, false, "", &mut Vec::new());
        if &pruned != d {
            causes.push(invalid(
                &format!("{path}.default"),
                d,
                "must not have unknown fields",
            ));
        }
        let mut sub = Vec::new();
        validate_node(schema, d, obj_path, false, &mut sub);
        for c in sub {
            let rest = c.field.strip_prefix(obj_path).unwrap_or("");
            let field = format!("{path}.default{rest}");
            causes.push(Cause { field, ..c });
        }
    }
    let preserve = m
        .get("x-kubernetes-preserve-unknown-fields")
        .and_then(Value::as_bool)
        == Some(true);
    if root {
        if ty != "object" {
            if ty.is_empty() {
                causes.push(required_because(
                    &format!("{path}.type"),
                    "must not be empty at the root",
                ));
            } else {
                causes.push(invalid(
                    &format!("{path}.type"),
                    &json!(ty),
                    "must be object at the root",
                ));
            }
        }
        if let Some(meta) = m.get("properties").and_then(|p| p.get("metadata")) {
            let only_names = meta
                .get("properties")
                .and_then(Value::as_object)
                .is_none_or(|p| p.keys().all(|k| k == "name" || k == "generateName"));
            let extra = meta.as_object().is_some_and(|mm| {
                mm.keys()
                    .any(|k| !matches!(k.as_str(), "type" | "properties" | "description"))
            });
            if !only_names || extra {
                causes.push(forbidden(
                    &format!("{path}.properties[metadata]"),
                    "must not specify anything other than name and generateName, but metadata is implicitly specified",
                ));
            }
        }
    }
    if !ty.is_empty() && !TYPES.contains(&ty) {
        causes.push(not_supported(
            &format!("{path}.type"),
            &json!(ty),
            &TYPES.iter().map(|t| json!(t)).collect::<Vec<_>>(),
        ));
    }
    if int_or_string && !ty.is_empty() {
        causes.push(invalid(
            &format!("{path}.type"),
            &json!(ty),
            "must be empty if x-kubernetes-int-or-string is true",
        ));
    }
    if m.contains_key("properties")
        && m.get("additionalProperties")
            .is_some_and(|a| a != &Value::Bool(false))
    {
        causes.push(forbidden(
            &format!("{path}.additionalProperties"),
            "additionalProperties and properties are mutual exclusive",
        ));
    }
    if m.get("additionalProperties") == Some(&Value::Bool(false)) {
        causes.push(forbidden(
            &format!("{path}.additionalProperties"),
            "additionalProperties cannot be set to false",
        ));
    }
    list_type_causes(m, ty, path, causes);
    if ty == "array" && !m.contains_key("items") {
        causes.push(required_because(
            &format!("{path}.items"),
            "must be specified",
        ));
    }
    if let Some(Value::Object(props)) = m.get("properties") {
        for (k, p) in props {
            let child = format!("{path}.properties[{k}]");
            if root && k == "metadata" {
                continue;
            }
            check_child_type(
                p,
                &child,
                "must not be empty for specified object fields",
                causes,
            );
            structural_causes(p, &child, &child_path(obj_path, k), false, causes);
        }
    }
    if let Some(items) = m.get("items") {
        let child = format!("{path}.items");
        if items.is_array() {
            causes.push(forbidden(
                &child,
                "items must be a schema object and not an array",
            ));
        } else {
            check_child_type(
                items,
                &child,
                "must not be empty for specified array items",
                causes,
            );
            structural_causes(items, &child, &format!("{obj_path}[0]"), false, causes);
        }
    }
    if let Some(add @ Value::Object(_)) = m.get("additionalProperties") {
        let child = format!("{path}.additionalProperties");
        check_child_type(
            add,
            &child,
            "must not be empty for specified object fields",
            causes,
        );
        structural_causes(add, &child, obj_path, false, causes);
    }
    if !root && preserve && ty.is_empty() && !int_or_string {
        // `x-kubernetes-preserve-unknown-fields: true` on its own is structural: any value.
    }
}

/// The `x-kubernetes-list-type` rules: a known type, on arrays only; scalar items for `set`;
/// object items with map keys that are item properties, each required or defaulted, for `map`.
fn list_type_causes(m: &Map<String, Value>, ty: &str, path: &str, causes: &mut Vec<Cause>) {
    let Some(list_type) = m.get("x-kubernetes-list-type") else {
        if m.contains_key("x-kubernetes-list-map-keys") {
            causes.push(forbidden(
                &format!("{path}.x-kubernetes-list-map-keys"),
                "must only be used if x-kubernetes-list-type is `map`",
            ));
        }
        return;
    };
    let field = format!("{path}.x-kubernetes-list-type");
    let supported = [json!("atomic"), json!("set"), json!("map")];
    if !supported.contains(list_type) {
        causes.push(not_supported(&field, list_type, &supported));
        return;
    }
    if ty != "array" {
        causes.push(invalid(
            &field,
            list_type,
            "must only be used on type array",
        ));
        return;
    }
    let items = m.get("items").unwrap_or(&Value::Null);
    let item_type = s(items, "/type");
    match list_type.as_str() {
        Some("set") if item_type == "object" || item_type == "array" => {
            causes.push(invalid(
                &format!("{path}.items.type"),
                &json!(item_type),
                "must be a scalar type if parent array's x-kubernetes-list-type is `set`",
            ));
        }
        Some("map") => {
            let keys_field = format!("{path}.x-kubernetes-list-map-keys");
            if item_type != "object" {
                causes.push(invalid(
                    &format!("{path}.items.type"),
                    &json!(item_type),
                    "must be object if parent array's x-kubernetes-list-type is `map`",
                ));
                return;
            }
            let keys: Vec<&str> = m
                .get("x-kubernetes-list-map-keys")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            if keys.is_empty() {
                causes.push(required_because(
                    &keys_field,
                    "must not be empty if x-kubernetes-list-type is `map`",
                ));
            }
            let required: Vec<&str> = items
                .get("required")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            for key in keys {
                match items.get("properties").and_then(|p| p.get(key)) {
                    None => causes.push(invalid(
                        &keys_field,
                        &json!(key),
                        "entries must all be names of item properties",
                    )),
                    Some(prop) if !required.contains(&key) && prop.get("default").is_none() => {
                        causes.push(required_because(
                            &format!("{path}.items.properties[{key}].default"),
                            "this property is in x-kubernetes-list-map-keys, so it must have a default or be a required property",
                        ));
                    }
                    Some(_) => {}
                }
            }
        }
        _ => {}
    }
}

fn check_child_type(child: &Value, path: &str, why: &str, causes: &mut Vec<Cause>) {
    let Some(m) = child.as_object() else { return };
    let has_type = m
        .get("type")
        .and_then(Value::as_str)
        .is_some_and(|t| !t.is_empty());
    let exempt = m.get("x-kubernetes-int-or-string").and_then(Value::as_bool) == Some(true)
        || m.get("x-kubernetes-preserve-unknown-fields")
            .and_then(Value::as_bool)
            == Some(true);
    if !has_type && !exempt {
        causes.push(required_because(&format!("{path}.type"), why));
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
    accept_at(crd, &now_rfc3339());
}

fn now_rfc3339() -> String {
    let now = jiff::Timestamp::now();
    jiff::Timestamp::from_second(now.as_second())
        .map_or_else(|_| now.to_string(), |t| t.to_string())
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

fn flag(schema: &Value, key: &str) -> bool {
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

fn prune_node(
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

fn json_type(v: &Value) -> &'static str {
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

fn child_path(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_owned()
    } else {
        format!("{parent}.{key}")
    }
}

/// The field as kube-openapi names it in messages (`spec.replicas`; `<root>` for the object).
fn body_name(path: &str) -> &str {
    if path.is_empty() { "<root>" } else { path }
}

fn validate_node(
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

fn values_equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        _ => a == b,
    }
}

fn validate_string(
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
fn format_ok(format: &str, text: &str) -> bool {
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

fn validate_number(sm: &Map<String, Value>, v: &Value, field: &str, causes: &mut Vec<Cause>) {
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

#[cfg(test)]
mod tests {
    use expect_test::{Expect, expect};
    use proptest::prelude::*;

    use super::*;

    fn crd() -> Value {
        json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": "widgets.example.com"},
            "spec": {
                "group": "example.com",
                "scope": "Namespaced",
                "names": {"plural": "widgets", "kind": "Widget", "shortNames": ["wd"], "categories": ["all"]},
                "versions": [
                    {"name": "v1", "served": true, "storage": true,
                     "schema": {"openAPIV3Schema": schema()},
                     "subresources": {"status": {}, "scale": {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas"}},
                     "additionalPrinterColumns": [{"name": "Replicas", "type": "integer", "jsonPath": ".spec.replicas"}],
                     "selectableFields": [{"jsonPath": ".spec.color"}]},
                    {"name": "v1beta1", "served": true, "storage": false,
                     "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}},
                    {"name": "v1alpha1", "served": false, "storage": false,
                     "schema": {"openAPIV3Schema": {"type": "object"}}},
                ],
            },
        })
    }

    fn schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "spec": {
                    "type": "object",
                    "required": ["color"],
                    "properties": {
                        "replicas": {"type": "integer", "minimum": 1, "maximum": 10, "default": 1},
                        "color": {"type": "string", "enum": ["red", "green"]},
                        "code": {"type": "string", "pattern": "^[0-9]+$", "minLength": 2, "maxLength": 4},
                        "port": {"x-kubernetes-int-or-string": true},
                        "when": {"type": "string", "format": "date-time"},
                        "ratio": {"type": "number", "nullable": true},
                        "mode": {"type": "string", "default": "auto"},
                        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                        "items": {"type": "array", "maxItems": 2, "items": {
                            "type": "object", "required": ["name"],
                            "properties": {"name": {"type": "string"}, "weight": {"type": "integer", "default": 5}}}},
                        "tags": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}},
                        "raw": {"type": "object", "x-kubernetes-preserve-unknown-fields": true,
                                "properties": {"known": {"type": "object", "properties": {"a": {"type": "string"}}}}},
                        "template": {"type": "object", "x-kubernetes-embedded-resource": true,
                                     "properties": {"spec": {"type": "object", "properties": {"x": {"type": "string"}}}}},
                    },
                },
                "status": {"type": "object", "properties": {"replicas": {"type": "integer"}}},
            },
        })
    }

    fn rt() -> ResourceType {
        types_from_crd(&crd()).expect("valid CRD").remove(0)
    }

    fn check_invalid(mut obj: Value, expect: Expect) {
        let err = prune_default_validate(&rt(), &mut obj).expect_err("must be invalid");
        assert_eq!((err.code, err.reason.as_str()), (422, "Invalid"));
        expect.assert_eq(&err.message);
    }

    #[test]
    fn types_from_crd_serves_each_served_version() {
        let types = types_from_crd(&crd()).expect("valid");
        let versions: Vec<(&str, bool)> = types
            .iter()
            .map(|t| (t.version.as_str(), t.storage))
            .collect();
        assert_eq!(versions, [("v1", true), ("v1beta1", false)]);
        let v1 = &types[0];
        assert_eq!(
            (
                v1.plural.as_str(),
                v1.singular.as_str(),
                v1.list_kind.as_str()
            ),
            ("widgets", "widget", "WidgetList")
        );
        assert!(v1.namespaced);
        assert_eq!(v1.subresources, ["status", "scale"]);
        assert_eq!(v1.short_names, ["wd"]);
        assert_eq!(v1.categories, ["all"]);
        assert_eq!(v1.selectable_fields, ["spec.color"]);
        assert_eq!(v1.printer_columns.len(), 1);
        assert_eq!(
            v1.origin,
            Origin::Crd {
                name: "widgets.example.com".into()
            }
        );
        // Without additionalPrinterColumns the real server shows AGE.
        let beta = &types[1];
        assert_eq!(
            beta.printer_columns
                .iter()
                .map(|c| (c.name.as_str(), c.type_.as_str(), c.json_path.as_str()))
                .collect::<Vec<_>>(),
            [("Age", "date", ".metadata.creationTimestamp")]
        );
        assert!(beta.subresources.is_empty());
    }

    #[test]
    fn accept_establishes_and_keeps_transition_times() {
        let mut c = crd();
        assert!(!crd_status_conditions_established(&c));
        accept_at(&mut c, "2025-01-01T00:00:00Z");
        assert!(crd_status_conditions_established(&c));
        assert_eq!(c["status"]["acceptedNames"]["listKind"], "WidgetList");
        assert_eq!(c["status"]["storedVersions"], json!(["v1"]));
        assert_eq!(c["spec"]["conversion"]["strategy"], "None");
        accept_at(&mut c, "2025-02-02T00:00:00Z");
        let times: Vec<&str> = c["status"]["conditions"]
            .as_array()
            .expect("conditions")
            .iter()
            .map(|x| x["lastTransitionTime"].as_str().unwrap_or_default())
            .collect();
        assert_eq!(times, ["2025-01-01T00:00:00Z", "2025-01-01T00:00:00Z"]);
        // A new storage version is appended to storedVersions, never replacing the old one.
        c["spec"]["versions"][0]["storage"] = json!(false);
        c["spec"]["versions"][1]["storage"] = json!(true);
        accept_at(&mut c, "2025-03-03T00:00:00Z");
        assert_eq!(c["status"]["storedVersions"], json!(["v1", "v1beta1"]));
        // The condition shape is what kube-runtime's is_crd_established reads.
        let typed: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition =
            serde_json::from_value(c).expect("typed CRD");
        use kube::runtime::wait::Condition as _;
        assert!(kube::runtime::wait::conditions::is_crd_established().matches_object(Some(&typed)));
    }

    fn crd_error(mutate: impl FnOnce(&mut Value)) -> String {
        let mut c = crd();
        mutate(&mut c);
        validate_crd(&c)
            .map(|()| "valid".to_owned())
            .unwrap_or_else(|e| e.message)
    }

    #[test]
    fn invalid_crds_are_rejected_with_the_real_messages() {
        let cases = [
            crd_error(|_| {}),
            crd_error(|c| c["metadata"]["name"] = json!("widget.example.com")),
            crd_error(|c| {
                c["spec"]["names"]
                    .as_object_mut()
                    .expect("names")
                    .remove("plural");
            }),
            crd_error(|c| {
                c["spec"]["names"]
                    .as_object_mut()
                    .expect("names")
                    .remove("kind");
            }),
            crd_error(|c| c["spec"]["scope"] = json!("Global")),
            crd_error(|c| c["spec"]["group"] = json!("example")),
            crd_error(|c| c["spec"]["versions"] = json!([])),
            crd_error(|c| c["spec"]["versions"][1]["storage"] = json!(true)),
            crd_error(|c| {
                c["spec"]["versions"][0]
                    .as_object_mut()
                    .expect("v")
                    .remove("schema");
            }),
            crd_error(|c| {
                c["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
                    ["color"] = json!({"enum": ["x"]})
            }),
            crd_error(|c| {
                c["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["type"] = json!("array")
            }),
            crd_error(|c| {
                c["spec"]["versions"][0]["selectableFields"] = json!([{"jsonPath": ".spec.labels"}])
            }),
            crd_error(|c| {
                c["spec"]["versions"][0]["additionalPrinterColumns"] =
                    json!([{"name": "X", "type": "map", "jsonPath": ".spec"}])
            }),
            crd_error(|c| {
                c["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
                    ["replicas"]["default"] = json!("one")
            }),
            crd_error(|c| c["spec"]["preserveUnknownFields"] = json!(true)),
            crd_error(|c| {
                c["spec"]["group"] = json!("tether.k8s.io");
                c["metadata"]["name"] = json!("widgets.tether.k8s.io");
            }),
            crd_error(|c| {
                c["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
                    ["ports"] = json!({"type": "array", "x-kubernetes-list-type": "map",
                        "x-kubernetes-list-map-keys": ["name", "port"],
                        "items": {"type": "object", "required": ["port"], "properties": {
                            "name": {"type": "string"}, "port": {"type": "integer"}}}})
            }),
            crd_error(|c| {
                c["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
                    ["tags"] = json!({"type": "array", "x-kubernetes-list-type": "set",
                        "items": {"type": "object"}})
            }),
            crd_error(|c| {
                c["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
                    ["ports"] = json!({"type": "array", "x-kubernetes-list-type": "map",
                        "x-kubernetes-list-map-keys": ["name"],
                        "items": {"type": "object", "properties": {"name": {"type": "string", "default": "http"}}}})
            }),
        ];
        expect![[r#"
            valid
            CustomResourceDefinition.apiextensions.k8s.io "widget.example.com" is invalid: metadata.name: Invalid value: "widget.example.com": must be spec.names.plural+"."+spec.group
            CustomResourceDefinition.apiextensions.k8s.io "widgets.example.com" is invalid: spec.names.plural: Required value
            CustomResourceDefinition.apiextensions.k8s.io "widgets.example.com" is invalid: [spec.names.kind: Required value, spec.names.listKind: Required value]
            CustomResourceDefinition.apiextensions.k8s.io "widgets.example.com" is invalid: spec.scope: Unsupported value: "Global": supported values: "Cluster", "Namespaced"
            CustomResourceDefinition.apiextensions.k8s.io "widgets.example.com" is invalid: [spec.group: Invalid value: "example": should be a domain with at least one dot, metadata.name: Invalid value: "widgets.example.com": must be spec.names.plural+"."+spec.group]
            CustomResourceDefinition.apiextensions.k8s.io "widgets.example.com" is invalid: spec.versions: Required value: must have exactly one version marked as storage version
            CustomResourceDefinition.apiextensions.k8s.io "widgets.example.com" is invalid: spec.versions: Invalid value: "2 storage versions": must have exactly one version marked as storage version
            CustomResourceDefinition.apiextensions.k8s.io "widgets.example.com" is invalid: [spec.versions[0].schema.openAPIV3Schema: Required value: schemas are required, spec.versions[0].selectableFields[0].jsonPath: Invalid value: ".spec.color": is an invalid path: does not refer to a valid field]
            CustomResourceDefinition.apiextensions.k8s.io "widgets.example.com" is invalid: [spec.versions[0].schema.openAPIV3Schema.properties[spec].properties[color].type: Required value: must not be empty for specified object fields, spec.versions[0].selectableFields[0].jsonPath: Invalid value: ".spec.color": must point to a field of type string, boolean or integer. Enum string fields and strings with formats are allowed.]
            CustomResourceDefinition.apiextensions.k8s.io "widgets.example.com" is invalid: [spec.versions[0].schema.openAPIV3Schema.type: Invalid value: "array": must be object at the root, spec.versions[0].schema.openAPIV3Schema.items: Required value: must be specified]
            CustomResourceDefinition.apiextensions.k8s.io "widgets.example.com" is invalid: spec.versions[0].selectableFields[0].jsonPath: Invalid value: ".spec.labels": must point to a field of type string, boolean or integer. Enum string fields and strings with formats are allowed.
            CustomResourceDefinition.apiextensions.k8s.io "widgets.example.com" is invalid: spec.versions[0].additionalPrinterColumns[0].type: Unsupported value: "map": supported values: "boolean", "date", "integer", "number", "string"
            CustomResourceDefinition.apiextensions.k8s.io "widgets.example.com" is invalid: spec.versions[0].schema.openAPIV3Schema.properties[spec].properties[replicas].default: Invalid value: "string": spec.replicas in body must be of type integer: "string"
            CustomResourceDefinition.apiextensions.k8s.io "widgets.example.com" is invalid: spec.preserveUnknownFields: Invalid value: true: cannot set to true, set x-kubernetes-preserve-unknown-fields to true in spec.versions[*].schema instead
            CustomResourceDefinition.apiextensions.k8s.io "widgets.tether.k8s.io" is invalid: metadata.annotations[api-approved.kubernetes.io]: Required value: protected groups must have approval annotation "api-approved.kubernetes.io", see https://github.com/kubernetes/enhancements/pull/1111
            CustomResourceDefinition.apiextensions.k8s.io "widgets.example.com" is invalid: spec.versions[0].schema.openAPIV3Schema.properties[spec].properties[ports].items.properties[name].default: Required value: this property is in x-kubernetes-list-map-keys, so it must have a default or be a required property
            CustomResourceDefinition.apiextensions.k8s.io "widgets.example.com" is invalid: spec.versions[0].schema.openAPIV3Schema.properties[spec].properties[tags].items.type: Invalid value: "object": must be a scalar type if parent array's x-kubernetes-list-type is `set`
            valid"#]]
        .assert_eq(&cases.join("\n"));
    }

    #[test]
    fn crd_updates_keep_scope_and_stored_versions() {
        let mut old = crd();
        accept_at(&mut old, "2025-01-01T00:00:00Z");
        let mut new = old.clone();
        new["spec"]["scope"] = json!("Cluster");
        let err = validate_crd_update(&old, &new).expect_err("scope is immutable");
        assert!(
            err.message
                .contains("spec.scope: Invalid value: \"Cluster\": field is immutable"),
            "{}",
            err.message
        );
        let mut dropped = old.clone();
        dropped["spec"]["versions"]
            .as_array_mut()
            .expect("versions")
            .remove(0);
        dropped["spec"]["versions"][0]["storage"] = json!(true);
        let err = validate_crd_update(&old, &dropped).expect_err("stored version removed");
        assert!(
            err.message.contains("status.storedVersions"),
            "{}",
            err.message
        );
        assert!(validate_crd_update(&old, &old).is_ok());
    }

    #[test]
    fn unknown_fields_are_pruned_and_defaults_applied() {
        let mut w = json!({
            "apiVersion": "example.com/v1", "kind": "Widget",
            "metadata": {"name": "w1", "unknownMeta": 1},
            "unknownTop": true,
            "spec": {"color": "red", "bogus": 1, "mode": null, "ratio": null,
                     "items": [{"name": "a", "junk": 1}],
                     "raw": {"anything": {"goes": 1}, "known": {"a": "x", "b": "pruned"}},
                     "template": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"x": "y", "z": 1}, "extra": 1}},
            "status": {"replicas": 2, "phase": "x"},
        });
        assert_eq!(
            unknown_fields(&rt(), &w),
            [
                "unknownTop",
                "spec.bogus",
                "spec.items[0].junk",
                "spec.raw.known.b",
                "spec.template.spec.z",
                "spec.template.extra",
                "status.phase"
            ]
        );
        prune_default_validate(&rt(), &mut w).expect("valid after pruning");
        expect![[r#"{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"w1","unknownMeta":1},"spec":{"color":"red","mode":"auto","ratio":null,"items":[{"name":"a","weight":5}],"raw":{"anything":{"goes":1},"known":{"a":"x"}},"template":{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"spec":{"x":"y"}},"replicas":1},"status":{"replicas":2}}"#]]
            .assert_eq(&w.to_string());
    }

    #[test]
    fn invalid_custom_resources_get_field_errors_like_the_real_server() {
        let base = |spec: Value| json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w1"}, "spec": spec});
        check_invalid(
            base(json!({"color": "red", "replicas": "string"})),
            expect![[
                r#"Widget.example.com "w1" is invalid: spec.replicas: Invalid value: "string": spec.replicas in body must be of type integer: "string""#
            ]],
        );
        check_invalid(
            base(json!({"replicas": 3})),
            expect![[r#"Widget.example.com "w1" is invalid: spec.color: Required value"#]],
        );
        check_invalid(
            base(json!({"color": "blue"})),
            expect![[
                r#"Widget.example.com "w1" is invalid: spec.color: Unsupported value: "blue": supported values: "red", "green""#
            ]],
        );
        check_invalid(
            base(json!({"color": "red", "replicas": 0})),
            expect![[
                r#"Widget.example.com "w1" is invalid: spec.replicas: Invalid value: 0: spec.replicas in body should be greater than or equal to 1"#
            ]],
        );
        check_invalid(
            base(json!({"color": "red", "replicas": 11})),
            expect![[
                r#"Widget.example.com "w1" is invalid: spec.replicas: Invalid value: 11: spec.replicas in body should be less than or equal to 10"#
            ]],
        );
        check_invalid(
            base(json!({"color": "red", "code": "a"})),
            expect![[
                r#"Widget.example.com "w1" is invalid: [spec.code: Invalid value: "a": spec.code in body should be at least 2 chars long, spec.code: Invalid value: "a": spec.code in body should match '^[0-9]+$']"#
            ]],
        );
        check_invalid(
            base(json!({"color": "red", "code": "123456"})),
            expect![[
                r#"Widget.example.com "w1" is invalid: spec.code: Too long: may not be more than 4 bytes"#
            ]],
        );
        check_invalid(
            base(json!({"color": "red", "port": true})),
            expect![[
                r#"Widget.example.com "w1" is invalid: spec.port: Invalid value: "boolean": spec.port in body must be of type integer,string: "boolean""#
            ]],
        );
        check_invalid(
            base(json!({"color": "red", "when": "yesterday"})),
            expect![[
                r#"Widget.example.com "w1" is invalid: spec.when: Invalid value: "yesterday": spec.when in body must be of type date-time: "yesterday""#
            ]],
        );
        check_invalid(
            base(json!({"color": "red", "items": [{"name": "a"}, {}, {"name": "c"}]})),
            expect![[
                r#"Widget.example.com "w1" is invalid: [spec.items: Too many: 3: must have at most 2 items, spec.items[1].name: Required value]"#
            ]],
        );
        check_invalid(
            base(json!({"color": "red", "tags": ["a", "b", "a"]})),
            expect![[r#"Widget.example.com "w1" is invalid: spec.tags[2]: Duplicate value: "a""#]],
        );
        check_invalid(
            base(json!({"color": "red", "labels": {"a": 1}})),
            expect![[
                r#"Widget.example.com "w1" is invalid: spec.labels.a: Invalid value: "integer": spec.labels.a in body must be of type string: "integer""#
            ]],
        );
        check_invalid(
            json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w1"}, "spec": "nope"}),
            expect![[
                r#"Widget.example.com "w1" is invalid: spec: Invalid value: "string": spec in body must be of type object: "string""#
            ]],
        );
        check_invalid(
            base(json!({"color": "red", "template": {"spec": {}}})),
            expect![[
                r#"Widget.example.com "w1" is invalid: [spec.template.apiVersion: Required value, spec.template.kind: Required value]"#
            ]],
        );
        // Valid edge cases: int-or-string both ways, nullable null, whole numbers as integers.
        for spec in [
            json!({"color": "green", "port": 80}),
            json!({"color": "green", "port": "http", "ratio": null}),
            json!({"color": "green", "replicas": 2.0}),
        ] {
            let mut obj = base(spec.clone());
            prune_default_validate(&rt(), &mut obj)
                .unwrap_or_else(|e| panic!("{spec} should be valid: {}", e.message));
        }
        let err = prune_default_validate(&rt(), &mut base(json!({"replicas": "x"})))
            .expect_err("invalid");
        let causes = err.details.expect("details")["causes"].clone();
        assert_eq!(
            causes,
            json!([
                {"reason": "FieldValueRequired", "message": "Required value", "field": "spec.color"},
                {"reason": "FieldValueInvalid", "message": "Invalid value: \"string\": spec.replicas in body must be of type integer: \"string\"", "field": "spec.replicas"},
            ])
        );
    }

    #[test]
    fn unsupported_constructs_are_reported() {
        let s = json!({"type": "object", "properties": {"spec": {"type": "object",
            "x-kubernetes-validations": [{"rule": "self.a > 0"}],
            "properties": {"list": {"type": "array", "items": {"type": "object", "x-kubernetes-validations": []}}}}}});
        assert_eq!(
            unsupported_constructs(&s),
            [
                "openAPIV3Schema.properties[spec].x-kubernetes-validations",
                "openAPIV3Schema.properties[spec].properties[list].items.x-kubernetes-validations",
            ]
        );
    }

    /// Arbitrary JSON up to a small depth, biased to the schema's field names so pruning,
    /// defaulting and nulls are exercised.
    fn arb_json() -> impl Strategy<Value = Value> {
        let key = prop_oneof![
            Just("spec".to_owned()),
            Just("status".to_owned()),
            Just("replicas".to_owned()),
            Just("items".to_owned()),
            Just("name".to_owned()),
            Just("raw".to_owned()),
            Just("known".to_owned()),
            Just("template".to_owned()),
            Just("metadata".to_owned()),
            Just("mode".to_owned()),
            Just("labels".to_owned()),
            "[a-z]{1,3}",
        ];
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i32>().prop_map(|n| json!(n)),
            "[a-z0-9]{0,4}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 48, 6, move |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                proptest::collection::btree_map(key.clone(), inner, 0..5)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn pruning_is_idempotent(obj in arb_json()) {
            let s = schema();
            let mut once = obj;
            prune(&s, &mut once);
            let mut twice = once.clone();
            prune(&s, &mut twice);
            prop_assert_eq!(once, twice);
        }

        #[test]
        fn prune_then_default_is_a_fixed_point(obj in arb_json()) {
            let s = schema();
            let mut once = obj;
            prune(&s, &mut once);
            default(&s, &mut once);
            let mut again = once.clone();
            prune(&s, &mut again);
            default(&s, &mut again);
            prop_assert_eq!(once, again);
        }

        #[test]
        fn accepted_objects_are_stable_and_valid(spec in arb_json()) {
            let rt = rt();
            let mut spec = spec;
            if let Some(m) = spec.as_object_mut() {
                // The one required field, so that most generated objects are accepted.
                m.insert("color".into(), json!("red"));
            }
            let mut obj = json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": spec});
            if prune_default_validate(&rt, &mut obj).is_ok() {
                // What the server stored passes again unchanged (a no-op write stays a no-op).
                let mut again = obj.clone();
                prop_assert!(prune_default_validate(&rt, &mut again).is_ok());
                prop_assert_eq!(again, obj);
            }
        }

        #[test]
        fn pruned_objects_only_keep_specified_fields(spec in arb_json()) {
            let s = schema();
            let mut obj = json!({"spec": spec});
            prune(&s, &mut obj);
            if let Some(Value::Object(m)) = obj.get("spec") {
                let allowed = s["properties"]["spec"]["properties"].as_object().expect("props");
                prop_assert!(m.keys().all(|k| allowed.contains_key(k)), "{m:?}");
            }
        }
    }
}
