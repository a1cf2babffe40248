//! The IO side of a pod's volumes: fetches the ConfigMaps, Secrets, ServiceAccount tokens and
//! PersistentVolumeClaims (with their volumes) they reference, writes them under `<pod dir>/volumes/<name>/` with the atomic writer, keeps
//! them current (a periodic resync, like the kubelet's), writes the pod's resolv.conf and hosts
//! files, and turns a container's `volumeMounts` into bind mounts.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, PersistentVolume, PersistentVolumeClaim, Pod, Secret, ServiceAccount,
    Volume,
};
use kube::api::PostParams;
use kube::{Api, Client};
use tokio_util::sync::CancellationToken;

use crate::prober::{EventRecorder, EventType};
use crate::process::Mount;
use crate::volumes::{self, NodeResources, Plan, Sources, Token, TokenKey};
use crate::{atomic_writer, env, pod_dns};

/// A token is renewed once this share of its lifetime has passed (the kubelet's 80 %).
const TOKEN_REFRESH_SHARE: f64 = 0.8;
/// ... or once it is this old, whatever its lifetime.
const TOKEN_MAX_AGE: Duration = Duration::from_secs(24 * 3600);
/// Where the host's resolver configuration lives.
const HOST_RESOLV_CONF: &str = "/etc/resolv.conf";

/// Node-wide settings of volumes and DNS.
#[derive(Debug, Clone)]
pub struct VolumeSettings {
    /// How often mounted API-data volumes are resynchronised.
    pub sync_period: Duration,
    /// Cluster DNS servers (empty: pods keep the host's resolv.conf).
    pub cluster_dns: Vec<IpAddr>,
    /// The cluster domain.
    pub cluster_domain: String,
    /// What the downward API reports for unlimited containers.
    pub node: NodeResources,
}

struct IssuedToken {
    token: Token,
    issued: Instant,
    lifetime: Duration,
}

impl IssuedToken {
    fn fresh(&self) -> bool {
        !token_due(self.issued.elapsed(), self.lifetime)
    }
}

/// Whether a token of `lifetime` issued `age` ago must be renewed: after 80 % of its lifetime
/// or a day, as the kubelet's token manager decides.
pub fn token_due(age: Duration, lifetime: Duration) -> bool {
    age >= lifetime.mul_f64(TOKEN_REFRESH_SHARE) || age >= TOKEN_MAX_AGE
}

#[derive(Default)]
struct State {
    /// Volumes set up so far, by name, with their source directory.
    ready: BTreeMap<String, (Plan, PathBuf)>,
    tokens: BTreeMap<TokenKey, IssuedToken>,
    etc: Option<Vec<Mount>>,
}

/// One pod's volumes.
pub(crate) struct PodVolumes {
    client: Client,
    settings: VolumeSettings,
    pod: Mutex<Arc<Pod>>,
    dir: PathBuf,
    pod_ip: IpAddr,
    state: tokio::sync::Mutex<State>,
    events: EventRecorder,
}

/// The directory of a pod's volumes: `<pod dir>/volumes`.
pub fn volumes_dir(pod_dir: &Path) -> PathBuf {
    pod_dir.join("volumes")
}

impl PodVolumes {
    /// The volumes of `pod`, kept under `pod_dir`.
    pub(crate) fn new(
        client: Client,
        settings: VolumeSettings,
        pod: Arc<Pod>,
        pod_dir: PathBuf,
        pod_ip: IpAddr,
        node: &str,
    ) -> Self {
        Self {
            events: EventRecorder::new(client.clone(), node),
            client,
            settings,
            pod: Mutex::new(pod),
            dir: pod_dir,
            pod_ip,
            state: tokio::sync::Mutex::new(State::default()),
        }
    }

