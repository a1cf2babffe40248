//! Sets of field paths, the ownership records of server-side apply, with the `FieldsV1` JSON
//! encoding the real server stores in `metadata.managedFields`.
//!
//! A set is a tree: at each level some path elements are *members* (owned themselves) and some
//! have *children* (something below them is owned). `FieldsV1` writes a member as `{}` and a
//! node that is both a member and a parent with a `"."` entry.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde_json::{Map, Value};

/// One step of a field path.
///
/// Path elements sort as structured-merge-diff sorts them: fields, then keys, then values,
/// then indices; keys field by field and values by type, then numerically or lexically.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum PathElement {
    /// A field of an object: `f:<name>`.
    Field(String),
    /// An element of a map list, by its key fields: `k:<json object with sorted keys>`.
    Key(String),
    /// An element of a set list, by value: `v:<json>`.
    Value(String),
    /// An element of a list by position: `i:<n>`.
    Index(usize),
}

impl PathElement {
    /// A key element from the key fields of a map-list item (fields sorted by name).
    pub fn key(fields: &[(String, Value)]) -> Self {
        let mut sorted: Vec<&(String, Value)> = fields.iter().collect();
        sorted.sort_by(|a, b| a.0.cmp(&b.0));
        let obj: Map<String, Value> = sorted
            .into_iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        PathElement::Key(Value::Object(obj).to_string())
    }

    /// A value element of a set-list item.
    pub fn value(v: &Value) -> Self {
        PathElement::Value(canonical(v).to_string())
    }

    /// The `FieldsV1` key of this element.
    pub fn encode(&self) -> String {
        match self {
            PathElement::Field(f) => format!("f:{f}"),
            PathElement::Key(k) => format!("k:{k}"),
            PathElement::Value(v) => format!("v:{v}"),
            PathElement::Index(i) => format!("i:{i}"),
        }
    }

    /// Parses a `FieldsV1` key.
    pub fn decode(s: &str) -> Result<Self, String> {
        let (prefix, rest) = s
            .split_once(':')
            .ok_or_else(|| format!("invalid path element {s:?}"))?;
        match prefix {
            "f" => Ok(PathElement::Field(rest.to_owned())),
            "k" => {
                let v: Value =
                    serde_json::from_str(rest).map_err(|e| format!("invalid key {rest:?}: {e}"))?;
                let Value::Object(m) = v else {
                    return Err(format!("invalid key {rest:?}: not an object"));
                };
                let fields: Vec<(String, Value)> = m.into_iter().collect();
                Ok(PathElement::key(&fields))
            }
            "v" => {
                let v: Value = serde_json::from_str(rest)
                    .map_err(|e| format!("invalid value {rest:?}: {e}"))?;
                Ok(PathElement::value(&v))
            }
            "i" => rest
                .parse()
                .map(PathElement::Index)
                .map_err(|e| format!("invalid index {rest:?}: {e}")),
            _ => Err(format!("unknown path element prefix {prefix:?}")),
        }
    }
}

impl PathElement {
    fn rank(&self) -> u8 {
        match self {
            PathElement::Field(_) => 0,
            PathElement::Key(_) => 1,
            PathElement::Value(_) => 2,
            PathElement::Index(_) => 3,
        }
    }
}

impl Ord for PathElement {
    fn cmp(&self, other: &Self) -> Ordering {
        match (self, other) {
            (PathElement::Field(a), PathElement::Field(b)) => a.cmp(b),
            (PathElement::Index(a), PathElement::Index(b)) => a.cmp(b),
            (PathElement::Key(a), PathElement::Key(b))
            | (PathElement::Value(a), PathElement::Value(b)) => {
                let parse = |s: &str| serde_json::from_str::<Value>(s).unwrap_or(Value::Null);
                compare_values(&parse(a), &parse(b)).then_with(|| a.cmp(b))
            }
            _ => self.rank().cmp(&other.rank()),
        }
    }
}

