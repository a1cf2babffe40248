//! Pod IP allocation from the node's pod CIDR (pure: no IO, no clock).
//!
//! The first usable address is the node side of every pod's veth (the pods' default gateway),
//! so it is never handed to a pod; the network and broadcast addresses are never used either.
//! Allocation is deterministic (lowest free address first), which keeps test output stable.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

/// Why an address could not be allocated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IpamError {
    /// The pod CIDR is too small to hold a gateway and at least one pod.
    #[error(
        "pod CIDR {0} is too small: it needs room for a gateway and one pod (use /30 or larger)"
    )]
    TooSmall(Ipv4Net),
    /// Every address is taken.
    #[error("pod CIDR {cidr} is exhausted ({used} pods hold an address)")]
    Exhausted {
        /// The pod CIDR.
        cidr: Ipv4Net,
        /// How many addresses are allocated.
        used: usize,
    },
    /// The address does not belong to the pod CIDR, or is reserved.
    #[error("{addr} is not an assignable pod address of {cidr}")]
    OutOfRange {
        /// The address asked for.
        addr: Ipv4Addr,
        /// The pod CIDR.
        cidr: Ipv4Net,
    },
    /// The address is already held by another pod.
    #[error("{addr} is already held by pod {holder}")]
    Taken {
        /// The address asked for.
        addr: Ipv4Addr,
        /// The key of the pod holding it.
        holder: String,
    },
}

/// Hands out pod addresses from one IPv4 pod CIDR, keyed by pod UID.
#[derive(Debug, Clone)]
pub struct PodIpAllocator {
    cidr: Ipv4Net,
    by_addr: BTreeMap<u32, String>,
    by_key: BTreeMap<String, Ipv4Addr>,
}

impl PodIpAllocator {
    /// An allocator for `cidr` (its host bits are ignored).
    pub fn new(cidr: Ipv4Net) -> Result<Self, IpamError> {
        let cidr = cidr.trunc();
        if cidr.prefix_len() > 30 {
            return Err(IpamError::TooSmall(cidr));
        }
        Ok(Self {
            cidr,
            by_addr: BTreeMap::new(),
            by_key: BTreeMap::new(),
        })
    }

    /// The pod CIDR.
    pub fn cidr(&self) -> Ipv4Net {
        self.cidr
    }