    fn pod(&self) -> Arc<Pod> {
        self.pod.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn namespace(&self) -> String {
        self.pod().metadata.namespace.clone().unwrap_or_default()
    }

    /// The bind mounts of `container` (its volumes, then resolv.conf and hosts), setting up
    /// what is not yet. The error is the kubelet's event text.
    pub(crate) async fn mounts_for(
        &self,
        container: &Container,
        vars: &[(String, String)],
    ) -> Result<Vec<Mount>, String> {
        let pod = self.pod();
        let mut state = self.state.lock().await;
        let mut mounts = Vec::new();
        for mount in container.volume_mounts.iter().flatten() {
            let volume = pod
                .spec
                .as_ref()
                .and_then(|s| s.volumes.iter().flatten().find(|v| v.name == mount.name))
                .ok_or_else(|| {
                    format!(
                        "volumeMount {:?} of container {:?} names no volume of the pod",
                        mount.name, container.name
                    )
                })?;
            if !state.ready.contains_key(&volume.name) {
                let set_up = match self.set_up(&mut state, &pod, volume).await {
                    Ok(set_up) => set_up,
                    Err(e) => {
                        let message = format!(
                            "MountVolume.SetUp failed for volume {:?} : {e}",
                            volume.name
                        );
                        // The kubelet's event; repeats fold into one by the recorder.
                        self.events
                            .record(&pod, None, EventType::Warning, "FailedMount", &message)
                            .await;
                        return Err(message);
                    }
                };
                state.ready.insert(volume.name.clone(), set_up);
            }
            let (plan, root) = &state.ready[&volume.name];
            let sub = match (&mount.sub_path, &mount.sub_path_expr) {
                (Some(p), _) if !p.is_empty() => Some(p.clone()),
                (_, Some(e)) if !e.is_empty() => Some(env::expand(e, vars)),
                _ => None,
            };
            let source = match sub {
                Some(sub) => {
                    volumes::check_path(&sub)
                        .map_err(|e| format!("subPath of volumeMount {:?}: {e}", mount.name))?;
                    let path = root.join(&sub);
                    // As the kubelet does, a missing subPath of a writable volume is created.
                    if !plan.is_files() && !path.exists() {
                        std::fs::create_dir_all(&path).map_err(|e| {
                            format!("cannot create subPath {}: {e}", path.display())
                        })?;
                    }
                    path
                }
                None => root.clone(),
            };
            mounts.push(Mount {
                source,
                target: PathBuf::from(&mount.mount_path),
                // API-data volumes are always read-only, as in the kubelet; so is a claim
                // the pod mounts `readOnly`.
                read_only: mount.read_only == Some(true) || plan.read_only(),
            });
        }
        if state.etc.is_none() {
            state.etc = Some(self.write_etc(&pod)?);
        }
        for etc in state.etc.iter().flatten() {
            // A container mounting its own file there keeps it.
            if !mounts.iter().any(|m| m.target == etc.target) {
                mounts.push(etc.clone());
            }
        }
        Ok(mounts)
    }

    fn write_etc(&self, pod: &Pod) -> Result<Vec<Mount>, String> {
        let mut mounts = Vec::new();
        let host_resolv = std::fs::read_to_string(HOST_RESOLV_CONF).unwrap_or_default();
        let dns = pod_dns::ClusterDns {
            servers: &self.settings.cluster_dns,
            domain: &self.settings.cluster_domain,
            host_resolv: &host_resolv,
        };
        let files = [
            ("resolv.conf", pod_dns::resolv_conf(pod, &dns)),
            (
                "hosts",
                pod_dns::hosts_file(pod, self.pod_ip, &self.settings.cluster_domain),
            ),
        ];
        for (name, content) in files {
            let Some(content) = content else { continue };
            let path = self.dir.join(format!("etc-{name}"));
            std::fs::create_dir_all(&self.dir)
                .and_then(|()| std::fs::write(&path, content))
                .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            mounts.push(Mount {
                source: path,
                target: PathBuf::from("/etc").join(name),
                read_only: false,
            });
        }
        Ok(mounts)
    }

    async fn set_up(
        &self,
        state: &mut State,
        pod: &Pod,
        volume: &Volume,
    ) -> Result<(Plan, PathBuf), String> {
        let dir = volumes_dir(&self.dir).join(&volume.name);
        let sources = self.fetch(state, volume).await?;
        let plan =
            volumes::plan(pod, volume, &sources, &self.settings.node).map_err(|e| e.to_string())?;
        let root = match &plan {
            Plan::Files(files) => {
                atomic_writer::write(&dir, files).map_err(|e| format!("write volume: {e}"))?;
                dir
            }
            Plan::EmptyDir => {
                std::fs::create_dir_all(&dir).map_err(|e| format!("create emptyDir: {e}"))?;
                // Every user of the pod may write scratch space, as the kubelet's 0777.
                set_mode(&dir, 0o777).map_err(|e| format!("create emptyDir: {e}"))?;
                dir
            }
            Plan::HostPath { path, kind } | Plan::Persistent { path, kind, .. } => {
                check_host_path(path, kind)?;
                path.clone()
            }
        };
        Ok((plan, root))
    }

    /// ConfigMaps, Secrets and tokens `volume` needs; a missing object is left out (the plan
    /// decides whether that is fine).
    async fn fetch(&self, state: &mut State, volume: &Volume) -> Result<Sources, String> {
        let refs = volumes::references(volume);
        let namespace = self.namespace();
        let mut sources = Sources::default();
        let cms: Api<ConfigMap> = Api::namespaced(self.client.clone(), &namespace);
        for name in refs.config_maps {
            match cms.get_opt(&name).await {
                Ok(Some(cm)) => {
                    let mut data: volumes::ObjectData = cm
                        .data
                        .unwrap_or_default()
                        .into_iter()
                        .map(|(k, v)| (k, v.into_bytes()))
                        .collect();
                    for (k, v) in cm.binary_data.unwrap_or_default() {
                        data.insert(k, v.0);
                    }
                    sources.config_maps.insert(name, data);
                }
                Ok(None) => {}
                Err(e) => return Err(format!("cannot read configmap {name:?}: {e}")),
            }
        }
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &namespace);
        for name in refs.secrets {
            match secrets.get_opt(&name).await {
                Ok(Some(secret)) => {
                    let data = secret
                        .data
                        .unwrap_or_default()
                        .into_iter()
                        .map(|(k, v)| (k, v.0))
                        .collect();
                    sources.secrets.insert(name, data);
                }
                Ok(None) => {}
                Err(e) => return Err(format!("cannot read secret {name:?}: {e}")),
            }
        }
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), &namespace);
        let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
        for name in refs.claims {
            let claim = match claims.get_opt(&name).await {
                Ok(Some(claim)) => claim,
                Ok(None) => continue,
                Err(e) => return Err(format!("cannot read persistentvolumeclaim {name:?}: {e}")),
            };
            let volume_name = claim
                .spec
                .as_ref()
                .and_then(|s| s.volume_name.clone())
                .filter(|v| !v.is_empty());
            let volume = match volume_name {
                Some(v) => pvs
                    .get_opt(&v)
                    .await
                    .map_err(|e| format!("cannot read persistentvolume {v:?}: {e}"))?,
                None => None,
            };
            sources.claims.insert(name, (claim, volume));
        }
        for key in refs.tokens {
            if key.expiration_seconds < volumes::MIN_TOKEN_SECONDS {
                continue; // the plan reports it
            }
            let token = self.token(state, &key).await?;
            sources.tokens.insert(key, token);
        }
        Ok(sources)
    }

    /// A token of the pod's ServiceAccount, bound to the pod, renewed when old.
    async fn token(&self, state: &mut State, key: &TokenKey) -> Result<Token, String> {
        if let Some(issued) = state.tokens.get(key)
            && issued.fresh()
        {
            return Ok(issued.token.clone());
        }
        let pod = self.pod();
        let sa = pod
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.clone())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "default".to_owned());
        let request = TokenRequest {
            spec: TokenRequestSpec {
                audiences: if key.audience.is_empty() {
                    Vec::new()
                } else {
                    vec![key.audience.clone()]
                },
                expiration_seconds: Some(key.expiration_seconds),
                bound_object_ref: Some(
                    k8s_openapi::api::authentication::v1::BoundObjectReference {
                        api_version: Some("v1".to_owned()),
                        kind: Some("Pod".to_owned()),
                        name: pod.metadata.name.clone(),
                        uid: pod.metadata.uid.clone(),
                    },
                ),
            },
            ..TokenRequest::default()
        };
        let api: Api<ServiceAccount> = Api::namespaced(self.client.clone(), &self.namespace());
        let issued = Instant::now();
        let answer = api
            .create_token_request(&sa, &PostParams::default(), &request)
            .await
            .map_err(|e| format!("failed to fetch token: {}", api_message(&e)))?;
        let status = answer
            .status
            .ok_or_else(|| "failed to fetch token: the TokenRequest has no status".to_owned())?;
        let expires = status.expiration_timestamp.0;
        let lifetime = expires
            .duration_since(jiff::Timestamp::now())
            .unsigned_abs();
        let token = Token::new(status.token);
        state.tokens.insert(
            key.clone(),
            IssuedToken {
                token: token.clone(),
                issued,
                lifetime,
            },
        );
        tracing::debug!(
            serviceaccount = %sa,
            audience = %key.audience,
            lifetime_s = lifetime.as_secs(),
            "service account token issued"
        );
        Ok(token)
    }

    /// Rewrites every API-data volume set up so far from fresh data and the current pod (new
    /// labels and annotations), renewing tokens that are due. Failures keep the old content.
    pub(crate) async fn resync(&self) {
        let pod = self.pod();
        let mut state = self.state.lock().await;
        let names: Vec<String> = state
            .ready
            .iter()
            .filter(|(_, (plan, _))| plan.is_files())
            .map(|(name, _)| name.clone())
            .collect();
        for name in names {
            let Some(volume) = pod
                .spec
                .as_ref()
                .and_then(|s| s.volumes.iter().flatten().find(|v| v.name == name))
            else {
                continue;
            };
            let result = async {
                let sources = self.fetch(&mut state, volume).await?;
                let plan = volumes::plan(&pod, volume, &sources, &self.settings.node)
                    .map_err(|e| e.to_string())?;
                if let Plan::Files(files) = &plan {
                    let dir = volumes_dir(&self.dir).join(&name);
                    atomic_writer::write(&dir, files).map_err(|e| e.to_string())?;
                }
                Ok::<_, String>(())
            }
            .await;
            if let Err(error) = result {
                tracing::warn!(
                    pod = %pod.metadata.name.as_deref().unwrap_or_default(),
                    volume = %name,
                    %error,
                    "cannot update volume; keeping its previous content"
                );
            }
        }
    }

    /// Resyncs every `sync_period` until `stop`, taking the pod's latest version from
    /// `current` each time.
    pub(crate) async fn run(
        self: Arc<Self>,
        current: impl Fn() -> Option<Arc<Pod>>,
        stop: CancellationToken,
    ) {
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(self.settings.sync_period) => {}
            }
            if let Some(pod) = current() {
                *self.pod.lock().unwrap_or_else(|p| p.into_inner()) = pod;
            }
            self.resync().await;
        }
    }
}

