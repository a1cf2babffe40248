//! Object handlers: get, list, create, update, patch, delete, deletecollection, and the
//! subresources (status, binding, eviction, token, approval, finalize, scale), each running the
//! write pipeline under one store transaction so checks and the write are atomic.

use std::sync::Arc;

use axum::extract::Request;
use axum::response::Response;
use base64::Engine as _;
use http::{Method, StatusCode, header};
use serde_json::{Map, Value, json};

use super::{
    Query, Repr, ResourcePath, ServerState, convert, decode_body, json_response,
    method_not_allowed, raw_json, read_body,
};
use crate::auth::{self, RequestAttributes};
use crate::error::{ApiError, Cause, qualified};
use crate::protobuf::DefaultKind;
use crate::registry::{FieldValidation, Origin, ResourceType, UnknownFields};
use crate::selectors::{FieldSelector, LabelSelector};
use crate::store::{ObjKey, Page, Txn, TypeKey, obj_key};
use crate::strategy;

use crate::table;
use crate::{crd, patch};

/// The `foregroundDeletion` finalizer the GC controller honours.
pub(crate) const FOREGROUND_FINALIZER: &str = "foregroundDeletion";
/// The `orphan` finalizer the GC controller honours.
pub(crate) const ORPHAN_FINALIZER: &str = "orphan";

fn key(rt: &ResourceType) -> TypeKey {
    convert::storage_key(rt)
}

fn ns_key() -> TypeKey {
    TypeKey::new("", "namespaces")
}

/// The RBAC objects as the authorizer sees them right now.
pub(super) fn rbac_view(state: &ServerState) -> Arc<auth::RbacView> {
    const PLURALS: [&str; 4] = [
        "roles",
        "clusterroles",
        "rolebindings",
        "clusterrolebindings",
    ];
    let keys = PLURALS.map(|p| TypeKey::new(auth::RBAC_GROUP, p));
    let versions = [0, 1, 2, 3].map(|i| state.store.type_version(&keys[i]));
    let mut cache = state.rbac_cache.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((v, view)) = cache.as_ref()
        && *v == versions
    {
        return view.clone();
    }
    let list = |i: usize| -> Vec<Value> {
        state
            .store
            .all(&keys[i])
            .iter()
            .map(|o| (**o).clone())
            .collect()
    };
    let view = Arc::new(auth::RbacView::new(list(0), list(1), list(2), list(3)));
    *cache = Some((versions, view.clone()));
    view
}

/// Everything a handler needs about one request.
struct Ctx<'a> {
    state: &'a Arc<ServerState>,
    rt: Arc<ResourceType>,
    rp: ResourcePath,
    query: Query,
    repr: Repr,
    attrs: &'a RequestAttributes,
    /// Who writes, for `managedFields`: `fieldManager`, else the User-Agent's program name.
    manager: Option<String>,
    /// For writes of RBAC objects under enforced RBAC: the view escalation checks use.
    escalation_view: Option<Arc<auth::RbacView>>,
}

impl Ctx<'_> {
    fn ns(&self) -> &str {
        self.rp.namespace.as_deref().unwrap_or_default()
    }

    fn name(&self) -> &str {
        self.rp.name.as_deref().unwrap_or_default()
    }

    fn dry_run(&self) -> Result<bool, ApiError> {
        let values = self.query.all("dryRun");
        for v in &values {
            if *v != "All" {
                return Err(ApiError::bad_request(format!(
                    "invalid dry run option: {v:?}: supported values are \"All\""
                )));
            }
        }
        Ok(!values.is_empty())
    }

    fn not_found(&self) -> ApiError {
        ApiError::not_found(&self.rt.group, &self.rt.plural, self.name())
    }

    fn conflict(&self, name: &str, why: &str) -> ApiError {
        ApiError::conflict(&self.rt.group, &self.rt.plural, name, why)
    }

    /// `fieldValidation` on a create or update body (at the served version, before pruning):
    /// Strict fails with 400, Warn returns the warnings for the response headers.
    /// Unknown fields of built-ins are then dropped, as the real server's typed decoding does.
    fn validate_body_fields(&self, obj: &mut Value) -> Result<Vec<String>, ApiError> {
        let mode = self.query.get("fieldValidation");
        FieldValidation::parse(mode)?;
        // One typed round trip in the common case of a clean body.
        if self.rt.unknown_fields(obj).is_empty() {
            return Ok(Vec::new());
        }
        let warnings = crate::registry::field_validation(&self.rt, obj, mode)?;
        self.rt.drop_unknown_fields(obj);
        Ok(warnings)
    }
}

/// Adds one `Warning: 299 - "<text>"` header per warning, as kube-apiserver sends them (kubectl
/// prints `Warning: <text>`, kube-rs logs them).
fn with_warnings(mut resp: Response, warnings: &[String]) -> Response {
    for w in warnings {
        let quoted = format!("299 - \"{}\"", w.replace('\\', "\\\\").replace('"', "\\\""));
        if let Ok(v) = http::HeaderValue::from_bytes(quoted.as_bytes()) {
            resp.headers_mut().append(header::WARNING, v);
        }
    }
    resp
}

/// Go's `%+v` of a decoded JSON value (`map[a:1 b:[x y]]`), which is how kube-apiserver quotes a
/// strategic merge patch in its strict decoding error.
fn go_format(v: &Value) -> String {
    match v {
        Value::Null => "<nil>".to_owned(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => s.clone(),
        Value::Array(items) => {
            let parts: Vec<String> = items.iter().map(go_format).collect();
            format!("[{}]", parts.join(" "))
        }
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            let parts: Vec<String> = keys
                .into_iter()
                .map(|k| format!("{k}:{}", go_format(&map[k])))
                .collect();
            format!("map[{}]", parts.join(" "))
        }
    }
}

