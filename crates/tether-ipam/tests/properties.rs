//! Property tests over random operation sequences in a small address space, checked against a
//! brute-force oracle: no overlap ever, remaps are the lowest free aligned block, exhaustion is
//! real, failed calls change nothing, and everything is deterministic and restorable.

use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use proptest::prelude::*;
use tether_ipam::{CidrKind, Ipam, IpamConfig, IpamError};

#[derive(Debug, Clone)]
enum Step {
    Map {
        peer: u8,
        kind: CidrKind,
        real: Ipv4Net,
    },
    Release {
        peer: u8,
        kind: CidrKind,
    },
    ReleasePeer {
        peer: u8,
    },
    AllocateExternal {
        prefix_len: u8,
    },
    ClaimExternal {
        cidr: Ipv4Net,
    },
    ReleaseExternal,
    ExternalIp {
        owner: u8,
    },
    ReleaseIp {
        owner: u8,
    },
}

/// A network with `prefix_len` 22..=26 somewhere in 10.0.0.0/18, host bits cleared.
fn small_net() -> impl Strategy<Value = Ipv4Net> {
    (0u32..(1 << 14), 22u8..=26).prop_map(|(offset, prefix_len)| {
        let addr = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 0, 0, 0)) + offset);
        Ipv4Net::new(addr, prefix_len)
            .expect("prefix <= 32")
            .trunc()
    })
}

fn kind() -> impl Strategy<Value = CidrKind> {
    prop_oneof![Just(CidrKind::Pod), Just(CidrKind::External)]
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (0u8..6, kind(), small_net()).prop_map(|(peer, kind, real)| Step::Map { peer, kind, real }),
        2 => (0u8..6, kind()).prop_map(|(peer, kind)| Step::Release { peer, kind }),
        1 => (0u8..6).prop_map(|peer| Step::ReleasePeer { peer }),
        1 => (22u8..=26).prop_map(|prefix_len| Step::AllocateExternal { prefix_len }),
        1 => small_net().prop_map(|cidr| Step::ClaimExternal { cidr }),
        1 => Just(Step::ReleaseExternal),
        2 => (0u8..8).prop_map(|owner| Step::ExternalIp { owner }),
        1 => (0u8..8).prop_map(|owner| Step::ReleaseIp { owner }),
    ]
}

fn config() -> impl Strategy<Value = IpamConfig> {
    let pools = vec![
        "10.0.16.0/21".parse().expect("literal"),
        "10.0.0.0/22".parse().expect("literal"),
    ];
    proptest::collection::vec(small_net(), 0..4).prop_map(move |reserved| IpamConfig {
        pools: pools.clone(),
        reserved,
    })
}

fn peer_name(peer: u8) -> String {
    format!("peer-{peer}")
}

/// Applies one step; returns a transcript line.
fn apply(ipam: &mut Ipam, step: &Step) -> String {
    match step {
        Step::Map { peer, kind, real } => {
            format!("{:?}", ipam.map_peer_cidr(&peer_name(*peer), *kind, *real))
        }
        Step::Release { peer, kind } => format!("{:?}", ipam.release(&peer_name(*peer), *kind)),
        Step::ReleasePeer { peer } => format!("{:?}", ipam.release_peer(&peer_name(*peer))),
        Step::AllocateExternal { prefix_len } => {
            format!("{:?}", ipam.allocate_external(*prefix_len))
        }
        Step::ClaimExternal { cidr } => format!("{:?}", ipam.claim_external(*cidr)),
        Step::ReleaseExternal => format!("{:?}", ipam.release_external()),
        Step::ExternalIp { owner } => {
            format!("{:?}", ipam.allocate_external_ip(&format!("o{owner}")))
        }
        Step::ReleaseIp { owner } => {
            format!("{:?}", ipam.release_external_ip(&format!("o{owner}")))
        }
    }
}

fn overlaps(a: Ipv4Net, b: Ipv4Net) -> bool {
    a.contains(&b.network()) || b.contains(&a.network())
}

/// Live allocations: the external CIDR and every mapping's local view.
fn live(ipam: &Ipam) -> Vec<Ipv4Net> {
    ipam.external()
        .into_iter()
        .chain(ipam.mappings().map(|m| m.local_view))
        .collect()
}

fn check_invariants(ipam: &Ipam) {
    let live = live(ipam);
    for (i, a) in live.iter().enumerate() {
        for b in &live[i + 1..] {
            assert!(!overlaps(*a, *b), "live allocations {a} and {b} overlap");
        }
        for reserved in &ipam.config().reserved {
            assert!(!overlaps(*a, *reserved), "{a} overlaps reserved {reserved}");
        }
    }
    let ips: Vec<_> = ipam.external_ips().collect();
    for (i, ip) in ips.iter().enumerate() {
        let cidr = ipam.external().expect("external IPs need an external CIDR");
        assert!(cidr.contains(&ip.address), "{ip:?} outside {cidr}");
        assert_ne!(
            ip.address,
            cidr.network(),
            "the unknown-source IP was handed out"
        );
        assert_ne!(
            ip.address,
            cidr.broadcast(),
            "the broadcast address was handed out"
        );
        assert!(
            ips[i + 1..].iter().all(|other| other.address != ip.address),
            "{ip:?} twice"
        );
    }
    for mapping in ipam.mappings() {
        assert_eq!(
            mapping.real.prefix_len(),
            mapping.local_view.prefix_len(),
            "{mapping}"
        );
        if mapping.is_remapped() {
            assert!(
                ipam.config()
                    .pools
                    .iter()
                    .any(|pool| pool.contains(&mapping.local_view)),
                "remap outside the pools: {mapping}"
            );
        }
    }
}

