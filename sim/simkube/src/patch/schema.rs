//! Patch metadata of the built-in kinds: which lists merge by which key, which are sets, which
//! objects are atomic. Strategic merge patch reads the `patchStrategy` / `patchMergeKey` side;
//! server-side apply reads the `listType` / `listMapKey` / `structType` / `mapType` side.
//!
//! The facts come from the struct tags of the upstream Kubernetes 1.33 API types
//! (`k8s.io/api/.../types.go`). Only types whose fields carry such tags, and the paths leading
//! to them, are described; any other field of a built-in object is a plain struct field: objects
//! merge, lists are replaced (atomic). Field names that are maps throughout the API (`labels`,
//! `data`, `limits`, ...) and the atomic `LabelSelector` fields are recognised by name.

use serde_json::Value;

/// A built-in struct type whose fields matter to patching.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ty {
    /// A top-level object of a kind not described further: only `metadata` is special.
    TopLevel,
    /// A struct not described further; fields are classified by name.
    Generic,
    /// `metav1.ObjectMeta`.
    ObjectMeta,
    /// `core/v1` Pod.
    Pod,
    /// `core/v1` PodTemplate (the kind).
    PodTemplate,
    /// `PodTemplateSpec`.
    PodTemplateSpec,
    /// `PodSpec`.
    PodSpec,
    /// `Container` (also `EphemeralContainer`).
    Container,
    /// `ResourceRequirements`.
    ResourceRequirements,
    /// `PodStatus`.
    PodStatus,
    /// `core/v1` Service.
    Service,
    /// `ServiceSpec`.
    ServiceSpec,
    /// `core/v1` Node.
    Node,
    /// `NodeSpec`.
    NodeSpec,
    /// `NodeStatus`.
    NodeStatus,
    /// `core/v1` Namespace.
    Namespace,
    /// `core/v1` ServiceAccount.
    ServiceAccount,
    /// Deployment, ReplicaSet, StatefulSet, DaemonSet.
    Workload,
    /// Their specs: `template`, `selector`.
    WorkloadSpec,
    /// `core/v1` ReplicationController.
    ReplicationController,
    /// `ReplicationControllerSpec`.
    ReplicationControllerSpec,
    /// `batch/v1` Job.
    Job,
    /// `JobSpec`.
    JobSpec,
    /// `JobStatus`: conditions merge by `type` in SMP but are atomic for apply.
    JobStatus,
    /// `batch/v1` CronJob.
    CronJob,
    /// `CronJobSpec`.
    CronJobSpec,
    /// `JobTemplateSpec`.
    JobTemplateSpec,
    /// A kind whose only special part is a `status.conditions` list merged by `type`.
    WithConditions,
    /// A status whose `conditions` merge by `type` (SMP and apply).
    ConditionsStatus,
    /// A kind whose `status.conditions` are a map list for apply but replaced by SMP
    /// (CustomResourceDefinition, CertificateSigningRequest, APIService).
    WithApplyConditions,
    /// Their status.
    ApplyConditionsStatus,
}

/// How strategic merge patch treats a list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Smp {
    /// Replaced whole (no `patchStrategy`).
    Replace,
    /// `patchStrategy: merge`: by the merge key for objects, as a set for scalars (`None`).
    Merge(Option<&'static str>),
}

/// How server-side apply treats a list (`x-kubernetes-list-type`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListType {
    /// Owned and replaced as a whole.
    Atomic,
    /// Scalars, each owned separately (`v:` path elements).
    Set,
    /// Objects keyed by these fields (`k:` path elements), each with the default value the
    /// schema gives it, used when an element omits that key (as `protocol: TCP` for ports).
    Map(Vec<(String, Option<Value>)>),
}

