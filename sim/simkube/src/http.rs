//! The HTTP front: one axum handler that records, delays, authenticates, authorizes and
//! fault-injects every request, parses Kubernetes URLs, negotiates the representation (JSON,
//! Table, PartialObjectMetadata, aggregated discovery) and dispatches to the object handlers.

mod convert;
mod objects;
mod query;

use crate::discovery;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{HeaderValue, Method, StatusCode, header};
use serde_json::Value;

use crate::auth::{self, RequestAttributes, UserInfo};
use crate::error::ApiError;
use crate::protobuf::{DefaultKind, ProtobufError};
use crate::registry::{Registry, ResourceType};
use crate::store::{Store, TypeKey};
use crate::tls::ClientIdentity;

pub(crate) use convert::to_served;
pub(crate) use objects::Selectors;
pub use query::Query;

/// Largest request body accepted (the real server's limit is 3 MiB for most writes).
pub const DEFAULT_BODY_LIMIT: usize = 3 * 1024 * 1024;
/// Requests kept in the request log.
const REQUEST_LOG_CAPACITY: usize = 20_000;

/// One served request, for tests that assert on API usage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestRecord {
    /// HTTP method.
    pub method: String,
    /// URL path.
    pub path: String,
    /// Raw query string (without `?`).
    pub query: String,
    /// Authenticated user name (`system:anonymous` or empty before authentication).
    pub user: String,
    /// The Kubernetes verb the request was attributed to (`get`, `list`, `watch`, ...).
    pub verb: String,
    /// HTTP status code of the response (200 for a watch that started streaming).
    pub code: u16,
    /// The request's `Content-Type` header, if it had one (kubectl 1.32+ sends protobuf).
    pub content_type: Option<String>,
}

/// An injected failure: the next `remaining` requests with this verb and resource get `error`.
#[derive(Debug, Clone)]
pub struct Fault {
    /// Kubernetes verb (`get`, `list`, `watch`, `create`, `update`, `patch`, `delete`,
    /// `deletecollection`) or `*`.
    pub verb: String,
    /// Plural resource, `resource/subresource`, or `*`.
    pub resource: String,
    /// How many more requests it applies to.
    pub remaining: usize,
    /// The Status answered.
    pub error: ApiError,
}

/// Server knobs fixed at start.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Cluster name.
    pub name: String,
    /// Whether RBAC is enforced.
    pub rbac: bool,
    /// Largest accepted request body.
    pub body_limit: usize,
    /// How often watches with `allowWatchBookmarks=true` get a BOOKMARK.
    pub bookmark_interval: Duration,
    /// Watch duration when the client sends no `timeoutSeconds` (kubectl sends none).
    pub default_watch_timeout: Duration,
    /// Requests without credentials act as the admin, like the old insecure port. Only for
    /// plain HTTP without RBAC: kubectl never sends a bearer token over plain HTTP.
    pub anonymous_is_admin: bool,
    /// The range ClusterIPs are allocated from (10.96.0.0/12 by default).
    pub service_cidr: ipnet::Ipv4Net,
}

/// Hook for `pods/{name}/log` and `pods/{name}/exec` (the kubelet proxy plugs in here).
pub type PodProxy = Arc<
    dyn Fn(
            Arc<ServerState>,
            Request,
            String,
            String,
            String,
        ) -> futures::future::BoxFuture<'static, Response>
        + Send
        + Sync,
>;

/// Everything the handlers share: store, registry, auth, config and test controls.
pub struct ServerState {
    /// Knobs.
    pub config: ServerConfig,
    /// The objects.
    pub store: Store,
    /// Served types; replaced whole when CRDs change.
    pub registry: RwLock<Arc<Registry>>,
    /// Request authentication.
    pub authenticator: auth::Authenticator,
    /// Pending injected failures.
    pub faults: Mutex<Vec<Fault>>,
    /// Delay added to every request.
    pub latency: Mutex<Duration>,
    /// The `/metrics` counters and gauges.
    pub metrics: crate::metrics::Metrics,
    /// Recent requests, oldest first.
    pub requests: Mutex<VecDeque<RequestRecord>>,
    /// Bumped to end every open watch.
    pub watch_breaker: tokio::sync::watch::Sender<u64>,
    /// Handler for `pods/log` and `pods/exec`; none answers 503.
    pub pod_proxy: RwLock<Option<PodProxy>>,
    /// The authorizer's view of the RBAC objects, rebuilt when one of them changes.
    pub rbac_cache: Mutex<Option<([u64; 4], Arc<auth::RbacView>)>>,
    /// How admission webhooks named by a Service reach its endpoints; none dials them from
    /// this process's network namespace.
    pub webhook_dialer: RwLock<Option<crate::admission::webhooks::WebhookDialer>>,
    /// Connections to webhooks, reused between calls.
    pub webhook_connections: crate::admission::webhooks::WebhookConnections,
}

