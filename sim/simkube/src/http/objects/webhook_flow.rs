//! Admission webhooks in the write path. A write runs under one store transaction, but webhook
//! calls are network IO, so a write that some webhook may concern runs in three stages of the
//! same handler: `Mutate` stops where the object is complete (after the built-in mutating
//! admission) and hands it to the mutating webhooks; `Validate` takes their result through
//! defaulting, validation and the built-in admission and stops before the write, for the
//! validating webhooks; `Commit` writes exactly what they saw, if the stored object has not
//! changed since (else the whole sequence starts again, as kube-apiserver's update retries do).
//! Writes no webhook rule covers take the direct path unchanged.

use std::sync::Mutex;

use crate::admission::webhooks::{self, Attributes, Operation};

#[allow(clippy::wildcard_imports)]
use super::*;

/// How often a write whose object changed while webhooks ran is retried before answering 409.
const ATTEMPTS: usize = 3;
/// Marks the early return of a stage; never leaves this module.
const STAGE_DONE: &str = "simkube:webhook-stage-done";
/// Marks a commit whose object changed while the webhooks ran.
const STALE: &str = "simkube:webhook-stale";

/// Which pass of a write this is.
#[derive(Debug, Default)]
pub(super) enum Stage {
    /// No webhook concerns the request: the handler runs as it always did.
    #[default]
    Direct,
    /// Capture `(old, new)` where mutating webhooks see the object, write nothing.
    Mutate(Mutex<Option<Captured>>),
    /// Continue from the mutated object, capture the final one before the write.
    Validate {
        mutated: Value,
        captured: Mutex<Option<Captured>>,
    },
    /// Write `last` if the stored object still has `old_rv`.
    Commit {
        mutated: Value,
        last: Value,
        old_rv: Option<String>,
    },
}

/// The objects at a capture point.
#[derive(Debug, Clone)]
pub(super) struct Captured {
    old: Option<Arc<Value>>,
    new: Value,
}

fn stage_done() -> ApiError {
    ApiError::new(0, STAGE_DONE, "")
}

fn take(slot: &Mutex<Option<Captured>>) -> Option<Captured> {
    slot.lock().unwrap_or_else(|e| e.into_inner()).take()
}

impl Ctx<'_> {
    /// Whether this pass serves webhooks (so the built-in mutations run before the capture).
    pub(super) fn webhook_pass(&self) -> bool {
        !matches!(self.stage, Stage::Direct)
    }

    /// Where mutating webhooks see the object: after the built-in mutating admission, before
    /// defaulting and validation by the strategy.
    pub(super) fn mutation_point(
        &self,
        old: Option<&Arc<Value>>,
        new: &mut Value,
    ) -> Result<(), ApiError> {
        match &self.stage {
            Stage::Direct => Ok(()),
            Stage::Mutate(slot) => {
                *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(Captured {
                    old: old.cloned(),
                    new: new.clone(),
                });
                Err(stage_done())
            }
            Stage::Validate { mutated, .. } | Stage::Commit { mutated, .. } => {
                *new = mutated.clone();
                Ok(())
            }
        }
    }

    /// Where validating webhooks see the object: the complete object about to be written.
    pub(super) fn validation_point(
        &self,
        old: Option<&Arc<Value>>,
        new: &mut Value,
    ) -> Result<(), ApiError> {
        match &self.stage {
            Stage::Direct | Stage::Mutate(_) => Ok(()),
            Stage::Validate { captured, .. } => {
                *captured.lock().unwrap_or_else(|e| e.into_inner()) = Some(Captured {
                    old: old.cloned(),
                    new: new.clone(),
                });
                Err(stage_done())
            }
            Stage::Commit { last, old_rv, .. } => {
                let rv = old.and_then(|o| o["metadata"]["resourceVersion"].as_str());
                if rv != old_rv.as_deref() {
                    return Err(ApiError::new(0, STALE, ""));
                }
                *new = last.clone();
                Ok(())
            }
        }
    }

    fn with_stage(&self, stage: Stage) -> Ctx<'_> {
        Ctx {
            state: self.state,
            rt: self.rt.clone(),
            rp: self.rp.clone(),
            query: self.query.clone(),
            repr: self.repr,
            attrs: self.attrs,
            manager: self.manager.clone(),
            escalation_view: self.escalation_view.clone(),
            stage,
        }
    }

    fn admission_attributes(&self, operation: Operation, name: &str, options: &str) -> Attributes {
        let mut opts = json!({"kind": options, "apiVersion": "meta.k8s.io/v1"});
        if self.query.get("dryRun").is_some() {
            opts["dryRun"] = json!(["All"]);
        }
        if let Some(manager) = self.query.get("fieldManager").filter(|m| !m.is_empty()) {
            opts["fieldManager"] = json!(manager);
        }
        Attributes {
            group: self.rt.group.clone(),
            version: self.rp.version.clone(),
            resource: self.rt.plural.clone(),
            subresource: self.rp.subresource.clone().unwrap_or_default(),
            kind: self.rt.kind.clone(),
            namespaced: self.rt.namespaced,
            namespace: if self.rt.namespaced {
                self.ns().to_owned()
            } else {
                String::new()
            },
            name: name.to_owned(),
            operation,
            dry_run: self.query.get("dryRun").is_some(),
            user: self.attrs.user.clone(),
            options: opts,
        }
    }

    /// Whether any stored webhook's rules cover some operation on this resource.
    fn any_webhook(&self) -> bool {
        let attrs = self.admission_attributes(Operation::Create, "", "");
        [true, false].into_iter().any(|mutating| {
            webhooks::hooks(self.state, mutating)
                .iter()
                .any(|h| webhooks::covers_resource(h, &attrs))
        })
    }

    /// The object as the request's version shows it (webhooks get the requested version).
    fn served(&self, obj: &Value) -> Value {
        at_version(&self.rt, obj).unwrap_or_else(|| obj.clone())
    }
}

