//! The virtual node as it should be, decided without IO: the Node (labels, taint, capacity,
//! addresses, node info, conditions with their reasons and messages), its Lease, the provider's
//! health from the probe record, and when a write is due. The task in `node_task` only reads
//! and writes what these functions return.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{
    DaemonEndpoint, Node, NodeAddress, NodeCondition, NodeDaemonEndpoints,
    NodeSpec as CoreNodeSpec, NodeStatus, NodeSystemInfo, Taint,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use tether_api::names::{labels, taints};

/// The field manager of every write of the virtual kubelet.
pub const FIELD_MANAGER: &str = "tether-virtual-kubelet";
/// The namespace of node Leases, as the kubelet uses.
pub const LEASE_NAMESPACE: &str = "kube-node-lease";
/// `status.nodeInfo.kubeletVersion`: the Kubernetes API version Tether is built against, with
/// a suffix that tells anyone reading `kubectl get nodes` that this is no real kubelet.
pub const KUBELET_VERSION: &str = "v1.33.0-tether";
/// `status.nodeInfo.osImage`.
pub const OS_IMAGE: &str = "Tether virtual node";

/// Condition types (the kubelet's set plus `NetworkUnavailable`, which CNI plugins report).
pub mod types {
    /// The node can run pods.
    pub const READY: &str = "Ready";
    /// The pod network to the node is down.
    pub const NETWORK_UNAVAILABLE: &str = "NetworkUnavailable";
    /// Memory is short.
    pub const MEMORY_PRESSURE: &str = "MemoryPressure";
    /// Disk is short.
    pub const DISK_PRESSURE: &str = "DiskPressure";
    /// Process IDs are short.
    pub const PID_PRESSURE: &str = "PIDPressure";
}

/// Condition reasons.
pub mod reasons {
    /// Ready=True.
    pub const READY: &str = "TetherVirtualNodeReady";
    /// Ready=False: no client for the provider yet, or no answer from it yet.
    pub const PROVIDER_UNKNOWN: &str = "ProviderUnknown";
    /// Ready=False: the provider's API server stopped answering.
    pub const PROVIDER_UNREACHABLE: &str = "ProviderUnreachable";
    /// Ready=False and NetworkUnavailable=True: the tunnel to the provider is down.
    pub const TUNNEL_DOWN: &str = "TunnelDown";
    /// Ready=False: the provider grants no resources.
    pub const NO_RESOURCES: &str = "NoResources";
    /// NetworkUnavailable=False: the tunnel is up.
    pub const TUNNEL_UP: &str = "TunnelUp";
    /// NetworkUnavailable=False: the networking module is off for this peer.
    pub const NETWORKING_OFF: &str = "NetworkingOff";
    /// MemoryPressure=False.
    pub const SUFFICIENT_MEMORY: &str = "TetherHasSufficientMemory";
    /// DiskPressure=False.
    pub const NO_DISK_PRESSURE: &str = "TetherHasNoDiskPressure";
    /// PIDPressure=False.
    pub const SUFFICIENT_PID: &str = "TetherHasSufficientPID";
}

/// What the Node should be (from the VirtualNode and its grant).
#[derive(Clone, Debug, PartialEq)]
pub struct NodeSpec {
    /// The Node's name.
    pub name: String,
    /// The provider's cluster ID.
    pub provider: String,
    /// Capacity, reported as allocatable too.
    pub capacity: BTreeMap<String, Quantity>,
    /// Extra labels (provider facts, VirtualNode labels). They never replace
    /// `tether.dev/type` or `tether.dev/remote-cluster-id`.
    pub labels: BTreeMap<String, String>,
    /// Whether to add the `NoExecute` taint only offloadable pods tolerate.
    pub taint: bool,
    /// The InternalIP (the controller pod's IP), if known.
    pub address: Option<String>,
    /// `status.daemonEndpoints.kubeletEndpoint.Port`, if the kubelet API is served.
    pub kubelet_port: Option<u16>,
}

/// The network module's view of the peer, from the ForeignCluster: `None` = module off (no
/// NetworkUnavailable reason from it), `Some(Ok)` = tunnel up, `Some(Err(why))` = down.
pub type Network = Option<Result<(), String>>;

/// What the probes of the provider's API server found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProviderHealth {
    /// No client for the provider: its identity is not issued yet, or was revoked.
    NoClient,
    /// A client, but no probe has concluded yet.
    Unknown,
    /// The provider answered within the allowed time.
    Reachable,
    /// The provider has not answered since `since` (its last answer, or when probing began).
    Unreachable {
        /// Since when.
        since: Timestamp,
        /// The last probe's error.
        error: String,
    },
}

