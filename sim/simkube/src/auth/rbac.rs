//! The RBAC authorizer: rule matching, binding resolution, ClusterRole aggregation and the
//! Forbidden messages, following kube-apiserver's `rbac` authorizer and its `validation` package.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

use super::{RequestAttributes, UserInfo};
use crate::error::ApiError;

/// The group kube-apiserver lets do anything before RBAC is consulted.
pub const SYSTEM_MASTERS: &str = "system:masters";
/// The RBAC API group.
pub const RBAC_GROUP: &str = "rbac.authorization.k8s.io";

/// One `PolicyRule` of a Role or ClusterRole.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PolicyRule {
    /// `verbs`; `*` is every verb.
    pub verbs: Vec<String>,
    /// `apiGroups`; `""` is the core group, `*` every group.
    pub api_groups: Vec<String>,
    /// `resources`, possibly `res/sub`, `*/sub` or `*`.
    pub resources: Vec<String>,
    /// `resourceNames`; empty means any name.
    pub resource_names: Vec<String>,
    /// `nonResourceURLs`, possibly ending in `*`.
    pub non_resource_urls: Vec<String>,
}

fn strings(value: Option<&Value>) -> Vec<String> {
    value
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

fn has(set: &[String], item: &str) -> bool {
    set.iter().any(|s| s == item)
}

impl PolicyRule {
    /// Reads a rule from its JSON form.
    pub fn from_value(value: &Value) -> PolicyRule {
        PolicyRule {
            verbs: strings(value.get("verbs")),
            api_groups: strings(value.get("apiGroups")),
            resources: strings(value.get("resources")),
            resource_names: strings(value.get("resourceNames")),
            non_resource_urls: strings(value.get("nonResourceURLs")),
        }
    }

    /// The JSON form, omitting empty lists as the API server does.
    pub fn to_value(&self) -> Value {
        let mut map = serde_json::Map::new();
        for (key, list) in [
            ("verbs", &self.verbs),
            ("apiGroups", &self.api_groups),
            ("resources", &self.resources),
            ("resourceNames", &self.resource_names),
            ("nonResourceURLs", &self.non_resource_urls),
        ] {
            if !list.is_empty() || key == "verbs" {
                map.insert(key.into(), json!(list));
            }
        }
        Value::Object(map)
    }

    fn verb_matches(&self, verb: &str) -> bool {
        has(&self.verbs, "*") || has(&self.verbs, verb)
    }

    fn resource_matches(&self, combined: &str, subresource: &str) -> bool {
        self.resources.iter().any(|r| {
            r == "*"
                || r == combined
                // `*/scale` grants the scale subresource of every resource.
                || (!subresource.is_empty()
                    && r.len() == subresource.len() + 2
                    && r.starts_with("*/")
                    && r.ends_with(subresource))
        })
    }

    fn name_matches(&self, name: &str) -> bool {
        self.resource_names.is_empty() || has(&self.resource_names, name)
    }

    fn url_matches(&self, path: &str) -> bool {
        self.non_resource_urls.iter().any(|rule| {
            rule == "*"
                || rule == path
                || rule
                    .strip_suffix('*')
                    .is_some_and(|prefix| path.starts_with(prefix))
        })
    }

    /// Whether this rule allows the request (kube-apiserver's `RuleAllows`).
    pub fn allows(&self, attrs: &RequestAttributes) -> bool {
        if !self.verb_matches(&attrs.verb) {
            return false;
        }
        if !attrs.resource_request {
            return self.url_matches(&attrs.path);
        }
        let combined = if attrs.subresource.is_empty() {
            attrs.resource.clone()
        } else {
            format!("{}/{}", attrs.resource, attrs.subresource)
        };
        (has(&self.api_groups, "*") || has(&self.api_groups, &attrs.api_group))
            && self.resource_matches(&combined, &attrs.subresource)
            && self.name_matches(&attrs.name)
    }

    /// The compact form Kubernetes prints in escalation errors:
    /// `{APIGroups:[""], Resources:["pods"], Verbs:["get"]}`.
    pub fn compact_string(&self) -> String {
        let mut parts = Vec::new();
        for (label, list) in [
            ("APIGroups", &self.api_groups),
            ("Resources", &self.resources),
            ("NonResourceURLs", &self.non_resource_urls),
            ("ResourceNames", &self.resource_names),
            ("Verbs", &self.verbs),
        ] {
            if !list.is_empty() {
                parts.push(format!("{label}:{}", go_quote_list(list)));
            }
        }
        format!("{{{}}}", parts.join(", "))
    }
}

/// Go's `%q` of a `[]string`: `["a" "b"]`.
pub(crate) fn go_quote_list(list: &[String]) -> String {
    let items: Vec<String> = list.iter().map(|s| go_quote(s)).collect();
    format!("[{}]", items.join(" "))
}

/// Go's `%q` of a string (JSON escaping agrees with it for the printable text RBAC carries).
pub(crate) fn go_quote(s: &str) -> String {
    serde_json::to_string(s).expect("invariant: a string always serializes")
}

/// A binding subject.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subject {
    /// `User`, `Group` or `ServiceAccount`.
    pub kind: String,
    /// User, group or ServiceAccount name.
    pub name: String,
    /// ServiceAccount namespace (empty: the binding's namespace).
    pub namespace: String,
}

