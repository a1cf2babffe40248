//! RBAC privilege-escalation prevention on writes of Roles, ClusterRoles and their bindings:
//! a user may only grant what they hold, unless they may `escalate` (roles) or `bind`
//! (bindings), as kube-apiserver's policy-based RBAC storage enforces.

use serde_json::Value;

use super::rbac::{
    PolicyRule, RBAC_GROUP, RbacView, SYSTEM_MASTERS, aggregate_errors, decide, forbidden,
    go_quote, go_quote_list,
};
use super::{RequestAttributes, UserInfo};
use crate::error::ApiError;

/// Splits a rule into single-verb, single-group, single-resource (and single-name) rules, or
/// single-URL rules (Kubernetes' `BreakdownRule`).
pub fn breakdown_rule(rule: &PolicyRule) -> Vec<PolicyRule> {
    let one = |s: &String| vec![s.clone()];
    let mut out = Vec::new();
    for group in &rule.api_groups {
        for resource in &rule.resources {
            for verb in &rule.verbs {
                if rule.resource_names.is_empty() {
                    out.push(PolicyRule {
                        verbs: one(verb),
                        api_groups: one(group),
                        resources: one(resource),
                        ..PolicyRule::default()
                    });
                } else {
                    for name in &rule.resource_names {
                        out.push(PolicyRule {
                            verbs: one(verb),
                            api_groups: one(group),
                            resources: one(resource),
                            resource_names: one(name),
                            ..PolicyRule::default()
                        });
                    }
                }
            }
        }
    }
    for url in &rule.non_resource_urls {
        for verb in &rule.verbs {
            out.push(PolicyRule {
                verbs: one(verb),
                non_resource_urls: one(url),
                ..PolicyRule::default()
            });
        }
    }
    out
}

fn has(set: &[String], item: &str) -> bool {
    set.iter().any(|s| s == item)
}

fn has_all(set: &[String], items: &[String]) -> bool {
    items.iter().all(|i| has(set, i))
}

fn resource_covers_all(owner: &[String], wanted: &[String]) -> bool {
    if has(owner, "*") || has_all(owner, wanted) {
        return true;
    }
    wanted.iter().all(|path| {
        has(owner, path)
            || path
                .split_once('/')
                .is_some_and(|(_, sub)| has(owner, &format!("*/{sub}")))
    })
}

fn url_covers(owner: &str, path: &str) -> bool {
    owner == path || (owner.ends_with('*') && path.starts_with(owner.trim_end_matches('*')))
}

fn urls_cover_all(owner: &[String], wanted: &[String]) -> bool {
    wanted
        .iter()
        .all(|path| owner.iter().any(|o| url_covers(o, path)))
}

/// Whether `owner` grants everything `sub` does (Kubernetes' `ruleCovers`).
pub fn rule_covers(owner: &PolicyRule, sub: &PolicyRule) -> bool {
    let verbs = has(&owner.verbs, "*") || has_all(&owner.verbs, &sub.verbs);
    let groups = has(&owner.api_groups, "*") || has_all(&owner.api_groups, &sub.api_groups);
    let resources = resource_covers_all(&owner.resources, &sub.resources);
    let urls = urls_cover_all(&owner.non_resource_urls, &sub.non_resource_urls);
    let names = if sub.resource_names.is_empty() {
        owner.resource_names.is_empty()
    } else {
        owner.resource_names.is_empty() || has_all(&owner.resource_names, &sub.resource_names)
    };
    verbs && groups && resources && names && urls
}

/// Whether `owner` rules cover all `wanted` rules; the uncovered atomic rules otherwise
/// (Kubernetes' `Covers`).
pub fn covers(owner: &[PolicyRule], wanted: &[PolicyRule]) -> (bool, Vec<PolicyRule>) {
    let mut missing = Vec::new();
    for rule in wanted {
        for atom in breakdown_rule(rule) {
            if !owner.iter().any(|o| rule_covers(o, &atom)) {
                missing.push(atom);
            }
        }
    }
    (missing.is_empty(), missing)
}

/// Merges single-group, single-resource rules (with at most one name) by appending verbs,
/// as Kubernetes' `CompactRules` does before printing missing rights.
fn compact_rules(rules: &[PolicyRule]) -> Vec<PolicyRule> {
    let mut out: Vec<PolicyRule> = Vec::new();
    // Keyed by (group, resource, single name); insertion order kept for stable output.
    type SimpleKey = (String, String, Option<String>);
    let mut simple: Vec<(SimpleKey, PolicyRule)> = Vec::new();
    for rule in rules {
        let is_simple = rule.non_resource_urls.is_empty()
            && rule.api_groups.len() == 1
            && rule.resources.len() == 1
            && rule.resource_names.len() <= 1;
        if !is_simple {
            out.push(rule.clone());
            continue;
        }
        let key = (
            rule.api_groups[0].clone(),
            rule.resources[0].clone(),
            rule.resource_names.first().cloned(),
        );
        match simple.iter_mut().find(|(k, _)| *k == key) {
            Some((_, existing)) => existing.verbs.extend(rule.verbs.iter().cloned()),
            None => simple.push((key, rule.clone())),
        }
    }
    out.extend(simple.into_iter().map(|(_, r)| r));
    out
}

