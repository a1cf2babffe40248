//! The service proxy's planner (pure, no IO): from the cluster's Services and EndpointSlices
//! it renders one nftables script that replaces the proxy's table as a whole, in the shape of
//! kube-proxy's nftables mode; from the Nodes it derives the host-gw routes to other nodes'
//! pod CIDRs.
//!
//! Invariants the IO side relies on:
//! - The script is one transaction (`table X {}` + `delete table X` + the full table), so
//!   applying it never leaves a half-updated table, and it only ever touches its own table.
//! - The same cluster state gives byte-identical output whatever the order of the inputs
//!   (services, slices, endpoints), so comparing scripts detects real changes only.
//!
//! Traffic paths (all in the node's network namespace):
//! - `nat-prerouting`/`nat-output` → `services`: `ip daddr . l4proto . dport` looks up cluster
//!   IPs, external IPs and load-balancer IPs; `fib daddr type local` plus `l4proto . dport`
//!   looks up node ports. Hits jump to a per-port chain that marks for masquerading where
//!   needed and picks an endpoint with `numgen random` (after a ClientIP affinity lookup).
//! - `filter-*` (priority -110, before DNAT): new connections to a service port with no usable
//!   endpoint are rejected (TCP reset, ICMP port unreachable otherwise); after DNAT, a cluster
//!   IP at a port it does not serve is rejected too. New connections to a load-balancer IP from
//!   outside its `loadBalancerSourceRanges` are dropped (`filter-prerouting`/`filter-output`).
//! - `nat-postrouting`: marked packets (node ports, load-balancer and external IPs with the
//!   Cluster policy, hairpin, non-pod sources reaching a cluster IP) are masqueraded; pod traffic
//!   leaving the cluster CIDR through the node's uplink is masqueraded to the node (as
//!   ip-masq-agent does; other devices, like a fabric's tunnels, keep pod addresses).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

use super::model::{NodeInfo, Protocol, ServiceInfo, ServicePort, SliceInfo};

/// kube-proxy's masquerade bit.
pub const DEFAULT_MASQUERADE_MARK: u32 = 0x4000;

/// Everything the nftables plan depends on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyInput {
    /// Name of the proxy's own table (family `ip`).
    pub table: String,
    /// This node's name: endpoints with this `nodeName` are local.
    pub node_name: String,
    /// The cluster's pod CIDR: sources inside it are pods.
    pub cluster_cidr: Ipv4Net,
    /// The service CIDR, if known: addresses in it that are no Service's are dropped rather
    /// than routed out of the node.
    pub service_cidr: Option<Ipv4Net>,
    /// The packet mark bit that asks for masquerading in postrouting.
    pub masquerade_mark: u32,
    /// Masquerade pod traffic to destinations outside `cluster_cidr`.
    pub egress_masquerade: bool,
    /// The node's uplink (the interface toward the cluster network): pod egress is masqueraded
    /// only when it leaves through it, so traffic a network fabric sends out of its own devices
    /// (a VXLAN or WireGuard link) keeps the pod's address. `None`: whatever the interface.
    pub uplink: Option<String>,
    /// The Services.
    pub services: Vec<ServiceInfo>,
    /// The EndpointSlices.
    pub slices: Vec<SliceInfo>,
}

/// The rendered plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The `nft -f -` script.
    pub script: String,
    /// Service ports proxied (with or without endpoints).
    pub service_ports: usize,
    /// Endpoint chains (one per service port and endpoint).
    pub endpoints: usize,
    /// What was left out and why (SCTP, addresses claimed twice), sorted.
    pub warnings: Vec<String>,
    /// Every UDP endpoint (address, port) the rules send to: when one disappears, its
    /// conntrack entries must go too.
    pub udp_targets: BTreeSet<(Ipv4Addr, u16)>,
    /// Every UDP address and port (`None`: a node port on any local address) the rules DNAT:
    /// when one appears, flows that reached it untranslated before must go.
    pub udp_frontends: BTreeSet<(Option<Ipv4Addr>, u16)>,
}