/// What a field of a built-in struct holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    /// A struct with its own fields.
    Struct(Ty),
    /// A `map[string]X`; `atomic` for `+mapType=atomic`.
    Map {
        /// Owned and replaced as a whole by apply.
        atomic: bool,
    },
    /// An atomic struct (`+structType=atomic`), e.g. `LabelSelector`.
    Atomic,
    /// A list.
    List {
        /// Strategic merge patch behaviour.
        smp: Smp,
        /// Apply list type keys; empty for atomic, `&["*"]` marks a set; `key=value` gives a
        /// key's default.
        ssa: &'static [&'static str],
        /// Element type when the elements are described structs.
        elem: Option<Ty>,
        /// Whether each element is an atomic struct.
        atomic_elem: bool,
    },
    /// Nothing special: objects are structs classified by name, lists are atomic.
    Plain,
}

const SET: &[&str] = &["*"];
const ATOMIC: &[&str] = &[];

const fn merge(key: &'static str, ssa: &'static [&'static str], elem: Option<Ty>) -> Field {
    Field::List {
        smp: Smp::Merge(Some(key)),
        ssa,
        elem,
        atomic_elem: false,
    }
}

const fn replace(ssa: &'static [&'static str], elem: Option<Ty>) -> Field {
    Field::List {
        smp: Smp::Replace,
        ssa,
        elem,
        atomic_elem: false,
    }
}

const CONDITIONS: Field = merge("type", &["type"], None);

/// Groups served by kube-apiserver itself (a CRD may not claim them without approval), so
/// strategic merge patch is available for every kind in them.
const BUILTIN_GROUPS: &[&str] = &[
    "",
    "apps",
    "batch",
    "autoscaling",
    "policy",
    "admissionregistration.k8s.io",
    "apiextensions.k8s.io",
    "apiregistration.k8s.io",
    "authentication.k8s.io",
    "authorization.k8s.io",
    "certificates.k8s.io",
    "coordination.k8s.io",
    "discovery.k8s.io",
    "events.k8s.io",
    "flowcontrol.apiserver.k8s.io",
    "internal.apiserver.k8s.io",
    "networking.k8s.io",
    "node.k8s.io",
    "rbac.authorization.k8s.io",
    "resource.k8s.io",
    "scheduling.k8s.io",
    "storage.k8s.io",
    "storagemigration.k8s.io",
];

/// The group of an `apiVersion` (`""` for `v1`).
pub fn group_of(api_version: &str) -> &str {
    api_version.rsplit_once('/').map(|(g, _)| g).unwrap_or("")
}

/// The root type of a built-in kind, or `None` when `apiVersion` is not a built-in group
/// (a custom resource).
pub fn root(api_version: &str, kind: &str) -> Option<Ty> {
    let group = group_of(api_version);
    if !BUILTIN_GROUPS.contains(&group) {
        return None;
    }
    Some(match (group, kind) {
        ("", "Pod") => Ty::Pod,
        ("", "PodTemplate") => Ty::PodTemplate,
        ("", "Service") => Ty::Service,
        ("", "Node") => Ty::Node,
        ("", "Namespace") => Ty::Namespace,
        ("", "ServiceAccount") => Ty::ServiceAccount,
        ("", "ReplicationController") => Ty::ReplicationController,
        ("", "PersistentVolumeClaim" | "PersistentVolume") => Ty::WithConditions,
        ("apps", "Deployment" | "ReplicaSet" | "StatefulSet" | "DaemonSet") => Ty::Workload,
        ("batch", "Job") => Ty::Job,
        ("batch", "CronJob") => Ty::CronJob,
        ("apiextensions.k8s.io", "CustomResourceDefinition")
        | ("certificates.k8s.io", "CertificateSigningRequest")
        | ("apiregistration.k8s.io", "APIService") => Ty::WithApplyConditions,
        ("autoscaling", "HorizontalPodAutoscaler") | ("policy", "PodDisruptionBudget") => {
            Ty::WithConditions
        }
        _ => Ty::TopLevel,
    })
}

