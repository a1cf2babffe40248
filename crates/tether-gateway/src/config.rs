//! The gateway's configuration file (YAML or JSON) and its validation. Every error names the
//! field that is wrong (`peers[1].publicKey: ...`), and nothing is applied before the whole
//! file has been checked.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ipnet::Ipv4Net;
use serde::Deserialize;
use tether_wg::{PrivateKey, PublicKey};

/// UDP port WireGuard gateways listen on unless told otherwise.
pub const DEFAULT_LISTEN_PORT: u16 = 51840;
/// Underlay MTU assumed when the file does not say.
pub const DEFAULT_UNDERLAY_MTU: u32 = 1500;
/// Bytes the tunnel costs over an IPv6 underlay (40 IPv6 + 8 UDP + 32 WireGuard). Using the
/// IPv6 figure keeps one default safe on both families (1500 → 1420).
pub const TUNNEL_OVERHEAD: u32 = 80;
/// How often kernel state is re-checked and repaired.
pub const DEFAULT_RECONCILE_INTERVAL: Duration = Duration::from_secs(10);

/// A configuration field and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct ConfigError {
    /// Dotted path of the field, e.g. `peers[1].publicKey` (or the file for parse errors).
    pub field: String,
    /// What is wrong and what to do.
    pub message: String,
}

