//! `kubectl port-forward` with the real kubectl against a simulated node: 1.33 tunnels SPDY/3.1
//! inside WebSocket, 1.27 upgrades to SPDY/3.1; both go through simkube's pod proxy to the
//! node agent's kubelet endpoint, which connects inside the pod's network namespace. Checked:
//! two concurrent connections, a few MB each way byte for byte, HTTP, and a port nothing
//! listens on: kubectl prints the kubelet's error and, as client-go does, ends the forward
//! ("lost connection to pod"); the next version's forward then works on the same node (root
//! and kubectl; skipped with a printed reason only when missing and CI is unset). kube-rs
//! `Api::portforward` (the kubelet's WebSocket form) on the same pod.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{LogParams, PostParams};
use tether_testkit::{patience, require_tools_or_skip};
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::TcpStream;

mod support;
use support::{Fixture, container_status, fast_backoff, pod, wait_pod};

/// The echo built-in's TCP port (answers each line) and HTTP port.
const TCP_PORT: u16 = 7000;
const HTTP_PORT: u16 = 8080;
/// A port nothing in the pod listens on.
const CLOSED_PORT: u16 = 7999;

/// The version-specific kubectl binaries beside the dispatcher on PATH, newest first; the
/// dispatcher alone (it picks by the server's version, 1.33) when there are none.
fn kubectl_binaries() -> Vec<(String, PathBuf)> {
    let dispatcher = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .map(|dir| dir.join("kubectl"))
        .find(|p| p.is_file())
        .and_then(|p| std::fs::canonicalize(p).ok());
    let mut found: Vec<(u32, PathBuf)> = dispatcher
        .as_deref()
        .and_then(Path::parent)
        .and_then(|dir| std::fs::read_dir(dir).ok())
        .into_iter()
        .flatten()
        .filter_map(|entry| {
            let path = entry.ok()?.path();
            let minor = path.file_name()?.to_str()?.strip_prefix("kubectl.1.")?;
            Some((minor.parse().ok()?, path))
        })
        .filter(|(minor, _)| [27, 33].contains(minor))
        .collect();
    found.sort_by(|a, b| b.cmp(a));
    if found.is_empty() {
        eprintln!("no kubectl.1.NN binaries beside kubectl: checking the dispatcher only");
        return vec![("dispatcher".to_owned(), PathBuf::from("kubectl"))];
    }
    found
        .into_iter()
        .map(|(minor, path)| (format!("1.{minor}"), path))
        .collect()
}

/// A running `kubectl port-forward`, its forwarded ports and what it wrote to stderr.
struct Forward {
    child: tokio::process::Child,
    local: BTreeMap<u16, u16>,
    stderr: Arc<Mutex<String>>,
}

impl Forward {
    async fn start(binary: &Path, kubeconfig: &Path, cache: &Path, remote: &[u16]) -> Self {
        let mut args = vec![
            "--kubeconfig".to_owned(),
            kubeconfig.display().to_string(),
            "--cache-dir".to_owned(),
            cache.display().to_string(),
            "-v=7".to_owned(),
            "port-forward".to_owned(),
            "pod/echo".to_owned(),
        ];
        args.extend(remote.iter().map(|p| format!(":{p}")));
        let mut child = tokio::process::Command::new(binary)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn kubectl port-forward");
        let stderr = Arc::new(Mutex::new(String::new()));
        {
            let stderr = stderr.clone();
            let mut pipe = BufReader::new(child.stderr.take().expect("stderr"));
            tokio::spawn(async move {
                let mut line = String::new();
                while pipe.read_line(&mut line).await.is_ok_and(|n| n > 0) {
                    stderr.lock().expect("stderr").push_str(&line);
                    line.clear();
                }
            });
        }
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut local = BTreeMap::new();
        let deadline = tokio::time::Instant::now() + patience(Duration::from_secs(20));
        while local.len() < remote.len() {
            let mut line = String::new();
            let read = tokio::time::timeout_at(deadline, stdout.read_line(&mut line)).await;
            assert!(
                matches!(read, Ok(Ok(n)) if n > 0),
                "kubectl port-forward printed no forwarding lines ({read:?}); stderr: {}",
                stderr.lock().expect("stderr")
            );
            // "Forwarding from 127.0.0.1:41234 -> 7000" (and the same for [::1]).
            if let Some(rest) = line.trim().strip_prefix("Forwarding from 127.0.0.1:") {
                let (l, r) = rest.split_once(" -> ").expect("local -> remote");
                local.insert(r.parse().expect("remote"), l.parse().expect("local"));
            }
        }
        // Keep draining stdout ("Handling connection for ...") so kubectl never blocks on it.
        tokio::spawn(async move {
            let mut sink = Vec::new();
            let _ = stdout.read_to_end(&mut sink).await;
        });
        Self {
            child,
            local,
            stderr,
        }
    }

    async fn connect(&self, remote: u16) -> TcpStream {
        TcpStream::connect(("127.0.0.1", self.local[&remote]))
            .await
            .expect("connect to the forwarded port")
    }