pub(super) async fn serve(
    state: &Arc<ServerState>,
    req: Request,
    rp: ResourcePath,
    query: Query,
    repr: Repr,
    attrs: &RequestAttributes,
) -> Result<Response, ApiError> {
    let registry = state.registry();
    let rt = registry
        .lookup(&rp.group, &rp.version, &rp.resource)
        .ok_or_else(ApiError::no_such_resource)?;
    if rt.namespaced && rp.namespace.is_none() && rp.name.is_some() {
        return Err(ApiError::no_such_resource());
    }
    if !rt.namespaced && rp.namespace.is_some() {
        return Err(ApiError::no_such_resource());
    }
    // attach and portforward are connect verbs the kubelet proxy serves whether or not
    // discovery lists them.
    let connect = rt.group.is_empty()
        && rt.plural == "pods"
        && matches!(rp.subresource.as_deref(), Some("attach" | "portforward"));
    if let Some(sub) = &rp.subresource
        && !connect
        && !rt.subresources.iter().any(|s| s == sub)
    {
        return Err(ApiError::no_such_resource());
    }
    let manager = query
        .get("fieldManager")
        .filter(|m| !m.is_empty())
        .map(str::to_owned)
        .or_else(|| {
            req.headers()
                .get(header::USER_AGENT)
                .and_then(|v| v.to_str().ok())
                .and_then(|ua| ua.split('/').next())
                .filter(|p| !p.is_empty())
                .map(|p| p.chars().take(128).collect())
        });
    let escalation_view = (state.config.rbac
        && rt.group == auth::RBAC_GROUP
        && !matches!(*req.method(), Method::GET | Method::DELETE))
    .then(|| rbac_view(state));
    let ctx = Ctx {
        state,
        rt,
        rp,
        query,
        repr,
        attrs,
        manager,
        escalation_view,
    };
    let method = req.method().clone();
    let content_type = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let sub = ctx.rp.subresource.clone();
    let watch = ctx.rp.watch_prefix || ctx.query.flag("watch")?;
    match (&method, ctx.rp.name.is_some(), sub.as_deref()) {
        (&Method::GET, false, None) if watch => crate::watch::serve(
            state,
            &ctx.rt,
            ctx.rp.namespace.as_deref(),
            &ctx.query,
            repr,
        ),
        (&Method::GET, false, None) => list(&ctx),
        (&Method::POST, false, None) => {
            if ctx.rt.namespaced && ctx.rp.namespace.is_none() {
                return Err(method_not_allowed(&method, &ctx.rt));
            }
            let body = read_body(state, req.into_body()).await?;
            create(&ctx, content_type.as_deref(), &body)
        }
        (&Method::DELETE, false, None) => {
            let body = read_body(state, req.into_body()).await?;
            delete_collection(&ctx, &body)
        }
        (&Method::GET, true, None | Some("status")) => get(&ctx),
        (&Method::PUT, true, None | Some("status")) => {
            let body = read_body(state, req.into_body()).await?;
            let obj = decode_object(&ctx, content_type.as_deref(), &body)?;
            update(&ctx, obj, sub.as_deref())
        }
        (&Method::PATCH, true, None | Some("status")) => {
            let body = read_body(state, req.into_body()).await?;
            patch(&ctx, content_type.as_deref(), &body, sub.as_deref())
        }
        (&Method::DELETE, true, None) => {
            let body = read_body(state, req.into_body()).await?;
            let opts = delete_options(&ctx, &body)?;
            delete(&ctx, &opts)
        }
        (&Method::POST, true, Some("binding")) => {
            let body = read_body(state, req.into_body()).await?;
            let into = DefaultKind {
                api_version: "v1",
                kind: "Binding",
            };
            binding(&ctx, &decode_body(content_type.as_deref(), &body, into)?)
        }
        (&Method::POST, true, Some("eviction")) => {
            let body = read_body(state, req.into_body()).await?;
            let into = DefaultKind {
                api_version: "policy/v1",
                kind: "Eviction",
            };
            eviction(&ctx, &decode_body(content_type.as_deref(), &body, into)?)
        }
        (&Method::POST, true, Some("token")) => {
            let body = read_body(state, req.into_body()).await?;
            let into = DefaultKind {
                api_version: "authentication.k8s.io/v1",
                kind: "TokenRequest",
            };
            token(&ctx, &decode_body(content_type.as_deref(), &body, into)?)
        }
        (&Method::GET, true, Some("approval" | "finalize")) => get(&ctx),
        (&Method::PUT, true, Some(s @ ("approval" | "finalize"))) => {
            let body = read_body(state, req.into_body()).await?;
            let obj = decode_object(&ctx, content_type.as_deref(), &body)?;
            update(&ctx, obj, Some(s))
        }
        (&Method::PATCH, true, Some("approval")) => {
            let body = read_body(state, req.into_body()).await?;
            patch(&ctx, content_type.as_deref(), &body, Some("approval"))
        }
        (&Method::GET, true, Some("scale")) => scale_get(&ctx),
        (&Method::PUT | &Method::PATCH, true, Some("scale")) => {
            let body = read_body(state, req.into_body()).await?;
            scale_write(&ctx, &method, content_type.as_deref(), &body)
        }
        (_, true, Some("log" | "exec" | "attach" | "portforward")) => {
            let proxy = state
                .pod_proxy
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            match proxy {
                Some(proxy) => Ok(proxy(
                    state.clone(),
                    req,
                    ctx.ns().to_owned(),
                    ctx.name().to_owned(),
                    sub.unwrap_or_default(),
                )
                .await),
                None => Err(ApiError::new(
                    503,
                    "ServiceUnavailable",
                    format!(
                        "pods/{} is not available: no kubelet endpoint is connected to this simulated cluster",
                        sub.unwrap_or_default()
                    ),
                )),
            }
        }
        _ => Err(method_not_allowed(&method, &ctx.rt)),
    }
}

// ---------------------------------------------------------------------------------------------
// Representation

/// The object as served at the requested version (see [`convert`]).
fn at_version(rt: &ResourceType, obj: &Value) -> Option<Value> {
    convert::to_served(rt, obj)
}

fn partial_metadata(obj: &Value) -> Value {
    json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"]})
}

fn include_object(query: &Query) -> table::IncludeObject {
    match query.get("includeObject") {
        Some("None") => table::IncludeObject::None,
        Some("Object") => table::IncludeObject::Object,
        _ => table::IncludeObject::Metadata,
    }
}

/// One object in the negotiated representation.
fn render(ctx: &Ctx<'_>, code: StatusCode, obj: &Value) -> Response {
    match ctx.repr {
        Repr::Json => match at_version(&ctx.rt, obj) {
            Some(o) => json_response(code, &o),
            None => json_response(code, obj),
        },
        Repr::Metadata => json_response(code, &partial_metadata(obj)),
        Repr::Table => {
            let o = at_version(&ctx.rt, obj).unwrap_or_else(|| obj.clone());
            let meta = json!({"resourceVersion": obj["metadata"]["resourceVersion"]});
            let table = table::to_table(&ctx.rt, &[o], include_object(&ctx.query), meta);
            json_response(code, &table)
        }
    }
}

fn success_status(rt: &ResourceType, obj: &Value) -> Value {
    let mut details =
        json!({"name": obj["metadata"]["name"], "kind": rt.plural, "uid": obj["metadata"]["uid"]});
    if !rt.group.is_empty() {
        details["group"] = json!(rt.group);
    }
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details})
}

// ---------------------------------------------------------------------------------------------
// Reads

fn get(ctx: &Ctx<'_>) -> Result<Response, ApiError> {
    let obj = ctx
        .state
        .store
        .get(&key(&ctx.rt), ctx.ns(), ctx.name())
        .ok_or_else(|| ctx.not_found())?;
    Ok(render(ctx, StatusCode::OK, &obj))
}

/// Parsed label and field selectors of a list or watch.
pub(crate) struct Selectors {
    labels: Option<LabelSelector>,
    fields: Option<FieldSelector>,
}

impl Selectors {
    /// Reads `labelSelector` and `fieldSelector` (400 on a syntax error or unsupported field).
    pub(crate) fn parse(query: &Query, rt: &ResourceType) -> Result<Self, ApiError> {
        let labels = match query.get("labelSelector") {
            Some(s) if !s.trim().is_empty() => Some(LabelSelector::parse(s)?),
            _ => None,
        };
        let fields = match query.get("fieldSelector") {
            Some(s) if !s.trim().is_empty() => Some(FieldSelector::parse(s, rt)?),
            _ => None,
        };
        Ok(Self { labels, fields })
    }

    /// Whether an object passes both selectors.
    pub(crate) fn matches(&self, obj: &Value) -> bool {
        static EMPTY: std::sync::OnceLock<Map<String, Value>> = std::sync::OnceLock::new();
        if let Some(l) = &self.labels {
            let labels = obj["metadata"]["labels"]
                .as_object()
                .unwrap_or_else(|| EMPTY.get_or_init(Map::new));
            if !l.matches(labels) {
                return false;
            }
        }
        self.fields.as_ref().is_none_or(|f| f.matches(obj))
    }
}

const CONTINUE_EXPIRED: &str = "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.";

fn encode_continue(rv: u64, after: &ObjKey) -> String {
    let start = format!("{}/{}", after.0, after.1);
    let token = json!({"v": "meta.k8s.io/v1", "rv": rv, "start": format!("{start}\u{0}")});
    base64::engine::general_purpose::URL_SAFE.encode(token.to_string())
}

fn decode_continue(token: &str) -> Result<(u64, ObjKey), ApiError> {
    let bad = || {
        ApiError::bad_request(
            "continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)",
        )
    };
    let raw = base64::engine::general_purpose::URL_SAFE
        .decode(token)
        .or_else(|_| base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(token))
        .map_err(|_| bad())?;
    let v: Value = serde_json::from_slice(&raw).map_err(|_| bad())?;
    let rv = v["rv"].as_u64().ok_or_else(bad)?;
    let start = v["start"]
        .as_str()
        .ok_or_else(bad)?
        .trim_end_matches('\u{0}');
    let (ns, name) = start.split_once('/').ok_or_else(bad)?;
    Ok((rv, (ns.to_owned(), name.to_owned())))
}

