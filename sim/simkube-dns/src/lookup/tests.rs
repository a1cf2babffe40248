//! Tests of the DNS schema: one small cluster, every kind of name asked about it, and the
//! answers rendered as zone-file text.

use std::fmt::Write as _;

use expect_test::{Expect, expect};
use hickory_proto::op::{Query, ResponseCode};
use hickory_proto::rr::{Name, RecordType};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::reflector::Store;
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher;
use proptest::prelude::*;
use serde_json::{Value, json};

use super::{Answer, Zone};
use crate::view::ClusterView;

fn store<K>(objects: Vec<Value>) -> Store<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + k8s_openapi::serde::de::DeserializeOwned,
{
    let mut writer = Writer::<K>::default();
    for object in objects {
        let object: K = serde_json::from_value(object).expect("fixture object");
        writer.apply_watcher_event(&watcher::Event::Apply(object));
    }
    writer.as_reader()
}

fn service(namespace: &str, name: &str, spec: Value) -> Value {
    json!({"metadata": {"name": name, "namespace": namespace}, "spec": spec})
}

fn slice(service: &str, name: &str, ports: Value, endpoints: Value) -> Value {
    json!({
        "metadata": {"name": name, "namespace": "default",
            "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4", "ports": ports, "endpoints": endpoints,
    })
}

/// The cluster every case asks about.
fn cluster() -> ClusterView {
    let services = store::<Service>(vec![
        service(
            "kube-system",
            "kube-dns",
            json!({"clusterIP": "10.96.0.10"}),
        ),
        service(
            "default",
            "web",
            json!({"clusterIP": "10.96.0.20", "ports": [
                {"name": "http", "port": 80, "protocol": "TCP"},
                {"name": "dns", "port": 53, "protocol": "UDP"},
                {"port": 9000},
            ]}),
        ),
        service("other", "web", json!({"clusterIP": "10.96.0.40"})),
        service("default", "db", json!({"clusterIP": "None"})),
        service("default", "empty", json!({"clusterIP": "None"})),
        service(
            "default",
            "ext",
            json!({"type": "ExternalName", "externalName": "example.com"}),
        ),
        service(
            "default",
            "alias",
            json!({"type": "ExternalName", "externalName": "web.default.svc.cluster.local"}),
        ),
        service(
            "default",
            "loop",
            json!({"type": "ExternalName", "externalName": "loop.default.svc.cluster.local"}),
        ),
        service(
            "default",
            "dual",
            json!({"clusterIP": "10.96.0.30", "clusterIPs": ["10.96.0.30", "fd00::30"]}),
        ),
    ]);
    let slices = store::<EndpointSlice>(vec![
        slice(
            "db",
            "db-a",
            json!([{"name": "pg", "port": 5432, "protocol": "TCP"}]),
            json!([
                {"addresses": ["10.244.1.5"], "hostname": "db-0", "conditions": {"ready": true}},
                // Unknown readiness counts as ready.
                {"addresses": ["10.244.2.6"], "hostname": "db-1", "conditions": {}},
                {"addresses": ["10.244.2.7"], "hostname": "db-2", "conditions": {"ready": false}},
                {"addresses": ["10.244.1.8"], "conditions": {"ready": true}},
            ]),
        ),
        // The same pod briefly in a second slice while it moves: answered once.
        slice(
            "db",
            "db-b",
            json!([{"name": "pg", "port": 5432, "protocol": "TCP"}]),
            json!([{"addresses": ["10.244.1.5"], "hostname": "db-0"}]),
        ),
        slice(
            "web",
            "web-a",
            json!([{"name": "http", "port": 8080, "protocol": "TCP"}]),
            json!([{"addresses": ["10.244.1.9"], "hostname": "web-0"}]),
        ),
    ]);
    ClusterView::new(services, slices)
}

fn render(answer: &Answer) -> String {
    let mut out = format!(
        "{}{}\n",
        answer.rcode,
        if answer.authoritative { " aa" } else { "" }
    );
    for (section, records) in [
        ("answer", &answer.answers),
        ("authority", &answer.authority),
        ("additional", &answer.additionals),
    ] {
        for record in records {
            writeln!(out, "  {section:<10} {record}").expect("write to a String");
        }
    }
    out
}

fn ask(view: &ClusterView, name: &str, qtype: RecordType) -> Answer {
    let zone = Zone::new("cluster.local", 5).expect("valid zone");
    let name = Name::from_ascii(name).expect("valid query name");
    zone.lookup(view, &name, qtype, 42)
}

fn check(questions: &[(&str, RecordType)], expect: Expect) {
    let view = cluster();
    let mut out = String::new();
    for (name, qtype) in questions {
        write!(out, "{name} {qtype}: {}", render(&ask(&view, name, *qtype))).expect("write");
    }
    expect.assert_eq(&out);
}

#[test]
fn apex_and_schema_version() {
    check(
        &[
            ("cluster.local.", RecordType::SOA),
            ("cluster.local.", RecordType::NS),
            ("cluster.local.", RecordType::A),
            ("dns-version.cluster.local.", RecordType::TXT),
            ("ns.dns.cluster.local.", RecordType::A),
            ("dns.cluster.local.", RecordType::A),
        ],
        expect![[r#"
            cluster.local. SOA: No Error aa
              answer     cluster.local. 5 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 42 7200 1800 86400 5
            cluster.local. NS: No Error aa
              answer     cluster.local. 5 IN NS ns.dns.cluster.local.
              additional ns.dns.cluster.local. 5 IN A 10.96.0.10
            cluster.local. A: No Error aa
              authority  cluster.local. 5 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 42 7200 1800 86400 5
            dns-version.cluster.local. TXT: No Error aa
              answer     dns-version.cluster.local. 5 IN TXT 1.1.0
            ns.dns.cluster.local. A: No Error aa
              answer     ns.dns.cluster.local. 5 IN A 10.96.0.10
            dns.cluster.local. A: No Error aa
              authority  cluster.local. 5 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 42 7200 1800 86400 5
        "#]],
    );
}

#[test]
fn cluster_ip_services() {
    check(
        &[
            ("web.default.svc.cluster.local.", RecordType::A),
            // Names are case-insensitive; the owner keeps the asker's spelling.
            ("WEB.Default.svc.cluster.local.", RecordType::A),
            ("web.other.svc.cluster.local.", RecordType::A),
            ("web.default.svc.cluster.local.", RecordType::AAAA),
            ("dual.default.svc.cluster.local.", RecordType::AAAA),
            ("dual.default.svc.cluster.local.", RecordType::ANY),
            // A relative name is read as fully qualified.
            ("web.default.svc.cluster.local", RecordType::A),
        ],
        expect![[r#"
            web.default.svc.cluster.local. A: No Error aa
              answer     web.default.svc.cluster.local. 5 IN A 10.96.0.20
            WEB.Default.svc.cluster.local. A: No Error aa
              answer     WEB.Default.svc.cluster.local. 5 IN A 10.96.0.20
            web.other.svc.cluster.local. A: No Error aa
              answer     web.other.svc.cluster.local. 5 IN A 10.96.0.40
            web.default.svc.cluster.local. AAAA: No Error aa
              authority  cluster.local. 5 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 42 7200 1800 86400 5
            dual.default.svc.cluster.local. AAAA: No Error aa
              answer     dual.default.svc.cluster.local. 5 IN AAAA fd00::30
            dual.default.svc.cluster.local. ANY: No Error aa
              answer     dual.default.svc.cluster.local. 5 IN A 10.96.0.30
              answer     dual.default.svc.cluster.local. 5 IN AAAA fd00::30
            web.default.svc.cluster.local A: No Error aa
              answer     web.default.svc.cluster.local. 5 IN A 10.96.0.20
        "#]],
    );
}

#[test]
fn missing_names_and_empty_non_terminals() {
    check(
        &[
            ("missing.default.svc.cluster.local.", RecordType::A),
            ("default.svc.cluster.local.", RecordType::A),
            ("nosuchns.svc.cluster.local.", RecordType::A),
            ("svc.cluster.local.", RecordType::A),
            ("a.b.web.default.svc.cluster.local.", RecordType::A),
            ("web.default.cluster.local.", RecordType::A),
        ],
        expect![[r#"
            missing.default.svc.cluster.local. A: Non-Existent Domain aa
              authority  cluster.local. 5 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 42 7200 1800 86400 5
            default.svc.cluster.local. A: No Error aa
              authority  cluster.local. 5 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 42 7200 1800 86400 5
            nosuchns.svc.cluster.local. A: Non-Existent Domain aa
              authority  cluster.local. 5 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 42 7200 1800 86400 5
            svc.cluster.local. A: No Error aa
              authority  cluster.local. 5 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 42 7200 1800 86400 5
            a.b.web.default.svc.cluster.local. A: Non-Existent Domain aa
              authority  cluster.local. 5 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 42 7200 1800 86400 5
            web.default.cluster.local. A: Non-Existent Domain aa
              authority  cluster.local. 5 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 42 7200 1800 86400 5
        "#]],
    );
}

#[test]
fn headless_services() {
    check(
        &[
            ("db.default.svc.cluster.local.", RecordType::A),
            ("db-0.db.default.svc.cluster.local.", RecordType::A),
            // Not ready: the name does not exist.
            ("db-2.db.default.svc.cluster.local.", RecordType::A),
            ("10-244-1-8.db.default.svc.cluster.local.", RecordType::A),
            ("empty.default.svc.cluster.local.", RecordType::A),
            // Endpoint names exist only under headless Services.
            ("web-0.web.default.svc.cluster.local.", RecordType::A),
        ],
        expect![[r#"
            db.default.svc.cluster.local. A: No Error aa
              answer     db.default.svc.cluster.local. 5 IN A 10.244.1.5
              answer     db.default.svc.cluster.local. 5 IN A 10.244.1.8
              answer     db.default.svc.cluster.local. 5 IN A 10.244.2.6
            db-0.db.default.svc.cluster.local. A: No Error aa
              answer     db-0.db.default.svc.cluster.local. 5 IN A 10.244.1.5
            db-2.db.default.svc.cluster.local. A: Non-Existent Domain aa
              authority  cluster.local. 5 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 42 7200 1800 86400 5
            10-244-1-8.db.default.svc.cluster.local. A: No Error aa
              answer     10-244-1-8.db.default.svc.cluster.local. 5 IN A 10.244.1.8
            empty.default.svc.cluster.local. A: No Error aa
              authority  cluster.local. 5 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 42 7200 1800 86400 5
            web-0.web.default.svc.cluster.local. A: Non-Existent Domain aa
              authority  cluster.local. 5 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 42 7200 1800 86400 5
        "#]],
    );
}

#[test]
fn srv_records() {
    check(
        &[
            ("_http._tcp.web.default.svc.cluster.local.", RecordType::SRV),
            ("_dns._udp.web.default.svc.cluster.local.", RecordType::SRV),
            ("_dns._tcp.web.default.svc.cluster.local.", RecordType::SRV),
            ("_pg._tcp.db.default.svc.cluster.local.", RecordType::SRV),
            ("_tcp.web.default.svc.cluster.local.", RecordType::A),
            ("_sctp.web.default.svc.cluster.local.", RecordType::A),
            ("_http._tcp.ext.default.svc.cluster.local.", RecordType::SRV),
        ],
        expect![[r#"
            _http._tcp.web.default.svc.cluster.local. SRV: No Error aa
              answer     _http._tcp.web.default.svc.cluster.local. 5 IN SRV 0 100 80 web.default.svc.cluster.local.
              additional web.default.svc.cluster.local. 5 IN A 10.96.0.20
            _dns._udp.web.default.svc.cluster.local. SRV: No Error aa
              answer     _dns._udp.web.default.svc.cluster.local. 5 IN SRV 0 100 53 web.default.svc.cluster.local.
              additional web.default.svc.cluster.local. 5 IN A 10.96.0.20
            _dns._tcp.web.default.svc.cluster.local. SRV: Non-Existent Domain aa
              authority  cluster.local. 5 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 42 7200 1800 86400 5
            _pg._tcp.db.default.svc.cluster.local. SRV: No Error aa
              answer     _pg._tcp.db.default.svc.cluster.local. 5 IN SRV 0 33 5432 10-244-1-8.db.default.svc.cluster.local.
              answer     _pg._tcp.db.default.svc.cluster.local. 5 IN SRV 0 33 5432 db-0.db.default.svc.cluster.local.
              answer     _pg._tcp.db.default.svc.cluster.local. 5 IN SRV 0 33 5432 db-1.db.default.svc.cluster.local.
              additional 10-244-1-8.db.default.svc.cluster.local. 5 IN A 10.244.1.8
              additional db-0.db.default.svc.cluster.local. 5 IN A 10.244.1.5
              additional db-1.db.default.svc.cluster.local. 5 IN A 10.244.2.6
            _tcp.web.default.svc.cluster.local. A: No Error aa
              authority  cluster.local. 5 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 42 7200 1800 86400 5
            _sctp.web.default.svc.cluster.local. A: Non-Existent Domain aa
              authority  cluster.local. 5 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 42 7200 1800 86400 5
            _http._tcp.ext.default.svc.cluster.local. SRV: Non-Existent Domain aa
              authority  cluster.local. 5 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 42 7200 1800 86400 5
        "#]],
    );
}

#[test]
fn external_names() {
    check(
        &[
            ("ext.default.svc.cluster.local.", RecordType::A),
            ("alias.default.svc.cluster.local.", RecordType::A),
            ("alias.default.svc.cluster.local.", RecordType::CNAME),
            ("loop.default.svc.cluster.local.", RecordType::A),
        ],
        expect![[r#"
            ext.default.svc.cluster.local. A: No Error aa
              answer     ext.default.svc.cluster.local. 5 IN CNAME example.com.
            alias.default.svc.cluster.local. A: No Error aa
              answer     alias.default.svc.cluster.local. 5 IN CNAME web.default.svc.cluster.local.
              answer     web.default.svc.cluster.local. 5 IN A 10.96.0.20
            alias.default.svc.cluster.local. CNAME: No Error aa
              answer     alias.default.svc.cluster.local. 5 IN CNAME web.default.svc.cluster.local.
            loop.default.svc.cluster.local. A: Server Failure aa
        "#]],
    );
}

#[test]
fn pods_and_outside_names() {
    check(
        &[
            ("10-244-1-5.default.pod.cluster.local.", RecordType::A),
            ("10-244-1-5.default.pod.cluster.local.", RecordType::AAAA),
            ("fd00--5.default.pod.cluster.local.", RecordType::AAAA),
            ("10-244-1-500.default.pod.cluster.local.", RecordType::A),
            ("default.pod.cluster.local.", RecordType::A),
            ("example.com.", RecordType::A),
            ("cluster.local.", RecordType::AXFR),
        ],
        expect![[r#"
            10-244-1-5.default.pod.cluster.local. A: No Error aa
              answer     10-244-1-5.default.pod.cluster.local. 5 IN A 10.244.1.5
            10-244-1-5.default.pod.cluster.local. AAAA: No Error aa
              authority  cluster.local. 5 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 42 7200 1800 86400 5
            fd00--5.default.pod.cluster.local. AAAA: No Error aa
              answer     fd00--5.default.pod.cluster.local. 5 IN AAAA fd00::5
            10-244-1-500.default.pod.cluster.local. A: Non-Existent Domain aa
              authority  cluster.local. 5 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 42 7200 1800 86400 5
            default.pod.cluster.local. A: No Error aa
              authority  cluster.local. 5 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 42 7200 1800 86400 5
            example.com. A: Query Refused
            cluster.local. AXFR: Query Refused aa
        "#]],
    );
}

#[test]
fn reverse_names() {
    check(
        &[
            ("20.0.96.10.in-addr.arpa.", RecordType::PTR),
            ("6.2.244.10.in-addr.arpa.", RecordType::PTR),
            // The ClusterIP of a dual-stack Service, in ip6.arpa.
            (
                "0.3.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.d.f.ip6.arpa.",
                RecordType::PTR,
            ),
            ("20.0.96.10.in-addr.arpa.", RecordType::A),
            // Not a cluster address, or not an address at all.
            ("1.1.1.1.in-addr.arpa.", RecordType::PTR),
            ("96.10.in-addr.arpa.", RecordType::PTR),
        ],
        expect![[r#"
            20.0.96.10.in-addr.arpa. PTR: No Error aa
              answer     20.0.96.10.in-addr.arpa. 5 IN PTR web.default.svc.cluster.local.
            6.2.244.10.in-addr.arpa. PTR: No Error aa
              answer     6.2.244.10.in-addr.arpa. 5 IN PTR db-1.db.default.svc.cluster.local.
            0.3.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.d.f.ip6.arpa. PTR: No Error aa
              answer     0.3.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.d.f.ip6.arpa. 5 IN PTR dual.default.svc.cluster.local.
            20.0.96.10.in-addr.arpa. A: No Error aa
            1.1.1.1.in-addr.arpa. PTR: Query Refused
            96.10.in-addr.arpa. PTR: Query Refused
        "#]],
    );
}

#[test]
fn rotation_spreads_first_address() {
    let view = cluster();
    let mut firsts = Vec::new();
    for n in 0..4 {
        let mut answer = ask(&view, "db.default.svc.cluster.local.", RecordType::A);
        answer.rotate(n);
        firsts.push(answer.answers[0].data().to_string());
    }
    assert_eq!(
        firsts,
        ["10.244.1.5", "10.244.1.8", "10.244.2.6", "10.244.1.5"]
    );
}

#[test]
fn answers_fit_classic_udp_by_dropping_additionals_then_truncating() {
    let view = cluster();
    let name = "_pg._tcp.db.default.svc.cluster.local.";
    let query = Query::query(Name::from_ascii(name).expect("name"), RecordType::SRV);
    let full = ask(&view, name, RecordType::SRV);

    let mut roomy = full.clone();
    assert!(!roomy.fit(&query, 512));
    assert_eq!(roomy, full, "an answer that fits is left alone");

    // Room for the SRV records but not their addresses.
    let mut tight = full.clone();
    assert!(!tight.fit(&query, 250));
    assert_eq!(tight.answers, full.answers);
    assert!(tight.additionals.is_empty());

    let mut tiny = full;
    assert!(tiny.fit(&query, 100), "TC is due");
    assert!(tiny.answers.is_empty() && tiny.authority.is_empty() && tiny.additionals.is_empty());
    assert_eq!(tiny.rcode, ResponseCode::NoError);
}

#[test]
fn invalid_zones_are_rejected() {
    assert!(Zone::new("", 5).is_err());
    assert!(Zone::new(".", 5).is_err());
    assert!(Zone::new(&"a".repeat(64), 5).is_err());
    assert!(Zone::new("Cluster.Local", 5).is_ok());
}

/// Names built from the schema's own labels and some noise, under the zone.
fn names_in_zone() -> impl Strategy<Value = String> {
    let label = prop_oneof![
        Just("svc".to_owned()),
        Just("pod".to_owned()),
        Just("default".to_owned()),
        Just("web".to_owned()),
        Just("db".to_owned()),
        Just("db-0".to_owned()),
        Just("_tcp".to_owned()),
        Just("_pg".to_owned()),
        Just("10-244-1-5".to_owned()),
        "[a-z0-9]{1,12}",
    ];
    prop::collection::vec(label, 0..6).prop_map(|labels| {
        let mut name: String = labels.iter().rev().map(|l| format!("{l}.")).collect();
        name.push_str("cluster.local.");
        name
    })
}

proptest! {
    /// Inside the zone every answer is authoritative, NXDOMAIN or NOERROR (or SERVFAIL for a
    /// CNAME loop), negative answers carry the SOA, and case does not change the answer.
    #[test]
    fn answers_inside_the_zone_are_well_formed(
        name in names_in_zone(),
        qtype in prop::sample::select(vec![RecordType::A, RecordType::AAAA, RecordType::SRV,
            RecordType::TXT, RecordType::CNAME, RecordType::ANY]),
        upper in any::<u64>(),
    ) {
        let view = cluster();
        let answer = ask(&view, &name, qtype);
        prop_assert!(answer.authoritative);
        match answer.rcode {
            ResponseCode::NXDomain => prop_assert!(answer.answers.is_empty()),
            ResponseCode::NoError if answer.answers.is_empty() => {}
            ResponseCode::NoError => prop_assert!(answer.authority.is_empty()),
            other => prop_assert!(false, "unexpected rcode {other}"),
        }
        if answer.answers.is_empty() {
            prop_assert_eq!(answer.authority.len(), 1);
            prop_assert_eq!(answer.authority[0].record_type(), RecordType::SOA);
        }
        let mixed: String = name
            .chars()
            .enumerate()
            .map(|(i, c)| if upper >> (i % 64) & 1 == 1 { c.to_ascii_uppercase() } else { c })
            .collect();
        let again = ask(&view, &mixed, qtype);
        prop_assert_eq!(again.rcode, answer.rcode);
        let data = |a: &Answer| a.answers.iter().map(|r| r.data().to_string()).collect::<Vec<_>>();
        prop_assert_eq!(data(&again), data(&answer));
    }
}
