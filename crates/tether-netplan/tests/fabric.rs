//! The fabric planner from data: snapshots of a node's and a gateway pod's plans, of the
//! errors bad input gives, of diffs against observed states, and properties (any input order
//! gives the same plan; no destination is routed twice).

// Fixtures are literals and valid by construction; a panic is the test failing.
#![allow(clippy::unwrap_used)]

use std::net::Ipv4Addr;

use expect_test::{Expect, expect};
use ipnet::Ipv4Net;
use proptest::prelude::*;
use tether_netplan::{
    DEFAULT_FABRIC_TABLE, FabricInput, FabricObserved, FabricPeer, ObservedLink, diff_fabric,
    mac_for, plan_fabric, teardown_fabric,
};

fn net(text: &str) -> Ipv4Net {
    text.parse().expect("CIDR literal")
}

fn ip(text: &str) -> Ipv4Addr {
    text.parse().expect("address literal")
}

fn peer(addr: &str, cidrs: &[&str], mtu: Option<u32>) -> FabricPeer {
    FabricPeer {
        ip: ip(addr),
        cidrs: cidrs.iter().map(|c| net(c)).collect(),
        mtu,
    }
}

/// Node A: two remote clusters behind two gateway pods, a third remote cluster without one.
fn node() -> FabricInput {
    FabricInput {
        device: "tether-fabric".to_owned(),
        vni: 7700,
        port: 4789,
        local_ip: ip("203.0.113.1"),
        mtu: 1450,
        table: DEFAULT_FABRIC_TABLE.to_owned(),
        peers: vec![
            peer("10.244.1.7", &["10.71.0.0/16", "10.81.0.0/16"], Some(1420)),
            peer("10.244.2.9", &["10.72.0.0/16"], Some(1400)),
        ],
        unreachable: vec![net("10.73.0.0/16")],
    }
}

fn check(input: &FabricInput, expect: Expect) {
    let actual = match plan_fabric(input) {
        Ok(plan) => plan.to_string(),
        Err(error) => format!("error: {error}"),
    };
    expect.assert_eq(&actual);
}

