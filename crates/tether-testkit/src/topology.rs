//! Simulated clusters built from network namespaces, for data-plane tests.
//!
//! Per cluster: pod namespaces bridged on a node namespace, the node routed to a gateway
//! namespace, and the gateway attached to a shared underlay namespace (a bridge on
//! 198.18.0.0/24), optionally through a NAT router namespace that masquerades it:
//!
//! ```text
//!  pod0 eth0 ─┐                       gateway                    underlay
//!  pod1 eth0 ─┤ cbr0 [node] gw0 ── node0 [gw] ul0 ───────────── gwN ─┐
//!             │                                                      ├ br0 198.18.0.1/24
//!                           (behind NAT)  ul0 ── lan0 [router] ul0 ─ rtN ─┘
//! ```
//!
//! Addresses: pods take `<pod subnet>.2…` where the pod subnet is the second /24 of the pod CIDR
//! (10.0.1.0/24 for 10.0.0.0/16), the node owns `.1` on its bridge; node and gateway share a /30
//! transit link; gateway N sits at 198.18.0.(10+N) on the underlay, or at 198.19.N.2 behind a
//! router whose public address is 198.18.0.(100+N). No namespace gets a route that leaves the
//! machine: pods default-route to their node, and nothing else has a default route.

use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

use crate::error::{Error, Result};
use crate::netns::Netns;

/// Name of the gateway's interface that pod traffic arrives on.
pub const GATEWAY_POD_INTERFACE: &str = "node0";
/// Name of the gateway's interface toward the underlay (or toward its NAT router).
pub const GATEWAY_UNDERLAY_INTERFACE: &str = "ul0";
/// Name of every pod's interface.
pub const POD_INTERFACE: &str = "eth0";

const UNDERLAY_BRIDGE: &str = "br0";
const UNDERLAY_NET: Ipv4Net = Ipv4Net::new_assert(Ipv4Addr::new(198, 18, 0, 0), 24);
const NAT_PRIVATE_BASE: [u8; 2] = [198, 19];
const MAX_CLUSTERS: usize = 80;
const MAX_PODS: usize = 200;
const DEFAULT_MTU: u32 = 1500;

/// Describes one simulated cluster.
#[derive(Debug, Clone)]
pub struct ClusterSpec {
    name: String,
    pod_cidr: String,
    pods: usize,
    behind_nat: bool,
    pod_mtu: u32,
    transit_cidr: String,
    routes_to_gateway: Vec<String>,
}

impl ClusterSpec {
    /// A cluster named `name` (1-8 characters of a-z, 0-9) with pod CIDR 10.0.0.0/16, one pod,
    /// MTU 1500 and a direct underlay attachment.
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            pod_cidr: "10.0.0.0/16".to_owned(),
            pods: 1,
            behind_nat: false,
            pod_mtu: DEFAULT_MTU,
            transit_cidr: "10.254.0.0/30".to_owned(),
            routes_to_gateway: Vec::new(),
        }
    }

    /// The cluster's pod CIDR (prefix length 8-23; clusters may overlap).
    pub fn pod_cidr(mut self, cidr: &str) -> Self {
        cidr.clone_into(&mut self.pod_cidr);
        self
    }

    /// How many pod namespaces to create (0-200).
    pub fn pods(mut self, count: usize) -> Self {
        self.pods = count;
        self
    }

    /// Puts the gateway behind a NAT router that masquerades it on the underlay.
    pub fn behind_nat(mut self) -> Self {
        self.behind_nat = true;
        self
    }

    /// MTU of the pod, bridge and node-gateway links (default 1500).
    pub fn pod_mtu(mut self, mtu: u32) -> Self {
        self.pod_mtu = mtu;
        self
    }

    /// The /30 linking node and gateway (default 10.254.0.0/30; the node takes the first host).
    pub fn transit_cidr(mut self, cidr: &str) -> Self {
        cidr.clone_into(&mut self.transit_cidr);
        self
    }

    /// Makes the node route `cidr` (for example the remapped CIDR of a peer) to the gateway.
    pub fn route_to_gateway(mut self, cidr: &str) -> Self {
        self.routes_to_gateway.push(cidr.to_owned());
        self
    }
}

/// Builds a [`Topology`].
#[derive(Debug, Clone)]
pub struct TopologyBuilder {
    clusters: Vec<ClusterSpec>,
    underlay_mtu: u32,
    underlay_offloads: bool,
}

