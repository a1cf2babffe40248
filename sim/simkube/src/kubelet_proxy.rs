//! Pod `log`, `exec`, `attach` and `portforward` forwarding to the kubelet that runs the pod,
//! the way kube-apiserver does it, so that a virtual kubelet (or any node agent serving the
//! kubelet API) gets real `kubectl logs`/`kubectl exec` and kube-rs `Api::<Pod>::logs`/`exec`
//! traffic.
//!
//! The server reads the pod's `spec.nodeName`, then that Node's `status.addresses` and
//! `status.daemonEndpoints.kubeletEndpoint.Port` (10250 when unset), and calls the kubelet API
//! over HTTPS:
//!
//! - `GET /containerLogs/{namespace}/{pod}/{container}?follow=true&tailLines=..&timestamps=true&
//!   sinceSeconds=..&sinceTime=..&limitBytes=..&previous=true` (only the options that were set);
//!   the response body is streamed back unchanged (so `follow` streams).
//! - `GET /exec/{namespace}/{pod}/{container}?command=..&command=..&input=1&output=1&error=1&
//!   tty=1` as a WebSocket upgrade offering the subprotocols the client offered
//!   (`v5.channel.k8s.io`, `v4.channel.k8s.io`, ...). The client's connection is upgraded to the
//!   subprotocol the kubelet chose and frames are pumped both ways unchanged. The query names
//!   `input`/`output`/`error`/`tty` with value `1` are the kubelet's own, as kube-apiserver
//!   sends them. `attach` is the same on `/attach/{namespace}/{pod}/{container}` without
//!   `command`; `portforward` tunnels to `/portForward/{namespace}/{pod}?port=..` (the client's
//!   `ports=80,443` become repeated `port`).
//!
//! The kubelet's certificate is not verified unless a CA is configured, which is
//! kube-apiserver's default when `--kubelet-certificate-authority` is unset. Node addresses are
//! tried in the order InternalIP, ExternalIP, Hostname, InternalDNS, ExternalDNS (kubeadm's
//! `--kubelet-preferred-address-types`).
//!
//! Errors read as kube-apiserver's: logs of a pod not bound to a node are an empty 200, while
//! exec/attach/portforward answer 400 `pod <name> does not have a host assigned`; a missing Node
//! is 404 `nodes "<name>" not found`; an unreachable kubelet is 500 with the dial error
//! (`... dial tcp <addr>: connect: connection refused`); kubelet HTTP errors keep their code.
//!
//! A cluster installs [`pod_proxy`] with [`KubeletClient::default`]; to verify kubelets or
//! present a client certificate, install one built from a [`KubeletClientConfig`] in
//! `ServerState::pod_proxy`.
//!
//! `portforward` also comes as SPDY: kubectl 1.31+ tunnels SPDY/3.1 inside WebSocket binary
//! messages (subprotocol `SPDY/3.1+portforward.k8s.io`, KEP-4006), older kubectl (and the
//! fallback of newer ones) upgrades to `SPDY/3.1` directly. Both reach the kubelet as a plain
//! SPDY upgrade (`X-Stream-Protocol-Version: portforward.k8s.io`), as kube-apiserver's tunneling
//! handler does, and the bytes are carried unchanged; such requests need no `ports`, since the
//! streams name their ports. Exec and attach over SPDY are not forwarded (kubectl only falls
//! back to it when the WebSocket upgrade fails; it gets a clear error).

// `ApiError` is the crate's error type, returned by value by every handler.
#![allow(clippy::result_large_err)]

mod transport;

use std::fmt;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::FromRequestParts;
use axum::extract::ws::{Message as AxumMessage, WebSocket, WebSocketUpgrade};
use axum::response::{IntoResponse, Response};
use futures::{SinkExt, StreamExt};
use serde_json::Value;
use tokio_tungstenite::tungstenite::Message as WsMessage;

use crate::error::ApiError;

pub use transport::{
    KubeletClient, KubeletClientConfig, KubeletClientError, KubeletDialer, KubeletSocket,
    KubeletUpgraded,
};

/// The kubelet port when a Node does not report one.
pub const DEFAULT_KUBELET_PORT: u16 = 10250;

/// The user of the client certificate kube-apiserver presents to kubelets (kubeadm's
/// `apiserver-kubelet-client.crt`).
pub const KUBELET_CLIENT_USER: &str = "kube-apiserver-kubelet-client";
/// Its group, as kubeadm before 1.29 issued it (later ones use `kubeadm:cluster-admins`,
/// bound to `cluster-admin`: a kubelet's SubjectAccessReview allows both alike).
pub const KUBELET_CLIENT_GROUP: &str = "system:masters";
/// Its lifetime, kubeadm's one year.
const KUBELET_CLIENT_VALIDITY: std::time::Duration =
    std::time::Duration::from_secs(365 * 24 * 3600);