/// One resolved endpoint of a service port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Target {
    ip: Ipv4Addr,
    port: u16,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct TargetState {
    ready: bool,
    serving: bool,
    not_terminating: bool,
    local: bool,
}

/// The endpoints of one service port, already filtered as kube-proxy does.
#[derive(Debug, Default)]
struct PortEndpoints {
    /// Ready endpoints anywhere; if none, serving-and-terminating ones.
    cluster: Vec<Target>,
    /// The same choice among this node's endpoints.
    local: Vec<Target>,
}

fn usable(all: &BTreeMap<Target, TargetState>, local_only: bool) -> Vec<Target> {
    let pick = |f: &dyn Fn(&TargetState) -> bool| -> Vec<Target> {
        all.iter()
            .filter(|(_, s)| (!local_only || s.local) && f(s))
            .map(|(t, _)| *t)
            .collect()
    };
    let ready = pick(&|s| s.ready);
    if ready.is_empty() {
        // kube-proxy falls back to endpoints that are terminating but still serving, so a
        // rolling update of the last pod does not drop connections.
        pick(&|s| s.serving && !s.not_terminating)
    } else {
        ready
    }
}

fn endpoints_of(
    service: &ServiceInfo,
    port: &ServicePort,
    slices: &[&SliceInfo],
    node: &str,
) -> PortEndpoints {
    let mut all: BTreeMap<Target, TargetState> = BTreeMap::new();
    for slice in slices {
        debug_assert_eq!(slice.service, service.name);
        let Some(slice_port) = slice
            .ports
            .iter()
            .find(|p| p.name == port.name && p.protocol == port.protocol)
        else {
            continue;
        };
        for endpoint in &slice.endpoints {
            let target = Target {
                ip: endpoint.ip,
                port: slice_port.port,
            };
            let state = TargetState {
                ready: endpoint.ready,
                serving: endpoint.serving,
                not_terminating: !endpoint.terminating,
                local: endpoint.node_name.as_deref() == Some(node),
            };
            // The same endpoint in two slices (a move in progress): keep the better view,
            // whichever slice came first.
            let entry = all.entry(target).or_insert(state);
            *entry = (*entry).max(state);
        }
    }
    PortEndpoints {
        cluster: usable(&all, false),
        local: usable(&all, true),
    }
}

/// A stable short hash (FNV-1a, base32), so chain names are unique even when names had to be
/// sanitized and identical from one run to the next.
fn short_hash(text: &str) -> String {
    const ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in text.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (0..8)
        .map(|i| char::from(ALPHABET[usize::try_from((hash >> (i * 5)) & 31).unwrap_or(0)]))
        .collect()
}

/// `kind-HASH-readable`: nftables identifiers allow letters, digits, `/`, `-`, `_` and `.`;
/// Kubernetes names already fit, anything else is replaced, and the hash keeps names unique.
fn chain_name(kind: &str, key: &str) -> String {
    let readable: String = key
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '/' | '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .take(200)
        .collect();
    format!("{kind}-{}-{readable}", short_hash(key))
}

fn quote(comment: &str) -> String {
    let clean: String = comment
        .chars()
        .filter(|c| !c.is_control() && *c != '"')
        .take(120)
        .collect();
    format!("\"{clean}\"")
}

/// Map elements keyed by their rendered key; the first claimant of a key wins.
#[derive(Default)]
struct Elements {
    entries: BTreeMap<String, (String, String)>,
}

impl Elements {
    fn add(&mut self, key: String, comment: &str, value: String, warnings: &mut Vec<String>) {
        match self.entries.get(&key) {
            Some((owner, _)) => warnings.push(format!(
                "{comment}: {key} is already served for {owner}; ignored"
            )),
            None => {
                self.entries.insert(key, (comment.to_owned(), value));
            }
        }
    }

