//! The service proxy's view of the cluster: plain structs distilled from Services,
//! EndpointSlices and Nodes, holding only what the rules depend on (pure, no IO).
//!
//! Only IPv4 is kept: IPv6 cluster IPs, addresses and slices are dropped here, so the planner
//! never sees them.

use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;

/// Label naming the Service an EndpointSlice belongs to.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// The default `sessionAffinityConfig.clientIP.timeoutSeconds` (3 hours), as the API server's.
pub const DEFAULT_AFFINITY_TIMEOUT: u32 = 10_800;

/// A transport protocol of a service port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
    /// SCTP (not proxied: the planner skips it with a warning).
    Sctp,
}

impl Protocol {
    /// Parses the Kubernetes spelling (`TCP`, `UDP`, `SCTP`); absent means TCP.
    pub fn parse(value: Option<&str>) -> Option<Self> {
        match value.unwrap_or("TCP") {
            "TCP" => Some(Self::Tcp),
            "UDP" => Some(Self::Udp),
            "SCTP" => Some(Self::Sctp),
            _ => None,
        }
    }

    /// The nftables keyword (`tcp`, `udp`, `sctp`).
    pub fn nft(self) -> &'static str {
        match self {
            Self::Tcp => "tcp",
            Self::Udp => "udp",
            Self::Sctp => "sctp",
        }
    }
}

/// One port of a Service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServicePort {
    /// `name` (empty for the single unnamed port); matched against the slices' port names.
    pub name: String,
    /// The protocol.
    pub protocol: Protocol,
    /// The port on the cluster IP, external IPs and load-balancer IPs.
    pub port: u16,
    /// The node port, for NodePort and LoadBalancer Services that have one.
    pub node_port: Option<u16>,
}

/// A Service as the proxy sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceInfo {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// IPv4 cluster IPs (empty for headless Services).
    pub cluster_ips: Vec<Ipv4Addr>,
    /// Ports.
    pub ports: Vec<ServicePort>,
    /// `spec.externalIPs` (IPv4), served like load-balancer IPs.
    pub external_ips: Vec<Ipv4Addr>,
    /// `status.loadBalancer.ingress[].ip` (IPv4).
    pub load_balancer_ips: Vec<Ipv4Addr>,
    /// `externalTrafficPolicy: Local`: external traffic only to this node's endpoints, with the
    /// client's address kept.
    pub external_local: bool,
    /// `internalTrafficPolicy: Local`: cluster-IP traffic only to this node's endpoints.
    pub internal_local: bool,
    /// `sessionAffinity: ClientIP` with its timeout in seconds.
    pub affinity_timeout: Option<u32>,
    /// `spec.loadBalancerSourceRanges` (IPv4, merged): only these sources reach the
    /// load-balancer IPs; empty means everyone.
    pub source_ranges: Vec<Ipv4Net>,
}

/// One port of an EndpointSlice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlicePort {
    /// The service port's name this port serves (empty for an unnamed port).
    pub name: String,
    /// The protocol.
    pub protocol: Protocol,
    /// The target port number (a named `targetPort` already resolved by the slice's writer).
    pub port: u16,
}

/// One endpoint of an EndpointSlice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// The endpoint's address (the first of `addresses`, as kube-proxy uses).
    pub ip: Ipv4Addr,
    /// `conditions.ready` (absent means ready).
    pub ready: bool,
    /// `conditions.serving` (absent means the same as `ready`).
    pub serving: bool,
    /// `conditions.terminating` (absent means not terminating).
    pub terminating: bool,
    /// `nodeName`.
    pub node_name: Option<String>,
}

/// An EndpointSlice as the proxy sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceInfo {
    /// Namespace of the slice and of its Service.
    pub namespace: String,
    /// The Service it belongs to (label `kubernetes.io/service-name`).
    pub service: String,
    /// Ports.
    pub ports: Vec<SlicePort>,
    /// Endpoints.
    pub endpoints: Vec<Endpoint>,
}

/// A Node as the route planner sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    /// Name.
    pub name: String,
    /// The IPv4 pod CIDR (`spec.podCIDRs` or `spec.podCIDR`).
    pub pod_cidr: Option<Ipv4Net>,
    /// The first `InternalIP` of `status.addresses` that is IPv4.
    pub internal_ip: Option<Ipv4Addr>,
}

fn ipv4(value: &str) -> Option<Ipv4Addr> {
    value.parse().ok()
}

