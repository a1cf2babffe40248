//! `tether status`: the rendering of fixture ForeignClusters (snapshots of the table, the
//! failing-condition explanations and the JSON), and the command against a simkube cluster.

mod support;

use std::collections::BTreeMap;

use expect_test::expect;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use support::Sim;
use tether_api::core::ForeignCluster;
use tether_api::networking::{Configuration, Connection};
use tether_cli::status::{self, LocalCluster, PeerNetwork};

fn fixture(name: &str, created: &str, status: serde_json::Value) -> ForeignCluster {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "core.tether.dev/v1alpha1",
        "kind": "ForeignCluster",
        "metadata": {"name": name, "creationTimestamp": created},
        "spec": {"clusterID": name},
        "status": status,
    }))
    .expect("fixture ForeignCluster")
}

fn condition(type_: &str, status: &str, reason: &str, message: &str) -> serde_json::Value {
    serde_json::json!({"type": type_, "status": status, "reason": reason, "message": message,
        "lastTransitionTime": "2030-01-01T00:00:00Z"})
}

fn fixtures() -> Vec<ForeignCluster> {
    vec![
        fixture(
            "south-3",
            "2029-12-31T23:58:00Z",
            serde_json::json!({"phase": "Failed", "role": "Unknown", "conditions": [
                condition("Authentication", "False", "TokenRejected",
                    "the provider rejected the token (expired); ask its admin for a new `tether generate peer-command`"),
            ]}),
        ),
        fixture(
            "east-1",
            "2029-12-31T22:00:00Z",
            serde_json::json!({"phase": "Established", "role": "Provider", "conditions": [
                condition("Authentication", "True", "IdentityIssued", "identity valid until 2030-01-02T00:00:00Z"),
                condition("Networking", "Unknown", "ModuleDisabled", "the networking module is off"),
                condition("Offloading", "Unknown", "ModuleDisabled", "the offloading module is off"),
                condition("APIServerReachable", "False", "Unreachable",
                    "https://198.51.100.7:6443 did not answer within 10s; check the provider's API server address (--api-server-url on its install)"),
            ]}),
        ),
        fixture("north-2", "2029-12-31T23:59:30Z", serde_json::json!({})),
    ]
}

fn local() -> LocalCluster {
    LocalCluster {
        cluster_id: "west-1".to_owned(),
        version: Some("v0.1.0".to_owned()),
        image: Some("ghcr.io/tether-dev/tetherd:v0.1.0".to_owned()),
        controller_ready: true,
        controller: "1/1 replicas available, 1/1 updated".to_owned(),
        auth_url: Some("https://198.51.100.9:443".to_owned()),
        auth_fingerprint: Some("sha256:ab".to_owned()),
    }
}

fn now() -> Timestamp {
    "2030-01-01T00:00:00Z".parse().expect("ts")
}

