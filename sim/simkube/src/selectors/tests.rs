//! Selector tests: table-driven parsing and matching, and property tests against a reference.

use std::collections::BTreeSet;

use proptest::prelude::*;
use serde_json::{Map, Value, json};

use super::*;
use crate::registry::ResourceType;

fn labels(v: Value) -> Map<String, Value> {
    v.as_object().cloned().expect("test labels are an object")
}

fn pods() -> ResourceType {
    crate::registry::builtins()
        .into_iter()
        .find(|t| t.group.is_empty() && t.kind == "Pod")
        .expect("pods are built in")
}

#[test]
fn label_selector_grammar_matches_like_the_real_server() {
    let obj = labels(json!({"app": "web", "tier": "front", "n": "5", "example.com/x": "y"}));
    let cases: &[(&str, bool)] = &[
        ("", true),
        ("app=web", true),
        ("app==web", true),
        ("app = web", true),
        ("app!=web", false),
        ("app!=db", true),
        ("missing!=x", true),
        ("app in (web,db)", true),
        ("app in ( db , web )", true),
        ("app notin (web)", false),
        ("missing notin (web)", true),
        ("app", true),
        ("!app", false),
        ("!missing", true),
        ("app=web,tier=front", true),
        ("app=web,tier=back", false),
        ("example.com/x=y", true),
        ("n>4", true),
        ("n>5", false),
        ("n<6", true),
        ("app>1", false),
        ("missing=", false),
        ("in=x", false),
        ("app in (web),!missing,tier", true),
    ];
    for (sel, want) in cases {
        let parsed = LabelSelector::parse(sel).unwrap_or_else(|e| panic!("{sel}: {e}"));
        assert_eq!(parsed.matches(&obj), *want, "selector {sel:?}");
    }
}

#[test]
fn empty_value_matches_an_empty_label() {
    let sel = LabelSelector::parse("a=,b in ()").unwrap();
    assert!(sel.matches(&labels(json!({"a": "", "b": ""}))));
    assert!(!sel.matches(&labels(json!({"a": "x", "b": ""}))));
}

#[test]
fn label_selector_errors_are_bad_requests_worded_like_apimachinery() {
    let cases: &[(&str, &str)] = &[
        ("a=b,", "found '', expected: identifier after ','"),
        ("a b", "found 'b', expected: in, notin, =, ==, !=, gt, lt"),
        ("a in b", "found 'b', expected: '('"),
        ("a in (b", "found '', expected: ',', ')' or identifier"),
        (
            "=a",
            "found '=', expected: !, identifier, or 'end of string'",
        ),
        ("a=b c", "found 'c', expected: ',' or 'end of string'"),
        ("!a=b", "found '=', expected: ',' or 'end of string'"),
        ("a=(", "found '(', expected: identifier"),
        ("a notin ()x", "found 'x', expected: ',' or 'end of string'"),
        (
            "a>b",
            "unable to parse requirement: for 'Gt', 'Lt' operators, the value must be an integer",
        ),
        (
            "-a=b",
            "unable to parse requirement: <nil>: Invalid value: \"-a\": name part must consist of",
        ),
        (
            "Foo.com/a=b",
            "unable to parse requirement: <nil>: Invalid value: \"Foo.com/a\": prefix part a lowercase RFC 1123",
        ),
        (
            "a=b_",
            "unable to parse requirement: values[0][a]: Invalid value: \"b_\": a valid label must be",
        ),
        ("a/b/c", "a qualified name must consist of"),
    ];
    for (sel, want) in cases {
        let err = LabelSelector::parse(sel).expect_err(sel);
        assert_eq!(err.code, 400, "{sel}");
        assert_eq!(err.reason, "BadRequest");
        assert!(
            err.message.contains(want),
            "{sel:?}: got {:?}, want {want:?}",
            err.message
        );
    }
    let long = format!("a={}", "x".repeat(64));
    assert!(
        LabelSelector::parse(&long)
            .unwrap_err()
            .message
            .contains("no more than 63")
    );
}

