//! The cluster DNS served for real: a simkube cluster in process, the server bound on loopback,
//! and hickory's DNS client asking over UDP and TCP.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use hickory_client::client::{Client as DnsClient, ClientHandle as _};
use hickory_client::proto::op::ResponseCode;
use hickory_client::proto::rr::{DNSClass, Name, RData, RecordType};
use hickory_client::proto::runtime::TokioRuntimeProvider;
use hickory_client::proto::tcp::TcpClientStream;
use hickory_client::proto::udp::UdpClientStream;
use hickory_client::proto::xfer::DnsResponse;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use prometheus_client::registry::Registry;
use serde_json::{Value, json};
use simkube::ApiError;
use simkube::controllers::Controllers;
use simkube_dns::{DnsConfig, Metrics};
use tokio_util::sync::CancellationToken;

/// How long the server may take to list the cluster or see a change.
const WAIT: Duration = Duration::from_secs(10);

/// A simkube cluster with its DNS server running on loopback.
struct Fixture {
    cluster: simkube::Cluster,
    udp: SocketAddr,
    tcp: SocketAddr,
    metrics: Metrics,
    shutdown: CancellationToken,
    server: tokio::task::JoinHandle<Result<(), simkube_dns::DnsError>>,
}

impl Fixture {
    async fn start() -> Self {
        Self::with_controllers(Controllers::none()).await
    }

    async fn with_controllers(controllers: Controllers) -> Self {
        let fixture = Self::serve(start_cluster(controllers).await).await;
        // The server answers SERVFAIL until its watches listed the cluster.
        fixture
            .eventually("the first answer", "cluster.local.", RecordType::SOA, |r| {
                r.response_code() == ResponseCode::NoError
            })
            .await;
        fixture
    }

    /// Starts the DNS server of `cluster` without waiting for it to list the cluster.
    async fn serve(cluster: simkube::Cluster) -> Self {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
        let udp = tokio::net::UdpSocket::bind("127.0.0.1:0")
            .await
            .expect("bind udp");
        let tcp = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind tcp");
        let (udp_addr, tcp_addr) = (
            udp.local_addr().expect("udp addr"),
            tcp.local_addr().expect("tcp addr"),
        );
        let metrics = Metrics::default();
        let config = DnsConfig {
            metrics: metrics.clone(),
            ..DnsConfig::default()
        };
        let shutdown = CancellationToken::new();
        let server = tokio::spawn(simkube_dns::serve(
            cluster.client(),
            config,
            udp,
            tcp,
            shutdown.clone(),
        ));
        Self {
            cluster,
            udp: udp_addr,
            tcp: tcp_addr,
            metrics,
            shutdown,
            server,
        }
    }

    /// The metrics as Prometheus scrapes them.
    fn scrape(&self) -> String {
        let mut registry = Registry::default();
        self.metrics.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode metrics");
        text
    }

    async fn udp_client(&self, edns: bool) -> DnsClient {
        let stream = UdpClientStream::builder(self.udp, TokioRuntimeProvider::new()).build();
        let (mut client, background) = DnsClient::connect(stream).await.expect("udp client");
        tokio::spawn(background);
        if !edns {
            client.disable_edns();
        }
        client
    }

    async fn tcp_client(&self) -> DnsClient {
        let (stream, sender) =
            TcpClientStream::new(self.tcp, None, None, TokioRuntimeProvider::new());
        let (client, background) = DnsClient::new(stream, sender, None)
            .await
            .expect("tcp client");
        tokio::spawn(background);
        client
    }

    /// Asks over UDP (with EDNS, as stub resolvers do).
    async fn ask(&self, name: &str, qtype: RecordType) -> DnsResponse {
        ask(&mut self.udp_client(true).await, name, qtype).await
    }

