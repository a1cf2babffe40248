//! `/portForward/{namespace}/{pod}` as the kubelet serves it to the API server: an HTTP upgrade
//! to SPDY/3.1 with `X-Stream-Protocol-Version: portforward.k8s.io`, on which the client opens a
//! pair of streams per forwarded connection (`streamType` `error` and `data`, the same `port`
//! and `requestID` headers). Each pair becomes one TCP connection to `localhost:<port>` made
//! inside the pod's network namespace, as the container runtime does; the bytes of the data
//! stream and of that connection are copied both ways, and a failure is written to the error
//! stream in the kubelet's words before both streams are closed. The kubelet's WebSocket form
//! (`v4.channel.k8s.io`, ports in the query, two channels per port), which kube-rs
//! `Api::portforward` speaks, is served too.

// Handlers' helpers return the finished error `Response` by value, as handlers do.
#![allow(clippy::result_large_err)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade, close_code};
use axum::extract::{FromRequestParts as _, Path as UrlPath, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse as _, Response};
use bytes::{Bytes, BytesMut};
use futures::{SinkExt as _, StreamExt as _};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::channel;
use super::logs::pod_dir;
use super::spdy::{self, Decoder, Encoder, FLAG_FIN, Frame};
use super::{Endpoint, text};

/// The port-forward protocol version negotiated in `X-Stream-Protocol-Version`.
pub(super) const PROTOCOL: &str = "portforward.k8s.io";

/// The header carrying the protocol versions a client speaks (and the one chosen).
const PROTOCOL_HEADER: &str = "x-stream-protocol-version";

/// How long connecting to the pod's port may take.
const DIAL_TIMEOUT: Duration = Duration::from_secs(10);

/// How long one direction of a connection may go on after the other ended.
const GRACE: Duration = Duration::from_secs(1);

/// The largest data frame sent.
const CHUNK: usize = 32 * 1024;

/// Where a session forwards to.
#[derive(Debug, Clone)]
struct Target {
    /// `namespace/pod`, for logs.
    pod: String,
    /// The sandbox's name, which the kubelet's messages call the pod.
    sandbox: String,
    /// The pod's network namespace file.
    netns: PathBuf,
}

pub(super) async fn port_forward(
    State(endpoint): State<Endpoint>,
    UrlPath((namespace, pod)): UrlPath<(String, String)>,
    mut request: Request,
) -> Response {
    let Some(running) = endpoint.containers.of_pod(&namespace, &pod) else {
        let message = if pod_dir(&endpoint.state_dir, &namespace, &pod).is_some() {
            format!(
                "pod {namespace}/{pod} has no running container to forward to (it is waiting to \
                 start, restarting or has terminated)"
            )
        } else {
            format!("pod {namespace}/{pod} does not exist on this node")
        };
        let status = if message.ends_with("on this node") {
            StatusCode::NOT_FOUND
        } else {
            StatusCode::BAD_REQUEST
        };
        return text(status, message);
    };
    let target = Target {
        pod: format!("{namespace}/{pod}"),
        sandbox: running
            .netns
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        netns: running.netns,
    };
    let headers = request.headers();
    let wants_websocket = headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    if wants_websocket {
        return websocket(request, target).await;
    }
    let wants_spdy = headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("SPDY/3.1"));
    if !wants_spdy {
        return text(
            StatusCode::BAD_REQUEST,
            format!(
                "unable to upgrade: port forwarding is served as an upgrade to SPDY/3.1 with \
                 X-Stream-Protocol-Version {PROTOCOL}; send Connection: Upgrade and Upgrade: \
                 SPDY/3.1"
            ),
        );
    }
    let offered: Vec<String> = headers
        .get_all(PROTOCOL_HEADER)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
        .collect();
    // A client naming no version is an old one that speaks the first.
    if !offered.is_empty() && !offered.iter().any(|p| p == PROTOCOL) {
        return text(
            StatusCode::FORBIDDEN,
            format!(
                "unable to upgrade: unable to negotiate protocol: client supports {offered:?}, \
                 server supports [\"{PROTOCOL}\"]"
            ),
        );
    }
    let upgrade = hyper::upgrade::on(&mut request);
    tokio::spawn(async move {
        match upgrade.await {
            Ok(upgraded) => serve_spdy(TokioIo::new(upgraded), target).await,
            Err(e) => tracing::debug!(error = %e, "port-forward upgrade failed"),
        }
    });
    let mut response = StatusCode::SWITCHING_PROTOCOLS.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    headers.insert(header::UPGRADE, HeaderValue::from_static("SPDY/3.1"));
    if !offered.is_empty() {
        headers.insert(PROTOCOL_HEADER, HeaderValue::from_static(PROTOCOL));
    }
    response
}

