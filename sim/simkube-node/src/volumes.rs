//! Volume planning (pure): a pod's volume spec plus the data the agent fetched (ConfigMaps,
//! Secrets, ServiceAccount tokens, claims and their volumes) become the files the kubelet would
//! write, with their paths, contents and modes, or the host directory to bind (`emptyDir`,
//! `hostPath`, and a `persistentVolumeClaim` bound to a `hostPath` or `local` volume).
//!
//! Messages follow the kubelet's, since users grep for them (`configmap "x" not found`,
//! `configmap references non-existent config key: k`).

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use k8s_openapi::api::core::v1::{
    ConfigMapProjection, Container, DownwardAPIVolumeFile, KeyToPath, PersistentVolume,
    PersistentVolumeClaim, Pod, SecretProjection, Volume,
};

/// The mode of files whose volume sets no `defaultMode` (0644, the API default).
pub const DEFAULT_MODE: u32 = 0o644;
/// The TokenRequest lifetime a projection without `expirationSeconds` asks for (the API
/// default of `serviceAccountToken.expirationSeconds`).
pub const DEFAULT_TOKEN_SECONDS: i64 = 3607;
/// The shortest lifetime a projection may ask for.
pub const MIN_TOKEN_SECONDS: i64 = 600;

/// The keys of a ConfigMap or Secret and their bytes (`data` and `binaryData` together).
pub type ObjectData = BTreeMap<String, Vec<u8>>;

/// A ServiceAccount token (a bearer credential): its `Debug` and `Display` never show it.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

impl Token {
    /// Wraps a token string.
    pub fn new(token: String) -> Self {
        Self(token)
    }

    /// The token itself, for the file that carries it; never log it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

/// Which token a projection needs: the audience (empty: the API server's) and lifetime.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TokenKey {
    /// The requested audience; empty for the API server's own.
    pub audience: String,
    /// The requested lifetime in seconds.
    pub expiration_seconds: i64,
}

/// Everything volumes may reference, fetched by the agent beforehand. A name missing from a
/// map means the object does not exist.
#[derive(Debug, Clone, Default)]
pub struct Sources {
    /// ConfigMap name → keys.
    pub config_maps: BTreeMap<String, ObjectData>,
    /// Secret name → keys. Values are secrets.
    pub secrets: BTreeMap<String, ObjectData>,
    /// Tokens for the pod's ServiceAccount, by projection.
    pub tokens: BTreeMap<TokenKey, Token>,
    /// Claim name → the claim and, when it names one that exists, its volume.
    pub claims: BTreeMap<String, (PersistentVolumeClaim, Option<PersistentVolume>)>,
}

/// What the downward API reports for resources a container does not limit (the node's
/// allocatable, as the kubelet does).
#[derive(Debug, Clone, Default)]
pub struct NodeResources {
    /// Allocatable CPU (a quantity, e.g. `4`).
    pub cpu: String,
    /// Allocatable memory (a quantity, e.g. `8Gi`).
    pub memory: String,
}

/// The objects a volume reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct References {
    /// ConfigMap names.
    pub config_maps: Vec<String>,
    /// Secret names.
    pub secrets: Vec<String>,
    /// Tokens.
    pub tokens: Vec<TokenKey>,
    /// PersistentVolumeClaim names.
    pub claims: Vec<String>,
}

/// One file of a volume.
#[derive(Clone, PartialEq, Eq)]
pub struct File {
    /// Path relative to the volume's root (validated: no `..`, not absolute).
    pub path: String,
    /// Contents (may be a secret).
    pub content: Vec<u8>,
    /// Permission bits.
    pub mode: u32,
}

impl fmt::Debug for File {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Contents may come from a Secret or be a token: only their size is shown.
        f.debug_struct("File")
            .field("path", &self.path)
            .field("bytes", &self.content.len())
            .field("mode", &format_args!("{:#o}", self.mode))
            .finish()
    }
}

