//! The IO side of container probes: runs exec, TCP, HTTP(S) and gRPC probe attempts against a
//! running container, drives one container run's [`ContainerProbes`] on the clock, and records
//! the kubelet's `Unhealthy` and `Killing` events (deduplicated and counted like the kubelet's
//! event correlator).
//!
//! Network probes connect from the agent's own namespace (the node's), which routes to every
//! pod IP on the node, as the kubelet probes from the host. Exec probes run inside the
//! container's namespaces through [`crate::process::run_in_container`].

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Empty, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Container, Event, EventSource, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use tokio::net::TcpStream;
use tokio::task::JoinSet;

use crate::containers::RunningContainer;
use crate::probes::{
    Action, ContainerProbes, Decision, Outcome, ProbeKind, ProbeSpec, Scheme, container_probes,
    resolve_port,
};

/// How much exec output (and HTTP body) the kubelet keeps of a probe.
const OUTPUT_LIMIT: usize = 10 * 1024;

/// The User-Agent of HTTP probes (`kube-probe/<major>.<minor>`, as the kubelet sends).
const USER_AGENT: &str = "kube-probe/1.33";

/// How long an event key is remembered for counting repeats (the kubelet's correlator keeps
/// similar events for 10 minutes).
const EVENT_MEMORY: Duration = Duration::from_secs(600);

/// The container a probe reaches: its pod's address, its spec (for named ports) and the
/// running process (for exec probes).
#[derive(Debug, Clone)]
pub struct ProbeTarget {
    /// The pod's IP (the node's for host-network pods).
    pub pod_ip: IpAddr,
    /// The container's spec.
    pub container: Container,
    /// The running container.
    pub running: RunningContainer,
}

/// Runs one attempt of `action` against `target`, giving up after `timeout`.
pub async fn run_probe(action: &Action, target: &ProbeTarget, timeout: Duration) -> Outcome {
    match action {
        Action::Exec { command } => exec(command, target, timeout).await,
        Action::TcpSocket { host, port } => match resolve_port(port, &target.container) {
            Ok(port) => match address(host.as_deref(), target.pod_ip, port).await {
                Ok(addr) => tcp(addr, timeout).await,
                Err(message) => Outcome::Failure(message),
            },
            Err(e) => Outcome::Failure(e.to_string()),
        },
        Action::HttpGet {
            scheme,
            host,
            port,
            path,
            headers,
        } => match resolve_port(port, &target.container) {
            Ok(port) => {
                http_get(
                    *scheme,
                    host.as_deref(),
                    target.pod_ip,
                    port,
                    path,
                    headers,
                    timeout,
                )
                .await
            }
            Err(e) => Outcome::Failure(e.to_string()),
        },
        Action::Grpc { port, service } => {
            grpc(SocketAddr::new(target.pod_ip, *port), service, timeout).await
        }
        Action::Invalid { reason } => Outcome::Failure(reason.clone()),
    }
}

/// `host:port` as a socket address; a name is resolved (from the node, as the kubelet does).
async fn address(host: Option<&str>, pod_ip: IpAddr, port: u16) -> Result<SocketAddr, String> {
    let Some(host) = host else {
        return Ok(SocketAddr::new(pod_ip, port));
    };
    if let Ok(ip) = host.trim_matches(['[', ']']).parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    tokio::net::lookup_host((host, port))
        .await
        .map_err(|e| format!("dial tcp: lookup {host}: {e}"))?
        .next()
        .ok_or_else(|| format!("dial tcp: lookup {host}: no such host"))
}

/// An IO error as Go's net package words it, which is what users see from the kubelet.
fn go_error(error: &std::io::Error) -> String {
    match error.kind() {
        std::io::ErrorKind::ConnectionRefused => "connect: connection refused".to_owned(),
        std::io::ErrorKind::TimedOut => "i/o timeout".to_owned(),
        std::io::ErrorKind::HostUnreachable => "connect: no route to host".to_owned(),
        std::io::ErrorKind::NetworkUnreachable => "connect: network is unreachable".to_owned(),
        _ => error.to_string(),
    }
}

async fn connect(addr: SocketAddr, timeout: Duration) -> Result<TcpStream, String> {
    match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
        Ok(Ok(stream)) => Ok(stream),
        Ok(Err(e)) => Err(format!("dial tcp {addr}: {}", go_error(&e))),
        Err(_) => Err(format!("dial tcp {addr}: i/o timeout")),
    }
}

async fn tcp(addr: SocketAddr, timeout: Duration) -> Outcome {
    match connect(addr, timeout).await {
        Ok(_) => Outcome::Success,
        Err(message) => Outcome::Failure(message),
    }
}

