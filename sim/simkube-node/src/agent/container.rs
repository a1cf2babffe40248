//! One supervisor per container: starting it (image, env, volumes), its prober, restarts
//! with the kubelet's back-off, and its log files.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, Secret};
use kube::Api;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::containers::{ContainerKey, Containers, RunningContainer};
use crate::env::{self, Sources};
use crate::kubelet::LiveLogs;
use crate::metrics::RestartReason;
use crate::pod_status::{ContainerPhase, ContainerRecord, Termination};
use crate::pod_volumes::PodVolumes;
use crate::prober::{ContainerProber, EventRecorder, EventType, ProbeTarget, Step as ProbeStep};
use crate::process::{ContainerProcess, Exit, Launch, Mount};

use super::Ctx;
use super::pod::pod_key;

/// Which container of the pod a supervisor runs.
#[derive(Debug, Clone, Copy)]
pub(super) enum Slot {
    Init(usize),
    Main(usize),
}

pub(super) struct Supervisor {
    pub(super) ctx: Arc<Ctx>,
    pub(super) pod: Arc<Pod>,
    pub(super) slot: Slot,
    pub(super) container: Container,
    pub(super) netns: PathBuf,
    pub(super) pod_ip: IpAddr,
    pub(super) events: mpsc::Sender<(Slot, ContainerRecord)>,
    pub(super) stop: CancellationToken,
    pub(super) grace: watch::Receiver<Duration>,
    pub(super) volumes: Arc<PodVolumes>,
}

impl Supervisor {
    fn log_path(&self, restart: i32) -> Result<PathBuf, std::io::Error> {
        let path = log_file(
            &self.ctx.config.state_dir,
            &self.pod,
            &self.container.name,
            restart,
        );
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
            // The logs of this run and the previous one are kept, as by the kubelet.
            if let Err(error) = crate::container_log::prune(dir, restart - 1) {
                tracing::warn!(dir = %dir.display(), %error, "cannot remove old container logs");
            }
        }
        Ok(path)
    }

    async fn send(&self, record: &ContainerRecord) {
        let _ = self.events.send((self.slot, record.clone())).await;
    }

    /// Sleeps `delay` unless told to stop first; `true` when stopping.
    async fn pause(&self, delay: Duration) -> bool {
        tokio::select! {
            () = self.stop.cancelled() => true,
            () = tokio::time::sleep(delay) => false,
        }
    }

    async fn sources(&self) -> Result<Sources, String> {
        let namespace = self.pod.metadata.namespace.as_deref().unwrap_or_default();
        let (config_maps, secrets) = env::referenced(&self.container);
        let mut sources = Sources::default();
        let cms: Api<ConfigMap> = Api::namespaced(self.ctx.client.clone(), namespace);
        for name in config_maps {
            match cms.get_opt(&name).await {
                Ok(Some(cm)) => {
                    sources
                        .config_maps
                        .insert(name, cm.data.unwrap_or_default());
                }
                Ok(None) => {}
                Err(e) => return Err(format!("cannot read configmap {name:?}: {e}")),
            }
        }
        let api: Api<Secret> = Api::namespaced(self.ctx.client.clone(), namespace);
        for name in secrets {
            match api.get_opt(&name).await {
                Ok(Some(secret)) => {
                    let data: BTreeMap<String, String> = secret
                        .data
                        .unwrap_or_default()
                        .into_iter()
                        .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
                        .collect();
                    sources.secrets.insert(name, data);
                }
                Ok(None) => {}
                Err(e) => return Err(format!("cannot read secret {name:?}: {e}")),
            }
        }
        Ok(sources)
    }

    /// Everything needed to start the container, or the waiting reason and message.
    async fn prepare(
        &self,
    ) -> Result<(Vec<String>, Vec<(String, String)>, Vec<Mount>), (&'static str, String)> {
        let image = self.container.image.as_deref().unwrap_or("");
        let resolved = self
            .ctx
            .config
            .images
            .resolve(image)
            .map_err(|e| ("ErrImagePull", e.to_string()))?;
        let sources = self
            .sources()
            .await
            .map_err(|e| ("CreateContainerConfigError", e))?;
        let runtime = env::Runtime {
            pod_ip: self.pod_ip.to_string(),
            host_ip: self.ctx.config.identity.internal_ip.to_string(),
            api_host: self.ctx.config.pod_api_host.clone(),
            api_port: self.ctx.config.pod_api_port,
        };
        let vars = env::resolve(&self.pod, &self.container, &runtime, &sources)
            .map_err(|e| ("CreateContainerConfigError", e.to_string()))?;
        let expand = |v: &Option<Vec<String>>| {
            v.as_ref().map(|list| {
                list.iter()
                    .map(|s| env::expand(s, &vars))
                    .collect::<Vec<_>>()
            })
        };
        let argv = resolved
            .argv(
                image,
                expand(&self.container.command).as_deref(),
                expand(&self.container.args).as_deref(),
            )
            .map_err(|e| ("CreateContainerError", e.to_string()))?;
        let mounts = self
            .volumes
            .mounts_for(&self.container, &vars)
            .await
            .map_err(|e| ("CreateContainerConfigError", e))?;
        Ok((argv, vars, mounts))
    }
}

