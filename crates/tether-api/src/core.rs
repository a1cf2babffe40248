//! `core.tether.dev`: ForeignCluster, one per remote cluster on each side of a peering.

use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::conditions::{Condition, Time};

/// A remote cluster this cluster peers with, in either direction. On a consumer it holds how
/// to reach the provider's authentication service; on a provider the controller creates it
/// when a consumer authenticates. Its status summarises every peering module.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "core.tether.dev",
    version = "v1alpha1",
    kind = "ForeignCluster",
    plural = "foreignclusters",
    shortname = "fc",
    category = "tether",
    status = "ForeignClusterStatus",
    derive = "PartialEq",
    crates(kube_core = "::kube_core"),
    doc = "A remote cluster this cluster peers with; its status summarises every peering module.",
    printcolumn(name = "Cluster ID", type_ = "string", json_path = ".spec.clusterID"),
    printcolumn(name = "Role", type_ = "string", json_path = ".status.role"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "Authentication",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Authentication\")].status"
    ),
    printcolumn(
        name = "Networking",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Networking\")].status"
    ),
    printcolumn(
        name = "Offloading",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Offloading\")].status"
    ),
    printcolumn(
        name = "API Server",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"APIServerReachable\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ForeignClusterSpec {
    /// The remote cluster's ID (a DNS-1123 label of at most 49 characters). The object's name
    /// must equal it.
    #[serde(rename = "clusterID")]
    #[schemars(length(min = 1, max = 49), regex(pattern = crate::cluster_id::PATTERN))]
    pub cluster_id: String,

    /// How this cluster reaches the remote cluster as its consumer. Present when this cluster
    /// consumes resources of the remote one (the remote is a provider); absent when the remote
    /// cluster only consumes from this one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<ProviderAccess>,

    /// Which peering modules are on for the direction in which this cluster is the consumer.
    #[serde(default)]
    pub modules: Modules,

    /// How the networking module builds the tunnel, when it is on.
    #[serde(default)]
    pub networking: NetworkingOptions,
}

/// Which cluster of a peering runs the listening end of the tunnel.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum GatewayServerSide {
    /// The consumer's controller chooses (the default): the provider listens first; if the
    /// tunnel does not connect in time, the consumer listens instead, and so on in turn until
    /// one connects, after which that side stays. An explicit `address` or `dialPort` fixes
    /// the provider as the listening side.
    #[default]
    Auto,
    /// The provider listens and the consumer dials it.
    Provider,
    /// The consumer listens and the provider dials it, for a provider that cannot be reached
    /// from outside (behind NAT).
    Consumer,
}

/// Options of the networking module, set by `tether peer`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkingOptions {
    /// Which cluster runs the gateway server; `status.networking.gatewayServer` says which
    /// one does.
    #[serde(default)]
    pub gateway_server: GatewayServerSide,
    /// How the gateway server's Service is exposed.
    #[serde(default)]
    pub service_type: crate::networking::ServiceType,
    /// UDP port of the gateway server's Service.
    #[serde(default = "NetworkingOptions::default_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: u16,
    /// Address the client dials instead of the one the server's Service reports (an address
    /// mapped on a NAT, for example).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub address: Option<String>,
    /// Port the client dials instead of the one the server's Service reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub dial_port: Option<u16>,
    /// Tunnel MTU; derived from the path when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1280, max = 9000))]
    pub mtu: Option<u32>,
}

impl NetworkingOptions {
    /// The gateway server's default UDP port.
    pub const DEFAULT_PORT: u16 = 51840;

    fn default_port() -> u16 {
        Self::DEFAULT_PORT
    }
}

impl Default for NetworkingOptions {
    fn default() -> Self {
        Self {
            gateway_server: GatewayServerSide::default(),
            service_type: crate::networking::ServiceType::default(),
            port: Self::DEFAULT_PORT,
            address: None,
            dial_port: None,
            mtu: None,
        }
    }
}

/// Where and how to authenticate to a provider.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderAccess {
    /// HTTPS URL of the provider's authentication service, for example
    /// `https://198.51.100.7:443`.
    #[serde(rename = "authURL")]
    #[schemars(
        length(max = 2048),
        regex(pattern = r"^https://[^\s/]+(:[0-9]{1,5})?/?$")
    )]
    pub auth_url: String,

    /// SHA-256 fingerprint of the authentication service's certificate, `sha256:` and 64
    /// lower-case hex digits. The consumer accepts no other certificate.
    #[schemars(regex(pattern = r"^sha256:[0-9a-f]{64}$"))]
    pub ca_fingerprint: String,

    /// Secret in `tether-system` holding the peering token under the key `token`. Needed only
    /// until the first identity is issued; the controller deletes the Secret afterwards.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_secret_ref: Option<LocalObjectRef>,

    /// In-band peering: the provider's authentication service and API server are reached
    /// through the tunnel, at hosts 2 and 1 of the provider's external CIDR as this cluster
    /// sees it. `authURL` is such an address, and the issued kubeconfig is rewritten to the
    /// in-band API server address (verified as `kubernetes.default.svc`). `tether peer
    /// --in-band` sets it after building the tunnel.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub in_band: bool,
}

