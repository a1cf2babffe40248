//! The resource registry: every resource type the server serves, built-in or from a CRD.

use std::sync::Arc;

use serde_json::Value;

/// Group, version and plural resource name: the key a URL resolves to.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Gvr {
    /// API group; empty for the core (legacy) group.
    pub group: String,
    /// API version, e.g. `v1`.
    pub version: String,
    /// Plural resource name, e.g. `pods`.
    pub resource: String,
}

impl Gvr {
    /// Builds a key from borrowed parts.
    pub fn new(group: &str, version: &str, resource: &str) -> Self {
        Self {
            group: group.to_owned(),
            version: version.to_owned(),
            resource: resource.to_owned(),
        }
    }

    /// `apiVersion` as written in objects: `v1` or `group/version`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }
}

/// An additional printer column (the CRD `additionalPrinterColumns` shape; built-ins use it too).
#[derive(Debug, Clone, PartialEq)]
pub struct PrinterColumn {
    /// Column header as kubectl shows it (upper-cased by kubectl).
    pub name: String,
    /// OpenAPI type: `string`, `integer`, `number`, `boolean`, `date`.
    pub type_: String,
    /// Optional OpenAPI format.
    pub format: String,
    /// Column description for the Table's columnDefinitions.
    pub description: String,
    /// 0 for the default view, >0 for `-o wide`.
    pub priority: i32,
    /// A simple JSONPath into the object, e.g. `.status.phase`.
    pub json_path: String,
}

/// Where a resource type comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum Origin {
    /// Compiled into the server.
    Builtin,
    /// Served because the named CRD exists and is established.
    Crd {
        /// `metadata.name` of the CRD, `<plural>.<group>`.
        name: String,
    },
}

/// Everything the server needs to know to serve one resource at one version.
#[derive(Debug, Clone, PartialEq)]
pub struct ResourceType {
    /// API group; empty for core.
    pub group: String,
    /// API version.
    pub version: String,
    /// Kind, e.g. `Pod`.
    pub kind: String,
    /// Plural resource name, e.g. `pods`.
    pub plural: String,
    /// Singular name, e.g. `pod`.
    pub singular: String,
    /// `kind` of the list, e.g. `PodList`.
    pub list_kind: String,
    /// Whether objects live in a namespace.
    pub namespaced: bool,
    /// Short names for kubectl, e.g. `po`.
    pub short_names: Vec<String>,
    /// Categories for kubectl, e.g. `all`.
    pub categories: Vec<String>,
    /// Verbs served, as discovery lists them.
    pub verbs: Vec<String>,
    /// Subresources served: `status`, `binding`, `eviction`, `log`, `exec`, `token`, `approval`, ...
    pub subresources: Vec<String>,
    /// Columns for Table output after NAME (AGE is added by the printer where the real server adds it).
    pub printer_columns: Vec<PrinterColumn>,
    /// Fields usable in field selectors besides `metadata.name` and `metadata.namespace`.
    pub selectable_fields: Vec<String>,
    /// For CRDs: the structural `openAPIV3Schema` of this version, used to prune, default and validate.
    pub schema: Option<Value>,
    /// Whether this version is the storage version (CRDs with several versions).
    pub storage: bool,
    /// Built-in or from a CRD.
    pub origin: Origin,
}

impl ResourceType {
    /// The URL key of this type.
    pub fn gvr(&self) -> Gvr {
        Gvr::new(&self.group, &self.version, &self.plural)
    }

    /// `apiVersion` as written in objects.
    pub fn api_version(&self) -> String {
        self.gvr().api_version()
    }

    /// Whether `/status` is a subresource, so the main resource ignores `.status` and vice versa.
    pub fn has_status(&self) -> bool {
        self.subresources.iter().any(|s| s == "status")
    }
}