impl std::fmt::Debug for ServerState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerState")
            .field("config", &self.config)
            .field("store", &self.store)
            .field("authenticator", &self.authenticator)
            .finish_non_exhaustive()
    }
}

impl ServerState {
    /// The current registry.
    pub fn registry(&self) -> Arc<Registry> {
        self.registry
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Replaces the registry.
    pub fn set_registry(&self, registry: Registry) {
        *self.registry.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(registry);
    }

    fn record(&self, rec: RequestRecord) {
        let mut log = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        if log.len() >= REQUEST_LOG_CAPACITY {
            log.pop_front();
        }
        log.push_back(rec);
    }

    fn take_fault(&self, verb: &str, resource: &str, subresource: &str) -> Option<ApiError> {
        let mut faults = self.faults.lock().unwrap_or_else(|e| e.into_inner());
        let full = if subresource.is_empty() {
            resource.to_owned()
        } else {
            format!("{resource}/{subresource}")
        };
        let pos = faults.iter().position(|f| {
            (f.verb == "*" || f.verb == verb)
                && (f.resource == "*" || f.resource == full || f.resource == resource)
        })?;
        let fault = &mut faults[pos];
        fault.remaining = fault.remaining.saturating_sub(1);
        let error = fault.error.clone();
        if fault.remaining == 0 {
            faults.remove(pos);
        }
        Some(error)
    }

    /// The store key for a type (its group and plural, shared by all versions).
    pub fn type_key(rt: &ResourceType) -> TypeKey {
        convert::storage_key(rt)
    }
}

/// The axum router serving the whole API for `state`.
pub fn router(state: Arc<ServerState>) -> axum::Router {
    axum::Router::new().fallback(entry).with_state(state)
}

/// Which representation the client asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Repr {
    /// The object itself.
    Json,
    /// `meta.k8s.io/v1` Table (kubectl get).
    Table,
    /// `PartialObjectMetadata` / `PartialObjectMetadataList` (metadata watchers).
    Metadata,
}

/// Picks the representation from an Accept header, first acceptable media type wins.
pub fn negotiate(accept: Option<&str>) -> Repr {
    let Some(accept) = accept else {
        return Repr::Json;
    };
    for media in accept.split(',') {
        let mut parts = media.split(';').map(str::trim);
        let base = parts.next().unwrap_or_default();
        let params: Vec<(&str, &str)> = parts.filter_map(|p| p.split_once('=')).collect();
        let param = |k: &str| {
            params
                .iter()
                .find(|(pk, _)| pk.eq_ignore_ascii_case(k))
                .map(|(_, v)| *v)
        };
        if base != "application/json" && base != "*/*" && base != "application/*" {
            continue;
        }
        match param("as") {
            None => return Repr::Json,
            Some("Table") if param("g") == Some("meta.k8s.io") => return Repr::Table,
            Some("PartialObjectMetadata" | "PartialObjectMetadataList")
                if param("g") == Some("meta.k8s.io") =>
            {
                return Repr::Metadata;
            }
            Some(_) => continue,
        }
    }
    Repr::Json
}

/// A JSON response with a status code.
pub fn json_response(code: StatusCode, body: &Value) -> Response {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    raw_json(code, bytes)
}

