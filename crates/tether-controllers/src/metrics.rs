//! The controller's Prometheus metrics: reconciles per controller (through tether-runtime's
//! shared families), peers by phase and authentication requests by outcome. Labels come from
//! bounded sets only.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tether_api::core::Phase;
use tether_runtime::{ControllerMetrics, ReconcileResult};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabel {
    phase: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AuthLabels {
    endpoint: &'static str,
    outcome: &'static str,
}

/// Every metric of the controller.
#[derive(Clone)]
pub struct Metrics {
    reconciles: ControllerMetrics,
    peers: Family<PhaseLabel, Gauge>,
    auth: Family<AuthLabels, Counter>,
    virtual_nodes: Gauge,
    slice_answers: Family<AnswerLabel, Counter>,
    pods_placed: Family<PlacedLabel, Counter>,
    kubelet_requests: Family<KubeletLabels, Counter>,
    reflected: Family<ReflectedLabels, Counter>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReflectedLabels {
    kind: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KubeletLabels {
    operation: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PlacedLabel {
    changed: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AnswerLabel {
    answer: &'static str,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Metrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self {
            reconciles: ControllerMetrics::register(registry),
            peers: Family::default(),
            auth: Family::default(),
            virtual_nodes: Gauge::default(),
            slice_answers: Family::default(),
            pods_placed: Family::default(),
            kubelet_requests: Family::default(),
            reflected: Family::default(),
        };
        registry.register(
            "reflected_objects",
            "Changes reflection made to copies in twin namespaces, by kind and outcome (applied, recreated, deleted, conflict, error)",
            m.reflected.clone(),
        );
        registry.register(
            "webhook_pods",
            "Pods of offloaded namespaces the admission webhook saw, by whether it changed their placement",
            m.pods_placed.clone(),
        );
        registry.register(
            "virtual_nodes",
            "Virtual nodes this controller runs",
            m.virtual_nodes.clone(),
        );
        registry.register(
            "resource_slice_answers",
            "Answers this provider gave to resource requests, by answer (Accepted or a denial reason)",
            m.slice_answers.clone(),
        );
        registry.register(
            "kubelet_requests",
            "Requests to the virtual nodes' kubelet API by operation (logs, exec, attach, portforward) and outcome",
            m.kubelet_requests.clone(),
        );
        registry.register("peers", "ForeignClusters by phase", m.peers.clone());
        registry.register(
            "auth_requests",
            "Authentication service requests by endpoint and outcome",
            m.auth.clone(),
        );
        for phase in Phase::ALL {
            m.peers
                .get_or_create(&PhaseLabel {
                    phase: phase.as_str(),
                })
                .set(0);
        }
        m
    }

    /// Records one reconcile.
    pub fn reconciled(
        &self,
        controller: &'static str,
        error: Option<&crate::Error>,
        took: Duration,
    ) {
        let result = match error {
            None => ReconcileResult::Ok,
            Some(e) => ReconcileResult::Error {
                reason: e.metric_reason(),
            },
        };
        self.reconciles.observe(controller, result, took);
    }

    /// Sets how many peers are in each phase.
    pub fn set_peers(&self, counts: &[(Phase, i64)]) {
        for phase in Phase::ALL {
            let n = counts
                .iter()
                .filter(|(p, _)| *p == phase)
                .map(|(_, n)| n)
                .sum();
            self.peers
                .get_or_create(&PhaseLabel {
                    phase: phase.as_str(),
                })
                .set(n);
        }
    }

    /// Sets how many virtual nodes run here.
    pub fn set_virtual_nodes(&self, n: usize) {
        self.virtual_nodes.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// Records one answer to a resource request; `answer` is `Accepted` or a fixed denial
    /// reason.
    pub fn slice_answered(&self, answer: &'static str) {
        self.slice_answers
            .get_or_create(&AnswerLabel { answer })
            .inc();
    }

    /// Records one pod the webhook placed (`changed`: it added a toleration or affinity).
    pub fn pod_placed(&self, changed: bool) {
        self.pods_placed
            .get_or_create(&PlacedLabel {
                changed: if changed { "true" } else { "false" },
            })
            .inc();
    }

    /// Records one request to the virtual nodes' kubelet API; `outcome` is from a fixed set.
    pub fn kubelet_request(&self, operation: &'static str, outcome: &'static str) {
        self.kubelet_requests
            .get_or_create(&KubeletLabels { operation, outcome })
            .inc();
    }

    /// Records one authentication request.
    pub fn auth_request(&self, endpoint: &'static str, outcome: &'static str) {
        self.auth
            .get_or_create(&AuthLabels { endpoint, outcome })
            .inc();
    }

    /// Records one change reflection made (or failed to make) in a twin namespace.
    pub fn reflected(&self, kind: &'static str, outcome: &'static str) {
        self.reflected
            .get_or_create(&ReflectedLabels { kind, outcome })
            .inc();
    }
}
