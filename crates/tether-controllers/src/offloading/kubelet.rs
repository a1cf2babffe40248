//! The kubelet API of virtual nodes: the consumer's API server forwards `kubectl logs`,
//! `exec`, `attach` and `port-forward` on a pod bound to a virtual node to the Node's
//! InternalIP and kubelet port, which is this process. Each request is re-issued to the
//! provider's API server with the identity that provider issued, on the pod of the same name
//! in the twin namespace, and the answer relayed.
//!
//! Logs are an ordinary streamed GET. Exec, attach and port-forward are HTTP upgrades
//! (WebSocket `v5.channel.k8s.io`/`v4.channel.k8s.io` for exec and attach, SPDY/3.1 or the
//! WebSocket channel form for port-forward): the upgrade headers the API server sent are
//! offered to the provider unchanged, the provider's choice is answered back, and the two
//! upgraded connections are then joined byte for byte. The provider's API server and kubelet
//! speak the same protocol as ours would, so stdin, stdout, stderr, resize, the v5 close
//! signal, the exit Status on channel 3 and SPDY streams pass through untouched, with no
//! second implementation of those protocols here. This is how kube-apiserver itself proxies
//! these subresources to a kubelet.
//!
//! Callers are checked as a kubelet with `--client-ca-file` and webhook authorisation checks
//! them ([`callers`]): a client certificate from the cluster's client CA (401 otherwise), whose
//! user a SubjectAccessReview allows `nodes/proxy` on the pod's node (403 otherwise); in
//! practice only the API server, with its `--kubelet-client-certificate`. Beyond that, what a
//! request can reach is bounded by the tenant identity each provider issued, and only pods
//! bound to one of this cluster's virtual nodes are served (404 otherwise). `/healthz` answers
//! anyone, like the kubelet's healthz port.
//!
//! Serving certificate: self-signed, made at start. kube-apiserver does not verify kubelet
//! certificates unless `--kubelet-certificate-authority` is set; a certificate signed through
//! a `kubernetes.io/kubelet-serving` CSR would be needed for clusters that do.

// Handlers' helpers return the finished error `Response` by value.
#![allow(clippy::result_large_err)]

pub mod callers;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, HeaderName, StatusCode, header};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, AttachParams, LogParams};
use kube::core::Request as KubeRequest;
use tether_api::ClusterId;
use tether_api::offloading::VirtualNode;
use tokio_util::sync::CancellationToken;

use self::callers::{Caller, ClientCa, Decisions, RequestClientCert, Verdict};
use crate::Error;
use crate::context::Ctx;
use crate::https::PeerCertificates;
use crate::providers::{Access, ProviderClients};

/// The header SPDY upgrades name their sub-protocol in (`portforward.k8s.io`, ...).
const STREAM_PROTOCOL: HeaderName = HeaderName::from_static("x-stream-protocol-version");

/// Request headers that make the upgrade, offered to the provider as they came.
const UPGRADE_REQUEST_HEADERS: [HeaderName; 6] = [
    header::CONNECTION,
    header::UPGRADE,
    header::SEC_WEBSOCKET_KEY,
    header::SEC_WEBSOCKET_VERSION,
    header::SEC_WEBSOCKET_PROTOCOL,
    STREAM_PROTOCOL,
];

/// Response headers of the provider's `101` that the API server needs to see.
const UPGRADE_RESPONSE_HEADERS: [HeaderName; 5] = [
    header::CONNECTION,
    header::UPGRADE,
    header::SEC_WEBSOCKET_ACCEPT,
    header::SEC_WEBSOCKET_PROTOCOL,
    STREAM_PROTOCOL,
];

/// Which kubelet operation a path names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// `/containerLogs/{ns}/{pod}/{container}`.
    Logs,
    /// `/exec/{ns}/{pod}[/{uid}]/{container}`.
    Exec,
    /// `/attach/{ns}/{pod}[/{uid}]/{container}`.
    Attach,
    /// `/portForward/{ns}/{pod}[/{uid}]`.
    PortForward,
}

impl Operation {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Logs => "logs",
            Operation::Exec => "exec",
            Operation::Attach => "attach",
            Operation::PortForward => "portforward",
        }
    }
}

/// A parsed kubelet path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The operation.
    pub operation: Operation,
    /// The pod's namespace here.
    pub namespace: String,
    /// The pod's name.
    pub pod: String,
    /// The container (none for port-forward).
    pub container: Option<String>,
}