    fn render(&self, out: &mut String, header: &str) {
        let _ = writeln!(out, "\tmap {header}");
        if !self.entries.is_empty() {
            out.push_str("\t\telements = {\n");
            let last = self.entries.len() - 1;
            for (i, (key, (comment, value))) in self.entries.iter().enumerate() {
                let sep = if i == last { "" } else { "," };
                let _ = writeln!(out, "\t\t\t{key} comment {} : {value}{sep}", quote(comment));
            }
            out.push_str("\t\t}\n");
        }
        out.push_str("\t}\n");
    }
}

struct Chain {
    name: String,
    rules: Vec<String>,
}

struct Builder<'a> {
    input: &'a ProxyInput,
    service_ips: Elements,
    node_ports: Elements,
    no_endpoint_services: Elements,
    no_endpoint_node_ports: Elements,
    firewall_ips: Elements,
    cluster_ips: BTreeSet<Ipv4Addr>,
    affinity_sets: Vec<(String, u32)>,
    chains: Vec<Chain>,
    endpoint_chains: BTreeSet<String>,
    udp_targets: BTreeSet<(Ipv4Addr, u16)>,
    udp_frontends: BTreeSet<(Option<Ipv4Addr>, u16)>,
    warnings: Vec<String>,
    service_ports: usize,
}

const MARK_CHAIN: &str = "mark-for-masquerade";
const REJECT_CHAIN: &str = "reject-chain";