/// The set of served types. Cheap to clone; replaced whole when a CRD comes or goes, and its
/// `generation` feeds discovery and OpenAPI hashes so clients notice.
#[derive(Debug, Clone, Default)]
pub struct Registry {
    /// Served types, built-ins first, in discovery order.
    pub types: Vec<Arc<ResourceType>>,
    /// Bumped on every change.
    pub generation: u64,
    /// The OpenAPI v3 documents of this exact set of types, built on first use; a registry is
    /// replaced, never changed, so the cache never goes stale.
    openapi: std::sync::OnceLock<Arc<crate::discovery::OpenApiDocs>>,
}

impl Registry {
    /// The type served at this URL key, if any.
    pub fn lookup(&self, group: &str, version: &str, plural: &str) -> Option<Arc<ResourceType>> {
        self.types
            .iter()
            .find(|t| t.group == group && t.version == version && t.plural == plural)
            .cloned()
    }

    /// The type with this apiVersion and kind, if any.
    pub fn by_kind(&self, api_version: &str, kind: &str) -> Option<Arc<ResourceType>> {
        self.types
            .iter()
            .find(|t| t.kind == kind && t.api_version() == api_version)
            .cloned()
    }
}

/// Verbs of an ordinary read-write collection, as discovery lists them (alphabetical).
const FULL_VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

/// Namespaces have no `deletecollection` in the real server.
const NO_DELETECOLLECTION_VERBS: &[&str] = &[
    "create", "delete", "get", "list", "patch", "update", "watch",
];

/// A built-in type from k8s-openapi's compile-time constants, so group, version, kind and plural
/// can never drift from what kube-rs sends.
fn builtin<K>() -> ResourceType
where
    K: k8s_openapi::ListableResource + 'static,
{
    let mut rt = builtin_unlisted::<K>();
    rt.list_kind = K::LIST_KIND.to_owned();
    rt
}

