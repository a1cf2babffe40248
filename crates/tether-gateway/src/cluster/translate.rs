//! From the Kubernetes objects the controller writes to a gateway [`Config`]: pure, so every
//! way the objects can be incomplete or wrong is a data test. The remap is the controller's
//! (`status.remote.cidr` of the Configuration); the gateway never chooses its own, so a
//! missing remap means waiting, not falling back to the IPAM.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use ipnet::Ipv4Net;
use k8s_openapi::api::core::v1::Secret;
use tether_api::names::{gateway_key, labels, objects};
use tether_api::networking::{Configuration, GatewayClient, GatewayServer, GatewayType};
use tether_wg::{IPV4_TUNNEL_OVERHEAD, PrivateKey, PublicKey};

use crate::config::{self, Config, ConfigError, PeerSpec, defaults};

/// Keepalive of the dialling end, so NAT mappings between the clusters stay open.
pub const CLIENT_KEEPALIVE: u16 = 10;

/// The gateway object this process serves.
#[derive(Clone, Debug, PartialEq)]
pub enum Gateway {
    /// The listening end.
    Server(GatewayServer),
    /// The dialling end.
    Client(GatewayClient),
}

impl Gateway {
    /// `Server` or `Client`.
    pub fn type_(&self) -> GatewayType {
        match self {
            Self::Server(_) => GatewayType::Server,
            Self::Client(_) => GatewayType::Client,
        }
    }

    /// The kind, as `kubectl` names it.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Server(_) => "GatewayServer",
            Self::Client(_) => "GatewayClient",
        }
    }

    /// The object's name.
    pub fn name(&self) -> &str {
        let meta = match self {
            Self::Server(s) => &s.metadata,
            Self::Client(c) => &c.metadata,
        };
        meta.name.as_deref().unwrap_or_default()
    }

    /// The remote cluster's ID.
    pub fn remote_cluster_id(&self) -> &str {
        match self {
            Self::Server(s) => &s.spec.remote_cluster_id,
            Self::Client(c) => &c.spec.remote_cluster_id,
        }
    }

    /// The Secret holding the private key.
    pub fn secret_name(&self) -> &str {
        let r = match self {
            Self::Server(s) => s.spec.secret_ref.as_ref(),
            Self::Client(c) => c.spec.secret_ref.as_ref(),
        };
        r.map_or(objects::GATEWAY_KEY_SECRET, |r| r.name.as_str())
    }

    fn mtu(&self) -> Option<u32> {
        match self {
            Self::Server(s) => s.spec.mtu,
            Self::Client(c) => c.spec.mtu,
        }
    }
}

/// What the process knows that the objects do not.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Admin server address.
    pub metrics_address: SocketAddr,
    /// Where local traffic enters (empty: every non-tunnel interface).
    pub pod_interfaces: Vec<String>,
    /// MTU of the interface of the default route, when it could be read.
    pub underlay_mtu: Option<u32>,
    /// Drift repair period.
    pub reconcile_interval: Duration,
    /// This pod's IP, the local end of the fabric to the nodes; `None` runs no fabric.
    pub fabric_ip: Option<std::net::Ipv4Addr>,
    /// Local addresses published under addresses of the external CIDR (`--publish`).
    pub publish: Vec<tether_netplan::IpMapping>,
}

/// Why there is no configuration yet.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NotReady {
    /// Something the controller writes later is missing: wait for it.
    #[error("{message}")]
    Waiting {
        /// A CamelCase reason for the Connection's condition.
        reason: &'static str,
        /// What is missing, where, and who writes it.
        message: String,
    },
    /// An object holds a value the gateway cannot use: a person must fix it.
    #[error("{object}: {field}: {message}")]
    Invalid {
        /// `Kind namespace/name`.
        object: String,
        /// The field, e.g. `spec.remote.cidr.pod[0]`.
        field: String,
        /// What is wrong.
        message: String,
    },
}

impl NotReady {
    fn waiting(reason: &'static str, message: impl Into<String>) -> Self {
        Self::Waiting {
            reason,
            message: message.into(),
        }
    }
}

/// The objects one translation reads.
#[derive(Clone, Copy, Debug)]
pub struct Objects<'a> {
    /// The namespace they live in.
    pub namespace: &'a str,
    /// The gateway object.
    pub gateway: &'a Gateway,
    /// The key Secret, if it exists.
    pub secret: Option<&'a Secret>,
    /// Every Configuration of the namespace.
    pub configurations: &'a [Configuration],
}

