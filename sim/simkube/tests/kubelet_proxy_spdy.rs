//! `pods/portforward` in its SPDY forms through simkube to a kubelet, at the byte level: a
//! plain `Upgrade: SPDY/3.1` (kubectl before 1.31) and SPDY tunnelled in WebSocket binary
//! messages (`SPDY/3.1+portforward.k8s.io`, kubectl 1.31+) both reach the kubelet as an SPDY
//! upgrade offering `portforward.k8s.io`, and the bytes after it are carried unchanged. The
//! test kubelet here answers the upgrade and echoes upper-cased; the real kubectl against a
//! real node agent is in simkube-node's `port_forward` test.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use futures::{SinkExt as _, StreamExt as _};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;

/// `method path?query offered-protocols` of each request the test kubelet got.
type Seen = Arc<Mutex<Vec<String>>>;

async fn kubelet_port_forward(seen: axum::extract::State<Seen>, mut request: Request) -> Response {
    let offered: Vec<String> = request
        .headers()
        .get_all("x-stream-protocol-version")
        .iter()
        .filter_map(|v| v.to_str().ok().map(str::to_owned))
        .collect();
    let upgrade = request
        .headers()
        .get(http::header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    seen.lock().expect("seen").push(format!(
        "{} {} upgrade={upgrade} offered={offered:?}",
        request.method(),
        request.uri()
    ));
    if !offered.iter().any(|p| p == "portforward.k8s.io") {
        return (
            http::StatusCode::FORBIDDEN,
            format!("unable to upgrade: unable to negotiate protocol: client supports {offered:?}"),
        )
            .into_response();
    }
    let on_upgrade = hyper::upgrade::on(&mut request);
    tokio::spawn(async move {
        let Ok(upgraded) = on_upgrade.await else {
            return;
        };
        let mut io = TokioIo::new(upgraded);
        let mut buf = [0u8; 1024];
        while let Ok(n) = io.read(&mut buf).await {
            if n == 0 || io.write_all(&buf[..n].to_ascii_uppercase()).await.is_err() {
                break;
            }
        }
    });
    let mut response = http::StatusCode::SWITCHING_PROTOCOLS.into_response();
    let headers = response.headers_mut();
    headers.insert(http::header::CONNECTION, "Upgrade".parse().expect("value"));
    headers.insert(http::header::UPGRADE, "SPDY/3.1".parse().expect("value"));
    headers.insert(
        "x-stream-protocol-version",
        "portforward.k8s.io".parse().expect("value"),
    );
    response
}

/// The HTTPS test kubelet on 127.0.0.1 (the API server does not verify it by default);
/// returns its port.
async fn start_kubelet(seen: Seen) -> u16 {
    let app = Router::new()
        .route("/portForward/{ns}/{pod}", any(kubelet_port_forward))
        .with_state(seen);
    support::https::serve(app, &["127.0.0.1"], "test kubelet CA")
        .await
        .port
}

/// A cluster whose node `n1` is served by the test kubelet, with pod `web` bound to it.
async fn cluster(seen: Seen) -> simkube::Cluster {
    let kubelet_port = start_kubelet(seen).await;
    let cluster = simkube::Cluster::builder()
        .start()
        .await
        .expect("start cluster");
    let client = cluster.client();
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "n1"}})).expect("node"),
        )
        .await
        .expect("create node");
    let status = json!({"status": {
        "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": kubelet_port}},
    }});
    nodes
        .patch_status("n1", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("node status");
    let pod = json!({"metadata": {"name": "web"}, "spec": {
        "nodeName": "n1", "containers": [{"name": "app", "image": "example/app"}],
    }});
    Api::<Pod>::namespaced(client, "default")
        .create(
            &PostParams::default(),
            &serde_json::from_value(pod).expect("pod"),
        )
        .await
        .expect("create pod");
    cluster
}

const PATH: &str = "/api/v1/namespaces/default/pods/web/portforward";

/// Reads an HTTP response head (through the blank line) byte by byte, so nothing after it is
/// consumed.
async fn read_head(tcp: &mut TcpStream) -> String {
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let byte = tcp.read_u8().await.expect("response head");
        head.push(byte);
    }
    String::from_utf8(head).expect("ascii head")
}