/// How a volume appears on the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// Files written by the agent (configMap, secret, downwardAPI, projected); always mounted
    /// read-only, as the kubelet does for API-data volumes.
    Files(Vec<File>),
    /// A per-pod scratch directory (`medium: Memory` is a plain directory too).
    EmptyDir,
    /// A directory or file of the host, bound as is.
    HostPath {
        /// The host path.
        path: PathBuf,
        /// `spec.hostPath.type` (empty: no check).
        kind: String,
    },
    /// A claim's volume: its host directory, bound as is (data outlives the pod).
    Persistent {
        /// The directory.
        path: PathBuf,
        /// The `hostPath.type` check to run (`DirectoryOrCreate` creates it).
        kind: String,
        /// `persistentVolumeClaim.readOnly`: every mount of it is read-only.
        read_only: bool,
    },
}

impl Plan {
    /// Whether the agent rewrites the volume on updates (API-data volumes).
    pub fn is_files(&self) -> bool {
        matches!(self, Self::Files(_))
    }

    /// Whether every mount of the volume is read-only whatever the `volumeMount` says
    /// (API-data volumes, as in the kubelet, and claims mounted `readOnly`).
    pub fn read_only(&self) -> bool {
        match self {
            Self::Files(_) => true,
            Self::Persistent { read_only, .. } => *read_only,
            Self::EmptyDir | Self::HostPath { .. } => false,
        }
    }
}

/// Why a volume cannot be set up (the kubelet's `MountVolume.SetUp failed` cases).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VolumeError {
    /// A referenced ConfigMap or Secret does not exist and is not optional.
    #[error("{kind} {name:?} not found")]
    MissingObject {
        /// `configmap` or `secret`.
        kind: &'static str,
        /// Its name.
        name: String,
    },
    /// An item names a key the object lacks.
    #[error("{kind} references non-existent {what} key: {key}")]
    MissingKey {
        /// `configmap` or `secret`.
        kind: &'static str,
        /// `config` or `secret`, as the kubelet words it.
        what: &'static str,
        /// The key.
        key: String,
    },
    /// A file path escapes the volume or is absolute.
    #[error("invalid path {0:?}: must be relative and may not contain '..'")]
    BadPath(String),
    /// A downward-API field the agent does not expose.
    #[error(
        "unsupported fieldRef {0:?} in a downwardAPI volume (supported: metadata.name, metadata.namespace, metadata.uid, metadata.labels, metadata.annotations, and one label or annotation as metadata.labels['k'])"
    )]
    UnsupportedField(String),
    /// A resourceFieldRef the agent cannot answer.
    #[error("cannot resolve resourceFieldRef {resource:?} of container {container:?}: {reason}")]
    BadResource {
        /// The resource (`limits.cpu`, ...).
        resource: String,
        /// The container it names.
        container: String,
        /// What is wrong.
        reason: String,
    },
    /// The token for a projection was not fetched.
    #[error("no token for audience {audience:?}: fetch it first")]
    MissingToken {
        /// The audience.
        audience: String,
    },
    /// The projection asks for a token lifetime below the minimum.
    #[error("serviceAccountToken expirationSeconds {0} is below the minimum of 600")]
    ShortToken(i64),
    /// A volume type simulated nodes cannot provide.
    #[error(
        "volume type {0} is not supported by simulated nodes (supported: configMap, secret, downwardAPI, projected, emptyDir, hostPath, persistentVolumeClaim)"
    )]
    Unsupported(String),
    /// The claim a volume names does not exist.
    #[error("persistentvolumeclaim {0:?} not found")]
    MissingClaim(String),
    /// The claim is not bound yet (the kubelet's words).
    #[error(
        "PVC {namespace}/{name} has non-bound phase ({phase:?}) or empty pvc.Spec.VolumeName ({volume:?})"
    )]
    UnboundClaim {
        /// The claim's namespace.
        namespace: String,
        /// The claim.
        name: String,
        /// Its phase.
        phase: String,
        /// Its `spec.volumeName`.
        volume: String,
    },
    /// The claim's volume does not exist.
    #[error("persistentvolume {0:?} not found")]
    MissingVolume(String),
    /// The claim's volume has a source simulated nodes cannot mount.
    #[error(
        "persistentvolume {volume:?} (claim {claim:?}) has a {source_kind} source, which simulated nodes cannot mount (supported: hostPath, local)"
    )]
    UnsupportedSource {
        /// The volume.
        volume: String,
        /// The claim.
        claim: String,
        /// The source, e.g. `csi (driver "x")`.
        source_kind: String,
    },
}

