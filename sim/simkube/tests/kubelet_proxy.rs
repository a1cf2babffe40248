//! Pod `log` and `exec` through simkube to a kubelet: a small HTTPS kubelet written here (served
//! by `support::https` with a certificate from its own CA, the kubelet's `/containerLogs` and
//! `/exec` API with the `v5.channel.k8s.io` framing) serves them, and the real kube-rs client
//! and the real kubectl consume them through the API server.

mod support;

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, RawQuery, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Client;
use kube::api::{Api, AttachParams, LogParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// What the test kubelet was asked, for assertions on the forwarded requests.
#[derive(Default)]
struct Seen {
    requests: Mutex<Vec<String>>,
}

impl Seen {
    fn record(&self, line: String) {
        self.requests.lock().expect("lock").push(line);
    }

    fn all(&self) -> Vec<String> {
        self.requests.lock().expect("lock").clone()
    }
}

const LINES: [&str; 5] = ["line 1", "line 2", "line 3", "line 4", "line 5"];

fn query_pairs(q: &str) -> Vec<(String, String)> {
    form_urlencoded::parse(q.as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

async fn container_logs(
    State(seen): State<Arc<Seen>>,
    Path((ns, pod, container)): Path<(String, String, String)>,
    RawQuery(query): RawQuery,
) -> Response {
    let query = query.unwrap_or_default();
    seen.record(format!("logs {ns}/{pod}/{container}?{query}"));
    let pairs = query_pairs(&query);
    let get = |k: &str| {
        pairs
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.clone())
    };
    let tail: usize = get("tailLines")
        .and_then(|v| v.parse().ok())
        .unwrap_or(LINES.len());
    let stamps = get("timestamps").as_deref() == Some("true");
    let follow = get("follow").as_deref() == Some("true");
    let render = move |i: usize, text: &str| {
        if stamps {
            format!("2025-01-01T00:00:0{i}Z {text}\n")
        } else {
            format!("{text}\n")
        }
    };
    let first: Vec<String> = LINES
        .iter()
        .enumerate()
        .skip(LINES.len().saturating_sub(tail))
        .map(|(i, l)| render(i, l))
        .collect();
    if !follow {
        return first.concat().into_response();
    }
    // A bounded follow: the backlog, then three more lines over time, then the stream ends.
    let stream = async_stream(first, render);
    axum::body::Body::from_stream(stream).into_response()
}

fn async_stream(
    backlog: Vec<String>,
    render: impl Fn(usize, &str) -> String + Send + 'static,
) -> impl futures::Stream<Item = Result<String, std::io::Error>> {
    let later = (0..3usize).map(move |i| render(i, &format!("followed {}", i + 1)));
    let later: Vec<String> = later.collect();
    futures::stream::iter(backlog.into_iter().map(Ok)).chain(futures::stream::iter(later).then(
        |line| async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            Ok(line)
        },
    ))
}

async fn exec(
    State(seen): State<Arc<Seen>>,
    Path((ns, pod, container)): Path<(String, String, String)>,
    RawQuery(query): RawQuery,
    ws: WebSocketUpgrade,
) -> Response {
    let query = query.unwrap_or_default();
    seen.record(format!("exec {ns}/{pod}/{container}?{query}"));
    let command: Vec<String> = query_pairs(&query)
        .into_iter()
        .filter(|(k, _)| k == "command")
        .map(|(_, v)| v)
        .collect();
    ws.protocols(["v5.channel.k8s.io", "v4.channel.k8s.io"])
        .on_upgrade(move |socket| run_command(socket, command))
}

fn frame(channel: u8, data: &[u8]) -> Message {
    let mut bytes = vec![channel];
    bytes.extend_from_slice(data);
    Message::Binary(bytes.into())
}

/// A tiny "container": `echo ...`, `cat` (stdin to stdout until stdin closes) and `fail N`.
async fn run_command(mut socket: WebSocket, command: Vec<String>) {
    let status = match command.first().map(String::as_str) {
        Some("echo") => {
            let line = format!("{}\n", command[1..].join(" "));
            let _ = socket.send(frame(1, line.as_bytes())).await;
            json!({"metadata": {}, "status": "Success"})
        }
        Some("cat") => {
            while let Some(Ok(message)) = socket.next().await {
                match message {
                    Message::Binary(b) if b.first() == Some(&0) => {
                        let _ = socket.send(frame(1, &b[1..])).await;
                    }
                    // v5 CLOSE signal for stdin.
                    Message::Binary(b) if b.as_ref() == [255, 0] => break,
                    Message::Close(_) => break,
                    _ => {}
                }
            }
            json!({"metadata": {}, "status": "Success"})
        }
        Some("fail") => {
            let code = command.get(1).cloned().unwrap_or_else(|| "1".into());
            let _ = socket.send(frame(2, b"failing\n")).await;
            json!({
                "metadata": {},
                "status": "Failure",
                "message": format!("command terminated with non-zero exit code: exit status {code}"),
                "reason": "NonZeroExitCode",
                "details": {"causes": [{"reason": "ExitCode", "message": code}]}
            })
        }
        _ => json!({"metadata": {}, "status": "Failure", "message": "unknown command"}),
    };
    let _ = socket.send(frame(3, status.to_string().as_bytes())).await;
    // `echo` closes without a status code, as a sloppy kubelet might: the API server must still
    // end the client's stream with a normal closure, or client-go reports "close 1005".
    let close = (command.first().map(String::as_str) != Some("echo")).then(|| {
        axum::extract::ws::CloseFrame {
            code: axum::extract::ws::close_code::NORMAL,
            reason: "".into(),
        }
    });
    let _ = socket.send(Message::Close(close)).await;
}

async fn attach(
    State(seen): State<Arc<Seen>>,
    Path((ns, pod, container)): Path<(String, String, String)>,
    RawQuery(query): RawQuery,
    ws: WebSocketUpgrade,
) -> Response {
    seen.record(format!(
        "attach {ns}/{pod}/{container}?{}",
        query.unwrap_or_default()
    ));
    ws.protocols(["v5.channel.k8s.io", "v4.channel.k8s.io"])
        .on_upgrade(move |mut socket| async move {
            let line = format!("attached to {container}\n");
            let _ = socket.send(frame(1, line.as_bytes())).await;
            let status = json!({"metadata": {}, "status": "Success"}).to_string();
            let _ = socket.send(frame(3, status.as_bytes())).await;
            let _ = socket.send(Message::Close(None)).await;
        })
}

/// The kubelet's WebSocket port-forward protocol: two channels per port (data, error), each
/// opened with the port number; data is answered upper-cased.
async fn port_forward(
    State(seen): State<Arc<Seen>>,
    Path((ns, pod)): Path<(String, String)>,
    RawQuery(query): RawQuery,
    ws: WebSocketUpgrade,
) -> Response {
    let query = query.unwrap_or_default();
    seen.record(format!("portForward {ns}/{pod}?{query}"));
    let ports: Vec<u16> = query_pairs(&query)
        .into_iter()
        .filter(|(k, _)| k == "port")
        .filter_map(|(_, v)| v.parse().ok())
        .collect();
    ws.protocols(["v4.channel.k8s.io"])
        .on_upgrade(move |mut socket| async move {
            for (i, port) in ports.iter().enumerate() {
                let index = u8::try_from(i).expect("few ports");
                for channel in [2 * index, 2 * index + 1] {
                    let _ = socket.send(frame(channel, &port.to_le_bytes())).await;
                }
            }
            while let Some(Ok(message)) = socket.next().await {
                match message {
                    Message::Binary(b) if b.len() > 1 && b[0] % 2 == 0 => {
                        let _ = socket.send(frame(b[0], &b[1..].to_ascii_uppercase())).await;
                    }
                    Message::Close(_) => break,
                    _ => {}
                }
            }
        })
}

/// Starts the HTTPS test kubelet on 127.0.0.1 with a serving certificate from its own CA;
/// returns its port and the CA certificate (PEM).
async fn start_kubelet(seen: Arc<Seen>) -> (u16, String) {
    let app = Router::new()
        .route("/containerLogs/{ns}/{pod}/{container}", get(container_logs))
        .route("/exec/{ns}/{pod}/{container}", get(exec))
        .route("/attach/{ns}/{pod}/{container}", get(attach))
        .route("/portForward/{ns}/{pod}", get(port_forward))
        .with_state(seen);
    let server = support::https::serve(app, &["127.0.0.1", "localhost"], "test kubelet CA").await;
    (server.port, server.ca_pem)
}

struct Fixture {
    cluster: simkube::Cluster,
    client: Client,
    seen: Arc<Seen>,
    kubelet_port: u16,
    kubelet_ca_pem: String,
}

/// A cluster with node `n1` (served by the test kubelet), bound pod `web` (container `app`),
/// unbound pod `pending`, and pod `lost` bound to a node that does not exist.
async fn fixture() -> Fixture {
    let seen = Arc::new(Seen::default());
    let (kubelet_port, kubelet_ca_pem) = start_kubelet(seen.clone()).await;
    // HTTPS: kubectl sends no bearer token over plain HTTP.
    let cluster = simkube::Cluster::builder()
        .tls(true)
        .start()
        .await
        .expect("start cluster");
    let client = cluster.client();
    let nodes: Api<Node> = Api::all(client.clone());
    let node = json!({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"},
    });
    nodes
        .create(
            &PostParams::default(),
            &serde_json::from_value(node).expect("node"),
        )
        .await
        .expect("create node");
    let status = json!({"status": {
        "addresses": [
            {"type": "Hostname", "address": "n1"},
            {"type": "InternalIP", "address": "127.0.0.1"},
        ],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": kubelet_port}},
    }});
    nodes
        .patch_status("n1", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("node status");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    for (name, node) in [
        ("web", Some("n1")),
        ("pending", None),
        ("lost", Some("gone")),
    ] {
        let mut spec = json!({"containers": [{"name": "app", "image": "example/app"}]});
        if let Some(node) = node {
            spec["nodeName"] = json!(node);
        }
        let pod =
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec});
        pods.create(
            &PostParams::default(),
            &serde_json::from_value(pod).expect("pod"),
        )
        .await
        .expect("create pod");
    }
    Fixture {
        cluster,
        client,
        seen,
        kubelet_port,
        kubelet_ca_pem,
    }
}

