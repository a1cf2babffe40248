//! Server-side apply and managed-fields bookkeeping.

use k8s_openapi::api::apps::v1::Deployment;
use serde_json::{Value, json};

use super::super::*;
use crate::registry::{Origin, ResourceType};

const T0: &str = "2026-01-01T00:00:00Z";
const T1: &str = "2026-01-01T00:01:00Z";

fn builtin(group: &str, kind: &str) -> ResourceType {
    crate::registry::builtins()
        .into_iter()
        .find(|t| t.group == group && t.kind == kind)
        .expect("built-in type")
}

fn widget(schema: Value) -> ResourceType {
    let mut rt = builtin("", "ConfigMap");
    rt.group = "example.com".into();
    rt.kind = "Widget".into();
    rt.plural = "widgets".into();
    rt.singular = "widget".into();
    rt.list_kind = "WidgetList".into();
    rt.schema = Some(schema);
    rt.origin = Origin::Crd {
        name: "widgets.example.com".into(),
    };
    rt
}

fn cm(data: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "d"}, "data": data})
}

fn entries(obj: &Value) -> Vec<Value> {
    obj["metadata"]["managedFields"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn entry<'a>(obj: &'a Value, manager: &str) -> Option<&'a Value> {
    obj["metadata"]["managedFields"]
        .as_array()
        .and_then(|es| es.iter().find(|e| e["manager"] == manager))
}

fn apply(
    live: Option<&Value>,
    cfg: &Value,
    mgr: &str,
    force: bool,
    rt: &ResourceType,
) -> Result<Value, ApiError> {
    server_side_apply(live, cfg, mgr, force, T1, rt)
}

#[test]
fn apply_creates_and_records_fields_v1() {
    let rt = builtin("", "ConfigMap");
    let cfg = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "c", "namespace": "d", "labels": {"app": "x"}},
        "data": {"a": "1"}
    });
    let got = server_side_apply(None, &cfg, "mgr", false, T0, &rt).unwrap();
    assert_eq!(got["data"], json!({"a": "1"}));
    assert_eq!(got["metadata"]["labels"], json!({"app": "x"}));
    assert_eq!(
        entries(&got),
        vec![json!({
            "manager": "mgr",
            "operation": "Apply",
            "apiVersion": "v1",
            "time": T0,
            "fieldsType": "FieldsV1",
            "fieldsV1": {"f:data": {"f:a": {}}, "f:metadata": {"f:labels": {"f:app": {}}}}
        })]
    );
}

#[test]
fn reapply_without_a_field_removes_it_unless_someone_else_owns_it() {
    let rt = builtin("", "ConfigMap");
    let one = apply(
        None,
        &cm(json!({"a": "1", "b": "2", "c": "3"})),
        "m",
        false,
        &rt,
    )
    .unwrap();
    let two = apply(Some(&one), &cm(json!({"c": "3"})), "other", false, &rt).unwrap();
    let three = apply(Some(&two), &cm(json!({"a": "1"})), "m", false, &rt).unwrap();
    // b was only m's: removed. c is also owned by "other": kept.
    assert_eq!(three["data"], json!({"a": "1", "c": "3"}));
    assert_eq!(
        entry(&three, "m").unwrap()["fieldsV1"],
        json!({"f:data": {"f:a": {}}})
    );
    assert_eq!(
        entry(&three, "other").unwrap()["fieldsV1"],
        json!({"f:data": {"f:c": {}}})
    );
    // dropping every field of a struct drops the struct (labels here)
    let lab = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "labels": {"x": "1"}}});
    let with = apply(Some(&three), &lab, "m", false, &rt).unwrap();
    assert_eq!(with["metadata"]["labels"], json!({"x": "1"}));
    assert_eq!(with["data"], json!({"c": "3"}));
    let bare = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}});
    let without = apply(Some(&with), &bare, "m", false, &rt).unwrap();
    assert!(without["metadata"].get("labels").is_none(), "{without}");
    assert_eq!(without["metadata"]["name"], "c");
    assert!(
        entry(&without, "m").is_none(),
        "an applier owning nothing has no entry"
    );
}

