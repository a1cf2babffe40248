//! Per-type write semantics, the equivalent of the apiserver's create/update strategies:
//! server-set metadata, generation, the status/spec split, defaulting that would otherwise cause
//! diff loops, normalization as Go's `omitempty` does it, and validation with the real messages.

use std::collections::HashSet;

use crate::names::{
    DNS1035_LABEL_MSG, DNS1123_LABEL_MSG, DNS1123_SUBDOMAIN_MSG, is_dns1035_label,
    is_dns1123_label, is_dns1123_subdomain,
};
use rand::Rng as _;
use serde_json::{Map, Value, json};

use crate::error::{ApiError, Cause};
use crate::registry::ResourceType;

/// The characters generateName draws from (the apiserver avoids vowels and look-alikes).
const NAME_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
/// generateName prefixes are cut so the result stays a valid DNS label.
const MAX_GENERATED_PREFIX: usize = 58;

/// A name from a generateName prefix: the prefix (cut to 58 characters) plus 5 random characters.
pub fn generate_name(prefix: &str) -> String {
    let mut rng = rand::rng();
    let cut: String = prefix.chars().take(MAX_GENERATED_PREFIX).collect();
    let suffix: String = (0..5)
        .map(|_| NAME_ALPHABET[rng.random_range(0..NAME_ALPHABET.len())] as char)
        .collect();
    format!("{cut}{suffix}")
}

/// Which rule validates `metadata.name` for a type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NameRule {
    Subdomain,
    Label,
    Dns1035,
    PathSegment,
}

fn name_rule(rt: &ResourceType) -> NameRule {
    match (rt.group.as_str(), rt.plural.as_str()) {
        ("", "namespaces") => NameRule::Label,
        ("", "services") => NameRule::Dns1035,
        ("rbac.authorization.k8s.io", _) => NameRule::PathSegment,
        ("certificates.k8s.io", "certificatesigningrequests") => NameRule::PathSegment,
        _ => NameRule::Subdomain,
    }
}

/// Checks a name under a type's rule; `Some(message)` describes the problem.
fn name_problem(rule: NameRule, name: &str) -> Option<String> {
    match rule {
        NameRule::Subdomain if !is_dns1123_subdomain(name) => {
            if name.len() > 253 {
                Some("must be no more than 253 characters".into())
            } else {
                Some(DNS1123_SUBDOMAIN_MSG.into())
            }
        }
        NameRule::Label if !is_dns1123_label(name) => {
            if name.len() > 63 {
                Some("must be no more than 63 characters".into())
            } else {
                Some(DNS1123_LABEL_MSG.into())
            }
        }
        NameRule::Dns1035 if !is_dns1035_label(name) => {
            if name.len() > 63 {
                Some("must be no more than 63 characters".into())
            } else {
                Some(DNS1035_LABEL_MSG.into())
            }
        }
        NameRule::PathSegment => {
            if name == "." || name == ".." {
                Some(format!("may not be '{name}'"))
            } else if name.contains('/') || name.contains('%') {
                Some(format!(
                    "may not contain '{}'",
                    if name.contains('/') { "/" } else { "%" }
                ))
            } else {
                None
            }
        }
        _ => None,
    }
}

fn invalid_value(field: &str, value: &Value, detail: &str) -> Cause {
    Cause {
        reason: "FieldValueInvalid".into(),
        message: format!("Invalid value: {value}: {detail}"),
        field: field.into(),
    }
}

fn required(field: &str, detail: &str) -> Cause {
    let message = if detail.is_empty() {
        "Required value".to_owned()
    } else {
        format!("Required value: {detail}")
    };
    Cause {
        reason: "FieldValueRequired".into(),
        message,
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

fn name_of(obj: &Value) -> &str {
    obj["metadata"]["name"].as_str().unwrap_or_default()
}

fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = json!({});
    }
    obj["metadata"]
        .as_object_mut()
        .expect("invariant: metadata was just made an object")
}

/// Drops empty metadata lists and maps, as Go's `omitempty` does; kube-runtime's finalizer
/// helper depends on `finalizers: []` disappearing.
pub fn normalize(obj: &mut Value) {
    let meta = meta_mut(obj);
    for key in [
        "finalizers",
        "labels",
        "annotations",
        "ownerReferences",
        "managedFields",
    ] {
        let empty = match meta.get(key) {
            Some(Value::Array(a)) => a.is_empty(),
            Some(Value::Object(m)) => m.is_empty(),
            Some(Value::Null) => true,
            _ => false,
        };
        if empty {
            meta.remove(key);
        }
    }
}

/// The part of an object whose change bumps `metadata.generation`: everything except metadata
/// (and except status when status is a subresource).
fn spec_part(rt: &ResourceType, obj: &Value) -> Map<String, Value> {
    let mut m = obj.as_object().cloned().unwrap_or_default();
    m.remove("metadata");
    m.remove("apiVersion");
    m.remove("kind");
    if rt.has_status() {
        m.remove("status");
    }
    m
}

/// Whether the type keeps `metadata.generation`: custom resources and the built-ins whose
/// strategies set it (workloads, CRDs, policy and networking objects). ConfigMaps, Services,
/// Pods (in 1.33) and most core types carry none.
pub fn tracks_generation(rt: &ResourceType) -> bool {
    matches!(rt.origin, crate::registry::Origin::Crd { .. })
        || matches!(
            rt.group.as_str(),
            "apps"
                | "batch"
                | "networking.k8s.io"
                | "policy"
                | "autoscaling"
                | "apiextensions.k8s.io"
                | "admissionregistration.k8s.io"
        )
}

