//! Small accessors and formatting shared by the cell printers: ages, labels, selectors.

#[allow(clippy::wildcard_imports)]
use super::*;

// ---------------------------------------------------------------------------------------------
// Small accessors.

pub(super) fn at<'a>(obj: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(obj, |v, k| v.get(*k))
}

pub(super) fn str_at<'a>(obj: &'a Value, path: &[&str]) -> &'a str {
    at(obj, path).and_then(Value::as_str).unwrap_or("")
}

pub(super) fn int_at(obj: &Value, path: &[&str]) -> i64 {
    at(obj, path).and_then(Value::as_i64).unwrap_or(0)
}

pub(super) fn len_at(obj: &Value, path: &[&str]) -> usize {
    match at(obj, path) {
        Some(Value::Object(m)) => m.len(),
        Some(Value::Array(a)) => a.len(),
        _ => 0,
    }
}

pub(super) fn arr<'a>(obj: &'a Value, path: &[&str]) -> &'a [Value] {
    at(obj, path)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

pub(super) fn or_none(s: String) -> String {
    if s.is_empty() { "<none>".to_owned() } else { s }
}

pub(super) fn parse_time(s: &str) -> Option<Timestamp> {
    s.parse::<Timestamp>().ok()
}

/// kube-apiserver's AGE cell: `<unknown>` without a creation timestamp.
pub(super) fn age(obj: &Value, now: Timestamp) -> Value {
    json!(since(str_at(obj, &["metadata", "creationTimestamp"]), now))
}

pub(super) fn since(timestamp: &str, now: Timestamp) -> String {
    match parse_time(timestamp) {
        Some(t) => human_duration(now.as_second() - t.as_second()),
        None => "<unknown>".to_owned(),
    }
}

/// apimachinery's `duration.HumanDuration`: precision shrinks as the duration grows.
pub fn human_duration(seconds: i64) -> String {
    if seconds < -1 {
        return "<invalid>".to_owned();
    }
    if seconds < 0 {
        return "0s".to_owned();
    }
    if seconds < 120 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        let s = seconds % 60;
        return if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        };
    }
    if minutes < 180 {
        return format!("{minutes}m");
    }
    let hours = seconds / 3600;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 {
            format!("{}d", hours / 24)
        } else {
            format!("{}d{h}h", hours / 24)
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        let dy = (hours / 24) % 365;
        return if dy == 0 {
            format!("{}y", hours / 24 / 365)
        } else {
            format!("{}y{dy}d", hours / 24 / 365)
        };
    }
    format!("{}y", hours / 24 / 365)
}

/// `k=v,k2=v2` sorted by key, as `labels.FormatLabels`.
pub(super) fn format_labels(map: Option<&Value>) -> String {
    let Some(Value::Object(m)) = map else {
        return String::new();
    };
    let mut pairs: Vec<String> = m
        .iter()
        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
        .collect();
    pairs.sort();
    pairs.join(",")
}

/// `metav1.FormatLabelSelector`: match labels, then expressions.
pub(super) fn format_label_selector(sel: Option<&Value>) -> String {
    let Some(sel) = sel else {
        return "<none>".to_owned();
    };
    let mut parts = Vec::new();
    if let Some(Value::Object(m)) = sel.get("matchLabels") {
        let mut keys: Vec<&String> = m.keys().collect();
        keys.sort();
        for k in keys {
            parts.push(format!("{k}={}", m[k].as_str().unwrap_or_default()));
        }
    }
    for e in arr(sel, &["matchExpressions"]) {
        let key = str_at(e, &["key"]);
        let values: Vec<&str> = arr(e, &["values"])
            .iter()
            .filter_map(Value::as_str)
            .collect();
        let part = match str_at(e, &["operator"]) {
            "In" => format!("{key} in ({})", values.join(",")),
            "NotIn" => format!("{key} notin ({})", values.join(",")),
            "Exists" => key.to_owned(),
            "DoesNotExist" => format!("!{key}"),
            op => format!("{key} {op} ({})", values.join(",")),
        };
        parts.push(part);
    }
    if parts.is_empty() {
        "<none>".to_owned()
    } else {
        parts.join(",")
    }
}
