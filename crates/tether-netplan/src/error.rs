//! The one error type of this crate: why a [`GatewayInput`](crate::GatewayInput) cannot be planned.

use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

/// Why [`plan`](crate::plan) refused its input. Every variant names the offending value, so the
/// message alone tells an operator what to change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// The nftables table name is empty or not a plain identifier.
    #[error(
        "invalid nftables table name {name:?}: use 1 to 64 ASCII letters, digits or '_', starting with a letter"
    )]
    InvalidTableName {
        /// The rejected name.
        name: String,
    },
    /// An interface name the kernel would refuse (empty, longer than 15 bytes, or with characters
    /// that cannot be quoted safely).
    #[error("invalid interface name {name:?}: use 1 to 15 ASCII letters, digits or '-', '_', '.'")]
    InvalidInterfaceName {
        /// The rejected name.
        name: String,
    },
    /// A peer ID that cannot be used as a label in rule comments.
    #[error("invalid peer id {id:?}: use 1 to 63 ASCII letters, digits or '-', '_', '.'")]
    InvalidPeerId {
        /// The rejected ID.
        id: String,
    },
    /// Two peers share an ID.
    #[error("peer id {id:?} appears more than once")]
    DuplicatePeerId {
        /// The repeated ID.
        id: String,
    },
    /// An interface is used by two peers, or both as a tunnel and as a pod interface.
    #[error("interface {name:?} is used more than once (each peer needs its own tunnel interface)")]
    DuplicateInterface {
        /// The repeated interface name.
        name: String,
    },
    /// The tunnel MTU is outside what IPv4 and the underlay allow.
    #[error("tunnel mtu {mtu} is out of range: use {min}..={max}", min = crate::MIN_MTU, max = crate::MAX_MTU)]
    MtuOutOfRange {
        /// The rejected MTU.
        mtu: u32,
    },
    /// A CIDR has host bits set, so it is an address, not a network.
    #[error("{what} {cidr} has host bits set: did you mean {network}?")]
    HostBitsSet {
        /// Which input field holds the CIDR.
        what: String,
        /// The CIDR as given.
        cidr: Ipv4Net,
        /// The same CIDR with host bits cleared.
        network: Ipv4Net,
    },
    /// A peer CIDR is remapped to a local view of another prefix length; prefix NAT maps 1:1.
    #[error(
        "peer {peer:?}: {kind} local view {local_view} must have the prefix length of its real CIDR {real}"
    )]
    PrefixLenMismatch {
        /// The peer.
        peer: String,
        /// `pod` or `external`.
        kind: &'static str,
        /// The peer's real CIDR.
        real: Ipv4Net,
        /// The mismatching local view.
        local_view: Ipv4Net,
    },
    /// A peer's own pod and external CIDRs overlap, so one route table cannot hold both.
    #[error("peer {peer:?}: real pod CIDR {pod} overlaps real external CIDR {external}")]
    PeerCidrsOverlap {
        /// The peer.
        peer: String,
        /// Its real pod CIDR.
        pod: Ipv4Net,
        /// Its real external CIDR.
        external: Ipv4Net,
    },
    /// Two addresses this cluster must tell apart overlap (local CIDRs, peers' local views,
    /// tunnel networks). Remap one of them (that is the IPAM's job).
    #[error("{first} {first_cidr} overlaps {second} {second_cidr}")]
    Overlap {
        /// What the first CIDR is, e.g. `local pod CIDR` or `peer "b" pod local view`.
        first: String,
        /// The first CIDR.
        first_cidr: Ipv4Net,
        /// What the second CIDR is.
        second: String,
        /// The second CIDR.
        second_cidr: Ipv4Net,
    },
    /// Peers exist but the local pod CIDRs are unknown, so incoming traffic cannot be filtered.
    #[error("local pod CIDRs are empty: the gateway must know them to accept traffic from peers")]
    NoLocalPodCidrs,
    /// More peers than marks or route tables reserved for them.
    #[error("{count} peers exceed the maximum of {max}")]
    TooManyPeers {
        /// How many peers were given.
        count: usize,
        /// The supported maximum.
        max: usize,
    },
    /// The fwmark base and mask cannot give every peer a distinct, non-zero mark inside the mask.
    #[error(
        "fwmark base {base:#x} with mask {mask:#x} cannot hold {peers} peer marks: every base+i must be non-zero and inside the mask"
    )]
    InvalidFwmark {
        /// The configured base.
        base: u32,
        /// The configured mask.
        mask: u32,
        /// The number of peers.
        peers: usize,
    },
    /// The route table range for the peers hits a table the kernel reserves (0, 253..=255) or
    /// overflows.
    #[error(
        "route tables {base}..{end} are unusable: keep clear of 0 and 253..=255 (and of u32::MAX)"
    )]
    InvalidRouteTables {
        /// The configured base.
        base: u32,
        /// One past the last table needed.
        end: u64,
    },
    /// The policy-rule priority is one the kernel's default rules own.
    #[error(
        "rule priority {priority} is reserved: use 1..=32764 (the next priority holds the local \
         lookup)"
    )]
    InvalidRulePriority {
        /// The rejected priority.
        priority: u32,
    },
    /// An IP mapping's external address is not inside our external CIDR (or there is none).
    #[error("ip mapping {external} is outside the local external CIDR ({}): pick an address inside it", external_cidr.map_or("none configured".to_owned(), |c| c.to_string()))]
    IpMappingOutsideExternalCidr {
        /// The external address.
        external: Ipv4Addr,
        /// Our external CIDR, if any.
        external_cidr: Option<Ipv4Net>,
    },
    /// An address appears in two IP mappings (as external or as real address).
    #[error("address {address} appears in more than one ip mapping")]
    DuplicateIpMapping {
        /// The repeated address.
        address: Ipv4Addr,
    },
    /// An IP mapping points at a pod address; peers reach pods directly.
    #[error("ip mapping to {real} points into the local pod CIDRs: peers reach pods directly")]
    IpMappingToPod {
        /// The real address.
        real: Ipv4Addr,
    },
}