async fn exec(command: &[String], target: &ProbeTarget, timeout: Duration) -> Outcome {
    let shown = command.join(" ");
    match crate::process::run_in_container(&target.running, command, timeout, OUTPUT_LIMIT).await {
        Ok(run) => match run.exit {
            Some(exit) if exit.code == 0 => Outcome::Success,
            Some(exit) => {
                let output = String::from_utf8_lossy(&run.output).trim_end().to_owned();
                Outcome::Failure(if output.is_empty() {
                    // The kubelet reports the (empty) output only; the code says more.
                    format!("command {shown:?} exited with code {}", exit.code)
                } else {
                    output
                })
            }
            None => Outcome::Failure(format!("command {shown:?} timed out")),
        },
        Err(e) => Outcome::Failure(format!("cannot run command {shown:?}: {e}")),
    }
}

/// Accepts any server certificate (the kubelet's HTTPS probes skip verification) while still
/// checking that the server holds the key of the certificate it sent.
#[derive(Debug)]
struct AcceptAnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AcceptAnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

fn insecure_tls() -> Result<tokio_rustls::TlsConnector, String> {
    static CONFIG: OnceLock<Result<Arc<rustls::ClientConfig>, String>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let config = rustls::ClientConfig::builder_with_provider(provider.clone())
                .with_safe_default_protocol_versions()
                .map_err(|e| format!("TLS setup: {e}"))?
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AcceptAnyCertificate(provider)))
                .with_no_client_auth();
            Ok(Arc::new(config))
        })
        .clone()
        .map(tokio_rustls::TlsConnector::from)
}

/// Sends `request` over `io` with HTTP/1.1 and returns the response status and `Location` (the
/// body is read, up to the kubelet's limit, so the server sees a complete exchange).
async fn http1_exchange<IO>(
    io: IO,
    request: http::Request<Empty<Bytes>>,
) -> Result<(http::StatusCode, Option<String>), String>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| e.to_string())?;
    // Aborted when this function returns (the JoinSet drops it).
    let mut driver = JoinSet::new();
    driver.spawn(connection);
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| e.to_string())?;
    let status = response.status();
    let location = response
        .headers()
        .get(http::header::LOCATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let mut body = response.into_body();
    let mut read = 0usize;
    while read < OUTPUT_LIMIT {
        match body.frame().await {
            Some(Ok(frame)) => read += frame.data_ref().map_or(0, Bytes::len),
            _ => break,
        }
    }
    Ok((status, location))
}

/// Where one request of an HTTP probe goes.
#[derive(Debug, Clone, PartialEq, Eq)]
struct HttpTarget {
    scheme: Scheme,
    /// A name or an IP address (without brackets).
    host: String,
    port: u16,
    /// Path and query.
    path: String,
}

impl HttpTarget {
    fn scheme_name(&self) -> &'static str {
        match self.scheme {
            Scheme::Http => "http",
            Scheme::Https => "https",
        }
    }

    fn default_port(scheme: Scheme) -> u16 {
        match scheme {
            Scheme::Http => 80,
            Scheme::Https => 443,
        }
    }

    /// `host[:port]` as it goes into the URL and the Host header.
    fn authority(&self) -> String {
        let host = match self.host.parse::<IpAddr>() {
            Ok(IpAddr::V6(ip)) => format!("[{ip}]"),
            _ => self.host.clone(),
        };
        if self.port == Self::default_port(self.scheme) {
            host
        } else {
            format!("{host}:{}", self.port)
        }
    }

    fn url(&self) -> String {
        format!("{}://{}{}", self.scheme_name(), self.authority(), self.path)
    }

    /// The target a `Location` header sends a redirect to (absolute, scheme-relative,
    /// absolute-path or relative-path), `None` when it does not parse.
    fn follow(&self, location: &str) -> Option<Self> {
        if location.starts_with("//") {
            return self.follow(&format!("{}:{location}", self.scheme_name()));
        }
        let uri: http::Uri = location.parse().ok()?;
        if let Some(scheme) = uri.scheme_str() {
            let scheme = match scheme {
                "http" => Scheme::Http,
                "https" => Scheme::Https,
                _ => return None,
            };
            return Some(Self {
                scheme,
                host: uri.host()?.trim_matches(['[', ']']).to_owned(),
                port: uri.port_u16().unwrap_or_else(|| Self::default_port(scheme)),
                path: uri
                    .path_and_query()
                    .map_or_else(|| "/".to_owned(), |p| p.as_str().to_owned()),
            });
        }
        let path = if location.starts_with('/') {
            location.to_owned()
        } else {
            let dir = self
                .path
                .split('?')
                .next()
                .and_then(|p| p.rsplit_once('/'))
                .map_or("", |(dir, _)| dir);
            format!("{dir}/{location}")
        };
        Some(Self {
            path,
            ..self.clone()
        })
    }
}