impl Builder<'_> {
    fn mark(&self) -> String {
        format!("{:#x}", self.input.masquerade_mark)
    }

    /// The endpoint chain of `target` (created once): hairpin masquerade, affinity, DNAT.
    fn endpoint_chain(&mut self, key: &str, proto: Protocol, target: Target, affinity: bool) {
        let name = endpoint_chain_name(key, target);
        if !self.endpoint_chains.insert(name.clone()) {
            return;
        }
        if proto == Protocol::Udp {
            self.udp_targets.insert((target.ip, target.port));
        }
        let mut rules = vec![
            // Hairpin: a pod reaching itself through the Service must see the reply come
            // back through the node, so its source becomes the node side of its veth.
            format!("ip saddr {} jump {MARK_CHAIN}", target.ip),
        ];
        if affinity {
            rules.push(format!(
                "update @{} {{ ip saddr }}",
                affinity_set_name(&name)
            ));
        }
        rules.push(format!(
            "meta l4proto {} dnat to {}:{}",
            proto.nft(),
            target.ip,
            target.port
        ));
        self.chains.push(Chain { name, rules });
    }

    /// A chain choosing one of `targets` at random (ClientIP affinity first), or dropping.
    fn dispatch_chain(
        &mut self,
        name: String,
        key: &str,
        proto: Protocol,
        targets: &[Target],
        affinity: Option<u32>,
    ) {
        let mut rules = Vec::new();
        for target in targets {
            self.endpoint_chain(key, proto, *target, affinity.is_some());
        }
        if let Some(timeout) = affinity {
            for target in targets {
                let endpoint = endpoint_chain_name(key, *target);
                let set = affinity_set_name(&endpoint);
                rules.push(format!("ip saddr @{set} goto {endpoint}"));
                self.affinity_sets.push((set, timeout));
            }
        }
        match targets {
            [] => rules.push("drop".to_owned()),
            [only] => rules.push(format!("goto {}", endpoint_chain_name(key, *only))),
            many => {
                let arms: Vec<String> = many
                    .iter()
                    .enumerate()
                    .map(|(i, t)| format!("{i} : goto {}", endpoint_chain_name(key, *t)))
                    .collect();
                rules.push(format!(
                    "numgen random mod {} vmap {{ {} }}",
                    many.len(),
                    arms.join(", ")
                ));
            }
        }
        self.chains.push(Chain { name, rules });
    }

    fn service_port(&mut self, service: &ServiceInfo, port: &ServicePort, slices: &[&SliceInfo]) {
        let display = if port.name.is_empty() {
            format!("{}/{}", service.namespace, service.name)
        } else {
            format!("{}/{}:{}", service.namespace, service.name, port.name)
        };
        if port.protocol == Protocol::Sctp {
            self.warnings.push(format!(
                "{display}: SCTP port {} is not proxied (only TCP and UDP are)",
                port.port
            ));
            return;
        }
        self.service_ports += 1;
        let proto = port.protocol.nft();
        let key = format!(
            "{}/{}/{proto}/{}",
            service.namespace, service.name, port.name
        );
        let eps = endpoints_of(service, port, slices, &self.input.node_name);
        let external_addrs: Vec<Ipv4Addr> = service
            .external_ips
            .iter()
            .chain(&service.load_balancer_ips)
            .copied()
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        self.cluster_ips.extend(&service.cluster_ips);
        let ip_key = |ip: &Ipv4Addr| format!("{ip} . {proto} . {}", port.port);
        let node_port_key = |n: u16| format!("{proto} . {n}");
        if !service.source_ranges.is_empty() && !service.load_balancer_ips.is_empty() {
            // Before anything else, endpoints or not: an outsider learns nothing.
            let name = chain_name("firewall", &key);
            let ranges: Vec<String> = service
                .source_ranges
                .iter()
                .map(ToString::to_string)
                .collect();
            for ip in &service.load_balancer_ips {
                self.firewall_ips.add(
                    ip_key(ip),
                    &display,
                    format!("goto {name}"),
                    &mut self.warnings,
                );
            }
            self.chains.push(Chain {
                name,
                rules: vec![format!("ip saddr != {{ {} }} drop", ranges.join(", "))],
            });
        }

        if eps.cluster.is_empty() {
            // No endpoint anywhere: refuse fast instead of letting clients time out.
            let reject = format!("goto {REJECT_CHAIN}");
            for ip in service.cluster_ips.iter().chain(&external_addrs) {
                self.no_endpoint_services.add(
                    ip_key(ip),
                    &display,
                    reject.clone(),
                    &mut self.warnings,
                );
            }
            if let Some(n) = port.node_port {
                self.no_endpoint_node_ports.add(
                    node_port_key(n),
                    &display,
                    reject,
                    &mut self.warnings,
                );
            }
            return;
        }

        if port.protocol == Protocol::Udp {
            let ips = service.cluster_ips.iter().chain(&external_addrs);
            self.udp_frontends
                .extend(ips.map(|ip| (Some(*ip), port.port)));
            self.udp_frontends.extend(port.node_port.map(|n| (None, n)));
        }
        let cluster_chain = chain_name("cluster", &key);
        let local_chain = chain_name("local", &key);
        let needs_local = service.internal_local
            || (service.external_local && (port.node_port.is_some() || !external_addrs.is_empty()));
        let needs_cluster =
            !service.internal_local || port.node_port.is_some() || !external_addrs.is_empty();
        if needs_cluster {
            self.dispatch_chain(
                cluster_chain.clone(),
                &key,
                port.protocol,
                &eps.cluster,
                service.affinity_timeout,
            );
        }
        if needs_local {
            self.dispatch_chain(
                local_chain.clone(),
                &key,
                port.protocol,
                &eps.local,
                service.affinity_timeout,
            );
        }

        if !service.cluster_ips.is_empty() {
            let name = chain_name("service", &key);
            let target = if service.internal_local {
                &local_chain
            } else {
                &cluster_chain
            };
            let rules = vec![
                // A source outside the pod network (the node itself, an underlay client) may
                // not be routable from the endpoint: masquerade it, as kube-proxy does.
                format!("ip saddr != {} jump {MARK_CHAIN}", self.input.cluster_cidr),
                format!("goto {target}"),
            ];
            for ip in &service.cluster_ips {
                self.service_ips.add(
                    ip_key(ip),
                    &display,
                    format!("goto {name}"),
                    &mut self.warnings,
                );
            }
            self.chains.push(Chain { name, rules });
        }

        if port.node_port.is_some() || !external_addrs.is_empty() {
            let name = chain_name("external", &key);
            let rules = if service.external_local {
                vec![
                    // Pods and the node itself are inside the cluster: they reach any
                    // endpoint (kube-proxy's short-circuit), only outsiders are kept local.
                    format!("ip saddr {} goto {cluster_chain}", self.input.cluster_cidr),
                    format!("fib saddr type local jump {MARK_CHAIN}"),
                    format!("fib saddr type local goto {cluster_chain}"),
                    format!("goto {local_chain}"),
                ]
            } else {
                vec![
                    format!("jump {MARK_CHAIN}"),
                    format!("goto {cluster_chain}"),
                ]
            };
            for ip in &external_addrs {
                self.service_ips.add(
                    ip_key(ip),
                    &display,
                    format!("goto {name}"),
                    &mut self.warnings,
                );
            }
            if let Some(n) = port.node_port {
                self.node_ports.add(
                    node_port_key(n),
                    &display,
                    format!("goto {name}"),
                    &mut self.warnings,
                );
            }
            self.chains.push(Chain { name, rules });
        }
    }
}

