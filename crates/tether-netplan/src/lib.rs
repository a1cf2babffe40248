//! Pure network planning for a Tether gateway: from plain inputs to the desired kernel state of
//! the gateway network namespace (sysctls, tunnel addresses, per-peer route tables, fwmark
//! rules and one nftables table), a deterministic text rendering, and a diff against what the
//! kernel holds; and, in [`fabric`], the same for the VXLAN overlay between nodes and gateway
//! pods. No IO: `tether-kernel` applies the [`Op`]s this crate computes.
//!
//! # Model
//!
//! Each cluster chooses alone how it sees each peer ("model L"): when a peer's real pod CIDR
//! collides with something local, the IPAM picks a *local view* of the same size, and only this
//! gateway translates. The tunnel always carries real addresses. Two peers may therefore share a
//! real CIDR (B and C both use 10.0.0.0/16), so routing by destination after translation cannot
//! tell them apart; instead every peer has its own tunnel interface, fwmark and route table.
//!
//! ```text
//!  local pod 10.0.1.2 ──► 10.71.1.2 (B as seen here)        B's tunnel (tether-b), table 7700
//!   prerouting/mangle: daddr ∈ B's local views → mark 0x7700, ct mark 0x7700
//!   prerouting/dstnat: mark 0x7700, daddr 10.71/16 → dnat prefix → 10.0/16 (B's real CIDR)
//!   routing:           fwmark 0x7700/0xffff → table 7700: 10.0.0.0/16 dev tether-b
//!                      (else `unreachable default`: never the main table, see below)
//!   forward:           clamp TCP MSS (SYN and SYN/ACK) to MTU − 40
//!                                   ════ tunnel carries 10.0.1.2 → 10.0.1.2 (both real) ════►
//!
//!  B's pod 10.0.1.2 ──► our pod 10.0.1.2 (B applied its own remap)      arrives on tether-b
//!   prerouting/mangle: drop unless saddr ∈ B's real CIDRs (+ tunnel network) and
//!                      daddr ∈ our pod/external CIDRs (+ our tunnel address); ct mark 0x7700
//!   routing:           no meta mark → main table → local pod
//!   postrouting/srcnat: iif tether-b, saddr 10.0/16 → snat prefix → 10.71/16
//!  replies from our pod go to 10.71.1.2: classified by destination as above, and the ct mark
//!  is restored into the meta mark for any reply whose destination alone would not tell.
//! ```
//!
//! Because peers may share real CIDRs, two peers' connections can have identical conntrack
//! tuples (same pod addresses and ports). A `raw`-priority chain puts each peer's traffic in its
//! own conntrack zone (zone `i + 1`), chosen the same way in both directions: arriving on the
//! peer's tunnel, or addressed to the peer's local views.
//!
//! Local non-pod addresses (the API server for the in-band control plane, say) can be published
//! under addresses of our external CIDR ([`GatewayInput::ip_mappings`]): DNAT for peers that
//! connect to them, SNAT for connections they open towards peers. A connection a peer opens to
//! such an address is also masqueraded to the gateway's own address: the real target may be
//! outside the pod network (the API server is) and the peer's source may equal one of our pod
//! addresses, so only the gateway can take the replies back. This is the one deliberate
//! masquerade, for control traffic only; pod-to-pod traffic keeps its (remapped) sources.
//! Such a connection is in its peer's conntrack zone in the original direction only (`ct
//! original zone`), since its replies, addressed to the gateway, tell no peer apart; the
//! connections a published address opens stay in the default zone.
//!
//! Any other local source heading for a peer (a node forwarding a NodePort or LoadBalancer
//! connection it masqueraded to its own address, a host-network pod) leaves with the network
//! address of our external CIDR, the unknown-source address (host 0, which no published address
//! uses): the peer accepts and routes back only our pod and external CIDRs.
//!
//! Reverse-path filtering is off on tunnels (loose mode would still drop a peer source that only
//! the peer's marked table routes) and loose on pod interfaces; the per-peer source guard is the
//! anti-spoofing check, and a stricter one.
//!
//! Every peer table ends in `unreachable default … metric 4294967295`. When the tunnel device
//! is missing (a restarting gateway, a deleted link) the kernel drops its device routes while
//! our rule and nftables table stay; without the catch-all the marked lookup would find nothing,
//! policy routing would continue to the main table, and a packet already translated to the
//! peer's real CIDR — possibly equal to our own — would be delivered to a local pod. An
//! unreachable route ends the lookup with an error (a rule falls through only when its table
//! yields no route at all), so the packet is dropped and the sender gets ICMP host unreachable.
//! For a remapped peer the error comes from the address the sender used, but the header it
//! quotes keeps the peer's real address (the DNAT is not undone inside it): unconnected sockets
//! with `IP_RECVERR` see it, a socket connected to the local view does not and times out as it
//! would with a blackhole. For a peer without a remap the quoted address is the one the sender
//! used, so connected sockets fail at once too.
//!
//! Packets arriving from a tunnel never get a meta mark: the peer's real CIDR may equal our own
//! pod CIDR, and a mark would send them straight back into the tunnel.
//!
//! # Example
//!
//! ```
//! use tether_netplan::{CidrMapping, GatewayInput, LocalNetworks, Observed, PeerInput, diff, plan};
//!
//! let input = GatewayInput {
//!     pod_interfaces: vec!["eth0".into()],
//!     local: LocalNetworks { pod_cidrs: vec!["10.0.0.0/16".parse().unwrap()], external_cidr: None },
//!     peers: vec![PeerInput {
//!         id: "cluster-b".into(),
//!         interface: "tether-b".into(),
//!         tunnel_address: Some("169.254.18.1/30".parse().unwrap()),
//!         pod: CidrMapping::remapped("10.0.0.0/16".parse().unwrap(), "10.71.0.0/16".parse().unwrap()),
//!         external: None,
//!     }],
//!     ..GatewayInput::default()
//! };
//! let desired = plan(&input)?;
//! // The catch-all that keeps the lookup in table 7700 when the tunnel is gone (sorted first:
//! // it has the shortest prefix), then the tunnel route.
//! assert_eq!(desired.routes[0].to_string(), "unreachable default table 7700 metric 4294967295");
//! assert_eq!(desired.routes[1].to_string(), "10.0.0.0/16 dev tether-b src 169.254.18.1 table 7700");
//! assert_eq!(desired.rules[0].to_string(), "pref 7700 fwmark 0x7700/0xffff lookup 7700");
//! // The local-table lookup moves behind the fwmark rules.
//! assert_eq!(desired.rules[1].to_string(), "pref 7701 lookup 255");
//! // Against an empty kernel everything is added, then the kernel's `pref 0` local rule goes;
//! // `render()` is the `nft -f -` script.
//! let ops = diff(&desired, &Observed::default());
//! assert_eq!(ops.len(), desired.sysctls.len() + 1 + 2 + 2 + 1 + 1);
//! assert!(desired.nft.render().contains("dnat ip prefix to ip daddr map { 10.71.0.0/16 : 10.0.0.0/16 }"));
//! # Ok::<(), tether_netplan::PlanError>(())
//! ```
//!
//! # Ownership
//!
//! A gateway owns one nftables table, the route tables `route_table_base..+MAX_PEERS`, the rules
//! at `rule_priority` and `rule_priority + 1` (where it moves the kernel's `pref 0 lookup local`
//! rule while it has peers, giving the original back on teardown), and the addresses on its
//! tunnel interfaces ([`GatewayInput::ownership`]).
//! [`diff`] and [`teardown`] only ever touch those, so other software in the namespace
//! coexists. The rendered ruleset embeds its [`Ruleset::fingerprint`] in the table comment,
//! which makes drift and stale tables detectable by reading one string back.