impl Subject {
    fn from_value(value: &Value) -> Subject {
        let text = |k: &str| {
            value
                .get(k)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        Subject {
            kind: text("kind"),
            name: text("name"),
            namespace: text("namespace"),
        }
    }

    fn applies_to(&self, user: &UserInfo, binding_namespace: &str) -> bool {
        match self.kind.as_str() {
            "User" => user.username == self.name,
            "Group" => user.groups.contains(&self.name),
            "ServiceAccount" => {
                let ns = if self.namespace.is_empty() {
                    binding_namespace
                } else {
                    &self.namespace
                };
                user.username == format!("system:serviceaccount:{ns}:{}", self.name)
            }
            _ => false,
        }
    }

    fn describe(&self, binding_namespace: &str) -> String {
        if self.kind == "ServiceAccount" {
            let ns = if self.namespace.is_empty() {
                binding_namespace
            } else {
                &self.namespace
            };
            format!("{} {}", self.kind, go_quote(&format!("{}/{ns}", self.name)))
        } else {
            format!("{} {}", self.kind, go_quote(&self.name))
        }
    }
}

/// A RoleBinding (non-empty namespace) or ClusterRoleBinding.
#[derive(Debug, Clone)]
struct Binding {
    name: String,
    namespace: String,
    role_kind: String,
    role_name: String,
    subjects: Vec<Subject>,
}

impl Binding {
    fn from_value(value: &Value, namespace: &str) -> Binding {
        let text = |p: &str| {
            value
                .pointer(p)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        Binding {
            name: text("/metadata/name"),
            namespace: namespace.to_owned(),
            role_kind: text("/roleRef/kind"),
            role_name: text("/roleRef/name"),
            subjects: value
                .get("subjects")
                .and_then(Value::as_array)
                .map(|a| a.iter().map(Subject::from_value).collect())
                .unwrap_or_default(),
        }
    }

    fn describe(&self, subject: &Subject) -> String {
        if self.namespace.is_empty() {
            format!(
                "ClusterRoleBinding {} of {} {} to {}",
                go_quote(&self.name),
                self.role_kind,
                go_quote(&self.role_name),
                subject.describe("")
            )
        } else {
            format!(
                "RoleBinding {} of {} {} to {}",
                go_quote(&format!("{}/{}", self.name, self.namespace)),
                self.role_kind,
                go_quote(&self.role_name),
                subject.describe(&self.namespace)
            )
        }
    }
}

/// A snapshot of the RBAC objects of a cluster, indexed for authorization. Build a new one when
/// any Role, ClusterRole or binding changes. ClusterRoles with an `aggregationRule` are given the
/// union of the rules of the ClusterRoles their selectors match at construction time, so they
/// authorize correctly whether or not a controller has persisted their `rules` (see
/// [`aggregate`]).
#[derive(Debug, Clone, Default)]
pub struct RbacView {
    roles: HashMap<(String, String), Vec<PolicyRule>>,
    cluster_roles: Arc<ClusterRoleIndex>,
    role_bindings: BTreeMap<String, Vec<Binding>>,
    cluster_role_bindings: Vec<Binding>,
}

/// ClusterRole name → effective (aggregated) rules.
type ClusterRoleIndex = HashMap<String, Vec<PolicyRule>>;

/// Identity of a set of stored ClusterRoles: (uid, resourceVersion) of each, in name order.
/// Any write changes a resourceVersion, and uids differ between clusters, so equal
/// fingerprints mean equal content.
type Fingerprint = Vec<(String, String)>;

/// Recently computed ClusterRole indexes. Aggregation costs far more than authorizing, and the
/// server builds a view per request while ClusterRoles rarely change; a few entries serve
/// several clusters in one process.
static CLUSTER_ROLE_CACHE: Mutex<Vec<(Fingerprint, Arc<ClusterRoleIndex>)>> =
    Mutex::new(Vec::new());
const CLUSTER_ROLE_CACHE_ENTRIES: usize = 8;

fn fingerprint(sorted_roles: &[Value]) -> Option<Fingerprint> {
    sorted_roles
        .iter()
        .map(|r| {
            let uid = meta(r, "uid");
            let rv = meta(r, "resourceVersion");
            (!uid.is_empty() && !rv.is_empty()).then(|| (uid.to_owned(), rv.to_owned()))
        })
        .collect()
}

fn cluster_role_index(mut cluster_roles: Vec<Value>) -> Arc<ClusterRoleIndex> {
    by_name(&mut cluster_roles);
    let key = fingerprint(&cluster_roles);
    if let Some(key) = &key {
        let cache = CLUSTER_ROLE_CACHE.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, index)) = cache.iter().find(|(k, _)| k == key) {
            return index.clone();
        }
    }
    let index: Arc<ClusterRoleIndex> = Arc::new(
        cluster_roles
            .iter()
            .zip(aggregated_rules(&cluster_roles))
            .map(|(r, aggregated)| {
                (
                    meta(r, "name").to_owned(),
                    aggregated.unwrap_or_else(|| rules_of(r)),
                )
            })
            .collect(),
    );
    if let Some(key) = key {
        let mut cache = CLUSTER_ROLE_CACHE.lock().unwrap_or_else(|e| e.into_inner());
        if cache.len() >= CLUSTER_ROLE_CACHE_ENTRIES {
            cache.remove(0);
        }
        cache.push((key, index.clone()));
    }
    index
}

