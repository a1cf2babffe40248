//! Server-side printing: `meta.k8s.io/v1` Table output for kubectl, per kind as the real server.
//!
//! kubectl asks for Tables (`Accept: application/json;as=Table;v=v1;g=meta.k8s.io`) on `get`,
//! and prints the server's columns verbatim. So the columns and the computed cells (pod READY
//! and STATUS, service PORT(S), node ROLES, ages) follow kube-apiserver's printers, and CRDs
//! follow the apiextensions table convertor (`additionalPrinterColumns` evaluated by JSONPath,
//! `date` columns shown as ages).

use jiff::Timestamp;
use serde_json::{Map, Value, json};

use crate::registry::{Origin, PrinterColumn, ResourceType};

/// What each Table row carries in `object` (`includeObject` query parameter).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IncludeObject {
    /// No object.
    None,
    /// A `PartialObjectMetadata` (kubectl's default: it needs labels and namespace).
    #[default]
    Metadata,
    /// The full object.
    Object,
}

impl IncludeObject {
    /// Parses the `includeObject` query value; absent or unknown means the default, `Metadata`.
    pub fn parse(query_value: Option<&str>) -> IncludeObject {
        match query_value {
            Some("None") => IncludeObject::None,
            Some("Object") => IncludeObject::Object,
            _ => IncludeObject::Metadata,
        }
    }
}

const NAME_DESCRIPTION: &str = "Name must be unique within a namespace. Is required when creating \
    resources, although some resources may allow a client to request the generation of a name \
    automatically. Name is primarily intended for creation idempotence and configuration \
    definition. Cannot be updated. More info: \
    https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names";

const CREATION_DESCRIPTION: &str = "CreationTimestamp is a timestamp representing the server time \
    when this object was created. It is not guaranteed to be set in happens-before order across \
    separate operations. Clients may not set this value. It is represented in RFC3339 form and is \
    in UTC.";

fn col(name: &str, type_: &str, priority: i32, description: &str) -> PrinterColumn {
    PrinterColumn {
        name: name.to_owned(),
        type_: type_.to_owned(),
        format: String::new(),
        description: description.to_owned(),
        priority,
        json_path: String::new(),
    }
}

fn age_col() -> PrinterColumn {
    col("Age", "string", 0, CREATION_DESCRIPTION)
}

/// Computes a built-in kind's cells after NAME (for Events: all cells), at time `now`.
type CellFn = fn(&Value, Timestamp) -> Vec<Value>;

/// How a built-in kind prints: whether NAME leads (Events put it last, at priority 1), the
/// columns after it and the function computing their cells.
struct Layout {
    name_first: bool,
    columns: Vec<PrinterColumn>,
    cells: CellFn,
}

fn layout(group: &str, kind: &str) -> Option<Layout> {
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

/// The column definitions after NAME for a built-in kind, as its Table prints them (empty: the
/// default convertor's NAME, CREATED AT). For Events, whose NAME is a wide column at the end,
/// every column is listed.
pub fn builtin_columns(group: &str, kind: &str) -> Vec<PrinterColumn> {
    layout(group, kind).map(|l| l.columns).unwrap_or_default()
}

/// The full column list of a type, NAME included, and how to compute a row's cells.
enum Printer {
    Builtin(Layout),
    /// NAME then the type's printer columns by JSONPath (CRDs).
    Columns(Vec<PrinterColumn>),
    /// kube-apiserver's default convertor: NAME, Created At.
    Default,
}

fn printer(rt: &ResourceType) -> Printer {
    if rt.origin == Origin::Builtin {
        return match layout(&rt.group, &rt.kind) {
            Some(l) => Printer::Builtin(l),
            None => Printer::Default,
        };
    }
    if rt.printer_columns.is_empty() {
        Printer::Default
    } else {
        Printer::Columns(rt.printer_columns.clone())
    }
}

fn name_col() -> PrinterColumn {
    PrinterColumn {
        format: "name".to_owned(),
        ..col("Name", "string", 0, NAME_DESCRIPTION)
    }
}

fn definitions(p: &Printer) -> Vec<Value> {
    let cols: Vec<PrinterColumn> = match p {
        Printer::Builtin(l) if l.name_first => std::iter::once(name_col())
            .chain(l.columns.clone())
            .collect(),
        Printer::Builtin(l) => l.columns.clone(),
        Printer::Columns(c) => std::iter::once(name_col())
            .chain(c.iter().cloned())
            .collect(),
        Printer::Default => vec![
            name_col(),
            col("Created At", "date", 0, CREATION_DESCRIPTION),
        ],
    };
    cols.iter()
        .map(|c| {
            json!({
                "name": c.name,
                "type": c.type_,
                "format": c.format,
                "description": c.description,
                "priority": c.priority,
            })
        })
        .collect()
}

fn cells(p: &Printer, obj: &Value, now: Timestamp) -> Vec<Value> {
    let name = json!(str_at(obj, &["metadata", "name"]));
    match p {
        Printer::Builtin(l) if l.name_first => std::iter::once(builtin_name(obj))
            .chain((l.cells)(obj, now))
            .collect(),
        Printer::Builtin(l) => (l.cells)(obj, now),
        Printer::Columns(cols) => std::iter::once(name)
            .chain(cols.iter().map(|c| column_cell(c, obj, now)))
            .collect(),
        Printer::Default => vec![name, json!(str_at(obj, &["metadata", "creationTimestamp"]))],
    }
}

/// NAME of a built-in object; the default StorageClass is marked as kubectl users know it.
fn builtin_name(obj: &Value) -> Value {
    let name = str_at(obj, &["metadata", "name"]);
    let default_class = [
        "storageclass.kubernetes.io/is-default-class",
        "storageclass.beta.kubernetes.io/is-default-class",
    ]
    .iter()
    .any(|a| {
        obj.pointer("/metadata/annotations")
            .and_then(|m| m.get(*a))
            .and_then(Value::as_str)
            == Some("true")
    });
    if default_class {
        json!(format!("{name} (default)"))
    } else {
        json!(name)
    }
}

fn row_value(p: &Printer, obj: &Value, include: IncludeObject, now: Timestamp) -> Value {
    let mut row = Map::new();
    row.insert("cells".into(), Value::Array(cells(p, obj, now)));
    match include {
        IncludeObject::None => {}
        IncludeObject::Metadata => {
            row.insert("object".into(), partial_metadata(obj));
        }
        IncludeObject::Object => {
            row.insert("object".into(), obj.clone());
        }
    }
    Value::Object(row)
}

/// `PartialObjectMetadata` of an object: what kubectl needs for labels and namespaces.
pub fn partial_metadata(obj: &Value) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj.get("metadata").cloned().unwrap_or_else(|| json!({})),
    })
}

/// A Table of `objects`, with `list_metadata` (`resourceVersion`, `continue`,
/// `remainingItemCount`) as the Table's metadata. Ages are relative to the current time.
pub fn to_table(
    rt: &ResourceType,
    objects: &[Value],
    include: IncludeObject,
    list_metadata: Value,
) -> Value {
    to_table_at(rt, objects, include, list_metadata, Timestamp::now())
}

/// [`to_table`] with ages relative to `now`, for reproducible output.
pub fn to_table_at(
    rt: &ResourceType,
    objects: &[Value],
    include: IncludeObject,
    list_metadata: Value,
    now: Timestamp,
) -> Value {
    let p = printer(rt);
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": list_metadata,
        "columnDefinitions": definitions(&p),
        "rows": objects.iter().map(|o| row_value(&p, o, include, now)).collect::<Vec<_>>(),
    })
}

/// A one-row Table for a single GET or a watch event (ADDED, MODIFIED and DELETED alike), with
/// the column definitions repeated so every event stands alone.
pub fn row(rt: &ResourceType, obj: &Value, include: IncludeObject) -> Value {
    row_at(rt, obj, include, Timestamp::now())
}

/// [`row`] with ages relative to `now`.
pub fn row_at(rt: &ResourceType, obj: &Value, include: IncludeObject, now: Timestamp) -> Value {
    let rv = obj
        .pointer("/metadata/resourceVersion")
        .cloned()
        .unwrap_or(Value::Null);
    let meta = if rv.is_null() {
        json!({})
    } else {
        json!({ "resourceVersion": rv })
    };
    to_table_at(rt, std::slice::from_ref(obj), include, meta, now)
}

// ---------------------------------------------------------------------------------------------
// Small accessors.

fn at<'a>(obj: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(obj, |v, k| v.get(*k))
}

fn str_at<'a>(obj: &'a Value, path: &[&str]) -> &'a str {
    at(obj, path).and_then(Value::as_str).unwrap_or("")
}

fn int_at(obj: &Value, path: &[&str]) -> i64 {
    at(obj, path).and_then(Value::as_i64).unwrap_or(0)
}

fn len_at(obj: &Value, path: &[&str]) -> usize {
    match at(obj, path) {
        Some(Value::Object(m)) => m.len(),
        Some(Value::Array(a)) => a.len(),
        _ => 0,
    }
}

fn arr<'a>(obj: &'a Value, path: &[&str]) -> &'a [Value] {
    at(obj, path)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

fn or_none(s: String) -> String {
    if s.is_empty() { "<none>".to_owned() } else { s }
}

fn parse_time(s: &str) -> Option<Timestamp> {
    s.parse::<Timestamp>().ok()
}

