//! Discovery and OpenAPI documents: `/version`, `/api`, `/apis`, `/api/v1`, `/apis/<g>/<v>`
//! (legacy and aggregated `apidiscovery.k8s.io/v2`) and the synthesized `/openapi/v3` tree.
//!
//! Everything is generated from the [`Registry`], so a CRD that becomes established shows up in
//! every document at once, and the OpenAPI hashes change so kubectl's caches refresh.
//!
//! OpenAPI v3 is deliberately minimal for built-ins: every resource has PATCH operations tagged
//! with its group-version-kind and a `fieldValidation` parameter (what kubectl checks before it
//! hands validation to the server), and a permissive schema per kind. Custom resources carry
//! their CRD's structural schema, so `kubectl explain` works for them; for built-ins it only
//! prints the kind and version. PATCH operations do not advertise strategic merge patch in their
//! request body, so kubectl's client-side `apply` computes strategic merge patches from its
//! compiled-in types instead of from (absent) OpenAPI schemas.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Map, Value, json};

use crate::registry::{Origin, Registry, ResourceType};

/// The Content-Type of an aggregated discovery answer; kubectl recognises aggregated discovery
/// by this header alone and otherwise falls back to one request per group-version.
pub const AGGREGATED_CONTENT_TYPE: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

/// Kubernetes version of the simulated server: the kubectl dispatcher picks its binary by it.
pub const KUBERNETES_VERSION: &str = "v1.33.1";

/// The `/version` document (`version.Info`).
pub fn version() -> Value {
    json!({
        "major": "1",
        "minor": "33",
        "emulationMajor": "1",
        "emulationMinor": "33",
        "minCompatibilityMajor": "1",
        "minCompatibilityMinor": "32",
        "gitVersion": KUBERNETES_VERSION,
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2025-05-15T00:00:00Z",
        "goVersion": "go1.24.2",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

/// The legacy `/api` document (`APIVersions`).
pub fn legacy_api_versions() -> Value {
    json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []})
}

/// Orders versions as Kubernetes does: GA before beta before alpha, higher numbers first, then
/// anything else alphabetically.
pub fn compare_versions(a: &str, b: &str) -> std::cmp::Ordering {
    version_key(a).cmp(&version_key(b))
}

/// Sort key: (class, -major, -minor, name) with class 0 = GA, 1 = beta, 2 = alpha, 3 = other.
fn version_key(v: &str) -> (u8, i64, i64, String) {
    let parsed = v.strip_prefix('v').and_then(|rest| {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let major: i64 = rest[..digits].parse().ok()?;
        if major == 0 {
            return None;
        }
        let tail = &rest[digits..];
        if tail.is_empty() {
            return Some((0u8, major, 0i64));
        }
        for (class, word) in [(1u8, "beta"), (2u8, "alpha")] {
            if let Some(n) = tail.strip_prefix(word) {
                let minor: i64 = n.parse().ok()?;
                if minor == 0 || n.starts_with('0') {
                    return None;
                }
                return Some((class, major, minor));
            }
        }
        None
    });
    match parsed {
        Some((class, major, minor)) => (class, -major, -minor, String::new()),
        None => (3, 0, 0, v.to_owned()),
    }
}

/// Groups in discovery order (built-in groups in registry order, then CRD groups by name), each
/// with its versions most preferred first. The core group is not included.
fn groups(reg: &Registry) -> Vec<(String, Vec<String>)> {
    let mut builtin: Vec<String> = Vec::new();
    let mut custom: Vec<String> = Vec::new();
    for t in &reg.types {
        if t.group.is_empty() {
            continue;
        }
        let list = if t.origin == Origin::Builtin {
            &mut builtin
        } else {
            &mut custom
        };
        if !list.contains(&t.group) {
            list.push(t.group.clone());
        }
    }
    custom.retain(|g| !builtin.contains(g));
    custom.sort();
    builtin
        .into_iter()
        .chain(custom)
        .map(|g| (g.clone(), versions_of(reg, &g)))
        .collect()
}

fn versions_of(reg: &Registry, group: &str) -> Vec<String> {
    let mut versions: Vec<String> = Vec::new();
    for t in reg.group_types(group) {
        if !versions.contains(&t.version) {
            versions.push(t.version.clone());
        }
    }
    versions.sort_by(|a, b| compare_versions(a, b));
    versions
}

fn group_value(group: &str, versions: &[String]) -> Value {
    let gv = |v: &String| json!({"groupVersion": format!("{group}/{v}"), "version": v});
    json!({
        "name": group,
        "versions": versions.iter().map(gv).collect::<Vec<_>>(),
        "preferredVersion": versions.first().map(gv).unwrap_or(Value::Null),
    })
}

/// The legacy `/apis` document (`APIGroupList`).
pub fn api_group_list(reg: &Registry) -> Value {
    let groups: Vec<Value> = groups(reg)
        .iter()
        .map(|(g, vs)| group_value(g, vs))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// The legacy `/apis/<group>` document (`APIGroup`), or `None` for an unknown group.
pub fn api_group(reg: &Registry, group: &str) -> Option<Value> {
    if group.is_empty() {
        return None;
    }
    let versions = versions_of(reg, group);
    if versions.is_empty() {
        return None;
    }
    let mut v = group_value(group, &versions);
    if let Some(map) = v.as_object_mut() {
        map.insert("kind".into(), json!("APIGroup"));
        map.insert("apiVersion".into(), json!("v1"));
    }
    Some(v)
}

/// What a subresource answers with and which verbs it serves.
struct SubInfo {
    group: String,
    version: String,
    kind: String,
    verbs: &'static [&'static str],
}

fn sub_info(rt: &ResourceType, sub: &str) -> SubInfo {
    let own = |verbs| SubInfo {
        group: rt.group.clone(),
        version: rt.version.clone(),
        kind: rt.kind.clone(),
        verbs,
    };
    let other = |group: &str, version: &str, kind: &str, verbs| SubInfo {
        group: group.to_owned(),
        version: version.to_owned(),
        kind: kind.to_owned(),
        verbs,
    };
    match sub {
        "status" | "approval" => own(&["get", "patch", "update"]),
        "scale" => other("autoscaling", "v1", "Scale", &["get", "patch", "update"]),
        "binding" => other("", "v1", "Binding", &["create"]),
        "eviction" => other("policy", "v1", "Eviction", &["create"]),
        "exec" => other("", "v1", "PodExecOptions", &["create", "get"]),
        "attach" => other("", "v1", "PodAttachOptions", &["create", "get"]),
        "portforward" => other("", "v1", "PodPortForwardOptions", &["create", "get"]),
        "log" => own(&["get"]),
        "token" => other("authentication.k8s.io", "v1", "TokenRequest", &["create"]),
        "finalize" => own(&["update"]),
        _ => own(&["get"]),
    }
}

/// A stable per-type hash, like the real server's `storageVersionHash` (8 bytes of SHA-256 of
/// the storage group/version/kind, base64).
fn storage_version_hash(reg: &Registry, rt: &ResourceType) -> String {
    use base64::Engine as _;
    let storage_version = reg
        .storage_type(&rt.group, &rt.plural)
        .map_or_else(|| rt.version.clone(), |s| s.version.clone());
    let digest = ring::digest::digest(
        &ring::digest::SHA256,
        format!("{}/{}/{}", rt.group, storage_version, rt.kind).as_bytes(),
    );
    base64::engine::general_purpose::STANDARD.encode(&digest.as_ref()[..8])
}

fn types_in<'a>(reg: &'a Registry, group: &str, version: &str) -> Vec<&'a Arc<ResourceType>> {
    let mut types: Vec<&Arc<ResourceType>> = reg
        .types
        .iter()
        .filter(|t| t.group == group && t.version == version)
        .collect();
    types.sort_by(|a, b| a.plural.cmp(&b.plural));
    types
}