fn is(rt: &ResourceType, group: &str, plural: &str) -> bool {
    rt.group == group && rt.plural == plural
}

/// Server-side work on a new object before it is stored: server-set metadata, status reset,
/// defaulting and validation. `obj` already carries its final namespace; a name is generated
/// here from `generateName` if needed.
pub fn prepare_create(rt: &ResourceType, obj: &mut Value) -> Result<(), ApiError> {
    let generation = tracks_generation(rt);
    if !obj.is_object() {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
        ));
    }
    {
        let meta = meta_mut(obj);
        if meta
            .get("resourceVersion")
            .and_then(Value::as_str)
            .is_some_and(|s| !s.is_empty())
        {
            return Err(ApiError::internal(
                "resourceVersion should not be set on objects to be created",
            ));
        }
        let name = meta
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        if name.is_empty()
            && let Some(prefix) = meta.get("generateName").and_then(Value::as_str)
            && !prefix.is_empty()
        {
            let generated = generate_name(prefix);
            meta.insert("name".into(), json!(generated));
        }
        meta.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
        meta.insert(
            "creationTimestamp".into(),
            json!(crate::timefmt::now_rfc3339()),
        );
        if generation {
            meta.insert("generation".into(), json!(1));
        } else {
            meta.remove("generation");
        }
        meta.remove("deletionTimestamp");
        meta.remove("deletionGracePeriodSeconds");
        meta.remove("selfLink");
    }
    if rt.has_status() {
        obj.as_object_mut()
            .expect("invariant: checked object above")
            .remove("status");
    }
    default_object(rt, obj);
    normalize(obj);
    validate(rt, obj, None)
}

/// Server-side work on an update. `subresource` is `Some("status")` for `/status` writes (only
/// `.status` is taken from `new`) and `None` for the main resource (`.status` is kept from `old`
/// when status is a subresource). Returns an error for changes the server forbids.
pub fn prepare_update(
    rt: &ResourceType,
    old: &Value,
    new: &mut Value,
    subresource: Option<&str>,
) -> Result<(), ApiError> {
    if !new.is_object() {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
        ));
    }
    let old_meta = old["metadata"].as_object().cloned().unwrap_or_default();
    // An empty uid means "the stored one"; a different one is an immutable-field error.
    if let Some(uid) = new["metadata"]["uid"].as_str()
        && !uid.is_empty()
        && Some(uid) != old_meta.get("uid").and_then(Value::as_str)
    {
        return Err(ApiError::invalid(
            &rt.group,
            &rt.kind,
            name_of(old),
            &[invalid_value(
                "metadata.uid",
                &json!(uid),
                "field is immutable",
            )],
        ));
    }
    if subresource == Some("status") {
        // Only status (and managedFields, which track the status write) come from the request.
        let status = new.get("status").cloned();
        let managed = new["metadata"].get("managedFields").cloned();
        let mut merged = old.clone();
        match status {
            Some(s) => merged["status"] = s,
            None => {
                if let Some(m) = merged.as_object_mut() {
                    m.remove("status");
                }
            }
        }
        if let Some(mf) = managed {
            meta_mut(&mut merged).insert("managedFields".into(), mf);
        }
        *new = merged;
        normalize(new);
        return validate(rt, new, Some(old));
    }
    if rt.has_status() {
        let m = new
            .as_object_mut()
            .expect("invariant: checked object above");
        match old.get("status") {
            Some(s) => {
                m.insert("status".into(), s.clone());
            }
            None => {
                m.remove("status");
            }
        }
    }
    {
        let meta = meta_mut(new);
        for key in [
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
        ] {
            match old_meta.get(key) {
                Some(v) => meta.insert(key.into(), v.clone()),
                None => meta.remove(key),
            };
        }
        meta.remove("selfLink");
    }
    if is(rt, "", "services") {
        keep_service_allocations(old, new);
    }
    default_object(rt, new);
    normalize(new);
    if tracks_generation(rt) && spec_part(rt, old) != spec_part(rt, new) {
        let generation = old["metadata"]["generation"].as_i64().unwrap_or(0) + 1;
        meta_mut(new).insert("generation".into(), json!(generation));
    }
    validate(rt, new, Some(old))
}

/// Whether an object being deleted has no finalizers left and no grace period running, so the
/// write that got it there must remove it.
pub fn deletion_complete(obj: &Value) -> bool {
    let meta = &obj["metadata"];
    meta.get("deletionTimestamp").is_some_and(|v| !v.is_null())
        && meta["finalizers"].as_array().is_none_or(Vec::is_empty)
        && meta["deletionGracePeriodSeconds"].as_i64().unwrap_or(0) == 0
}

