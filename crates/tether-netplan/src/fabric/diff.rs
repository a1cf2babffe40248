//! The fabric's reconciliation: the ordered operations that turn the observed device, FDB,
//! neighbours, routes and table into a [`FabricPlan`], and those that remove all of it.

use std::collections::BTreeSet;
use std::fmt;

use serde::{Deserialize, Serialize};

use super::{FabricPlan, FabricRoute, FdbEntry, Mac, Neighbour, VxlanLink};
use crate::Ruleset;

/// One change to the kernel, in the order [`diff`] and [`teardown`] emit them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum FabricOp {
    /// Delete the device (a foreign or misconfigured one in our name, or at teardown); the
    /// kernel removes its FDB, neighbours and routes with it.
    DeleteLink(String),
    /// Create the device and bring it up.
    CreateLink(VxlanLink),
    /// Set the device's MAC and MTU and bring it up (the settings the kernel can change in
    /// place).
    ConfigureLink(VxlanLink),
    /// Delete a route of ours.
    DelRoute(FabricRoute),
    /// Delete a neighbour on the device.
    DelNeighbour(Neighbour),
    /// Delete an FDB entry on the device.
    DelFdb(FdbEntry),
    /// Add an FDB entry.
    AddFdb(FdbEntry),
    /// Add a permanent neighbour.
    AddNeighbour(Neighbour),
    /// Add a route.
    AddRoute(FabricRoute),
    /// Replace our table atomically.
    ReplaceRuleset(Ruleset),
    /// Delete our table (absent counts as done).
    DeleteRuleset(String),
}

/// The device as the kernel reports it. `None` fields are attributes it did not report.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObservedLink {
    /// Whether it is a VXLAN device at all.
    pub is_vxlan: bool,
    /// VXLAN network identifier.
    pub vni: Option<u32>,
    /// UDP destination port.
    pub port: Option<u16>,
    /// Underlay source address.
    pub local: Option<std::net::Ipv4Addr>,
    /// Whether it learns MACs from received frames (ours must not).
    pub learning: bool,
    /// Its MAC.
    pub mac: Option<Mac>,
    /// Its MTU.
    pub mtu: u32,
    /// Administratively up.
    pub up: bool,
}

/// What the kernel adapter read back: the device by name, the FDB entries and permanent
/// neighbours on it, our routes (by protocol) and our table.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FabricObserved {
    /// The device, if a link of that name exists.
    pub link: Option<ObservedLink>,
    /// Static FDB entries with an IPv4 destination on the device.
    pub fdb: Vec<FdbEntry>,
    /// Permanent IPv4 neighbours on the device.
    pub neighbours: Vec<Neighbour>,
    /// Our routes in the main table.
    pub routes: Vec<FabricRoute>,
    /// Fingerprint from our table's comment; `Some("")` for a table without one, `None`
    /// when the table does not exist.
    pub ruleset_fingerprint: Option<String>,
}

impl fmt::Display for FabricOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::DeleteLink(name) => write!(f, "ip link del {name}"),
            Self::CreateLink(link) => write!(f, "ip link add {link}"),
            Self::ConfigureLink(link) => write!(
                f,
                "ip link set {} address {} mtu {} up",
                link.name, link.mac, link.mtu
            ),
            Self::DelRoute(route) => write!(f, "ip route del {route}"),
            Self::DelNeighbour(n) => write!(f, "ip neigh del {n}"),
            Self::DelFdb(entry) => write!(f, "bridge fdb del {entry}"),
            Self::AddFdb(entry) => write!(f, "bridge fdb add {entry}"),
            Self::AddNeighbour(n) => write!(f, "ip neigh add {n}"),
            Self::AddRoute(route) => write!(f, "ip route add {route}"),
            Self::ReplaceRuleset(ruleset) => write!(
                f,
                "nft replace table ip {} ({})",
                ruleset.table,
                ruleset.fingerprint()
            ),
            Self::DeleteRuleset(table) => write!(f, "nft delete table ip {table}"),
        }
    }
}

