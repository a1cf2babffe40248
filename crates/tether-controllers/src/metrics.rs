//! The controller's Prometheus metrics: reconciles per controller, peers by phase and
//! authentication requests by outcome. Labels come from bounded sets only.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tether_api::core::Phase;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReconcileLabels {
    controller: &'static str,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    controller: &'static str,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ControllerLabel {
    controller: &'static str,
}

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
    reconciles: Family<ReconcileLabels, Counter>,
    errors: Family<ErrorLabels, Counter>,
    durations: Family<ControllerLabel, Histogram>,
    peers: Family<PhaseLabel, Gauge>,
    auth: Family<AuthLabels, Counter>,
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
            reconciles: Family::default(),
            errors: Family::default(),
            durations: Family::new_with_constructor(|| {
                Histogram::new([
                    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                ])
            }),
            peers: Family::default(),
            auth: Family::default(),
        };
        registry.register(
            "reconcile",
            "Reconciles by controller and result",
            m.reconciles.clone(),
        );
        registry.register(
            "reconcile_errors",
            "Failed reconciles by controller and reason",
            m.errors.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Time spent in one reconcile, by controller",
            m.durations.clone(),
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
        let result = if error.is_some() { "error" } else { "ok" };
        self.reconciles
            .get_or_create(&ReconcileLabels { controller, result })
            .inc();
        if let Some(e) = error {
            self.errors
                .get_or_create(&ErrorLabels {
                    controller,
                    reason: e.metric_reason(),
                })
                .inc();
        }
        self.durations
            .get_or_create(&ControllerLabel { controller })
            .observe(took.as_secs_f64());
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

    /// Records one authentication request.
    pub fn auth_request(&self, endpoint: &'static str, outcome: &'static str) {
        self.auth
            .get_or_create(&AuthLabels { endpoint, outcome })
            .inc();
    }
}
