//! Strategic merge patch: table-driven cases, including the shapes `kubectl patch` and
//! client-side `kubectl apply` send.

use serde_json::{Value, json};

use super::super::strategic_merge_patch;

fn pod(containers: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": containers}})
}

/// (name, apiVersion, kind, original, patch, expected)
type Case = (
    &'static str,
    &'static str,
    &'static str,
    Value,
    Value,
    Value,
);

fn cases() -> Vec<Case> {
    vec![
        (
            "containers merge by name; other containers stay",
            "v1",
            "Pod",
            pod(json!([{"name": "a", "image": "a1"}, {"name": "b", "image": "b1"}])),
            json!({"spec": {"containers": [{"name": "b", "image": "b2"}]}}),
            pod(json!([{"name": "a", "image": "a1"}, {"name": "b", "image": "b2"}])),
        ),
        (
            // upstream puts patch items not in the live list before the live-only ones
            "a new container comes first, as upstream orders it",
            "v1",
            "Pod",
            pod(json!([{"name": "a", "image": "a1"}, {"name": "b", "image": "b1"}])),
            json!({"spec": {"containers": [{"name": "c", "image": "c1"}]}}),
            pod(
                json!([{"name": "c", "image": "c1"}, {"name": "a", "image": "a1"}, {"name": "b", "image": "b1"}]),
            ),
        ),
        (
            "env by name, ports by containerPort, volumeMounts by mountPath",
            "v1",
            "Pod",
            pod(json!([{
                "name": "a",
                "env": [{"name": "X", "value": "1"}, {"name": "Y", "value": "2"}],
                "ports": [{"containerPort": 80, "name": "http"}],
                "volumeMounts": [{"mountPath": "/a", "name": "va"}]
            }])),
            json!({"spec": {"containers": [{
                "name": "a",
                "env": [{"name": "Y", "value": "3"}],
                "ports": [{"containerPort": 80, "protocol": "TCP"}, {"containerPort": 443}],
                "volumeMounts": [{"mountPath": "/a", "readOnly": true}]
            }]}}),
            pod(json!([{
                "name": "a",
                "env": [{"name": "X", "value": "1"}, {"name": "Y", "value": "3"}],
                "ports": [{"containerPort": 80, "name": "http", "protocol": "TCP"}, {"containerPort": 443}],
                "volumeMounts": [{"mountPath": "/a", "name": "va", "readOnly": true}]
            }])),
        ),
        (
            "$patch: delete removes a keyed element",
            "v1",
            "Pod",
            pod(json!([{"name": "a"}, {"name": "b"}])),
            json!({"spec": {"containers": [{"name": "a", "$patch": "delete"}]}}),
            pod(json!([{"name": "b"}])),
        ),
        (
            "$patch: replace in a list makes the rest of the patch the list",
            "v1",
            "Pod",
            pod(json!([{"name": "a", "image": "x"}, {"name": "b"}])),
            json!({"spec": {"containers": [{"$patch": "replace"}, {"name": "c"}]}}),
            pod(json!([{"name": "c"}])),
        ),
        (
            "$patch: replace on a map replaces it",
            "v1",
            "ConfigMap",
            json!({"metadata": {"name": "c", "labels": {"a": "1", "b": "2"}}}),
            json!({"metadata": {"labels": {"$patch": "replace", "z": "9"}}}),
            json!({"metadata": {"name": "c", "labels": {"z": "9"}}}),
        ),
        (
            "$patch: delete on a map empties it",
            "v1",
            "Pod",
            json!({"spec": {"securityContext": {"runAsUser": 1}, "containers": []}}),
            json!({"spec": {"securityContext": {"$patch": "delete"}}}),
            json!({"spec": {"securityContext": {}, "containers": []}}),
        ),
        (
            "tolerations have no merge key: replaced",
            "v1",
            "Pod",
            json!({"spec": {"tolerations": [{"key": "a"}, {"key": "b"}]}}),
            json!({"spec": {"tolerations": [{"key": "c"}]}}),
            json!({"spec": {"tolerations": [{"key": "c"}]}}),
        ),
        (
            "finalizers merge as a set of scalars",
            "v1",
            "ConfigMap",
            json!({"metadata": {"finalizers": ["a", "b"]}}),
            json!({"metadata": {"finalizers": ["b", "c"]}}),
            json!({"metadata": {"finalizers": ["a", "b", "c"]}}),
        ),
        (
            "$deleteFromPrimitiveList removes scalars",
            "v1",
            "ConfigMap",
            json!({"metadata": {"finalizers": ["a", "b", "c"]}}),
            json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["a", "c", "zz"]}}),
            json!({"metadata": {"finalizers": ["b"]}}),
        ),
        (
            "ownerReferences merge by uid",
            "v1",
            "ConfigMap",
            json!({"metadata": {"ownerReferences": [{"uid": "1", "name": "x"}]}}),
            json!({"metadata": {"ownerReferences": [{"uid": "1", "controller": true}, {"uid": "2", "name": "y"}]}}),
            json!({"metadata": {"ownerReferences": [{"uid": "1", "name": "x", "controller": true}, {"uid": "2", "name": "y"}]}}),
        ),
        (
            "status conditions merge by type",
            "v1",
            "Pod",
            json!({"status": {"conditions": [{"type": "Ready", "status": "False"}, {"type": "Initialized", "status": "True"}]}}),
            json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}}),
            json!({"status": {"conditions": [{"type": "Ready", "status": "True"}, {"type": "Initialized", "status": "True"}]}}),
        ),
        (
            "container statuses have no merge key: replaced",
            "v1",
            "Pod",
            json!({"status": {"containerStatuses": [{"name": "a", "ready": false}, {"name": "b"}]}}),
            json!({"status": {"containerStatuses": [{"name": "a", "ready": true}]}}),
            json!({"status": {"containerStatuses": [{"name": "a", "ready": true}]}}),
        ),
        (
            "kubectl apply: $setElementOrder reorders the merged list",
            "apps/v1",
            "Deployment",
            json!({"spec": {"template": {"spec": {"containers": [{"name": "a", "image": "a1"}, {"name": "b", "image": "b1"}]}}}}),
            json!({"spec": {"template": {"spec": {
                "$setElementOrder/containers": [{"name": "b"}, {"name": "a"}],
                "containers": [{"name": "a", "image": "a2"}]
            }}}}),
            json!({"spec": {"template": {"spec": {"containers": [{"name": "b", "image": "b1"}, {"name": "a", "image": "a2"}]}}}}),
        ),
        (
            "kubectl apply: removing a container",
            "apps/v1",
            "Deployment",
            json!({"spec": {"template": {"spec": {"containers": [{"name": "a"}, {"name": "b"}]}}}}),
            json!({"spec": {"template": {"spec": {
                "$setElementOrder/containers": [{"name": "a"}],
                "containers": [{"$patch": "delete", "name": "b"}]
            }}}}),
            json!({"spec": {"template": {"spec": {"containers": [{"name": "a"}]}}}}),
        ),
        (
            "kubectl apply: $retainKeys drops the other union members",
            "apps/v1",
            "Deployment",
            json!({"spec": {"replicas": 2, "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1}}}}),
            json!({"spec": {"strategy": {"$retainKeys": ["type"], "rollingUpdate": null, "type": "Recreate"}}}),
            json!({"spec": {"replicas": 2, "strategy": {"type": "Recreate"}}}),
        ),
        (
            "kubectl apply: $retainKeys in a volume switches its source",
            "v1",
            "Pod",
            json!({"spec": {"volumes": [{"name": "v", "emptyDir": {}}, {"name": "w", "emptyDir": {}}]}}),
            json!({"spec": {"volumes": [{"$retainKeys": ["configMap", "name"], "name": "v", "configMap": {"name": "cm"}}]}}),
            json!({"spec": {"volumes": [{"name": "v", "configMap": {"name": "cm"}}, {"name": "w", "emptyDir": {}}]}}),
        ),
        (
            "kubectl apply: annotation update and label removal",
            "v1",
            "ConfigMap",
            json!({"metadata": {"name": "c", "labels": {"a": "1", "b": "2"}, "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}"}}, "data": {"k": "v", "old": "x"}}),
            json!({
                "data": {"k": "v2", "old": null},
                "metadata": {"annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{\"data\":{\"k\":\"v2\"}}"}, "labels": {"b": null}}
            }),
            json!({"metadata": {"name": "c", "labels": {"a": "1"}, "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{\"data\":{\"k\":\"v2\"}}"}}, "data": {"k": "v2"}}),
        ),
        (
            "service ports merge by port, ordered by $setElementOrder",
            "v1",
            "Service",
            json!({"spec": {"ports": [{"port": 80, "targetPort": 8080}, {"port": 443, "targetPort": 8443}]}}),
            json!({"spec": {"$setElementOrder/ports": [{"port": 443}, {"port": 80}], "ports": [{"port": 443, "targetPort": 9443}]}}),
            json!({"spec": {"ports": [{"port": 443, "targetPort": 9443}, {"port": 80, "targetPort": 8080}]}}),
        ),
        (
            "node addresses and conditions by type, podCIDRs as a set, taints replaced",
            "v1",
            "Node",
            json!({"spec": {"podCIDRs": ["10.0.0.0/24"], "taints": [{"key": "a", "effect": "NoSchedule"}]},
                   "status": {"addresses": [{"type": "InternalIP", "address": "1.1.1.1"}, {"type": "Hostname", "address": "n"}]}}),
            json!({"spec": {"podCIDRs": ["fd00::/64"], "taints": [{"key": "b", "effect": "NoSchedule"}]},
                   "status": {"addresses": [{"type": "InternalIP", "address": "2.2.2.2"}]}}),
            json!({"spec": {"podCIDRs": ["fd00::/64", "10.0.0.0/24"], "taints": [{"key": "b", "effect": "NoSchedule"}]},
                   "status": {"addresses": [{"type": "InternalIP", "address": "2.2.2.2"}, {"type": "Hostname", "address": "n"}]}}),
        ),
        (
            "service account secrets merge by name",
            "v1",
            "ServiceAccount",
            json!({"secrets": [{"name": "a"}]}),
            json!({"secrets": [{"name": "b"}]}),
            json!({"secrets": [{"name": "b"}, {"name": "a"}]}),
        ),
        (
            "RBAC rules are replaced",
            "rbac.authorization.k8s.io/v1",
            "Role",
            json!({"rules": [{"verbs": ["get"], "resources": ["pods"]}]}),
            json!({"rules": [{"verbs": ["list"], "resources": ["pods"]}]}),
            json!({"rules": [{"verbs": ["list"], "resources": ["pods"]}]}),
        ),
        (
            "a value of another type replaces; nulls in it go",
            "v1",
            "ConfigMap",
            json!({"data": "oops"}),
            json!({"data": {"a": "1", "b": null}}),
            json!({"data": {"a": "1"}}),
        ),
        (
            "job conditions merge by type in SMP",
            "batch/v1",
            "Job",
            json!({"status": {"conditions": [{"type": "Complete", "status": "False"}, {"type": "Failed", "status": "False"}]}}),
            json!({"status": {"conditions": [{"type": "Failed", "status": "True"}]}}),
            json!({"status": {"conditions": [{"type": "Complete", "status": "False"}, {"type": "Failed", "status": "True"}]}}),
        ),
    ]
}

