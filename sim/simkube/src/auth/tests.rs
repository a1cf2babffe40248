//! Unit tests for authentication, RBAC evaluation, escalation checks, reviews and tokens.

use std::sync::{Arc, Mutex};

use http::{HeaderMap, HeaderValue, Method};
use serde_json::{Value, json};

use super::*;

fn user(name: &str, groups: &[&str]) -> UserInfo {
    let groups: Vec<String> = groups.iter().map(|g| (*g).to_owned()).collect();
    UserInfo::authenticated(name, &groups)
}

fn role(ns: &str, name: &str, rules: Value) -> Value {
    json!({"kind": "Role", "metadata": {"namespace": ns, "name": name}, "rules": rules})
}

fn cluster_role(name: &str, rules: Value) -> Value {
    json!({"kind": "ClusterRole", "metadata": {"name": name}, "rules": rules})
}

fn subject(kind: &str, name: &str) -> Value {
    json!({"kind": kind, "name": name})
}

fn role_binding(ns: &str, name: &str, kind: &str, role: &str, subjects: Value) -> Value {
    json!({
        "kind": "RoleBinding",
        "metadata": {"namespace": ns, "name": name},
        "roleRef": {"apiGroup": RBAC_GROUP, "kind": kind, "name": role},
        "subjects": subjects,
    })
}

fn cluster_role_binding(name: &str, role: &str, subjects: Value) -> Value {
    json!({
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": role},
        "subjects": subjects,
    })
}

fn attrs(
    u: &UserInfo,
    verb: &str,
    group: &str,
    resource: &str,
    ns: &str,
    name: &str,
) -> RequestAttributes {
    let (resource, subresource) = resource.split_once('/').unwrap_or((resource, ""));
    RequestAttributes {
        user: u.clone(),
        verb: verb.into(),
        api_group: group.into(),
        api_version: "v1".into(),
        resource: resource.into(),
        subresource: subresource.into(),
        namespace: ns.into(),
        name: name.into(),
        path: String::new(),
        resource_request: true,
    }
}

fn url(u: &UserInfo, verb: &str, path: &str) -> RequestAttributes {
    RequestAttributes {
        user: u.clone(),
        verb: verb.into(),
        path: path.into(),
        ..RequestAttributes::default()
    }
}

/// A cluster with the default policy plus the given objects.
fn view(
    roles: Vec<Value>,
    cluster_roles: Vec<Value>,
    rbs: Vec<Value>,
    crbs: Vec<Value>,
) -> RbacView {
    let mut all_cluster_roles = default_cluster_roles();
    all_cluster_roles.extend(cluster_roles);
    let mut all_crbs = default_cluster_role_bindings();
    all_crbs.extend(crbs);
    RbacView::new(roles, all_cluster_roles, rbs, all_crbs)
}

fn message(result: Result<(), ApiError>) -> String {
    let error = result.expect_err("expected a denial");
    assert_eq!((error.code, error.reason.as_str()), (403, "Forbidden"));
    error.message
}