/// kube-apiserver's AGE cell: `<unknown>` without a creation timestamp.
fn age(obj: &Value, now: Timestamp) -> Value {
    json!(since(str_at(obj, &["metadata", "creationTimestamp"]), now))
}

fn since(timestamp: &str, now: Timestamp) -> String {
    match parse_time(timestamp) {
        Some(t) => human_duration(now.as_second() - t.as_second()),
        None => "<unknown>".to_owned(),
    }
}

/// apimachinery's `duration.HumanDuration`: precision shrinks as the duration grows.
pub fn human_duration(seconds: i64) -> String {
    if seconds < -1 {
        return "<invalid>".to_owned();
    }
    if seconds < 0 {
        return "0s".to_owned();
    }
    if seconds < 120 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        let s = seconds % 60;
        return if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        };
    }
    if minutes < 180 {
        return format!("{minutes}m");
    }
    let hours = seconds / 3600;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 {
            format!("{}d", hours / 24)
        } else {
            format!("{}d{h}h", hours / 24)
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        let dy = (hours / 24) % 365;
        return if dy == 0 {
            format!("{}y", hours / 24 / 365)
        } else {
            format!("{}y{dy}d", hours / 24 / 365)
        };
    }
    format!("{}y", hours / 24 / 365)
}

/// `k=v,k2=v2` sorted by key, as `labels.FormatLabels`.
fn format_labels(map: Option<&Value>) -> String {
    let Some(Value::Object(m)) = map else {
        return String::new();
    };
    let mut pairs: Vec<String> = m
        .iter()
        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
        .collect();
    pairs.sort();
    pairs.join(",")
}

/// `metav1.FormatLabelSelector`: match labels, then expressions.
fn format_label_selector(sel: Option<&Value>) -> String {
    let Some(sel) = sel else {
        return "<none>".to_owned();
    };
    let mut parts = Vec::new();
    if let Some(Value::Object(m)) = sel.get("matchLabels") {
        let mut keys: Vec<&String> = m.keys().collect();
        keys.sort();
        for k in keys {
            parts.push(format!("{k}={}", m[k].as_str().unwrap_or_default()));
        }
    }
    for e in arr(sel, &["matchExpressions"]) {
        let key = str_at(e, &["key"]);
        let values: Vec<&str> = arr(e, &["values"])
            .iter()
            .filter_map(Value::as_str)
            .collect();
        let part = match str_at(e, &["operator"]) {
            "In" => format!("{key} in ({})", values.join(",")),
            "NotIn" => format!("{key} notin ({})", values.join(",")),
            "Exists" => key.to_owned(),
            "DoesNotExist" => format!("!{key}"),
            op => format!("{key} {op} ({})", values.join(",")),
        };
        parts.push(part);
    }
    if parts.is_empty() {
        "<none>".to_owned()
    } else {
        parts.join(",")
    }
}

// ---------------------------------------------------------------------------------------------
// Per-kind cells, after kube-apiserver's `pkg/printers/internalversion`.

fn pod_cells(pod: &Value, now: Timestamp) -> Vec<Value> {
    let containers = arr(pod, &["spec", "containers"]);
    let mut total = containers.len();
    let mut ready = 0usize;
    let mut restarts = 0i64;
    let mut last_restart: Option<Timestamp> = None;
    let mut reason = str_at(pod, &["status", "phase"]).to_owned();
    if !str_at(pod, &["status", "reason"]).is_empty() {
        reason = str_at(pod, &["status", "reason"]).to_owned();
    }
    let note_restart = |cs: &Value, restarts: &mut i64, last: &mut Option<Timestamp>| {
        *restarts += int_at(cs, &["restartCount"]);
        if let Some(t) = parse_time(str_at(cs, &["lastState", "terminated", "finishedAt"]))
            && last.is_none_or(|l| t > l)
        {
            *last = Some(t);
        }
    };

    // Sidecars (restartable init containers) count as containers.
    let sidecars: Vec<&str> = arr(pod, &["spec", "initContainers"])
        .iter()
        .filter(|c| str_at(c, &["restartPolicy"]) == "Always")
        .map(|c| str_at(c, &["name"]))
        .collect();
    total += sidecars.len();

    let init_statuses = arr(pod, &["status", "initContainerStatuses"]);
    let init_total = arr(pod, &["spec", "initContainers"]).len();
    let mut initializing = false;
    for (i, cs) in init_statuses.iter().enumerate() {
        note_restart(cs, &mut restarts, &mut last_restart);
        let is_sidecar = sidecars.contains(&str_at(cs, &["name"]));
        if is_sidecar && cs.get("started").and_then(Value::as_bool) == Some(true) {
            if cs.get("ready").and_then(Value::as_bool) == Some(true) {
                ready += 1;
            }
            continue;
        }
        let term = at(cs, &["state", "terminated"]);
        if let Some(t) = term
            && int_at(t, &["exitCode"]) == 0
        {
            continue;
        }
        if let Some(t) = term {
            reason = if !str_at(t, &["reason"]).is_empty() {
                format!("Init:{}", str_at(t, &["reason"]))
            } else if int_at(t, &["signal"]) != 0 {
                format!("Init:Signal:{}", int_at(t, &["signal"]))
            } else {
                format!("Init:ExitCode:{}", int_at(t, &["exitCode"]))
            };
        } else if let Some(w) = at(cs, &["state", "waiting"])
            && !str_at(w, &["reason"]).is_empty()
            && str_at(w, &["reason"]) != "PodInitializing"
        {
            reason = format!("Init:{}", str_at(w, &["reason"]));
        } else {
            reason = format!("Init:{i}/{init_total}");
        }
        initializing = true;
        break;
    }

    if !initializing {
        restarts = 0;
        last_restart = None;
        for cs in init_statuses {
            if sidecars.contains(&str_at(cs, &["name"])) {
                note_restart(cs, &mut restarts, &mut last_restart);
            }
        }
        let mut has_running = false;
        for cs in arr(pod, &["status", "containerStatuses"]).iter().rev() {
            note_restart(cs, &mut restarts, &mut last_restart);
            if let Some(w) = at(cs, &["state", "waiting"])
                && !str_at(w, &["reason"]).is_empty()
            {
                reason = str_at(w, &["reason"]).to_owned();
            } else if let Some(t) = at(cs, &["state", "terminated"]) {
                reason = if !str_at(t, &["reason"]).is_empty() {
                    str_at(t, &["reason"]).to_owned()
                } else if int_at(t, &["signal"]) != 0 {
                    format!("Signal:{}", int_at(t, &["signal"]))
                } else {
                    format!("ExitCode:{}", int_at(t, &["exitCode"]))
                };
            } else if at(cs, &["state", "running"]).is_some()
                && cs.get("ready").and_then(Value::as_bool) == Some(true)
            {
                has_running = true;
                ready += 1;
            }
        }
        if reason == "Completed" && has_running {
            let pod_ready = arr(pod, &["status", "conditions"])
                .iter()
                .any(|c| str_at(c, &["type"]) == "Ready" && str_at(c, &["status"]) == "True");
            reason = if pod_ready {
                "Running".to_owned()
            } else {
                "NotReady".to_owned()
            };
        }
    }

    if pod
        .pointer("/metadata/deletionTimestamp")
        .is_some_and(|v| !v.is_null())
    {
        reason = if str_at(pod, &["status", "reason"]) == "NodeLost" {
            "Unknown".to_owned()
        } else {
            "Terminating".to_owned()
        };
    }

    let restarts_cell = match last_restart {
        Some(t) if restarts > 0 => {
            format!(
                "{restarts} ({} ago)",
                human_duration(now.as_second() - t.as_second())
            )
        }
        _ => restarts.to_string(),
    };

    let gates = arr(pod, &["spec", "readinessGates"]);
    let gates_cell = if gates.is_empty() {
        "<none>".to_owned()
    } else {
        let conditions = arr(pod, &["status", "conditions"]);
        let true_gates = gates
            .iter()
            .filter(|g| {
                conditions.iter().any(|c| {
                    str_at(c, &["type"]) == str_at(g, &["conditionType"])
                        && str_at(c, &["status"]) == "True"
                })
            })
            .count();
        format!("{true_gates}/{}", gates.len())
    };

    vec![
        json!(format!("{ready}/{total}")),
        json!(reason),
        json!(restarts_cell),
        age(pod, now),
        json!(or_none(str_at(pod, &["status", "podIP"]).to_owned())),
        json!(or_none(str_at(pod, &["spec", "nodeName"]).to_owned())),
        json!(or_none(
            str_at(pod, &["status", "nominatedNodeName"]).to_owned()
        )),
        json!(gates_cell),
    ]
}

