//! One worker per pod: its sandbox, its containers' supervisors in order (init containers
//! first), its status, and the end of its life (deletion, disappearance or agent shutdown).

use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, Pod};
use kube::Api;
use kube::api::{DeleteParams, Preconditions};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::pod_status::{ContainerPhase, ContainerRecord};
use crate::pod_volumes::{self, PodVolumes, VolumeSettings};
use crate::sandbox::{self, SandboxNames};
use crate::volumes::NodeResources;

use super::container::{Slot, Supervisor, log_dir, supervise};
use super::reporter::Reporter;
use super::{Ctx, PodMsg};

/// The agent thread's own network namespace (the node's), for host-network containers; opened
/// by the thread that spawns the container, so it names the node namespace.
const OWN_NETNS: &str = "/proc/thread-self/ns/net";

pub(super) fn pod_key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

fn grace_of(pod: &Pod) -> Duration {
    let seconds = pod
        .metadata
        .deletion_grace_period_seconds
        .or_else(|| {
            pod.spec
                .as_ref()
                .and_then(|s| s.termination_grace_period_seconds)
        })
        .unwrap_or(30);
    Duration::from_secs(u64::try_from(seconds).unwrap_or(0))
}

/// How a pod worker ends.
enum Ending {
    /// The pod is being deleted: stop with its grace period, then finish the deletion.
    Deleted(Duration),
    /// The pod is gone from the API already.
    Gone,
    /// The agent is shutting down.
    Shutdown,
}

pub(super) async fn pod_worker(
    ctx: Arc<Ctx>,
    uid: String,
    mut rx: watch::Receiver<PodMsg>,
    shutdown: CancellationToken,
) {
    let PodMsg::Current(pod) = rx.borrow_and_update().clone() else {
        return;
    };
    let key = pod_key(&pod);
    let names = sandbox::names(&ctx.config.netns_prefix, &uid);
    let mut reporter = Reporter::new(&ctx, &pod);
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    let ending = if pod.metadata.deletion_timestamp.is_some() {
        Ending::Deleted(grace_of(&pod))
    } else if matches!(phase, Some("Succeeded" | "Failed")) {
        // A finished pod never runs again (an agent restart must not revive it); it only
        // waits for its deletion.
        tokio::select! {
            () = shutdown.cancelled() => Ending::Shutdown,
            end = async { loop { if let Some(end) = next_msg(&mut rx).await { break end } } } => end,
        }
    } else {
        let _running = ctx.metrics.pod_running();
        run_pod(&ctx, &uid, &pod, &names, &mut rx, &mut reporter, &shutdown).await
    };
    if let Err(error) = pod_volumes::remove(&log_dir(&ctx.config.state_dir, &pod)) {
        tracing::warn!(pod = %key, %error, "cannot remove the pod's volumes");
    }
    if let Err(error) = sandbox::remove(&names).await {
        tracing::warn!(pod = %key, %error, "cannot remove the pod sandbox");
    }
    ctx.ipam
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .release(&uid);
    if let Ending::Deleted(_) = ending {
        let pods: Api<Pod> = Api::namespaced(
            ctx.client.clone(),
            pod.metadata.namespace.as_deref().unwrap_or_default(),
        );
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        let logs = log_dir(&ctx.config.state_dir, &pod);
        if let Err(error) = std::fs::remove_dir_all(&logs)
            && error.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(pod = %key, %error, "cannot remove the pod's logs");
        }
        match pods
            .delete(pod.metadata.name.as_deref().unwrap_or_default(), &params)
            .await
        {
            Ok(_) => tracing::info!(pod = %key, "pod stopped and deleted"),
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
            Err(error) => tracing::warn!(pod = %key, %error, "cannot finish the pod's deletion"),
        }
    }
}