impl KubeletClient {
    /// A client presenting a certificate signed by `ca` for [`KUBELET_CLIENT_USER`] in
    /// [`KUBELET_CLIENT_GROUP`], as kube-apiserver's `--kubelet-client-certificate`, and not
    /// verifying kubelets (no `--kubelet-certificate-authority`).
    pub fn with_client_certificate_from(
        ca: &crate::tls::CertAuthority,
    ) -> Result<Self, KubeletClientError> {
        let (cert, key) = ca
            .issue_client_cert(
                KUBELET_CLIENT_USER,
                &[KUBELET_CLIENT_GROUP.to_owned()],
                KUBELET_CLIENT_VALIDITY,
            )
            .map_err(|e| KubeletClientError::Config(format!("kubelet client certificate: {e}")))?;
        Self::new(&KubeletClientConfig {
            client_cert_pem: Some(cert),
            client_key_pem: Some(RedactedPem(key.into())),
            ..KubeletClientConfig::default()
        })
    }
}

/// Node address types in the order they are preferred.
pub const PREFERRED_ADDRESS_TYPES: [&str; 5] = [
    "InternalIP",
    "ExternalIP",
    "Hostname",
    "InternalDNS",
    "ExternalDNS",
];

/// Where a pod's kubelet serves its API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeletTarget {
    /// The node's name.
    pub node: String,
    /// Address (IP or host name) from the Node's status.
    pub host: String,
    /// Kubelet port.
    pub port: u16,
}

impl KubeletTarget {
    /// `host:port`, with IPv6 addresses bracketed.
    pub fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

fn pod_name(pod: &Value) -> &str {
    pod.pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("")
}

fn container_names(pod: &Value) -> Vec<String> {
    ["initContainers", "containers", "ephemeralContainers"]
        .iter()
        .flat_map(|field| {
            pod.pointer(&format!("/spec/{field}"))
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
        })
        .filter_map(|c| c.get("name").and_then(Value::as_str).map(str::to_owned))
        .collect()
}

/// Picks the container a request is for, with kube-apiserver's rules and messages: an empty
/// name means the only container; a given name must be one of the pod's (init, regular or
/// ephemeral) containers.
pub fn resolve_container(pod: &Value, requested: Option<&str>) -> Result<String, ApiError> {
    let name = pod_name(pod);
    match requested.filter(|c| !c.is_empty()) {
        Some(container) => {
            if container_names(pod).iter().any(|c| c == container) {
                Ok(container.to_owned())
            } else {
                Err(ApiError::bad_request(format!(
                    "container {container} is not valid for pod {name}"
                )))
            }
        }
        None => {
            let regular: Vec<&str> = pod
                .pointer("/spec/containers")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|c| c.get("name").and_then(Value::as_str))
                .collect();
            match regular.as_slice() {
                [only] => Ok((*only).to_owned()),
                [] => Err(ApiError::bad_request(format!(
                    "a container name must be specified for pod {name}"
                ))),
                _ => {
                    let init: Vec<&str> = pod
                        .pointer("/spec/initContainers")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                        .filter_map(|c| c.get("name").and_then(Value::as_str))
                        .collect();
                    let mut message = format!(
                        "a container name must be specified for pod {name}, choose one of: [{}]",
                        regular.join(" ")
                    );
                    if !init.is_empty() {
                        message.push_str(&format!(
                            " or one of the init containers: [{}]",
                            init.join(" ")
                        ));
                    }
                    Err(ApiError::bad_request(message))
                }
            }
        }
    }
}

/// The node a pod is bound to, if any.
pub fn node_name(pod: &Value) -> Option<&str> {
    pod.pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
}

/// Where the kubelet of `node` (a Node object) listens. `node_name` names it for errors; `None`
/// for `node` means the Node does not exist (404 as kube-apiserver answers).
pub fn kubelet_target(node_name: &str, node: Option<&Value>) -> Result<KubeletTarget, ApiError> {
    let Some(node) = node else {
        return Err(ApiError::not_found("", "nodes", node_name));
    };
    let addresses: Vec<(&str, &str)> = node
        .pointer("/status/addresses")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|a| {
            Some((
                a.get("type")?.as_str()?,
                a.get("address")?.as_str().filter(|s| !s.is_empty())?,
            ))
        })
        .collect();
    let host = PREFERRED_ADDRESS_TYPES
        .iter()
        .find_map(|wanted| addresses.iter().find(|(t, _)| t == wanted))
        .map(|(_, address)| (*address).to_owned())
        .ok_or_else(|| {
            let known: Vec<String> = addresses
                .iter()
                .map(|(t, a)| format!("{{{t} {a}}}"))
                .collect();
            ApiError::internal(format!(
                "no preferred addresses found; known addresses: [{}]",
                known.join(" ")
            ))
        })?;
    let port = node
        .pointer("/status/daemonEndpoints/kubeletEndpoint/Port")
        .and_then(Value::as_i64)
        .and_then(|p| u16::try_from(p).ok())
        .filter(|p| *p > 0)
        .unwrap_or(DEFAULT_KUBELET_PORT);
    Ok(KubeletTarget {
        node: node_name.to_owned(),
        host,
        port,
    })
}

