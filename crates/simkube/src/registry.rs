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