fn service_cells(svc: &Value, now: Timestamp) -> Vec<Value> {
    let type_ = match str_at(svc, &["spec", "type"]) {
        "" => "ClusterIP",
        t => t,
    };
    let external_ips: Vec<&str> = arr(svc, &["spec", "externalIPs"])
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let external = match type_ {
        "ClusterIP" | "NodePort" => or_none(external_ips.join(",")),
        "LoadBalancer" => {
            let mut ips: Vec<String> = arr(svc, &["status", "loadBalancer", "ingress"])
                .iter()
                .map(|i| {
                    let ip = str_at(i, &["ip"]);
                    if ip.is_empty() {
                        str_at(i, &["hostname"]).to_owned()
                    } else {
                        ip.to_owned()
                    }
                })
                .filter(|s| !s.is_empty())
                .collect();
            ips.extend(external_ips.iter().map(|s| (*s).to_owned()));
            if ips.is_empty() {
                "<pending>".to_owned()
            } else {
                ips.join(",")
            }
        }
        "ExternalName" => str_at(svc, &["spec", "externalName"]).to_owned(),
        _ => "<unknown>".to_owned(),
    };
    let ports: Vec<String> = arr(svc, &["spec", "ports"])
        .iter()
        .map(|p| {
            let proto = match str_at(p, &["protocol"]) {
                "" => "TCP",
                x => x,
            };
            let port = int_at(p, &["port"]);
            match int_at(p, &["nodePort"]) {
                0 => format!("{port}/{proto}"),
                np => format!("{port}:{np}/{proto}"),
            }
        })
        .collect();
    vec![
        json!(type_),
        json!(or_none(str_at(svc, &["spec", "clusterIP"]).to_owned())),
        json!(external),
        json!(or_none(ports.join(","))),
        age(svc, now),
        json!(or_none(format_labels(at(svc, &["spec", "selector"])))),
    ]
}

fn node_cells(node: &Value, now: Timestamp) -> Vec<Value> {
    let mut status: Vec<String> = Vec::new();
    match arr(node, &["status", "conditions"])
        .iter()
        .find(|c| str_at(c, &["type"]) == "Ready")
    {
        Some(c) if str_at(c, &["status"]) == "True" => status.push("Ready".into()),
        Some(c) if str_at(c, &["status"]) == "False" => status.push("NotReady".into()),
        _ => status.push("Unknown".into()),
    }
    if node.pointer("/spec/unschedulable").and_then(Value::as_bool) == Some(true) {
        status.push("SchedulingDisabled".into());
    }
    let mut roles: Vec<String> = Vec::new();
    if let Some(Value::Object(labels)) = node.pointer("/metadata/labels") {
        for (k, v) in labels {
            if let Some(role) = k.strip_prefix("node-role.kubernetes.io/") {
                if !role.is_empty() {
                    roles.push(role.to_owned());
                }
            } else if k == "kubernetes.io/role" && v.as_str().is_some_and(|s| !s.is_empty()) {
                roles.push(v.as_str().unwrap_or_default().to_owned());
            }
        }
    }
    roles.sort();
    roles.dedup();
    let address = |kind: &str| {
        or_none(
            arr(node, &["status", "addresses"])
                .iter()
                .find(|a| str_at(a, &["type"]) == kind)
                .map(|a| str_at(a, &["address"]).to_owned())
                .unwrap_or_default(),
        )
    };
    let info = |field: &str| {
        let v = str_at(node, &["status", "nodeInfo", field]);
        if v.is_empty() {
            "<unknown>".to_owned()
        } else {
            v.to_owned()
        }
    };
    vec![
        json!(status.join(",")),
        json!(or_none(roles.join(","))),
        age(node, now),
        json!(str_at(node, &["status", "nodeInfo", "kubeletVersion"])),
        json!(address("InternalIP")),
        json!(address("ExternalIP")),
        json!(info("osImage")),
        json!(info("kernelVersion")),
        json!(info("containerRuntimeVersion")),
    ]
}

/// The first three endpoints then `+ N more...`, as kube-apiserver shortens them.
fn summarize(list: Vec<String>) -> String {
    const MAX: usize = 3;
    if list.is_empty() {
        return "<none>".to_owned();
    }
    if list.len() > MAX {
        return format!("{} + {} more...", list[..MAX].join(","), list.len() - MAX);
    }
    list.join(",")
}

fn endpoints_summary(ep: &Value) -> String {
    let mut list = Vec::new();
    for subset in arr(ep, &["subsets"]) {
        let ports = arr(subset, &["ports"]);
        for addr in arr(subset, &["addresses"]) {
            let ip = str_at(addr, &["ip"]);
            if ports.is_empty() {
                list.push(ip.to_owned());
            }
            for p in ports {
                list.push(format!("{ip}:{}", int_at(p, &["port"])));
            }
        }
    }
    summarize(list)
}

fn endpointslice_cells(slice: &Value, now: Timestamp) -> Vec<Value> {
    let ports: Vec<String> = arr(slice, &["ports"])
        .iter()
        .map(|p| match p.get("port").and_then(Value::as_i64) {
            Some(n) => n.to_string(),
            None => "<unset>".to_owned(),
        })
        .collect();
    let addresses: Vec<String> = arr(slice, &["endpoints"])
        .iter()
        .flat_map(|e| {
            arr(e, &["addresses"])
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
        })
        .collect();
    let ports_cell = if arr(slice, &["ports"]).is_empty() {
        "<unset>".to_owned()
    } else if ports.len() > 3 {
        format!("{} + {} more...", ports[..3].join(","), ports.len() - 3)
    } else {
        ports.join(",")
    };
    vec![
        json!(str_at(slice, &["addressType"])),
        json!(ports_cell),
        json!(summarize(addresses)),
        age(slice, now),
    ]
}

/// Cells of an Event in either API: `regarding`/`note`/`reportingController` (events.k8s.io) or
/// `involvedObject`/`message`/`source` (core).
struct EventView<'a> {
    obj: &'a Value,
    target: &'a Value,
    message: &'a str,
    first: &'a str,
    last: &'a str,
    count: Option<i64>,
    source: String,
}

fn event_cells(e: EventView<'_>, now: Timestamp) -> Vec<Value> {
    let obj = e.obj;
    let micro = str_at(obj, &["eventTime"]);
    let first = if e.first.is_empty() {
        since(micro, now)
    } else {
        since(e.first, now)
    };
    let mut last = if e.last.is_empty() {
        first.clone()
    } else {
        since(e.last, now)
    };
    let mut count = e.count.filter(|c| *c != 0).unwrap_or(1);
    if let Some(series) = obj.get("series").filter(|s| s.is_object()) {
        last = since(str_at(series, &["lastObservedTime"]), now);
        count = int_at(series, &["count"]);
    }
    let kind = str_at(e.target, &["kind"]).to_ascii_lowercase();
    let name = str_at(e.target, &["name"]);
    let target = if name.is_empty() {
        kind
    } else {
        format!("{kind}/{name}")
    };
    vec![
        json!(last),
        json!(str_at(obj, &["type"])),
        json!(str_at(obj, &["reason"])),
        json!(target),
        json!(str_at(e.target, &["fieldPath"])),
        json!(e.source),
        json!(e.message.trim()),
        json!(first),
        json!(count),
        json!(str_at(obj, &["metadata", "name"])),
    ]
}

fn event_source(component: &str, host: &str) -> String {
    if host.is_empty() {
        component.to_owned()
    } else {
        format!("{component}, {host}")
    }
}

fn core_event_cells(ev: &Value, now: Timestamp) -> Vec<Value> {
    let component = match str_at(ev, &["source", "component"]) {
        "" => str_at(ev, &["reportingComponent"]),
        c => c,
    };
    let host = match str_at(ev, &["source", "host"]) {
        "" => str_at(ev, &["reportingInstance"]),
        h => h,
    };
    event_cells(
        EventView {
            obj: ev,
            target: ev.get("involvedObject").unwrap_or(&Value::Null),
            message: str_at(ev, &["message"]),
            first: str_at(ev, &["firstTimestamp"]),
            last: str_at(ev, &["lastTimestamp"]),
            count: ev.get("count").and_then(Value::as_i64),
            source: event_source(component, host),
        },
        now,
    )
}

fn events_event_cells(ev: &Value, now: Timestamp) -> Vec<Value> {
    let component = match str_at(ev, &["deprecatedSource", "component"]) {
        "" => str_at(ev, &["reportingController"]),
        c => c,
    };
    let host = match str_at(ev, &["deprecatedSource", "host"]) {
        "" => str_at(ev, &["reportingInstance"]),
        h => h,
    };
    event_cells(
        EventView {
            obj: ev,
            target: ev.get("regarding").unwrap_or(&Value::Null),
            message: str_at(ev, &["note"]),
            first: str_at(ev, &["deprecatedFirstTimestamp"]),
            last: str_at(ev, &["deprecatedLastTimestamp"]),
            count: ev.get("deprecatedCount").and_then(Value::as_i64),
            source: event_source(component, host),
        },
        now,
    )
}

fn csr_cells(csr: &Value, now: Timestamp) -> Vec<Value> {
    let signer = or_none(str_at(csr, &["spec", "signerName"]).to_owned());
    let duration = match csr
        .pointer("/spec/expirationSeconds")
        .and_then(Value::as_i64)
    {
        Some(s) => human_duration(s),
        None => "<none>".to_owned(),
    };
    let mut conditions: Vec<String> = Vec::new();
    for c in arr(csr, &["status", "conditions"]) {
        let t = str_at(c, &["type"]);
        if !t.is_empty() && str_at(c, &["status"]) != "False" {
            conditions.push(t.to_owned());
        }
    }
    if csr
        .pointer("/status/certificate")
        .and_then(Value::as_str)
        .is_some_and(|s| !s.is_empty())
    {
        conditions.push("Issued".to_owned());
    }
    conditions.sort();
    let condition = if conditions.is_empty() {
        "Pending".to_owned()
    } else {
        conditions.join(",")
    };
    vec![
        age(csr, now),
        json!(signer),
        json!(str_at(csr, &["spec", "username"])),
        json!(duration),
        json!(condition),
    ]
}