#[test]
fn managers_on_different_fields_coexist_and_same_values_are_shared() {
    let rt = builtin("", "ConfigMap");
    let one = apply(None, &cm(json!({"a": "1"})), "m1", false, &rt).unwrap();
    let two = apply(Some(&one), &cm(json!({"b": "2"})), "m2", false, &rt).unwrap();
    assert_eq!(two["data"], json!({"a": "1", "b": "2"}));
    // same value: no conflict, both own it
    let three = apply(
        Some(&two),
        &cm(json!({"a": "1", "b": "2"})),
        "m1",
        false,
        &rt,
    )
    .unwrap();
    assert_eq!(
        entry(&three, "m1").unwrap()["fieldsV1"],
        json!({"f:data": {"f:a": {}, "f:b": {}}})
    );
    assert_eq!(
        entry(&three, "m2").unwrap()["fieldsV1"],
        json!({"f:data": {"f:b": {}}})
    );
}

#[test]
fn conflicting_apply_is_409_and_force_moves_ownership() {
    let rt = builtin("", "ConfigMap");
    let one = apply(None, &cm(json!({"k": "a", "j": "a"})), "first", false, &rt).unwrap();
    let err = apply(Some(&one), &cm(json!({"k": "b"})), "second", false, &rt).unwrap_err();
    assert_eq!((err.code, err.reason.as_str()), (409, "Conflict"));
    assert_eq!(
        err.message,
        "Apply failed with 1 conflict: conflict with \"first\": .data.k"
    );
    assert_eq!(
        err.to_status()["details"],
        json!({"causes": [{"reason": "FieldManagerConflict", "message": "conflict with \"first\"", "field": ".data.k"}]})
    );
    let err = apply(
        Some(&one),
        &cm(json!({"k": "b", "j": "b"})),
        "second",
        false,
        &rt,
    )
    .unwrap_err();
    assert_eq!(
        err.message,
        "Apply failed with 2 conflicts: conflicts with \"first\":\n- .data.j\n- .data.k"
    );

    let forced = apply(Some(&one), &cm(json!({"k": "b"})), "second", true, &rt).unwrap();
    assert_eq!(forced["data"], json!({"k": "b", "j": "a"}));
    assert_eq!(
        entry(&forced, "first").unwrap()["fieldsV1"],
        json!({"f:data": {"f:j": {}}})
    );
    assert_eq!(
        entry(&forced, "second").unwrap()["fieldsV1"],
        json!({"f:data": {"f:k": {}}})
    );
    // the previous owner now conflicts in turn
    let err = apply(
        Some(&forced),
        &cm(json!({"k": "a", "j": "a"})),
        "first",
        false,
        &rt,
    )
    .unwrap_err();
    assert_eq!(
        err.message,
        "Apply failed with 1 conflict: conflict with \"second\": .data.k"
    );
}

fn deployment(containers: Value, replicas: Option<i64>) -> Value {
    let mut d = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "d"},
        "spec": {
            "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": containers}}
        }
    });
    if let Some(r) = replicas {
        d["spec"]["replicas"] = json!(r);
    }
    d
}