/// Everything the Node's conditions depend on besides the spec.
#[derive(Clone, Debug, PartialEq)]
pub struct Health {
    /// The provider's API server.
    pub provider: ProviderHealth,
    /// The tunnel.
    pub network: Network,
}

/// The record the provider probes keep.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Probes {
    /// When the provider's client (first) became known; `None` while there is none.
    pub client_since: Option<Timestamp>,
    /// The last successful answer.
    pub last_answer: Option<Timestamp>,
    /// The error of the last failed probe, cleared by an answer.
    pub last_error: Option<String>,
}

impl Probes {
    /// The provider's health at `now`: reachable while its last answer is at most
    /// `unreachable_after` old. A provider that never answered is unknown until a probe fails.
    pub fn health(&self, now: Timestamp, unreachable_after: Duration) -> ProviderHealth {
        let Some(client_since) = self.client_since else {
            return ProviderHealth::NoClient;
        };
        let error = || {
            self.last_error.clone().unwrap_or_else(|| {
                format!(
                    "no answer for more than {}",
                    SignedDuration::try_from(unreachable_after)
                        .map_or_else(|_| format!("{unreachable_after:?}"), |d| format!("{d:#}"))
                )
            })
        };
        match self.last_answer {
            Some(answer) if age(answer, now) <= unreachable_after => ProviderHealth::Reachable,
            Some(answer) => ProviderHealth::Unreachable {
                since: answer,
                error: error(),
            },
            None if self.last_error.is_none() && age(client_since, now) <= unreachable_after => {
                ProviderHealth::Unknown
            }
            None => ProviderHealth::Unreachable {
                since: client_since,
                error: error(),
            },
        }
    }
}

impl Probes {
    /// How long after `now` the provider's health turns unreachable if no answer comes: the
    /// node task wakes then, so that NotReady follows `unreachable_after` to the moment
    /// rather than to the next probe. `None` while no such turn is pending.
    pub fn unreachable_in(&self, now: Timestamp, unreachable_after: Duration) -> Option<Duration> {
        let since = match (self.last_answer, self.client_since) {
            (Some(answer), _) => answer,
            (None, Some(client)) if self.last_error.is_none() => client,
            _ => return None,
        };
        let left = unreachable_after.checked_sub(age(since, now))?;
        // Health turns once the age is strictly beyond the limit.
        Some(left + Duration::from_millis(1))
    }
}

fn age(then: Timestamp, now: Timestamp) -> Duration {
    Duration::try_from(now.duration_since(then)).unwrap_or(Duration::ZERO)
}

/// The taint that keeps pods that may not be offloaded off the virtual node.
pub fn not_allowed_taint() -> Taint {
    Taint {
        key: taints::NOT_ALLOWED.to_owned(),
        value: Some("true".to_owned()),
        effect: "NoExecute".to_owned(),
        time_added: None,
    }
}

/// The Node's labels: the fixed ones, then `spec.labels`, then the two that identify a virtual
/// node and its provider, which nothing overrides.
pub fn node_labels(spec: &NodeSpec) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> = [
        ("type", "virtual-kubelet"),
        ("kubernetes.io/hostname", spec.name.as_str()),
        ("kubernetes.io/os", "linux"),
        ("kubernetes.io/arch", "amd64"),
        ("node.kubernetes.io/instance-type", "virtual-node"),
        ("kubernetes.io/role", "agent"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    out.extend(spec.labels.clone());
    out.insert(
        labels::TYPE.to_owned(),
        labels::TYPE_VIRTUAL_NODE.to_owned(),
    );
    out.insert(labels::REMOTE_CLUSTER_ID.to_owned(), spec.provider.clone());
    out
}

/// The Node's taints: those others put there (the node-lifecycle controller's, an admin's) kept
/// in their order, then ours when `spec.taint`. Taints are one atomic list for server-side
/// apply, so whoever writes it writes all of it.
pub fn node_taints(spec: &NodeSpec, current: Option<&Node>) -> Vec<Taint> {
    let mut out: Vec<Taint> = current
        .and_then(|n| n.spec.as_ref())
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|t| t.key != taints::NOT_ALLOWED)
        .collect();
    if spec.taint {
        out.push(not_allowed_taint());
    }
    out
}