fn template_summary(obj: &Value) -> (String, String) {
    let containers = arr(obj, &["spec", "template", "spec", "containers"]);
    let names: Vec<&str> = containers.iter().map(|c| str_at(c, &["name"])).collect();
    let images: Vec<&str> = containers.iter().map(|c| str_at(c, &["image"])).collect();
    (names.join(","), images.join(","))
}

fn deployment_cells(d: &Value, now: Timestamp) -> Vec<Value> {
    let desired = d
        .pointer("/spec/replicas")
        .and_then(Value::as_i64)
        .unwrap_or(1);
    let (names, images) = template_summary(d);
    vec![
        json!(format!(
            "{}/{desired}",
            int_at(d, &["status", "readyReplicas"])
        )),
        json!(int_at(d, &["status", "updatedReplicas"])),
        json!(int_at(d, &["status", "availableReplicas"])),
        age(d, now),
        json!(names),
        json!(images),
        json!(format_label_selector(at(d, &["spec", "selector"]))),
    ]
}

fn replicaset_cells(rs: &Value, now: Timestamp) -> Vec<Value> {
    let desired = rs
        .pointer("/spec/replicas")
        .and_then(Value::as_i64)
        .unwrap_or(1);
    let (names, images) = template_summary(rs);
    vec![
        json!(desired),
        json!(int_at(rs, &["status", "replicas"])),
        json!(int_at(rs, &["status", "readyReplicas"])),
        age(rs, now),
        json!(names),
        json!(images),
        json!(format_label_selector(at(rs, &["spec", "selector"]))),
    ]
}

fn daemonset_cells(ds: &Value, now: Timestamp) -> Vec<Value> {
    let (names, images) = template_summary(ds);
    vec![
        json!(int_at(ds, &["status", "desiredNumberScheduled"])),
        json!(int_at(ds, &["status", "currentNumberScheduled"])),
        json!(int_at(ds, &["status", "numberReady"])),
        json!(int_at(ds, &["status", "updatedNumberScheduled"])),
        json!(int_at(ds, &["status", "numberAvailable"])),
        json!(or_none(format_labels(at(
            ds,
            &["spec", "template", "spec", "nodeSelector"]
        )))),
        age(ds, now),
        json!(names),
        json!(images),
        json!(format_label_selector(at(ds, &["spec", "selector"]))),
    ]
}

fn statefulset_cells(sts: &Value, now: Timestamp) -> Vec<Value> {
    let desired = sts
        .pointer("/spec/replicas")
        .and_then(Value::as_i64)
        .unwrap_or(1);
    let (names, images) = template_summary(sts);
    vec![
        json!(format!(
            "{}/{desired}",
            int_at(sts, &["status", "readyReplicas"])
        )),
        age(sts, now),
        json!(names),
        json!(images),
    ]
}

fn condition_true(obj: &Value, ty: &str) -> bool {
    arr(obj, &["status", "conditions"])
        .iter()
        .any(|c| str_at(c, &["type"]) == ty && str_at(c, &["status"]) == "True")
}

fn job_cells(job: &Value, now: Timestamp) -> Vec<Value> {
    let succeeded = int_at(job, &["status", "succeeded"]);
    let completions = match job.pointer("/spec/completions").and_then(Value::as_i64) {
        Some(c) => format!("{succeeded}/{c}"),
        None => match job.pointer("/spec/parallelism").and_then(Value::as_i64) {
            Some(p) if p > 1 => format!("{succeeded}/1 of {p}"),
            _ => format!("{succeeded}/1"),
        },
    };
    let status = if condition_true(job, "Complete") {
        "Complete"
    } else if condition_true(job, "Failed") {
        "Failed"
    } else if job
        .pointer("/metadata/deletionTimestamp")
        .is_some_and(|v| !v.is_null())
    {
        "Terminating"
    } else if condition_true(job, "FailureTarget") {
        "FailureTarget"
    } else if condition_true(job, "SuccessCriteriaMet") {
        "SuccessCriteriaMet"
    } else if condition_true(job, "Suspended") {
        "Suspended"
    } else {
        "Running"
    };
    let duration = match parse_time(str_at(job, &["status", "startTime"])) {
        Some(start) => {
            let end = parse_time(str_at(job, &["status", "completionTime"])).unwrap_or(now);
            human_duration(end.as_second() - start.as_second())
        }
        None => String::new(),
    };
    let (names, images) = template_summary(job);
    vec![
        json!(status),
        json!(completions),
        json!(duration),
        age(job, now),
        json!(names),
        json!(images),
        json!(format_label_selector(at(job, &["spec", "selector"]))),
    ]
}

fn cronjob_cells(cj: &Value, now: Timestamp) -> Vec<Value> {
    let suspend = match cj.pointer("/spec/suspend").and_then(Value::as_bool) {
        Some(true) => "True",
        Some(false) => "False",
        None => "<unset>",
    };
    let last = match parse_time(str_at(cj, &["status", "lastScheduleTime"])) {
        Some(t) => human_duration(now.as_second() - t.as_second()),
        None => "<none>".to_owned(),
    };
    let containers = arr(
        cj,
        &[
            "spec",
            "jobTemplate",
            "spec",
            "template",
            "spec",
            "containers",
        ],
    );
    let names: Vec<&str> = containers.iter().map(|c| str_at(c, &["name"])).collect();
    let images: Vec<&str> = containers.iter().map(|c| str_at(c, &["image"])).collect();
    vec![
        json!(str_at(cj, &["spec", "schedule"])),
        json!(or_none(str_at(cj, &["spec", "timeZone"]).to_owned())),
        json!(suspend),
        json!(len_at(cj, &["status", "active"])),
        json!(last),
        age(cj, now),
        json!(names.join(",")),
        json!(images.join(",")),
        json!(format_label_selector(at(
            cj,
            &["spec", "jobTemplate", "spec", "selector"]
        ))),
    ]
}

/// `RWO,ROX,RWX,RWOP`, as kubectl abbreviates access modes.
fn access_modes(modes: &[Value]) -> String {
    let has = |m: &str| modes.iter().any(|v| v.as_str() == Some(m));
    let mut out = Vec::new();
    for (long, short) in [
        ("ReadWriteOnce", "RWO"),
        ("ReadOnlyMany", "ROX"),
        ("ReadWriteMany", "RWX"),
        ("ReadWriteOncePod", "RWOP"),
    ] {
        if has(long) {
            out.push(short);
        }
    }
    out.join(",")
}

fn deleting(obj: &Value) -> bool {
    obj.pointer("/metadata/deletionTimestamp")
        .is_some_and(|v| !v.is_null())
}

fn pvc_cells(pvc: &Value, now: Timestamp) -> Vec<Value> {
    let phase = if deleting(pvc) {
        "Terminating"
    } else {
        str_at(pvc, &["status", "phase"])
    };
    let bound = !str_at(pvc, &["spec", "volumeName"]).is_empty();
    let (capacity, modes) = if bound {
        (
            str_at(pvc, &["status", "capacity", "storage"]).to_owned(),
            access_modes(arr(pvc, &["status", "accessModes"])),
        )
    } else {
        (String::new(), String::new())
    };
    let vac = match str_at(pvc, &["status", "currentVolumeAttributesClassName"]) {
        "" => "<unset>",
        v => v,
    };
    let mode = match str_at(pvc, &["spec", "volumeMode"]) {
        "" => "<unset>",
        m => m,
    };
    vec![
        json!(phase),
        json!(str_at(pvc, &["spec", "volumeName"])),
        json!(capacity),
        json!(modes),
        json!(str_at(pvc, &["spec", "storageClassName"])),
        json!(vac),
        age(pvc, now),
        json!(mode),
    ]
}

fn pv_cells(pv: &Value, now: Timestamp) -> Vec<Value> {
    let claim = match at(pv, &["spec", "claimRef"]) {
        Some(c) if c.is_object() => {
            format!("{}/{}", str_at(c, &["namespace"]), str_at(c, &["name"]))
        }
        _ => String::new(),
    };
    let phase = if deleting(pv) {
        "Terminating"
    } else {
        str_at(pv, &["status", "phase"])
    };
    let vac = match str_at(pv, &["spec", "volumeAttributesClassName"]) {
        "" => "<unset>",
        v => v,
    };
    let mode = match str_at(pv, &["spec", "volumeMode"]) {
        "" => "<unset>",
        m => m,
    };
    vec![
        json!(str_at(pv, &["spec", "capacity", "storage"])),
        json!(access_modes(arr(pv, &["spec", "accessModes"]))),
        json!(str_at(pv, &["spec", "persistentVolumeReclaimPolicy"])),
        json!(phase),
        json!(claim),
        json!(str_at(pv, &["spec", "storageClassName"])),
        json!(vac),
        json!(str_at(pv, &["status", "reason"])),
        age(pv, now),
        json!(mode),
    ]
}

fn quota_cells(q: &Value, now: Timestamp) -> Vec<Value> {
    let mut requests = Vec::new();
    let mut limits = Vec::new();
    if let Some(Value::Object(hard)) = q.pointer("/status/hard") {
        let mut keys: Vec<&String> = hard.keys().collect();
        keys.sort();
        for k in keys {
            let used = q
                .pointer(&format!(
                    "/status/used/{}",
                    k.replace('~', "~0").replace('/', "~1")
                ))
                .map(quantity_text)
                .unwrap_or_else(|| "0".to_owned());
            let entry = format!("{k}: {used}/{}", quantity_text(&hard[k]));
            if k.starts_with("limits.") {
                limits.push(entry);
            } else {
                requests.push(entry);
            }
        }
    }
    vec![
        age(q, now),
        json!(requests.join(", ")),
        json!(limits.join(", ")),
    ]
}