#[test]
fn keyed_list_items_merge_by_key_and_are_owned_per_key() {
    let rt = builtin("apps", "Deployment");
    let a = apply(
        None,
        &deployment(json!([{"name": "app", "image": "app:1"}]), Some(2)),
        "a",
        false,
        &rt,
    )
    .unwrap();
    let b = apply(
        Some(&a),
        &deployment(
            json!([{"name": "sidecar", "image": "proxy:1", "env": [{"name": "X", "value": "1"}]}]),
            None,
        ),
        "b",
        false,
        &rt,
    )
    .unwrap();
    let names: Vec<&str> = b["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["app", "sidecar"]);
    assert_eq!(b["spec"]["replicas"], 2);
    assert_eq!(
        entry(&b, "b").unwrap()["fieldsV1"],
        json!({
            "f:spec": {
                "f:selector": {},
                "f:template": {
                    "f:metadata": {"f:labels": {"f:app": {}}},
                    "f:spec": {"f:containers": {"k:{\"name\":\"sidecar\"}": {
                        ".": {},
                        "f:env": {"k:{\"name\":\"X\"}": {".": {}, "f:name": {}, "f:value": {}}},
                        "f:image": {},
                        "f:name": {}
                    }}}
                }
            }
        })
    );
    // b changing a's container image conflicts on that path
    let err = apply(
        Some(&b),
        &deployment(json!([{"name": "app", "image": "app:2"}]), None),
        "b",
        false,
        &rt,
    )
    .unwrap_err();
    assert_eq!(
        err.message,
        "Apply failed with 1 conflict: conflict with \"a\": .spec.template.spec.containers[name=\"app\"].image"
    );
    // a dropping its container removes it; b's stays
    let a2 = apply(Some(&b), &deployment(json!([]), Some(3)), "a", false, &rt).unwrap();
    let names: Vec<&str> = a2["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["sidecar"]);
    assert_eq!(a2["spec"]["replicas"], 3);
}

#[test]
fn update_managers_conflict_with_appliers() {
    let rt = builtin("apps", "Deployment");
    let mut created = deployment(json!([{"name": "app", "image": "app:1"}]), Some(3));
    update_managed_fields(None, &mut created, "kubectl-create", "Update", T0);
    let upd = entry(&created, "kubectl-create").unwrap().clone();
    assert_eq!(upd["operation"], "Update");
    assert_eq!(upd["apiVersion"], "apps/v1");
    assert_eq!(upd["time"], T0);
    assert_eq!(upd["fieldsV1"]["f:spec"]["f:replicas"], json!({}));
    assert_eq!(
        upd["fieldsV1"]["f:spec"]["f:template"]["f:metadata"]["f:labels"],
        json!({".": {}, "f:app": {}})
    );
    assert_eq!(
        upd["fieldsV1"]["f:spec"]["f:template"]["f:spec"]["f:containers"]["k:{\"name\":\"app\"}"],
        json!({".": {}, "f:image": {}, "f:name": {}})
    );

    let err = apply(
        Some(&created),
        &deployment(json!([{"name": "app", "image": "app:1"}]), Some(5)),
        "ctrl",
        false,
        &rt,
    )
    .unwrap_err();
    assert_eq!(
        err.message,
        "Apply failed with 1 conflict: conflict with \"kubectl-create\" using apps/v1: .spec.replicas"
    );

    // an edit by another updater takes the field from the first one
    let mut edited = created.clone();
    edited["spec"]["replicas"] = json!(4);
    update_managed_fields(Some(&created), &mut edited, "kubectl-edit", "Update", T1);
    assert_eq!(
        entry(&edited, "kubectl-edit").unwrap()["fieldsV1"],
        json!({"f:spec": {"f:replicas": {}}})
    );
    assert!(
        entry(&edited, "kubectl-create").unwrap()["fieldsV1"]["f:spec"]
            .get("f:replicas")
            .is_none()
    );
    // a write that changes nothing leaves the entries alone
    let mut same = edited.clone();
    update_managed_fields(Some(&edited), &mut same, "noop", "Update", T1);
    assert_eq!(same, edited);
}

#[test]
fn update_keeps_managed_fields_the_client_did_not_send_and_resets_on_request() {
    let mut created = cm(json!({"a": "1"}));
    update_managed_fields(None, &mut created, "creator", "Update", T0);
    // a PUT without managedFields keeps the stored ones
    let mut put = cm(json!({"a": "1", "b": "2"}));
    update_managed_fields(Some(&created), &mut put, "writer", "Update", T1);
    assert!(entry(&put, "creator").is_some());
    assert_eq!(
        entry(&put, "writer").unwrap()["fieldsV1"],
        json!({"f:data": {"f:b": {}}})
    );
    // managedFields: [{}] resets them, and the write that clears them is not recorded even
    // though it changes a field
    let mut reset = cm(json!({"a": "1", "b": "3"}));
    reset["metadata"]["managedFields"] = json!([{}]);
    update_managed_fields(Some(&put), &mut reset, "writer", "Update", T1);
    assert!(reset["metadata"].get("managedFields").is_none(), "{reset}");
    // nor is a later update of the untracked object, of the main resource or of a subresource
    let mut later = cm(json!({"a": "2", "b": "3"}));
    update_managed_fields(Some(&reset), &mut later, "other", "Update", T1);
    assert!(later["metadata"].get("managedFields").is_none(), "{later}");
    let rt = builtin("", "ConfigMap");
    let mut sub = cm(json!({"a": "2", "b": "3"}));
    update_managed_fields_with(
        Some(&later),
        &mut sub,
        "k",
        "Update",
        T1,
        Some(&rt),
        Some("status"),
    );
    assert!(sub["metadata"].get("managedFields").is_none(), "{sub}");
    // a create is recorded whatever the client sent
    let mut created = cm(json!({"a": "1"}));
    created["metadata"]["managedFields"] = json!([{}]);
    update_managed_fields(None, &mut created, "creator", "Update", T0);
    assert!(entry(&created, "creator").is_some(), "{created}");
}

#[test]
fn managed_fields_deserialize_as_kube_types() {
    let rt = builtin("apps", "Deployment");
    let mut created = deployment(
        json!([{"name": "app", "image": "app:1", "ports": [{"containerPort": 80, "protocol": "TCP"}]}]),
        Some(1),
    );
    update_managed_fields(None, &mut created, "kubectl-create", "Update", T0);
    let applied = apply(
        Some(&created),
        &deployment(json!([{"name": "app", "image": "app:1"}]), Some(1)),
        "ctrl",
        false,
        &rt,
    )
    .unwrap();
    let typed: Deployment = serde_json::from_value(applied).expect("valid Deployment");
    let mf = typed.metadata.managed_fields.expect("managedFields");
    assert_eq!(mf.len(), 2);
    assert_eq!(mf[0].manager.as_deref(), Some("ctrl"));
    assert_eq!(mf[0].operation.as_deref(), Some("Apply"));
    assert_eq!(mf[0].fields_type.as_deref(), Some("FieldsV1"));
    assert!(mf[0].time.is_some());
    assert_eq!(mf[1].manager.as_deref(), Some("kubectl-create"));
    let ports = &mf[1].fields_v1.as_ref().unwrap().0["f:spec"]["f:template"]["f:spec"]["f:containers"]
        ["k:{\"name\":\"app\"}"]["f:ports"];
    assert_eq!(
        ports,
        &json!({".": {}, "k:{\"containerPort\":80,\"protocol\":\"TCP\"}": {".": {}, "f:containerPort": {}, "f:protocol": {}}})
    );
}

#[test]
fn crd_list_types_come_from_the_schema() {
    let rt = widget(json!({
        "type": "object",
        "properties": {
            "spec": {"type": "object", "properties": {
                "items": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["id"],
                          "items": {"type": "object", "properties": {"id": {"type": "string"}, "v": {"type": "integer"}}}},
                "tags": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}},
                "plain": {"type": "array", "items": {"type": "string"}},
                "extra": {"type": "object", "additionalProperties": {"type": "string"}}
            }}
        }
    }));
    let w = |spec: Value| json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": spec});
    let one = apply(None, &w(json!({"items": [{"id": "a", "v": 1}], "tags": ["x"], "plain": ["p"], "extra": {"k": "v"}})), "m1", false, &rt).unwrap();
    let two = apply(
        Some(&one),
        &w(json!({"items": [{"id": "b", "v": 2}], "tags": ["y"], "plain": ["q"]})),
        "m2",
        true,
        &rt,
    )
    .unwrap();
    assert_eq!(
        two["spec"]["items"],
        json!([{"id": "a", "v": 1}, {"id": "b", "v": 2}])
    );
    assert_eq!(two["spec"]["tags"], json!(["x", "y"]));
    assert_eq!(
        two["spec"]["plain"],
        json!(["q"]),
        "atomic lists are replaced"
    );
    assert_eq!(
        entry(&one, "m1").unwrap()["fieldsV1"],
        json!({"f:spec": {
            "f:extra": {"f:k": {}},
            "f:items": {"k:{\"id\":\"a\"}": {".": {}, "f:id": {}, "f:v": {}}},
            "f:plain": {},
            "f:tags": {"v:\"x\"": {}}
        }})
    );
    // m2 took the atomic list by force
    assert!(
        entry(&two, "m1").unwrap()["fieldsV1"]["f:spec"]
            .get("f:plain")
            .is_none()
    );
    // a CR without a schema is owned as untyped maps
    let untyped = apply(
        None,
        &w(json!({"a": {"b": 1}})),
        "m",
        false,
        &widget(Value::Null),
    )
    .unwrap();
    assert_eq!(untyped["spec"], json!({"a": {"b": 1}}));
}

