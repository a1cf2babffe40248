//! The planner: from a [`GatewayInput`] to the desired kernel state of the gateway namespace
//! (sysctls, tunnel addresses, per-peer route tables, fwmark rules and the nftables table).

use std::fmt;
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use serde::{Deserialize, Serialize};

use crate::input::validate;
use crate::nft::{Chain, ChainKind, Hook, NftRule, Priority, Ruleset};
use crate::{CidrMapping, GatewayInput, Ownership, PeerInput, PlanError};

/// Desired kernel state of one gateway namespace. Every list is sorted, so equal inputs give
/// equal plans, whatever the order of `pod_interfaces` or CIDRs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    /// Kernel parameters to set.
    pub sysctls: Vec<Sysctl>,
    /// Addresses on tunnel interfaces.
    pub addresses: Vec<Address>,
    /// Routes in the per-peer route tables.
    pub routes: Vec<Route>,
    /// Policy rules sending marked packets to the per-peer tables.
    pub rules: Vec<Rule>,
    /// Our nftables table.
    pub nft: Ruleset,
    /// What this plan owns; [`crate::diff`] ignores observed objects outside it.
    pub ownership: Ownership,
}

/// A kernel parameter. `key` is the path below `/proc/sys` with `/` separators
/// (`net/ipv4/conf/eth0.100/rp_filter`), which stays unambiguous for interface names with dots.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Sysctl {
    /// Path below `/proc/sys`.
    pub key: String,
    /// Value as written to the file.
    pub value: String,
}

/// An IPv4 address on an interface (`ip addr add <addr> dev <dev>`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Address {
    /// Interface.
    pub dev: String,
    /// Address with the prefix length of its network.
    pub addr: Ipv4Net,
}

/// A unicast route through an interface (`ip route add <dst> dev <dev> [src <src>] table <t>`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Route {
    /// Route table.
    pub table: u32,
    /// Destination network.
    pub dst: Ipv4Net,
    /// Output interface.
    pub dev: String,
    /// Preferred source for locally generated packets.
    pub src: Option<Ipv4Addr>,
}

/// A policy routing rule (`ip rule add pref <p> [fwmark <m>/<mask>] [iif <i>] [to <dst>] lookup <t>`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Rule {
    /// Rule priority (`pref`).
    pub priority: u32,
    /// Mark and mask to match.
    pub fwmark: Option<(u32, u32)>,
    /// Input interface to match.
    pub iif: Option<String>,
    /// Destination to match.
    pub dst: Option<Ipv4Net>,
    /// Table to look up.
    pub table: u32,
}

impl Sysctl {
    /// A sysctl from its `/`-separated key.
    pub fn new(key: impl Into<String>, value: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            value: value.into(),
        }
    }

    /// The key in `sysctl(8)` notation, where `.` and `/` swap roles
    /// (`net.ipv4.conf.eth0/100.rp_filter`).
    pub fn dotted_key(&self) -> String {
        self.key
            .chars()
            .map(|c| match c {
                '/' => '.',
                '.' => '/',
                other => other,
            })
            .collect()
    }
}

impl fmt::Display for Sysctl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.dotted_key(), self.value)
    }
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} dev {}", self.addr, self.dev)
    }
}

impl fmt::Display for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} dev {}", self.dst, self.dev)?;
        if let Some(src) = self.src {
            write!(f, " src {src}")?;
        }
        write!(f, " table {}", self.table)
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pref {}", self.priority)?;
        if let Some((mark, mask)) = self.fwmark {
            write!(f, " fwmark {mark:#x}/{mask:#x}")?;
        }
        if let Some(iif) = &self.iif {
            write!(f, " iif {iif}")?;
        }
        if let Some(dst) = self.dst {
            write!(f, " to {dst}")?;
        }
        write!(f, " lookup {}", self.table)
    }
}

impl fmt::Display for Plan {
    /// The whole plan in `sysctl` / `ip` / `nft` syntax, one object per line, for snapshots
    /// and logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for sysctl in &self.sysctls {
            writeln!(f, "sysctl {sysctl}")?;
        }
        for address in &self.addresses {
            writeln!(f, "addr {address}")?;
        }
        for route in &self.routes {
            writeln!(f, "route {route}")?;
        }
        for rule in &self.rules {
            writeln!(f, "rule {rule}")?;
        }
        f.write_str(&self.nft.render())
    }
}

