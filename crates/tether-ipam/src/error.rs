//! The one error type of this crate.

use ipnet::Ipv4Net;

use crate::CidrKind;

/// Why an IPAM call was refused. Nothing is changed when an error is returned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IpamError {
    /// A CIDR has host bits set, so it is an address, not a network.
    #[error("{what} {cidr} has host bits set: did you mean {network}?")]
    HostBitsSet {
        /// Which input holds the CIDR.
        what: String,
        /// The CIDR as given.
        cidr: Ipv4Net,
        /// The same CIDR with host bits cleared.
        network: Ipv4Net,
    },
    /// A prefix length outside what this IPAM allocates or maps.
    #[error("{what} /{prefix_len} is out of range: use /{min} to /{max}")]
    PrefixLenOutOfRange {
        /// Which input holds the prefix.
        what: String,
        /// The rejected prefix length.
        prefix_len: u8,
        /// Smallest accepted prefix length (largest network).
        min: u8,
        /// Largest accepted prefix length (smallest network).
        max: u8,
    },
    /// No pool configured, so nothing can ever be remapped.
    #[error("no address pool configured: give at least one pool (the default is RFC 1918)")]
    NoPools,
    /// Two pools overlap, so the same block could be counted twice.
    #[error("pools {first} and {second} overlap: merge them or drop one")]
    OverlappingPools {
        /// One pool.
        first: Ipv4Net,
        /// The pool it overlaps.
        second: Ipv4Net,
    },
    /// A peer or owner name that cannot identify anything.
    #[error("invalid {what} name {name:?}: use 1 to 253 characters without control characters")]
    InvalidName {
        /// `peer` or `owner`.
        what: &'static str,
        /// The rejected name.
        name: String,
    },
    /// An external IP was asked for before the external CIDR exists.
    #[error("no external CIDR yet: allocate or claim it before handing out external IPs")]
    NoExternalCidr,
    /// Every usable address of the external CIDR is taken.
    #[error(
        "no free address left in the external CIDR {cidr}: release external IPs or use a larger CIDR"
    )]
    ExternalIpsExhausted {
        /// The external CIDR.
        cidr: Ipv4Net,
    },
    /// No free block of the requested size is left in any pool.
    #[error(
        "no free /{prefix_len} block left in the pools {}: add a pool or release peers",
        list(pools)
    )]
    Exhausted {
        /// The requested prefix length.
        prefix_len: u8,
        /// The configured pools, all full at that size.
        pools: Vec<Ipv4Net>,
    },
    /// The external CIDR is already set to something else; release it first.
    #[error("the external CIDR is already {existing}: release it before asking for {requested}")]
    ExternalAlreadyAllocated {
        /// The current external CIDR.
        existing: Ipv4Net,
        /// What was asked for (a CIDR, or `/len` for any block of that size).
        requested: String,
    },
    /// A CIDR asked for explicitly collides with something already in use.
    #[error("{cidr} is not available: it overlaps {conflict}")]
    Unavailable {
        /// The requested CIDR.
        cidr: Ipv4Net,
        /// What it overlaps, e.g. `reserved 10.0.0.0/16`.
        conflict: String,
    },
    /// A persisted mapping's local view does not have the prefix length of its real CIDR.
    #[error(
        "persisted {kind} mapping of peer {peer:?} maps {real} to {local_view}: prefix lengths differ"
    )]
    PrefixLenMismatch {
        /// The peer.
        peer: String,
        /// Which of its CIDRs.
        kind: CidrKind,
        /// The real CIDR.
        real: Ipv4Net,
        /// The local view.
        local_view: Ipv4Net,
    },
    /// A peer appears twice with the same kind in persisted state.
    #[error("persisted state maps the {kind} CIDR of peer {peer:?} twice")]
    DuplicateMapping {
        /// The peer.
        peer: String,
        /// Which of its CIDRs.
        kind: CidrKind,
    },
    /// Persisted allocations overlap each other or a reserved CIDR (the configuration changed,
    /// or the state was edited by hand).
    #[error("persisted state conflicts: {first} overlaps {second}")]
    RestoreConflict {
        /// One allocation, e.g. `peer "b" pod local view 10.71.0.0/16`.
        first: String,
        /// What it overlaps.
        second: String,
    },
    /// A persisted external IP is not a usable address of the external CIDR.
    #[error("persisted external IP {address} of {owner:?} is not a usable address of the external CIDR ({})", external.map_or("none".to_owned(), |c| c.to_string()))]
    ExternalIpOutsideCidr {
        /// Who held it.
        owner: String,
        /// The address.
        address: std::net::Ipv4Addr,
        /// The external CIDR of the persisted state, if any.
        external: Option<Ipv4Net>,
    },
    /// An owner holds two external IPs in persisted state.
    #[error("persisted state gives {owner:?} more than one external IP")]
    DuplicateExternalIpOwner {
        /// The owner.
        owner: String,
    },
}

fn list(pools: &[Ipv4Net]) -> String {
    pools
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}
