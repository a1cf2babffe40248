//! Shared fixtures for the netplan tests: the data-driven gateway scenarios that the snapshot,
//! diff and `nft -c` tests all run over.

#![allow(dead_code, unreachable_pub)]

use ipnet::Ipv4Net;
use tether_netplan::{CidrMapping, GatewayInput, LocalNetworks, PeerInput};

pub fn net(text: &str) -> Ipv4Net {
    text.parse().expect("test CIDR literal")
}

pub fn peer(id: &str, interface: &str, real: &str, view: &str) -> PeerInput {
    PeerInput {
        id: id.to_owned(),
        interface: interface.to_owned(),
        tunnel_address: None,
        pod: CidrMapping::remapped(net(real), net(view)),
        external: None,
    }
}

pub fn gateway(peers: Vec<PeerInput>) -> GatewayInput {
    GatewayInput {
        pod_interfaces: vec!["eth0".to_owned()],
        local: LocalNetworks {
            pod_cidrs: vec![net("10.0.0.0/16")],
            external_cidr: None,
        },
        peers,
        ..GatewayInput::default()
    }
}

/// Named scenarios covering every shape the planner emits.
pub fn scenarios() -> Vec<(&'static str, GatewayInput)> {
    let one_peer_no_remap = gateway(vec![PeerInput {
        tunnel_address: Some(net("169.254.18.1/30")),
        ..peer("cluster-b", "tether-b", "10.1.0.0/16", "10.1.0.0/16")
    }]);
    let one_peer_remapped = gateway(vec![peer(
        "cluster-b",
        "tether-b",
        "10.0.0.0/16",
        "10.71.0.0/16",
    )]);
    let two_peers_same_real = GatewayInput {
        pod_interfaces: Vec::new(),
        ..gateway(vec![
            PeerInput {
                tunnel_address: Some(net("169.254.18.1/30")),
                ..peer("cluster-b", "tether-b", "10.0.0.0/16", "10.71.0.0/16")
            },
            PeerInput {
                tunnel_address: Some(net("169.254.18.5/30")),
                ..peer("cluster-c", "tether-c", "10.0.0.0/16", "10.72.0.0/16")
            },
        ])
    };
    let mut external_remap = gateway(vec![PeerInput {
        external: Some(CidrMapping::remapped(
            net("10.70.0.0/16"),
            net("10.81.0.0/16"),
        )),
        ..peer("cluster-b", "tether-b", "10.0.0.0/16", "10.71.0.0/16")
    }]);
    external_remap.local.external_cidr = Some(net("10.70.0.0/16"));
    let jumbo = GatewayInput {
        mtu: 8920,
        ..one_peer_remapped.clone()
    };
    let minimum_mtu = GatewayInput {
        mtu: 576,
        ..one_peer_remapped.clone()
    };
    let no_peers = gateway(Vec::new());
    vec![
        ("one_peer_no_remap", one_peer_no_remap),
        ("one_peer_remapped", one_peer_remapped),
        ("two_peers_same_real", two_peers_same_real),
        ("external_remap", external_remap),
        ("jumbo_mtu", jumbo),
        ("minimum_mtu", minimum_mtu),
        ("no_peers", no_peers),
    ]
}