/// Parses a kubelet API path, with the kubelet's optional pod UID segment.
pub fn parse_path(path: &str) -> Option<Target> {
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let nonempty = |s: &[&str]| s.iter().all(|x| !x.is_empty());
    let (operation, rest) = segments.split_first()?;
    if !nonempty(rest) {
        return None;
    }
    let (operation, container) = match (*operation, rest.len()) {
        ("containerLogs", 3) => (Operation::Logs, Some(rest[2])),
        ("exec", 3 | 4) => (Operation::Exec, rest.last().copied()),
        ("attach", 3 | 4) => (Operation::Attach, rest.last().copied()),
        ("portForward", 2 | 3) => (Operation::PortForward, None),
        _ => return None,
    };
    Some(Target {
        operation,
        namespace: rest[0].to_owned(),
        pod: rest[1].to_owned(),
        container: container.map(str::to_owned),
    })
}

fn pairs(query: &str) -> Result<Vec<(String, String)>, String> {
    let uri: http::Uri = format!("/?{query}")
        .parse()
        .map_err(|e| format!("unreadable query: {e}"))?;
    axum::extract::Query::<Vec<(String, String)>>::try_from_uri(&uri)
        .map(|q| q.0)
        .map_err(|e| format!("unreadable query: {e}"))
}

fn flag(name: &str, value: &str) -> Result<bool, String> {
    match value {
        "1" | "true" | "True" | "TRUE" | "t" | "T" => Ok(true),
        "0" | "false" | "False" | "FALSE" | "f" | "F" | "" => Ok(false),
        other => Err(format!(
            "invalid value {other:?} for {name}: expected true or false"
        )),
    }
}

fn int(name: &str, value: &str) -> Result<i64, String> {
    value
        .parse()
        .map_err(|_| format!("invalid value {value:?} for {name}: expected an integer"))
}

/// The kubelet's log query as kube-rs `LogParams` for `container`.
pub fn log_params(container: &str, query: &str) -> Result<LogParams, String> {
    let mut lp = LogParams {
        container: Some(container.to_owned()),
        ..LogParams::default()
    };
    for (key, value) in pairs(query)? {
        match key.as_str() {
            "follow" => lp.follow = flag(&key, &value)?,
            "previous" => lp.previous = flag(&key, &value)?,
            "timestamps" => lp.timestamps = flag(&key, &value)?,
            "tailLines" => lp.tail_lines = Some(int(&key, &value)?),
            "limitBytes" => lp.limit_bytes = Some(int(&key, &value)?),
            "sinceSeconds" => lp.since_seconds = Some(int(&key, &value)?),
            "sinceTime" => {
                lp.since_time = Some(value.parse().map_err(|e| {
                    format!("invalid value {value:?} for sinceTime: expected RFC 3339 ({e})")
                })?);
            }
            _ => {}
        }
    }
    Ok(lp)
}

/// The kubelet's exec or attach query (`input`/`output`/`error`/`tty`, repeated `command`) as
/// kube-rs `AttachParams` for `container` and the command.
pub fn attach_params(container: &str, query: &str) -> Result<(AttachParams, Vec<String>), String> {
    let mut ap = AttachParams::default()
        .container(container)
        .stdout(false)
        .stderr(false);
    let mut command = Vec::new();
    for (key, value) in pairs(query)? {
        match key.as_str() {
            // The API server sends the kubelet's names; the API's own are taken as well.
            "input" | "stdin" => ap.stdin = flag(&key, &value)?,
            "output" | "stdout" => ap.stdout = flag(&key, &value)?,
            "error" | "stderr" => ap.stderr = flag(&key, &value)?,
            "tty" => ap.tty = flag(&key, &value)?,
            "command" => command.push(value),
            _ => {}
        }
    }
    Ok((ap, command))
}

/// The ports of a port-forward query (`port`, repeated or comma-separated); none for SPDY,
/// whose streams name their ports.
pub fn forward_ports(query: &str) -> Result<Vec<u16>, String> {
    let mut ports = Vec::new();
    for (key, value) in pairs(query)? {
        if key != "port" && key != "ports" {
            continue;
        }
        for p in value.split(',').filter(|p| !p.is_empty()) {
            match p.trim().parse::<u16>() {
                Ok(n) if n > 0 => ports.push(n),
                _ => return Err(format!("invalid port {p:?}: expected 1-65535")),
            }
        }
    }
    Ok(ports)
}

