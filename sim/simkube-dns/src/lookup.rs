//! The Kubernetes DNS schema as a pure function: a question and a view of the cluster in, the
//! sections of the answer out. No sockets, no clock, no API calls, so every rule is tested
//! without a server.
//!
//! The schema follows the Kubernetes DNS specification (schema version 1.1.0) for Services,
//! plus the pod `A` records of CoreDNS's `pods insecure` mode (kubeadm's default):
//!
//! ```text
//! <zone>                                   SOA, NS ns.dns.<zone>
//! dns-version.<zone>                       TXT "1.1.0"
//! ns.dns.<zone>                            A/AAAA of the kube-system/kube-dns ClusterIPs
//! <svc>.<ns>.svc.<zone>                    A/AAAA ClusterIPs, or ready endpoints when headless,
//!                                          or CNAME <externalName>
//! <host>.<svc>.<ns>.svc.<zone>             A/AAAA of that ready endpoint (headless only)
//! _<port>._<proto>.<svc>.<ns>.svc.<zone>   SRV per named port (per ready endpoint if headless)
//! <a-b-c-d>.<ns>.pod.<zone>                A a.b.c.d
//! <d.c.b.a>.in-addr.arpa (and ip6.arpa)    PTR to the Service or endpoint name above
//! ```

use std::collections::BTreeSet;
use std::net::IpAddr;

use hickory_proto::op::{Message, Query, ResponseCode};
use hickory_proto::rr::domain::Label;
use hickory_proto::rr::rdata::{A, AAAA, CNAME, NS, PTR, SOA, SRV, TXT};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use k8s_openapi::api::core::v1::Service;

use crate::view::{ClusterView, Endpoint, undashed};

/// The version of the Kubernetes DNS schema implemented, published at `dns-version.<zone>`.
const SCHEMA_VERSION: &str = "1.1.0";

/// The Service whose ClusterIPs are the zone's name server address (`ns.dns.<zone>`).
const DNS_SERVICE: (&str, &str) = ("kube-system", "kube-dns");

/// The reverse zones whose names for cluster addresses are answered (as CoreDNS's
/// `kubernetes cluster.local in-addr.arpa ip6.arpa` does).
static REVERSE_ZONES: std::sync::LazyLock<[Name; 2]> = std::sync::LazyLock::new(|| {
    ["in-addr.arpa.", "ip6.arpa."]
        .map(|z| Name::from_ascii(z).expect("invariant: a valid constant name"))
});

/// How many CNAMEs (ExternalName Services pointing into the zone) are followed in one answer.
const MAX_CHAIN: usize = 8;

/// The authoritative zone of one cluster.
#[derive(Debug, Clone)]
pub(crate) struct Zone {
    /// Lower case, fully qualified.
    origin: Name,
    ttl: u32,
}

/// The sections of a response, before hickory encodes (and if need be truncates) them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Answer {
    pub(crate) rcode: ResponseCode,
    /// Set for every answer about a name inside the zone.
    pub(crate) authoritative: bool,
    pub(crate) answers: Vec<Record>,
    pub(crate) authority: Vec<Record>,
    pub(crate) additionals: Vec<Record>,
}

impl Answer {
    /// A bare response code, for requests that are not a question about the zone.
    pub(crate) fn code(rcode: ResponseCode) -> Self {
        Self::empty(rcode, false)
    }

    fn empty(rcode: ResponseCode, authoritative: bool) -> Self {
        Self {
            rcode,
            authoritative,
            answers: Vec::new(),
            authority: Vec::new(),
            additionals: Vec::new(),
        }
    }