impl Default for TopologyBuilder {
    fn default() -> Self {
        Self {
            clusters: Vec::new(),
            underlay_mtu: DEFAULT_MTU,
            underlay_offloads: true,
        }
    }
}

impl TopologyBuilder {
    /// Adds a cluster.
    pub fn cluster(mut self, spec: ClusterSpec) -> Self {
        self.clusters.push(spec);
        self
    }

    /// MTU of every underlay link (default 1500).
    pub fn underlay_mtu(mut self, mtu: u32) -> Self {
        self.underlay_mtu = mtu;
        self
    }

    /// Turns GSO and TSO off (`false`) or leaves them on (`true`, default) on every underlay
    /// veth. Off is what an MTU test wants: veth passes GSO super-packets without checking the
    /// MTU, which hides black holes. Needs the `ethtool` command.
    pub fn underlay_offloads(mut self, enabled: bool) -> Self {
        self.underlay_offloads = enabled;
        self
    }

    /// Creates every namespace, link, address, route and sysctl. On error, whatever was created
    /// is removed again.
    pub fn build(self) -> Result<Topology> {
        let plans = self.validate()?;
        let underlay = Netns::new("underlay")?;
        underlay.ip(&["link", "add", UNDERLAY_BRIDGE, "type", "bridge"])?;
        underlay.ip(&[
            "link",
            "set",
            UNDERLAY_BRIDGE,
            "mtu",
            &self.underlay_mtu.to_string(),
        ])?;
        underlay.ip(&[
            "addr",
            "add",
            &host_cidr(UNDERLAY_NET, 1),
            "dev",
            UNDERLAY_BRIDGE,
        ])?;
        underlay.ip(&["link", "set", UNDERLAY_BRIDGE, "up"])?;
        let mut topology = Topology {
            clusters: Vec::with_capacity(plans.len()),
            underlay,
            underlay_ip: nth_host(UNDERLAY_NET, 1),
        };
        for (index, plan) in plans.into_iter().enumerate() {
            let cluster = build_cluster(&self, &topology.underlay, index, plan)?;
            topology.clusters.push(cluster);
        }
        Ok(topology)
    }

    fn validate(&self) -> Result<Vec<ClusterPlan>> {
        if self.clusters.is_empty() {
            return Err(Error::Invalid(
                "a topology needs at least one cluster".into(),
            ));
        }
        if self.clusters.len() > MAX_CLUSTERS {
            return Err(Error::Invalid(format!(
                "at most {MAX_CLUSTERS} clusters are supported"
            )));
        }
        if !(576..=65535).contains(&self.underlay_mtu) {
            return Err(Error::Invalid(format!(
                "underlay MTU {} must be within 576-65535",
                self.underlay_mtu
            )));
        }
        let mut plans: Vec<ClusterPlan> = Vec::new();
        for spec in &self.clusters {
            let plan = ClusterPlan::from_spec(spec)?;
            if plans.iter().any(|p| p.name == plan.name) {
                return Err(Error::Invalid(format!(
                    "cluster name {:?} is used twice",
                    plan.name
                )));
            }
            plans.push(plan);
        }
        Ok(plans)
    }
}

/// A validated cluster spec with its derived addresses.
#[derive(Debug)]
struct ClusterPlan {
    name: String,
    pod_cidr: Ipv4Net,
    pod_subnet: Ipv4Net,
    pods: usize,
    behind_nat: bool,
    pod_mtu: u32,
    transit: Ipv4Net,
    routes_to_gateway: Vec<Ipv4Net>,
}