/// The token a projection asks for.
pub fn token_key(audience: Option<&str>, expiration_seconds: Option<i64>) -> TokenKey {
    TokenKey {
        audience: audience.unwrap_or_default().to_owned(),
        expiration_seconds: expiration_seconds.unwrap_or(DEFAULT_TOKEN_SECONDS),
    }
}

/// The objects and tokens `volume` reads.
pub fn references(volume: &Volume) -> References {
    let mut refs = References::default();
    if let Some(cm) = &volume.config_map {
        refs.config_maps.push(cm.name.clone());
    }
    if let Some(secret) = &volume.secret {
        refs.secrets
            .push(secret.secret_name.clone().unwrap_or_default());
    }
    if let Some(projected) = &volume.projected {
        for source in projected.sources.iter().flatten() {
            if let Some(cm) = &source.config_map {
                refs.config_maps.push(cm.name.clone());
            }
            if let Some(secret) = &source.secret {
                refs.secrets.push(secret.name.clone());
            }
            if let Some(token) = &source.service_account_token {
                refs.tokens.push(token_key(
                    token.audience.as_deref(),
                    token.expiration_seconds,
                ));
            }
        }
    }
    if let Some(claim) = &volume.persistent_volume_claim {
        refs.claims.push(claim.claim_name.clone());
    }
    refs.config_maps.dedup();
    refs.secrets.dedup();
    refs.tokens.dedup();
    refs
}

/// Plans `volume` of `pod` from `sources`.
pub fn plan(
    pod: &Pod,
    volume: &Volume,
    sources: &Sources,
    node: &NodeResources,
) -> Result<Plan, VolumeError> {
    if let Some(cm) = &volume.config_map {
        let mode = mode_of(cm.default_mode);
        let files = object_files(
            Kind::ConfigMap,
            &cm.name,
            sources.config_maps.get(&cm.name),
            cm.items.as_deref(),
            cm.optional,
            mode,
        )?;
        return Ok(Plan::Files(files));
    }
    if let Some(secret) = &volume.secret {
        let name = secret.secret_name.clone().unwrap_or_default();
        let files = object_files(
            Kind::Secret,
            &name,
            sources.secrets.get(&name),
            secret.items.as_deref(),
            secret.optional,
            mode_of(secret.default_mode),
        )?;
        return Ok(Plan::Files(files));
    }
    if let Some(downward) = &volume.downward_api {
        let mode = mode_of(downward.default_mode);
        let files = downward_files(pod, downward.items.as_deref(), mode, node)?;
        return Ok(Plan::Files(files));
    }
    if let Some(projected) = &volume.projected {
        let mode = mode_of(projected.default_mode);
        let mut files: Vec<File> = Vec::new();
        for source in projected.sources.iter().flatten() {
            let mut add = match source {
                s if s.config_map.is_some() => {
                    let ConfigMapProjection {
                        name,
                        items,
                        optional,
                    } = s.config_map.as_ref().expect("invariant: matched is_some");
                    object_files(
                        Kind::ConfigMap,
                        name,
                        sources.config_maps.get(name),
                        items.as_deref(),
                        *optional,
                        mode,
                    )?
                }
                s if s.secret.is_some() => {
                    let SecretProjection {
                        name,
                        items,
                        optional,
                    } = s.secret.as_ref().expect("invariant: matched is_some");
                    object_files(
                        Kind::Secret,
                        name,
                        sources.secrets.get(name),
                        items.as_deref(),
                        *optional,
                        mode,
                    )?
                }
                s if s.downward_api.is_some() => {
                    let items = s.downward_api.as_ref().and_then(|d| d.items.as_deref());
                    downward_files(pod, items, mode, node)?
                }
                s if s.service_account_token.is_some() => {
                    let token = s
                        .service_account_token
                        .as_ref()
                        .expect("invariant: matched is_some");
                    let key = token_key(token.audience.as_deref(), token.expiration_seconds);
                    if key.expiration_seconds < MIN_TOKEN_SECONDS {
                        return Err(VolumeError::ShortToken(key.expiration_seconds));
                    }
                    let value =
                        sources
                            .tokens
                            .get(&key)
                            .ok_or_else(|| VolumeError::MissingToken {
                                audience: key.audience.clone(),
                            })?;
                    check_path(&token.path)?;
                    // The kubelet writes tokens 0600 unless the projection sets a mode; with
                    // no fsGroup or runAsUser to honour, the volume's mode applies.
                    vec![File {
                        path: token.path.clone(),
                        content: value.expose().as_bytes().to_vec(),
                        mode,
                    }]
                }
                // clusterTrustBundle and podCertificate projections have no data here.
                _ => Vec::new(),
            };
            for file in add.drain(..) {
                // A later source writing the same path wins, as the kubelet's map merge does.
                files.retain(|f| f.path != file.path);
                files.push(file);
            }
        }
        return Ok(Plan::Files(files));
    }
    if volume.empty_dir.is_some() {
        return Ok(Plan::EmptyDir);
    }
    if let Some(source) = &volume.persistent_volume_claim {
        return claim_plan(&source.claim_name, source.read_only == Some(true), sources);
    }
    if let Some(host) = &volume.host_path {
        return Ok(Plan::HostPath {
            path: PathBuf::from(&host.path),
            kind: host.type_.clone().unwrap_or_default(),
        });
    }
    Err(VolumeError::Unsupported(volume_type(volume).to_owned()))
}