fn endpoint_chain_name(key: &str, target: Target) -> String {
    chain_name("endpoint", &format!("{key}__{}/{}", target.ip, target.port))
}

fn affinity_set_name(endpoint_chain: &str) -> String {
    format!(
        "affinity-{}",
        endpoint_chain
            .strip_prefix("endpoint-")
            .unwrap_or(endpoint_chain)
    )
}

/// Renders the proxy's nftables script for `input`.
pub fn plan(input: &ProxyInput) -> Plan {
    let mut services: Vec<&ServiceInfo> = input.services.iter().collect();
    services.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    services.dedup_by(|a, b| (&a.namespace, &a.name) == (&b.namespace, &b.name));
    let mut by_service: BTreeMap<(&str, &str), Vec<&SliceInfo>> = BTreeMap::new();
    for slice in &input.slices {
        by_service
            .entry((slice.namespace.as_str(), slice.service.as_str()))
            .or_default()
            .push(slice);
    }
    let mut b = Builder {
        input,
        service_ips: Elements::default(),
        node_ports: Elements::default(),
        no_endpoint_services: Elements::default(),
        no_endpoint_node_ports: Elements::default(),
        firewall_ips: Elements::default(),
        cluster_ips: BTreeSet::new(),
        affinity_sets: Vec::new(),
        chains: Vec::new(),
        endpoint_chains: BTreeSet::new(),
        udp_targets: BTreeSet::new(),
        udp_frontends: BTreeSet::new(),
        warnings: Vec::new(),
        service_ports: 0,
    };
    for service in services {
        let slices = by_service
            .get(&(service.namespace.as_str(), service.name.as_str()))
            .cloned()
            .unwrap_or_default();
        let mut ports: Vec<&ServicePort> = service.ports.iter().collect();
        ports.sort_by(|a, b| {
            (&a.name, a.protocol, a.port, a.node_port).cmp(&(
                &b.name,
                b.protocol,
                b.port,
                b.node_port,
            ))
        });
        for port in ports {
            b.service_port(service, port, &slices);
        }
    }
    let endpoints = b.endpoint_chains.len();
    let script = render(&mut b);
    b.warnings.sort();
    b.warnings.dedup();
    Plan {
        script,
        service_ports: b.service_ports,
        endpoints,
        warnings: b.warnings,
        udp_targets: b.udp_targets,
        udp_frontends: b.udp_frontends,
    }
}