/// The Configuration describing `remote`: the one named after it, else the one labelled with it.
pub fn configuration_for<'a>(
    configurations: &'a [Configuration],
    remote: &str,
) -> Option<&'a Configuration> {
    configurations
        .iter()
        .find(|c| c.metadata.name.as_deref() == Some(remote))
        .or_else(|| {
            configurations.iter().find(|c| {
                c.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(labels::REMOTE_CLUSTER_ID))
                    .is_some_and(|v| v == remote)
            })
        })
}

/// The gateway configuration the objects describe.
pub fn translate(objects: &Objects<'_>, settings: &Settings) -> Result<Config, NotReady> {
    let ns = objects.namespace;
    let gw = objects.gateway;
    let gw_object = format!("{} {ns}/{}", gw.kind(), gw.name());
    let remote = gw.remote_cluster_id();
    let invalid = |object: &str, field: &str, message: String| NotReady::Invalid {
        object: object.to_owned(),
        field: field.to_owned(),
        message,
    };

    let secret_name = gw.secret_name();
    let secret_object = format!("Secret {ns}/{secret_name}");
    let Some(secret) = objects.secret else {
        return Err(NotReady::waiting(
            "KeyPending",
            format!(
                "waiting for {secret_object} with the gateway's WireGuard key (the controller creates it)"
            ),
        ));
    };
    let field = format!("data.{}", gateway_key::PRIVATE_KEY);
    let Some(raw_key) = secret
        .data
        .as_ref()
        .and_then(|d| d.get(gateway_key::PRIVATE_KEY))
    else {
        return Err(NotReady::waiting(
            "KeyPending",
            format!("waiting for {secret_object} to hold {field}"),
        ));
    };
    // Never echo the key itself, not even a malformed one.
    let private_key = std::str::from_utf8(&raw_key.0)
        .ok()
        .and_then(|s| s.trim().parse::<PrivateKey>().ok())
        .ok_or_else(|| {
            invalid(
                &secret_object,
                &field,
                "is not a base64 WireGuard private key (32 bytes)".into(),
            )
        })?;

    let Some(conf) = configuration_for(objects.configurations, remote) else {
        return Err(NotReady::waiting(
            "ConfigurationPending",
            format!(
                "waiting for the Configuration of cluster {remote} in {ns} (named {remote} or labelled {}={remote})",
                labels::REMOTE_CLUSTER_ID
            ),
        ));
    };
    let conf_object = format!(
        "Configuration {ns}/{}",
        conf.metadata.name.as_deref().unwrap_or_default()
    );
    let cidr = |field: &str, s: &str| -> Result<Ipv4Net, NotReady> {
        let net: Ipv4Net = s.trim().parse().map_err(|_| {
            invalid(
                &conf_object,
                field,
                format!("{s:?} is not an IPv4 CIDR (expected e.g. 10.0.0.0/16)"),
            )
        })?;
        tether_netplan::check_network("CIDR", net)
            .map_err(|e| invalid(&conf_object, field, e.to_string()))?;
        Ok(net)
    };
    if conf.spec.remote.cluster_id != remote {
        return Err(invalid(
            &conf_object,
            "spec.remote.clusterID",
            format!(
                "is {:?}, but {gw_object} is for cluster {remote:?}",
                conf.spec.remote.cluster_id
            ),
        ));
    }
    let Some(local) = conf.spec.local.as_ref().filter(|l| !l.cidr.pod.is_empty()) else {
        return Err(NotReady::waiting(
            "LocalCidrsPending",
            format!("waiting for {conf_object} spec.local.cidr.pod (this cluster's pod CIDRs)"),
        ));
    };
    let pod_cidrs = local
        .cidr
        .pod
        .iter()
        .enumerate()
        .map(|(i, s)| cidr(&format!("spec.local.cidr.pod[{i}]"), s))
        .collect::<Result<Vec<_>, _>>()?;
    let external_cidr = local
        .cidr
        .external
        .first()
        .map(|s| cidr("spec.local.cidr.external[0]", s))
        .transpose()?;
    let reserved_cidrs = local
        .cidr
        .service
        .iter()
        .enumerate()
        .map(|(i, s)| cidr(&format!("spec.local.cidr.service[{i}]"), s))
        .collect::<Result<Vec<_>, _>>()?;
    let Some(remote_pod) = conf.spec.remote.cidr.pod.first() else {
        return Err(NotReady::waiting(
            "RemoteCidrsPending",
            format!(
                "waiting for {conf_object} spec.remote.cidr.pod (the remote cluster's pod CIDRs)"
            ),
        ));
    };
    let pod_cidr = cidr("spec.remote.cidr.pod[0]", remote_pod)?;
    let seen = conf
        .status
        .as_ref()
        .and_then(|s| s.remote.as_ref())
        .map(|r| &r.cidr);
    let Some(view) = seen.and_then(|c| c.pod.first()) else {
        return Err(NotReady::waiting(
            "RemapPending",
            format!(
                "waiting for the controller to choose how this cluster addresses {remote}'s pods \
                 ({conf_object} status.remote.cidr.pod)"
            ),
        ));
    };
    let pod_local_view = cidr("status.remote.cidr.pod[0]", view)?;
    let (external, external_local_view) = match conf.spec.remote.cidr.external.first() {
        None => (None, None),
        Some(real) => {
            let real = cidr("spec.remote.cidr.external[0]", real)?;
            let Some(view) = seen.and_then(|c| c.external.first()) else {
                return Err(NotReady::waiting(
                    "RemapPending",
                    format!(
                        "waiting for the controller to choose how this cluster addresses {remote}'s \
                         external CIDR ({conf_object} status.remote.cidr.external)"
                    ),
                ));
            };
            (
                Some(real),
                Some(cidr("status.remote.cidr.external[0]", view)?),
            )
        }
    };

    let peer_key = |field: &str, s: &str| -> Result<PublicKey, NotReady> {
        s.trim()
            .parse::<PublicKey>()
            .map_err(|e| invalid(&gw_object, field, e.to_string()))
    };
    let (listen, public_key, endpoint, keepalive) = match gw {
        Gateway::Server(s) => {
            let Some(key) = s.spec.client_public_key.as_deref() else {
                return Err(NotReady::waiting(
                    "PeerKeyPending",
                    format!(
                        "waiting for {gw_object} spec.clientPublicKey (the controller copies it from the client cluster)"
                    ),
                ));
            };
            let key = peer_key("spec.clientPublicKey", key)?;
            let listen = SocketAddr::from(([0, 0, 0, 0], s.spec.endpoint.port));
            (listen, key, None, None)
        }
        Gateway::Client(c) => {
            let key = peer_key("spec.serverPublicKey", &c.spec.server_public_key)?;
            let Some(address) = c.spec.endpoint.addresses.first() else {
                return Err(NotReady::waiting(
                    "EndpointPending",
                    format!(
                        "waiting for {gw_object} spec.endpoint.addresses (the server's address)"
                    ),
                ));
            };
            let ip: IpAddr = address.trim().parse().map_err(|_| {
                invalid(
                    &gw_object,
                    "spec.endpoint.addresses[0]",
                    format!("{address:?} is not an IP address (host names are not resolved)"),
                )
            })?;
            // Any local port: the server learns where the client is from its handshake.
            let listen = SocketAddr::from(([0, 0, 0, 0], 0));
            let endpoint = SocketAddr::new(ip, c.spec.endpoint.port);
            (listen, key, Some(endpoint), Some(CLIENT_KEEPALIVE))
        }
    };
    let mtu = gw.mtu().unwrap_or_else(|| match settings.underlay_mtu {
        Some(underlay) => underlay.saturating_sub(IPV4_TUNNEL_OVERHEAD as u32),
        None => config::defaults::tunnel_mtu(config::DEFAULT_UNDERLAY_MTU),
    });

    let mut peers = vec![PeerSpec {
        id: remote.to_owned(),
        position: 0,
        public_key,
        endpoint,
        persistent_keepalive: keepalive,
        pod_cidr,
        pod_local_view: Some(pod_local_view),
        external_cidr: external,
        external_local_view,
        interface: config::default_interface(remote),
        tunnel_address: None,
    }];
    defaults::assign_tunnel_addresses(&mut peers);
    let ip_mappings = published_mappings(settings, conf, external_cidr, &pod_cidrs);
    Ok(Config {
        private_key,
        listen,
        mtu,
        pod_cidrs,
        external_cidr,
        reserved_cidrs,
        pod_interfaces: settings.pod_interfaces.clone(),
        metrics_address: settings.metrics_address,
        reconcile_interval: settings.reconcile_interval,
        remap_pools: tether_ipam::IpamConfig::rfc1918_pools(),
        peers,
        ip_mappings,
    })
}