    fn stderr(&self) -> String {
        self.stderr.lock().expect("stderr").clone()
    }
}

/// One line to the echo and its answer.
async fn exchange(forward: &Forward, message: &str) -> String {
    let stream = forward.connect(TCP_PORT).await;
    let (reader, mut writer) = stream.into_split();
    writer
        .write_all(format!("{message}\n").as_bytes())
        .await
        .expect("write");
    let mut answer = String::new();
    tokio::time::timeout(
        patience(Duration::from_secs(10)),
        BufReader::new(reader).read_line(&mut answer),
    )
    .await
    .unwrap_or_else(|_| panic!("no answer to {message:?}; stderr {}", forward.stderr()))
    .expect("read");
    answer
}

/// `count` distinct printable lines of `width` bytes (no newline inside).
fn lines(count: usize, width: usize) -> Vec<String> {
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..count)
        .map(|i| {
            let mut line = format!("{i:08} ");
            while line.len() < width {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                line.push(char::from(b' ' + ((state >> 33) % 95) as u8));
            }
            line
        })
        .collect()
}

/// Sends `lines` while reading the answers; once every answer is in, half-closes and
/// returns everything read until the forward closed the connection.
async fn bulk(forward: &Forward, lines: &[String]) -> Vec<u8> {
    let stream = forward.connect(TCP_PORT).await;
    let (mut reader, mut writer) = stream.into_split();
    let (all_read, mut all_read_rx) = tokio::sync::oneshot::channel::<()>();
    let send = async {
        let mut payload = Vec::new();
        for line in lines {
            payload.extend_from_slice(line.as_bytes());
            payload.push(b'\n');
        }
        for chunk in payload.chunks(64 * 1024) {
            writer.write_all(chunk).await.expect("write");
        }
        let _ = (&mut all_read_rx).await;
        writer.shutdown().await.expect("half-close");
    };
    let receive = async {
        let mut got = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        let mut all_read = Some(all_read);
        let mut answers = 0;
        loop {
            let n = reader.read(&mut buf).await.expect("read");
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
            answers += buf[..n].iter().filter(|b| **b == b'\n').count();
            if answers >= lines.len()
                && let Some(tx) = all_read.take()
            {
                let _ = tx.send(());
            }
        }
        got
    };
    let ((), got) = tokio::time::timeout(patience(Duration::from_secs(60)), async {
        tokio::join!(send, receive)
    })
    .await
    .unwrap_or_else(|_| panic!("bulk transfer stalled; stderr {}", forward.stderr()));
    got
}