/// The metadata of field `name` of struct `ty`.
pub fn field(ty: Ty, name: &str) -> Field {
    use Ty as T;
    let described = match (ty, name) {
        (_, "metadata") if is_top_level(ty) || ty == T::PodTemplateSpec => {
            Some(Field::Struct(T::ObjectMeta))
        }
        (T::ObjectMeta, "finalizers") => Some(Field::List {
            smp: Smp::Merge(None),
            ssa: SET,
            elem: None,
            atomic_elem: false,
        }),
        (T::ObjectMeta, "ownerReferences") => Some(Field::List {
            smp: Smp::Merge(Some("uid")),
            ssa: &["uid"],
            elem: None,
            atomic_elem: true,
        }),
        (T::ObjectMeta, "managedFields") => Some(replace(ATOMIC, None)),

        (T::Pod, "spec") => Some(Field::Struct(T::PodSpec)),
        (T::Pod, "status") => Some(Field::Struct(T::PodStatus)),
        (T::PodTemplate, "template") => Some(Field::Struct(T::PodTemplateSpec)),
        (T::PodTemplateSpec, "spec") => Some(Field::Struct(T::PodSpec)),
        (T::PodSpec, "containers" | "initContainers" | "ephemeralContainers") => {
            Some(merge("name", &["name"], Some(T::Container)))
        }
        (T::PodSpec, "volumes" | "imagePullSecrets" | "schedulingGates" | "resourceClaims") => {
            Some(merge("name", &["name"], None))
        }
        (T::PodSpec, "hostAliases") => Some(merge("ip", &["ip"], None)),
        (T::PodSpec, "topologySpreadConstraints") => Some(merge(
            "topologyKey",
            &["topologyKey", "whenUnsatisfiable"],
            None,
        )),
        (T::PodSpec, "tolerations" | "readinessGates") => Some(replace(ATOMIC, None)),
        (T::PodSpec, "nodeSelector") => Some(Field::Map { atomic: true }),
        (T::Container, "ports") => Some(merge(
            "containerPort",
            &["containerPort", "protocol=TCP"],
            None,
        )),
        (T::Container, "env") => Some(merge("name", &["name"], None)),
        (T::Container, "volumeMounts") => Some(merge("mountPath", &["mountPath"], None)),
        (T::Container, "volumeDevices") => Some(merge("devicePath", &["devicePath"], None)),
        (T::Container, "resources") => Some(Field::Struct(T::ResourceRequirements)),
        (T::ResourceRequirements, "claims") => Some(replace(&["name"], None)),
        (T::PodStatus, "conditions") => Some(CONDITIONS),
        (T::PodStatus, "podIPs" | "hostIPs") => Some(merge("ip", &["ip"], None)),
        (T::PodStatus, "resourceClaimStatuses") => Some(merge("name", &["name"], None)),

        (T::Service, "spec") => Some(Field::Struct(T::ServiceSpec)),
        (T::Service | T::Namespace | T::WithConditions, "status") => {
            Some(Field::Struct(T::ConditionsStatus))
        }
        (T::ServiceSpec, "ports") => Some(merge("port", &["port", "protocol=TCP"], None)),
        (T::ServiceSpec, "selector") => Some(Field::Map { atomic: true }),

        (T::Node, "spec") => Some(Field::Struct(T::NodeSpec)),
        (T::Node, "status") => Some(Field::Struct(T::NodeStatus)),
        (T::NodeSpec, "podCIDRs") => Some(Field::List {
            smp: Smp::Merge(None),
            ssa: SET,
            elem: None,
            atomic_elem: false,
        }),
        (T::NodeStatus, "conditions" | "addresses") => Some(CONDITIONS),

        (T::ServiceAccount, "secrets") => Some(merge("name", &["name"], None)),

        (T::Workload, "spec") => Some(Field::Struct(T::WorkloadSpec)),
        (T::Workload, "status") => Some(Field::Struct(T::ConditionsStatus)),
        (T::WorkloadSpec | T::ReplicationControllerSpec | T::JobSpec, "template") => {
            Some(Field::Struct(T::PodTemplateSpec))
        }
        (T::ReplicationController, "spec") => Some(Field::Struct(T::ReplicationControllerSpec)),
        (T::ReplicationController, "status") => Some(Field::Struct(T::ConditionsStatus)),
        (T::ReplicationControllerSpec, "selector") => Some(Field::Map { atomic: true }),

        (T::Job, "spec") | (T::JobTemplateSpec, "spec") => Some(Field::Struct(T::JobSpec)),
        (T::Job, "status") => Some(Field::Struct(T::JobStatus)),
        (T::JobStatus, "conditions") => Some(merge("type", ATOMIC, None)),
        (T::CronJob, "spec") => Some(Field::Struct(T::CronJobSpec)),
        (T::CronJobSpec, "jobTemplate") => Some(Field::Struct(T::JobTemplateSpec)),
        (T::JobTemplateSpec, "metadata") => Some(Field::Struct(T::ObjectMeta)),

        (T::ConditionsStatus, "conditions") => Some(CONDITIONS),
        (T::WithApplyConditions, "status") => Some(Field::Struct(T::ApplyConditionsStatus)),
        (T::ApplyConditionsStatus, "conditions") => Some(replace(&["type"], None)),
        _ => None,
    };
    described.unwrap_or_else(|| by_name(name))
}