impl ServiceInfo {
    /// The proxy's view of `service`; `None` for what it never proxies (ExternalName Services,
    /// objects without a name).
    pub fn from_service(service: &Service) -> Option<Self> {
        let spec = service.spec.as_ref()?;
        let kind = spec.type_.as_deref().unwrap_or("ClusterIP");
        if kind == "ExternalName" {
            return None;
        }
        let mut cluster_ips: Vec<Ipv4Addr> = match &spec.cluster_ips {
            Some(ips) if !ips.is_empty() => ips.iter().filter_map(|ip| ipv4(ip)).collect(),
            _ => spec
                .cluster_ip
                .as_deref()
                .and_then(ipv4)
                .into_iter()
                .collect(),
        };
        cluster_ips.dedup();
        let external_nodes = matches!(kind, "NodePort" | "LoadBalancer");
        let ports = spec
            .ports
            .iter()
            .flatten()
            .filter_map(|p| {
                Some(ServicePort {
                    name: p.name.clone().unwrap_or_default(),
                    protocol: Protocol::parse(p.protocol.as_deref())?,
                    port: u16::try_from(p.port).ok()?,
                    node_port: p
                        .node_port
                        .filter(|_| external_nodes)
                        .and_then(|n| u16::try_from(n).ok())
                        .filter(|n| *n != 0),
                })
            })
            .collect();
        let load_balancer_ips = if kind == "LoadBalancer" {
            service
                .status
                .as_ref()
                .and_then(|s| s.load_balancer.as_ref())
                .and_then(|lb| lb.ingress.as_ref())
                .into_iter()
                .flatten()
                .filter_map(|i| i.ip.as_deref().and_then(ipv4))
                .collect()
        } else {
            Vec::new()
        };
        let affinity_timeout = (spec.session_affinity.as_deref() == Some("ClientIP")).then(|| {
            spec.session_affinity_config
                .as_ref()
                .and_then(|c| c.client_ip.as_ref())
                .and_then(|c| c.timeout_seconds)
                .and_then(|t| u32::try_from(t).ok())
                .filter(|t| *t > 0)
                .unwrap_or(DEFAULT_AFFINITY_TIMEOUT)
        });
        Some(Self {
            namespace: service.metadata.namespace.clone()?,
            name: service.metadata.name.clone()?,
            cluster_ips,
            ports,
            external_ips: spec
                .external_ips
                .iter()
                .flatten()
                .filter_map(|ip| ipv4(ip))
                .collect(),
            load_balancer_ips,
            external_local: spec.external_traffic_policy.as_deref() == Some("Local"),
            internal_local: spec.internal_traffic_policy.as_deref() == Some("Local"),
            affinity_timeout,
            source_ranges: if kind == "LoadBalancer" {
                let ranges: Vec<Ipv4Net> = spec
                    .load_balancer_source_ranges
                    .iter()
                    .flatten()
                    .filter_map(|r| r.trim().parse::<Ipv4Net>().ok())
                    .collect();
                // Overlapping prefixes would make an invalid nftables interval set.
                Ipv4Net::aggregate(&ranges)
            } else {
                Vec::new()
            },
        })
    }
}

impl SliceInfo {
    /// The proxy's view of `slice`; `None` for slices that are not IPv4 or name no Service.
    pub fn from_slice(slice: &EndpointSlice) -> Option<Self> {
        if slice.address_type != "IPv4" {
            return None;
        }
        let service = slice.metadata.labels.as_ref()?.get(SERVICE_NAME_LABEL)?;
        let ports = slice
            .ports
            .iter()
            .flatten()
            .filter_map(|p| {
                Some(SlicePort {
                    name: p.name.clone().unwrap_or_default(),
                    protocol: Protocol::parse(p.protocol.as_deref())?,
                    port: u16::try_from(p.port?).ok().filter(|p| *p != 0)?,
                })
            })
            .collect();
        let endpoints = slice
            .endpoints
            .iter()
            .filter_map(|e| {
                let ip = ipv4(e.addresses.first()?)?;
                let conditions = e.conditions.clone().unwrap_or_default();
                let ready = conditions.ready.unwrap_or(true);
                Some(Endpoint {
                    ip,
                    ready,
                    serving: conditions.serving.unwrap_or(ready),
                    terminating: conditions.terminating.unwrap_or(false),
                    node_name: e.node_name.clone(),
                })
            })
            .collect();
        Some(Self {
            namespace: slice.metadata.namespace.clone()?,
            service: service.clone(),
            ports,
            endpoints,
        })
    }
}

