//! Plain input of the planner: what one gateway namespace must do for its peers, and the
//! validation that turns bad input into a [`PlanError`] before anything is planned.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use serde::{Deserialize, Serialize};

use crate::PlanError;

/// Smallest tunnel MTU accepted (the IPv4 minimum datagram every host must accept).
pub const MIN_MTU: u32 = 576;
/// Largest tunnel MTU accepted (jumbo frames).
pub const MAX_MTU: u32 = 9000;
/// Default tunnel MTU: a 1500-byte underlay minus 80 bytes of WireGuard over IPv6
/// (40 IPv6 + 8 UDP + 32 WireGuard). Over a pure IPv4 underlay 1440 would fit; 1420 is the
/// WireGuard convention and is safe on both.
pub const DEFAULT_MTU: u32 = 1420;
/// Most peers one gateway serves (one mark and one route table each).
pub const MAX_PEERS: usize = 256;
/// Default nftables table name.
pub const DEFAULT_TABLE: &str = "tether";
/// Default first per-peer route table.
pub const DEFAULT_ROUTE_TABLE_BASE: u32 = 7700;
/// Default priority of the per-peer policy rules.
pub const DEFAULT_RULE_PRIORITY: u32 = 7700;
/// Default first per-peer fwmark.
pub const DEFAULT_FWMARK_BASE: u32 = 0x7700;
/// Default fwmark mask: the low 16 bits are ours, the high 16 bits stay with whoever uses them
/// (Calico and Tailscale live there).
pub const DEFAULT_FWMARK_MASK: u32 = 0x0000_ffff;

/// Everything one gateway network namespace must do, as plain data.
///
/// Peer `i` (its position in `peers`) gets route table `route_table_base + i` and fwmark
/// `fwmark_base + i` (compared under `fwmark_mask`). Keep the order stable across
/// reconciliations (sort by ID), or marks and tables move between peers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GatewayInput {
    /// Name of our nftables table (family `ip`). We own it entirely.
    pub table: String,
    /// Route table of the first peer.
    pub route_table_base: u32,
    /// Priority (`pref`) of all our policy rules.
    pub rule_priority: u32,
    /// Mark of the first peer.
    pub fwmark_base: u32,
    /// The mark bits we own; other bits of the packet and conntrack marks are preserved.
    pub fwmark_mask: u32,
    /// Interfaces where local traffic (from pods or nodes) arrives; empty means every interface
    /// that is not a peer tunnel.
    pub pod_interfaces: Vec<String>,
    /// This cluster's own networks.
    pub local: LocalNetworks,
    /// Tunnel MTU; TCP MSS is clamped to `mtu - 40` on tunnel traffic.
    pub mtu: u32,
    /// The peers, one tunnel interface each.
    pub peers: Vec<PeerInput>,
    /// Local non-pod addresses peers reach through our external CIDR (ExternalIPRemapping),
    /// e.g. the API server for the in-band control plane.
    #[serde(default)]
    pub ip_mappings: Vec<IpMapping>,
}

/// One local address published to peers under an address of our external CIDR. Peers that
/// connect to `external` reach `real`; connections `real` opens towards a peer leave with
/// source `external`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct IpMapping {
    /// The address in [`LocalNetworks::external_cidr`].
    pub external: Ipv4Addr,
    /// The local address it stands for (not a pod address: pods are reached directly).
    pub real: Ipv4Addr,
}

impl Default for GatewayInput {
    fn default() -> Self {
        Self {
            table: DEFAULT_TABLE.to_owned(),
            route_table_base: DEFAULT_ROUTE_TABLE_BASE,
            rule_priority: DEFAULT_RULE_PRIORITY,
            fwmark_base: DEFAULT_FWMARK_BASE,
            fwmark_mask: DEFAULT_FWMARK_MASK,
            pod_interfaces: Vec::new(),
            local: LocalNetworks::default(),
            mtu: DEFAULT_MTU,
            peers: Vec::new(),
            ip_mappings: Vec::new(),
        }
    }
}

