//! The fabric's metrics: reconciles through the shared [`ControllerMetrics`] (controller label
//! `fabric`) and gauges of what the last successful plan holds.

use std::time::Duration;

use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tether_netplan::FabricPlan;
use tether_runtime::{ControllerMetrics, ReconcileResult};

/// The `controller` label of the fabric's reconciles.
pub const CONTROLLER: &str = "fabric";

/// Cloning shares the series.
#[derive(Clone, Debug)]
pub struct FabricMetrics {
    reconciles: ControllerMetrics,
    routes: Gauge,
    peers: Gauge,
    unreachable: Gauge,
}

impl FabricMetrics {
    /// Registers `fabric_routes`, `fabric_peers` and `fabric_unreachable_cidrs` in `registry`
    /// and reports reconciles through `reconciles`.
    pub fn register(registry: &mut Registry, reconciles: ControllerMetrics) -> Self {
        let this = Self {
            reconciles,
            routes: Gauge::default(),
            peers: Gauge::default(),
            unreachable: Gauge::default(),
        };
        registry.register(
            "fabric_routes",
            "Routes the fabric holds (through peers and unreachable)",
            this.routes.clone(),
        );
        registry.register(
            "fabric_peers",
            "Fabric peers (gateway pods on a node, nodes in a gateway pod)",
            this.peers.clone(),
        );
        registry.register(
            "fabric_unreachable_cidrs",
            "Remote CIDRs without a Ready gateway pod",
            this.unreachable.clone(),
        );
        this
    }

    /// Records one reconcile.
    pub fn observe(&self, result: ReconcileResult, duration: Duration) {
        self.reconciles.observe(CONTROLLER, result, duration);
    }

    /// Records what an applied plan holds.
    pub fn set_plan(&self, plan: &FabricPlan) {
        let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        self.routes.set(count(plan.routes.len()));
        self.peers.set(count(plan.neighbours.len()));
        self.unreachable.set(count(
            plan.routes.iter().filter(|r| r.via.is_none()).count(),
        ));
    }
}