#[test]
fn status_is_not_owned_through_the_main_resource() {
    let rt = builtin("", "Pod");
    let cfg = json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": "i"}]},
        "status": {"phase": "Running"}
    });
    let got = apply(None, &cfg, "m", false, &rt).unwrap();
    assert!(
        entry(&got, "m").unwrap()["fieldsV1"]
            .get("f:status")
            .is_none()
    );
    let status_cfg = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "status": {"phase": "Running"}});
    let st = server_side_apply_with(ApplyRequest {
        live: Some(&got),
        applied: &status_cfg,
        manager: "kubelet",
        force: false,
        now: T1,
        rt: &rt,
        subresource: Some("status"),
    })
    .unwrap();
    let e = entry(&st, "kubelet").unwrap();
    assert_eq!(e["subresource"], "status");
    assert_eq!(e["fieldsV1"], json!({"f:status": {"f:phase": {}}}));

    // a main-resource apply carrying a different status neither conflicts nor changes it
    let mut main_cfg = cfg;
    main_cfg["status"] = json!({"phase": "Failed"});
    let again = apply(Some(&st), &main_cfg, "m", false, &rt).unwrap();
    assert_eq!(again["status"], json!({"phase": "Running"}));
    assert!(entry(&again, "kubelet").is_some());
}