/// The RV a list reads at: `None` = now.
fn list_rv(ctx: &Ctx<'_>, limit: usize) -> Result<Option<u64>, ApiError> {
    let rv = match ctx.query.get("resourceVersion") {
        None | Some("") => None,
        Some(s) => Some(s.parse::<u64>().map_err(|_| {
            ApiError::bad_request(format!("invalid resource version: {s}")).with_causes(&[Cause {
                reason: "FieldValueInvalid".into(),
                message: format!("Invalid value: {s:?}: resourceVersion must be a number"),
                field: "resourceVersion".into(),
            }])
        })?),
    };
    let current = ctx.state.store.current_rv();
    match (ctx.query.get("resourceVersionMatch"), rv) {
        (Some(m), None) if !m.is_empty() => Err(invalid_list_option(
            "resourceVersionMatch",
            m,
            "resourceVersionMatch is forbidden unless resourceVersion is provided",
        )),
        (Some("Exact"), Some(0)) => Err(invalid_list_option(
            "resourceVersionMatch",
            "Exact",
            "resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
        )),
        (Some("Exact"), Some(n)) => {
            if n > current {
                return Err(too_large(n, current));
            }
            Ok(Some(n))
        }
        (Some("NotOlderThan") | None, Some(n)) => {
            if n > current {
                return Err(too_large(n, current));
            }
            // A legacy `resourceVersion=N` with `limit` reads exactly at N, as the real server.
            if ctx.query.get("resourceVersionMatch").is_none() && n > 0 && limit > 0 {
                Ok(Some(n))
            } else {
                Ok(None)
            }
        }
        (Some(""), _) | (None, None) => Ok(None),
        (Some(other), _) => Err(invalid_list_option(
            "resourceVersionMatch",
            other,
            "supported values: \"Exact\", \"NotOlderThan\"",
        )),
    }
}

fn invalid_list_option(field: &str, value: &str, detail: &str) -> ApiError {
    ApiError::invalid(
        "meta.k8s.io",
        "ListOptions",
        "",
        &[Cause {
            reason: "FieldValueInvalid".into(),
            message: format!("Invalid value: {value:?}: {detail}"),
            field: field.into(),
        }],
    )
}

fn too_large(n: u64, current: u64) -> ApiError {
    let mut e = ApiError::new(
        504,
        "Timeout",
        format!("Too large resource version: {n}, current: {current}"),
    );
    e.details = Some(
        json!({"causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}], "retryAfterSeconds": 1}),
    );
    e
}

fn list(ctx: &Ctx<'_>) -> Result<Response, ApiError> {
    let selectors = Selectors::parse(&ctx.query, &ctx.rt)?;
    let limit = ctx.query.int("limit")?.unwrap_or(0).max(0) as usize;
    let (at, after) = match ctx.query.get("continue") {
        Some(token) if !token.is_empty() => {
            let (rv, after) = decode_continue(token)?;
            (Some(rv), Some(after))
        }
        _ => (list_rv(ctx, limit)?, None),
    };
    let filter = |o: &Value| selectors.matches(o);
    let page: Page = ctx
        .state
        .store
        .list(
            &key(&ctx.rt),
            ctx.rp.namespace.as_deref(),
            at,
            after.as_ref(),
            limit,
            &filter,
        )
        .map_err(|e| {
            if after.is_some() {
                ApiError::gone(CONTINUE_EXPIRED)
            } else {
                ApiError::gone(format!(
                    "too old resource version: {} ({})",
                    e.requested, e.oldest
                ))
            }
        })?;
    let mut meta = Map::new();
    meta.insert("resourceVersion".into(), json!(page.rv.to_string()));
    if let Some(after) = &page.more_after {
        meta.insert("continue".into(), json!(encode_continue(page.rv, after)));
    }
    if let Some(n) = page.remaining {
        meta.insert("remainingItemCount".into(), json!(n));
    }
    let meta = Value::Object(meta);
    match ctx.repr {
        Repr::Table => {
            let items: Vec<Value> = page
                .items
                .iter()
                .map(|o| at_version(&ctx.rt, o).unwrap_or_else(|| (**o).clone()))
                .collect();
            let table = table::to_table(&ctx.rt, &items, include_object(&ctx.query), meta);
            Ok(json_response(StatusCode::OK, &table))
        }
        Repr::Metadata => {
            let items: Vec<Value> = page.items.iter().map(|o| partial_metadata(o)).collect();
            Ok(json_response(
                StatusCode::OK,
                &json!({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1", "metadata": meta, "items": items}),
            ))
        }
        Repr::Json => {
            // Serialized piecewise so the shared objects are never deep-copied.
            let mut out = Vec::with_capacity(256 + page.items.len() * 512);
            out.extend_from_slice(b"{\"kind\":");
            serde_json::to_writer(&mut out, &ctx.rt.list_kind).map_err(internal)?;
            out.extend_from_slice(b",\"apiVersion\":");
            serde_json::to_writer(&mut out, &ctx.rt.api_version()).map_err(internal)?;
            out.extend_from_slice(b",\"metadata\":");
            serde_json::to_writer(&mut out, &meta).map_err(internal)?;
            out.extend_from_slice(b",\"items\":[");
            for (i, o) in page.items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                match at_version(&ctx.rt, o) {
                    Some(v) => serde_json::to_writer(&mut out, &v),
                    None => serde_json::to_writer(&mut out, &**o),
                }
                .map_err(internal)?;
            }
            out.extend_from_slice(b"]}");
            Ok(raw_json(StatusCode::OK, out))
        }
    }
}

fn internal(e: impl std::fmt::Display) -> ApiError {
    ApiError::internal(e.to_string())
}

// ---------------------------------------------------------------------------------------------
// Writes

/// Where a body's `apiVersion` and `kind` may come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TypeMetaSource {
    /// Create and update bodies: kube-apiserver's decoder fills a missing kind, and a missing
    /// apiVersion, of a built-in type from the URL (the Python client and others rely on it).
    BodyOrUrl,
    /// Apply patches and patched objects: the kind must be in the body.
    Body,
}

/// Checks kind/apiVersion of a body against the URL's type, filling them in when absent.
fn check_type_meta(
    rt: &ResourceType,
    obj: &mut Value,
    source: TypeMetaSource,
) -> Result<(), ApiError> {
    if !obj.is_object() {
        return Err(ApiError::bad_request(
            "the body of the request must be a JSON object",
        ));
    }
    let want_av = rt.api_version();
    let builtin = rt.origin == Origin::Builtin;
    let non_empty = |field: &str| {
        obj[field]
            .as_str()
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
    };
    let (body_kind, body_av) = (non_empty("kind"), non_empty("apiVersion"));
    let kind = match body_kind {
        Some(kind) => kind,
        None if builtin && source == TypeMetaSource::BodyOrUrl => rt.kind.clone(),
        None => {
            return Err(ApiError::bad_request(format!(
                "Object 'Kind' is missing in '{}'",
                compact(obj)
            )));
        }
    };
    let av = body_av.unwrap_or_else(|| want_av.clone());
    if kind != rt.kind {
        return Err(if builtin {
            builtin_kind_mismatch(rt, &av, &kind)
        } else {
            ApiError::bad_request(format!(
                "the object provided is unrecognized (must be of type {}): {kind} in version {av:?}",
                rt.kind
            ))
        });
    }
    if av != want_av {
        // Another served version of the same type converts by rewriting apiVersion.
        let same_group = av.rsplit_once('/').map_or("", |(g, _)| g) == rt.group;
        if !same_group || builtin {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({av}) does not match the expected API version ({want_av})"
            )));
        }
    }
    obj["kind"] = json!(kind);
    obj["apiVersion"] = json!(want_av);
    Ok(())
}

/// A built-in URL given a body of another kind: kube-apiserver decodes the body as its own kind
/// and fails to convert it into the URL's (or, for a kind it does not know, fails to decode).
fn builtin_kind_mismatch(rt: &ResourceType, api_version: &str, kind: &str) -> ApiError {
    let version = api_version.rsplit('/').next().unwrap_or_default();
    let reason = if crate::registry::is_known_kind(api_version, kind) {
        // The internal types live in a Go package named after the group (`core` for "").
        let internal = match rt.group.split('.').next().unwrap_or_default() {
            "" | "events" => "core",
            first => first,
        };
        format!(
            "converting ({version}.{kind}) to ({internal}.{}): unknown conversion",
            rt.kind
        )
    } else {
        format!(
            "no kind {kind:?} is registered for version {api_version:?} in scheme \"pkg/api/legacyscheme/scheme.go:30\""
        )
    };
    ApiError::bad_request(format!(
        "{kind} in version {version:?} cannot be handled as a {}: {reason}",
        rt.kind
    ))
}

fn compact(v: &Value) -> String {
    let s = v.to_string();
    if s.len() > 200 {
        format!("{}...", &s[..200])
    } else {
        s
    }
}

