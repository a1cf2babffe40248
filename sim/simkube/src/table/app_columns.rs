//! Column definitions of the workloads', storage, policy and access kinds' Tables, after
//! kube-apiserver's printers.

#[allow(clippy::wildcard_imports)]
use super::*;

pub(super) fn deployment_layout() -> Option<Layout> {
    layout_of(
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
    )
}

pub(super) fn replica_set_layout() -> Option<Layout> {
    layout_of(
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
    )
}

pub(super) fn role_binding_layout() -> Option<Layout> {
    layout_of(
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
    )
}

pub(super) fn daemon_set_layout() -> Option<Layout> {
    layout_of(
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
    )
}

pub(super) fn stateful_set_layout() -> Option<Layout> {
    layout_of(
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
    )
}

pub(super) fn job_layout() -> Option<Layout> {
    layout_of(
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
    )
}

pub(super) fn cron_job_layout() -> Option<Layout> {
    layout_of(
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
    )
}

pub(super) fn persistent_volume_claim_layout() -> Option<Layout> {
    layout_of(
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
    )
}

pub(super) fn persistent_volume_layout() -> Option<Layout> {
    layout_of(
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
    )
}

pub(super) fn resource_quota_layout() -> Option<Layout> {
    layout_of(
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
    )
}

pub(super) fn network_policy_layout() -> Option<Layout> {
    layout_of(
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
    )
}

pub(super) fn ingress_layout() -> Option<Layout> {
    layout_of(
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
    )
}

pub(super) fn storage_class_layout() -> Option<Layout> {
    layout_of(
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
    )
}

pub(super) fn priority_class_layout() -> Option<Layout> {
    layout_of(
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
    )
}

pub(super) fn pod_disruption_budget_layout() -> Option<Layout> {
    layout_of(
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
    )
}

pub(super) fn webhook_configuration_layout() -> Option<Layout> {
    layout_of(
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
    )
}

pub(super) fn role_layout() -> Option<Layout> {
    layout_of(
        vec![PrinterColumn {
            format: String::new(),
            ..col("Created At", "date", 0, CREATION_DESCRIPTION)
        }],
        |o, _| vec![json!(str_at(o, &["metadata", "creationTimestamp"]))],
    )
}