#[test]
fn strategic_merge_patch_table() {
    for (name, av, kind, original, patch, want) in cases() {
        let got = strategic_merge_patch(&original, &patch, av, kind)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(got, want, "{name}");
    }
}

#[test]
fn strategic_merge_patch_rejects_custom_resources_with_415() {
    let err = strategic_merge_patch(
        &json!({}),
        &json!({}),
        "core.tether.dev/v1alpha1",
        "ForeignCluster",
    )
    .unwrap_err();
    assert_eq!(err.code, 415);
    assert_eq!(err.reason, "UnsupportedMediaType");
    assert_eq!(
        err.message,
        "the body of the request was in an unknown format - accepted media types include: \
         application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"
    );
    // a CRD in a *.k8s.io group that the API server does not serve itself is still a CR
    let gw = strategic_merge_patch(
        &json!({}),
        &json!({}),
        "gateway.networking.k8s.io/v1",
        "Gateway",
    );
    assert_eq!(gw.unwrap_err().code, 415);
}

#[test]
fn strategic_merge_patch_errors() {
    let p = pod(json!([{"name": "a"}]));
    let cases: Vec<(Value, u16, &str)> = vec![
        (
            json!([1]),
            400,
            "json: cannot unmarshal array into Go value of type map[string]interface {}",
        ),
        (
            json!({"spec": {"containers": [{"image": "x"}]}}),
            500,
            "map: map[image:x] does not contain declared merge key: name",
        ),
        (
            json!({"spec": {"containers": [{"$patch": "merge"}]}}),
            500,
            "merging lists cannot yet be specified in the patch",
        ),
        (
            json!({"spec": {"$patch": "frob"}}),
            500,
            "unknown patch type: frob in map: map[$patch:frob]",
        ),
        (
            json!({"spec": {"$retainKeys": "x"}}),
            400,
            "invalid patch format of retainKeys",
        ),
        (
            json!({"spec": {"$retainKeys": ["a"], "b": 1}}),
            400,
            "invalid patch format of retainKeys",
        ),
        (
            json!({"spec": {"containers": [[1]]}}),
            500,
            "list element types are not identical: [map[name:a] [1]]",
        ),
        (
            json!({"spec": {"$setElementOrder/containers": [{"name": "a"}], "containers": [{"name": "a"}, {"name": "b"}]}}),
            500,
            "The order in patch list:",
        ),
    ];
    for (patch, code, msg) in cases {
        let err = strategic_merge_patch(&p, &patch, "v1", "Pod").unwrap_err();
        assert_eq!(err.code, code, "{patch}");
        assert!(err.message.starts_with(msg), "{patch}: {}", err.message);
    }
}