    /// Makes the answer fit in `limit` bytes once encoded for `query`: first without the
    /// additional section (which RFC 2181 lets a server leave out silently), then as an empty
    /// answer with the TC bit, which sends the client to TCP. Returns whether TC is due.
    pub(crate) fn fit(&mut self, query: &Query, limit: usize) -> bool {
        let size = |a: &Self| {
            let mut message = Message::new();
            message
                .add_query(query.clone())
                .add_answers(a.answers.iter().cloned())
                .add_name_servers(a.authority.iter().cloned())
                .add_additionals(a.additionals.iter().cloned());
            message.to_vec().map_or(usize::MAX, |bytes| bytes.len())
        };
        if size(self) <= limit {
            return false;
        }
        self.additionals.clear();
        if size(self) <= limit {
            return false;
        }
        self.answers.clear();
        self.authority.clear();
        true
    }

    /// Rotates the records of each type by `n`, so successive clients that take the first
    /// address spread over a headless Service's endpoints (CoreDNS's `loadbalance`).
    pub(crate) fn rotate(&mut self, n: usize) {
        let mut start = 0;
        while start < self.answers.len() {
            let kind = self.answers[start].record_type();
            let len = self.answers[start..]
                .iter()
                .take_while(|r| r.record_type() == kind)
                .count();
            if kind != RecordType::CNAME {
                self.answers[start..start + len].rotate_left(n % len);
            }
            start += len;
        }
    }
}

/// What the schema holds at one name.
enum Node {
    /// The name does not exist (NXDOMAIN).
    Missing,
    /// The name exists with these records; none for an empty non-terminal (`svc.<zone>`).
    Records(Vec<Record>),
}

impl Zone {
    /// A zone for `domain` (`cluster.local`); the error says why it is not a usable zone.
    pub(crate) fn new(domain: &str, ttl: u32) -> Result<Self, String> {
        let mut origin = Name::from_ascii(domain)
            .map_err(|e| e.to_string())?
            .to_lowercase();
        origin.set_fqdn(true);
        if origin.is_root() {
            return Err("the root zone would swallow every name".to_owned());
        }
        // ns.dns.<zone> and hostmaster.<zone> must fit in a name too.
        if origin.len() > 255 - "ns.dns.".len() {
            return Err("the name is too long".to_owned());
        }
        Ok(Self { origin, ttl })
    }

    /// Whether the answer for `name` comes from the cluster's data (the zone itself or a
    /// reverse name), rather than being refused outright.
    pub(crate) fn covers(&self, name: &Name) -> bool {
        self.origin.zone_of(name) || REVERSE_ZONES.iter().any(|z| z.zone_of(name))
    }

    /// Answers `qname`/`qtype` from `view`; `serial` is the SOA serial of the data seen.
    pub(crate) fn lookup(
        &self,
        view: &ClusterView,
        qname: &Name,
        qtype: RecordType,
        serial: u32,
    ) -> Answer {
        let mut qname = qname.clone();
        qname.set_fqdn(true);
        if REVERSE_ZONES.iter().any(|z| z.zone_of(&qname)) {
            return self.reverse(view, &qname, qtype);
        }
        if !self.origin.zone_of(&qname) {
            // No upstream exists on the simulated networks: out-of-zone names are refused
            // rather than forwarded, so a misconfigured client fails fast.
            return Answer::empty(ResponseCode::Refused, false);
        }
        if matches!(qtype, RecordType::AXFR | RecordType::IXFR) {
            return Answer::empty(ResponseCode::Refused, true);
        }
        let mut answer = Answer::empty(ResponseCode::NoError, true);
        let mut name = qname;
        for _ in 0..MAX_CHAIN {
            let records = match self.node(view, &name, serial) {
                Node::Missing => {
                    answer.rcode = ResponseCode::NXDomain;
                    answer.authority.push(self.soa(serial));
                    return answer;
                }
                Node::Records(records) => records,
            };
            let alias = records.iter().find_map(|r| match r.data() {
                RData::CNAME(target) => Some(target.0.clone()),
                _ => None,
            });
            if let Some(target) = alias
                && !matches!(qtype, RecordType::CNAME | RecordType::ANY)
            {
                answer.answers.extend(records);
                if !self.origin.zone_of(&target) {
                    return answer; // The client resolves the target itself.
                }
                name = target;
                continue;
            }
            let before = answer.answers.len();
            answer.answers.extend(
                records
                    .into_iter()
                    .filter(|r| qtype == RecordType::ANY || r.record_type() == qtype),
            );
            if answer.answers.len() == before {
                answer.authority.push(self.soa(serial)); // NODATA
            }
            answer.additionals = self.additionals(view, &answer.answers, serial);
            return answer;
        }
        // An ExternalName loop inside the zone.
        Answer::empty(ResponseCode::ServFail, true)
    }