impl PartialOrd for PathElement {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// A total order on JSON values: by type, then numbers numerically, strings lexically, lists
/// element-wise, objects field by field (keys sorted).
fn compare_values(a: &Value, b: &Value) -> Ordering {
    fn rank(v: &Value) -> u8 {
        match v {
            Value::Null => 0,
            Value::Bool(_) => 1,
            Value::Number(_) => 2,
            Value::String(_) => 3,
            Value::Array(_) => 4,
            Value::Object(_) => 5,
        }
    }
    match (a, b) {
        (Value::Bool(x), Value::Bool(y)) => x.cmp(y),
        (Value::Number(x), Value::Number(y)) => {
            let (x, y) = (x.as_f64().unwrap_or(0.0), y.as_f64().unwrap_or(0.0));
            x.total_cmp(&y)
        }
        (Value::String(x), Value::String(y)) => x.cmp(y),
        (Value::Array(x), Value::Array(y)) => x
            .iter()
            .zip(y)
            .map(|(p, q)| compare_values(p, q))
            .find(|o| o.is_ne())
            .unwrap_or_else(|| x.len().cmp(&y.len())),
        (Value::Object(x), Value::Object(y)) => {
            let mut xs: Vec<(&String, &Value)> = x.iter().collect();
            let mut ys: Vec<(&String, &Value)> = y.iter().collect();
            xs.sort_by(|p, q| p.0.cmp(q.0));
            ys.sort_by(|p, q| p.0.cmp(q.0));
            xs.iter()
                .zip(&ys)
                .map(|((kx, vx), (ky, vy))| kx.cmp(ky).then_with(|| compare_values(vx, vy)))
                .find(|o| o.is_ne())
                .unwrap_or_else(|| xs.len().cmp(&ys.len()))
        }
        _ => rank(a).cmp(&rank(b)),
    }
}

/// The value with object keys sorted, so equal values render equally.
fn canonical(v: &Value) -> Value {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            Value::Object(
                keys.into_iter()
                    .map(|k| (k.clone(), canonical(&m[k])))
                    .collect(),
            )
        }
        Value::Array(a) => Value::Array(a.iter().map(canonical).collect()),
        other => other.clone(),
    }
}

/// Go's `value.ToString` for a key or set value in a path: JSON, strings quoted.
fn render_value(v: &Value) -> String {
    v.to_string()
}

impl fmt::Display for PathElement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PathElement::Field(name) => write!(f, ".{name}"),
            PathElement::Key(k) => {
                let parsed: Value = serde_json::from_str(k).unwrap_or(Value::Null);
                let parts: Vec<String> = parsed
                    .as_object()
                    .map(|m| {
                        m.iter()
                            .map(|(k, v)| format!("{k}={}", render_value(v)))
                            .collect()
                    })
                    .unwrap_or_default();
                write!(f, "[{}]", parts.join(","))
            }
            PathElement::Value(v) => write!(f, "[={v}]"),
            PathElement::Index(i) => write!(f, "[{i}]"),
        }
    }
}

/// A field path, printed as the real server prints it in conflicts: `.spec.containers[name="c"].image`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Path(pub Vec<PathElement>);

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for pe in &self.0 {
            write!(f, "{pe}")?;
        }
        Ok(())
    }
}

/// A set of field paths.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FieldSet {
    members: BTreeSet<PathElement>,
    children: BTreeMap<PathElement, FieldSet>,
}

