//! What the gateway assumes when the file is silent: ports, MTUs, intervals, interface names
//! and tunnel addresses.

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use ipnet::Ipv4Net;

use super::PeerSpec;

/// UDP port WireGuard gateways listen on unless told otherwise.
pub const DEFAULT_LISTEN_PORT: u16 = 51840;
/// Port of the admin server (`/metrics`, `/healthz`) unless told otherwise.
pub const DEFAULT_METRICS_PORT: u16 = 9090;
/// Underlay MTU assumed when the file does not say.
pub const DEFAULT_UNDERLAY_MTU: u32 = 1500;
/// Bytes the tunnel costs over an IPv6 underlay (40 IPv6 + 8 UDP + 32 WireGuard). Using the
/// IPv6 figure keeps one default safe on both families (1500 → 1420).
pub const TUNNEL_OVERHEAD: u32 = 80;
/// How often kernel state is re-checked and repaired.
pub const DEFAULT_RECONCILE_INTERVAL: Duration = Duration::from_secs(10);
/// Network default tunnel addresses come from (link-local, never routed off the host).
pub const TUNNEL_ADDRESS_NET: [u8; 3] = [169, 254, 18];

/// The UDP listen address when the file gives none: every address, the default port.
pub fn listen_address() -> SocketAddr {
    SocketAddr::from(([0, 0, 0, 0], DEFAULT_LISTEN_PORT))
}

/// The admin server address when the file gives none.
pub fn metrics_address() -> SocketAddr {
    SocketAddr::from(([0, 0, 0, 0], DEFAULT_METRICS_PORT))
}

/// The tunnel MTU that fits `underlay_mtu` on either address family.
pub fn tunnel_mtu(underlay_mtu: u32) -> u32 {
    underlay_mtu.saturating_sub(TUNNEL_OVERHEAD)
}

/// The default tunnel interface name for a peer: `tth-` plus the id, cut to 15 bytes, with
/// characters an interface name cannot hold replaced by `_`.
pub fn default_interface(id: &str) -> String {
    let mut name = String::from("tth-");
    for c in id.chars() {
        if name.len() >= 15 {
            break;
        }
        name.push(if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
            c
        } else {
            '_'
        });
    }
    name
}

/// Gives every peer without one a tunnel address: the lowest free `169.254.18.x/32`, in the
/// order of `peers`.
///
/// Linux drops forwarded packets that arrive on an interface without any IPv4 address when
/// reverse-path filtering is on (even in loose mode), so each TUN needs one; nothing routes
/// to it, and each side picks its own.
pub(crate) fn assign_tunnel_addresses(peers: &mut [PeerSpec]) {
    let taken: BTreeSet<Ipv4Addr> = peers
        .iter()
        .filter_map(|p| p.tunnel_address.map(|a| a.addr()))
        .collect();
    let [a, b, c] = TUNNEL_ADDRESS_NET;
    let mut free = (1..=254u8)
        .map(|h| Ipv4Addr::new(a, b, c, h))
        .filter(|addr| !taken.contains(addr));
    for p in peers.iter_mut().filter(|p| p.tunnel_address.is_none()) {
        p.tunnel_address = free
            .next()
            .map(|addr| Ipv4Net::new(addr, 32).expect("invariant: /32 is valid"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interface_names_are_truncated_and_sanitised() {
        assert_eq!(default_interface("b"), "tth-b");
        assert_eq!(
            default_interface("a-very-long-cluster-id"),
            "tth-a-very-long"
        );
        assert_eq!(default_interface("a-very-long-cluster-id").len(), 15);
        assert_eq!(default_interface("eu.west/1"), "tth-eu_west_1");
    }

    #[test]
    fn the_default_mtu_leaves_room_for_ipv6_headers() {
        assert_eq!(tunnel_mtu(DEFAULT_UNDERLAY_MTU), 1420);
        assert_eq!(tunnel_mtu(9000), 8920);
    }
}