/// One request of an HTTP probe: its status and `Location`.
async fn http_once(
    target: &HttpTarget,
    headers: &[(String, String)],
) -> Result<(http::StatusCode, Option<String>), String> {
    let addr = address(Some(&target.host), IpAddr::from([0, 0, 0, 0]), target.port).await?;
    let mut request = http::Request::get(target.path.as_str())
        .header(http::header::HOST, target.authority())
        .header(http::header::USER_AGENT, USER_AGENT)
        .header(http::header::ACCEPT, "*/*")
        .header(http::header::CONNECTION, "close");
    for (name, value) in headers {
        let Some(map) = request.headers_mut() else {
            break;
        };
        let name = http::HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| format!("invalid header name {name:?}"))?;
        let value = http::HeaderValue::from_str(value)
            .map_err(|_| format!("invalid value for header {name}"))?;
        // A header the probe sets replaces the default of the same name.
        map.insert(name, value);
    }
    let request = request
        .body(Empty::<Bytes>::new())
        .map_err(|e| e.to_string())?;
    let stream = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("dial tcp {addr}: {}", go_error(&e)))?;
    match target.scheme {
        Scheme::Http => http1_exchange(stream, request).await,
        Scheme::Https => {
            let name = rustls::pki_types::ServerName::try_from(target.host.clone())
                .map_err(|e| format!("invalid host {:?}: {e}", target.host))?;
            let tls = insecure_tls()?
                .connect(name, stream)
                .await
                .map_err(|e| format!("tls handshake: {e}"))?;
            http1_exchange(tls, request).await
        }
    }
}

/// How many redirects an HTTP probe follows (Go's HTTP client default, which the kubelet keeps).
const MAX_REDIRECTS: usize = 10;

async fn http_get(
    scheme: Scheme,
    host: Option<&str>,
    pod_ip: IpAddr,
    port: u16,
    path: &str,
    headers: &[(String, String)],
    timeout: Duration,
) -> Outcome {
    let first = HttpTarget {
        scheme,
        host: host.map_or_else(
            || pod_ip.to_string(),
            |h| h.trim_matches(['[', ']']).to_owned(),
        ),
        port,
        path: path.to_owned(),
    };
    // The kubelet follows redirects to the same host name; a redirect elsewhere ends the
    // probe with the redirect's own (successful) status.
    let chain = async {
        let mut current = first.clone();
        let mut hops = 0;
        loop {
            let (status, location) = http_once(&current, headers)
                .await
                .map_err(|message| format!("Get {:?}: {message}", current.url()))?;
            let next = location
                .filter(|_| status.is_redirection())
                .and_then(|l| current.follow(&l))
                .filter(|next| next.host == first.host);
            let Some(next) = next else {
                return Ok(status);
            };
            hops += 1;
            if hops > MAX_REDIRECTS {
                return Err(format!(
                    "Get {:?}: stopped after {MAX_REDIRECTS} redirects",
                    next.url()
                ));
            }
            current = next;
        }
    };
    match tokio::time::timeout(timeout, chain).await {
        Ok(Ok(status)) if (200..400).contains(&status.as_u16()) => Outcome::Success,
        Ok(Ok(status)) => Outcome::Failure(format!(
            "HTTP probe failed with statuscode: {}",
            status.as_u16()
        )),
        Ok(Err(message)) => Outcome::Failure(message),
        Err(_) => Outcome::Failure(format!(
            "Get {:?}: context deadline exceeded (Client.Timeout exceeded while awaiting \
             headers)",
            first.url()
        )),
    }
}

/// The `grpc.health.v1.HealthCheckResponse.ServingStatus` names.
fn serving_status_name(status: u64) -> &'static str {
    match status {
        1 => "SERVING",
        2 => "NOT_SERVING",
        3 => "SERVICE_UNKNOWN",
        _ => "UNKNOWN",
    }
}

/// The name gRPC gives a status code (`rpc error: code = NotFound ..`, as Go prints it).
fn grpc_code_name(code: &str) -> &str {
    const NAMES: [&str; 17] = [
        "OK",
        "Canceled",
        "Unknown",
        "InvalidArgument",
        "DeadlineExceeded",
        "NotFound",
        "AlreadyExists",
        "PermissionDenied",
        "ResourceExhausted",
        "FailedPrecondition",
        "Aborted",
        "OutOfRange",
        "Unimplemented",
        "Internal",
        "Unavailable",
        "DataLoss",
        "Unauthenticated",
    ];
    code.parse::<usize>()
        .ok()
        .and_then(|n| NAMES.get(n).copied())
        .unwrap_or(code)
}

/// Reads a protobuf varint at the start of `bytes`: the value and its length.
fn varint(bytes: &[u8]) -> Option<(u64, usize)> {
    let mut value = 0u64;
    for (i, byte) in bytes.iter().enumerate().take(10) {
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Some((value, i + 1));
        }
    }
    None
}