/// The legacy `/api/v1` or `/apis/<g>/<v>` document (`APIResourceList`), with one row per
/// resource and one per subresource (`pods/status`, `deployments/scale`, ...), sorted by name.
pub fn api_resource_list(reg: &Registry, group: &str, version: &str) -> Option<Value> {
    let types = types_in(reg, group, version);
    if types.is_empty() {
        return None;
    }
    let mut rows: Vec<(String, Value)> = Vec::new();
    for t in types {
        let mut row = json!({
            "name": t.plural,
            "singularName": t.singular,
            "namespaced": t.namespaced,
            "kind": t.kind,
            "verbs": t.verbs,
        });
        let map = row.as_object_mut().expect("invariant: json! object");
        if !t.short_names.is_empty() {
            map.insert("shortNames".into(), json!(t.short_names));
        }
        if !t.categories.is_empty() {
            map.insert("categories".into(), json!(t.categories));
        }
        if t.supports("list") {
            map.insert(
                "storageVersionHash".into(),
                json!(storage_version_hash(reg, t)),
            );
        }
        rows.push((t.plural.clone(), row));
        for sub in &t.subresources {
            let info = sub_info(t, sub);
            let mut row = Map::new();
            row.insert("name".into(), json!(format!("{}/{sub}", t.plural)));
            row.insert("singularName".into(), json!(""));
            row.insert("namespaced".into(), json!(t.namespaced));
            if info.group != t.group || info.version != t.version {
                row.insert("group".into(), json!(info.group));
                row.insert("version".into(), json!(info.version));
            }
            row.insert("kind".into(), json!(info.kind));
            row.insert("verbs".into(), json!(info.verbs));
            rows.push((format!("{}/{sub}", t.plural), Value::Object(row)));
        }
    }
    rows.sort_by(|a, b| a.0.cmp(&b.0));
    let group_version = if group.is_empty() {
        version.to_owned()
    } else {
        format!("{group}/{version}")
    };
    Some(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": rows.into_iter().map(|(_, r)| r).collect::<Vec<_>>(),
    }))
}

fn gvk(group: &str, version: &str, kind: &str) -> Value {
    json!({"group": group, "version": version, "kind": kind})
}

fn aggregated_version(reg: &Registry, group: &str, version: &str) -> Value {
    let resources: Vec<Value> = types_in(reg, group, version)
        .into_iter()
        .map(|t| {
            let mut r = json!({
                "resource": t.plural,
                "responseKind": gvk(&t.group, &t.version, &t.kind),
                "scope": if t.namespaced { "Namespaced" } else { "Cluster" },
                "singularResource": t.singular,
                "verbs": t.verbs,
            });
            let map = r.as_object_mut().expect("invariant: json! object");
            if !t.short_names.is_empty() {
                map.insert("shortNames".into(), json!(t.short_names));
            }
            if !t.categories.is_empty() {
                map.insert("categories".into(), json!(t.categories));
            }
            if !t.subresources.is_empty() {
                let mut subs: Vec<&String> = t.subresources.iter().collect();
                subs.sort();
                let subs: Vec<Value> = subs
                    .into_iter()
                    .map(|s| {
                        let info = sub_info(t, s);
                        json!({
                            "subresource": s,
                            "responseKind": gvk(&info.group, &info.version, &info.kind),
                            "verbs": info.verbs,
                        })
                    })
                    .collect();
                map.insert("subresources".into(), Value::Array(subs));
            }
            r
        })
        .collect();
    json!({"version": version, "resources": resources, "freshness": "Current"})
}