#[test]
fn apply_validates_the_configuration() {
    let rt = builtin("", "ConfigMap");
    let wrong_version = json!({"apiVersion": "v2", "kind": "ConfigMap", "metadata": {"name": "c"}});
    let err = apply(None, &wrong_version, "m", false, &rt).unwrap_err();
    assert_eq!(
        (err.code, err.message.as_str()),
        (
            400,
            "Incorrect version specified in apply patch. Specified patch version: v2, expected: v1"
        )
    );
    let with_mf = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "managedFields": []}});
    assert_eq!(
        apply(None, &with_mf, "m", false, &rt).unwrap_err().message,
        "metadata.managedFields must be nil"
    );
    let wrong_kind = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "c"}});
    assert_eq!(
        apply(None, &wrong_kind, "m", false, &rt).unwrap_err().code,
        400
    );
}

#[test]
fn a_no_op_apply_keeps_the_object_and_its_time() {
    let rt = builtin("", "ConfigMap");
    let one = server_side_apply(None, &cm(json!({"a": "1"})), "m", false, T0, &rt).unwrap();
    let again = server_side_apply(Some(&one), &cm(json!({"a": "1"})), "m", false, T1, &rt).unwrap();
    assert_eq!(again, one);
}

#[test]
fn fieldsets_round_trip_through_fields_v1() {
    let v = json!({
        "f:metadata": {"f:labels": {".": {}, "f:a": {}}},
        "f:spec": {"f:containers": {"k:{\"name\":\"c\"}": {".": {}, "f:image": {}}}, "f:tags": {"v:\"x\"": {}}, "f:l": {"i:0": {}}}
    });
    let set = FieldSet::from_fields_v1(&v).unwrap();
    let back = set.to_fields_v1();
    assert_eq!(FieldSet::from_fields_v1(&back).unwrap(), set);
    let paths: Vec<String> = set.paths().iter().map(ToString::to_string).collect();
    assert!(
        paths.contains(&".spec.containers[name=\"c\"].image".to_owned()),
        "{paths:?}"
    );
    assert!(
        paths.contains(&".spec.tags[=\"x\"]".to_owned()),
        "{paths:?}"
    );
    assert!(paths.contains(&".metadata.labels".to_owned()), "{paths:?}");
    assert!(FieldSet::from_fields_v1(&json!({"x:bad": {}})).is_err());
}

