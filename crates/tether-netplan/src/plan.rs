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

pub(crate) fn peer_mappings(peer: &PeerInput) -> impl Iterator<Item = CidrMapping> + '_ {
    std::iter::once(peer.pod).chain(peer.external)
}