/// Computes the desired state of a gateway namespace, or says which input is wrong.
///
/// See the crate documentation for the packet walk these objects implement.
pub fn plan(input: &GatewayInput) -> Result<Plan, PlanError> {
    validate(input)?;
    let mut sysctls = vec![
        Sysctl::new("net/ipv4/ip_forward", "1"),
        // The kernel applies max(all, interface), so `all` must be 0 for the per-interface
        // values below to decide.
        Sysctl::new("net/ipv4/conf/all/rp_filter", "0"),
    ];
    let mut addresses = Vec::new();
    let mut routes = Vec::new();
    let mut rules = Vec::new();
    for interface in &input.pod_interfaces {
        sysctls.push(rp_filter(interface, RP_FILTER_LOOSE));
    }
    for (index, peer) in input.peers.iter().enumerate() {
        let table = input.peer_table(index);
        sysctls.push(rp_filter(&peer.interface, RP_FILTER_OFF));
        if let Some(address) = peer.tunnel_address {
            addresses.push(Address {
                dev: peer.interface.clone(),
                addr: address,
            });
        }
        for mapping in peer_mappings(peer) {
            routes.push(Route {
                table,
                dst: mapping.real,
                dev: peer.interface.clone(),
                src: peer.tunnel_address.map(|address| address.addr()),
            });
        }
        rules.push(Rule {
            priority: input.rule_priority,
            fwmark: Some((input.peer_mark(index), input.fwmark_mask)),
            iif: None,
            dst: None,
            table,
        });
    }
    sysctls.sort();
    sysctls.dedup();
    addresses.sort();
    routes.sort();
    rules.sort();
    Ok(Plan {
        sysctls,
        addresses,
        routes,
        rules,
        nft: ruleset(input),
        ownership: input.ownership(),
    })
}

/// Reverse-path filtering off: for tunnels. Model L puts the peer's real, possibly overlapping
/// source on the tunnel, and even loose mode drops it unless the main table happens to route
/// that source somewhere (a peer's CIDRs live only in its marked table). The per-peer source
/// guard in the nftables table replaces it, and is stricter: each tunnel accepts exactly its
/// peer's CIDRs.
const RP_FILTER_OFF: &str = "0";
/// Loose reverse-path filtering: for pod-facing interfaces, whose sources are local.
const RP_FILTER_LOOSE: &str = "2";

fn rp_filter(interface: &str, mode: &str) -> Sysctl {
    Sysctl::new(format!("net/ipv4/conf/{interface}/rp_filter"), mode)
}

fn peer_mappings(peer: &PeerInput) -> impl Iterator<Item = CidrMapping> + '_ {
    std::iter::once(peer.pod).chain(peer.external)
}

/// `{ a, b }` for nft, or the single element without braces.
fn nft_set<T: fmt::Display>(items: impl IntoIterator<Item = T>) -> String {
    let items: Vec<String> = items.into_iter().map(|item| item.to_string()).collect();
    match items.as_slice() {
        [one] => one.clone(),
        many => format!("{{ {} }}", many.join(", ")),
    }
}

fn quoted(name: &str) -> String {
    format!("\"{name}\"")
}

/// Sets `meta mark` or `ct mark` to `mark`, keeping the bits outside `mask`.
fn set_mark(what: &str, mark: u32, mask: u32) -> String {
    format!(
        "{what} mark set {what} mark and {:#010x} or {mark:#x}",
        !mask
    )
}

