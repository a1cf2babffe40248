//! HTTP/2 as client-go and Tether's daemons speak it to kube-apiserver: chosen by ALPN over
//! TLS, one connection carrying a watch and concurrent writes as separate streams, and
//! HTTP/1.1 still chosen by a client that offers only it (upgrades need it).

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::json;
use simkube::Cluster;

/// A TLS connection to `cluster` offering `alpn`, and the protocol the server chose.
async fn connect(
    cluster: &Cluster,
    alpn: &[&[u8]],
) -> (
    tokio_rustls::client::TlsStream<tokio::net::TcpStream>,
    Option<Vec<u8>>,
) {
    let mut roots = rustls::RootCertStore::empty();
    let ca = cluster.ca_pem().expect("tls on");
    for cert in rustls_pemfile::certs(&mut ca.as_bytes()) {
        roots.add(cert.expect("PEM")).expect("CA");
    }
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let url: http::Uri = cluster.url().parse().expect("url");
    let port = url.port_u16().expect("port");
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").expect("name");
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .expect("handshake");
    let chosen = tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
    (tls, chosen)
}

fn request(
    cluster: &Cluster,
    method: &str,
    path: &str,
    body: Option<serde_json::Value>,
) -> http::Request<Full<Bytes>> {
    let url: http::Uri = cluster.url().parse().expect("url");
    let uri = format!("https://{}{path}", url.authority().expect("authority"));
    let mut builder = http::Request::builder()
        .method(method)
        .uri(uri)
        .header("authorization", format!("Bearer {}", cluster.admin_token()));
    let body = match body {
        Some(b) => {
            builder = builder.header("content-type", "application/json");
            Bytes::from(serde_json::to_vec(&b).expect("json"))
        }
        None => Bytes::new(),
    };
    builder.body(Full::new(body)).expect("request")
}

#[tokio::test]
async fn one_http2_connection_carries_a_watch_and_concurrent_writes() {
    let cluster = Cluster::builder()
        .name("http2")
        .tls(true)
        .start()
        .await
        .expect("cluster");
    let (tls, chosen) = connect(&cluster, &[b"h2", b"http/1.1"]).await;
    assert_eq!(chosen.as_deref(), Some(&b"h2"[..]), "ALPN picks HTTP/2");
    let (sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .expect("HTTP/2 preface and settings");
    tokio::spawn(connection);

    let watch = sender
        .clone()
        .send_request(request(
            &cluster,
            "GET",
            "/api/v1/namespaces/default/configmaps?watch=true",
            None,
        ))
        .await
        .expect("watch");
    assert_eq!(watch.status(), 200);
    assert_eq!(watch.version(), http::Version::HTTP_2);
    let mut events = watch.into_body();

    const WRITES: usize = 12;
    let writes = (0..WRITES).map(|i| {
        let mut sender = sender.clone();
        let req = request(
            &cluster,
            "POST",
            "/api/v1/namespaces/default/configmaps",
            Some(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": format!("cm-{i}")}})),
        );
        async move { sender.send_request(req).await.expect("create").status() }
    });
    let statuses = futures::future::join_all(writes).await;
    assert!(statuses.iter().all(|s| *s == 201), "{statuses:?}");

    // The watch's stream interleaves with the writes' on the same connection.
    let mut seen = std::collections::BTreeSet::new();
    let mut buffer = Vec::new();
    while seen.len() < WRITES {
        let frame = tokio::time::timeout(std::time::Duration::from_secs(10), events.frame())
            .await
            .expect("an event within 10 s")
            .expect("stream open")
            .expect("frame");
        buffer.extend_from_slice(frame.data_ref().expect("data"));
        while let Some(end) = buffer.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buffer.drain(..=end).collect();
            let event: serde_json::Value = serde_json::from_slice(&line).expect("event JSON");
            assert_eq!(event["type"], "ADDED", "{event}");
            seen.insert(
                event["object"]["metadata"]["name"]
                    .as_str()
                    .expect("name")
                    .to_owned(),
            );
        }
    }
    assert_eq!(seen.len(), WRITES);

    // A client that offers only HTTP/1.1 gets it.
    let (_, chosen) = connect(&cluster, &[b"http/1.1"]).await;
    assert_eq!(chosen.as_deref(), Some(&b"http/1.1"[..]));
    cluster.shutdown().await;
}
