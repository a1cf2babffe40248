//! CRD columns: the apiextensions table convertor, evaluating `additionalPrinterColumns` by JSONPath.

#[allow(clippy::wildcard_imports)]
use super::*;

// ---------------------------------------------------------------------------------------------
// CRD columns: the apiextensions table convertor.

pub(super) fn column_cell(c: &PrinterColumn, obj: &Value, now: Timestamp) -> Value {
    let Some(value) = jsonpath_first(obj, &c.json_path) else {
        return Value::Null;
    };
    match c.type_.as_str() {
        "integer" => match &value {
            Value::Number(n) => n
                .as_i64()
                .or_else(|| n.as_f64().map(|f| f as i64))
                .map_or(Value::Null, |i| json!(i)),
            _ => Value::Null,
        },
        "number" => value.as_f64().map_or(Value::Null, |f| json!(f)),
        "boolean" => value.as_bool().map_or(Value::Null, Value::Bool),
        "date" => match value.as_str() {
            Some(s) => match parse_time(s) {
                Some(t) => json!(human_duration(now.as_second() - t.as_second())),
                None => json!("<invalid>"),
            },
            None => Value::Null,
        },
        // "string" prints any value the way kubectl's JSONPath printer does.
        _ => match value {
            Value::String(s) => Value::String(s),
            Value::Null => Value::Null,
            other => Value::String(other.to_string()),
        },
    }
}

/// One JSONPath step.
#[derive(Debug, PartialEq)]
pub(super) enum Step {
    Field(String),
    Index(usize),
    Wildcard,
    /// `[?(@.a.b=="v")]` (also `!=`).
    Filter {
        path: Vec<String>,
        value: String,
        negate: bool,
    },
}

/// Parses the JSONPath subset `additionalPrinterColumns` use: `.a.b`, `['a.b']`, `[0]`, `[*]`,
/// and `[?(@.type=="Ready")]`. `None` for anything else.
pub(super) fn parse_jsonpath(path: &str) -> Option<Vec<Step>> {
    let path = path.trim();
    let path = path
        .strip_prefix('{')
        .and_then(|p| p.strip_suffix('}'))
        .unwrap_or(path);
    let path = path.strip_prefix('$').unwrap_or(path);
    let mut steps = Vec::new();
    let chars: Vec<char> = path.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '.' => {
                let start = i + 1;
                let mut j = start;
                while j < chars.len() && chars[j] != '.' && chars[j] != '[' {
                    j += 1;
                }
                let name: String = chars[start..j].iter().collect();
                if name == "*" {
                    steps.push(Step::Wildcard);
                } else if !name.is_empty() {
                    steps.push(Step::Field(name));
                }
                i = j;
            }
            '[' => {
                let close = bracket_end(&chars, i)?;
                let inner: String = chars[i + 1..close].iter().collect();
                let inner = inner.trim();
                if inner == "*" {
                    steps.push(Step::Wildcard);
                } else if let Ok(n) = inner.parse::<usize>() {
                    steps.push(Step::Index(n));
                } else if let Some(q) = inner
                    .strip_prefix('\'')
                    .and_then(|s| s.strip_suffix('\''))
                    .or_else(|| inner.strip_prefix('"').and_then(|s| s.strip_suffix('"')))
                {
                    steps.push(Step::Field(q.to_owned()));
                } else if let Some(f) = inner.strip_prefix("?(").and_then(|s| s.strip_suffix(')')) {
                    steps.push(parse_filter(f)?);
                } else {
                    return None;
                }
                i = close + 1;
            }
            c if c.is_whitespace() => i += 1,
            _ => {
                // A leading field without a dot, e.g. `spec.x`.
                let start = i;
                let mut j = start;
                while j < chars.len() && chars[j] != '.' && chars[j] != '[' {
                    j += 1;
                }
                steps.push(Step::Field(chars[start..j].iter().collect()));
                i = j;
            }
        }
    }
    Some(steps)
}

pub(super) fn bracket_end(chars: &[char], open: usize) -> Option<usize> {
    let mut quote: Option<char> = None;
    let mut depth = 0;
    for (k, &c) in chars.iter().enumerate().skip(open) {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '\'' | '"') => quote = Some(c),
            (None, '[') => depth += 1,
            (None, ']') => {
                depth -= 1;
                if depth == 0 {
                    return Some(k);
                }
            }
            _ => {}
        }
    }
    None
}

pub(super) fn parse_filter(f: &str) -> Option<Step> {
    let (lhs, rhs, negate) = if let Some((l, r)) = f.split_once("!=") {
        (l, r, true)
    } else {
        let (l, r) = f.split_once("==")?;
        (l, r, false)
    };
    let lhs = lhs.trim().strip_prefix('@')?;
    let path: Vec<String> = lhs
        .split('.')
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    let rhs = rhs.trim();
    let value = rhs
        .strip_prefix('"')
        .and_then(|s| s.strip_suffix('"'))
        .or_else(|| rhs.strip_prefix('\'').and_then(|s| s.strip_suffix('\'')))
        .unwrap_or(rhs)
        .to_owned();
    Some(Step::Filter {
        path,
        value,
        negate,
    })
}

/// The first value a JSONPath finds in `obj` (the apiextensions convertor prints only the first).
pub fn jsonpath_first(obj: &Value, path: &str) -> Option<Value> {
    let steps = parse_jsonpath(path)?;
    let mut current: Vec<&Value> = vec![obj];
    for step in &steps {
        let mut next = Vec::new();
        for v in current {
            match step {
                Step::Field(name) => next.extend(v.get(name.as_str())),
                Step::Index(n) => next.extend(v.get(*n)),
                Step::Wildcard => match v {
                    Value::Array(a) => next.extend(a.iter()),
                    Value::Object(m) => next.extend(m.values()),
                    _ => {}
                },
                Step::Filter {
                    path,
                    value,
                    negate,
                } => {
                    for item in v.as_array().map(Vec::as_slice).unwrap_or(&[]) {
                        let found = path.iter().try_fold(item, |x, k| x.get(k.as_str()));
                        let text = match found {
                            Some(Value::String(s)) => Some(s.clone()),
                            Some(Value::Null) | None => None,
                            Some(other) => Some(other.to_string()),
                        };
                        let equal = text.as_deref() == Some(value.as_str());
                        if equal != *negate && (found.is_some() || *negate) {
                            next.push(item);
                        }
                    }
                }
            }
        }
        current = next;
    }
    current.into_iter().next().cloned()
}