impl ClusterPlan {
    fn from_spec(spec: &ClusterSpec) -> Result<Self> {
        let name = &spec.name;
        let name_ok = !name.is_empty()
            && name.len() <= 8
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
        if !name_ok {
            return Err(Error::Invalid(format!(
                "cluster name {name:?} must be 1-8 characters of a-z and 0-9"
            )));
        }
        let pod_cidr = parse_net(name, "pod CIDR", &spec.pod_cidr)?;
        if !(8..=23).contains(&pod_cidr.prefix_len()) {
            return Err(Error::Invalid(format!(
                "cluster {name}: pod CIDR {pod_cidr} must have a prefix length of 8-23, so that \
                 its second /24 can hold the pods"
            )));
        }
        let pod_subnet =
            Ipv4Net::new_assert(Ipv4Addr::from(u32::from(pod_cidr.network()) + 256), 24);
        if spec.pods > MAX_PODS {
            return Err(Error::Invalid(format!(
                "cluster {name}: {} pods requested, at most {MAX_PODS} fit",
                spec.pods
            )));
        }
        if !(576..=65535).contains(&spec.pod_mtu) {
            return Err(Error::Invalid(format!(
                "cluster {name}: pod MTU {} must be within 576-65535",
                spec.pod_mtu
            )));
        }
        let transit = parse_net(name, "transit CIDR", &spec.transit_cidr)?;
        if transit.prefix_len() != 30 {
            return Err(Error::Invalid(format!(
                "cluster {name}: transit CIDR {transit} must be a /30"
            )));
        }
        if transit.contains(&pod_subnet.network()) || pod_subnet.contains(&transit.network()) {
            return Err(Error::Invalid(format!(
                "cluster {name}: transit CIDR {transit} overlaps the pod subnet {pod_subnet}"
            )));
        }
        let routes_to_gateway = spec
            .routes_to_gateway
            .iter()
            .map(|cidr| parse_net(name, "route to gateway", cidr))
            .collect::<Result<_>>()?;
        Ok(Self {
            name: name.clone(),
            pod_cidr,
            pod_subnet,
            pods: spec.pods,
            behind_nat: spec.behind_nat,
            pod_mtu: spec.pod_mtu,
            transit: transit.trunc(),
            routes_to_gateway,
        })
    }
}

fn parse_net(cluster: &str, what: &str, text: &str) -> Result<Ipv4Net> {
    text.parse::<Ipv4Net>().map(|n| n.trunc()).map_err(|_| {
        Error::Invalid(format!(
            "cluster {cluster}: {what} {text:?} is not an IPv4 CIDR like 10.0.0.0/16"
        ))
    })
}

fn nth_host(net: Ipv4Net, n: u32) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(net.network()) + n)
}

fn host_cidr(net: Ipv4Net, n: u32) -> String {
    format!("{}/{}", nth_host(net, n), net.prefix_len())
}

/// Creates a veth pair with one end in each namespace, sets its MTU and brings both ends up
/// (for ad-hoc links a test needs beyond its topology, such as a stand-in for a tunnel).
pub fn veth_pair(a: &Netns, a_name: &str, b: &Netns, b_name: &str, mtu: u32) -> Result<()> {
    veth(a, a_name, b, b_name, mtu)?;
    up(a, a_name)?;
    up(b, b_name)
}

/// Creates a veth pair with one end in each namespace (both down, MTU set).
fn veth(a: &Netns, a_name: &str, b: &Netns, b_name: &str, mtu: u32) -> Result<()> {
    // Creating both ends directly inside their namespaces avoids name clashes in the caller's.
    crate::netns::run_checked(std::process::Command::new("ip").args([
        "link",
        "add",
        a_name,
        "netns",
        a.name(),
        "type",
        "veth",
        "peer",
        "name",
        b_name,
        "netns",
        b.name(),
    ]))?;
    let mtu = mtu.to_string();
    a.ip(&["link", "set", a_name, "mtu", &mtu])?;
    b.ip(&["link", "set", b_name, "mtu", &mtu])?;
    Ok(())
}

fn up(ns: &Netns, interface: &str) -> Result<()> {
    ns.ip(&["link", "set", interface, "up"]).map(drop)
}

fn addr(ns: &Netns, cidr: &str, interface: &str) -> Result<()> {
    ns.ip(&["addr", "add", cidr, "dev", interface]).map(drop)
}

fn offloads_off(ns: &Netns, interface: &str) -> Result<()> {
    ns.exec_ok(&["ethtool", "-K", interface, "gso", "off", "tso", "off"])
        .map(drop)
}