mod diff;
mod error;
pub mod fabric;
mod firewall;
mod input;
mod nft;
mod plan;

pub use diff::{Observed, Op, diff, teardown};
pub use error::PlanError;
pub use fabric::{
    DEFAULT_FABRIC_TABLE, FabricError, FabricInput, FabricObserved, FabricOp, FabricPeer,
    FabricPlan, FabricRoute, FdbEntry, MAX_FABRIC_MTU, MAX_VNI, MIN_FABRIC_MTU, Mac, Neighbour,
    ObservedLink, VxlanLink, mac_for, plan_fabric,
};
pub use fabric::{diff as diff_fabric, teardown as teardown_fabric};
pub use input::{
    CidrMapping, DEFAULT_FWMARK_BASE, DEFAULT_FWMARK_MASK, DEFAULT_MTU, DEFAULT_ROUTE_TABLE_BASE,
    DEFAULT_RULE_PRIORITY, DEFAULT_TABLE, GatewayInput, IpMapping, LocalNetworks, MAX_MTU,
    MAX_PEERS, MIN_MTU, Ownership, PeerInput, check_network,
};
pub use nft::{
    Chain, ChainKind, FINGERPRINT_COMMENT_PREFIX, Hook, NftRule, Priority, Ruleset,
    fingerprint_from_comment,
};
pub use plan::{
    Address, CATCH_ALL_METRIC, LOCAL_TABLE, Plan, Route, RouteKind, Rule, Sysctl, plan,
};