fn raw_json(code: StatusCode, bytes: Vec<u8>) -> Response {
    let mut resp = Response::new(Body::from(bytes));
    *resp.status_mut() = code;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

fn text(code: StatusCode, body: &'static str) -> Response {
    let mut resp = Response::new(Body::from(body));
    *resp.status_mut() = code;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

/// A parsed resource URL.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResourcePath {
    /// API group (empty for core).
    pub group: String,
    /// API version.
    pub version: String,
    /// Namespace from the URL.
    pub namespace: Option<String>,
    /// Plural resource.
    pub resource: String,
    /// Object name.
    pub name: Option<String>,
    /// Subresource.
    pub subresource: Option<String>,
    /// The legacy `/watch/` path prefix was used.
    pub watch_prefix: bool,
}

/// What a URL addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// `/version`
    Version,
    /// `/healthz`, `/livez`, `/readyz` (and their `/...` checks)
    Health,
    /// `/api`
    LegacyVersions,
    /// `/apis`
    GroupList,
    /// `/apis/{group}`
    Group(String),
    /// `/api/v1` or `/apis/{group}/{version}`
    ResourceList(String, String),
    /// `/openapi/v3`
    OpenApiRoot,
    /// `/openapi/v3/{path}`
    OpenApi(String),
    /// `/metrics` (Prometheus; a non-resource URL RBAC must allow, as on kube-apiserver)
    Metrics,
    /// A resource URL.
    Resource(ResourcePath),
    /// Anything else.
    Unknown,
}

/// Parses a request path.
pub fn parse_path(path: &str) -> Route {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    match parts.as_slice() {
        ["version"] => Route::Version,
        ["metrics"] => Route::Metrics,
        [h, ..] if matches!(*h, "healthz" | "livez" | "readyz") => Route::Health,
        ["api"] => Route::LegacyVersions,
        ["apis"] => Route::GroupList,
        ["apis", g] => Route::Group((*g).to_owned()),
        ["api", v] => Route::ResourceList(String::new(), (*v).to_owned()),
        ["apis", g, v] => Route::ResourceList((*g).to_owned(), (*v).to_owned()),
        ["openapi", "v3"] => Route::OpenApiRoot,
        ["openapi", "v3", rest @ ..] => Route::OpenApi(rest.join("/")),
        ["api", v, rest @ ..] => resource_route("", v, rest),
        ["apis", g, v, rest @ ..] => resource_route(g, v, rest),
        _ => Route::Unknown,
    }
}

fn resource_route(group: &str, version: &str, rest: &[&str]) -> Route {
    let mut rp = ResourcePath {
        group: group.to_owned(),
        version: version.to_owned(),
        ..Default::default()
    };
    let mut rest = rest;
    if rest.first() == Some(&"watch") && rest.len() >= 2 {
        rp.watch_prefix = true;
        rest = &rest[1..];
    }
    let s = |x: &&str| (*x).to_owned();
    match rest {
        ["namespaces", ns, sub] if matches!(*sub, "status" | "finalize") => {
            rp.resource = "namespaces".into();
            rp.name = Some(s(ns));
            rp.subresource = Some(s(sub));
        }
        ["namespaces", ns, res, tail @ ..] => {
            rp.namespace = Some(s(ns));
            rp.resource = s(res);
            match tail {
                [] => {}
                [name] => rp.name = Some(s(name)),
                [name, sub] => {
                    rp.name = Some(s(name));
                    rp.subresource = Some(s(sub));
                }
                _ => return Route::Unknown,
            }
        }
        [res] => rp.resource = s(res),
        [res, name] => {
            rp.resource = s(res);
            rp.name = Some(s(name));
        }
        [res, name, sub] => {
            rp.resource = s(res);
            rp.name = Some(s(name));
            rp.subresource = Some(s(sub));
        }
        _ => return Route::Unknown,
    }
    Route::Resource(rp)
}

/// Paths served to everyone, like the `system:public-info-viewer` role allows.
fn is_public(route: &Route) -> bool {
    matches!(route, Route::Version | Route::Health)
}

async fn entry(State(state): State<Arc<ServerState>>, req: Request) -> Response {
    let started = std::time::Instant::now();
    let mut labels = metric_labels(&state, &req);
    let resp = handle(state.clone(), req).await;
    labels.code = resp.status().as_u16().to_string();
    state
        .metrics
        .observe(labels, started.elapsed().as_secs_f64());
    resp
}

