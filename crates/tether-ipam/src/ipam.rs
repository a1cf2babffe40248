//! The allocator: maps peer CIDRs to local views (identity when free, a same-size block from the
//! pools when they collide), allocates the cluster's external CIDR, and persists as plain data.

use std::collections::BTreeMap;
use std::fmt;
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use serde::{Deserialize, Serialize};

use crate::IpamError;
use crate::cidr_math::{lowest_free_block, overlaps};
use crate::config::{IpamConfig, MIN_PREFIX_LEN, check_network, check_prefix_len};

/// Which of a peer's CIDRs a mapping is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum CidrKind {
    /// The peer's pod CIDR.
    Pod,
    /// The peer's external CIDR (its ExternalIPRemapping range).
    External,
}

/// How this cluster sees one CIDR of one peer.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Mapping {
    /// The peer (cluster ID).
    pub peer: String,
    /// Which of the peer's CIDRs.
    pub kind: CidrKind,
    /// The CIDR as the peer uses it.
    pub real: Ipv4Net,
    /// The CIDR under which this cluster addresses it; equal to `real` when not remapped.
    pub local_view: Ipv4Net,
}

/// Everything an [`Ipam`] holds beyond its configuration, as plain data to persist (for
/// example in a custom resource status) and [`Ipam::restore`] later.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IpamState {
    /// The cluster's external CIDR, if allocated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external: Option<Ipv4Net>,
    /// Peer mappings, sorted by peer and kind.
    #[serde(default)]
    pub mappings: Vec<Mapping>,
    /// Addresses of the external CIDR handed out, sorted by owner.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub external_ips: Vec<ExternalIp>,
}

/// An address of the cluster's external CIDR given to a local owner, for example a local
/// non-pod address published to peers (the API server, an offloaded pod's placeholder).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExternalIp {
    /// Who holds the address (a stable name chosen by the caller).
    pub owner: String,
    /// The address, inside the external CIDR.
    pub address: Ipv4Addr,
}

/// The address manager of one cluster. Deterministic: the same calls in the same order give
/// the same answers, and a remap is always the lowest free aligned block, pools in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ipam {
    config: IpamConfig,
    external: Option<Ipv4Net>,
    mappings: BTreeMap<(String, CidrKind), Mapping>,
    external_ips: BTreeMap<String, Ipv4Addr>,
}

impl fmt::Display for CidrKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Pod => "pod",
            Self::External => "external",
        })
    }
}

impl Mapping {
    /// Whether the peer's CIDR is seen under another CIDR here (prefix NAT needed).
    pub fn is_remapped(&self) -> bool {
        self.real != self.local_view
    }

    /// The local-view address of a real peer address (host part kept), if it is in `real`.
    pub fn to_local_view(&self, real_addr: Ipv4Addr) -> Option<Ipv4Addr> {
        translate(self.real, self.local_view, real_addr)
    }

    /// The real peer address behind a local-view address, if it is in `local_view`.
    pub fn to_real(&self, local_addr: Ipv4Addr) -> Option<Ipv4Addr> {
        translate(self.local_view, self.real, local_addr)
    }

    fn describe(&self) -> String {
        format!(
            "peer {:?} {} local view {}",
            self.peer, self.kind, self.local_view
        )
    }
}

fn translate(from: Ipv4Net, to: Ipv4Net, addr: Ipv4Addr) -> Option<Ipv4Addr> {
    from.contains(&addr).then(|| {
        let host = u32::from(addr) & u32::from(from.hostmask());
        Ipv4Addr::from(u32::from(to.network()) | host)
    })
}

impl fmt::Display for Mapping {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} {} -> {}",
            self.peer, self.kind, self.real, self.local_view
        )?;
        if !self.is_remapped() {
            f.write_str(" (identity)")?;
        }
        Ok(())
    }
}

