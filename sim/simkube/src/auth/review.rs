//! Access and identity reviews: SelfSubjectAccessReview (`kubectl auth can-i`),
//! SubjectAccessReview, LocalSubjectAccessReview, SelfSubjectRulesReview
//! (`kubectl auth can-i --list`) and SelfSubjectReview (`kubectl auth whoami`).

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::rbac::{PolicyRule, RbacView, SYSTEM_MASTERS, aggregate_errors, decide};
use super::{RequestAttributes, UserInfo};
use crate::error::{ApiError, Cause};

const AUTHZ_GROUP: &str = "authorization.k8s.io";

fn text(v: &Value, key: &str) -> String {
    v.get(key)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

fn required(kind: &str, field: &str, message: &str) -> ApiError {
    ApiError::invalid(
        AUTHZ_GROUP,
        kind,
        "",
        &[Cause {
            reason: "FieldValueRequired".into(),
            message: format!("Required value: {message}"),
            field: field.into(),
        }],
    )
}

/// Builds the attributes a review's `spec` asks about, for `user`.
fn review_attributes(
    kind: &str,
    spec: &Value,
    user: UserInfo,
) -> Result<RequestAttributes, ApiError> {
    let resource = spec.get("resourceAttributes").filter(|v| !v.is_null());
    let non_resource = spec.get("nonResourceAttributes").filter(|v| !v.is_null());
    match (resource, non_resource) {
        (Some(r), None) => Ok(RequestAttributes {
            user,
            verb: text(r, "verb"),
            api_group: text(r, "group"),
            api_version: text(r, "version"),
            resource: text(r, "resource"),
            subresource: text(r, "subresource"),
            namespace: text(r, "namespace"),
            name: text(r, "name"),
            path: String::new(),
            resource_request: true,
        }),
        (None, Some(n)) => Ok(RequestAttributes {
            user,
            verb: text(n, "verb"),
            api_group: String::new(),
            api_version: String::new(),
            resource: String::new(),
            subresource: String::new(),
            namespace: String::new(),
            name: String::new(),
            path: text(n, "path"),
            resource_request: false,
        }),
        (Some(_), Some(_)) => Err(ApiError::invalid(
            AUTHZ_GROUP,
            kind,
            "",
            &[Cause {
                reason: "FieldValueInvalid".into(),
                message: "Invalid value: \"\": cannot be specified in combination with \
                          resourceAttributes"
                    .into(),
                field: "spec.nonResourceAttributes".into(),
            }],
        )),
        (None, None) => Err(required(
            kind,
            "spec.resourceAttributes",
            "exactly one of nonResourceAttributes or resourceAttributes must be specified",
        )),
    }
}

fn answer(
    kind: &str,
    review: &Value,
    spec: Value,
    rbac: &RbacView,
    attrs: &RequestAttributes,
) -> Value {
    let decision = decide(rbac, attrs);
    let mut status = json!({"allowed": decision.allowed});
    if !decision.reason.is_empty() {
        status["reason"] = json!(decision.reason);
    }
    let mut metadata = review.get("metadata").cloned().unwrap_or_else(|| json!({}));
    if metadata.get("creationTimestamp").is_none() {
        metadata["creationTimestamp"] = Value::Null;
    }
    json!({
        "kind": kind,
        "apiVersion": format!("{AUTHZ_GROUP}/v1"),
        "metadata": metadata,
        "spec": spec,
        "status": status,
    })
}

/// Answers a SelfSubjectAccessReview for the requesting `user`: `status.allowed` and, when RBAC
/// allowed it, `status.reason` naming the binding. A spec with neither or both of
/// `resourceAttributes` and `nonResourceAttributes` is a 422 as upstream.
pub fn self_subject_access_review(
    rbac: &RbacView,
    user: &UserInfo,
    review: &Value,
) -> Result<Value, ApiError> {
    const KIND: &str = "SelfSubjectAccessReview";
    let spec = review.get("spec").cloned().unwrap_or_else(|| json!({}));
    let attrs = review_attributes(KIND, &spec, user.clone())?;
    Ok(answer(KIND, review, spec, rbac, &attrs))
}

fn user_from_spec(spec: &Value) -> UserInfo {
    let extra: BTreeMap<String, Vec<String>> = spec
        .get("extra")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| {
                    let values = v
                        .as_array()
                        .map(|a| {
                            a.iter()
                                .filter_map(Value::as_str)
                                .map(str::to_owned)
                                .collect()
                        })
                        .unwrap_or_default();
                    (k.clone(), values)
                })
                .collect()
        })
        .unwrap_or_default();
    UserInfo {
        username: text(spec, "user"),
        uid: text(spec, "uid"),
        groups: spec
            .get("groups")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default(),
        extra,
    }
}

