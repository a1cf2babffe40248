//! Well-known names: namespaces, labels, annotations, finalizers and object names that every
//! component and the CLI agree on.

use crate::ClusterId;

/// The namespace Tether is installed in.
pub const SYSTEM_NAMESPACE: &str = "tether-system";
/// Prefix of the per-peer namespace, on both sides of a peering.
pub const TENANT_NAMESPACE_PREFIX: &str = "tether-tenant-";

/// The per-peer namespace for the remote cluster `remote`.
pub fn tenant_namespace(remote: &ClusterId) -> String {
    format!("{TENANT_NAMESPACE_PREFIX}{remote}")
}

/// The Kubernetes username a consumer's client certificate carries on its provider.
pub fn consumer_username(consumer: &ClusterId) -> String {
    format!("tether:consumer:{consumer}")
}

/// Labels.
pub mod labels {
    /// The remote cluster an object belongs to.
    pub const REMOTE_CLUSTER_ID: &str = "tether.dev/remote-cluster-id";
    /// Marks a per-peer namespace.
    pub const TENANT_NAMESPACE: &str = "tether.dev/tenant-namespace";
    /// Which Tether part an object belongs to (`controller`, `auth`, `gateway`, ...).
    pub const COMPONENT: &str = "tether.dev/component";
    /// Marks a peering-token Secret.
    pub const PEERING_TOKEN: &str = "tether.dev/peering-token";
    /// The standard managed-by label; its value is [`MANAGED_BY_VALUE`].
    pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
    /// The value of [`MANAGED_BY`] on everything Tether creates.
    pub const MANAGED_BY_VALUE: &str = "tether";
    /// The standard part-of label, `tether` on everything `tether install` creates.
    pub const PART_OF: &str = "app.kubernetes.io/part-of";
    /// [`COMPONENT`] of gateway pods (one Deployment per peer, in its tenant namespace).
    pub const COMPONENT_GATEWAY: &str = "gateway";
    /// [`COMPONENT`] of the fabric DaemonSet's pods.
    pub const COMPONENT_FABRIC: &str = "fabric";
    /// What kind of Tether object a Kubernetes object stands for (on virtual nodes:
    /// [`TYPE_VIRTUAL_NODE`]), so that pods can select them with a nodeSelector.
    pub const TYPE: &str = "tether.dev/type";
    /// [`TYPE`] of the Node a virtual node registers.
    pub const TYPE_VIRTUAL_NODE: &str = "virtual-node";
    /// The consumer's namespace an object stands for: on a NamespaceOffloading request in a
    /// provider's tenant namespace, and on the twin namespace made for it.
    pub const ORIGIN_NAMESPACE: &str = "tether.dev/origin-namespace";
    /// On a provider's Pod: which Tether part made it ([`SHADOW_POD`]); distinct from the
    /// standard [`MANAGED_BY`] so that a consumer's own value there is kept.
    pub const TETHER_MANAGED_BY: &str = "tether.dev/managed-by";
    /// [`TETHER_MANAGED_BY`] of a Pod made from a ShadowPod.
    pub const SHADOW_POD: &str = "shadowpod";
    /// On a consumer's namespace: its pods may be offloaded (the pod admission webhook
    /// selects namespaces by it).
    pub const OFFLOADING_ENABLED: &str = "tether.dev/offloading-enabled";
    /// On a ShadowPod: the consumer's virtual node its pod is bound to.
    pub const VIRTUAL_NODE: &str = "tether.dev/virtual-node";
    /// On a ShadowPod, set by the provider once it has written the ShadowPod's status (value
    /// `true`). The consumer watches only ShadowPods that carry it: one it has just written
    /// tells it nothing new until the provider reports on it, and would cross the link once
    /// more for nothing.
    pub const STATUS_REPORTED: &str = "tether.dev/status-reported";

    /// The labels of an object the controller creates for itself: part of Tether, managed by
    /// Tether.
    pub fn managed() -> std::collections::BTreeMap<String, String> {
        std::collections::BTreeMap::from([
            (PART_OF.to_owned(), MANAGED_BY_VALUE.to_owned()),
            (MANAGED_BY.to_owned(), MANAGED_BY_VALUE.to_owned()),
        ])
    }
}

