//! Whether a server-side apply would change anything: every field of the applied body already
//! holds in the live object. Passes that re-apply the same intent every few seconds check this
//! against a watched copy first, so a steady state costs no write (and, across clusters, no
//! traffic).

use serde::Serialize;
use serde_json::Value;

/// Whether `live` already carries everything `desired` sets. Objects are compared field by
/// field (extra fields in `live` are someone else's), lists element by element and of the same
/// length (an apply replaces an atomic list whole), scalars by equality. A `null` asks for
/// nothing (it is a typed object's unset field); an empty list or object asks for nothing
/// where `live` lacks the field, since typed objects leave empty fields out when serialised.
pub fn holds(desired: &Value, live: &Value) -> bool {
    match (desired, live) {
        (Value::Object(want), Value::Object(have)) => want.iter().all(|(k, v)| match have.get(k) {
            Some(h) => holds(v, h),
            None => asks_nothing(v),
        }),
        (Value::Array(want), Value::Array(have)) => {
            want.len() == have.len() && want.iter().zip(have).all(|(w, h)| holds(w, h))
        }
        (Value::Null, _) => true,
        (want, Value::Null) => asks_nothing(want),
        (want, have) => want == have,
    }
}

/// [`holds`] against a typed object, as its JSON. An object that cannot be serialised holds
/// nothing, so the caller applies.
pub fn holds_in<K: Serialize>(desired: &Value, live: &K) -> bool {
    serde_json::to_value(live).is_ok_and(|l| holds(desired, &l))
}

fn asks_nothing(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;

    #[test]
    fn by_example() {
        let live = json!({
            "metadata": { "name": "g", "labels": { "a": "1", "b": "2" }, "uid": "u" },
            "spec": { "port": 51820, "addresses": ["10.0.0.1"], "mtu": 1420 },
            "status": { "ready": true },
        });
        let cases = [
            (json!({}), true, "an empty body"),
            (
                json!({ "metadata": { "labels": { "a": "1" } } }),
                true,
                "a subset of labels",
            ),
            (
                json!({ "spec": { "port": 51820 } }),
                true,
                "one field of several",
            ),
            (
                json!({ "spec": { "port": 51821 } }),
                false,
                "a changed number",
            ),
            (
                json!({ "spec": { "port": "51820" } }),
                false,
                "a number as a string",
            ),
            (
                json!({ "spec": { "addresses": ["10.0.0.1"] } }),
                true,
                "an equal list",
            ),
            (
                json!({ "spec": { "addresses": [] } }),
                false,
                "a shorter list",
            ),
            (
                json!({ "spec": { "addresses": ["10.0.0.1", "10.0.0.2"] } }),
                false,
                "a longer list",
            ),
            (
                json!({ "spec": { "key": "k" } }),
                false,
                "a field live lacks",
            ),
            (
                json!({ "spec": { "key": null } }),
                true,
                "null for a field live lacks",
            ),
            (
                json!({ "spec": { "key": [] } }),
                true,
                "an empty list for a field live lacks",
            ),
            (
                json!({ "spec": { "key": {} } }),
                true,
                "an empty object for a field live lacks",
            ),
            (
                json!({ "spec": { "mtu": null } }),
                true,
                "null for a field live has",
            ),
            (json!({ "spec": "x" }), false, "a scalar for an object"),
        ];
        for (desired, expected, what) in cases {
            assert_eq!(holds(&desired, &live), expected, "{what}: {desired}");
        }
    }

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i32>().prop_map(|n| json!(n)),
            "[a-z]{0,4}".prop_map(Value::String),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::btree_map("[a-c]", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn an_object_holds_itself(v in json_value()) {
            prop_assert!(holds(&v, &v));
        }

        #[test]
        fn extra_live_fields_do_not_matter(
            want in prop::collection::btree_map("[a-c]", json_value(), 0..4),
            extra in prop::collection::btree_map("[d-f]", json_value(), 0..4),
        ) {
            let desired = Value::Object(want.clone().into_iter().collect());
            let live = Value::Object(want.into_iter().chain(extra).collect());
            prop_assert!(holds(&desired, &live));
        }

        #[test]
        fn a_changed_scalar_does_not_hold(v in json_value(), n in any::<i32>()) {
            let desired = json!({ "k": n });
            let same = v == json!(n);
            let live = json!({ "k": v });
            prop_assert_eq!(holds(&desired, &live), same);
        }
    }
}