impl NodeInfo {
    /// The route planner's view of `node`.
    pub fn from_node(node: &Node) -> Option<Self> {
        let spec = node.spec.as_ref();
        let pod_cidr = spec
            .and_then(|s| s.pod_cidrs.clone())
            .unwrap_or_default()
            .into_iter()
            .chain(spec.and_then(|s| s.pod_cidr.clone()))
            .find_map(|c| c.parse::<Ipv4Net>().ok())
            .map(|c| c.trunc());
        let internal_ip = node
            .status
            .as_ref()
            .and_then(|s| s.addresses.as_ref())
            .into_iter()
            .flatten()
            .filter(|a| a.type_ == "InternalIP")
            .find_map(|a| ipv4(&a.address));
        Some(Self {
            name: node.metadata.name.clone()?,
            pod_cidr,
            internal_ip,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn services_keep_what_the_rules_need() {
        let service: Service = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "shop"},
            "spec": {
                "type": "LoadBalancer",
                "clusterIP": "10.96.0.20",
                "clusterIPs": ["10.96.0.20", "fd00::20"],
                "externalIPs": ["198.18.5.5", "fd00::1"],
                "externalTrafficPolicy": "Local",
                "sessionAffinity": "ClientIP",
                "loadBalancerSourceRanges": ["198.18.0.0/16", "198.18.4.0/24 ", "10.1.0.0/16", "fd00::/8"],
                "ports": [
                    {"name": "http", "port": 80, "targetPort": "web", "nodePort": 30080},
                    {"name": "dns", "port": 53, "protocol": "UDP", "nodePort": 30053},
                    {"name": "weird", "port": 9, "protocol": "QUIC"}
                ]
            },
            "status": {"loadBalancer": {"ingress": [{"ip": "198.19.1.4"}, {"hostname": "x"}]}}
        }))
        .expect("service");
        let info = ServiceInfo::from_service(&service).expect("proxied");
        assert_eq!(info.cluster_ips, vec![Ipv4Addr::new(10, 96, 0, 20)]);
        assert_eq!(info.external_ips, vec![Ipv4Addr::new(198, 18, 5, 5)]);
        assert_eq!(info.load_balancer_ips, vec![Ipv4Addr::new(198, 19, 1, 4)]);
        assert!(info.external_local);
        assert!(!info.internal_local);
        assert_eq!(info.affinity_timeout, Some(DEFAULT_AFFINITY_TIMEOUT));
        assert_eq!(
            info.source_ranges,
            vec![
                "10.1.0.0/16".parse::<Ipv4Net>().expect("cidr"),
                "198.18.0.0/16".parse().expect("cidr")
            ]
        );
        assert_eq!(
            info.ports,
            vec![
                ServicePort {
                    name: "http".into(),
                    protocol: Protocol::Tcp,
                    port: 80,
                    node_port: Some(30080)
                },
                ServicePort {
                    name: "dns".into(),
                    protocol: Protocol::Udp,
                    port: 53,
                    node_port: Some(30053)
                },
            ]
        );
        let external_name: Service = serde_json::from_value(json!({
            "metadata": {"name": "ext", "namespace": "shop"},
            "spec": {"type": "ExternalName", "externalName": "example.org"}
        }))
        .expect("service");
        assert_eq!(ServiceInfo::from_service(&external_name), None);
        let headless: Service = serde_json::from_value(json!({
            "metadata": {"name": "db", "namespace": "shop"},
            "spec": {"clusterIP": "None", "ports": [{"port": 5432, "nodePort": 31000}]}
        }))
        .expect("service");
        let info = ServiceInfo::from_service(&headless).expect("headless is kept");
        assert!(info.cluster_ips.is_empty());
        assert_eq!(
            info.ports[0].node_port, None,
            "a ClusterIP Service has no node port"
        );
    }

    #[test]
    fn slices_default_their_conditions_as_the_api_documents() {
        let slice: EndpointSlice = serde_json::from_value(json!({
            "metadata": {"name": "web-abc", "namespace": "shop",
                         "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080}, {"name": "none"}],
            "endpoints": [
                {"addresses": ["10.244.1.2"], "nodeName": "n1"},
                {"addresses": ["10.244.1.3"], "conditions": {"ready": false, "serving": true,
                                                             "terminating": true}},
                {"addresses": ["not-an-ip"]}
            ]
        }))
        .expect("slice");
        let info = SliceInfo::from_slice(&slice).expect("IPv4 slice");
        assert_eq!(info.service, "web");
        assert_eq!(
            info.ports,
            vec![SlicePort {
                name: "http".into(),
                protocol: Protocol::Tcp,
                port: 8080
            }]
        );
        assert_eq!(info.endpoints.len(), 2);
        assert!(info.endpoints[0].ready && info.endpoints[0].serving);
        assert!(!info.endpoints[0].terminating);
        assert_eq!(info.endpoints[0].node_name.as_deref(), Some("n1"));
        assert!(!info.endpoints[1].ready && info.endpoints[1].serving);
        assert!(info.endpoints[1].terminating);
        let mut v6 = slice;
        v6.address_type = "IPv6".into();
        assert_eq!(SliceInfo::from_slice(&v6), None);
    }

    #[test]
    fn nodes_give_their_ipv4_pod_cidr_and_internal_ip() {
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": "n2"},
            "spec": {"podCIDR": "10.244.2.7/24", "podCIDRs": ["fd00:2::/64", "10.244.2.7/24"]},
            "status": {"addresses": [{"type": "Hostname", "address": "n2"},
                                     {"type": "InternalIP", "address": "fd00::2"},
                                     {"type": "InternalIP", "address": "198.18.1.12"}]}
        }))
        .expect("node");
        let info = NodeInfo::from_node(&node).expect("named");
        assert_eq!(info.pod_cidr, Some("10.244.2.0/24".parse().expect("cidr")));
        assert_eq!(info.internal_ip, Some(Ipv4Addr::new(198, 18, 1, 12)));
    }
}