/// Validates an object (against `old` on update) and answers 422 Invalid with causes.
pub fn validate(rt: &ResourceType, obj: &Value, old: Option<&Value>) -> Result<(), ApiError> {
    let mut causes = Vec::new();
    let meta = &obj["metadata"];
    let name = name_of(obj);
    if name.is_empty() {
        causes.push(required(
            "metadata.name",
            "name or generateName is required",
        ));
    } else if let Some(problem) = name_problem(name_rule(rt), name) {
        causes.push(invalid_value("metadata.name", &json!(name), &problem));
    }
    if let Some(labels) = meta.get("labels").and_then(Value::as_object) {
        for (k, v) in labels {
            if let Some(p) = qualified_name_problem(k) {
                causes.push(invalid_value("metadata.labels", &json!(k), &p));
            }
            match v.as_str() {
                Some(s) if label_value_ok(s) => {}
                Some(s) => causes.push(invalid_value(
                    "metadata.labels",
                    &json!(s),
                    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')",
                )),
                None => causes.push(invalid_value("metadata.labels", v, "label values must be strings")),
            }
        }
    }
    if let Some(refs) = meta.get("ownerReferences").and_then(Value::as_array) {
        let mut controllers = 0;
        for (i, r) in refs.iter().enumerate() {
            for f in ["apiVersion", "kind", "name", "uid"] {
                if r[f].as_str().is_none_or(str::is_empty) {
                    causes.push(required(&format!("metadata.ownerReferences[{i}].{f}"), ""));
                }
            }
            if r["controller"].as_bool() == Some(true) {
                controllers += 1;
            }
        }
        if controllers > 1 {
            causes.push(invalid_value(
                "metadata.ownerReferences",
                &Value::Array(refs.clone()),
                "Only one reference can have Controller set to true",
            ));
        }
    }
    if let Some(old) = old {
        let old_meta = &old["metadata"];
        if old_meta
            .get("deletionTimestamp")
            .is_some_and(|v| !v.is_null())
        {
            let before: HashSet<&str> = old_meta["finalizers"]
                .as_array()
                .map(|a| a.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let added = meta["finalizers"].as_array().is_some_and(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .any(|f| !before.contains(f))
            });
            if added {
                causes.push(forbidden(
                    "metadata.finalizers",
                    "no new finalizers can be added if the object is being deleted",
                ));
            }
        }
        if (is(rt, "", "configmaps") || is(rt, "", "secrets"))
            && old["immutable"].as_bool() == Some(true)
        {
            if old.get("data") != obj.get("data") || old.get("binaryData") != obj.get("binaryData")
            {
                causes.push(forbidden(
                    "data",
                    "field is immutable when `immutable` is set",
                ));
            }
            if obj["immutable"].as_bool() != Some(true) {
                causes.push(forbidden(
                    "immutable",
                    "field is immutable when `immutable` is set",
                ));
            }
        }
        if is(rt, "", "services") {
            let (o, n) = (&old["spec"]["clusterIP"], &obj["spec"]["clusterIP"]);
            if o.is_string() && o != n {
                causes.push(invalid_value("spec.clusterIP", n, "field is immutable"));
            }
        }
        if is(rt, "", "pods") {
            causes.extend(pod_update_problems(old, obj));
        }
        if is(rt, "", "persistentvolumeclaims") {
            causes.extend(claim_update_problems(old, obj));
        }
    }
    causes.extend(type_problems(rt, obj));
    if causes.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(&rt.group, &rt.kind, name, &causes))
    }
}

fn label_value_ok(s: &str) -> bool {
    s.is_empty()
        || (s.len() <= 63
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
            && s.as_bytes()[0].is_ascii_alphanumeric()
            && s.as_bytes()[s.len() - 1].is_ascii_alphanumeric())
}

fn qualified_name_problem(key: &str) -> Option<String> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix
        && !is_dns1123_subdomain(p)
    {
        return Some(format!("prefix part {DNS1123_SUBDOMAIN_MSG}"));
    }
    if name.is_empty() || !label_value_ok(name) {
        return Some("name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')".into());
    }
    None
}

/// Pod updates may change only a few spec fields once created.
fn pod_update_problems(old: &Value, new: &Value) -> Vec<Cause> {
    let strip = |pod: &Value| -> Value {
        let mut spec = pod["spec"].clone();
        for list in ["containers", "initContainers"] {
            if let Some(cs) = spec[list].as_array_mut() {
                for c in cs {
                    if let Some(m) = c.as_object_mut() {
                        m.remove("image");
                    }
                }
            }
        }
        if let Some(m) = spec.as_object_mut() {
            m.remove("activeDeadlineSeconds");
            m.remove("tolerations");
            m.remove("terminationGracePeriodSeconds");
        }
        spec
    };
    if strip(old) == strip(new) {
        return Vec::new();
    }
    vec![forbidden(
        "spec",
        "pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)",
    )]
}

/// The beta annotation naming a claim's class, from before `spec.storageClassName`.
const CLAIM_CLASS_BETA: &str = "volume.beta.kubernetes.io/storage-class";