/// How one run of a container ended.
enum RunEnd {
    /// It exited, or its probe killed it, or it never started (`Err`).
    Exited(std::io::Result<Exit>),
    /// The pod stopped it: the supervisor ends.
    Stopped,
}

/// Runs a container for the life of its pod: prepares and starts it, follows it, and restarts
/// it as the pod's restart policy says, with the kubelet's back-off.
pub(super) async fn supervise(s: Supervisor) {
    let policy = s
        .pod
        .spec
        .as_ref()
        .and_then(|p| p.restart_policy.clone())
        .unwrap_or_else(|| "Always".to_owned());
    let key = format!("{}/{}", pod_key(&s.pod), s.container.name);
    let backoff = s.ctx.config.backoff;
    let image = s.container.image.clone().unwrap_or_default();
    let mut record = ContainerRecord::new(&s.container.name, &image);
    let mut crashes = 0u32;
    let mut failures = 0u32;
    let kubelet_events = EventRecorder::new(s.ctx.client.clone(), s.ctx.node());
    loop {
        let (argv, vars, mounts) = match s.prepare().await {
            Ok(ready) => ready,
            Err((reason, message)) => {
                failures = failures.saturating_add(1);
                tracing::warn!(container = %key, reason, %message, "cannot start container");
                record.phase = ContainerPhase::Waiting {
                    reason: reason.to_owned(),
                    message: Some(message),
                };
                s.send(&record).await;
                if s.pause(backoff.delay(failures)).await {
                    return;
                }
                continue;
            }
        };
        failures = 0;
        let container_id = format!(
            "simkube://{}/{}/{}",
            s.pod.metadata.uid.as_deref().unwrap_or_default(),
            s.container.name,
            record.restart_count
        );
        let started_at = Timestamp::now();
        let started = Instant::now();
        record.container_id = Some(container_id.clone());
        let launch = (argv.as_slice(), vars.as_slice(), mounts.as_slice());
        let exit = match s
            .run_once(&key, launch, started_at, &mut record, &kubelet_events)
            .await
        {
            RunEnd::Exited(exit) => exit,
            RunEnd::Stopped => return,
        };
        let (code, signal, reason) = match exit {
            Ok(e) if e.code == 0 => (0, None, "Completed"),
            Ok(e) => (e.code, e.signal, "Error"),
            Err(_) => (128, None, "StartError"),
        };
        let termination = Termination {
            exit_code: code,
            signal,
            reason: reason.to_owned(),
            started_at,
            finished_at: Timestamp::now(),
            container_id,
        };
        tracing::info!(container = %key, code, "container exited");
        let init = matches!(s.slot, Slot::Init(_));
        let restart = match policy.as_str() {
            // An init container is retried until it succeeds unless the pod never restarts.
            "Always" if init => code != 0,
            "Never" => false,
            "OnFailure" => code != 0,
            _ => true,
        };
        if !restart {
            record.phase = ContainerPhase::Terminated(termination);
            s.send(&record).await;
            if !init {
                s.stop.cancelled().await;
            }
            return;
        }
        crashes = backoff.next_crash_count(crashes, started.elapsed());
        let delay = backoff.delay(crashes);
        s.back_off(&mut record, termination, delay, &kubelet_events)
            .await;
        if s.pause(delay).await {
            return;
        }
        s.ctx.metrics.restarted(match reason {
            "Completed" => RestartReason::Completed,
            "Error" => RestartReason::Error,
            _ => RestartReason::StartError,
        });
        record.restart_count += 1;
    }
}

