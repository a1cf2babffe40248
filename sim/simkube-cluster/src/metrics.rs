//! The daemon's own `/metrics` and `/healthz`, served on a second 127.0.0.1 listener in the
//! host namespace: node agent supervision and the cluster DNS. (The API server's own metrics
//! are on its listeners, as on kube-apiserver.)

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

/// The Prometheus text format's content type.
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Labels naming one node.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeLabels {
    /// The node name.
    pub node: String,
}

/// Supervision counters, shared by the node supervisors.
#[derive(Debug, Clone, Default)]
pub struct AgentMetrics {
    /// 1 while the node's agent process runs.
    pub up: Family<NodeLabels, Gauge>,
    /// 1 while the node is stopped by request (`cluster stop-node`).
    pub stopped: Family<NodeLabels, Gauge>,
    /// Times the agent exited on its own and was started again.
    pub restarts: Family<NodeLabels, Counter>,
}

impl AgentMetrics {
    /// Labels for `node`.
    pub fn labels(node: &str) -> NodeLabels {
        NodeLabels {
            node: node.to_owned(),
        }
    }

    fn register(&self, registry: &mut Registry) {
        let registry = registry.sub_registry_with_prefix("simkube_cluster_node_agent");
        registry.register("up", "1 while the node agent process runs", self.up.clone());
        registry.register(
            "stopped",
            "1 while the node is stopped by request",
            self.stopped.clone(),
        );
        registry.register(
            "restarts",
            "Node agent exits followed by a restart",
            self.restarts.clone(),
        );
    }
}

/// Serves `/metrics` (agents and `dns`) and `/healthz` on `listener` until `shutdown`.
pub fn serve(
    listener: std::net::TcpListener,
    agents: &AgentMetrics,
    dns: &simkube_dns::Metrics,
    shutdown: CancellationToken,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let mut registry = Registry::default();
    agents.register(&mut registry);
    dns.register(&mut registry);
    let registry = Arc::new(registry);
    listener.set_nonblocking(true)?;
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let router = axum::Router::new()
        .route(
            "/metrics",
            axum::routing::get(move || {
                let registry = registry.clone();
                async move {
                    let mut body = String::new();
                    let _ = prometheus_client::encoding::text::encode(&mut body, &registry);
                    ([(axum::http::header::CONTENT_TYPE, CONTENT_TYPE)], body)
                }
            }),
        )
        .route("/healthz", axum::routing::get(|| async { "ok" }));
    Ok(tokio::spawn(async move {
        let served = axum::serve(listener, router)
            .with_graceful_shutdown(async move { shutdown.cancelled().await })
            .await;
        if let Err(error) = served {
            tracing::warn!(%error, "the metrics endpoint failed");
        }
    }))
}
