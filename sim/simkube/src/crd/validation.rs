//! CRD objects: API defaulting and validation of a CustomResourceDefinition (names, versions, the structural schema rules), with kube-apiserver's causes.

#[allow(clippy::wildcard_imports)]
use super::*;

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

pub(super) fn versions(crd: &Value) -> &[Value] {
    crd.pointer("/spec/versions")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

pub(super) fn crd_causes(crd: &Value) -> Vec<Cause> {
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
pub(super) fn schema_at<'a>(schema: &'a Value, path: &str) -> Option<&'a Value> {
    path.trim_start_matches('.')
        .split('.')
        .try_fold(schema, |sch, k| {
            sch.get("properties").and_then(|p| p.get(k))
        })
}

pub(super) const TYPES: &[&str] = &["array", "boolean", "integer", "number", "object", "string"];

/// Structural-schema rules (KEP-1002) for `openAPIV3Schema`, with the real messages.
/// `path` locates the schema node in the CRD, `obj_path` the field it describes in objects
/// (`spec.replicas`), for the messages about invalid defaults.
pub(super) fn structural_causes(
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
pub(super) fn list_type_causes(
    m: &Map<String, Value>,
    ty: &str,
    path: &str,
    causes: &mut Vec<Cause>,
) {
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

pub(super) fn check_child_type(child: &Value, path: &str, why: &str, causes: &mut Vec<Cause>) {
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
