//! `tetherd gateway --namespace` end to end: two gateways in two simulated clusters (network
//! namespaces) read their objects from an in-process simkube, which the test writes as the
//! controller will. The API server is reached from the gateway namespaces through a second
//! listener bound in the underlay namespace (198.18.0.1). Needs root, `/dev/net/tun`, `ip` and
//! `nft`; skips loudly without them (fails when `CI` is set).

mod support;

use std::net::{IpAddr, SocketAddr};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use nix::sys::signal::Signal;
use support::{PORT, translate};
use tether_api::networking::{
    Configuration, Connection, ConnectionState, GatewayClient, GatewayServer,
};
use tether_testkit::{
    ClusterSpec, ProcessGuard, TcpEchoServer, Topology, assert_eventually, tcp_echo,
};
use tether_wg::PrivateKey;

/// How A sees B's pods and B sees A's: the controller's remaps (both clusters use 10.0.0.0/16).
const B_IN_A: &str = "10.71.0.0/16";
const A_IN_B: &str = "10.72.0.0/16";
/// A is the client (in its tenant namespace for B), B the server.
const NS_A: &str = "tether-tenant-b";
const NS_B: &str = "tether-tenant-a";

struct Setup {
    topo: Topology,
    rt: tokio::runtime::Runtime,
    cluster: simkube::Cluster,
    kubeconfig: tempfile::NamedTempFile,
}

fn setup() -> Setup {
    let topo = Topology::builder()
        .cluster(ClusterSpec::new("a").route_to_gateway(B_IN_A))
        .cluster(ClusterSpec::new("b").route_to_gateway(A_IN_B))
        .build()
        .expect("topology");
    let underlay_ip = topo.underlay_ip();
    let listener = topo
        .underlay()
        .run(|| std::net::TcpListener::bind((underlay_ip, 0)))
        .expect("listener in the underlay");
    listener.set_nonblocking(true).expect("nonblocking");
    let port = listener.local_addr().expect("addr").port();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let cluster = rt
        .block_on(simkube::Cluster::builder().extra_listener(listener).start())
        .expect("simkube");
    // The gateways reach the API through the underlay listener.
    let config = cluster
        .kubeconfig()
        .replace(&cluster.url(), &format!("http://{underlay_ip}:{port}"));
    let kubeconfig = tempfile::NamedTempFile::new().expect("kubeconfig");
    std::fs::write(kubeconfig.path(), config).expect("write kubeconfig");
    let client = {
        let _entered = rt.enter();
        cluster.client()
    };
    rt.block_on(async {
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        for crd in tether_api::crds::all() {
            let name = crd.metadata.name.clone().expect("name");
            crds.create(&PostParams::default(), &crd)
                .await
                .expect("crd");
            tokio::time::timeout(
                Duration::from_secs(10),
                await_condition(crds.clone(), &name, conditions::is_crd_established()),
            )
            .await
            .expect("established in time")
            .expect("watch");
        }
        let namespaces: Api<Namespace> = Api::all(client.clone());
        for ns in [NS_A, NS_B] {
            namespaces
                .create(
                    &PostParams::default(),
                    &serde_json::from_value(serde_json::json!({"metadata": {"name": ns}}))
                        .expect("ns"),
                )
                .await
                .expect("namespace");
        }
    });
    Setup {
        topo,
        rt,
        cluster,
        kubeconfig,
    }
}

impl Setup {
    /// kube's client spawns its buffer task on creation, so it needs the runtime entered.
    fn client(&self) -> kube::Client {
        let _entered = self.rt.enter();
        self.cluster.client()
    }

    fn create<K>(&self, ns: &str, value: serde_json::Value) -> K
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + std::fmt::Debug
            + serde::Serialize
            + serde::de::DeserializeOwned,
    {
        let api: Api<K> = Api::namespaced(self.client(), ns);
        let obj: K = serde_json::from_value(value).expect("object");
        self.rt
            .block_on(api.create(&PostParams::default(), &obj))
            .expect("create")
    }