    /// `PTR` for a ClusterIP (the Service's name) or a ready endpoint of a headless Service
    /// (the endpoint's name), the names the forward schema answers with that address. Other
    /// reverse names are refused like any name outside the zone: there is no upstream.
    fn reverse(&self, view: &ClusterView, qname: &Name, qtype: RecordType) -> Answer {
        let ip = match qname.to_lowercase().parse_arpa_name() {
            Ok(net) if net.prefix_len() == net.max_prefix_len() => net.addr(),
            _ => return Answer::code(ResponseCode::Refused),
        };
        let mut targets = BTreeSet::new();
        for svc in view.services() {
            let (Some(namespace), Some(service)) = (
                svc.metadata.namespace.as_deref(),
                svc.metadata.name.as_deref(),
            ) else {
                continue;
            };
            if is_headless(&svc) {
                for endpoint in view.ready_endpoints(namespace, service) {
                    if endpoint.ip == ip {
                        targets.extend(self.name(&[&endpoint.label, service, namespace, "svc"]));
                    }
                }
            } else if cluster_ips(&svc).contains(&ip) {
                targets.extend(self.name(&[service, namespace, "svc"]));
            }
        }
        if targets.is_empty() {
            return Answer::code(ResponseCode::Refused);
        }
        let mut answer = Answer::empty(ResponseCode::NoError, true);
        if matches!(qtype, RecordType::PTR | RecordType::ANY) {
            answer.answers = targets
                .into_iter()
                .map(|t| Record::from_rdata(qname.clone(), self.ttl, RData::PTR(PTR(t))))
                .collect();
        }
        answer
    }

    /// Addresses of the SRV and NS targets in the answer, so clients need no second query.
    fn additionals(&self, view: &ClusterView, answers: &[Record], serial: u32) -> Vec<Record> {
        let targets: BTreeSet<Name> = answers
            .iter()
            .filter_map(|r| match r.data() {
                RData::SRV(srv) => Some(srv.target().clone()),
                RData::NS(ns) => Some(ns.0.clone()),
                _ => None,
            })
            .collect();
        let mut out = Vec::new();
        for target in targets {
            if let Node::Records(records) = self.node(view, &target, serial) {
                out.extend(
                    records
                        .into_iter()
                        .filter(|r| matches!(r.record_type(), RecordType::A | RecordType::AAAA)),
                );
            }
        }
        out
    }