fn query_pairs(query: &str) -> Vec<(String, String)> {
    form_urlencoded::parse(query.as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

fn parse_bool(name: &str, value: &str) -> Result<bool, ApiError> {
    match value {
        "true" | "1" | "True" | "TRUE" | "t" | "T" => Ok(true),
        "false" | "0" | "False" | "FALSE" | "f" | "F" | "" => Ok(false),
        other => Err(ApiError::bad_request(format!(
            "invalid value {other:?} for query parameter {name}: expected true or false"
        ))),
    }
}

fn parse_int(name: &str, value: &str) -> Result<i64, ApiError> {
    value.parse().map_err(|_| {
        ApiError::bad_request(format!(
            "invalid value {value:?} for query parameter {name}: expected an integer"
        ))
    })
}

/// `PodLogOptions` from a `pods/log` query string.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogOptions {
    /// `container`.
    pub container: Option<String>,
    /// `follow`.
    pub follow: bool,
    /// `previous`.
    pub previous: bool,
    /// `timestamps`.
    pub timestamps: bool,
    /// `sinceSeconds`.
    pub since_seconds: Option<i64>,
    /// `sinceTime` (RFC 3339).
    pub since_time: Option<String>,
    /// `tailLines`.
    pub tail_lines: Option<i64>,
    /// `limitBytes`.
    pub limit_bytes: Option<i64>,
}

impl LogOptions {
    /// Parses and validates the query as kube-apiserver does (422 for out-of-range values).
    pub fn from_query(pod: &str, query: &str) -> Result<Self, ApiError> {
        let mut opts = LogOptions::default();
        for (key, value) in query_pairs(query) {
            match key.as_str() {
                "container" => opts.container = Some(value),
                "follow" => opts.follow = parse_bool(&key, &value)?,
                "previous" => opts.previous = parse_bool(&key, &value)?,
                "timestamps" => opts.timestamps = parse_bool(&key, &value)?,
                "sinceSeconds" => opts.since_seconds = Some(parse_int(&key, &value)?),
                "sinceTime" => opts.since_time = Some(value),
                "tailLines" => opts.tail_lines = Some(parse_int(&key, &value)?),
                "limitBytes" => opts.limit_bytes = Some(parse_int(&key, &value)?),
                _ => {}
            }
        }
        let mut causes = Vec::new();
        let mut invalid = |field: &str, value: String, why: &str| {
            causes.push(crate::error::Cause {
                reason: "FieldValueInvalid".to_owned(),
                message: format!("Invalid value: {value}: {why}"),
                field: field.to_owned(),
            });
        };
        if let Some(n) = opts.tail_lines.filter(|n| *n < 0) {
            invalid(
                "tailLines",
                n.to_string(),
                "must be greater than or equal to 0",
            );
        }
        if let Some(n) = opts.limit_bytes.filter(|n| *n < 1) {
            invalid("limitBytes", n.to_string(), "must be greater than 0");
        }
        if let Some(n) = opts.since_seconds.filter(|n| *n < 1) {
            invalid("sinceSeconds", n.to_string(), "must be greater than 0");
        }
        if opts.since_seconds.is_some() && opts.since_time.is_some() {
            causes.push(crate::error::Cause {
                reason: "FieldValueForbidden".to_owned(),
                message: "Forbidden: at most one of `sinceTime` or `sinceSeconds` may be specified"
                    .to_owned(),
                field: String::new(),
            });
        }
        if !causes.is_empty() {
            return Err(ApiError::invalid("", "PodLogOptions", pod, &causes));
        }
        Ok(opts)
    }

    /// The kubelet query string: only the options that were set.
    pub fn kubelet_query(&self) -> String {
        let mut out = form_urlencoded::Serializer::new(String::new());
        if self.follow {
            out.append_pair("follow", "true");
        }
        if self.previous {
            out.append_pair("previous", "true");
        }
        if self.timestamps {
            out.append_pair("timestamps", "true");
        }
        if let Some(n) = self.since_seconds {
            out.append_pair("sinceSeconds", &n.to_string());
        }
        if let Some(t) = &self.since_time {
            out.append_pair("sinceTime", t);
        }
        if let Some(n) = self.tail_lines {
            out.append_pair("tailLines", &n.to_string());
        }
        if let Some(n) = self.limit_bytes {
            out.append_pair("limitBytes", &n.to_string());
        }
        out.finish()
    }
}

/// `PodExecOptions` from a `pods/exec` query string.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecOptions {
    /// `container`.
    pub container: Option<String>,
    /// `command` (repeated).
    pub command: Vec<String>,
    /// `stdin`.
    pub stdin: bool,
    /// `stdout`.
    pub stdout: bool,
    /// `stderr`.
    pub stderr: bool,
    /// `tty`.
    pub tty: bool,
}

impl ExecOptions {
    /// Parses and validates an exec query.
    pub fn from_query(pod: &str, query: &str) -> Result<Self, ApiError> {
        Self::parse(pod, query, true)
    }