fn rules_of(role: &Value) -> Vec<PolicyRule> {
    role.get("rules")
        .and_then(Value::as_array)
        .map(|a| a.iter().map(PolicyRule::from_value).collect())
        .unwrap_or_default()
}

fn meta<'a>(obj: &'a Value, field: &str) -> &'a str {
    obj.get("metadata")
        .and_then(|m| m.get(field))
        .and_then(Value::as_str)
        .unwrap_or_default()
}

fn by_name(list: &mut [Value]) {
    list.sort_by(|a, b| {
        (meta(a, "namespace"), meta(a, "name")).cmp(&(meta(b, "namespace"), meta(b, "name")))
    });
}

/// Called with each granted rule and its source, or with a resolution error; returns `false` to
/// stop the walk.
pub(crate) type RuleVisitor<'v> =
    dyn FnMut(Option<&RuleSource<'_>>, Option<&PolicyRule>, Option<String>) -> bool + 'v;

/// Where a rule came from, for the "allowed by" reason.
pub(crate) struct RuleSource<'a> {
    binding: &'a Binding,
    subject: &'a Subject,
}

impl RuleSource<'_> {
    pub(crate) fn describe(&self) -> String {
        self.binding.describe(self.subject)
    }
}

impl RbacView {
    /// Indexes the given objects (each the JSON of a Role, ClusterRole, RoleBinding or
    /// ClusterRoleBinding). Bindings are evaluated in name order, as the allow reason names the
    /// first one that matches.
    pub fn new(
        roles: Vec<Value>,
        cluster_roles: Vec<Value>,
        role_bindings: Vec<Value>,
        cluster_role_bindings: Vec<Value>,
    ) -> Self {
        let roles = roles
            .iter()
            .map(|r| {
                (
                    (meta(r, "namespace").to_owned(), meta(r, "name").to_owned()),
                    rules_of(r),
                )
            })
            .collect();
        let cluster_roles = cluster_role_index(cluster_roles);
        let mut role_bindings = role_bindings;
        by_name(&mut role_bindings);
        let mut rb_index: BTreeMap<String, Vec<Binding>> = BTreeMap::new();
        for rb in &role_bindings {
            let ns = meta(rb, "namespace");
            rb_index
                .entry(ns.to_owned())
                .or_default()
                .push(Binding::from_value(rb, ns));
        }
        let mut crbs = cluster_role_bindings;
        by_name(&mut crbs);
        RbacView {
            roles,
            cluster_roles,
            role_bindings: rb_index,
            cluster_role_bindings: crbs.iter().map(|b| Binding::from_value(b, "")).collect(),
        }
    }