    /// Asks until `done` holds for the answer, or fails the test naming `what`.
    async fn eventually(
        &self,
        what: &str,
        name: &str,
        qtype: RecordType,
        done: impl Fn(&DnsResponse) -> bool,
    ) -> DnsResponse {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let response = self.ask(name, qtype).await;
            if done(&response) {
                return response;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out after {WAIT:?} waiting for {what}; last answer: {response:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Asks for `name`'s A records until they are exactly `want`.
    async fn eventually_a(&self, what: &str, name: &str, want: &[&str]) -> DnsResponse {
        let want = ips(want);
        self.eventually(what, name, RecordType::A, |r| addresses(r) == want)
            .await
    }

    async fn stop(self) {
        self.shutdown.cancel();
        self.server
            .await
            .expect("server task")
            .expect("server stops cleanly");
        self.cluster.shutdown().await;
    }
}

/// A simulated cluster running `controllers`.
async fn start_cluster(controllers: Controllers) -> simkube::Cluster {
    simkube::Cluster::builder()
        .controllers(controllers)
        .start()
        .await
        .expect("start simkube")
}

async fn ask(client: &mut DnsClient, name: &str, qtype: RecordType) -> DnsResponse {
    let name = Name::from_ascii(name).expect("query name");
    client
        .query(name, DNSClass::IN, qtype)
        .await
        .expect("a response")
}

/// The addresses in the answer section, sorted.
fn addresses(response: &DnsResponse) -> Vec<IpAddr> {
    let mut out: Vec<IpAddr> = response
        .answers()
        .iter()
        .filter_map(|r| match r.data() {
            RData::A(a) => Some(IpAddr::V4(a.0)),
            RData::AAAA(a) => Some(IpAddr::V6(a.0)),
            _ => None,
        })
        .collect();
    out.sort();
    out
}

fn ips(list: &[&str]) -> Vec<IpAddr> {
    let mut out: Vec<IpAddr> = list
        .iter()
        .map(|ip| ip.parse().expect("test address"))
        .collect();
    out.sort();
    out
}

async fn create_service(client: &kube::Client, name: &str, spec: Value) {
    let svc: Service =
        serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).expect("service");
    Api::<Service>::default_namespaced(client.clone())
        .create(&PostParams::default(), &svc)
        .await
        .expect("create service");
}

/// An EndpointSlice of `service` with one ready endpoint per address, named `<service>-<i>`.
async fn create_slice(client: &kube::Client, service: &str, addresses: &[String]) {
    let endpoints: Vec<Value> = addresses
        .iter()
        .enumerate()
        .map(|(i, ip)| {
            json!({"addresses": [ip], "hostname": format!("{service}-{i}"),
                "conditions": {"ready": true}})
        })
        .collect();
    let slice: EndpointSlice = serde_json::from_value(json!({
        "metadata": {"name": format!("{service}-abc"),
            "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": endpoints,
    }))
    .expect("slice");
    Api::<EndpointSlice>::default_namespaced(client.clone())
        .create(&PostParams::default(), &slice)
        .await
        .expect("create slice");
}

#[tokio::test]
async fn kubernetes_service_and_zone_apex() {
    let dns = Fixture::start().await;
    let response = dns
        .ask("kubernetes.default.svc.cluster.local.", RecordType::A)
        .await;
    assert_eq!(response.response_code(), ResponseCode::NoError);
    assert!(response.authoritative());
    assert_eq!(addresses(&response), ips(&["10.96.0.1"]));

    // The search path pods use turns `kubernetes.default` into this name.
    let response = dns
        .ask("kubernetes.default.svc.cluster.local.", RecordType::AAAA)
        .await;
    assert_eq!(response.response_code(), ResponseCode::NoError, "NODATA");
    assert!(response.answers().is_empty());
    assert_eq!(response.name_servers()[0].record_type(), RecordType::SOA);

    let response = dns.ask("cluster.local.", RecordType::NS).await;
    assert_eq!(response.answers()[0].record_type(), RecordType::NS);

    let response = dns.ask("1.0.96.10.in-addr.arpa.", RecordType::PTR).await;
    let names: Vec<String> = response
        .answers()
        .iter()
        .map(|r| r.data().to_string())
        .collect();
    assert_eq!(names, ["kubernetes.default.svc.cluster.local."]);
    dns.stop().await;
}

#[tokio::test]
async fn missing_names_and_outside_names() {
    let dns = Fixture::start().await;
    let response = dns
        .ask("nothing.default.svc.cluster.local.", RecordType::A)
        .await;
    assert_eq!(response.response_code(), ResponseCode::NXDomain);
    assert!(response.authoritative());
    let soa = &response.name_servers()[0];
    assert_eq!(soa.record_type(), RecordType::SOA);
    assert_eq!(soa.ttl(), 5, "negative answers are cached for the TTL");

    let response = dns.ask("example.com.", RecordType::A).await;
    assert_eq!(response.response_code(), ResponseCode::Refused);
    assert!(response.answers().is_empty());
    dns.stop().await;
}

#[tokio::test]
async fn headless_service_and_srv_over_udp_and_tcp() {
    let dns = Fixture::start().await;
    let client = dns.cluster.client();
    create_service(
        &client,
        "db",
        json!({"clusterIP": "None", "ports": [{"name": "http", "port": 80}]}),
    )
    .await;
    create_slice(&client, "db", &["10.244.1.5".into(), "10.244.2.6".into()]).await;
    let response = dns
        .eventually_a(
            "the headless Service",
            "db.default.svc.cluster.local.",
            &["10.244.1.5", "10.244.2.6"],
        )
        .await;
    assert_eq!(response.answers()[0].ttl(), 5);

    let mut tcp = dns.tcp_client().await;
    let over_tcp = ask(
        &mut tcp,
        "db-1.db.default.svc.cluster.local.",
        RecordType::A,
    )
    .await;
    assert_eq!(addresses(&over_tcp), ips(&["10.244.2.6"]));

    let srv = ask(
        &mut tcp,
        "_http._tcp.db.default.svc.cluster.local.",
        RecordType::SRV,
    )
    .await;
    let mut targets: Vec<(String, u16)> = srv
        .answers()
        .iter()
        .filter_map(|r| match r.data() {
            RData::SRV(srv) => Some((srv.target().to_string(), srv.port())),
            _ => None,
        })
        .collect();
    targets.sort();
    assert_eq!(
        targets,
        [
            ("db-0.db.default.svc.cluster.local.".to_owned(), 8080),
            ("db-1.db.default.svc.cluster.local.".to_owned(), 8080),
        ]
    );
    // The targets' addresses come along, so no second query is needed.
    assert_eq!(srv.additionals().len(), 2);
    dns.stop().await;
}

#[tokio::test]
async fn services_appear_and_disappear_within_a_second() {
    let dns = Fixture::start().await;
    let client = dns.cluster.client();
    let name = "late.default.svc.cluster.local.";
    assert_eq!(
        dns.ask(name, RecordType::A).await.response_code(),
        ResponseCode::NXDomain
    );
    create_service(&client, "late", json!({"ports": [{"port": 80}]})).await;
    let created = tokio::time::Instant::now();
    let response = dns
        .eventually("the new Service", name, RecordType::A, |r| {
            r.response_code() == ResponseCode::NoError && !r.answers().is_empty()
        })
        .await;
    assert!(
        created.elapsed() < Duration::from_secs(1),
        "seen after {:?}",
        created.elapsed()
    );
    let cluster_ip: IpAddr = Api::<Service>::default_namespaced(client.clone())
        .get("late")
        .await
        .expect("get service")
        .spec
        .and_then(|s| s.cluster_ip)
        .expect("allocated ClusterIP")
        .parse()
        .expect("ClusterIP");
    assert_eq!(addresses(&response), [cluster_ip]);

    Api::<Service>::default_namespaced(client)
        .delete("late", &DeleteParams::default())
        .await
        .expect("delete service");
    let deleted = tokio::time::Instant::now();
    dns.eventually("the Service gone", name, RecordType::A, |r| {
        r.response_code() == ResponseCode::NXDomain
    })
    .await;
    assert!(
        deleted.elapsed() < Duration::from_secs(1),
        "gone after {:?}",
        deleted.elapsed()
    );
    dns.stop().await;
}

#[tokio::test]
async fn large_answers_truncate_over_udp_and_complete_over_tcp() {
    let dns = Fixture::start().await;
    let client = dns.cluster.client();
    create_service(&client, "wide", json!({"clusterIP": "None"})).await;
    let many: Vec<String> = (1..=60).map(|i| format!("10.244.3.{i}")).collect();
    create_slice(&client, "wide", &many).await;
    let name = "wide.default.svc.cluster.local.";
    dns.eventually("all endpoints", name, RecordType::A, |r| {
        r.response_code() == ResponseCode::NoError && (r.truncated() || r.answers().len() == 60)
    })
    .await;

    // 60 A records need about 1 KB: more than 512 bytes, the limit without EDNS.
    let mut plain_udp = dns.udp_client(false).await;
    let truncated = ask(&mut plain_udp, name, RecordType::A).await;
    assert!(truncated.truncated(), "TC set when the answer does not fit");
    assert!(truncated.answers().len() < 60);

    let mut tcp = dns.tcp_client().await;
    let whole = ask(&mut tcp, name, RecordType::A).await;
    assert!(!whole.truncated());
    assert_eq!(whole.answers().len(), 60);
    dns.stop().await;
}

#[tokio::test]
async fn metrics_count_queries_by_type_and_code() {
    let dns = Fixture::start().await;
    dns.ask("nothing.default.svc.cluster.local.", RecordType::A)
        .await;
    dns.ask("example.com.", RecordType::AAAA).await;
    let text = dns.scrape();
    for line in [
        r#"simkube_dns_queries_total{type="A",rcode="NXDOMAIN"} 1"#,
        r#"simkube_dns_queries_total{type="AAAA",rcode="REFUSED"} 1"#,
        r#"simkube_dns_watch_synced{resource="services"} 1"#,
        r#"simkube_dns_watch_synced{resource="endpointslices"} 1"#,
    ] {
        assert!(text.contains(line), "missing {line} in:\n{text}");
    }
    dns.stop().await;
}

/// Marks a pod Running with `ip`, Ready or not, as its kubelet would.
async fn set_pod_ready(client: &kube::Client, name: &str, ip: &str, ready: bool) {
    let status = if ready { "True" } else { "False" };
    let patch = json!({"status": {
        "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
        "conditions": [{"type": "Ready", "status": status}],
    }});
    Api::<Pod>::default_namespaced(client.clone())
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("pod status");
}

#[tokio::test]
async fn headless_answers_follow_pod_readiness_through_the_endpointslice_controller() {
    let dns = Fixture::with_controllers(Controllers {
        endpoint_slices: true,
        ..Controllers::none()
    })
    .await;
    let client = dns.cluster.client();
    create_service(
        &client,
        "db",
        json!({"clusterIP": "None", "selector": {"app": "db"},
            "ports": [{"name": "pg", "port": 5432}]}),
    )
    .await;
    for (i, ip) in ["10.244.1.5", "10.244.2.6"].iter().enumerate() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": format!("db-{i}"), "labels": {"app": "db"}},
            "spec": {"nodeName": "n1", "hostname": format!("db-{i}"), "subdomain": "db",
                "containers": [{"name": "pg", "image": "postgres",
                    "ports": [{"name": "pg", "containerPort": 5432}]}]},
        }))
        .expect("pod");
        Api::<Pod>::default_namespaced(client.clone())
            .create(&PostParams::default(), &pod)
            .await
            .expect("create pod");
        set_pod_ready(&client, &format!("db-{i}"), ip, true).await;
    }
    dns.eventually_a(
        "both pods",
        "db.default.svc.cluster.local.",
        &["10.244.1.5", "10.244.2.6"],
    )
    .await;
    // The pods' hostname and subdomain name them under the Service.
    let one = dns
        .ask("db-1.db.default.svc.cluster.local.", RecordType::A)
        .await;
    assert_eq!(addresses(&one), ips(&["10.244.2.6"]));

    set_pod_ready(&client, "db-1", "10.244.2.6", false).await;
    dns.eventually_a(
        "the unready pod gone",
        "db.default.svc.cluster.local.",
        &["10.244.1.5"],
    )
    .await;
    let gone = dns
        .ask("db-1.db.default.svc.cluster.local.", RecordType::A)
        .await;
    assert_eq!(gone.response_code(), ResponseCode::NXDomain);
    dns.stop().await;
}