    /// Parses and validates an exec (`require_command`) or attach query.
    pub fn parse(pod: &str, query: &str, require_command: bool) -> Result<Self, ApiError> {
        let mut opts = ExecOptions::default();
        for (key, value) in query_pairs(query) {
            match key.as_str() {
                "container" => opts.container = Some(value),
                "command" => opts.command.push(value),
                "stdin" => opts.stdin = parse_bool(&key, &value)?,
                "stdout" => opts.stdout = parse_bool(&key, &value)?,
                "stderr" => opts.stderr = parse_bool(&key, &value)?,
                "tty" => opts.tty = parse_bool(&key, &value)?,
                _ => {}
            }
        }
        let mut causes = Vec::new();
        if require_command && opts.command.is_empty() {
            causes.push(crate::error::Cause {
                reason: "FieldValueRequired".to_owned(),
                message: "Required value: you must specify at least 1 command".to_owned(),
                field: "command".to_owned(),
            });
        }
        if !(opts.stdin || opts.stdout || opts.stderr) {
            causes.push(crate::error::Cause {
                reason: "FieldValueRequired".to_owned(),
                message: "Required value: you must specify at least 1 of stdin, stdout, stderr"
                    .to_owned(),
                field: String::new(),
            });
        }
        if !causes.is_empty() {
            let kind = if require_command {
                "PodExecOptions"
            } else {
                "PodAttachOptions"
            };
            return Err(ApiError::invalid("", kind, pod, &causes));
        }
        Ok(opts)
    }

    /// The kubelet query string, with the kubelet's parameter names.
    pub fn kubelet_query(&self) -> String {
        let mut out = form_urlencoded::Serializer::new(String::new());
        for arg in &self.command {
            out.append_pair("command", arg);
        }
        for (set, name) in [
            (self.stdin, "input"),
            (self.stdout, "output"),
            (self.stderr, "error"),
            (self.tty, "tty"),
        ] {
            if set {
                out.append_pair(name, "1");
            }
        }
        out.finish()
    }
}

fn path_segment(s: &str) -> String {
    // Kubernetes names are DNS labels/subdomains; escape anyway so a bad name cannot change the
    // path.
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

/// Serves `GET .../pods/{name}/log` for `pod`; `node` is the Node named by `spec.nodeName`
/// (`None` if it does not exist). A pod not bound to a node has no logs yet: the answer is an
/// empty 200, as kube-apiserver gives.
pub async fn proxy_log(
    client: &KubeletClient,
    pod: &Value,
    node: Option<&Value>,
    query: &str,
) -> Result<Response, ApiError> {
    let name = pod_name(pod);
    let opts = LogOptions::from_query(name, query)?;
    let container = resolve_container(pod, opts.container.as_deref())?;
    let Some(node_name) = node_name(pod) else {
        return Ok(plain_text(Body::empty()));
    };
    let target = kubelet_target(node_name, node)?;
    let namespace = pod
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or("default");
    let mut path = format!(
        "/containerLogs/{}/{}/{}",
        path_segment(namespace),
        path_segment(name),
        path_segment(&container)
    );
    let q = opts.kubelet_query();
    if !q.is_empty() {
        path.push('?');
        path.push_str(&q);
    }
    let response = client
        .get(&target, &path)
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let status = response.status();
    if !status.is_success() {
        return Err(kubelet_error(status.as_u16(), response.into_body()).await);
    }
    Ok(plain_text(response.into_body()))
}

fn plain_text(body: Body) -> Response {
    let mut response = Response::new(body);
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain"),
    );
    response
}

/// Turns a kubelet error response into a Status: a Status body passes through, anything else
/// becomes the message under the kubelet's status code.
async fn kubelet_error(code: u16, body: Body) -> ApiError {
    let bytes = axum::body::to_bytes(body, 64 * 1024)
        .await
        .unwrap_or_default();
    if let Ok(status) = serde_json::from_slice::<Value>(&bytes)
        && status.get("kind").and_then(Value::as_str) == Some("Status")
    {
        let message = status
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let reason = status
            .get("reason")
            .and_then(Value::as_str)
            .unwrap_or(reason_for(code));
        return ApiError::new(code, reason, message);
    }
    let text = String::from_utf8_lossy(&bytes).trim().to_owned();
    ApiError::new(code, reason_for(code), text)
}

fn reason_for(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        409 => "Conflict",
        422 => "Invalid",
        429 => "TooManyRequests",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "InternalError",
    }
}

/// The WebSocket subprotocols a client offered, in its order.
fn offered_protocols(parts: &http::request::Parts) -> Vec<String> {
    parts
        .headers
        .get_all(http::header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|p| p.trim().to_owned())
        .filter(|p| !p.is_empty())
        .collect()
}

fn is_websocket(parts: &http::request::Parts) -> bool {
    parts
        .headers
        .get(http::header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"))
}

/// The streaming pod subresources, each tunnelled to the kubelet over WebSocket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamKind {
    /// `pods/exec` → `/exec/{ns}/{pod}/{container}`.
    Exec,
    /// `pods/attach` → `/attach/{ns}/{pod}/{container}`.
    Attach,
    /// `pods/portforward` → `/portForward/{ns}/{pod}`.
    PortForward,
}

impl StreamKind {
    fn subresource(self) -> &'static str {
        match self {
            StreamKind::Exec => "exec",
            StreamKind::Attach => "attach",
            StreamKind::PortForward => "portforward",
        }
    }
}

/// The kubelet query for `pods/portforward`: the client's `ports=80,443` (or repeated `ports`)
/// become the kubelet's repeated `port`, as kube-apiserver translates them.
pub fn port_forward_query(pod: &str, query: &str) -> Result<String, ApiError> {
    port_forward_ports(pod, query, true)
}