/// The provider's API request standing for `target` on the pod `pod` in the twin namespace
/// `twin`, built by kube-rs from the parsed parameters.
pub fn provider_request(
    target: &Target,
    twin: &str,
    query: &str,
) -> Result<http::Request<Vec<u8>>, String> {
    let pods = KubeRequest::new(format!("/api/v1/namespaces/{twin}/pods"));
    let container = target.container.as_deref().unwrap_or_default();
    let built = match target.operation {
        Operation::Logs => pods
            .logs(&target.pod, &log_params(container, query)?)
            .map_err(|e| e.to_string()),
        Operation::Exec => {
            let (ap, command) = attach_params(container, query)?;
            if command.is_empty() {
                return Err("you must specify at least 1 command".to_owned());
            }
            pods.exec(&target.pod, command, &ap)
                .map_err(|e| e.to_string())
        }
        Operation::Attach => pods
            .attach(&target.pod, &attach_params(container, query)?.0)
            .map_err(|e| e.to_string()),
        Operation::PortForward => {
            let ports = forward_ports(query)?;
            if ports.is_empty() {
                // SPDY: kube-rs asks for ports, which this form does without.
                http::Request::get(format!(
                    "/api/v1/namespaces/{twin}/pods/{}/portforward",
                    target.pod
                ))
                .body(Vec::new())
                .map_err(|e| e.to_string())
            } else {
                pods.portforward(&target.pod, &ports)
                    .map_err(|e| e.to_string())
            }
        }
    };
    let mut built = built?;
    // kube-rs's query builder leaves an empty first pair (`?&`), which servers skip anyway.
    if let Some(tidy) = built
        .uri()
        .to_string()
        .split_once("?&")
        .map(|(path, query)| format!("{path}?{query}"))
    {
        *built.uri_mut() = tidy.parse().map_err(|e| format!("request URI: {e}"))?;
    }
    Ok(built)
}

/// Copies the headers named in `names` from `from` to `to`, every value.
fn copy_headers(names: &[HeaderName], from: &HeaderMap, to: &mut HeaderMap) {
    for name in names {
        for value in from.get_all(name) {
            to.append(name.clone(), value.clone());
        }
    }
}

/// What the endpoint serves from.
struct Kubelet {
    ctx: Arc<Ctx>,
    providers: Arc<ProviderClients>,
    client_ca: Arc<ClientCa>,
    decisions: Decisions,
}

/// An answer that is not the provider's.
struct Refusal {
    status: StatusCode,
    outcome: &'static str,
    message: String,
}

impl Refusal {
    fn new(status: StatusCode, outcome: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            outcome,
            message: message.into(),
        }
    }

    fn internal(e: &Error) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "error", e.to_string())
    }
}