/// The `status` field (1) of a `HealthCheckResponse` in a gRPC length-prefixed message;
/// unknown fields are skipped.
fn health_status(body: &[u8]) -> Option<u64> {
    let len = usize::try_from(u32::from_be_bytes(body.get(1..5)?.try_into().ok()?)).ok()?;
    let mut message = body.get(5..5 + len)?;
    let mut status = 0;
    while !message.is_empty() {
        let (key, n) = varint(message)?;
        message = &message[n..];
        match key & 7 {
            0 => {
                let (value, n) = varint(message)?;
                message = &message[n..];
                if key >> 3 == 1 {
                    status = value;
                }
            }
            2 => {
                let (len, n) = varint(message)?;
                let end = n.checked_add(usize::try_from(len).ok()?)?;
                message = message.get(end..)?;
            }
            5 => message = message.get(4..)?,
            1 => message = message.get(8..)?,
            _ => return None,
        }
    }
    Some(status)
}

/// A `HealthCheckRequest { service }` as a gRPC length-prefixed message.
fn health_request(service: &str) -> Vec<u8> {
    let mut message = Vec::new();
    if !service.is_empty() {
        message.push(0x0a);
        let mut len = service.len();
        while len >= 0x80 {
            message.push(u8::try_from(len & 0x7f).unwrap_or(0) | 0x80);
            len >>= 7;
        }
        message.push(u8::try_from(len).unwrap_or(0));
        message.extend_from_slice(service.as_bytes());
    }
    let mut framed = vec![0];
    framed.extend_from_slice(
        &u32::try_from(message.len())
            .unwrap_or(u32::MAX)
            .to_be_bytes(),
    );
    framed.extend_from_slice(&message);
    framed
}

