//! The cluster as the DNS schema sees it: Services and the ready endpoints of their
//! EndpointSlices, read from kube-runtime reflector stores.
//!
//! Reading a store takes a short read lock and never blocks on the API server, so a query costs
//! no round trip; the reflectors keep the stores current in the background.

use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::reflector::{ObjectRef, Store};

/// The label that ties an EndpointSlice to its Service.
const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// Read-only access to the Services and EndpointSlices of every namespace.
#[derive(Clone)]
pub(crate) struct ClusterView {
    services: Store<Service>,
    slices: Store<EndpointSlice>,
}

/// One address of a ready endpoint of a Service, with the name the schema gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Endpoint {
    /// The endpoint's hostname, or its address with dashes (`10-244-1-5`) when it has none,
    /// as CoreDNS names them, so every endpoint of a headless Service can be an SRV target.
    pub(crate) label: String,
    pub(crate) ip: IpAddr,
    /// The ports of the endpoint's slice: (name, lower-case protocol, port).
    pub(crate) ports: Arc<[(String, String, u16)]>,
}

impl ClusterView {
    pub(crate) fn new(services: Store<Service>, slices: Store<EndpointSlice>) -> Self {
        Self { services, slices }
    }

    pub(crate) fn service(&self, namespace: &str, name: &str) -> Option<Arc<Service>> {
        self.services.get(&ObjectRef::new(name).within(namespace))
    }

    /// Every Service; reverse lookups scan them, as there is no index by address.
    pub(crate) fn services(&self) -> Vec<Arc<Service>> {
        self.services.state()
    }

    pub(crate) fn has_services(&self, namespace: &str) -> bool {
        self.services
            .find(|s| s.metadata.namespace.as_deref() == Some(namespace))
            .is_some()
    }

    /// Every address of every ready endpoint of the Service, deduplicated (a pod moving between
    /// slices can briefly appear in two) and sorted, so answers are stable.
    pub(crate) fn ready_endpoints(&self, namespace: &str, service: &str) -> Vec<Endpoint> {
        let slices = self.slices.state_filter(|s| {
            s.metadata.namespace.as_deref() == Some(namespace)
                && s.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(SERVICE_NAME_LABEL))
                    .is_some_and(|n| n == service)
        });
        let mut out = Vec::new();
        for slice in slices {
            if slice.address_type != "IPv4" && slice.address_type != "IPv6" {
                continue; // FQDN slices carry names, not addresses.
            }
            let ports: Arc<[(String, String, u16)]> = slice
                .ports
                .iter()
                .flatten()
                .filter_map(|p| {
                    let name = p.name.clone().filter(|n| !n.is_empty())?;
                    let port = u16::try_from(p.port?).ok()?;
                    let protocol = p.protocol.as_deref().unwrap_or("TCP").to_ascii_lowercase();
                    Some((name, protocol, port))
                })
                .collect();
            for endpoint in &slice.endpoints {
                // The EndpointSlice API says an unknown readiness is to be read as ready.
                let ready = endpoint
                    .conditions
                    .as_ref()
                    .and_then(|c| c.ready)
                    .unwrap_or(true);
                if !ready {
                    continue;
                }
                for address in &endpoint.addresses {
                    let Ok(ip) = address.parse::<IpAddr>() else {
                        continue;
                    };
                    let label = match endpoint.hostname.as_deref() {
                        Some(h) if !h.is_empty() => h.to_ascii_lowercase(),
                        _ => dashed(ip),
                    };
                    out.push(Endpoint {
                        label,
                        ip,
                        ports: ports.clone(),
                    });
                }
            }
        }
        out.sort_by(|a, b| (&a.label, a.ip).cmp(&(&b.label, b.ip)));
        out.dedup_by(|a, b| a.label == b.label && a.ip == b.ip);
        out
    }
}

/// The address written with dashes, the form pod and endpoint names use.
pub(crate) fn dashed(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string().replace('.', "-"),
        IpAddr::V6(v6) => v6.to_string().replace(':', "-"),
    }
}

/// The inverse of [`dashed`]: `10-244-1-5` or `fd00--5` back to an address.
pub(crate) fn undashed(label: &str) -> Option<IpAddr> {
    label
        .replace('-', ".")
        .parse::<std::net::Ipv4Addr>()
        .map(IpAddr::V4)
        .or_else(|_| label.replace('-', ":").parse().map(IpAddr::V6))
        .ok()
}
