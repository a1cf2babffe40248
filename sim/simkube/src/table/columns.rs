//! Which columns each built-in kind's Table has and which function computes its cells: the
//! dispatch from group and kind to a [`Layout`].

#[allow(clippy::wildcard_imports)]
use super::*;

pub(super) fn layout(group: &str, kind: &str) -> Option<Layout> {
    match (group, kind) {
        ("", "Pod") => pod_layout(),
        ("", "Namespace") => namespace_layout(),
        ("", "Service") => service_layout(),
        ("", "Node") => node_layout(),
        ("", "ConfigMap") => config_map_layout(),
        ("", "Secret") => secret_layout(),
        ("", "ServiceAccount") => service_account_layout(),
        ("", "Endpoints") => endpoints_layout(),
        ("discovery.k8s.io", "EndpointSlice") => endpoint_slice_layout(),
        ("", "Event") | ("events.k8s.io", "Event") => event_layout(group),
        ("coordination.k8s.io", "Lease") => lease_layout(),
        ("certificates.k8s.io", "CertificateSigningRequest") => {
            certificate_signing_request_layout()
        }
        ("apps", "Deployment") => deployment_layout(),
        ("apps", "ReplicaSet") => replica_set_layout(),
        ("rbac.authorization.k8s.io", "RoleBinding" | "ClusterRoleBinding") => {
            role_binding_layout()
        }
        ("apps", "DaemonSet") => daemon_set_layout(),
        ("apps", "StatefulSet") => stateful_set_layout(),
        ("batch", "Job") => job_layout(),
        ("batch", "CronJob") => cron_job_layout(),
        ("", "PersistentVolumeClaim") => persistent_volume_claim_layout(),
        ("", "PersistentVolume") => persistent_volume_layout(),
        ("", "ResourceQuota") => resource_quota_layout(),
        ("networking.k8s.io", "NetworkPolicy") => network_policy_layout(),
        ("networking.k8s.io", "Ingress") => ingress_layout(),
        ("storage.k8s.io", "StorageClass") => storage_class_layout(),
        ("scheduling.k8s.io", "PriorityClass") => priority_class_layout(),
        ("policy", "PodDisruptionBudget") => pod_disruption_budget_layout(),
        (
            "admissionregistration.k8s.io",
            "MutatingWebhookConfiguration" | "ValidatingWebhookConfiguration",
        ) => webhook_configuration_layout(),
        ("rbac.authorization.k8s.io", "Role" | "ClusterRole") => role_layout(),
        _ => None,
    }
}

/// A layout whose NAME column leads.
pub(super) fn layout_of(columns: Vec<PrinterColumn>, cells: CellFn) -> Option<Layout> {
    Some(Layout {
        name_first: true,
        columns,
        cells,
    })
}
