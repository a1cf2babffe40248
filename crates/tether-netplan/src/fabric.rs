//! The fabric overlay: a flannel-style L3 VXLAN between every node and every gateway pod, with
//! no overlay IPAM and no MAC exchange.
//!
//! Each network namespace (a node, or a gateway pod) has one VXLAN device (`nolearning`, bound to
//! its underlay address) and, per fabric peer, three objects: a static FDB entry
//! `<peer mac> dst <peer ip>`, a permanent neighbour `<peer ip> lladdr <peer mac>`, and one route
//! `<cidr> via <peer ip> dev <device> onlink` per CIDR the peer serves. The peer's MAC is
//! [`mac_for`] its underlay IPv4 address, so every side derives every other side's MAC alone.
//! The device needs no address: the route's `via` is resolved through the permanent neighbour,
//! and the FDB entry gives the neighbour's MAC an underlay destination.
//!
//! ```text
//!  pod 10.0.1.2 ─► node A: 10.71.0.0/16 via 203.0.113.3 dev tether-fabric onlink mtu 1400
//!                  neigh 203.0.113.3 lladdr 02:74:cb:00:71:03 (permanent)
//!                  fdb   02:74:cb:00:71:03 dst 203.0.113.3 (VNI 7700, UDP 4789)
//!       ═══ UDP 203.0.113.1 → 203.0.113.3:4789 carries 10.0.1.2 → 10.71.0.5 unchanged ═══►
//!  gateway pod: decapsulates on its own tether-fabric, forwards into its tunnel
//! ```
//!
//! CIDRs with no peer (a remote cluster without a Ready gateway) get `unreachable` routes, so
//! pods fail at once instead of leaking to the default route. Our nftables table clamps the
//! MSS of TCP SYNs forwarded into the device to the route's MTU (`rt mtu`), and of SYNs coming
//! out of it to the MTU towards their source, so a pod with a 1500-byte MTU never meets a
//! black hole even when ICMP is filtered.
//!
//! Ownership: the device (by name), the routes carrying the adapter's route protocol, the FDB
//! entries and permanent neighbours on the device, and one nftables table. [`diff`] and
//! [`teardown`] touch nothing else.

mod diff;
mod error;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use serde::{Deserialize, Serialize};

pub use diff::{FabricObserved, FabricOp, ObservedLink, diff, teardown};
pub use error::FabricError;

use crate::input::overlaps;
use crate::{Chain, ChainKind, Hook, NftRule, Priority, Ruleset};

/// Default name of the fabric's nftables table (family `ip`).
pub const DEFAULT_FABRIC_TABLE: &str = "tether-fabric";
/// Route table the fabric's routes live in: `main`, where pods' traffic is looked up.
pub const MAIN_TABLE: u32 = 254;
/// Smallest device or route MTU accepted (the IPv4 minimum datagram).
pub const MIN_FABRIC_MTU: u32 = 576;
/// Largest device or route MTU accepted (jumbo frames).
pub const MAX_FABRIC_MTU: u32 = 9000;
/// Largest VXLAN network identifier (24 bits).
pub const MAX_VNI: u32 = 0x00ff_ffff;

/// Everything one namespace's fabric must do, as plain data.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FabricInput {
    /// Name of the VXLAN device.
    pub device: String,
    /// VXLAN network identifier.
    pub vni: u32,
    /// UDP destination port of the underlay.
    pub port: u16,
    /// This namespace's underlay address: the VXLAN source and the base of our own MAC.
    pub local_ip: Ipv4Addr,
    /// MTU of the device: the uplink's minus the VXLAN overhead.
    pub mtu: u32,
    /// Our nftables table (family `ip`).
    pub table: String,
    /// The namespaces reachable through the overlay, and what each one routes.
    pub peers: Vec<FabricPeer>,
    /// CIDRs no peer serves right now; they get `unreachable` routes.
    pub unreachable: Vec<Ipv4Net>,
}

/// One namespace on the other end of the overlay.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FabricPeer {
    /// Its underlay address.
    pub ip: Ipv4Addr,
    /// The CIDRs routed to it.
    pub cidrs: Vec<Ipv4Net>,
    /// MTU of the path beyond it (a gateway's tunnel), when lower than the device's.
    pub mtu: Option<u32>,
}

/// Desired state of one namespace's fabric. Every list is sorted, so equal inputs in any
/// order give equal plans.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FabricPlan {
    /// The VXLAN device.
    pub link: VxlanLink,
    /// Static FDB entries on the device.
    pub fdb: Vec<FdbEntry>,
    /// Permanent neighbours on the device.
    pub neighbours: Vec<Neighbour>,
    /// Routes in the main table.
    pub routes: Vec<FabricRoute>,
    /// Our nftables table (MSS clamping).
    pub nft: Ruleset,
}

/// A MAC address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Mac(pub [u8; 6]);