/// A reference to an object by name, in a namespace the context defines.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct LocalObjectRef {
    /// Name of the object.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// A reference to a namespaced object.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct ObjectRef {
    /// Namespace of the object.
    #[schemars(length(min = 1, max = 63))]
    pub namespace: String,
    /// Name of the object.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// The peering modules. Authentication is the base of the others.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Modules {
    /// Authentication: the provider issues this cluster an identity confined to a tenant
    /// namespace.
    #[serde(default = "ModuleSpec::on")]
    pub authentication: ModuleSpec,
    /// Networking: a WireGuard tunnel joins the two clusters' pod networks.
    #[serde(default)]
    pub networking: ModuleSpec,
    /// Offloading: the provider's resources appear here as a virtual node.
    #[serde(default)]
    pub offloading: ModuleSpec,
}

impl Default for Modules {
    fn default() -> Self {
        Self {
            authentication: ModuleSpec::on(),
            networking: ModuleSpec::default(),
            offloading: ModuleSpec::default(),
        }
    }
}

/// One module's switch.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct ModuleSpec {
    /// Whether the module is on.
    #[serde(default)]
    pub enabled: bool,
}

impl ModuleSpec {
    /// An enabled module.
    pub fn on() -> Self {
        Self { enabled: true }
    }
}

/// What the remote cluster is to this one.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum Role {
    /// The remote cluster consumes resources of this one.
    Consumer,
    /// This cluster consumes resources of the remote one.
    Provider,
    /// Both directions.
    ConsumerAndProvider,
    /// Neither direction is established yet.
    Unknown,
}

/// Where a peering stands, for humans and metrics.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum Phase {
    /// Waiting for the first step.
    Pending,
    /// Authenticating to the provider.
    Authenticating,
    /// Authenticated; the tunnel of the networking module is being built.
    Connecting,
    /// Every enabled module is ready.
    Established,
    /// A module failed; the conditions say why.
    Failed,
    /// The peering is being torn down.
    Unpeering,
}

impl Phase {
    /// Every phase, for metrics that report a gauge per phase.
    pub const ALL: [Phase; 6] = [
        Self::Pending,
        Self::Authenticating,
        Self::Connecting,
        Self::Established,
        Self::Failed,
        Self::Unpeering,
    ];

    /// The wire form.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "Pending",
            Self::Authenticating => "Authenticating",
            Self::Connecting => "Connecting",
            Self::Established => "Established",
            Self::Failed => "Failed",
            Self::Unpeering => "Unpeering",
        }
    }
}

/// Observed state of a peering.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ForeignClusterStatus {
    /// What the remote cluster is to this one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<Role>,
    /// Where the peering stands.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    /// The remote API server this cluster talks to with its identity.
    #[serde(
        rename = "apiServerURL",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub api_server_url: Option<String>,
    /// The per-peer namespaces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant_namespace: Option<TenantNamespaces>,
    /// The identity this cluster holds on the provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<IdentityStatus>,
    /// Per-module conditions: Authentication, Networking, Offloading, APIServerReachable.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The networking module's choices that must outlive a controller restart; set by the
    /// consumer's controller while it manages the tunnel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub networking: Option<NetworkingStatus>,
}

/// How the consumer's controller runs the tunnel of a peering.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkingStatus {
    /// The cluster whose gateway listens now: Provider or Consumer (never Auto).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway_server: Option<GatewayServerSide>,
    /// Why that cluster listens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway_server_choice: Option<GatewayServerChoice>,
    /// With the automatic choice, before the tunnel first connects: when both gateways of the
    /// current side were in place. The other side is tried when the tunnel is not up within
    /// the attempt window after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt_started_at: Option<Time>,
    /// With the automatic choice: how many times the listening side was switched because the
    /// tunnel did not connect.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub switches: u32,
    /// True once the tunnel connected with this side. An automatic choice then stays, so a
    /// later outage shows as a dead tunnel rather than a switch.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub connected: bool,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// Why a cluster runs the gateway server of a peering.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum GatewayServerChoice {
    /// `spec.networking.gatewayServer` names the side.
    Requested,
    /// `spec.networking.address` or `dialPort` says how to dial the provider's gateway, so
    /// the provider listens.
    AddressGiven,
    /// Chosen automatically from which side's gateway could be reached.
    Automatic,
}

/// The per-peer namespaces on both sides.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct TenantNamespaces {
    /// The namespace in this cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local: Option<String>,
    /// The namespace in the remote cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote: Option<String>,
}

/// The identity a consumer holds on its provider.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IdentityStatus {
    /// The Secret holding the kubeconfig.
    pub secret_ref: ObjectRef,
    /// The Kubernetes username of the identity.
    pub username: String,
    /// When the current credential expires.
    pub expires_at: Time,
    /// When the controller renews it.
    pub renew_at: Time,
    /// How many times it has been renewed.
    #[serde(default)]
    pub renewals: u32,
}