/// [`port_forward_query`], with `required` false for the SPDY forms, whose streams name their
/// ports (kubectl sends no `ports`).
fn port_forward_ports(pod: &str, query: &str, required: bool) -> Result<String, ApiError> {
    let mut out = form_urlencoded::Serializer::new(String::new());
    let mut any = false;
    for (key, value) in query_pairs(query) {
        if key != "ports" {
            continue;
        }
        for port in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match port.parse::<u16>() {
                Ok(p) if p > 0 => {
                    out.append_pair("port", port);
                    any = true;
                }
                _ => {
                    return Err(ApiError::invalid(
                        "",
                        "PodPortForwardOptions",
                        pod,
                        &[crate::error::Cause {
                            reason: "FieldValueInvalid".to_owned(),
                            message: format!(
                                "Invalid value: {port:?}: must be a port between 1 and 65535"
                            ),
                            field: "ports".to_owned(),
                        }],
                    ));
                }
            }
        }
    }
    if !any && required {
        return Err(ApiError::invalid(
            "",
            "PodPortForwardOptions",
            pod,
            &[crate::error::Cause {
                reason: "FieldValueRequired".to_owned(),
                message: "Required value: at least one port is required".to_owned(),
                field: "ports".to_owned(),
            }],
        ));
    }
    Ok(out.finish())
}

/// Serves `GET .../pods/{name}/exec` (a WebSocket upgrade) for `pod` by tunnelling to the
/// kubelet's `/exec` WebSocket. Everything that can fail is checked before the client's
/// connection is upgraded, so errors reach the client as ordinary Status responses.
pub async fn proxy_exec(
    client: &KubeletClient,
    pod: &Value,
    node: Option<&Value>,
    request: http::Request<Body>,
) -> Result<Response, ApiError> {
    proxy_stream(client, pod, node, request, StreamKind::Exec).await
}

/// Serves `pods/exec`, `pods/attach` or `pods/portforward` as a WebSocket tunnel to the
/// kubelet: frames are copied unchanged in both directions, under the subprotocol the kubelet
/// chose among those the client offered.
pub async fn proxy_stream(
    client: &KubeletClient,
    pod: &Value,
    node: Option<&Value>,
    request: http::Request<Body>,
    kind: StreamKind,
) -> Result<Response, ApiError> {
    let name = pod_name(pod);
    let (mut parts, _body) = request.into_parts();
    let query = parts.uri.query().unwrap_or("");
    let namespace = pod
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or("default");
    let path = match kind {
        StreamKind::Exec | StreamKind::Attach => {
            let opts = ExecOptions::parse(name, query, kind == StreamKind::Exec)?;
            let container = resolve_container(pod, opts.container.as_deref())?;
            format!(
                "/{}/{}/{}/{}?{}",
                kind.subresource(),
                path_segment(namespace),
                path_segment(name),
                path_segment(&container),
                opts.kubelet_query()
            )
        }
        StreamKind::PortForward => {
            let ports = port_forward_ports(name, query, spdy_form(&parts).is_none())?;
            let mut path = format!(
                "/portForward/{}/{}",
                path_segment(namespace),
                path_segment(name),
            );
            if !ports.is_empty() {
                path.push('?');
                path.push_str(&ports);
            }
            path
        }
    };
    let Some(node_name) = node_name(pod) else {
        return Err(ApiError::bad_request(format!(
            "pod {name} does not have a host assigned"
        )));
    };
    let target = kubelet_target(node_name, node)?;
    if kind == StreamKind::PortForward
        && let Some(form) = spdy_form(&parts)
    {
        return proxy_spdy(client, &target, &path, parts, form).await;
    }
    if !is_websocket(&parts) {
        return Err(ApiError::bad_request(format!(
            "this server streams {} over WebSocket only (subprotocols v5.channel.k8s.io and \
             v4.channel.k8s.io); SPDY is not supported: use a client that speaks WebSocket \
             (kubectl 1.30+ does by default)",
            kind.subresource()
        )));
    }
    let offered = offered_protocols(&parts);
    let upgrade = WebSocketUpgrade::from_request_parts(&mut parts, &())
        .await
        .map_err(|e| ApiError::bad_request(format!("invalid WebSocket upgrade request: {e}")))?;
    let (kubelet, protocol) =
        client
            .websocket(&target, &path, &offered)
            .await
            .map_err(|e| match e {
                KubeletClientError::Rejected { code, body } => {
                    let text = String::from_utf8_lossy(&body).trim().to_owned();
                    ApiError::new(code, reason_for(code), text)
                }
                other => ApiError::internal(other.to_string()),
            })?;
    let upgrade = match protocol {
        Some(p) => upgrade.protocols([p]),
        None => upgrade,
    };
    Ok(upgrade
        .on_upgrade(move |socket| pump(socket, kubelet))
        .into_response())
}

/// The prefix of a WebSocket subprotocol that tunnels SPDY (KEP-4006): the rest is the
/// protocol spoken over SPDY, e.g. `SPDY/3.1+portforward.k8s.io`.
const TUNNEL_PREFIX: &str = "SPDY/3.1+";