/// A claim's volume as the kubelet mounts it: the claim must be Bound and name an existing
/// volume whose source is a host directory.
fn claim_plan(name: &str, read_only: bool, sources: &Sources) -> Result<Plan, VolumeError> {
    let (claim, volume) = sources
        .claims
        .get(name)
        .ok_or_else(|| VolumeError::MissingClaim(name.to_owned()))?;
    let phase = claim
        .status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default();
    let volume_name = claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.clone())
        .unwrap_or_default();
    if phase != "Bound" || volume_name.is_empty() {
        return Err(VolumeError::UnboundClaim {
            namespace: claim.metadata.namespace.clone().unwrap_or_default(),
            name: name.to_owned(),
            phase,
            volume: volume_name,
        });
    }
    let spec = volume
        .as_ref()
        .and_then(|v| v.spec.clone())
        .ok_or_else(|| VolumeError::MissingVolume(volume_name.clone()))?;
    if let Some(host) = spec.host_path {
        return Ok(Plan::Persistent {
            path: PathBuf::from(host.path),
            kind: host.type_.unwrap_or_default(),
            read_only,
        });
    }
    if let Some(local) = spec.local {
        // A local volume is a directory someone prepared on the node: it must exist.
        return Ok(Plan::Persistent {
            path: PathBuf::from(local.path),
            kind: "Directory".into(),
            read_only,
        });
    }
    let source_kind = if let Some(csi) = &spec.csi {
        format!("csi (driver {:?})", csi.driver)
    } else if spec.nfs.is_some() {
        "nfs".into()
    } else if spec.iscsi.is_some() {
        "iscsi".into()
    } else if spec.fc.is_some() {
        "fc".into()
    } else {
        "(unknown)".into()
    };
    Err(VolumeError::UnsupportedSource {
        volume: volume_name,
        claim: name.to_owned(),
        source_kind,
    })
}

fn volume_type(volume: &Volume) -> &'static str {
    if volume.persistent_volume_claim.is_some() {
        "persistentVolumeClaim"
    } else if volume.ephemeral.is_some() {
        "ephemeral"
    } else if volume.csi.is_some() {
        "csi"
    } else if volume.nfs.is_some() {
        "nfs"
    } else if volume.image.is_some() {
        "image"
    } else {
        "(unknown)"
    }
}

fn mode_of(mode: Option<i32>) -> u32 {
    mode.and_then(|m| u32::try_from(m).ok())
        .map_or(DEFAULT_MODE, |m| m & 0o777)
}

#[derive(Clone, Copy)]
enum Kind {
    ConfigMap,
    Secret,
}

impl Kind {
    fn word(self) -> &'static str {
        match self {
            Self::ConfigMap => "configmap",
            Self::Secret => "secret",
        }
    }
}