/// The operations that make `observed` equal to `desired`, in apply order: the device first
/// (recreated when a setting the kernel cannot change in place differs), then deletions (routes
/// before the neighbours and FDB entries they use), additions in the reverse order, and the
/// ruleset when its fingerprint differs. Each group is sorted.
pub fn diff(desired: &FabricPlan, observed: &FabricObserved) -> Vec<FabricOp> {
    let mut ops = Vec::new();
    let link = &desired.link;
    // Whether the device's current FDB, neighbours and device routes survive this diff.
    let keeps_device = match &observed.link {
        None => {
            ops.push(FabricOp::CreateLink(link.clone()));
            false
        }
        Some(seen) if !same_identity(link, seen) => {
            ops.push(FabricOp::DeleteLink(link.name.clone()));
            ops.push(FabricOp::CreateLink(link.clone()));
            false
        }
        Some(seen) => {
            if seen.mac != Some(link.mac) || seen.mtu != link.mtu || !seen.up {
                ops.push(FabricOp::ConfigureLink(link.clone()));
            }
            true
        }
    };
    let (fdb, neighbours, routes): (Vec<_>, Vec<_>, Vec<_>) = if keeps_device {
        (
            observed.fdb.clone(),
            observed.neighbours.clone(),
            observed.routes.clone(),
        )
    } else {
        // Routes through the device go with it; unreachable routes stay.
        let kept = observed
            .routes
            .iter()
            .filter(|r| r.via.is_none())
            .copied()
            .collect();
        (Vec::new(), Vec::new(), kept)
    };
    let (del_fdb, add_fdb) = set_diff(&desired.fdb, &fdb);
    let (del_neighbours, add_neighbours) = set_diff(&desired.neighbours, &neighbours);
    let (del_routes, add_routes) = set_diff(&desired.routes, &routes);
    ops.extend(del_routes.into_iter().map(FabricOp::DelRoute));
    ops.extend(del_neighbours.into_iter().map(FabricOp::DelNeighbour));
    ops.extend(del_fdb.into_iter().map(FabricOp::DelFdb));
    ops.extend(add_fdb.into_iter().map(FabricOp::AddFdb));
    ops.extend(add_neighbours.into_iter().map(FabricOp::AddNeighbour));
    ops.extend(add_routes.into_iter().map(FabricOp::AddRoute));
    if observed.ruleset_fingerprint.as_deref() != Some(desired.nft.fingerprint().as_str()) {
        ops.push(FabricOp::ReplaceRuleset(desired.nft.clone()));
    }
    ops
}

/// The operations that remove everything the fabric owns that `observed` shows: the table, the
/// unreachable routes (which outlive the device) and the device with everything on it.
pub fn teardown(device: &str, table: &str, observed: &FabricObserved) -> Vec<FabricOp> {
    let mut ops = Vec::new();
    if observed.ruleset_fingerprint.is_some() {
        ops.push(FabricOp::DeleteRuleset(table.to_owned()));
    }
    let (del_routes, _) = set_diff(&[], &observed.routes);
    ops.extend(
        del_routes
            .into_iter()
            .filter(|r| r.via.is_none() || observed.link.is_none())
            .map(FabricOp::DelRoute),
    );
    if observed.link.is_some() {
        ops.push(FabricOp::DeleteLink(device.to_owned()));
    }
    ops
}

/// Whether the observed device is ours as planned in every setting that needs a new device
/// to change.
fn same_identity(link: &VxlanLink, seen: &ObservedLink) -> bool {
    seen.is_vxlan
        && seen.vni == Some(link.vni)
        && seen.port == Some(link.port)
        && seen.local == Some(link.local)
        && !seen.learning
}

/// (observed − desired, desired − observed), each sorted and without duplicates.
fn set_diff<T: Ord + Clone>(desired: &[T], observed: &[T]) -> (Vec<T>, Vec<T>) {
    let desired: BTreeSet<&T> = desired.iter().collect();
    let observed: BTreeSet<&T> = observed.iter().collect();
    let delete = observed
        .difference(&desired)
        .map(|t| (*t).clone())
        .collect();
    let add = desired
        .difference(&observed)
        .map(|t| (*t).clone())
        .collect();
    (delete, add)
}