/// A TLS configuration with a fresh self-signed certificate for `ip` (HTTP/1.1 only: the
/// upgrades need it), asking callers for a client certificate.
pub fn tls_config(ip: Option<&str>) -> Result<rustls::ServerConfig, Error> {
    let mut names = vec!["tether-virtual-kubelet".to_owned()];
    names.extend(ip.map(str::to_owned));
    let certified = rcgen::generate_simple_self_signed(names)
        .map_err(Error::cert("making the kubelet serving certificate"))?;
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(certified.signing_key.serialize_der().into());
    let mut config = rustls::ServerConfig::builder_with_provider(crate::auth::tls::provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Invalid(format!("TLS versions: {e}")))?
        .with_client_cert_verifier(Arc::new(RequestClientCert::default()))
        .with_single_cert(vec![certified.cert.der().clone()], key)
        .map_err(|e| Error::Invalid(format!("the kubelet certificate is unusable: {e}")))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// Binds `addr` and returns the bound address and the serving future, which runs until
/// `shutdown` and keeps the client CA read from the cluster meanwhile. Authorisation answers
/// are remembered as `decisions` says.
pub async fn serve(
    ctx: Arc<Ctx>,
    providers: Arc<ProviderClients>,
    addr: SocketAddr,
    decisions: Decisions,
    shutdown: CancellationToken,
) -> Result<(SocketAddr, impl Future<Output = ()> + use<>), Error> {
    let client_ca = Arc::new(ClientCa::default());
    // Read once before serving, so the first calls are not refused for want of it.
    if let Err(e) = client_ca.load(&ctx.client).await {
        tracing::warn!(error = %e, "virtual kubelet API: cannot read the client CA yet");
    }
    let loader = client_ca
        .clone()
        .keep_loaded(ctx.client.clone(), shutdown.clone());
    let tls = tls_config(ctx.settings.pod_ip.as_deref())?;
    let app = Router::new()
        .route("/healthz", axum::routing::get(|| async { "ok" }))
        .fallback(handle)
        .with_state(Arc::new(Kubelet {
            ctx,
            providers,
            client_ca,
            decisions,
        }));
    let (bound, server) =
        crate::https::serve("the virtual kubelet API", addr, tls, app, shutdown).await?;
    Ok((bound, async move {
        tokio::join!(server, loader);
    }))
}

/// The caller of `request`, or the kubelet's 401.
fn authenticate(kubelet: &Kubelet, request: &http::Request<Body>) -> Result<Caller, Refusal> {
    let chain = request
        .extensions()
        .get::<PeerCertificates>()
        .map(|c| c.0.as_slice());
    kubelet.client_ca.authenticate(chain).map_err(|why| {
        tracing::debug!(%why, "kubelet request unauthenticated");
        Refusal::new(StatusCode::UNAUTHORIZED, "unauthorized", "Unauthorized")
    })
}

async fn handle(State(kubelet): State<Arc<Kubelet>>, request: http::Request<Body>) -> Response {
    let started = Instant::now();
    // Authentication comes first, as in the kubelet: an unknown caller learns nothing.
    let caller = match authenticate(&kubelet, &request) {
        Ok(c) => c,
        Err(refusal) => {
            if let Some(target) = parse_path(request.uri().path()) {
                kubelet
                    .ctx
                    .metrics
                    .kubelet_request(target.operation.as_str(), refusal.outcome);
            }
            return text(refusal.status, refusal.message);
        }
    };
    let Some(target) = parse_path(request.uri().path()) else {
        return text(
            StatusCode::NOT_FOUND,
            format!(
                "404 page not found: {} (this virtual kubelet serves /containerLogs, /exec, \
                 /attach and /portForward)",
                request.uri().path()
            ),
        );
    };
    let operation = target.operation;
    let (outcome, response) = match forward(&kubelet, &caller, &target, request).await {
        Ok((outcome, response)) => (outcome, response),
        Err(refusal) => {
            tracing::debug!(operation = operation.as_str(), pod = %format!("{}/{}", target.namespace, target.pod), status = %refusal.status, message = %refusal.message, "kubelet request refused");
            (refusal.outcome, text(refusal.status, refusal.message))
        }
    };
    kubelet
        .ctx
        .metrics
        .kubelet_request(operation.as_str(), outcome);
    tracing::debug!(operation = operation.as_str(), outcome, took = ?started.elapsed(), "kubelet request");
    response
}

fn text(status: StatusCode, message: String) -> Response {
    (status, [(header::CONTENT_TYPE, "text/plain")], message).into_response()
}

/// The pod `target` names, read here, or none.
async fn read_pod(kubelet: &Kubelet, target: &Target) -> Result<Option<Pod>, Refusal> {
    let ns = &target.namespace;
    Api::<Pod>::namespaced(kubelet.ctx.client.clone(), ns)
        .get_opt(&target.pod)
        .await
        .map_err(|e| Refusal::internal(&Error::kube(format!("reading pod {ns}/{}", target.pod))(e)))
}

/// Whether `caller` may `method` on `nodes/proxy` of the node `pod` is bound to (a pod not
/// bound, or not found, is checked on the nameless node, as nothing is revealed before).
async fn authorize(
    kubelet: &Kubelet,
    caller: &Caller,
    method: &http::Method,
    pod: Option<&Pod>,
) -> Result<(), Refusal> {
    let node = pod
        .and_then(|p| p.spec.as_ref())
        .and_then(|s| s.node_name.as_deref())
        .unwrap_or_default();
    let verb = callers::verb(method);
    let decided = kubelet.decisions.decide(caller, verb, node, || {
        callers::authorize(&kubelet.ctx.client, caller, verb, node)
    });
    match decided.await {
        Ok(Verdict::Allowed) => Ok(()),
        Ok(Verdict::Forbidden(message)) => {
            Err(Refusal::new(StatusCode::FORBIDDEN, "forbidden", message))
        }
        Err(e) => {
            tracing::warn!(error = %e, user = %caller.user, "kubelet request: authorisation failed");
            Err(Refusal::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "error",
                format!(
                    "Authorization error (user={}, verb={verb}, resource=nodes, \
                     subresource(s)=[proxy])",
                    caller.user
                ),
            ))
        }
    }
}