#[test]
fn map_list_keys_take_schema_defaults() {
    let rt = builtin("apps", "Deployment");
    let port = |p: Value| deployment(json!([{"name": "app", "image": "i", "ports": p}]), None);
    let mut live = apply(None, &port(json!([{"containerPort": 80}])), "a", false, &rt).unwrap();
    // the server defaults the protocol after apply
    live["spec"]["template"]["spec"]["containers"][0]["ports"][0]["protocol"] = json!("TCP");
    let again = apply(
        Some(&live),
        &port(json!([{"containerPort": 80, "name": "http"}])),
        "a",
        false,
        &rt,
    )
    .unwrap();
    assert_eq!(
        again["spec"]["template"]["spec"]["containers"][0]["ports"],
        json!([{"containerPort": 80, "protocol": "TCP", "name": "http"}]),
        "one element: the applied port without protocol is the live TCP port"
    );
    let ports = &entry(&again, "a").unwrap()["fieldsV1"]["f:spec"]["f:template"]["f:spec"]["f:containers"]
        ["k:{\"name\":\"app\"}"]["f:ports"];
    assert_eq!(
        ports,
        &json!({"k:{\"containerPort\":80,\"protocol\":\"TCP\"}": {".": {}, "f:containerPort": {}, "f:name": {}}})
    );
}

mod properties {
    use std::collections::BTreeMap;

    use proptest::prelude::*;
    use serde_json::{Value, json};

    use super::{T0, T1, builtin, cm};
    use crate::patch::server_side_apply;

    fn data() -> impl Strategy<Value = BTreeMap<String, String>> {
        prop::collection::btree_map("[a-e]", "[x-z]", 0..5)
    }

    proptest! {
        #[test]
        fn a_sole_applier_gets_exactly_its_configuration(first in data(), second in data()) {
            let rt = builtin("", "ConfigMap");
            let one = server_side_apply(None, &cm(json!(first)), "m", false, T0, &rt).unwrap();
            let two = server_side_apply(Some(&one), &cm(json!(second)), "m", false, T1, &rt).unwrap();
            let got = two.get("data").cloned().unwrap_or(Value::Null);
            if second.is_empty() {
                // `data: {}` is itself owned and stays as an empty map
                prop_assert_eq!(got, json!({}));
            } else {
                prop_assert_eq!(got, json!(second));
            }
            // applying the same configuration again changes nothing
            let three = server_side_apply(Some(&two), &cm(json!(second)), "m", false, "2027-01-01T00:00:00Z", &rt).unwrap();
            prop_assert_eq!(three, two);
        }

        #[test]
        fn disjoint_appliers_never_conflict_and_keep_their_own(a in data(), b in data()) {
            let rt = builtin("", "ConfigMap");
            let b: BTreeMap<String, String> = b.into_iter().map(|(k, v)| (format!("b{k}"), v)).collect();
            let one = server_side_apply(None, &cm(json!(a)), "ma", false, T0, &rt).unwrap();
            let two = server_side_apply(Some(&one), &cm(json!(b)), "mb", false, T1, &rt).unwrap();
            let mut both = a.clone();
            both.extend(b.clone());
            if !both.is_empty() {
                prop_assert_eq!(&two["data"], &json!(both));
            }
            // ma dropping everything leaves exactly mb's keys
            let three = server_side_apply(Some(&two), &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "d"}}), "ma", false, T1, &rt).unwrap();
            let left = three.get("data").cloned().unwrap_or(json!({}));
            if b.is_empty() && !a.is_empty() {
                prop_assert_eq!(left, json!({}));
            } else if !b.is_empty() {
                prop_assert_eq!(left, json!(b));
            }
        }
    }
}

mod list_properties {
    use proptest::prelude::*;
    use serde_json::{Value, json};

    use super::{T0, T1, builtin, deployment};
    use crate::patch::server_side_apply;

    fn containers() -> impl Strategy<Value = Vec<(String, String)>> {
        prop::collection::vec(("[a-e]", "[0-3]"), 0..6)
    }