#[test]
fn rbac_table() {
    let alice = user("alice", &[]);
    let bob = user("bob", &["devs"]);
    let robot = UserInfo::authenticated(
        "system:serviceaccount:tenant-a:robot",
        &[
            "system:serviceaccounts".into(),
            "system:serviceaccounts:tenant-a".into(),
        ],
    );
    let rbac = view(
        vec![
            role(
                "tenant-a",
                "pod-reader",
                json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]),
            ),
            role(
                "tenant-a",
                "logs",
                json!([{"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]}]),
            ),
            role(
                "tenant-a",
                "one-cm",
                json!([{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["settings"], "verbs": ["*"]}]),
            ),
            role(
                "tenant-a",
                "scaler",
                json!([{"apiGroups": ["*"], "resources": ["*/scale"], "verbs": ["update"]}]),
            ),
        ],
        vec![
            cluster_role(
                "ns-reader",
                json!([{"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list"]}]),
            ),
            cluster_role(
                "everything-core",
                json!([{"apiGroups": [""], "resources": ["*"], "verbs": ["*"]}]),
            ),
            cluster_role(
                "health",
                json!([{"nonResourceURLs": ["/metrics", "/debug/*"], "verbs": ["get"]}]),
            ),
        ],
        vec![
            role_binding(
                "tenant-a",
                "alice-pods",
                "Role",
                "pod-reader",
                json!([subject("User", "alice")]),
            ),
            role_binding(
                "tenant-a",
                "alice-logs",
                "Role",
                "logs",
                json!([subject("User", "alice")]),
            ),
            role_binding(
                "tenant-a",
                "alice-cm",
                "Role",
                "one-cm",
                json!([subject("User", "alice")]),
            ),
            role_binding(
                "tenant-a",
                "alice-scale",
                "Role",
                "scaler",
                json!([subject("User", "alice")]),
            ),
            // A ClusterRole bound by a RoleBinding applies in that namespace only.
            role_binding(
                "tenant-a",
                "devs-core",
                "ClusterRole",
                "everything-core",
                json!([subject("Group", "devs")]),
            ),
            // ServiceAccount subject without a namespace: the binding's namespace.
            role_binding(
                "tenant-a",
                "robot",
                "Role",
                "pod-reader",
                json!([{"kind": "ServiceAccount", "name": "robot"}]),
            ),
            role_binding(
                "tenant-a",
                "broken",
                "Role",
                "missing",
                json!([subject("User", "carol")]),
            ),
        ],
        vec![
            cluster_role_binding("bob-ns", "ns-reader", json!([subject("User", "bob")])),
            cluster_role_binding("bob-health", "health", json!([subject("Group", "devs")])),
            cluster_role_binding(
                "robot-elsewhere",
                "ns-reader",
                json!([{"kind": "ServiceAccount", "name": "robot", "namespace": "other"}]),
            ),
        ],
    );
    let carol = user("carol", &[]);
    let cases: Vec<(RequestAttributes, Option<&str>)> = vec![
        (attrs(&alice, "list", "", "pods", "tenant-a", ""), None),
        (attrs(&alice, "watch", "", "pods", "tenant-a", ""), None),
        (attrs(&alice, "get", "", "pods", "tenant-a", "p"), None),
        (
            attrs(&alice, "list", "", "pods", "default", ""),
            Some(
                r#"pods is forbidden: User "alice" cannot list resource "pods" in API group "" in the namespace "default""#,
            ),
        ),
        (
            attrs(&alice, "get", "", "pods", "x", "p"),
            Some(
                r#"pods "p" is forbidden: User "alice" cannot get resource "pods" in API group "" in the namespace "x""#,
            ),
        ),
        (
            attrs(&alice, "delete", "", "pods", "tenant-a", "p"),
            Some(
                r#"pods "p" is forbidden: User "alice" cannot delete resource "pods" in API group "" in the namespace "tenant-a""#,
            ),
        ),
        // pods/log is granted separately from pods, and pods does not grant pods/log.
        (attrs(&alice, "get", "", "pods/log", "tenant-a", "p"), None),
        (
            attrs(&alice, "get", "", "pods/exec", "tenant-a", "p"),
            Some(
                r#"pods "p" is forbidden: User "alice" cannot get resource "pods/exec" in API group "" in the namespace "tenant-a""#,
            ),
        ),
        // resourceNames restricts by name; requests without a name never match it.
        (
            attrs(&alice, "get", "", "configmaps", "tenant-a", "settings"),
            None,
        ),
        (
            attrs(&alice, "update", "", "configmaps", "tenant-a", "settings"),
            None,
        ),
        (
            attrs(&alice, "get", "", "configmaps", "tenant-a", "other"),
            Some(
                r#"configmaps "other" is forbidden: User "alice" cannot get resource "configmaps" in API group "" in the namespace "tenant-a""#,
            ),
        ),
        (
            attrs(&alice, "list", "", "configmaps", "tenant-a", ""),
            Some(
                r#"configmaps is forbidden: User "alice" cannot list resource "configmaps" in API group "" in the namespace "tenant-a""#,
            ),
        ),
        (
            attrs(&alice, "create", "", "configmaps", "tenant-a", ""),
            Some(
                r#"configmaps is forbidden: User "alice" cannot create resource "configmaps" in API group "" in the namespace "tenant-a""#,
            ),
        ),
        // `*/scale` matches any resource's scale subresource, not the resource.
        (
            attrs(
                &alice,
                "update",
                "apps",
                "deployments/scale",
                "tenant-a",
                "d",
            ),
            None,
        ),
        (
            attrs(&alice, "update", "apps", "deployments", "tenant-a", "d"),
            Some(
                r#"deployments.apps "d" is forbidden: User "alice" cannot update resource "deployments" in API group "apps" in the namespace "tenant-a""#,
            ),
        ),
        // `*` resources include subresources; the group still has to match.
        (
            attrs(&bob, "create", "", "pods/exec", "tenant-a", "p"),
            None,
        ),
        (
            attrs(&bob, "deletecollection", "", "secrets", "tenant-a", ""),
            None,
        ),
        (
            attrs(&bob, "list", "apps", "deployments", "tenant-a", ""),
            Some(
                r#"deployments.apps is forbidden: User "bob" cannot list resource "deployments" in API group "apps" in the namespace "tenant-a""#,
            ),
        ),
        (
            attrs(&bob, "list", "", "secrets", "tenant-b", ""),
            Some(
                r#"secrets is forbidden: User "bob" cannot list resource "secrets" in API group "" in the namespace "tenant-b""#,
            ),
        ),
        // ClusterRoleBinding: everywhere, including cluster scope.
        (attrs(&bob, "list", "", "namespaces", "", ""), None),
        (
            attrs(&bob, "get", "", "namespaces", "tenant-z", "tenant-z"),
            None,
        ),
        (
            attrs(&alice, "list", "", "namespaces", "", ""),
            Some(
                r#"namespaces is forbidden: User "alice" cannot list resource "namespaces" in API group "" at the cluster scope"#,
            ),
        ),
        (
            attrs(&alice, "get", "", "nodes", "", "n1"),
            Some(
                r#"nodes "n1" is forbidden: User "alice" cannot get resource "nodes" in API group "" at the cluster scope"#,
            ),
        ),
        // Non-resource URLs, with a trailing-star prefix.
        (url(&bob, "get", "/metrics"), None),
        (url(&bob, "get", "/debug/pprof/heap"), None),
        (
            url(&bob, "get", "/debugger"),
            Some(r#"forbidden: User "bob" cannot get path "/debugger""#),
        ),
        (
            url(&bob, "post", "/metrics"),
            Some(r#"forbidden: User "bob" cannot post path "/metrics""#),
        ),
        // Default policy: every authenticated user may discover the API.
        (url(&alice, "get", "/apis/apps/v1"), None),
        (
            attrs(
                &alice,
                "create",
                "authorization.k8s.io",
                "selfsubjectaccessreviews",
                "",
                "",
            ),
            None,
        ),
        // ServiceAccounts: in the binding's namespace, or the subject's explicit one.
        (attrs(&robot, "list", "", "pods", "tenant-a", ""), None),
        (
            attrs(&robot, "list", "", "namespaces", "", ""),
            Some(
                r#"namespaces is forbidden: User "system:serviceaccount:tenant-a:robot" cannot list resource "namespaces" in API group "" at the cluster scope"#,
            ),
        ),
        // A binding to a missing role is reported in the reason.
        (
            attrs(&carol, "get", "", "pods", "tenant-a", "p"),
            Some(
                r#"pods "p" is forbidden: User "carol" cannot get resource "pods" in API group "" in the namespace "tenant-a": RBAC: role.rbac.authorization.k8s.io "missing" not found"#,
            ),
        ),
    ];
    for (request, expected) in cases {
        let got = authorize(&rbac, &request);
        match expected {
            None => assert!(got.is_ok(), "{request:?} should be allowed, got {got:?}"),
            Some(msg) => assert_eq!(message(got), msg, "{request:?}"),
        }
    }
}

#[test]
fn forbidden_status_details_name_the_resource() {
    let rbac = view(vec![], vec![], vec![], vec![]);
    let alice = user("alice", &[]);
    let error = authorize(
        &rbac,
        &attrs(&alice, "get", "apps", "deployments/scale", "ns", "web"),
    )
    .expect_err("denied");
    assert_eq!(
        error.to_status()["details"],
        json!({"name": "web", "group": "apps", "kind": "deployments"})
    );
    let error = authorize(&rbac, &url(&alice, "get", "/x")).expect_err("denied");
    assert_eq!(error.to_status()["details"], json!({}));
}

#[test]
fn allowed_reason_names_the_binding() {
    let rbac = view(
        vec![role(
            "ns",
            "r",
            json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]),
        )],
        vec![],
        vec![role_binding(
            "ns",
            "rb",
            "Role",
            "r",
            json!([{"kind": "ServiceAccount", "name": "sa"}]),
        )],
        vec![],
    );
    let sa = user("system:serviceaccount:ns:sa", &[]);
    let decision = decide(&rbac, &attrs(&sa, "get", "", "pods", "ns", "p"));
    assert_eq!(
        decision,
        Decision {
            allowed: true,
            reason: r#"RBAC: allowed by RoleBinding "rb/ns" of Role "r" to ServiceAccount "sa/ns""#
                .into()
        }
    );
    let admin = user("root", &["system:masters"]);
    assert!(decide(&rbac, &attrs(&admin, "delete", "x.io", "things", "", "a")).allowed);
    let viewer = user("v", &["viewers"]);
    let rbac = view(
        vec![],
        vec![],
        vec![],
        vec![cluster_role_binding(
            "v",
            "view",
            json!([subject("Group", "viewers")]),
        )],
    );
    assert_eq!(
        decide(&rbac, &attrs(&viewer, "list", "", "pods", "ns", "")).reason,
        r#"RBAC: allowed by ClusterRoleBinding "v" of ClusterRole "view" to Group "viewers""#
    );
}

#[test]
fn anonymous_and_authenticated_defaults() {
    let rbac = view(vec![], vec![], vec![], vec![]);
    let anon = UserInfo::anonymous();
    for path in ["/version", "/healthz", "/livez", "/readyz"] {
        assert!(authorize(&rbac, &url(&anon, "get", path)).is_ok(), "{path}");
    }
    assert_eq!(
        message(authorize(&rbac, &url(&anon, "get", "/api"))),
        r#"forbidden: User "system:anonymous" cannot get path "/api""#
    );
    assert_eq!(
        message(authorize(
            &rbac,
            &attrs(&anon, "list", "", "namespaces", "", "")
        )),
        r#"namespaces is forbidden: User "system:anonymous" cannot list resource "namespaces" in API group "" at the cluster scope"#
    );
    let alice = user("alice", &[]);
    for path in [
        "/api",
        "/api/v1",
        "/apis",
        "/apis/apps/v1",
        "/openapi/v3",
        "/version",
    ] {
        assert!(
            authorize(&rbac, &url(&alice, "get", path)).is_ok(),
            "{path}"
        );
    }
    assert!(authorize(&rbac, &url(&alice, "get", "/metrics")).is_err());
}