#[test]
fn strategic_merge_patch_refuses_lists_of_lists_with_422() {
    let err = strategic_merge_patch(
        &pod(json!([])),
        &json!({"spec": {"containers": [[1]]}}),
        "v1",
        "Pod",
    )
    .unwrap_err();
    assert_eq!(err.code, 422);
    assert_eq!(
        err.message,
        "the server rejected our request due to an error in our request"
    );
}

#[test]
fn strategic_merge_patch_does_not_modify_its_input() {
    let original = pod(json!([{"name": "a", "image": "a1"}]));
    let copy = original.clone();
    let _ = strategic_merge_patch(
        &original,
        &json!({"spec": {"containers": [{"name": "a", "image": "z"}]}}),
        "v1",
        "Pod",
    );
    assert_eq!(original, copy);
}

mod properties {
    use proptest::prelude::*;
    use serde_json::{Map, Value, json};

    use super::super::super::{merge_patch, strategic_merge_patch};

    /// Objects of scalars and nested objects, no lists (where SMP and merge patch differ on
    /// purpose), keys without directives.
    fn tree(nulls: bool) -> impl Strategy<Value = Value> {
        let leaf = if nulls {
            prop_oneof![
                Just(Value::Null),
                "[a-c]".prop_map(Value::String),
                (0i64..3).prop_map(|n| json!(n))
            ]
            .boxed()
        } else {
            prop_oneof![
                "[a-c]".prop_map(Value::String),
                (0i64..3).prop_map(|n| json!(n))
            ]
            .boxed()
        };
        leaf.prop_recursive(3, 20, 4, |inner| {
            prop::collection::btree_map("[a-d]", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect::<Map<String, Value>>()))
        })
    }

    proptest! {
        #[test]
        fn without_lists_strategic_merge_is_a_merge_patch(
            data in tree(false),
            patch in tree(true),
        ) {
            let original = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": data});
            let patch = json!({"data": patch});
            let mut want = original.clone();
            merge_patch(&mut want, &patch);
            let got = strategic_merge_patch(&original, &patch, "v1", "ConfigMap").unwrap();
            prop_assert_eq!(got, want);
        }
    }
}

#[test]
fn strategic_merge_patch_result_has_no_nulls_or_directives() {
    let got = strategic_merge_patch(
        &pod(json!([{"name": "a"}])),
        &json!({"spec": {
            "containers": [{"name": "b", "image": null, "env": [{"name": "X", "value": null}],
                            "$setElementOrder/env": [{"name": "X"}]}],
            "tolerations": [{"key": "k", "value": null}]
        }}),
        "v1",
        "Pod",
    )
    .unwrap();
    assert_eq!(
        got["spec"],
        json!({
            "containers": [{"name": "b", "env": [{"name": "X"}]}, {"name": "a"}],
            "tolerations": [{"key": "k"}]
        })
    );
}