fn object_files(
    kind: Kind,
    name: &str,
    data: Option<&ObjectData>,
    items: Option<&[KeyToPath]>,
    optional: Option<bool>,
    mode: u32,
) -> Result<Vec<File>, VolumeError> {
    let optional = optional == Some(true);
    let Some(data) = data else {
        return if optional {
            Ok(Vec::new())
        } else {
            Err(VolumeError::MissingObject {
                kind: kind.word(),
                name: name.to_owned(),
            })
        };
    };
    let Some(items) = items.filter(|i| !i.is_empty()) else {
        return data
            .iter()
            .map(|(key, value)| {
                check_path(key)?;
                Ok(File {
                    path: key.clone(),
                    content: value.clone(),
                    mode,
                })
            })
            .collect();
    };
    let mut files = Vec::new();
    for item in items {
        let Some(value) = data.get(&item.key) else {
            if optional {
                continue;
            }
            return Err(VolumeError::MissingKey {
                kind: kind.word(),
                what: match kind {
                    Kind::ConfigMap => "config",
                    Kind::Secret => "secret",
                },
                key: item.key.clone(),
            });
        };
        check_path(&item.path)?;
        files.push(File {
            path: item.path.clone(),
            content: value.clone(),
            mode: item.mode.map_or(mode, |m| mode_of(Some(m))),
        });
    }
    Ok(files)
}

/// Rejects absolute paths, empty ones and any `..` element (the API validates the same).
pub fn check_path(path: &str) -> Result<(), VolumeError> {
    let bad = path.is_empty()
        || path.starts_with('/')
        || path
            .split('/')
            .any(|part| part == ".." || part.starts_with(".."));
    if bad {
        Err(VolumeError::BadPath(path.to_owned()))
    } else {
        Ok(())
    }
}

fn downward_files(
    pod: &Pod,
    items: Option<&[DownwardAPIVolumeFile]>,
    mode: u32,
    node: &NodeResources,
) -> Result<Vec<File>, VolumeError> {
    let mut files = Vec::new();
    for item in items.unwrap_or_default() {
        check_path(&item.path)?;
        let value = if let Some(field) = &item.field_ref {
            field_value(pod, &field.field_path)?
        } else if let Some(resource) = &item.resource_field_ref {
            let container = resource.container_name.clone().unwrap_or_default();
            let spec = pod
                .spec
                .as_ref()
                .and_then(|s| s.containers.iter().find(|c| c.name == container));
            let Some(spec) = spec else {
                return Err(VolumeError::BadResource {
                    resource: resource.resource.clone(),
                    container,
                    reason: "no such container in the pod".to_owned(),
                });
            };
            let divisor = resource.divisor.as_ref().map(|q| q.0.as_str());
            resource_value(spec, &resource.resource, divisor, node).map_err(|reason| {
                VolumeError::BadResource {
                    resource: resource.resource.clone(),
                    container: container.clone(),
                    reason,
                }
            })?
        } else {
            String::new()
        };
        files.push(File {
            path: item.path.clone(),
            content: value.into_bytes(),
            mode: item.mode.map_or(mode, |m| mode_of(Some(m))),
        });
    }
    Ok(files)
}

fn field_value(pod: &Pod, path: &str) -> Result<String, VolumeError> {
    let meta = &pod.metadata;
    Ok(match path {
        "metadata.labels" => format_map(meta.labels.as_ref()),
        "metadata.annotations" => format_map(meta.annotations.as_ref()),
        _ => crate::env::metadata_field(meta, path)
            .ok_or_else(|| VolumeError::UnsupportedField(path.to_owned()))?,
    })
}

/// `key="value"` lines in key order, values quoted like Go's `%q` (the kubelet's format).
pub fn format_map(map: Option<&BTreeMap<String, String>>) -> String {
    let lines: Vec<String> = map
        .into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}={}", go_quote(v)))
        .collect();
    lines.join("\n")
}

fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn resource_value(
    container: &Container,
    resource: &str,
    divisor: Option<&str>,
    node: &NodeResources,
) -> Result<String, String> {
    let resources = container.resources.as_ref();
    let (table, name) = resource
        .split_once('.')
        .ok_or_else(|| "expected limits.<name> or requests.<name>".to_owned())?;
    let set = match table {
        "limits" => resources.and_then(|r| r.limits.as_ref()),
        "requests" => resources.and_then(|r| r.requests.as_ref()),
        _ => return Err("expected limits.<name> or requests.<name>".to_owned()),
    };
    let given = set.and_then(|m| m.get(name)).map(|q| q.0.clone());
    let value = match (given, table, name) {
        (Some(v), _, _) => v,
        // An unlimited container may use the whole node, which is what the kubelet reports.
        (None, "limits", "cpu") => node.cpu.clone(),
        (None, "limits", "memory") => node.memory.clone(),
        (None, "limits", "ephemeral-storage") => node.memory.clone(),
        (None, _, "cpu" | "memory" | "ephemeral-storage") => "0".to_owned(),
        (None, _, other) => return Err(format!("unsupported resource {other:?}")),
    };
    let amount = quantity(&value).ok_or_else(|| format!("invalid quantity {value:?}"))?;
    let divisor_text = divisor.unwrap_or("1");
    let divisor = quantity(divisor_text)
        .filter(|d| *d > 0.0)
        .ok_or_else(|| format!("invalid divisor {divisor_text:?}"))?;
    // Both round up, in milli-units for CPU and whole units otherwise, as the kubelet does.
    let result = if name == "cpu" {
        ((amount * 1000.0).ceil() / (divisor * 1000.0).ceil()).ceil()
    } else {
        (amount.ceil() / divisor.ceil().max(1.0)).ceil()
    };
    Ok(format!("{result:.0}"))
}

