//! The file from text to [`Config`] and, for the rules the lower crates own, to
//! [`Prepared`]: every error names its field and keeps the owning crate's error as its source.

use std::error::Error as _;

use tether_netplan::PlanError;
use tether_wg::{DeviceError, KeyError};

use super::*;
use crate::Prepared;

fn key() -> String {
    PrivateKey::generate().to_base64()
}

fn public() -> PublicKey {
    PrivateKey::generate().public()
}

fn base(peers: &str) -> String {
    format!(
        "privateKey: {}\nlocal:\n  podCidrs: [10.0.0.0/16]\npeers:\n{peers}",
        key()
    )
}

fn peer(id: &str, cidr: &str, extra: &str) -> String {
    format!(
        "  - id: {id}\n    publicKey: {}\n    podCidr: {cidr}\n{extra}",
        public()
    )
}

/// Parses and prepares; the error of whichever step refused.
fn prepare(text: &str) -> Result<Prepared, ConfigError> {
    Config::parse(text, None).and_then(Prepared::new)
}

#[test]
fn minimal_config_gets_defaults() {
    let c = Config::parse(&base(&peer("b", "10.0.0.0/16", "")), None).expect("valid");
    assert_eq!(c.mtu, 1420);
    assert_eq!(c.listen.port(), DEFAULT_LISTEN_PORT);
    assert_eq!(c.metrics_address.port(), 9090);
    assert_eq!(c.reconcile_interval, DEFAULT_RECONCILE_INTERVAL);
    assert_eq!(c.peers[0].interface, "tth-b");
    assert_eq!(c.peers[0].endpoint, None);
    assert_eq!(
        c.peers[0].tunnel_address.map(|a| a.to_string()).as_deref(),
        Some("169.254.18.1/32")
    );
}

#[test]
fn peers_are_sorted_by_id_and_remember_their_position() {
    let text = base(&[peer("c", "10.1.0.0/16", ""), peer("a", "10.2.0.0/16", "")].concat());
    let c = Config::parse(&text, None).expect("valid");
    let order: Vec<_> = c
        .peers
        .iter()
        .map(|p| (p.id.as_str(), p.position))
        .collect();
    assert_eq!(order, [("a", 1), ("c", 0)]);
    let addresses: Vec<_> = c
        .peers
        .iter()
        .map(|p| p.tunnel_address.expect("assigned").to_string())
        .collect();
    assert_eq!(
        addresses,
        ["169.254.18.1/32", "169.254.18.2/32"],
        "defaults follow id order, not file order"
    );
}

#[test]
fn errors_name_the_field() {
    let text = base(&format!(
        "{}  - id: b\n    publicKey: no_pe\n    podCidr: 10.2.0.0/16\n",
        peer("a", "10.1.0.0/16", "")
    ));
    let err = Config::parse(&text, None).expect_err("bad key");
    assert_eq!(err.field, "peers[1].publicKey");
    assert!(
        err.to_string()
            .starts_with("peers[1].publicKey: not valid base64 (expected 32 bytes"),
        "{err}"
    );
    let key_error = err.source().and_then(|s| s.downcast_ref::<KeyError>());
    assert!(
        matches!(key_error, Some(KeyError::Encoding(_))),
        "tether-wg's error is the source: {err:?}"
    );

    let err = Config::parse(&base(&peer("a", "10.1.0.0/16", "    colour: red\n")), None)
        .expect_err("unknown field");
    assert!(err.field.starts_with("config (line "), "{err}");
    assert!(err.to_string().contains("unknown field `colour`"), "{err}");
}

#[test]
fn host_bits_are_the_planners_rule() {
    let err = Config::parse(&base(&peer("a", "10.1.0.1/16", "")), None).expect_err("host bits");
    assert_eq!(
        err.to_string(),
        "peers[0].podCidr: CIDR 10.1.0.1/16 has host bits set: did you mean 10.1.0.0/16?"
    );
    assert!(matches!(
        err.problem,
        Problem::Plan(PlanError::HostBitsSet { .. })
    ));
    let text = format!(
        "privateKey: {}\nremapPools: [10.0.0.0/8, 172.16.0.1/12]\nlocal:\n  podCidrs: [10.0.0.0/16]\n",
        key()
    );
    assert_eq!(
        Config::parse(&text, None).expect_err("pool").field,
        "remapPools[1]"
    );
}

#[test]
fn interface_rules_come_from_the_planner_and_name_the_field() {
    let err = prepare(&base(&peer(
        "a",
        "10.1.0.0/16",
        "    interface: much-too-long-name\n",
    )))
    .expect_err("long name");
    assert_eq!(err.field, "peers[0].interface");
    assert!(matches!(
        err.problem,
        Problem::Plan(PlanError::InvalidInterfaceName { .. })
    ));

    // The second use is the one to change, in file order even though peers are sorted.
    let text = base(
        &[
            peer("z", "10.1.0.0/16", "    interface: tun-x\n"),
            peer("a", "10.2.0.0/16", "    interface: tun-x\n"),
        ]
        .concat(),
    );
    let err = prepare(&text).expect_err("shared interface");
    assert_eq!(err.field, "peers[1].interface", "{err}");
    assert!(matches!(
        err.problem,
        Problem::Plan(PlanError::DuplicateInterface { .. })
    ));

    let text = format!(
        "privateKey: {}\npodInterfaces: [eth0]\nlocal:\n  podCidrs: [10.0.0.0/16]\npeers:\n{}",
        key(),
        peer("a", "10.1.0.0/16", "    interface: eth0\n")
    );
    assert_eq!(
        prepare(&text).expect_err("pod interface reused").field,
        "peers[0].interface"
    );
}