fn api_status(err: kube::Error) -> (u16, String) {
    match err {
        kube::Error::Api(status) => (status.code, status.message),
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test]
async fn kube_rs_logs_are_forwarded_with_options() {
    let f = fixture().await;
    let pods: Api<Pod> = Api::namespaced(f.client.clone(), "default");
    let all = pods.logs("web", &LogParams::default()).await.expect("logs");
    assert_eq!(all, "line 1\nline 2\nline 3\nline 4\nline 5\n");
    let tail = pods
        .logs(
            "web",
            &LogParams {
                container: Some("app".into()),
                tail_lines: Some(2),
                timestamps: true,
                ..LogParams::default()
            },
        )
        .await
        .expect("tail");
    assert_eq!(
        tail,
        "2025-01-01T00:00:03Z line 4\n2025-01-01T00:00:04Z line 5\n"
    );
    let seen = f.seen.all();
    assert_eq!(seen[0], "logs default/web/app?");
    assert_eq!(seen[1], "logs default/web/app?timestamps=true&tailLines=2");
}

#[tokio::test]
async fn kube_rs_log_stream_follows() {
    let f = fixture().await;
    let pods: Api<Pod> = Api::namespaced(f.client.clone(), "default");
    let stream = pods
        .log_stream(
            "web",
            &LogParams {
                follow: true,
                tail_lines: Some(1),
                ..LogParams::default()
            },
        )
        .await
        .expect("stream");
    let mut stream = std::pin::pin!(stream);
    let mut text = String::new();
    tokio::time::timeout(
        Duration::from_secs(10),
        futures::AsyncReadExt::read_to_string(&mut stream, &mut text),
    )
    .await
    .expect("the bounded follow ends")
    .expect("read");
    assert_eq!(text, "line 5\nfollowed 1\nfollowed 2\nfollowed 3\n");
}

#[tokio::test]
async fn kube_rs_exec_runs_through_the_kubelet() {
    let f = fixture().await;
    let pods: Api<Pod> = Api::namespaced(f.client.clone(), "default");
    let mut attached = pods
        .exec(
            "web",
            ["echo", "hi", "there"],
            &AttachParams::default().stdout(true).stderr(false),
        )
        .await
        .expect("exec");
    let mut stdout = attached.stdout().expect("stdout");
    let status = attached.take_status().expect("status");
    let mut out = String::new();
    stdout.read_to_string(&mut out).await.expect("read");
    assert_eq!(out, "hi there\n");
    let status = status.await.expect("status arrives");
    assert_eq!(status.status.as_deref(), Some("Success"));
    attached.join().await.expect("join");
    assert_eq!(
        f.seen.all(),
        vec!["exec default/web/app?command=echo&command=hi&command=there&output=1".to_owned()]
    );

    // stdin round trip, closed with the v5 CLOSE signal.
    let mut attached = pods
        .exec(
            "web",
            ["cat"],
            &AttachParams::default()
                .stdin(true)
                .stdout(true)
                .stderr(false),
        )
        .await
        .expect("exec cat");
    let mut stdin = attached.stdin().expect("stdin");
    let mut stdout = attached.stdout().expect("stdout");
    stdin.write_all(b"ping\n").await.expect("write");
    stdin.shutdown().await.expect("close stdin");
    drop(stdin);
    let mut out = String::new();
    tokio::time::timeout(Duration::from_secs(10), stdout.read_to_string(&mut out))
        .await
        .expect("cat ends when stdin closes")
        .expect("read");
    assert_eq!(out, "ping\n");

    // A failing command reports its exit code through the error channel.
    let mut attached = pods
        .exec(
            "web",
            ["fail", "3"],
            &AttachParams::default().stderr(true).stdout(false),
        )
        .await
        .expect("exec fail");
    let status = attached.take_status().expect("status");
    let status = status.await.expect("status");
    assert_eq!(status.reason.as_deref(), Some("NonZeroExitCode"));
}

#[tokio::test]
async fn kube_rs_attach_and_port_forward_are_tunnelled() {
    let f = fixture().await;
    let pods: Api<Pod> = Api::namespaced(f.client.clone(), "default");
    let mut attached = pods
        .attach("web", &AttachParams::default().stdout(true).stderr(false))
        .await
        .expect("attach");
    let mut stdout = attached.stdout().expect("stdout");
    let mut out = String::new();
    stdout.read_to_string(&mut out).await.expect("read");
    assert_eq!(out, "attached to app\n");

    let mut forwarder = pods
        .portforward("web", &[8080, 9090])
        .await
        .expect("port-forward");
    for port in [8080, 9090] {
        let mut stream = forwarder.take_stream(port).expect("stream for the port");
        stream
            .write_all(format!("hello {port}").as_bytes())
            .await
            .expect("write");
        let mut buf = vec![0; 10];
        tokio::time::timeout(Duration::from_secs(10), stream.read_exact(&mut buf))
            .await
            .expect("the kubelet answers")
            .expect("read");
        assert_eq!(String::from_utf8_lossy(&buf), format!("HELLO {port}"));
    }
    forwarder.abort();
    let seen = f.seen.all();
    assert_eq!(seen[0], "attach default/web/app?output=1");
    assert_eq!(seen[1], "portForward default/web?port=8080&port=9090");
}

/// With `--kubelet-certificate-authority` semantics: the kubelet's certificate is verified
/// against the configured CA, and a kubelet with a certificate from elsewhere is refused.
#[tokio::test]
async fn kubelet_certificate_is_verified_when_a_ca_is_configured() {
    use simkube::kubelet_proxy::{KubeletClient, KubeletClientConfig, pod_proxy};
    let f = fixture().await;
    let pods: Api<Pod> = Api::namespaced(f.client.clone(), "default");
    let with_ca = |ca_pem: String| {
        let client = KubeletClient::new(&KubeletClientConfig {
            ca_pem: Some(ca_pem),
            ..KubeletClientConfig::default()
        })
        .expect("kubelet client");
        *f.cluster.state().pod_proxy.write().expect("lock") = Some(pod_proxy(client));
    };
    with_ca(f.kubelet_ca_pem.clone());
    let logs = pods
        .logs("web", &LogParams::default())
        .await
        .expect("verified kubelet");
    assert!(logs.starts_with("line 1\n"), "{logs}");

    let other = rcgen::CertificateParams::default()
        .self_signed(&rcgen::KeyPair::generate().expect("key"))
        .expect("other CA");
    with_ca(other.pem());
    let (code, message) = api_status(
        pods.logs("web", &LogParams::default())
            .await
            .expect_err("untrusted kubelet"),
    );
    assert_eq!(code, 500);
    assert!(message.contains("tls:"), "{message}");
    assert!(
        KubeletClient::new(&KubeletClientConfig {
            ca_pem: Some("not a certificate".into()),
            ..KubeletClientConfig::default()
        })
        .is_err()
    );
}

#[tokio::test]
async fn forwarding_errors_read_like_kube_apiserver() {
    let f = fixture().await;
    let pods: Api<Pod> = Api::namespaced(f.client.clone(), "default");
    let Err(exec_err) = pods
        .exec(
            "pending",
            ["echo"],
            &AttachParams::default().stdout(true).stderr(false),
        )
        .await
    else {
        panic!("exec into an unbound pod must fail");
    };
    let text = format!("{exec_err:?}");
    assert!(text.contains("400"), "{text}");
    // An unbound pod has no logs yet: kube-apiserver answers an empty 200.
    assert_eq!(
        pods.logs("pending", &LogParams::default())
            .await
            .expect("empty"),
        ""
    );
    let (code, message) = api_status(
        pods.logs("lost", &LogParams::default())
            .await
            .expect_err("missing node"),
    );
    assert_eq!((code, message.as_str()), (404, "nodes \"gone\" not found"));
    let (code, message) = api_status(
        pods.logs(
            "web",
            &LogParams {
                container: Some("nope".into()),
                ..LogParams::default()
            },
        )
        .await
        .expect_err("bad container"),
    );
    assert_eq!(
        (code, message.as_str()),
        (400, "container nope is not valid for pod web")
    );
    let (code, _) = api_status(
        pods.logs("absent", &LogParams::default())
            .await
            .expect_err("missing pod"),
    );
    assert_eq!(code, 404);

    // The kubelet goes away: 500 with the dial error.
    let closed = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let dead_port = closed.local_addr().expect("addr").port();
    drop(closed);
    let nodes: Api<Node> = Api::all(f.client.clone());
    let status = json!({"status": {"daemonEndpoints": {"kubeletEndpoint": {"Port": dead_port}}}});
    nodes
        .patch_status("n1", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("repoint node");
    let (code, message) = api_status(
        pods.logs("web", &LogParams::default())
            .await
            .expect_err("kubelet down"),
    );
    assert_eq!(code, 500);
    assert!(
        message.contains(&format!(
            "dial tcp 127.0.0.1:{dead_port}: connect: connection refused"
        )),
        "{message}"
    );
    let _ = f.kubelet_port;
}

/// `kubectl` with a kubeconfig for the cluster, or `None` (with the reason printed) when kubectl
/// is missing outside CI.
fn kubectl(f: &Fixture) -> Option<(tempfile::TempDir, impl Fn(&[&str]) -> std::process::Command)> {
    let found = std::process::Command::new("kubectl")
        .arg("version")
        .arg("--client")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        assert!(
            std::env::var_os("CI").is_none(),
            "kubectl is required in CI but was not found on PATH"
        );
        eprintln!("skipping: kubectl not found on PATH (install it to run the kubectl tests)");
        return None;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, f.cluster.kubeconfig()).expect("write kubeconfig");
    let cache = dir.path().join("cache");
    let command = move |args: &[&str]| {
        let mut c = std::process::Command::new("kubectl");
        c.arg("--kubeconfig")
            .arg(&kubeconfig)
            .arg("--cache-dir")
            .arg(&cache)
            .args(args);
        c
    };
    Some((dir, command))
}

async fn run(mut command: std::process::Command, stdin: Option<&[u8]>) -> std::process::Output {
    let stdin = stdin.map(<[u8]>::to_vec);
    tokio::task::spawn_blocking(move || {
        use std::io::Write as _;
        command
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command.spawn().expect("spawn kubectl");
        if let Some(data) = stdin {
            let mut pipe = child.stdin.take().expect("stdin pipe");
            pipe.write_all(&data).expect("write stdin");
        }
        child.wait_with_output().expect("kubectl output")
    })
    .await
    .expect("join")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[tokio::test]
async fn kubectl_logs_and_exec_work_through_simkube() {
    let f = fixture().await;
    let Some((_dir, kubectl)) = kubectl(&f) else {
        return;
    };
    let out = run(kubectl(&["logs", "web", "--tail=2"]), None).await;
    assert!(out.status.success(), "kubectl logs: {}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "line 4\nline 5\n");

    let out = tokio::time::timeout(
        Duration::from_secs(30),
        run(
            kubectl(&["logs", "-f", "web", "-c", "app", "--tail=1"]),
            None,
        ),
    )
    .await
    .expect("the bounded follow ends");
    assert!(
        out.status.success(),
        "kubectl logs -f: {}",
        text(&out.stderr)
    );
    assert_eq!(
        text(&out.stdout),
        "line 5\nfollowed 1\nfollowed 2\nfollowed 3\n"
    );

    let out = run(kubectl(&["exec", "web", "--", "echo", "hi"]), None).await;
    assert!(out.status.success(), "kubectl exec: {}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "hi\n");

    let out = run(
        kubectl(&["exec", "-i", "web", "--", "cat"]),
        Some(b"from stdin\n"),
    )
    .await;
    assert!(
        out.status.success(),
        "kubectl exec -i: {}",
        text(&out.stderr)
    );
    assert_eq!(text(&out.stdout), "from stdin\n");

    let out = run(kubectl(&["exec", "web", "--", "fail", "3"]), None).await;
    assert_eq!(out.status.code(), Some(3), "stderr: {}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("failing"),
        "{}",
        text(&out.stderr)
    );

    let out = run(kubectl(&["exec", "pending", "--", "echo", "hi"]), None).await;
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("pod pending does not have a host assigned"),
        "{}",
        text(&out.stderr)
    );
}