impl ConfigError {
    fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// The file as written, before validation.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawConfig {
    private_key: Option<String>,
    private_key_file: Option<PathBuf>,
    #[serde(default)]
    listen: Option<String>,
    mtu: Option<u32>,
    underlay_mtu: Option<u32>,
    local: RawLocal,
    #[serde(default)]
    pod_interfaces: Vec<String>,
    metrics_address: Option<String>,
    reconcile_interval_seconds: Option<u64>,
    remap_pools: Option<Vec<String>>,
    #[serde(default)]
    peers: Vec<RawPeer>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawLocal {
    #[serde(default)]
    pod_cidrs: Vec<String>,
    external_cidr: Option<String>,
    #[serde(default)]
    reserved_cidrs: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawPeer {
    id: String,
    public_key: String,
    endpoint: Option<String>,
    persistent_keepalive: Option<u16>,
    pod_cidr: String,
    pod_local_view: Option<String>,
    external_cidr: Option<String>,
    external_local_view: Option<String>,
    interface: Option<String>,
    tunnel_address: Option<String>,
}

/// A validated configuration.
#[derive(Clone, Debug)]
pub struct Config {
    /// Our WireGuard private key.
    pub private_key: PrivateKey,
    /// UDP listen address.
    pub listen: SocketAddr,
    /// Tunnel (inner) MTU.
    pub mtu: u32,
    /// This cluster's pod CIDRs.
    pub pod_cidrs: Vec<Ipv4Net>,
    /// This cluster's external CIDR, if any.
    pub external_cidr: Option<Ipv4Net>,
    /// Other local networks remaps must avoid (service CIDR, node network).
    pub reserved_cidrs: Vec<Ipv4Net>,
    /// Interfaces where local traffic enters the gateway (empty: all non-tunnel interfaces).
    pub pod_interfaces: Vec<String>,
    /// Admin server address (`/metrics`, `/healthz`).
    pub metrics_address: SocketAddr,
    /// Drift repair period.
    pub reconcile_interval: Duration,
    /// Where remapped local views come from.
    pub remap_pools: Vec<Ipv4Net>,
    /// The peers, sorted by id (marks and route tables follow this order).
    pub peers: Vec<PeerSpec>,
}

/// One validated peer.
#[derive(Clone, Debug)]
pub struct PeerSpec {
    /// Peer cluster id.
    pub id: String,
    /// The peer's public key.
    pub public_key: PublicKey,
    /// Where to reach it (client side); learned otherwise.
    pub endpoint: Option<SocketAddr>,
    /// Keepalive interval in seconds.
    pub persistent_keepalive: Option<u16>,
    /// The peer's real pod CIDR.
    pub pod_cidr: Ipv4Net,
    /// Explicit local view of the pod CIDR (else chosen by the IPAM).
    pub pod_local_view: Option<Ipv4Net>,
    /// The peer's real external CIDR.
    pub external_cidr: Option<Ipv4Net>,
    /// Explicit local view of the external CIDR.
    pub external_local_view: Option<Ipv4Net>,
    /// The peer's TUN interface.
    pub interface: String,
    /// Our address on the tunnel network (defaults to a free `169.254.18.x/32`).
    pub tunnel_address: Option<Ipv4Net>,
}

fn cidr(field: &str, s: &str) -> Result<Ipv4Net, ConfigError> {
    let net: Ipv4Net = s.trim().parse().map_err(|_| {
        ConfigError::new(
            field,
            format!("{s:?} is not an IPv4 CIDR (expected e.g. 10.0.0.0/16)"),
        )
    })?;
    if net.trunc() != net {
        return Err(ConfigError::new(
            field,
            format!("{s:?} has host bits set; did you mean {}?", net.trunc()),
        ));
    }
    Ok(net)
}

fn socket(field: &str, s: &str, default_port: Option<u16>) -> Result<SocketAddr, ConfigError> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    if let (Some(port), Ok(ip)) = (default_port, s.parse::<std::net::IpAddr>()) {
        return Ok(SocketAddr::new(ip, port));
    }
    Err(ConfigError::new(
        field,
        format!("{s:?} is not an address:port (e.g. 198.18.0.2:51840)"),
    ))
}

/// The default tunnel interface name for a peer: `tth-` plus the id, cut to 15 bytes.
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

fn interface_ok(name: &str) -> bool {
    (1..=15).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && name != "."
        && name != ".."
}

/// Network default tunnel addresses come from (link-local, never routed off the host).
pub const TUNNEL_ADDRESS_NET: [u8; 3] = [169, 254, 18];

/// Gives every peer without one a tunnel address: the lowest free `169.254.18.x/32`.
///
/// Linux drops forwarded packets that arrive on an interface without any IPv4 address when
/// reverse-path filtering is on (even in loose mode), so each TUN needs one; nothing routes
/// to it, and each side picks its own.
fn assign_tunnel_addresses(peers: &mut [PeerSpec]) {
    let taken: BTreeSet<std::net::Ipv4Addr> = peers
        .iter()
        .filter_map(|p| p.tunnel_address.map(|a| a.addr()))
        .collect();
    let mut free = (1..=254u8)
        .map(|h| {
            std::net::Ipv4Addr::new(
                TUNNEL_ADDRESS_NET[0],
                TUNNEL_ADDRESS_NET[1],
                TUNNEL_ADDRESS_NET[2],
                h,
            )
        })
        .filter(|a| !taken.contains(a));
    for p in peers.iter_mut().filter(|p| p.tunnel_address.is_none()) {
        p.tunnel_address = free
            .next()
            .map(|a| Ipv4Net::new(a, 32).expect("invariant: /32 is valid"));
    }
}

impl Config {
    /// Reads and validates a file. YAML is a superset of JSON, so both parse.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            ConfigError::new(path.display().to_string(), format!("cannot read: {e}"))
        })?;
        Self::parse(&text, path.parent())
    }

    /// Parses and validates configuration text; `base` resolves a relative key file.
    pub fn parse(text: &str, base: Option<&Path>) -> Result<Self, ConfigError> {
        let raw: RawConfig = serde_yaml::from_str(text).map_err(|e| {
            let field = e.location().map_or_else(
                || "config".to_owned(),
                |l| format!("config (line {}, column {})", l.line(), l.column()),
            );
            ConfigError::new(field, e.to_string())
        })?;
        Self::validate(raw, base)
    }

    fn validate(raw: RawConfig, base: Option<&Path>) -> Result<Self, ConfigError> {
        let private_key = match (raw.private_key, raw.private_key_file) {
            (Some(_), Some(_)) => {
                return Err(ConfigError::new(
                    "privateKey",
                    "give either privateKey or privateKeyFile, not both",
                ));
            }
            (Some(k), None) => k
                .parse::<PrivateKey>()
                .map_err(|e| ConfigError::new("privateKey", e.to_string()))?,
            (None, Some(file)) => {
                let file = match base {
                    Some(b) if file.is_relative() => b.join(file),
                    _ => file,
                };
                let text = std::fs::read_to_string(&file).map_err(|e| {
                    ConfigError::new(
                        "privateKeyFile",
                        format!("cannot read {}: {e}", file.display()),
                    )
                })?;
                text.parse::<PrivateKey>().map_err(|e| {
                    ConfigError::new("privateKeyFile", format!("{}: {e}", file.display()))
                })?
            }
            (None, None) => {
                return Err(ConfigError::new(
                    "privateKey",
                    "missing: set privateKey (base64, from `wg genkey`) or privateKeyFile",
                ));
            }
        };
        let listen = match raw.listen.as_deref() {
            None => SocketAddr::from(([0, 0, 0, 0], DEFAULT_LISTEN_PORT)),
            Some(s) => socket("listen", s, Some(DEFAULT_LISTEN_PORT))?,
        };
        let underlay_mtu = raw.underlay_mtu.unwrap_or(DEFAULT_UNDERLAY_MTU);
        if !(1280..=65535).contains(&underlay_mtu) {
            return Err(ConfigError::new(
                "underlayMtu",
                format!("{underlay_mtu} is outside 1280..=65535"),
            ));
        }
        let mtu = match raw.mtu {
            Some(m) => {
                if !(576..=9000).contains(&m) {
                    return Err(ConfigError::new(
                        "mtu",
                        format!("{m} is outside 576..=9000"),
                    ));
                }
                if m + 60 > underlay_mtu {
                    return Err(ConfigError::new(
                        "mtu",
                        format!(
                            "{m} plus {} bytes of tunnel headers exceeds underlayMtu {underlay_mtu}; \
                             use at most {}",
                            60,
                            underlay_mtu - 60
                        ),
                    ));
                }
                m
            }
            None => underlay_mtu - TUNNEL_OVERHEAD,
        };
        if raw.local.pod_cidrs.is_empty() {
            return Err(ConfigError::new(
                "local.podCidrs",
                "missing: list this cluster's pod CIDRs",
            ));
        }
        let pod_cidrs = raw
            .local
            .pod_cidrs
            .iter()
            .enumerate()
            .map(|(i, s)| cidr(&format!("local.podCidrs[{i}]"), s))
            .collect::<Result<Vec<_>, _>>()?;
        let external_cidr = raw
            .local
            .external_cidr
            .as_deref()
            .map(|s| cidr("local.externalCidr", s))
            .transpose()?;
        let reserved_cidrs = raw
            .local
            .reserved_cidrs
            .iter()
            .enumerate()
            .map(|(i, s)| cidr(&format!("local.reservedCidrs[{i}]"), s))
            .collect::<Result<Vec<_>, _>>()?;
        for (i, name) in raw.pod_interfaces.iter().enumerate() {
            if !interface_ok(name) {
                return Err(ConfigError::new(
                    format!("podInterfaces[{i}]"),
                    format!("{name:?} is not an interface name (1-15 of [A-Za-z0-9._-])"),
                ));
            }
        }
        let metrics_address = match raw.metrics_address.as_deref() {
            None => SocketAddr::from(([0, 0, 0, 0], 9090)),
            Some(s) => socket("metricsAddress", s, None)?,
        };
        let reconcile_interval = match raw.reconcile_interval_seconds {
            Some(0) => {
                return Err(ConfigError::new(
                    "reconcileIntervalSeconds",
                    "must be at least 1",
                ));
            }
            Some(s) => Duration::from_secs(s),
            None => DEFAULT_RECONCILE_INTERVAL,
        };
        let remap_pools = match raw.remap_pools {
            Some(p) if p.is_empty() => {
                return Err(ConfigError::new(
                    "remapPools",
                    "must not be empty when given",
                ));
            }
            Some(p) => p
                .iter()
                .enumerate()
                .map(|(i, s)| cidr(&format!("remapPools[{i}]"), s))
                .collect::<Result<Vec<_>, _>>()?,
            None => tether_ipam::IpamConfig::rfc1918_pools(),
        };

        let own_public = private_key.public();
        let mut peers = Vec::with_capacity(raw.peers.len());
        let mut ids = BTreeSet::new();
        let mut keys = BTreeSet::new();
        let mut interfaces: BTreeSet<String> = raw.pod_interfaces.iter().cloned().collect();
        for (i, p) in raw.peers.into_iter().enumerate() {
            let f = |name: &str| format!("peers[{i}].{name}");
            let id_ok = (1..=63).contains(&p.id.len())
                && p.id
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
            if !id_ok {
                return Err(ConfigError::new(
                    f("id"),
                    format!("{:?} must be 1-63 of [A-Za-z0-9._-]", p.id),
                ));
            }
            if !ids.insert(p.id.clone()) {
                return Err(ConfigError::new(
                    f("id"),
                    format!("{:?} is used by an earlier peer", p.id),
                ));
            }
            let public_key: PublicKey =
                p.public_key.parse().map_err(|e: tether_wg::KeyError| {
                    ConfigError::new(f("publicKey"), e.to_string())
                })?;
            if public_key == own_public {
                return Err(ConfigError::new(
                    f("publicKey"),
                    "is this gateway's own public key",
                ));
            }
            if !keys.insert(*public_key.as_bytes()) {
                return Err(ConfigError::new(
                    f("publicKey"),
                    "is used by an earlier peer",
                ));
            }
            let endpoint = p
                .endpoint
                .as_deref()
                .map(|s| socket(&f("endpoint"), s, Some(DEFAULT_LISTEN_PORT)))
                .transpose()?;
            let pod_cidr = cidr(&f("podCidr"), &p.pod_cidr)?;
            let pod_local_view = p
                .pod_local_view
                .as_deref()
                .map(|s| cidr(&f("podLocalView"), s))
                .transpose()?;
            if let Some(v) = pod_local_view
                && v.prefix_len() != pod_cidr.prefix_len()
            {
                return Err(ConfigError::new(
                    f("podLocalView"),
                    format!("{v} must have the same prefix length as podCidr {pod_cidr}"),
                ));
            }
            let external_cidr = p
                .external_cidr
                .as_deref()
                .map(|s| cidr(&f("externalCidr"), s))
                .transpose()?;
            let external_local_view = p
                .external_local_view
                .as_deref()
                .map(|s| cidr(&f("externalLocalView"), s))
                .transpose()?;
            match (external_cidr, external_local_view) {
                (None, Some(_)) => {
                    return Err(ConfigError::new(
                        f("externalLocalView"),
                        "given without externalCidr",
                    ));
                }
                (Some(e), Some(v)) if e.prefix_len() != v.prefix_len() => {
                    return Err(ConfigError::new(
                        f("externalLocalView"),
                        format!("{v} must have the same prefix length as externalCidr {e}"),
                    ));
                }
                _ => {}
            }
            let interface = p.interface.unwrap_or_else(|| default_interface(&p.id));
            if !interface_ok(&interface) {
                return Err(ConfigError::new(
                    f("interface"),
                    format!("{interface:?} is not an interface name (1-15 of [A-Za-z0-9._-])"),
                ));
            }
            if !interfaces.insert(interface.clone()) {
                return Err(ConfigError::new(
                    f("interface"),
                    format!("{interface:?} is already used (set a distinct interface per peer)"),
                ));
            }
            let tunnel_address = p
                .tunnel_address
                .as_deref()
                .map(|s| {
                    s.trim().parse::<Ipv4Net>().map_err(|_| {
                        ConfigError::new(f("tunnelAddress"), format!("{s:?} is not address/prefix"))
                    })
                })
                .transpose()?;
            peers.push(PeerSpec {
                id: p.id,
                public_key,
                endpoint,
                persistent_keepalive: p.persistent_keepalive,
                pod_cidr,
                pod_local_view,
                external_cidr,
                external_local_view,
                interface,
                tunnel_address,
            });
        }
        peers.sort_by(|a, b| a.id.cmp(&b.id));
        assign_tunnel_addresses(&mut peers);
        Ok(Self {
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
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> String {
        PrivateKey::generate().to_base64()
    }

    fn base(peers: &str) -> String {
        format!(
            "privateKey: {}\nlocal:\n  podCidrs: [10.0.0.0/16]\npeers:\n{peers}",
            key()
        )
    }

    #[test]
    fn minimal_config_gets_defaults() {
        let pk = PrivateKey::generate().public();
        let c = Config::parse(
            &base(&format!(
                "  - id: b\n    publicKey: {pk}\n    podCidr: 10.0.0.0/16\n"
            )),
            None,
        )
        .expect("valid");
        assert_eq!(c.mtu, 1420);
        assert_eq!(c.listen.port(), DEFAULT_LISTEN_PORT);
        assert_eq!(c.peers[0].interface, "tth-b");
        assert_eq!(c.peers[0].endpoint, None);
    }

    #[test]
    fn errors_name_the_field() {
        let pk = PrivateKey::generate().public();
        let text = base(&format!(
            "  - id: a\n    publicKey: {pk}\n    podCidr: 10.1.0.0/16\n  - id: b\n    publicKey: nope\n    podCidr: 10.2.0.0/16\n"
        ));
        let err = Config::parse(&text, None).expect_err("bad key");
        assert_eq!(err.field, "peers[1].publicKey");
        assert!(
            err.to_string()
                .starts_with("peers[1].publicKey: not valid base64 (expected 32 bytes"),
            "{err}"
        );

        let err = Config::parse(
            &base(&format!(
                "  - id: a\n    publicKey: {pk}\n    podCidr: 10.1.0.1/16\n"
            )),
            None,
        )
        .expect_err("host bits");
        assert_eq!(
            err.to_string(),
            "peers[0].podCidr: \"10.1.0.1/16\" has host bits set; did you mean 10.1.0.0/16?"
        );

        let err = Config::parse(
            &base(&format!(
                "  - id: a\n    publicKey: {pk}\n    podCidr: 10.1.0.0/16\n    colour: red\n"
            )),
            None,
        )
        .expect_err("unknown field");
        assert!(err.to_string().contains("unknown field `colour`"), "{err}");
    }

    #[test]
    fn interface_names_are_checked_and_defaults_truncated() {
        assert_eq!(
            default_interface("a-very-long-cluster-id"),
            "tth-a-very-long"
        );
        assert_eq!(default_interface("a-very-long-cluster-id").len(), 15);
        let pk = PrivateKey::generate().public();
        let err = Config::parse(
            &base(&format!("  - id: a\n    publicKey: {pk}\n    podCidr: 10.1.0.0/16\n    interface: much-too-long-name\n")),
            None,
        )
        .expect_err("long name");
        assert_eq!(err.field, "peers[0].interface");
    }

    #[test]
    fn mtu_must_fit_the_underlay() {
        let text = format!(
            "privateKey: {}\nmtu: 1480\nlocal:\n  podCidrs: [10.0.0.0/16]\n",
            key()
        );
        let err = Config::parse(&text, None).expect_err("too big");
        assert_eq!(err.field, "mtu");
        let text = format!(
            "privateKey: {}\nunderlayMtu: 9000\nlocal:\n  podCidrs: [10.0.0.0/16]\n",
            key()
        );
        assert_eq!(Config::parse(&text, None).expect("ok").mtu, 8920);
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
}