/// The VXLAN device: `ip link add <name> address <mac> mtu <mtu> type vxlan id <vni>
/// dstport <port> local <local> nolearning`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct VxlanLink {
    /// Device name.
    pub name: String,
    /// VXLAN network identifier.
    pub vni: u32,
    /// UDP destination port.
    pub port: u16,
    /// Underlay source address.
    pub local: Ipv4Addr,
    /// Device MAC, [`mac_for`] `local`.
    pub mac: Mac,
    /// Device MTU.
    pub mtu: u32,
}

/// A static FDB entry: frames for `mac` go to the underlay address `dst`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct FdbEntry {
    /// The peer's MAC.
    pub mac: Mac,
    /// The peer's underlay address.
    pub dst: Ipv4Addr,
}

/// A permanent neighbour on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Neighbour {
    /// The peer's underlay address (the routes' next hop).
    pub ip: Ipv4Addr,
    /// The peer's MAC.
    pub mac: Mac,
}

/// A route in the main table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct FabricRoute {
    /// Destination network.
    pub dst: Ipv4Net,
    /// `Some(peer)`: `via <peer> dev <device> onlink`; `None`: `unreachable`.
    pub via: Option<Ipv4Addr>,
    /// Route MTU (`mtu` metric), for routes through a peer whose path is narrower.
    pub mtu: Option<u32>,
}

/// The MAC of the namespace whose underlay address is `ip`: locally administered unicast
/// `02:74:<a>:<b>:<c>:<d>`. Distinct addresses give distinct MACs, so peers never exchange them.
pub fn mac_for(ip: Ipv4Addr) -> Mac {
    let [a, b, c, d] = ip.octets();
    Mac([0x02, 0x74, a, b, c, d])
}

impl fmt::Display for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d, e, g] = self.0;
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}

impl fmt::Display for VxlanLink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} address {} mtu {} type vxlan id {} dstport {} local {} nolearning",
            self.name, self.mac, self.mtu, self.vni, self.port, self.local
        )
    }
}

impl fmt::Display for FdbEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} dst {}", self.mac, self.dst)
    }
}

impl fmt::Display for Neighbour {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} lladdr {} permanent", self.ip, self.mac)
    }
}

impl fmt::Display for FabricRoute {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.via {
            Some(via) => write!(f, "{} via {via} onlink", self.dst)?,
            None => write!(f, "unreachable {}", self.dst)?,
        }
        if let Some(mtu) = self.mtu {
            write!(f, " mtu {mtu}")?;
        }
        Ok(())
    }
}

impl fmt::Display for FabricPlan {
    /// The whole plan, one object per line, for snapshots and logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "link {}", self.link)?;
        for entry in &self.fdb {
            writeln!(f, "fdb {entry} dev {}", self.link.name)?;
        }
        for neighbour in &self.neighbours {
            writeln!(f, "neigh {neighbour} dev {}", self.link.name)?;
        }
        for route in &self.routes {
            match route.via {
                Some(_) => writeln!(f, "route {route} dev {}", self.link.name)?,
                None => writeln!(f, "route {route}")?,
            }
        }
        f.write_str(&self.nft.render())
    }
}

/// Computes the desired fabric of one namespace, or says which input is wrong.
pub fn plan_fabric(input: &FabricInput) -> Result<FabricPlan, FabricError> {
    validate(input)?;
    let link = VxlanLink {
        name: input.device.clone(),
        vni: input.vni,
        port: input.port,
        local: input.local_ip,
        mac: mac_for(input.local_ip),
        mtu: input.mtu,
    };
    let mut fdb = Vec::new();
    let mut neighbours = Vec::new();
    let mut routes = BTreeSet::new();
    for peer in &input.peers {
        let mac = mac_for(peer.ip);
        fdb.push(FdbEntry { mac, dst: peer.ip });
        neighbours.push(Neighbour { ip: peer.ip, mac });
        // A route MTU at or above the device's would change nothing: leave it out, so the
        // route follows the device when the uplink's MTU changes.
        let mtu = peer.mtu.filter(|mtu| *mtu < input.mtu);
        for cidr in &peer.cidrs {
            routes.insert(FabricRoute {
                dst: *cidr,
                via: Some(peer.ip),
                mtu,
            });
        }
    }
    for cidr in &input.unreachable {
        routes.insert(FabricRoute {
            dst: *cidr,
            via: None,
            mtu: None,
        });
    }
    fdb.sort();
    neighbours.sort();
    Ok(FabricPlan {
        link,
        fdb,
        neighbours,
        routes: routes.into_iter().collect(),
        nft: ruleset(input),
    })
}

