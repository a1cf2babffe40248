//! Supervision of one node agent: started as a child in its node namespace, restarted with
//! back-off when it exits on its own, kept stopped while `cluster stop-node` asks for it.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::Error;
use crate::ops::AGENT_GRACE;
use crate::state::{ClusterRecord, StateDir, open_log, write_atomic};
use crate::topology::{self, NodePlan};

/// Back-off of a crashing agent.
const RESTART_INITIAL: Duration = Duration::from_secs(1);
const RESTART_MAX: Duration = Duration::from_secs(60);
/// An agent that ran this long before exiting restarts without back-off.
const RESTART_RESET: Duration = Duration::from_secs(60);

/// The agent's report (`simkube_node::status`) is `node-I.status.json`.
pub(crate) const STATUS_SUFFIX: &str = ".status.json";

/// Runs and restarts the agent of one node.
pub(super) struct Supervisor {
    pub(super) exe: PathBuf,
    pub(super) state: StateDir,
    pub(super) record: ClusterRecord,
    pub(super) node: NodePlan,
    pub(super) metrics: crate::metrics::AgentMetrics,
}

impl Supervisor {
    fn file(&self, suffix: &str) -> PathBuf {
        self.state.file(
            &self.record.name,
            &format!("node-{}{suffix}", self.node.number),
        )
    }

    fn stopped_by_request(&self) -> bool {
        self.file(".stopped").exists()
    }

    fn command(&self) -> tokio::process::Command {
        let plan = self.record.plan();
        let mut command = tokio::process::Command::new(&self.exe);
        command
            .arg("node")
            .arg("--netns")
            .arg(&self.node.netns)
            .arg("--netns-prefix")
            .arg(&self.node.sandbox_prefix)
            .arg("--kubeconfig")
            .arg(self.file(".kubeconfig"))
            .arg("--name")
            .arg(&self.node.name)
            .arg("--pod-cidr")
            .arg(self.node.pod_cidr.to_string())
            .arg("--internal-ip")
            .arg(self.node.ip.to_string())
            .arg("--state-dir")
            .arg(self.file(""))
            .arg("--pod-api-server")
            .arg(format!("{}:443", topology::API_SERVICE_IP))
            .arg("--cluster-dns")
            .arg(topology::DNS_SERVICE_IP.to_string())
            .arg("--cluster-domain")
            .arg(topology::CLUSTER_DOMAIN)
            .arg("--cluster-cidr")
            .arg(plan.pod_cidr.to_string())
            .arg("--service-cidr")
            .arg(self.record.service_cidr.to_string())
            .arg("--lease-duration")
            .arg(self.record.node_grace_seconds.to_string())
            .arg("--exit-with-parent")
            .arg(std::process::id().to_string())
            .arg("--status-file")
            .arg(self.file(STATUS_SUFFIX));
        for (image, program) in &self.record.images {
            command
                .arg("--image")
                .arg(format!("{image}={}", program.display()));
        }
        command
    }

    pub(super) async fn run(self, shutdown: CancellationToken) {
        let mut backoff = RESTART_INITIAL;
        let node = self.node.name.clone();
        let labels = crate::metrics::AgentMetrics::labels(&node);
        loop {
            if shutdown.is_cancelled() {
                return;
            }
            let stopped = self.stopped_by_request();
            self.metrics
                .stopped
                .get_or_create(&labels)
                .set(i64::from(stopped));
            if stopped {
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(Duration::from_millis(250)) => continue,
                }
            }
            let child = match self.spawn() {
                Ok(child) => child,
                Err(error) => {
                    tracing::error!(%node, %error, "cannot start the node agent");
                    tokio::select! {
                        () = shutdown.cancelled() => return,
                        () = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(RESTART_MAX);
                    continue;
                }
            };
            let started = Instant::now();
            self.metrics.up.get_or_create(&labels).set(1);
            let exit = self.watch(child, &shutdown).await;
            self.metrics.up.get_or_create(&labels).set(0);
            match exit {
                Exit::Shutdown => return,
                Exit::Requested => {
                    tracing::info!(%node, "node agent stopped by request; not restarting");
                    backoff = RESTART_INITIAL;
                    continue;
                }
                Exit::Crashed(status) => {
                    self.metrics.restarts.get_or_create(&labels).inc();
                    if started.elapsed() > RESTART_RESET {
                        backoff = RESTART_INITIAL;
                    }
                    tracing::warn!(%node, %status, restart_in = ?backoff, "node agent exited; restarting");
                    tokio::select! {
                        () = shutdown.cancelled() => return,
                        () = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(RESTART_MAX);
                }
            }
        }
    }

    fn spawn(&self) -> Result<tokio::process::Child, Error> {
        // A report of an earlier run must not pass for this one's.
        let _ = std::fs::remove_file(self.file(STATUS_SUFFIX));
        let (log, log_err) = open_log(&self.file(".log"))?;
        let child = self
            .command()
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .spawn()
            .map_err(Error::io(format!("starting {}", self.exe.display())))?;
        let pid = child.id().unwrap_or_default();
        write_atomic(&self.file(".pid"), format!("{pid}\n").as_bytes(), 0o644)?;
        tracing::info!(node = %self.node.name, pid, netns = %self.node.netns, "node agent started");
        Ok(child)
    }

    async fn watch(&self, mut child: tokio::process::Child, shutdown: &CancellationToken) -> Exit {
        let exit = loop {
            tokio::select! {
                status = child.wait() => {
                    let status = status.map_or_else(|e| e.to_string(), |s| s.to_string());
                    break Exit::Crashed(status);
                }
                () = shutdown.cancelled() => break Exit::Shutdown,
                () = tokio::time::sleep(Duration::from_millis(250)) => {
                    if self.stopped_by_request() {
                        break Exit::Requested;
                    }
                }
            }
        };
        if !matches!(exit, Exit::Crashed(_)) {
            stop_child(&mut child, &self.node.name).await;
        }
        let _ = std::fs::remove_file(self.file(".pid"));
        exit
    }
}

enum Exit {
    Shutdown,
    Requested,
    Crashed(String),
}

/// SIGTERM, then SIGKILL after [`AGENT_GRACE`].
async fn stop_child(child: &mut tokio::process::Child, node: &str) {
    if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
    match tokio::time::timeout(AGENT_GRACE, child.wait()).await {
        Ok(_) => tracing::info!(%node, "node agent stopped"),
        Err(_) => {
            tracing::warn!(%node, "node agent did not stop in time; killing it");
            let _ = child.kill().await;
        }
    }
}