#[test]
fn aggregation_unions_labelled_cluster_roles() {
    let crd_viewer = json!({
        "metadata": {"name": "widgets-view", "labels": {"rbac.authorization.k8s.io/aggregate-to-view": "true"}},
        "rules": [{"apiGroups": ["example.com"], "resources": ["widgets"], "verbs": ["get", "list", "watch"]}],
    });
    let custom = json!({
        "metadata": {"name": "monitoring"},
        "aggregationRule": {"clusterRoleSelectors": [
            {"matchExpressions": [{"key": "team", "operator": "In", "values": ["obs", "sre"]}]},
        ]},
    });
    let metrics = json!({
        "metadata": {"name": "metrics", "labels": {"team": "sre"}},
        "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}],
    });
    let mut roles = default_cluster_roles();
    roles.extend([crd_viewer, custom, metrics]);
    let aggregated = aggregate(&roles);
    let rules = |name: &str| -> Vec<PolicyRule> {
        let role = aggregated
            .iter()
            .find(|r| r["metadata"]["name"] == name)
            .expect("role present");
        role["rules"]
            .as_array()
            .expect("rules")
            .iter()
            .map(PolicyRule::from_value)
            .collect()
    };
    let admin = rules("admin");
    let edit = rules("edit");
    let view_rules = rules("view");
    // Nested: view ⊂ edit ⊂ admin, and the CRD role reached all three.
    for r in &view_rules {
        assert!(edit.contains(r) && admin.contains(r), "{r:?}");
    }
    for r in &edit {
        assert!(admin.contains(r), "{r:?}");
    }
    assert!(view_rules.iter().any(|r| r.resources == ["widgets"]));
    assert!(
        !view_rules
            .iter()
            .any(|r| r.resources.contains(&"secrets".to_owned()))
    );
    assert!(
        edit.iter()
            .any(|r| r.resources.contains(&"secrets".to_owned()))
    );
    assert!(
        admin
            .iter()
            .any(|r| r.resources.contains(&"rolebindings".to_owned()))
    );
    assert_eq!(
        rules("monitoring"),
        vec![PolicyRule {
            verbs: vec!["get".into()],
            non_resource_urls: vec!["/metrics".into()],
            ..PolicyRule::default()
        }]
    );
    // Aggregation is idempotent.
    assert_eq!(aggregate(&aggregated), aggregated);

    // And RbacView applies it: a namespace `view` binding grants the CRD.
    let rbac = RbacView::new(
        vec![],
        roles,
        vec![role_binding(
            "ns",
            "v",
            "ClusterRole",
            "view",
            json!([subject("User", "u")]),
        )],
        vec![],
    );
    let u = user("u", &[]);
    assert!(
        authorize(
            &rbac,
            &attrs(&u, "list", "example.com", "widgets", "ns", "")
        )
        .is_ok()
    );
    assert!(authorize(&rbac, &attrs(&u, "get", "", "pods/log", "ns", "p")).is_ok());
    assert!(authorize(&rbac, &attrs(&u, "get", "", "secrets", "ns", "s")).is_err());
    assert!(
        authorize(
            &rbac,
            &attrs(&u, "list", "example.com", "widgets", "other", "")
        )
        .is_err()
    );
}

#[test]
fn label_selectors() {
    let labels = json!({"a": "1", "b": "2"});
    let labels = labels.as_object().expect("object");
    let yes = [
        json!({}),
        json!({"matchLabels": {"a": "1"}}),
        json!({"matchExpressions": [{"key": "a", "operator": "Exists"}]}),
        json!({"matchExpressions": [{"key": "c", "operator": "DoesNotExist"}]}),
        json!({"matchExpressions": [{"key": "b", "operator": "NotIn", "values": ["3"]}]}),
        json!({"matchExpressions": [{"key": "c", "operator": "NotIn", "values": ["3"]}]}),
    ];
    let no = [
        json!({"matchLabels": {"a": "2"}}),
        json!({"matchLabels": {"a": "1", "c": "1"}}),
        json!({"matchExpressions": [{"key": "b", "operator": "In", "values": ["1"]}]}),
        json!({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}),
        json!({"matchExpressions": [{"key": "a", "operator": "Bogus"}]}),
    ];
    for s in &yes {
        assert!(label_selector_matches(s, labels), "{s}");
    }
    for s in &no {
        assert!(!label_selector_matches(s, labels), "{s}");
    }
}

#[test]
fn request_attributes_follow_request_info() {
    let u = user("u", &[]);
    // (method, path, query) -> (verb, group, version, resource, subresource, ns, name, resource_request)
    type Row = (Method, &'static str, &'static str, [&'static str; 7], bool);
    let rows: Vec<Row> = vec![
        (
            Method::GET,
            "/api/v1/namespaces/ns/pods",
            "",
            ["list", "", "v1", "pods", "", "ns", ""],
            true,
        ),
        (
            Method::GET,
            "/api/v1/namespaces/ns/pods",
            "watch=true&resourceVersion=5",
            ["watch", "", "v1", "pods", "", "ns", ""],
            true,
        ),
        (
            Method::GET,
            "/api/v1/namespaces/ns/pods",
            "fieldSelector=metadata.name%3Dweb",
            ["list", "", "v1", "pods", "", "ns", "web"],
            true,
        ),
        (
            Method::GET,
            "/api/v1/watch/namespaces/ns/pods/web",
            "",
            ["watch", "", "v1", "pods", "", "ns", "web"],
            true,
        ),
        (
            Method::GET,
            "/api/v1/namespaces/ns/pods/web/log",
            "container=c",
            ["get", "", "v1", "pods", "log", "ns", "web"],
            true,
        ),
        (
            Method::POST,
            "/api/v1/namespaces/ns/pods/web/exec",
            "command=ls",
            ["create", "", "v1", "pods", "exec", "ns", "web"],
            true,
        ),
        (
            Method::DELETE,
            "/apis/apps/v1/namespaces/ns/deployments",
            "",
            [
                "deletecollection",
                "apps",
                "v1",
                "deployments",
                "",
                "ns",
                "",
            ],
            true,
        ),
        (
            Method::DELETE,
            "/apis/apps/v1/namespaces/ns/deployments/d",
            "",
            ["delete", "apps", "v1", "deployments", "", "ns", "d"],
            true,
        ),
        (
            Method::PATCH,
            "/apis/apps/v1/namespaces/ns/deployments/d/scale",
            "",
            ["patch", "apps", "v1", "deployments", "scale", "ns", "d"],
            true,
        ),
        (
            Method::PUT,
            "/apis/rbac.authorization.k8s.io/v1/clusterroles/x",
            "",
            [
                "update",
                "rbac.authorization.k8s.io",
                "v1",
                "clusterroles",
                "",
                "",
                "x",
            ],
            true,
        ),
        // A Namespace object is in its own namespace.
        (
            Method::GET,
            "/api/v1/namespaces/ns",
            "",
            ["get", "", "v1", "namespaces", "", "ns", "ns"],
            true,
        ),
        (
            Method::PUT,
            "/api/v1/namespaces/ns/finalize",
            "",
            ["update", "", "v1", "namespaces", "finalize", "ns", "ns"],
            true,
        ),
        (
            Method::GET,
            "/api/v1/nodes",
            "",
            ["list", "", "v1", "nodes", "", "", ""],
            true,
        ),
        (
            Method::HEAD,
            "/api/v1/nodes/n",
            "",
            ["get", "", "v1", "nodes", "", "", "n"],
            true,
        ),
        (
            Method::GET,
            "/api/v1",
            "",
            ["get", "", "", "", "", "", ""],
            false,
        ),
        (
            Method::GET,
            "/apis/apps/v1",
            "",
            ["get", "", "", "", "", "", ""],
            false,
        ),
        (
            Method::GET,
            "/healthz",
            "",
            ["get", "", "", "", "", "", ""],
            false,
        ),
        (
            Method::POST,
            "/version",
            "",
            ["post", "", "", "", "", "", ""],
            false,
        ),
    ];
    for (method, path, query, want, resource_request) in rows {
        let a = RequestAttributes::from_request(u.clone(), &method, path, query);
        let got = [
            a.verb.as_str(),
            &a.api_group,
            &a.api_version,
            &a.resource,
            &a.subresource,
            &a.namespace,
            &a.name,
        ];
        assert_eq!(got, want, "{method} {path}?{query}");
        assert_eq!(a.resource_request, resource_request, "{path}");
        assert_eq!(a.path, path);
    }
}

#[test]
fn resource_names_allow_single_object_watch_via_field_selector() {
    let rbac = view(
        vec![role(
            "ns",
            "one",
            json!([{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["cfg"], "verbs": ["get", "list", "watch"]}]),
        )],
        vec![],
        vec![role_binding(
            "ns",
            "one",
            "Role",
            "one",
            json!([subject("User", "u")]),
        )],
        vec![],
    );
    let u = user("u", &[]);
    let path = "/api/v1/namespaces/ns/configmaps";
    let named = RequestAttributes::from_request(
        u.clone(),
        &Method::GET,
        path,
        "watch=1&fieldSelector=metadata.name=cfg",
    );
    assert!(authorize(&rbac, &named).is_ok());
    let all = RequestAttributes::from_request(u, &Method::GET, path, "watch=1");
    assert_eq!(
        message(authorize(&rbac, &all)),
        r#"configmaps is forbidden: User "u" cannot watch resource "configmaps" in API group "" in the namespace "ns""#
    );
}

// ---- escalation ----

fn tenant_rbac() -> RbacView {
    view(
        vec![
            role(
                "t",
                "manager",
                json!([
                    {"apiGroups": [""], "resources": ["pods", "configmaps"], "verbs": ["get", "list", "create"]},
                    {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles", "rolebindings"], "verbs": ["create", "update"]},
                ]),
            ),
            role(
                "t",
                "secret-reader",
                json!([{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]),
            ),
        ],
        vec![],
        vec![
            role_binding("t", "m", "Role", "manager", json!([subject("User", "mgr")])),
            role_binding(
                "t",
                "admin",
                "ClusterRole",
                "admin",
                json!([subject("User", "nsadmin")]),
            ),
        ],
        vec![cluster_role_binding(
            "binder",
            "binder",
            json!([subject("User", "binder")]),
        )],
    )
}

#[test]
fn escalation_roles() {
    let rbac = tenant_rbac();
    let mgr = user("mgr", &["team"]);
    let ok = role(
        "t",
        "sub",
        json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]),
    );
    assert!(check_escalation(&rbac, &mgr, "Role", &ok, "t").is_ok());
    let too_much = role(
        "t",
        "more",
        json!([{"apiGroups": [""], "resources": ["pods", "secrets"], "verbs": ["get", "delete"]}]),
    );
    let error = check_escalation(&rbac, &mgr, "Role", &too_much, "t").expect_err("escalation");
    assert_eq!(error.code, 403);
    assert_eq!(
        error.message,
        "roles.rbac.authorization.k8s.io \"more\" is forbidden: user \"mgr\" (groups=[\"team\" \"system:authenticated\"]) is attempting to grant RBAC permissions not currently held:\n{APIGroups:[\"\"], Resources:[\"pods\"], Verbs:[\"delete\"]}\n{APIGroups:[\"\"], Resources:[\"secrets\"], Verbs:[\"get\" \"delete\"]}"
    );
    // The same rules in another namespace are not held there.
    assert!(check_escalation(&rbac, &mgr, "Role", &ok, "elsewhere").is_err());
    // A namespace admin (aggregated `admin`) may grant what `admin` holds, but not nodes.
    let nsadmin = user("nsadmin", &[]);
    let edit_like = role(
        "t",
        "x",
        json!([{"apiGroups": [""], "resources": ["secrets"], "verbs": ["*"]}]),
    );
    assert!(
        check_escalation(&rbac, &nsadmin, "Role", &edit_like, "t").is_err(),
        "admin lacks secrets `*` (no impersonate etc.)"
    );
    let secrets_rw = role(
        "t",
        "x",
        json!([{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]}]),
    );
    assert!(check_escalation(&rbac, &nsadmin, "Role", &secrets_rw, "t").is_ok());
    // system:masters may grant anything.
    let root = user("root", &["system:masters"]);
    assert!(
        check_escalation(
            &rbac,
            &root,
            "ClusterRole",
            &cluster_role(
                "all",
                json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}])
            ),
            ""
        )
        .is_ok()
    );
}