impl Supervisor {
    /// Starts one run of the container and follows it until it ends.
    async fn run_once(
        &self,
        key: &str,
        (argv, vars, mounts): (&[String], &[(String, String)], &[Mount]),
        started_at: Timestamp,
        record: &mut ContainerRecord,
        events: &EventRecorder,
    ) -> RunEnd {
        let working_dir = PathBuf::from(self.container.working_dir.as_deref().unwrap_or("/"));
        let log = self.log_path(record.restart_count);
        let spawned = log
            .as_ref()
            .map_err(|e| std::io::Error::new(e.kind(), e.to_string()))
            .and_then(|log| {
                self.ctx.live_logs.insert(log.clone());
                ContainerProcess::spawn(&Launch {
                    argv,
                    env: vars,
                    working_dir: &working_dir,
                    netns: &self.netns,
                    log,
                    mounts,
                })
            });
        // The log stays live for `kubectl logs -f` until the run ends, however it ends.
        let _live = log.ok().map(|path| LiveGuard {
            logs: self.ctx.live_logs.clone(),
            path,
        });
        match spawned {
            Ok(process) => {
                let running = RunningContainer {
                    pod_uid: self.pod.metadata.uid.clone().unwrap_or_default(),
                    pid: process.pid(),
                    netns: self.netns.clone(),
                    env: vars.to_vec(),
                    working_dir,
                };
                self.follow(key, process, running, started_at, record, events)
                    .await
            }
            Err(error) => {
                tracing::warn!(container = %key, %error, program = %argv[0], "cannot start container");
                RunEnd::Exited(Err(error))
            }
        }
    }

    /// Registers a running container for exec and probes, runs its prober, and waits until it
    /// exits, its probe kills it, or the pod stops it.
    async fn follow(
        &self,
        key: &str,
        mut process: ContainerProcess,
        running: RunningContainer,
        started_at: Timestamp,
        record: &mut ContainerRecord,
        events: &EventRecorder,
    ) -> RunEnd {
        tracing::info!(container = %key, pid = process.pid(), "container started");
        let _running = self.ctx.metrics.container_running();
        let registered = ContainerKey::new(
            self.pod.metadata.namespace.as_deref().unwrap_or_default(),
            self.pod.metadata.name.as_deref().unwrap_or_default(),
            &self.container.name,
        );
        self.ctx
            .containers
            .insert(registered.clone(), running.clone());
        let _registration = Registration {
            containers: self.ctx.containers.clone(),
            key: registered,
            pid: process.pid(),
        };
        record.phase = ContainerPhase::Running { started_at };
        // Init containers are not probed (as the kubelet, sidecars aside); each run of a
        // regular container gets fresh probes.
        let mut prober = matches!(self.slot, Slot::Main(_)).then(|| {
            let target = ProbeTarget {
                pod_ip: self.pod_ip,
                container: self.container.clone(),
                running,
            };
            ContainerProber::new(self.pod.clone(), target, events.clone())
        });
        record.startup_passed = prober.as_ref().is_none_or(ContainerProber::started);
        record.readiness_passed = prober.as_ref().is_none_or(ContainerProber::ready);
        self.send(record).await;
        loop {
            tokio::select! {
                exit = process.wait() => return RunEnd::Exited(exit),
                () = self.stop.cancelled() => {
                    let grace = *self.grace.borrow();
                    let exit = process.stop(grace).await;
                    tracing::info!(container = %key, ?exit, "container stopped");
                    return RunEnd::Stopped;
                }
                step = async {
                    match prober.as_mut() {
                        Some(prober) => prober.next().await,
                        None => std::future::pending().await,
                    }
                } => match step {
                    ProbeStep::Status { started, ready } => {
                        record.startup_passed = started;
                        record.readiness_passed = ready;
                        self.send(record).await;
                    }
                    ProbeStep::Kill { grace, kind } => {
                        record.readiness_passed = false;
                        self.send(record).await;
                        let exit = process.stop(grace).await;
                        tracing::info!(
                            container = %key,
                            ?exit,
                            probe = kind.lower(),
                            "container killed by its probe"
                        );
                        return RunEnd::Exited(exit);
                    }
                },
            }
        }
    }