    /// The node-side address every pod uses as its default gateway.
    pub fn gateway(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.cidr.network()) + 1)
    }

    fn first(&self) -> u32 {
        u32::from(self.cidr.network()) + 2
    }

    fn last(&self) -> u32 {
        u32::from(self.cidr.broadcast()) - 1
    }

    /// How many addresses pods can hold in total.
    pub fn capacity(&self) -> usize {
        (self.last() - self.first() + 1) as usize
    }

    /// How many addresses are allocated.
    pub fn used(&self) -> usize {
        self.by_key.len()
    }

    /// The address held by `key`, if any.
    pub fn get(&self, key: &str) -> Option<Ipv4Addr> {
        self.by_key.get(key).copied()
    }

    /// Allocates the lowest free address to `key`; idempotent for a key that already holds one.
    pub fn allocate(&mut self, key: &str) -> Result<Ipv4Addr, IpamError> {
        if let Some(addr) = self.get(key) {
            return Ok(addr);
        }
        let mut candidate = self.first();
        for &taken in self
            .by_addr
            .range(self.first()..=self.last())
            .map(|(a, _)| a)
        {
            if taken != candidate {
                break;
            }
            candidate += 1;
        }
        if candidate > self.last() {
            return Err(IpamError::Exhausted {
                cidr: self.cidr,
                used: self.used(),
            });
        }
        let addr = Ipv4Addr::from(candidate);
        self.by_addr.insert(candidate, key.to_owned());
        self.by_key.insert(key.to_owned(), addr);
        Ok(addr)
    }

    /// Records that `key` holds `addr` (used when the agent restarts and finds running pods).
    pub fn reserve(&mut self, key: &str, addr: Ipv4Addr) -> Result<(), IpamError> {
        let raw = u32::from(addr);
        if raw < self.first() || raw > self.last() {
            return Err(IpamError::OutOfRange {
                addr,
                cidr: self.cidr,
            });
        }
        match self.by_addr.get(&raw) {
            Some(holder) if holder == key => Ok(()),
            Some(holder) => Err(IpamError::Taken {
                addr,
                holder: holder.clone(),
            }),
            None => {
                if let Some(old) = self.by_key.insert(key.to_owned(), addr) {
                    self.by_addr.remove(&u32::from(old));
                }
                self.by_addr.insert(raw, key.to_owned());
                Ok(())
            }
        }
    }

    /// Frees the address held by `key`; returns it.
    pub fn release(&mut self, key: &str) -> Option<Ipv4Addr> {
        let addr = self.by_key.remove(key)?;
        self.by_addr.remove(&u32::from(addr));
        Some(addr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn net(s: &str) -> Ipv4Net {
        s.parse().expect("test CIDR")
    }

    #[test]
    fn skips_network_gateway_and_broadcast() {
        let mut ipam = PodIpAllocator::new(net("10.244.1.0/29")).expect("valid");
        assert_eq!(ipam.gateway(), Ipv4Addr::new(10, 244, 1, 1));
        assert_eq!(ipam.capacity(), 5);
        let got: Vec<_> = (0..5)
            .map(|i| ipam.allocate(&format!("p{i}")).expect("room").to_string())
            .collect();
        expect_test::expect![[r#"
            [
                "10.244.1.2",
                "10.244.1.3",
                "10.244.1.4",
                "10.244.1.5",
                "10.244.1.6",
            ]
        "#]]
        .assert_debug_eq(&got);
        let err = ipam.allocate("p5").expect_err("full");
        assert_eq!(
            err.to_string(),
            "pod CIDR 10.244.1.0/29 is exhausted (5 pods hold an address)"
        );
    }

    #[test]
    fn reuses_the_lowest_released_address_and_is_idempotent() {
        let mut ipam = PodIpAllocator::new(net("10.0.0.0/24")).expect("valid");
        let a = ipam.allocate("a").expect("room");
        let b = ipam.allocate("b").expect("room");
        assert_eq!(ipam.allocate("a").expect("same"), a);
        assert_eq!(ipam.release("a"), Some(a));
        assert_eq!(ipam.allocate("c").expect("room"), a);
        assert_ne!(a, b);
        assert_eq!(ipam.release("zzz"), None);
    }

    #[test]
    fn reserve_checks_range_and_holder() {
        let mut ipam = PodIpAllocator::new(net("10.0.0.0/24")).expect("valid");
        ipam.reserve("a", Ipv4Addr::new(10, 0, 0, 9)).expect("free");
        assert!(matches!(
            ipam.reserve("b", Ipv4Addr::new(10, 0, 0, 9)),
            Err(IpamError::Taken { .. })
        ));
        assert!(matches!(
            ipam.reserve("b", Ipv4Addr::new(10, 0, 0, 1)),
            Err(IpamError::OutOfRange { .. })
        ));
        assert!(matches!(
            ipam.reserve("b", Ipv4Addr::new(10, 0, 1, 5)),
            Err(IpamError::OutOfRange { .. })
        ));
        assert_eq!(
            ipam.allocate("c").expect("room"),
            Ipv4Addr::new(10, 0, 0, 2)
        );
        assert!(PodIpAllocator::new(net("10.0.0.0/31")).is_err());
    }

    proptest! {
        #[test]
        fn never_hands_out_duplicates_or_reserved(ops in proptest::collection::vec((0u8..12, any::<bool>()), 0..200)) {
            let mut ipam = PodIpAllocator::new(net("10.9.0.0/28")).expect("valid");
            for (key, alloc) in ops {
                let key = format!("k{key}");
                if alloc {
                    if let Ok(addr) = ipam.allocate(&key) {
                        prop_assert!(ipam.cidr().contains(&addr));
                        prop_assert_ne!(addr, ipam.gateway());
                        prop_assert_ne!(addr, ipam.cidr().network());
                        prop_assert_ne!(addr, ipam.cidr().broadcast());
                    } else {
                        prop_assert_eq!(ipam.used(), ipam.capacity());
                    }
                } else {
                    ipam.release(&key);
                }
                let mut seen = std::collections::BTreeSet::new();
                for i in 0..12 {
                    if let Some(a) = ipam.get(&format!("k{i}")) {
                        prop_assert!(seen.insert(a), "duplicate {}", a);
                    }
                }
            }
        }
    }
}