async fn grpc(addr: SocketAddr, service: &str, timeout: Duration) -> Outcome {
    let deadline = tokio::time::Instant::now() + timeout;
    let Ok(Ok(stream)) = tokio::time::timeout_at(deadline, TcpStream::connect(addr)).await else {
        return Outcome::Failure(format!(
            "timeout: failed to connect service {:?} within {}s",
            addr.to_string(),
            timeout.as_secs()
        ));
    };
    let call = async {
        let (mut sender, connection) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                .await
                .map_err(|e| format!("rpc error: code = Unavailable desc = {e}"))?;
        let mut driver = JoinSet::new();
        driver.spawn(connection);
        let request = http::Request::post(format!("http://{addr}/grpc.health.v1.Health/Check"))
            .header(http::header::CONTENT_TYPE, "application/grpc")
            .header(http::header::TE, "trailers")
            .header(http::header::USER_AGENT, USER_AGENT)
            .body(Full::new(Bytes::from(health_request(service))))
            .map_err(|e| e.to_string())?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| format!("rpc error: code = Unavailable desc = {e}"))?;
        let headers = response.headers().clone();
        let collected = response
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("rpc error: code = Unavailable desc = {e}"))?;
        let trailers = collected.trailers().cloned().unwrap_or_default();
        let field = |name: &str| {
            trailers
                .get(name)
                .or_else(|| headers.get(name))
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let code = field("grpc-status").unwrap_or_else(|| "2".to_owned());
        if code != "0" {
            return Err(format!(
                "rpc error: code = {} desc = {}",
                grpc_code_name(&code),
                field("grpc-message").unwrap_or_default()
            ));
        }
        health_status(&collected.to_bytes())
            .ok_or_else(|| "rpc error: malformed health check response".to_owned())
    };
    match tokio::time::timeout_at(deadline, call).await {
        Ok(Ok(1)) => Outcome::Success,
        Ok(Ok(status)) => Outcome::Failure(format!(
            "service unhealthy (responded with {:?})",
            serving_status_name(status)
        )),
        Ok(Err(message)) => Outcome::Failure(message),
        Err(_) => Outcome::Failure(format!(
            "timeout: health rpc did not complete within {}s",
            timeout.as_secs()
        )),
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct EventKey {
    uid: String,
    field_path: Option<String>,
    type_: &'static str,
    reason: String,
    message: String,
}

/// The kubelet's per-object event spam filter (client-go's): a bucket of 25 events per
/// object, refilled at one per five minutes; repeats counted into an existing event use it up
/// too. Pure: time is passed in.
#[derive(Debug, Clone, Copy)]
struct SpamBucket {
    tokens: f64,
    at: std::time::Instant,
}

impl SpamBucket {
    const BURST: f64 = 25.0;
    const REFILL: Duration = Duration::from_secs(300);

    fn new(now: std::time::Instant) -> Self {
        Self {
            tokens: Self::BURST,
            at: now,
        }
    }

    fn refill(&mut self, now: std::time::Instant) {
        let gained =
            now.saturating_duration_since(self.at).as_secs_f64() / Self::REFILL.as_secs_f64();
        self.tokens = (self.tokens + gained).min(Self::BURST);
        self.at = now;
    }

    /// Takes a token if there is one.
    fn allow(&mut self, now: std::time::Instant) -> bool {
        self.refill(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Whether the bucket is full again (and can be forgotten).
    fn full(&self, now: std::time::Instant) -> bool {
        let mut copy = *self;
        copy.refill(now);
        copy.tokens >= Self::BURST
    }
}

/// What the recorder remembers: events to count repeats into, and spam buckets by pod UID.
#[derive(Debug, Default)]
struct Memory {
    seen: HashMap<EventKey, Seen>,
    buckets: HashMap<String, SpamBucket>,
}

#[derive(Debug, Clone)]
struct Seen {
    name: String,
    count: i32,
    last: Timestamp,
}

/// Records core/v1 Events about pods as the kubelet does (`source.component: kubelet`): an
/// event repeating the same object, reason and message within ten minutes bumps the count and
/// `lastTimestamp` of the first one instead of adding another, and a pod gets at most 25
/// events in a burst, then one per five minutes (client-go's spam filter), so a probe failing
/// every second costs the API server little.
#[derive(Clone)]
pub struct EventRecorder {
    client: Client,
    node: String,
    memory: Arc<Mutex<Memory>>,
}

impl std::fmt::Debug for EventRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventRecorder")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

/// A Warning or Normal event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// Something normal happened.
    Normal,
    /// Something is wrong.
    Warning,
}

impl EventRecorder {
    /// A recorder reporting as the kubelet of `node`.
    pub fn new(client: Client, node: &str) -> Self {
        Self {
            client,
            node: node.to_owned(),
            memory: Arc::default(),
        }
    }

    /// Records an event about `pod` (and its container at `field_path`, such as
    /// `spec.containers{web}`). Failures are logged, never returned: events are best effort.
    pub async fn record(
        &self,
        pod: &Pod,
        field_path: Option<String>,
        type_: EventType,
        reason: &str,
        message: &str,
    ) {
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let key = EventKey {
            uid: pod.metadata.uid.clone().unwrap_or_default(),
            field_path: field_path.clone(),
            type_: match type_ {
                EventType::Normal => "Normal",
                EventType::Warning => "Warning",
            },
            reason: reason.to_owned(),
            message: message.to_owned(),
        };
        let now = Timestamp::now();
        let repeat = {
            let mut memory = self.memory.lock().unwrap_or_else(|p| p.into_inner());
            let instant = std::time::Instant::now();
            memory.buckets.retain(|_, b| !b.full(instant));
            let allowed = memory
                .buckets
                .entry(key.uid.clone())
                .or_insert_with(|| SpamBucket::new(instant))
                .allow(instant);
            if !allowed {
                tracing::debug!(reason, %message, "event dropped by the spam filter");
                return;
            }
            let keep = jiff::SignedDuration::try_from(EVENT_MEMORY).unwrap_or_default();
            memory.seen.retain(|_, s| s.last + keep > now);
            memory.seen.get_mut(&key).map(|s| {
                s.count = s.count.saturating_add(1);
                s.last = now;
                s.clone()
            })
        };
        let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
        if let Some(seen) = repeat {
            let patch = json!({
                "count": seen.count,
                "lastTimestamp": Time(seen.last),
            });
            match api
                .patch(&seen.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => return,
                // Deleted meanwhile (TTL, namespace cleanup): start a new one.
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(error) => {
                    tracing::warn!(%error, reason, "cannot update event");
                    return;
                }
            }
        }
        let name = format!(
            "{}.{:x}",
            pod.metadata.name.as_deref().unwrap_or_default(),
            now.as_nanosecond()
        );
        let event = Event {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(namespace.clone()),
                ..ObjectMeta::default()
            },
            involved_object: ObjectReference {
                api_version: Some("v1".to_owned()),
                kind: Some("Pod".to_owned()),
                name: pod.metadata.name.clone(),
                namespace: Some(namespace.clone()),
                uid: pod.metadata.uid.clone(),
                resource_version: pod.metadata.resource_version.clone(),
                field_path,
            },
            reason: Some(reason.to_owned()),
            message: Some(message.to_owned()),
            type_: Some(key.type_.to_owned()),
            count: Some(1),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            source: Some(EventSource {
                component: Some("kubelet".to_owned()),
                host: Some(self.node.clone()),
            }),
            reporting_component: Some("kubelet".to_owned()),
            reporting_instance: Some(self.node.clone()),
            ..Event::default()
        };
        match api.create(&PostParams::default(), &event).await {
            Ok(_) => {
                let mut memory = self.memory.lock().unwrap_or_else(|p| p.into_inner());
                memory.seen.insert(
                    key,
                    Seen {
                        name,
                        count: 1,
                        last: now,
                    },
                );
            }
            Err(error) => tracing::warn!(%error, reason, "cannot record event"),
        }
    }
}

/// What a container's prober asks of its supervisor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// `started` or `ready` changed: report them.
    Status {
        /// Whether the container counts as started.
        started: bool,
        /// Whether it counts as ready.
        ready: bool,
    },
    /// Kill the container with this grace period; it restarts by the restart policy.
    Kill {
        /// The grace period (the probe's, else the pod's).
        grace: Duration,
        /// Which probe failed.
        kind: ProbeKind,
    },
}

