//! Prometheus metrics of the simulated API server, named after kube-apiserver's own
//! (`apiserver_request_total`, `apiserver_request_duration_seconds`,
//! `apiserver_longrunning_requests`, `apiserver_storage_objects`). Labels come from bounded
//! sets only: verbs, HTTP codes, and resources the registry serves; never object names.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::registry::Registry as Types;
use crate::store::{Store, TypeKey};

/// The content type of [`Metrics::render`] (OpenMetrics text, which Prometheus scrapes).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Labels of one served request.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// kube-apiserver's reported verb: `GET`, `LIST`, `WATCH`, `POST`, `PUT`, `PATCH`, `APPLY`,
    /// `DELETE`, `DELETECOLLECTION`, or the HTTP method of a non-resource request.
    pub verb: String,
    /// API group of a served resource; empty for core and non-resource requests.
    pub group: String,
    /// Plural resource, only when the registry serves it; empty otherwise.
    pub resource: String,
    /// Subresource the resource serves (`status`, `scale`, ...); empty otherwise.
    pub subresource: String,
    /// HTTP status code.
    pub code: String,
}

/// Labels of the latency histogram (the request labels without the code).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DurationLabels {
    verb: String,
    group: String,
    resource: String,
    subresource: String,
}

/// Labels of the per-resource gauges.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResourceLabels {
    /// `<plural>.<group>`, or the plural for the core group, as kube-apiserver labels storage.
    resource: String,
}

/// Labels of the open watch gauge.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WatchLabels {
    verb: String,
    group: String,
    resource: String,
}

/// Labels of one admission webhook call.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WebhookLabels {
    /// The webhook's name (configurations are written by administrators, so the set is small).
    name: String,
    /// `admit` (mutating) or `validating`, as kube-apiserver labels it.
    r#type: String,
    operation: String,
    /// 200 for an answer; for a failed call the status kube-apiserver gives it (400, or 503
    /// for an unusable answer).
    code: String,
    /// Whether the webhook denied the request.
    rejected: String,
}

/// The metrics of one server.
pub struct Metrics {
    registry: Registry,
    webhooks: Family<WebhookLabels, Counter>,
    requests: Family<RequestLabels, Counter>,
    durations: Family<DurationLabels, Histogram>,
    watches: Family<WatchLabels, Gauge>,
    objects: Family<ResourceLabels, Gauge>,
    resource_version: Gauge,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every metric.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "apiserver_request",
            "Requests by verb, group, resource, subresource and HTTP code",
            requests.clone(),
        );
        let durations = Family::<DurationLabels, Histogram>::new_with_constructor(
            duration_histogram as fn() -> Histogram,
        );
        registry.register(
            "apiserver_request_duration_seconds",
            "Time to the response headers, by verb, group, resource and subresource",
            durations.clone(),
        );
        let watches = Family::<WatchLabels, Gauge>::default();
        registry.register(
            "apiserver_longrunning_requests",
            "Open watches by resource",
            watches.clone(),
        );
        let objects = Family::<ResourceLabels, Gauge>::default();
        registry.register(
            "apiserver_storage_objects",
            "Stored objects per resource",
            objects.clone(),
        );
        let webhooks = Family::<WebhookLabels, Counter>::default();
        registry.register(
            "apiserver_admission_webhook_request",
            "Admission webhook calls by name, type, operation, HTTP code and rejection",
            webhooks.clone(),
        );
        let resource_version = Gauge::default();
        registry.register(
            "simkube_resource_version",
            "The cluster's current resourceVersion",
            resource_version.clone(),
        );
        Self {
            registry,
            webhooks,
            requests,
            durations,
            watches,
            objects,
            resource_version,
        }
    }

    /// Counts one admission webhook call.
    pub fn webhook_request(
        &self,
        name: &str,
        mutating: bool,
        operation: &str,
        code: u16,
        rejected: bool,
    ) {
        self.webhooks
            .get_or_create(&WebhookLabels {
                name: name.to_owned(),
                r#type: if mutating { "admit" } else { "validating" }.to_owned(),
                operation: operation.to_owned(),
                code: code.to_string(),
                rejected: rejected.to_string(),
            })
            .inc();
    }

    /// Counts one finished request and its latency.
    pub fn observe(&self, labels: RequestLabels, seconds: f64) {
        self.durations
            .get_or_create(&DurationLabels {
                verb: labels.verb.clone(),
                group: labels.group.clone(),
                resource: labels.resource.clone(),
                subresource: labels.subresource.clone(),
            })
            .observe(seconds);
        self.requests.get_or_create(&labels).inc();
    }

    /// Counts an open watch until the guard drops.
    pub fn watch_started(&self, group: &str, resource: &str) -> WatchGuard {
        let gauge = self
            .watches
            .get_or_create(&WatchLabels {
                verb: "WATCH".into(),
                group: group.into(),
                resource: resource.into(),
            })
            .clone();
        gauge.inc();
        WatchGuard(gauge)
    }

    /// The OpenMetrics text, with the storage gauges read from `store` for the types `types`
    /// serves right now (a withdrawn CRD's resource disappears).
    pub fn render(&self, store: &Store, types: &Types) -> String {
        self.objects.clear();
        for rt in types
            .types
            .iter()
            .filter(|t| t.storage && t.supports("list"))
        {
            let label = if rt.group.is_empty() {
                rt.plural.clone()
            } else {
                format!("{}.{}", rt.plural, rt.group)
            };
            let count = store.count(&TypeKey::new(&rt.group, &rt.plural));
            self.objects
                .get_or_create(&ResourceLabels { resource: label })
                .set(i64::try_from(count).unwrap_or(i64::MAX));
        }
        self.resource_version
            .set(i64::try_from(store.current_rv()).unwrap_or(i64::MAX));
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// kube-apiserver's buckets run from 5 ms to 60 s; these cover the same span.
fn duration_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 2.0, 14))
}

/// Keeps an open watch counted; dropping it (the watch ended) uncounts it.
#[derive(Debug)]
pub struct WatchGuard(Gauge);

impl Drop for WatchGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}