#[test]
fn from_object_follows_metav1_label_selector_rules() {
    let everything = LabelSelector::from_object(&json!({})).unwrap();
    assert!(everything.is_empty());
    assert!(everything.matches(&Map::new()));
    let nothing = LabelSelector::from_object(&Value::Null).unwrap();
    assert!(!nothing.is_empty());
    assert!(!nothing.matches(&Map::new()));

    let sel = LabelSelector::from_object(&json!({
        "matchLabels": {"app": "web"},
        "matchExpressions": [
            {"key": "tier", "operator": "In", "values": ["a", "b"]},
            {"key": "gone", "operator": "DoesNotExist"},
            {"key": "env", "operator": "NotIn", "values": ["prod"]},
            {"key": "app", "operator": "Exists"}
        ]
    }))
    .unwrap();
    assert!(sel.matches(&labels(json!({"app": "web", "tier": "a"}))));
    assert!(!sel.matches(&labels(json!({"app": "web", "tier": "a", "gone": "x"}))));
    assert!(!sel.matches(&labels(json!({"app": "web", "tier": "a", "env": "prod"}))));
    assert_eq!(
        sel.to_string(),
        "app=web,app,env notin (prod),!gone,tier in (a,b)"
    );

    let bad = LabelSelector::from_object(
        &json!({"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]}),
    );
    assert_eq!(
        bad.unwrap_err().message,
        "\"Gt\" is not a valid label selector operator"
    );
    let empty_in = LabelSelector::from_object(
        &json!({"matchExpressions": [{"key": "a", "operator": "In", "values": []}]}),
    );
    assert!(
        empty_in
            .unwrap_err()
            .message
            .contains("values set can't be empty")
    );
    let vals_exist = LabelSelector::from_object(
        &json!({"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]}),
    );
    assert!(
        vals_exist
            .unwrap_err()
            .message
            .contains("values set must be empty")
    );
}

#[test]
fn field_selectors_parse_match_and_reject_unknown_labels() {
    let rt = pods();
    let pod = json!({
        "metadata": {"name": "p1", "namespace": "ns"},
        "spec": {"nodeName": "vk-node"},
        "status": {"phase": "Running"}
    });
    let cases: &[(&str, bool)] = &[
        ("", true),
        ("metadata.name=p1", true),
        ("metadata.name==p1", true),
        ("metadata.name!=p1", false),
        ("metadata.namespace=ns,spec.nodeName=vk-node", true),
        ("spec.nodeName=other", false),
        ("spec.nodeName!=other", true),
        ("status.phase=Running", true),
        ("spec.hostNetwork=false", true),
        ("spec.hostNetwork=true", false),
        ("metadata.name=", false),
    ];
    for (sel, want) in cases {
        let parsed = FieldSelector::parse(sel, &rt).unwrap_or_else(|e| panic!("{sel}: {e}"));
        assert_eq!(parsed.matches(&pod), *want, "selector {sel:?}");
    }
    let err = FieldSelector::parse("spec.foo=bar", &rt).unwrap_err();
    assert_eq!(
        (err.code, err.message.as_str()),
        (400, "field label not supported: spec.foo")
    );
    let err = FieldSelector::parse("metadata.name", &rt).unwrap_err();
    assert_eq!(
        err.message,
        "invalid selector: 'metadata.name'; can't understand 'metadata.name'"
    );
    let escaped = FieldSelector::parse(r"metadata.name=a\,b", &rt).unwrap();
    assert!(escaped.matches(&json!({"metadata": {"name": "a,b"}})));
    assert_eq!(
        FieldSelector::parse("metadata.name=p1", &rt)
            .unwrap()
            .exact_name(),
        Some("p1")
    );
}

/// A naive reference matcher over the requirement list.
fn reference(reqs: &[(String, u8, Vec<String>)], labels: &Map<String, Value>) -> bool {
    reqs.iter().all(|(k, op, vals)| {
        let have = labels.get(k).and_then(Value::as_str);
        match op {
            0 => have == Some(vals[0].as_str()),
            1 => have != Some(vals[0].as_str()),
            2 => have.is_some_and(|h| vals.iter().any(|v| v == h)),
            3 => !have.is_some_and(|h| vals.iter().any(|v| v == h)),
            4 => have.is_some(),
            _ => have.is_none(),
        }
    })
}

fn render(reqs: &[(String, u8, Vec<String>)]) -> String {
    reqs.iter()
        .map(|(k, op, vals)| match op {
            0 => format!("{k} = {}", vals[0]),
            1 => format!("{k}!={}", vals[0]),
            2 => format!("{k} in ({})", vals.join(", ")),
            3 => format!("{k} notin ({})", vals.join(",")),
            4 => k.clone(),
            _ => format!("! {k}"),
        })
        .collect::<Vec<_>>()
        .join(" , ")
}

fn key_strategy() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-c]",
        "[a-z][a-z0-9._-]{0,6}[a-z0-9]",
        "[a-z]{1,4}\\.(io|com)/[A-Za-z][a-z0-9]{0,5}",
    ]
}

fn req_strategy() -> impl Strategy<Value = (String, u8, Vec<String>)> {
    (
        key_strategy(),
        0u8..6,
        prop::collection::vec("[a-c]|[A-Za-z0-9][A-Za-z0-9_.-]{0,4}[a-z0-9]", 1..4),
    )
        .prop_map(|(k, op, vals)| (k, op, vals))
}

proptest! {
    #[test]
    fn parse_render_round_trips_and_matches_reference(
        reqs in prop::collection::vec(req_strategy(), 0..5),
        label_pairs in prop::collection::vec((key_strategy(), "[a-c]|x[0-9]"), 0..6),
    ) {
        let text = render(&reqs);
        let sel = LabelSelector::parse(&text).unwrap();
        let again = LabelSelector::parse(&sel.to_string()).unwrap();
        prop_assert_eq!(&sel, &again);
        let mut lbl = Map::new();
        for (k, v) in label_pairs {
            lbl.insert(k, Value::String(v));
        }
        prop_assert_eq!(sel.matches(&lbl), reference(&reqs, &lbl));
    }

    #[test]
    fn parser_never_panics(s in "[a-z!=(), <>in]{0,20}") {
        let _ = LabelSelector::parse(&s);
    }

    #[test]
    fn set_values_are_deduplicated(vals in prop::collection::btree_set("[a-c]", 1..4)) {
        let sel = LabelSelector::parse(&format!("k in ({})", vals.iter().cloned().collect::<Vec<_>>().join(","))).unwrap();
        prop_assert_eq!(&sel.requirements()[0].values, &vals.into_iter().collect::<BTreeSet<_>>());
    }
}

#[test]
fn field_selector_escapes_are_checked() {
    let rt = pods();
    let err = FieldSelector::parse(r"metadata.name=a\x", &rt).unwrap_err();
    assert_eq!(
        err.message,
        r"invalid field selector: invalid escape sequence: \x"
    );
    let err = FieldSelector::parse("metadata.name=a=b", &rt).unwrap_err();
    assert_eq!(
        err.message,
        "invalid field selector: unescaped character in value: 61"
    );
    let ok = FieldSelector::parse(r"metadata.name=a\=b\\", &rt).unwrap();
    assert!(ok.matches(&json!({"metadata": {"name": r"a=b\"}})));
}