    /// The rules a role reference grants, as the rule resolver's `GetRoleReferenceRules`.
    /// The error is the lister's NotFound wording (`clusterrole.rbac.authorization.k8s.io "x" not
    /// found`).
    pub(crate) fn role_ref_rules(
        &self,
        kind: &str,
        name: &str,
        namespace: &str,
    ) -> Result<&[PolicyRule], String> {
        let found = match kind {
            "Role" => self.roles.get(&(namespace.to_owned(), name.to_owned())),
            "ClusterRole" => self.cluster_roles.get(name),
            other => {
                return Err(format!(
                    "unsupported role reference kind: {}",
                    go_quote(other)
                ));
            }
        };
        found.map(Vec::as_slice).ok_or_else(|| {
            format!(
                "{}.{RBAC_GROUP} {} not found",
                kind.to_lowercase(),
                go_quote(name)
            )
        })
    }

    /// Visits every rule granted to `user` in `namespace` (cluster-wide bindings first, then the
    /// namespace's RoleBindings), with resolution errors for bindings naming missing roles.
    /// The visitor returns `false` to stop.
    pub(crate) fn visit_rules_for(
        &self,
        user: &UserInfo,
        namespace: &str,
        visitor: &mut RuleVisitor<'_>,
    ) {
        let namespaced = if namespace.is_empty() {
            None
        } else {
            self.role_bindings.get(namespace)
        };
        let bindings = self
            .cluster_role_bindings
            .iter()
            .chain(namespaced.into_iter().flatten());
        for binding in bindings {
            let Some(subject) = binding
                .subjects
                .iter()
                .find(|s| s.applies_to(user, &binding.namespace))
            else {
                continue;
            };
            match self.role_ref_rules(&binding.role_kind, &binding.role_name, &binding.namespace) {
                Ok(rules) => {
                    let source = RuleSource { binding, subject };
                    for rule in rules {
                        if !visitor(Some(&source), Some(rule), None) {
                            return;
                        }
                    }
                }
                Err(error) => {
                    if !visitor(None, None, Some(error)) {
                        return;
                    }
                }
            }
        }
    }

    /// Every rule that applies to `user` in `namespace`, and resolution errors
    /// (the rule resolver's `RulesFor`).
    pub fn rules_for(&self, user: &UserInfo, namespace: &str) -> (Vec<PolicyRule>, Vec<String>) {
        let mut rules = Vec::new();
        let mut errors = Vec::new();
        self.visit_rules_for(user, namespace, &mut |_, rule, error| {
            if let Some(rule) = rule {
                rules.push(rule.clone());
            }
            if let Some(error) = error {
                errors.push(error);
            }
            true
        });
        (rules, errors)
    }
}

/// The outcome of authorizing one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Whether the request may proceed.
    pub allowed: bool,
    /// `RBAC: allowed by ...` when allowed through RBAC; on denial, binding resolution errors
    /// (`RBAC: role.rbac.authorization.k8s.io "x" not found`) or empty.
    pub reason: String,
}

