//! Temporary stand-ins for the patch engine and CRD handling while their modules are written;
//! same signatures, simplest correct behaviour.

pub(crate) mod patch {
    use serde_json::Value;

    use crate::error::ApiError;
    use crate::registry::ResourceType;

    /// RFC 7386 merge patch.
    pub(crate) fn merge_patch(target: &mut Value, patch: &Value) {
        let Some(p) = patch.as_object() else {
            *target = patch.clone();
            return;
        };
        if !target.is_object() {
            *target = Value::Object(serde_json::Map::new());
        }
        let t = target
            .as_object_mut()
            .expect("invariant: made an object above");
        for (k, v) in p {
            if v.is_null() {
                t.remove(k);
            } else {
                merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
    }

    /// RFC 6902 JSON patch (without the Kubernetes `test` quirk).
    pub(crate) fn json_patch(target: &mut Value, patch: &Value) -> Result<(), ApiError> {
        let p: json_patch::Patch = serde_json::from_value(patch.clone())
            .map_err(|e| ApiError::bad_request(format!("invalid JSON patch: {e}")))?;
        json_patch::patch(target, &p).map_err(|e| ApiError::new(422, "Invalid", e.to_string()))
    }

    /// Strategic merge patch approximated as a merge patch.
    pub(crate) fn strategic_merge_patch(
        original: &Value,
        patch: &Value,
        _api_version: &str,
        _kind: &str,
    ) -> Result<Value, ApiError> {
        let mut out = original.clone();
        merge_patch(&mut out, patch);
        Ok(out)
    }

    /// Apply approximated as a merge of the applied configuration.
    pub(crate) fn server_side_apply(
        live: Option<&Value>,
        applied: &Value,
        _manager: &str,
        _force: bool,
        _now: &str,
        _rt: &ResourceType,
    ) -> Result<Value, ApiError> {
        let mut out = live
            .cloned()
            .unwrap_or_else(|| Value::Object(serde_json::Map::new()));
        merge_patch(&mut out, applied);
        Ok(out)
    }
}

pub(crate) mod crd {
    use serde_json::Value;

    use crate::error::ApiError;
    use crate::registry::ResourceType;

    pub(crate) fn validate_crd(_crd: &Value) -> Result<(), ApiError> {
        Ok(())
    }

    pub(crate) fn types_from_crd(_crd: &Value) -> Result<Vec<ResourceType>, ApiError> {
        Ok(Vec::new())
    }

    pub(crate) fn accept(_crd: &mut Value) {}

    pub(crate) fn prune_default_validate(
        _rt: &ResourceType,
        _obj: &mut Value,
    ) -> Result<(), ApiError> {
        Ok(())
    }
}