/// The WebSocket form's subprotocol (binary frames, first byte the channel).
const WS_PROTOCOL: &str = "v4.channel.k8s.io";

/// The WebSocket form: the ports come in the query (`port`, repeated); port `i` gets data
/// channel `2i` and error channel `2i+1`, each opened by a frame carrying the port number
/// (little endian), then one connection per port for the life of the socket.
async fn websocket(request: Request, target: Target) -> Response {
    let ports = match ports_of(request.uri().query().unwrap_or("")) {
        Ok(ports) => ports,
        Err(message) => return text(StatusCode::BAD_REQUEST, message),
    };
    let offered: Vec<String> = request
        .headers()
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
        .collect();
    if !offered.is_empty() && !offered.iter().any(|p| p == WS_PROTOCOL) {
        return text(
            StatusCode::BAD_REQUEST,
            format!(
                "requested protocol(s) are not supported: {offered:?}; supports \
                 [\"{WS_PROTOCOL}\"]"
            ),
        );
    }
    let (mut parts, _body) = request.into_parts();
    let ws = match WebSocketUpgrade::from_request_parts(&mut parts, &()).await {
        Ok(ws) => ws,
        Err(e) => {
            return text(
                StatusCode::BAD_REQUEST,
                format!("invalid WebSocket upgrade request: {e}"),
            );
        }
    };
    ws.protocols([WS_PROTOCOL])
        .on_upgrade(move |socket| serve_websocket(socket, target, ports))
}

/// The `port` parameters of the WebSocket form, checked as the kubelet does.
fn ports_of(query: &str) -> Result<Vec<u16>, String> {
    let mut ports = Vec::new();
    for pair in query.split('&') {
        let Some(value) = pair.strip_prefix("port=") else {
            continue;
        };
        let port: u16 = value
            .parse()
            .map_err(|e| format!("unable to parse {value:?} as a port: {e}"))?;
        if port == 0 {
            return Err(format!("port {value:?} must be > 0"));
        }
        ports.push(port);
    }
    if ports.is_empty() {
        return Err("query parameter \"port\" is required".to_owned());
    }
    // Two channels per port, numbered in one byte.
    if ports.len() > 127 {
        return Err(format!(
            "{} ports requested; at most 127 fit the channel numbers",
            ports.len()
        ));
    }
    Ok(ports)
}

async fn serve_websocket(socket: WebSocket, target: Target, ports: Vec<u16>) {
    let (mut sink, mut incoming) = socket.split();
    let (messages, mut outgoing) = mpsc::channel::<Message>(256);
    let writer = tokio::spawn(async move {
        while let Some(message) = outgoing.recv().await {
            let closing = matches!(message, Message::Close(_));
            if sink.send(message).await.is_err() || closing {
                break;
            }
        }
        let _ = sink.close().await;
    });
    let cancel = CancellationToken::new();
    let mut inbound = Vec::new();
    let mut forwards = tokio::task::JoinSet::new();
    for (index, port) in (0u8..).zip(&ports) {
        let data = 2 * index;
        for channel_number in [data, data + 1] {
            let opening = channel::frame(channel_number, &port.to_le_bytes());
            let _ = messages.send(Message::Binary(opening.into())).await;
        }
        let (tx, rx) = mpsc::channel(64);
        inbound.push(tx);
        forwards.spawn(forward(
            *port,
            target.clone(),
            rx,
            Outlet::WebSocket {
                messages: messages.clone(),
                data,
                error: data + 1,
            },
            cancel.clone(),
        ));
    }
    loop {
        tokio::select! {
            message = incoming.next() => match message {
                Some(Ok(Message::Binary(frame))) => {
                    if let Some((&number, payload)) = frame.split_first()
                        && number % 2 == 0
                        && !payload.is_empty()
                        && let Some(tx) = inbound.get(usize::from(number / 2))
                    {
                        let _ = tx.send(Bytes::copy_from_slice(payload)).await;
                    }
                }
                Some(Ok(Message::Close(_)) | Err(_)) | None => break,
                Some(Ok(_)) => {}
            },
            // The socket closes once every port's connection has ended, as the kubelet's does.
            ended = forwards.join_next() => if ended.is_none() {
                break;
            },
        }
    }
    cancel.cancel();
    drop(inbound);
    while forwards.join_next().await.is_some() {}
    let _ = messages
        .send(Message::Close(Some(CloseFrame {
            code: close_code::NORMAL,
            reason: "".into(),
        })))
        .await;
    drop(messages);
    let _ = writer.await;
}

