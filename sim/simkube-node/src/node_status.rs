//! The Node and Lease this agent publishes, computed from its configuration and the time passed
//! in (pure: the agent applies them).

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::Ipv4Net;
use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{
    DaemonEndpoint, Node, NodeAddress, NodeCondition, NodeDaemonEndpoints, NodeSpec, NodeStatus,
    NodeSystemInfo,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};

/// Namespace of node heartbeat Leases.
pub const LEASE_NAMESPACE: &str = "kube-node-lease";

/// The kubelet version this agent reports (the simulated API level, marked as simulated).
pub const KUBELET_VERSION: &str = "v1.33.0-simkube";

/// What a node is: everything the Node object says about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeIdentity {
    /// Node name (also the hostname label and the Lease name).
    pub name: String,
    /// The node's pod CIDR.
    pub pod_cidr: Ipv4Net,
    /// The node's InternalIP, where the kubelet endpoint listens.
    pub internal_ip: IpAddr,
    /// Port of the kubelet HTTPS endpoint.
    pub kubelet_port: u16,
    /// CPU capacity (a Kubernetes quantity, e.g. `4`).
    pub cpu: String,
    /// Memory capacity (e.g. `8Gi`).
    pub memory: String,
    /// Most pods the node accepts.
    pub max_pods: u32,
    /// Extra labels.
    pub labels: BTreeMap<String, String>,
}

/// The Node object to create when registering (metadata and spec; status is set separately).
pub fn node_object(id: &NodeIdentity) -> Node {
    let mut labels = BTreeMap::from([
        ("kubernetes.io/hostname".to_owned(), id.name.clone()),
        ("kubernetes.io/os".to_owned(), "linux".to_owned()),
        (
            "kubernetes.io/arch".to_owned(),
            std::env::consts::ARCH
                .replace("x86_64", "amd64")
                .replace("aarch64", "arm64"),
        ),
        (
            "node.kubernetes.io/instance-type".to_owned(),
            "simkube".to_owned(),
        ),
    ]);
    labels.extend(id.labels.clone());
    Node {
        metadata: ObjectMeta {
            name: Some(id.name.clone()),
            labels: Some(labels),
            ..ObjectMeta::default()
        },
        spec: Some(NodeSpec {
            pod_cidr: Some(id.pod_cidr.to_string()),
            pod_cidrs: Some(vec![id.pod_cidr.to_string()]),
            ..NodeSpec::default()
        }),
        status: Some(node_status(id, None, true, "", Timestamp::UNIX_EPOCH)),
    }
}

/// The Node status at `now`. `previous` keeps the transition times of conditions that did not
/// change; `ready` is false while the agent cannot run pods (with `why`).
pub fn node_status(
    id: &NodeIdentity,
    previous: Option<&NodeStatus>,
    ready: bool,
    why: &str,
    now: Timestamp,
) -> NodeStatus {
    let resources = BTreeMap::from([
        ("cpu".to_owned(), Quantity(id.cpu.clone())),
        ("memory".to_owned(), Quantity(id.memory.clone())),
        ("pods".to_owned(), Quantity(id.max_pods.to_string())),
        ("ephemeral-storage".to_owned(), Quantity("100Gi".to_owned())),
    ]);
    let pressure = |kind: &str, reason: &str, message: &str| {
        (
            kind.to_owned(),
            "False",
            reason.to_owned(),
            message.to_owned(),
        )
    };
    let wanted = [
        pressure(
            "MemoryPressure",
            "KubeletHasSufficientMemory",
            "kubelet has sufficient memory available",
        ),
        pressure(
            "DiskPressure",
            "KubeletHasNoDiskPressure",
            "kubelet has no disk pressure",
        ),
        pressure(
            "PIDPressure",
            "KubeletHasSufficientPID",
            "kubelet has sufficient PID available",
        ),
        if ready {
            (
                "Ready".to_owned(),
                "True",
                "KubeletReady".to_owned(),
                "kubelet is posting ready status".to_owned(),
            )
        } else {
            (
                "Ready".to_owned(),
                "False",
                "KubeletNotReady".to_owned(),
                why.to_owned(),
            )
        },
    ];
    let conditions = wanted
        .into_iter()
        .map(|(kind, status, reason, message)| {
            let old = previous
                .and_then(|p| p.conditions.as_ref())
                .and_then(|cs| cs.iter().find(|c| c.type_ == kind));
            let transition = match old {
                Some(c) if c.status == status => c.last_transition_time.clone(),
                _ => None,
            };
            NodeCondition {
                type_: kind,
                status: status.to_owned(),
                reason: Some(reason),
                message: Some(message),
                last_heartbeat_time: Some(Time(now)),
                last_transition_time: transition.or(Some(Time(now))),
            }
        })
        .collect();
    NodeStatus {
        capacity: Some(resources.clone()),
        allocatable: Some(resources),
        addresses: Some(vec![
            NodeAddress {
                type_: "InternalIP".to_owned(),
                address: id.internal_ip.to_string(),
            },
            NodeAddress {
                type_: "Hostname".to_owned(),
                address: id.name.clone(),
            },
        ]),
        daemon_endpoints: Some(NodeDaemonEndpoints {
            kubelet_endpoint: Some(DaemonEndpoint {
                port: i32::from(id.kubelet_port),
            }),
        }),
        conditions: Some(conditions),
        node_info: Some(NodeSystemInfo {
            architecture: std::env::consts::ARCH.to_owned(),
            operating_system: "linux".to_owned(),
            os_image: "simkube simulated node".to_owned(),
            kernel_version: String::new(),
            container_runtime_version: "simkube://0.1".to_owned(),
            kubelet_version: KUBELET_VERSION.to_owned(),
            kube_proxy_version: String::new(),
            machine_id: id.name.clone(),
            system_uuid: id.name.clone(),
            boot_id: String::new(),
            ..NodeSystemInfo::default()
        }),
        ..NodeStatus::default()
    }
}