/// Like [`builtin`] for kinds that have no list (review objects).
fn builtin_unlisted<K>() -> ResourceType
where
    K: k8s_openapi::Resource + 'static,
{
    let namespaced = std::any::TypeId::of::<K::Scope>()
        == std::any::TypeId::of::<k8s_openapi::NamespaceResourceScope>();
    ResourceType {
        group: K::GROUP.to_owned(),
        version: K::VERSION.to_owned(),
        kind: K::KIND.to_owned(),
        plural: K::URL_PATH_SEGMENT.to_owned(),
        singular: K::KIND.to_ascii_lowercase(),
        list_kind: format!("{}List", K::KIND),
        namespaced,
        short_names: Vec::new(),
        categories: Vec::new(),
        verbs: strings(FULL_VERBS),
        subresources: Vec::new(),
        printer_columns: crate::table::builtin_columns(K::GROUP, K::KIND),
        selectable_fields: Vec::new(),
        schema: None,
        storage: true,
        origin: Origin::Builtin,
    }
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

impl ResourceType {
    fn short(mut self, names: &[&str]) -> Self {
        self.short_names = strings(names);
        self
    }

    fn categories(mut self, names: &[&str]) -> Self {
        self.categories = strings(names);
        self
    }

    fn subs(mut self, names: &[&str]) -> Self {
        self.subresources = strings(names);
        self
    }

    fn fields(mut self, names: &[&str]) -> Self {
        self.selectable_fields = strings(names);
        self
    }

    fn verbs(mut self, names: &[&str]) -> Self {
        self.verbs = strings(names);
        self
    }

    /// Whether `verb` (`get`, `list`, `watch`, `create`, `update`, `patch`, `delete`,
    /// `deletecollection`) is served on the main resource.
    pub fn supports(&self, verb: &str) -> bool {
        self.verbs.iter().any(|v| v == verb)
    }
}

/// The field labels of core/v1 Events (the real server also accepts them on events.k8s.io/v1,
/// where they name the same stored fields). `source` selects `source.component`.
const EVENT_FIELDS: &[&str] = &[
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
];

/// Every built-in type the server serves, in the order discovery lists them.
///
/// Verbs, short names, categories, subresources and field labels are those of a real 1.33
/// kube-apiserver for the same resources.
pub fn builtins() -> Vec<ResourceType> {
    use k8s_openapi::api::{
        admissionregistration::v1 as admission, apps::v1 as apps, authorization::v1 as authz,
        batch::v1 as batch, certificates::v1 as certs, coordination::v1 as coord, core::v1 as core,
        discovery::v1 as disc, events::v1 as events, networking::v1 as net, policy::v1 as policy,
        rbac::v1 as rbac, scheduling::v1 as sched, storage::v1 as storage,
    };
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1 as apiext;

    vec![
        // core/v1, in the order the real /api/v1 lists them.
        builtin::<core::ConfigMap>().short(&["cm"]),
        builtin::<core::Endpoints>().short(&["ep"]),
        builtin::<core::Event>().short(&["ev"]).fields(EVENT_FIELDS),
        builtin::<core::Namespace>()
            .short(&["ns"])
            .verbs(NO_DELETECOLLECTION_VERBS)
            .subs(&["finalize", "status"])
            .fields(&["status.phase"]),
        builtin::<core::Node>()
            .short(&["no"])
            .subs(&["status"])
            .fields(&["spec.unschedulable"]),
        builtin::<core::Pod>()
            .short(&["po"])
            .categories(&["all"])
            .subs(&[
                "attach",
                "binding",
                "eviction",
                "exec",
                "log",
                "portforward",
                "status",
            ])
            .fields(&[
                "spec.nodeName",
                "spec.restartPolicy",
                "spec.schedulerName",
                "spec.serviceAccountName",
                "spec.hostNetwork",
                "status.phase",
                "status.podIP",
                "status.podIPs",
                "status.nominatedNodeName",
            ]),
        builtin::<core::LimitRange>().short(&["limits"]),
        builtin::<core::PersistentVolumeClaim>()
            .short(&["pvc"])
            .subs(&["status"]),
        builtin::<core::PersistentVolume>()
            .short(&["pv"])
            .subs(&["status"]),
        builtin::<core::ResourceQuota>()
            .short(&["quota"])
            .subs(&["status"]),
        builtin::<core::Secret>().fields(&["type"]),
        builtin::<core::ServiceAccount>()
            .short(&["sa"])
            .subs(&["token"]),
        builtin::<core::Service>()
            .short(&["svc"])
            .categories(&["all"])
            .subs(&["status"]),
        // apiextensions.k8s.io/v1
        builtin::<apiext::CustomResourceDefinition>()
            .short(&["crd", "crds"])
            .categories(&["api-extensions"])
            .subs(&["status"]),
        // apps/v1
        builtin::<apps::Deployment>()
            .short(&["deploy"])
            .categories(&["all"])
            .subs(&["scale", "status"]),
        builtin::<apps::DaemonSet>()
            .short(&["ds"])
            .categories(&["all"])
            .subs(&["status"]),
        builtin::<apps::ReplicaSet>()
            .short(&["rs"])
            .categories(&["all"])
            .subs(&["scale", "status"])
            .fields(&["status.replicas"]),
        builtin::<apps::StatefulSet>()
            .short(&["sts"])
            .categories(&["all"])
            .subs(&["scale", "status"]),
        // admissionregistration.k8s.io/v1: the webhooks admission/webhooks.rs calls.
        builtin::<admission::MutatingWebhookConfiguration>(),
        builtin::<admission::ValidatingWebhookConfiguration>(),
        // batch/v1
        builtin::<batch::CronJob>()
            .short(&["cj"])
            .categories(&["all"])
            .subs(&["status"]),
        builtin::<batch::Job>()
            .categories(&["all"])
            .subs(&["status"])
            .fields(&["status.successful"]),
        // networking.k8s.io/v1
        builtin::<net::Ingress>().short(&["ing"]).subs(&["status"]),
        builtin::<net::NetworkPolicy>().short(&["netpol"]),
        // policy/v1
        builtin::<policy::PodDisruptionBudget>()
            .short(&["pdb"])
            .subs(&["status"]),
        // scheduling.k8s.io/v1
        builtin::<sched::PriorityClass>().short(&["pc"]),
        // storage.k8s.io/v1
        builtin::<storage::StorageClass>().short(&["sc"]),
        // authorization.k8s.io/v1: a virtual resource, create only.
        // authentication.k8s.io/v1: `kubectl auth whoami`.
        builtin_unlisted::<k8s_openapi::api::authentication::v1::SelfSubjectReview>()
            .verbs(&["create"]),
        builtin_unlisted::<k8s_openapi::api::authentication::v1::TokenReview>().verbs(&["create"]),
        builtin_unlisted::<authz::LocalSubjectAccessReview>().verbs(&["create"]),
        builtin_unlisted::<authz::SelfSubjectAccessReview>().verbs(&["create"]),
        builtin_unlisted::<authz::SelfSubjectRulesReview>().verbs(&["create"]),
        builtin_unlisted::<authz::SubjectAccessReview>().verbs(&["create"]),
        // certificates.k8s.io/v1
        builtin::<certs::CertificateSigningRequest>()
            .short(&["csr"])
            .subs(&["approval", "status"])
            .fields(&["spec.signerName"]),
        // coordination.k8s.io/v1
        builtin::<coord::Lease>(),
        // discovery.k8s.io/v1
        builtin::<disc::EndpointSlice>(),
        // events.k8s.io/v1: the same events as core/v1, another view.
        builtin::<events::Event>()
            .short(&["ev"])
            .fields(EVENT_FIELDS),
        // rbac.authorization.k8s.io/v1
        builtin::<rbac::ClusterRoleBinding>(),
        builtin::<rbac::ClusterRole>(),
        builtin::<rbac::RoleBinding>(),
        builtin::<rbac::Role>(),
    ]
}

impl Registry {
    /// A registry serving every [`builtins`] type, at generation 1.
    pub fn with_builtins() -> Registry {
        Registry {
            types: builtins().into_iter().map(Arc::new).collect(),
            generation: 1,
            openapi: std::sync::OnceLock::new(),
        }
    }

    /// A new registry where the types of CRD `crd_name` are replaced by `types` (none removes
    /// them), with the generation bumped so discovery and OpenAPI hashes change.
    pub fn with_crd_types(&self, crd_name: &str, types: Vec<ResourceType>) -> Registry {
        let mut kept: Vec<Arc<ResourceType>> = self
            .types
            .iter()
            .filter(|t| !matches!(&t.origin, Origin::Crd { name } if name == crd_name))
            .cloned()
            .collect();
        kept.extend(types.into_iter().map(Arc::new));
        Registry {
            types: kept,
            generation: self.generation + 1,
            openapi: std::sync::OnceLock::new(),
        }
    }

    /// The OpenAPI v3 documents, built once per registry.
    pub(crate) fn openapi_docs(&self) -> Arc<crate::discovery::OpenApiDocs> {
        self.openapi
            .get_or_init(|| Arc::new(crate::discovery::OpenApiDocs::build(self)))
            .clone()
    }

    /// The types of one group, any version.
    pub fn group_types<'a>(
        &'a self,
        group: &'a str,
    ) -> impl Iterator<Item = &'a Arc<ResourceType>> {
        self.types.iter().filter(move |t| t.group == group)
    }

    /// The storage version's type for a group and plural (for CRDs with several versions).
    pub fn storage_type(&self, group: &str, plural: &str) -> Option<Arc<ResourceType>> {
        self.types
            .iter()
            .find(|t| t.group == group && t.plural == plural && t.storage)
            .cloned()
    }
}