impl FieldSet {
    /// The empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether nothing is owned.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty() && self.children.values().all(FieldSet::is_empty)
    }

    /// Adds `path` as a member. The empty path is ignored (the root is never owned).
    pub fn insert(&mut self, path: &[PathElement]) {
        match path {
            [] => {}
            [last] => {
                self.members.insert(last.clone());
            }
            [first, rest @ ..] => self.children.entry(first.clone()).or_default().insert(rest),
        }
    }

    /// Whether `path` is a member.
    pub fn has(&self, path: &[PathElement]) -> bool {
        match path {
            [] => false,
            [last] => self.members.contains(last),
            [first, rest @ ..] => self.children.get(first).is_some_and(|c| c.has(rest)),
        }
    }

    /// The subset below `pe` (paths relative to it).
    pub fn child(&self, pe: &PathElement) -> Option<&FieldSet> {
        self.children.get(pe)
    }

    /// Whether `pe` is a member at this level.
    pub fn has_member(&self, pe: &PathElement) -> bool {
        self.members.contains(pe)
    }

    /// Member path elements at this level.
    pub fn members(&self) -> impl Iterator<Item = &PathElement> {
        self.members.iter()
    }

    /// Child subsets at this level.
    pub fn children(&self) -> impl Iterator<Item = (&PathElement, &FieldSet)> {
        self.children.iter()
    }

    /// Adds a member at this level.
    pub fn insert_member(&mut self, pe: PathElement) {
        self.members.insert(pe);
    }

    /// The subset below `pe`, created if absent.
    pub fn child_mut(&mut self, pe: PathElement) -> &mut FieldSet {
        self.children.entry(pe).or_default()
    }

    /// Every member path, members of a level before the levels below, each level sorted.
    pub fn paths(&self) -> Vec<Path> {
        let mut out = Vec::new();
        self.collect(&mut Vec::new(), &mut out);
        out
    }

    fn collect(&self, prefix: &mut Vec<PathElement>, out: &mut Vec<Path>) {
        for m in &self.members {
            let mut p = prefix.clone();
            p.push(m.clone());
            out.push(Path(p));
        }
        for (pe, c) in &self.children {
            prefix.push(pe.clone());
            c.collect(prefix, out);
            prefix.pop();
        }
    }

    /// `self ∪ other`.
    pub fn union(&self, other: &FieldSet) -> FieldSet {
        let mut out = self.clone();
        out.members.extend(other.members.iter().cloned());
        for (pe, c) in &other.children {
            let merged = match out.children.get(pe) {
                Some(mine) => mine.union(c),
                None => c.clone(),
            };
            out.children.insert(pe.clone(), merged);
        }
        out
    }

    /// `self − other`, member by member.
    pub fn difference(&self, other: &FieldSet) -> FieldSet {
        let mut out = FieldSet::new();
        out.members = self.members.difference(&other.members).cloned().collect();
        for (pe, c) in &self.children {
            let rest = match other.children.get(pe) {
                Some(o) => c.difference(o),
                None => c.clone(),
            };
            if !rest.is_empty() {
                out.children.insert(pe.clone(), rest);
            }
        }
        out
    }

    /// `self ∩ other`, member by member.
    pub fn intersection(&self, other: &FieldSet) -> FieldSet {
        let mut out = FieldSet::new();
        out.members = self.members.intersection(&other.members).cloned().collect();
        for (pe, c) in &self.children {
            if let Some(o) = other.children.get(pe) {
                let both = c.intersection(o);
                if !both.is_empty() {
                    out.children.insert(pe.clone(), both);
                }
            }
        }
        out
    }

    /// Drops empty child subsets, so equality and encoding ignore them.
    pub fn normalized(mut self) -> FieldSet {
        self.children = std::mem::take(&mut self.children)
            .into_iter()
            .map(|(pe, c)| (pe, c.normalized()))
            .filter(|(_, c)| !c.is_empty())
            .collect();
        self
    }

    /// The `fieldsV1` JSON object.
    pub fn to_fields_v1(&self) -> Value {
        let mut out = Map::new();
        let all: BTreeSet<&PathElement> = self.members.iter().chain(self.children.keys()).collect();
        for pe in all {
            let mut obj = Map::new();
            if let Some(c) = self.children.get(pe).filter(|c| !c.is_empty()) {
                if self.members.contains(pe) {
                    obj.insert(".".into(), Value::Object(Map::new()));
                }
                if let Value::Object(inner) = c.to_fields_v1() {
                    obj.extend(inner);
                }
            } else if !self.members.contains(pe) {
                continue;
            }
            out.insert(pe.encode(), Value::Object(obj));
        }
        Value::Object(out)
    }

    /// Parses a `fieldsV1` JSON object.
    pub fn from_fields_v1(v: &Value) -> Result<FieldSet, String> {
        let Value::Object(m) = v else {
            return Err("fieldsV1 must be an object".into());
        };
        let mut out = FieldSet::new();
        for (k, inner) in m {
            if k == "." {
                continue;
            }
            let pe = PathElement::decode(k)?;
            let Value::Object(im) = inner else {
                return Err(format!("fieldsV1 entry {k:?} must be an object"));
            };
            if im.is_empty() || im.contains_key(".") {
                out.members.insert(pe.clone());
            }
            let child = FieldSet::from_fields_v1(inner)?;
            if !child.is_empty() {
                out.children.insert(pe, child);
            }
        }
        Ok(out)
    }
}