/// The metric labels of a request, from bounded sets only: a resource the registry does not
/// serve is counted with empty group and resource.
fn metric_labels(state: &ServerState, req: &Request) -> crate::metrics::RequestLabels {
    let method = req.method();
    let mut labels = crate::metrics::RequestLabels {
        verb: method.as_str().to_owned(),
        group: String::new(),
        resource: String::new(),
        subresource: String::new(),
        code: String::new(),
    };
    let Route::Resource(rp) = parse_path(req.uri().path()) else {
        return labels;
    };
    let Some(rt) = state
        .registry()
        .lookup(&rp.group, &rp.version, &rp.resource)
    else {
        return labels;
    };
    labels.group = rt.group.clone();
    labels.resource = rt.plural.clone();
    let sub = rp.subresource.as_deref().unwrap_or_default();
    let connect = matches!(sub, "exec" | "attach" | "portforward");
    if rt.subresources.iter().any(|s| s == sub) || connect {
        labels.subresource = sub.to_owned();
    }
    let watch = rp.watch_prefix
        || Query::parse(req.uri().query().unwrap_or_default())
            .flag("watch")
            .unwrap_or(false);
    let apply = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("application/apply-patch"));
    // kube-apiserver's reported verbs.
    labels.verb = match (method.as_str(), rp.name.is_some()) {
        _ if connect => "CONNECT",
        ("GET", _) if watch => "WATCH",
        ("GET", true) => "GET",
        ("GET", false) => "LIST",
        ("PATCH", _) if apply => "APPLY",
        ("DELETE", false) => "DELETECOLLECTION",
        (m, _) => m,
    }
    .to_owned();
    labels
}

async fn handle(state: Arc<ServerState>, req: Request) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let raw_query = req.uri().query().unwrap_or_default().to_owned();
    let content_type = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let latency = *state.latency.lock().unwrap_or_else(|e| e.into_inner());
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    let route = parse_path(&path);
    let identity = req.extensions().get::<ClientIdentity>().cloned();
    let user = if is_public(&route) {
        state
            .authenticator
            .authenticate(req.headers(), identity.as_ref())
            .unwrap_or_else(|_| UserInfo::anonymous())
    } else {
        match state
            .authenticator
            .authenticate(req.headers(), identity.as_ref())
        {
            Ok(user)
                if user.username == auth::ANONYMOUS_USER && state.config.anonymous_is_admin =>
            {
                UserInfo::authenticated(auth::ADMIN_USER, &[auth::SYSTEM_MASTERS.to_owned()])
            }
            Ok(user) if user.username != auth::ANONYMOUS_USER => user,
            result => {
                let e = result.err().unwrap_or_else(ApiError::unauthorized);
                let resp = e.into_response();
                state.record(RequestRecord {
                    method: method.to_string(),
                    path,
                    query: raw_query,
                    user: String::new(),
                    verb: String::new(),
                    code: resp.status().as_u16(),
                    content_type,
                });
                return resp;
            }
        }
    };
    let user = match impersonation(&state, user, req.headers()) {
        Ok(user) => user,
        Err(e) => return e.into_response(),
    };
    let attrs = RequestAttributes::from_request(user.clone(), &method, &path, &raw_query);
    let resp = match authorize_and_serve(&state, req, route, &attrs, &raw_query).await {
        Ok(resp) => resp,
        Err(e) => e.into_response(),
    };
    tracing::debug!(%method, %path, code = resp.status().as_u16(), user = %user.username, "request");
    state.record(RequestRecord {
        method: method.to_string(),
        path,
        query: raw_query,
        user: user.username,
        verb: attrs.verb.clone(),
        code: resp.status().as_u16(),
        content_type,
    });
    resp
}

/// `Impersonate-*` headers (`kubectl --as`): act as another user when the caller may, as
/// kube-apiserver's impersonation filter does; without RBAC anyone may.
fn impersonation(
    state: &ServerState,
    user: UserInfo,
    headers: &http::HeaderMap,
) -> Result<UserInfo, ApiError> {
    if !auth::wants_impersonation(headers) {
        return Ok(user);
    }
    let view = state.config.rbac.then(|| objects::rbac_view(state));
    Ok(auth::impersonate(view.as_deref(), &user, headers)?.unwrap_or(user))
}