    /// Every record at `name` (a name inside the zone).
    fn node(&self, view: &ClusterView, name: &Name, serial: u32) -> Node {
        let depth = usize::from(name.num_labels() - self.origin.num_labels());
        let lower = name.to_lowercase();
        let mut labels = Vec::with_capacity(depth);
        for label in lower.iter().take(depth) {
            let Ok(label) = std::str::from_utf8(label) else {
                return Node::Missing; // Kubernetes names are ASCII.
            };
            labels.push(label);
        }
        labels.reverse(); // From the zone down: ["svc", ns, service, ...].
        let records = |rdata: Vec<RData>| {
            Node::Records(
                rdata
                    .into_iter()
                    .map(|d| Record::from_rdata(name.clone(), self.ttl, d))
                    .collect(),
            )
        };
        match labels.as_slice() {
            [] => records(vec![
                RData::SOA(self.soa_data(serial)),
                RData::NS(NS(self.nameserver())),
            ]),
            ["dns-version"] => records(vec![RData::TXT(TXT::new(vec![SCHEMA_VERSION.into()]))]),
            ["dns"] | ["svc"] | ["pod"] | ["pod", _] => records(Vec::new()),
            ["dns", "ns"] => {
                let ips = view
                    .service(DNS_SERVICE.0, DNS_SERVICE.1)
                    .map(|s| cluster_ips(&s))
                    .unwrap_or_default();
                records(ips.into_iter().map(address).collect())
            }
            ["svc", namespace] if view.has_services(namespace) => records(Vec::new()),
            ["svc", namespace, service] => match view.service(namespace, service) {
                Some(svc) => records(self.service_records(view, &svc, namespace, service)),
                None => Node::Missing,
            },
            ["svc", namespace, service, proto] if proto.starts_with('_') => {
                let found = self
                    .service_ports(view, namespace, service)
                    .is_some_and(|ports| ports.iter().any(|(_, p, _)| p == &proto[1..]));
                if found {
                    records(Vec::new())
                } else {
                    Node::Missing
                }
            }
            ["svc", namespace, service, host] => {
                let ips: Vec<RData> = match view.service(namespace, service) {
                    Some(svc) if is_headless(&svc) => view
                        .ready_endpoints(namespace, service)
                        .into_iter()
                        .filter(|e| e.label == *host)
                        .map(|e| address(e.ip))
                        .collect(),
                    _ => Vec::new(),
                };
                if ips.is_empty() {
                    Node::Missing
                } else {
                    records(ips)
                }
            }
            ["svc", namespace, service, proto, port]
                if proto.starts_with('_') && port.starts_with('_') =>
            {
                let srv = self.srv_records(view, namespace, service, &proto[1..], &port[1..]);
                if srv.is_empty() {
                    Node::Missing
                } else {
                    records(srv)
                }
            }
            ["pod", _, ip] => match undashed(ip) {
                Some(ip) => records(vec![address(ip)]),
                None => Node::Missing,
            },
            _ => Node::Missing,
        }
    }

    fn service_records(
        &self,
        view: &ClusterView,
        svc: &Service,
        namespace: &str,
        service: &str,
    ) -> Vec<RData> {
        let spec = svc.spec.as_ref();
        if spec.and_then(|s| s.type_.as_deref()) == Some("ExternalName") {
            let target = spec
                .and_then(|s| s.external_name.as_deref())
                .and_then(|n| Name::from_ascii(n).ok())
                .map(|mut n| {
                    n.set_fqdn(true);
                    n
                });
            return target.map(|t| RData::CNAME(CNAME(t))).into_iter().collect();
        }
        let ips: BTreeSet<IpAddr> = if is_headless(svc) {
            view.ready_endpoints(namespace, service)
                .into_iter()
                .map(|e| e.ip)
                .collect()
        } else {
            cluster_ips(svc).into_iter().collect()
        };
        ips.into_iter().map(address).collect()
    }

    /// The named ports of a Service as (name, protocol, port); for a headless Service the
    /// union over its ready endpoints. None for a missing or ExternalName Service.
    fn service_ports(
        &self,
        view: &ClusterView,
        namespace: &str,
        service: &str,
    ) -> Option<Vec<(String, String, u16)>> {
        let svc = view.service(namespace, service)?;
        let spec = svc.spec.as_ref()?;
        if spec.type_.as_deref() == Some("ExternalName") {
            return None;
        }
        if is_headless(&svc) {
            let endpoints = view.ready_endpoints(namespace, service);
            return Some(endpoints.iter().flat_map(|e| e.ports.to_vec()).collect());
        }
        Some(
            spec.ports
                .iter()
                .flatten()
                .filter_map(|p| {
                    let name = p.name.clone().filter(|n| !n.is_empty())?;
                    let protocol = p.protocol.as_deref().unwrap_or("TCP").to_ascii_lowercase();
                    Some((name, protocol, u16::try_from(p.port).ok()?))
                })
                .collect(),
        )
    }

