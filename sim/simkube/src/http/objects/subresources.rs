//! The subresources with their own bodies: binding, eviction, token and scale.

#[allow(clippy::wildcard_imports)]
use super::*;

// ---------------------------------------------------------------------------------------------
// Subresources

pub(super) fn binding(ctx: &Ctx<'_>, body: &Value) -> Result<Response, ApiError> {
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
        let cond = json!({"type": "PodScheduled", "status": "True", "lastProbeTime": null, "lastTransitionTime": crate::timefmt::now_rfc3339()});
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

pub(super) fn eviction(ctx: &Ctx<'_>, body: &Value) -> Result<Response, ApiError> {
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

pub(super) fn token(ctx: &Ctx<'_>, body: &Value) -> Result<Response, ApiError> {
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

pub(super) fn scale_of(obj: &Value) -> Value {
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

pub(super) fn scale_get(ctx: &Ctx<'_>) -> Result<Response, ApiError> {
    let obj = ctx
        .state
        .store
        .get(&key(&ctx.rt), ctx.ns(), ctx.name())
        .ok_or_else(|| ctx.not_found())?;
    Ok(json_response(StatusCode::OK, &scale_of(&obj)))
}

pub(super) fn scale_write(
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