/// kube-apiserver 1.33's `ValidatePersistentVolumeClaimUpdate` (RecoverVolumeExpansionFailure
/// on, as it is by default since 1.32): a claim's spec is fixed once created, except that the
/// volume controller names its volume once, a class may be filled in where none was (the
/// retroactive default class, or the beta annotation moving to the field), and a bound claim's
/// storage request may change, down to just above `status.capacity` so that a user can back
/// out of an expansion the storage cannot make. Whether it may grow is admission's question.
fn claim_update_problems(old: &Value, new: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    let (mut was, mut now) = (old["spec"].clone(), new["spec"].clone());
    let (Some(was_map), Some(now_map)) = (was.as_object_mut(), now.as_object_mut()) else {
        return causes;
    };
    if was_map
        .get("volumeName")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        match now_map.get("volumeName") {
            Some(v) => was_map.insert("volumeName".into(), v.clone()),
            None => was_map.remove("volumeName"),
        };
    }
    let unset = |m: &Map<String, Value>| m.get("storageClassName").is_none_or(Value::is_null);
    if unset(&*was_map) && !unset(&*now_map) {
        let annotation = |o: &Value| {
            o["metadata"]["annotations"][CLAIM_CLASS_BETA]
                .as_str()
                .map(str::to_owned)
        };
        let upgrade = match annotation(old) {
            Some(class) => {
                now_map.get("storageClassName").and_then(Value::as_str) == Some(class.as_str())
                    && annotation(new).is_none_or(|c| c == class)
            }
            None => true,
        };
        if upgrade {
            now_map.remove("storageClassName");
        }
    }
    if new["status"]["phase"].as_str() == Some("Bound")
        && let Some(requests) = now_map
            .get_mut("resources")
            .and_then(|r| r.get_mut("requests"))
            .and_then(Value::as_object_mut)
    {
        match old["spec"]["resources"]["requests"].get("storage") {
            Some(v) => requests.insert("storage".into(), v.clone()),
            None => requests.remove("storage"),
        };
    }
    if was != now {
        // kube-apiserver appends a Go diff of the two specs, which is not reproduced.
        causes.push(forbidden(
            "spec",
            "spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims",
        ));
    }
    let size = |v: &Value| {
        v.as_str()
            .and_then(crate::controllers::scheduler::parse_quantity)
            .unwrap_or(0)
    };
    let storage = |o: &Value| size(&o["spec"]["resources"]["requests"]["storage"]);
    let (old_size, new_size) = (storage(old), storage(new));
    if new_size < old_size && new_size <= size(&old["status"]["capacity"]["storage"]) {
        causes.push(forbidden(
            "spec.resources.requests.storage",
            "field can not be less than status.capacity",
        ));
    }
    let mode = &new["spec"]["volumeMode"];
    if old["spec"]["volumeMode"] != *mode {
        // Upstream's path, without `spec.`.
        causes.push(invalid_value("volumeMode", mode, "field is immutable"));
    }
    causes
}

/// Required fields the real server insists on, for the types whose absence would surprise.
fn type_problems(rt: &ResourceType, obj: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    let container_problems =
        |spec: &Value, path: &str, causes: &mut Vec<Cause>| match spec["containers"].as_array() {
            Some(cs) if !cs.is_empty() => {
                let mut seen = HashSet::new();
                for (i, c) in cs.iter().enumerate() {
                    match c["name"].as_str() {
                        Some(n) if !n.is_empty() => {
                            if !seen.insert(n.to_owned()) {
                                causes.push(Cause {
                                    reason: "FieldValueDuplicate".into(),
                                    message: format!("Duplicate value: \"{n}\""),
                                    field: format!("{path}.containers[{i}].name"),
                                });
                            } else if !is_dns1123_label(n) {
                                causes.push(invalid_value(
                                    &format!("{path}.containers[{i}].name"),
                                    &json!(n),
                                    DNS1123_LABEL_MSG,
                                ));
                            }
                        }
                        _ => causes.push(required(&format!("{path}.containers[{i}].name"), "")),
                    }
                    if c["image"].as_str().is_none_or(str::is_empty) {
                        causes.push(required(&format!("{path}.containers[{i}].image"), ""));
                    }
                }
            }
            _ => causes.push(required(&format!("{path}.containers"), "")),
        };
    if is(rt, "", "pods") {
        container_problems(&obj["spec"], "spec", &mut causes);
    } else if is(rt, "apps", "deployments") || is(rt, "apps", "replicasets") {
        if !obj["spec"]["selector"].is_object() {
            causes.push(required("spec.selector", ""));
        }
        container_problems(
            &obj["spec"]["template"]["spec"],
            "spec.template.spec",
            &mut causes,
        );
    } else if is(rt, "", "services") {
        let spec = &obj["spec"];
        let headless = spec["clusterIP"].as_str() == Some("None");
        let external = spec["type"].as_str() == Some("ExternalName");
        let ports = spec["ports"].as_array().map_or(0, Vec::len);
        if ports == 0 && !headless && !external {
            causes.push(required("spec.ports", ""));
        }
        if let Some(list) = spec["ports"].as_array() {
            for (i, p) in list.iter().enumerate() {
                match p["port"].as_i64() {
                    Some(n) if (1..=65535).contains(&n) => {}
                    _ => causes.push(invalid_value(
                        &format!("spec.ports[{i}].port"),
                        &p["port"],
                        "must be between 1 and 65535, inclusive",
                    )),
                }
                if list.len() > 1 && p["name"].as_str().is_none_or(str::is_empty) {
                    causes.push(required(&format!("spec.ports[{i}].name"), ""));
                }
            }
        }
    } else if is(rt, "", "configmaps") || is(rt, "", "secrets") {
        for field in ["data", "binaryData"] {
            if let Some(m) = obj[field].as_object() {
                for k in m.keys() {
                    let ok = !k.is_empty()
                        && k.len() <= 253
                        && k.bytes()
                            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
                    if !ok {
                        causes.push(invalid_value(
                            &format!("{field}[{k}]"),
                            &json!(k),
                            "a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')",
                        ));
                    }
                }
            }
        }
    }
    causes
}