/// Fills the namespace from the URL, rejecting a different one in the body.
fn check_namespace(ctx: &Ctx<'_>, obj: &mut Value) -> Result<(), ApiError> {
    let meta = obj.as_object_mut().and_then(|m| {
        m.entry("metadata").or_insert_with(|| json!({}));
        m.get_mut("metadata").and_then(Value::as_object_mut)
    });
    let Some(meta) = meta else {
        return Err(ApiError::bad_request("metadata must be an object"));
    };
    if ctx.rt.namespaced {
        let url_ns = ctx.ns();
        match meta.get("namespace").and_then(Value::as_str) {
            Some(ns) if !ns.is_empty() && ns != url_ns => {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            _ => {
                meta.insert("namespace".into(), json!(url_ns));
            }
        }
    } else {
        meta.remove("namespace");
    }
    Ok(())
}

fn check_name(ctx: &Ctx<'_>, obj: &Value) -> Result<(), ApiError> {
    let body_name = obj["metadata"]["name"].as_str().unwrap_or_default();
    if body_name != ctx.name() {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({body_name}) does not match the name on the URL ({})",
            ctx.name()
        )));
    }
    Ok(())
}

/// NamespaceLifecycle admission: the namespace must exist and not be terminating.
fn namespace_admission(
    txn: &Txn<'_>,
    rt: &ResourceType,
    ns: &str,
    name: &str,
) -> Result<(), ApiError> {
    if !rt.namespaced {
        return Ok(());
    }
    let Some(nsobj) = txn.get(&ns_key(), "", ns) else {
        return Err(ApiError::not_found("", "namespaces", ns));
    };
    if nsobj["metadata"]
        .get("deletionTimestamp")
        .is_some_and(|v| !v.is_null())
        || nsobj["status"]["phase"].as_str() == Some("Terminating")
    {
        let what = qualified(&rt.group, &rt.plural);
        return Err(ApiError::forbidden(format!(
            "{what} \"{name}\" is forbidden: unable to create new content in namespace {ns} because it is being terminated"
        ))
        .with_details(&rt.group, &rt.plural, name)
        .with_causes(&[Cause {
            reason: "NamespaceTerminating".into(),
            message: format!("namespace {ns} is being terminated"),
            field: "metadata.namespace".into(),
        }]));
    }
    Ok(())
}

/// Type-specific admission on create that needs the store (allocations, CRDs, CRs).
fn admit_create(ctx: &Ctx<'_>, txn: &Txn<'_>, obj: &mut Value) -> Result<(), ApiError> {
    let rt = &ctx.rt;
    if rt.group.is_empty() && rt.plural == "pods" {
        crate::controllers::taint_eviction::default_toleration_seconds(obj);
    }
    match (rt.group.as_str(), rt.plural.as_str()) {
        ("", "services") => {
            let services = txn.list(&TypeKey::new("", "services"), None);
            let mut alloc = crate::service_alloc::ServiceAllocator::from_services(
                ctx.state.config.service_cidr,
                services.iter().map(|s| &**s),
            );
            if let Err(errors) = alloc.assign(obj, &mut rand::rng()) {
                return Err(service_invalid(obj, &errors));
            }
        }
        ("", "pods") => crate::admission::admit_pod(
            obj,
            |ns, name| {
                txn.get(&TypeKey::new("", "serviceaccounts"), ns, name)
                    .map(|sa| (*sa).clone())
            },
            || crate::strategy::generate_name(""),
        ),
        ("apiextensions.k8s.io", "customresourcedefinitions") => {
            crd::default_crd(obj);
            crd::validate_crd(obj)?;
            crd::accept(obj);
        }
        _ => {}
    }
    if matches!(rt.origin, Origin::Crd { .. }) {
        crd::prune_default_validate(rt, obj)?;
    }
    admit_rbac(ctx, txn, obj, None)
}

/// With RBAC on, a write of a Role, ClusterRole or binding may not grant more than the writer
/// holds (kube-apiserver's escalation check), judged against the RBAC objects in this
/// transaction.
fn admit_rbac(
    ctx: &Ctx<'_>,
    txn: &Txn<'_>,
    new: &Value,
    old: Option<&Value>,
) -> Result<(), ApiError> {
    if !ctx.state.config.rbac || ctx.rt.group != auth::RBAC_GROUP {
        return Ok(());
    }
    let list = |plural: &str| -> Vec<Value> {
        txn.list(&TypeKey::new(auth::RBAC_GROUP, plural), None)
            .iter()
            .map(|o| (**o).clone())
            .collect()
    };
    let view = auth::RbacView::new(
        list("roles"),
        list("clusterroles"),
        list("rolebindings"),
        list("clusterrolebindings"),
    );
    let user = &ctx.attrs.user;
    let ns = ctx.rp.namespace.as_deref().unwrap_or_default();
    match old {
        Some(old) => auth::check_escalation_update(&view, user, &ctx.rt.kind, new, old, ns),
        None => auth::check_escalation(&view, user, &ctx.rt.kind, new, ns),
    }
}

/// The 422 for a Service whose IP or node ports cannot be had.
fn service_invalid(svc: &Value, errors: &[crate::service_alloc::AllocError]) -> ApiError {
    let causes: Vec<Cause> = errors
        .iter()
        .map(|e| Cause {
            reason: "FieldValueInvalid".into(),
            message: format!("Invalid value: {}: {}", e.value, e.detail),
            field: e.field.clone(),
        })
        .collect();
    let name = svc["metadata"]["name"].as_str().unwrap_or_default();
    ApiError::invalid("", "Service", name, &causes)
}

fn admit_update(
    ctx: &Ctx<'_>,
    txn: &Txn<'_>,
    old: &Value,
    new: &mut Value,
) -> Result<(), ApiError> {
    let rt = &ctx.rt;
    if rt.group.is_empty() && rt.plural == "pods" {
        // The plugin admits updates too: a replaced pod keeps its default tolerations.
        crate::controllers::taint_eviction::default_toleration_seconds(new);
    }
    if rt.group.is_empty() && rt.plural == "services" {
        crate::service_alloc::drop_type_dependent_fields(old, new);
        let this = obj_key(old);
        let others: Vec<_> = txn
            .list(&TypeKey::new("", "services"), None)
            .into_iter()
            .filter(|s| obj_key(s) != this)
            .collect();
        let mut alloc = crate::service_alloc::ServiceAllocator::from_services(
            ctx.state.config.service_cidr,
            others.iter().map(|s| &**s),
        );
        if let Err(errors) = alloc.assign_update(old, new, &mut rand::rng()) {
            return Err(service_invalid(new, &errors));
        }
    }
    if rt.group == "apiextensions.k8s.io" && rt.plural == "customresourcedefinitions" {
        crd::default_crd(new);
        crd::validate_crd_update(old, new)?;
        crd::accept(new);
    }
    if matches!(rt.origin, Origin::Crd { .. }) {
        crd::prune_default_validate(rt, new)?;
    }
    Ok(())
}

/// Decodes the body of a create or update of the URL's type. Custom resources have no protobuf
/// form, so kube-apiserver refuses protobuf bodies for them as an unknown format.
fn decode_object(
    ctx: &Ctx<'_>,
    content_type: Option<&str>,
    body: &[u8],
) -> Result<Value, ApiError> {
    if matches!(ctx.rt.origin, Origin::Crd { .. }) && super::is_protobuf(content_type) {
        return Err(ApiError::unsupported_media_type(
            "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml",
        ));
    }
    let api_version = ctx.rt.api_version();
    let into = DefaultKind {
        api_version: &api_version,
        kind: &ctx.rt.kind,
    };
    decode_body(content_type, body, into)
}

/// Access and identity reviews are answered from the caller's identity and RBAC, never stored.
fn review(ctx: &Ctx<'_>, obj: &Value) -> Result<Option<Value>, ApiError> {
    let user = &ctx.attrs.user;
    let answer = match (ctx.rt.group.as_str(), ctx.rt.plural.as_str()) {
        ("authorization.k8s.io", "selfsubjectaccessreviews") => {
            auth::self_subject_access_review(&rbac_view(ctx.state), user, obj)?
        }
        ("authorization.k8s.io", "selfsubjectrulesreviews") => {
            auth::self_subject_rules_review(&rbac_view(ctx.state), user, obj)?
        }
        ("authorization.k8s.io", "subjectaccessreviews") => {
            auth::subject_access_review(&rbac_view(ctx.state), obj)?
        }
        ("authorization.k8s.io", "localsubjectaccessreviews") => {
            auth::local_subject_access_review(&rbac_view(ctx.state), ctx.ns(), obj)?
        }
        ("authentication.k8s.io", "selfsubjectreviews") => {
            return Ok(Some(auth::self_subject_review(user)));
        }
        ("authentication.k8s.io", "tokenreviews") => {
            return Ok(Some(ctx.state.authenticator.token_review(obj)));
        }
        _ => return Ok(None),
    };
    let mut answer = answer;
    if !ctx.state.config.rbac {
        // Without RBAC the server authorizes everything (AlwaysAllow), and says so.
        answer["status"] = json!({"allowed": true});
    }
    Ok(Some(answer))
}

