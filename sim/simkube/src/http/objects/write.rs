//! Create and update (PUT), each one store transaction from the checks to the write.

#[allow(clippy::wildcard_imports)]
use super::*;

pub(super) fn create(
    ctx: &Ctx<'_>,
    content_type: Option<&str>,
    body: &[u8],
) -> Result<Response, ApiError> {
    let mut obj = decode_object(ctx, content_type, body)?;
    if let Some(answer) = review(ctx, &obj)? {
        return Ok(crate::http::json_response(StatusCode::CREATED, &answer));
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
                if ctx.webhook_pass() {
                    let name = candidate["metadata"]["name"].as_str().unwrap_or_default();
                    namespace_admission(txn, &rt, ctx.ns(), name)?;
                    webhook_flow::builtin_mutations(ctx, txn, &mut candidate, true);
                }
                ctx.mutation_point(None, &mut candidate)?;
                strategy::prepare_create(&rt, &mut candidate)?;
                let (ns, name) = obj_key(&candidate);
                namespace_admission(txn, &rt, &ns, &name)?;
                admit_create(ctx, txn, &mut candidate)?;
                if let Some(view) = &ctx.escalation_view {
                    auth::check_escalation(view, &ctx.attrs.user, &rt.kind, &candidate, &ns)?;
                }
                let now = crate::timefmt::now_rfc3339();
                patch::update_managed_fields_with(
                    None,
                    &mut candidate,
                    &ctx.manager,
                    "Update",
                    &now,
                    Some(&rt),
                    None,
                );
                ctx.validation_point(None, &mut candidate)?;
                let (ns, name) = obj_key(&candidate);
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
pub(super) fn check_rv(ctx: &Ctx<'_>, old: &Value, new: &Value) -> Result<(), ApiError> {
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
pub(super) fn write_update(
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
    if ctx.webhook_pass() && sub.is_none() {
        webhook_flow::builtin_mutations(ctx, txn, &mut new, false);
    }
    ctx.mutation_point(Some(old), &mut new)?;
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
    if record_manager {
        let now = crate::timefmt::now_rfc3339();
        let sub = sub.filter(|s| *s == "status");
        patch::update_managed_fields_with(
            Some(old),
            &mut new,
            &ctx.manager,
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
    ctx.validation_point(Some(old), &mut new)?;
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

pub(super) fn validate_csr_conditions(rt: &ResourceType, csr: &Value) -> Result<(), ApiError> {
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

pub(super) fn update(
    ctx: &Ctx<'_>,
    mut obj: Value,
    sub: Option<&str>,
) -> Result<Response, ApiError> {
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