#[tokio::test]
async fn spdy_upgrades_are_relayed_to_the_kubelet_byte_for_byte() {
    let seen = Seen::default();
    let cluster = cluster(seen.clone()).await;
    let mut tcp = TcpStream::connect(cluster.addr()).await.expect("connect");
    // kubectl 1.27 sends no ports: the streams name them.
    let request = format!(
        "POST {PATH} HTTP/1.1\r\nHost: simkube\r\nAuthorization: Bearer {}\r\nConnection: \
         Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: portforward.k8s.io\r\n\
         Content-Length: 0\r\n\r\n",
        cluster.admin_token()
    );
    tcp.write_all(request.as_bytes()).await.expect("request");
    let head = tokio::time::timeout(Duration::from_secs(10), read_head(&mut tcp))
        .await
        .expect("an answer");
    let lower = head.to_ascii_lowercase();
    assert!(
        lower.starts_with("http/1.1 101")
            && lower.contains("upgrade: spdy/3.1")
            && lower.contains("x-stream-protocol-version: portforward.k8s.io"),
        "{head}"
    );
    tcp.write_all(b"\x80\x03\x00\x01 any spdy bytes")
        .await
        .expect("write");
    let mut echoed = [0u8; 19];
    tokio::time::timeout(Duration::from_secs(10), tcp.read_exact(&mut echoed))
        .await
        .expect("echo in time")
        .expect("read");
    assert_eq!(&echoed, b"\x80\x03\x00\x01 ANY SPDY BYTES");
    assert_eq!(
        seen.lock().expect("seen").as_slice(),
        ["POST /portForward/default/web upgrade=SPDY/3.1 offered=[\"portforward.k8s.io\"]"]
    );
    cluster.shutdown().await;
}

async fn tunnel_request(cluster: &simkube::Cluster, protocol: &str) -> http::Request<()> {
    let mut request = format!("ws://{}{PATH}", cluster.addr())
        .into_client_request()
        .expect("request");
    let headers = request.headers_mut();
    headers.insert(
        http::header::SEC_WEBSOCKET_PROTOCOL,
        protocol.parse().expect("value"),
    );
    headers.insert(
        http::header::AUTHORIZATION,
        format!("Bearer {}", cluster.admin_token())
            .parse()
            .expect("value"),
    );
    request
}

#[tokio::test]
async fn spdy_tunnelled_in_websocket_reaches_the_kubelet_as_an_spdy_upgrade() {
    let seen = Seen::default();
    let cluster = cluster(seen.clone()).await;
    let tcp = TcpStream::connect(cluster.addr()).await.expect("connect");
    let request = tunnel_request(&cluster, "SPDY/3.1+portforward.k8s.io").await;
    let (mut socket, response) = tokio_tungstenite::client_async(request, tcp)
        .await
        .expect("WebSocket upgrade");
    assert_eq!(
        response
            .headers()
            .get(http::header::SEC_WEBSOCKET_PROTOCOL)
            .and_then(|v| v.to_str().ok()),
        Some("SPDY/3.1+portforward.k8s.io")
    );
    // Message boundaries do not matter: the payloads are one byte stream.
    for part in ["tunnelled ", "spdy"] {
        socket
            .send(Message::binary(part.as_bytes().to_vec()))
            .await
            .expect("send");
    }
    let mut got = Vec::new();
    while got.len() < 14 {
        let message = tokio::time::timeout(Duration::from_secs(10), socket.next())
            .await
            .expect("echo in time")
            .expect("open")
            .expect("message");
        match message {
            Message::Binary(data) => got.extend_from_slice(&data),
            other => panic!("binary messages only, got {other:?}"),
        }
    }
    assert_eq!(got, b"TUNNELLED SPDY");
    assert_eq!(
        seen.lock().expect("seen").as_slice(),
        ["GET /portForward/default/web upgrade=SPDY/3.1 offered=[\"portforward.k8s.io\"]"]
    );

    // A protocol the kubelet refuses comes back as its HTTP error, before any upgrade.
    let tcp = TcpStream::connect(cluster.addr()).await.expect("connect");
    let request = tunnel_request(&cluster, "SPDY/3.1+other.k8s.io").await;
    match tokio_tungstenite::client_async(request, tcp).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            assert_eq!(response.status(), http::StatusCode::FORBIDDEN);
            let body = String::from_utf8_lossy(response.body().as_deref().unwrap_or_default())
                .into_owned();
            assert!(body.contains("unable to negotiate protocol"), "{body}");
        }
        other => panic!("expected the kubelet's 403, got {other:?}"),
    }
    cluster.shutdown().await;
}