/// The value of a Kubernetes quantity (`500m`, `2Gi`, `1e3`), or `None` if it is not one.
pub fn quantity(text: &str) -> Option<f64> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let number: f64 = number.parse().ok()?;
    let factor = match suffix {
        "" => 1.0,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        exp if exp.starts_with(['e', 'E']) => 10f64.powi(exp[1..].parse().ok()?),
        _ => return None,
    };
    Some(number * factor)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod() -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web-1", "namespace": "shop", "uid": "u-1",
                         "labels": {"app": "web", "tier": "front"},
                         "annotations": {"note": "say \"hi\"\nbye"}},
            "spec": {"containers": [{"name": "c", "image": "x",
                "resources": {"limits": {"memory": "64Mi"}, "requests": {"cpu": "250m"}}}]}
        }))
        .expect("pod")
    }

    fn volume(json: serde_json::Value) -> Volume {
        serde_json::from_value(json).expect("volume")
    }

    fn sources() -> Sources {
        let mut s = Sources::default();
        s.config_maps.insert(
            "cfg".into(),
            BTreeMap::from([
                ("a.conf".to_owned(), b"alpha".to_vec()),
                ("b.conf".to_owned(), b"beta".to_vec()),
            ]),
        );
        s.secrets.insert(
            "db".into(),
            BTreeMap::from([("password".to_owned(), b"s3cret".to_vec())]),
        );
        s.tokens.insert(
            token_key(None, None),
            Token::new("header.claims.signature".into()),
        );
        s
    }

    fn node() -> NodeResources {
        NodeResources {
            cpu: "4".into(),
            memory: "8Gi".into(),
        }
    }

    fn show(plan: Result<Plan, VolumeError>) -> String {
        match plan {
            Ok(Plan::Files(files)) => files
                .iter()
                .map(|f| {
                    format!(
                        "{} {:o} {:?}\n",
                        f.path,
                        f.mode,
                        String::from_utf8_lossy(&f.content)
                    )
                })
                .collect(),
            Ok(other) => format!("{other:?}\n"),
            Err(e) => format!("error: {e}\n"),
        }
    }

    #[test]
    fn plans_every_supported_volume_type() {
        let cases = [
            serde_json::json!({"name": "v", "configMap": {"name": "cfg"}}),
            serde_json::json!({"name": "v", "configMap": {"name": "cfg", "defaultMode": 0o400,
                "items": [{"key": "b.conf", "path": "sub/b"}, {"key": "a.conf", "path": "a", "mode": 0o755}]}}),
            serde_json::json!({"name": "v", "configMap": {"name": "nope"}}),
            serde_json::json!({"name": "v", "configMap": {"name": "nope", "optional": true}}),
            serde_json::json!({"name": "v", "configMap": {"name": "cfg", "items": [{"key": "zz", "path": "z"}]}}),
            serde_json::json!({"name": "v", "configMap": {"name": "cfg", "items": [{"key": "a.conf", "path": "../x"}]}}),
            serde_json::json!({"name": "v", "secret": {"secretName": "db"}}),
            serde_json::json!({"name": "v", "secret": {"secretName": "db", "items": [{"key": "user", "path": "u"}]}}),
            serde_json::json!({"name": "v", "secret": {"secretName": "gone"}}),
            serde_json::json!({"name": "v", "downwardAPI": {"items": [
                {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}},
                {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
                {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}},
                {"path": "app", "fieldRef": {"fieldPath": "metadata.labels['app']"}},
                {"path": "mem", "resourceFieldRef": {"containerName": "c", "resource": "limits.memory", "divisor": "1Mi"}},
                {"path": "cpu", "resourceFieldRef": {"containerName": "c", "resource": "limits.cpu"}},
                {"path": "req", "resourceFieldRef": {"containerName": "c", "resource": "requests.cpu", "divisor": "1m"}}
            ]}}),
            serde_json::json!({"name": "v", "downwardAPI": {"items": [
                {"path": "ip", "fieldRef": {"fieldPath": "status.podIP"}}]}}),
            serde_json::json!({"name": "kube-api-access-abcde", "projected": {"defaultMode": 420, "sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"name": "cfg", "items": [{"key": "a.conf", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
                {"secret": {"name": "db"}}
            ]}}),
            serde_json::json!({"name": "v", "projected": {"sources": [
                {"serviceAccountToken": {"audience": "vault", "path": "token"}}]}}),
            serde_json::json!({"name": "v", "projected": {"sources": [
                {"serviceAccountToken": {"expirationSeconds": 60, "path": "token"}}]}}),
            serde_json::json!({"name": "v", "emptyDir": {"medium": "Memory"}}),
            serde_json::json!({"name": "v", "hostPath": {"path": "/var/log", "type": "Directory"}}),
            serde_json::json!({"name": "v", "persistentVolumeClaim": {"claimName": "data"}}),
            serde_json::json!({"name": "v", "nfs": {"server": "nas", "path": "/x"}}),
        ];
        let out: String = cases
            .into_iter()
            .map(|v| show(plan(&pod(), &volume(v), &sources(), &node())))
            .collect::<Vec<_>>()
            .join("--\n");
        expect_test::expect![[r#"
            a.conf 644 "alpha"
            b.conf 644 "beta"
            --
            sub/b 400 "beta"
            a 755 "alpha"
            --
            error: configmap "nope" not found
            --
            --
            error: configmap references non-existent config key: zz
            --
            error: invalid path "../x": must be relative and may not contain '..'
            --
            password 644 "s3cret"
            --
            error: secret references non-existent secret key: user
            --
            error: secret "gone" not found
            --
            name 644 "web-1"
            labels 644 "app=\"web\"\ntier=\"front\""
            annotations 644 "note=\"say \\\"hi\\\"\\nbye\""
            app 644 "web"
            mem 644 "64"
            cpu 644 "4"
            req 644 "250"
            --
            error: unsupported fieldRef "status.podIP" in a downwardAPI volume (supported: metadata.name, metadata.namespace, metadata.uid, metadata.labels, metadata.annotations, and one label or annotation as metadata.labels['k'])
            --
            token 644 "header.claims.signature"
            ca.crt 644 "alpha"
            namespace 644 "shop"
            password 644 "s3cret"
            --
            error: no token for audience "vault": fetch it first
            --
            error: serviceAccountToken expirationSeconds 60 is below the minimum of 600
            --
            EmptyDir
            --
            HostPath { path: "/var/log", kind: "Directory" }
            --
            error: persistentvolumeclaim "data" not found
            --
            error: volume type nfs is not supported by simulated nodes (supported: configMap, secret, downwardAPI, projected, emptyDir, hostPath, persistentVolumeClaim)
        "#]]
        .assert_eq(&out);
    }

    #[test]
    fn claims_mount_their_volume_directory_or_say_why_not() {
        let claim = |phase: &str, volume: &str| -> PersistentVolumeClaim {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "data", "namespace": "shop"},
                "spec": {"volumeName": volume}, "status": {"phase": phase}}))
            .expect("claim")
        };
        let pv = |source: serde_json::Value| -> PersistentVolume {
            serde_json::from_value(
                serde_json::json!({"metadata": {"name": "pv-1"}, "spec": source}),
            )
            .expect("volume")
        };
        let host =
            serde_json::json!({"hostPath": {"path": "/vols/pv-1", "type": "DirectoryOrCreate"}});
        let cases = [
            (claim("Bound", "pv-1"), Some(pv(host.clone())), false),
            (claim("Bound", "pv-1"), Some(pv(host)), true),
            (
                claim("Bound", "pv-1"),
                Some(pv(serde_json::json!({"local": {"path": "/mnt/disk"}}))),
                false,
            ),
            (
                claim("Bound", "pv-1"),
                Some(pv(
                    serde_json::json!({"csi": {"driver": "tether.dev/remote", "volumeHandle": "h"}}),
                )),
                false,
            ),
            (claim("Bound", "pv-1"), None, false),
            (claim("Pending", ""), None, false),
        ];
        let out: String = cases
            .into_iter()
            .map(|(claim, volume, read_only)| {
                let mut sources = Sources::default();
                sources.claims.insert("data".into(), (claim, volume));
                let v = volume_of(read_only);
                format!("{}\n", show_any(plan(&pod(), &v, &sources, &node())))
            })
            .collect();
        expect_test::expect![[r#"
            Persistent { path: "/vols/pv-1", kind: "DirectoryOrCreate", read_only: false }
            Persistent { path: "/vols/pv-1", kind: "DirectoryOrCreate", read_only: true }
            Persistent { path: "/mnt/disk", kind: "Directory", read_only: false }
            error: persistentvolume "pv-1" (claim "data") has a csi (driver "tether.dev/remote") source, which simulated nodes cannot mount (supported: hostPath, local)
            error: persistentvolume "pv-1" not found
            error: PVC shop/data has non-bound phase ("Pending") or empty pvc.Spec.VolumeName ("")
        "#]]
        .assert_eq(&out);

        fn volume_of(read_only: bool) -> Volume {
            volume(
                serde_json::json!({"name": "v", "persistentVolumeClaim": {"claimName": "data", "readOnly": read_only}}),
            )
        }
        fn show_any(plan: Result<Plan, VolumeError>) -> String {
            match plan {
                Ok(plan) => format!("{plan:?}"),
                Err(e) => format!("error: {e}"),
            }
        }
        assert!(Plan::Files(Vec::new()).read_only() && !Plan::EmptyDir.read_only());
    }

    #[test]
    fn references_name_objects_and_tokens() {
        let v = volume(serde_json::json!({"name": "v", "projected": {"sources": [
            {"serviceAccountToken": {"audience": "vault", "expirationSeconds": 7200, "path": "t"}},
            {"configMap": {"name": "a"}}, {"secret": {"name": "s"}}]}}));
        let refs = references(&v);
        assert_eq!(refs.config_maps, vec!["a".to_owned()]);
        assert_eq!(refs.secrets, vec!["s".to_owned()]);
        assert_eq!(
            refs.tokens,
            vec![TokenKey {
                audience: "vault".into(),
                expiration_seconds: 7200
            }]
        );
    }

    #[test]
    fn tokens_and_file_contents_never_show_in_debug() {
        let token = Token::new("very-secret-token".into());
        assert!(!format!("{token:?}").contains("very-secret"));
        let files = plan(
            &pod(),
            &volume(serde_json::json!({"name": "v", "secret": {"secretName": "db"}})),
            &sources(),
            &node(),
        )
        .expect("plan");
        assert!(!format!("{files:?}").contains("s3cret"));
    }

    #[test]
    fn quantities() {
        assert_eq!(quantity("500m"), Some(0.5));
        assert_eq!(quantity("2Gi"), Some(2.0 * 1024.0 * 1024.0 * 1024.0));
        assert_eq!(quantity("1e3"), Some(1000.0));
        assert_eq!(quantity("12"), Some(12.0));
        assert_eq!(quantity("x"), None);
        assert_eq!(quantity("1Q"), None);
    }

    proptest::proptest! {
        #[test]
        fn planned_paths_never_escape_the_volume(key in "[a-z./]{1,12}", path in "[a-z./]{1,12}") {
            let mut s = sources();
            s.config_maps.insert("p".into(), BTreeMap::from([(key.clone(), b"x".to_vec())]));
            let v = volume(serde_json::json!({"name": "v", "configMap": {"name": "p",
                "items": [{"key": key, "path": path}]}}));
            if let Ok(Plan::Files(files)) = plan(&pod(), &v, &s, &node()) {
                for f in files {
                    proptest::prop_assert!(!f.path.starts_with('/'));
                    proptest::prop_assert!(!f.path.split('/').any(|p| p == ".."));
                }
            }
        }
    }
}