/// The aggregated discovery document (`apidiscovery.k8s.io/v2` `APIGroupDiscoveryList`): for
/// `/api` when `legacy` (the core group, whose name is empty), for `/apis` otherwise. Answer it
/// with [`AGGREGATED_CONTENT_TYPE`].
pub fn aggregated(reg: &Registry, legacy: bool) -> Value {
    let items: Vec<Value> = if legacy {
        vec![json!({"metadata": {}, "versions": [aggregated_version(reg, "", "v1")]})]
    } else {
        groups(reg)
            .into_iter()
            .map(|(g, versions)| {
                let versions: Vec<Value> = versions
                    .iter()
                    .map(|v| aggregated_version(reg, &g, v))
                    .collect();
                json!({"metadata": {"name": g}, "versions": versions})
            })
            .collect()
    };
    json!({
        "kind": "APIGroupDiscoveryList",
        "apiVersion": "apidiscovery.k8s.io/v2",
        "metadata": {},
        "items": items,
    })
}

// ---------------------------------------------------------------------------------------------
// OpenAPI v3.

/// Every group-version the server serves, as OpenAPI v3 names them: `api/v1`, `apis/<g>/<v>`.
fn openapi_group_versions(reg: &Registry) -> Vec<(String, String, String)> {
    let mut out: Vec<(String, String, String)> = Vec::new();
    if reg.types.iter().any(|t| t.group.is_empty()) {
        out.push(("api/v1".to_owned(), String::new(), "v1".to_owned()));
    }
    for (g, versions) in groups(reg) {
        for v in versions {
            out.push((format!("apis/{g}/{v}"), g.clone(), v));
        }
    }
    out
}

/// Every group-version's OpenAPI v3 document with its hash, keyed by `api/v1` /
/// `apis/<g>/<v>`; built once per [`Registry`] (see [`Registry::openapi_docs`]).
#[derive(Debug)]
pub struct OpenApiDocs {
    docs: BTreeMap<String, (Value, String)>,
    order: Vec<String>,
}

impl OpenApiDocs {
    pub(crate) fn build(reg: &Registry) -> OpenApiDocs {
        let mut docs = BTreeMap::new();
        let mut order = Vec::new();
        for (path, group, version) in openapi_group_versions(reg) {
            let doc = group_version_document(reg, &group, &version);
            let digest = ring::digest::digest(&ring::digest::SHA512, doc.to_string().as_bytes());
            let hash: String = digest.as_ref().iter().map(|b| format!("{b:02X}")).collect();
            order.push(path.clone());
            docs.insert(path, (doc, hash));
        }
        OpenApiDocs { docs, order }
    }
}

/// The `/openapi/v3` root: a map from each group-version path to its document's URL, whose
/// `hash` is a digest of that document, so kubectl refetches exactly the ones that changed.
pub fn openapi_v3_root(reg: &Registry) -> Value {
    let docs = reg.openapi_docs();
    let mut paths = Map::new();
    for path in &docs.order {
        if let Some((_, hash)) = docs.docs.get(path) {
            paths.insert(
                path.clone(),
                json!({"serverRelativeURL": format!("/openapi/v3/{path}?hash={hash}")}),
            );
        }
    }
    json!({"paths": paths})
}

/// The OpenAPI v3 document of one group-version, addressed as in the root (`api/v1`,
/// `apis/apps/v1`; a leading `/` and a query string are ignored), or `None` if not served.
pub fn openapi_v3_group_version(reg: &Registry, path: &str) -> Option<Value> {
    let path = path.split('?').next().unwrap_or(path);
    let path = path.trim_start_matches('/');
    let path = path.strip_prefix("openapi/v3/").unwrap_or(path);
    reg.openapi_docs()
        .docs
        .get(path)
        .map(|(doc, _)| doc.clone())
}

/// The OpenAPI schema name of a kind: `io.k8s.api.core.v1.Pod` for built-ins, the reversed
/// group for custom resources (`com.example.v1.Widget`), as the real server names them.
pub fn schema_name(rt: &ResourceType) -> String {
    if rt.origin == Origin::Builtin {
        return match rt.group.as_str() {
            "" => format!("io.k8s.api.core.{}.{}", rt.version, rt.kind),
            "apiextensions.k8s.io" => format!(
                "io.k8s.apiextensions-apiserver.pkg.apis.apiextensions.{}.{}",
                rt.version, rt.kind
            ),
            g => {
                let first = g.split('.').next().unwrap_or(g);
                format!("io.k8s.api.{first}.{}.{}", rt.version, rt.kind)
            }
        };
    }
    let reversed: Vec<&str> = rt.group.split('.').rev().collect();
    format!("{}.{}.{}", reversed.join("."), rt.version, rt.kind)
}

const OBJECT_META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta";