/// The provider and twin namespace serving `target`'s pod, if it is bound to one of this
/// cluster's virtual nodes.
async fn locate(
    kubelet: &Kubelet,
    target: &Target,
    pod: Option<Pod>,
) -> Result<(Access, String), Refusal> {
    let client = &kubelet.ctx.client;
    let ns = &target.namespace;
    let pod = pod.ok_or_else(|| {
        Refusal::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("pod {ns}/{} not found", target.pod),
        )
    })?;
    let not_ours = || {
        Refusal::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!(
                "pod {ns}/{} is not bound to a virtual node of this cluster",
                target.pod
            ),
        )
    };
    let node = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .ok_or_else(not_ours)?;
    let nodes = Api::<VirtualNode>::all(client.clone())
        .list(&Default::default())
        .await
        .map_err(|e| Refusal::internal(&Error::kube("listing VirtualNodes")(e)))?;
    let vn = nodes
        .items
        .into_iter()
        .find(|vn| vn.metadata.name.as_deref() == Some(node.as_str()))
        .ok_or_else(not_ours)?;
    let provider = ClusterId::new(&vn.spec.cluster_id).map_err(|e| {
        Refusal::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "error",
            format!("VirtualNode {node}: spec.clusterID: {e}"),
        )
    })?;
    let unavailable =
        |why: String| Refusal::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", why);
    let access = kubelet
        .providers
        .access(client, &provider)
        .await
        .map_err(|e| Refusal::internal(&e))?
        .ok_or_else(|| unavailable(format!("no identity issued by {provider} (not peered?)")))?;
    let twin = super::pods::twin_of(client, ns, &provider)
        .await
        .map_err(|e| Refusal::internal(&e))?
        .map_err(unavailable)?;
    Ok((access, twin))
}

async fn forward(
    kubelet: &Kubelet,
    caller: &Caller,
    target: &Target,
    request: http::Request<Body>,
) -> Result<(&'static str, Response), Refusal> {
    let pod = read_pod(kubelet, target).await?;
    authorize(kubelet, caller, request.method(), pod.as_ref()).await?;
    let query = request.uri().query().unwrap_or_default().to_owned();
    // Bad parameters are refused before the provider is looked up.
    provider_request(target, "-", &query)
        .map_err(|m| Refusal::new(StatusCode::BAD_REQUEST, "bad_request", m))?;
    let (access, twin) = locate(kubelet, target, pod).await?;
    let outgoing = provider_request(target, &twin, &query)
        .map_err(|m| Refusal::new(StatusCode::BAD_REQUEST, "bad_request", m))?;
    match target.operation {
        Operation::Logs => logs(&access.client, outgoing).await,
        _ => relay_upgrade(&access.upgrades, request, outgoing).await,
    }
}

fn provider_failed(e: &kube::Error) -> Refusal {
    Refusal::new(
        StatusCode::BAD_GATEWAY,
        "provider_error",
        format!("the provider's API server: {e}"),
    )
}

/// The provider's answer as ours: its status, content type and streamed body.
fn relay_response(response: http::Response<kube::client::Body>) -> (&'static str, Response) {
    let outcome = if response.status().is_success() || response.status().is_informational() {
        "ok"
    } else {
        "provider_refused"
    };
    let (parts, body) = response.into_parts();
    let mut out = Response::new(Body::new(body));
    *out.status_mut() = parts.status;
    copy_headers(&[header::CONTENT_TYPE], &parts.headers, out.headers_mut());
    (outcome, out)
}

async fn logs(
    client: &kube::Client,
    outgoing: http::Request<Vec<u8>>,
) -> Result<(&'static str, Response), Refusal> {
    let response = client
        .send(outgoing.map(kube::client::Body::from))
        .await
        .map_err(|e| provider_failed(&e))?;
    Ok(relay_response(response))
}