fn is_top_level(ty: Ty) -> bool {
    !matches!(
        ty,
        Ty::Generic
            | Ty::ObjectMeta
            | Ty::PodSpec
            | Ty::Container
            | Ty::ResourceRequirements
            | Ty::PodStatus
            | Ty::ServiceSpec
            | Ty::NodeSpec
            | Ty::NodeStatus
            | Ty::WorkloadSpec
            | Ty::ReplicationControllerSpec
            | Ty::JobSpec
            | Ty::JobStatus
            | Ty::CronJobSpec
            | Ty::JobTemplateSpec
            | Ty::ConditionsStatus
            | Ty::ApplyConditionsStatus
            | Ty::PodTemplateSpec
    )
}

/// Fields recognised anywhere by name: maps and atomic label selectors.
fn by_name(name: &str) -> Field {
    match name {
        "labels" | "annotations" | "data" | "binaryData" | "stringData" | "limits" | "requests"
        | "capacity" | "allocatable" | "overhead" | "hard" | "used" | "parameters"
        | "volumeAttributes" => Field::Map { atomic: false },
        "selector" | "podSelector" | "namespaceSelector" | "labelSelector" | "objectSelector" => {
            Field::Atomic
        }
        _ => Field::Plain,
    }
}

/// A position in a schema, for server-side apply: a built-in field, a node of a CRD's
/// structural schema, or an untyped ("deduced") value.
#[derive(Debug, Clone, Copy)]
pub enum Node<'a> {
    /// A field of a built-in object.
    Builtin(Field),
    /// A node of a structural schema (`openAPIV3Schema` of a CRD version).
    Schema(&'a Value),
    /// No schema: objects are granular maps, lists atomic.
    Deduced,
}

/// How server-side apply treats an object value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObjKind {
    /// Declared fields; a non-empty struct value is not owned itself.
    Struct,
    /// Free-form keys, each entry owned itself.
    Map,
    /// Owned and replaced as a whole.
    Atomic,
}