fn build_cluster(
    builder: &TopologyBuilder,
    underlay: &Netns,
    index: usize,
    plan: ClusterPlan,
) -> Result<Cluster> {
    let name = &plan.name;
    let index_u8 = u8::try_from(index).expect("invariant: cluster count is validated");
    let index_u32 = u32::from(index_u8);
    let gateway = Netns::new(&format!("{name}-gw"))?;
    let node = Netns::new(&format!("{name}-node"))?;

    // Gateway toward the underlay, directly or through a NAT router.
    let underlay_mtu = builder.underlay_mtu;
    let (router, gateway_underlay_ip, public_ip) = if plan.behind_nat {
        let router = Netns::new(&format!("{name}-rt"))?;
        let port = format!("rt{index}");
        veth(&router, "ul0", underlay, &port, underlay_mtu)?;
        veth(
            &gateway,
            GATEWAY_UNDERLAY_INTERFACE,
            &router,
            "lan0",
            underlay_mtu,
        )?;
        let public = nth_host(UNDERLAY_NET, 100 + index_u32);
        let private_net = Ipv4Net::new_assert(
            Ipv4Addr::new(NAT_PRIVATE_BASE[0], NAT_PRIVATE_BASE[1], index_u8, 0),
            24,
        );
        addr(&router, &format!("{public}/24"), "ul0")?;
        addr(&router, &host_cidr(private_net, 1), "lan0")?;
        addr(
            &gateway,
            &host_cidr(private_net, 2),
            GATEWAY_UNDERLAY_INTERFACE,
        )?;
        underlay.ip(&["link", "set", &port, "master", UNDERLAY_BRIDGE])?;
        for (ns, interface) in [
            (&router, "ul0"),
            (&router, "lan0"),
            (underlay, port.as_str()),
        ] {
            up(ns, interface)?;
        }
        up(&gateway, GATEWAY_UNDERLAY_INTERFACE)?;
        gateway.ip(&[
            "route",
            "add",
            &UNDERLAY_NET.to_string(),
            "via",
            &nth_host(private_net, 1).to_string(),
        ])?;
        router.set_sysctl("net.ipv4.ip_forward", "1")?;
        router.nft(NAT_RULESET)?;
        if !builder.underlay_offloads {
            for (ns, interface) in [
                (&router, "ul0"),
                (&router, "lan0"),
                (underlay, port.as_str()),
            ] {
                offloads_off(ns, interface)?;
            }
        }
        (Some(router), nth_host(private_net, 2), public)
    } else {
        let port = format!("gw{index}");
        veth(
            &gateway,
            GATEWAY_UNDERLAY_INTERFACE,
            underlay,
            &port,
            underlay_mtu,
        )?;
        let ip = nth_host(UNDERLAY_NET, 10 + index_u32);
        addr(&gateway, &format!("{ip}/24"), GATEWAY_UNDERLAY_INTERFACE)?;
        underlay.ip(&["link", "set", &port, "master", UNDERLAY_BRIDGE])?;
        up(underlay, &port)?;
        up(&gateway, GATEWAY_UNDERLAY_INTERFACE)?;
        if !builder.underlay_offloads {
            offloads_off(underlay, &port)?;
        }
        (None, ip, ip)
    };
    if !builder.underlay_offloads {
        offloads_off(&gateway, GATEWAY_UNDERLAY_INTERFACE)?;
    }

    // Node ↔ gateway transit link.
    let mtu = plan.pod_mtu;
    veth(&node, "gw0", &gateway, GATEWAY_POD_INTERFACE, mtu)?;
    let node_transit_ip = nth_host(plan.transit, 1);
    let gateway_transit_ip = nth_host(plan.transit, 2);
    addr(&node, &host_cidr(plan.transit, 1), "gw0")?;
    addr(&gateway, &host_cidr(plan.transit, 2), GATEWAY_POD_INTERFACE)?;
    up(&node, "gw0")?;
    up(&gateway, GATEWAY_POD_INTERFACE)?;
    gateway.ip(&[
        "route",
        "add",
        &plan.pod_cidr.to_string(),
        "via",
        &node_transit_ip.to_string(),
    ])?;
    gateway.set_sysctl("net.ipv4.ip_forward", "1")?;

    // Node bridge and pods.
    node.ip(&["link", "add", "cbr0", "type", "bridge"])?;
    node.ip(&["link", "set", "cbr0", "mtu", &mtu.to_string()])?;
    let bridge_ip = nth_host(plan.pod_subnet, 1);
    addr(&node, &host_cidr(plan.pod_subnet, 1), "cbr0")?;
    up(&node, "cbr0")?;
    node.set_sysctl("net.ipv4.ip_forward", "1")?;
    let mut pods = Vec::with_capacity(plan.pods);
    let mut pod_ips = Vec::with_capacity(plan.pods);
    for pod_index in 0..plan.pods {
        let pod = Netns::new(&format!("{name}-pod{pod_index}"))?;
        let port = format!("pod{pod_index}");
        veth(&pod, POD_INTERFACE, &node, &port, mtu)?;
        let host = u32::try_from(2 + pod_index).expect("invariant: pod count is validated");
        addr(&pod, &host_cidr(plan.pod_subnet, host), POD_INTERFACE)?;
        up(&pod, POD_INTERFACE)?;
        pod.ip(&["route", "add", "default", "via", &bridge_ip.to_string()])?;
        node.ip(&["link", "set", &port, "master", "cbr0"])?;
        up(&node, &port)?;
        pods.push(pod);
        pod_ips.push(nth_host(plan.pod_subnet, host));
    }
    let cluster = Cluster {
        pods,
        node,
        gateway,
        router,
        name: plan.name,
        pod_cidr: plan.pod_cidr,
        pod_subnet: plan.pod_subnet,
        pod_ips,
        pod_mtu: plan.pod_mtu,
        gateway_underlay_ip,
        public_ip,
        node_transit_ip,
        gateway_transit_ip,
    };
    for cidr in plan.routes_to_gateway {
        cluster.route_to_gateway(cidr)?;
    }
    Ok(cluster)
}