async fn authorize_and_serve(
    state: &Arc<ServerState>,
    req: Request,
    route: Route,
    attrs: &RequestAttributes,
    raw_query: &str,
) -> Result<Response, ApiError> {
    if state.config.rbac && !is_public(&route) {
        let view = objects::rbac_view(state);
        auth::authorize(&view, attrs)?;
    } else if attrs.user.username == auth::ANONYMOUS_USER && !is_public(&route) {
        // Without RBAC every authenticated user may do anything; anonymous users only reach
        // the public endpoints.
        return Err(ApiError::forbidden(auth::forbidden_message(attrs)));
    }
    if let Some(error) = state.take_fault(&attrs.verb, &attrs.resource, &attrs.subresource) {
        return Err(error);
    }
    let query = Query::parse(raw_query);
    let accept = req
        .headers()
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    match route {
        Route::Version => Ok(json_response(StatusCode::OK, &discovery::version())),
        Route::Health => Ok(text(StatusCode::OK, "ok")),
        Route::Metrics => {
            let body = state.metrics.render(&state.store, &state.registry());
            let mut resp = Response::new(Body::from(body));
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static(crate::metrics::CONTENT_TYPE),
            );
            Ok(resp)
        }
        Route::LegacyVersions | Route::GroupList => {
            let legacy = route == Route::LegacyVersions;
            let aggregated = accept.as_deref().is_some_and(wants_aggregated);
            let registry = state.registry();
            if aggregated {
                let mut resp =
                    json_response(StatusCode::OK, &discovery::aggregated(&registry, legacy));
                resp.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static(
                        "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList",
                    ),
                );
                return Ok(resp);
            }
            let body = if legacy {
                discovery::legacy_api_versions()
            } else {
                discovery::api_group_list(&registry)
            };
            Ok(json_response(StatusCode::OK, &body))
        }
        Route::Group(group) => discovery::api_group(&state.registry(), &group)
            .map(|v| json_response(StatusCode::OK, &v))
            .ok_or_else(ApiError::no_such_resource),
        Route::ResourceList(group, version) => {
            discovery::api_resource_list(&state.registry(), &group, &version)
                .map(|v| json_response(StatusCode::OK, &v))
                .ok_or_else(ApiError::no_such_resource)
        }
        Route::OpenApiRoot => Ok(json_response(
            StatusCode::OK,
            &discovery::openapi_v3_root(&state.registry()),
        )),
        Route::OpenApi(rest) => discovery::openapi_v3_group_version(&state.registry(), &rest)
            .map(|v| json_response(StatusCode::OK, &v))
            .ok_or_else(ApiError::no_such_resource),
        Route::Resource(rp) => {
            let repr = negotiate(accept.as_deref());
            objects::serve(state, req, rp, query, repr, attrs).await
        }
        Route::Unknown => Err(ApiError::no_such_resource()),
    }
}

/// Whether the Accept header offers aggregated discovery v2 (kubectl and kube-rs list it first).
fn wants_aggregated(accept: &str) -> bool {
    accept.split(',').any(|media| {
        let params: Vec<&str> = media.split(';').map(str::trim).collect();
        params.contains(&"as=APIGroupDiscoveryList")
            && params.contains(&"g=apidiscovery.k8s.io")
            && params.contains(&"v=v2")
    })
}

/// Reads a request body up to the limit: 413 beyond it.
async fn read_body(state: &ServerState, body: Body) -> Result<Bytes, ApiError> {
    axum::body::to_bytes(body, state.config.body_limit)
        .await
        .map_err(|_| ApiError::too_large(state.config.body_limit))
}

/// The Content-Type of Kubernetes protobuf bodies.
pub const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";

/// The media type of a Content-Type header, without parameters (JSON when absent).
fn media_type(content_type: Option<&str>) -> &str {
    content_type
        .unwrap_or("application/json")
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
}

/// Whether a Content-Type is Kubernetes protobuf.
pub fn is_protobuf(content_type: Option<&str>) -> bool {
    media_type(content_type) == PROTOBUF
}

/// Decodes a JSON, YAML or protobuf request body according to its Content-Type. `into` is the
/// type the URL addresses: a protobuf envelope without a type is read as it, and decoding
/// errors name it as kube-apiserver's do.
pub fn decode_body(
    content_type: Option<&str>,
    body: &[u8],
    into: DefaultKind<'_>,
) -> Result<Value, ApiError> {
    match media_type(content_type) {
        PROTOBUF => {
            crate::protobuf::decode(body, into).map_err(|e| protobuf_decode_error(&e, into, body))
        }
        "application/yaml" | "application/apply-patch+yaml" | "text/yaml" => {
            serde_yaml::from_slice::<Value>(body)
                .map_err(|e| ApiError::bad_request(format!("error converting YAML to JSON: {e}")))
        }
        _ => serde_json::from_slice::<Value>(body).map_err(|e| {
            ApiError::bad_request(format!("couldn't get version/kind; json parse error: {e}"))
        }),
    }
}