/// A stream pair as it is being opened.
#[derive(Default)]
struct Pair {
    port: Option<u16>,
    error: Option<u32>,
    data: Option<(u32, mpsc::Receiver<Bytes>)>,
}

/// The client side of a data stream while its connection runs.
struct Active {
    inbound: Option<mpsc::Sender<Bytes>>,
    cancel: CancellationToken,
}

/// Runs one SPDY connection until the client goes away.
async fn serve_spdy<IO>(io: IO, target: Target)
where
    IO: AsyncRead + AsyncWrite + Send + 'static,
{
    let (mut reader, writer) = tokio::io::split(io);
    let (frames, outgoing) = mpsc::channel::<Frame>(256);
    let writing = tokio::spawn(write_frames(writer, outgoing));
    let mut decoder = Decoder::new();
    let mut buf = BytesMut::with_capacity(64 * 1024);
    let mut pairs: HashMap<String, Pair> = HashMap::new();
    let mut active: HashMap<u32, Active> = HashMap::new();
    'session: loop {
        loop {
            let frame = match decoder.decode(&mut buf) {
                Ok(Some(frame)) => frame,
                Ok(None) => break,
                Err(e) => {
                    tracing::debug!(pod = %target.pod, error = %e, "port-forward protocol error");
                    let _ = frames
                        .send(Frame::GoAway {
                            last_good_stream_id: 0,
                            status: 1,
                        })
                        .await;
                    break 'session;
                }
            };
            match frame {
                Frame::SynStream {
                    stream_id, headers, ..
                } => {
                    let _ = frames
                        .send(Frame::SynReply {
                            stream_id,
                            flags: 0,
                            headers: Vec::new(),
                        })
                        .await;
                    match classify(stream_id, &headers) {
                        Ok((kind, port, request_id)) => {
                            let pair = pairs.entry(request_id.clone()).or_default();
                            pair.port = Some(port);
                            match kind {
                                StreamKind::Error => pair.error = Some(stream_id),
                                StreamKind::Data => {
                                    let (tx, rx) = mpsc::channel(64);
                                    pair.data = Some((stream_id, rx));
                                    active.insert(
                                        stream_id,
                                        Active {
                                            inbound: Some(tx),
                                            cancel: CancellationToken::new(),
                                        },
                                    );
                                }
                            }
                            let complete = pair.error.is_some() && pair.data.is_some();
                            if complete
                                && let Some(Pair {
                                    port: Some(port),
                                    error: Some(error),
                                    data: Some((data, inbound)),
                                }) = pairs.remove(&request_id)
                            {
                                let cancel = active
                                    .get(&data)
                                    .map(|a| a.cancel.clone())
                                    .unwrap_or_default();
                                tokio::spawn(forward(
                                    port,
                                    target.clone(),
                                    inbound,
                                    Outlet::Spdy {
                                        frames: frames.clone(),
                                        data,
                                        error,
                                    },
                                    cancel,
                                ));
                            }
                        }
                        Err(message) => {
                            tracing::debug!(pod = %target.pod, stream_id, "{message}");
                            let _ = frames
                                .send(Frame::RstStream {
                                    stream_id,
                                    status: spdy::RST_PROTOCOL_ERROR,
                                })
                                .await;
                        }
                    }
                }
                Frame::Data {
                    stream_id,
                    flags,
                    data,
                } => {
                    if let Some(stream) = active.get_mut(&stream_id) {
                        if !data.is_empty()
                            && let Some(inbound) = &stream.inbound
                        {
                            // A connection that stopped reading (the pod closed it) just
                            // drops what still arrives.
                            let _ = inbound.send(data).await;
                        }
                        if flags & FLAG_FIN != 0 {
                            stream.inbound = None;
                        }
                    }
                }
                Frame::RstStream { stream_id, .. } => {
                    if let Some(stream) = active.remove(&stream_id) {
                        stream.cancel.cancel();
                    }
                }
                Frame::Ping { id } => {
                    let _ = frames.send(Frame::Ping { id }).await;
                }
                Frame::GoAway { .. } => break 'session,
                Frame::SynReply { .. }
                | Frame::Headers { .. }
                | Frame::Settings { .. }
                | Frame::WindowUpdate { .. }
                | Frame::Unknown { .. } => {}
            }
        }
        match reader.read_buf(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
    for (_, stream) in active.drain() {
        stream.cancel.cancel();
    }
    drop(frames);
    let _ = writing.await;
}

async fn write_frames<W: AsyncWrite>(writer: W, mut outgoing: mpsc::Receiver<Frame>) {
    tokio::pin!(writer);
    let mut encoder = Encoder::new();
    let mut out = BytesMut::new();
    while let Some(frame) = outgoing.recv().await {
        out.clear();
        if let Err(e) = encoder.encode(&frame, &mut out) {
            tracing::debug!(error = %e, "port-forward frame not encodable");
            break;
        }
        // Send whatever else is queued in the same write.
        while let Ok(frame) = outgoing.try_recv() {
            if encoder.encode(&frame, &mut out).is_err() {
                break;
            }
        }
        if writer.write_all(&out).await.is_err() || writer.flush().await.is_err() {
            break;
        }
    }
    let _ = writer.shutdown().await;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StreamKind {
    Error,
    Data,
}

/// A stream's kind, port and request id from its headers, checked as the kubelet does.
fn classify(stream_id: u32, headers: &spdy::Headers) -> Result<(StreamKind, u16, String), String> {
    let kind = match spdy::header(headers, "streamtype") {
        Some("error") => StreamKind::Error,
        Some("data") => StreamKind::Data,
        Some(other) => return Err(format!("invalid stream type {other:?}")),
        None => return Err("streamType header not set".to_owned()),
    };
    let port = spdy::header(headers, "port").ok_or("port header not set")?;
    let port = port
        .parse::<u16>()
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| format!("invalid port {port:?}"))?;
    // Clients before request ids paired a data stream with the error stream opened just
    // before it.
    let request_id = match spdy::header(headers, "requestid") {
        Some(id) if !id.is_empty() => id.to_owned(),
        _ => match kind {
            StreamKind::Error => stream_id.to_string(),
            StreamKind::Data => stream_id.saturating_sub(2).to_string(),
        },
    };
    Ok((kind, port, request_id))
}

/// Where one forwarded connection's bytes and error go: a SPDY stream pair, or a WebSocket
/// channel pair.
#[derive(Clone)]
enum Outlet {
    Spdy {
        frames: mpsc::Sender<Frame>,
        data: u32,
        error: u32,
    },
    WebSocket {
        messages: mpsc::Sender<Message>,
        data: u8,
        error: u8,
    },
}

impl Outlet {
    /// Sends bytes from the pod; false once the client side is gone.
    async fn data(&self, bytes: Bytes) -> bool {
        match self {
            Outlet::Spdy { frames, data, .. } => frames
                .send(Frame::Data {
                    stream_id: *data,
                    flags: 0,
                    data: bytes,
                })
                .await
                .is_ok(),
            Outlet::WebSocket { messages, data, .. } => messages
                .send(Message::Binary(channel::frame(*data, &bytes).into()))
                .await
                .is_ok(),
        }
    }

    /// Reports a failure on the error stream or channel.
    async fn error(&self, message: String) {
        match self {
            Outlet::Spdy { frames, error, .. } => {
                let _ = frames
                    .send(Frame::Data {
                        stream_id: *error,
                        flags: 0,
                        data: Bytes::from(message),
                    })
                    .await;
            }
            Outlet::WebSocket {
                messages, error, ..
            } => {
                let _ = messages
                    .send(Message::Binary(
                        channel::frame(*error, message.as_bytes()).into(),
                    ))
                    .await;
            }
        }
    }

    /// Ends the data stream (the WebSocket channels have no end of their own).
    async fn end_data(&self) {
        if let Outlet::Spdy { frames, data, .. } = self {
            let _ = frames.send(fin(*data)).await;
        }
    }

    /// Ends the error stream.
    async fn end_error(&self) {
        if let Outlet::Spdy { frames, error, .. } = self {
            let _ = frames.send(fin(*error)).await;
        }
    }
}

fn fin(stream_id: u32) -> Frame {
    Frame::Data {
        stream_id,
        flags: FLAG_FIN,
        data: Bytes::new(),
    }
}

/// One forwarded connection: dials the pod's port, then copies until both directions ended
/// or the client reset the data stream; the error stream carries a failure, then closes.
async fn forward(
    port: u16,
    target: Target,
    mut inbound: mpsc::Receiver<Bytes>,
    outlet: Outlet,
    cancel: CancellationToken,
) {
    let tcp = match dial_in_netns(&target.netns, port).await {
        Ok(tcp) => tcp,
        Err(reason) => {
            let message = format!(
                "error forwarding port {port} to pod {}, uid : failed to execute portforward in \
                 network namespace {:?}: {reason}",
                target.sandbox,
                target.netns.display().to_string()
            );
            tracing::debug!(pod = %target.pod, "{message}");
            outlet.error(message).await;
            outlet.end_error().await;
            outlet.end_data().await;
            return;
        }
    };
    let _ = tcp.set_nodelay(true);
    let (mut rd, mut wr) = tcp.into_split();
    let upstream = async {
        while let Some(chunk) = inbound.recv().await {
            if wr.write_all(&chunk).await.is_err() {
                break;
            }
        }
        let _ = wr.shutdown().await;
    };
    let downstream = async {
        let mut buf = vec![0u8; CHUNK];
        loop {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if !outlet.data(Bytes::copy_from_slice(&buf[..n])).await {
                        return true;
                    }
                }
            }
        }
        // The pod's side ended: the client hears it at once.
        outlet.end_data().await;
        true
    };
    // As the container runtime does: once one direction has ended, the other gets a moment
    // to finish, then both streams close (a client that keeps its side open, as kubectl
    // before 1.29 does while waiting for the error stream, is not left hanging).
    tokio::pin!(upstream, downstream);
    let mut data_closed = false;
    let first = tokio::select! {
        () = &mut upstream => Some(true),
        closed = &mut downstream => {
            data_closed = closed;
            Some(false)
        }
        // A reset stream takes no more frames.
        () = cancel.cancelled() => {
            data_closed = true;
            None
        }
    };
    if let Some(upstream_ended) = first {
        tokio::select! {
            closed = tokio::time::timeout(GRACE, &mut downstream), if upstream_ended => {
                data_closed = closed.unwrap_or(false);
            }
            _ = tokio::time::timeout(GRACE, &mut upstream), if !upstream_ended => {}
            () = cancel.cancelled() => data_closed = true,
        }
    }
    if !data_closed {
        outlet.end_data().await;
    }
    outlet.end_error().await;
}