fn query_param(name: &str, description: &str) -> Value {
    json!({
        "name": name,
        "in": "query",
        "description": description,
        "schema": {"type": if name == "force" { "boolean" } else { "string" }, "uniqueItems": true},
    })
}

fn path_param(name: &str) -> Value {
    json!({"name": name, "in": "path", "required": true, "schema": {"type": "string", "uniqueItems": true}})
}

fn write_params(with_force: bool) -> Vec<Value> {
    let mut params = vec![
        query_param(
            "dryRun",
            "When present, indicates that modifications should not be persisted.",
        ),
        query_param(
            "fieldManager",
            "fieldManager is a name associated with the actor or entity that is making these changes.",
        ),
        query_param(
            "fieldValidation",
            "fieldValidation instructs the server on how to handle objects in the request containing unknown or duplicate fields. Valid values are: Ignore, Warn, Strict.",
        ),
    ];
    if with_force {
        params.push(query_param(
            "force",
            "Force is going to \"force\" Apply requests.",
        ));
    }
    params.push(query_param(
        "pretty",
        "If 'true', then the output is pretty printed.",
    ));
    params
}

fn operation(
    rt: &ResourceType,
    action: &str,
    id: &str,
    params: Vec<Value>,
    body: Option<Value>,
) -> Value {
    let schema_ref = json!({"$ref": format!("#/components/schemas/{}", schema_name(rt))});
    let mut op = json!({
        "tags": [format!("{}{}", rt.group, rt.version)],
        "operationId": id,
        "parameters": params,
        "responses": {
            "200": {"description": "OK", "content": {"application/json": {"schema": schema_ref}}},
            "401": {"description": "Unauthorized"},
        },
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": gvk(&rt.group, &rt.version, &rt.kind),
    });
    if let (Some(body), Some(map)) = (body, op.as_object_mut()) {
        map.insert("requestBody".into(), body);
    }
    op
}

fn group_version_document(reg: &Registry, group: &str, version: &str) -> Value {
    let base = if group.is_empty() {
        format!("/api/{version}")
    } else {
        format!("/apis/{group}/{version}")
    };
    let mut paths: BTreeMap<String, Value> = BTreeMap::new();
    let mut schemas = Map::new();
    schemas.insert(OBJECT_META.into(), object_meta_schema());
    for t in types_in(reg, group, version) {
        let id = format!("{}{}", t.kind, version);
        let ns_prefix = if t.namespaced {
            format!("{base}/namespaces/{{namespace}}")
        } else {
            base.clone()
        };
        let ns_params: Vec<Value> = if t.namespaced {
            vec![path_param("namespace")]
        } else {
            Vec::new()
        };
        let object_body = json!({"content": {"application/json": {
            "schema": {"$ref": format!("#/components/schemas/{}", schema_name(t))}}}, "required": true});
        let patch_body = json!({"content": {
            "application/apply-patch+yaml": {"schema": {"type": "object"}},
            "application/json-patch+json": {"schema": {"type": "object"}},
            "application/merge-patch+json": {"schema": {"type": "object"}},
        }, "required": true});

        let mut collection = Map::new();
        if t.supports("create") {
            let params = ns_params
                .iter()
                .cloned()
                .chain(write_params(false))
                .collect();
            collection.insert(
                "post".into(),
                operation(
                    t,
                    "post",
                    &format!("create{id}"),
                    params,
                    Some(object_body.clone()),
                ),
            );
        }
        if t.supports("list") {
            collection.insert(
                "get".into(),
                operation(t, "list", &format!("list{id}"), ns_params.clone(), None),
            );
        }
        if !collection.is_empty() {
            paths.insert(
                format!("{ns_prefix}/{}", t.plural),
                Value::Object(collection),
            );
        }

        let mut item = Map::new();
        let item_params = || ns_params.iter().cloned().chain([path_param("name")]);
        if t.supports("get") {
            item.insert(
                "get".into(),
                operation(
                    t,
                    "get",
                    &format!("read{id}"),
                    item_params().collect(),
                    None,
                ),
            );
        }
        if t.supports("update") {
            let params = item_params().chain(write_params(false)).collect();
            item.insert(
                "put".into(),
                operation(
                    t,
                    "put",
                    &format!("replace{id}"),
                    params,
                    Some(object_body.clone()),
                ),
            );
        }
        if t.supports("patch") {
            let params = item_params().chain(write_params(true)).collect();
            item.insert(
                "patch".into(),
                operation(
                    t,
                    "patch",
                    &format!("patch{id}"),
                    params,
                    Some(patch_body.clone()),
                ),
            );
        }
        if t.supports("delete") {
            item.insert(
                "delete".into(),
                operation(
                    t,
                    "delete",
                    &format!("delete{id}"),
                    item_params().collect(),
                    None,
                ),
            );
        }
        if !item.is_empty() {
            paths.insert(
                format!("{ns_prefix}/{}/{{name}}", t.plural),
                Value::Object(item),
            );
        }
        {
            if t.has_status() {
                let params: Vec<Value> = item_params().chain(write_params(true)).collect();
                let mut ops = Map::new();
                ops.insert(
                    "get".into(),
                    operation(
                        t,
                        "get",
                        &format!("read{id}Status"),
                        item_params().collect(),
                        None,
                    ),
                );
                ops.insert(
                    "put".into(),
                    operation(
                        t,
                        "put",
                        &format!("replace{id}Status"),
                        params.clone(),
                        Some(object_body.clone()),
                    ),
                );
                ops.insert(
                    "patch".into(),
                    operation(
                        t,
                        "patch",
                        &format!("patch{id}Status"),
                        params,
                        Some(patch_body.clone()),
                    ),
                );
                paths.insert(
                    format!("{ns_prefix}/{}/{{name}}/status", t.plural),
                    Value::Object(ops),
                );
            }
        }
        schemas.insert(schema_name(t), kind_schema(t));
    }
    json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": KUBERNETES_VERSION},
        "paths": paths,
        "components": {"schemas": schemas},
    })
}

