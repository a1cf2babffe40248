//! Pure address management for a Tether cluster: which CIDR this cluster uses to address each
//! peer's pods and external range, remapping the ones that collide, plus the cluster's own
//! external CIDR. No IO and no Kubernetes types; state is plain serde data so a controller can
//! persist it and [`Ipam::restore`] it.
//!
//! # Model
//!
//! Every cluster decides alone how it sees its peers (Liqo's model). A peer CIDR that collides
//! with nothing keeps its real value (an identity mapping, still recorded so that later peers
//! cannot take it). A colliding one gets a *local view*: the lowest free aligned block of the
//! same prefix length in the pools, so the gateway can translate 1:1 with prefix NAT.
//!
//! ```text
//!  local (reserved): pods 10.0.0.0/16, services 10.96.0.0/12, nodes 192.168.1.0/24
//!
//!  peer B pods 10.0.0.0/16   collides with local pods ──────► local view 10.1.0.0/16
//!  peer C pods 10.0.0.0/16   collides with local pods ──────► local view 10.2.0.0/16
//!  peer D pods 10.1.0.0/16   collides with B's local view ──► local view 10.3.0.0/16
//!  peer E pods 172.20.0.0/16 free ──────────────────────────► identity 172.20.0.0/16
//!  external CIDR /16 for this cluster ─────────────────────► 10.4.0.0/16
//! ```
//!
//! Inside the external CIDR, [`Ipam::allocate_external_ip`] hands single addresses to local
//! owners (addresses published to peers, see netplan's IP mappings); the first address is the
//! unknown-source IP ([`Ipam::unknown_source_ip`]) and is never handed out.
//!
//! # Example
//!
//! ```
//! use tether_ipam::{CidrKind, Ipam, IpamConfig};
//!
//! let local_pods = "10.0.0.0/16".parse().unwrap();
//! let mut ipam = Ipam::new(IpamConfig::with_reserved(vec![local_pods]))?;
//! let b = ipam.map_peer_cidr("cluster-b", CidrKind::Pod, "10.0.0.0/16".parse().unwrap())?;
//! assert_eq!(b.local_view.to_string(), "10.1.0.0/16");
//! assert_eq!(b.to_local_view("10.0.3.7".parse().unwrap()), Some("10.1.3.7".parse().unwrap()));
//! let e = ipam.map_peer_cidr("cluster-e", CidrKind::Pod, "172.20.0.0/16".parse().unwrap())?;
//! assert!(!e.is_remapped());
//!
//! // Persist `state()` (serde), and later continue exactly where this instance left off.
//! let restored = Ipam::restore(ipam.config().clone(), &ipam.state())?;
//! assert_eq!(restored, ipam);
//! # Ok::<(), tether_ipam::IpamError>(())
//! ```
//!
//! # Invariants
//!
//! - No two live allocations (local views, identity mappings, the external CIDR) overlap, and
//!   none overlaps a reserved CIDR. External IPs are distinct usable addresses of the external
//!   CIDR.
//! - A remap has the prefix length of its real CIDR.
//! - Same calls in the same order give the same results; releasing and mapping again gives the
//!   same answer. A failed call changes nothing.
//! - Exhaustion and bad input are typed errors ([`IpamError`]), never panics.

mod cidr_math;
mod config;
mod error;
mod ipam;

pub use config::{IpamConfig, MAX_PREFIX_LEN, MIN_PREFIX_LEN};
pub use error::IpamError;
pub use ipam::{CidrKind, ExternalIp, Ipam, IpamState, Mapping};