impl Ipam {
    /// An empty IPAM, after validating the configuration.
    pub fn new(config: IpamConfig) -> Result<Self, IpamError> {
        config.validate()?;
        Ok(Self {
            config,
            external: None,
            mappings: BTreeMap::new(),
            external_ips: BTreeMap::new(),
        })
    }

    /// An IPAM holding persisted state. Fails, naming both sides, if the state is invalid or
    /// overlaps itself or a reserved CIDR; it never silently drops or moves an allocation,
    /// because live traffic depends on it.
    pub fn restore(config: IpamConfig, state: &IpamState) -> Result<Self, IpamError> {
        let mut ipam = Self::new(config)?;
        let mut taken: Vec<(String, Ipv4Net)> = ipam
            .config
            .reserved
            .iter()
            .map(|cidr| (format!("reserved {cidr}"), *cidr))
            .collect();
        let mut claim = |what: String, cidr: Ipv4Net| {
            if let Some((other, _)) = taken.iter().find(|(_, existing)| overlaps(*existing, cidr)) {
                return Err(IpamError::RestoreConflict {
                    first: what,
                    second: other.clone(),
                });
            }
            taken.push((what, cidr));
            Ok(())
        };
        if let Some(external) = state.external {
            check_network("persisted external CIDR", external)?;
            claim(format!("external CIDR {external}"), external)?;
        }
        for mapping in &state.mappings {
            validate_peer(&mapping.peer)?;
            let what = format!(
                "persisted {} mapping of peer {:?}",
                mapping.kind, mapping.peer
            );
            check_network(&format!("{what} real CIDR"), mapping.real)?;
            check_network(&format!("{what} local view"), mapping.local_view)?;
            if mapping.real.prefix_len() != mapping.local_view.prefix_len() {
                return Err(IpamError::PrefixLenMismatch {
                    peer: mapping.peer.clone(),
                    kind: mapping.kind,
                    real: mapping.real,
                    local_view: mapping.local_view,
                });
            }
            let key = (mapping.peer.clone(), mapping.kind);
            if ipam.mappings.contains_key(&key) {
                return Err(IpamError::DuplicateMapping {
                    peer: mapping.peer.clone(),
                    kind: mapping.kind,
                });
            }
            claim(mapping.describe(), mapping.local_view)?;
            ipam.mappings.insert(key, mapping.clone());
        }
        ipam.external = state.external;
        for external_ip in &state.external_ips {
            ipam.restore_external_ip(external_ip)?;
        }
        Ok(ipam)
    }

    fn restore_external_ip(&mut self, external_ip: &ExternalIp) -> Result<(), IpamError> {
        let ExternalIp { owner, address } = external_ip;
        validate_name("owner", owner)?;
        if !self
            .external
            .is_some_and(|cidr| is_host_address(cidr, *address))
        {
            return Err(IpamError::ExternalIpOutsideCidr {
                owner: owner.clone(),
                address: *address,
                external: self.external,
            });
        }
        if let Some((other, _)) = self
            .external_ips
            .iter()
            .find(|(_, taken)| *taken == address)
        {
            return Err(IpamError::RestoreConflict {
                first: format!("external IP {address} of {owner:?}"),
                second: format!("external IP {address} of {other:?}"),
            });
        }
        if self.external_ips.insert(owner.clone(), *address).is_some() {
            return Err(IpamError::DuplicateExternalIpOwner {
                owner: owner.clone(),
            });
        }
        Ok(())
    }