/// This cluster's own networks, as the gateway needs them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocalNetworks {
    /// Pod CIDRs of this cluster (real addresses; peers reach them after their own remap).
    pub pod_cidrs: Vec<Ipv4Net>,
    /// Our ExternalIPRemapping range, under which peers reach local non-pod addresses.
    pub external_cidr: Option<Ipv4Net>,
}

/// One peer cluster as this gateway serves it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerInput {
    /// Peer cluster ID (used in rule comments; ASCII letters, digits, `-`, `_`, `.`).
    pub id: String,
    /// The peer's own tunnel (TUN) interface.
    pub interface: String,
    /// Our address on the tunnel, with the tunnel network's prefix (e.g. `169.254.18.1/30`).
    pub tunnel_address: Option<Ipv4Net>,
    /// The peer's pod CIDR and how this cluster sees it.
    pub pod: CidrMapping,
    /// The peer's external CIDR and how this cluster sees it, if the peer uses one.
    pub external: Option<CidrMapping>,
}

/// A peer CIDR and the CIDR under which this cluster sees it (equal when not remapped).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct CidrMapping {
    /// The CIDR as the peer itself uses it (what the tunnel carries).
    pub real: Ipv4Net,
    /// The CIDR under which local pods address the peer.
    pub local_view: Ipv4Net,
}

impl CidrMapping {
    /// A mapping that does not remap.
    pub fn identity(cidr: Ipv4Net) -> Self {
        Self {
            real: cidr,
            local_view: cidr,
        }
    }

    /// A mapping from `real` to `local_view`.
    pub fn remapped(real: Ipv4Net, local_view: Ipv4Net) -> Self {
        Self { real, local_view }
    }

    /// Whether prefix NAT is needed.
    pub fn is_remapped(&self) -> bool {
        self.real != self.local_view
    }
}

/// The objects a gateway owns, so the kernel adapter reads back (and tears down) only those.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ownership {
    /// Our nftables table (family `ip`).
    pub table: String,
    /// Route tables we own: `route_tables.0 ..= route_tables.1`, one per possible peer.
    pub route_tables: (u32, u32),
    /// Priority of our policy rules; rules at other priorities are not ours, except our copy
    /// of the local-table lookup one priority below ([`Ownership::local_rule_priority`]).
    pub rule_priority: u32,
}

impl Ownership {
    /// Where the gateway moves the kernel's `pref 0 lookup local` rule: right after its fwmark
    /// rules (see [`crate::Plan::rules`]).
    pub fn local_rule_priority(&self) -> u32 {
        self.rule_priority + 1
    }

    /// Whether `priority` is one of ours.
    pub fn owns_rule_priority(&self, priority: u32) -> bool {
        priority == self.rule_priority || priority == self.local_rule_priority()
    }
}

impl GatewayInput {
    /// What this gateway owns in the kernel. The route table range covers [`MAX_PEERS`]
    /// tables, so a table left behind by a peer that has since gone is still found and removed.
    pub fn ownership(&self) -> Ownership {
        let last = self.route_table_base.saturating_add(MAX_PEERS as u32 - 1);
        Ownership {
            table: self.table.clone(),
            route_tables: (self.route_table_base, last),
            rule_priority: self.rule_priority,
        }
    }

    /// The fwmark of peer `index` (meaningful under `fwmark_mask`).
    pub fn peer_mark(&self, index: usize) -> u32 {
        self.fwmark_base.wrapping_add(index as u32)
    }

    /// The route table of peer `index`.
    pub fn peer_table(&self, index: usize) -> u32 {
        self.route_table_base.wrapping_add(index as u32)
    }
}

