//! Why a [`FabricInput`](crate::FabricInput) cannot be planned.

use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

use crate::PlanError;

/// Why [`plan_fabric`](crate::plan_fabric) refused its input. Every variant names the offending
/// value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FabricError {
    /// The device name is one the kernel would refuse.
    #[error("fabric device {name:?} is not a valid interface name")]
    InvalidDevice {
        /// The rejected name.
        name: String,
        /// The interface-name rule it breaks.
        #[source]
        source: PlanError,
    },
    /// The nftables table name is not a plain identifier.
    #[error(
        "invalid fabric nftables table name {name:?}: use 1 to 64 ASCII letters, digits, '_' or '-', starting with a letter"
    )]
    InvalidTableName {
        /// The rejected name.
        name: String,
    },
    /// The VNI does not fit VXLAN's 24 bits.
    #[error("VXLAN id {vni} does not fit in 24 bits (max {max})", max = crate::MAX_VNI)]
    InvalidVni {
        /// The rejected VNI.
        vni: u32,
    },
    /// The UDP port is 0.
    #[error("VXLAN UDP port 0 is not a port")]
    InvalidPort,
    /// A device or route MTU outside what IPv4 and jumbo frames allow.
    #[error("{what} MTU {mtu} is out of range: use {min}..={max}", min = crate::MIN_FABRIC_MTU, max = crate::MAX_FABRIC_MTU)]
    MtuOutOfRange {
        /// Which MTU (`device`, `peer 203.0.113.3 route`).
        what: String,
        /// The rejected MTU.
        mtu: u32,
    },
    /// An underlay address that cannot carry unicast VXLAN (unspecified, loopback, multicast,
    /// broadcast).
    #[error("{what} {ip} cannot carry unicast VXLAN")]
    InvalidUnderlay {
        /// Which address.
        what: String,
        /// The rejected address.
        ip: Ipv4Addr,
    },
    /// Two peers share an underlay address, or a peer has ours.
    #[error(
        "underlay address {ip} appears more than once (peers and the local address must differ)"
    )]
    DuplicatePeer {
        /// The repeated address.
        ip: Ipv4Addr,
    },
    /// A CIDR has host bits set.
    #[error("fabric CIDR {cidr} has host bits set")]
    HostBitsSet {
        /// The CIDR as given.
        cidr: Ipv4Net,
        /// The check that names the field and the network meant.
        #[source]
        source: PlanError,
    },
    /// A CIDR is routed to two peers, or to a peer and marked unreachable.
    #[error(
        "{first} CIDR {first_cidr} overlaps {second} CIDR {second_cidr}: one destination needs one next hop"
    )]
    Overlap {
        /// Who claims the first CIDR (`peer 203.0.113.3` or `unreachable`).
        first: String,
        /// The first CIDR.
        first_cidr: Ipv4Net,
        /// Who claims the second.
        second: String,
        /// The second CIDR.
        second_cidr: Ipv4Net,
    },
    /// A routed CIDR contains an underlay address, which would loop encapsulated packets back
    /// into the device.
    #[error(
        "{owner} CIDR {cidr} contains the underlay address {ip}: VXLAN packets would loop into the overlay"
    )]
    UnderlayInOverlay {
        /// Who claims the CIDR.
        owner: String,
        /// The CIDR.
        cidr: Ipv4Net,
        /// The underlay address inside it.
        ip: Ipv4Addr,
    },
}
