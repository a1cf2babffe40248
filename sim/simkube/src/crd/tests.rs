//! Tests of CRD validation and of the structural schema: pruning, defaulting and validation of custom resources.

use expect_test::{Expect, expect};
use proptest::prelude::*;

use super::*;

fn crd() -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "scope": "Namespaced",
            "names": {"plural": "widgets", "kind": "Widget", "shortNames": ["wd"], "categories": ["all"]},
            "versions": [
                {"name": "v1", "served": true, "storage": true,
                 "schema": {"openAPIV3Schema": schema()},
                 "subresources": {"status": {}, "scale": {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas"}},
                 "additionalPrinterColumns": [{"name": "Replicas", "type": "integer", "jsonPath": ".spec.replicas"}],
                 "selectableFields": [{"jsonPath": ".spec.color"}]},
                {"name": "v1beta1", "served": true, "storage": false,
                 "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}},
                {"name": "v1alpha1", "served": false, "storage": false,
                 "schema": {"openAPIV3Schema": {"type": "object"}}},
            ],
        },
    })
}

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "required": ["color"],
                "properties": {
                    "replicas": {"type": "integer", "minimum": 1, "maximum": 10, "default": 1},
                    "color": {"type": "string", "enum": ["red", "green"]},
                    "code": {"type": "string", "pattern": "^[0-9]+$", "minLength": 2, "maxLength": 4},
                    "port": {"x-kubernetes-int-or-string": true},
                    "when": {"type": "string", "format": "date-time"},
                    "ratio": {"type": "number", "nullable": true},
                    "mode": {"type": "string", "default": "auto"},
                    "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                    "items": {"type": "array", "maxItems": 2, "items": {
                        "type": "object", "required": ["name"],
                        "properties": {"name": {"type": "string"}, "weight": {"type": "integer", "default": 5}}}},
                    "tags": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}},
                    "raw": {"type": "object", "x-kubernetes-preserve-unknown-fields": true,
                            "properties": {"known": {"type": "object", "properties": {"a": {"type": "string"}}}}},
                    "template": {"type": "object", "x-kubernetes-embedded-resource": true,
                                 "properties": {"spec": {"type": "object", "properties": {"x": {"type": "string"}}}}},
                },
            },
            "status": {"type": "object", "properties": {"replicas": {"type": "integer"}}},
        },
    })
}

fn rt() -> ResourceType {
    types_from_crd(&crd()).expect("valid CRD").remove(0)
}

fn check_invalid(mut obj: Value, expect: Expect) {
    let err = prune_default_validate(&rt(), &mut obj).expect_err("must be invalid");
    assert_eq!((err.code, err.reason.as_str()), (422, "Invalid"));
    expect.assert_eq(&err.message);
}

#[test]
fn types_from_crd_serves_each_served_version() {
    let types = types_from_crd(&crd()).expect("valid");
    let versions: Vec<(&str, bool)> = types
        .iter()
        .map(|t| (t.version.as_str(), t.storage))
        .collect();
    assert_eq!(versions, [("v1", true), ("v1beta1", false)]);
    let v1 = &types[0];
    assert_eq!(
        (
            v1.plural.as_str(),
            v1.singular.as_str(),
            v1.list_kind.as_str()
        ),
        ("widgets", "widget", "WidgetList")
    );
    assert!(v1.namespaced);
    assert_eq!(v1.subresources, ["status", "scale"]);
    assert_eq!(v1.short_names, ["wd"]);
    assert_eq!(v1.categories, ["all"]);
    assert_eq!(v1.selectable_fields, ["spec.color"]);
    assert_eq!(v1.printer_columns.len(), 1);
    assert_eq!(
        v1.origin,
        Origin::Crd {
            name: "widgets.example.com".into()
        }
    );
    // Without additionalPrinterColumns the real server shows AGE.
    let beta = &types[1];
    assert_eq!(
        beta.printer_columns
            .iter()
            .map(|c| (c.name.as_str(), c.type_.as_str(), c.json_path.as_str()))
            .collect::<Vec<_>>(),
        [("Age", "date", ".metadata.creationTimestamp")]
    );
    assert!(beta.subresources.is_empty());
}

