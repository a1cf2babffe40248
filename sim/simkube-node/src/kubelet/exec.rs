//! `/exec/{namespace}/{pod}/{container}` and `/attach/{namespace}/{pod}/{container}` as
//! WebSocket sessions: exec runs a command inside the running container (pipes or a terminal)
//! and ends with the Status carrying its exit code; attach streams the container's output as it
//! is written until the container exits (its stdin is `/dev/null`, so there is nothing to
//! attach input to).

// Handlers' helpers return the finished error `Response` by value, as handlers do.
#![allow(clippy::result_large_err)]

use std::time::Duration;

use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade, close_code};
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use futures::stream::{SplitSink, SplitStream};
use futures::{SinkExt as _, StreamExt as _};
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::mpsc;

use super::channel::{self, ClientFrame, StreamOptions};
use super::logs::{Follow, pod_dir, runs};
use super::{Endpoint, LiveLogs, text};
use crate::container_log::{self, Stream};
use crate::containers::{ContainerKey, Containers, RunningContainer};
use crate::metrics::{ActiveGuard, SessionKind};
use crate::process::{ExecStdio, Pty, spawn_in_container};

/// How long output may still arrive after the command exited (a process it left in the
/// background may hold its streams open for ever).
const DRAIN: Duration = Duration::from_secs(1);

/// How often a session checks that its container still runs.
const WATCH: Duration = Duration::from_millis(500);

/// How long the last frames (status, close) may take to reach the client.
const FLUSH: Duration = Duration::from_secs(5);

type Upgrade = Result<WebSocketUpgrade, WebSocketUpgradeRejection>;

pub(super) async fn exec(
    State(endpoint): State<Endpoint>,
    UrlPath((namespace, pod, container)): UrlPath<(String, String, String)>,
    Query(pairs): Query<Vec<(String, String)>>,
    ws: Upgrade,
) -> Response {
    let opts = match StreamOptions::from_pairs(pairs) {
        Ok(opts) => opts,
        Err(message) => return text(StatusCode::BAD_REQUEST, message),
    };
    if opts.command.is_empty() {
        return text(
            StatusCode::BAD_REQUEST,
            "you must specify at least 1 command".to_owned(),
        );
    }
    let key = ContainerKey::new(&namespace, &pod, &container);
    let target = match running(&endpoint, &key) {
        Ok(target) => target,
        Err(response) => return response,
    };
    let ws = match negotiate(ws, "exec") {
        Ok(ws) => ws,
        Err(response) => return response,
    };
    let guard = endpoint.metrics.session(SessionKind::Exec);
    let containers = endpoint.containers;
    ws.on_upgrade(move |socket| exec_session(socket, target, key, opts, containers, guard))
}

pub(super) async fn attach(
    State(endpoint): State<Endpoint>,
    UrlPath((namespace, pod, container)): UrlPath<(String, String, String)>,
    Query(pairs): Query<Vec<(String, String)>>,
    ws: Upgrade,
) -> Response {
    let opts = match StreamOptions::from_pairs(pairs) {
        Ok(opts) => opts,
        Err(message) => return text(StatusCode::BAD_REQUEST, message),
    };
    if opts.stdin || opts.tty {
        return text(
            StatusCode::BAD_REQUEST,
            format!(
                "cannot attach to the stdin or terminal of container {container:?}: simulated \
                 containers run with stdin from /dev/null and no TTY; attach without -i/-t to \
                 stream its output, or use exec"
            ),
        );
    }
    let key = ContainerKey::new(&namespace, &pod, &container);
    if let Err(response) = running(&endpoint, &key) {
        return response;
    }
    let Some(path) = pod_dir(&endpoint.state_dir, &namespace, &pod)
        .and_then(|dir| runs(&dir, &container))
        .and_then(|mut runs| runs.pop())
    else {
        return not_running(&container, &pod);
    };
    let ws = match negotiate(ws, "attach") {
        Ok(ws) => ws,
        Err(response) => return response,
    };
    let guard = endpoint.metrics.session(SessionKind::Attach);
    let live = endpoint.live;
    ws.on_upgrade(move |socket| attach_session(socket, path, live, opts, guard))
}

/// The running container `key`, or the kubelet-like answer why there is none.
fn running(endpoint: &Endpoint, key: &ContainerKey) -> Result<RunningContainer, Response> {
    if let Some(target) = endpoint.containers.get(key) {
        return Ok(target);
    }
    match pod_dir(&endpoint.state_dir, &key.namespace, &key.pod) {
        None => Err(text(
            StatusCode::NOT_FOUND,
            format!(
                "pod {}/{} does not exist on this node",
                key.namespace, key.pod
            ),
        )),
        Some(_) => Err(not_running(&key.container, &key.pod)),
    }
}