fn ruleset(input: &GatewayInput) -> Ruleset {
    if input.peers.is_empty() {
        return Ruleset::empty(input.table.clone());
    }
    let mask = input.fwmark_mask;
    let tunnels = nft_set(input.peers.iter().map(|peer| quoted(&peer.interface)));
    // Local traffic: the configured pod interfaces, or anything that is not a tunnel.
    let from_local = if input.pod_interfaces.is_empty() {
        format!("iifname != {}", {
            let names: Vec<String> = input.peers.iter().map(|p| quoted(&p.interface)).collect();
            format!("{{ {} }}", names.join(", "))
        })
    } else {
        let mut names: Vec<&String> = input.pod_interfaces.iter().collect();
        names.sort();
        format!(
            "iifname {}",
            nft_set(names.into_iter().map(|name| quoted(name)))
        )
    };
    let mut local_destinations: Vec<Ipv4Net> = input.local.pod_cidrs.clone();
    local_destinations.extend(input.local.external_cidr);

    let mut zones = Vec::new();
    let mut guard = Vec::new();
    let mut restore = Vec::new();
    let mut classify = Vec::new();
    let mut dstnat = Vec::new();
    let mut srcnat = Vec::new();
    for (index, peer) in input.peers.iter().enumerate() {
        let id = &peer.id;
        let mark = input.peer_mark(index);
        let iif = format!("iifname {}", quoted(&peer.interface));
        let tunnel_net = peer.tunnel_address.map(|address| address.trunc());

        // Peers may share real CIDRs, so two peers' connections can have identical tuples
        // (same pod IPs and ports). A conntrack zone per peer keeps them apart; it is chosen
        // the same way for both directions (tunnel in, or destination in the peer's views).
        let zone = index + 1;
        let mut views: Vec<Ipv4Net> = peer_mappings(peer).map(|m| m.local_view).collect();
        views.sort();
        zones.push(NftRule::new(
            format!("{iif} ct zone set {zone}"),
            format!("peer {id}: own conntrack zone"),
        ));
        zones.push(NftRule::new(
            format!(
                "{from_local} ip daddr {} ct zone set {zone}",
                nft_set(&views)
            ),
            format!("peer {id}: own conntrack zone"),
        ));

        let mut sources: Vec<Ipv4Net> = peer_mappings(peer).map(|m| m.real).collect();
        sources.extend(tunnel_net);
        sources.sort();
        guard.push(NftRule::new(
            format!("{iif} ip saddr != {} counter drop", nft_set(&sources)),
            format!("peer {id}: source outside its CIDRs"),
        ));
        let mut destinations = local_destinations.clone();
        destinations.extend(
            peer.tunnel_address
                .map(|address| Ipv4Net::from(address.addr())),
        );
        destinations.sort();
        guard.push(NftRule::new(
            format!("{iif} ip daddr != {} counter drop", nft_set(&destinations)),
            format!("peer {id}: destination outside local CIDRs"),
        ));
        guard.push(NftRule::new(
            format!("{iif} {}", set_mark("ct", mark, mask)),
            format!("peer {id}: remember the peer of this connection"),
        ));

        restore.push(NftRule::new(
            format!(
                "{from_local} ct mark and {mask:#x} == {mark:#x} {}",
                set_mark("meta", mark, mask)
            ),
            format!("peer {id}: replies follow their connection"),
        ));

        classify.push(NftRule::new(
            format!(
                "{from_local} ip daddr {} {} {}",
                nft_set(&views),
                set_mark("meta", mark, mask),
                set_mark("ct", mark, mask)
            ),
            format!("peer {id}: to the peer"),
        ));

        for mapping in peer_mappings(peer).filter(CidrMapping::is_remapped) {
            dstnat.push(NftRule::new(
                format!(
                    "meta mark and {mask:#x} == {mark:#x} ip daddr {view} \
                     dnat ip prefix to ip daddr map {{ {view} : {real} }}",
                    view = mapping.local_view,
                    real = mapping.real
                ),
                format!("peer {id}: local view to real"),
            ));
            srcnat.push(NftRule::new(
                format!(
                    "{iif} ip saddr {real} snat ip prefix to ip saddr map {{ {real} : {view} }}",
                    view = mapping.local_view,
                    real = mapping.real
                ),
                format!("peer {id}: real to local view"),
            ));
        }
    }

    if !input.ip_mappings.is_empty() {
        let mut mappings = input.ip_mappings.clone();
        mappings.sort();
        let externals = nft_set(mappings.iter().map(|m| m.external));
        let reals = nft_set(mappings.iter().map(|m| m.real));
        let to_real: Vec<String> = mappings
            .iter()
            .map(|m| format!("{} : {}", m.external, m.real))
            .collect();
        let to_external: Vec<String> = mappings
            .iter()
            .map(|m| format!("{} : {}", m.real, m.external))
            .collect();
        dstnat.push(NftRule::new(
            format!(
                "iifname {tunnels} ip daddr {externals} dnat ip to ip daddr map {{ {} }}",
                to_real.join(", ")
            ),
            "external IP to local address",
        ));
        srcnat.push(NftRule::new(
            format!(
                "oifname {tunnels} ip saddr {reals} snat ip to ip saddr map {{ {} }}",
                to_external.join(", ")
            ),
            "local address to external IP",
        ));
    }

    let mss = input.mtu - 40;
    let clamp = |direction: &str| {
        NftRule::new(
            format!(
                "{direction} {tunnels} tcp flags & (syn | rst) == syn \
                 tcp option maxseg size > {mss} tcp option maxseg size set {mss}"
            ),
            "clamp MSS to the tunnel MTU",
        )
    };

    let mut prerouting = guard;
    prerouting.extend(restore);
    prerouting.extend(classify);
    let mut chains = vec![Chain {
        name: "zone".to_owned(),
        kind: ChainKind::Filter,
        hook: Hook::Prerouting,
        priority: Priority::Raw,
        rules: zones,
    }];
    chains.push(Chain {
        name: "prerouting".to_owned(),
        kind: ChainKind::Filter,
        hook: Hook::Prerouting,
        priority: Priority::Mangle,
        rules: prerouting,
    });
    if !dstnat.is_empty() {
        chains.push(Chain {
            name: "dstnat".to_owned(),
            kind: ChainKind::Nat,
            hook: Hook::Prerouting,
            priority: Priority::Dstnat,
            rules: dstnat,
        });
    }
    chains.push(Chain {
        name: "forward".to_owned(),
        kind: ChainKind::Filter,
        hook: Hook::Forward,
        priority: Priority::Filter,
        rules: vec![clamp("iifname"), clamp("oifname")],
    });
    if !srcnat.is_empty() {
        chains.push(Chain {
            name: "srcnat".to_owned(),
            kind: ChainKind::Nat,
            hook: Hook::Postrouting,
            priority: Priority::Srcnat,
            rules: srcnat,
        });
    }
    Ruleset {
        table: input.table.clone(),
        chains,
    }
}
