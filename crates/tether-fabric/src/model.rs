//! Who the fabric's peers are, from Kubernetes objects: pure functions, tested with data.
//!
//! On a node, each remote cluster is a Configuration (its local-view CIDRs in
//! `status.remote.cidr`) served by the Ready gateway pod in the same namespace with the same
//! `tether.dev/remote-cluster-id` label; the pod's IP is the peer's underlay address and the
//! Connection's `status.mtu` the route MTU. A remote cluster without a Ready gateway pod gets
//! unreachable routes. In a gateway pod, every node is a peer: its InternalIP routes its pod
//! CIDRs.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};

use ipnet::Ipv4Net;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt as _;
use tether_api::names::{fabric, labels};
use tether_api::networking::{Configuration, Connection};
use tether_netplan::{DEFAULT_FABRIC_TABLE, FabricInput, FabricPeer};

/// The fabric settings of one namespace that do not come from the API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// The VXLAN device's name.
    pub device: String,
    /// VXLAN network identifier.
    pub vni: u32,
    /// UDP port of the underlay.
    pub port: u16,
    /// Our nftables table.
    pub table: String,
    /// This namespace's underlay address (a node's InternalIP, a gateway pod's IP).
    pub local_ip: Ipv4Addr,
    /// The device MTU ([`device_mtu`] of the uplink's).
    pub mtu: u32,
}

impl Settings {
    /// Tether's well-known device, VNI, port and table for `local_ip` and a device MTU.
    pub fn new(local_ip: Ipv4Addr, mtu: u32) -> Self {
        Self {
            device: fabric::DEVICE.to_owned(),
            vni: fabric::VNI,
            port: fabric::PORT,
            table: DEFAULT_FABRIC_TABLE.to_owned(),
            local_ip,
            mtu,
        }
    }

    fn input(&self, peers: Vec<FabricPeer>, unreachable: Vec<Ipv4Net>) -> FabricInput {
        FabricInput {
            device: self.device.clone(),
            vni: self.vni,
            port: self.port,
            local_ip: self.local_ip,
            mtu: self.mtu,
            table: self.table.clone(),
            peers,
            unreachable,
        }
    }
}

/// The device MTU over an uplink of `uplink_mtu` bytes: VXLAN over IPv4 takes
/// [`fabric::OVERHEAD`].
pub fn device_mtu(uplink_mtu: u32) -> u32 {
    uplink_mtu.saturating_sub(fabric::OVERHEAD)
}

/// A fabric input and what was left out of it, with the reason (for logs; a left-out object
/// never fails the whole fabric).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Built {
    /// The input for `tether_netplan::plan_fabric`.
    pub input: FabricInput,
    /// One line per object or CIDR left out.
    pub notes: Vec<String>,
}

/// A node's fabric: one peer per remote cluster with a Ready gateway pod, unreachable routes
/// for the others. `gateway_pods`, `configurations` and `connections` may come in any order
/// and may hold unrelated objects; the result depends only on their content.
pub fn node_input(
    settings: &Settings,
    gateway_pods: &[Pod],
    configurations: &[Configuration],
    connections: &[Connection],
) -> Built {
    let mut notes = Vec::new();
    let mut clusters: BTreeMap<String, (String, Vec<Ipv4Net>)> = BTreeMap::new();
    let mut sorted: Vec<&Configuration> = configurations.iter().collect();
    sorted.sort_by_key(|c| (c.namespace(), c.name_any()));
    for configuration in sorted {
        let key = object_key(configuration);
        if configuration.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let id = configuration
            .labels()
            .get(labels::REMOTE_CLUSTER_ID)
            .cloned()
            .unwrap_or_else(|| configuration.spec.remote.cluster_id.clone());
        let Some(remote) = configuration
            .status
            .as_ref()
            .and_then(|s| s.remote.as_ref())
        else {
            notes.push(format!(
                "configuration {key}: no local view of the remote CIDRs yet"
            ));
            continue;
        };
        let mut cidrs = Vec::new();
        for text in remote.cidr.pod.iter().chain(&remote.cidr.external) {
            match text.parse::<Ipv4Net>() {
                Ok(cidr) if cidr.trunc() == cidr => cidrs.push(cidr),
                Ok(cidr) => notes.push(format!(
                    "configuration {key}: CIDR {cidr} has host bits set; left out"
                )),
                Err(_) => notes.push(format!(
                    "configuration {key}: {text:?} is not an IPv4 CIDR; left out"
                )),
            }
        }
        if clusters.contains_key(&id) {
            notes.push(format!(
                "configuration {key}: remote cluster {id} already has a configuration; left out"
            ));
            continue;
        }
        clusters.insert(id, (namespace(configuration), cidrs));
    }

    let mut peers: BTreeMap<Ipv4Addr, FabricPeer> = BTreeMap::new();
    let mut unreachable = Vec::new();
    let mut claimed: Vec<(Ipv4Net, String)> = Vec::new();
    for (id, (ns, cidrs)) in &clusters {
        let gateway = ready_gateway(gateway_pods, ns, id);
        let mut own = Vec::new();
        for cidr in cidrs {
            if let Some((_, other)) = claimed.iter().find(|(c, _)| overlaps(*c, *cidr)) {
                notes.push(format!(
                    "remote cluster {id}: CIDR {cidr} overlaps one of remote cluster {other}; left out"
                ));
                continue;
            }
            let underlay = std::iter::once(settings.local_ip).chain(gateway);
            if let Some(ip) = underlay.into_iter().find(|ip| cidr.contains(ip)) {
                notes.push(format!(
                    "remote cluster {id}: CIDR {cidr} contains the underlay address {ip}; left out"
                ));
                continue;
            }
            claimed.push((*cidr, id.clone()));
            own.push(*cidr);
        }
        match gateway {
            Some(ip) => {
                let mtu = tunnel_mtu(connections, ns, id);
                let peer = peers.entry(ip).or_insert_with(|| FabricPeer {
                    ip,
                    cidrs: Vec::new(),
                    mtu,
                });
                peer.cidrs.extend(own);
                peer.mtu = match (peer.mtu, mtu) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
            }
            None => {
                notes.push(format!(
                    "remote cluster {id}: no Ready gateway pod; its CIDRs are unreachable"
                ));
                unreachable.extend(own);
            }
        }
    }
    Built {
        input: settings.input(peers.into_values().collect(), unreachable),
        notes,
    }
}

