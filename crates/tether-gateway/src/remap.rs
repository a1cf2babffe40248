//! From configuration to the netplan input: choose how this cluster sees each peer (IPAM
//! remaps for colliding CIDRs, explicit overrides honoured) and assemble `GatewayInput`.

use ipnet::Ipv4Net;
use tether_ipam::{CidrKind, Ipam, IpamConfig, IpamError};
use tether_netplan::{CidrMapping, GatewayInput, LocalNetworks, PeerInput};

use crate::config::{Config, ConfigError, Problem};

/// The netplan input for `config`. Deterministic: peers are processed in id order and the IPAM
/// hands out the lowest free block, so a restart chooses the same remaps.
pub fn gateway_input(config: &Config) -> Result<GatewayInput, ConfigError> {
    let mut reserved: Vec<Ipv4Net> = config.pod_cidrs.clone();
    reserved.extend(config.external_cidr);
    reserved.extend(config.reserved_cidrs.iter().copied());
    // Explicit local views are claimed before the IPAM chooses the others.
    for p in &config.peers {
        reserved.extend(p.pod_local_view);
        reserved.extend(p.external_local_view);
        reserved.extend(p.tunnel_address.map(|a| a.trunc()));
    }
    let ipam_config = IpamConfig {
        pools: config.remap_pools.clone(),
        reserved,
    };
    // Every CIDR was checked when the file was read, so what is left to refuse is the pools.
    let mut ipam =
        Ipam::new(ipam_config).map_err(|e| ConfigError::new("remapPools", Problem::Ipam(e)))?;
    let mut peers = Vec::with_capacity(config.peers.len());
    for p in &config.peers {
        let err = |field: &str, e: IpamError| {
            // The IPAM names peers too; its name rule is about the id, not the CIDR.
            let field = match &e {
                IpamError::InvalidName { .. } => "id",
                _ => field,
            };
            ConfigError::new(format!("peers[{}].{field}", p.position), Problem::Ipam(e))
        };
        let pod = match p.pod_local_view {
            Some(view) => CidrMapping::remapped(p.pod_cidr, view),
            None => {
                let m = ipam
                    .map_peer_cidr(&p.id, CidrKind::Pod, p.pod_cidr)
                    .map_err(|e| err("podCidr", e))?;
                CidrMapping::remapped(m.real, m.local_view)
            }
        };
        let external = match (p.external_cidr, p.external_local_view) {
            (None, _) => None,
            (Some(real), Some(view)) => Some(CidrMapping::remapped(real, view)),
            (Some(real), None) => {
                let m = ipam
                    .map_peer_cidr(&p.id, CidrKind::External, real)
                    .map_err(|e| err("externalCidr", e))?;
                Some(CidrMapping::remapped(m.real, m.local_view))
            }
        };
        peers.push(PeerInput {
            id: p.id.clone(),
            interface: p.interface.clone(),
            tunnel_address: p.tunnel_address,
            pod,
            external,
        });
    }
    Ok(GatewayInput {
        pod_interfaces: config.pod_interfaces.clone(),
        local: LocalNetworks {
            pod_cidrs: config.pod_cidrs.clone(),
            external_cidr: config.external_cidr,
        },
        mtu: config.mtu,
        peers,
        ip_mappings: config.ip_mappings.clone(),
        ..GatewayInput::default()
    })
}

/// Plans the kernel state for `config`, reporting planner errors as configuration errors
/// (they are always caused by the file: overlapping CIDRs, bad names).
pub fn plan(config: &Config) -> Result<(GatewayInput, tether_netplan::Plan), ConfigError> {
    let input = gateway_input(config)?;
    let plan = tether_netplan::plan(&input).map_err(|e| ConfigError::from_plan(config, e))?;
    Ok((input, plan))
}

#[cfg(test)]
mod tests {
    use tether_wg::PrivateKey;

    use super::*;

    fn config(peers: &[(&str, &str, Option<&str>)]) -> Config {
        let mut text = format!(
            "privateKey: {}\nlocal:\n  podCidrs: [10.0.0.0/16]\npeers:\n",
            PrivateKey::generate().to_base64()
        );
        for (id, cidr, view) in peers {
            text.push_str(&format!(
                "  - id: {id}\n    publicKey: {}\n    podCidr: {cidr}\n",
                PrivateKey::generate().public()
            ));
            if let Some(v) = view {
                text.push_str(&format!("    podLocalView: {v}\n"));
            }
        }
        Config::parse(&text, None).expect("valid test config")
    }

    #[test]
    fn colliding_peers_get_distinct_deterministic_views() {
        let c = config(&[
            ("c", "10.0.0.0/16", None),
            ("b", "10.0.0.0/16", None),
            ("d", "172.20.0.0/16", None),
        ]);
        let input = gateway_input(&c).expect("plannable");
        let views: Vec<_> = input
            .peers
            .iter()
            .map(|p| (p.id.as_str(), p.pod.local_view.to_string()))
            .collect();
        assert_eq!(
            views,
            vec![
                ("b", "10.1.0.0/16".to_owned()),
                ("c", "10.2.0.0/16".to_owned()),
                ("d", "172.20.0.0/16".to_owned())
            ]
        );
        assert_eq!(
            gateway_input(&c).expect("again"),
            input,
            "same config, same remaps"
        );
        plan(&c).expect("the planner accepts the result");
    }

    #[test]
    fn explicit_views_are_kept_and_avoided() {
        let c = config(&[
            ("b", "10.0.0.0/16", Some("10.1.0.0/16")),
            ("c", "10.0.0.0/16", None),
        ]);
        let input = gateway_input(&c).expect("plannable");
        assert_eq!(input.peers[0].pod.local_view.to_string(), "10.1.0.0/16");
        assert_eq!(input.peers[1].pod.local_view.to_string(), "10.2.0.0/16");
    }

    #[test]
    fn conflicting_overrides_are_rejected_before_anything_runs() {
        let c = config(&[("b", "10.5.0.0/16", Some("10.0.0.0/16"))]);
        let err = plan(&c).expect_err("view overlaps our pods");
        assert!(err.to_string().contains("10.0.0.0/16"), "{err}");
    }
}