#[test]
fn escalate_verb_and_aggregation_rule() {
    let rbac = view(
        vec![],
        vec![cluster_role(
            "escalator",
            json!([{"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"], "verbs": ["escalate", "create"]}]),
        )],
        vec![],
        vec![cluster_role_binding(
            "esc",
            "escalator",
            json!([subject("User", "esc")]),
        )],
    );
    let esc = user("esc", &[]);
    let big = cluster_role(
        "big",
        json!([{"apiGroups": [""], "resources": ["secrets"], "verbs": ["*"]}]),
    );
    assert!(check_escalation(&rbac, &esc, "ClusterRole", &big, "").is_ok());
    let plain = user("plain", &[]);
    let mut aggregating = cluster_role("agg", json!([]));
    aggregating["aggregationRule"] = json!({"clusterRoleSelectors": [{"matchLabels": {"x": "y"}}]});
    let error =
        check_escalation(&rbac, &plain, "ClusterRole", &aggregating, "").expect_err("denied");
    assert_eq!(
        error.message,
        "clusterroles.rbac.authorization.k8s.io \"agg\" is forbidden: must have cluster-admin privileges to use the aggregationRule"
    );
}

#[test]
fn escalation_bindings() {
    let mut rbac_roles = vec![cluster_role(
        "binder",
        json!([{"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"], "verbs": ["bind"], "resourceNames": ["cluster-admin"]}]),
    )];
    rbac_roles.push(cluster_role("noop", json!([])));
    let rbac = view(
        vec![role(
            "t",
            "secret-reader",
            json!([{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]),
        )],
        rbac_roles,
        vec![role_binding(
            "t",
            "admin",
            "ClusterRole",
            "admin",
            json!([subject("User", "nsadmin")]),
        )],
        vec![cluster_role_binding(
            "binder",
            "binder",
            json!([subject("User", "binder")]),
        )],
    );
    let nsadmin = user("nsadmin", &[]);
    let to_reader = role_binding(
        "t",
        "b",
        "Role",
        "secret-reader",
        json!([subject("User", "x")]),
    );
    assert!(check_escalation(&rbac, &nsadmin, "RoleBinding", &to_reader, "t").is_ok());
    let to_cluster_admin = role_binding(
        "t",
        "b",
        "ClusterRole",
        "cluster-admin",
        json!([subject("User", "x")]),
    );
    let error = check_escalation(&rbac, &nsadmin, "RoleBinding", &to_cluster_admin, "t")
        .expect_err("denied");
    assert!(
        error.message.starts_with(
            "rolebindings.rbac.authorization.k8s.io \"b\" is forbidden: user \"nsadmin\" (groups=[\"system:authenticated\"]) is attempting to grant RBAC permissions not currently held:\n"
        ),
        "{}",
        error.message
    );
    // The `bind` verb on exactly that role allows it without holding the permissions.
    let binder = user("binder", &[]);
    assert!(check_escalation(&rbac, &binder, "RoleBinding", &to_cluster_admin, "t").is_ok());
    let crb = cluster_role_binding("c", "cluster-admin", json!([subject("User", "x")]));
    assert!(check_escalation(&rbac, &binder, "ClusterRoleBinding", &crb, "").is_ok());
    let crb_admin = cluster_role_binding("c", "admin", json!([subject("User", "x")]));
    assert!(check_escalation(&rbac, &binder, "ClusterRoleBinding", &crb_admin, "").is_err());
    // An empty role grants nothing, so anyone may bind it.
    let nobody = user("nobody", &[]);
    let to_noop = cluster_role_binding("n", "noop", json!([subject("User", "x")]));
    assert!(check_escalation(&rbac, &nobody, "ClusterRoleBinding", &to_noop, "").is_ok());
    // A missing role is a 404 from the rule resolver.
    let to_missing = role_binding("t", "b", "Role", "ghost", json!([subject("User", "x")]));
    let error =
        check_escalation(&rbac, &nsadmin, "RoleBinding", &to_missing, "t").expect_err("404");
    assert_eq!(
        (error.code, error.message.as_str()),
        (404, r#"roles.rbac.authorization.k8s.io "ghost" not found"#)
    );
    // Updates touching only GC fields pass even for users who could not create the object.
    let mut with_owner = to_cluster_admin.clone();
    with_owner["metadata"]["ownerReferences"] = json!([{"name": "o"}]);
    with_owner["metadata"]["finalizers"] = json!(["f"]);
    assert!(
        check_escalation_update(
            &rbac,
            &nsadmin,
            "RoleBinding",
            &with_owner,
            &to_cluster_admin,
            "t"
        )
        .is_ok()
    );
    let mut more_subjects = to_cluster_admin.clone();
    more_subjects["subjects"] = json!([subject("User", "y")]);
    assert!(
        check_escalation_update(
            &rbac,
            &nsadmin,
            "RoleBinding",
            &more_subjects,
            &to_cluster_admin,
            "t"
        )
        .is_err()
    );
}

#[test]
fn covers_follows_upstream_rules() {
    let r = |v: Value| PolicyRule::from_value(&v);
    let owner = vec![r(
        json!({"apiGroups": [""], "resources": ["*/scale", "pods"], "verbs": ["get"]}),
    )];
    assert!(covers(&owner, &[r(json!({"apiGroups": [""], "resources": ["pods", "deployments/scale"], "verbs": ["get"]}))]).0);
    assert!(
        !covers(
            &owner,
            &[r(
                json!({"apiGroups": [""], "resources": ["deployments"], "verbs": ["get"]})
            )]
        )
        .0
    );
    // Owner restricted by name does not cover an unrestricted rule.
    let named = vec![r(
        json!({"apiGroups": [""], "resources": ["pods"], "resourceNames": ["a"], "verbs": ["get"]}),
    )];
    assert!(
        !covers(
            &named,
            &[r(
                json!({"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]})
            )]
        )
        .0
    );
    assert!(covers(&named, &[r(json!({"apiGroups": [""], "resources": ["pods"], "resourceNames": ["a"], "verbs": ["get"]}))]).0);
    let urls = vec![r(
        json!({"nonResourceURLs": ["/metrics*"], "verbs": ["get"]}),
    )];
    assert!(
        covers(
            &urls,
            &[r(
                json!({"nonResourceURLs": ["/metrics/cadvisor"], "verbs": ["get"]})
            )]
        )
        .0
    );
    let (ok, missing) = covers(
        &urls,
        &[r(
            json!({"nonResourceURLs": ["/logs"], "verbs": ["get", "post"]}),
        )],
    );
    assert!(!ok);
    assert_eq!(missing.len(), 2);
    assert_eq!(
        missing[0].compact_string(),
        r#"{NonResourceURLs:["/logs"], Verbs:["get"]}"#
    );
}

// ---- reviews ----

#[test]
fn access_reviews() {
    let rbac = tenant_rbac();
    let mgr = user("mgr", &[]);
    let review = json!({
        "kind": "SelfSubjectAccessReview", "apiVersion": "authorization.k8s.io/v1",
        "spec": {"resourceAttributes": {"namespace": "t", "verb": "create", "resource": "pods"}},
    });
    let answer = self_subject_access_review(&rbac, &mgr, &review).expect("valid");
    assert_eq!(
        answer["status"],
        json!({"allowed": true, "reason": "RBAC: allowed by RoleBinding \"m/t\" of Role \"manager\" to User \"mgr\""})
    );
    assert_eq!(answer["spec"], review["spec"]);
    assert_eq!(answer["kind"], "SelfSubjectAccessReview");
    let denied = json!({"spec": {"resourceAttributes": {"namespace": "u", "verb": "create", "resource": "pods"}}});
    assert_eq!(
        self_subject_access_review(&rbac, &mgr, &denied).expect("valid")["status"],
        json!({"allowed": false})
    );
    let url = json!({"spec": {"nonResourceAttributes": {"path": "/version", "verb": "get"}}});
    assert_eq!(
        self_subject_access_review(&rbac, &mgr, &url).expect("valid")["status"]["allowed"],
        true
    );
    let error = self_subject_access_review(&rbac, &mgr, &json!({"spec": {}})).expect_err("invalid");
    assert_eq!(error.code, 422);
    assert_eq!(
        error.message,
        "SelfSubjectAccessReview.authorization.k8s.io \"\" is invalid: spec.resourceAttributes: Required value: exactly one of nonResourceAttributes or resourceAttributes must be specified"
    );

    let sar = json!({"spec": {"user": "mgr", "groups": ["system:authenticated"], "resourceAttributes": {"namespace": "t", "verb": "list", "resource": "configmaps"}}});
    assert_eq!(
        subject_access_review(&rbac, &sar).expect("valid")["status"]["allowed"],
        true
    );
    assert_eq!(
        subject_access_review(&rbac, &json!({"spec": {"resourceAttributes": {}}}))
            .expect_err("invalid")
            .code,
        422
    );
    let lsar = json!({"spec": {"user": "mgr", "resourceAttributes": {"verb": "list", "resource": "configmaps"}}});
    let local = local_subject_access_review(&rbac, "t", &lsar).expect("valid");
    assert_eq!(
        (
            local["status"]["allowed"].clone(),
            local["spec"]["resourceAttributes"]["namespace"].clone()
        ),
        (json!(true), json!("t"))
    );
    assert_eq!(
        local_subject_access_review(&rbac, "u", &lsar).expect("valid")["status"]["allowed"],
        false
    );

    let rules = self_subject_rules_review(&rbac, &mgr, &json!({"spec": {"namespace": "t"}}))
        .expect("valid");
    let resource_rules = rules["status"]["resourceRules"].as_array().expect("rules");
    assert!(
        resource_rules
            .iter()
            .any(|r| r["resources"] == json!(["pods", "configmaps"]))
    );
    assert!(
        resource_rules
            .iter()
            .any(|r| r["resources"]
                == json!(["selfsubjectaccessreviews", "selfsubjectrulesreviews"]))
    );
    assert!(
        rules["status"]["nonResourceRules"]
            .as_array()
            .expect("rules")
            .iter()
            .any(|r| r["nonResourceURLs"]
                .as_array()
                .expect("urls")
                .contains(&json!("/api")))
    );
    assert_eq!(rules["status"]["incomplete"], false);

    let whoami = self_subject_review(&mgr);
    assert_eq!(
        whoami["status"]["userInfo"],
        json!({"username": "mgr", "groups": ["system:authenticated"]})
    );
}

// ---- tokens and authentication ----

const NOW: i64 = 1_800_000_000;

fn sa(ns: &str, name: &str, uid: &str) -> Value {
    json!({"metadata": {"namespace": ns, "name": name, "uid": uid}})
}

type SaTable = Arc<Mutex<Vec<(String, String, String)>>>;

fn authenticator(issuer: Arc<TokenIssuer>, table: SaTable) -> Authenticator {
    let lookup: ServiceAccountLookup = Arc::new(move |ns: &str, name: &str| {
        let table = table.lock().expect("lock");
        table
            .iter()
            .find(|(n, m, _)| n == ns && m == name)
            .map(|(_, _, uid)| uid.clone())
    });
    Authenticator::new("admin-secret-token", None, issuer, lookup)
}

fn bearer(token: &str) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(
        http::header::AUTHORIZATION,
        HeaderValue::from_str(&format!("Bearer {token}")).expect("header"),
    );
    headers
}

#[test]
fn token_request_defaults_and_validation() {
    let issuer = TokenIssuer::generate().expect("key");
    let response = token_request(
        &issuer,
        &sa("ns", "robot", "u-1"),
        &json!({"spec": {}}),
        NOW,
    )
    .expect("ok");
    assert_eq!(response["kind"], "TokenRequest");
    assert_eq!(response["apiVersion"], "authentication.k8s.io/v1");
    assert_eq!(response["spec"]["expirationSeconds"], 3600);
    assert_eq!(response["spec"]["audiences"], json!([DEFAULT_ISSUER]));
    assert_eq!(
        response["status"]["expirationTimestamp"],
        "2027-01-15T09:00:00Z"
    );
    let token = response["status"]["token"].as_str().expect("token");
    let claims = issuer.verify(token, NOW).expect("verifies");
    assert_eq!(
        (
            claims.namespace.as_str(),
            claims.name.as_str(),
            claims.uid.as_str()
        ),
        ("ns", "robot", "u-1")
    );
    assert_eq!(claims.expires, NOW + 3600);

    let long = token_request(
        &issuer,
        &sa("ns", "robot", "u-1"),
        &json!({"spec": {"expirationSeconds": 86400}}),
        NOW,
    )
    .expect("ok");
    assert_eq!(
        long["status"]["expirationTimestamp"],
        "2027-01-16T08:00:00Z"
    );
    let error = token_request(
        &issuer,
        &sa("ns", "robot", "u-1"),
        &json!({"spec": {"expirationSeconds": 599}}),
        NOW,
    )
    .expect_err("too short");
    assert_eq!(error.code, 422);
    assert_eq!(
        error.message,
        "TokenRequest.authentication.k8s.io \"robot\" is invalid: spec.expirationSeconds: Invalid value: 599: may not specify a duration less than 10 minutes"
    );
    let error = token_request(&issuer, &sa("ns", "robot", "u-1"), &json!({"spec": {"boundObjectRef": {"kind": "ConfigMap", "apiVersion": "v1", "name": "c"}}}), NOW).expect_err("bad kind");
    assert_eq!(
        (error.code, error.message.as_str()),
        (
            400,
            "cannot bind token to object of type /v1, Kind=ConfigMap"
        )
    );
}

/// A token of ServiceAccount `ns/robot` issued at `NOW` for ten minutes.
fn ten_minute_token(issuer: &TokenIssuer) -> String {
    let req = json!({"spec": {"expirationSeconds": 600}});
    token_request(issuer, &sa("ns", "robot", "u-1"), &req, NOW).expect("ok")["status"]["token"]
        .as_str()
        .expect("token")
        .to_owned()
}

#[test]
fn a_remembered_signature_still_has_its_claims_checked() {
    let issuer = TokenIssuer::generate().expect("key");
    let token = ten_minute_token(&issuer);
    assert!(issuer.verify(&token, NOW).is_ok());
    // The second time the signature is not checked again; expiry and the signed claims are.
    assert!(issuer.verify(&token, NOW).is_ok());
    assert_eq!(
        issuer.verify(&token, NOW + 600 + 61),
        Err(TokenError::Expired)
    );
    let (signed, signature) = token.rsplit_once('.').expect("three segments");
    let (header, _) = signed.split_once('.').expect("three segments");
    let forged_claims = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(
        json!({"iss": DEFAULT_ISSUER, "aud": [DEFAULT_ISSUER], "exp": NOW + 600, "kubernetes.io": {"namespace": "kube-system", "serviceaccount": {"name": "admin"}}}).to_string(),
    );
    assert_eq!(
        issuer.verify(&format!("{header}.{forged_claims}.{signature}"), NOW),
        Err(TokenError::BadSignature)
    );
}

#[test]
fn token_verification_failures() {
    let issuer = TokenIssuer::generate().expect("key");
    let other = TokenIssuer::generate().expect("key");
    let token = ten_minute_token(&issuer);
    // go-jose's one minute leeway.
    assert!(issuer.verify(&token, NOW + 600 + 60).is_ok());
    assert_eq!(
        issuer.verify(&token, NOW + 600 + 61),
        Err(TokenError::Expired)
    );
    assert_eq!(
        issuer.verify(&token, NOW - 61),
        Err(TokenError::NotYetValid)
    );
    assert_eq!(other.verify(&token, NOW), Err(TokenError::BadSignature));
    let mut tampered: Vec<&str> = token.split('.').collect();
    let forged_claims = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(json!({"iss": DEFAULT_ISSUER, "aud": [DEFAULT_ISSUER], "exp": NOW + 9999, "kubernetes.io": {"namespace": "kube-system", "serviceaccount": {"name": "admin"}}}).to_string());
    tampered[1] = &forged_claims;
    assert_eq!(
        issuer.verify(&tampered.join("."), NOW),
        Err(TokenError::BadSignature)
    );
    assert_eq!(issuer.verify("not-a-jwt", NOW), Err(TokenError::Malformed));
    let vault = token_request(
        &issuer,
        &sa("ns", "robot", "u-1"),
        &json!({"spec": {"audiences": ["vault"]}}),
        NOW,
    )
    .expect("ok");
    assert_eq!(
        issuer.verify(vault["status"]["token"].as_str().expect("token"), NOW),
        Err(TokenError::WrongAudience(vec!["vault".into()]))
    );
    // Keys never reach Debug output.
    let debug = format!("{issuer:?}");
    assert!(
        debug.contains("<redacted>") && !debug.contains("pkcs8"),
        "{debug}"
    );
    let jwks = issuer.jwks();
    assert_eq!(jwks["keys"][0]["alg"], "ES256");
    assert!(
        jwks.to_string().find("\"d\"").is_none(),
        "no private scalar in the JWKS"
    );
}

#[test]
fn service_account_tokens_authenticate_until_the_account_changes() {
    let issuer = Arc::new(TokenIssuer::generate().expect("key"));
    let table: SaTable = Arc::new(Mutex::new(vec![(
        "ns".into(),
        "robot".into(),
        "u-1".into(),
    )]));
    let auth = authenticator(issuer.clone(), table.clone());
    let response = token_request(&issuer, &sa("ns", "robot", "u-1"), &json!({}), NOW).expect("ok");
    let token = response["status"]["token"].as_str().expect("token");
    let who = auth
        .authenticate_at(&bearer(token), None, NOW + 10)
        .expect("authenticates");
    assert_eq!(who.username, "system:serviceaccount:ns:robot");
    assert_eq!(who.uid, "u-1");
    assert_eq!(
        who.groups,
        [
            "system:serviceaccounts",
            "system:serviceaccounts:ns",
            "system:authenticated"
        ]
    );
    assert!(who.extra["authentication.kubernetes.io/credential-id"][0].starts_with("JTI="));
    // Expired.
    let error = auth
        .authenticate_at(&bearer(token), None, NOW + 3600 + 61)
        .expect_err("expired");
    assert_eq!(
        (error.code, error.to_status()),
        (
            401,
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": "Unauthorized", "reason": "Unauthorized", "code": 401})
        )
    );
    // Re-created with another uid.
    table.lock().expect("lock")[0].2 = "u-2".into();
    assert_eq!(
        auth.authenticate_at(&bearer(token), None, NOW)
            .expect_err("stale uid")
            .code,
        401
    );
    // Deleted.
    table.lock().expect("lock").clear();
    assert_eq!(
        auth.authenticate_at(&bearer(token), None, NOW)
            .expect_err("deleted")
            .code,
        401
    );
}

#[test]
fn bound_tokens_die_with_their_pod() {
    let issuer = Arc::new(TokenIssuer::generate().expect("key"));
    let table: SaTable = Arc::new(Mutex::new(vec![(
        "ns".into(),
        "robot".into(),
        "u-1".into(),
    )]));
    let pods: Arc<Mutex<Vec<(String, String)>>> =
        Arc::new(Mutex::new(vec![("web".into(), "pod-uid".into())]));
    let pods_lookup = pods.clone();
    let auth = authenticator(issuer.clone(), table).with_bound_object_lookup(Arc::new(
        move |kind, _ns, name| {
            (kind == "Pod")
                .then(|| {
                    pods_lookup
                        .lock()
                        .expect("lock")
                        .iter()
                        .find(|(n, _)| n == name)
                        .map(|(_, u)| u.clone())
                })
                .flatten()
        },
    ));
    let pod = json!({"metadata": {"name": "web", "uid": "pod-uid"}, "spec": {"serviceAccountName": "robot", "nodeName": "node-1"}});
    let req =
        json!({"spec": {"boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "web"}}});
    let response =
        token_request_bound(&issuer, &sa("ns", "robot", "u-1"), &req, Some(&pod), NOW).expect("ok");
    assert_eq!(response["spec"]["boundObjectRef"]["uid"], "pod-uid");
    let token = response["status"]["token"].as_str().expect("token");
    let who = auth.authenticate_at(&bearer(token), None, NOW).expect("ok");
    assert_eq!(who.extra["authentication.kubernetes.io/pod-name"], ["web"]);
    assert_eq!(
        who.extra["authentication.kubernetes.io/node-name"],
        ["node-1"]
    );
    pods.lock().expect("lock").clear();
    assert_eq!(
        auth.authenticate_at(&bearer(token), None, NOW)
            .expect_err("pod gone")
            .code,
        401
    );
    // A pod running as another ServiceAccount cannot be bound.
    let error = token_request_bound(&issuer, &sa("ns", "other", "u-9"), &req, Some(&pod), NOW)
        .expect_err("wrong sa");
    assert_eq!(error.code, 400);
}

#[test]
fn admin_static_certificate_and_anonymous_identities() {
    let issuer = Arc::new(TokenIssuer::generate().expect("key"));
    let table: SaTable = Arc::default();
    let ca = crate::tls::CertAuthority::generate("c").expect("ca");
    let lookup: ServiceAccountLookup = Arc::new(move |_: &str, _: &str| {
        let _ = &table;
        None
    });
    let auth = Authenticator::new(
        "admin-secret-token",
        Some(&ca),
        issuer.clone(),
        lookup.clone(),
    )
    .with_static_token("static-1", user("carol", &["ops"]));
    let admin = auth
        .authenticate(&bearer("admin-secret-token"), None)
        .expect("admin");
    assert_eq!(
        admin,
        UserInfo {
            username: "admin".into(),
            groups: vec!["system:masters".into(), "system:authenticated".into()],
            ..UserInfo::default()
        }
    );
    assert_eq!(
        auth.authenticate(&bearer("static-1"), None)
            .expect("static")
            .groups,
        ["ops", "system:authenticated"]
    );
    let mut lower = HeaderMap::new();
    lower.insert(
        http::header::AUTHORIZATION,
        HeaderValue::from_static("bearer admin-secret-token"),
    );
    assert_eq!(
        auth.authenticate(&lower, None)
            .expect("case-insensitive scheme")
            .username,
        "admin"
    );
    for bad in [
        "admin-secret-toke",
        "admin-secret-token2",
        "eyJhbGciOiJFUzI1NiJ9.e30.AAAA",
    ] {
        assert_eq!(
            auth.authenticate(&bearer(bad), None).expect_err("bad").code,
            401,
            "{bad}"
        );
    }
    let peer = crate::tls::ClientIdentity {
        common_name: "dave".into(),
        organizations: vec!["tenants".into(), "x".into()],
    };
    let who = auth
        .authenticate(&HeaderMap::new(), Some(&peer))
        .expect("cert");
    assert_eq!(
        (who.username.as_str(), who.groups.clone()),
        (
            "dave",
            vec![
                "tenants".to_owned(),
                "x".into(),
                "system:authenticated".into()
            ]
        )
    );
    // A certificate wins over a (bad) token, as the x509 authenticator runs first.
    assert_eq!(
        auth.authenticate(&bearer("bogus"), Some(&peer))
            .expect("cert first")
            .username,
        "dave"
    );
    // Without a CA configured, certificate identities are not trusted.
    let no_certs = Authenticator::new("admin-secret-token", None, issuer.clone(), lookup.clone());
    assert_eq!(
        no_certs
            .authenticate(&HeaderMap::new(), Some(&peer))
            .expect("anon")
            .username,
        "system:anonymous"
    );
    // No credentials: anonymous, or 401 when anonymous auth is off.
    let anon = auth
        .authenticate(&HeaderMap::new(), None)
        .expect("anonymous");
    assert_eq!(anon, UserInfo::anonymous());
    assert_eq!(anon.groups, ["system:unauthenticated"]);
    let strict =
        Authenticator::new("admin-secret-token", None, issuer, lookup).with_anonymous(false);
    assert_eq!(
        strict
            .authenticate(&HeaderMap::new(), None)
            .expect_err("401")
            .code,
        401
    );
    // WebSocket clients may send the token as a subprotocol.
    let mut ws = HeaderMap::new();
    let encoded = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode("admin-secret-token");
    ws.insert(
        http::header::SEC_WEBSOCKET_PROTOCOL,
        HeaderValue::from_str(&format!(
            "v5.channel.k8s.io, base64url.bearer.authorization.k8s.io.{encoded}"
        ))
        .expect("header"),
    );
    assert_eq!(
        strict.authenticate(&ws, None).expect("ws token").username,
        "admin"
    );
    // The admin token never reaches Debug output.
    assert!(!format!("{auth:?}").contains("admin-secret-token"));
}

#[test]
fn cached_cluster_roles_follow_resource_versions() {
    let stored = |rv: &str, verbs: Value| {
        let mut roles = default_cluster_roles();
        for (i, r) in roles.iter_mut().enumerate() {
            r["metadata"]["uid"] = json!(format!("cache-test-{i}"));
            r["metadata"]["resourceVersion"] = json!("1");
        }
        roles.push(json!({
            "metadata": {
                "name": "extra-view", "uid": "cache-test-extra", "resourceVersion": rv,
                "labels": {"rbac.authorization.k8s.io/aggregate-to-view": "true"},
            },
            "rules": [{"apiGroups": ["example.com"], "resources": ["widgets"], "verbs": verbs}],
        }));
        let binding = role_binding(
            "ns",
            "v",
            "ClusterRole",
            "view",
            json!([subject("User", "u")]),
        );
        RbacView::new(
            vec![],
            roles,
            vec![binding],
            default_cluster_role_bindings(),
        )
    };
    let u = user("u", &[]);
    let list = attrs(&u, "list", "example.com", "widgets", "ns", "");
    assert!(authorize(&stored("10", json!(["list"])), &list).is_ok());
    // Same fingerprint again: served from the cache, same answer.
    assert!(authorize(&stored("10", json!(["list"])), &list).is_ok());
    // An update (new resourceVersion) is seen through the aggregated `view`.
    assert!(authorize(&stored("11", json!(["get"])), &list).is_err());
}

fn impersonation_headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for (k, v) in pairs {
        headers.append(
            http::header::HeaderName::from_bytes(k.as_bytes()).expect("name"),
            HeaderValue::from_str(v).expect("value"),
        );
    }
    headers
}

#[test]
fn impersonation_needs_the_impersonate_verb() {
    let rbac = view(
        vec![],
        vec![
            cluster_role(
                "impersonate-bob",
                json!([
                    {"apiGroups": [""], "resources": ["users"], "resourceNames": ["bob"], "verbs": ["impersonate"]},
                    {"apiGroups": [""], "resources": ["groups"], "resourceNames": ["devs"], "verbs": ["impersonate"]},
                    {"apiGroups": ["authentication.k8s.io"], "resources": ["userextras/scopes"], "verbs": ["impersonate"]},
                ]),
            ),
            cluster_role(
                "impersonate-robot",
                json!([
                    {"apiGroups": [""], "resources": ["serviceaccounts"], "verbs": ["impersonate"]},
                ]),
            ),
        ],
        vec![role_binding(
            "t",
            "robots",
            "ClusterRole",
            "impersonate-robot",
            json!([subject("User", "alice")]),
        )],
        vec![cluster_role_binding(
            "alice-bob",
            "impersonate-bob",
            json!([subject("User", "alice")]),
        )],
    );
    let alice = user("alice", &[]);
    assert_eq!(
        impersonate(Some(&rbac), &alice, &HeaderMap::new()).expect("none"),
        None
    );
    let as_bob = impersonation_headers(&[
        ("Impersonate-User", "bob"),
        ("Impersonate-Group", "devs"),
        ("Impersonate-Extra-Scopes", "read"),
    ]);
    let bob = impersonate(Some(&rbac), &alice, &as_bob)
        .expect("allowed")
        .expect("some");
    assert_eq!(bob.username, "bob");
    assert_eq!(bob.groups, ["devs", "system:authenticated"]);
    assert_eq!(bob.extra["scopes"], ["read"]);
    let error = impersonate(
        Some(&rbac),
        &alice,
        &impersonation_headers(&[("Impersonate-User", "carol")]),
    )
    .expect_err("denied");
    assert_eq!(
        (error.code, error.message.as_str()),
        (
            403,
            r#"users "carol" is forbidden: User "alice" cannot impersonate resource "users" in API group "" at the cluster scope"#
        )
    );
    let error = impersonate(
        Some(&rbac),
        &alice,
        &impersonation_headers(&[
            ("Impersonate-User", "bob"),
            ("Impersonate-Group", "system:masters"),
        ]),
    )
    .expect_err("denied");
    assert!(
        error
            .message
            .starts_with(r#"groups "system:masters" is forbidden"#),
        "{}",
        error.message
    );
    // ServiceAccounts are impersonated per namespace.
    let robot = impersonate(
        Some(&rbac),
        &alice,
        &impersonation_headers(&[("Impersonate-User", "system:serviceaccount:t:robot")]),
    )
    .expect("allowed")
    .expect("some");
    assert_eq!(
        robot.groups,
        [
            "system:serviceaccounts",
            "system:serviceaccounts:t",
            "system:authenticated"
        ]
    );
    let error = impersonate(
        Some(&rbac),
        &alice,
        &impersonation_headers(&[(
            "Impersonate-User",
            "system:serviceaccount:kube-system:admin",
        )]),
    )
    .expect_err("denied");
    assert_eq!(
        error.message,
        r#"serviceaccounts "admin" is forbidden: User "alice" cannot impersonate resource "serviceaccounts" in API group "" in the namespace "kube-system""#
    );
    // Groups without a user are a bad request; without RBAC anything goes.
    let groups_only = impersonation_headers(&[("Impersonate-Group", "devs")]);
    assert_eq!(
        impersonate(Some(&rbac), &alice, &groups_only)
            .expect_err("400")
            .code,
        400
    );
    let anyone = impersonate(
        None,
        &alice,
        &impersonation_headers(&[("Impersonate-User", "system:anonymous")]),
    )
    .expect("no rbac")
    .expect("some");
    assert_eq!(anyone.groups, ["system:unauthenticated"]);
}

#[test]
fn token_reviews() {
    let issuer = Arc::new(TokenIssuer::generate().expect("key"));
    let table: SaTable = Arc::new(Mutex::new(vec![(
        "ns".into(),
        "robot".into(),
        "u-1".into(),
    )]));
    let auth = authenticator(issuer.clone(), table);
    let review = |token: &str, audiences: Value| {
        auth.token_review_at(
            &json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token, "audiences": audiences}}),
            NOW,
        )
    };
    let api = token_request(&issuer, &sa("ns", "robot", "u-1"), &json!({}), NOW).expect("ok");
    let api = api["status"]["token"].as_str().expect("token");
    let answer = review(api, json!([]));
    assert_eq!(answer["status"]["authenticated"], true, "{answer}");
    assert_eq!(
        answer["status"]["user"]["username"],
        "system:serviceaccount:ns:robot"
    );
    assert_eq!(answer["status"]["user"]["uid"], "u-1");
    assert_eq!(answer["status"]["audiences"], json!([DEFAULT_ISSUER]));
    // A token minted for another audience only passes a review naming that audience.
    let vault = token_request(
        &issuer,
        &sa("ns", "robot", "u-1"),
        &json!({"spec": {"audiences": ["vault"]}}),
        NOW,
    )
    .expect("ok");
    let vault = vault["status"]["token"].as_str().expect("token");
    assert_eq!(review(vault, json!([]))["status"]["authenticated"], false);
    let answer = review(vault, json!(["vault", "other"]));
    assert_eq!(
        (
            answer["status"]["authenticated"].clone(),
            answer["status"]["audiences"].clone()
        ),
        (json!(true), json!(["vault"]))
    );
    assert_eq!(
        review(api, json!(["vault"]))["status"]["authenticated"],
        false
    );
    let answer = review("garbage", json!([]));
    assert_eq!(answer["status"]["authenticated"], false);
    assert_eq!(
        answer["status"]["error"],
        "[invalid bearer token, malformed token]"
    );
    assert_eq!(
        review("admin-secret-token", json!([]))["status"]["user"]["groups"],
        json!(["system:masters", "system:authenticated"])
    );
}

#[test]
fn websocket_exec_needs_create_as_well_as_get() {
    let rbac = view(
        vec![
            role(
                "ns",
                "peek",
                json!([{"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["get"]}]),
            ),
            role(
                "ns",
                "shell",
                json!([{"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["get", "create"]}]),
            ),
        ],
        vec![],
        vec![
            role_binding(
                "ns",
                "peek",
                "Role",
                "peek",
                json!([subject("User", "peeker")]),
            ),
            role_binding(
                "ns",
                "shell",
                "Role",
                "shell",
                json!([subject("User", "sheller")]),
            ),
        ],
        vec![],
    );
    let peeker = user("peeker", &[]);
    assert_eq!(
        message(authorize(
            &rbac,
            &attrs(&peeker, "get", "", "pods/exec", "ns", "p")
        )),
        r#"pods "p" is forbidden: User "peeker" cannot create resource "pods/exec" in API group "" in the namespace "ns""#
    );
    let sheller = user("sheller", &[]);
    assert!(authorize(&rbac, &attrs(&sheller, "get", "", "pods/exec", "ns", "p")).is_ok());
    assert!(
        authorize(
            &rbac,
            &attrs(&sheller, "create", "", "pods/exec", "ns", "p")
        )
        .is_ok()
    );
    // The review API reports the single check asked about.
    assert!(decide(&rbac, &attrs(&peeker, "get", "", "pods/exec", "ns", "p")).allowed);
}

mod properties {
    use proptest::prelude::*;

    use super::*;

    fn pick(options: &'static [&'static str]) -> impl Strategy<Value = Vec<String>> {
        proptest::sample::subsequence(options, 1..=options.len().min(2))
            .prop_map(|v| v.into_iter().map(str::to_owned).collect())
    }

    fn rule() -> impl Strategy<Value = PolicyRule> {
        let resource_rule = (
            pick(&["get", "list", "create", "*"]),
            pick(&["", "apps", "*"]),
            pick(&[
                "pods",
                "pods/log",
                "deployments",
                "deployments/scale",
                "*/scale",
                "*",
            ]),
            prop_oneof![Just(Vec::new()), pick(&["a", "b"])],
        )
            .prop_map(
                |(verbs, api_groups, resources, resource_names)| PolicyRule {
                    verbs,
                    api_groups,
                    resources,
                    resource_names,
                    ..PolicyRule::default()
                },
            );
        let url_rule = (
            pick(&["get", "post", "*"]),
            pick(&["/healthz", "/logs/*", "/logs/x", "*"]),
        )
            .prop_map(|(verbs, non_resource_urls)| PolicyRule {
                verbs,
                non_resource_urls,
                ..PolicyRule::default()
            });
        prop_oneof![3 => resource_rule, 1 => url_rule]
    }

    /// Every request in the small vocabulary the rules above talk about.
    fn requests() -> Vec<RequestAttributes> {
        let u = UserInfo::authenticated("u", &[]);
        let mut out = Vec::new();
        for verb in ["get", "list", "create", "delete"] {
            for group in ["", "apps", "batch"] {
                for resource in [
                    "pods",
                    "pods/log",
                    "deployments",
                    "deployments/scale",
                    "jobs/scale",
                ] {
                    for name in ["", "a", "b", "c"] {
                        out.push(attrs(&u, verb, group, resource, "ns", name));
                    }
                }
            }
            for path in ["/healthz", "/logs/x", "/logs/y", "/other"] {
                out.push(url(&u, verb, path));
            }
        }
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Escalation checks are sound: whatever `covers` says the owner holds, the owner's
        /// rules really allow every request the granted rule allows.
        #[test]
        fn covered_rules_grant_nothing_new(owner in proptest::collection::vec(rule(), 1..4), wanted in rule()) {
            let (covered, _) = covers(&owner, std::slice::from_ref(&wanted));
            if covered {
                for request in requests() {
                    if wanted.allows(&request) {
                        prop_assert!(
                            owner.iter().any(|o| o.allows(&request)),
                            "{wanted:?} allows {request:?} but {owner:?} does not"
                        );
                    }
                }
            }
        }

        /// A rule and its breakdown into single-verb, single-resource rules allow the same.
        #[test]
        fn breakdown_preserves_meaning(r in rule()) {
            let parts = breakdown_rule(&r);
            for request in requests() {
                prop_assert_eq!(r.allows(&request), parts.iter().any(|p| p.allows(&request)), "{:?}", request);
            }
        }

        /// A rule always covers itself, so anyone may grant exactly what they hold.
        #[test]
        fn rules_cover_themselves(r in rule()) {
            prop_assert!(covers(std::slice::from_ref(&r), std::slice::from_ref(&r)).0);
        }
    }
}
