//! Patch: merge, JSON, strategic merge and server-side apply, including apply creating a missing object.

#[allow(clippy::wildcard_imports)]
use super::*;

pub(super) fn patch(
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
                    let now = crate::timefmt::now_rfc3339();
                    let obj = patch::server_side_apply(None, &applied, &manager, force, &now, &rt)?;
                    let mut obj = convert::to_storage(&rt, obj);
                    if ctx.webhook_pass() {
                        namespace_admission(txn, &rt, ctx.ns(), ctx.name())?;
                        webhook_flow::builtin_mutations(ctx, txn, &mut obj, true);
                    }
                    ctx.mutation_point(None, &mut obj)?;
                    strategy::prepare_create(&rt, &mut obj)?;
                    namespace_admission(txn, &rt, ctx.ns(), ctx.name())?;
                    admit_create(ctx, txn, &mut obj)?;
                    ctx.validation_point(None, &mut obj)?;
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
                        let now = crate::timefmt::now_rfc3339();
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