/// Probes one run of one container: call [`ContainerProber::next`] in a loop alongside waiting
/// for the process; dropping it stops probing.
#[derive(Debug)]
pub struct ContainerProber {
    probes: ContainerProbes,
    start: tokio::time::Instant,
    target: ProbeTarget,
    pod: Arc<Pod>,
    events: EventRecorder,
}

impl ContainerProber {
    /// A prober for `target`, whose container (of `pod`) started just now.
    pub fn new(pod: Arc<Pod>, target: ProbeTarget, events: EventRecorder) -> Self {
        Self {
            probes: ContainerProbes::new(container_probes(&target.container)),
            start: tokio::time::Instant::now(),
            target,
            pod,
            events,
        }
    }

    /// Whether the container counts as started now.
    pub fn started(&self) -> bool {
        self.probes.started()
    }

    /// Whether the container counts as ready now.
    pub fn ready(&self) -> bool {
        self.probes.ready()
    }

    /// Probes as they fall due until something changes; never returns when nothing will.
    /// Cancel-safe: dropping it mid-attempt loses only that attempt.
    pub async fn next(&mut self) -> Step {
        loop {
            let Some(due) = self.probes.next_due() else {
                return std::future::pending().await;
            };
            tokio::time::sleep_until(self.start + due).await;
            let began = self.start.elapsed();
            let specs: Vec<ProbeSpec> = self.probes.due(began).into_iter().cloned().collect();
            let outcomes = futures::future::join_all(
                specs
                    .iter()
                    .map(|s| run_probe(&s.action, &self.target, s.timing.timeout)),
            )
            .await;
            let ended = self.start.elapsed();
            let mut step = None;
            for (spec, outcome) in specs.iter().zip(outcomes) {
                if let Outcome::Failure(message) = &outcome {
                    tracing::debug!(
                        pod = self.pod.metadata.name.as_deref().unwrap_or_default(),
                        container = %self.target.container.name,
                        probe = spec.kind.lower(),
                        %message,
                        "probe failed"
                    );
                }
                for decision in self.probes.record(spec.kind, &outcome, ended) {
                    match decision {
                        Decision::Unhealthy { kind, message } => {
                            let message = format!("{} probe failed: {message}", kind.title());
                            self.event(EventType::Warning, "Unhealthy", &message).await;
                        }
                        Decision::StatusChanged => {
                            step = step.or(Some(Step::Status {
                                started: self.probes.started(),
                                ready: self.probes.ready(),
                            }));
                        }
                        Decision::Kill { kind, grace } => {
                            let message = format!(
                                "Container {} failed {} probe, will be restarted",
                                self.target.container.name,
                                kind.lower()
                            );
                            tracing::info!(
                                pod = self.pod.metadata.name.as_deref().unwrap_or_default(),
                                %message
                            );
                            self.event(EventType::Normal, "Killing", &message).await;
                            let grace = grace.unwrap_or_else(|| pod_grace(&self.pod));
                            step = Some(Step::Kill { grace, kind });
                        }
                    }
                }
            }
            if let Some(step) = step {
                return step;
            }
        }
    }

    async fn event(&self, type_: EventType, reason: &str, message: &str) {
        let field_path = Some(format!("spec.containers{{{}}}", self.target.container.name));
        self.events
            .record(&self.pod, field_path, type_, reason, message)
            .await;
    }
}