/// A gateway pod's fabric: every node with an InternalIP routes its pod CIDRs.
pub fn gateway_input(settings: &Settings, nodes: &[Node]) -> Built {
    let mut notes = Vec::new();
    let mut peers: BTreeMap<Ipv4Addr, FabricPeer> = BTreeMap::new();
    for node in nodes {
        let name = node.name_any();
        let Some(ip) = node_internal_ip(node) else {
            notes.push(format!("node {name}: no IPv4 InternalIP; left out"));
            continue;
        };
        if ip == settings.local_ip {
            continue;
        }
        let spec = node.spec.as_ref();
        let texts: Vec<&String> = spec
            .and_then(|s| s.pod_cidrs.as_ref())
            .filter(|list| !list.is_empty())
            .map(|list| list.iter().collect())
            .or_else(|| spec.and_then(|s| s.pod_cidr.as_ref()).map(|c| vec![c]))
            .unwrap_or_default();
        let mut cidrs = Vec::new();
        for text in texts {
            match text.parse::<Ipv4Net>() {
                Ok(cidr) if cidr.trunc() == cidr => cidrs.push(cidr),
                // IPv6 pod CIDRs of dual-stack nodes are not the IPv4 fabric's business.
                Err(_) if text.contains(':') => {}
                _ => notes.push(format!("node {name}: pod CIDR {text:?} left out")),
            }
        }
        if cidrs.is_empty() {
            notes.push(format!("node {name}: no IPv4 pod CIDR; left out"));
            continue;
        }
        peers.insert(
            ip,
            FabricPeer {
                ip,
                cidrs,
                mtu: None,
            },
        );
    }
    Built {
        input: settings.input(peers.into_values().collect(), Vec::new()),
        notes,
    }
}

/// A node's first IPv4 InternalIP.
pub fn node_internal_ip(node: &Node) -> Option<Ipv4Addr> {
    node.status
        .as_ref()?
        .addresses
        .as_ref()?
        .iter()
        .filter(|a| a.type_ == "InternalIP")
        .find_map(|a| a.address.parse::<Ipv4Addr>().ok())
}

/// The IP of the gateway pod serving `cluster` from namespace `ns`: Ready, not being deleted,
/// with an IPv4 address. During a rollout two can be Ready; the newest is the one that stays.
fn ready_gateway(pods: &[Pod], ns: &str, cluster: &str) -> Option<Ipv4Addr> {
    pods.iter()
        .filter(|p| p.namespace().as_deref() == Some(ns))
        .filter(|p| {
            let l = p.labels();
            l.get(labels::COMPONENT).map(String::as_str) == Some(labels::COMPONENT_GATEWAY)
                && l.get(labels::REMOTE_CLUSTER_ID).map(String::as_str) == Some(cluster)
        })
        .filter(|p| p.metadata.deletion_timestamp.is_none() && is_ready(p))
        .filter_map(|p| Some((p.creation_timestamp(), p.name_any(), pod_ipv4(p)?)))
        .max_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)))
        .map(|(_, _, ip)| ip)
}

fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn pod_ipv4(pod: &Pod) -> Option<Ipv4Addr> {
    match pod
        .status
        .as_ref()?
        .pod_ip
        .as_ref()?
        .parse::<IpAddr>()
        .ok()?
    {
        IpAddr::V4(ip) => Some(ip),
        IpAddr::V6(_) => None,
    }
}

/// The tunnel MTU the gateway reports for `cluster` in its Connection.
fn tunnel_mtu(connections: &[Connection], ns: &str, cluster: &str) -> Option<u32> {
    connections
        .iter()
        .filter(|c| c.namespace().as_deref() == Some(ns))
        .filter(|c| {
            c.labels()
                .get(labels::REMOTE_CLUSTER_ID)
                .map(String::as_str)
                == Some(cluster)
                || c.spec.remote_cluster_id == cluster
        })
        .filter_map(|c| c.status.as_ref()?.mtu)
        .min()
}

fn namespace(object: &impl kube::Resource) -> String {
    object.meta().namespace.clone().unwrap_or_default()
}

fn object_key(object: &impl kube::Resource) -> String {
    format!(
        "{}/{}",
        namespace(object),
        object.meta().name.clone().unwrap_or_default()
    )
}

fn overlaps(a: Ipv4Net, b: Ipv4Net) -> bool {
    a.contains(&b.network()) || b.contains(&a.network())
}