/// A protobuf body that does not decode, worded as kube-apiserver's `transformDecodeError`.
fn protobuf_decode_error(error: &ProtobufError, into: DefaultKind<'_>, body: &[u8]) -> ApiError {
    if let ProtobufError::UnsupportedKind { .. } | ProtobufError::UnsupportedField { .. } = error {
        return ApiError::unsupported_media_type(format!(
            "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml ({error})"
        ));
    }
    if let ProtobufError::UnknownKind { api_version, kind } = error {
        let version = api_version.rsplit('/').next().unwrap_or_default();
        return ApiError::bad_request(format!(
            "{kind} in version {version:?} cannot be handled as a {}: no kind {kind:?} is registered for version {api_version:?} in scheme \"pkg/api/legacyscheme/scheme.go:30\"",
            into.kind
        ));
    }
    let summary: String = body.iter().take(30).map(|b| format!("{b:02x}")).collect();
    let ellipsis = if body.len() > 30 { " ..." } else { "" };
    ApiError::bad_request(format!(
        "the object provided is unrecognized (must be of type {}): {} ({summary}{ellipsis})",
        into.kind,
        crate::error::chain(error)
    ))
}

/// Methods are checked per route; this answers the rest.
fn method_not_allowed(method: &Method, rt: &ResourceType) -> ApiError {
    ApiError::method_not_supported(method.as_str(), &rt.group, &rt.plural)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_resource_urls() {
        let r = parse_path("/api/v1/namespaces/default/pods/p/status");
        let Route::Resource(rp) = r else {
            panic!("resource")
        };
        assert_eq!(
            (
                rp.group.as_str(),
                rp.namespace.as_deref(),
                rp.resource.as_str(),
                rp.name.as_deref(),
                rp.subresource.as_deref()
            ),
            ("", Some("default"), "pods", Some("p"), Some("status"))
        );
        let Route::Resource(ns) = parse_path("/api/v1/namespaces/x/finalize") else {
            panic!("ns")
        };
        assert_eq!(
            (
                ns.resource.as_str(),
                ns.name.as_deref(),
                ns.subresource.as_deref()
            ),
            ("namespaces", Some("x"), Some("finalize"))
        );
        let Route::Resource(w) = parse_path("/apis/apps/v1/watch/namespaces/d/deployments") else {
            panic!("w")
        };
        assert!(w.watch_prefix);
        assert_eq!(w.resource, "deployments");
        assert_eq!(parse_path("/apis/apps"), Route::Group("apps".into()));
        assert_eq!(parse_path("/nope"), Route::Unknown);
    }

    #[test]
    fn negotiates_table_and_metadata() {
        assert_eq!(
            negotiate(Some(
                "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
            )),
            Repr::Table
        );
        assert_eq!(
            negotiate(Some(
                "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
            )),
            Repr::Metadata
        );
        assert_eq!(
            negotiate(Some("application/vnd.kubernetes.protobuf,application/json")),
            Repr::Json
        );
        assert_eq!(negotiate(None), Repr::Json);
    }

    #[test]
    fn protobuf_bodies_that_do_not_decode_are_bad_requests_naming_the_type() {
        let into = DefaultKind {
            api_version: "v1",
            kind: "ConfigMap",
        };
        let err = decode_body(Some(PROTOBUF), b"k8s\0\n\x0f", into).expect_err("400");
        assert_eq!((err.code, err.reason.as_str()), (400, "BadRequest"));
        expect_test::expect!["the object provided is unrecognized (must be of type ConfigMap): malformed protobuf envelope: failed to decode Protobuf message: Unknown.type_meta: buffer underflow (6b3873000a0f)"].assert_eq(&err.message);
        assert!(is_protobuf(Some(
            "application/vnd.kubernetes.protobuf; charset=x"
        )));
        assert!(!is_protobuf(None));
    }
}