#[test]
fn the_table_lists_peers_and_explains_every_failing_condition() {
    let report = status::report(local(), &fixtures(), now());
    expect![[r#"
        Cluster west-1 (Tether v0.1.0): controller ready (1/1 replicas available, 1/1 updated)
        Authentication: https://198.51.100.9:443 (sha256:ab)

        CLUSTER ID   ROLE       PHASE         AUTHENTICATION   NETWORKING   OFFLOADING   API SERVER   TUNNEL   LATENCY   AGE
        east-1       Provider   Established   True             Unknown      Unknown      False        -        -         120m
        north-2      Unknown    -             -                -            -            -            -        -         30s
        south-3      Unknown    Failed        False            -            -            -            -        -         2m

        Failing conditions:
          east-1: APIServerReachable: Unreachable: https://198.51.100.7:6443 did not answer within 10s; check the provider's API server address (--api-server-url on its install)
          south-3: Authentication: TokenRejected: the provider rejected the token (expired); ask its admin for a new `tether generate peer-command`
    "#]]
    .assert_eq(&status::render_table(&report));
}

#[test]
fn no_peers_and_an_unready_controller_say_so() {
    let mut l = local();
    l.controller_ready = false;
    l.controller = "0/1 replicas available, 1/1 updated".to_owned();
    l.auth_url = None;
    expect![[r#"
        Cluster west-1 (Tether v0.1.0): controller NOT ready (0/1 replicas available, 1/1 updated)
        Authentication: not published yet by the controller

        No peers. Peer with `tether peer` (see `tether peer --help`).
    "#]]
    .assert_eq(&status::render_table(&status::report(l, &[], now())));
}

#[test]
fn the_json_form_carries_every_condition() {
    let report = status::report(local(), &fixtures()[..1], now());
    expect![[r#"
        {
          "cluster": {
            "clusterID": "west-1",
            "version": "v0.1.0",
            "image": "ghcr.io/tether-dev/tetherd:v0.1.0",
            "controllerReady": true,
            "controller": "1/1 replicas available, 1/1 updated",
            "authURL": "https://198.51.100.9:443",
            "authFingerprint": "sha256:ab"
          },
          "peers": [
            {
              "clusterID": "south-3",
              "role": "Unknown",
              "phase": "Failed",
              "authentication": "False",
              "networking": "-",
              "offloading": "-",
              "apiServer": "-",
              "created": "2029-12-31T23:58:00Z",
              "age": "2m",
              "conditions": [
                {
                  "type": "Authentication",
                  "status": "False",
                  "reason": "TokenRejected",
                  "message": "the provider rejected the token (expired); ask its admin for a new `tether generate peer-command`"
                }
              ]
            }
          ]
        }"#]]
    .assert_eq(&serde_json::to_string_pretty(&report).expect("json"));
}

fn networks() -> BTreeMap<String, PeerNetwork> {
    let connection: Connection = serde_json::from_value(serde_json::json!({
        "apiVersion": "networking.tether.dev/v1alpha1",
        "kind": "Connection",
        "metadata": {"name": "tether-gateway", "namespace": "tether-tenant-east-1"},
        "spec": {"remoteClusterID": "east-1", "type": "Client",
            "gatewayRef": {"name": "tether-gateway"}},
        "status": {"value": "Connected",
            "latency": {"value": "1.3ms", "timestamp": "2029-12-31T23:59:58Z"},
            "lastHandshake": "2029-12-31T23:59:40Z", "mtu": 1340},
    }))
    .expect("fixture Connection");
    let configuration: Configuration = serde_json::from_value(serde_json::json!({
        "apiVersion": "networking.tether.dev/v1alpha1",
        "kind": "Configuration",
        "metadata": {"name": "east-1", "namespace": "tether-tenant-east-1"},
        "spec": {"remote": {"clusterID": "east-1",
            "cidr": {"pod": ["10.244.0.0/16"], "external": ["192.0.2.0/24"]}}},
        "status": {"remote": {"clusterID": "east-1",
            "cidr": {"pod": ["10.245.0.0/16"], "external": ["192.0.2.0/24"]}}},
    }))
    .expect("fixture Configuration");
    // A Connection the gateway has not reported on yet, and no Configuration.
    let mut waiting = connection.clone();
    waiting.status = None;
    BTreeMap::from([
        (
            "east-1".to_owned(),
            PeerNetwork {
                connection: Some(connection),
                configuration: Some(configuration),
            },
        ),
        (
            "north-2".to_owned(),
            PeerNetwork {
                connection: Some(waiting),
                configuration: None,
            },
        ),
    ])
}

#[test]
fn the_table_shows_each_tunnel_its_latency_and_the_remaps() {
    let report = status::report_with_network(local(), &fixtures(), &networks(), now());
    expect![[r#"
        Cluster west-1 (Tether v0.1.0): controller ready (1/1 replicas available, 1/1 updated)
        Authentication: https://198.51.100.9:443 (sha256:ab)

        CLUSTER ID   ROLE       PHASE         AUTHENTICATION   NETWORKING   OFFLOADING   API SERVER   TUNNEL      LATENCY   AGE
        east-1       Provider   Established   True             Unknown      Unknown      False        Connected   1.3ms     120m
        north-2      Unknown    -             -                -            -            -            -           -         30s
        south-3      Unknown    Failed        False            -            -            -            -           -         2m

        Remaps:
          east-1: pod 10.244.0.0/16 reached here as 10.245.0.0/16
          east-1: external 192.0.2.0/24 (not remapped)

        Failing conditions:
          east-1: APIServerReachable: Unreachable: https://198.51.100.7:6443 did not answer within 10s; check the provider's API server address (--api-server-url on its install)
          south-3: Authentication: TokenRejected: the provider rejected the token (expired); ask its admin for a new `tether generate peer-command`
    "#]].assert_eq(&status::render_table(&report));
    let east = serde_json::to_value(&report.peers[0]).expect("json");
    expect![[r#"
        {
          "tunnel": {
            "state": "Connected",
            "latency": "1.3ms",
            "lastHandshake": "2029-12-31T23:59:40Z"
          },
          "remaps": [
            {
              "kind": "pod",
              "remote": "10.244.0.0/16",
              "local": "10.245.0.0/16"
            },
            {
              "kind": "external",
              "remote": "192.0.2.0/24",
              "local": "192.0.2.0/24"
            }
          ]
        }"#]]
    .assert_eq(
        &serde_json::to_string_pretty(&serde_json::json!({
            "tunnel": east["tunnel"], "remaps": east["remaps"]
        }))
        .expect("json"),
    );
}

#[test]
fn image_tags_and_digests_name_the_version() {
    assert_eq!(
        status::image_tag("ghcr.io/tether-dev/tetherd:v1.2.3"),
        "v1.2.3"
    );
    assert_eq!(status::image_tag("localhost:5000/tetherd"), "latest");
    assert_eq!(status::image_tag("r/t@sha256:abc"), "sha256:abc");
}

#[tokio::test]
async fn status_reads_the_cluster_and_its_peers() {
    let sim = Sim::start("status").await;
    let client = sim.client();
    sim.tether(&["status"])
        .await
        .assert_fails(4, &["not installed", "tether install"]);
    sim.install("west-1").await;
    sim.fake_controller_ready("west-1").await;
    let api: Api<ForeignCluster> = Api::all(client.clone());
    for fc in fixtures() {
        let name = fc.metadata.name.clone().expect("name");
        let mut fresh = fc.clone();
        fresh.metadata.creation_timestamp = None;
        fresh.status = None;
        api.create(&PostParams::default(), &fresh)
            .await
            .expect("create");
        if let Some(status) = fc.status {
            let patch = serde_json::json!({"status": status});
            api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .expect("status");
        }
    }
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                serde_json::json!({"metadata": {"name": "tether-tenant-east-1"}}),
            )
            .expect("namespace"),
        )
        .await
        .expect("create namespace");
    let net = networks().remove("east-1").expect("east-1 network");
    let connections: Api<Connection> = Api::namespaced(client.clone(), "tether-tenant-east-1");
    let connection = net.connection.expect("connection");
    let mut fresh = connection.clone();
    fresh.status = None;
    connections
        .create(&PostParams::default(), &fresh)
        .await
        .expect("create Connection");
    connections
        .patch_status(
            "tether-gateway",
            &PatchParams::default(),
            &Patch::Merge(&serde_json::json!({"status": connection.status})),
        )
        .await
        .expect("Connection status");
    let configurations: Api<Configuration> =
        Api::namespaced(client.clone(), "tether-tenant-east-1");
    let configuration = net.configuration.expect("configuration");
    let mut fresh = configuration.clone();
    fresh.status = None;
    configurations
        .create(&PostParams::default(), &fresh)
        .await
        .expect("create Configuration");
    configurations
        .patch_status(
            "east-1",
            &PatchParams::default(),
            &Patch::Merge(&serde_json::json!({"status": configuration.status})),
        )
        .await
        .expect("Configuration status");
    let run = sim.tether(&["status"]).await;
    run.assert_code(0);
    assert!(
        run.stdout
            .contains("east-1: pod 10.244.0.0/16 reached here as 10.245.0.0/16"),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.starts_with("Cluster west-1 (Tether v"),
        "{}",
        run.stdout
    );
    assert!(run.stdout.contains("controller ready"), "{}", run.stdout);
    assert!(
        run.stdout
            .contains("south-3: Authentication: TokenRejected"),
        "{}",
        run.stdout
    );
    let row = run
        .stdout
        .lines()
        .find(|l| l.starts_with("east-1"))
        .expect("east-1 row");
    assert_eq!(
        row.split_whitespace().take(9).collect::<Vec<_>>(),
        [
            "east-1",
            "Provider",
            "Established",
            "True",
            "Unknown",
            "Unknown",
            "False",
            "Connected",
            "1.3ms"
        ]
    );
    for format in ["json", "yaml"] {
        let run = sim.tether(&["status", "-o", format]).await;
        run.assert_code(0);
        let v: serde_json::Value = if format == "json" {
            serde_json::from_str(&run.stdout).expect("json")
        } else {
            serde_yaml::from_str(&run.stdout).expect("yaml")
        };
        assert_eq!(v["cluster"]["clusterID"], "west-1");
        assert_eq!(v["peers"].as_array().map(Vec::len), Some(3));
    }
    let version = sim.tether(&["version"]).await;
    version.assert_code(0);
    assert!(
        version.stdout.contains(&format!(
            "controller image: ghcr.io/tether-dev/tetherd:v{}",
            env!("CARGO_PKG_VERSION")
        )),
        "{}",
        version.stdout
    );
}

#[tokio::test]
async fn the_kubeconfig_comes_from_the_environment_and_the_context_flag_is_checked() {
    let sim = Sim::start("status-env").await;
    sim.install("env-1").await;
    let home = tempfile::tempdir().expect("home");
    let run = |args: &'static [&'static str]| {
        tokio::process::Command::new(env!("CARGO_BIN_EXE_tether"))
            .args(args)
            .env("KUBECONFIG", &sim.kubeconfig)
            .env("HOME", home.path())
            .output()
    };
    let out = run(&["status"]).await.expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("Cluster env-1 "));
    let out = run(&["--context", "nope", "status"]).await.expect("run");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("nope") && stderr.contains("--context"),
        "{stderr}"
    );
}