#[test]
fn accept_establishes_and_keeps_transition_times() {
    let mut c = crd();
    assert!(!crd_status_conditions_established(&c));
    accept_at(&mut c, "2025-01-01T00:00:00Z");
    assert!(crd_status_conditions_established(&c));
    assert_eq!(c["status"]["acceptedNames"]["listKind"], "WidgetList");
    assert_eq!(c["status"]["storedVersions"], json!(["v1"]));
    assert_eq!(c["spec"]["conversion"]["strategy"], "None");
    accept_at(&mut c, "2025-02-02T00:00:00Z");
    let times: Vec<&str> = c["status"]["conditions"]
        .as_array()
        .expect("conditions")
        .iter()
        .map(|x| x["lastTransitionTime"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(times, ["2025-01-01T00:00:00Z", "2025-01-01T00:00:00Z"]);
    // A new storage version is appended to storedVersions, never replacing the old one.
    c["spec"]["versions"][0]["storage"] = json!(false);
    c["spec"]["versions"][1]["storage"] = json!(true);
    accept_at(&mut c, "2025-03-03T00:00:00Z");
    assert_eq!(c["status"]["storedVersions"], json!(["v1", "v1beta1"]));
    // The condition shape is what kube-runtime's is_crd_established reads.
    let typed: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition =
        serde_json::from_value(c).expect("typed CRD");
    use kube::runtime::wait::Condition as _;
    assert!(kube::runtime::wait::conditions::is_crd_established().matches_object(Some(&typed)));
}

fn crd_error(mutate: impl FnOnce(&mut Value)) -> String {
    let mut c = crd();
    mutate(&mut c);
    validate_crd(&c)
        .map(|()| "valid".to_owned())
        .unwrap_or_else(|e| e.message)
}

#[test]
fn invalid_crds_are_rejected_with_the_real_messages() {
    let cases = [
        crd_error(|_| {}),
        crd_error(|c| c["metadata"]["name"] = json!("widget.example.com")),
        crd_error(|c| {
            c["spec"]["names"]
                .as_object_mut()
                .expect("names")
                .remove("plural");
        }),
        crd_error(|c| {
            c["spec"]["names"]
                .as_object_mut()
                .expect("names")
                .remove("kind");
        }),
        crd_error(|c| c["spec"]["scope"] = json!("Global")),
        crd_error(|c| c["spec"]["group"] = json!("example")),
        crd_error(|c| c["spec"]["versions"] = json!([])),
        crd_error(|c| c["spec"]["versions"][1]["storage"] = json!(true)),
        crd_error(|c| {
            c["spec"]["versions"][0]
                .as_object_mut()
                .expect("v")
                .remove("schema");
        }),
        crd_error(|c| {
            c["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
                ["color"] = json!({"enum": ["x"]})
        }),
        crd_error(|c| {
            c["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["type"] = json!("array")
        }),
        crd_error(|c| {
            c["spec"]["versions"][0]["selectableFields"] = json!([{"jsonPath": ".spec.labels"}])
        }),
        crd_error(|c| {
            c["spec"]["versions"][0]["additionalPrinterColumns"] =
                json!([{"name": "X", "type": "map", "jsonPath": ".spec"}])
        }),
        crd_error(|c| {
            c["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
                ["replicas"]["default"] = json!("one")
        }),
        crd_error(|c| c["spec"]["preserveUnknownFields"] = json!(true)),
        crd_error(|c| {
            c["spec"]["group"] = json!("tether.k8s.io");
            c["metadata"]["name"] = json!("widgets.tether.k8s.io");
        }),
        crd_error(|c| {
            c["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
                ["ports"] = json!({"type": "array", "x-kubernetes-list-type": "map",
                    "x-kubernetes-list-map-keys": ["name", "port"],
                    "items": {"type": "object", "required": ["port"], "properties": {
                        "name": {"type": "string"}, "port": {"type": "integer"}}}})
        }),
        crd_error(|c| {
            c["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
                ["tags"] = json!({"type": "array", "x-kubernetes-list-type": "set",
                    "items": {"type": "object"}})
        }),
        crd_error(|c| {
            c["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
                ["ports"] = json!({"type": "array", "x-kubernetes-list-type": "map",
                    "x-kubernetes-list-map-keys": ["name"],
                    "items": {"type": "object", "properties": {"name": {"type": "string", "default": "http"}}}})
        }),
    ];
    expect![[r#"
        valid
        CustomResourceDefinition.apiextensions.k8s.io "widget.example.com" is invalid: metadata.name: Invalid value: "widget.example.com": must be spec.names.plural+"."+spec.group
        CustomResourceDefinition.apiextensions.k8s.io "widgets.example.com" is invalid: spec.names.plural: Required value
        CustomResourceDefinition.apiextensions.k8s.io "widgets.example.com" is invalid: [spec.names.kind: Required value, spec.names.listKind: Required value]
        CustomResourceDefinition.apiextensions.k8s.io "widgets.example.com" is invalid: spec.scope: Unsupported value: "Global": supported values: "Cluster", "Namespaced"
        CustomResourceDefinition.apiextensions.k8s.io "widgets.example.com" is invalid: [spec.group: Invalid value: "example": should be a domain with at least one dot, metadata.name: Invalid value: "widgets.example.com": must be spec.names.plural+"."+spec.group]
        CustomResourceDefinition.apiextensions.k8s.io "widgets.example.com" is invalid: spec.versions: Required value: must have exactly one version marked as storage version
        CustomResourceDefinition.apiextensions.k8s.io "widgets.example.com" is invalid: spec.versions: Invalid value: "2 storage versions": must have exactly one version marked as storage version
        CustomResourceDefinition.apiextensions.k8s.io "widgets.example.com" is invalid: [spec.versions[0].schema.openAPIV3Schema: Required value: schemas are required, spec.versions[0].selectableFields[0].jsonPath: Invalid value: ".spec.color": is an invalid path: does not refer to a valid field]
        CustomResourceDefinition.apiextensions.k8s.io "widgets.example.com" is invalid: [spec.versions[0].schema.openAPIV3Schema.properties[spec].properties[color].type: Required value: must not be empty for specified object fields, spec.versions[0].selectableFields[0].jsonPath: Invalid value: ".spec.color": must point to a field of type string, boolean or integer. Enum string fields and strings with formats are allowed.]
        CustomResourceDefinition.apiextensions.k8s.io "widgets.example.com" is invalid: [spec.versions[0].schema.openAPIV3Schema.type: Invalid value: "array": must be object at the root, spec.versions[0].schema.openAPIV3Schema.items: Required value: must be specified]
        CustomResourceDefinition.apiextensions.k8s.io "widgets.example.com" is invalid: spec.versions[0].selectableFields[0].jsonPath: Invalid value: ".spec.labels": must point to a field of type string, boolean or integer. Enum string fields and strings with formats are allowed.
        CustomResourceDefinition.apiextensions.k8s.io "widgets.example.com" is invalid: spec.versions[0].additionalPrinterColumns[0].type: Unsupported value: "map": supported values: "boolean", "date", "integer", "number", "string"
        CustomResourceDefinition.apiextensions.k8s.io "widgets.example.com" is invalid: spec.versions[0].schema.openAPIV3Schema.properties[spec].properties[replicas].default: Invalid value: "string": spec.replicas in body must be of type integer: "string"
        CustomResourceDefinition.apiextensions.k8s.io "widgets.example.com" is invalid: spec.preserveUnknownFields: Invalid value: true: cannot set to true, set x-kubernetes-preserve-unknown-fields to true in spec.versions[*].schema instead
        CustomResourceDefinition.apiextensions.k8s.io "widgets.tether.k8s.io" is invalid: metadata.annotations[api-approved.kubernetes.io]: Required value: protected groups must have approval annotation "api-approved.kubernetes.io", see https://github.com/kubernetes/enhancements/pull/1111
        CustomResourceDefinition.apiextensions.k8s.io "widgets.example.com" is invalid: spec.versions[0].schema.openAPIV3Schema.properties[spec].properties[ports].items.properties[name].default: Required value: this property is in x-kubernetes-list-map-keys, so it must have a default or be a required property
        CustomResourceDefinition.apiextensions.k8s.io "widgets.example.com" is invalid: spec.versions[0].schema.openAPIV3Schema.properties[spec].properties[tags].items.type: Invalid value: "object": must be a scalar type if parent array's x-kubernetes-list-type is `set`
        valid"#]]
    .assert_eq(&cases.join("\n"));
}

#[test]
fn crd_updates_keep_scope_and_stored_versions() {
    let mut old = crd();
    accept_at(&mut old, "2025-01-01T00:00:00Z");
    let mut new = old.clone();
    new["spec"]["scope"] = json!("Cluster");
    let err = validate_crd_update(&old, &new).expect_err("scope is immutable");
    assert!(
        err.message
            .contains("spec.scope: Invalid value: \"Cluster\": field is immutable"),
        "{}",
        err.message
    );
    let mut dropped = old.clone();
    dropped["spec"]["versions"]
        .as_array_mut()
        .expect("versions")
        .remove(0);
    dropped["spec"]["versions"][0]["storage"] = json!(true);
    let err = validate_crd_update(&old, &dropped).expect_err("stored version removed");
    assert!(
        err.message.contains("status.storedVersions"),
        "{}",
        err.message
    );
    assert!(validate_crd_update(&old, &old).is_ok());
}

#[test]
fn unknown_fields_are_pruned_and_defaults_applied() {
    let mut w = json!({
        "apiVersion": "example.com/v1", "kind": "Widget",
        "metadata": {"name": "w1", "unknownMeta": 1},
        "unknownTop": true,
        "spec": {"color": "red", "bogus": 1, "mode": null, "ratio": null,
                 "items": [{"name": "a", "junk": 1}],
                 "raw": {"anything": {"goes": 1}, "known": {"a": "x", "b": "pruned"}},
                 "template": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"x": "y", "z": 1}, "extra": 1}},
        "status": {"replicas": 2, "phase": "x"},
    });
    assert_eq!(
        unknown_fields(&rt(), &w),
        [
            "unknownTop",
            "spec.bogus",
            "spec.items[0].junk",
            "spec.raw.known.b",
            "spec.template.spec.z",
            "spec.template.extra",
            "status.phase"
        ]
    );
    prune_default_validate(&rt(), &mut w).expect("valid after pruning");
    expect![[r#"{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"w1","unknownMeta":1},"spec":{"color":"red","mode":"auto","ratio":null,"items":[{"name":"a","weight":5}],"raw":{"anything":{"goes":1},"known":{"a":"x"}},"template":{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"spec":{"x":"y"}},"replicas":1},"status":{"replicas":2}}"#]]
        .assert_eq(&w.to_string());
}

#[test]
fn invalid_custom_resources_get_field_errors_like_the_real_server() {
    let base = |spec: Value| json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w1"}, "spec": spec});
    check_invalid(
        base(json!({"color": "red", "replicas": "string"})),
        expect![[
            r#"Widget.example.com "w1" is invalid: spec.replicas: Invalid value: "string": spec.replicas in body must be of type integer: "string""#
        ]],
    );
    check_invalid(
        base(json!({"replicas": 3})),
        expect![[r#"Widget.example.com "w1" is invalid: spec.color: Required value"#]],
    );
    check_invalid(
        base(json!({"color": "blue"})),
        expect![[
            r#"Widget.example.com "w1" is invalid: spec.color: Unsupported value: "blue": supported values: "red", "green""#
        ]],
    );
    check_invalid(
        base(json!({"color": "red", "replicas": 0})),
        expect![[
            r#"Widget.example.com "w1" is invalid: spec.replicas: Invalid value: 0: spec.replicas in body should be greater than or equal to 1"#
        ]],
    );
    check_invalid(
        base(json!({"color": "red", "replicas": 11})),
        expect![[
            r#"Widget.example.com "w1" is invalid: spec.replicas: Invalid value: 11: spec.replicas in body should be less than or equal to 10"#
        ]],
    );
    check_invalid(
        base(json!({"color": "red", "code": "a"})),
        expect![[
            r#"Widget.example.com "w1" is invalid: [spec.code: Invalid value: "a": spec.code in body should be at least 2 chars long, spec.code: Invalid value: "a": spec.code in body should match '^[0-9]+$']"#
        ]],
    );
    check_invalid(
        base(json!({"color": "red", "code": "123456"})),
        expect![[
            r#"Widget.example.com "w1" is invalid: spec.code: Too long: may not be more than 4 bytes"#
        ]],
    );
    check_invalid(
        base(json!({"color": "red", "port": true})),
        expect![[
            r#"Widget.example.com "w1" is invalid: spec.port: Invalid value: "boolean": spec.port in body must be of type integer,string: "boolean""#
        ]],
    );
    check_invalid(
        base(json!({"color": "red", "when": "yesterday"})),
        expect![[
            r#"Widget.example.com "w1" is invalid: spec.when: Invalid value: "yesterday": spec.when in body must be of type date-time: "yesterday""#
        ]],
    );
    check_invalid(
        base(json!({"color": "red", "items": [{"name": "a"}, {}, {"name": "c"}]})),
        expect![[
            r#"Widget.example.com "w1" is invalid: [spec.items: Too many: 3: must have at most 2 items, spec.items[1].name: Required value]"#
        ]],
    );
    check_invalid(
        base(json!({"color": "red", "tags": ["a", "b", "a"]})),
        expect![[r#"Widget.example.com "w1" is invalid: spec.tags[2]: Duplicate value: "a""#]],
    );
    check_invalid(
        base(json!({"color": "red", "labels": {"a": 1}})),
        expect![[
            r#"Widget.example.com "w1" is invalid: spec.labels.a: Invalid value: "integer": spec.labels.a in body must be of type string: "integer""#
        ]],
    );
    check_invalid(
        json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w1"}, "spec": "nope"}),
        expect![[
            r#"Widget.example.com "w1" is invalid: spec: Invalid value: "string": spec in body must be of type object: "string""#
        ]],
    );
    check_invalid(
        base(json!({"color": "red", "template": {"spec": {}}})),
        expect![[
            r#"Widget.example.com "w1" is invalid: [spec.template.apiVersion: Required value, spec.template.kind: Required value]"#
        ]],
    );
    // Valid edge cases: int-or-string both ways, nullable null, whole numbers as integers.
    for spec in [
        json!({"color": "green", "port": 80}),
        json!({"color": "green", "port": "http", "ratio": null}),
        json!({"color": "green", "replicas": 2.0}),
    ] {
        let mut obj = base(spec.clone());
        prune_default_validate(&rt(), &mut obj)
            .unwrap_or_else(|e| panic!("{spec} should be valid: {}", e.message));
    }
    let err =
        prune_default_validate(&rt(), &mut base(json!({"replicas": "x"}))).expect_err("invalid");
    let causes = err.details.expect("details")["causes"].clone();
    assert_eq!(
        causes,
        json!([
            {"reason": "FieldValueRequired", "message": "Required value", "field": "spec.color"},
            {"reason": "FieldValueInvalid", "message": "Invalid value: \"string\": spec.replicas in body must be of type integer: \"string\"", "field": "spec.replicas"},
        ])
    );
}

#[test]
fn unsupported_constructs_are_reported() {
    let s = json!({"type": "object", "properties": {"spec": {"type": "object",
        "x-kubernetes-validations": [{"rule": "self.a > 0"}],
        "properties": {"list": {"type": "array", "items": {"type": "object", "x-kubernetes-validations": []}}}}}});
    assert_eq!(
        unsupported_constructs(&s),
        [
            "openAPIV3Schema.properties[spec].x-kubernetes-validations",
            "openAPIV3Schema.properties[spec].properties[list].items.x-kubernetes-validations",
        ]
    );
}

/// Arbitrary JSON up to a small depth, biased to the schema's field names so pruning,
/// defaulting and nulls are exercised.
fn arb_json() -> impl Strategy<Value = Value> {
    let key = prop_oneof![
        Just("spec".to_owned()),
        Just("status".to_owned()),
        Just("replicas".to_owned()),
        Just("items".to_owned()),
        Just("name".to_owned()),
        Just("raw".to_owned()),
        Just("known".to_owned()),
        Just("template".to_owned()),
        Just("metadata".to_owned()),
        Just("mode".to_owned()),
        Just("labels".to_owned()),
        "[a-z]{1,3}",
    ];
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i32>().prop_map(|n| json!(n)),
        "[a-z0-9]{0,4}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, move |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::btree_map(key.clone(), inner, 0..5)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #[test]
    fn pruning_is_idempotent(obj in arb_json()) {
        let s = schema();
        let mut once = obj;
        prune(&s, &mut once);
        let mut twice = once.clone();
        prune(&s, &mut twice);
        prop_assert_eq!(once, twice);
    }

    #[test]
    fn prune_then_default_is_a_fixed_point(obj in arb_json()) {
        let s = schema();
        let mut once = obj;
        prune(&s, &mut once);
        default(&s, &mut once);
        let mut again = once.clone();
        prune(&s, &mut again);
        default(&s, &mut again);
        prop_assert_eq!(once, again);
    }

    #[test]
    fn accepted_objects_are_stable_and_valid(spec in arb_json()) {
        let rt = rt();
        let mut spec = spec;
        if let Some(m) = spec.as_object_mut() {
            // The one required field, so that most generated objects are accepted.
            m.insert("color".into(), json!("red"));
        }
        let mut obj = json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": spec});
        if prune_default_validate(&rt, &mut obj).is_ok() {
            // What the server stored passes again unchanged (a no-op write stays a no-op).
            let mut again = obj.clone();
            prop_assert!(prune_default_validate(&rt, &mut again).is_ok());
            prop_assert_eq!(again, obj);
        }
    }

    #[test]
    fn pruned_objects_only_keep_specified_fields(spec in arb_json()) {
        let s = schema();
        let mut obj = json!({"spec": spec});
        prune(&s, &mut obj);
        if let Some(Value::Object(m)) = obj.get("spec") {
            let allowed = s["properties"]["spec"]["properties"].as_object().expect("props");
            prop_assert!(m.keys().all(|k| allowed.contains_key(k)), "{m:?}");
        }
    }
}