/// Fills in the defaults the real server sets, for the fields whose absence would make a
/// controller that compares desired and actual state loop forever.
pub fn default_object(rt: &ResourceType, obj: &mut Value) {
    match (rt.group.as_str(), rt.plural.as_str()) {
        ("", "pods") => {
            default_pod_spec(&mut obj["spec"]);
            default_pod_only(&mut obj["spec"]);
            if !obj["status"].is_object() {
                obj["status"] = json!({});
            }
            if obj["status"].get("phase").is_none() {
                obj["status"]["phase"] = json!("Pending");
            }
            if obj["status"].get("qosClass").is_none() {
                obj["status"]["qosClass"] = json!(qos_class(&obj["spec"]));
            }
        }
        ("", "namespaces") => {
            let name = name_of(obj).to_owned();
            let meta = meta_mut(obj);
            if !meta.get("labels").is_some_and(Value::is_object) {
                meta.insert("labels".into(), json!({}));
            }
            meta["labels"]["kubernetes.io/metadata.name"] = json!(name);
            if !obj["spec"].is_object() {
                obj["spec"] = json!({});
            }
            if obj["spec"].get("finalizers").is_none() {
                obj["spec"]["finalizers"] = json!(["kubernetes"]);
            }
            if !obj["status"].is_object() {
                obj["status"] = json!({});
            }
            if obj["status"].get("phase").is_none() {
                obj["status"]["phase"] = json!("Active");
            }
        }
        ("", "services") => default_service(obj),
        ("", "secrets") => {
            if obj.get("type").is_none() {
                obj["type"] = json!("Opaque");
            }
            merge_string_data(obj);
        }
        ("", "serviceaccounts") | ("", "configmaps") | ("", "endpoints") => {}
        ("apps", "deployments") => {
            let spec = &mut obj["spec"];
            if !spec.is_object() {
                *spec = json!({});
            }
            set_default(spec, "replicas", json!(1));
            set_default(spec, "revisionHistoryLimit", json!(10));
            set_default(spec, "progressDeadlineSeconds", json!(600));
            default_deployment_strategy(spec);
            default_pod_template(spec);
        }
        ("apps", "daemonsets") => {
            let spec = &mut obj["spec"];
            if !spec.is_object() {
                *spec = json!({});
            }
            set_default(spec, "revisionHistoryLimit", json!(10));
            default_daemonset_strategy(spec);
            default_pod_template(spec);
        }
        ("apps", "replicasets") => {
            let spec = &mut obj["spec"];
            if !spec.is_object() {
                *spec = json!({});
            }
            set_default(spec, "replicas", json!(1));
            default_pod_template(spec);
        }
        // `SetDefaults_PersistentVolumeClaim`, `SetDefaults_PersistentVolume` and the
        // StorageClass defaults: what `kubectl get` shows of a new object before any
        // controller touched it.
        ("", "persistentvolumeclaims") => {
            if obj["spec"].is_object() {
                set_default(&mut obj["spec"], "volumeMode", json!("Filesystem"));
            }
            default_status_phase(obj, "Pending");
        }
        ("", "persistentvolumes") => {
            if obj["spec"].is_object() {
                set_default(
                    &mut obj["spec"],
                    "persistentVolumeReclaimPolicy",
                    json!("Retain"),
                );
                set_default(&mut obj["spec"], "volumeMode", json!("Filesystem"));
            }
            default_status_phase(obj, "Pending");
        }
        ("storage.k8s.io", "storageclasses") => {
            set_default(obj, "reclaimPolicy", json!("Delete"));
            set_default(obj, "volumeBindingMode", json!("Immediate"));
        }
        _ => {}
    }
}

fn default_status_phase(obj: &mut Value, phase: &str) {
    if !obj["status"].is_object() {
        obj["status"] = json!({});
    }
    set_default(&mut obj["status"], "phase", json!(phase));
}

/// As kube-apiserver defaults it field by field, so `strategy: {}` (what kubectl's protobuf body
/// carries) and a partial `rollingUpdate` are completed too.
fn default_deployment_strategy(spec: &mut Value) {
    if !spec["strategy"].is_object() {
        spec["strategy"] = json!({});
    }
    let strategy = &mut spec["strategy"];
    if strategy["type"].as_str().is_none_or(str::is_empty) {
        strategy["type"] = json!("RollingUpdate");
    }
    if strategy["type"] == "RollingUpdate" {
        if !strategy["rollingUpdate"].is_object() {
            strategy["rollingUpdate"] = json!({});
        }
        set_default(
            &mut strategy["rollingUpdate"],
            "maxUnavailable",
            json!("25%"),
        );
        set_default(&mut strategy["rollingUpdate"], "maxSurge", json!("25%"));
    }
}

/// `SetDefaults_DaemonSet`: RollingUpdate with `maxUnavailable: 1`, `maxSurge: 0`.
fn default_daemonset_strategy(spec: &mut Value) {
    if !spec["updateStrategy"].is_object() {
        spec["updateStrategy"] = json!({});
    }
    let strategy = &mut spec["updateStrategy"];
    if strategy["type"].as_str().is_none_or(str::is_empty) {
        strategy["type"] = json!("RollingUpdate");
    }
    if strategy["type"] == "RollingUpdate" {
        if !strategy["rollingUpdate"].is_object() {
            strategy["rollingUpdate"] = json!({});
        }
        set_default(&mut strategy["rollingUpdate"], "maxUnavailable", json!(1));
        set_default(&mut strategy["rollingUpdate"], "maxSurge", json!(0));
    }
}