fn object_meta_schema() -> Value {
    json!({
        "description": "ObjectMeta is metadata that all persisted resources must have, which includes all objects users must create.",
        "type": "object",
        "properties": {
            "name": {"description": "Name must be unique within a namespace.", "type": "string"},
            "generateName": {"description": "An optional prefix used by the server to generate a unique name.", "type": "string"},
            "namespace": {"description": "Namespace defines the space within which each name must be unique.", "type": "string"},
            "labels": {"description": "Map of string keys and values that can be used to organize and categorize objects.", "type": "object", "additionalProperties": {"type": "string", "default": ""}},
            "annotations": {"description": "Annotations is an unstructured key value map stored with a resource.", "type": "object", "additionalProperties": {"type": "string", "default": ""}},
            "finalizers": {"description": "Must be empty before the object is deleted from the registry.", "type": "array", "items": {"type": "string", "default": ""}},
            "ownerReferences": {"description": "List of objects depended by this object.", "type": "array", "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
            "uid": {"description": "UID is the unique in time and space value for this object.", "type": "string"},
            "resourceVersion": {"description": "An opaque value that represents the internal version of this object.", "type": "string"},
            "generation": {"description": "A sequence number representing a specific generation of the desired state.", "type": "integer", "format": "int64"},
            "creationTimestamp": {"description": "CreationTimestamp is a timestamp representing the server time when this object was created.", "type": "string", "format": "date-time"},
            "deletionTimestamp": {"description": "DeletionTimestamp is RFC 3339 date and time at which this resource will be deleted.", "type": "string", "format": "date-time"},
            "deletionGracePeriodSeconds": {"description": "Number of seconds allowed for this object to gracefully terminate.", "type": "integer", "format": "int64"},
            "managedFields": {"description": "ManagedFields maps workflow-id and version to the set of fields that are managed by that workflow.", "type": "array", "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
        },
    })
}

/// A CRD's structural schema with the standard `apiVersion`, `kind` and `metadata` fields, or a
/// permissive object for built-ins (simkube does not carry their full schemas).
fn kind_schema(rt: &ResourceType) -> Value {
    let mut schema = match (&rt.origin, &rt.schema) {
        (Origin::Crd { .. }, Some(s)) => s.clone(),
        (Origin::Crd { .. }, None) => {
            json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true})
        }
        (Origin::Builtin, _) => json!({
            "description": format!("{} ({}). simkube serves no field schema for built-in kinds.", rt.kind, rt.api_version()),
            "type": "object",
            "x-kubernetes-preserve-unknown-fields": true,
        }),
    };
    let Some(map) = schema.as_object_mut() else {
        return schema;
    };
    let props = map.entry("properties").or_insert_with(|| json!({}));
    if let Some(props) = props.as_object_mut() {
        props.insert("apiVersion".into(), json!({
            "description": "APIVersion defines the versioned schema of this representation of an object.",
            "type": "string",
        }));
        props.insert("kind".into(), json!({
            "description": "Kind is a string value representing the REST resource this object represents.",
            "type": "string",
        }));
        props.insert(
            "metadata".into(),
            json!({
                "description": "Standard object's metadata.",
                "allOf": [{"$ref": format!("#/components/schemas/{OBJECT_META}")}],
                "default": {},
            }),
        );
    }
    map.insert(
        "x-kubernetes-group-version-kind".into(),
        json!([gvk(&rt.group, &rt.version, &rt.kind)]),
    );
    schema
}

#[cfg(test)]
mod tests {
    use expect_test::expect;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;
    use kube::core::discovery::v2::APIGroupDiscoveryList;

    use super::*;