    /// Writes the objects of one side as the controller will: the gateway object, its key
    /// Secret, and the Configuration with the remap in its status.
    fn side(
        &self,
        ns: &str,
        local: &str,
        remote: &str,
        remap: &str,
        key: &PrivateKey,
        gateway: serde_json::Value,
    ) {
        let _: Secret = self.create(ns, serde_json::json!({
            "metadata": {"name": "tether-gateway-key"},
            "stringData": {"privateKey": key.to_base64(), "publicKey": key.public().to_string()},
        }));
        let _: Configuration = self.create(
            ns,
            serde_json::json!({
                "apiVersion": "networking.tether.dev/v1alpha1", "kind": "Configuration",
                "metadata": {"name": remote, "labels": {"tether.dev/remote-cluster-id": remote}},
                "spec": {"local": {"clusterID": local, "cidr": {"pod": ["10.0.0.0/16"]}},
                         "remote": {"clusterID": remote, "cidr": {"pod": ["10.0.0.0/16"]}}},
            }),
        );
        let api: Api<Configuration> = Api::namespaced(self.client(), ns);
        self.rt
            .block_on(api.patch_status(
                remote,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"status": {"remote": {"clusterID": remote, "cidr": {"pod": [remap]}}}})),
            ))
            .expect("remap");
        if gateway["kind"] == "GatewayServer" {
            let _: GatewayServer = self.create(ns, gateway);
        } else {
            let _: GatewayClient = self.create(ns, gateway);
        }
    }

    fn start(&self, cluster: &str, ns: &str, flag: &str) -> ProcessGuard {
        let c = self.topo.cluster(cluster);
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_tetherd"));
        cmd.args([
            "gateway",
            "--namespace",
            ns,
            flag,
            "tether-gateway",
            "--metrics-addr",
            support::METRICS,
        ])
        .arg("--pod-interface")
        .arg(c.pod_facing_interface())
        .arg("--kubeconfig")
        .arg(self.kubeconfig.path())
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env(
            "TETHER_LOG",
            std::env::var("TETHER_TEST_GATEWAY_LOG").unwrap_or_else(|_| "info".to_owned()),
        )
        .stdin(Stdio::null());
        c.gateway()
            .spawn(cmd)
            .expect("spawn gateway")
            .with_stop_timeout(Duration::from_secs(10))
    }

    fn connection(&self, ns: &str) -> Option<Connection> {
        let api: Api<Connection> = Api::namespaced(self.client(), ns);
        self.rt
            .block_on(api.get_opt("tether-gateway"))
            .ok()
            .flatten()
    }

    fn state(&self, ns: &str) -> (Option<ConnectionState>, String) {
        let c = self.connection(ns);
        let st = c.and_then(|c| c.status).unwrap_or_default();
        let message = st
            .conditions
            .first()
            .map(|c| format!("{}: {}", c.reason, c.message))
            .unwrap_or_default();
        (st.value, message)
    }
}

fn both_sides(s: &Setup, ka: &PrivateKey, kb: &PrivateKey, server_key_for_a: String) {
    let b_ip = s.topo.cluster("b").gateway_underlay_ip();
    s.side(NS_A, "a", "b", B_IN_A, ka, serde_json::json!({
        "apiVersion": "networking.tether.dev/v1alpha1", "kind": "GatewayClient",
        "metadata": {"name": "tether-gateway"},
        "spec": {"remoteClusterID": "b", "endpoint": {"addresses": [b_ip.to_string()], "port": PORT},
                 "serverPublicKey": server_key_for_a},
    }));
    s.side(NS_B, "b", "a", A_IN_B, kb, serde_json::json!({
        "apiVersion": "networking.tether.dev/v1alpha1", "kind": "GatewayServer",
        "metadata": {"name": "tether-gateway"},
        "spec": {"remoteClusterID": "a", "endpoint": {"port": PORT}, "clientPublicKey": ka.public().to_string()},
    }));
}