/// How a client asks for SPDY.
#[derive(Debug, Clone, PartialEq, Eq)]
enum SpdyForm {
    /// A plain `Upgrade: SPDY/3.1` (kubectl before 1.31, or its fallback), offering these
    /// `X-Stream-Protocol-Version`s.
    Upgrade(Vec<String>),
    /// SPDY inside WebSocket binary messages, offering these protocols (without the prefix).
    Tunnel(Vec<String>),
}

fn spdy_form(parts: &http::request::Parts) -> Option<SpdyForm> {
    if is_websocket(parts) {
        let tunnelled: Vec<String> = offered_protocols(parts)
            .iter()
            .filter_map(|p| p.strip_prefix(TUNNEL_PREFIX))
            .map(str::to_owned)
            .collect();
        return (!tunnelled.is_empty()).then_some(SpdyForm::Tunnel(tunnelled));
    }
    let spdy = parts
        .headers
        .get(http::header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("SPDY/3.1"));
    spdy.then(|| {
        SpdyForm::Upgrade(
            parts
                .headers
                .get_all(transport::STREAM_PROTOCOL_HEADER)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .flat_map(|v| v.split(','))
                .map(|p| p.trim().to_owned())
                .filter(|p| !p.is_empty())
                .collect(),
        )
    })
}

/// Port-forward over SPDY, as kube-apiserver does it: the kubelet is always reached with an
/// SPDY upgrade; a tunnelling client gets the kubelet's bytes as WebSocket binary messages
/// (and its messages' payloads go to the kubelet), a SPDY client gets them unchanged.
async fn proxy_spdy(
    client: &KubeletClient,
    target: &KubeletTarget,
    path: &str,
    mut parts: http::request::Parts,
    form: SpdyForm,
) -> Result<Response, ApiError> {
    let (offered, method) = match &form {
        SpdyForm::Upgrade(offered) => (offered.clone(), http::Method::POST),
        SpdyForm::Tunnel(offered) => (offered.clone(), http::Method::GET),
    };
    let (kubelet, chosen) = client
        .spdy_upgrade(target, path, method, &offered)
        .await
        .map_err(|e| match e {
            KubeletClientError::Rejected { code, body } => {
                let text = String::from_utf8_lossy(&body).trim().to_owned();
                ApiError::new(code, reason_for(code), text)
            }
            other => ApiError::internal(other.to_string()),
        })?;
    // A kubelet naming no version speaks the client's first.
    let chosen = chosen.or_else(|| offered.first().cloned());
    match form {
        SpdyForm::Tunnel(_) => {
            let upgrade = WebSocketUpgrade::from_request_parts(&mut parts, &())
                .await
                .map_err(|e| {
                    ApiError::bad_request(format!("invalid WebSocket upgrade request: {e}"))
                })?;
            let upgrade = match chosen {
                Some(p) => upgrade.protocols([format!("{TUNNEL_PREFIX}{p}")]),
                None => upgrade,
            };
            Ok(upgrade
                .on_upgrade(move |socket| tunnel(socket, kubelet))
                .into_response())
        }
        SpdyForm::Upgrade(_) => {
            let Some(on_upgrade) = parts.extensions.remove::<hyper::upgrade::OnUpgrade>() else {
                return Err(ApiError::internal(
                    "this connection cannot be upgraded (HTTP/2 carries no SPDY upgrade); \
                     use HTTP/1.1"
                        .to_owned(),
                ));
            };
            tokio::spawn(async move {
                let Ok(upgraded) = on_upgrade.await else {
                    return;
                };
                let mut client = hyper_util::rt::TokioIo::new(upgraded);
                let mut kubelet = kubelet;
                let _ = tokio::io::copy_bidirectional(&mut client, &mut kubelet).await;
            });
            let mut response = http::StatusCode::SWITCHING_PROTOCOLS.into_response();
            let headers = response.headers_mut();
            headers.insert(
                http::header::CONNECTION,
                http::HeaderValue::from_static("Upgrade"),
            );
            headers.insert(
                http::header::UPGRADE,
                http::HeaderValue::from_static("SPDY/3.1"),
            );
            if let Some(p) = chosen.and_then(|p| http::HeaderValue::from_str(&p).ok()) {
                headers.insert(transport::STREAM_PROTOCOL_HEADER, p);
            }
            Ok(response)
        }
    }
}

/// Carries a SPDY connection between a tunnelling client (WebSocket binary messages) and the
/// kubelet (raw bytes) until the kubelet's side ends.
async fn tunnel(client: WebSocket, kubelet: transport::KubeletUpgraded) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let (mut client_tx, mut client_rx) = client.split();
    let (mut kubelet_rx, mut kubelet_tx) = tokio::io::split(kubelet);
    let upstream = async {
        while let Some(Ok(message)) = client_rx.next().await {
            match message {
                AxumMessage::Binary(data) if kubelet_tx.write_all(&data).await.is_err() => break,
                AxumMessage::Close(_) => break,
                _ => {}
            }
        }
        let _ = kubelet_tx.shutdown().await;
    };
    let downstream = async {
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            match kubelet_rx.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let data = bytes::Bytes::copy_from_slice(&buf[..n]);
                    if client_tx.send(AxumMessage::Binary(data)).await.is_err() {
                        break;
                    }
                }
            }
        }
        let _ = client_tx
            .send(AxumMessage::Close(Some(axum::extract::ws::CloseFrame {
                code: axum::extract::ws::close_code::NORMAL,
                reason: "".into(),
            })))
            .await;
    };
    tokio::select! {
        () = downstream => {}
        () = async { upstream.await; std::future::pending::<()>().await } => {}
    }
}