/// Connects to `localhost:port` from inside the network namespace `netns`, IPv4 first, then
/// IPv6, as the container runtime does; the error reads like the runtime's.
async fn dial_in_netns(netns: &Path, port: u16) -> Result<tokio::net::TcpStream, String> {
    let (tx, rx) = oneshot::channel();
    let netns = netns.to_owned();
    // setns changes the calling thread for good, so the dial gets a thread of its own; the
    // socket stays in the pod's namespace after the thread is gone.
    std::thread::Builder::new()
        .name("portforward-dial".to_owned())
        .spawn(move || {
            let _ = tx.send(dial_blocking(&netns, port));
        })
        .map_err(|e| format!("cannot start a thread to dial: {e}"))?;
    let stream = rx
        .await
        .map_err(|_| "the dialing thread ended without an answer".to_owned())??;
    stream
        .set_nonblocking(true)
        .map_err(|e| format!("socket setup: {e}"))?;
    tokio::net::TcpStream::from_std(stream).map_err(|e| format!("socket setup: {e}"))
}

fn dial_blocking(netns: &Path, port: u16) -> Result<std::net::TcpStream, String> {
    let file = std::fs::File::open(netns)
        .map_err(|e| format!("cannot open network namespace {}: {e}", netns.display()))?;
    nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
        .map_err(|e| format!("cannot enter network namespace {}: {e}", netns.display()))?;
    let v4 = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let v6 = std::net::SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, port));
    let err4 = match std::net::TcpStream::connect_timeout(&v4, DIAL_TIMEOUT) {
        Ok(stream) => return Ok(stream),
        Err(e) => e,
    };
    let err6 = match std::net::TcpStream::connect_timeout(&v6, DIAL_TIMEOUT) {
        Ok(stream) => return Ok(stream),
        Err(e) => e,
    };
    let sandbox = netns
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    Err(format!(
        "failed to connect to localhost:{port} inside namespace {sandbox:?}, IPv4: dial tcp4 \
         {v4}: {} IPv6 dial tcp6 {v6}: {} ",
        go_error(&err4),
        go_error(&err6)
    ))
}