/// Rejects every input that would plan something the kernel refuses or that misroutes.
pub(crate) fn validate(input: &GatewayInput) -> Result<(), PlanError> {
    validate_table_name(&input.table)?;
    if !(MIN_MTU..=MAX_MTU).contains(&input.mtu) {
        return Err(PlanError::MtuOutOfRange { mtu: input.mtu });
    }
    if input.rule_priority == 0 || input.rule_priority >= 32765 {
        return Err(PlanError::InvalidRulePriority {
            priority: input.rule_priority,
        });
    }
    let n_peers = input.peers.len();
    if n_peers > MAX_PEERS {
        return Err(PlanError::TooManyPeers {
            count: n_peers,
            max: MAX_PEERS,
        });
    }
    validate_marks(input)?;
    validate_tables(input)?;

    let mut interfaces = BTreeSet::new();
    for name in &input.pod_interfaces {
        validate_interface(name)?;
        if !interfaces.insert(name.as_str()) {
            return Err(PlanError::DuplicateInterface { name: name.clone() });
        }
    }
    let mut ids = BTreeSet::new();
    for peer in &input.peers {
        validate_peer_id(&peer.id)?;
        if !ids.insert(peer.id.as_str()) {
            return Err(PlanError::DuplicatePeerId {
                id: peer.id.clone(),
            });
        }
        validate_interface(&peer.interface)?;
        if !interfaces.insert(peer.interface.as_str()) {
            return Err(PlanError::DuplicateInterface {
                name: peer.interface.clone(),
            });
        }
    }
    if n_peers > 0 && input.local.pod_cidrs.is_empty() {
        return Err(PlanError::NoLocalPodCidrs);
    }
    validate_networks(input)?;
    validate_ip_mappings(input)
}

fn validate_ip_mappings(input: &GatewayInput) -> Result<(), PlanError> {
    let mut externals = BTreeSet::new();
    let mut reals = BTreeSet::new();
    for mapping in &input.ip_mappings {
        let inside = input
            .local
            .external_cidr
            .is_some_and(|cidr| cidr.contains(&mapping.external));
        if !inside {
            return Err(PlanError::IpMappingOutsideExternalCidr {
                external: mapping.external,
                external_cidr: input.local.external_cidr,
            });
        }
        if !externals.insert(mapping.external) {
            return Err(PlanError::DuplicateIpMapping {
                address: mapping.external,
            });
        }
        if !reals.insert(mapping.real) {
            return Err(PlanError::DuplicateIpMapping {
                address: mapping.real,
            });
        }
        if input
            .local
            .pod_cidrs
            .iter()
            .any(|cidr| cidr.contains(&mapping.real))
        {
            return Err(PlanError::IpMappingToPod { real: mapping.real });
        }
    }
    Ok(())
}

fn validate_table_name(name: &str) -> Result<(), PlanError> {
    let mut chars = name.chars();
    let ok = name.len() <= 64
        && chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if ok {
        Ok(())
    } else {
        Err(PlanError::InvalidTableName {
            name: name.to_owned(),
        })
    }
}

fn is_label_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')
}

pub(crate) fn validate_interface(name: &str) -> Result<(), PlanError> {
    // The kernel limit is IFNAMSIZ - 1 = 15 bytes; the charset keeps names safe inside nft
    // strings and sysctl paths ("." and ".." are not interface names).
    let ok = (1..=15).contains(&name.len())
        && name.chars().all(is_label_char)
        && name != "."
        && name != "..";
    if ok {
        Ok(())
    } else {
        Err(PlanError::InvalidInterfaceName {
            name: name.to_owned(),
        })
    }
}

fn validate_peer_id(id: &str) -> Result<(), PlanError> {
    if (1..=63).contains(&id.len()) && id.chars().all(is_label_char) {
        Ok(())
    } else {
        Err(PlanError::InvalidPeerId { id: id.to_owned() })
    }
}

fn validate_marks(input: &GatewayInput) -> Result<(), PlanError> {
    let n_peers = input.peers.len();
    let invalid = || PlanError::InvalidFwmark {
        base: input.fwmark_base,
        mask: input.fwmark_mask,
        peers: n_peers,
    };
    if n_peers == 0 {
        return Ok(());
    }
    let last = u64::from(input.fwmark_base) + n_peers as u64 - 1;
    let last = u32::try_from(last).map_err(|_| invalid())?;
    // Every mark in base..=last must be non-zero and lie inside the mask, so that
    // `mark & mask == base + i` identifies exactly one peer.
    let fits = |mark: u32| mark != 0 && mark & !input.fwmark_mask == 0;
    if (input.fwmark_base..=last).all(fits) {
        Ok(())
    } else {
        Err(invalid())
    }
}

