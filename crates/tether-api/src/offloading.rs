//! `offloading.tether.dev`: VirtualNode (a provider's capacity as a node of the consumer),
//! NamespaceOffloading (which namespaces extend into which providers) and ShadowPod (a
//! consumer's pod, held by the provider).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PodSpec;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::conditions::Condition;
use crate::core::{LocalObjectRef, ObjectRef};

/// A provider's granted capacity as a node of this (consumer) cluster, run by a virtual
/// kubelet inside the controller. Lives in the tenant namespace.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "offloading.tether.dev",
    version = "v1alpha1",
    kind = "VirtualNode",
    plural = "virtualnodes",
    shortname = "vn",
    category = "tether",
    namespaced,
    status = "VirtualNodeStatus",
    derive = "PartialEq",
    crates(kube_core = "::kube_core"),
    doc = "A provider's granted capacity as a node of this cluster.",
    printcolumn(name = "Cluster ID", type_ = "string", json_path = ".spec.clusterID"),
    printcolumn(name = "Node", type_ = "string", json_path = ".status.nodeName"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct VirtualNodeSpec {
    /// The provider.
    #[serde(rename = "clusterID")]
    #[schemars(length(min = 1, max = 49), regex(pattern = crate::cluster_id::PATTERN))]
    pub cluster_id: String,
    /// The ResourceSlice whose grant this node exposes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_slice_ref: Option<LocalObjectRef>,
    /// The node's capacity; the grant's when absent.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub resources: BTreeMap<String, Quantity>,
    /// Extra labels for the Node.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Whether the Node carries the taint that only offloadable pods tolerate (default true).
    #[serde(default = "yes")]
    pub create_taint: bool,
    /// The Secret with the kubeconfig for the provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubeconfig_secret_ref: Option<ObjectRef>,
}

fn yes() -> bool {
    true
}

/// Observed state of a virtual node.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualNodeStatus {
    /// The Node's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// Conditions; `Ready` mirrors the Node's readiness.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// Where the pods of an offloaded namespace may run.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum PodOffloadingStrategy {
    /// Only on local nodes.
    Local,
    /// Only on virtual nodes.
    Remote,
    /// On both (the default).
    #[default]
    LocalAndRemote,
}

/// How the twin namespace in a provider is named.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum NamespaceMappingStrategy {
    /// `<namespace>-<consumer cluster ID>` (the default).
    #[default]
    DefaultName,
    /// The same name; fails where the provider already has such a namespace.
    EnforceSameName,
    /// `spec.remoteNamespaceName`.
    SelectedName,
}

/// Extends the namespace it lives in into providers. Its name must be `offloading`.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "offloading.tether.dev",
    version = "v1alpha1",
    kind = "NamespaceOffloading",
    plural = "namespaceoffloadings",
    shortname = "nsoff",
    category = "tether",
    namespaced,
    status = "NamespaceOffloadingStatus",
    derive = "PartialEq",
    crates(kube_core = "::kube_core"),
    doc = "Extends the namespace it lives in into providers.",
    printcolumn(
        name = "Strategy",
        type_ = "string",
        json_path = ".spec.podOffloadingStrategy"
    ),
    printcolumn(
        name = "Remote Namespace",
        type_ = "string",
        json_path = ".status.remoteNamespaceName"
    ),
    printcolumn(
        name = "Phase",
        type_ = "string",
        json_path = ".status.offloadingPhase"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceOffloadingSpec {
    /// Where pods may run.
    #[serde(default)]
    pub pod_offloading_strategy: PodOffloadingStrategy,
    /// How twin namespaces are named.
    #[serde(default)]
    pub namespace_mapping_strategy: NamespaceMappingStrategy,
    /// The twin namespace's name, for `SelectedName`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63), regex(pattern = crate::cluster_id::PATTERN))]
    pub remote_namespace_name: Option<String>,
    /// Labels a provider's virtual node must carry to be used; every provider when empty.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub cluster_selector: BTreeMap<String, String>,
}

/// Observed state of namespace offloading.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceOffloadingStatus {
    /// The twin namespaces' name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_namespace_name: Option<String>,
    /// `Ready`, `InProgress`, `SomeFailed`, `AllFailed`, `NoClusterSelected` or `Terminating`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offloading_phase: Option<String>,
    /// Conditions per provider, by cluster ID.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub remote_namespaces_conditions: BTreeMap<String, Vec<Condition>>,
    /// Conditions; `Ready` once every selected provider has its twin namespace.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// A consumer's pod as the provider holds it: the provider's controller turns it into a real
/// pod and keeps that pod running even when the consumer is unreachable. Lives in the twin
/// namespace.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "offloading.tether.dev",
    version = "v1alpha1",
    kind = "ShadowPod",
    plural = "shadowpods",
    shortname = "shpod",
    category = "tether",
    namespaced,
    status = "ShadowPodStatus",
    derive = "PartialEq",
    crates(kube_core = "::kube_core"),
    doc = "A consumer's pod as the provider holds it.",
    printcolumn(
        name = "Consumer",
        type_ = "string",
        json_path = ".spec.consumerClusterID"
    ),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ShadowPodSpec {
    /// The consumer the pod belongs to.
    #[serde(rename = "consumerClusterID")]
    #[schemars(length(min = 1, max = 49), regex(pattern = crate::cluster_id::PATTERN))]
    pub consumer_cluster_id: String,
    /// The pod's specification, translated for the provider.
    // Owned whole by the consumer, and atomic for server-side apply: the ShadowPod's managed
    // fields then list `pod` once instead of every field of it, and every copy of a ShadowPod
    // that crosses the link (the apply's answer, each watch event) is that much smaller.
    #[schemars(extend("x-kubernetes-map-type" = "atomic"))]
    pub pod: PodSpec,
}

/// Observed state of a shadow pod.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ShadowPodStatus {
    /// The real pod's phase, or `Rejected` when the provider refused to run it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Conditions; `Ready` mirrors the real pod, or says why it was rejected.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The real pod's status as the provider reports it (addresses in the provider's view).
    // Written whole by the provider, and atomic for the managed fields as `spec.pod` is: the
    // provider's entry names `pod` once instead of every field of it, and each status report
    // the consumer's watch carries across the link is that much smaller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-map-type" = "atomic"))]
    pub pod: Option<k8s_openapi::api::core::v1::PodStatus>,
}