    fn names(v: &Value) -> Vec<String> {
        v["spec"]["template"]["spec"]["containers"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|c| c["name"].as_str().unwrap_or("").to_owned())
                    .collect()
            })
            .unwrap_or_default()
    }

    fn unique(list: Vec<(String, String)>) -> Vec<(String, String)> {
        let mut seen = Vec::new();
        list.into_iter()
            .filter(|(n, _)| {
                let fresh = !seen.contains(n);
                seen.push(n.clone());
                fresh
            })
            .collect()
    }

    proptest! {
        /// Two appliers' keyed lists merge: every item of each appears once, the second
        /// applier's items keep its order, and the images are the last applier's.
        #[test]
        fn keyed_lists_merge_without_loss_or_duplicates(a in containers(), b in containers()) {
            let (a, b) = (unique(a), unique(b));
            let rt = builtin("apps", "Deployment");
            let list = |l: &[(String, String)]| {
                Value::Array(l.iter().map(|(n, i)| json!({"name": n, "image": i})).collect())
            };
            let one = server_side_apply(None, &deployment(list(&a), None), "a", false, T0, &rt).unwrap();
            let two = server_side_apply(Some(&one), &deployment(list(&b), None), "b", true, T1, &rt).unwrap();
            let got = names(&two);
            let mut want: Vec<String> = a.iter().map(|(n, _)| n.clone()).collect();
            for (n, _) in &b {
                if !want.contains(n) {
                    want.push(n.clone());
                }
            }
            let mut sorted_got = got.clone();
            sorted_got.sort();
            want.sort();
            prop_assert_eq!(sorted_got, want);
            let b_names: Vec<&String> = b.iter().map(|(n, _)| n).collect();
            let b_order: Vec<&String> = got.iter().filter(|n| b_names.contains(n)).collect();
            prop_assert_eq!(b_order, b_names);
            for c in two["spec"]["template"]["spec"]["containers"].as_array().into_iter().flatten() {
                if let Some((_, img)) = b.iter().find(|(n, _)| c["name"] == n.as_str()) {
                    prop_assert_eq!(&c["image"], &json!(img));
                }
            }
        }
    }
}

#[test]
fn fields_v1_orders_keys_like_structured_merge_diff() {
    let mut set = FieldSet::new();
    for port in [443, 80, 8080] {
        set.insert(&[
            PathElement::Field("ports".into()),
            PathElement::key(&[
                ("port".into(), json!(port)),
                ("protocol".into(), json!("TCP")),
            ]),
        ]);
    }
    set.insert(&[
        PathElement::Field("ports".into()),
        PathElement::Field("zz".into()),
    ]);
    let keys: Vec<String> = set.to_fields_v1()["f:ports"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    assert_eq!(
        keys,
        [
            "f:zz",
            "k:{\"port\":80,\"protocol\":\"TCP\"}",
            "k:{\"port\":443,\"protocol\":\"TCP\"}",
            "k:{\"port\":8080,\"protocol\":\"TCP\"}"
        ]
    );
}

#[test]
fn more_than_ten_updaters_fold_into_ancient_changes() {
    let mut obj = cm(json!({}));
    for i in 0..12 {
        let mut next = obj.clone();
        next["data"][format!("k{i}")] = json!("v");
        // The first write creates the object: an update would not start tracking it.
        update_managed_fields(
            (i > 0).then_some(&obj),
            &mut next,
            &format!("writer-{i:02}"),
            "Update",
            &format!("2026-01-01T00:00:{i:02}Z"),
        );
        obj = next;
    }
    let managers: Vec<String> = entries(&obj)
        .iter()
        .map(|e| e["manager"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(managers.len(), 10, "{managers:?}");
    assert_eq!(managers[0], "ancient-changes");
    assert_eq!(managers[9], "writer-11");
    let ancient = entry(&obj, "ancient-changes").unwrap();
    assert_eq!(
        ancient["fieldsV1"],
        json!({"f:data": {".": {}, "f:k0": {}, "f:k1": {}, "f:k2": {}}})
    );
    assert_eq!(ancient["time"], "2026-01-01T00:00:02Z");
}

#[test]
fn applying_to_an_unmanaged_object_conflicts_with_before_first_apply() {
    let rt = builtin("", "ConfigMap");
    let unmanaged = cm(json!({"a": "1"}));
    let err = apply(Some(&unmanaged), &cm(json!({"a": "2"})), "m", false, &rt).unwrap_err();
    assert_eq!(
        err.message,
        "Apply failed with 1 conflict: conflict with \"before-first-apply\" using v1: .data.a"
    );
    let same = apply(
        Some(&unmanaged),
        &cm(json!({"a": "1", "b": "2"})),
        "m",
        false,
        &rt,
    )
    .unwrap();
    assert_eq!(
        entry(&same, "before-first-apply").unwrap()["fieldsV1"],
        json!({"f:data": {".": {}, "f:a": {}}})
    );
    assert_eq!(
        entry(&same, "m").unwrap()["fieldsV1"],
        json!({"f:data": {"f:a": {}, "f:b": {}}})
    );
}