/// The addresses to publish: `--publish` first (the control plane), then the
/// Configuration's `status.published` (the cluster's IP objects), less every entry the planner
/// would refuse (not an address, outside the external CIDR, a pod address, an address or host
/// already taken), so that one bad entry never takes the tunnel down.
pub fn published_mappings(
    settings: &Settings,
    conf: &Configuration,
    external_cidr: Option<Ipv4Net>,
    pod_cidrs: &[Ipv4Net],
) -> Vec<tether_netplan::IpMapping> {
    let mut out = settings.publish.clone();
    let Some(external_cidr) = external_cidr else {
        return out;
    };
    let listed = conf
        .status
        .as_ref()
        .map(|s| s.published.as_slice())
        .unwrap_or_default();
    for p in listed {
        let (Ok(external), Ok(real)) = (
            p.external.trim().parse::<std::net::Ipv4Addr>(),
            p.ip.trim().parse::<std::net::Ipv4Addr>(),
        ) else {
            continue;
        };
        let usable = external_cidr.contains(&external)
            && !pod_cidrs.iter().any(|c| c.contains(&real))
            && !out.iter().any(|m| m.external == external || m.real == real);
        if usable {
            out.push(tether_netplan::IpMapping { external, real });
        }
    }
    out
}

/// Turns a planning error of a translated configuration into the object field behind it.
pub fn planning_error(objects: &Objects<'_>, error: &ConfigError) -> NotReady {
    let ns = objects.namespace;
    let gw = objects.gateway;
    let conf = configuration_for(objects.configurations, gw.remote_cluster_id())
        .and_then(|c| c.metadata.name.clone())
        .unwrap_or_default();
    let conf_object = format!("Configuration {ns}/{conf}");
    let gw_object = format!("{} {ns}/{}", gw.kind(), gw.name());
    let key_field = match gw {
        Gateway::Server(_) => "spec.clientPublicKey",
        Gateway::Client(_) => "spec.serverPublicKey",
    };
    let f = error.field.as_str();
    let (object, field) = if f.ends_with("podLocalView") {
        (conf_object, "status.remote.cidr.pod[0]")
    } else if f.ends_with("externalLocalView") {
        (conf_object, "status.remote.cidr.external[0]")
    } else if f.ends_with("externalCidr") || f.starts_with("local.externalCidr") {
        (conf_object, "spec.remote.cidr.external[0]")
    } else if f.starts_with("local.") {
        (conf_object, "spec.local.cidr")
    } else if f.ends_with("publicKey") {
        (gw_object, key_field)
    } else if f == "mtu" {
        (gw_object, "spec.mtu")
    } else {
        (gw_object, "spec")
    };
    NotReady::Invalid {
        object,
        field: field.to_owned(),
        message: format!("{} ({f})", error.problem),
    }
}