fn quantity_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn ingress_cells(ing: &Value, now: Timestamp) -> Vec<Value> {
    let class = or_none(str_at(ing, &["spec", "ingressClassName"]).to_owned());
    let hosts: Vec<String> = arr(ing, &["spec", "rules"])
        .iter()
        .map(|r| match str_at(r, &["host"]) {
            "" => "*".to_owned(),
            h => h.to_owned(),
        })
        .collect();
    let hosts = if hosts.is_empty() {
        "*".to_owned()
    } else if hosts.len() > 4 {
        format!("{} + {} more...", hosts[..4].join(","), hosts.len() - 4)
    } else {
        hosts.join(",")
    };
    let address: Vec<String> = arr(ing, &["status", "loadBalancer", "ingress"])
        .iter()
        .map(|i| match str_at(i, &["ip"]) {
            "" => str_at(i, &["hostname"]).to_owned(),
            ip => ip.to_owned(),
        })
        .filter(|s| !s.is_empty())
        .collect();
    let ports = if arr(ing, &["spec", "tls"]).is_empty() {
        "80"
    } else {
        "80, 443"
    };
    vec![
        json!(class),
        json!(hosts),
        json!(address.join(",")),
        json!(ports),
        age(ing, now),
    ]
}

fn storageclass_cells(sc: &Value, now: Timestamp) -> Vec<Value> {
    let reclaim = match str_at(sc, &["reclaimPolicy"]) {
        "" => "Delete",
        r => r,
    };
    let binding = match str_at(sc, &["volumeBindingMode"]) {
        "" => "Immediate",
        b => b,
    };
    vec![
        json!(str_at(sc, &["provisioner"])),
        json!(reclaim),
        json!(binding),
        json!(
            sc.get("allowVolumeExpansion")
                .and_then(Value::as_bool)
                .unwrap_or(false)
                .to_string()
        ),
        age(sc, now),
    ]
}

fn binding_cells(b: &Value, now: Timestamp) -> Vec<Value> {
    let subjects = arr(b, &["subjects"]);
    let of_kind = |kind: &str| -> String {
        subjects
            .iter()
            .filter(|s| str_at(s, &["kind"]) == kind)
            .map(|s| {
                let ns = str_at(s, &["namespace"]);
                let name = str_at(s, &["name"]);
                if kind == "ServiceAccount" {
                    format!("{ns}/{name}")
                } else {
                    name.to_owned()
                }
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    vec![
        json!(format!(
            "{}/{}",
            str_at(b, &["roleRef", "kind"]),
            str_at(b, &["roleRef", "name"])
        )),
        age(b, now),
        json!(of_kind("User")),
        json!(of_kind("Group")),
        json!(of_kind("ServiceAccount")),
    ]
}

// ---------------------------------------------------------------------------------------------
// CRD columns: the apiextensions table convertor.

fn column_cell(c: &PrinterColumn, obj: &Value, now: Timestamp) -> Value {
    let Some(value) = jsonpath_first(obj, &c.json_path) else {
        return Value::Null;
    };
    match c.type_.as_str() {
        "integer" => match &value {
            Value::Number(n) => n
                .as_i64()
                .or_else(|| n.as_f64().map(|f| f as i64))
                .map_or(Value::Null, |i| json!(i)),
            _ => Value::Null,
        },
        "number" => value.as_f64().map_or(Value::Null, |f| json!(f)),
        "boolean" => value.as_bool().map_or(Value::Null, Value::Bool),
        "date" => match value.as_str() {
            Some(s) => match parse_time(s) {
                Some(t) => json!(human_duration(now.as_second() - t.as_second())),
                None => json!("<invalid>"),
            },
            None => Value::Null,
        },
        // "string" prints any value the way kubectl's JSONPath printer does.
        _ => match value {
            Value::String(s) => Value::String(s),
            Value::Null => Value::Null,
            other => Value::String(other.to_string()),
        },
    }
}

/// One JSONPath step.
#[derive(Debug, PartialEq)]
enum Step {
    Field(String),
    Index(usize),
    Wildcard,
    /// `[?(@.a.b=="v")]` (also `!=`).
    Filter {
        path: Vec<String>,
        value: String,
        negate: bool,
    },
}

/// Parses the JSONPath subset `additionalPrinterColumns` use: `.a.b`, `['a.b']`, `[0]`, `[*]`,
/// and `[?(@.type=="Ready")]`. `None` for anything else.
fn parse_jsonpath(path: &str) -> Option<Vec<Step>> {
    let path = path.trim();
    let path = path
        .strip_prefix('{')
        .and_then(|p| p.strip_suffix('}'))
        .unwrap_or(path);
    let path = path.strip_prefix('$').unwrap_or(path);
    let mut steps = Vec::new();
    let chars: Vec<char> = path.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '.' => {
                let start = i + 1;
                let mut j = start;
                while j < chars.len() && chars[j] != '.' && chars[j] != '[' {
                    j += 1;
                }
                let name: String = chars[start..j].iter().collect();
                if name == "*" {
                    steps.push(Step::Wildcard);
                } else if !name.is_empty() {
                    steps.push(Step::Field(name));
                }
                i = j;
            }
            '[' => {
                let close = bracket_end(&chars, i)?;
                let inner: String = chars[i + 1..close].iter().collect();
                let inner = inner.trim();
                if inner == "*" {
                    steps.push(Step::Wildcard);
                } else if let Ok(n) = inner.parse::<usize>() {
                    steps.push(Step::Index(n));
                } else if let Some(q) = inner
                    .strip_prefix('\'')
                    .and_then(|s| s.strip_suffix('\''))
                    .or_else(|| inner.strip_prefix('"').and_then(|s| s.strip_suffix('"')))
                {
                    steps.push(Step::Field(q.to_owned()));
                } else if let Some(f) = inner.strip_prefix("?(").and_then(|s| s.strip_suffix(')')) {
                    steps.push(parse_filter(f)?);
                } else {
                    return None;
                }
                i = close + 1;
            }
            c if c.is_whitespace() => i += 1,
            _ => {
                // A leading field without a dot, e.g. `spec.x`.
                let start = i;
                let mut j = start;
                while j < chars.len() && chars[j] != '.' && chars[j] != '[' {
                    j += 1;
                }
                steps.push(Step::Field(chars[start..j].iter().collect()));
                i = j;
            }
        }
    }
    Some(steps)
}

fn bracket_end(chars: &[char], open: usize) -> Option<usize> {
    let mut quote: Option<char> = None;
    let mut depth = 0;
    for (k, &c) in chars.iter().enumerate().skip(open) {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '\'' | '"') => quote = Some(c),
            (None, '[') => depth += 1,
            (None, ']') => {
                depth -= 1;
                if depth == 0 {
                    return Some(k);
                }
            }
            _ => {}
        }
    }
    None
}

fn parse_filter(f: &str) -> Option<Step> {
    let (lhs, rhs, negate) = if let Some((l, r)) = f.split_once("!=") {
        (l, r, true)
    } else {
        let (l, r) = f.split_once("==")?;
        (l, r, false)
    };
    let lhs = lhs.trim().strip_prefix('@')?;
    let path: Vec<String> = lhs
        .split('.')
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    let rhs = rhs.trim();
    let value = rhs
        .strip_prefix('"')
        .and_then(|s| s.strip_suffix('"'))
        .or_else(|| rhs.strip_prefix('\'').and_then(|s| s.strip_suffix('\'')))
        .unwrap_or(rhs)
        .to_owned();
    Some(Step::Filter {
        path,
        value,
        negate,
    })
}

/// The first value a JSONPath finds in `obj` (the apiextensions convertor prints only the first).
pub fn jsonpath_first(obj: &Value, path: &str) -> Option<Value> {
    let steps = parse_jsonpath(path)?;
    let mut current: Vec<&Value> = vec![obj];
    for step in &steps {
        let mut next = Vec::new();
        for v in current {
            match step {
                Step::Field(name) => next.extend(v.get(name.as_str())),
                Step::Index(n) => next.extend(v.get(*n)),
                Step::Wildcard => match v {
                    Value::Array(a) => next.extend(a.iter()),
                    Value::Object(m) => next.extend(m.values()),
                    _ => {}
                },
                Step::Filter {
                    path,
                    value,
                    negate,
                } => {
                    for item in v.as_array().map(Vec::as_slice).unwrap_or(&[]) {
                        let found = path.iter().try_fold(item, |x, k| x.get(k.as_str()));
                        let text = match found {
                            Some(Value::String(s)) => Some(s.clone()),
                            Some(Value::Null) | None => None,
                            Some(other) => Some(other.to_string()),
                        };
                        let equal = text.as_deref() == Some(value.as_str());
                        if equal != *negate && (found.is_some() || *negate) {
                            next.push(item);
                        }
                    }
                }
            }
        }
        current = next;
    }
    current.into_iter().next().cloned()
}

#[cfg(test)]
mod tests {
    use expect_test::{Expect, expect};

    use super::*;
    use crate::registry::Registry;

    fn now() -> Timestamp {
        "2025-01-01T12:00:00Z".parse().expect("timestamp")
    }

