//! `networking.tether.dev`: Configuration (CIDRs and remaps), GatewayServer and GatewayClient
//! (the two ends of a tunnel), Connection (its health) and IP (a local address published to
//! peers under a host of the external CIDR).

use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::conditions::{Condition, Time};
use crate::core::LocalObjectRef;

/// An IPv4 CIDR such as `10.244.0.0/16`.
const CIDR_PATTERN: &str = r"^([0-9]{1,3}\.){3}[0-9]{1,3}/([0-9]|[12][0-9]|3[0-2])$";

/// The network facts of a peering: the remote cluster's real CIDRs and, in the status, how this
/// cluster addresses them (remapped where they collide). Lives in the tenant namespace.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "networking.tether.dev",
    version = "v1alpha1",
    kind = "Configuration",
    plural = "configurations",
    shortname = "conf",
    category = "tether",
    namespaced,
    status = "ConfigurationStatus",
    derive = "PartialEq",
    crates(kube_core = "::kube_core"),
    doc = "The remote cluster's CIDRs and, in the status, how this cluster addresses them.",
    printcolumn(
        name = "Cluster ID",
        type_ = "string",
        json_path = ".spec.remote.clusterID"
    ),
    printcolumn(
        name = "Remote Pod CIDR",
        type_ = "string",
        json_path = ".spec.remote.cidr.pod[0]"
    ),
    printcolumn(
        name = "Remapped",
        type_ = "string",
        json_path = ".status.remote.cidr.pod[0]"
    ),
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
pub struct ConfigurationSpec {
    /// This cluster's own CIDRs, as sent to the remote cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local: Option<ClusterCidrs>,
    /// The remote cluster's real CIDRs.
    pub remote: ClusterCidrs,
}

/// A cluster's CIDRs.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterCidrs {
    /// The cluster's ID.
    #[serde(rename = "clusterID")]
    #[schemars(length(min = 1, max = 49), regex(pattern = crate::cluster_id::PATTERN))]
    pub cluster_id: String,
    /// The CIDRs.
    pub cidr: Cidrs,
}

/// Pod, Service and external CIDRs.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Cidrs {
    /// Pod CIDRs.
    #[serde(default)]
    #[schemars(length(max = 8), inner(regex(pattern = CIDR_PATTERN)))]
    pub pod: Vec<String>,
    /// Service CIDRs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8), inner(regex(pattern = CIDR_PATTERN)))]
    pub service: Vec<String>,
    /// External CIDRs: addresses through which the remote cluster reaches hosts outside
    /// both clusters via this one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8), inner(regex(pattern = CIDR_PATTERN)))]
    pub external: Vec<String>,
}

/// How this cluster addresses the remote one.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConfigurationStatus {
    /// The remote CIDRs as this cluster sees them (index-aligned with `spec.remote.cidr`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote: Option<ClusterCidrs>,
    /// Local addresses this cluster's gateway publishes to the remote cluster, each under a
    /// host of this cluster's external CIDR: the assigned IP objects of this cluster. The
    /// gateway applies changes to this list without restarting the tunnel.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 4096))]
    pub published: Vec<PublishedAddress>,
    /// Conditions; `Ready` once every remote CIDR has a local view.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// One local address a gateway publishes to its peer.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PublishedAddress {
    /// The address in this cluster's external CIDR; the peer reaches it at the same host of
    /// its view of that CIDR.
    #[schemars(regex(pattern = IPV4_PATTERN))]
    pub external: String,
    /// The local address it stands for.
    #[schemars(regex(pattern = IPV4_PATTERN))]
    pub ip: String,
    /// The IP object behind it, `namespace/name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
}

/// An IPv4 address such as `192.168.1.10`.
const IPV4_PATTERN: &str = r"^([0-9]{1,3}\.){3}[0-9]{1,3}$";

/// An address of this cluster's network that is not a pod (a host, a VM, a device next to the
/// cluster) made reachable from the pods of every peer, offloaded pods included: the
/// controller gives it a host of the external CIDR (`status.ip`) and every gateway of this
/// cluster publishes it there. A peer's pod reaches it at the same host of that peer's view of
/// this cluster's external CIDR.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "networking.tether.dev",
    version = "v1alpha1",
    kind = "IP",
    plural = "ips",
    shortname = "eip",
    category = "tether",
    namespaced,
    status = "IPStatus",
    derive = "PartialEq",
    crates(kube_core = "::kube_core"),
    doc = "A local address that is not a pod, published to every peer under a host of this cluster's external CIDR.",
    printcolumn(name = "IP", type_ = "string", json_path = ".spec.ip"),
    printcolumn(name = "External", type_ = "string", json_path = ".status.ip"),
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
pub struct IPSpec {
    /// The local IPv4 address to publish: not a pod or Service address (those are reached
    /// directly) and not inside the external CIDR. Immutable: to publish another address,
    /// delete the IP and create it again.
    #[schemars(
        regex(pattern = IPV4_PATTERN),
        extend("x-kubernetes-validations" = [{
            "rule": "self == oldSelf",
            "message": "spec.ip is immutable: delete this IP and create it again to publish another address"
        }])
    )]
    pub ip: String,
}

