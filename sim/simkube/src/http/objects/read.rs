//! Reads: get and list in their representations (JSON, Table, PartialObjectMetadata), with pagination, selectors and the resourceVersion rules.

#[allow(clippy::wildcard_imports)]
use super::*;

// ---------------------------------------------------------------------------------------------
// Representation

/// The object as served at the requested version (see [`convert`]).
pub(super) fn at_version(rt: &ResourceType, obj: &Value) -> Option<Value> {
    convert::to_served(rt, obj)
}

pub(super) fn partial_metadata(obj: &Value) -> Value {
    json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"]})
}

pub(super) fn include_object(query: &Query) -> table::IncludeObject {
    match query.get("includeObject") {
        Some("None") => table::IncludeObject::None,
        Some("Object") => table::IncludeObject::Object,
        _ => table::IncludeObject::Metadata,
    }
}

/// One object in the negotiated representation.
pub(super) fn render(ctx: &Ctx<'_>, code: StatusCode, obj: &Value) -> Response {
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

pub(super) fn success_status(rt: &ResourceType, obj: &Value) -> Value {
    let mut details =
        json!({"name": obj["metadata"]["name"], "kind": rt.plural, "uid": obj["metadata"]["uid"]});
    if !rt.group.is_empty() {
        details["group"] = json!(rt.group);
    }
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details})
}

// ---------------------------------------------------------------------------------------------
// Reads

pub(super) fn get(ctx: &Ctx<'_>) -> Result<Response, ApiError> {
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

pub(super) const CONTINUE_EXPIRED: &str = "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.";

pub(super) fn encode_continue(rv: u64, after: &ObjKey) -> String {
    let start = format!("{}/{}", after.0, after.1);
    let token = json!({"v": "meta.k8s.io/v1", "rv": rv, "start": format!("{start}\u{0}")});
    base64::engine::general_purpose::URL_SAFE.encode(token.to_string())
}

pub(super) fn decode_continue(token: &str) -> Result<(u64, ObjKey), ApiError> {
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
pub(super) fn list_rv(ctx: &Ctx<'_>, limit: usize) -> Result<Option<u64>, ApiError> {
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

pub(super) fn invalid_list_option(field: &str, value: &str, detail: &str) -> ApiError {
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

pub(super) fn too_large(n: u64, current: u64) -> ApiError {
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

pub(super) fn list(ctx: &Ctx<'_>) -> Result<Response, ApiError> {
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

pub(super) fn internal(e: impl std::fmt::Display) -> ApiError {
    ApiError::internal(e.to_string())
}