async fn run_pod(
    ctx: &Arc<Ctx>,
    uid: &str,
    pod: &Arc<Pod>,
    names: &SandboxNames,
    rx: &mut watch::Receiver<PodMsg>,
    reporter: &mut Reporter,
    shutdown: &CancellationToken,
) -> Ending {
    let key = pod_key(pod);
    // The sandbox first: containers need the namespace, and the env needs the pod IP.
    let (pod_ip, netns) = match network(ctx, uid, pod, names, rx, reporter, shutdown).await {
        Ok(network) => network,
        Err(end) => return end,
    };
    tracing::info!(pod = %key, %pod_ip, netns = %netns.display(), "sandbox ready");
    reporter.record.pod_ip = Some(pod_ip);
    reporter.report().await;
    let volumes = Arc::new(pod_volumes(ctx, pod, pod_ip));

    let spec = pod.spec.clone().unwrap_or_default();
    let inits = spec.init_containers.unwrap_or_default();
    let mains = spec.containers;
    let (events_tx, mut events) = mpsc::channel::<(Slot, ContainerRecord)>(64);
    let stop = CancellationToken::new();
    let (grace_tx, grace_rx) = watch::channel(ctx.config.shutdown_grace);
    let mut supervisors = JoinSet::new();
    let latest = rx.clone();
    supervisors.spawn(volumes.clone().run(
        move || match &*latest.borrow() {
            PodMsg::Current(pod) => Some(pod.clone()),
            PodMsg::Gone => None,
        },
        stop.clone(),
    ));
    let mut start = |slot: Slot, container: Container| {
        supervisors.spawn(supervise(Supervisor {
            ctx: ctx.clone(),
            pod: pod.clone(),
            slot,
            container,
            netns: netns.clone(),
            pod_ip,
            events: events_tx.clone(),
            stop: stop.clone(),
            grace: grace_rx.clone(),
            volumes: volumes.clone(),
        }));
    };
    // Init containers run one at a time, each to success, before any regular container starts.
    match inits.first() {
        Some(first) => start(Slot::Init(0), first.clone()),
        None => {
            for (index, container) in mains.iter().enumerate() {
                start(Slot::Main(index), container.clone());
            }
        }
    }
    let ending = loop {
        tokio::select! {
            () = shutdown.cancelled() => break Ending::Shutdown,
            msg = next_msg(rx) => if let Some(end) = msg { break end },
            Some((slot, record)) = events.recv() => {
                let succeeded =
                    matches!(&record.phase, ContainerPhase::Terminated(t) if t.exit_code == 0);
                let target = match slot {
                    Slot::Init(index) => reporter.record.init_containers.get_mut(index),
                    Slot::Main(index) => reporter.record.containers.get_mut(index),
                };
                if let Some(target) = target {
                    *target = record;
                }
                reporter.report().await;
                if let (Slot::Init(index), true) = (slot, succeeded) {
                    match inits.get(index + 1) {
                        Some(next) => start(Slot::Init(index + 1), next.clone()),
                        None => {
                            for (index, container) in mains.iter().enumerate() {
                                start(Slot::Main(index), container.clone());
                            }
                        }
                    }
                }
            }
        }
    };
    let grace = match ending {
        Ending::Deleted(grace) => grace,
        Ending::Gone => Duration::ZERO,
        Ending::Shutdown => ctx.config.shutdown_grace,
    };
    let _ = grace_tx.send(grace);
    stop.cancel();
    while supervisors.join_next().await.is_some() {}
    ending
}

/// The pod's address and network namespace: the node's own for host-network pods, else a new
/// sandbox.
async fn network(
    ctx: &Arc<Ctx>,
    uid: &str,
    pod: &Pod,
    names: &SandboxNames,
    rx: &mut watch::Receiver<PodMsg>,
    reporter: &mut Reporter,
    shutdown: &CancellationToken,
) -> Result<(IpAddr, PathBuf), Ending> {
    let host_network = pod
        .spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false);
    if host_network {
        // Host-network pods share the node's namespace, which is the agent's own.
        return Ok((ctx.config.identity.internal_ip, PathBuf::from(OWN_NETNS)));
    }
    let key = pod_key(pod);
    let ip = create_sandbox(ctx, uid, &key, names, rx, reporter, shutdown).await?;
    Ok((IpAddr::V4(ip), names.netns_path()))
}

/// The pod's volumes, kept under its log directory.
fn pod_volumes(ctx: &Ctx, pod: &Arc<Pod>, pod_ip: IpAddr) -> PodVolumes {
    PodVolumes::new(
        ctx.client.clone(),
        VolumeSettings {
            sync_period: ctx.config.volume_sync_period,
            cluster_dns: ctx.config.cluster_dns.clone(),
            cluster_domain: ctx.config.cluster_domain.clone(),
            node: NodeResources {
                cpu: ctx.config.identity.cpu.clone(),
                memory: ctx.config.identity.memory.clone(),
            },
        },
        pod.clone(),
        log_dir(&ctx.config.state_dir, pod),
        pod_ip,
        ctx.node(),
    )
}

/// Allocates the pod's address and creates its sandbox, retrying until it works or the pod
/// ends.
async fn create_sandbox(
    ctx: &Arc<Ctx>,
    uid: &str,
    key: &str,
    names: &SandboxNames,
    rx: &mut watch::Receiver<PodMsg>,
    reporter: &mut Reporter,
    shutdown: &CancellationToken,
) -> Result<Ipv4Addr, Ending> {
    loop {
        let allocated = ctx
            .ipam
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .allocate(uid);
        let attempt = match allocated {
            Ok(ip) => {
                let started = Instant::now();
                let created = sandbox::create(names, ip, ctx.gateway()).await;
                if created.is_ok() {
                    let seconds = started.elapsed().as_secs_f64();
                    ctx.metrics.sandbox_setup_seconds.observe(seconds);
                }
                created.map(|()| ip).map_err(|e| e.to_string())
            }
            Err(e) => Err(e.to_string()),
        };
        match attempt {
            Ok(ip) => return Ok(ip),
            Err(error) => {
                tracing::warn!(pod = %key, %error, "cannot create the pod sandbox; retrying");
                reporter.sandbox_error(&error).await;
            }
        }
        tokio::select! {
            () = shutdown.cancelled() => return Err(Ending::Shutdown),
            msg = next_msg(rx) => if let Some(end) = msg { return Err(end) },
            () = tokio::time::sleep(Duration::from_secs(2)) => {}
        }
    }
}

/// Waits for the next pod update that ends the pod's life; `None` for other updates.
async fn next_msg(rx: &mut watch::Receiver<PodMsg>) -> Option<Ending> {
    if rx.changed().await.is_err() {
        // The agent dropped the sender: it is shutting down.
        return Some(Ending::Shutdown);
    }
    match &*rx.borrow_and_update() {
        PodMsg::Gone => Some(Ending::Gone),
        PodMsg::Current(pod) if pod.metadata.deletion_timestamp.is_some() => {
            Some(Ending::Deleted(grace_of(pod)))
        }
        PodMsg::Current(_) => None,
    }
}
