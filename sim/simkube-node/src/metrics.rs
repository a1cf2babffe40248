//! The node agent's Prometheus metrics, served on the kubelet endpoint's `/metrics`: pods and
//! containers running, container starts and restarts, sandbox set-up time and exec sessions.
//! Other parts of the agent (the service proxy) register their own metrics in the same registry.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// The `Content-Type` of the text exposition.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Why a container was started again.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum RestartReason {
    /// It exited with code 0 (restartPolicy Always).
    Completed,
    /// It exited with a non-zero code or was killed by a signal.
    Error,
    /// Its process could not be started.
    StartError,
}

/// Labels of [`Metrics::container_restarts`].
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RestartLabels {
    /// How the previous run ended.
    pub reason: RestartReason,
}

/// Which streaming session.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum SessionKind {
    /// `kubectl exec`.
    Exec,
    /// `kubectl attach`.
    Attach,
}

/// Labels of [`Metrics::sessions`].
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SessionLabels {
    /// Exec or attach.
    pub kind: SessionKind,
}

/// The agent's metrics; cheap to share (every metric is an `Arc` inside).
#[derive(Debug, Clone)]
pub struct Metrics {
    /// Pods whose sandbox exists and whose containers run or wait to (kubelet's
    /// `kubelet_running_pods`).
    pub running_pods: Gauge,
    /// Container processes running now.
    pub running_containers: Gauge,
    /// Container processes started, restarts included.
    pub containers_started: Counter,
    /// Containers started again after their previous run ended, by how it ended.
    pub container_restarts: Family<RestartLabels, Counter>,
    /// Time to create a pod sandbox (namespace, veth, address, routes).
    pub sandbox_setup_seconds: Histogram,
    /// Exec and attach sessions opened.
    pub sessions: Family<SessionLabels, Counter>,
    /// Exec and attach sessions open now.
    pub sessions_active: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            running_pods: Gauge::default(),
            running_containers: Gauge::default(),
            containers_started: Counter::default(),
            container_restarts: Family::default(),
            // 10 ms .. ~40 s: `ip` commands take tens of milliseconds each, a loaded node seconds.
            sandbox_setup_seconds: Histogram::new(exponential_buckets(0.01, 2.0, 13)),
            sessions: Family::default(),
            sessions_active: Gauge::default(),
        }
    }
}

impl Metrics {
    /// Registers every metric under the `simkube_node` prefix.
    pub fn register(&self, registry: &mut Registry) {
        let sub = registry.sub_registry_with_prefix("simkube_node");
        sub.register(
            "running_pods",
            "Pods with a sandbox on this node",
            self.running_pods.clone(),
        );
        sub.register(
            "running_containers",
            "Container processes running on this node",
            self.running_containers.clone(),
        );
        sub.register(
            "containers_started",
            "Container processes started, restarts included",
            self.containers_started.clone(),
        );
        sub.register(
            "container_restarts",
            "Containers started again after their previous run ended, by how it ended",
            self.container_restarts.clone(),
        );
        sub.register(
            "sandbox_setup_seconds",
            "Time to create a pod sandbox",
            self.sandbox_setup_seconds.clone(),
        );
        sub.register(
            "stream_sessions",
            "Exec and attach sessions opened",
            self.sessions.clone(),
        );
        sub.register(
            "stream_sessions_active",
            "Exec and attach sessions open now",
            self.sessions_active.clone(),
        );
    }

    /// Counts a session as open until the returned guard drops.
    pub fn session(&self, kind: SessionKind) -> ActiveGuard {
        self.sessions.get_or_create(&SessionLabels { kind }).inc();
        ActiveGuard::new(self.sessions_active.clone())
    }

    /// Counts a container process as running until the returned guard drops.
    pub fn container_running(&self) -> ActiveGuard {
        self.containers_started.inc();
        ActiveGuard::new(self.running_containers.clone())
    }

    /// Counts a pod as running until the returned guard drops.
    pub fn pod_running(&self) -> ActiveGuard {
        ActiveGuard::new(self.running_pods.clone())
    }

    /// Counts a restart after a run that ended for `reason`.
    pub fn restarted(&self, reason: RestartReason) {
        self.container_restarts
            .get_or_create(&RestartLabels { reason })
            .inc();
    }
}

/// Keeps a gauge raised by one while it lives (however its owner ends).
#[derive(Debug)]
pub struct ActiveGuard(Gauge);

impl ActiveGuard {
    fn new(gauge: Gauge) -> Self {
        gauge.inc();
        Self(gauge)
    }
}

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// The OpenMetrics text of `registry`.
pub fn encode(registry: &Registry) -> String {
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, registry);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guards_count_while_alive_and_the_text_names_every_metric() {
        let metrics = Metrics::default();
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let pod = metrics.pod_running();
        let first = metrics.container_running();
        let second = metrics.container_running();
        drop(first);
        metrics.restarted(RestartReason::Error);
        let _session = metrics.session(SessionKind::Exec);
        metrics.sandbox_setup_seconds.observe(0.05);
        let text = encode(&registry);
        for line in [
            "simkube_node_running_pods 1",
            "simkube_node_running_containers 1",
            "simkube_node_containers_started_total 2",
            "simkube_node_container_restarts_total{reason=\"Error\"} 1",
            "simkube_node_sandbox_setup_seconds_count 1",
            "simkube_node_stream_sessions_total{kind=\"Exec\"} 1",
            "simkube_node_stream_sessions_active 1",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "{line:?} missing in:\n{text}"
            );
        }
        drop((pod, second));
        let text = encode(&registry);
        assert!(text.contains("simkube_node_running_pods 0\n"), "{text}");
        assert!(
            text.contains("simkube_node_running_containers 0\n"),
            "{text}"
        );
    }
}
