//! `authentication.tether.dev`: Tenant (a consumer, as its provider sees it) and ResourceSlice
//! (resources a consumer asks a provider for).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::conditions::{Condition, Time};

/// A consumer cluster as its provider sees it. Created by the provider's authentication
/// service once the consumer proved it holds its key; owns the tenant namespace, the
/// consumer's roles and its identity. Deleting it revokes all of them.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "authentication.tether.dev",
    version = "v1alpha1",
    kind = "Tenant",
    plural = "tenants",
    shortname = "tn",
    category = "tether",
    status = "TenantStatus",
    derive = "PartialEq",
    crates(kube_core = "::kube_core"),
    doc = "A consumer cluster as its provider sees it; owns the consumer's namespace, roles and identity.",
    printcolumn(name = "Cluster ID", type_ = "string", json_path = ".spec.clusterID"),
    printcolumn(name = "Namespace", type_ = "string", json_path = ".status.namespace"),
    printcolumn(
        name = "Condition",
        type_ = "string",
        json_path = ".spec.tenantCondition"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Expires",
        type_ = "string",
        json_path = ".status.identityExpiresAt"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct TenantSpec {
    /// The consumer's cluster ID. The object's name equals it.
    #[serde(rename = "clusterID")]
    #[schemars(length(min = 1, max = 49), regex(pattern = crate::cluster_id::PATTERN))]
    pub cluster_id: String,

    /// The consumer's Ed25519 public key, base64 (32 bytes). Every later request of the
    /// consumer (renewal, revocation) must be signed with the matching private key.
    #[schemars(regex(pattern = r"^[A-Za-z0-9+/]{43}=$"))]
    pub public_key: String,

    /// Whether the consumer may use the provider: `Active` (default), `Cordoned` (no new
    /// resources) or `Drained` (offloaded workloads evicted).
    #[serde(default)]
    pub tenant_condition: TenantCondition,
}

/// Whether a tenant may use its provider.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum TenantCondition {
    /// Normal operation.
    #[default]
    Active,
    /// No new resources are granted.
    Cordoned,
    /// Offloaded workloads are evicted.
    Drained,
}

/// Observed state of a tenant.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TenantStatus {
    /// The tenant namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// The Kubernetes username of the consumer's identity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    /// When the newest credential issued to the consumer expires.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity_expires_at: Option<Time>,
    /// How many credentials were issued (first issue and renewals).
    #[serde(default)]
    pub identities_issued: u32,
    /// Conditions; `Ready` once namespace and roles exist.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// Resources a consumer asks its provider for; the provider's answer is in the status. Lives
/// in the tenant namespace on both sides.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "authentication.tether.dev",
    version = "v1alpha1",
    kind = "ResourceSlice",
    plural = "resourceslices",
    shortname = "rslice",
    category = "tether",
    namespaced,
    status = "ResourceSliceStatus",
    derive = "PartialEq",
    crates(kube_core = "::kube_core"),
    doc = "Resources a consumer asks its provider for; the status holds what the provider granted.",
    printcolumn(
        name = "Consumer",
        type_ = "string",
        json_path = ".spec.consumerClusterID"
    ),
    printcolumn(
        name = "Provider",
        type_ = "string",
        json_path = ".spec.providerClusterID"
    ),
    printcolumn(
        name = "Resources",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Resources\")].reason"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ResourceSliceSpec {
    /// The consumer's cluster ID.
    #[serde(rename = "consumerClusterID")]
    #[schemars(length(min = 1, max = 49), regex(pattern = crate::cluster_id::PATTERN))]
    pub consumer_cluster_id: String,
    /// The provider's cluster ID.
    #[serde(rename = "providerClusterID")]
    #[schemars(length(min = 1, max = 49), regex(pattern = crate::cluster_id::PATTERN))]
    pub provider_cluster_id: String,
    /// The class of resources asked for; the provider decides what a class means.
    #[serde(default = "default_class")]
    #[schemars(length(min = 1, max = 63), regex(pattern = crate::cluster_id::PATTERN))]
    pub class: String,
    /// The amounts asked for, by resource name (`cpu`, `memory`, `pods`, ...).
    #[serde(default)]
    pub resources: BTreeMap<String, Quantity>,
}

fn default_class() -> String {
    "default".to_owned()
}

/// The provider's answer to a ResourceSlice.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResourceSliceStatus {
    /// What the provider granted, by resource name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub resources: BTreeMap<String, Quantity>,
    /// Labels the virtual node should carry (provider facts such as region or zone).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_labels: BTreeMap<String, String>,
    /// Conditions; `Resources` is True with reason `Accepted` or False with reason `Denied`
    /// and a message saying why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}