#[test]
fn gateways_driven_by_objects_connect_carry_remapped_traffic_and_report_it() {
    if !tether_testkit::require_root_or_skip() {
        return;
    }
    let s = setup();
    let (ka, kb) = (PrivateKey::generate(), PrivateKey::generate());
    both_sides(&s, &ka, &kb, kb.public().to_string());
    let mut ga = s.start("a", NS_A, "--gateway-client");
    let mut gb = s.start("b", NS_B, "--gateway-server");
    let (ca, cb) = (s.topo.cluster("a"), s.topo.cluster("b"));

    // Pod to pod, through the controller's remaps.
    let b_pod_from_a = translate(cb.pod_ip(0), B_IN_A.parse().expect("cidr"));
    let a_pod_from_b = translate(ca.pod_ip(0), A_IN_B.parse().expect("cidr"));
    assert_eventually!(
        ca.pod(0).ping(IpAddr::V4(b_pod_from_a)).unwrap_or(false),
        Duration::from_secs(20),
        "A's pod cannot ping B's pod at {b_pod_from_a}"
    );
    let server = TcpEchoServer::start(cb.pod(0), SocketAddr::new(IpAddr::V4(cb.pod_ip(0)), 0))
        .expect("echo");
    let to = SocketAddr::new(IpAddr::V4(b_pod_from_a), server.local_addr().port());
    let reply = tcp_echo(ca.pod(0), to, b"objects", Duration::from_secs(5)).expect("tcp echo");
    assert_eq!(
        reply.seen_as.ip(),
        IpAddr::V4(a_pod_from_b),
        "B sees A's pod through B's remap"
    );

    // Both Connections turn Connected, with a latency, an MTU and a handshake time.
    for ns in [NS_A, NS_B] {
        assert_eventually!(
            s.state(ns).0 == Some(ConnectionState::Connected),
            Duration::from_secs(10),
            "{ns}: {:?}",
            s.state(ns)
        );
        let c = s.connection(ns).expect("connection");
        let st = c.status.clone().expect("status");
        let latency = st.latency.clone().expect("latency").value;
        assert!(latency.ends_with("ms"), "{latency}");
        assert!(st.last_handshake.is_some() && st.mtu.is_some(), "{st:?}");
        let owner = &c.metadata.owner_references.as_ref().expect("owner")[0];
        assert_eq!(
            (owner.name.as_str(), owner.controller),
            ("tether-gateway", Some(true))
        );
        eprintln!("{ns}: Connected, latency {latency}, mtu {:?}", st.mtu);
    }
    let a = s.connection(NS_A).expect("a");
    assert_eq!(a.spec.type_, tether_api::networking::GatewayType::Client);
    assert_eq!(a.spec.remote_cluster_id, "b");

    // The controller changes its remap of B: A applies it in the same process.
    let new_view: ipnet::Ipv4Net = "10.73.0.0/16".parse().expect("cidr");
    ca.route_to_gateway(new_view).expect("node route");
    let confs: Api<Configuration> = Api::namespaced(s.client(), NS_A);
    s.rt.block_on(confs.patch_status(
        "b",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"status": {"remote": {"clusterID": "b", "cidr": {"pod": [new_view.to_string()]}}}})),
    ))
    .expect("new remap");
    let b_pod_new = translate(cb.pod_ip(0), new_view);
    assert_eventually!(
        ca.pod(0).ping(IpAddr::V4(b_pod_new)).unwrap_or(false),
        Duration::from_secs(20),
        "A's pod cannot ping B's pod at its new address {b_pod_new}"
    );
    assert!(
        ga.try_wait().expect("wait").is_none(),
        "A's gateway process restarted"
    );
    assert_eventually!(
        s.state(NS_A).0 == Some(ConnectionState::Connected),
        Duration::from_secs(10),
        "{:?}",
        s.state(NS_A)
    );

    // B dies: A's Connection leaves Connected within 10 s.
    gb.signal(Signal::SIGKILL).expect("kill");
    let _ = gb.wait_timeout(Duration::from_secs(5));
    let killed = Instant::now();
    while s.state(NS_A).0 == Some(ConnectionState::Connected) {
        assert!(
            killed.elapsed() < Duration::from_secs(10),
            "A still Connected 10 s after B died"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let (state, message) = s.state(NS_A);
    eprintln!(
        "A left Connected after {:?}: {state:?} {message}",
        killed.elapsed()
    );
    assert_eq!(state, Some(ConnectionState::Connecting));
    assert!(message.contains("ProbesUnanswered"), "{message}");
}

#[test]
fn a_wrong_server_key_means_no_handshake_and_says_which_field() {
    if !tether_testkit::require_root_or_skip() {
        return;
    }
    let s = setup();
    let (ka, kb) = (PrivateKey::generate(), PrivateKey::generate());
    both_sides(&s, &ka, &kb, PrivateKey::generate().public().to_string());
    let _ga = s.start("a", NS_A, "--gateway-client");
    let _gb = s.start("b", NS_B, "--gateway-server");
    assert_eventually!(
        s.state(NS_A).1.contains("spec.serverPublicKey"),
        Duration::from_secs(10),
        "{:?}",
        s.state(NS_A)
    );
    assert_eventually!(
        s.state(NS_B).1.starts_with("HandshakeRejected"),
        Duration::from_secs(10),
        "{:?}",
        s.state(NS_B)
    );
    std::thread::sleep(Duration::from_secs(3));
    for ns in [NS_A, NS_B] {
        let (state, message) = s.state(ns);
        assert_eq!(state, Some(ConnectionState::Connecting), "{message}");
        let st = s.connection(ns).and_then(|c| c.status).expect("status");
        assert!(
            st.last_handshake.is_none(),
            "no handshake may succeed: {st:?}"
        );
        eprintln!("{ns}: {message}");
    }
}
