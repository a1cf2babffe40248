//! Column definitions of the core kinds' Tables (pods, services, nodes, config, endpoints,
//! events, leases, CSRs), after kube-apiserver's printers.

#[allow(clippy::wildcard_imports)]
use super::*;

pub(super) fn pod_layout() -> Option<Layout> {
    layout_of(
        vec![
            col(
                "Ready",
                "string",
                0,
                "The aggregate readiness state of this pod for accepting traffic.",
            ),
            col(
                "Status",
                "string",
                0,
                "The aggregate status of the containers in this pod.",
            ),
            col(
                "Restarts",
                "string",
                0,
                "The number of times the containers in this pod have been restarted and when the last container in this pod has restarted.",
            ),
            age_col(),
            col(
                "IP",
                "string",
                1,
                "IP address allocated to the pod. Routable at least within the cluster. Empty if not yet allocated.",
            ),
            col(
                "Node",
                "string",
                1,
                "NodeName is a request to schedule this pod onto a specific node.",
            ),
            col(
                "Nominated Node",
                "string",
                1,
                "nominatedNodeName is set only when this pod preempts other pods on the node.",
            ),
            col(
                "Readiness Gates",
                "string",
                1,
                "If specified, all readiness gates will be evaluated for pod readiness.",
            ),
        ],
        pod_cells,
    )
}

pub(super) fn namespace_layout() -> Option<Layout> {
    layout_of(
        vec![
            col("Status", "string", 0, "The status of the namespace"),
            age_col(),
        ],
        |o, now| vec![json!(str_at(o, &["status", "phase"])), age(o, now)],
    )
}

pub(super) fn service_layout() -> Option<Layout> {
    layout_of(
        vec![
            col(
                "Type",
                "string",
                0,
                "type determines how the Service is exposed.",
            ),
            col(
                "Cluster-IP",
                "string",
                0,
                "clusterIP is the IP address of the service.",
            ),
            col(
                "External-IP",
                "string",
                0,
                "externalIPs is a list of IP addresses for which nodes in the cluster will also accept traffic for this service.",
            ),
            col(
                "Port(s)",
                "string",
                0,
                "The list of ports that are exposed by this service.",
            ),
            age_col(),
            col(
                "Selector",
                "string",
                1,
                "Route service traffic to pods with label keys and values matching this selector.",
            ),
        ],
        service_cells,
    )
}

pub(super) fn node_layout() -> Option<Layout> {
    layout_of(
        vec![
            col("Status", "string", 0, "The status of the node"),
            col("Roles", "string", 0, "The roles of the node"),
            age_col(),
            col(
                "Version",
                "string",
                0,
                "Kubelet Version reported by the node.",
            ),
            col(
                "Internal-IP",
                "string",
                1,
                "List of addresses reachable to the node.",
            ),
            col(
                "External-IP",
                "string",
                1,
                "List of addresses reachable to the node.",
            ),
            col(
                "OS-Image",
                "string",
                1,
                "OS Image reported by the node from /etc/os-release.",
            ),
            col(
                "Kernel-Version",
                "string",
                1,
                "Kernel Version reported by the node from 'uname -r'.",
            ),
            col(
                "Container-Runtime",
                "string",
                1,
                "ContainerRuntime Version reported by the node.",
            ),
        ],
        node_cells,
    )
}

pub(super) fn config_map_layout() -> Option<Layout> {
    layout_of(
        vec![
            col(
                "Data",
                "integer",
                0,
                "Data contains the configuration data.",
            ),
            age_col(),
        ],
        |o, now| {
            vec![
                json!(len_at(o, &["data"]) + len_at(o, &["binaryData"])),
                age(o, now),
            ]
        },
    )
}

pub(super) fn secret_layout() -> Option<Layout> {
    layout_of(
        vec![
            col(
                "Type",
                "string",
                0,
                "Used to facilitate programmatic handling of secret data.",
            ),
            col("Data", "integer", 0, "Data contains the secret data."),
            age_col(),
        ],
        |o, now| {
            vec![
                json!(str_at(o, &["type"])),
                json!(len_at(o, &["data"])),
                age(o, now),
            ]
        },
    )
}

pub(super) fn service_account_layout() -> Option<Layout> {
    layout_of(
        vec![
            col(
                "Secrets",
                "integer",
                0,
                "Secrets is a list of the secrets in the same namespace that pods running using this ServiceAccount are allowed to use.",
            ),
            age_col(),
        ],
        |o, now| vec![json!(len_at(o, &["secrets"])), age(o, now)],
    )
}

pub(super) fn endpoints_layout() -> Option<Layout> {
    layout_of(
        vec![
            col("Endpoints", "string", 0, "Endpoints of the service"),
            age_col(),
        ],
        |o, now| vec![json!(endpoints_summary(o)), age(o, now)],
    )
}

pub(super) fn endpoint_slice_layout() -> Option<Layout> {
    layout_of(
        vec![
            col("AddressType", "string", 0, "The IP protocol for this slice"),
            col("Ports", "string", 0, "The ports for this slice"),
            col("Endpoints", "string", 0, "The endpoints for this slice"),
            age_col(),
        ],
        endpointslice_cells,
    )
}

pub(super) fn event_layout(group: &str) -> Option<Layout> {
    Some(Layout {
        name_first: false,
        columns: vec![
            col("Last Seen", "string", 0, "Time when last event occurred"),
            col("Type", "string", 0, "Type of this event."),
            col("Reason", "string", 0, "Reason of this event."),
            col("Object", "string", 0, "Object this event is about."),
            col("Subobject", "string", 1, "Subobject this event is about."),
            col("Source", "string", 1, "Source of this event."),
            col("Message", "string", 0, "Message of this event."),
            col("First Seen", "string", 1, "Time when first event occurred"),
            col("Count", "integer", 1, "Number of occurrences"),
            PrinterColumn {
                format: "name".to_owned(),
                ..col("Name", "string", 1, NAME_DESCRIPTION)
            },
        ],
        cells: if group.is_empty() {
            core_event_cells
        } else {
            events_event_cells
        },
    })
}

pub(super) fn lease_layout() -> Option<Layout> {
    layout_of(
        vec![
            col("Holder", "string", 0, "The holder of the lease"),
            age_col(),
        ],
        |o, now| vec![json!(str_at(o, &["spec", "holderIdentity"])), age(o, now)],
    )
}

pub(super) fn certificate_signing_request_layout() -> Option<Layout> {
    layout_of(
        vec![
            age_col(),
            col(
                "SignerName",
                "string",
                0,
                "Only present if the signerName is set",
            ),
            col("Requestor", "string", 0, "Name of requestor"),
            col(
                "RequestedDuration",
                "string",
                0,
                "Only present if the expirationSeconds is set",
            ),
            col("Condition", "string", 0, "Condition of the resource"),
        ],
        csr_cells,
    )
}
