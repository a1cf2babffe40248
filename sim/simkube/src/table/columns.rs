//! Column definitions of the built-in kinds' Tables, after kube-apiserver's printers, with the function computing each kind's cells.

#[allow(clippy::wildcard_imports)]
use super::*;

pub(super) fn layout(group: &str, kind: &str) -> Option<Layout> {
    let l = |columns: Vec<PrinterColumn>, cells: CellFn| {
        Some(Layout {
            name_first: true,
            columns,
            cells,
        })
    };
    match (group, kind) {
        ("", "Pod") => l(
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
        ),
        ("", "Namespace") => l(
            vec![
                col("Status", "string", 0, "The status of the namespace"),
                age_col(),
            ],
            |o, now| vec![json!(str_at(o, &["status", "phase"])), age(o, now)],
        ),
        ("", "Service") => l(
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
        ),
        ("", "Node") => l(
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
        ),
        ("", "ConfigMap") => l(
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
        ),
        ("", "Secret") => l(
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
        ),
        ("", "ServiceAccount") => l(
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
        ),
        ("", "Endpoints") => l(
            vec![
                col("Endpoints", "string", 0, "Endpoints of the service"),
                age_col(),
            ],
            |o, now| vec![json!(endpoints_summary(o)), age(o, now)],
        ),
        ("discovery.k8s.io", "EndpointSlice") => l(
            vec![
                col("AddressType", "string", 0, "The IP protocol for this slice"),
                col("Ports", "string", 0, "The ports for this slice"),
                col("Endpoints", "string", 0, "The endpoints for this slice"),
                age_col(),
            ],
            endpointslice_cells,
        ),
        ("", "Event") | ("events.k8s.io", "Event") => Some(Layout {
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
        }),
        ("coordination.k8s.io", "Lease") => l(
            vec![
                col("Holder", "string", 0, "The holder of the lease"),
                age_col(),
            ],
            |o, now| vec![json!(str_at(o, &["spec", "holderIdentity"])), age(o, now)],
        ),
        ("certificates.k8s.io", "CertificateSigningRequest") => l(
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
        ),
        ("apps", "Deployment") => l(
            vec![
                col("Ready", "string", 0, "Number of the pod with ready state"),
                col(
                    "Up-to-date",
                    "integer",
                    0,
                    "Total number of non-terminated pods targeted by this deployment that have the desired template spec.",
                ),
                col(
                    "Available",
                    "integer",
                    0,
                    "Total number of available pods (ready for at least minReadySeconds) targeted by this deployment.",
                ),
                age_col(),
                col(
                    "Containers",
                    "string",
                    1,
                    "Names of each container in the template.",
                ),
                col(
                    "Images",
                    "string",
                    1,
                    "Images referenced by each container in the template.",
                ),
                col(
                    "Selector",
                    "string",
                    1,
                    "Label selector for pods. Existing ReplicaSets whose pods are selected by this will be the ones affected by this deployment.",
                ),
            ],
            deployment_cells,
        ),
        ("apps", "ReplicaSet") => l(
            vec![
                col(
                    "Desired",
                    "integer",
                    0,
                    "Replicas is the number of desired pods.",
                ),
                col(
                    "Current",
                    "integer",
                    0,
                    "Replicas is the most recently observed number of replicas.",
                ),
                col(
                    "Ready",
                    "integer",
                    0,
                    "The number of ready replicas for this replica set.",
                ),
                age_col(),
                col(
                    "Containers",
                    "string",
                    1,
                    "Names of each container in the template.",
                ),
                col(
                    "Images",
                    "string",
                    1,
                    "Images referenced by each container in the template.",
                ),
                col(
                    "Selector",
                    "string",
                    1,
                    "Selector is a label query over pods that should match the replica count.",
                ),
            ],
            replicaset_cells,
        ),
        ("rbac.authorization.k8s.io", "RoleBinding" | "ClusterRoleBinding") => l(
            vec![
                col("Role", "string", 0, "Role to which this binding refers"),
                age_col(),
                col("Users", "string", 1, "Users in the binding"),
                col("Groups", "string", 1, "Groups in the binding"),
                col(
                    "ServiceAccounts",
                    "string",
                    1,
                    "ServiceAccounts in the binding",
                ),
            ],
            binding_cells,
        ),
        ("apps", "DaemonSet") => l(
            vec![
                col(
                    "Desired",
                    "integer",
                    0,
                    "The desired number of nodes that should be running the daemon pod.",
                ),
                col(
                    "Current",
                    "integer",
                    0,
                    "The number of nodes that are running at least 1 daemon pod and are supposed to run the daemon pod.",
                ),
                col(
                    "Ready",
                    "integer",
                    0,
                    "The number of nodes that should be running the daemon pod and have one or more of the daemon pod running and ready.",
                ),
                col(
                    "Up-to-date",
                    "integer",
                    0,
                    "The total number of nodes that are running updated daemon pod",
                ),
                col(
                    "Available",
                    "integer",
                    0,
                    "The number of nodes that should be running the daemon pod and have one or more of the daemon pod running and available (ready for at least spec.minReadySeconds)",
                ),
                col(
                    "Node Selector",
                    "string",
                    0,
                    "NodeSelector is a selector which must be true for the pod to fit on a node.",
                ),
                age_col(),
                col(
                    "Containers",
                    "string",
                    1,
                    "Names of each container in the template.",
                ),
                col(
                    "Images",
                    "string",
                    1,
                    "Images referenced by each container in the template.",
                ),
                col(
                    "Selector",
                    "string",
                    1,
                    "A label query over pods that are managed by the daemon set.",
                ),
            ],
            daemonset_cells,
        ),
        ("apps", "StatefulSet") => l(
            vec![
                col("Ready", "string", 0, "Number of the pod with ready state"),
                age_col(),
                col(
                    "Containers",
                    "string",
                    1,
                    "Names of each container in the template.",
                ),
                col(
                    "Images",
                    "string",
                    1,
                    "Images referenced by each container in the template.",
                ),
            ],
            statefulset_cells,
        ),
        ("batch", "Job") => l(
            vec![
                col("Status", "string", 0, "Status of the job."),
                col(
                    "Completions",
                    "string",
                    0,
                    "The completion status of the job.",
                ),
                col(
                    "Duration",
                    "string",
                    0,
                    "Time required to complete the job.",
                ),
                age_col(),
                col(
                    "Containers",
                    "string",
                    1,
                    "Names of each container in the template.",
                ),
                col(
                    "Images",
                    "string",
                    1,
                    "Images referenced by each container in the template.",
                ),
                col(
                    "Selector",
                    "string",
                    1,
                    "A label query over pods that should match the pod count.",
                ),
            ],
            job_cells,
        ),
        ("batch", "CronJob") => l(
            vec![
                col(
                    "Schedule",
                    "string",
                    0,
                    "The schedule in Cron format, see https://en.wikipedia.org/wiki/Cron.",
                ),
                col(
                    "Timezone",
                    "string",
                    0,
                    "The time zone name for the given schedule.",
                ),
                col(
                    "Suspend",
                    "boolean",
                    0,
                    "This flag tells the controller to suspend subsequent executions.",
                ),
                col(
                    "Active",
                    "integer",
                    0,
                    "A list of pointers to currently running jobs.",
                ),
                col(
                    "Last Schedule",
                    "string",
                    0,
                    "Information when was the last time the job was successfully scheduled.",
                ),
                age_col(),
                col(
                    "Containers",
                    "string",
                    1,
                    "Names of each container in the template.",
                ),
                col(
                    "Images",
                    "string",
                    1,
                    "Images referenced by each container in the template.",
                ),
                col(
                    "Selector",
                    "string",
                    1,
                    "A label query over pods that should match the pod count.",
                ),
            ],
            cronjob_cells,
        ),
        ("", "PersistentVolumeClaim") => l(
            vec![
                col(
                    "Status",
                    "string",
                    0,
                    "Phase represents the current phase of PersistentVolumeClaim.",
                ),
                col(
                    "Volume",
                    "string",
                    0,
                    "volumeName is the binding reference to the PersistentVolume backing this claim.",
                ),
                col(
                    "Capacity",
                    "string",
                    0,
                    "capacity represents the actual resources of the underlying volume.",
                ),
                col(
                    "Access Modes",
                    "string",
                    0,
                    "accessModes contains the desired access modes the volume should have.",
                ),
                col(
                    "StorageClass",
                    "string",
                    0,
                    "storageClassName is the name of the StorageClass required by the claim.",
                ),
                col(
                    "VolumeAttributesClass",
                    "string",
                    0,
                    "currentVolumeAttributesClassName is the current name of the VolumeAttributesClass the PVC is using.",
                ),
                age_col(),
                col(
                    "VolumeMode",
                    "string",
                    1,
                    "volumeMode defines what type of volume is required by the claim.",
                ),
            ],
            pvc_cells,
        ),
        ("", "PersistentVolume") => l(
            vec![
                col(
                    "Capacity",
                    "string",
                    0,
                    "capacity is the description of the persistent volume's resources and capacity.",
                ),
                col(
                    "Access Modes",
                    "string",
                    0,
                    "accessModes contains all ways the volume can be mounted.",
                ),
                col(
                    "Reclaim Policy",
                    "string",
                    0,
                    "persistentVolumeReclaimPolicy defines what happens to a persistent volume when released from its claim.",
                ),
                col(
                    "Status",
                    "string",
                    0,
                    "phase indicates if a volume is available, bound to a claim, or released by a claim.",
                ),
                col(
                    "Claim",
                    "string",
                    0,
                    "claimRef is part of a bi-directional binding between PersistentVolume and PersistentVolumeClaim.",
                ),
                col(
                    "StorageClass",
                    "string",
                    0,
                    "storageClassName is the name of StorageClass to which this persistent volume belongs.",
                ),
                col(
                    "VolumeAttributesClass",
                    "string",
                    0,
                    "Name of VolumeAttributesClass to which this persistent volume belongs.",
                ),
                col(
                    "Reason",
                    "string",
                    0,
                    "reason is a brief CamelCase string that describes any failure.",
                ),
                age_col(),
                col(
                    "VolumeMode",
                    "string",
                    1,
                    "volumeMode defines if a volume is intended to be used with a formatted filesystem or to remain in raw block state.",
                ),
            ],
            pv_cells,
        ),
        ("", "ResourceQuota") => l(
            vec![
                age_col(),
                col(
                    "Request",
                    "string",
                    0,
                    "Request represents a minimum amount of cpu/memory that a container may consume.",
                ),
                col(
                    "Limit",
                    "string",
                    0,
                    "Limits control the maximum amount of cpu/memory that a container may use independent of contention on the node.",
                ),
            ],
            quota_cells,
        ),
        ("networking.k8s.io", "NetworkPolicy") => l(
            vec![
                col(
                    "Pod-Selector",
                    "string",
                    0,
                    "podSelector selects the pods to which this NetworkPolicy object applies.",
                ),
                age_col(),
            ],
            |o, now| {
                vec![
                    json!(format_label_selector(at(o, &["spec", "podSelector"]))),
                    age(o, now),
                ]
            },
        ),
        ("networking.k8s.io", "Ingress") => l(
            vec![
                col(
                    "Class",
                    "string",
                    0,
                    "The name of the IngressClass resource.",
                ),
                col(
                    "Hosts",
                    "string",
                    0,
                    "Hosts that incoming requests are matched against before the ingress rule",
                ),
                col(
                    "Address",
                    "string",
                    0,
                    "Address is a list containing ingress points for the load-balancer",
                ),
                col(
                    "Ports",
                    "string",
                    0,
                    "Ports of TLS configurations that open",
                ),
                age_col(),
            ],
            ingress_cells,
        ),
        ("storage.k8s.io", "StorageClass") => l(
            vec![
                col(
                    "Provisioner",
                    "string",
                    0,
                    "provisioner indicates the type of the provisioner.",
                ),
                col(
                    "ReclaimPolicy",
                    "string",
                    0,
                    "reclaimPolicy controls the reclaimPolicy for dynamically provisioned PersistentVolumes of this storage class.",
                ),
                col(
                    "VolumeBindingMode",
                    "string",
                    0,
                    "volumeBindingMode indicates how PersistentVolumeClaims should be provisioned and bound.",
                ),
                col(
                    "AllowVolumeExpansion",
                    "string",
                    0,
                    "allowVolumeExpansion shows whether the storage class allow volume expand.",
                ),
                age_col(),
            ],
            storageclass_cells,
        ),
        ("scheduling.k8s.io", "PriorityClass") => l(
            vec![
                col(
                    "Value",
                    "integer",
                    0,
                    "value represents the integer value of this priority class.",
                ),
                col(
                    "Global-Default",
                    "boolean",
                    0,
                    "globalDefault specifies whether this PriorityClass should be considered as the default priority for pods that do not have any priority class.",
                ),
                age_col(),
                col(
                    "PreemptionPolicy",
                    "string",
                    0,
                    "preemptionPolicy is the Policy for preempting pods with lower priority.",
                ),
            ],
            |o, now| {
                vec![
                    json!(int_at(o, &["value"])),
                    json!(
                        o.get("globalDefault")
                            .and_then(Value::as_bool)
                            .unwrap_or(false)
                    ),
                    age(o, now),
                    json!(match str_at(o, &["preemptionPolicy"]) {
                        "" => "PreemptLowerPriority",
                        p => p,
                    }),
                ]
            },
        ),
        ("policy", "PodDisruptionBudget") => l(
            vec![
                col(
                    "Min Available",
                    "string",
                    0,
                    "The minimum number of pods that must be available simultaneously.",
                ),
                col(
                    "Max Unavailable",
                    "string",
                    0,
                    "The maximum number of pods that may be unavailable simultaneously.",
                ),
                col(
                    "Allowed Disruptions",
                    "integer",
                    0,
                    "Calculation of the current number of pods that may be disrupted.",
                ),
                age_col(),
            ],
            |o, now| {
                let int_or_string = |v: Option<&Value>| match v {
                    Some(Value::String(s)) => s.clone(),
                    Some(Value::Number(n)) => n.to_string(),
                    _ => "N/A".to_owned(),
                };
                vec![
                    json!(int_or_string(o.pointer("/spec/minAvailable"))),
                    json!(int_or_string(o.pointer("/spec/maxUnavailable"))),
                    json!(int_at(o, &["status", "disruptionsAllowed"])),
                    age(o, now),
                ]
            },
        ),
        (
            "admissionregistration.k8s.io",
            "MutatingWebhookConfiguration" | "ValidatingWebhookConfiguration",
        ) => l(
            vec![
                col(
                    "Webhooks",
                    "integer",
                    0,
                    "Webhooks indicates the number of webhooks in the configuration.",
                ),
                age_col(),
            ],
            |o, now| vec![json!(len_at(o, &["webhooks"])), age(o, now)],
        ),
        ("rbac.authorization.k8s.io", "Role" | "ClusterRole") => l(
            vec![PrinterColumn {
                format: String::new(),
                ..col("Created At", "date", 0, CREATION_DESCRIPTION)
            }],
            |o, _| vec![json!(str_at(o, &["metadata", "creationTimestamp"]))],
        ),
        _ => None,
    }
}