    fn builtin(group: &str, kind: &str) -> ResourceType {
        let reg = Registry::with_builtins();
        reg.types
            .iter()
            .find(|t| t.group == group && t.kind == kind)
            .map(|t| (**t).clone())
            .expect("built-in type")
    }

    /// Renders a Table like kubectl's default (non-wide) output, for readable snapshots.
    fn render(table: &Value, wide: bool) -> String {
        let defs = table["columnDefinitions"].as_array().expect("columns");
        let shown: Vec<usize> = (0..defs.len())
            .filter(|i| wide || defs[*i]["priority"].as_i64() == Some(0))
            .collect();
        let mut lines = vec![
            shown
                .iter()
                .map(|i| defs[*i]["name"].as_str().unwrap_or_default().to_uppercase())
                .collect::<Vec<_>>()
                .join(" | "),
        ];
        for row in table["rows"].as_array().expect("rows") {
            let cells = row["cells"].as_array().expect("cells");
            assert_eq!(cells.len(), defs.len(), "one cell per column");
            lines.push(
                shown
                    .iter()
                    .map(|i| match &cells[*i] {
                        Value::String(s) => s.clone(),
                        Value::Null => "<none>".to_owned(),
                        other => other.to_string(),
                    })
                    .collect::<Vec<_>>()
                    .join(" | "),
            );
        }
        lines.join("\n")
    }

    fn check(rt: &ResourceType, objects: &[Value], wide: bool, expect: Expect) {
        let table = to_table_at(rt, objects, IncludeObject::Metadata, json!({}), now());
        expect.assert_eq(&render(&table, wide));
    }

    #[test]
    fn human_durations_match_apimachinery() {
        let cases = [
            -5, -1, 0, 59, 119, 120, 150, 600, 10799, 10800, 12000, 28800, 172799, 172800, 180000,
            700000, 63072000, 63158400, 252288000,
        ];
        let out: Vec<String> = cases
            .iter()
            .map(|s| format!("{s}={}", human_duration(*s)))
            .collect();
        expect!["-5=<invalid> -1=0s 0=0s 59=59s 119=119s 120=2m 150=2m30s 600=10m 10799=179m 10800=3h 12000=3h20m 28800=8h 172799=47h 172800=2d 180000=2d2h 700000=8d 63072000=2y 63158400=2y1d 252288000=8y"]
            .assert_eq(&out.join(" "));
    }

