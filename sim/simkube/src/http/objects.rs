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

mod checks;
mod delete;
mod patching;
mod read;
mod subresources;
mod webhook_flow;
mod write;
use checks::*;
pub(crate) use delete::DeleteOptions;
use delete::*;
use patching::*;
pub(crate) use read::Selectors;
use read::*;
use subresources::*;
use webhook_flow::Stage;
use write::*;

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
    /// Who writes, for `managedFields`: `fieldManager`, else the User-Agent's program name,
    /// else nobody named (upstream still records the write, under an empty manager).
    manager: String,
    /// For writes of RBAC objects under enforced RBAC: the view escalation checks use.
    escalation_view: Option<Arc<auth::RbacView>>,
    /// Which pass of a write admission webhooks concern (`Direct` when none does).
    stage: Stage,
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
                .map(|p| p.chars().filter(|c| !c.is_control()).take(128).collect())
        })
        .unwrap_or_default();
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
        stage: Stage::Direct,
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
            webhook_flow::admit_write(&ctx, "CreateOptions", |c| {
                create(c, content_type.as_deref(), &body)
            })
            .await
        }
        (&Method::DELETE, false, None) => {
            let body = read_body(state, req.into_body()).await?;
            match delete_options(&ctx, &body) {
                Ok(opts) if ctx.rt.verbs.iter().any(|v| v == "deletecollection") => {
                    webhook_flow::admit_delete_collection(&ctx, opts.dry_run, |c| {
                        delete_collection(c, &body)
                    })
                    .await
                }
                // The handler answers bad options and unsupported collections as before.
                _ => delete_collection(&ctx, &body),
            }
        }
        (&Method::GET, true, None | Some("status")) => get(&ctx),
        (&Method::PUT, true, None | Some("status")) => {
            let body = read_body(state, req.into_body()).await?;
            let obj = decode_object(&ctx, content_type.as_deref(), &body)?;
            webhook_flow::admit_write(&ctx, "UpdateOptions", |c| {
                update(c, obj.clone(), sub.as_deref())
            })
            .await
        }
        (&Method::PATCH, true, None | Some("status")) => {
            let body = read_body(state, req.into_body()).await?;
            webhook_flow::admit_write(&ctx, "PatchOptions", |c| {
                patch(c, content_type.as_deref(), &body, sub.as_deref())
            })
            .await
        }
        (&Method::DELETE, true, None) => {
            let body = read_body(state, req.into_body()).await?;
            let opts = delete_options(&ctx, &body)?;
            webhook_flow::admit_delete(&ctx, opts.dry_run, |c| delete(c, &opts)).await
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
            webhook_flow::admit_write(&ctx, "UpdateOptions", |c| update(c, obj.clone(), Some(s)))
                .await
        }
        (&Method::PATCH, true, Some("approval")) => {
            let body = read_body(state, req.into_body()).await?;
            webhook_flow::admit_write(&ctx, "PatchOptions", |c| {
                patch(c, content_type.as_deref(), &body, Some("approval"))
            })
            .await
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
