//! The planner: from a [`GatewayInput`] to the desired kernel state of the gateway namespace
//! (sysctls, tunnel addresses, per-peer route tables, fwmark rules and the nftables table).

use std::fmt;
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use serde::{Deserialize, Serialize};

use crate::firewall::ruleset;
use crate::input::validate;
use crate::nft::Ruleset;
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
    /// Policy rules sending marked packets to the per-peer tables and, with at least one peer,
    /// the local-table lookup moved after them (the kernel's `pref 0 lookup local` rule is then
    /// removed, see [`crate::Op::HideLocalRule`]). Both clusters may use the same pod CIDR, so
    /// the address a reply is translated back to can be the gateway pod's own: only a marked
    /// lookup before the local table still sends it into the tunnel instead of delivering it
    /// to the gateway itself.
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

/// A route in one of our tables: `ip route add [<kind>] <dst> [dev <dev>] [src <src>] table <t>
/// [metric <m>]`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Route {
    /// Route table.
    pub table: u32,
    /// Destination network.
    pub dst: Ipv4Net,
    /// What the route does with a matching packet.
    #[serde(default)]
    pub kind: RouteKind,
    /// Output interface: `Some` exactly for [`RouteKind::Unicast`].
    pub dev: Option<String>,
    /// Preferred source for locally generated packets (unicast only).
    pub src: Option<Ipv4Addr>,
    /// Route priority (`metric`); 0 is the kernel's default and the most preferred.
    #[serde(default)]
    pub metric: u32,
}

/// The kernel route type (`RTN_*`) of a [`Route`].
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum RouteKind {
    /// Forward through `dev` (`RTN_UNICAST`).
    #[default]
    Unicast,
    /// Drop and answer ICMP host unreachable (`RTN_UNREACHABLE`); the lookup ends here, so
    /// policy routing does not fall through to later rules.
    Unreachable,
    /// Drop silently (`RTN_BLACKHOLE`); the lookup ends here too.
    Blackhole,
}

impl RouteKind {
    /// The `ip route` keyword (`unicast` is implied and printed only by this method).
    pub fn keyword(self) -> &'static str {
        match self {
            Self::Unicast => "unicast",
            Self::Unreachable => "unreachable",
            Self::Blackhole => "blackhole",
        }
    }
}

/// Metric of each peer table's catch-all: the lowest preference, so any route for the same
/// destination wins over it, and it only answers when nothing else in the table does.
pub const CATCH_ALL_METRIC: u32 = u32::MAX;

/// The kernel's local route table (`ip route show table local`).
pub const LOCAL_TABLE: u32 = 255;

/// Whether a plan moves the local-table lookup behind its fwmark rules.
pub(crate) fn moves_local_rule(plan: &Plan) -> bool {
    plan.rules.iter().any(|r| r.table == LOCAL_TABLE)
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
        if self.kind != RouteKind::Unicast {
            write!(f, "{} ", self.kind.keyword())?;
        }
        if self.dst.prefix_len() == 0 {
            f.write_str("default")?;
        } else {
            write!(f, "{}", self.dst)?;
        }
        if let Some(dev) = &self.dev {
            write!(f, " dev {dev}")?;
        }
        if let Some(src) = self.src {
            write!(f, " src {src}")?;
        }
        write!(f, " table {}", self.table)?;
        if self.metric != 0 {
            write!(f, " metric {}", self.metric)?;
        }
        Ok(())
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
        // A peer's real source may equal one of our own addresses (same pod CIDR on both
        // sides, and the gateway is a pod): without accept_local the kernel drops such a packet
        // as a martian before our source translation runs in postrouting.
        sysctls.push(Sysctl::new(
            format!("net/ipv4/conf/{}/accept_local", peer.interface),
            "1",
        ));
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
                kind: RouteKind::Unicast,
                dev: Some(peer.interface.clone()),
                src: peer.tunnel_address.map(|address| address.addr()),
                metric: 0,
            });
        }
        // The peer's table must never come up empty: without its tunnel (deleted, or not yet
        // created by a restarting gateway) the kernel removes the device routes, the lookup
        // would fall through to the main table, and a packet already translated to the peer's
        // real CIDR — which may equal ours — would reach a local pod. Unreachable rather than
        // blackhole: the sender gets ICMP host unreachable at once instead of a timeout.
        routes.push(Route {
            table,
            dst: Ipv4Net::default(),
            kind: RouteKind::Unreachable,
            dev: None,
            src: None,
            metric: CATCH_ALL_METRIC,
        });
        rules.push(Rule {
            priority: input.rule_priority,
            fwmark: Some((input.peer_mark(index), input.fwmark_mask)),
            iif: None,
            dst: None,
            table,
        });
    }
    if !input.peers.is_empty() {
        rules.push(Rule {
            priority: input.ownership().local_rule_priority(),
            fwmark: None,
            iif: None,
            dst: None,
            table: LOCAL_TABLE,
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

pub(crate) fn peer_mappings(peer: &PeerInput) -> impl Iterator<Item = CidrMapping> + '_ {
    std::iter::once(peer.pod).chain(peer.external)
}
