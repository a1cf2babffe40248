//! Deletion: delete options, preconditions, finalizers, graceful pod deletion, and deletecollection.

#[allow(clippy::wildcard_imports)]
use super::*;

// ---------------------------------------------------------------------------------------------
// Deletion

/// DeleteOptions from the body and the query.
#[derive(Debug, Default, Clone)]
pub(crate) struct DeleteOptions {
    pub(super) grace: Option<i64>,
    pub(super) propagation: Option<String>,
    pub(super) uid: Option<String>,
    pub(super) rv: Option<String>,
    pub(super) dry_run: bool,
}

pub(super) fn delete_options(ctx: &Ctx<'_>, body: &[u8]) -> Result<DeleteOptions, ApiError> {
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
pub(super) enum Deleted {
    /// Gone; its last state.
    Gone(Arc<Value>),
    /// Still there, marked for deletion (finalizers or grace period).
    Marked(Arc<Value>),
}

pub(super) fn delete_one(
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
        json!(crate::timefmt::rfc3339_after(grace)),
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

pub(super) fn delete(ctx: &Ctx<'_>, opts: &DeleteOptions) -> Result<Response, ApiError> {
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

pub(super) fn delete_collection(ctx: &Ctx<'_>, body: &[u8]) -> Result<Response, ApiError> {
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