fn render(b: &mut Builder<'_>) -> String {
    let input = b.input;
    let table = &input.table;
    let mark = b.mark();
    let cidr = input.cluster_cidr;
    let mut out = String::new();
    // One transaction: create-if-missing, delete, then the full definition.
    let _ = writeln!(out, "table ip {table} {{}}");
    let _ = writeln!(out, "delete table ip {table}");
    let _ = writeln!(out, "table ip {table} {{");
    let _ = writeln!(
        out,
        "\tcomment {}",
        quote(&format!("service proxy of node {}", input.node_name))
    );

    out.push_str("\tset cluster-ips {\n\t\ttype ipv4_addr\n");
    if !b.cluster_ips.is_empty() {
        let ips: Vec<String> = b.cluster_ips.iter().map(ToString::to_string).collect();
        let _ = writeln!(out, "\t\telements = {{ {} }}", ips.join(", "));
    }
    out.push_str("\t}\n");
    b.affinity_sets.sort();
    b.affinity_sets.dedup();
    for (set, timeout) in &b.affinity_sets {
        let _ = writeln!(
            out,
            "\tset {set} {{\n\t\ttype ipv4_addr\n\t\tflags dynamic,timeout\n\t\ttimeout {timeout}s\n\t}}"
        );
    }
    let addr_map = "{\n\t\ttype ipv4_addr . inet_proto . inet_service : verdict";
    let port_map = "{\n\t\ttype inet_proto . inet_service : verdict";
    b.service_ips
        .render(&mut out, &format!("service-ips {addr_map}"));
    b.node_ports
        .render(&mut out, &format!("service-nodeports {port_map}"));
    b.no_endpoint_services
        .render(&mut out, &format!("no-endpoint-services {addr_map}"));
    b.no_endpoint_node_ports
        .render(&mut out, &format!("no-endpoint-nodeports {port_map}"));
    b.firewall_ips
        .render(&mut out, &format!("firewall-ips {addr_map}"));

    let base = |out: &mut String, name: &str, hook: &str, rules: &[String]| {
        let _ = writeln!(out, "\tchain {name} {{\n\t\t{hook}; policy accept;");
        for rule in rules {
            let _ = writeln!(out, "\t\t{rule}");
        }
        out.push_str("\t}\n");
    };
    let new = "ct state new jump";
    base(
        &mut out,
        "filter-prerouting",
        "type filter hook prerouting priority -110",
        &[format!("{new} firewall-check")],
    );
    base(
        &mut out,
        "filter-input",
        "type filter hook input priority -110",
        &[
            format!("{new} nodeport-endpoints-check"),
            format!("{new} service-endpoints-check"),
        ],
    );
    base(
        &mut out,
        "filter-forward",
        "type filter hook forward priority -110",
        &[
            format!("{new} service-endpoints-check"),
            format!("{new} cluster-ips-check"),
        ],
    );
    base(
        &mut out,
        "filter-output",
        "type filter hook output priority -110",
        &[
            format!("{new} service-endpoints-check"),
            format!("{new} firewall-check"),
        ],
    );
    base(
        &mut out,
        "filter-output-post-dnat",
        "type filter hook output priority -90",
        &[format!("{new} cluster-ips-check")],
    );
    base(
        &mut out,
        "nat-prerouting",
        "type nat hook prerouting priority dstnat",
        &["jump services".to_owned()],
    );
    base(
        &mut out,
        "nat-output",
        "type nat hook output priority -100",
        &["jump services".to_owned()],
    );
    let mut post = vec!["jump masquerading".to_owned()];
    if input.egress_masquerade {
        // Pods leaving the pod network (other clusters, node and load-balancer addresses)
        // appear as the node, as behind ip-masq-agent; pod CIDRs overlap between clusters.
        // Only out of the uplink, as Cilium masquerades only on its native devices.
        let oif = input
            .uplink
            .as_ref()
            .map(|dev| format!("oifname \"{dev}\" "))
            .unwrap_or_default();
        post.push(format!(
            "{oif}ip saddr {cidr} ip daddr != {cidr} masquerade"
        ));
    }
    base(
        &mut out,
        "nat-postrouting",
        "type nat hook postrouting priority srcnat",
        &post,
    );

    let mut chains: Vec<Chain> = vec![
        Chain {
            name: "services".to_owned(),
            rules: vec![
                "ip daddr . meta l4proto . th dport vmap @service-ips".to_owned(),
                "fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @service-nodeports".to_owned(),
            ],
        },
        Chain {
            name: "nodeport-endpoints-check".to_owned(),
            rules: vec![
                "fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @no-endpoint-nodeports".to_owned(),
            ],
        },
        Chain {
            name: "service-endpoints-check".to_owned(),
            rules: vec!["ip daddr . meta l4proto . th dport vmap @no-endpoint-services".to_owned()],
        },
        Chain {
            name: "firewall-check".to_owned(),
            rules: vec!["ip daddr . meta l4proto . th dport vmap @firewall-ips".to_owned()],
        },
        Chain {
            name: "cluster-ips-check".to_owned(),
            rules: {
                // After DNAT only packets to a cluster IP at a port it does not serve still
                // carry a cluster IP: refuse them, and drop the rest of the service range.
                let mut rules = vec![format!("ip daddr @cluster-ips goto {REJECT_CHAIN}")];
                if let Some(services) = input.service_cidr {
                    rules.push(format!("ip daddr {services} drop"));
                }
                rules
            },
        },
        Chain {
            name: REJECT_CHAIN.to_owned(),
            rules: vec![
                "meta l4proto tcp reject with tcp reset".to_owned(),
                "reject".to_owned(),
            ],
        },
        Chain {
            name: MARK_CHAIN.to_owned(),
            rules: vec![format!("meta mark set meta mark | {mark}")],
        },
        Chain {
            name: "masquerading".to_owned(),
            rules: vec![
                format!("meta mark & {mark} == 0 return"),
                // Clear the bit so a packet that is routed again is not masqueraded twice.
                format!("meta mark set meta mark ^ {mark}"),
                "masquerade fully-random".to_owned(),
            ],
        },
    ];
    let mut rest = std::mem::take(&mut b.chains);
    rest.sort_by(|a, b| a.name.cmp(&b.name));
    chains.extend(rest);
    for chain in &chains {
        let _ = writeln!(out, "\tchain {} {{", chain.name);
        for rule in &chain.rules {
            let _ = writeln!(out, "\t\t{rule}");
        }
        out.push_str("\t}\n");
    }
    out.push_str("}\n");
    out
}