/// The NAT router's ruleset: masquerade everything leaving toward the underlay.
const NAT_RULESET: &str = "\
table ip tt_nat {
  chain postrouting {
    type nat hook postrouting priority srcnat; policy accept;
    oifname \"ul0\" masquerade
  }
}
";

/// A set of simulated clusters on a shared underlay; every namespace is deleted on drop.
#[derive(Debug)]
pub struct Topology {
    // Field order is drop order: clusters before the underlay they are plugged into.
    clusters: Vec<Cluster>,
    underlay: Netns,
    underlay_ip: Ipv4Addr,
}

impl Topology {
    /// Starts describing a topology.
    pub fn builder() -> TopologyBuilder {
        TopologyBuilder::default()
    }

    /// The cluster called `name`.
    ///
    /// # Panics
    /// If there is no such cluster (a mistake in the test itself).
    pub fn cluster(&self, name: &str) -> &Cluster {
        self.try_cluster(name)
            .unwrap_or_else(|| panic!("the topology has no cluster {name:?}"))
    }

    /// The cluster called `name`, if any.
    pub fn try_cluster(&self, name: &str) -> Option<&Cluster> {
        self.clusters.iter().find(|c| c.name == name)
    }

    /// All clusters, in the order they were added.
    pub fn clusters(&self) -> &[Cluster] {
        &self.clusters
    }

    /// The underlay namespace (holds the bridge every gateway or router is plugged into).
    pub fn underlay(&self) -> &Netns {
        &self.underlay
    }

    /// The underlay namespace's own address (198.18.0.1), handy for servers run there.
    pub fn underlay_ip(&self) -> Ipv4Addr {
        self.underlay_ip
    }

    /// Names of every namespace of the topology.
    pub fn namespace_names(&self) -> Vec<String> {
        let mut names = vec![self.underlay.name().to_owned()];
        for cluster in &self.clusters {
            names.extend(cluster.namespaces().map(|ns| ns.name().to_owned()));
        }
        names
    }
}

/// One simulated cluster of a [`Topology`].
#[derive(Debug)]
pub struct Cluster {
    pods: Vec<Netns>,
    node: Netns,
    gateway: Netns,
    router: Option<Netns>,
    name: String,
    pod_cidr: Ipv4Net,
    pod_subnet: Ipv4Net,
    pod_ips: Vec<Ipv4Addr>,
    pod_mtu: u32,
    gateway_underlay_ip: Ipv4Addr,
    public_ip: Ipv4Addr,
    node_transit_ip: Ipv4Addr,
    gateway_transit_ip: Ipv4Addr,
}

impl Cluster {
    /// The cluster's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The gateway namespace.
    pub fn gateway(&self) -> &Netns {
        &self.gateway
    }

    /// The node namespace (bridges the pods, routes to the gateway).
    pub fn node(&self) -> &Netns {
        &self.node
    }

    /// Pod namespace number `index`.
    ///
    /// # Panics
    /// If the cluster has fewer pods.
    pub fn pod(&self, index: usize) -> &Netns {
        self.pods.get(index).unwrap_or_else(|| {
            panic!(
                "cluster {} has {} pods, no pod {index}",
                self.name,
                self.pods.len()
            )
        })
    }

    /// All pod namespaces.
    pub fn pods(&self) -> &[Netns] {
        &self.pods
    }

    /// The address of pod `index`.
    ///
    /// # Panics
    /// If the cluster has fewer pods.
    pub fn pod_ip(&self, index: usize) -> Ipv4Addr {
        *self.pod_ips.get(index).unwrap_or_else(|| {
            panic!(
                "cluster {} has {} pods, no pod {index}",
                self.name,
                self.pod_ips.len()
            )
        })
    }

