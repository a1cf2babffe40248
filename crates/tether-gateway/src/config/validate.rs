//! From the file as written to a [`Config`]: each field is parsed into its type and checked
//! against the rules only the gateway knows (which keys go together, how the tunnel MTU relates
//! to the underlay). Rules about values a lower crate consumes are that crate's: key formats are
//! tether-wg's, network CIDRs tether-netplan's, and the rules that span peers (unique ids,
//! interfaces and keys, local-view prefix lengths) are checked when the gateway is planned
//! ([`crate::Prepared::new`]), which maps the lower crate's error back to the field.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use ipnet::Ipv4Net;
use tether_wg::{IPV4_TUNNEL_OVERHEAD, PrivateKey, PublicKey};

use super::defaults::{
    self, DEFAULT_LISTEN_PORT, DEFAULT_RECONCILE_INTERVAL, DEFAULT_UNDERLAY_MTU,
};
use super::file::{RawConfig, RawPeer};
use super::{Config, ConfigError, PeerSpec, Problem};

/// The underlay MTUs accepted: IPv6's minimum link MTU up to the largest IP datagram.
const UNDERLAY_MTU_RANGE: std::ops::RangeInclusive<u32> = 1280..=65535;

/// Every tunnel packet must still fit the underlay over IPv4 (the smaller overhead: an IPv6
/// underlay with an explicit MTU is the operator's call).
const MIN_TUNNEL_HEADROOM: u32 = IPV4_TUNNEL_OVERHEAD as u32;

/// Turns the parsed file into a configuration; `base` resolves a relative key file.
pub(super) fn validate(raw: RawConfig, base: Option<&Path>) -> Result<Config, ConfigError> {
    let private_key = private_key(raw.private_key, raw.private_key_file, base)?;
    let listen = match raw.listen.as_deref() {
        None => defaults::listen_address(),
        Some(s) => socket("listen", s, Some(DEFAULT_LISTEN_PORT))?,
    };
    let underlay_mtu = raw.underlay_mtu.unwrap_or(DEFAULT_UNDERLAY_MTU);
    if !UNDERLAY_MTU_RANGE.contains(&underlay_mtu) {
        return Err(ConfigError::invalid(
            "underlayMtu",
            format!(
                "{underlay_mtu} is outside {}..={}",
                UNDERLAY_MTU_RANGE.start(),
                UNDERLAY_MTU_RANGE.end()
            ),
        ));
    }
    let mtu = match raw.mtu {
        // The range itself is the planner's rule (tether-netplan's MIN_MTU..=MAX_MTU).
        Some(m) if m.saturating_add(MIN_TUNNEL_HEADROOM) > underlay_mtu => {
            return Err(ConfigError::invalid(
                "mtu",
                format!(
                    "{m} plus {MIN_TUNNEL_HEADROOM} bytes of tunnel headers exceeds underlayMtu \
                     {underlay_mtu}; use at most {}",
                    underlay_mtu - MIN_TUNNEL_HEADROOM
                ),
            ));
        }
        Some(m) => m,
        None => defaults::tunnel_mtu(underlay_mtu),
    };
    // Required even without peers: the gateway filters what enters from any later peer by it.
    if raw.local.pod_cidrs.is_empty() {
        return Err(ConfigError::invalid(
            "local.podCidrs",
            "missing: list this cluster's pod CIDRs",
        ));
    }
    let pod_cidrs = networks("local.podCidrs", &raw.local.pod_cidrs)?;
    let external_cidr = raw
        .local
        .external_cidr
        .as_deref()
        .map(|s| network("local.externalCidr", s))
        .transpose()?;
    let reserved_cidrs = networks("local.reservedCidrs", &raw.local.reserved_cidrs)?;
    let metrics_address = match raw.metrics_address.as_deref() {
        None => defaults::metrics_address(),
        Some(s) => socket("metricsAddress", s, None)?,
    };
    let reconcile_interval = match raw.reconcile_interval_seconds {
        Some(0) => {
            return Err(ConfigError::invalid(
                "reconcileIntervalSeconds",
                "must be at least 1",
            ));
        }
        Some(s) => Duration::from_secs(s),
        None => DEFAULT_RECONCILE_INTERVAL,
    };
    let remap_pools = match raw.remap_pools {
        Some(p) if p.is_empty() => {
            return Err(ConfigError::invalid(
                "remapPools",
                "must not be empty when given (leave it out for the RFC 1918 ranges)",
            ));
        }
        Some(p) => networks("remapPools", &p)?,
        None => tether_ipam::IpamConfig::rfc1918_pools(),
    };

    let mut peers = raw
        .peers
        .into_iter()
        .enumerate()
        .map(|(position, p)| peer(position, p))
        .collect::<Result<Vec<_>, _>>()?;
    // Marks, route tables and default tunnel addresses follow id order, so that editing the
    // file's order changes nothing in the kernel.
    peers.sort_by(|a, b| a.id.cmp(&b.id));
    defaults::assign_tunnel_addresses(&mut peers);
    Ok(Config {
        private_key,
        listen,
        mtu,
        pod_cidrs,
        external_cidr,
        reserved_cidrs,
        pod_interfaces: raw.pod_interfaces,
        metrics_address,
        reconcile_interval,
        remap_pools,
        peers,
        ip_mappings: Vec::new(),
    })
}