/// Formats errors as Go's `utilerrors.NewAggregate(...).Error()`: deduplicated, bracketed when
/// there are several.
pub(crate) fn aggregate_errors(errors: &[String]) -> String {
    let mut seen: Vec<&String> = Vec::new();
    for e in errors {
        if !seen.contains(&e) {
            seen.push(e);
        }
    }
    match seen.as_slice() {
        [] => String::new(),
        [one] => (*one).clone(),
        many => format!(
            "[{}]",
            many.iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// Decides a request as kube-apiserver with `--authorization-mode=RBAC` does: members of
/// `system:masters` are always allowed; otherwise the first RBAC rule that allows wins.
pub fn decide(rbac: &RbacView, attrs: &RequestAttributes) -> Decision {
    if attrs.user.groups.iter().any(|g| g == SYSTEM_MASTERS) {
        return Decision {
            allowed: true,
            reason: String::new(),
        };
    }
    let mut allowed_by = None;
    let mut errors = Vec::new();
    rbac.visit_rules_for(&attrs.user, &attrs.namespace, &mut |source, rule, error| {
        if let Some(error) = error {
            errors.push(error);
            return true;
        }
        match (source, rule) {
            (Some(source), Some(rule)) if rule.allows(attrs) => {
                allowed_by = Some(source.describe());
                false
            }
            _ => true,
        }
    });
    match allowed_by {
        Some(by) => Decision {
            allowed: true,
            reason: format!("RBAC: allowed by {by}"),
        },
        None if errors.is_empty() => Decision {
            allowed: false,
            reason: String::new(),
        },
        None => Decision {
            allowed: false,
            reason: format!("RBAC: {}", aggregate_errors(&errors)),
        },
    }
}

/// The text after `is forbidden: ` in a 403, as kube-apiserver's `forbiddenMessage`.
pub fn forbidden_message(attrs: &RequestAttributes) -> String {
    let user = go_quote(&attrs.user.username);
    if !attrs.resource_request {
        return format!(
            "User {user} cannot {} path {}",
            attrs.verb,
            go_quote(&attrs.path)
        );
    }
    let resource = if attrs.subresource.is_empty() {
        attrs.resource.clone()
    } else {
        format!("{}/{}", attrs.resource, attrs.subresource)
    };
    let what = format!(
        "User {user} cannot {} resource {} in API group {}",
        attrs.verb,
        go_quote(&resource),
        go_quote(&attrs.api_group)
    );
    if attrs.namespace.is_empty() {
        format!("{what} at the cluster scope")
    } else {
        format!("{what} in the namespace {}", go_quote(&attrs.namespace))
    }
}

/// A 403 shaped as `apierrors.NewForbidden(groupResource, name, err)`.
pub(crate) fn forbidden(group: &str, resource: &str, name: &str, why: &str) -> ApiError {
    if resource.is_empty() {
        let mut error = ApiError::forbidden(format!("forbidden: {why}"));
        error.details = Some(json!({}));
        return error;
    }
    let qualified = crate::error::qualified(group, resource);
    let message = if name.is_empty() {
        format!("{qualified} is forbidden: {why}")
    } else {
        format!("{qualified} {} is forbidden: {why}", go_quote(name))
    };
    ApiError::forbidden(message).with_details(group, resource, name)
}

/// Authorizes a request; on denial, the 403 kube-apiserver sends, e.g.
/// `pods "p" is forbidden: User "alice" cannot get resource "pods" in API group "" in the
/// namespace "x"`.
///
/// A `get` of `pods/exec`, `pods/attach` or `pods/portforward` (the WebSocket form of those
/// streams) also needs `create` on the same subresource, as kube-apiserver 1.31+ checks
/// (`AuthorizePodWebsocketUpgradeCreatePermission`), so `get` alone cannot open a shell.
pub fn authorize(rbac: &RbacView, attrs: &RequestAttributes) -> Result<(), ApiError> {
    deny_unless_allowed(rbac, attrs)?;
    let streaming = attrs.resource_request
        && attrs.verb == "get"
        && attrs.api_group.is_empty()
        && attrs.resource == "pods"
        && matches!(
            attrs.subresource.as_str(),
            "exec" | "attach" | "portforward"
        );
    if streaming {
        let create = RequestAttributes {
            verb: "create".into(),
            ..attrs.clone()
        };
        deny_unless_allowed(rbac, &create)?;
    }
    Ok(())
}

fn deny_unless_allowed(rbac: &RbacView, attrs: &RequestAttributes) -> Result<(), ApiError> {
    let decision = decide(rbac, attrs);
    if decision.allowed {
        return Ok(());
    }
    let mut why = forbidden_message(attrs);
    if !decision.reason.is_empty() {
        why = format!("{why}: {}", decision.reason);
    }
    if attrs.resource_request {
        Err(forbidden(
            &attrs.api_group,
            &attrs.resource,
            &attrs.name,
            &why,
        ))
    } else {
        Err(forbidden("", "", "", &why))
    }
}

/// Whether `labels` satisfy a `metav1.LabelSelector` (matchLabels and matchExpressions with
/// In, NotIn, Exists, DoesNotExist). An empty selector matches everything.
pub fn label_selector_matches(selector: &Value, labels: &serde_json::Map<String, Value>) -> bool {
    let label = |k: &str| labels.get(k).and_then(Value::as_str);
    if let Some(map) = selector.get("matchLabels").and_then(Value::as_object)
        && !map.iter().all(|(k, v)| label(k) == v.as_str())
    {
        return false;
    }
    let expressions = selector.get("matchExpressions").and_then(Value::as_array);
    expressions.into_iter().flatten().all(|expr| {
        let key = expr.get("key").and_then(Value::as_str).unwrap_or_default();
        let values = strings(expr.get("values"));
        match expr
            .get("operator")
            .and_then(Value::as_str)
            .unwrap_or_default()
        {
            "In" => label(key).is_some_and(|v| has(&values, v)),
            "NotIn" => label(key).is_none_or(|v| !has(&values, v)),
            "Exists" => label(key).is_some(),
            "DoesNotExist" => label(key).is_none(),
            _ => false,
        }
    })
}

/// Computes the aggregated rules of every ClusterRole with an `aggregationRule`: the
/// deduplicated union of the rules of all other ClusterRoles matching any of its selectors, in
/// name order, iterated to a fixed point for nested aggregation. `roles` must be sorted by name.
/// Returns, per role, `Some(rules)` for aggregated roles.
fn aggregated_rules(roles: &[Value]) -> Vec<Option<Vec<PolicyRule>>> {
    let empty = serde_json::Map::new();
    let mut rules: Vec<Vec<PolicyRule>> = roles.iter().map(rules_of).collect();
    // Which roles each aggregated role selects; labels do not change while iterating.
    let selected: Vec<Option<Vec<usize>>> = roles
        .iter()
        .enumerate()
        .map(|(i, role)| {
            let selectors = role
                .pointer("/aggregationRule/clusterRoleSelectors")
                .and_then(Value::as_array)?;
            Some(
                roles
                    .iter()
                    .enumerate()
                    .filter(|(j, other)| {
                        let labels = other.pointer("/metadata/labels").and_then(Value::as_object);
                        *j != i
                            && selectors
                                .iter()
                                .any(|s| label_selector_matches(s, labels.unwrap_or(&empty)))
                    })
                    .map(|(j, _)| j)
                    .collect(),
            )
        })
        .collect();
    // Each pass propagates one level of nesting; there cannot be more levels than roles.
    for _ in 0..=roles.len() {
        let mut changed = false;
        for (i, sources) in selected.iter().enumerate() {
            let Some(sources) = sources else {
                continue;
            };
            let mut union: Vec<PolicyRule> = Vec::new();
            for &j in sources {
                for rule in &rules[j] {
                    if !union.contains(rule) {
                        union.push(rule.clone());
                    }
                }
            }
            if union != rules[i] {
                rules[i] = union;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    selected
        .iter()
        .zip(rules)
        .map(|(s, r)| s.as_ref().map(|_| r))
        .collect()
}

/// ClusterRole aggregation, as kube-controller-manager's `clusterrole-aggregation` controller
/// computes it: every ClusterRole with an `aggregationRule` gets, as its `rules`, the
/// deduplicated union of the rules of all other ClusterRoles matching any of its
/// `clusterRoleSelectors`, in name order. Nested aggregation (edit feeding admin) is iterated to
/// a fixed point. Returns all ClusterRoles sorted by name; a caller persisting them writes back
/// those whose rules changed. [`RbacView::new`] applies the same computation by itself.
pub fn aggregate(cluster_roles: &[Value]) -> Vec<Value> {
    let mut roles: Vec<Value> = cluster_roles.to_vec();
    by_name(&mut roles);
    let computed = aggregated_rules(&roles);
    for (role, rules) in roles.iter_mut().zip(computed) {
        if let Some(rules) = rules {
            role["rules"] = Value::Array(rules.iter().map(PolicyRule::to_value).collect());
        }
    }
    roles
}