fn not_running(container: &str, pod: &str) -> Response {
    text(
        StatusCode::BAD_REQUEST,
        format!(
            "container {container:?} in pod {pod:?} is not running (it is waiting to start, \
             restarting or has terminated)"
        ),
    )
}

/// Accepts the upgrade under the best subprotocol both sides speak.
fn negotiate(ws: Upgrade, what: &str) -> Result<WebSocketUpgrade, Response> {
    let offer = || channel::PROTOCOLS.join(" or ");
    let ws = ws.map_err(|e| {
        text(
            StatusCode::BAD_REQUEST,
            format!(
                "{what} is served as a WebSocket upgrade with subprotocol {} (SPDY is not \
                 served): {e}",
                offer()
            ),
        )
    })?;
    let ws = ws.protocols(channel::PROTOCOLS);
    if ws.selected_protocol().is_none() {
        return Err(text(
            StatusCode::BAD_REQUEST,
            format!(
                "none of the offered WebSocket subprotocols is served; offer {}",
                offer()
            ),
        ));
    }
    Ok(ws)
}

type Sink = SplitSink<WebSocket, Message>;

/// Sends the frames the session queues, in order, until the close frame.
async fn write_frames(mut sink: Sink, mut frames: mpsc::Receiver<Message>) {
    while let Some(message) = frames.recv().await {
        let closing = matches!(message, Message::Close(_));
        if sink.send(message).await.is_err() || closing {
            break;
        }
    }
}

async fn send(tx: &mpsc::Sender<Message>, stream: u8, data: &[u8]) -> bool {
    tx.send(Message::Binary(channel::frame(stream, data).into()))
        .await
        .is_ok()
}

/// Ends a session: the Status on the error stream, then a normal close.
async fn finish(tx: &mpsc::Sender<Message>, status: &Value) {
    send(tx, channel::ERROR, status.to_string().as_bytes()).await;
    let _ = tx
        .send(Message::Close(Some(CloseFrame {
            code: close_code::NORMAL,
            reason: "".into(),
        })))
        .await;
}

async fn exec_session(
    socket: WebSocket,
    target: RunningContainer,
    key: ContainerKey,
    opts: StreamOptions,
    containers: Containers,
    _active: ActiveGuard,
) {
    let v5 = socket
        .protocol()
        .is_some_and(|p| p.as_bytes() == channel::PROTOCOLS[0].as_bytes());
    let (sink, mut incoming) = socket.split();
    let (tx, rx) = mpsc::channel(32);
    let writer = tokio::spawn(write_frames(sink, rx));
    let status = run_command(&mut incoming, &tx, &target, &key, &opts, &containers, v5).await;
    if let Some(status) = status {
        finish(&tx, &status).await;
    }
    drop(tx);
    let _ = tokio::time::timeout(FLUSH, writer).await;
}

/// How a command's session ended.
enum Ending {
    Exited(std::io::Result<crate::process::Exit>),
    ClientGone,
    ContainerGone,
}