/// What kube-apiserver has done to an object before its mutating webhooks see it: the
/// defaults of decoding, and the built-in mutating admission (ServiceAccount and
/// DefaultTolerationSeconds on pods, DefaultStorageClass on claims). All of it runs again,
/// idempotently, in the strategy's pass over the webhooks' result.
pub(super) fn builtin_mutations(ctx: &Ctx<'_>, txn: &Txn<'_>, obj: &mut Value, create: bool) {
    crate::strategy::default_object(&ctx.rt, obj);
    if create && ctx.rt.group.is_empty() && ctx.rt.plural == "persistentvolumeclaims" {
        let classes = txn.list(&TypeKey::new("storage.k8s.io", "storageclasses"), None);
        crate::controllers::persistent_volumes::admit_claim(obj, classes.iter().map(|c| &**c));
    }
    if !(ctx.rt.group.is_empty() && ctx.rt.plural == "pods") {
        return;
    }
    crate::controllers::taint_eviction::default_toleration_seconds(obj);
    if create {
        crate::admission::admit_pod(
            obj,
            |ns, name| {
                txn.get(&TypeKey::new("", "serviceaccounts"), ns, name)
                    .map(|sa| (*sa).clone())
            },
            || crate::strategy::generate_name(""),
        );
    }
}

fn finish(result: Result<Response, ApiError>, warnings: &[String]) -> Result<Response, ApiError> {
    if warnings.is_empty() {
        return result;
    }
    let resp = match result {
        Ok(resp) => resp,
        Err(e) => axum::response::IntoResponse::into_response(e),
    };
    Ok(with_warnings(resp, warnings))
}