/// Where the address is published.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IPStatus {
    /// The address's host in this cluster's external CIDR, assigned once and kept while the
    /// object lives (hosts 1 and 2 stand for the control plane and are never assigned).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip: Option<String>,
    /// The external CIDR `ip` belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cidr: Option<String>,
    /// The local address `ip` stands for: `spec.ip` when it was published, kept if
    /// `spec.ip` is changed afterwards (which is refused).
    #[serde(default, rename = "localIP", skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = IPV4_PATTERN))]
    pub local_ip: Option<String>,
    /// Conditions; `Ready` once the address has a host and the gateways publish it, else why
    /// not and what to do.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// How a gateway server is exposed.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum ServiceType {
    /// A LoadBalancer Service (the default).
    #[default]
    LoadBalancer,
    /// A NodePort Service.
    NodePort,
    /// A ClusterIP Service (the client reaches it some other way).
    ClusterIP,
}

/// The listening end of a WireGuard tunnel to a remote cluster: a Deployment running
/// `tetherd gateway` behind a UDP Service. Lives in the tenant namespace.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "networking.tether.dev",
    version = "v1alpha1",
    kind = "GatewayServer",
    plural = "gatewayservers",
    shortname = "gws",
    category = "tether",
    namespaced,
    status = "GatewayServerStatus",
    derive = "PartialEq",
    crates(kube_core = "::kube_core"),
    doc = "The listening end of a WireGuard tunnel to a remote cluster.",
    printcolumn(
        name = "Cluster ID",
        type_ = "string",
        json_path = ".spec.remoteClusterID"
    ),
    printcolumn(
        name = "Type",
        type_ = "string",
        json_path = ".spec.endpoint.serviceType"
    ),
    printcolumn(
        name = "Address",
        type_ = "string",
        json_path = ".status.endpoint.addresses[0]"
    ),
    printcolumn(name = "Port", type_ = "integer", json_path = ".status.endpoint.port"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct GatewayServerSpec {
    /// The remote cluster at the other end.
    #[serde(rename = "remoteClusterID")]
    #[schemars(length(min = 1, max = 49), regex(pattern = crate::cluster_id::PATTERN))]
    pub remote_cluster_id: String,
    /// Tunnel MTU; derived from the path when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1280, max = 9000))]
    pub mtu: Option<u32>,
    /// How the server is exposed.
    pub endpoint: ServerEndpointSpec,
    /// The client's WireGuard public key, base64; the server accepts no other peer. Absent
    /// until the client's key exists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[A-Za-z0-9+/]{43}=$"))]
    pub client_public_key: Option<String>,
    /// Secret holding the gateway's WireGuard private key; generated when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<LocalObjectRef>,
    /// In-band peering: this gateway publishes its cluster's API server and authentication
    /// Service to the peer under hosts 1 and 2 of the local external CIDR.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub in_band: bool,
}

/// How a gateway server is exposed.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServerEndpointSpec {
    /// UDP port of the Service.
    #[schemars(range(min = 1, max = 65535))]
    pub port: u16,
    /// Service type.
    #[serde(default)]
    pub service_type: ServiceType,
    /// A fixed node port, for `NodePort`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub node_port: Option<u16>,
    /// A requested load-balancer address, for `LoadBalancer`.
    #[serde(
        rename = "loadBalancerIP",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub load_balancer_ip: Option<String>,
}

/// Where a gateway can be reached.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Endpoint {
    /// Addresses (IP addresses or host names) of the endpoint.
    #[serde(default)]
    #[schemars(length(max = 16))]
    pub addresses: Vec<String>,
    /// UDP port.
    #[schemars(range(min = 1, max = 65535))]
    pub port: u16,
}

/// Where a gateway pod runs inside its cluster.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InternalEndpoint {
    /// The gateway pod's IP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip: Option<String>,
    /// The node the gateway pod runs on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