    /// The state to persist.
    pub fn state(&self) -> IpamState {
        IpamState {
            external: self.external,
            mappings: self.mappings.values().cloned().collect(),
            external_ips: self.external_ips().collect(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &IpamConfig {
        &self.config
    }

    /// Maps a peer's CIDR: the real CIDR itself when it collides with nothing (a reserved CIDR,
    /// the external CIDR, or any other mapping's local view), else the lowest free block of the
    /// same prefix length in the pools. Calling again with the same CIDR returns the same
    /// mapping; with a different CIDR it replaces the old mapping. On error nothing changes.
    pub fn map_peer_cidr(
        &mut self,
        peer: &str,
        kind: CidrKind,
        real: Ipv4Net,
    ) -> Result<Mapping, IpamError> {
        validate_peer(peer)?;
        let what = format!("{kind} CIDR of peer {peer:?}");
        check_network(&what, real)?;
        check_prefix_len(&what, real.prefix_len(), MIN_PREFIX_LEN)?;
        let key = (peer.to_owned(), kind);
        if let Some(existing) = self.mappings.get(&key)
            && existing.real == real
        {
            return Ok(existing.clone());
        }
        let occupied = self.occupied(Some(&key));
        let local_view = if occupied.iter().any(|taken| overlaps(*taken, real)) {
            self.lowest_free(real.prefix_len(), &occupied)?
        } else {
            real
        };
        let mapping = Mapping {
            peer: peer.to_owned(),
            kind,
            real,
            local_view,
        };
        self.mappings.insert(key, mapping.clone());
        Ok(mapping)
    }

    /// The mapping of one peer CIDR.
    pub fn mapping(&self, peer: &str, kind: CidrKind) -> Option<&Mapping> {
        self.mappings.get(&(peer.to_owned(), kind))
    }

    /// All mappings, sorted by peer and kind.
    pub fn mappings(&self) -> impl Iterator<Item = &Mapping> {
        self.mappings.values()
    }

    /// Releases one peer CIDR; returns the mapping that was released.
    pub fn release(&mut self, peer: &str, kind: CidrKind) -> Option<Mapping> {
        self.mappings.remove(&(peer.to_owned(), kind))
    }

    /// Releases every CIDR of a peer; returns the released mappings, sorted by kind.
    pub fn release_peer(&mut self, peer: &str) -> Vec<Mapping> {
        [CidrKind::Pod, CidrKind::External]
            .into_iter()
            .filter_map(|kind| self.release(peer, kind))
            .collect()
    }

    /// Allocates the cluster's external CIDR: the lowest free block of `prefix_len` in the
    /// pools. Idempotent while an external CIDR of that size exists.
    pub fn allocate_external(&mut self, prefix_len: u8) -> Result<Ipv4Net, IpamError> {
        check_prefix_len("external CIDR", prefix_len, MIN_PREFIX_LEN)?;
        if let Some(existing) = self.external {
            return if existing.prefix_len() == prefix_len {
                Ok(existing)
            } else {
                Err(IpamError::ExternalAlreadyAllocated {
                    existing,
                    requested: format!("/{prefix_len}"),
                })
            };
        }
        let occupied = self.occupied(None);
        let external = self.lowest_free(prefix_len, &occupied)?;
        self.external = Some(external);
        Ok(external)
    }

    /// Takes a specific external CIDR (for example the configured default 10.70.0.0/16) if it
    /// overlaps nothing in use. It need not lie in a pool. Idempotent for the same CIDR.
    pub fn claim_external(&mut self, cidr: Ipv4Net) -> Result<Ipv4Net, IpamError> {
        check_network("external CIDR", cidr)?;
        check_prefix_len("external CIDR", cidr.prefix_len(), MIN_PREFIX_LEN)?;
        match self.external {
            Some(existing) if existing == cidr => return Ok(cidr),
            Some(existing) => {
                return Err(IpamError::ExternalAlreadyAllocated {
                    existing,
                    requested: cidr.to_string(),
                });
            }
            None => {}
        }
        if let Some(conflict) = self.conflict(cidr) {
            return Err(IpamError::Unavailable { cidr, conflict });
        }
        self.external = Some(cidr);
        Ok(cidr)
    }

    /// The cluster's external CIDR, if allocated.
    pub fn external(&self) -> Option<Ipv4Net> {
        self.external
    }

    /// Releases the external CIDR, and with it every external IP; returns the CIDR.
    pub fn release_external(&mut self) -> Option<Ipv4Net> {
        self.external_ips.clear();
        self.external.take()
    }

    /// The address that stands for "somewhere in this cluster, not a pod" (host network,
    /// NodePort sources): the first address of the external CIDR, never handed out.
    pub fn unknown_source_ip(&self) -> Option<Ipv4Addr> {
        self.external.map(|cidr| cidr.network())
    }

    /// Gives `owner` the lowest free address of the external CIDR (neither the network address,
    /// which is the unknown-source IP, nor the broadcast address). Idempotent per owner.
    pub fn allocate_external_ip(&mut self, owner: &str) -> Result<Ipv4Addr, IpamError> {
        validate_name("owner", owner)?;
        let cidr = self.external.ok_or(IpamError::NoExternalCidr)?;
        if let Some(address) = self.external_ips.get(owner) {
            return Ok(*address);
        }
        let used: std::collections::BTreeSet<Ipv4Addr> =
            self.external_ips.values().copied().collect();
        let first = u32::from(cidr.network()) + 1;
        let last = u32::from(cidr.broadcast()) - 1;
        let address = (first..=last)
            .map(Ipv4Addr::from)
            .find(|address| !used.contains(address))
            .ok_or(IpamError::ExternalIpsExhausted { cidr })?;
        self.external_ips.insert(owner.to_owned(), address);
        Ok(address)
    }

    /// The external IP of `owner`, if it has one.
    pub fn external_ip(&self, owner: &str) -> Option<Ipv4Addr> {
        self.external_ips.get(owner).copied()
    }

    /// All external IPs, sorted by owner.
    pub fn external_ips(&self) -> impl Iterator<Item = ExternalIp> + '_ {
        self.external_ips.iter().map(|(owner, address)| ExternalIp {
            owner: owner.clone(),
            address: *address,
        })
    }

    /// Releases the external IP of `owner`; returns it.
    pub fn release_external_ip(&mut self, owner: &str) -> Option<Ipv4Addr> {
        self.external_ips.remove(owner)
    }

    /// Everything no new allocation may overlap, except the mapping `skip` (being replaced).
    fn occupied(&self, skip: Option<&(String, CidrKind)>) -> Vec<Ipv4Net> {
        let mut occupied = self.config.reserved.clone();
        occupied.extend(self.external);
        occupied.extend(
            self.mappings
                .iter()
                .filter(|(key, _)| Some(*key) != skip)
                .map(|(_, mapping)| mapping.local_view),
        );
        occupied
    }

    /// Describes the first thing in use that `cidr` overlaps.
    fn conflict(&self, cidr: Ipv4Net) -> Option<String> {
        if let Some(reserved) = self.config.reserved.iter().find(|r| overlaps(**r, cidr)) {
            return Some(format!("reserved {reserved}"));
        }
        if let Some(external) = self.external.filter(|e| overlaps(*e, cidr)) {
            return Some(format!("external CIDR {external}"));
        }
        self.mappings
            .values()
            .find(|m| overlaps(m.local_view, cidr))
            .map(Mapping::describe)
    }

    fn lowest_free(&self, prefix_len: u8, occupied: &[Ipv4Net]) -> Result<Ipv4Net, IpamError> {
        self.config
            .pools
            .iter()
            .find_map(|pool| lowest_free_block(*pool, prefix_len, occupied))
            .ok_or_else(|| IpamError::Exhausted {
                prefix_len,
                pools: self.config.pools.clone(),
            })
    }
}

fn validate_peer(peer: &str) -> Result<(), IpamError> {
    validate_name("peer", peer)
}

fn validate_name(what: &'static str, name: &str) -> Result<(), IpamError> {
    if (1..=253).contains(&name.len()) && !name.chars().any(char::is_control) {
        Ok(())
    } else {
        Err(IpamError::InvalidName {
            what,
            name: name.to_owned(),
        })
    }
}

/// Whether `address` is in `cidr` and is neither its network nor its broadcast address.
fn is_host_address(cidr: Ipv4Net, address: Ipv4Addr) -> bool {
    cidr.contains(&address) && address != cidr.network() && address != cidr.broadcast()
}