impl<'a> Node<'a> {
    /// The root node of an object of this kind; `schema` is the CRD version's schema if any.
    pub fn root(api_version: &str, kind: &str, schema: Option<&'a Value>) -> Node<'a> {
        match root(api_version, kind) {
            Some(ty) => Node::Builtin(Field::Struct(ty)),
            None => match schema {
                Some(s) => Node::Schema(s),
                None => Node::Deduced,
            },
        }
    }

    /// How an object at this node is owned.
    pub fn obj_kind(&self) -> ObjKind {
        match self {
            Node::Builtin(Field::Map { atomic: false }) | Node::Deduced => ObjKind::Map,
            Node::Builtin(Field::Map { atomic: true } | Field::Atomic) => ObjKind::Atomic,
            Node::Builtin(_) => ObjKind::Struct,
            Node::Schema(s) => {
                if s.get("x-kubernetes-map-type").and_then(Value::as_str) == Some("atomic") {
                    ObjKind::Atomic
                } else if s.get("properties").is_some() {
                    ObjKind::Struct
                } else if s.get("additionalProperties").is_some()
                    || s.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true))
                {
                    ObjKind::Map
                } else {
                    ObjKind::Struct
                }
            }
        }
    }

    /// The node of member `name` of an object at this node, and whether it is a declared
    /// struct field (as opposed to a map entry).
    pub fn child(&self, name: &str, top: bool) -> (Node<'a>, bool) {
        match self {
            Node::Builtin(Field::Struct(ty)) => (Node::Builtin(field(*ty, name)), true),
            Node::Builtin(Field::Plain) => (Node::Builtin(field(Ty::Generic, name)), true),
            Node::Builtin(_) => (Node::Builtin(Field::Plain), false),
            Node::Deduced => (Node::Deduced, false),
            Node::Schema(s) => {
                if top && name == "metadata" {
                    return (Node::Builtin(Field::Struct(Ty::ObjectMeta)), true);
                }
                if let Some(p) = s.get("properties").and_then(|p| p.get(name)) {
                    return (Node::Schema(p), true);
                }
                match s.get("additionalProperties") {
                    Some(ap @ Value::Object(_)) => (Node::Schema(ap), false),
                    _ => (Node::Deduced, false),
                }
            }
        }
    }

    /// How a list at this node is owned, and the node of its elements.
    pub fn list(&self) -> (ListType, Node<'a>) {
        match self {
            Node::Builtin(Field::List {
                ssa,
                elem,
                atomic_elem,
                ..
            }) => {
                let lt = if ssa.is_empty() {
                    ListType::Atomic
                } else if *ssa == SET {
                    ListType::Set
                } else {
                    ListType::Map(
                        ssa.iter()
                            .map(|k| match k.split_once('=') {
                                Some((name, default)) => {
                                    (name.to_owned(), Some(Value::from(default)))
                                }
                                None => ((*k).to_owned(), None),
                            })
                            .collect(),
                    )
                };
                let el = match (elem, atomic_elem) {
                    (_, true) => Field::Atomic,
                    (Some(t), _) => Field::Struct(*t),
                    (None, _) => Field::Plain,
                };
                (lt, Node::Builtin(el))
            }
            Node::Builtin(_) => (ListType::Atomic, Node::Builtin(Field::Plain)),
            Node::Deduced => (ListType::Atomic, Node::Deduced),
            Node::Schema(s) => {
                let items = s.get("items").map_or(Node::Deduced, Node::Schema);
                let lt = match s.get("x-kubernetes-list-type").and_then(Value::as_str) {
                    Some("set") => ListType::Set,
                    Some("map") => ListType::Map(
                        s.get("x-kubernetes-list-map-keys")
                            .and_then(Value::as_array)
                            .map(|ks| {
                                ks.iter()
                                    .filter_map(Value::as_str)
                                    .map(|k| {
                                        let default = s
                                            .get("items")
                                            .and_then(|i| i.get("properties"))
                                            .and_then(|p| p.get(k))
                                            .and_then(|p| p.get("default"))
                                            .cloned();
                                        (k.to_owned(), default)
                                    })
                                    .collect()
                            })
                            .unwrap_or_default(),
                    ),
                    _ => ListType::Atomic,
                };
                (lt, items)
            }
        }
    }
}