/// Taints.
pub mod taints {
    /// The `NoExecute` taint of a virtual node: only pods that tolerate it (those allowed to be
    /// offloaded) are scheduled there, and nothing else stays there.
    pub const NOT_ALLOWED: &str = "virtual-node.tether.dev/not-allowed";
}

/// Annotations.
pub mod annotations {
    /// When a peering token expires (RFC 3339).
    pub const TOKEN_EXPIRES: &str = "tether.dev/expires";
    /// A human note on a peering token (`--description`).
    pub const TOKEN_DESCRIPTION: &str = "tether.dev/description";
    /// On a GatewayServer or GatewayClient: the cluster whose consumer step manages the
    /// tunnel, so that the other direction of a two-way peering shares it instead.
    pub const TUNNEL_CONSUMER: &str = "tether.dev/tunnel-consumer";
}

/// Finalizers.
pub mod finalizers {
    /// Held by a ForeignCluster until its peering is torn down on both sides.
    pub const PEERING: &str = "core.tether.dev/peering";
    /// Held by a Tenant until its namespace, roles and identity are revoked.
    pub const TENANT: &str = "authentication.tether.dev/tenant";
    /// On a consumer's ResourceSlice: its copy at the provider is deleted first.
    pub const RESOURCE_SLICE: &str = "authentication.tether.dev/resource-slice";
    /// On a VirtualNode: its Node and Lease are deleted first.
    pub const VIRTUAL_NODE: &str = "offloading.tether.dev/virtual-node";
    /// On a provider's NamespaceOffloading request: its twin namespace is deleted, and gone,
    /// first.
    pub const TWIN_NAMESPACE: &str = "offloading.tether.dev/twin-namespace";
    /// On a consumer's NamespaceOffloading: its requests at the providers are withdrawn
    /// (and the twin namespaces with them) first.
    pub const NAMESPACE_OFFLOADING: &str = "offloading.tether.dev/namespace-offloading";
}

/// Storage: the class whose claims the controller provisions at the provider that runs the
/// pod using them.
pub mod storage {
    /// The StorageClass `tether install` creates.
    pub const STORAGE_CLASS: &str = "tether";
    /// Its provisioner, which the controller serves (and the CSI driver named in its volumes).
    pub const PROVISIONER: &str = "tether.dev/remote";
    /// The class parameter naming the provider's StorageClass for the twin claim; without it
    /// the provider's default class serves it.
    pub const PROVIDER_STORAGE_CLASS: &str = "providerStorageClass";
}