/// After a CRD write: make the registry serve exactly the CRD's current types.
fn sync_crd(state: &ServerState, crd: Option<&Value>, name: &str) {
    let types = match crd {
        Some(c)
            if c["metadata"]
                .get("deletionTimestamp")
                .is_none_or(Value::is_null) =>
        {
            crd::types_from_crd(c).unwrap_or_default()
        }
        _ => Vec::new(),
    };
    let mut registry = state.registry.write().unwrap_or_else(|e| e.into_inner());
    let next = registry.with_crd_types(name, types);
    *registry = Arc::new(next);
}

/// A CRD is gone: its custom resources go with it (the real server's
/// `customresourcecleanup` finalizer does this before the CRD disappears).
fn purge_custom_resources(txn: &mut Txn<'_>, crd: &Value) {
    let group = crd["spec"]["group"].as_str().unwrap_or_default();
    let plural = crd["spec"]["names"]["plural"].as_str().unwrap_or_default();
    if plural.is_empty() {
        return;
    }
    let key = TypeKey::new(group, plural);
    for obj in txn.list(&key, None) {
        let (ns, name) = obj_key(&obj);
        txn.remove(&key, &ns, &name);
    }
}

fn is_crd(rt: &ResourceType) -> bool {
    rt.group == "apiextensions.k8s.io" && rt.plural == "customresourcedefinitions"
}

fn create(ctx: &Ctx<'_>, content_type: Option<&str>, body: &[u8]) -> Result<Response, ApiError> {
    let mut obj = decode_object(ctx, content_type, body)?;
    if let Some(answer) = review(ctx, &obj)? {
        return Ok(super::json_response(StatusCode::CREATED, &answer));
    }
    check_type_meta(&ctx.rt, &mut obj, TypeMetaSource::BodyOrUrl)?;
    let warnings = ctx.validate_body_fields(&mut obj)?;
    check_namespace(ctx, &mut obj)?;
    let obj = convert::to_storage(&ctx.rt, obj);
    let dry_run = ctx.dry_run()?;
    let rt = ctx.rt.clone();
    let k = key(&rt);
    let stored = ctx
        .state
        .store
        .transact(|txn| -> Result<Arc<Value>, ApiError> {
            let generate = obj["metadata"]["name"].as_str().is_none_or(str::is_empty);
            let mut attempt = 0;
            loop {
                let mut candidate = obj.clone();
                strategy::prepare_create(&rt, &mut candidate)?;
                let (ns, name) = obj_key(&candidate);
                namespace_admission(txn, &rt, &ns, &name)?;
                admit_create(ctx, txn, &mut candidate)?;
                if let Some(view) = &ctx.escalation_view {
                    auth::check_escalation(view, &ctx.attrs.user, &rt.kind, &candidate, &ns)?;
                }
                if let Some(manager) = &ctx.manager {
                    let now = strategy::now_rfc3339();
                    patch::update_managed_fields_with(
                        None,
                        &mut candidate,
                        manager,
                        "Update",
                        &now,
                        Some(&rt),
                        None,
                    );
                }
                if txn.get(&k, &ns, &name).is_some() {
                    attempt += 1;
                    if generate && attempt < 8 {
                        continue;
                    }
                    return Err(ApiError::already_exists(&rt.group, &rt.plural, &name));
                }
                if dry_run {
                    return Ok(Arc::new(candidate));
                }
                return Ok(txn.put(&k, candidate));
            }
        })?;
    if is_crd(&rt) && !dry_run {
        sync_crd(
            ctx.state,
            Some(&stored),
            stored["metadata"]["name"].as_str().unwrap_or_default(),
        );
    }
    Ok(with_warnings(
        render(ctx, StatusCode::CREATED, &stored),
        &warnings,
    ))
}

/// Checks a client-sent resourceVersion against the stored one: 409 when stale.
fn check_rv(ctx: &Ctx<'_>, old: &Value, new: &Value) -> Result<(), ApiError> {
    match new["metadata"]["resourceVersion"].as_str() {
        Some(rv) if !rv.is_empty() && rv != old["metadata"]["resourceVersion"].as_str().unwrap_or_default() => {
            Err(ctx.conflict(
                ctx.name(),
                "the object has been modified; please apply your changes to the latest version and try again",
            ))
        }
        _ => Ok(()),
    }
}