/// Runs a create, update or patch handler through the webhooks that apply. `options` names the
/// request's options kind (`CreateOptions`, `UpdateOptions`, `PatchOptions`); a patch is shown
/// to webhooks with the options of the create or update it becomes, as kube-apiserver does.
pub(super) async fn admit_write(
    ctx: &Ctx<'_>,
    options: &str,
    run: impl Fn(&Ctx<'_>) -> Result<Response, ApiError>,
) -> Result<Response, ApiError> {
    if !ctx.any_webhook() {
        return run(ctx);
    }
    for _ in 0..ATTEMPTS {
        let mut warnings = Vec::new();
        let probe = ctx.with_stage(Stage::Mutate(Mutex::new(None)));
        let result = run(&probe);
        let Stage::Mutate(slot) = &probe.stage else {
            unreachable!("the probe is a Mutate stage")
        };
        let Some(Captured { old, new }) = take(slot) else {
            return result;
        };
        let operation = if old.is_some() {
            Operation::Update
        } else {
            Operation::Create
        };
        let name = new["metadata"]["name"].as_str().unwrap_or_default();
        // A patch reaches webhooks as the create or update it turns into, with those options.
        let options = match (options, operation) {
            ("PatchOptions", Operation::Create) => "CreateOptions",
            ("PatchOptions", _) => "UpdateOptions",
            (options, _) => options,
        };
        let mut attrs = ctx.admission_attributes(operation, name, options);
        let old_served = old.as_deref().map(|o| ctx.served(o));
        let mutated = webhooks::mutate(
            ctx.state,
            &attrs,
            old_served.as_ref(),
            Some(ctx.served(&new)),
        )
        .await;
        warnings.extend(mutated.warnings);
        if let Some(e) = mutated.error {
            return finish(Err(e), &warnings);
        }
        let mutated = convert::to_storage(&ctx.rt, mutated.object.unwrap_or(new));

        let check = ctx.with_stage(Stage::Validate {
            mutated: mutated.clone(),
            captured: Mutex::new(None),
        });
        let result = run(&check);
        let Stage::Validate { captured, .. } = &check.stage else {
            unreachable!("the check is a Validate stage")
        };
        let Some(Captured { old, new: last }) = take(captured) else {
            return finish(result, &warnings);
        };
        last["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .clone_into(&mut attrs.name);
        let old_served = old.as_deref().map(|o| ctx.served(o));
        let validated = webhooks::validate_request(
            ctx.state,
            &attrs,
            old_served.as_ref(),
            Some(&ctx.served(&last)),
        )
        .await;
        warnings.extend(validated.warnings);
        if let Some(e) = validated.error {
            return finish(Err(e), &warnings);
        }

        let old_rv = old
            .as_deref()
            .and_then(|o| o["metadata"]["resourceVersion"].as_str())
            .map(str::to_owned);
        let commit = ctx.with_stage(Stage::Commit {
            mutated,
            last,
            old_rv,
        });
        match run(&commit) {
            Err(e) if e.reason == STALE => continue,
            result => return finish(result, &warnings),
        }
    }
    Err(ctx.conflict(
        ctx.name(),
        "the object has been modified; please apply your changes to the latest version and try again",
    ))
}

/// Runs a delete through the webhooks that apply: they get the stored object as `oldObject`
/// and no `object`.
pub(super) async fn admit_delete(
    ctx: &Ctx<'_>,
    dry_run: bool,
    run: impl Fn(&Ctx<'_>) -> Result<Response, ApiError>,
) -> Result<Response, ApiError> {
    if !ctx.any_webhook() {
        return run(ctx);
    }
    let Some(old) = ctx.state.store.get(&key(&ctx.rt), ctx.ns(), ctx.name()) else {
        return run(ctx);
    };
    let old = ctx.served(&old);
    let mut attrs = ctx.admission_attributes(Operation::Delete, ctx.name(), "DeleteOptions");
    attrs.dry_run = dry_run;
    let mut warnings = Vec::new();
    let mutated = webhooks::mutate(ctx.state, &attrs, Some(&old), None).await;
    warnings.extend(mutated.warnings);
    if let Some(e) = mutated.error {
        return finish(Err(e), &warnings);
    }
    let validated = webhooks::validate_request(ctx.state, &attrs, Some(&old), None).await;
    warnings.extend(validated.warnings);
    if let Some(e) = validated.error {
        return finish(Err(e), &warnings);
    }
    finish(run(ctx), &warnings)
}

/// Runs a deletecollection through the webhooks that apply: mutating webhooks once for the
/// request (no name, no objects), validating webhooks once per object with it as `oldObject`,
/// as kube-apiserver does. One denial fails the request before anything is deleted (upstream
/// deletes the objects before the denied one).
pub(super) async fn admit_delete_collection(
    ctx: &Ctx<'_>,
    dry_run: bool,
    run: impl Fn(&Ctx<'_>) -> Result<Response, ApiError>,
) -> Result<Response, ApiError> {
    if !ctx.any_webhook() {
        return run(ctx);
    }
    let selectors = Selectors::parse(&ctx.query, &ctx.rt)?;
    let mut attrs = ctx.admission_attributes(Operation::Delete, "", "DeleteOptions");
    attrs.dry_run = dry_run;
    let mut warnings = Vec::new();
    let mutated = webhooks::mutate(ctx.state, &attrs, None, None).await;
    warnings.extend(mutated.warnings);
    if let Some(e) = mutated.error {
        return finish(Err(e), &warnings);
    }
    let targets: Vec<Arc<Value>> = ctx
        .state
        .store
        .all(&key(&ctx.rt))
        .into_iter()
        .filter(|o| {
            ctx.rp
                .namespace
                .as_deref()
                .is_none_or(|ns| o["metadata"]["namespace"] == ns)
                && selectors.matches(o)
        })
        .collect();
    for target in targets {
        let old = ctx.served(&target);
        let mut attrs = attrs.clone();
        old["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .clone_into(&mut attrs.name);
        if ctx.rt.namespaced {
            old["metadata"]["namespace"]
                .as_str()
                .unwrap_or_default()
                .clone_into(&mut attrs.namespace);
        }
        let validated = webhooks::validate_request(ctx.state, &attrs, Some(&old), None).await;
        warnings.extend(validated.warnings);
        if let Some(e) = validated.error {
            return finish(Err(e), &warnings);
        }
    }
    finish(run(ctx), &warnings)
}