/// Names of objects `tether install` and the controller create in [`SYSTEM_NAMESPACE`].
pub mod objects {
    /// The controller's ServiceAccount, ClusterRole(Binding), Role(Binding) and Deployment.
    pub const CONTROLLER: &str = "tether-controller";
    /// The ClusterRole the controller binds to itself in each tenant namespace.
    pub const CONTROLLER_TENANT_ROLE: &str = "tether-controller-tenant";
    /// The ClusterRole bound to a consumer's identity in its tenant namespace on the provider.
    pub const TENANT_ROLE: &str = "tether-tenant";
    /// The ClusterRole bound to a consumer's identity in each of its twin namespaces on the
    /// provider (by a RoleBinding named [`TENANT_ROLE`]).
    pub const TENANT_OFFLOADED_ROLE: &str = "tether-tenant-offloaded";
    /// The authentication Service.
    pub const AUTH_SERVICE: &str = "tether-auth";
    /// ConfigMap holding the cluster ID (written once by `tether install`).
    pub const CLUSTER_ID_CONFIGMAP: &str = "tether-cluster-id";
    /// Key of the cluster ID in [`CLUSTER_ID_CONFIGMAP`].
    pub const CLUSTER_ID_KEY: &str = "clusterID";
    /// Secret with the cluster's Ed25519 key pair (created once by the controller).
    pub const IDENTITY_SECRET: &str = "tether-identity";
    /// Public facts peers may know: cluster ID, public key, authentication certificate
    /// fingerprint and URL. Written by the controller.
    pub const PUBLIC_IDENTITY_CONFIGMAP: &str = "tether-public-identity";
    /// Secret with the authentication service's TLS certificate and key.
    pub const AUTH_TLS_SECRET: &str = "tether-auth-tls";
    /// The Service in front of the controller's admission webhook.
    pub const WEBHOOK_SERVICE: &str = "tether-webhook";
    /// The webhook's CA and serving certificate (`ca.crt`, `tls.crt`, `tls.key`).
    pub const WEBHOOK_TLS_SECRET: &str = "tether-webhook-tls";
    /// The MutatingWebhookConfiguration that places pods of offloaded namespaces.
    pub const POD_WEBHOOK: &str = "tether-pods";
    /// The webhook's name inside it.
    pub const POD_WEBHOOK_NAME: &str = "pods.offloading.tether.dev";
    /// The path the pod webhook is served at.
    pub const POD_WEBHOOK_PATH: &str = "/mutate-pods";
    /// The Lease of the controller's leader election.
    pub const LEADER_LEASE: &str = "tether-controller";
    /// Secret (in the local tenant namespace) with the kubeconfig for a provider.
    pub const PROVIDER_KUBECONFIG_SECRET: &str = "tether-provider-kubeconfig";
    /// The container image of every Tether daemon.
    pub const IMAGE: &str = "ghcr.io/tether-dev/tetherd";
    /// In each tenant namespace: the GatewayServer or GatewayClient, its Deployment, Service,
    /// ServiceAccount and RoleBinding, and the Connection the gateway reports on. Also the
    /// ClusterRole that binding and the gateway's node-reading ClusterRoleBinding name.
    pub const GATEWAY: &str = "tether-gateway";
    /// ClusterRole letting a gateway read Nodes (bound per peer by a ClusterRoleBinding
    /// `tether-gateway-nodes-<remote>`).
    pub const GATEWAY_NODES_ROLE: &str = "tether-gateway-nodes";
    /// In each tenant namespace: the gateway's WireGuard key pair (keys in [`super::gateway_key`]).
    pub const GATEWAY_KEY_SECRET: &str = "tether-gateway-key";
    /// The fabric DaemonSet, its ServiceAccount and ClusterRole(Binding), in [`super::SYSTEM_NAMESPACE`].
    pub const FABRIC: &str = "tether-fabric";
    /// ConfigMap with this cluster's own CIDRs (keys in [`super::network`]), written by
    /// `tether install`.
    pub const NETWORK_CONFIGMAP: &str = "tether-network";
}

/// Keys of the gateway key Secret.
pub mod gateway_key {
    /// The WireGuard private key, base64 (never leaves the cluster).
    pub const PRIVATE_KEY: &str = "privateKey";
    /// The WireGuard public key, base64.
    pub const PUBLIC_KEY: &str = "publicKey";
}

/// Keys of the network ConfigMap: comma-separated IPv4 CIDRs.
pub mod network {
    /// The cluster's pod CIDRs.
    pub const POD_CIDRS: &str = "podCIDRs";
    /// The cluster's Service CIDRs.
    pub const SERVICE_CIDRS: &str = "serviceCIDRs";
    /// The external CIDR peers use to reach addresses outside this cluster's pods.
    pub const EXTERNAL_CIDR: &str = "externalCIDR";
    /// The one CIDR peers' colliding CIDRs are remapped into; RFC 1918 when absent.
    pub const REMAP_POOL: &str = "remapPool";
}

/// In-band peering: a provider publishes its control plane through the tunnel under fixed
/// hosts of its external CIDR, so a consumer that cannot reach it otherwise still can.
pub mod in_band {
    use std::net::Ipv4Addr;

    /// Host of the external CIDR standing for the `default/kubernetes` Service (the API server).
    pub const API_SERVER_HOST: u32 = 1;
    /// Host of the external CIDR standing for the authentication Service.
    pub const AUTH_HOST: u32 = 2;
    /// Port of the `default/kubernetes` Service.
    pub const API_SERVER_PORT: u16 = 443;
    /// The name every Kubernetes API server certificate carries; a kubeconfig pointing at an
    /// in-band address verifies the certificate against it (`tls-server-name`).
    pub const API_SERVER_NAME: &str = "kubernetes.default.svc";
    /// The default external CIDR of `tether install`. A cluster's remaps never use its own
    /// external CIDR; a peer with the same one sees it remapped.
    pub const DEFAULT_EXTERNAL_CIDR: &str = "10.70.0.0/16";