/// An IO error as Go's net package words it.
fn go_error(error: &std::io::Error) -> String {
    match error.kind() {
        std::io::ErrorKind::ConnectionRefused => "connect: connection refused".to_owned(),
        std::io::ErrorKind::TimedOut => "i/o timeout".to_owned(),
        std::io::ErrorKind::AddrNotAvailable => {
            "connect: cannot assign requested address".to_owned()
        }
        std::io::ErrorKind::NetworkUnreachable => "connect: network is unreachable".to_owned(),
        _ => format!("connect: {error}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> spdy::Headers {
        pairs
            .iter()
            .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn websocket_ports_are_required_and_checked() {
        assert_eq!(ports_of("port=80&port=8080"), Ok(vec![80, 8080]));
        assert_eq!(ports_of("x=1&port=443"), Ok(vec![443]));
        assert_eq!(
            ports_of(""),
            Err("query parameter \"port\" is required".to_owned())
        );
        assert!(
            ports_of("port=http")
                .expect_err("name")
                .starts_with("unable to parse \"http\" as a port")
        );
        assert_eq!(ports_of("port=0"), Err("port \"0\" must be > 0".to_owned()));
    }

    #[test]
    fn streams_are_classified_and_old_clients_pair_by_stream_id() {
        assert_eq!(
            classify(
                1,
                &headers(&[("streamtype", "error"), ("port", "80"), ("requestid", "7")])
            ),
            Ok((StreamKind::Error, 80, "7".to_owned()))
        );
        assert_eq!(
            classify(3, &headers(&[("streamtype", "error"), ("port", "80")])),
            Ok((StreamKind::Error, 80, "3".to_owned()))
        );
        assert_eq!(
            classify(5, &headers(&[("streamtype", "data"), ("port", "80")])),
            Ok((StreamKind::Data, 80, "3".to_owned()))
        );
        assert!(classify(1, &headers(&[("port", "80")])).is_err());
        assert!(classify(1, &headers(&[("streamtype", "data")])).is_err());
        assert!(
            classify(1, &headers(&[("streamtype", "data"), ("port", "0")]))
                .expect_err("port 0")
                .contains("invalid port")
        );
        assert!(classify(1, &headers(&[("streamtype", "resize"), ("port", "1")])).is_err());
    }
}
