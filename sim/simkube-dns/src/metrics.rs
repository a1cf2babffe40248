//! Prometheus metrics of the cluster DNS: queries by type and response code, their latency,
//! and the state of the watches that feed the answers. Labels come from bounded sets only
//! (common record types, response codes, two resources); never query names.

use hickory_proto::op::ResponseCode;
use hickory_proto::rr::RecordType;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Labels of one answered query.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueryLabels {
    /// The query type (`A`, `AAAA`, `SRV`, ...), `other` outside a fixed list.
    r#type: &'static str,
    /// The response code (`NOERROR`, `NXDOMAIN`, `REFUSED`, ...).
    rcode: &'static str,
}

/// Labels of the watch metrics.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WatchLabels {
    /// `services` or `endpointslices`.
    resource: &'static str,
}

/// The metrics of one DNS server. Cloning shares the same series, so a clone can be
/// registered while another is handed to [`serve`](crate::serve) in its
/// [`DnsConfig`](crate::DnsConfig).
#[derive(Clone)]
pub struct Metrics {
    queries: Family<QueryLabels, Counter>,
    duration: Histogram,
    watch_synced: Family<WatchLabels, Gauge>,
    watch_errors: Family<WatchLabels, Counter>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            queries: Family::default(),
            // 10 µs .. about 80 ms: answers come from memory, so anything slow is a problem.
            duration: Histogram::new(exponential_buckets(1e-5, 2.0, 14)),
            watch_synced: Family::default(),
            watch_errors: Family::default(),
        }
    }
}

impl Metrics {
    /// Registers every series under `registry` with the prefix `simkube_dns_`:
    /// `queries_total{type,rcode}`, `query_duration_seconds`, `watch_synced{resource}` (1 once
    /// the first list of that resource arrived) and `watch_errors_total{resource}`.
    pub fn register(&self, registry: &mut Registry) {
        let registry = registry.sub_registry_with_prefix("simkube_dns");
        registry.register(
            "queries",
            "DNS queries answered, by query type and response code",
            self.queries.clone(),
        );
        registry.register(
            "query_duration_seconds",
            "Time from a parsed query to its response being handed to the socket",
            self.duration.clone(),
        );
        registry.register(
            "watch_synced",
            "1 once the watch of the resource has listed it; answers wait for both watches",
            self.watch_synced.clone(),
        );
        registry.register(
            "watch_errors",
            "Errors of the watch of the resource (it retries with back-off)",
            self.watch_errors.clone(),
        );
    }

    pub(crate) fn query(&self, qtype: RecordType, rcode: ResponseCode, seconds: f64) {
        self.queries
            .get_or_create(&QueryLabels {
                r#type: type_label(qtype),
                rcode: rcode_label(rcode),
            })
            .inc();
        self.duration.observe(seconds);
    }

    pub(crate) fn watch_synced(&self, resource: &'static str) {
        self.watch_synced
            .get_or_create(&WatchLabels { resource })
            .set(1);
    }

    pub(crate) fn watch_error(&self, resource: &'static str) {
        self.watch_errors
            .get_or_create(&WatchLabels { resource })
            .inc();
    }
}

fn type_label(qtype: RecordType) -> &'static str {
    match qtype {
        RecordType::A => "A",
        RecordType::AAAA => "AAAA",
        RecordType::SRV => "SRV",
        RecordType::CNAME => "CNAME",
        RecordType::PTR => "PTR",
        RecordType::TXT => "TXT",
        RecordType::SOA => "SOA",
        RecordType::NS => "NS",
        RecordType::MX => "MX",
        RecordType::HTTPS => "HTTPS",
        RecordType::ANY => "ANY",
        _ => "other",
    }
}

fn rcode_label(rcode: ResponseCode) -> &'static str {
    match rcode {
        ResponseCode::NoError => "NOERROR",
        ResponseCode::FormErr => "FORMERR",
        ResponseCode::ServFail => "SERVFAIL",
        ResponseCode::NXDomain => "NXDOMAIN",
        ResponseCode::NotImp => "NOTIMP",
        ResponseCode::Refused => "REFUSED",
        ResponseCode::BADVERS => "BADVERS",
        _ => "other",
    }
}