/// MSS clamping in both directions. Into the device, `rt mtu` is the MSS of the route the SYN
/// takes (a route MTU, else the device's). Out of the device, the route the SYN takes leads to
/// a local pod and says nothing about the overlay, so the MSS is clamped to the MTU towards the
/// SYN's source, per distinct MTU. The kernel only ever lowers an MSS this way.
fn ruleset(input: &FabricInput) -> Ruleset {
    let device = &input.device;
    let syn = "tcp flags & (syn | rst) == syn";
    let mut rules = vec![NftRule::new(
        format!("oifname \"{device}\" {syn} tcp option maxseg size set rt mtu"),
        "clamp MSS to the route MTU into the overlay",
    )];
    let mut by_mtu: BTreeMap<u32, BTreeSet<Ipv4Net>> = BTreeMap::new();
    for peer in &input.peers {
        let mtu = peer.mtu.map_or(input.mtu, |mtu| mtu.min(input.mtu));
        by_mtu.entry(mtu).or_default().extend(&peer.cidrs);
    }
    for (mtu, cidrs) in by_mtu {
        if cidrs.is_empty() {
            continue;
        }
        let set = cidrs
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        let mss = mtu - 40;
        rules.push(NftRule::new(
            format!(
                "iifname \"{device}\" ip saddr {{ {set} }} {syn} tcp option maxseg size > {mss} tcp option maxseg size set {mss}"
            ),
            format!("clamp MSS to the MTU {mtu} out of the overlay"),
        ));
    }
    Ruleset {
        table: input.table.clone(),
        chains: vec![Chain {
            name: "forward".to_owned(),
            kind: ChainKind::Filter,
            hook: Hook::Forward,
            priority: Priority::Mangle,
            rules,
        }],
    }
}

fn validate(input: &FabricInput) -> Result<(), FabricError> {
    crate::input::validate_interface(&input.device).map_err(|source| {
        FabricError::InvalidDevice {
            name: input.device.clone(),
            source,
        }
    })?;
    validate_table(&input.table)?;
    if input.vni > MAX_VNI {
        return Err(FabricError::InvalidVni { vni: input.vni });
    }
    if input.port == 0 {
        return Err(FabricError::InvalidPort);
    }
    check_mtu("device", input.mtu)?;
    check_underlay("local underlay address", input.local_ip)?;
    let mut ips = BTreeSet::from([input.local_ip]);
    // Every CIDR with who claims it, to find one routed twice.
    let mut claims: Vec<(String, Ipv4Net)> = Vec::new();
    for peer in &input.peers {
        check_underlay("peer underlay address", peer.ip)?;
        if !ips.insert(peer.ip) {
            return Err(FabricError::DuplicatePeer { ip: peer.ip });
        }
        if let Some(mtu) = peer.mtu {
            check_mtu(&format!("peer {} route", peer.ip), mtu)?;
        }
        let mut own = BTreeSet::new();
        for cidr in &peer.cidrs {
            check_host_bits(&format!("peer {} CIDR", peer.ip), *cidr)?;
            // The same CIDR twice for one peer is one route; keep the first claim.
            if own.insert(*cidr) {
                claims.push((format!("peer {}", peer.ip), *cidr));
            }
        }
    }
    let mut unreachable = BTreeSet::new();
    for cidr in &input.unreachable {
        check_host_bits("unreachable CIDR", *cidr)?;
        if unreachable.insert(*cidr) {
            claims.push(("unreachable".to_owned(), *cidr));
        }
    }
    for (i, (first, first_cidr)) in claims.iter().enumerate() {
        for (second, second_cidr) in &claims[i + 1..] {
            if first != second && overlaps(*first_cidr, *second_cidr) {
                return Err(FabricError::Overlap {
                    first: first.clone(),
                    first_cidr: *first_cidr,
                    second: second.clone(),
                    second_cidr: *second_cidr,
                });
            }
        }
    }
    // Routing a peer's underlay address into the overlay would send the encapsulated packets
    // back into the device. Our own address may be covered (a gateway pod's IP lies in its
    // node's pod CIDR): local delivery wins over any route, and nothing is encapsulated to it.
    ips.remove(&input.local_ip);
    for (owner, cidr) in &claims {
        if let Some(ip) = ips.iter().find(|ip| cidr.contains(*ip)) {
            return Err(FabricError::UnderlayInOverlay {
                owner: owner.clone(),
                cidr: *cidr,
                ip: *ip,
            });
        }
    }
    Ok(())
}

fn validate_table(name: &str) -> Result<(), FabricError> {
    let mut chars = name.chars();
    let ok = name.len() <= 64
        && chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if ok {
        Ok(())
    } else {
        Err(FabricError::InvalidTableName {
            name: name.to_owned(),
        })
    }
}

fn check_mtu(what: &str, mtu: u32) -> Result<(), FabricError> {
    if (MIN_FABRIC_MTU..=MAX_FABRIC_MTU).contains(&mtu) {
        Ok(())
    } else {
        Err(FabricError::MtuOutOfRange {
            what: what.to_owned(),
            mtu,
        })
    }
}

fn check_underlay(what: &str, ip: Ipv4Addr) -> Result<(), FabricError> {
    if ip.is_unspecified() || ip.is_loopback() || ip.is_multicast() || ip.is_broadcast() {
        Err(FabricError::InvalidUnderlay {
            what: what.to_owned(),
            ip,
        })
    } else {
        Ok(())
    }
}

fn check_host_bits(what: &str, cidr: Ipv4Net) -> Result<(), FabricError> {
    crate::input::check_network(what, cidr)
        .map_err(|source| FabricError::HostBitsSet { cidr, source })
}