#[test]
fn peer_ids_and_keys_are_checked_by_their_owners() {
    let text = base(&[peer("b", "10.1.0.0/16", ""), peer("b", "10.2.0.0/16", "")].concat());
    let err = prepare(&text).expect_err("duplicate id");
    assert_eq!(err.field, "peers[1].id");
    assert!(matches!(
        err.problem,
        Problem::Plan(PlanError::DuplicatePeerId { .. })
    ));

    let err = prepare(&base(&peer("b/c", "10.1.0.0/16", ""))).expect_err("bad id");
    assert_eq!(err.field, "peers[0].id", "{err}");

    let shared = public();
    let text = base(&format!(
        "{}  - id: a\n    publicKey: {shared}\n    podCidr: 10.2.0.0/16\n  - id: c\n    publicKey: {shared}\n    podCidr: 10.3.0.0/16\n",
        peer("b", "10.1.0.0/16", "")
    ));
    let err = prepare(&text).expect_err("duplicate key");
    assert_eq!(err.field, "peers[2].publicKey", "{err}");
    let device_error = err.source().and_then(|s| s.downcast_ref::<DeviceError>());
    assert!(
        matches!(device_error, Some(DeviceError::DuplicateKey { .. })),
        "{err:?}"
    );

    let own = PrivateKey::generate();
    let text = format!(
        "privateKey: {}\nlocal:\n  podCidrs: [10.0.0.0/16]\npeers:\n  - id: a\n    publicKey: {}\n    podCidr: 10.1.0.0/16\n",
        own.to_base64(),
        own.public()
    );
    let err = prepare(&text).expect_err("own key");
    assert_eq!(err.field, "peers[0].publicKey");
    assert!(matches!(
        err.problem,
        Problem::Device(DeviceError::OwnKey(_))
    ));
}

#[test]
fn local_views_must_keep_the_prefix_length() {
    let err = prepare(&base(&peer(
        "a",
        "10.1.0.0/16",
        "    podLocalView: 10.9.0.0/24\n",
    )))
    .expect_err("prefix");
    assert_eq!(err.field, "peers[0].podLocalView");
    assert!(matches!(
        err.problem,
        Problem::Plan(PlanError::PrefixLenMismatch { .. })
    ));
    let err = Config::parse(
        &base(&peer(
            "a",
            "10.1.0.0/16",
            "    externalLocalView: 10.9.0.0/24\n",
        )),
        None,
    )
    .expect_err("view without cidr");
    assert_eq!(
        err.to_string(),
        "peers[0].externalLocalView: given without externalCidr"
    );
}

#[test]
fn mtu_must_fit_the_underlay_and_the_planner() {
    let text = format!(
        "privateKey: {}\nmtu: 1480\nlocal:\n  podCidrs: [10.0.0.0/16]\n",
        key()
    );
    let err = Config::parse(&text, None).expect_err("too big");
    assert_eq!(err.field, "mtu");
    assert!(err.to_string().contains("use at most 1440"), "{err}");
    let text = format!(
        "privateKey: {}\nunderlayMtu: 9000\nlocal:\n  podCidrs: [10.0.0.0/16]\n",
        key()
    );
    assert_eq!(Config::parse(&text, None).expect("ok").mtu, 8920);
    let text = format!(
        "privateKey: {}\nmtu: 500\nlocal:\n  podCidrs: [10.0.0.0/16]\n",
        key()
    );
    let err = prepare(&text).expect_err("below the IPv4 minimum");
    assert_eq!(err.field, "mtu");
    assert!(matches!(
        err.problem,
        Problem::Plan(PlanError::MtuOutOfRange { mtu: 500 })
    ));
}

#[test]
fn a_missing_key_file_names_the_field_and_keeps_the_os_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let text = "privateKeyFile: missing.key\nlocal:\n  podCidrs: [10.0.0.0/16]\n";
    let err = Config::parse(text, Some(dir.path())).expect_err("no file");
    assert_eq!(err.field, "privateKeyFile");
    let io = err
        .source()
        .and_then(|s| s.downcast_ref::<std::io::Error>())
        .expect("the OS error is the source");
    assert_eq!(io.kind(), std::io::ErrorKind::NotFound);
    assert!(err.to_string().contains("missing.key"), "{err}");
}

#[test]
fn private_key_never_appears_in_debug() {
    let k = key();
    let c = Config::parse(
        &format!("privateKey: {k}\nlocal:\n  podCidrs: [10.0.0.0/16]\n"),
        None,
    )
    .expect("ok");
    assert!(!format!("{c:?}").contains(&k));
}