/// Copies frames between the client and the kubelet until either side closes.
async fn pump(client: WebSocket, kubelet: transport::KubeletSocket) {
    let (mut client_tx, mut client_rx) = client.split();
    let (mut kubelet_tx, mut kubelet_rx) = kubelet.split();
    let upstream = async {
        while let Some(Ok(message)) = client_rx.next().await {
            let closing = matches!(message, AxumMessage::Close(_));
            if kubelet_tx.send(to_kubelet(message)).await.is_err() || closing {
                break;
            }
        }
        let _ = kubelet_tx.close().await;
    };
    let downstream = async {
        while let Some(Ok(message)) = kubelet_rx.next().await {
            let Some(message) = to_client(message) else {
                continue;
            };
            let closing = matches!(message, AxumMessage::Close(_));
            if client_tx.send(message).await.is_err() || closing {
                break;
            }
        }
        let _ = client_tx.close().await;
    };
    // The exec session ends when the kubelet closes (the command exited); the client closing
    // first (interrupted) ends it too.
    tokio::select! {
        () = downstream => {}
        () = async { upstream.await; std::future::pending::<()>().await } => {}
    }
}

fn to_kubelet(message: AxumMessage) -> WsMessage {
    use tokio_tungstenite::tungstenite::protocol::CloseFrame;
    use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
    match message {
        AxumMessage::Binary(b) => WsMessage::Binary(b),
        AxumMessage::Text(t) => WsMessage::text(t.as_str()),
        AxumMessage::Ping(p) => WsMessage::Ping(p),
        AxumMessage::Pong(p) => WsMessage::Pong(p),
        AxumMessage::Close(frame) => WsMessage::Close(frame.map(|f| CloseFrame {
            code: CloseCode::from(f.code),
            reason: f.reason.as_str().into(),
        })),
    }
}

fn to_client(message: WsMessage) -> Option<AxumMessage> {
    use axum::extract::ws::CloseFrame;
    Some(match message {
        WsMessage::Binary(b) => AxumMessage::Binary(b),
        WsMessage::Text(t) => AxumMessage::Text(t.as_str().into()),
        WsMessage::Ping(p) => AxumMessage::Ping(p),
        WsMessage::Pong(p) => AxumMessage::Pong(p),
        // A close without a status reads as an abnormal 1005 to client-go ("close 1005 (no
        // status)"); kube-apiserver always ends an exec stream with a normal closure.
        WsMessage::Close(frame) => AxumMessage::Close(Some(frame.map_or(
            CloseFrame {
                code: axum::extract::ws::close_code::NORMAL,
                reason: "".into(),
            },
            |f| CloseFrame {
                code: f.code.into(),
                reason: f.reason.as_str().into(),
            },
        ))),
        WsMessage::Frame(_) => return None,
    })
}

/// The hook the HTTP layer calls for `pods/{name}/log` and `pods/{name}/exec`: reads the pod
/// and its Node from the store and forwards to the kubelet with `client`.
pub fn pod_proxy(client: KubeletClient) -> crate::http::PodProxy {
    Arc::new(move |state, request, namespace, name, subresource| {
        let client = client.clone();
        Box::pin(async move {
            serve(&client, &state, request, &namespace, &name, &subresource)
                .await
                .unwrap_or_else(IntoResponse::into_response)
        })
    })
}

async fn serve(
    client: &KubeletClient,
    state: &crate::http::ServerState,
    request: http::Request<Body>,
    namespace: &str,
    name: &str,
    subresource: &str,
) -> Result<Response, ApiError> {
    use crate::store::TypeKey;
    let pod = state
        .store
        .get(&TypeKey::new("", "pods"), namespace, name)
        .ok_or_else(|| ApiError::not_found("", "pods", name))?;
    let node =
        node_name(&pod).and_then(|node| state.store.get(&TypeKey::new("", "nodes"), "", node));
    match subresource {
        "log" => {
            let query = request.uri().query().unwrap_or("").to_owned();
            proxy_log(client, &pod, node.as_deref(), &query).await
        }
        "exec" => proxy_stream(client, &pod, node.as_deref(), request, StreamKind::Exec).await,
        "attach" => proxy_stream(client, &pod, node.as_deref(), request, StreamKind::Attach).await,
        "portforward" => {
            proxy_stream(
                client,
                &pod,
                node.as_deref(),
                request,
                StreamKind::PortForward,
            )
            .await
        }
        other => Err(ApiError::no_such_resource().with_details("", &format!("pods/{other}"), name)),
    }
}

/// A private key that never reaches logs.
#[derive(Clone)]
pub struct RedactedPem(pub Arc<str>);

