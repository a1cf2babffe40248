//! Allowed IPs: which inner source addresses a peer may use. boringtun does not check this,
//! so a peer holding a valid key could otherwise spoof any source.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

/// The set of networks a peer's decrypted packets may come from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AllowedIps {
    nets: Vec<IpNet>,
}

impl AllowedIps {
    /// A set of networks (host bits are ignored).
    pub fn new(nets: impl IntoIterator<Item = IpNet>) -> Self {
        Self {
            nets: nets.into_iter().map(|n| n.trunc()).collect(),
        }
    }

    /// The networks.
    pub fn nets(&self) -> &[IpNet] {
        &self.nets
    }

    /// Whether `addr` lies in one of the networks.
    pub fn contains(&self, addr: IpAddr) -> bool {
        self.nets.iter().any(|n| n.contains(&addr))
    }

    /// The inner source address of an IP packet, if it is well-formed enough to have one.
    pub fn source_of(packet: &[u8]) -> Option<IpAddr> {
        match packet.first()? >> 4 {
            4 if packet.len() >= 20 => {
                let b: [u8; 4] = packet[12..16].try_into().ok()?;
                Some(IpAddr::V4(Ipv4Addr::from(b)))
            }
            6 if packet.len() >= 40 => {
                let b: [u8; 16] = packet[8..24].try_into().ok()?;
                Some(IpAddr::V6(Ipv6Addr::from(b)))
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn v4_packet(src: Ipv4Addr) -> Vec<u8> {
        let mut p = vec![0u8; 20];
        p[0] = 0x45;
        p[12..16].copy_from_slice(&src.octets());
        p
    }

    #[test]
    fn short_or_unknown_packets_have_no_source() {
        assert_eq!(AllowedIps::source_of(&[]), None);
        assert_eq!(AllowedIps::source_of(&[0x45; 19]), None);
        assert_eq!(AllowedIps::source_of(&[0x15; 40]), None);
    }

    proptest! {
        #[test]
        fn membership_matches_prefix_math(a: u32, net: u32, len in 0u8..=32) {
            let n: IpNet = ipnet::Ipv4Net::new(Ipv4Addr::from(net), len).expect("len<=32").into();
            let allowed = AllowedIps::new([n]);
            let addr = Ipv4Addr::from(a);
            let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
            let expected = (a & mask) == (net & mask);
            let src = AllowedIps::source_of(&v4_packet(addr)).expect("well-formed");
            prop_assert_eq!(allowed.contains(src), expected);
        }
    }
}
