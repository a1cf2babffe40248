//! What writes check before they store: apiVersion, kind, name and namespace against the URL, namespace lifecycle and the built-in admission steps, body decoding, access reviews, and CRD registration.

#[allow(clippy::wildcard_imports)]
use super::*;
use crate::admission::webhooks;

// ---------------------------------------------------------------------------------------------
// Writes

/// Where a body's `apiVersion` and `kind` may come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TypeMetaSource {
    /// Create and update bodies: kube-apiserver's decoder fills a missing kind, and a missing
    /// apiVersion, of a built-in type from the URL (the Python client and others rely on it).
    BodyOrUrl,
    /// Apply patches and patched objects: the kind must be in the body.
    Body,
}

/// Checks kind/apiVersion of a body against the URL's type, filling them in when absent.
pub(super) fn check_type_meta(
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
pub(super) fn builtin_kind_mismatch(rt: &ResourceType, api_version: &str, kind: &str) -> ApiError {
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

pub(super) fn compact(v: &Value) -> String {
    let s = v.to_string();
    if s.len() > 200 {
        format!("{}...", &s[..200])
    } else {
        s
    }
}

/// Fills the namespace from the URL, rejecting a different one in the body.
pub(super) fn check_namespace(ctx: &Ctx<'_>, obj: &mut Value) -> Result<(), ApiError> {
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

pub(super) fn check_name(ctx: &Ctx<'_>, obj: &Value) -> Result<(), ApiError> {
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
pub(super) fn namespace_admission(
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
pub(super) fn admit_create(ctx: &Ctx<'_>, txn: &Txn<'_>, obj: &mut Value) -> Result<(), ApiError> {
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
        ("", "persistentvolumeclaims") => {
            let classes = txn.list(&TypeKey::new("storage.k8s.io", "storageclasses"), None);
            crate::controllers::persistent_volumes::admit_claim(obj, classes.iter().map(|c| &**c));
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
        (webhooks::GROUP, webhooks::MUTATING | webhooks::VALIDATING) => {
            webhooks::default_and_validate(&rt.kind, obj)?;
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
pub(super) fn admit_rbac(
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
pub(super) fn service_invalid(
    svc: &Value,
    errors: &[crate::service_alloc::AllocError],
) -> ApiError {
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

pub(super) fn admit_update(
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
    if rt.group.is_empty() && rt.plural == "persistentvolumeclaims" {
        let classes = TypeKey::new("storage.k8s.io", "storageclasses");
        let class = |name: &str| txn.get(&classes, "", name).map(|c| (*c).clone());
        if let Some(why) = crate::controllers::persistent_volumes::resize_refusal(old, new, class) {
            let name = new["metadata"]["name"].as_str().unwrap_or_default();
            return Err(ApiError::forbidden(format!(
                "persistentvolumeclaims {name:?} is forbidden: {why}"
            ))
            .with_details("", "persistentvolumeclaims", name));
        }
    }
    if rt.group == webhooks::GROUP
        && matches!(
            rt.plural.as_str(),
            webhooks::MUTATING | webhooks::VALIDATING
        )
    {
        webhooks::default_and_validate(&rt.kind, new)?;
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
pub(super) fn decode_object(
    ctx: &Ctx<'_>,
    content_type: Option<&str>,
    body: &[u8],
) -> Result<Value, ApiError> {
    if matches!(ctx.rt.origin, Origin::Crd { .. }) && crate::http::is_protobuf(content_type) {
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
pub(super) fn review(ctx: &Ctx<'_>, obj: &Value) -> Result<Option<Value>, ApiError> {
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
pub(super) fn sync_crd(state: &ServerState, crd: Option<&Value>, name: &str) {
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
pub(super) fn purge_custom_resources(txn: &mut Txn<'_>, crd: &Value) {
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

pub(super) fn is_crd(rt: &ResourceType) -> bool {
    rt.group == "apiextensions.k8s.io" && rt.plural == "customresourcedefinitions"
}