/// The typed round trip of a built-in kind: decodes into the k8s-openapi type and encodes it
/// again; the input fields the typed value does not carry back out are unknown.
type TypedCheck = fn(&Value) -> Option<Value>;

fn typed_roundtrip(rt: &ResourceType, obj: &Value) -> Option<Value> {
    typed_check(&rt.group, &rt.kind).and_then(|f| f(obj))
}

/// Whether Kubernetes has this kind in this group/version, as far as this server knows: the
/// built-in types it serves and the kinds of their subresources.
pub(crate) fn is_known_kind(api_version: &str, kind: &str) -> bool {
    const SUBRESOURCE_KINDS: &[(&str, &str)] = &[
        ("v1", "Binding"),
        ("policy/v1", "Eviction"),
        ("autoscaling/v1", "Scale"),
        ("authentication.k8s.io/v1", "TokenRequest"),
    ];
    SUBRESOURCE_KINDS.contains(&(api_version, kind))
        || builtins()
            .iter()
            .any(|t| t.kind == kind && t.api_version() == api_version)
}

fn typed_check(group: &str, kind: &str) -> Option<TypedCheck> {
    use k8s_openapi::Resource;
    use k8s_openapi::api::{
        admissionregistration::v1 as admission, apps::v1 as apps, authentication::v1 as authn,
        authorization::v1 as authz, batch::v1 as batch, certificates::v1 as certs,
        coordination::v1 as coord, core::v1 as core, discovery::v1 as disc, events::v1 as events,
        networking::v1 as net, policy::v1 as policy, rbac::v1 as rbac, scheduling::v1 as sched,
        storage::v1 as storage,
    };
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1 as apiext;
    macro_rules! find {
        ($($t:ty),* $(,)?) => {
            $(
                if group == <$t as Resource>::GROUP && kind == <$t as Resource>::KIND {
                    return Some(typed_back::<$t>);
                }
            )*
        };
    }
    find!(
        core::ConfigMap,
        core::Endpoints,
        core::Event,
        core::Namespace,
        core::Node,
        core::Pod,
        core::LimitRange,
        core::PersistentVolumeClaim,
        core::PersistentVolume,
        core::ResourceQuota,
        core::Secret,
        core::ServiceAccount,
        core::Service,
        apiext::CustomResourceDefinition,
        apps::Deployment,
        apps::DaemonSet,
        apps::ReplicaSet,
        apps::StatefulSet,
        admission::MutatingWebhookConfiguration,
        admission::ValidatingWebhookConfiguration,
        batch::CronJob,
        batch::Job,
        net::Ingress,
        net::NetworkPolicy,
        policy::PodDisruptionBudget,
        sched::PriorityClass,
        storage::StorageClass,
        authn::SelfSubjectReview,
        authn::TokenReview,
        authz::LocalSubjectAccessReview,
        authz::SelfSubjectAccessReview,
        authz::SelfSubjectRulesReview,
        authz::SubjectAccessReview,
        certs::CertificateSigningRequest,
        coord::Lease,
        disc::EndpointSlice,
        events::Event,
        rbac::ClusterRoleBinding,
        rbac::ClusterRole,
        rbac::RoleBinding,
        rbac::Role,
    );
    None
}

