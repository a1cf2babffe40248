//! simkube-dns: the cluster DNS of a simulated cluster, what CoreDNS is to a real one.
//!
//! [`serve`] watches Services and EndpointSlices of every namespace through a kube client and
//! answers the Kubernetes DNS schema for the cluster domain over UDP and TCP:
//!
//! - `<svc>.<ns>.svc.<domain>`: `A`/`AAAA` with the ClusterIPs; for a headless Service
//!   (`clusterIP: None`) the addresses of its ready endpoints; for an ExternalName Service a
//!   `CNAME` to the external name (followed while it stays inside the zone).
//! - `<hostname>.<svc>.<ns>.svc.<domain>`: one ready endpoint of a headless Service, named by its
//!   hostname, or by its address with dashes (`10-244-1-5`) when it has none.
//! - `_<port>._<proto>.<svc>.<ns>.svc.<domain>`: `SRV` for each named port, targeting the
//!   Service name, or each ready endpoint of a headless Service, with the targets' addresses
//!   in the additional section.
//! - `<a-b-c-d>.<ns>.pod.<domain>`: `A` a.b.c.d, without checking that such a pod exists
//!   (CoreDNS's `pods insecure`, kubeadm's default).
//! - `<d.c.b.a>.in-addr.arpa` (and `ip6.arpa`): `PTR` to the name of the Service with that
//!   ClusterIP, or of the headless Service's ready endpoint with that address.
//! - The apex has `SOA` and `NS ns.dns.<domain>` (whose address is the `kube-system/kube-dns`
//!   ClusterIP), and `dns-version.<domain>` has `TXT "1.1.0"`.
//!
//! A name inside the zone that does not exist is `NXDOMAIN`; an existing name without records of
//! the asked type (`AAAA` of an IPv4-only Service) is `NODATA`; both carry the `SOA` so clients
//! cache the negative answer for the TTL. Names outside the zone, and reverse names of addresses
//! that are neither a ClusterIP nor an endpoint, are `REFUSED`: the simulated networks have no
//! upstream resolver to forward to, so a pod's lookup of an outside name fails at once instead
//! of timing out. Until both watches have listed once, names inside the zone are `SERVFAIL`,
//! never a premature `NXDOMAIN`. UDP answers larger than the client's EDNS payload size (512
//! bytes without EDNS) lose their additional section, then are truncated with the `TC` bit, and
//! clients retry over TCP.
//!
//! ```no_run
//! # async fn demo(client: kube::Client) -> Result<(), Box<dyn std::error::Error>> {
//! use prometheus_client::registry::Registry;
//! use simkube_dns::{DnsConfig, Metrics};
//!
//! let metrics = Metrics::default();
//! let mut registry = Registry::default();
//! metrics.register(&mut registry);
//!
//! let udp = tokio::net::UdpSocket::bind("198.18.1.1:53").await?;
//! let tcp = tokio::net::TcpListener::bind("198.18.1.1:53").await?;
//! let shutdown = tokio_util::sync::CancellationToken::new();
//! let config = DnsConfig { metrics, ..DnsConfig::default() }; // cluster.local, TTL 5 s
//! let dns = tokio::spawn(simkube_dns::serve(client, config, udp, tcp, shutdown.clone()));
//! // ... later:
//! shutdown.cancel();
//! dns.await??;
//! # Ok(())
//! # }
//! ```

mod lookup;
mod metrics;
mod server;
mod view;

pub use metrics::Metrics;

/// How a cluster DNS server answers.
#[derive(Debug, Clone)]
pub struct DnsConfig {
    /// The cluster domain, the zone the server is authoritative for (`cluster.local`).
    pub domain: String,
    /// TTL in seconds of every record, and of negative answers (the SOA minimum).
    pub ttl: u32,
    /// Where the server counts queries and watch state; register a clone before serving.
    pub metrics: Metrics,
}

impl Default for DnsConfig {
    fn default() -> Self {
        Self {
            domain: "cluster.local".to_owned(),
            ttl: 5,
            metrics: Metrics::default(),
        }
    }
}

/// Why the DNS server could not start or stopped on its own.
#[derive(Debug, thiserror::Error)]
pub enum DnsError {
    /// [`DnsConfig::domain`] is not a usable zone name.
    #[error("invalid cluster domain {domain:?}: {reason}; use a DNS name such as cluster.local")]
    InvalidDomain {
        /// The domain as configured.
        domain: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A listener failed in a way hickory does not recover from.
    #[error("the DNS listeners failed")]
    Serve(#[source] hickory_proto::ProtoError),
    /// The listeners ended although shutdown was not requested.
    #[error("the DNS listeners closed before shutdown was requested")]
    Closed,
}

/// Serves the cluster DNS on `udp` and `tcp` (both already bound, usually to the same address)
/// until `shutdown` is cancelled, answering from Services and EndpointSlices that `client`
/// watches in all namespaces. The watches retry with back-off on their own; the function returns
/// early only for an invalid configuration or failing listeners.
pub async fn serve(
    client: kube::Client,
    config: DnsConfig,
    udp: tokio::net::UdpSocket,
    tcp: tokio::net::TcpListener,
    shutdown: tokio_util::sync::CancellationToken,
) -> Result<(), DnsError> {
    server::serve(client, config, udp, tcp, shutdown).await
}