/// Offers the API server's upgrade to the provider; on its `101`, answers `101` with the
/// provider's choice and joins the two connections.
async fn relay_upgrade(
    client: &kube::Client,
    mut incoming: http::Request<Body>,
    outgoing: http::Request<Vec<u8>>,
) -> Result<(&'static str, Response), Refusal> {
    let Some(on_upgrade) = incoming
        .extensions_mut()
        .remove::<hyper::upgrade::OnUpgrade>()
    else {
        return Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            "bad_request",
            "this endpoint needs an HTTP/1.1 upgrade (WebSocket or SPDY/3.1)",
        ));
    };
    if !incoming.headers().contains_key(header::UPGRADE) {
        return Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            "bad_request",
            "missing Upgrade header: exec, attach and port-forward are WebSocket or SPDY/3.1 \
             upgrades",
        ));
    }
    let (mut parts, body) = outgoing.into_parts();
    // SPDY upgrades come as POST, WebSocket ones as GET: the provider sees the same.
    parts.method = incoming.method().clone();
    copy_headers(
        &UPGRADE_REQUEST_HEADERS,
        incoming.headers(),
        &mut parts.headers,
    );
    let mut response = client
        .send(http::Request::from_parts(
            parts,
            kube::client::Body::from(body),
        ))
        .await
        .map_err(|e| provider_failed(&e))?;
    if response.status() != StatusCode::SWITCHING_PROTOCOLS {
        return Ok(relay_response(response));
    }
    let provider_side = hyper::upgrade::on(&mut response);
    let mut answer = Response::new(Body::empty());
    *answer.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    copy_headers(
        &UPGRADE_RESPONSE_HEADERS,
        response.headers(),
        answer.headers_mut(),
    );
    tokio::spawn(async move {
        let (ours, theirs) = match tokio::join!(on_upgrade, provider_side) {
            (Ok(a), Ok(b)) => (a, b),
            (a, b) => {
                tracing::debug!(
                    api_server = a.err().map(|e| e.to_string()),
                    provider = b.err().map(|e| e.to_string()),
                    "an upgraded kubelet connection did not come up"
                );
                return;
            }
        };
        let mut ours = hyper_util::rt::TokioIo::new(ours);
        let mut theirs = hyper_util::rt::TokioIo::new(theirs);
        let _ = tokio::io::copy_bidirectional(&mut ours, &mut theirs).await;
    });
    Ok(("ok", answer))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(operation: Operation, container: Option<&str>) -> Target {
        Target {
            operation,
            namespace: "ns".into(),
            pod: "web".into(),
            container: container.map(Into::into),
        }
    }

    #[test]
    fn paths_name_the_operation_pod_and_container() {
        assert_eq!(
            parse_path("/containerLogs/ns/web/app"),
            Some(target(Operation::Logs, Some("app")))
        );
        assert_eq!(
            parse_path("/exec/ns/web/app"),
            Some(target(Operation::Exec, Some("app")))
        );
        // The kubelet's form with the pod UID.
        assert_eq!(
            parse_path("/attach/ns/web/0000-uid/app"),
            Some(target(Operation::Attach, Some("app")))
        );
        assert_eq!(
            parse_path("/portForward/ns/web"),
            Some(target(Operation::PortForward, None))
        );
        for bad in [
            "/containerLogs/ns/web",
            "/exec/ns//app",
            "/portForward/ns",
            "/run/ns/web/app",
            "/",
            "/containerLogs/ns/web/app/extra",
        ] {
            assert_eq!(parse_path(bad), None, "{bad}");
        }
    }

    #[test]
    fn log_queries_become_log_params_and_the_providers_query() {
        let lp = log_params(
            "app",
            "follow=true&tailLines=1&timestamps=true&previous=true&limitBytes=10&sinceSeconds=5",
        )
        .expect("valid");
        assert!(lp.follow && lp.previous && lp.timestamps);
        assert_eq!(
            (lp.tail_lines, lp.limit_bytes, lp.since_seconds),
            (Some(1), Some(10), Some(5))
        );
        let req = provider_request(
            &target(Operation::Logs, Some("app")),
            "twin",
            "tailLines=1&follow=true",
        )
        .expect("request");
        assert_eq!(
            req.uri().to_string(),
            "/api/v1/namespaces/twin/pods/web/log?container=app&follow=true&tailLines=1"
        );
        let since = log_params("app", "sinceTime=2026-01-02T03:04:05Z").expect("time");
        assert_eq!(
            since.since_time.map(|t| t.to_string()).as_deref(),
            Some("2026-01-02T03:04:05Z")
        );
        assert!(log_params("app", "tailLines=x").is_err());
        assert!(log_params("app", "follow=maybe").is_err());
        assert!(log_params("app", "sinceTime=yesterday").is_err());
    }

    #[test]
    fn exec_queries_use_the_apis_names_at_the_provider() {
        let (ap, command) = attach_params(
            "app",
            "command=sh&command=-c&command=echo+hi%26&input=1&output=1&tty=1",
        )
        .expect("valid");
        assert!(ap.stdin && ap.stdout && ap.tty && !ap.stderr);
        assert_eq!(command, ["sh", "-c", "echo hi&"]);
        let req = provider_request(
            &target(Operation::Exec, Some("app")),
            "twin",
            "command=cat&command=%2Fetc%2Fhostname&output=1&error=1",
        )
        .expect("request");
        assert_eq!(
            req.uri().to_string(),
            "/api/v1/namespaces/twin/pods/web/exec?stdout=true&stderr=true&container=app&\
             command=cat&command=%2Fetc%2Fhostname"
        );
        let e = provider_request(&target(Operation::Exec, Some("app")), "twin", "output=1")
            .expect_err("no command");
        assert!(e.contains("command"), "{e}");
        // kube-rs refuses what the API server would: no stream, or a tty with stderr.
        assert!(provider_request(&target(Operation::Attach, Some("app")), "t", "tty=1").is_err());
        assert!(
            provider_request(
                &target(Operation::Attach, Some("app")),
                "t",
                "output=1&error=1&tty=1"
            )
            .is_err()
        );
        let attach = provider_request(
            &target(Operation::Attach, Some("app")),
            "twin",
            "output=1&error=1",
        )
        .expect("attach");
        assert_eq!(
            attach.uri().to_string(),
            "/api/v1/namespaces/twin/pods/web/attach?stdout=true&stderr=true&container=app"
        );
    }

    #[test]
    fn port_forward_takes_its_ports_or_none_for_spdy() {
        assert_eq!(
            forward_ports("port=80&port=8080,443").expect("ports"),
            [80, 8080, 443]
        );
        assert!(forward_ports("port=0").is_err());
        assert!(forward_ports("port=http").is_err());
        let ws = provider_request(&target(Operation::PortForward, None), "twin", "port=8080")
            .expect("ws");
        assert_eq!(
            ws.uri().to_string(),
            "/api/v1/namespaces/twin/pods/web/portforward?ports=8080"
        );
        let spdy =
            provider_request(&target(Operation::PortForward, None), "twin", "").expect("spdy");
        assert_eq!(
            spdy.uri().to_string(),
            "/api/v1/namespaces/twin/pods/web/portforward"
        );
    }

    /// Serves `router` over plain HTTP/1.1 with upgrades on a free port.
    async fn http_server(router: Router) -> SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let router = router.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(
                        move |r: http::Request<hyper::body::Incoming>| {
                            let mut router = router.clone();
                            async move { tower::Service::call(&mut router, r).await }
                        },
                    );
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(tcp), service)
                        .with_upgrades()
                        .await;
                });
            }
        });
        addr
    }

    /// A provider that answers a SPDY upgrade (echoing the offered protocol) by writing back
    /// every byte it gets, upper-cased, and refuses anything else with a 403 body.
    fn provider() -> Router {
        Router::new().fallback(|mut request: http::Request<Body>| async move {
            let offered = request.headers().get(STREAM_PROTOCOL).cloned();
            let Some(on_upgrade) = request
                .extensions_mut()
                .remove::<hyper::upgrade::OnUpgrade>()
                .filter(|_| request.uri().path().ends_with("/portforward"))
            else {
                return (StatusCode::FORBIDDEN, "pods \"web\" is forbidden").into_response();
            };
            tokio::spawn(async move {
                use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
                let mut io = hyper_util::rt::TokioIo::new(on_upgrade.await.expect("upgrade"));
                let mut buf = [0u8; 64];
                while let Ok(n) = io.read(&mut buf).await {
                    if n == 0 || io.write_all(&buf[..n].to_ascii_uppercase()).await.is_err() {
                        break;
                    }
                }
            });
            let mut answer = StatusCode::SWITCHING_PROTOCOLS.into_response();
            answer
                .headers_mut()
                .insert(header::CONNECTION, "Upgrade".parse().expect("v"));
            answer
                .headers_mut()
                .insert(header::UPGRADE, "SPDY/3.1".parse().expect("v"));
            if let Some(p) = offered {
                answer.headers_mut().insert(STREAM_PROTOCOL, p);
            }
            answer
        })
    }

    #[tokio::test]
    async fn upgrades_are_joined_byte_for_byte_and_refusals_relayed() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let provider_addr = http_server(provider()).await;
        let config = kube::Config::new(
            format!("http://{provider_addr}")
                .parse()
                .expect("provider URL"),
        );
        let client =
            tether_runtime::transport::client(&config, tether_runtime::transport::Protocols::Http1)
                .expect("client");
        let relay = Router::new().fallback(move |request: http::Request<Body>| {
            let client = client.clone();
            async move {
                let target = parse_path(request.uri().path()).expect("kubelet path");
                let query = request.uri().query().unwrap_or_default().to_owned();
                let outgoing = provider_request(&target, "twin", &query).expect("request");
                match relay_upgrade(&client, request, outgoing).await {
                    Ok((_, response)) => response,
                    Err(refusal) => text(refusal.status, refusal.message),
                }
            }
        });
        let kubelet = http_server(relay).await;

        let mut tcp = tokio::net::TcpStream::connect(kubelet)
            .await
            .expect("connect");
        tcp.write_all(
            b"POST /portForward/ns/web HTTP/1.1\r\nhost: k\r\nconnection: Upgrade\r\n\
              upgrade: SPDY/3.1\r\nx-stream-protocol-version: portforward.k8s.io\r\n\r\n",
        )
        .await
        .expect("request");
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            let mut byte = [0u8; 1];
            tcp.read_exact(&mut byte).await.expect("response head");
            head.push(byte[0]);
        }
        let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
        assert!(head.starts_with("http/1.1 101"), "{head}");
        assert!(
            head.contains("x-stream-protocol-version: portforward.k8s.io"),
            "{head}"
        );
        tcp.write_all(b"frames\x00\x01").await.expect("write");
        let mut back = [0u8; 8];
        tokio::time::timeout(std::time::Duration::from_secs(5), tcp.read_exact(&mut back))
            .await
            .expect("in time")
            .expect("read");
        assert_eq!(&back, b"FRAMES\x00\x01");

        // The provider's refusal comes back with its code and message.
        let mut tcp = tokio::net::TcpStream::connect(kubelet)
            .await
            .expect("connect");
        tcp.write_all(
            b"GET /exec/ns/web/app?command=ls&output=1 HTTP/1.1\r\nhost: k\r\n\
              connection: Upgrade\r\nupgrade: websocket\r\nsec-websocket-key: \
              dGhlIHNhbXBsZSBub25jZQ==\r\nsec-websocket-version: 13\r\n\
              sec-websocket-protocol: v5.channel.k8s.io\r\n\r\n",
        )
        .await
        .expect("request");
        let mut answer = vec![0u8; 512];
        let n = tokio::time::timeout(std::time::Duration::from_secs(5), tcp.read(&mut answer))
            .await
            .expect("in time")
            .expect("read");
        let answer = String::from_utf8_lossy(&answer[..n]);
        assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
        assert!(answer.contains("pods \"web\" is forbidden"), "{answer}");
    }

    #[test]
    fn upgrade_headers_are_copied_with_every_value() {
        let mut from = HeaderMap::new();
        from.append(
            header::SEC_WEBSOCKET_PROTOCOL,
            "v5.channel.k8s.io".parse().expect("v"),
        );
        from.append(
            header::SEC_WEBSOCKET_PROTOCOL,
            "v4.channel.k8s.io".parse().expect("v"),
        );
        from.append(STREAM_PROTOCOL, "portforward.k8s.io".parse().expect("v"));
        from.append(header::AUTHORIZATION, "Bearer secret".parse().expect("v"));
        let mut to = HeaderMap::new();
        copy_headers(&UPGRADE_REQUEST_HEADERS, &from, &mut to);
        assert_eq!(to.get_all(header::SEC_WEBSOCKET_PROTOCOL).iter().count(), 2);
        assert_eq!(
            to.get(STREAM_PROTOCOL).expect("copied"),
            "portforward.k8s.io"
        );
        // The caller's credentials never reach the provider.
        assert!(to.get(header::AUTHORIZATION).is_none());
    }
}