/// Every aligned block of `prefix_len` in the pools, in search order.
fn all_blocks(config: &IpamConfig, prefix_len: u8) -> Vec<Ipv4Net> {
    config
        .pools
        .iter()
        .flat_map(|pool| pool.subnets(prefix_len).into_iter().flatten())
        .collect()
}

/// The oracle: the first block no occupied CIDR overlaps.
fn first_free(config: &IpamConfig, prefix_len: u8, occupied: &[Ipv4Net]) -> Option<Ipv4Net> {
    all_blocks(config, prefix_len)
        .into_iter()
        .find(|block| occupied.iter().all(|taken| !overlaps(*taken, *block)))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn invariants_hold_and_remaps_match_the_oracle(
        config in config(),
        steps in proptest::collection::vec(step(), 1..40),
    ) {
        let mut ipam = Ipam::new(config.clone()).expect("valid config");
        for step in &steps {
            let before = ipam.clone();
            let outcome = apply(&mut ipam, step);
            check_invariants(&ipam);
            if outcome.starts_with("Err") {
                prop_assert_eq!(&ipam, &before, "failed call changed state: {:?}", step);
            }
            if let Step::Map { peer, kind, real } = step {
                let name = peer_name(*peer);
                let previous = before.mapping(&name, *kind).cloned();
                if previous.as_ref().is_some_and(|m| m.real == *real) {
                    prop_assert_eq!(ipam.mapping(&name, *kind), previous.as_ref());
                    continue;
                }
                let mut occupied = config.reserved.clone();
                occupied.extend(before.external());
                occupied.extend(
                    before.mappings()
                        .filter(|m| !(m.peer == name && m.kind == *kind))
                        .map(|m| m.local_view),
                );
                let collides = occupied.iter().any(|taken| overlaps(*taken, *real));
                let expected = if collides {
                    first_free(&config, real.prefix_len(), &occupied)
                } else {
                    Some(*real)
                };
                match (ipam.map_peer_cidr(&name, *kind, *real), expected) {
                    (Ok(mapping), Some(view)) => prop_assert_eq!(mapping.local_view, view),
                    (Err(IpamError::Exhausted { prefix_len, .. }), None) => {
                        prop_assert_eq!(prefix_len, real.prefix_len());
                    }
                    (got, want) => prop_assert!(false, "got {:?}, oracle {:?}", got, want),
                }
            }
        }
    }

    #[test]
    fn same_steps_give_same_answers(
        config in config(),
        steps in proptest::collection::vec(step(), 1..40),
    ) {
        let mut first = Ipam::new(config.clone()).expect("valid config");
        let mut second = Ipam::new(config).expect("valid config");
        for step in &steps {
            prop_assert_eq!(apply(&mut first, step), apply(&mut second, step));
        }
        prop_assert_eq!(first.state(), second.state());
    }

    #[test]
    fn map_release_map_round_trips(
        config in config(),
        steps in proptest::collection::vec(step(), 0..30),
        kind in kind(),
        real in small_net(),
    ) {
        let mut ipam = Ipam::new(config).expect("valid config");
        for step in &steps {
            apply(&mut ipam, step);
        }
        let before = ipam.clone();
        let first = ipam.map_peer_cidr("newcomer", kind, real);
        ipam.release("newcomer", kind);
        prop_assert_eq!(&ipam, &before);
        let second = ipam.map_peer_cidr("newcomer", kind, real);
        prop_assert_eq!(first, second);
    }

    #[test]
    fn restored_state_continues_identically(
        config in config(),
        steps in proptest::collection::vec(step(), 0..30),
        more in proptest::collection::vec(step(), 1..20),
    ) {
        let mut ipam = Ipam::new(config.clone()).expect("valid config");
        for step in &steps {
            apply(&mut ipam, step);
        }
        let json = serde_json::to_string(&ipam.state()).expect("state serializes");
        let state = serde_json::from_str(&json).expect("state deserializes");
        let mut restored = Ipam::restore(config, &state).expect("own state restores");
        prop_assert_eq!(&restored, &ipam);
        for step in &more {
            prop_assert_eq!(apply(&mut restored, step), apply(&mut ipam, step));
        }
    }

    #[test]
    fn exhaustion_is_reported_exactly_when_no_block_is_free(
        reserved in proptest::collection::vec(small_net(), 0..4),
        prefix_len in 22u8..=24,
    ) {
        // The owner takes the real CIDR first, so every later peer with the same CIDR collides
        // and must be remapped; keep adding peers until the IPAM reports exhaustion.
        let config = IpamConfig { pools: vec!["10.0.0.0/21".parse().expect("literal")], reserved };
        let mut ipam = Ipam::new(config.clone()).expect("valid config");
        let colliding = Ipv4Net::new(Ipv4Addr::new(10, 0, 0, 0), prefix_len).expect("valid");
        match ipam.map_peer_cidr("owner", CidrKind::Pod, colliding) {
            Ok(_) | Err(IpamError::Exhausted { .. }) => {}
            Err(other) => prop_assert!(false, "unexpected error {other}"),
        }
        let mut allocated = 0usize;
        loop {
            match ipam.map_peer_cidr(&format!("p{allocated}"), CidrKind::Pod, colliding) {
                Ok(_) => allocated += 1,
                Err(IpamError::Exhausted { .. }) => break,
                Err(other) => prop_assert!(false, "unexpected error {other}"),
            }
            prop_assert!(allocated <= 64, "cannot exceed the pool's block count");
        }
        let live = live(&ipam);
        let free = all_blocks(&config, prefix_len)
            .into_iter()
            .filter(|block| {
                config.reserved.iter().chain(&live).all(|taken| !overlaps(*taken, *block))
            })
            .count();
        prop_assert_eq!(free, 0, "exhausted while blocks were free");
        check_invariants(&ipam);
    }
}