fn typed_back<K>(obj: &Value) -> Option<Value>
where
    K: serde::de::DeserializeOwned + serde::Serialize,
{
    // A body that does not even decode is left to the server's other checks: k8s-openapi is
    // stricter than Go in places (numbers for quantities), so a decode error is not evidence.
    let typed = serde_json::from_value::<K>(obj.clone()).ok()?;
    serde_json::to_value(&typed).ok()
}

/// Removes from `input` the non-null fields `typed` lacks (the walk of [`missing_fields`]).
fn drop_missing(input: &mut Value, typed: &Value) {
    match (input, typed) {
        (Value::Object(a), Value::Object(b)) => {
            a.retain(|k, v| v.is_null() || b.contains_key(k));
            for (k, v) in a.iter_mut() {
                if let Some(bv) = b.get(k) {
                    drop_missing(v, bv);
                }
            }
        }
        (Value::Array(a), Value::Array(b)) => {
            for (x, y) in a.iter_mut().zip(b) {
                drop_missing(x, y);
            }
        }
        _ => {}
    }
}

/// Paths of the non-null fields of `input` that `typed` lacks.
fn missing_fields(input: &Value, typed: &Value, path: &str, out: &mut Vec<String>) {
    match (input, typed) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in a {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                match b.get(k) {
                    _ if v.is_null() => {}
                    None => out.push(p),
                    Some(bv) => missing_fields(v, bv, &p, out),
                }
            }
        }
        (Value::Array(a), Value::Array(b)) => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                missing_fields(x, y, &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

impl ResourceType {
    /// Drops the fields of a built-in object its type does not know, as kube-apiserver's typed
    /// decoding does under `Warn` and `Ignore` (custom resources are pruned by their schema).
    pub fn drop_unknown_fields(&self, obj: &mut Value) {
        if self.origin != Origin::Builtin {
            return;
        }
        if let Some(typed) = typed_roundtrip(self, obj) {
            drop_missing(obj, &typed);
        }
    }

    /// The fields of `obj` this type does not know, as `fieldValidation` reports them
    /// (`spec.replicaz`, `spec.template.spec.containers[0].imagePullPolicyy`). Built-ins are
    /// checked against their k8s-openapi type; custom resources against the structural schema
    /// (see [`crate::crd::unknown_fields`]), plus `metadata` against `ObjectMeta`.
    pub fn unknown_fields(&self, obj: &Value) -> Vec<String> {
        match &self.origin {
            Origin::Builtin => {
                let mut out = Vec::new();
                if let Some(back) = typed_roundtrip(self, obj) {
                    missing_fields(obj, &back, "", &mut out);
                }
                out
            }
            Origin::Crd { .. } => {
                // The real server reports what pruning drops first, then unknown metadata.
                let mut out = crate::crd::unknown_fields(self, obj);
                if let Some(meta) = obj.get("metadata") {
                    let typed = serde_json::from_value::<
                        k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
                    >(meta.clone())
                    .ok()
                    .and_then(|m| serde_json::to_value(m).ok());
                    if let Some(typed) = typed {
                        missing_fields(meta, &typed, "metadata", &mut out);
                    }
                }
                out
            }
        }
    }
}

/// A `fieldValidation` mode (the query parameter of every write).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldValidation {
    /// Unknown fields are dropped silently.
    Ignore,
    /// Unknown fields are dropped with a `Warning` header each (the server default).
    Warn,
    /// Unknown fields fail the request.
    Strict,
}

