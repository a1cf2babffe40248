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
        };
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

    /// Records one authentication request.
    pub fn auth_request(&self, endpoint: &'static str, outcome: &'static str) {
        self.auth
            .get_or_create(&AuthLabels { endpoint, outcome })
            .inc();
    }
}