    /// Host `host` of the IPv4 CIDR `cidr` (`a.b.c.d/len`), or `None` when the text is no
    /// CIDR or the CIDR has no such host (the network and broadcast addresses are not hosts).
    pub fn address(cidr: &str, host: u32) -> Option<Ipv4Addr> {
        let (addr, len) = cidr.split_once('/')?;
        let addr: Ipv4Addr = addr.parse().ok()?;
        let len: u32 = len.parse().ok()?;
        if len > 30 || host == 0 {
            return None;
        }
        let size = 1u64 << (32 - len);
        if u64::from(host) >= size - 1 {
            return None;
        }
        let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
        Some(Ipv4Addr::from((u32::from(addr) & mask) + host))
    }

    /// The in-band API server URL for an external CIDR (as the consumer sees it).
    pub fn api_server_url(cidr: &str) -> Option<String> {
        address(cidr, API_SERVER_HOST).map(|a| format!("https://{a}:{API_SERVER_PORT}"))
    }

    /// The in-band authentication URL for an external CIDR (as the consumer sees it) and the
    /// authentication Service's port.
    pub fn auth_url(cidr: &str, port: u16) -> Option<String> {
        address(cidr, AUTH_HOST).map(|a| format!("https://{a}:{port}"))
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn hosts_of_the_external_cidr() {
            assert_eq!(
                address("10.70.0.0/16", API_SERVER_HOST),
                Some(Ipv4Addr::new(10, 70, 0, 1))
            );
            assert_eq!(
                address("10.71.0.0/16", AUTH_HOST),
                Some(Ipv4Addr::new(10, 71, 0, 2))
            );
            // Host bits in the text do not shift the result.
            assert_eq!(
                address("10.70.3.4/16", AUTH_HOST),
                Some(Ipv4Addr::new(10, 70, 0, 2))
            );
            // A /30 has hosts 1 and 2; a /31 or /32 has no room for the convention.
            assert_eq!(
                address("192.0.2.4/30", AUTH_HOST),
                Some(Ipv4Addr::new(192, 0, 2, 6))
            );
            assert_eq!(address("192.0.2.4/31", API_SERVER_HOST), None);
            assert_eq!(address("192.0.2.4/30", 3), None, "the broadcast address");
            assert_eq!(address("not a cidr", 1), None);
            assert_eq!(address("10.70.0.0/16", 0), None);
            assert_eq!(
                api_server_url("10.70.0.0/16").as_deref(),
                Some("https://10.70.0.1:443")
            );
            assert_eq!(
                auth_url("10.80.0.0/16", 8443).as_deref(),
                Some("https://10.80.0.2:8443")
            );
        }
    }
}

/// The fabric overlay between every node and the gateway pods: one VXLAN device in each node's
/// and each gateway pod's network namespace.
pub mod fabric {
    /// Name of the VXLAN device.
    pub const DEVICE: &str = "tether-fabric";
    /// VXLAN network identifier.
    pub const VNI: u32 = 7700;
    /// UDP port of the VXLAN underlay (IANA's).
    pub const PORT: u16 = 4789;
    /// Bytes VXLAN adds to an inner packet over IPv4 (20 IP + 8 UDP + 8 VXLAN + 14 Ethernet).
    pub const OVERHEAD: u32 = 50;
}

/// Keys of the public identity ConfigMap.
pub mod public_identity {
    /// The cluster ID.
    pub const CLUSTER_ID: &str = "clusterID";
    /// The Ed25519 public key, base64.
    pub const PUBLIC_KEY: &str = "publicKey";
    /// `sha256:<hex>` of the authentication service's certificate (DER).
    pub const AUTH_FINGERPRINT: &str = "authFingerprint";
    /// The authentication service's URL as other clusters reach it.
    pub const AUTH_URL: &str = "authURL";
    /// The API server URL peers should use.
    pub const API_SERVER_URL: &str = "apiServerURL";
}

/// Keys of the identity Secret.
pub mod identity_secret {
    /// The cluster ID the key belongs to.
    pub const CLUSTER_ID: &str = "clusterID";
    /// PKCS#8 document of the Ed25519 key pair.
    pub const PRIVATE_KEY: &str = "privateKey.pk8";
    /// The raw 32-byte public key.
    pub const PUBLIC_KEY: &str = "publicKey";
}