/// Runs the command; the Status to send, or `None` when the client is gone.
async fn run_command(
    incoming: &mut SplitStream<WebSocket>,
    tx: &mpsc::Sender<Message>,
    target: &RunningContainer,
    key: &ContainerKey,
    opts: &StreamOptions,
    containers: &Containers,
    v5: bool,
) -> Option<Value> {
    let stdio = if opts.tty {
        ExecStdio::Tty
    } else {
        ExecStdio::Pipes {
            stdin: opts.stdin,
            stdout: opts.stdout,
            stderr: opts.stderr,
        }
    };
    let mut process = match spawn_in_container(target, &opts.command, stdio) {
        Ok(process) => process,
        Err(error) => {
            tracing::info!(container = ?key, %error, "exec failed to start");
            return Some(channel::internal_error(&format!(
                "failed to exec in container: {error}"
            )));
        }
    };
    tracing::debug!(container = ?key, pid = process.pid(), tty = opts.tty, "exec started");
    let pty = process.take_pty();
    let mut stdin = process.take_stdin();
    let stdout = process.take_stdout();
    let stderr = process.take_stderr();
    let output = async {
        match &pty {
            Some(pty) => pump_pty(pty, tx).await,
            None => {
                tokio::join!(
                    pump(stdout, channel::STDOUT, tx),
                    pump(stderr, channel::STDERR, tx)
                );
            }
        }
    };
    let completion = async {
        tokio::pin!(output);
        let wait = process.wait();
        tokio::pin!(wait);
        let mut exit = None;
        let mut output_done = false;
        tokio::select! {
            e = &mut wait => exit = Some(e),
            () = &mut output => output_done = true,
        }
        let exit = match exit {
            Some(exit) => exit,
            None => wait.await,
        };
        if !output_done {
            let _ = tokio::time::timeout(DRAIN, &mut output).await;
        }
        exit
    };
    let input = async {
        while let Some(Ok(message)) = incoming.next().await {
            let data = match message {
                Message::Binary(data) => data,
                Message::Close(_) => break,
                _ => continue,
            };
            match channel::parse_client_frame(&data, v5) {
                Ok(ClientFrame::Stdin(bytes)) => {
                    if let Some(pty) = &pty {
                        let _ = pty.write_all(bytes).await;
                    } else if let Some(pipe) = stdin.as_mut()
                        && pipe.write_all(bytes).await.is_err()
                    {
                        // The command closed its stdin; later input has nowhere to go.
                        stdin = None;
                    }
                }
                // A terminal has no end of input; a pipe gets its EOF.
                Ok(ClientFrame::StdinClosed) => stdin = None,
                Ok(ClientFrame::Resize { width, height }) => {
                    if let Some(pty) = &pty
                        && let Err(error) = pty.resize(width, height)
                    {
                        tracing::debug!(%error, "cannot resize the exec terminal");
                    }
                }
                Ok(ClientFrame::Ignored) => {}
                Err(message) => tracing::debug!(%message, "ignoring a client frame"),
            }
        }
    };
    let ending = tokio::select! {
        exit = completion => Ending::Exited(exit),
        () = input => Ending::ClientGone,
        () = container_gone(containers, key, target.pid) => Ending::ContainerGone,
    };
    match ending {
        Ending::Exited(Ok(exit)) if exit.code == 0 => Some(channel::success()),
        Ending::Exited(Ok(exit)) => Some(channel::exit_failure(&opts.command, exit.code)),
        Ending::Exited(Err(error)) => Some(channel::internal_error(&format!(
            "waiting for the command: {error}"
        ))),
        Ending::ClientGone => {
            tracing::debug!(container = ?key, "exec client went away; killing the command");
            None
        }
        Ending::ContainerGone => {
            // The command dies with its container, as it would in a container runtime.
            process.kill();
            let code = process.wait().await.map_or(137, |exit| exit.code);
            Some(channel::exit_failure(&opts.command, code))
        }
    }
}

/// Copies a pipe to `stream` until its end.
async fn pump(pipe: Option<impl AsyncRead + Unpin>, stream: u8, tx: &mpsc::Sender<Message>) {
    let Some(mut pipe) = pipe else {
        return;
    };
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        match pipe.read(&mut buf).await {
            Ok(n) if n > 0 => {
                if !send(tx, stream, &buf[..n]).await {
                    return;
                }
            }
            _ => return,
        }
    }
}

/// Copies terminal output to stdout until no process holds the terminal.
async fn pump_pty(pty: &Pty, tx: &mpsc::Sender<Message>) {
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        match pty.read(&mut buf).await {
            Ok(n) if n > 0 => {
                if !send(tx, channel::STDOUT, &buf[..n]).await {
                    return;
                }
            }
            _ => return,
        }
    }
}

/// Returns once the container run `pid` of `key` has ended.
async fn container_gone(containers: &Containers, key: &ContainerKey, pid: u32) {
    loop {
        tokio::time::sleep(WATCH).await;
        if containers.get(key).map(|r| r.pid) != Some(pid) {
            return;
        }
    }
}

async fn attach_session(
    socket: WebSocket,
    path: std::path::PathBuf,
    live: LiveLogs,
    opts: StreamOptions,
    _active: ActiveGuard,
) {
    let (sink, mut incoming) = socket.split();
    let (tx, rx) = mpsc::channel(32);
    let writer = tokio::spawn(write_frames(sink, rx));
    let output = async {
        let mut follow = match Follow::from_end(path, live).await {
            Ok(follow) => follow,
            Err(error) => {
                return channel::internal_error(&format!(
                    "reading the container's output: {error}"
                ));
            }
        };
        while let Some(chunk) = follow.next().await {
            let (lines, _) = container_log::lines(&chunk);
            for entry in lines.into_iter().filter_map(container_log::parse) {
                let stream = match entry.stream {
                    Stream::Stdout if opts.stdout => channel::STDOUT,
                    Stream::Stderr if opts.stderr => channel::STDERR,
                    _ => continue,
                };
                let mut data = Vec::with_capacity(entry.content.len() + 1);
                container_log::render(&mut data, &entry, false);
                if !send(&tx, stream, &data).await {
                    return channel::success();
                }
            }
        }
        channel::success()
    };
    let client_gone = async {
        while let Some(Ok(message)) = incoming.next().await {
            if matches!(message, Message::Close(_)) {
                break;
            }
        }
    };
    tokio::select! {
        status = output => finish(&tx, &status).await,
        () = client_gone => {}
    }
    drop(tx);
    let _ = tokio::time::timeout(FLUSH, writer).await;
}