async fn check(version: &str, binary: &Path, kubeconfig: &Path) {
    let cache = tempfile::tempdir().expect("cache");
    let mut forward = Forward::start(
        binary,
        kubeconfig,
        cache.path(),
        &[TCP_PORT, HTTP_PORT, CLOSED_PORT],
    )
    .await;

    // Two connections at once, each answered on its own.
    let (one, two) = tokio::join!(
        exchange(&forward, "hello one"),
        exchange(&forward, "hello two")
    );
    for (answer, message) in [(&one, "hello one"), (&two, "hello two")] {
        // The runtime dials localhost inside the pod, so the echo sees a loopback peer.
        assert!(
            answer.starts_with("pod=echo peer=127.0.0.1:")
                && answer.ends_with(&format!(" {message}\n")),
            "kubectl {version}: {answer:?}"
        );
    }

    // A few MB each way, byte for byte.
    let sent = lines(40_000, 100);
    let got = bulk(&forward, &sent).await;
    let text = String::from_utf8(got).expect("utf-8 answers");
    let peer = text
        .split_once(' ')
        .and_then(|(_, rest)| rest.split_once(' '))
        .map(|(peer, _)| peer.to_owned())
        .expect("an answer with a peer");
    let mut want = String::with_capacity(text.len());
    for line in &sent {
        want.push_str(&format!("pod=echo {peer} {line}\n"));
    }
    assert!(
        text.len() > 4_000_000,
        "kubectl {version}: {} bytes",
        text.len()
    );
    assert!(
        text == want,
        "kubectl {version}: {} bytes back, {} expected; first difference at {:?}",
        text.len(),
        want.len(),
        text.bytes().zip(want.bytes()).position(|(a, b)| a != b)
    );

    // HTTP through the second forwarded port.
    let mut http = forward.connect(HTTP_PORT).await;
    http.write_all(b"GET /through-the-forward HTTP/1.1\r\nHost: echo\r\n\r\n")
        .await
        .expect("request");
    let mut response = String::new();
    tokio::time::timeout(
        patience(Duration::from_secs(10)),
        http.read_to_string(&mut response),
    )
    .await
    .expect("HTTP answer in time")
    .expect("read");
    assert!(
        response.starts_with("HTTP/1.1 200 OK") && response.contains("path=/through-the-forward"),
        "kubectl {version}: {response:?}"
    );

    // A port nothing listens on: the connection closes without data and kubectl reports the
    // kubelet's error.
    let mut closed = forward.connect(CLOSED_PORT).await;
    let mut nothing = Vec::new();
    let _ = tokio::time::timeout(
        patience(Duration::from_secs(10)),
        closed.read_to_end(&mut nothing),
    )
    .await
    .expect("the connection to a closed port ends");
    assert!(nothing.is_empty(), "kubectl {version}: {nothing:?}");
    let deadline = tokio::time::Instant::now() + patience(Duration::from_secs(10));
    while !forward.stderr().contains("connection refused") {
        assert!(
            tokio::time::Instant::now() < deadline,
            "kubectl {version} reported no error: {}",
            forward.stderr()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let stderr = forward.stderr();
    assert!(
        stderr.contains(&format!(
            "an error occurred forwarding {} -> {CLOSED_PORT}",
            forward.local[&CLOSED_PORT]
        )) && stderr.contains(&format!("error forwarding port {CLOSED_PORT} to pod"))
            && stderr.contains(&format!(
                "failed to connect to localhost:{CLOSED_PORT} inside namespace"
            )),
        "kubectl {version}: {stderr}"
    );
    // client-go ends the whole forward when an error stream reports a failure (it closes the
    // SPDY connection), in 1.27 as in 1.33.
    let status = tokio::time::timeout(patience(Duration::from_secs(10)), forward.child.wait())
        .await
        .unwrap_or_else(|_| panic!("kubectl {version} went on after the error: {stderr}"))
        .expect("wait");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let stderr = forward.stderr();
    assert!(
        !status.success() && stderr.contains("lost connection to pod"),
        "kubectl {version}: {status}: {stderr}"
    );

    // Which protocol carried it (kubectl -v=7 logs its requests).
    if version == "1.33" {
        assert!(
            stderr.contains("Sec-Websocket-Protocol: SPDY/3.1+portforward.k8s.io")
                && stderr.contains("negotiated protocol: portforward.k8s.io"),
            "kubectl 1.33 tunnels SPDY in WebSocket: {stderr}"
        );
    } else if version == "1.27" {
        assert!(
            stderr.contains("POST ") && stderr.contains("/pods/echo/portforward"),
            "kubectl 1.27 upgrades to SPDY: {stderr}"
        );
    }
}

/// kube-rs speaks the kubelet's WebSocket form (channels per port, ports in the query): a
/// line through the open port, and the kubelet's error on the channel of the closed one.
async fn kube_rs_port_forward(api: &Api<Pod>) {
    let mut forwarder = api
        .portforward("echo", &[TCP_PORT, CLOSED_PORT])
        .await
        .expect("kube-rs port-forward");
    let mut stream = forwarder.take_stream(TCP_PORT).expect("stream");
    stream.write_all(b"from kube-rs\n").await.expect("write");
    let mut answer = String::new();
    tokio::time::timeout(
        patience(Duration::from_secs(10)),
        BufReader::new(&mut stream).read_line(&mut answer),
    )
    .await
    .expect("kube-rs answer in time")
    .expect("read");
    assert!(
        answer.starts_with("pod=echo peer=127.0.0.1:") && answer.ends_with(" from kube-rs\n"),
        "{answer:?}"
    );
    let error = tokio::time::timeout(
        patience(Duration::from_secs(10)),
        forwarder.take_error(CLOSED_PORT).expect("error channel"),
    )
    .await
    .expect("the closed port's error in time")
    .expect("an error message");
    assert!(
        error.contains(&format!("error forwarding port {CLOSED_PORT} to pod"))
            && error.contains("connection refused"),
        "{error}"
    );
    drop(stream);
    forwarder.abort();
}

#[test]
fn kubectl_port_forward_carries_tcp_both_ways() {
    if !require_tools_or_skip(&["kubectl"]) {
        return;
    }
    let binaries = kubectl_binaries();
    let fixture = Fixture::new("skn-pf");
    let kubeconfig = fixture.kubeconfig();
    // HTTPS as in `simkube cluster up`: the upgrades must survive ALPN and TLS.
    fixture.run_with(
        fast_backoff(),
        |b| b.tls(true),
        |_| {},
        |client, node| async move {
            let api: Api<Pod> = Api::namespaced(client, "default");
            api.create(
                &PostParams::default(),
                &pod("echo", &node, "simkube.dev/echo", &[], "Always"),
            )
            .await
            .expect("create");
            wait_pod(&api, "echo", Duration::from_secs(20), "running", |p| {
                container_status(p)
                    .is_some_and(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
            })
            .await;
            // The echo says when it listens; a forward before that would only test the refusal.
            let deadline = tokio::time::Instant::now() + patience(Duration::from_secs(15));
            while !api
                .logs("echo", &LogParams::default())
                .await
                .is_ok_and(|l| l.contains("serving tcp"))
            {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "the echo never listened"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            for (version, binary) in &binaries {
                check(version, binary, &kubeconfig).await;
            }
            kube_rs_port_forward(&api).await;
        },
    );
}