    fn srv_records(
        &self,
        view: &ClusterView,
        namespace: &str,
        service: &str,
        proto: &str,
        port: &str,
    ) -> Vec<RData> {
        let Some(svc) = view.service(namespace, service) else {
            return Vec::new();
        };
        let matches = |(n, p, _): &&(String, String, u16)| n == port && p == proto;
        let mut targets: BTreeSet<(Name, u16)> = BTreeSet::new();
        if is_headless(&svc) {
            for endpoint in view.ready_endpoints(namespace, service) {
                let Endpoint { label, ports, .. } = endpoint;
                for (_, _, number) in ports.iter().filter(matches) {
                    if let Some(target) = self.name(&[&label, service, namespace, "svc"]) {
                        targets.insert((target, *number));
                    }
                }
            }
        } else if let Some(ports) = self.service_ports(view, namespace, service) {
            for (_, _, number) in ports.iter().filter(matches) {
                if let Some(target) = self.name(&[service, namespace, "svc"]) {
                    targets.insert((target, *number));
                }
            }
        }
        // Equal weights summing to about 100, as CoreDNS gives them.
        let weight = u16::try_from(100 / targets.len().max(1))
            .unwrap_or(1)
            .max(1);
        targets
            .into_iter()
            .map(|(target, number)| RData::SRV(SRV::new(0, weight, number, target)))
            .collect()
    }

    /// `labels` (leftmost first) followed by the zone origin.
    fn name(&self, labels: &[&str]) -> Option<Name> {
        let labels: Result<Vec<Label>, _> = labels.iter().map(|l| Label::from_ascii(l)).collect();
        Name::from_labels(labels.ok()?)
            .ok()?
            .append_domain(&self.origin)
            .ok()
    }

    fn nameserver(&self) -> Name {
        self.name(&["ns", "dns"])
            .expect("invariant: ns.dns.<zone> fits, the zone is a valid name")
    }

    fn soa_data(&self, serial: u32) -> SOA {
        let hostmaster = self
            .name(&["hostmaster"])
            .expect("invariant: hostmaster.<zone> fits, the zone is a valid name");
        // Refresh, retry and expire matter only to secondaries, which a cluster zone has none
        // of; the values are CoreDNS's. The minimum is the negative-caching TTL.
        SOA::new(
            self.nameserver(),
            hostmaster,
            serial,
            7200,
            1800,
            86400,
            self.ttl,
        )
    }

    fn soa(&self, serial: u32) -> Record {
        Record::from_rdata(
            self.origin.clone(),
            self.ttl,
            RData::SOA(self.soa_data(serial)),
        )
    }
}

fn is_headless(svc: &Service) -> bool {
    svc.spec.as_ref().and_then(|s| s.cluster_ip.as_deref()) == Some("None")
}

/// The ClusterIPs of a Service (`clusterIPs`, else `clusterIP`), unparsable ones skipped.
fn cluster_ips(svc: &Service) -> Vec<IpAddr> {
    let Some(spec) = svc.spec.as_ref() else {
        return Vec::new();
    };
    let ips: Vec<&String> = match spec.cluster_ips.as_ref() {
        Some(ips) if !ips.is_empty() => ips.iter().collect(),
        _ => spec.cluster_ip.iter().collect(),
    };
    ips.into_iter().filter_map(|ip| ip.parse().ok()).collect()
}

fn address(ip: IpAddr) -> RData {
    match ip {
        IpAddr::V4(v4) => RData::A(A(v4)),
        IpAddr::V6(v6) => RData::AAAA(AAAA(v6)),
    }
}

#[cfg(test)]
mod tests;