/// The heartbeat Lease at `now`, held by the node for `duration_seconds`.
pub fn lease(node: &str, duration_seconds: i32, now: Timestamp) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(node.to_owned()),
            namespace: Some(LEASE_NAMESPACE.to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(node.to_owned()),
            lease_duration_seconds: Some(duration_seconds),
            renew_time: Some(MicroTime(now)),
            ..LeaseSpec::default()
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id() -> NodeIdentity {
        NodeIdentity {
            name: "n1".into(),
            pod_cidr: "10.244.1.0/24".parse().expect("cidr"),
            internal_ip: "198.18.0.2".parse().expect("ip"),
            kubelet_port: 10250,
            cpu: "4".into(),
            memory: "8Gi".into(),
            max_pods: 110,
            labels: BTreeMap::from([("zone".to_owned(), "a".to_owned())]),
        }
    }

    #[test]
    fn status_snapshot() {
        let now: Timestamp = "2026-01-01T00:00:00Z".parse().expect("time");
        let mut status = node_status(&id(), None, true, "", now);
        status.node_info = None; // architecture depends on the build host
        expect_test::expect![[r#"
            {
              "addresses": [
                {
                  "address": "198.18.0.2",
                  "type": "InternalIP"
                },
                {
                  "address": "n1",
                  "type": "Hostname"
                }
              ],
              "allocatable": {
                "cpu": "4",
                "ephemeral-storage": "100Gi",
                "memory": "8Gi",
                "pods": "110"
              },
              "capacity": {
                "cpu": "4",
                "ephemeral-storage": "100Gi",
                "memory": "8Gi",
                "pods": "110"
              },
              "conditions": [
                {
                  "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                  "lastTransitionTime": "2026-01-01T00:00:00Z",
                  "message": "kubelet has sufficient memory available",
                  "reason": "KubeletHasSufficientMemory",
                  "status": "False",
                  "type": "MemoryPressure"
                },
                {
                  "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                  "lastTransitionTime": "2026-01-01T00:00:00Z",
                  "message": "kubelet has no disk pressure",
                  "reason": "KubeletHasNoDiskPressure",
                  "status": "False",
                  "type": "DiskPressure"
                },
                {
                  "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                  "lastTransitionTime": "2026-01-01T00:00:00Z",
                  "message": "kubelet has sufficient PID available",
                  "reason": "KubeletHasSufficientPID",
                  "status": "False",
                  "type": "PIDPressure"
                },
                {
                  "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                  "lastTransitionTime": "2026-01-01T00:00:00Z",
                  "message": "kubelet is posting ready status",
                  "reason": "KubeletReady",
                  "status": "True",
                  "type": "Ready"
                }
              ],
              "daemonEndpoints": {
                "kubeletEndpoint": {
                  "Port": 10250
                }
              }
            }"#]]
        .assert_eq(&serde_json::to_string_pretty(&status).expect("json"));
    }

    #[test]
    fn transitions_keep_their_time_until_the_status_changes() {
        let t0: Timestamp = "2026-01-01T00:00:00Z".parse().expect("time");
        let t1: Timestamp = "2026-01-01T00:01:00Z".parse().expect("time");
        let ready = |s: &NodeStatus| {
            s.conditions
                .as_ref()
                .and_then(|c| c.iter().find(|c| c.type_ == "Ready").cloned())
                .expect("Ready condition")
        };
        let first = node_status(&id(), None, true, "", t0);
        let same = node_status(&id(), Some(&first), true, "", t1);
        assert_eq!(ready(&same).last_transition_time, Some(Time(t0)));
        assert_eq!(ready(&same).last_heartbeat_time, Some(Time(t1)));
        let down = node_status(&id(), Some(&same), false, "sandbox setup failing", t1);
        assert_eq!(ready(&down).status, "False");
        assert_eq!(ready(&down).last_transition_time, Some(Time(t1)));
        assert_eq!(
            ready(&down).message.as_deref(),
            Some("sandbox setup failing")
        );
    }

    #[test]
    fn node_object_has_cidr_and_labels() {
        let node = node_object(&id());
        let spec = node.spec.expect("spec");
        assert_eq!(spec.pod_cidr.as_deref(), Some("10.244.1.0/24"));
        let labels = node.metadata.labels.expect("labels");
        assert_eq!(labels["kubernetes.io/hostname"], "n1");
        assert_eq!(labels["zone"], "a");
        let l = lease("n1", 40, Timestamp::UNIX_EPOCH);
        assert_eq!(l.metadata.namespace.as_deref(), Some(LEASE_NAMESPACE));
        assert_eq!(
            l.spec.and_then(|s| s.holder_identity).as_deref(),
            Some("n1")
        );
    }
}