/// Answers a SubjectAccessReview (cluster-scoped; the subject is `spec.user`/`spec.groups`, used
/// as given: no `system:authenticated` is added, as upstream).
pub fn subject_access_review(rbac: &RbacView, review: &Value) -> Result<Value, ApiError> {
    const KIND: &str = "SubjectAccessReview";
    let spec = review.get("spec").cloned().unwrap_or_else(|| json!({}));
    let user = user_from_spec(&spec);
    if user.username.is_empty() && user.groups.is_empty() {
        return Err(ApiError::invalid(
            AUTHZ_GROUP,
            KIND,
            "",
            &[Cause {
                reason: "FieldValueInvalid".into(),
                message: "Invalid value: \"\": at least one of user or group must be specified"
                    .into(),
                field: "spec.user".into(),
            }],
        ));
    }
    let attrs = review_attributes(KIND, &spec, user)?;
    Ok(answer(KIND, review, spec, rbac, &attrs))
}

/// Answers a LocalSubjectAccessReview posted in `namespace`: like a SubjectAccessReview whose
/// resource namespace must be that namespace (or empty, then it is filled in).
pub fn local_subject_access_review(
    rbac: &RbacView,
    namespace: &str,
    review: &Value,
) -> Result<Value, ApiError> {
    const KIND: &str = "LocalSubjectAccessReview";
    let mut spec = review.get("spec").cloned().unwrap_or_else(|| json!({}));
    if spec
        .get("nonResourceAttributes")
        .is_some_and(|v| !v.is_null())
    {
        return Err(ApiError::invalid(
            AUTHZ_GROUP,
            KIND,
            "",
            &[Cause {
                reason: "FieldValueInvalid".into(),
                message: "Invalid value: \"\": disallowed on this kind of request".into(),
                field: "spec.nonResourceAttributes".into(),
            }],
        ));
    }
    if let Some(attrs) = spec
        .get_mut("resourceAttributes")
        .and_then(Value::as_object_mut)
    {
        let given = attrs
            .get("namespace")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if given.is_empty() {
            attrs.insert("namespace".into(), json!(namespace));
        } else if given != namespace {
            return Err(ApiError::bad_request(format!(
                "spec.resourceAttributes.namespace must match namespace: {namespace}"
            )));
        }
    }
    let user = user_from_spec(&spec);
    let attrs = review_attributes(KIND, &spec, user)?;
    Ok(answer(KIND, review, spec, rbac, &attrs))
}

/// Answers a SelfSubjectRulesReview: every resource and non-resource rule that applies to `user`
/// in `spec.namespace`, as `kubectl auth can-i --list` prints them.
pub fn self_subject_rules_review(
    rbac: &RbacView,
    user: &UserInfo,
    review: &Value,
) -> Result<Value, ApiError> {
    const KIND: &str = "SelfSubjectRulesReview";
    let spec = review.get("spec").cloned().unwrap_or_else(|| json!({}));
    let namespace = text(&spec, "namespace");
    let (mut rules, errors) = rbac.rules_for(user, &namespace);
    if user.groups.iter().any(|g| g == SYSTEM_MASTERS) && rules.is_empty() {
        let star = || vec!["*".to_owned()];
        rules.push(PolicyRule {
            verbs: star(),
            api_groups: star(),
            resources: star(),
            ..PolicyRule::default()
        });
        rules.push(PolicyRule {
            verbs: star(),
            non_resource_urls: star(),
            ..PolicyRule::default()
        });
    }
    let mut resource_rules = Vec::new();
    let mut non_resource_rules = Vec::new();
    for rule in &rules {
        if rule.resources.is_empty() && !rule.non_resource_urls.is_empty() {
            non_resource_rules
                .push(json!({"verbs": rule.verbs, "nonResourceURLs": rule.non_resource_urls}));
        } else {
            let mut r = json!({"verbs": rule.verbs, "apiGroups": rule.api_groups, "resources": rule.resources});
            if !rule.resource_names.is_empty() {
                r["resourceNames"] = json!(rule.resource_names);
            }
            resource_rules.push(r);
        }
    }
    let mut status = json!({
        "resourceRules": resource_rules,
        "nonResourceRules": non_resource_rules,
        "incomplete": false,
    });
    if !errors.is_empty() {
        status["evaluationError"] = json!(aggregate_errors(&errors));
    }
    Ok(json!({
        "kind": KIND,
        "apiVersion": format!("{AUTHZ_GROUP}/v1"),
        "metadata": {"creationTimestamp": null},
        "spec": spec,
        "status": status,
    }))
}

/// Answers a SelfSubjectReview (authentication.k8s.io/v1): who the server thinks the caller is.
pub fn self_subject_review(user: &UserInfo) -> Value {
    let mut info = json!({"username": user.username, "groups": user.groups});
    if !user.uid.is_empty() {
        info["uid"] = json!(user.uid);
    }
    if !user.extra.is_empty() {
        info["extra"] = json!(user.extra);
    }
    json!({
        "kind": "SelfSubjectReview",
        "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"creationTimestamp": null},
        "status": {"userInfo": info},
    })
}