impl fmt::Debug for RedactedPem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RedactedPem(..)")
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(containers: &[&str]) -> Value {
        json!({
            "metadata": {"name": "web", "namespace": "ns"},
            "spec": {
                "initContainers": [{"name": "init"}],
                "containers": containers.iter().map(|c| json!({"name": c})).collect::<Vec<_>>(),
                "nodeName": "n1",
            }
        })
    }

    #[test]
    fn container_defaulting_matches_the_apiserver() {
        assert_eq!(
            resolve_container(&pod(&["app"]), None).expect("only"),
            "app"
        );
        assert_eq!(
            resolve_container(&pod(&["app"]), Some("")).expect("only"),
            "app"
        );
        assert_eq!(
            resolve_container(&pod(&["app"]), Some("init")).expect("init"),
            "init"
        );
        let e = resolve_container(&pod(&["a", "b"]), None).expect_err("ambiguous");
        assert_eq!(e.code, 400);
        assert_eq!(
            e.message,
            "a container name must be specified for pod web, choose one of: [a b] or one of the \
             init containers: [init]"
        );
        let e = resolve_container(&pod(&["a"]), Some("zzz")).expect_err("unknown");
        assert_eq!(e.message, "container zzz is not valid for pod web");
    }

    #[test]
    fn kubelet_target_prefers_internal_ip_and_defaults_the_port() {
        let node = json!({"status": {
            "addresses": [
                {"type": "Hostname", "address": "n1"},
                {"type": "InternalIP", "address": "10.0.0.7"},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10443}},
        }});
        assert_eq!(
            kubelet_target("n1", Some(&node)).expect("target"),
            KubeletTarget {
                node: "n1".into(),
                host: "10.0.0.7".into(),
                port: 10443
            }
        );
        let bare = json!({"status": {"addresses": [{"type": "Hostname", "address": "n1"}]}});
        let t = kubelet_target("n1", Some(&bare)).expect("target");
        assert_eq!((t.host.as_str(), t.port), ("n1", DEFAULT_KUBELET_PORT));
        let v6 = KubeletTarget {
            node: "n".into(),
            host: "::1".into(),
            port: 1,
        };
        assert_eq!(v6.authority(), "[::1]:1");
    }

    #[test]
    fn kubelet_target_errors() {
        let e = kubelet_target("gone", None).expect_err("missing node");
        assert_eq!(
            (e.code, e.message.as_str()),
            (404, "nodes \"gone\" not found")
        );
        let e = kubelet_target("n1", Some(&json!({"status": {}}))).expect_err("no address");
        assert_eq!(e.code, 500);
        assert!(
            e.message.starts_with("no preferred addresses found"),
            "{}",
            e.message
        );
    }

    #[test]
    fn log_options_round_trip_to_the_kubelet_query() {
        let opts = LogOptions::from_query(
            "web",
            "container=app&follow=true&tailLines=3&timestamps=true&sinceSeconds=60&previous=false",
        )
        .expect("valid");
        assert_eq!(opts.container.as_deref(), Some("app"));
        assert_eq!(
            opts.kubelet_query(),
            "follow=true&timestamps=true&sinceSeconds=60&tailLines=3"
        );
        assert_eq!(LogOptions::default().kubelet_query(), "");
    }

    #[test]
    fn log_options_are_validated() {
        let e = LogOptions::from_query("web", "tailLines=-1").expect_err("negative");
        assert_eq!(e.code, 422);
        assert_eq!(
            e.message,
            "PodLogOptions \"web\" is invalid: tailLines: Invalid value: -1: must be greater than \
             or equal to 0"
        );
        let e = LogOptions::from_query("web", "sinceSeconds=5&sinceTime=2025-01-01T00:00:00Z")
            .expect_err("both");
        assert_eq!(e.code, 422);
        let e = LogOptions::from_query("web", "follow=maybe").expect_err("bool");
        assert_eq!(e.code, 400);
    }

    #[test]
    fn port_forward_ports_become_kubelet_port_parameters() {
        assert_eq!(
            port_forward_query("web", "ports=80,443&ports=8080").expect("valid"),
            "port=80&port=443&port=8080"
        );
        assert_eq!(port_forward_query("web", "").expect_err("none").code, 422);
        assert_eq!(
            port_forward_query("web", "ports=0").expect_err("zero").code,
            422
        );
        assert_eq!(
            port_forward_query("web", "ports=http")
                .expect_err("name")
                .code,
            422
        );
        let attach = ExecOptions::parse("web", "stdout=true&tty=true", false).expect("attach");
        assert_eq!(attach.kubelet_query(), "output=1&tty=1");
    }

    #[test]
    fn exec_options_use_kubelet_parameter_names() {
        let opts = ExecOptions::from_query(
            "web",
            "command=sh&command=-c&command=echo+hi%26&stdin=true&stdout=true&stderr=false&tty=false",
        )
        .expect("valid");
        assert_eq!(opts.command, vec!["sh", "-c", "echo hi&"]);
        assert_eq!(
            opts.kubelet_query(),
            "command=sh&command=-c&command=echo+hi%26&input=1&output=1"
        );
        let e = ExecOptions::from_query("web", "stdout=true").expect_err("no command");
        assert_eq!(e.code, 422);
        let e = ExecOptions::from_query("web", "command=ls").expect_err("no streams");
        assert_eq!(e.code, 422);
    }
}