#[test]
fn a_node_routes_remote_cidrs_to_their_gateway_pods_and_fails_fast_without_one() {
    check(
        &node(),
        expect![[r#"
            link tether-fabric address 02:74:cb:00:71:01 mtu 1450 type vxlan id 7700 dstport 4789 local 203.0.113.1 nolearning
            fdb 02:74:0a:f4:01:07 dst 10.244.1.7 dev tether-fabric
            fdb 02:74:0a:f4:02:09 dst 10.244.2.9 dev tether-fabric
            neigh 10.244.1.7 lladdr 02:74:0a:f4:01:07 permanent dev tether-fabric
            neigh 10.244.2.9 lladdr 02:74:0a:f4:02:09 permanent dev tether-fabric
            route 10.71.0.0/16 via 10.244.1.7 onlink mtu 1420 dev tether-fabric
            route 10.72.0.0/16 via 10.244.2.9 onlink mtu 1400 dev tether-fabric
            route unreachable 10.73.0.0/16
            route 10.81.0.0/16 via 10.244.1.7 onlink mtu 1420 dev tether-fabric
            table ip tether-fabric
            delete table ip tether-fabric
            table ip tether-fabric {
            	comment "tether:26558c9356e56220"
            	chain forward {
            		type filter hook forward priority mangle; policy accept;
            		oifname "tether-fabric" tcp flags & (syn | rst) == syn tcp option maxseg size set rt mtu comment "clamp MSS to the route MTU into the overlay"
            		iifname "tether-fabric" ip saddr { 10.72.0.0/16 } tcp flags & (syn | rst) == syn tcp option maxseg size > 1360 tcp option maxseg size set 1360 comment "clamp MSS to the MTU 1400 out of the overlay"
            		iifname "tether-fabric" ip saddr { 10.71.0.0/16, 10.81.0.0/16 } tcp flags & (syn | rst) == syn tcp option maxseg size > 1380 tcp option maxseg size set 1380 comment "clamp MSS to the MTU 1420 out of the overlay"
            	}
            }
        "#]],
    );
}

#[test]
fn a_gateway_pod_routes_each_nodes_pod_cidr_at_the_device_mtu() {
    let input = FabricInput {
        local_ip: ip("10.244.1.7"),
        peers: vec![
            peer("203.0.113.2", &["10.0.2.0/24"], None),
            peer("203.0.113.1", &["10.0.1.0/24"], None),
        ],
        unreachable: Vec::new(),
        ..node()
    };
    check(
        &input,
        expect![[r#"
            link tether-fabric address 02:74:0a:f4:01:07 mtu 1450 type vxlan id 7700 dstport 4789 local 10.244.1.7 nolearning
            fdb 02:74:cb:00:71:01 dst 203.0.113.1 dev tether-fabric
            fdb 02:74:cb:00:71:02 dst 203.0.113.2 dev tether-fabric
            neigh 203.0.113.1 lladdr 02:74:cb:00:71:01 permanent dev tether-fabric
            neigh 203.0.113.2 lladdr 02:74:cb:00:71:02 permanent dev tether-fabric
            route 10.0.1.0/24 via 203.0.113.1 onlink dev tether-fabric
            route 10.0.2.0/24 via 203.0.113.2 onlink dev tether-fabric
            table ip tether-fabric
            delete table ip tether-fabric
            table ip tether-fabric {
            	comment "tether:bcf238d9d12a64af"
            	chain forward {
            		type filter hook forward priority mangle; policy accept;
            		oifname "tether-fabric" tcp flags & (syn | rst) == syn tcp option maxseg size set rt mtu comment "clamp MSS to the route MTU into the overlay"
            		iifname "tether-fabric" ip saddr { 10.0.1.0/24, 10.0.2.0/24 } tcp flags & (syn | rst) == syn tcp option maxseg size > 1410 tcp option maxseg size set 1410 comment "clamp MSS to the MTU 1450 out of the overlay"
            	}
            }
        "#]],
    );
}

#[test]
fn a_route_mtu_above_the_device_mtu_is_left_out() {
    let mut input = node();
    input.peers = vec![peer("10.244.1.7", &["10.71.0.0/16"], Some(1500))];
    input.unreachable.clear();
    let plan = plan_fabric(&input).unwrap();
    assert_eq!(plan.routes[0].mtu, None);
    assert!(
        plan.nft.render().contains("MTU 1450"),
        "{}",
        plan.nft.render()
    );
}

#[test]
fn bad_inputs_name_what_is_wrong() {
    let cases: Vec<(&str, FabricInput)> = vec![
        (
            "device name",
            FabricInput {
                device: "a-much-too-long-name".to_owned(),
                ..node()
            },
        ),
        (
            "table name",
            FabricInput {
                table: "tether fabric".to_owned(),
                ..node()
            },
        ),
        (
            "vni",
            FabricInput {
                vni: 1 << 24,
                ..node()
            },
        ),
        ("port", FabricInput { port: 0, ..node() }),
        ("device mtu", FabricInput { mtu: 100, ..node() }),
        (
            "route mtu",
            FabricInput {
                peers: vec![peer("10.244.1.7", &["10.71.0.0/16"], Some(65000))],
                ..node()
            },
        ),
        (
            "local address",
            FabricInput {
                local_ip: Ipv4Addr::UNSPECIFIED,
                ..node()
            },
        ),
        (
            "duplicate peer",
            FabricInput {
                peers: vec![
                    peer("10.244.1.7", &["10.71.0.0/16"], None),
                    peer("10.244.1.7", &["10.72.0.0/16"], None),
                ],
                ..node()
            },
        ),
        (
            "peer is us",
            FabricInput {
                peers: vec![peer("203.0.113.1", &["10.71.0.0/16"], None)],
                ..node()
            },
        ),
        (
            "host bits",
            FabricInput {
                peers: vec![peer("10.244.1.7", &["10.71.0.1/16"], None)],
                ..node()
            },
        ),
        (
            "two next hops",
            FabricInput {
                peers: vec![
                    peer("10.244.1.7", &["10.71.0.0/16"], None),
                    peer("10.244.2.9", &["10.71.128.0/17"], None),
                ],
                ..node()
            },
        ),
        (
            "routed and unreachable",
            FabricInput {
                unreachable: vec![net("10.71.0.0/24")],
                ..node()
            },
        ),
        (
            "underlay in the overlay",
            FabricInput {
                peers: vec![peer("10.244.1.7", &["10.244.0.0/16"], None)],
                unreachable: Vec::new(),
                ..node()
            },
        ),
    ];
    let report: String = cases
        .iter()
        .map(|(name, input)| {
            let error = plan_fabric(input).expect_err(name);
            let mut line = format!("{name}: {error}");
            let mut source = std::error::Error::source(&error);
            while let Some(inner) = source {
                line.push_str(&format!(" <- {inner}"));
                source = inner.source();
            }
            line + "\n"
        })
        .collect();
    expect![[r#"
        device name: fabric device "a-much-too-long-name" is not a valid interface name <- invalid interface name "a-much-too-long-name": use 1 to 15 ASCII letters, digits or '-', '_', '.'
        table name: invalid fabric nftables table name "tether fabric": use 1 to 64 ASCII letters, digits, '_' or '-', starting with a letter
        vni: VXLAN id 16777216 does not fit in 24 bits (max 16777215)
        port: VXLAN UDP port 0 is not a port
        device mtu: device MTU 100 is out of range: use 576..=9000
        route mtu: peer 10.244.1.7 route MTU 65000 is out of range: use 576..=9000
        local address: local underlay address 0.0.0.0 cannot carry unicast VXLAN
        duplicate peer: underlay address 10.244.1.7 appears more than once (peers and the local address must differ)
        peer is us: underlay address 203.0.113.1 appears more than once (peers and the local address must differ)
        host bits: fabric CIDR 10.71.0.1/16 has host bits set <- peer 10.244.1.7 CIDR 10.71.0.1/16 has host bits set: did you mean 10.71.0.0/16?
        two next hops: peer 10.244.1.7 CIDR 10.71.0.0/16 overlaps peer 10.244.2.9 CIDR 10.71.128.0/17: one destination needs one next hop
        routed and unreachable: peer 10.244.1.7 CIDR 10.71.0.0/16 overlaps unreachable CIDR 10.71.0.0/24: one destination needs one next hop
        underlay in the overlay: peer 10.244.1.7 CIDR 10.244.0.0/16 contains the underlay address 10.244.1.7: VXLAN packets would loop into the overlay
    "#]]
    .assert_eq(&report);
}

fn observed_as_planned(input: &FabricInput) -> FabricObserved {
    let plan = plan_fabric(input).unwrap();
    FabricObserved {
        link: Some(ObservedLink {
            is_vxlan: true,
            vni: Some(plan.link.vni),
            port: Some(plan.link.port),
            local: Some(plan.link.local),
            learning: false,
            mac: Some(plan.link.mac),
            mtu: plan.link.mtu,
            up: true,
        }),
        fdb: plan.fdb.clone(),
        neighbours: plan.neighbours.clone(),
        routes: plan.routes.clone(),
        ruleset_fingerprint: Some(plan.nft.fingerprint()),
    }
}

fn ops(list: &[tether_netplan::FabricOp]) -> String {
    list.iter().map(|op| format!("{op}\n")).collect()
}

#[test]
fn diffs_create_change_and_remove_only_what_differs() {
    let input = node();
    let plan = plan_fabric(&input).unwrap();
    assert_eq!(diff_fabric(&plan, &observed_as_planned(&input)), vec![]);

    // The gateway pod of 10.72/16 went away: its CIDR becomes unreachable; a peer changes MTU.
    let mut changed = node();
    changed.peers = vec![peer(
        "10.244.1.7",
        &["10.71.0.0/16", "10.81.0.0/16"],
        Some(1380),
    )];
    changed.unreachable.push(net("10.72.0.0/16"));
    let plan = plan_fabric(&changed).unwrap();
    expect![[r#"
        ip route del 10.71.0.0/16 via 10.244.1.7 onlink mtu 1420
        ip route del 10.72.0.0/16 via 10.244.2.9 onlink mtu 1400
        ip route del 10.81.0.0/16 via 10.244.1.7 onlink mtu 1420
        ip neigh del 10.244.2.9 lladdr 02:74:0a:f4:02:09 permanent
        bridge fdb del 02:74:0a:f4:02:09 dst 10.244.2.9
        ip route add 10.71.0.0/16 via 10.244.1.7 onlink mtu 1380
        ip route add unreachable 10.72.0.0/16
        ip route add 10.81.0.0/16 via 10.244.1.7 onlink mtu 1380
        nft replace table ip tether-fabric (23f20534cc81848f)
    "#]]
    .assert_eq(&ops(&diff_fabric(&plan, &observed_as_planned(&input))));

    // A device of our name with another VNI is replaced; unreachable routes survive that.
    let mut observed = observed_as_planned(&input);
    if let Some(link) = observed.link.as_mut() {
        link.vni = Some(42);
    }
    expect![[r#"
        ip link del tether-fabric
        ip link add tether-fabric address 02:74:cb:00:71:01 mtu 1450 type vxlan id 7700 dstport 4789 local 203.0.113.1 nolearning
        bridge fdb add 02:74:0a:f4:01:07 dst 10.244.1.7
        bridge fdb add 02:74:0a:f4:02:09 dst 10.244.2.9
        ip neigh add 10.244.1.7 lladdr 02:74:0a:f4:01:07 permanent
        ip neigh add 10.244.2.9 lladdr 02:74:0a:f4:02:09 permanent
        ip route add 10.71.0.0/16 via 10.244.1.7 onlink mtu 1420
        ip route add 10.72.0.0/16 via 10.244.2.9 onlink mtu 1400
        ip route add 10.81.0.0/16 via 10.244.1.7 onlink mtu 1420
    "#]]
    .assert_eq(&ops(&diff_fabric(&plan_fabric(&input).unwrap(), &observed)));

    expect![[r#"
        nft delete table ip tether-fabric
        ip route del unreachable 10.73.0.0/16
        ip link del tether-fabric
    "#]]
    .assert_eq(&ops(&teardown_fabric(
        "tether-fabric",
        DEFAULT_FABRIC_TABLE,
        &observed_as_planned(&input),
    )));
}

#[test]
fn our_own_address_may_lie_in_a_routed_cidr() {
    // A gateway pod's IP lies in its node's pod CIDR, which the gateway routes to that node.
    let input = FabricInput {
        local_ip: ip("10.0.1.7"),
        peers: vec![peer("203.0.113.1", &["10.0.1.0/24"], None)],
        unreachable: Vec::new(),
        ..node()
    };
    assert!(plan_fabric(&input).is_ok());
}

#[test]
fn macs_are_locally_administered_unicast_and_follow_the_address() {
    let mac = mac_for(ip("192.0.2.254"));
    assert_eq!(mac.to_string(), "02:74:c0:00:02:fe");
    assert_eq!(mac.0[0] & 0b11, 0b10, "locally administered, unicast");
}

fn arb_input() -> impl Strategy<Value = FabricInput> {
    // Peers at 10.244.0.i, each with some /24s out of 10.70.0.0/16 picked disjointly by index,
    // and unreachable /24s from 10.90.0.0/16.
    let peers = proptest::collection::btree_map(
        1u8..50,
        (
            proptest::collection::btree_set(0u8..=255, 0..4),
            proptest::option::of(1300u32..1500),
        ),
        0..6,
    );
    let unreachable = proptest::collection::vec(0u8..=255, 0..4);
    (peers, unreachable).prop_map(|(peers, unreachable)| {
        let mut used = std::collections::BTreeSet::new();
        let peers = peers
            .into_iter()
            .map(|(host, (blocks, mtu))| FabricPeer {
                ip: Ipv4Addr::new(10, 244, 0, host),
                cidrs: blocks
                    .into_iter()
                    .filter(|b| used.insert(*b))
                    .map(|b| Ipv4Net::new(Ipv4Addr::new(10, 70, b, 0), 24).unwrap())
                    .collect(),
                mtu,
            })
            .collect();
        FabricInput {
            peers,
            unreachable: unreachable
                .into_iter()
                .map(|b| Ipv4Net::new(Ipv4Addr::new(10, 90, b, 0), 24).unwrap())
                .collect(),
            ..node()
        }
    })
}

proptest! {
    #[test]
    fn plans_do_not_depend_on_input_order(input in arb_input(), seed in any::<u64>()) {
        let plan = plan_fabric(&input).unwrap();
        let mut shuffled = input;
        let rotate = |len: usize| if len == 0 { 0 } else { (seed as usize) % len };
        let n = shuffled.peers.len();
        shuffled.peers.rotate_left(rotate(n));
        shuffled.peers.reverse();
        for peer in &mut shuffled.peers {
            let n = peer.cidrs.len();
            peer.cidrs.rotate_left(rotate(n));
        }
        shuffled.unreachable.reverse();
        let again = plan_fabric(&shuffled).unwrap();
        prop_assert_eq!(plan.to_string(), again.to_string());
        prop_assert_eq!(&plan, &again);
    }

    #[test]
    fn no_destination_is_routed_twice(input in arb_input()) {
        let plan = plan_fabric(&input).unwrap();
        let dsts: std::collections::BTreeSet<_> = plan.routes.iter().map(|r| r.dst).collect();
        prop_assert_eq!(dsts.len(), plan.routes.len());
        // Applying the plan to a kernel that holds it leaves nothing to do.
        prop_assert!(diff_fabric(&plan, &observed_as_planned(&input)).is_empty());
    }
}