    #[test]
    fn pods_print_ready_status_restarts_and_wide_columns() {
        let running = json!({
            "metadata": {"name": "web", "creationTimestamp": "2025-01-01T11:55:00Z"},
            "spec": {"nodeName": "n1", "containers": [{"name": "a"}, {"name": "b"}]},
            "status": {"phase": "Running", "podIP": "10.0.0.5", "containerStatuses": [
                {"name": "a", "ready": true, "restartCount": 2, "state": {"running": {}},
                 "lastState": {"terminated": {"finishedAt": "2025-01-01T11:59:00Z"}}},
                {"name": "b", "ready": false, "restartCount": 0, "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]},
        });
        let pending = json!({
            "metadata": {"name": "new", "creationTimestamp": "2025-01-01T11:59:30Z"},
            "spec": {"containers": [{"name": "a"}]},
            "status": {"phase": "Pending"},
        });
        let init = json!({
            "metadata": {"name": "init", "creationTimestamp": "2025-01-01T10:00:00Z"},
            "spec": {"initContainers": [{"name": "i1"}, {"name": "i2"}], "containers": [{"name": "a"}]},
            "status": {"phase": "Pending", "initContainerStatuses": [
                {"name": "i1", "state": {"terminated": {"exitCode": 0}}},
                {"name": "i2", "state": {"running": {}}}]},
        });
        let deleting = json!({
            "metadata": {"name": "old", "creationTimestamp": "2024-12-01T00:00:00Z", "deletionTimestamp": "2025-01-01T12:00:30Z"},
            "spec": {"containers": [{"name": "a"}], "readinessGates": [{"conditionType": "x/ok"}]},
            "status": {"phase": "Running", "conditions": [{"type": "x/ok", "status": "True"}],
                       "containerStatuses": [{"name": "a", "ready": true, "state": {"running": {}}}]},
        });
        let done = json!({
            "metadata": {"name": "job", "creationTimestamp": "2025-01-01T11:00:00Z"},
            "spec": {"containers": [{"name": "a"}]},
            "status": {"phase": "Succeeded", "containerStatuses": [
                {"name": "a", "ready": false, "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}]},
        });
        let pods = [running, pending, init, deleting, done];
        let rt = builtin("", "Pod");
        check(
            &rt,
            &pods,
            false,
            expect![[r#"
            NAME | READY | STATUS | RESTARTS | AGE
            web | 1/2 | CrashLoopBackOff | 2 (60s ago) | 5m
            new | 0/1 | Pending | 0 | 30s
            init | 0/1 | Init:1/2 | 0 | 120m
            old | 1/1 | Terminating | 0 | 31d
            job | 0/1 | Completed | 0 | 60m"#]],
        );
        check(
            &rt,
            &pods[..1],
            true,
            expect![[r#"
            NAME | READY | STATUS | RESTARTS | AGE | IP | NODE | NOMINATED NODE | READINESS GATES
            web | 1/2 | CrashLoopBackOff | 2 (60s ago) | 5m | 10.0.0.5 | n1 | <none> | <none>"#]],
        );
        check(
            &rt,
            &pods[3..4],
            true,
            expect![[r#"
            NAME | READY | STATUS | RESTARTS | AGE | IP | NODE | NOMINATED NODE | READINESS GATES
            old | 1/1 | Terminating | 0 | 31d | <none> | <none> | <none> | 1/1"#]],
        );
    }

    #[test]
    fn services_nodes_deployments_and_friends_print_like_kubectl() {
        let t = "2025-01-01T11:00:00Z";
        check(
            &builtin("", "Service"),
            &[
                json!({"metadata": {"name": "kubernetes", "creationTimestamp": t},
                   "spec": {"type": "ClusterIP", "clusterIP": "10.96.0.1", "ports": [{"port": 443, "protocol": "TCP"}]}}),
                json!({"metadata": {"name": "lb", "creationTimestamp": t},
                   "spec": {"type": "LoadBalancer", "clusterIP": "10.96.0.9", "selector": {"b": "2", "a": "1"},
                            "ports": [{"port": 80, "nodePort": 30080}, {"port": 53, "protocol": "UDP", "nodePort": 30053}]},
                   "status": {"loadBalancer": {}}}),
                json!({"metadata": {"name": "ext", "creationTimestamp": t},
                   "spec": {"type": "ExternalName", "externalName": "example.org"}}),
            ],
            true,
            expect![[r#"
            NAME | TYPE | CLUSTER-IP | EXTERNAL-IP | PORT(S) | AGE | SELECTOR
            kubernetes | ClusterIP | 10.96.0.1 | <none> | 443/TCP | 60m | <none>
            lb | LoadBalancer | 10.96.0.9 | <pending> | 80:30080/TCP,53:30053/UDP | 60m | a=1,b=2
            ext | ExternalName | <none> | example.org | <none> | 60m | <none>"#]],
        );
        check(
            &builtin("", "Node"),
            &[json!({
                "metadata": {"name": "vk-remote", "creationTimestamp": t, "labels": {"node-role.kubernetes.io/agent": "", "type": "virtual"}},
                "spec": {"unschedulable": true},
                "status": {"conditions": [{"type": "Ready", "status": "True"}], "nodeInfo": {"kubeletVersion": "v1.33.1"},
                           "addresses": [{"type": "InternalIP", "address": "198.18.0.2"}]},
            })],
            true,
            expect![[r#"
            NAME | STATUS | ROLES | AGE | VERSION | INTERNAL-IP | EXTERNAL-IP | OS-IMAGE | KERNEL-VERSION | CONTAINER-RUNTIME
            vk-remote | Ready,SchedulingDisabled | agent | 60m | v1.33.1 | 198.18.0.2 | <none> | <unknown> | <unknown> | <unknown>"#]],
        );
        check(
            &builtin("apps", "Deployment"),
            &[json!({
                "metadata": {"name": "web", "creationTimestamp": t},
                "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
                         "template": {"spec": {"containers": [{"name": "nginx", "image": "nginx:1"}, {"name": "sc", "image": "busybox"}]}}},
                "status": {"readyReplicas": 2, "updatedReplicas": 3, "availableReplicas": 2},
            })],
            true,
            expect![[r#"
            NAME | READY | UP-TO-DATE | AVAILABLE | AGE | CONTAINERS | IMAGES | SELECTOR
            web | 2/3 | 3 | 2 | 60m | nginx,sc | nginx:1,busybox | app=web"#]],
        );
        check(
            &builtin("", "ConfigMap"),
            &[
                json!({"metadata": {"name": "c", "creationTimestamp": t}, "data": {"a": "1", "b": "2"}, "binaryData": {"c": "AA=="}}),
            ],
            false,
            expect![[r#"
                NAME | DATA | AGE
                c | 3 | 60m"#]],
        );
        check(
            &builtin("", "Secret"),
            &[
                json!({"metadata": {"name": "s", "creationTimestamp": t}, "type": "Opaque", "data": {"a": "MQ=="}}),
            ],
            false,
            expect![[r#"
                NAME | TYPE | DATA | AGE
                s | Opaque | 1 | 60m"#]],
        );
        check(
            &builtin("", "Namespace"),
            &[
                json!({"metadata": {"name": "default", "creationTimestamp": t}, "status": {"phase": "Active"}}),
            ],
            false,
            expect![[r#"
                NAME | STATUS | AGE
                default | Active | 60m"#]],
        );
        check(
            &builtin("coordination.k8s.io", "Lease"),
            &[
                json!({"metadata": {"name": "n1", "creationTimestamp": t}, "spec": {"holderIdentity": "n1"}}),
            ],
            false,
            expect![[r#"
                NAME | HOLDER | AGE
                n1 | n1 | 60m"#]],
        );
        check(
            &builtin("certificates.k8s.io", "CertificateSigningRequest"),
            &[json!({
                "metadata": {"name": "peer", "creationTimestamp": t},
                "spec": {"signerName": "kubernetes.io/kube-apiserver-client", "username": "admin", "expirationSeconds": 86400},
                "status": {"conditions": [{"type": "Approved", "status": "True"}], "certificate": "LS0t"},
            })],
            false,
            expect![[r#"
            NAME | AGE | SIGNERNAME | REQUESTOR | REQUESTEDDURATION | CONDITION
            peer | 60m | kubernetes.io/kube-apiserver-client | admin | 24h | Approved,Issued"#]],
        );
        check(
            &builtin("rbac.authorization.k8s.io", "ClusterRole"),
            &[json!({"metadata": {"name": "view", "creationTimestamp": t}})],
            false,
            expect![[r#"
                NAME | CREATED AT
                view | 2025-01-01T11:00:00Z"#]],
        );
        check(
            &builtin("apiextensions.k8s.io", "CustomResourceDefinition"),
            &[json!({"metadata": {"name": "widgets.example.com", "creationTimestamp": t}})],
            false,
            expect![[r#"
                NAME | CREATED AT
                widgets.example.com | 2025-01-01T11:00:00Z"#]],
        );
        check(
            &builtin("", "Endpoints"),
            &[
                json!({"metadata": {"name": "e", "creationTimestamp": t}, "subsets": [
            {"addresses": [{"ip": "10.0.0.1"}, {"ip": "10.0.0.2"}], "ports": [{"port": 80}, {"port": 443}]}]}),
            ],
            false,
            expect![[r#"
                NAME | ENDPOINTS | AGE
                e | 10.0.0.1:80,10.0.0.1:443,10.0.0.2:80 + 1 more... | 60m"#]],
        );
    }

    #[test]
    fn workloads_storage_and_policy_kinds_print_like_kubectl() {
        let t = "2025-01-01T11:00:00Z";
        check(
            &builtin("apps", "DaemonSet"),
            &[json!({
                "metadata": {"name": "fabric", "creationTimestamp": t},
                "spec": {"selector": {"matchLabels": {"app": "fabric"}},
                         "template": {"spec": {"nodeSelector": {"kubernetes.io/os": "linux"}, "containers": [{"name": "f", "image": "tether"}]}}},
                "status": {"desiredNumberScheduled": 3, "currentNumberScheduled": 3, "numberReady": 2, "updatedNumberScheduled": 3, "numberAvailable": 2},
            })],
            true,
            expect![[r#"
            NAME | DESIRED | CURRENT | READY | UP-TO-DATE | AVAILABLE | NODE SELECTOR | AGE | CONTAINERS | IMAGES | SELECTOR
            fabric | 3 | 3 | 2 | 3 | 2 | kubernetes.io/os=linux | 60m | f | tether | app=fabric"#]],
        );
        check(
            &builtin("apps", "StatefulSet"),
            &[json!({
                "metadata": {"name": "db", "creationTimestamp": t},
                "spec": {"replicas": 3, "template": {"spec": {"containers": [{"name": "pg", "image": "postgres"}]}}},
                "status": {"readyReplicas": 1},
            })],
            true,
            expect![[r#"
            NAME | READY | AGE | CONTAINERS | IMAGES
            db | 1/3 | 60m | pg | postgres"#]],
        );
        check(
            &builtin("batch", "Job"),
            &[
                json!({"metadata": {"name": "done", "creationTimestamp": t},
                   "spec": {"completions": 1, "template": {"spec": {"containers": [{"name": "c", "image": "busybox"}]}}},
                   "status": {"succeeded": 1, "startTime": "2025-01-01T11:00:00Z", "completionTime": "2025-01-01T11:00:42Z",
                              "conditions": [{"type": "Complete", "status": "True"}]}}),
                json!({"metadata": {"name": "busy", "creationTimestamp": t},
                   "spec": {"parallelism": 3}, "status": {"startTime": "2025-01-01T11:57:00Z"}}),
            ],
            false,
            expect![[r#"
            NAME | STATUS | COMPLETIONS | DURATION | AGE
            done | Complete | 1/1 | 42s | 60m
            busy | Running | 0/1 of 3 | 3m | 60m"#]],
        );
        check(
            &builtin("batch", "CronJob"),
            &[json!({
                "metadata": {"name": "nightly", "creationTimestamp": t},
                "spec": {"schedule": "0 3 * * *", "suspend": false},
                "status": {"active": [{"name": "nightly-1"}], "lastScheduleTime": "2025-01-01T11:50:00Z"},
            })],
            false,
            expect![[r#"
            NAME | SCHEDULE | TIMEZONE | SUSPEND | ACTIVE | LAST SCHEDULE | AGE
            nightly | 0 3 * * * | <none> | False | 1 | 10m | 60m"#]],
        );
        check(
            &builtin("", "PersistentVolumeClaim"),
            &[json!({
                "metadata": {"name": "data", "creationTimestamp": t},
                "spec": {"volumeName": "pv-1", "storageClassName": "standard", "resources": {"requests": {"storage": "1Gi"}}},
                "status": {"phase": "Bound", "capacity": {"storage": "2Gi"}, "accessModes": ["ReadWriteOnce", "ReadOnlyMany"]},
            })],
            true,
            expect![[r#"
            NAME | STATUS | VOLUME | CAPACITY | ACCESS MODES | STORAGECLASS | VOLUMEATTRIBUTESCLASS | AGE | VOLUMEMODE
            data | Bound | pv-1 | 2Gi | RWO,ROX | standard | <unset> | 60m | <unset>"#]],
        );
        check(
            &builtin("", "PersistentVolume"),
            &[json!({
                "metadata": {"name": "pv-1", "creationTimestamp": t},
                "spec": {"capacity": {"storage": "2Gi"}, "accessModes": ["ReadWriteOnce"], "persistentVolumeReclaimPolicy": "Retain",
                         "claimRef": {"namespace": "default", "name": "data"}, "storageClassName": "standard"},
                "status": {"phase": "Bound"},
            })],
            false,
            expect![[r#"
            NAME | CAPACITY | ACCESS MODES | RECLAIM POLICY | STATUS | CLAIM | STORAGECLASS | VOLUMEATTRIBUTESCLASS | REASON | AGE
            pv-1 | 2Gi | RWO | Retain | Bound | default/data | standard | <unset> |  | 60m"#]],
        );
        check(
            &builtin("", "ResourceQuota"),
            &[json!({
                "metadata": {"name": "tenant", "creationTimestamp": t},
                "status": {"hard": {"requests.cpu": "4", "limits.memory": "8Gi", "pods": "10"}, "used": {"requests.cpu": "500m", "pods": "2"}},
            })],
            false,
            expect![[r#"
            NAME | AGE | REQUEST | LIMIT
            tenant | 60m | pods: 2/10, requests.cpu: 500m/4 | limits.memory: 0/8Gi"#]],
        );
        check(
            &builtin("networking.k8s.io", "NetworkPolicy"),
            &[
                json!({"metadata": {"name": "all", "creationTimestamp": t}, "spec": {"podSelector": {}}}),
                json!({"metadata": {"name": "web", "creationTimestamp": t}, "spec": {"podSelector": {"matchLabels": {"app": "web"}}}}),
            ],
            false,
            expect![[r#"
            NAME | POD-SELECTOR | AGE
            all | <none> | 60m
            web | app=web | 60m"#]],
        );
        check(
            &builtin("networking.k8s.io", "Ingress"),
            &[json!({
                "metadata": {"name": "site", "creationTimestamp": t},
                "spec": {"ingressClassName": "nginx", "rules": [{"host": "a.example"}, {}], "tls": [{"hosts": ["a.example"]}]},
                "status": {"loadBalancer": {"ingress": [{"ip": "198.18.0.10"}]}},
            })],
            false,
            expect![[r#"
            NAME | CLASS | HOSTS | ADDRESS | PORTS | AGE
            site | nginx | a.example,* | 198.18.0.10 | 80, 443 | 60m"#]],
        );
        check(
            &builtin("storage.k8s.io", "StorageClass"),
            &[json!({
                "metadata": {"name": "standard", "creationTimestamp": t, "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
                "provisioner": "rancher.io/local-path", "volumeBindingMode": "WaitForFirstConsumer",
            })],
            false,
            expect![[r#"
            NAME | PROVISIONER | RECLAIMPOLICY | VOLUMEBINDINGMODE | ALLOWVOLUMEEXPANSION | AGE
            standard (default) | rancher.io/local-path | Delete | WaitForFirstConsumer | false | 60m"#]],
        );
        check(
            &builtin("scheduling.k8s.io", "PriorityClass"),
            &[json!({
                "metadata": {"name": "system-node-critical", "creationTimestamp": t}, "value": 2000001000,
            })],
            false,
            expect![[r#"
            NAME | VALUE | GLOBAL-DEFAULT | AGE | PREEMPTIONPOLICY
            system-node-critical | 2000001000 | false | 60m | PreemptLowerPriority"#]],
        );
        check(
            &builtin("policy", "PodDisruptionBudget"),
            &[json!({
                "metadata": {"name": "pdb", "creationTimestamp": t}, "spec": {"minAvailable": "50%"}, "status": {"disruptionsAllowed": 1},
            })],
            false,
            expect![[r#"
            NAME | MIN AVAILABLE | MAX UNAVAILABLE | ALLOWED DISRUPTIONS | AGE
            pdb | 50% | N/A | 1 | 60m"#]],
        );
        check(
            &builtin(
                "admissionregistration.k8s.io",
                "ValidatingWebhookConfiguration",
            ),
            &[json!({
                "metadata": {"name": "shadowpods", "creationTimestamp": t}, "webhooks": [{"name": "a"}, {"name": "b"}],
            })],
            false,
            expect![[r#"
            NAME | WEBHOOKS | AGE
            shadowpods | 2 | 60m"#]],
        );
        check(
            &builtin("", "LimitRange"),
            &[json!({"metadata": {"name": "limits", "creationTimestamp": t}})],
            false,
            expect![[r#"
                NAME | CREATED AT
                limits | 2025-01-01T11:00:00Z"#]],
        );
    }

    #[test]
    fn events_put_name_last_and_print_the_involved_object() {
        let core = json!({
            "metadata": {"name": "web.17f", "creationTimestamp": "2025-01-01T11:00:00Z"},
            "involvedObject": {"kind": "Pod", "name": "web", "fieldPath": "spec.containers{a}"},
            "reason": "Pulled", "type": "Normal", "message": "pulled image \n",
            "firstTimestamp": "2025-01-01T11:00:00Z", "lastTimestamp": "2025-01-01T11:58:00Z", "count": 3,
            "source": {"component": "kubelet", "host": "n1"},
        });
        check(
            &builtin("", "Event"),
            std::slice::from_ref(&core),
            true,
            expect![[r#"
            LAST SEEN | TYPE | REASON | OBJECT | SUBOBJECT | SOURCE | MESSAGE | FIRST SEEN | COUNT | NAME
            2m | Normal | Pulled | pod/web | spec.containers{a} | kubelet, n1 | pulled image | 60m | 3 | web.17f"#]],
        );
        let new = json!({
            "metadata": {"name": "r.1", "creationTimestamp": "2025-01-01T11:59:00Z"},
            "regarding": {"kind": "Widget", "name": "w1"}, "reason": "Synced", "type": "Normal",
            "note": "ok", "eventTime": "2025-01-01T11:59:00.000000Z", "reportingController": "tether",
        });
        check(
            &builtin("events.k8s.io", "Event"),
            &[new],
            false,
            expect![[r#"
            LAST SEEN | TYPE | REASON | OBJECT | MESSAGE
            60s | Normal | Synced | widget/w1 | ok"#]],
        );
    }

    #[test]
    fn crd_columns_follow_jsonpath_and_show_dates_as_ages() {
        let mut rt = builtin("", "ConfigMap");
        rt.origin = Origin::Crd {
            name: "widgets.example.com".into(),
        };
        let c = |name: &str, type_: &str, path: &str, priority| PrinterColumn {
            name: name.into(),
            type_: type_.into(),
            format: String::new(),
            description: String::new(),
            priority,
            json_path: path.into(),
        };
        rt.printer_columns = vec![
            c(
                "Ready",
                "string",
                r#".status.conditions[?(@.type=="Ready")].status"#,
                0,
            ),
            c("Size", "integer", ".spec.size", 0),
            c("Ratio", "number", ".spec.ratio", 0),
            c("Paused", "boolean", ".spec.paused", 0),
            c("First", "string", ".spec.items[0].name", 0),
            c("Tags", "string", ".spec.tags", 1),
            c(
                "Dotted",
                "string",
                ".metadata.labels['app.kubernetes.io/name']",
                1,
            ),
            c("Age", "date", ".metadata.creationTimestamp", 0),
        ];
        let w = json!({
            "metadata": {"name": "w1", "creationTimestamp": "2025-01-01T11:30:00Z", "labels": {"app.kubernetes.io/name": "demo"}},
            "spec": {"size": 3.0, "ratio": 2, "paused": false, "items": [{"name": "x"}], "tags": ["a", "b"]},
            "status": {"conditions": [{"type": "Synced", "status": "False"}, {"type": "Ready", "status": "True"}]},
        });
        let empty = json!({"metadata": {"name": "w2"}});
        check(
            &rt,
            &[w, empty],
            true,
            expect![[r#"
            NAME | READY | SIZE | RATIO | PAUSED | FIRST | TAGS | DOTTED | AGE
            w1 | True | 3 | 2.0 | false | x | ["a","b"] | demo | 30m
            w2 | <none> | <none> | <none> | <none> | <none> | <none> | <none> | <none>"#]],
        );
    }

    #[test]
    fn include_object_selects_what_rows_carry() {
        assert_eq!(IncludeObject::parse(None), IncludeObject::Metadata);
        assert_eq!(IncludeObject::parse(Some("None")), IncludeObject::None);
        assert_eq!(IncludeObject::parse(Some("Object")), IncludeObject::Object);
        let rt = builtin("", "ConfigMap");
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "resourceVersion": "7", "labels": {"a": "b"}}, "data": {"k": "v"}});
        let meta = to_table_at(
            &rt,
            std::slice::from_ref(&cm),
            IncludeObject::Metadata,
            json!({"resourceVersion": "9"}),
            now(),
        );
        assert_eq!(
            meta["rows"][0]["object"],
            json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": cm["metadata"]})
        );
        assert_eq!(meta["metadata"]["resourceVersion"], "9");
        let full = to_table_at(
            &rt,
            std::slice::from_ref(&cm),
            IncludeObject::Object,
            json!({}),
            now(),
        );
        assert_eq!(full["rows"][0]["object"], cm);
        let none = to_table_at(
            &rt,
            std::slice::from_ref(&cm),
            IncludeObject::None,
            json!({}),
            now(),
        );
        assert!(none["rows"][0].get("object").is_none());
        let one = row_at(&rt, &cm, IncludeObject::Metadata, now());
        assert_eq!(one["kind"], "Table");
        assert_eq!(one["metadata"]["resourceVersion"], "7");
        assert_eq!(one["rows"].as_array().map(Vec::len), Some(1));
        assert_eq!(
            one["columnDefinitions"][0],
            json!({"name": "Name", "type": "string", "format": "name", "description": NAME_DESCRIPTION, "priority": 0})
        );
    }

    /// Arbitrary JSON biased to the fields the printers read, so odd shapes reach them.
    fn arb_object() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let key = prop_oneof![
            Just("metadata"),
            Just("spec"),
            Just("status"),
            Just("containers"),
            Just("containerStatuses"),
            Just("initContainerStatuses"),
            Just("initContainers"),
            Just("state"),
            Just("waiting"),
            Just("terminated"),
            Just("reason"),
            Just("ports"),
            Just("port"),
            Just("nodePort"),
            Just("conditions"),
            Just("type"),
            Just("creationTimestamp"),
            Just("deletionTimestamp"),
            Just("labels"),
            Just("selector"),
            Just("matchExpressions"),
            Just("values"),
            Just("subsets"),
            Just("addresses"),
            Just("endpoints"),
            Just("involvedObject"),
            Just("series"),
            Just("hard"),
            Just("used"),
            Just("replicas"),
            Just("rules"),
            Just("template"),
            Just("data"),
            Just("phase"),
        ]
        .prop_map(str::to_owned);
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(|f| json!(f)),
            prop_oneof![
                Just("2025-01-01T11:00:00Z".to_owned()),
                Just("Always".to_owned()),
                "[a-z]{0,3}"
            ]
            .prop_map(Value::String),
        ];
        leaf.prop_recursive(5, 64, 6, move |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                proptest::collection::btree_map(key.clone(), inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest::proptest! {
        #[test]
        fn every_printer_yields_one_cell_per_column_for_any_object(obj in arb_object()) {
            let reg = Registry::with_builtins();
            for rt in &reg.types {
                let table = to_table_at(rt, std::slice::from_ref(&obj), IncludeObject::Metadata, json!({}), now());
                let columns = table["columnDefinitions"].as_array().map_or(0, Vec::len);
                let cells = table["rows"][0]["cells"].as_array().map_or(0, Vec::len);
                proptest::prop_assert_eq!(columns, cells, "{}", rt.kind);
            }
        }
    }

    #[test]
    fn jsonpath_subset() {
        let obj = json!({"a": {"b": [{"k": "x", "v": 1}, {"k": "y", "v": 2}], "c.d": "dot"}});
        let cases = [
            (".a.b[1].v", Some(json!(2))),
            ("{.a.b[0].k}", Some(json!("x"))),
            (r#".a.b[?(@.k=="y")].v"#, Some(json!(2))),
            (r#".a.b[?(@.k!="x")].k"#, Some(json!("y"))),
            (".a.b[*].k", Some(json!("x"))),
            (".a['c.d']", Some(json!("dot"))),
            (".a.missing", None),
            (".a.b[9]", None),
            ("a.b[0].v", Some(json!(1))),
        ];
        for (path, want) in cases {
            assert_eq!(jsonpath_first(&obj, path), want, "{path}");
        }
    }
}