/// A route to another node's pod CIDR through that node (host-gw).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PodRoute {
    /// The other node's pod CIDR.
    pub cidr: Ipv4Net,
    /// The other node's InternalIP.
    pub via: Ipv4Addr,
}

/// The routes this node needs: one per other Node with an IPv4 pod CIDR and InternalIP, sorted;
/// a CIDR claimed by two nodes goes to the first by name (and is reported in the warnings), and
/// CIDRs overlapping this node's own are never routed away.
pub fn plan_routes(
    own_name: &str,
    own_cidr: Option<Ipv4Net>,
    nodes: &[NodeInfo],
) -> (Vec<PodRoute>, Vec<String>) {
    let mut sorted: Vec<&NodeInfo> = nodes.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    let mut routes: BTreeMap<Ipv4Net, (&str, Ipv4Addr)> = BTreeMap::new();
    let mut warnings = Vec::new();
    for node in sorted {
        if node.name == own_name {
            continue;
        }
        let (Some(cidr), Some(via)) = (node.pod_cidr, node.internal_ip) else {
            continue;
        };
        if let Some(own) = own_cidr
            && (own.contains(&cidr) || cidr.contains(&own))
        {
            warnings.push(format!(
                "node {}: pod CIDR {cidr} overlaps this node's {own}; not routed",
                node.name
            ));
            continue;
        }
        if let Some((owner, _)) = routes.get(&cidr) {
            warnings.push(format!(
                "node {}: pod CIDR {cidr} is already routed to node {owner}; ignored",
                node.name
            ));
            continue;
        }
        routes.insert(cidr, (&node.name, via));
    }
    let routes = routes
        .into_iter()
        .map(|(cidr, (_, via))| PodRoute { cidr, via })
        .collect();
    (routes, warnings)
}

#[cfg(test)]
mod tests;