/// The conditions for `spec` and `health` at `now`. `previous` are the conditions last
/// written: a condition keeps its `lastTransitionTime` while its status stays the same.
pub fn conditions(
    spec: &NodeSpec,
    health: &Health,
    previous: &[NodeCondition],
    now: Timestamp,
) -> Vec<NodeCondition> {
    let provider = &spec.provider;
    let mut problems: Vec<(&str, String)> = Vec::new();
    match &health.provider {
        ProviderHealth::NoClient => problems.push((
            reasons::PROVIDER_UNKNOWN,
            format!(
                "no credentials for the provider cluster {provider} yet: waiting for the \
                 authentication module to issue this cluster's identity there"
            ),
        )),
        ProviderHealth::Unknown => {
            // No verdict yet is no news: a Node that already reports on the provider (a
            // restarted controller adopting it) keeps that until the first probe ends, rather
            // than flapping NotReady on every restart.
            let ready = previous.iter().find(|c| c.type_ == types::READY);
            match ready.and_then(|c| c.reason.as_deref().map(|r| (r, c))) {
                Some((reasons::PROVIDER_UNREACHABLE, c)) => problems.push((
                    reasons::PROVIDER_UNREACHABLE,
                    c.message.clone().unwrap_or_default(),
                )),
                Some((reason, _)) if reason != reasons::PROVIDER_UNKNOWN => {}
                _ => problems.push((
                    reasons::PROVIDER_UNKNOWN,
                    format!(
                        "waiting for the first answer of the provider cluster {provider}'s API \
                         server"
                    ),
                )),
            }
        }
        ProviderHealth::Reachable => {}
        ProviderHealth::Unreachable { since, error } => problems.push((
            reasons::PROVIDER_UNREACHABLE,
            format!(
                "the API server of the provider cluster {provider} has not answered since \
                 {since:.0}: {error}"
            ),
        )),
    }
    let tunnel_down = match &health.network {
        Some(Err(why)) => {
            let message = format!("the tunnel to the provider cluster {provider} is down: {why}");
            problems.push((reasons::TUNNEL_DOWN, message.clone()));
            Some(message)
        }
        _ => None,
    };
    if spec.capacity.is_empty() {
        problems.push((
            reasons::NO_RESOURCES,
            format!("the provider cluster {provider} grants no resources (empty capacity)"),
        ));
    }
    let ready = match problems.first() {
        None => (
            "True",
            reasons::READY,
            format!("the provider cluster {provider} answers and grants resources"),
        ),
        Some((reason, _)) => (
            "False",
            *reason,
            problems
                .iter()
                .map(|(_, m)| m.as_str())
                .collect::<Vec<_>>()
                .join("; "),
        ),
    };
    let network = match (&health.network, tunnel_down) {
        (_, Some(message)) => ("True", reasons::TUNNEL_DOWN, message),
        (Some(_), None) => (
            "False",
            reasons::TUNNEL_UP,
            format!("the tunnel to the provider cluster {provider} is up"),
        ),
        (None, None) => (
            "False",
            reasons::NETWORKING_OFF,
            format!(
                "the networking module is off for the provider cluster {provider}: no \
                 tunnel to check"
            ),
        ),
    };
    let no_pressure = |what: &str| {
        format!(
            "the virtual node has sufficient {what} available: the provider cluster {provider} \
             enforces its own limits"
        )
    };
    [
        (types::NETWORK_UNAVAILABLE, network.0, network.1, network.2),
        (
            types::MEMORY_PRESSURE,
            "False",
            reasons::SUFFICIENT_MEMORY,
            no_pressure("memory"),
        ),
        (
            types::DISK_PRESSURE,
            "False",
            reasons::NO_DISK_PRESSURE,
            no_pressure("disk"),
        ),
        (
            types::PID_PRESSURE,
            "False",
            reasons::SUFFICIENT_PID,
            no_pressure("PID"),
        ),
        (types::READY, ready.0, ready.1, ready.2),
    ]
    .into_iter()
    .map(|(type_, status, reason, message)| {
        let transition = previous
            .iter()
            .find(|c| c.type_ == type_ && c.status == status)
            .and_then(|c| c.last_transition_time.clone())
            .unwrap_or(Time(now));
        NodeCondition {
            type_: type_.to_owned(),
            status: status.to_owned(),
            reason: Some(reason.to_owned()),
            message: Some(message),
            last_heartbeat_time: Some(Time(now)),
            last_transition_time: Some(transition),
        }
    })
    .collect()
}

