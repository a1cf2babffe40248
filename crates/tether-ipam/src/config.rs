//! IPAM configuration: where remapped blocks come from, and what must never be handed out.

use ipnet::Ipv4Net;
use serde::{Deserialize, Serialize};

use crate::IpamError;
use crate::cidr_math::overlaps;

/// Smallest prefix length of a mapped or allocated CIDR (a /8).
pub const MIN_PREFIX_LEN: u8 = 8;
/// Largest prefix length of a mapped or allocated CIDR (a /30).
pub const MAX_PREFIX_LEN: u8 = 30;

/// Where the IPAM may allocate from, and what it must avoid.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IpamConfig {
    /// Pools remapped and external CIDRs come from, searched in this order.
    pub pools: Vec<Ipv4Net>,
    /// The cluster's own pod, service, node and external CIDRs: never allocated, never
    /// overlapped by a peer's local view. They may overlap each other and the pools.
    pub reserved: Vec<Ipv4Net>,
}

impl IpamConfig {
    /// The RFC 1918 private ranges, lowest first.
    pub fn rfc1918_pools() -> Vec<Ipv4Net> {
        ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"]
            .iter()
            .map(|text| text.parse().expect("invariant: literal CIDR"))
            .collect()
    }

    /// RFC 1918 pools with the given reserved CIDRs.
    pub fn with_reserved(reserved: Vec<Ipv4Net>) -> Self {
        Self {
            pools: Self::rfc1918_pools(),
            reserved,
        }
    }

    pub(crate) fn validate(&self) -> Result<(), IpamError> {
        if self.pools.is_empty() {
            return Err(IpamError::NoPools);
        }
        for pool in &self.pools {
            check_network("pool", *pool)?;
            check_prefix_len("pool", pool.prefix_len(), 1)?;
        }
        for reserved in &self.reserved {
            check_network("reserved CIDR", *reserved)?;
        }
        for (i, first) in self.pools.iter().enumerate() {
            if let Some(second) = self.pools[i + 1..].iter().find(|p| overlaps(*first, **p)) {
                return Err(IpamError::OverlappingPools {
                    first: *first,
                    second: *second,
                });
            }
        }
        Ok(())
    }
}

impl Default for IpamConfig {
    /// RFC 1918 pools and nothing reserved (add the cluster's own CIDRs before use).
    fn default() -> Self {
        Self::with_reserved(Vec::new())
    }
}

pub(crate) fn check_network(what: &str, cidr: Ipv4Net) -> Result<(), IpamError> {
    if cidr.trunc() == cidr {
        Ok(())
    } else {
        Err(IpamError::HostBitsSet {
            what: what.to_owned(),
            cidr,
            network: cidr.trunc(),
        })
    }
}

/// Checks `prefix_len` against `min..=MAX_PREFIX_LEN`.
pub(crate) fn check_prefix_len(what: &str, prefix_len: u8, min: u8) -> Result<(), IpamError> {
    if (min..=MAX_PREFIX_LEN).contains(&prefix_len) {
        Ok(())
    } else {
        Err(IpamError::PrefixLenOutOfRange {
            what: what.to_owned(),
            prefix_len,
            min,
            max: MAX_PREFIX_LEN,
        })
    }
}