fn private_key(
    inline: Option<String>,
    file: Option<std::path::PathBuf>,
    base: Option<&Path>,
) -> Result<PrivateKey, ConfigError> {
    match (inline, file) {
        (Some(_), Some(_)) => Err(ConfigError::invalid(
            "privateKey",
            "give either privateKey or privateKeyFile, not both",
        )),
        (Some(k), None) => k
            .parse::<PrivateKey>()
            .map_err(|e| ConfigError::new("privateKey", Problem::Key(e))),
        (None, Some(file)) => {
            let file = match base {
                Some(b) if file.is_relative() => b.join(file),
                _ => file,
            };
            let text = std::fs::read_to_string(&file).map_err(|source| {
                ConfigError::new(
                    "privateKeyFile",
                    Problem::Read {
                        path: file.clone(),
                        source,
                    },
                )
            })?;
            text.parse::<PrivateKey>()
                .map_err(|e| ConfigError::new("privateKeyFile", Problem::Key(e)))
        }
        (None, None) => Err(ConfigError::invalid(
            "privateKey",
            "missing: set privateKey (base64, from `wg genkey`) or privateKeyFile",
        )),
    }
}

fn peer(position: usize, p: RawPeer) -> Result<PeerSpec, ConfigError> {
    let f = |name: &str| format!("peers[{position}].{name}");
    let public_key: PublicKey = p
        .public_key
        .parse()
        .map_err(|e| ConfigError::new(f("publicKey"), Problem::Key(e)))?;
    let endpoint = p
        .endpoint
        .as_deref()
        .map(|s| socket(&f("endpoint"), s, Some(DEFAULT_LISTEN_PORT)))
        .transpose()?;
    let optional =
        |name: &str, value: Option<&str>| value.map(|s| network(&f(name), s)).transpose();
    let pod_cidr = network(&f("podCidr"), &p.pod_cidr)?;
    let pod_local_view = optional("podLocalView", p.pod_local_view.as_deref())?;
    let external_cidr = optional("externalCidr", p.external_cidr.as_deref())?;
    let external_local_view = optional("externalLocalView", p.external_local_view.as_deref())?;
    if external_cidr.is_none() && external_local_view.is_some() {
        return Err(ConfigError::invalid(
            f("externalLocalView"),
            "given without externalCidr",
        ));
    }
    let tunnel_address = p
        .tunnel_address
        .as_deref()
        .map(|s| {
            s.trim().parse::<Ipv4Net>().map_err(|_| {
                ConfigError::invalid(
                    f("tunnelAddress"),
                    format!("{s:?} is not address/prefix (e.g. 169.254.18.1/32)"),
                )
            })
        })
        .transpose()?;
    let interface = p
        .interface
        .unwrap_or_else(|| defaults::default_interface(&p.id));
    Ok(PeerSpec {
        id: p.id,
        position,
        public_key,
        endpoint,
        persistent_keepalive: p.persistent_keepalive,
        pod_cidr,
        pod_local_view,
        external_cidr,
        external_local_view,
        interface,
        tunnel_address,
    })
}

/// A network in CIDR notation. Whether host bits may be set is the planner's rule.
fn network(field: &str, s: &str) -> Result<Ipv4Net, ConfigError> {
    let net: Ipv4Net = s.trim().parse().map_err(|_| {
        ConfigError::invalid(
            field,
            format!("{s:?} is not an IPv4 CIDR (expected e.g. 10.0.0.0/16)"),
        )
    })?;
    tether_netplan::check_network("CIDR", net)
        .map_err(|e| ConfigError::new(field, Problem::Plan(e)))?;
    Ok(net)
}

fn networks(field: &str, list: &[String]) -> Result<Vec<Ipv4Net>, ConfigError> {
    list.iter()
        .enumerate()
        .map(|(i, s)| network(&format!("{field}[{i}]"), s))
        .collect()
}

fn socket(field: &str, s: &str, default_port: Option<u16>) -> Result<SocketAddr, ConfigError> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    if let (Some(port), Ok(ip)) = (default_port, s.parse::<IpAddr>()) {
        return Ok(SocketAddr::new(ip, port));
    }
    let example = if default_port.is_some() {
        "an address, with or without :port (e.g. 198.18.0.2 or 198.18.0.2:51840)"
    } else {
        "an address:port (e.g. 0.0.0.0:9090)"
    };
    Err(ConfigError::invalid(
        field,
        format!("{s:?} is not {example}"),
    ))
}