#[tokio::test]
async fn failing_watches_answer_servfail_never_nxdomain() {
    let cluster = start_cluster(Controllers::none()).await;
    // The first lists fail; the watcher retries with back-off (about a second).
    cluster.fail_next("list", "services", 2, ApiError::internal("injected"));
    let dns = Fixture::serve(cluster).await;
    let name = "kubernetes.default.svc.cluster.local.";
    let early = dns.ask(name, RecordType::A).await;
    assert_eq!(
        early.response_code(),
        ResponseCode::ServFail,
        "an unlisted cluster must not deny names: {early:?}"
    );
    // Outside names do not depend on the cluster.
    let outside = dns.ask("example.com.", RecordType::A).await;
    assert_eq!(outside.response_code(), ResponseCode::Refused);

    dns.eventually("the cluster listed", name, RecordType::A, |r| {
        r.response_code() == ResponseCode::NoError
    })
    .await;
    let text = dns.scrape();
    assert!(
        text.contains(r#"simkube_dns_watch_errors_total{resource="services"} 2"#),
        "both failures counted:\n{text}"
    );
    assert!(text.contains(r#"simkube_dns_queries_total{type="A",rcode="SERVFAIL"}"#));
    dns.stop().await;
}

#[tokio::test]
async fn an_invalid_domain_is_an_error_naming_it() {
    let cluster = start_cluster(Controllers::none()).await;
    let udp = tokio::net::UdpSocket::bind("127.0.0.1:0")
        .await
        .expect("bind udp");
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind tcp");
    let config = DnsConfig {
        domain: ".".to_owned(),
        ..DnsConfig::default()
    };
    let error = simkube_dns::serve(cluster.client(), config, udp, tcp, CancellationToken::new())
        .await
        .expect_err("the root zone is refused");
    assert_eq!(
        error.to_string(),
        r#"invalid cluster domain ".": the root zone would swallow every name; use a DNS name such as cluster.local"#
    );
    cluster.shutdown().await;
}