/// Observed state of a gateway server.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GatewayServerStatus {
    /// Where the client should connect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<Endpoint>,
    /// The server's WireGuard public key, base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_key: Option<String>,
    /// Where the gateway pod runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub internal_endpoint: Option<InternalEndpoint>,
    /// Conditions; `Ready` once the Deployment is available and the Service has an address.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// The dialling end of a WireGuard tunnel to a remote cluster's gateway server. Lives in the
/// tenant namespace.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "networking.tether.dev",
    version = "v1alpha1",
    kind = "GatewayClient",
    plural = "gatewayclients",
    shortname = "gwc",
    category = "tether",
    namespaced,
    status = "GatewayClientStatus",
    derive = "PartialEq",
    crates(kube_core = "::kube_core"),
    doc = "The dialling end of a WireGuard tunnel to a remote cluster's gateway server.",
    printcolumn(
        name = "Cluster ID",
        type_ = "string",
        json_path = ".spec.remoteClusterID"
    ),
    printcolumn(
        name = "Server",
        type_ = "string",
        json_path = ".spec.endpoint.addresses[0]"
    ),
    printcolumn(name = "Port", type_ = "integer", json_path = ".spec.endpoint.port"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct GatewayClientSpec {
    /// The remote cluster at the other end.
    #[serde(rename = "remoteClusterID")]
    #[schemars(length(min = 1, max = 49), regex(pattern = crate::cluster_id::PATTERN))]
    pub remote_cluster_id: String,
    /// Tunnel MTU; derived from the path when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1280, max = 9000))]
    pub mtu: Option<u32>,
    /// The server to dial.
    pub endpoint: Endpoint,
    /// The server's WireGuard public key, base64.
    #[schemars(regex(pattern = r"^[A-Za-z0-9+/]{43}=$"))]
    pub server_public_key: String,
    /// Secret holding the client's WireGuard private key; generated when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<LocalObjectRef>,
    /// In-band peering: this gateway publishes its cluster's API server and authentication
    /// Service to the peer under hosts 1 and 2 of the local external CIDR.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub in_band: bool,
}

/// Observed state of a gateway client.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GatewayClientStatus {
    /// The client's WireGuard public key, base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_key: Option<String>,
    /// Where the gateway pod runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub internal_endpoint: Option<InternalEndpoint>,
    /// Conditions; `Ready` once the Deployment is available.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// Which end of the tunnel a Connection describes.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum GatewayType {
    /// The listening end.
    Server,
    /// The dialling end.
    Client,
}

/// Tunnel state as a Connection reports it.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ConnectionState {
    /// No handshake yet, or probes are failing for less than the dead interval.
    Connecting,
    /// Handshake done and probes answered.
    Connected,
    /// The tunnel cannot work; the conditions say why.
    Error,
}

/// The health of one tunnel, as measured by the local gateway. Lives in the tenant namespace.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "networking.tether.dev",
    version = "v1alpha1",
    kind = "Connection",
    plural = "connections",
    shortname = "conn",
    category = "tether",
    namespaced,
    status = "ConnectionStatus",
    derive = "PartialEq",
    crates(kube_core = "::kube_core"),
    doc = "The health of one tunnel, as measured by the local gateway.",
    printcolumn(
        name = "Cluster ID",
        type_ = "string",
        json_path = ".spec.remoteClusterID"
    ),
    printcolumn(name = "Type", type_ = "string", json_path = ".spec.type"),
    printcolumn(name = "Status", type_ = "string", json_path = ".status.value"),
    printcolumn(
        name = "Latency",
        type_ = "string",
        json_path = ".status.latency.value"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ConnectionSpec {
    /// The remote cluster at the other end.
    #[serde(rename = "remoteClusterID")]
    #[schemars(length(min = 1, max = 49), regex(pattern = crate::cluster_id::PATTERN))]
    pub remote_cluster_id: String,
    /// Which end this cluster is.
    #[serde(rename = "type")]
    pub type_: GatewayType,
    /// The GatewayServer or GatewayClient this connection belongs to.
    pub gateway_ref: LocalObjectRef,
}

/// Measured latency.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct Latency {
    /// Round-trip time through the tunnel, as a duration such as `1.2ms`.
    pub value: String,
    /// When it was measured.
    pub timestamp: Time,
}

/// Observed state of a tunnel.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConnectionStatus {
    /// Connecting, Connected or Error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<ConnectionState>,
    /// The last round-trip measurement.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency: Option<Latency>,
    /// When the last WireGuard handshake completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_handshake: Option<Time>,
    /// The tunnel MTU the gateway uses; nodes route the remote CIDRs with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 576, max = 9000))]
    pub mtu: Option<u32>,
    /// Conditions explaining the state.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}