/// The pod's `terminationGracePeriodSeconds` (default 30 s).
fn pod_grace(pod: &Pod) -> Duration {
    let seconds = pod
        .spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
        .unwrap_or(30);
    Duration::from_secs(u64::try_from(seconds.max(0)).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A probe target at `pod_ip` whose "container" is this test process in its own namespace.
    fn target_in_this_process(pod_ip: IpAddr, container: Container) -> ProbeTarget {
        ProbeTarget {
            pod_ip,
            container,
            running: RunningContainer {
                pod_uid: "u".into(),
                pid: std::process::id(),
                netns: "/proc/self/ns/net".into(),
                env: Vec::new(),
                working_dir: "/".into(),
            },
        }
    }

    #[test]
    fn health_messages_round_trip() {
        assert_eq!(health_request(""), vec![0, 0, 0, 0, 0]);
        let request = health_request("svc");
        assert_eq!(request, vec![0, 0, 0, 0, 5, 0x0a, 3, b's', b'v', b'c']);
        // status: NOT_SERVING, after an unknown string field 2.
        let response = [0, 0, 0, 0, 6, 0x12, 2, b'h', b'i', 0x08, 2];
        assert_eq!(health_status(&response), Some(2));
        assert_eq!(health_status(&[0, 0, 0, 0, 0]), Some(0));
        assert_eq!(health_status(&[0, 0, 0, 0, 3, 0x08]), None);
        assert_eq!(serving_status_name(1), "SERVING");
    }

    #[test]
    fn redirect_locations_resolve_against_the_request() {
        let base = HttpTarget {
            scheme: Scheme::Http,
            host: "10.244.1.5".into(),
            port: 8080,
            path: "/app/health?full=1".into(),
        };
        let follow = |l: &str| base.follow(l).map(|t| t.url());
        assert_eq!(
            follow("ready").as_deref(),
            Some("http://10.244.1.5:8080/app/ready")
        );
        assert_eq!(
            follow("/ready").as_deref(),
            Some("http://10.244.1.5:8080/ready")
        );
        assert_eq!(
            follow("https://10.244.1.5/x?y=1").as_deref(),
            Some("https://10.244.1.5/x?y=1")
        );
        assert_eq!(
            follow("//[fd00::1]:81/z").as_deref(),
            Some("http://[fd00::1]:81/z")
        );
        assert_eq!(follow("ftp://x/"), None);
    }

    #[test]
    fn spam_filter_allows_a_burst_then_one_per_five_minutes() {
        let start = std::time::Instant::now();
        let mut bucket = SpamBucket::new(start);
        let burst = (0..30).filter(|_| bucket.allow(start)).count();
        assert_eq!(burst, 25);
        let later = start + Duration::from_secs(299);
        assert!(!bucket.allow(later));
        let refilled = start + Duration::from_secs(301);
        assert!(bucket.allow(refilled));
        assert!(!bucket.allow(refilled));
        assert!(!bucket.full(refilled + Duration::from_secs(300 * 24)));
        assert!(bucket.full(refilled + Duration::from_secs(300 * 26)));
    }

    #[test]
    fn io_errors_read_like_the_kubelets() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert_eq!(go_error(&refused), "connect: connection refused");
    }

    #[tokio::test]
    async fn grpc_health_probes() {
        use http_body_util::StreamBody;
        use hyper::body::Frame;
        let ip = IpAddr::from([127, 0, 0, 1]);
        let listener = tokio::net::TcpListener::bind((ip, 0)).await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        // A health server: "" is SERVING, "down" NOT_SERVING, anything else NOT_FOUND (5).
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let service = hyper::service::service_fn(
                    |request: http::Request<hyper::body::Incoming>| async move {
                        assert_eq!(request.uri().path(), "/grpc.health.v1.Health/Check");
                        let body = request.into_body().collect().await?.to_bytes();
                        let name =
                            String::from_utf8_lossy(body.get(7..).unwrap_or_default()).into_owned();
                        let mut trailers = http::HeaderMap::new();
                        let mut frames = Vec::new();
                        match name.as_str() {
                            "" | "down" => {
                                let status = if name.is_empty() { 1 } else { 2 };
                                frames.push(Frame::data(Bytes::from(vec![
                                    0, 0, 0, 0, 2, 0x08, status,
                                ])));
                                trailers.insert("grpc-status", "0".parse().expect("value"));
                            }
                            _ => {
                                trailers.insert("grpc-status", "5".parse().expect("value"));
                                trailers
                                    .insert("grpc-message", "unknown service".parse().expect("v"));
                            }
                        }
                        frames.push(Frame::trailers(trailers));
                        let body = StreamBody::new(futures::stream::iter(
                            frames.into_iter().map(Ok::<_, std::convert::Infallible>),
                        ));
                        Ok::<_, hyper::Error>(
                            http::Response::builder()
                                .header("content-type", "application/grpc")
                                .body(body)
                                .expect("response"),
                        )
                    },
                );
                tokio::spawn(
                    hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service),
                );
            }
        });
        let target = target_in_this_process(ip, Container::default());
        let check = |service: &str| Action::Grpc {
            port,
            service: service.into(),
        };
        let second = Duration::from_secs(2);
        assert_eq!(
            run_probe(&check(""), &target, second).await,
            Outcome::Success
        );
        assert_eq!(
            run_probe(&check("down"), &target, second).await,
            Outcome::Failure("service unhealthy (responded with \"NOT_SERVING\")".into())
        );
        assert_eq!(
            run_probe(&check("other"), &target, second).await,
            Outcome::Failure("rpc error: code = NotFound desc = unknown service".into())
        );
    }

    #[tokio::test]
    async fn https_probes_skip_certificate_verification() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let ip = IpAddr::from([127, 0, 0, 1]);
        // A self-signed certificate for another name: verification would reject it.
        let tls = crate::kubelet::tls_config("not-this-host", IpAddr::from([192, 0, 2, 1]))
            .expect("server TLS");
        let acceptor = tokio_rustls::TlsAcceptor::from(tls);
        let listener = tokio::net::TcpListener::bind((ip, 0)).await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(mut stream) = acceptor.accept(stream).await else {
                        return;
                    };
                    let mut buf = vec![0u8; 4096];
                    let n = stream.read(&mut buf).await.unwrap_or(0);
                    let request = String::from_utf8_lossy(&buf[..n]).into_owned();
                    let status = if request.starts_with("GET /ok ") {
                        "204 No Content"
                    } else {
                        "500 Internal Server Error"
                    };
                    let reply = format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\n\r\n");
                    let _ = stream.write_all(reply.as_bytes()).await;
                    let _ = stream.shutdown().await;
                });
            }
        });
        let target = target_in_this_process(ip, Container::default());
        let get = |path: &str| Action::HttpGet {
            scheme: Scheme::Https,
            host: None,
            port: crate::probes::PortRef::Number(port),
            path: path.into(),
            headers: Vec::new(),
        };
        let second = Duration::from_secs(2);
        assert_eq!(
            run_probe(&get("/ok"), &target, second).await,
            Outcome::Success
        );
        assert_eq!(
            run_probe(&get("/broken"), &target, second).await,
            Outcome::Failure("HTTP probe failed with statuscode: 500".into())
        );
    }

    #[tokio::test]
    async fn network_probes_against_loopback() {
        let target = target_in_this_process(
            IpAddr::from([127, 0, 0, 1]),
            serde_json::from_value(json!({
                "name": "web", "ports": [{"name": "http", "containerPort": 1}]
            }))
            .expect("container"),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        // A tiny HTTP server: /ok answers 200, /redirect 302, anything else 503.
        tokio::spawn(async move {
            loop {
                let Ok((mut stream, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(async move {
                    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
                    let mut buf = vec![0u8; 4096];
                    let n = stream.read(&mut buf).await.unwrap_or(0);
                    let request = String::from_utf8_lossy(&buf[..n]).into_owned();
                    let status = if request.starts_with("GET /ok ") {
                        assert!(request.contains("user-agent: kube-probe/"), "{request}");
                        assert!(request.contains("x-probe: yes"), "{request}");
                        "200 OK"
                    } else if request.starts_with("GET /redirect ") {
                        "302 Found\r\nlocation: ok"
                    } else if request.starts_with("GET /to-bad ") {
                        "301 Moved Permanently\r\nlocation: /bad"
                    } else if request.starts_with("GET /away ") {
                        "302 Found\r\nlocation: http://192.0.2.1/bad"
                    } else if request.starts_with("GET /loop ") {
                        "302 Found\r\nlocation: /loop"
                    } else {
                        "503 Service Unavailable"
                    };
                    let _ = stream
                        .write_all(
                            format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\n\r\n").as_bytes(),
                        )
                        .await;
                });
            }
        });
        let second = Duration::from_secs(1);
        let http = |path: &str| Action::HttpGet {
            scheme: Scheme::Http,
            host: None,
            port: crate::probes::PortRef::Number(port),
            path: path.into(),
            headers: vec![("X-Probe".into(), "yes".into())],
        };
        assert_eq!(
            run_probe(&http("/ok"), &target, second).await,
            Outcome::Success
        );
        assert_eq!(
            run_probe(&http("/redirect"), &target, second).await,
            Outcome::Success
        );
        assert_eq!(
            run_probe(&http("/bad"), &target, second).await,
            Outcome::Failure("HTTP probe failed with statuscode: 503".into())
        );
        // Redirects to the same host are followed, to another host not.
        assert_eq!(
            run_probe(&http("/to-bad"), &target, second).await,
            Outcome::Failure("HTTP probe failed with statuscode: 503".into())
        );
        assert_eq!(
            run_probe(&http("/away"), &target, second).await,
            Outcome::Success
        );
        assert_eq!(
            run_probe(&http("/loop"), &target, second).await,
            Outcome::Failure(format!(
                "Get \"http://127.0.0.1:{port}/loop\": stopped after 10 redirects"
            ))
        );
        let tcp = |port| Action::TcpSocket {
            host: None,
            port: crate::probes::PortRef::Number(port),
        };
        assert_eq!(
            run_probe(&tcp(port), &target, second).await,
            Outcome::Success
        );
        // Port 1 on loopback: nothing listens there (the "http" name resolves to it).
        let named = Action::TcpSocket {
            host: None,
            port: crate::probes::PortRef::Name("http".into()),
        };
        assert_eq!(
            run_probe(&named, &target, second).await,
            Outcome::Failure("dial tcp 127.0.0.1:1: connect: connection refused".into())
        );
        let https = Action::HttpGet {
            scheme: Scheme::Https,
            host: None,
            port: crate::probes::PortRef::Number(port),
            path: "/ok".into(),
            headers: Vec::new(),
        };
        let Outcome::Failure(message) = run_probe(&https, &target, second).await else {
            panic!("TLS against a plain HTTP server cannot succeed");
        };
        assert!(
            message.starts_with(&format!(
                "Get \"https://127.0.0.1:{port}/ok\": tls handshake"
            )),
            "{message}"
        );
        let grpc = Action::Grpc {
            port,
            service: String::new(),
        };
        assert!(matches!(
            run_probe(&grpc, &target, second).await,
            Outcome::Failure(_)
        ));
    }
}