/// Removes a pod's volumes and its resolv.conf and hosts files (after its containers ended,
/// so no mount namespace refers to them any more).
pub(crate) fn remove(pod_dir: &Path) -> std::io::Result<()> {
    for path in [
        volumes_dir(pod_dir),
        pod_dir.join("etc-resolv.conf"),
        pod_dir.join("etc-hosts"),
    ] {
        let result = if path.is_dir() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        match result {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    Ok(())
}

fn api_message(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) => status.message.clone(),
        other => other.to_string(),
    }
}

fn set_mode(path: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

/// The `hostPath.type` checks, creating what `...OrCreate` asks for.
fn check_host_path(path: &Path, kind: &str) -> Result<(), String> {
    use std::os::unix::fs::FileTypeExt as _;
    let meta = std::fs::metadata(path);
    let shown = path.display();
    let is =
        |check: fn(&std::fs::FileType) -> bool| meta.as_ref().is_ok_and(|m| check(&m.file_type()));
    match kind {
        "DirectoryOrCreate" if meta.is_err() => {
            std::fs::create_dir_all(path).map_err(|e| format!("cannot create {shown}: {e}"))?;
            set_mode(path, 0o755).map_err(|e| e.to_string())
        }
        "FileOrCreate" if meta.is_err() => {
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)
                    .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
            }
            std::fs::write(path, b"").map_err(|e| format!("cannot create {shown}: {e}"))
        }
        "Directory" | "DirectoryOrCreate" if !is(std::fs::FileType::is_dir) => Err(format!(
            "hostPath type check failed: {shown} is not a directory"
        )),
        "File" | "FileOrCreate" if !is(std::fs::FileType::is_file) => {
            Err(format!("hostPath type check failed: {shown} is not a file"))
        }
        "Socket" if !is(std::fs::FileType::is_socket) => Err(format!(
            "hostPath type check failed: {shown} is not a socket"
        )),
        "CharDevice" if !is(std::fs::FileType::is_char_device) => Err(format!(
            "hostPath type check failed: {shown} is not a character device"
        )),
        "BlockDevice" if !is(std::fs::FileType::is_block_device) => Err(format!(
            "hostPath type check failed: {shown} is not a block device"
        )),
        _ if meta.is_err() => {
            // No type: the runtime creates a missing directory, as Docker and containerd do.
            std::fs::create_dir_all(path).map_err(|e| format!("cannot create {shown}: {e}"))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_renew_at_80_percent_or_a_day() {
        let hour = Duration::from_secs(3600);
        assert!(!token_due(Duration::ZERO, hour));
        assert!(!token_due(Duration::from_secs(2879), hour));
        assert!(token_due(Duration::from_secs(2880), hour));
        let week = hour * 24 * 7;
        assert!(!token_due(hour * 23, week));
        assert!(token_due(hour * 24, week));
    }

    #[test]
    fn host_path_types_are_checked_and_created() {
        let tmp = tempfile::tempdir().expect("tmp");
        let dir = tmp.path().join("d");
        assert!(check_host_path(&dir, "Directory").is_err());
        check_host_path(&dir, "DirectoryOrCreate").expect("created");
        assert!(dir.is_dir());
        let file = tmp.path().join("sub/f");
        check_host_path(&file, "FileOrCreate").expect("created");
        assert!(file.is_file());
        assert_eq!(
            check_host_path(&dir, "File").expect_err("a directory"),
            format!(
                "hostPath type check failed: {} is not a file",
                dir.display()
            )
        );
        assert!(check_host_path(&file, "Socket").is_err());
        check_host_path(&file, "").expect("no check");
    }
}
