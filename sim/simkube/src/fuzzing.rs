//! Fuzzing entry points: the request decoding the server does before touching its store (path,
//! query, selectors, content negotiation, body, patch application) as pure functions, so the
//! cargo-fuzz targets and the property tests drive exactly the server's code.

use serde_json::{Value, json};

use crate::error::ApiError;
use crate::http::{self, Query, Repr, Route};
use crate::patch;
use crate::registry::Registry;
use crate::selectors::{FieldSelector, LabelSelector};

/// One request as the fuzzers describe it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RawRequest {
    /// HTTP method.
    pub method: String,
    /// URL path.
    pub path: String,
    /// Raw query string without `?`.
    pub query: String,
    /// `Content-Type` header.
    pub content_type: Option<String>,
    /// `Accept` header.
    pub accept: Option<String>,
    /// Request body.
    pub body: Vec<u8>,
}

impl RawRequest {
    /// Reads the fuzzers' text form: `METHOD PATH[?QUERY]`, then a `Content-Type` line and an
    /// `Accept` line (empty for none), then the body. Missing parts are empty.
    pub fn from_bytes(data: &[u8]) -> Self {
        let mut parts = data.splitn(4, |b| *b == b'\n');
        let line = String::from_utf8_lossy(parts.next().unwrap_or_default()).into_owned();
        let header = |b: Option<&[u8]>| {
            let s = String::from_utf8_lossy(b.unwrap_or_default())
                .trim()
                .to_owned();
            (!s.is_empty()).then_some(s)
        };
        let content_type = header(parts.next());
        let accept = header(parts.next());
        let body = parts.next().unwrap_or_default().to_vec();
        let (method, target) = line.split_once(' ').unwrap_or(("GET", line.as_str()));
        let (path, query) = target.split_once('?').unwrap_or((target, ""));
        Self {
            method: method.to_owned(),
            path: path.to_owned(),
            query: query.to_owned(),
            content_type,
            accept,
            body,
        }
    }
}

/// What the decoding made of a request.
#[derive(Debug, Clone, PartialEq)]
pub struct Decoded {
    /// The route the path addresses.
    pub route: Route,
    /// The representation the Accept header asks for.
    pub repr: Repr,
    /// The decoded body, when there was one.
    pub body: Option<Value>,
}

/// Decodes a request the way the server does before it touches its store: path, query flags,
/// label and field selectors (against the built-in type the path names), Accept, body by
/// Content-Type, and for `PATCH` the patch applied to a small object of that type. Every
/// rejection is an [`ApiError`], which is what the server would answer.
pub fn decode_request(req: &RawRequest) -> Result<Decoded, ApiError> {
    let route = http::parse_path(&req.path);
    let query = Query::parse(&req.query);
    for flag in ["watch", "allowWatchBookmarks", "sendInitialEvents", "force"] {
        query.flag(flag)?;
    }
    let registry = Registry::with_builtins();
    let rt = match &route {
        Route::Resource(rp) => registry.lookup(&rp.group, &rp.version, &rp.resource),
        _ => None,
    };
    if let Some(sel) = query.get("labelSelector") {
        LabelSelector::parse(sel)?;
    }
    if let (Some(sel), Some(rt)) = (query.get("fieldSelector"), &rt) {
        FieldSelector::parse(sel, rt)?;
    }
    let repr = http::negotiate(req.accept.as_deref());
    let body = if req.body.is_empty() {
        None
    } else if req.method == "PATCH" {
        Some(decode_patch(req, rt.as_deref())?)
    } else {
        let (api_version, kind) = rt
            .as_ref()
            .map_or(("v1".to_owned(), "ConfigMap".to_owned()), |rt| {
                (rt.api_version(), rt.kind.clone())
            });
        let into = crate::protobuf::DefaultKind {
            api_version: &api_version,
            kind: &kind,
        };
        Some(http::decode_body(
            req.content_type.as_deref(),
            &req.body,
            into,
        )?)
    };
    Ok(Decoded { route, repr, body })
}

fn decode_patch(
    req: &RawRequest,
    rt: Option<&crate::registry::ResourceType>,
) -> Result<Value, ApiError> {
    let content_type = req
        .content_type
        .as_deref()
        .unwrap_or_default()
        .split(';')
        .next()
        .unwrap_or_default()
        .trim();
    let (api_version, kind) = rt.map_or(("v1".to_owned(), "ConfigMap".to_owned()), |rt| {
        (rt.api_version(), rt.kind.clone())
    });
    let mut target = json!({
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"name": "target", "namespace": "default", "labels": {"a": "b"},
                     "finalizers": ["x/y"]},
        "spec": {"containers": [{"name": "c", "image": "i", "ports": [{"containerPort": 80}]}]},
        "data": {"k": "v"},
    });
    match content_type {
        "application/json-patch+json" => {
            let ops: Value = serde_json::from_slice(&req.body)
                .map_err(|e| ApiError::bad_request(e.to_string()))?;
            patch::json_patch(&mut target, &ops)?;
            Ok(target)
        }
        "application/merge-patch+json" => {
            let p: Value = serde_json::from_slice(&req.body)
                .map_err(|e| ApiError::bad_request(e.to_string()))?;
            patch::merge_patch_checked(&mut target, &p)?;
            Ok(target)
        }
        "application/strategic-merge-patch+json" => {
            let p: Value = serde_json::from_slice(&req.body)
                .map_err(|e| ApiError::bad_request(e.to_string()))?;
            patch::strategic_merge_patch(&target, &p, &api_version, &kind)
        }
        _ => {
            let into = crate::protobuf::DefaultKind {
                api_version: &api_version,
                kind: &kind,
            };
            http::decode_body(req.content_type.as_deref(), &req.body, into)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_text_form() {
        let r = RawRequest::from_bytes(
            b"PATCH /api/v1/namespaces/default/pods/p?fieldManager=x\napplication/merge-patch+json\n\n{}",
        );
        assert_eq!(r.method, "PATCH");
        assert_eq!(r.path, "/api/v1/namespaces/default/pods/p");
        assert_eq!(r.query, "fieldManager=x");
        assert_eq!(
            r.content_type.as_deref(),
            Some("application/merge-patch+json")
        );
        assert_eq!(r.accept, None);
        assert_eq!(r.body, b"{}");
    }

    #[test]
    fn decodes_like_the_server() {
        let ok = decode_request(&RawRequest::from_bytes(
            b"PATCH /api/v1/namespaces/default/pods/p\napplication/strategic-merge-patch+json\n\n{\"spec\":{\"containers\":[{\"name\":\"c\",\"image\":\"j\"}]}}",
        ))
        .expect("decodes");
        assert_eq!(
            ok.body.expect("body")["spec"]["containers"][0]["image"],
            "j"
        );
        let bad = decode_request(&RawRequest::from_bytes(
            b"GET /api/v1/pods?labelSelector=a%20in%20(\n\n\n",
        ))
        .expect_err("bad selector");
        assert_eq!(bad.code, 400);
        let bad = decode_request(&RawRequest::from_bytes(
            b"GET /api/v1/pods?fieldSelector=spec.nope%3Dx\n\n\n",
        ))
        .expect_err("bad field");
        assert_eq!(bad.message, "field label not supported: spec.nope");
    }
}