impl FieldValidation {
    /// Parses the query parameter; absent or empty is `Warn`, as on kube-apiserver 1.27+.
    pub fn parse(mode: Option<&str>) -> Result<Self, crate::error::ApiError> {
        match mode {
            None | Some("" | "Warn") => Ok(Self::Warn),
            Some("Ignore") => Ok(Self::Ignore),
            Some("Strict") => Ok(Self::Strict),
            Some(other) => Err(crate::error::ApiError::bad_request(format!(
                "fieldValidation parameter unsupported: {other:?}; valid values are Ignore, Warn, Strict"
            ))),
        }
    }
}

/// What a `fieldValidation` check found in a body with unknown fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UnknownFields {
    /// Nothing to report (no unknown fields, or `Ignore`).
    None,
    /// `Warn`: one `unknown field "<path>"` text per field, for `Warning: 299` headers.
    Warn(Vec<String>),
    /// `Strict`: the `strict decoding error: unknown field "<path>", ...` text that fails the
    /// request (its wrapping depends on the verb).
    Strict(String),
}

/// Checks a decoded body or a patched object for unknown fields under `mode`.
pub fn check_unknown_fields(
    rt: &ResourceType,
    obj: &Value,
    mode: FieldValidation,
) -> UnknownFields {
    if mode == FieldValidation::Ignore {
        return UnknownFields::None;
    }
    let unknown = rt.unknown_fields(obj);
    if unknown.is_empty() {
        return UnknownFields::None;
    }
    let texts: Vec<String> = unknown
        .iter()
        .map(|f| format!("unknown field {f:?}"))
        .collect();
    match mode {
        FieldValidation::Warn => UnknownFields::Warn(texts),
        _ => UnknownFields::Strict(format!("strict decoding error: {}", texts.join(", "))),
    }
}

