//! The daemons' client stack against a real (simulated) API server over HTTPS: HTTP/2 is
//! negotiated, watches and a burst of concurrent writes share one connection, and the
//! HTTP/1.1 client that upgrades need stays on HTTP/1.1.

use std::collections::BTreeSet;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams, WatchEvent, WatchParams};
use tether_runtime::transport::{self, Protocols};

async fn tls_cluster(name: &str) -> simkube::Cluster {
    simkube::Cluster::builder()
        .name(name)
        .tls(true)
        .start()
        .await
        .expect("cluster")
}

async fn config(cluster: &simkube::Cluster) -> kube::Config {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("kubeconfig");
    cluster.write_kubeconfig(&path).expect("kubeconfig");
    let kubeconfig = kube::config::Kubeconfig::read_from(&path).expect("read");
    kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .expect("config")
}

/// The HTTP version of the answer to `GET /version`.
async fn version(client: &kube::Client) -> http::Version {
    let request = http::Request::get("/version")
        .body(kube::client::Body::empty())
        .expect("request");
    client.send(request).await.expect("GET /version").version()
}

/// Established TCP connections of this process to `port` (the server's own side excluded).
fn connections_to(port: u16) -> usize {
    ["/proc/self/net/tcp", "/proc/self/net/tcp6"]
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .flat_map(|text| {
            text.lines()
                .skip(1)
                .filter(|line| {
                    let fields: Vec<&str> = line.split_whitespace().collect();
                    let remote_port = fields
                        .get(2)
                        .and_then(|a| a.rsplit(':').next())
                        .and_then(|p| u16::from_str_radix(p, 16).ok());
                    remote_port == Some(port) && fields.get(3) == Some(&"01")
                })
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .count()
}

#[tokio::test]
async fn a_write_naming_no_field_manager_is_managed_by_the_program() {
    let cluster = tls_cluster("runtime-agent").await;
    let client = transport::client(&config(&cluster).await, Protocols::Negotiated).expect("client");
    let agent = transport::user_agent();
    let program = std::env::args()
        .next()
        .and_then(|p| p.rsplit('/').next().map(str::to_owned))
        .expect("program");
    assert!(
        agent.starts_with(&format!("{program}/v")),
        "{agent} names {program}"
    );
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    let cm = ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some("agent".to_owned()),
            ..Default::default()
        },
        // A manager owning no field gets no entry.
        data: Some([("k".to_owned(), "v".to_owned())].into()),
        ..Default::default()
    };
    let written = cms
        .create(&PostParams::default(), &cm)
        .await
        .expect("create");
    let managers: Vec<_> = written
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .map(|m| (m.manager.clone(), m.operation.clone()))
        .collect();
    assert_eq!(managers, vec![(Some(program), Some("Update".to_owned()))]);
    cluster.shutdown().await;
}

#[tokio::test]
async fn watches_and_a_burst_of_writes_share_one_http2_connection() {
    let cluster = tls_cluster("runtime-h2").await;
    let port: u16 = cluster
        .url()
        .parse::<http::Uri>()
        .expect("url")
        .port_u16()
        .expect("port");
    let config = config(&cluster).await;
    let client = transport::client(&config, Protocols::Negotiated).expect("client");
    assert_eq!(version(&client).await, http::Version::HTTP_2);

    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let mut watches = Vec::new();
    for _ in 0..3 {
        watches.push(
            cms.watch(&WatchParams::default(), "0")
                .await
                .expect("watch")
                .boxed(),
        );
    }
    const WRITES: usize = 40;
    let writes = (0..WRITES).map(|i| {
        let cms = cms.clone();
        async move {
            let mut cm = ConfigMap::default();
            cm.metadata.name = Some(format!("burst-{i}"));
            cms.create(&PostParams::default(), &cm)
                .await
                .expect("create");
        }
    });
    futures::future::join_all(writes).await;
    for watch in watches {
        let names: BTreeSet<String> = tokio::time::timeout(
            Duration::from_secs(10),
            watch
                .try_filter_map(|e| async move {
                    Ok(match e {
                        WatchEvent::Added(cm) => cm.metadata.name,
                        _ => None,
                    })
                })
                .take(WRITES)
                .try_collect(),
        )
        .await
        .expect("every write watched within 10 s")
        .expect("watch stream");
        assert_eq!(names.len(), WRITES);
    }
    assert_eq!(
        connections_to(port),
        1,
        "three watches and {WRITES} concurrent writes over one connection"
    );

    let upgrades = transport::client(&config, Protocols::Http1).expect("client");
    assert_eq!(version(&upgrades).await, http::Version::HTTP_11);
    cluster.shutdown().await;
}