    /// Reports the crash loop: the container waits `delay` in CrashLoopBackOff, with the
    /// kubelet's BackOff warning event.
    async fn back_off(
        &self,
        record: &mut ContainerRecord,
        termination: Termination,
        delay: Duration,
        events: &EventRecorder,
    ) {
        record.last_termination = Some(termination);
        record.phase = ContainerPhase::Waiting {
            reason: "CrashLoopBackOff".to_owned(),
            message: Some(format!(
                "back-off {} restarting failed container={} pod={}",
                format_delay(delay),
                self.container.name,
                self.pod.metadata.name.as_deref().unwrap_or_default()
            )),
        };
        self.send(record).await;
        // The kubelet's warning for a crash loop, counted per container like its others.
        let field_path = match self.slot {
            Slot::Init(_) => format!("spec.initContainers{{{}}}", self.container.name),
            Slot::Main(_) => format!("spec.containers{{{}}}", self.container.name),
        };
        let meta = &self.pod.metadata;
        let message = format!(
            "Back-off restarting failed container {} in pod {}_{}({})",
            self.container.name,
            meta.name.as_deref().unwrap_or_default(),
            meta.namespace.as_deref().unwrap_or_default(),
            meta.uid.as_deref().unwrap_or_default()
        );
        events
            .record(
                &self.pod,
                Some(field_path),
                EventType::Warning,
                "BackOff",
                &message,
            )
            .await;
    }
}

/// Removes a container run from the registry when it ends, however it ends.
struct Registration {
    containers: Containers,
    key: ContainerKey,
    pid: u32,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.containers.remove(&self.key, self.pid);
    }
}

/// Unmarks a log file as live when its container run ends, however it ends.
struct LiveGuard {
    logs: LiveLogs,
    path: PathBuf,
}

impl Drop for LiveGuard {
    fn drop(&mut self) {
        self.logs.remove(&self.path);
    }
}

fn format_delay(delay: Duration) -> String {
    let secs = delay.as_secs();
    if secs >= 60 {
        format!("{}m{}s", secs / 60, secs % 60)
    } else if secs > 0 {
        format!("{secs}s")
    } else {
        format!("{}ms", delay.as_millis())
    }
}

/// The directory of a pod's container logs: `<state>/pods/<namespace>_<name>_<uid>`.
pub fn log_dir(state_dir: &Path, pod: &Pod) -> PathBuf {
    let meta = &pod.metadata;
    state_dir.join("pods").join(format!(
        "{}_{}_{}",
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default(),
        meta.uid.as_deref().unwrap_or_default()
    ))
}

/// The log file of one container run: `<log_dir>/<container>/<restart>.log`.
pub fn log_file(state_dir: &Path, pod: &Pod, container: &str, restart: i32) -> PathBuf {
    log_dir(state_dir, pod)
        .join(container)
        .join(format!("{restart}.log"))
}