fn set_default(obj: &mut Value, key: &str, value: Value) {
    if let Some(m) = obj.as_object_mut() {
        m.entry(key).or_insert(value);
    }
}

fn default_pod_template(spec: &mut Value) {
    if spec["template"].is_object() {
        if !spec["template"]["spec"].is_object() {
            spec["template"]["spec"] = json!({});
        }
        default_pod_spec(&mut spec["template"]["spec"]);
        if !spec["template"]["metadata"].is_object() {
            spec["template"]["metadata"] = json!({});
        }
    }
}

fn qos_class(spec: &Value) -> &'static str {
    let any = spec["containers"].as_array().is_some_and(|cs| {
        cs.iter().any(|c| {
            c["resources"].as_object().is_some_and(|r| {
                r.values()
                    .any(|v| v.as_object().is_some_and(|m| !m.is_empty()))
            })
        })
    });
    if any { "Burstable" } else { "BestEffort" }
}

/// Defaults of every pod spec, including pod templates (`SetDefaults_PodSpec`).
fn default_pod_spec(spec: &mut Value) {
    if !spec.is_object() {
        *spec = json!({});
    }
    set_default(spec, "restartPolicy", json!("Always"));
    set_default(spec, "dnsPolicy", json!("ClusterFirst"));
    set_default(spec, "schedulerName", json!("default-scheduler"));
    set_default(spec, "terminationGracePeriodSeconds", json!(30));
    set_default(spec, "securityContext", json!({}));
    if spec.get("serviceAccountName").is_some() {
        let sa = spec["serviceAccountName"].clone();
        set_default(spec, "serviceAccount", sa);
    }
    for list in ["containers", "initContainers"] {
        if let Some(cs) = spec[list].as_array_mut() {
            for c in cs {
                default_container(c);
            }
        }
    }
}

/// What only Pods get, from pod defaulting and the admission plugins (Priority,
/// DefaultTolerationSeconds); pod templates in workloads do not carry these.
fn default_pod_only(spec: &mut Value) {
    set_default(spec, "enableServiceLinks", json!(true));
    set_default(spec, "priority", json!(0));
    set_default(spec, "preemptionPolicy", json!("PreemptLowerPriority"));
    if !spec.get("tolerations").is_some_and(Value::is_array) {
        spec["tolerations"] = json!([]);
    }
    for taint in [
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
    ] {
        let tolerations = spec["tolerations"]
            .as_array_mut()
            .expect("invariant: set to an array above");
        if !tolerations.iter().any(|t| t["key"].as_str() == Some(taint)) {
            tolerations.push(json!({"key": taint, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}));
        }
    }
}

fn default_container(c: &mut Value) {
    let image = c["image"].as_str().unwrap_or_default();
    let last = image.rsplit('/').next().unwrap_or_default();
    let tag_latest = image.contains('@') || !last.contains(':') || last.ends_with(":latest");
    let pull = if image.contains('@') {
        "IfNotPresent"
    } else if tag_latest {
        "Always"
    } else {
        "IfNotPresent"
    };
    set_default(c, "imagePullPolicy", json!(pull));
    set_default(c, "terminationMessagePath", json!("/dev/termination-log"));
    set_default(c, "terminationMessagePolicy", json!("File"));
    set_default(c, "resources", json!({}));
    if let Some(ports) = c["ports"].as_array_mut() {
        for p in ports {
            set_default(p, "protocol", json!("TCP"));
        }
    }
}

fn default_service(obj: &mut Value) {
    let spec = &mut obj["spec"];
    if !spec.is_object() {
        *spec = json!({});
    }
    set_default(spec, "type", json!("ClusterIP"));
    set_default(spec, "sessionAffinity", json!("None"));
    let external_name = spec["type"].as_str() == Some("ExternalName");
    if !external_name {
        set_default(spec, "ipFamilies", json!(["IPv4"]));
        set_default(spec, "ipFamilyPolicy", json!("SingleStack"));
        set_default(spec, "internalTrafficPolicy", json!("Cluster"));
    }
    if matches!(spec["type"].as_str(), Some("NodePort" | "LoadBalancer")) {
        set_default(spec, "externalTrafficPolicy", json!("Cluster"));
    }
    if let Some(ports) = spec["ports"].as_array_mut() {
        for p in ports {
            set_default(p, "protocol", json!("TCP"));
            if p.get("targetPort").is_none() {
                let port = p["port"].clone();
                p["targetPort"] = port;
            }
        }
    }
    if !obj["status"].is_object() {
        obj["status"] = json!({"loadBalancer": {}});
    }
}

/// An update that leaves out the allocated cluster IPs or node ports keeps them, as the real
/// server does (so `kubectl replace` of a manifest without them works).
fn keep_service_allocations(old: &Value, new: &mut Value) {
    if !new["spec"].is_object() {
        return;
    }
    for key in ["clusterIP", "clusterIPs"] {
        let missing = match new["spec"].get(key) {
            None | Some(Value::Null) => true,
            Some(Value::String(s)) => s.is_empty(),
            Some(Value::Array(a)) => a.is_empty(),
            _ => false,
        };
        if missing && let Some(v) = old["spec"].get(key) {
            new["spec"][key] = v.clone();
        }
    }
    let old_ports = old["spec"]["ports"].as_array().cloned().unwrap_or_default();
    if let Some(ports) = new["spec"]["ports"].as_array_mut() {
        for p in ports {
            if p.get("nodePort").is_some_and(|n| !n.is_null()) {
                continue;
            }
            let same = old_ports.iter().find(|o| {
                o["port"] == p["port"]
                    && o["protocol"] == p["protocol"].as_str().map_or(json!("TCP"), |s| json!(s))
            });
            if let Some(n) = same.and_then(|o| o.get("nodePort")) {
                p["nodePort"] = n.clone();
            }
        }
    }
}

