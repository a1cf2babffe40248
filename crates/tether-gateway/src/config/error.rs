//! Configuration errors: a field and what is wrong with it. Rules the gateway owns say so in
//! words; rules owned by a lower crate (key format in tether-wg, planning rules in
//! tether-netplan, address management in tether-ipam) arrive as that crate's typed error,
//! which stays the error's source, and this module only finds the field that caused it.

use std::fmt;
use std::path::PathBuf;

use tether_ipam::IpamError;
use tether_netplan::PlanError;
use tether_wg::{DeviceError, KeyError};

use super::Config;

/// A configuration field and what is wrong with it.
#[derive(Debug)]
pub struct ConfigError {
    /// Dotted path of the field, e.g. `peers[1].publicKey` (or the file for read errors).
    pub field: String,
    /// What is wrong, and which crate's rule says so.
    pub problem: Problem,
}

/// What is wrong with a field.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Problem {
    /// A rule of the gateway's own file format; the text says what to do.
    #[error("{0}")]
    Invalid(String),
    /// A file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The text is not YAML, or does not have the file's shape.
    #[error(transparent)]
    Syntax(serde_yaml::Error),
    /// A key is not a WireGuard key.
    #[error(transparent)]
    Key(KeyError),
    /// The planner refused the gateway's input.
    #[error(transparent)]
    Plan(PlanError),
    /// Address management refused a CIDR or pool.
    #[error(transparent)]
    Ipam(IpamError),
    /// The WireGuard device refused the peers.
    #[error(transparent)]
    Device(DeviceError),
}

impl ConfigError {
    pub(crate) fn new(field: impl Into<String>, problem: Problem) -> Self {
        Self {
            field: field.into(),
            problem,
        }
    }

    /// A violation of one of the gateway's own rules.
    pub(crate) fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(field, Problem::Invalid(message.into()))
    }

    /// Names the field behind a planner error. The planner identifies peers by id and
    /// interfaces by name; the file identifies them by position.
    pub(crate) fn from_plan(config: &Config, error: PlanError) -> Self {
        let field = match &error {
            PlanError::InvalidPeerId { id } => peer_field(config, id, "id"),
            PlanError::DuplicatePeerId { id } => config
                .peers
                .iter()
                .filter(|p| &p.id == id)
                .map(|p| p.position)
                .nth(1)
                .map_or_else(|| "peers".to_owned(), |i| format!("peers[{i}].id")),
            PlanError::InvalidInterfaceName { name } => interface_fields(config, name)
                .into_iter()
                .next()
                .unwrap_or_else(|| "podInterfaces".to_owned()),
            PlanError::DuplicateInterface { name } => interface_fields(config, name)
                .into_iter()
                .nth(1)
                .unwrap_or_else(|| "podInterfaces".to_owned()),
            PlanError::MtuOutOfRange { .. } => "mtu".to_owned(),
            PlanError::PrefixLenMismatch { peer, kind, .. } => {
                peer_field(config, peer, &format!("{kind}LocalView"))
            }
            PlanError::PeerCidrsOverlap { peer, .. } => peer_field(config, peer, "externalCidr"),
            PlanError::NoLocalPodCidrs => "local.podCidrs".to_owned(),
            PlanError::TooManyPeers { .. } => "peers".to_owned(),
            _ => "config".to_owned(),
        };
        Self::new(field, Problem::Plan(error))
    }

    /// Names the field behind a WireGuard device error.
    pub(crate) fn from_device(config: &Config, error: DeviceError) -> Self {
        let field = match &error {
            DeviceError::OwnKey(id) => peer_field(config, id, "publicKey"),
            // The later of the two in the file is the one to change.
            DeviceError::DuplicateKey { first, second } => {
                let position =
                    |id: &str| config.peers.iter().find(|p| p.id == id).map(|p| p.position);
                match position(first).max(position(second)) {
                    Some(i) => format!("peers[{i}].publicKey"),
                    None => "peers".to_owned(),
                }
            }
        };
        Self::new(field, Problem::Device(error))
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.problem)
    }
}

impl std::error::Error for ConfigError {
    /// The lower crate's error itself, so callers can match it through the chain.
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.problem {
            Problem::Invalid(_) => None,
            Problem::Read { source, .. } => Some(source),
            Problem::Syntax(e) => Some(e),
            Problem::Key(e) => Some(e),
            Problem::Plan(e) => Some(e),
            Problem::Ipam(e) => Some(e),
            Problem::Device(e) => Some(e),
        }
    }
}

/// `peers[i].name` for the peer with this id, by its position in the file.
pub(crate) fn peer_field(config: &Config, id: &str, name: &str) -> String {
    config.peers.iter().find(|p| p.id == id).map_or_else(
        || "peers".to_owned(),
        |p| format!("peers[{}].{name}", p.position),
    )
}

/// Every field that names interface `name`, in file order: pod interfaces first, then peers.
fn interface_fields(config: &Config, name: &str) -> Vec<String> {
    let mut fields: Vec<String> = config
        .pod_interfaces
        .iter()
        .enumerate()
        .filter(|(_, n)| *n == name)
        .map(|(i, _)| format!("podInterfaces[{i}]"))
        .collect();
    let mut peers: Vec<_> = config
        .peers
        .iter()
        .filter(|p| p.interface == name)
        .collect();
    peers.sort_by_key(|p| p.position);
    fields.extend(
        peers
            .into_iter()
            .map(|p| format!("peers[{}].interface", p.position)),
    );
    fields
}