/// The whole Node for `spec` and `health` at `now`. `previous` is the Node as last seen, with
/// the status last written: it supplies the taints of others and the transition times.
pub fn node(spec: &NodeSpec, health: &Health, previous: Option<&Node>, now: Timestamp) -> Node {
    let labels = node_labels(spec);
    let previous_conditions = previous
        .and_then(|n| n.status.as_ref())
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default();
    let label = |key: &str, default: &str| labels.get(key).cloned().unwrap_or(default.into());
    let mut addresses: Vec<NodeAddress> = spec
        .address
        .iter()
        .map(|a| NodeAddress {
            type_: "InternalIP".to_owned(),
            address: a.clone(),
        })
        .collect();
    addresses.push(NodeAddress {
        type_: "Hostname".to_owned(),
        address: spec.name.clone(),
    });
    Node {
        metadata: ObjectMeta {
            name: Some(spec.name.clone()),
            labels: Some(labels.clone()),
            ..ObjectMeta::default()
        },
        spec: Some(CoreNodeSpec {
            taints: Some(node_taints(spec, previous)),
            ..CoreNodeSpec::default()
        }),
        status: Some(NodeStatus {
            capacity: Some(spec.capacity.clone()),
            allocatable: Some(spec.capacity.clone()),
            conditions: Some(conditions(spec, health, previous_conditions, now)),
            addresses: Some(addresses),
            daemon_endpoints: spec.kubelet_port.map(|port| NodeDaemonEndpoints {
                kubelet_endpoint: Some(DaemonEndpoint {
                    port: i32::from(port),
                }),
            }),
            node_info: Some(NodeSystemInfo {
                architecture: label("kubernetes.io/arch", "amd64"),
                operating_system: label("kubernetes.io/os", "linux"),
                os_image: OS_IMAGE.to_owned(),
                kubelet_version: KUBELET_VERSION.to_owned(),
                container_runtime_version: format!("tether://{}", spec.provider),
                ..NodeSystemInfo::default()
            }),
            ..NodeStatus::default()
        }),
    }
}

/// Whether the Ready condition of `node` is True.
pub fn is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == types::READY))
        .is_some_and(|c| c.status == "True")
}

/// The Ready condition's reason and message, for logs.
pub fn ready_reason(node: &Node) -> (String, String) {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == types::READY))
        .map(|c| {
            (
                c.reason.clone().unwrap_or_default(),
                c.message.clone().unwrap_or_default(),
            )
        })
        .unwrap_or_default()
}

/// The server-side apply body for the Node's metadata and spec (no status: that goes through
/// the status subresource).
pub fn apply_body(node: &Node) -> Node {
    Node {
        metadata: ObjectMeta {
            name: node.metadata.name.clone(),
            labels: node.metadata.labels.clone(),
            ..ObjectMeta::default()
        },
        spec: node.spec.clone(),
        status: None,
    }
}

/// The server-side apply body for the status subresource.
pub fn status_body(node: &Node) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": node.metadata.name},
        "status": node.status,
    })
}

/// Whether the metadata and spec of `current` lack something `desired` has: a label missing or
/// different, or our taint present when it should not be or absent when it should. Labels and
/// taints of others are not drift.
pub fn spec_drift(desired: &Node, current: &Node) -> bool {
    let have = current.metadata.labels.clone().unwrap_or_default();
    let labels_drift = desired
        .metadata
        .labels
        .iter()
        .flatten()
        .any(|(k, v)| have.get(k) != Some(v));
    let ours = |n: &Node| -> Vec<Taint> {
        n.spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default()
            .into_iter()
            .filter(|t| t.key == taints::NOT_ALLOWED)
            .map(|t| Taint {
                time_added: None,
                ..t
            })
            .collect()
    };
    labels_drift || ours(desired) != ours(current)
}

/// Whether two statuses differ in anything but heartbeat times: only then is a write due before
/// the periodic refresh.
pub fn status_changed(written: Option<&NodeStatus>, desired: &NodeStatus) -> bool {
    fn strip(s: &NodeStatus) -> NodeStatus {
        let mut s = s.clone();
        for c in s.conditions.iter_mut().flatten() {
            c.last_heartbeat_time = None;
        }
        s
    }
    written.is_none_or(|w| strip(w) != strip(desired))
}

/// The node's Lease, as the kubelet keeps it: held by the node, owned by the Node object (so
/// that deleting the Node deletes it), renewed at `now`.
pub fn lease(name: &str, node_uid: &str, duration_seconds: i32, now: Timestamp) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(LEASE_NAMESPACE.to_owned()),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".to_owned(),
                kind: "Node".to_owned(),
                name: name.to_owned(),
                uid: node_uid.to_owned(),
                ..OwnerReference::default()
            }]),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(name.to_owned()),
            lease_duration_seconds: Some(duration_seconds),
            renew_time: Some(MicroTime(now)),
            ..LeaseSpec::default()
        }),
    }
}

#[cfg(test)]
mod tests;