/// Secret `stringData` is merged into `data` (base64) on write and never stored.
fn merge_string_data(obj: &mut Value) {
    use base64::Engine as _;
    let Some(string_data) = obj.as_object_mut().and_then(|m| m.remove("stringData")) else {
        return;
    };
    let Some(entries) = string_data.as_object() else {
        return;
    };
    if !obj["data"].is_object() {
        obj["data"] = json!({});
    }
    for (k, v) in entries {
        let raw = v.as_str().unwrap_or_default();
        obj["data"][k] = json!(base64::engine::general_purpose::STANDARD.encode(raw));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::Origin;

    fn rt(group: &str, plural: &str, kind: &str, status: bool) -> ResourceType {
        ResourceType {
            group: group.into(),
            version: "v1".into(),
            kind: kind.into(),
            plural: plural.into(),
            singular: kind.to_lowercase(),
            list_kind: format!("{kind}List"),
            namespaced: plural != "namespaces",
            short_names: vec![],
            categories: vec![],
            verbs: vec![],
            subresources: if status {
                vec!["status".into()]
            } else {
                vec![]
            },
            printer_columns: vec![],
            selectable_fields: vec![],
            schema: None,
            storage: true,
            origin: Origin::Builtin,
        }
    }

    #[test]
    fn generate_name_uses_the_real_alphabet_and_cut() {
        let long = "x".repeat(80);
        let n = generate_name(&long);
        assert_eq!(n.len(), 63);
        assert!(n[58..].bytes().all(|b| NAME_ALPHABET.contains(&b)));
    }

    #[test]
    fn create_sets_server_fields_and_rejects_bad_names() {
        let cm = rt("", "configmaps", "ConfigMap", false);
        let mut o = json!({"metadata": {"name": "ok", "finalizers": []}});
        prepare_create(&cm, &mut o).expect("valid");
        assert!(
            o["metadata"].get("generation").is_none(),
            "configmaps carry no generation"
        );
        assert!(o["metadata"]["uid"].is_string());
        assert!(
            o["metadata"].get("finalizers").is_none(),
            "empty finalizers dropped"
        );
        let mut bad = json!({"metadata": {"name": "Bad_Name"}});
        let err = prepare_create(&cm, &mut bad).expect_err("invalid");
        assert_eq!(err.code, 422);
        assert!(err.message.starts_with("ConfigMap \"Bad_Name\" is invalid: metadata.name: Invalid value: \"Bad_Name\": a lowercase RFC 1123 subdomain"), "{}", err.message);
    }

    #[test]
    fn generation_follows_spec_not_status_or_metadata() {
        let dep = rt("apps", "deployments", "Deployment", true);
        let mut o = json!({"metadata": {"name": "d"}, "spec": {"selector": {}, "template": {"spec": {"containers": [{"name": "c", "image": "i:1"}]}}}});
        prepare_create(&dep, &mut o).expect("valid");
        let mut labels_only = o.clone();
        labels_only["metadata"]["labels"] = json!({"a": "b"});
        labels_only["status"] = json!({"replicas": 3});
        prepare_update(&dep, &o, &mut labels_only, None).expect("valid");
        assert_eq!(labels_only["metadata"]["generation"], 1);
        assert!(
            labels_only.get("status").is_none(),
            "main resource ignores status"
        );
        let mut spec = o.clone();
        spec["spec"]["replicas"] = json!(5);
        prepare_update(&dep, &o, &mut spec, None).expect("valid");
        assert_eq!(spec["metadata"]["generation"], 2);
        let mut status = o.clone();
        status["spec"]["replicas"] = json!(9);
        status["status"] = json!({"replicas": 1});
        prepare_update(&dep, &o, &mut status, Some("status")).expect("valid");
        assert_eq!(status["spec"]["replicas"], 1);
        assert_eq!(status["status"]["replicas"], 1);
        assert_eq!(status["metadata"]["generation"], 1);
    }

    #[test]
    fn claims_may_back_out_of_an_expansion_down_to_just_above_their_capacity() {
        let claim = |request: &str| {
            json!({"metadata": {"name": "data"},
                "spec": {"accessModes": ["ReadWriteOnce"], "volumeMode": "Filesystem",
                    "storageClassName": "fast", "volumeName": "pv-1",
                    "resources": {"requests": {"storage": request}}},
                "status": {"phase": "Bound", "capacity": {"storage": "2Gi"}}})
        };
        // An expansion to 3Gi the storage could not make: 2.5Gi is still more than it has.
        let old = claim("3Gi");
        assert_eq!(claim_update_problems(&old, &claim("2560Mi")), []);
        assert_eq!(claim_update_problems(&old, &claim("4Gi")), []);
        let problems = claim_update_problems(&old, &claim("2Gi"));
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(problems[0].field, "spec.resources.requests.storage");
        assert_eq!(
            problems[0].message,
            "Forbidden: field can not be less than status.capacity"
        );
        // The volume mode is reported twice, as upstream reports it.
        let mut block = claim("3Gi");
        block["spec"]["volumeMode"] = json!("Block");
        let fields: Vec<_> = claim_update_problems(&old, &block)
            .into_iter()
            .map(|c| c.field)
            .collect();
        assert_eq!(fields, ["spec", "volumeMode"]);
        // A class filled in where there was none (the retroactive default class) is no change.
        let mut unnamed = json!({"metadata": {"name": "data"},
            "spec": {"accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}}},
            "status": {"phase": "Pending"}});
        let mut named = unnamed.clone();
        named["spec"]["storageClassName"] = json!("fast");
        assert_eq!(claim_update_problems(&unnamed, &named), []);
        unnamed["spec"]["volumeName"] = json!("pv-1");
        named["spec"]["volumeName"] = json!("pv-2");
        assert_eq!(
            claim_update_problems(&unnamed, &named).len(),
            1,
            "the volume is named once"
        );
    }

    #[test]
    fn uid_is_immutable_but_may_be_omitted() {
        let cm = rt("", "configmaps", "ConfigMap", false);
        let mut old = json!({"metadata": {"name": "a"}});
        prepare_create(&cm, &mut old).expect("valid");
        let mut omitted = json!({"metadata": {"name": "a"}, "data": {"k": "v"}});
        prepare_update(&cm, &old, &mut omitted, None).expect("uid filled in");
        assert_eq!(omitted["metadata"]["uid"], old["metadata"]["uid"]);
        let mut changed = json!({"metadata": {"name": "a", "uid": "other"}});
        let err = prepare_update(&cm, &old, &mut changed, None).expect_err("immutable");
        assert_eq!(err.code, 422);
        assert!(
            err.message
                .contains("metadata.uid: Invalid value: \"other\": field is immutable"),
            "{}",
            err.message
        );
    }

    #[test]
    fn service_updates_keep_allocations_and_secrets_merge_string_data() {
        let svc = rt("", "services", "Service", true);
        // As the write path's allocator would have left it.
        let mut old = json!({"metadata": {"name": "s"}, "spec": {"type": "NodePort",
            "clusterIP": "10.96.7.9", "clusterIPs": ["10.96.7.9"],
            "ports": [{"port": 80, "nodePort": 30123}]}});
        prepare_create(&svc, &mut old).expect("valid");
        let mut new = json!({"metadata": {"name": "s"}, "spec": {"type": "NodePort", "ports": [{"port": 80}]}});
        prepare_update(&svc, &old, &mut new, None).expect("allocations kept");
        assert_eq!(new["spec"]["clusterIP"], old["spec"]["clusterIP"]);
        assert_eq!(
            new["spec"]["ports"][0]["nodePort"],
            old["spec"]["ports"][0]["nodePort"]
        );
        let mut moved = new.clone();
        moved["spec"]["clusterIP"] = json!("10.96.9.9");
        assert_eq!(
            prepare_update(&svc, &old, &mut moved, None)
                .expect_err("immutable")
                .code,
            422
        );

        let secret = rt("", "secrets", "Secret", false);
        let mut s = json!({"metadata": {"name": "x"}, "stringData": {"a": "hi"}});
        prepare_create(&secret, &mut s).expect("valid");
        assert_eq!(s["data"]["a"], "aGk=");
        assert_eq!(s["type"], "Opaque");
        assert!(s.get("stringData").is_none());
    }

    #[test]
    fn no_new_finalizers_while_deleting() {
        let cm = rt("", "configmaps", "ConfigMap", false);
        let old = json!({"metadata": {"name": "a", "finalizers": ["x"], "deletionTimestamp": "2026-01-01T00:00:00Z"}});
        let mut new = old.clone();
        new["metadata"]["finalizers"] = json!(["x", "y"]);
        let err = prepare_update(&cm, &old, &mut new, None).expect_err("forbidden");
        assert!(
            err.message.contains("no new finalizers can be added"),
            "{}",
            err.message
        );
        let mut done = old.clone();
        done["metadata"]["finalizers"] = json!([]);
        prepare_update(&cm, &old, &mut done, None).expect("removal allowed");
        assert!(deletion_complete(&done));
    }

    #[test]
    fn pod_and_service_defaults() {
        let pod = rt("", "pods", "Pod", true);
        let mut p = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "nginx"}]}});
        prepare_create(&pod, &mut p).expect("valid");
        assert_eq!(p["spec"]["restartPolicy"], "Always");
        assert_eq!(p["spec"]["containers"][0]["imagePullPolicy"], "Always");
        assert_eq!(p["status"]["phase"], "Pending");
        let svc = rt("", "services", "Service", true);
        let mut s = json!({"metadata": {"name": "s"}, "spec": {"ports": [{"port": 80}]}});
        prepare_create(&svc, &mut s).expect("valid");
        assert_eq!(s["spec"]["ports"][0]["targetPort"], 80);
        assert_eq!(s["spec"]["type"], "ClusterIP");
        let mut bad = json!({"metadata": {"name": "1svc"}, "spec": {"ports": [{"port": 80}]}});
        assert_eq!(
            prepare_create(&svc, &mut bad).expect_err("dns-1035").code,
            422
        );
    }
}
