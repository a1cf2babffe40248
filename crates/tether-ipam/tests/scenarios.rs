//! Data-driven snapshots of allocation sequences: each script runs against a fresh IPAM and its
//! transcript is compared with the expected one (`UPDATE_EXPECT=1` rewrites).

mod script;

use expect_test::{Expect, expect};
use tether_ipam::{CidrKind, ExternalIp, Ipam, IpamConfig, IpamState, Mapping};

fn check(script: &str, expect: Expect) {
    expect.assert_eq(&script::run(script));
}

#[test]
fn colliding_peers_get_lowest_free_blocks_and_free_ones_keep_their_cidr() {
    check(
        "
        reserved 10.0.0.0/16 10.96.0.0/12 192.168.1.0/24
        map b pod 10.0.0.0/16
        map c pod 10.0.0.0/16
        map d pod 10.1.0.0/16
        map e pod 172.20.0.0/16
        map e external 10.70.0.0/16
        map f external 10.70.0.0/16
        external 16
        state
        ",
        expect![[r#"
            map b pod 10.0.0.0/16: b pod 10.0.0.0/16 -> 10.1.0.0/16
            map c pod 10.0.0.0/16: c pod 10.0.0.0/16 -> 10.2.0.0/16
            map d pod 10.1.0.0/16: d pod 10.1.0.0/16 -> 10.3.0.0/16
            map e pod 172.20.0.0/16: e pod 172.20.0.0/16 -> 172.20.0.0/16 (identity)
            map e external 10.70.0.0/16: e external 10.70.0.0/16 -> 10.70.0.0/16 (identity)
            map f external 10.70.0.0/16: f external 10.70.0.0/16 -> 10.4.0.0/16
            external 16: 10.5.0.0/16
            state: [b pod 10.0.0.0/16 -> 10.1.0.0/16; c pod 10.0.0.0/16 -> 10.2.0.0/16; d pod 10.1.0.0/16 -> 10.3.0.0/16; e pod 172.20.0.0/16 -> 172.20.0.0/16 (identity); e external 10.70.0.0/16 -> 10.70.0.0/16 (identity); f external 10.70.0.0/16 -> 10.4.0.0/16; external 10.5.0.0/16]
        "#]],
    );
}

#[test]
fn mapping_is_idempotent_and_a_changed_cidr_replaces_the_old_one() {
    check(
        "
        reserved 10.0.0.0/16
        map b pod 10.0.0.0/16
        map b pod 10.0.0.0/16
        map b pod 10.0.0.0/24
        map c pod 10.1.0.0/16
        map b pod 172.16.5.0/24
        state
        ",
        expect![[r#"
            map b pod 10.0.0.0/16: b pod 10.0.0.0/16 -> 10.1.0.0/16
            map b pod 10.0.0.0/16: b pod 10.0.0.0/16 -> 10.1.0.0/16
            map b pod 10.0.0.0/24: b pod 10.0.0.0/24 -> 10.1.0.0/24
            map c pod 10.1.0.0/16: c pod 10.1.0.0/16 -> 10.2.0.0/16
            map b pod 172.16.5.0/24: b pod 172.16.5.0/24 -> 172.16.5.0/24 (identity)
            state: [b pod 172.16.5.0/24 -> 172.16.5.0/24 (identity); c pod 10.1.0.0/16 -> 10.2.0.0/16]
        "#]],
    );
}

#[test]
fn released_blocks_are_reused_lowest_first() {
    check(
        "
        reserved 10.0.0.0/16
        map b pod 10.0.0.0/16
        map c pod 10.0.0.0/16
        map d pod 10.0.0.0/16
        release c
        map e pod 10.0.0.0/16
        release b pod
        release b pod
        map c pod 10.0.0.0/16
        ",
        expect![[r#"
            map b pod 10.0.0.0/16: b pod 10.0.0.0/16 -> 10.1.0.0/16
            map c pod 10.0.0.0/16: c pod 10.0.0.0/16 -> 10.2.0.0/16
            map d pod 10.0.0.0/16: d pod 10.0.0.0/16 -> 10.3.0.0/16
            release c: released 1
            map e pod 10.0.0.0/16: e pod 10.0.0.0/16 -> 10.2.0.0/16
            release b pod: released 1
            release b pod: released 0
            map c pod 10.0.0.0/16: c pod 10.0.0.0/16 -> 10.1.0.0/16
        "#]],
    );
}

#[test]
fn exhaustion_is_an_error_and_changes_nothing() {
    check(
        "
        pools 10.0.0.0/23
        reserved 10.0.0.0/24
        map b pod 10.0.0.0/24
        map c pod 10.0.0.0/24
        map c pod 10.0.0.0/25
        map b pod 10.0.0.0/25
        state
        external 24
        release b
        external 24
        map c pod 10.0.1.0/24
        ",
        expect![[r#"
            map b pod 10.0.0.0/24: b pod 10.0.0.0/24 -> 10.0.1.0/24
            map c pod 10.0.0.0/24: error: no free /24 block left in the pools 10.0.0.0/23: add a pool or release peers
            map c pod 10.0.0.0/25: error: no free /25 block left in the pools 10.0.0.0/23: add a pool or release peers
            map b pod 10.0.0.0/25: b pod 10.0.0.0/25 -> 10.0.1.0/25
            state: [b pod 10.0.0.0/25 -> 10.0.1.0/25]
            external 24: error: no free /24 block left in the pools 10.0.0.0/23: add a pool or release peers
            release b: released 1
            external 24: 10.0.1.0/24
            map c pod 10.0.1.0/24: error: no free /24 block left in the pools 10.0.0.0/23: add a pool or release peers
        "#]],
    );
}

#[test]
fn pools_are_searched_in_order_and_prefix_size_is_kept() {
    check(
        "
        pools 192.168.0.0/16 172.16.0.0/12
        reserved 10.0.0.0/8 192.168.0.0/17
        map b pod 10.0.0.0/8
        map c pod 10.8.0.0/16
        map d pod 10.9.0.0/17
        map e pod 10.10.0.0/17
        ",
        expect![[r#"
            map b pod 10.0.0.0/8: error: no free /8 block left in the pools 192.168.0.0/16, 172.16.0.0/12: add a pool or release peers
            map c pod 10.8.0.0/16: c pod 10.8.0.0/16 -> 172.16.0.0/16
            map d pod 10.9.0.0/17: d pod 10.9.0.0/17 -> 192.168.128.0/17
            map e pod 10.10.0.0/17: e pod 10.10.0.0/17 -> 172.17.0.0/17
        "#]],
    );
}

#[test]
fn external_cidr_is_claimed_or_allocated_once() {
    check(
        "
        reserved 10.0.0.0/16
        claim-external 10.0.0.0/16
        claim-external 10.70.0.0/16
        claim-external 10.70.0.0/16
        claim-external 10.71.0.0/16
        external 16
        external 24
        map b pod 10.70.0.0/16
        release-external
        external 16
        ",
        expect![[r#"
            claim-external 10.0.0.0/16: error: 10.0.0.0/16 is not available: it overlaps reserved 10.0.0.0/16
            claim-external 10.70.0.0/16: 10.70.0.0/16
            claim-external 10.70.0.0/16: 10.70.0.0/16
            claim-external 10.71.0.0/16: error: the external CIDR is already 10.70.0.0/16: release it before asking for 10.71.0.0/16
            external 16: 10.70.0.0/16
            external 24: error: the external CIDR is already 10.70.0.0/16: release it before asking for /24
            map b pod 10.70.0.0/16: b pod 10.70.0.0/16 -> 10.1.0.0/16
            release-external: released Some(10.70.0.0/16)
            external 16: 10.2.0.0/16
        "#]],
    );
}

#[test]
fn external_ips_are_handed_out_lowest_first_inside_the_external_cidr() {
    check(
        "
        reserved 10.0.0.0/16
        external-ip api-server
        claim-external 10.70.0.0/30
        unknown-source
        external-ip api-server
        external-ip proxy
        external-ip api-server
        external-ip third
        release-ip api-server
        external-ip third
        state
        restore
        release-external
        state
        ",
        expect![[r#"
            external-ip api-server: error: no external CIDR yet: allocate or claim it before handing out external IPs
            claim-external 10.70.0.0/30: 10.70.0.0/30
            unknown-source: Some(10.70.0.0)
            external-ip api-server: 10.70.0.1
            external-ip proxy: 10.70.0.2
            external-ip api-server: 10.70.0.1
            external-ip third: error: no free address left in the external CIDR 10.70.0.0/30: release external IPs or use a larger CIDR
            release-ip api-server: released Some(10.70.0.1)
            external-ip third: 10.70.0.1
            state: [external 10.70.0.0/30; ip proxy 10.70.0.2; ip third 10.70.0.1]
            restore: restored, identical: true
            release-external: released Some(10.70.0.0/30)
            state: []
        "#]],
    );
}

#[test]
fn invalid_input_is_rejected_naming_the_input() {
    check(
        "
        reserved 10.0.0.0/16
        map b pod 10.0.0.1/16
        map b pod 10.0.0.0/31
        map b pod 10.0.0.0/7
        external 31
        claim-external 10.70.0.1/16
        map '' pod 10.9.0.0/16
        ",
        expect![[r#"
            map b pod 10.0.0.1/16: error: pod CIDR of peer "b" 10.0.0.1/16 has host bits set: did you mean 10.0.0.0/16?
            map b pod 10.0.0.0/31: error: pod CIDR of peer "b" /31 is out of range: use /8 to /30
            map b pod 10.0.0.0/7: error: pod CIDR of peer "b" /7 is out of range: use /8 to /30
            external 31: error: external CIDR /31 is out of range: use /8 to /30
            claim-external 10.70.0.1/16: error: external CIDR 10.70.0.1/16 has host bits set: did you mean 10.70.0.0/16?
            map '' pod 10.9.0.0/16: error: invalid peer name "": use 1 to 253 characters without control characters
        "#]],
    );
    check(
        "pools 10.0.0.0/8 10.1.0.0/16\nmap b pod 10.0.0.0/16",
        expect![[r#"
        new: error: pools 10.0.0.0/8 and 10.1.0.0/16 overlap: merge them or drop one
    "#]],
    );
    check(
        "pools\nmap b pod 10.0.0.0/16",
        expect![[r#"
        new: error: no address pool configured: give at least one pool (the default is RFC 1918)
    "#]],
    );
    check(
        "pools 10.0.0.1/8\nmap b pod 10.0.0.0/16",
        expect![[r#"
        new: error: pool 10.0.0.1/8 has host bits set: did you mean 10.0.0.0/8?
    "#]],
    );
    check(
        "reserved 10.0.0.1/16\nmap b pod 10.0.0.0/16",
        expect![[r#"
        new: error: reserved CIDR 10.0.0.1/16 has host bits set: did you mean 10.0.0.0/16?
    "#]],
    );
}

#[test]
fn state_round_trips_through_restore_and_serde() {
    check(
        "
        reserved 10.0.0.0/16
        map b pod 10.0.0.0/16
        map b external 10.70.0.0/16
        external 16
        restore
        ",
        expect![[r#"
            map b pod 10.0.0.0/16: b pod 10.0.0.0/16 -> 10.1.0.0/16
            map b external 10.70.0.0/16: b external 10.70.0.0/16 -> 10.70.0.0/16 (identity)
            external 16: 10.2.0.0/16
            restore: restored, identical: true
        "#]],
    );
}

fn restore_error(state: IpamState) -> String {
    let config = IpamConfig::with_reserved(vec![script::net("10.0.0.0/16")]);
    match Ipam::restore(config, &state) {
        Ok(_) => "restored".to_owned(),
        Err(error) => error.to_string(),
    }
}

fn mapping(peer: &str, kind: CidrKind, real: &str, view: &str) -> Mapping {
    Mapping {
        peer: peer.to_owned(),
        kind,
        real: script::net(real),
        local_view: script::net(view),
    }
}

#[test]
fn restore_rejects_overlapping_or_malformed_state() {
    let cases = [
        IpamState {
            external: None,
            mappings: vec![
                mapping("b", CidrKind::Pod, "10.0.0.0/16", "10.1.0.0/16"),
                mapping("c", CidrKind::Pod, "10.0.0.0/16", "10.1.0.0/16"),
            ],
            ..IpamState::default()
        },
        IpamState {
            external: None,
            mappings: vec![mapping("b", CidrKind::Pod, "10.0.0.0/16", "10.0.0.0/16")],
            ..IpamState::default()
        },
        IpamState {
            external: Some(script::net("10.1.0.0/16")),
            mappings: vec![mapping(
                "b",
                CidrKind::External,
                "10.70.0.0/16",
                "10.1.0.0/16",
            )],
            ..IpamState::default()
        },
        IpamState {
            external: None,
            mappings: vec![mapping("b", CidrKind::Pod, "10.0.0.0/16", "10.1.0.0/24")],
            ..IpamState::default()
        },
        IpamState {
            external: None,
            mappings: vec![
                mapping("b", CidrKind::Pod, "10.0.0.0/16", "10.1.0.0/16"),
                mapping("b", CidrKind::Pod, "10.0.0.0/16", "10.2.0.0/16"),
            ],
            ..IpamState::default()
        },
        IpamState {
            external: None,
            mappings: vec![mapping("b", CidrKind::Pod, "10.0.0.0/16", "10.1.0.1/16")],
            ..IpamState::default()
        },
        IpamState {
            external: Some(script::net("10.70.0.0/16")),
            external_ips: vec![
                ExternalIp {
                    owner: "api".to_owned(),
                    address: "10.70.0.1".parse().unwrap(),
                },
                ExternalIp {
                    owner: "proxy".to_owned(),
                    address: "10.70.0.1".parse().unwrap(),
                },
            ],
            ..IpamState::default()
        },
        IpamState {
            external: Some(script::net("10.70.0.0/16")),
            external_ips: vec![ExternalIp {
                owner: "api".to_owned(),
                address: "10.70.0.0".parse().unwrap(),
            }],
            ..IpamState::default()
        },
        IpamState {
            external: None,
            external_ips: vec![ExternalIp {
                owner: "api".to_owned(),
                address: "10.70.0.1".parse().unwrap(),
            }],
            ..IpamState::default()
        },
    ];
    let transcript: String = cases
        .into_iter()
        .map(|state| format!("{}\n", restore_error(state)))
        .collect();
    expect![[r#"
        persisted state conflicts: peer "c" pod local view 10.1.0.0/16 overlaps peer "b" pod local view 10.1.0.0/16
        persisted state conflicts: peer "b" pod local view 10.0.0.0/16 overlaps reserved 10.0.0.0/16
        persisted state conflicts: peer "b" external local view 10.1.0.0/16 overlaps external CIDR 10.1.0.0/16
        persisted pod mapping of peer "b" maps 10.0.0.0/16 to 10.1.0.0/24: prefix lengths differ
        persisted state maps the pod CIDR of peer "b" twice
        persisted pod mapping of peer "b" local view 10.1.0.1/16 has host bits set: did you mean 10.1.0.0/16?
        persisted state conflicts: external IP 10.70.0.1 of "proxy" overlaps external IP 10.70.0.1 of "api"
        persisted external IP 10.70.0.0 of "api" is not a usable address of the external CIDR (10.70.0.0/16)
        persisted external IP 10.70.0.1 of "api" is not a usable address of the external CIDR (none)
    "#]].assert_eq(&transcript);
}

#[test]
fn state_serializes_as_camel_case_json_and_restores() {
    let config = IpamConfig::with_reserved(vec!["10.0.0.0/16".parse().unwrap()]);
    let mut ipam = Ipam::new(config.clone()).expect("valid config");
    ipam.map_peer_cidr("b", CidrKind::Pod, "10.0.0.0/16".parse().unwrap())
        .unwrap();
    ipam.map_peer_cidr("c", CidrKind::External, "172.20.0.0/16".parse().unwrap())
        .unwrap();
    ipam.allocate_external(16).unwrap();
    let json = serde_json::to_string_pretty(&ipam.state()).unwrap();
    expect![[r#"
        {
          "external": "10.2.0.0/16",
          "mappings": [
            {
              "peer": "b",
              "kind": "Pod",
              "real": "10.0.0.0/16",
              "localView": "10.1.0.0/16"
            },
            {
              "peer": "c",
              "kind": "External",
              "real": "172.20.0.0/16",
              "localView": "172.20.0.0/16"
            }
          ]
        }"#]]
    .assert_eq(&json);
    let state: IpamState = serde_json::from_str(&json).unwrap();
    let mut restored = Ipam::restore(config, &state).expect("persisted state is valid");
    assert_eq!(restored, ipam);
    // The restored allocator continues exactly where the original would.
    let next = "10.0.0.0/16".parse().unwrap();
    assert_eq!(
        restored.map_peer_cidr("d", CidrKind::Pod, next),
        ipam.map_peer_cidr("d", CidrKind::Pod, next)
    );
}