    /// The cluster's pod CIDR.
    pub fn pod_cidr(&self) -> Ipv4Net {
        self.pod_cidr
    }

    /// The /24 of the pod CIDR that the pods actually use.
    pub fn pod_subnet(&self) -> Ipv4Net {
        self.pod_subnet
    }

    /// MTU of the pod, bridge and node-gateway links.
    pub fn pod_mtu(&self) -> u32 {
        self.pod_mtu
    }

    /// The gateway's interface that pod traffic arrives on.
    pub fn pod_facing_interface(&self) -> &str {
        GATEWAY_POD_INTERFACE
    }

    /// The gateway's interface toward the underlay (or toward its NAT router).
    pub fn underlay_interface(&self) -> &str {
        GATEWAY_UNDERLAY_INTERFACE
    }

    /// The gateway's own underlay address: reachable from the underlay when the cluster is not
    /// behind NAT; the private address behind the router otherwise.
    pub fn gateway_underlay_ip(&self) -> Ipv4Addr {
        self.gateway_underlay_ip
    }

    /// The address peers see the gateway's traffic come from: the router's underlay address for
    /// a NATed cluster, else the gateway's underlay address.
    pub fn public_ip(&self) -> Ipv4Addr {
        self.public_ip
    }

    /// Whether the gateway sits behind a NAT router.
    pub fn behind_nat(&self) -> bool {
        self.router.is_some()
    }

    /// The NAT router namespace, if the cluster is behind NAT.
    pub fn nat_router(&self) -> Option<&Netns> {
        self.router.as_ref()
    }

    /// The gateway's address on the node link (the next hop the node routes remote CIDRs to).
    pub fn gateway_transit_ip(&self) -> Ipv4Addr {
        self.gateway_transit_ip
    }

    /// The node's address on the gateway link (the gateway's next hop for the pod CIDR).
    pub fn node_transit_ip(&self) -> Ipv4Addr {
        self.node_transit_ip
    }

    /// Makes the node route `cidr` to the gateway (for CIDRs known only once a test has run
    /// its remap allocation).
    pub fn route_to_gateway(&self, cidr: Ipv4Net) -> Result<()> {
        self.node
            .ip(&[
                "route",
                "replace",
                &cidr.to_string(),
                "via",
                &self.gateway_transit_ip.to_string(),
            ])
            .map(drop)
    }

    fn namespaces(&self) -> impl Iterator<Item = &Netns> {
        [&self.gateway, &self.node]
            .into_iter()
            .chain(&self.router)
            .chain(&self.pods)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn invalid(builder: TopologyBuilder) -> String {
        match builder.validate() {
            Err(Error::Invalid(message)) => message,
            other => panic!("expected a validation error, got {other:?}"),
        }
    }

    #[test]
    fn derives_addresses() {
        let plans = Topology::builder()
            .cluster(ClusterSpec::new("a").pod_cidr("10.0.0.0/16").pods(3))
            .validate()
            .unwrap();
        assert_eq!(plans[0].pod_subnet.to_string(), "10.0.1.0/24");
        assert_eq!(plans[0].transit.to_string(), "10.254.0.0/30");
    }

    #[test]
    fn rejects_bad_specs_naming_the_problem() {
        assert!(invalid(Topology::builder()).contains("at least one cluster"));
        let m = invalid(Topology::builder().cluster(ClusterSpec::new("toolongname")));
        assert!(m.contains("toolongname"), "{m}");
        let m = invalid(Topology::builder().cluster(ClusterSpec::new("a").pod_cidr("10.0.0.0/24")));
        assert!(m.contains("prefix length"), "{m}");
        let m = invalid(Topology::builder().cluster(ClusterSpec::new("a").pod_cidr("ten")));
        assert!(m.contains("\"ten\""), "{m}");
        let m = invalid(
            Topology::builder()
                .cluster(ClusterSpec::new("a"))
                .cluster(ClusterSpec::new("a")),
        );
        assert!(m.contains("used twice"), "{m}");
        let m = invalid(Topology::builder().cluster(ClusterSpec::new("a").pods(500)));
        assert!(m.contains("500 pods"), "{m}");
        let m =
            invalid(Topology::builder().cluster(ClusterSpec::new("a").transit_cidr("10.0.1.0/30")));
        assert!(m.contains("overlaps"), "{m}");
        let m = invalid(
            Topology::builder()
                .cluster(ClusterSpec::new("a"))
                .underlay_mtu(100),
        );
        assert!(m.contains("underlay MTU 100"), "{m}");
    }
}
