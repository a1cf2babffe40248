//! Conversion between the stored form of an object and the form served at a URL's version:
//! several served versions of a custom resource share one storage (apiVersion rewritten), and
//! `events.k8s.io/v1` Events are a second view of the core `v1` Events, as in a real cluster
//! (kube-runtime's `Recorder` writes the former, `kubectl describe` reads the latter).

use serde_json::{Map, Value, json};

use crate::registry::ResourceType;
use crate::store::TypeKey;

/// `events.k8s.io/v1` field ↔ core `v1` field, for the fields that are renamed.
const EVENT_FIELDS: &[(&str, &str)] = &[
    ("regarding", "involvedObject"),
    ("note", "message"),
    ("reportingController", "reportingComponent"),
    ("deprecatedSource", "source"),
    ("deprecatedFirstTimestamp", "firstTimestamp"),
    ("deprecatedLastTimestamp", "lastTimestamp"),
    ("deprecatedCount", "count"),
];

fn is_events_view(rt: &ResourceType) -> bool {
    rt.group == "events.k8s.io" && rt.plural == "events"
}

/// Where a type's objects are stored: its group and plural, except that `events.k8s.io`
/// Events live with the core Events.
pub(crate) fn storage_key(rt: &ResourceType) -> TypeKey {
    if is_events_view(rt) {
        TypeKey::new("", "events")
    } else {
        TypeKey::new(&rt.group, &rt.plural)
    }
}

fn rename(
    obj: &Value,
    pairs: impl Iterator<Item = (&'static str, &'static str)>,
    api_version: &str,
) -> Value {
    let Some(map) = obj.as_object() else {
        return obj.clone();
    };
    let mut out = Map::with_capacity(map.len());
    let pairs: Vec<_> = pairs.collect();
    for (k, v) in map {
        let key = pairs
            .iter()
            .find(|(from, _)| from == k)
            .map_or(k.as_str(), |(_, to)| to);
        out.insert(key.to_owned(), v.clone());
    }
    out.insert("apiVersion".into(), json!(api_version));
    out.insert("kind".into(), json!("Event"));
    Value::Object(out)
}

/// The object as served for `rt`; `None` when the stored form is already it.
pub(crate) fn to_served(rt: &ResourceType, stored: &Value) -> Option<Value> {
    if is_events_view(rt) {
        return Some(rename(
            stored,
            EVENT_FIELDS.iter().map(|(v1, core)| (*core, *v1)),
            "events.k8s.io/v1",
        ));
    }
    let want = rt.api_version();
    (stored["apiVersion"].as_str() != Some(want.as_str())).then(|| {
        let mut o = stored.clone();
        o["apiVersion"] = json!(want);
        o
    })
}

/// The object as stored, from the form a client sent for `rt`.
pub(crate) fn to_storage(rt: &ResourceType, served: Value) -> Value {
    if is_events_view(rt) {
        return rename(&served, EVENT_FIELDS.iter().copied(), "v1");
    }
    served
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::Registry;

    #[test]
    fn events_round_trip_between_the_two_views() {
        let reg = Registry::with_builtins();
        let v1 = reg
            .lookup("events.k8s.io", "v1", "events")
            .expect("events.k8s.io served");
        let sent = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "e"},
            "regarding": {"kind": "Pod", "name": "p"}, "note": "hi", "reason": "Started",
            "reportingController": "ctl", "reportingInstance": "ctl-1", "type": "Normal", "action": "Run"});
        let stored = to_storage(&v1, sent.clone());
        assert_eq!(stored["apiVersion"], "v1");
        assert_eq!(stored["involvedObject"]["name"], "p");
        assert_eq!(stored["message"], "hi");
        assert_eq!(stored["reportingComponent"], "ctl");
        assert_eq!(to_served(&v1, &stored), Some(sent));
        assert_eq!(storage_key(&v1), TypeKey::new("", "events"));
    }
}