/// The settings that differ between two configurations, named as in the objects, for the log
/// line that explains a rebuild.
pub fn changed_fields(old: &Config, new: &Config) -> Vec<&'static str> {
    let mut out = Vec::new();
    let mut check = |changed: bool, name: &'static str| {
        if changed {
            out.push(name);
        }
    };
    check(
        old.private_key.public() != new.private_key.public(),
        "private key (Secret)",
    );
    check(old.listen != new.listen, "spec.endpoint.port");
    check(old.mtu != new.mtu, "mtu");
    check(
        old.pod_cidrs != new.pod_cidrs,
        "Configuration spec.local.cidr.pod",
    );
    check(
        old.external_cidr != new.external_cidr,
        "Configuration spec.local.cidr.external",
    );
    check(
        old.reserved_cidrs != new.reserved_cidrs,
        "Configuration spec.local.cidr.service",
    );
    check(old.pod_interfaces != new.pod_interfaces, "pod interfaces");
    match (old.peers.first(), new.peers.first()) {
        (Some(a), Some(b)) => {
            check(a.id != b.id, "spec.remoteClusterID");
            check(a.public_key != b.public_key, "peer public key");
            check(a.endpoint != b.endpoint, "spec.endpoint");
            check(
                a.pod_cidr != b.pod_cidr,
                "Configuration spec.remote.cidr.pod",
            );
            check(
                a.pod_local_view != b.pod_local_view,
                "Configuration status.remote.cidr.pod (remap)",
            );
            check(
                a.external_cidr != b.external_cidr,
                "Configuration spec.remote.cidr.external",
            );
            check(
                a.external_local_view != b.external_local_view,
                "Configuration status.remote.cidr.external (remap)",
            );
        }
        (a, b) => check(a.is_some() != b.is_some(), "peer"),
    }
    out
}

#[cfg(test)]
mod tests;