/// Applies the strategy for an update of `old` into `new` (already patched or decoded) and
/// writes it; removes the object when the write finished its deletion.
fn write_update(
    ctx: &Ctx<'_>,
    txn: &mut Txn<'_>,
    old: &Arc<Value>,
    mut new: Value,
    sub: Option<&str>,
    dry_run: bool,
    record_manager: bool,
) -> Result<Arc<Value>, ApiError> {
    check_rv(ctx, old, &new)?;
    let rt = &ctx.rt;
    match sub {
        Some("approval") => {
            let conditions = new["status"]["conditions"].clone();
            new = (**old).clone();
            new["status"]["conditions"] = conditions;
            strategy::normalize(&mut new);
            validate_csr_conditions(rt, &new)?;
        }
        Some("finalize") => {
            let finalizers = new["spec"]["finalizers"].clone();
            new = (**old).clone();
            if !new["spec"].is_object() {
                new["spec"] = json!({});
            }
            new["spec"]["finalizers"] = if finalizers.is_null() {
                json!([])
            } else {
                finalizers
            };
        }
        Some("status") if rt.group == "certificates.k8s.io" => {
            // Approval conditions change only through /approval.
            let approvals: Vec<Value> = old["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|c| matches!(c["type"].as_str(), Some("Approved" | "Denied")))
                .cloned()
                .collect();
            strategy::prepare_update(rt, old, &mut new, Some("status"))?;
            let mut conditions: Vec<Value> = new["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|c| !matches!(c["type"].as_str(), Some("Approved" | "Denied")))
                .cloned()
                .collect();
            conditions.splice(0..0, approvals);
            if !conditions.is_empty() {
                new["status"]["conditions"] = Value::Array(conditions);
            }
        }
        _ => {
            strategy::prepare_update(rt, old, &mut new, sub)?;
            if sub.is_none() {
                admit_update(ctx, txn, old, &mut new)?;
                admit_rbac(ctx, txn, &new, Some(old))?;
            }
        }
    }
    if record_manager && let Some(manager) = &ctx.manager {
        let now = strategy::now_rfc3339();
        let sub = sub.filter(|s| *s == "status");
        patch::update_managed_fields_with(
            Some(old),
            &mut new,
            manager,
            "Update",
            &now,
            Some(rt),
            sub,
        );
    }
    if let Some(m) = new["metadata"].as_object_mut() {
        m.insert(
            "resourceVersion".into(),
            old["metadata"]["resourceVersion"].clone(),
        );
    }
    let k = key(rt);
    if dry_run {
        return Ok(Arc::new(new));
    }
    let finished = strategy::deletion_complete(&new)
        && (!(rt.group.is_empty() && rt.plural == "namespaces")
            || new["spec"]["finalizers"]
                .as_array()
                .is_none_or(Vec::is_empty));
    if finished {
        // One DELETED event carrying the final state, as the real server's update-to-delete.
        let last = txn.remove_as(&k, new).ok_or_else(|| ctx.not_found())?;
        if is_crd(rt) {
            purge_custom_resources(txn, &last);
        }
        return Ok(last);
    }
    Ok(txn.put(&k, new))
}

fn validate_csr_conditions(rt: &ResourceType, csr: &Value) -> Result<(), ApiError> {
    let types: Vec<&str> = csr["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["type"].as_str())
        .collect();
    if types.contains(&"Approved") && types.contains(&"Denied") {
        return Err(ApiError::invalid(
            &rt.group,
            &rt.kind,
            csr["metadata"]["name"].as_str().unwrap_or_default(),
            &[Cause {
                reason: "FieldValueInvalid".into(),
                message: "Invalid value: \"Denied\": Approved and Denied conditions are mutually exclusive".into(),
                field: "status.conditions[1].type".into(),
            }],
        ));
    }
    Ok(())
}

fn update(ctx: &Ctx<'_>, mut obj: Value, sub: Option<&str>) -> Result<Response, ApiError> {
    check_type_meta(&ctx.rt, &mut obj, TypeMetaSource::BodyOrUrl)?;
    let warnings = ctx.validate_body_fields(&mut obj)?;
    check_namespace(ctx, &mut obj)?;
    check_name(ctx, &obj)?;
    let obj = convert::to_storage(&ctx.rt, obj);
    let dry_run = ctx.dry_run()?;
    let k = key(&ctx.rt);
    let stored = ctx.state.store.transact(|txn| {
        let old = txn
            .get(&k, ctx.ns(), ctx.name())
            .ok_or_else(|| ctx.not_found())?;
        write_update(ctx, txn, &old, obj, sub, dry_run, true)
    })?;
    if is_crd(&ctx.rt) && !dry_run {
        let current = ctx.state.store.get(&k, "", ctx.name());
        sync_crd(ctx.state, current.as_deref(), ctx.name());
    }
    Ok(with_warnings(
        render(ctx, StatusCode::OK, &stored),
        &warnings,
    ))
}

fn patch(
    ctx: &Ctx<'_>,
    content_type: Option<&str>,
    body: &[u8],
    sub: Option<&str>,
) -> Result<Response, ApiError> {
    let ct = content_type
        .unwrap_or_default()
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_owned();
    let patch_doc = match ct.as_str() {
        "application/merge-patch+json"
        | "application/json-patch+json"
        | "application/strategic-merge-patch+json" => serde_json::from_slice::<Value>(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?,
        "application/apply-patch+yaml" | "application/apply-patch+cbor" => {
            serde_yaml::from_slice::<Value>(body)
                .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?
        }
        _ => {
            return Err(ApiError::unsupported_media_type(format!(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml{}",
                if matches!(ctx.rt.origin, Origin::Builtin) {
                    ", application/strategic-merge-patch+json"
                } else {
                    ""
                }
            )));
        }
    };
    if ct == "application/strategic-merge-patch+json" && !matches!(ctx.rt.origin, Origin::Builtin) {
        return Err(ApiError::unsupported_media_type(
            "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
        ));
    }
    let apply = ct.starts_with("application/apply-patch");
    let manager = ctx.query.get("fieldManager").unwrap_or_default().to_owned();
    if apply && manager.is_empty() {
        return Err(ApiError::bad_request(
            "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch",
        ));
    }
    let force = ctx.query.flag("force")?;
    if force && !apply {
        return Err(ApiError::bad_request(
            "force is only allowed for apply patches",
        ));
    }
    let dry_run = ctx.dry_run()?;
    // Apply patches are checked against the schema by server-side apply itself; the other patch
    // types check the patched object, as kube-apiserver decodes it strictly.
    let validation = FieldValidation::parse(ctx.query.get("fieldValidation"))?;
    let k = key(&ctx.rt);
    let rt = ctx.rt.clone();
    let mut warnings = Vec::new();
    let (stored, created) =
        ctx.state
            .store
            .transact(|txn| -> Result<(Arc<Value>, bool), ApiError> {
                let old = txn.get(&k, ctx.ns(), ctx.name());
                let Some(old) = old else {
                    if !apply || sub.is_some() {
                        return Err(ctx.not_found());
                    }
                    // Server-side apply creates a missing object.
                    let mut applied = patch_doc.clone();
                    check_type_meta(&rt, &mut applied, TypeMetaSource::Body)?;
                    check_namespace(ctx, &mut applied)?;
                    check_name(ctx, &applied)?;
                    let now = strategy::now_rfc3339();
                    let obj = patch::server_side_apply(None, &applied, &manager, force, &now, &rt)?;
                    let mut obj = convert::to_storage(&rt, obj);
                    strategy::prepare_create(&rt, &mut obj)?;
                    namespace_admission(txn, &rt, ctx.ns(), ctx.name())?;
                    admit_create(ctx, txn, &mut obj)?;
                    if dry_run {
                        return Ok((Arc::new(obj), true));
                    }
                    return Ok((txn.put(&k, obj), true));
                };
                let mut target = at_version(&rt, &old).unwrap_or_else(|| (*old).clone());
                let new = match ct.as_str() {
                    "application/merge-patch+json" => {
                        patch::merge_patch(&mut target, &patch_doc);
                        target
                    }
                    "application/json-patch+json" => {
                        patch::json_patch(&mut target, &patch_doc)?;
                        target
                    }
                    "application/strategic-merge-patch+json" => patch::strategic_merge_patch(
                        &target,
                        &patch_doc,
                        &rt.api_version(),
                        &rt.kind,
                    )?,
                    _ => {
                        let mut applied = patch_doc.clone();
                        check_type_meta(&rt, &mut applied, TypeMetaSource::Body)?;
                        check_name(ctx, &applied)?;
                        let now = strategy::now_rfc3339();
                        let mut scoped = applied;
                        if sub == Some("status") {
                            // An apply to /status only speaks for status.
                            if let Some(m) = scoped.as_object_mut() {
                                m.retain(|k, _| {
                                    matches!(
                                        k.as_str(),
                                        "apiVersion" | "kind" | "metadata" | "status"
                                    )
                                });
                            }
                        }
                        patch::server_side_apply_with(patch::ApplyRequest {
                            live: Some(&target),
                            applied: &scoped,
                            manager: &manager,
                            force,
                            now: &now,
                            rt: &rt,
                            subresource: sub,
                        })?
                    }
                };
                if !new.is_object() {
                    return Err(ApiError::bad_request(
                        "the patched object is not a JSON object",
                    ));
                }
                let mut new = new;
                if !apply && !rt.unknown_fields(&new).is_empty() {
                    match crate::registry::check_unknown_fields(&rt, &new, validation) {
                        UnknownFields::None => {}
                        UnknownFields::Warn(found) => warnings = found,
                        UnknownFields::Strict(detail) => {
                            // kube-apiserver quotes the patched object (JSON and merge patches)
                            // or the strategic patch map (Go's `%+v`) in a 422 on `patch`.
                            let value = if ct == "application/strategic-merge-patch+json" {
                                go_format(&patch_doc)
                            } else {
                                new.to_string()
                            };
                            return Err(ApiError::invalid(
                                "",
                                "",
                                "",
                                &[Cause {
                                    reason: "FieldValueInvalid".into(),
                                    message: format!("Invalid value: {value:?}: {detail}"),
                                    field: "patch".into(),
                                }],
                            ));
                        }
                    }
                    rt.drop_unknown_fields(&mut new);
                }
                // A changed name or namespace in a patch is an error, not a rename.
                if new["metadata"]["name"] != old["metadata"]["name"]
                    || new["metadata"]["namespace"] != old["metadata"]["namespace"]
                {
                    return Err(ApiError::bad_request(format!(
                        "the name of the object ({}) does not match the name on the URL ({})",
                        new["metadata"]["name"].as_str().unwrap_or_default(),
                        ctx.name()
                    )));
                }
                if new["metadata"]["resourceVersion"].is_null()
                    && let Some(m) = new["metadata"].as_object_mut()
                {
                    m.remove("resourceVersion");
                }
                check_type_meta(&rt, &mut new, TypeMetaSource::Body)?;
                let new = convert::to_storage(&rt, new);
                let stored = write_update(ctx, txn, &old, new, sub, dry_run, !apply)?;
                Ok((stored, false))
            })?;
    if is_crd(&ctx.rt) && !dry_run {
        let current = ctx.state.store.get(&k, "", ctx.name());
        sync_crd(ctx.state, current.as_deref(), ctx.name());
    }
    let code = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok(with_warnings(render(ctx, code, &stored), &warnings))
}

// ---------------------------------------------------------------------------------------------
// Deletion

/// DeleteOptions from the body and the query.
#[derive(Debug, Default, Clone)]
pub(crate) struct DeleteOptions {
    grace: Option<i64>,
    propagation: Option<String>,
    uid: Option<String>,
    rv: Option<String>,
    dry_run: bool,
}

fn delete_options(ctx: &Ctx<'_>, body: &[u8]) -> Result<DeleteOptions, ApiError> {
    let mut opts = DeleteOptions::default();
    let v: Value = if body.iter().all(u8::is_ascii_whitespace) {
        json!({})
    } else {
        serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding DeleteOptions: {e}")))?
    };
    opts.grace = v["gracePeriodSeconds"].as_i64();
    opts.propagation = v["propagationPolicy"].as_str().map(str::to_owned);
    if v["orphanDependents"].as_bool() == Some(true) && opts.propagation.is_none() {
        opts.propagation = Some("Orphan".into());
    }
    opts.uid = v["preconditions"]["uid"].as_str().map(str::to_owned);
    opts.rv = v["preconditions"]["resourceVersion"]
        .as_str()
        .map(str::to_owned);
    opts.dry_run = v["dryRun"]
        .as_array()
        .is_some_and(|a| a.iter().any(|x| x == "All"))
        || ctx.dry_run()?;
    if let Some(g) = ctx.query.int("gracePeriodSeconds")? {
        opts.grace = Some(g);
    }
    if let Some(p) = ctx.query.get("propagationPolicy") {
        opts.propagation = Some(p.to_owned());
    }
    if let Some(p) = &opts.propagation
        && !matches!(p.as_str(), "Foreground" | "Background" | "Orphan")
    {
        return Err(ApiError::invalid(
            "meta.k8s.io",
            "DeleteOptions",
            "",
            &[Cause {
                reason: "FieldValueNotSupported".into(),
                message: format!(
                    "Unsupported value: {p:?}: supported values: \"Foreground\", \"Background\", \"Orphan\""
                ),
                field: "propagationPolicy".into(),
            }],
        ));
    }
    Ok(opts)
}

/// The outcome of deleting one object.
enum Deleted {
    /// Gone; its last state.
    Gone(Arc<Value>),
    /// Still there, marked for deletion (finalizers or grace period).
    Marked(Arc<Value>),
}

fn delete_one(
    ctx: &Ctx<'_>,
    txn: &mut Txn<'_>,
    rt: &ResourceType,
    ns: &str,
    name: &str,
    opts: &DeleteOptions,
) -> Result<Deleted, ApiError> {
    let k = key(rt);
    let old = txn
        .get(&k, ns, name)
        .ok_or_else(|| ApiError::not_found(&rt.group, &rt.plural, name))?;
    if let Some(uid) = &opts.uid
        && old["metadata"]["uid"].as_str() != Some(uid)
    {
        return Err(ApiError::conflict(
            &rt.group,
            &rt.plural,
            name,
            &format!(
                "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                old["metadata"]["uid"].as_str().unwrap_or_default()
            ),
        ));
    }
    if let Some(rv) = &opts.rv
        && old["metadata"]["resourceVersion"].as_str() != Some(rv)
    {
        return Err(ApiError::conflict(
            &rt.group,
            &rt.plural,
            name,
            &format!(
                "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                old["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap_or_default()
            ),
        ));
    }
    let mut new = (*old).clone();
    let deleting = old["metadata"]
        .get("deletionTimestamp")
        .is_some_and(|v| !v.is_null());
    let is_pod = rt.group.is_empty() && rt.plural == "pods";
    let is_ns = rt.group.is_empty() && rt.plural == "namespaces";
    if is_ns && matches!(name, "default" | "kube-system" | "kube-public") {
        return Err(ApiError::forbidden(format!(
            "namespaces \"{name}\" is forbidden: this namespace may not be deleted"
        ))
        .with_details("", "namespaces", name));
    }
    // Graceful deletion: pods bound to a node that has not finished them.
    let mut grace = 0;
    if is_pod {
        let bound = old["spec"]["nodeName"]
            .as_str()
            .is_some_and(|n| !n.is_empty());
        let terminal = matches!(
            old["status"]["phase"].as_str(),
            Some("Succeeded" | "Failed")
        );
        if bound && !terminal {
            grace = opts.grace.unwrap_or_else(|| {
                old["spec"]["terminationGracePeriodSeconds"]
                    .as_i64()
                    .unwrap_or(30)
            });
            grace = grace.max(0);
            if deleting {
                let current = old["metadata"]["deletionGracePeriodSeconds"]
                    .as_i64()
                    .unwrap_or(0);
                grace = grace.min(current);
            }
        }
    }
    let mut finalizers: Vec<String> = old["metadata"]["finalizers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|f| f.as_str().map(str::to_owned))
        .collect();
    if !deleting {
        let add = match opts.propagation.as_deref() {
            Some("Foreground") => Some(FOREGROUND_FINALIZER),
            Some("Orphan") => Some(ORPHAN_FINALIZER),
            _ => None,
        };
        if let Some(f) = add
            && !finalizers.iter().any(|x| x == f)
        {
            finalizers.push(f.to_owned());
        }
    }
    let ns_finalizers = is_ns
        && new["spec"]["finalizers"]
            .as_array()
            .is_some_and(|a| !a.is_empty());
    if finalizers.is_empty() && grace == 0 && !ns_finalizers {
        if opts.dry_run {
            return Ok(Deleted::Gone(old));
        }
        let last = txn
            .remove(&k, ns, name)
            .ok_or_else(|| ApiError::not_found(&rt.group, &rt.plural, name))?;
        if is_crd(rt) {
            purge_custom_resources(txn, &last);
        }
        return Ok(Deleted::Gone(last));
    }
    if deleting
        && !(is_pod
            && grace
                < old["metadata"]["deletionGracePeriodSeconds"]
                    .as_i64()
                    .unwrap_or(0))
    {
        // Already being deleted: nothing changes.
        return Ok(Deleted::Marked(old));
    }
    let meta = new["metadata"]
        .as_object_mut()
        .expect("invariant: stored objects have metadata");
    meta.insert(
        "deletionTimestamp".into(),
        json!(strategy::timestamp_after(grace)),
    );
    meta.insert("deletionGracePeriodSeconds".into(), json!(grace));
    if !finalizers.is_empty() {
        meta.insert("finalizers".into(), json!(finalizers));
    }
    if is_ns {
        new["status"]["phase"] = json!("Terminating");
    }
    if opts.dry_run {
        return Ok(Deleted::Marked(Arc::new(new)));
    }
    let _ = ctx;
    Ok(Deleted::Marked(txn.put(&k, new)))
}

fn delete(ctx: &Ctx<'_>, opts: &DeleteOptions) -> Result<Response, ApiError> {
    let rt = ctx.rt.clone();
    let outcome = ctx
        .state
        .store
        .transact(|txn| delete_one(ctx, txn, &rt, ctx.ns(), ctx.name(), opts))?;
    match outcome {
        Deleted::Marked(obj) => Ok(render(ctx, StatusCode::OK, &obj)),
        Deleted::Gone(obj) => {
            if is_crd(&rt) && !opts.dry_run {
                sync_crd(ctx.state, None, ctx.name());
            }
            // Pods answer with the object, most types with a Success Status, as the real server.
            if rt.group.is_empty() && rt.plural == "pods" {
                Ok(render(ctx, StatusCode::OK, &obj))
            } else {
                Ok(json_response(StatusCode::OK, &success_status(&rt, &obj)))
            }
        }
    }
}

fn delete_collection(ctx: &Ctx<'_>, body: &[u8]) -> Result<Response, ApiError> {
    if !ctx.rt.verbs.iter().any(|v| v == "deletecollection") {
        return Err(method_not_allowed(&Method::DELETE, &ctx.rt));
    }
    let opts = delete_options(ctx, body)?;
    let selectors = Selectors::parse(&ctx.query, &ctx.rt)?;
    let rt = ctx.rt.clone();
    let k = key(&rt);
    let items = ctx
        .state
        .store
        .transact(|txn| -> Result<Vec<Value>, ApiError> {
            let targets: Vec<Arc<Value>> = txn
                .list(&k, ctx.rp.namespace.as_deref())
                .into_iter()
                .filter(|o| selectors.matches(o))
                .collect();
            let mut out = Vec::new();
            for t in targets {
                let (ns, name) = obj_key(&t);
                match delete_one(ctx, txn, &rt, &ns, &name, &opts)? {
                    Deleted::Gone(o) | Deleted::Marked(o) => out.push((*o).clone()),
                }
            }
            Ok(out)
        })?;
    if is_crd(&rt) && !opts.dry_run {
        for i in &items {
            let name = i["metadata"]["name"].as_str().unwrap_or_default();
            let current = ctx.state.store.get(&k, "", name);
            sync_crd(ctx.state, current.as_deref(), name);
        }
    }
    Ok(json_response(
        StatusCode::OK,
        &json!({"kind": rt.list_kind, "apiVersion": rt.api_version(), "metadata": {"resourceVersion": ctx.state.store.current_rv().to_string()}, "items": items}),
    ))
}

// ---------------------------------------------------------------------------------------------
// Subresources

fn binding(ctx: &Ctx<'_>, body: &Value) -> Result<Response, ApiError> {
    let target = body["target"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    if target.is_empty() {
        return Err(ApiError::invalid(
            "",
            "Binding",
            ctx.name(),
            &[Cause {
                reason: "FieldValueRequired".into(),
                message: "Required value".into(),
                field: "target.name".into(),
            }],
        ));
    }
    if let Some(n) = body["metadata"]["name"].as_str()
        && !n.is_empty()
        && n != ctx.name()
    {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({n}) does not match the name on the URL ({})",
            ctx.name()
        )));
    }
    let dry_run = ctx.dry_run()?;
    let k = key(&ctx.rt);
    ctx.state.store.transact(|txn| -> Result<(), ApiError> {
        let old = txn.get(&k, ctx.ns(), ctx.name()).ok_or_else(|| ctx.not_found())?;
        if old["metadata"].get("deletionTimestamp").is_some_and(|v| !v.is_null()) {
            return Err(ApiError::conflict("", "pods/binding", ctx.name(), &format!("pod {} is being deleted, cannot be assigned to a host", ctx.name())));
        }
        if let Some(node) = old["spec"]["nodeName"].as_str()
            && !node.is_empty()
        {
            return Err(ApiError::conflict(
                "",
                "pods/binding",
                ctx.name(),
                &format!("pod {} is already assigned to node \"{node}\"", ctx.name()),
            ));
        }
        if let Some(uid) = body["metadata"]["uid"].as_str()
            && !uid.is_empty()
            && old["metadata"]["uid"].as_str() != Some(uid)
        {
            return Err(ApiError::conflict("", "pods/binding", ctx.name(), "Precondition failed: UID mismatch"));
        }
        let mut new = (*old).clone();
        new["spec"]["nodeName"] = json!(target);
        if let Some(ann) = body["metadata"]["annotations"].as_object() {
            for (k2, v) in ann {
                new["metadata"]["annotations"][k2] = v.clone();
            }
        }
        let cond = json!({"type": "PodScheduled", "status": "True", "lastProbeTime": null, "lastTransitionTime": strategy::now_rfc3339()});
        let conds = new["status"]["conditions"].as_array().cloned().unwrap_or_default();
        let mut conds: Vec<Value> = conds.into_iter().filter(|c| c["type"] != "PodScheduled").collect();
        conds.push(cond);
        new["status"]["conditions"] = Value::Array(conds);
        if !dry_run {
            txn.put(&k, new);
        }
        Ok(())
    })?;
    Ok(json_response(
        StatusCode::CREATED,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
    ))
}

fn eviction(ctx: &Ctx<'_>, body: &Value) -> Result<Response, ApiError> {
    let opts_v = &body["deleteOptions"];
    let mut opts = DeleteOptions {
        grace: opts_v["gracePeriodSeconds"].as_i64(),
        propagation: opts_v["propagationPolicy"].as_str().map(str::to_owned),
        uid: opts_v["preconditions"]["uid"].as_str().map(str::to_owned),
        rv: opts_v["preconditions"]["resourceVersion"]
            .as_str()
            .map(str::to_owned),
        dry_run: ctx.dry_run()?,
    };
    if opts_v["dryRun"]
        .as_array()
        .is_some_and(|a| a.iter().any(|x| x == "All"))
    {
        opts.dry_run = true;
    }
    let rt = ctx.rt.clone();
    ctx.state
        .store
        .transact(|txn| delete_one(ctx, txn, &rt, ctx.ns(), ctx.name(), &opts))?;
    Ok(json_response(
        StatusCode::CREATED,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
    ))
}

fn token(ctx: &Ctx<'_>, body: &Value) -> Result<Response, ApiError> {
    let sa = ctx
        .state
        .store
        .get(&key(&ctx.rt), ctx.ns(), ctx.name())
        .ok_or_else(|| ctx.not_found())?;
    let bound = match body["spec"]["boundObjectRef"]["kind"].as_str() {
        Some(kind @ ("Pod" | "Secret" | "Node")) => {
            let name = body["spec"]["boundObjectRef"]["name"]
                .as_str()
                .unwrap_or_default();
            let (plural, ns) = match kind {
                "Pod" => ("pods", ctx.ns()),
                "Secret" => ("secrets", ctx.ns()),
                _ => ("nodes", ""),
            };
            Some(
                ctx.state
                    .store
                    .get(&TypeKey::new("", plural), ns, name)
                    .ok_or_else(|| ApiError::not_found("", plural, name))?,
            )
        }
        _ => None,
    };
    let now = jiff::Timestamp::now().as_second();
    let issuer = ctx.state.authenticator.issuer();
    let resp = auth::token_request_bound(issuer, &sa, body, bound.as_deref(), now)?;
    Ok(json_response(StatusCode::CREATED, &resp))
}

fn scale_of(obj: &Value) -> Value {
    let selector = obj["spec"]["selector"]["matchLabels"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default();
    json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            "name": obj["metadata"]["name"],
            "namespace": obj["metadata"]["namespace"],
            "uid": obj["metadata"]["uid"],
            "resourceVersion": obj["metadata"]["resourceVersion"],
            "creationTimestamp": obj["metadata"]["creationTimestamp"],
        },
        "spec": {"replicas": obj["spec"]["replicas"].as_i64().unwrap_or(0)},
        "status": {"replicas": obj["status"]["replicas"].as_i64().unwrap_or(0), "selector": selector},
    })
}

fn scale_get(ctx: &Ctx<'_>) -> Result<Response, ApiError> {
    let obj = ctx
        .state
        .store
        .get(&key(&ctx.rt), ctx.ns(), ctx.name())
        .ok_or_else(|| ctx.not_found())?;
    Ok(json_response(StatusCode::OK, &scale_of(&obj)))
}

fn scale_write(
    ctx: &Ctx<'_>,
    method: &Method,
    content_type: Option<&str>,
    body: &[u8],
) -> Result<Response, ApiError> {
    let dry_run = ctx.dry_run()?;
    let k = key(&ctx.rt);
    let stored = ctx.state.store.transact(|txn| -> Result<Arc<Value>, ApiError> {
        let old = txn.get(&k, ctx.ns(), ctx.name()).ok_or_else(|| ctx.not_found())?;
        let mut scale = scale_of(&old);
        if method == Method::PUT {
            let into = DefaultKind {
                api_version: "autoscaling/v1",
                kind: "Scale",
            };
            scale = decode_body(content_type, body, into)?;
        } else {
            let doc: Value = serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
            match content_type.unwrap_or_default().split(';').next().unwrap_or_default() {
                "application/json-patch+json" => patch::json_patch(&mut scale, &doc)?,
                _ => patch::merge_patch(&mut scale, &doc),
            }
        }
        if let Some(rv) = scale["metadata"]["resourceVersion"].as_str()
            && !rv.is_empty()
            && Some(rv) != old["metadata"]["resourceVersion"].as_str()
        {
            return Err(ctx.conflict(ctx.name(), "the object has been modified; please apply your changes to the latest version and try again"));
        }
        let replicas = scale["spec"]["replicas"].as_i64().ok_or_else(|| {
            ApiError::invalid("autoscaling", "Scale", ctx.name(), &[Cause { reason: "FieldValueRequired".into(), message: "Required value".into(), field: "spec.replicas".into() }])
        })?;
        if replicas < 0 {
            return Err(ApiError::invalid("autoscaling", "Scale", ctx.name(), &[Cause {
                reason: "FieldValueInvalid".into(),
                message: format!("Invalid value: {replicas}: must be greater than or equal to 0"),
                field: "spec.replicas".into(),
            }]));
        }
        let mut new = (*old).clone();
        new["spec"]["replicas"] = json!(replicas);
        if let Some(m) = new["metadata"].as_object_mut() {
            m.remove("resourceVersion");
        }
        write_update(ctx, txn, &old, new, None, dry_run, true)
    })?;
    Ok(json_response(StatusCode::OK, &scale_of(&stored)))
}