/// Applies the `fieldValidation` query parameter to a decoded create or update body: `Strict`
/// (kubectl's default) rejects unknown fields with 400 BadRequest worded as kube-apiserver words
/// it, `Warn` (the default when absent) returns one warning per field (for
/// `Warning: 299 - "<text>"` headers), and `Ignore` accepts silently. Unknown modes are a 400.
pub fn field_validation(
    rt: &ResourceType,
    obj: &Value,
    mode: Option<&str>,
) -> Result<Vec<String>, crate::error::ApiError> {
    match check_unknown_fields(rt, obj, FieldValidation::parse(mode)?) {
        UnknownFields::None => Ok(Vec::new()),
        UnknownFields::Warn(texts) => Ok(texts),
        UnknownFields::Strict(detail) => Err(crate::error::ApiError::bad_request(format!(
            "{kind} in version {version:?} cannot be handled as a {kind}: {detail}",
            kind = rt.kind,
            version = rt.version,
        ))),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn builtins_are_unique_and_consistent() {
        let reg = Registry::with_builtins();
        let mut seen = BTreeSet::new();
        for t in &reg.types {
            assert!(seen.insert(t.gvr()), "duplicate {:?}", t.gvr());
            assert_eq!(t.origin, Origin::Builtin);
            assert!(t.storage);
            assert!(!t.verbs.is_empty(), "{} has verbs", t.plural);
            assert_eq!(t.singular, t.kind.to_ascii_lowercase());
            if t.supports("list") {
                assert_eq!(t.list_kind, format!("{}List", t.kind));
            }
            for sub in &t.subresources {
                assert!(
                    [
                        "status",
                        "scale",
                        "binding",
                        "eviction",
                        "exec",
                        "attach",
                        "portforward",
                        "log",
                        "token",
                        "approval",
                        "finalize",
                    ]
                    .contains(&sub.as_str()),
                    "{}/{sub} is a subresource discovery knows",
                    t.plural
                );
            }
        }
        let short: Vec<&String> = reg.types.iter().flat_map(|t| &t.short_names).collect();
        let unique: BTreeSet<&&String> = short.iter().collect();
        // `ev` names both Event APIs, as on a real server; nothing else may collide.
        assert_eq!(
            short.len(),
            unique.len() + 1,
            "short names collide: {short:?}"
        );
        assert!(
            reg.lookup("", "v1", "pods")
                .is_some_and(|p| p.namespaced && p.has_status())
        );
        assert!(reg.lookup("", "v1", "nodes").is_some_and(|n| !n.namespaced));
        assert!(reg.by_kind("apps/v1", "Deployment").is_some());
        assert!(reg.lookup("", "v1", "widgets").is_none());
    }

    #[test]
    fn unknown_fields_of_builtins_and_custom_resources() {
        let reg = Registry::with_builtins();
        let deploy = reg.by_kind("apps/v1", "Deployment").expect("deployments");
        let obj = serde_json::json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "d", "labelz": {}, "labels": {"a": "b"}},
            "spec": {"replicaz": 2, "selector": {"matchLabels": {"app": "d"}},
                     "template": {"metadata": {"labels": {"app": "d"}},
                                  "spec": {"containers": [{"name": "c", "image": "nginx", "imagePullPolicyy": "Always", "ports": null}]}}},
            "status": {},
        });
        assert_eq!(
            deploy.unknown_fields(&obj),
            [
                "metadata.labelz",
                "spec.replicaz",
                "spec.template.spec.containers[0].imagePullPolicyy"
            ]
        );
        let err = field_validation(&deploy, &obj, Some("Strict")).expect_err("strict");
        assert_eq!(err.code, 400);
        assert_eq!(
            err.message,
            "Deployment in version \"v1\" cannot be handled as a Deployment: strict decoding error: unknown field \"metadata.labelz\", unknown field \"spec.replicaz\", unknown field \"spec.template.spec.containers[0].imagePullPolicyy\""
        );
        assert_eq!(
            field_validation(&deploy, &obj, Some("Warn"))
                .expect("warn")
                .len(),
            3
        );
        assert!(
            field_validation(&deploy, &obj, Some("Ignore"))
                .expect("ignore")
                .is_empty()
        );
        assert_eq!(
            field_validation(&deploy, &obj, None)
                .expect("default is Warn")
                .len(),
            3
        );
        let mut dropped = obj.clone();
        deploy.drop_unknown_fields(&mut dropped);
        assert!(deploy.unknown_fields(&dropped).is_empty());
        assert_eq!(dropped["spec"]["selector"], obj["spec"]["selector"]);
        assert_eq!(dropped["metadata"]["labels"], obj["metadata"]["labels"]);
        assert_eq!(
            field_validation(&deploy, &obj, Some("Sometimes"))
                .expect_err("bad mode")
                .code,
            400
        );

        // A well-formed object of every kind has no unknown fields, whatever the defaults.
        let cm = reg.lookup("", "v1", "configmaps").expect("configmaps");
        let good = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "c", "creationTimestamp": "2025-01-01T00:00:00Z", "labels": {}}, "data": {}});
        assert!(
            cm.unknown_fields(&good).is_empty(),
            "{:?}",
            cm.unknown_fields(&good)
        );
        // Bodies k8s-openapi cannot decode are not judged here.
        let pod = reg.lookup("", "v1", "pods").expect("pods");
        let numeric = serde_json::json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c",
            "resources": {"limits": {"cpu": 1}}}], "bogus": 1}});
        assert_eq!(pod.unknown_fields(&numeric), ["spec.bogus"]);
        let odd =
            serde_json::json!({"metadata": {"name": "p"}, "spec": {"containers": "c", "bogus": 1}});
        assert!(pod.unknown_fields(&odd).is_empty());

        let crd = serde_json::json!({
            "metadata": {"name": "widgets.example.com"},
            "spec": {"group": "example.com", "scope": "Namespaced", "names": {"plural": "widgets", "kind": "Widget"},
                     "versions": [{"name": "v1", "served": true, "storage": true, "schema": {"openAPIV3Schema": {
                        "type": "object", "properties": {"spec": {"type": "object", "properties": {"a": {"type": "string"}}}}}}}]},
        });
        let widget = crate::crd::types_from_crd(&crd).expect("valid").remove(0);
        let w = serde_json::json!({"apiVersion": "example.com/v1", "kind": "Widget",
            "metadata": {"name": "w", "bogus": 1}, "spec": {"a": "x", "b": 2}});
        assert_eq!(widget.unknown_fields(&w), ["spec.b", "metadata.bogus"]);
        let err = field_validation(&widget, &w, Some("Strict")).expect_err("strict");
        assert_eq!(
            err.message,
            "Widget in version \"v1\" cannot be handled as a Widget: strict decoding error: unknown field \"spec.b\", unknown field \"metadata.bogus\""
        );
    }

    #[test]
    fn crd_types_replace_each_other_and_bump_the_generation() {
        let reg = Registry::with_builtins();
        let widget = |version: &str| ResourceType {
            group: "example.com".into(),
            version: version.into(),
            origin: Origin::Crd {
                name: "widgets.example.com".into(),
            },
            ..(*reg.lookup("", "v1", "configmaps").expect("configmaps")).clone()
        };
        let one = reg.with_crd_types("widgets.example.com", vec![widget("v1")]);
        assert_eq!(one.generation, reg.generation + 1);
        assert!(one.lookup("example.com", "v1", "configmaps").is_some());
        let two = one.with_crd_types("widgets.example.com", vec![widget("v2")]);
        assert!(
            two.lookup("example.com", "v1", "configmaps").is_none(),
            "old version replaced"
        );
        assert!(two.lookup("example.com", "v2", "configmaps").is_some());
        assert_eq!(two.types.len(), reg.types.len() + 1);
        let gone = two.with_crd_types("widgets.example.com", Vec::new());
        assert_eq!(gone.types.len(), reg.types.len());
        assert_eq!(gone.generation, reg.generation + 3);
        assert!(gone.group_types("example.com").next().is_none());
    }
}