fn validate_tables(input: &GatewayInput) -> Result<(), PlanError> {
    let base = u64::from(input.route_table_base);
    let end = base + input.peers.len().max(1) as u64;
    let reserved = |table: u64| table == 0 || (253..=255).contains(&table);
    if end > u64::from(u32::MAX) || (base..end).any(reserved) {
        return Err(PlanError::InvalidRouteTables {
            base: input.route_table_base,
            end,
        });
    }
    Ok(())
}

/// Every CIDR this cluster must tell apart, with a description for error messages.
fn claims(input: &GatewayInput) -> Vec<(String, Ipv4Net)> {
    let mut claims = Vec::new();
    for cidr in &input.local.pod_cidrs {
        claims.push(("local pod CIDR".to_owned(), *cidr));
    }
    if let Some(cidr) = input.local.external_cidr {
        claims.push(("local external CIDR".to_owned(), cidr));
    }
    for peer in &input.peers {
        claims.push((
            format!("peer {:?} pod local view", peer.id),
            peer.pod.local_view,
        ));
        if let Some(external) = &peer.external {
            claims.push((
                format!("peer {:?} external local view", peer.id),
                external.local_view,
            ));
        }
        if let Some(address) = peer.tunnel_address {
            claims.push((
                format!("peer {:?} tunnel network", peer.id),
                address.trunc(),
            ));
        }
    }
    claims
}

/// Checks that `cidr` is a network, not an address inside one (no host bits set); `what`
/// names it in the error. The planner applies this to every CIDR of its input; callers that
/// read CIDRs from users apply it where they parse them, to name their own field.
pub fn check_network(what: &str, cidr: Ipv4Net) -> Result<(), PlanError> {
    if cidr.trunc() == cidr {
        Ok(())
    } else {
        Err(PlanError::HostBitsSet {
            what: what.to_owned(),
            cidr,
            network: cidr.trunc(),
        })
    }
}

fn validate_networks(input: &GatewayInput) -> Result<(), PlanError> {
    for cidr in &input.local.pod_cidrs {
        check_network("local pod CIDR", *cidr)?;
    }
    if let Some(cidr) = input.local.external_cidr {
        check_network("local external CIDR", cidr)?;
    }
    for peer in &input.peers {
        let mut mappings = vec![("pod", peer.pod)];
        mappings.extend(peer.external.map(|external| ("external", external)));
        for (kind, mapping) in mappings {
            check_network(
                &format!("peer {:?} real {kind} CIDR", peer.id),
                mapping.real,
            )?;
            check_network(
                &format!("peer {:?} {kind} local view", peer.id),
                mapping.local_view,
            )?;
            if mapping.real.prefix_len() != mapping.local_view.prefix_len() {
                return Err(PlanError::PrefixLenMismatch {
                    peer: peer.id.clone(),
                    kind,
                    real: mapping.real,
                    local_view: mapping.local_view,
                });
            }
        }
        if let Some(external) = &peer.external
            && overlaps(peer.pod.real, external.real)
        {
            return Err(PlanError::PeerCidrsOverlap {
                peer: peer.id.clone(),
                pod: peer.pod.real,
                external: external.real,
            });
        }
    }
    let claims = claims(input);
    for (i, (first, first_cidr)) in claims.iter().enumerate() {
        for (second, second_cidr) in &claims[i + 1..] {
            if overlaps(*first_cidr, *second_cidr) {
                return Err(PlanError::Overlap {
                    first: first.clone(),
                    first_cidr: *first_cidr,
                    second: second.clone(),
                    second_cidr: *second_cidr,
                });
            }
        }
    }
    Ok(())
}

/// Whether two networks share an address (aligned prefixes either nest or are disjoint).
pub(crate) fn overlaps(a: Ipv4Net, b: Ipv4Net) -> bool {
    a.contains(&b.network()) || b.contains(&a.network())
}
