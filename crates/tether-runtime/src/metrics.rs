//! Metrics every reconciler reports the same way: how many reconciles ended well or badly, why
//! the bad ones failed, and how long they took. Labels come from bounded sets the caller names
//! in code (`&'static str`), never from object names.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

/// How one reconcile ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReconcileResult {
    /// It converged (or requeued on purpose).
    Ok,
    /// It failed; `reason` is one of a fixed set the controller defines (e.g. `conflict`,
    /// `api`, `invalid-spec`).
    Error {
        /// Why, as a metric label.
        reason: &'static str,
    },
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
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

/// Reconcile counters and latency for any number of controllers. Cloning shares the series.
///
/// Registered under the registry's prefix (a daemon's registry has `tether`):
/// `reconcile_total{controller,result="ok|error"}`, `reconcile_errors_total{controller,reason}`
/// and the `reconcile_duration_seconds{controller}` histogram.
#[derive(Clone, Debug)]
pub struct ControllerMetrics {
    reconciles: Family<ResultLabels, Counter>,
    errors: Family<ErrorLabels, Counter>,
    duration: Family<ControllerLabel, Histogram>,
}

/// Upper bounds of the duration buckets: 1 ms doubling to about 16 s, which spans a cached
/// no-op and a reconcile stuck behind API retries.
fn duration_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

impl ControllerMetrics {
    /// Creates the series and registers them in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let this = Self {
            reconciles: Family::default(),
            errors: Family::default(),
            duration: Family::new_with_constructor(duration_histogram),
        };
        registry.register(
            "reconcile",
            "Reconciles by controller and result",
            this.reconciles.clone(),
        );
        registry.register(
            "reconcile_errors",
            "Failed reconciles by controller and reason",
            this.errors.clone(),
        );
        registry.register_with_unit(
            "reconcile_duration",
            "Time one reconcile took",
            Unit::Seconds,
            this.duration.clone(),
        );
        this
    }

    /// Records one reconcile of `controller`.
    pub fn observe(&self, controller: &'static str, result: ReconcileResult, duration: Duration) {
        let label = match result {
            ReconcileResult::Ok => "ok",
            ReconcileResult::Error { reason } => {
                self.errors
                    .get_or_create(&ErrorLabels { controller, reason })
                    .inc();
                "error"
            }
        };
        self.reconciles
            .get_or_create(&ResultLabels {
                controller,
                result: label,
            })
            .inc();
        self.duration
            .get_or_create(&ControllerLabel { controller })
            .observe(duration.as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(registry: &Registry) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, registry).expect("encode");
        text
    }

    #[test]
    fn results_reasons_and_durations_are_counted_per_controller() {
        let mut registry = Registry::with_prefix("tether");
        let metrics = ControllerMetrics::register(&mut registry);
        let ms = Duration::from_millis;
        let shared = metrics.clone();
        shared.observe(
            "offloading",
            ReconcileResult::Error { reason: "api" },
            Duration::from_secs(30),
        );
        metrics.observe("peering", ReconcileResult::Ok, ms(3));
        metrics.observe("peering", ReconcileResult::Ok, ms(5));
        metrics.observe(
            "peering",
            ReconcileResult::Error { reason: "conflict" },
            ms(40),
        );
        let text = render(&registry);
        for line in [
            "tether_reconcile_total{controller=\"peering\",result=\"ok\"} 2",
            "tether_reconcile_total{controller=\"peering\",result=\"error\"} 1",
            "tether_reconcile_total{controller=\"offloading\",result=\"error\"} 1",
            "tether_reconcile_errors_total{controller=\"peering\",reason=\"conflict\"} 1",
            "tether_reconcile_errors_total{controller=\"offloading\",reason=\"api\"} 1",
            "tether_reconcile_duration_seconds_count{controller=\"peering\"} 3",
            "tether_reconcile_duration_seconds_bucket{le=\"0.004\",controller=\"peering\"} 1",
            "tether_reconcile_duration_seconds_bucket{le=\"0.008\",controller=\"peering\"} 2",
            "tether_reconcile_duration_seconds_bucket{le=\"+Inf\",controller=\"offloading\"} 1",
            "tether_reconcile_duration_seconds_bucket{le=\"16.384\",controller=\"offloading\"} 0",
        ] {
            assert!(text.contains(line), "missing {line:?} in:\n{text}");
        }
        assert!(
            !text.contains("reason=\"ok\""),
            "successes add no error series:\n{text}"
        );
    }
}