    fn widget_crd(versions: &[(&str, bool, bool)]) -> Value {
        let versions: Vec<Value> = versions
            .iter()
            .map(|(name, served, storage)| {
                json!({
                    "name": name, "served": served, "storage": storage,
                    "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                        "spec": {"type": "object", "properties": {"size": {"type": "integer"}}}}}},
                    "subresources": {"status": {}},
                })
            })
            .collect();
        json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": "widgets.example.com"},
            "spec": {
                "group": "example.com",
                "scope": "Namespaced",
                "names": {"plural": "widgets", "kind": "Widget", "shortNames": ["wd"], "categories": ["all"]},
                "versions": versions,
            },
        })
    }

    fn with_widgets(versions: &[(&str, bool, bool)]) -> Registry {
        let types = crate::crd::types_from_crd(&widget_crd(versions)).expect("valid CRD");
        Registry::with_builtins().with_crd_types("widgets.example.com", types)
    }

    #[test]
    fn version_parses_as_version_info() {
        let info: k8s_openapi::apimachinery::pkg::version::Info =
            serde_json::from_value(version()).expect("Info");
        assert_eq!((info.major.as_str(), info.minor.as_str()), ("1", "33"));
        assert!(info.git_version.starts_with("v1.33."));
        assert_eq!(info.platform, "linux/amd64");
    }

    #[test]
    fn legacy_documents_parse_into_k8s_openapi_types() {
        let reg = Registry::with_builtins();
        let versions: meta::APIVersions =
            serde_json::from_value(legacy_api_versions()).expect("APIVersions");
        assert_eq!(versions.versions, ["v1"]);
        let groups: meta::APIGroupList =
            serde_json::from_value(api_group_list(&reg)).expect("APIGroupList");
        let names: Vec<&str> = groups.groups.iter().map(|g| g.name.as_str()).collect();
        expect!["apiextensions.k8s.io apps admissionregistration.k8s.io batch networking.k8s.io policy scheduling.k8s.io storage.k8s.io authentication.k8s.io authorization.k8s.io certificates.k8s.io coordination.k8s.io discovery.k8s.io events.k8s.io rbac.authorization.k8s.io"]
        .assert_eq(&names.join(" "));
        let apps: meta::APIGroup =
            serde_json::from_value(api_group(&reg, "apps").expect("apps")).expect("APIGroup");
        assert_eq!(
            apps.preferred_version.map(|p| p.group_version),
            Some("apps/v1".to_owned())
        );
        assert!(api_group(&reg, "nope.example.com").is_none());
        assert!(api_resource_list(&reg, "apps", "v2").is_none());
    }

    /// One line per discovery row: name, scope, kind (with group/version if foreign), verbs,
    /// short names and categories.
    fn summarize(list: &meta::APIResourceList) -> String {
        list.resources
            .iter()
            .map(|r| {
                let foreign = match (&r.group, &r.version) {
                    (Some(g), Some(v)) => format!(" ({g}/{v})"),
                    _ => String::new(),
                };
                format!(
                    "{} ns={} {}{foreign} [{}] short={:?} cat={:?}",
                    r.name,
                    r.namespaced,
                    r.kind,
                    r.verbs.join(","),
                    r.short_names.clone().unwrap_or_default(),
                    r.categories.clone().unwrap_or_default(),
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    #[test]
    fn core_v1_resource_list_matches_the_real_server() {
        let reg = Registry::with_builtins();
        let list: meta::APIResourceList =
            serde_json::from_value(api_resource_list(&reg, "", "v1").expect("core"))
                .expect("APIResourceList");
        assert_eq!(list.group_version, "v1");
        expect![[r#"
            configmaps ns=true ConfigMap [create,delete,deletecollection,get,list,patch,update,watch] short=["cm"] cat=[]
            endpoints ns=true Endpoints [create,delete,deletecollection,get,list,patch,update,watch] short=["ep"] cat=[]
            events ns=true Event [create,delete,deletecollection,get,list,patch,update,watch] short=["ev"] cat=[]
            limitranges ns=true LimitRange [create,delete,deletecollection,get,list,patch,update,watch] short=["limits"] cat=[]
            namespaces ns=false Namespace [create,delete,get,list,patch,update,watch] short=["ns"] cat=[]
            namespaces/finalize ns=false Namespace [update] short=[] cat=[]
            namespaces/status ns=false Namespace [get,patch,update] short=[] cat=[]
            nodes ns=false Node [create,delete,deletecollection,get,list,patch,update,watch] short=["no"] cat=[]
            nodes/status ns=false Node [get,patch,update] short=[] cat=[]
            persistentvolumeclaims ns=true PersistentVolumeClaim [create,delete,deletecollection,get,list,patch,update,watch] short=["pvc"] cat=[]
            persistentvolumeclaims/status ns=true PersistentVolumeClaim [get,patch,update] short=[] cat=[]
            persistentvolumes ns=false PersistentVolume [create,delete,deletecollection,get,list,patch,update,watch] short=["pv"] cat=[]
            persistentvolumes/status ns=false PersistentVolume [get,patch,update] short=[] cat=[]
            pods ns=true Pod [create,delete,deletecollection,get,list,patch,update,watch] short=["po"] cat=["all"]
            pods/attach ns=true PodAttachOptions [create,get] short=[] cat=[]
            pods/binding ns=true Binding [create] short=[] cat=[]
            pods/eviction ns=true Eviction (policy/v1) [create] short=[] cat=[]
            pods/exec ns=true PodExecOptions [create,get] short=[] cat=[]
            pods/log ns=true Pod [get] short=[] cat=[]
            pods/portforward ns=true PodPortForwardOptions [create,get] short=[] cat=[]
            pods/status ns=true Pod [get,patch,update] short=[] cat=[]
            resourcequotas ns=true ResourceQuota [create,delete,deletecollection,get,list,patch,update,watch] short=["quota"] cat=[]
            resourcequotas/status ns=true ResourceQuota [get,patch,update] short=[] cat=[]
            secrets ns=true Secret [create,delete,deletecollection,get,list,patch,update,watch] short=[] cat=[]
            serviceaccounts ns=true ServiceAccount [create,delete,deletecollection,get,list,patch,update,watch] short=["sa"] cat=[]
            serviceaccounts/token ns=true TokenRequest (authentication.k8s.io/v1) [create] short=[] cat=[]
            services ns=true Service [create,delete,deletecollection,get,list,patch,update,watch] short=["svc"] cat=["all"]
            services/status ns=true Service [get,patch,update] short=[] cat=[]"#]]
        .assert_eq(&summarize(&list));
    }

    #[test]
    fn group_resource_lists_carry_subresources_and_create_only_reviews() {
        let reg = Registry::with_builtins();
        let apps: meta::APIResourceList =
            serde_json::from_value(api_resource_list(&reg, "apps", "v1").expect("apps"))
                .expect("APIResourceList");
        expect![[r#"
            daemonsets ns=true DaemonSet [create,delete,deletecollection,get,list,patch,update,watch] short=["ds"] cat=["all"]
            daemonsets/status ns=true DaemonSet [get,patch,update] short=[] cat=[]
            deployments ns=true Deployment [create,delete,deletecollection,get,list,patch,update,watch] short=["deploy"] cat=["all"]
            deployments/scale ns=true Scale (autoscaling/v1) [get,patch,update] short=[] cat=[]
            deployments/status ns=true Deployment [get,patch,update] short=[] cat=[]
            replicasets ns=true ReplicaSet [create,delete,deletecollection,get,list,patch,update,watch] short=["rs"] cat=["all"]
            replicasets/scale ns=true Scale (autoscaling/v1) [get,patch,update] short=[] cat=[]
            replicasets/status ns=true ReplicaSet [get,patch,update] short=[] cat=[]
            statefulsets ns=true StatefulSet [create,delete,deletecollection,get,list,patch,update,watch] short=["sts"] cat=["all"]
            statefulsets/scale ns=true Scale (autoscaling/v1) [get,patch,update] short=[] cat=[]
            statefulsets/status ns=true StatefulSet [get,patch,update] short=[] cat=[]"#]]
        .assert_eq(&summarize(&apps));
        let authz: meta::APIResourceList = serde_json::from_value(
            api_resource_list(&reg, "authorization.k8s.io", "v1").expect("authz"),
        )
        .expect("APIResourceList");
        expect![[r#"
            localsubjectaccessreviews ns=true LocalSubjectAccessReview [create] short=[] cat=[]
            selfsubjectaccessreviews ns=false SelfSubjectAccessReview [create] short=[] cat=[]
            selfsubjectrulesreviews ns=false SelfSubjectRulesReview [create] short=[] cat=[]
            subjectaccessreviews ns=false SubjectAccessReview [create] short=[] cat=[]"#]]
        .assert_eq(&summarize(&authz));
        let csr = api_resource_list(&reg, "certificates.k8s.io", "v1").expect("csr");
        let names: Vec<&str> = csr["resources"]
            .as_array()
            .expect("resources")
            .iter()
            .filter_map(|r| r["name"].as_str())
            .collect();
        assert_eq!(
            names,
            [
                "certificatesigningrequests",
                "certificatesigningrequests/approval",
                "certificatesigningrequests/status"
            ]
        );
    }

    #[test]
    fn aggregated_discovery_parses_into_kube_types() {
        let reg = with_widgets(&[("v1", true, true)]);
        let core: APIGroupDiscoveryList =
            serde_json::from_value(aggregated(&reg, true)).expect("core list");
        assert_eq!(core.items.len(), 1);
        let pods = core.items[0].versions[0]
            .resources
            .iter()
            .find(|r| r.resource.as_deref() == Some("pods"))
            .expect("pods");
        let subs: Vec<&str> = pods
            .subresources
            .iter()
            .filter_map(|s| s.subresource.as_deref())
            .collect();
        assert_eq!(
            subs,
            [
                "attach",
                "binding",
                "eviction",
                "exec",
                "log",
                "portforward",
                "status"
            ]
        );
        assert_eq!(pods.scope.as_deref(), Some("Namespaced"));

        let groups: APIGroupDiscoveryList =
            serde_json::from_value(aggregated(&reg, false)).expect("groups list");
        let example = groups
            .items
            .iter()
            .find(|g| g.metadata.as_ref().and_then(|m| m.name.as_deref()) == Some("example.com"))
            .expect("CRD group listed");
        let widgets = &example.versions[0].resources[0];
        assert_eq!(widgets.resource.as_deref(), Some("widgets"));
        assert_eq!(widgets.short_names, ["wd"]);
        assert_eq!(
            widgets.verbs,
            [
                "delete",
                "deletecollection",
                "get",
                "list",
                "patch",
                "create",
                "update",
                "watch"
            ]
        );
        assert_eq!(
            groups
                .items
                .last()
                .and_then(|g| g.metadata.clone())
                .and_then(|m| m.name),
            Some("example.com".into())
        );
    }

    #[test]
    fn versions_sort_by_kubernetes_priority() {
        let mut v = vec![
            "v1alpha1",
            "v2beta1",
            "foo",
            "v1",
            "v1beta2",
            "v1beta1",
            "v10",
            "v2",
            "v11alpha2",
            "bar",
        ];
        v.sort_by(|a, b| compare_versions(a, b));
        expect!["v10 v2 v1 v2beta1 v1beta2 v1beta1 v11alpha2 v1alpha1 bar foo"]
            .assert_eq(&v.join(" "));
    }

    #[test]
    fn crd_versions_appear_in_preference_order_with_the_preferred_first() {
        let reg = with_widgets(&[
            ("v1alpha1", true, false),
            ("v1beta1", true, false),
            ("v1", true, true),
            ("v2alpha1", false, false),
        ]);
        let group: meta::APIGroup =
            serde_json::from_value(api_group(&reg, "example.com").expect("group"))
                .expect("APIGroup");
        let versions: Vec<&str> = group.versions.iter().map(|v| v.version.as_str()).collect();
        assert_eq!(
            versions,
            ["v1", "v1beta1", "v1alpha1"],
            "unserved v2alpha1 must not appear"
        );
        assert_eq!(
            group.preferred_version.map(|p| p.version),
            Some("v1".to_owned())
        );
        let agg = aggregated(&reg, false);
        let item = agg["items"]
            .as_array()
            .expect("items")
            .iter()
            .find(|i| i["metadata"]["name"] == "example.com")
            .expect("group");
        let agg_versions: Vec<&str> = item["versions"]
            .as_array()
            .expect("versions")
            .iter()
            .filter_map(|v| v["version"].as_str())
            .collect();
        assert_eq!(agg_versions, ["v1", "v1beta1", "v1alpha1"]);
    }

    #[test]
    fn openapi_v3_lets_kubectl_find_field_validation_for_every_patchable_kind() {
        let reg = with_widgets(&[("v1", true, true)]);
        let root = openapi_v3_root(&reg);
        let paths = root["paths"].as_object().expect("paths");
        assert!(paths.contains_key("api/v1"));
        assert!(paths.contains_key("apis/apps/v1"));
        assert!(paths.contains_key("apis/example.com/v1"));
        for (gv_path, entry) in paths {
            let url = entry["serverRelativeURL"].as_str().expect("url");
            assert!(
                url.starts_with(&format!("/openapi/v3/{gv_path}?hash=")),
                "{url}"
            );
            let doc = openapi_v3_group_version(&reg, url).expect("document served");
            let (group, version) = match gv_path.split('/').collect::<Vec<_>>().as_slice() {
                ["api", v] => (String::new(), (*v).to_owned()),
                ["apis", g, v] => ((*g).to_owned(), (*v).to_owned()),
                other => panic!("unexpected path {other:?}"),
            };
            for t in types_in(&reg, &group, &version)
                .into_iter()
                .filter(|t| t.supports("patch"))
            {
                let found = doc["paths"]
                    .as_object()
                    .expect("paths")
                    .values()
                    .any(|item| {
                        let op = &item["patch"];
                        op["x-kubernetes-group-version-kind"] == gvk(&t.group, &t.version, &t.kind)
                            && op["parameters"].as_array().is_some_and(|ps| {
                                ps.iter()
                                    .any(|p| p["name"] == "fieldValidation" && p["in"] == "query")
                            })
                    });
                assert!(
                    found,
                    "no PATCH with fieldValidation for {}/{}",
                    gv_path, t.kind
                );
                let schema = &doc["components"]["schemas"][schema_name(t)];
                assert_eq!(
                    schema["x-kubernetes-group-version-kind"][0]["kind"],
                    json!(t.kind)
                );
                // kubectl must not try to build strategic merge patches from these schemas.
                assert!(
                    doc["paths"]
                        .as_object()
                        .expect("paths")
                        .values()
                        .all(|item| item["patch"]["requestBody"]["content"]
                            .get("application/strategic-merge-patch+json")
                            .is_none())
                );
            }
        }
        let widget = openapi_v3_group_version(&reg, "apis/example.com/v1").expect("doc");
        let schema = &widget["components"]["schemas"]["com.example.v1.Widget"];
        assert_eq!(
            schema["properties"]["spec"]["properties"]["size"]["type"],
            "integer"
        );
        assert!(
            widget["paths"]
                .get("/apis/example.com/v1/namespaces/{namespace}/widgets/{name}/status")
                .is_some()
        );
        assert!(openapi_v3_group_version(&reg, "apis/example.com/v9").is_none());
        assert!(openapi_v3_group_version(&reg, "garbage").is_none());
    }

    #[test]
    fn openapi_hashes_change_only_for_the_changed_group_version() {
        let before = openapi_v3_root(&with_widgets(&[("v1", true, true)]));
        let after = openapi_v3_root(&with_widgets(&[
            ("v1", true, true),
            ("v1beta1", true, false),
        ]));
        assert_eq!(before["paths"]["api/v1"], after["paths"]["api/v1"]);
        assert_eq!(
            before["paths"]["apis/example.com/v1"],
            after["paths"]["apis/example.com/v1"]
        );
        assert!(after["paths"].get("apis/example.com/v1beta1").is_some());
        assert!(before["paths"].get("apis/example.com/v1beta1").is_none());

        let mut changed = widget_crd(&[("v1", true, true)]);
        changed["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
            ["color"] = json!({"type": "string"});
        let types = crate::crd::types_from_crd(&changed).expect("valid CRD");
        let reg = Registry::with_builtins().with_crd_types("widgets.example.com", types);
        let changed = openapi_v3_root(&reg);
        assert_ne!(
            before["paths"]["apis/example.com/v1"],
            changed["paths"]["apis/example.com/v1"]
        );
    }

    #[test]
    fn storage_version_hash_is_stable_and_names_the_storage_version() {
        let reg = with_widgets(&[("v1", true, true), ("v1beta1", true, false)]);
        let v1 = api_resource_list(&reg, "example.com", "v1").expect("v1");
        let beta = api_resource_list(&reg, "example.com", "v1beta1").expect("v1beta1");
        assert_eq!(
            v1["resources"][0]["storageVersionHash"],
            beta["resources"][0]["storageVersionHash"]
        );
        assert_eq!(
            v1["resources"][0]["storageVersionHash"]
                .as_str()
                .map(str::len),
            Some(12)
        );
    }
}