/// `ConfirmNoEscalation`: the user's rules in `namespace` must cover `rules`.
fn confirm_no_escalation(
    rbac: &RbacView,
    user: &UserInfo,
    namespace: &str,
    rules: &[PolicyRule],
) -> Result<(), String> {
    let (owner, errors) = rbac.rules_for(user, namespace);
    let (covered, missing) = covers(&owner, rules);
    if covered {
        return Ok(());
    }
    let mut descriptions: Vec<String> = compact_rules(&missing)
        .iter()
        .map(PolicyRule::compact_string)
        .collect();
    descriptions.sort();
    descriptions.dedup();
    let mut msg = format!(
        "user {} (groups={}) is attempting to grant RBAC permissions not currently held:\n{}",
        go_quote(&user.username),
        go_quote_list(&user.groups),
        descriptions.join("\n")
    );
    if !errors.is_empty() {
        msg.push_str(&format!(
            "; resolution errors: [{}]",
            aggregate_errors(&errors)
        ));
    }
    Err(msg)
}

fn full_authority() -> Vec<PolicyRule> {
    let star = || vec!["*".to_owned()];
    vec![
        PolicyRule {
            verbs: star(),
            api_groups: star(),
            resources: star(),
            ..PolicyRule::default()
        },
        PolicyRule {
            verbs: star(),
            non_resource_urls: star(),
            ..PolicyRule::default()
        },
    ]
}

fn rbac_check(
    rbac: &RbacView,
    user: &UserInfo,
    verb: &str,
    resource: &str,
    namespace: &str,
    name: &str,
) -> bool {
    let attrs = RequestAttributes {
        user: user.clone(),
        verb: verb.to_owned(),
        api_group: RBAC_GROUP.to_owned(),
        api_version: "v1".to_owned(),
        resource: resource.to_owned(),
        subresource: String::new(),
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        path: String::new(),
        resource_request: true,
    };
    decide(rbac, &attrs).allowed
}

fn plural(kind: &str) -> Option<&'static str> {
    Some(match kind {
        "Role" => "roles",
        "ClusterRole" => "clusterroles",
        "RoleBinding" => "rolebindings",
        "ClusterRoleBinding" => "clusterrolebindings",
        _ => return None,
    })
}

/// Refuses a create or update of a Role, ClusterRole, RoleBinding or ClusterRoleBinding
/// (`role_or_binding_kind`) that would grant `user` more than they hold, with the 403
/// kube-apiserver sends. `namespace` is the request's namespace (empty for cluster objects).
///
/// - `system:masters` may do anything.
/// - Roles: allowed with the `escalate` verb on the role, else every rule must be covered by the
///   user's own rules in `namespace`; an `aggregationRule` needs full authority.
/// - Bindings: allowed with the `bind` verb on the referenced role, else the referenced role's
///   rules must be covered. A missing role is a 404 as the rule resolver reports it.
pub fn check_escalation(
    rbac: &RbacView,
    user: &UserInfo,
    role_or_binding_kind: &str,
    obj: &Value,
    namespace: &str,
) -> Result<(), ApiError> {
    let Some(resource) = plural(role_or_binding_kind) else {
        return Ok(());
    };
    if user.groups.iter().any(|g| g == SYSTEM_MASTERS) {
        return Ok(());
    }
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let deny = |why: String| forbidden(RBAC_GROUP, resource, name, &why);
    match role_or_binding_kind {
        "Role" | "ClusterRole" => {
            if rbac_check(rbac, user, "escalate", resource, namespace, name) {
                return Ok(());
            }
            let rules: Vec<PolicyRule> = obj
                .get("rules")
                .and_then(Value::as_array)
                .map(|a| a.iter().map(PolicyRule::from_value).collect())
                .unwrap_or_default();
            confirm_no_escalation(rbac, user, namespace, &rules).map_err(deny)?;
            let aggregated = obj.get("aggregationRule").is_some_and(|a| !a.is_null());
            if role_or_binding_kind == "ClusterRole"
                && aggregated
                && confirm_no_escalation(rbac, user, namespace, &full_authority()).is_err()
            {
                return Err(deny(
                    "must have cluster-admin privileges to use the aggregationRule".to_owned(),
                ));
            }
            Ok(())
        }
        _ => {
            let role_kind = obj
                .pointer("/roleRef/kind")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let role_name = obj
                .pointer("/roleRef/name")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let role_resource = if role_kind == "Role" {
                "roles"
            } else {
                "clusterroles"
            };
            if rbac_check(rbac, user, "bind", role_resource, namespace, role_name) {
                return Ok(());
            }
            let rules = rbac
                .role_ref_rules(role_kind, role_name, namespace)
                .map_err(|_| ApiError::not_found(RBAC_GROUP, role_resource, role_name))?;
            confirm_no_escalation(rbac, user, namespace, rules).map_err(deny)
        }
    }
}

/// [`check_escalation`] for an update: like kube-apiserver, an update that only changes
/// fields the garbage collector needs (`ownerReferences`, `finalizers`) is always allowed, so a
/// controller can clean up what it may not recreate.
pub fn check_escalation_update(
    rbac: &RbacView,
    user: &UserInfo,
    role_or_binding_kind: &str,
    new: &Value,
    old: &Value,
    namespace: &str,
) -> Result<(), ApiError> {
    let strip = |v: &Value| {
        let mut v = v.clone();
        if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
            for key in [
                "ownerReferences",
                "finalizers",
                "resourceVersion",
                "managedFields",
                "generation",
            ] {
                m.remove(key);
            }
        }
        v
    };
    if strip(new) == strip(old) {
        return Ok(());
    }
    check_escalation(rbac, user, role_or_binding_kind, new, namespace)
}
