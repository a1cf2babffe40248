//! Label and field selectors, parsed and matched with kube-apiserver's rules and error wording.
//!
//! Label selectors follow the grammar of apimachinery's `labels.Parse`: comma-separated
//! requirements `k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k`, `!k`, `k>1`, `k<1`,
//! whitespace tolerated between tokens, keys validated as qualified names and values as label
//! values. Field selectors follow `fields.ParseSelector`: `=`, `==`, `!=`, comma means AND,
//! backslash escapes, and only whitelisted field labels.

// `ApiError` is the crate-wide error answered to clients; boxing it here only to please the
// size lint would make every caller unbox it again.
#![allow(clippy::result_large_err)]

use std::collections::BTreeSet;
use std::fmt;

use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::registry::ResourceType;

/// The relation a label requirement checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LabelOp {
    /// `k=v`.
    Equals,
    /// `k==v`.
    DoubleEquals,
    /// `k!=v`: true when the label is absent too.
    NotEquals,
    /// `k in (a,b)`.
    In,
    /// `k notin (a,b)`: true when the label is absent too.
    NotIn,
    /// `k`.
    Exists,
    /// `!k`.
    DoesNotExist,
    /// `k>n`: both sides integers.
    GreaterThan,
    /// `k<n`: both sides integers.
    LessThan,
}

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Requirement {
    /// The label key, with its optional DNS prefix.
    pub key: String,
    /// The relation.
    pub op: LabelOp,
    /// The values, sorted and deduplicated (empty for `Exists` / `DoesNotExist`).
    pub values: BTreeSet<String>,
}

impl Requirement {
    fn new(key: &str, op: LabelOp, values: BTreeSet<String>) -> Result<Self, String> {
        validate_label_key(key)?;
        match op {
            LabelOp::In | LabelOp::NotIn if values.is_empty() => {
                return Err("for 'in', 'notin' operators, values set can't be empty".into());
            }
            LabelOp::Equals | LabelOp::DoubleEquals | LabelOp::NotEquals if values.len() != 1 => {
                return Err("exact-match compatibility requires one single value".into());
            }
            LabelOp::Exists | LabelOp::DoesNotExist if !values.is_empty() => {
                return Err("values set must be empty for exists and does not exist".into());
            }
            LabelOp::GreaterThan | LabelOp::LessThan => {
                if values.len() != 1 {
                    return Err("for 'Gt', 'Lt' operators, exactly one value is required".into());
                }
                for v in &values {
                    if v.parse::<i64>().is_err() {
                        return Err(
                            "for 'Gt', 'Lt' operators, the value must be an integer".to_owned()
                        );
                    }
                }
            }
            _ => {}
        }
        for (i, v) in values.iter().enumerate() {
            if !matches!(op, LabelOp::GreaterThan | LabelOp::LessThan) {
                validate_label_value(v)
                    .map_err(|m| format!("values[{i}][{key}]: Invalid value: {v:?}: {m}"))?;
            }
        }
        Ok(Self {
            key: key.to_owned(),
            op,
            values,
        })
    }

    /// Whether a label set satisfies this requirement.
    pub fn matches(&self, labels: &Map<String, Value>) -> bool {
        let value = labels.get(&self.key).map(label_text);
        match self.op {
            LabelOp::Equals | LabelOp::DoubleEquals | LabelOp::In => {
                value.is_some_and(|v| self.values.contains(&v))
            }
            LabelOp::NotEquals | LabelOp::NotIn => value.is_none_or(|v| !self.values.contains(&v)),
            LabelOp::Exists => value.is_some(),
            LabelOp::DoesNotExist => value.is_none(),
            LabelOp::GreaterThan | LabelOp::LessThan => {
                let Some(have) = value.and_then(|v| v.parse::<i64>().ok()) else {
                    return false;
                };
                let Some(want) = self
                    .values
                    .iter()
                    .next()
                    .and_then(|v| v.parse::<i64>().ok())
                else {
                    return false;
                };
                if self.op == LabelOp::GreaterThan {
                    have > want
                } else {
                    have < want
                }
            }
        }
    }
}

/// Labels are strings; anything else stored under `labels` is compared by its JSON text.
fn label_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let first = self
            .values
            .iter()
            .next()
            .map(String::as_str)
            .unwrap_or_default();
        let list = self
            .values
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join(",");
        match self.op {
            LabelOp::Equals => write!(f, "{}={first}", self.key),
            LabelOp::DoubleEquals => write!(f, "{}=={first}", self.key),
            LabelOp::NotEquals => write!(f, "{}!={first}", self.key),
            LabelOp::In => write!(f, "{} in ({list})", self.key),
            LabelOp::NotIn => write!(f, "{} notin ({list})", self.key),
            LabelOp::Exists => write!(f, "{}", self.key),
            LabelOp::DoesNotExist => write!(f, "!{}", self.key),
            LabelOp::GreaterThan => write!(f, "{}>{first}", self.key),
            LabelOp::LessThan => write!(f, "{}<{first}", self.key),
        }
    }
}

/// A parsed label selector: the AND of its requirements.
///
/// Two special values exist, as in apimachinery: the *empty* selector (no requirements) matches
/// every object, and the *nothing* selector (from a `null` `metav1.LabelSelector`) matches none.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
    nothing: bool,
}

impl LabelSelector {
    /// Parses the `labelSelector` query parameter. Errors are 400 BadRequest worded like
    /// apimachinery's parser (`found ',', expected: ...`, `unable to parse requirement: ...`).
    pub fn parse(s: &str) -> Result<LabelSelector, ApiError> {
        Parser::new(s).parse().map_err(ApiError::bad_request)
    }

    /// Converts a `metav1.LabelSelector` object (`matchLabels`, `matchExpressions`).
    ///
    /// `null` matches nothing; `{}` matches everything (the rule Deployments, Services and
    /// NetworkPolicies follow). An unknown operator or bad key/value is a 400 BadRequest.
    pub fn from_object(sel: &Value) -> Result<LabelSelector, ApiError> {
        let obj = match sel {
            Value::Null => {
                return Ok(Self {
                    requirements: Vec::new(),
                    nothing: true,
                });
            }
            Value::Object(o) => o,
            other => {
                return Err(ApiError::bad_request(format!(
                    "a label selector must be an object, not {other}"
                )));
            }
        };
        let mut reqs = Vec::new();
        if let Some(labels) = obj.get("matchLabels").and_then(Value::as_object) {
            for (k, v) in labels {
                let val = v.as_str().unwrap_or_default().to_owned();
                let r = Requirement::new(k, LabelOp::Equals, BTreeSet::from([val]))
                    .map_err(|e| ApiError::bad_request(req_error(k, e)))?;
                reqs.push(r);
            }
        }
        if let Some(exprs) = obj.get("matchExpressions").and_then(Value::as_array) {
            for e in exprs {
                let key = e.get("key").and_then(Value::as_str).unwrap_or_default();
                let op_name = e
                    .get("operator")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let op = match op_name {
                    "In" => LabelOp::In,
                    "NotIn" => LabelOp::NotIn,
                    "Exists" => LabelOp::Exists,
                    "DoesNotExist" => LabelOp::DoesNotExist,
                    other => {
                        return Err(ApiError::bad_request(format!(
                            "{other:?} is not a valid label selector operator"
                        )));
                    }
                };
                let values: BTreeSet<String> = e
                    .get("values")
                    .and_then(Value::as_array)
                    .map(|vs| {
                        vs.iter()
                            .filter_map(Value::as_str)
                            .map(str::to_owned)
                            .collect()
                    })
                    .unwrap_or_default();
                let r = Requirement::new(key, op, values)
                    .map_err(|m| ApiError::bad_request(req_error(key, m)))?;
                reqs.push(r);
            }
        }
        reqs.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(Self {
            requirements: reqs,
            nothing: false,
        })
    }

    /// Whether the labels satisfy every requirement.
    pub fn matches(&self, labels: &Map<String, Value>) -> bool {
        !self.nothing && self.requirements.iter().all(|r| r.matches(labels))
    }

    /// Whether this selector matches everything (no requirements, not the `null` selector).
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty() && !self.nothing
    }

    /// The requirements, sorted by key as apimachinery keeps them.
    pub fn requirements(&self) -> &[Requirement] {
        &self.requirements
    }
}

impl fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.requirements.iter().map(ToString::to_string).collect();
        f.write_str(&parts.join(","))
    }
}

/// Key errors carry apimachinery's nil field path; value errors already carry their path.
fn req_error(key: &str, msg: String) -> String {
    if msg.starts_with("values[") || msg.starts_with("for '") || msg.starts_with("values set") {
        format!("unable to parse requirement: {msg}")
    } else if msg.starts_with("exact-match") {
        msg
    } else {
        format!("unable to parse requirement: <nil>: Invalid value: {key:?}: {msg}")
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Identifier(String),
    DoesNotExist,
    Equals,
    DoubleEquals,
    NotEquals,
    GreaterThan,
    LessThan,
    In,
    NotIn,
    OpenPar,
    ClosePar,
    Comma,
    End,
}

impl Token {
    /// The literal as the Go lexer reports it in "found '...'" messages.
    fn literal(&self) -> String {
        match self {
            Token::Identifier(s) => s.clone(),
            Token::DoesNotExist => "!".into(),
            Token::Equals => "=".into(),
            Token::DoubleEquals => "==".into(),
            Token::NotEquals => "!=".into(),
            Token::GreaterThan => ">".into(),
            Token::LessThan => "<".into(),
            Token::In => "in".into(),
            Token::NotIn => "notin".into(),
            Token::OpenPar => "(".into(),
            Token::ClosePar => ")".into(),
            Token::Comma => ",".into(),
            Token::End => String::new(),
        }
    }
}

fn is_special(c: char) -> bool {
    matches!(c, '=' | '!' | '(' | ')' | ',' | '>' | '<')
}

fn lex(s: &str) -> Vec<Token> {
    let chars: Vec<char> = s.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
            continue;
        }
        let next = chars.get(i + 1).copied();
        let (tok, len) = match (c, next) {
            ('!', Some('=')) => (Token::NotEquals, 2),
            ('=', Some('=')) => (Token::DoubleEquals, 2),
            ('!', _) => (Token::DoesNotExist, 1),
            ('=', _) => (Token::Equals, 1),
            ('>', _) => (Token::GreaterThan, 1),
            ('<', _) => (Token::LessThan, 1),
            ('(', _) => (Token::OpenPar, 1),
            (')', _) => (Token::ClosePar, 1),
            (',', _) => (Token::Comma, 1),
            _ => {
                let start = i;
                let mut j = i;
                while j < chars.len() && !chars[j].is_whitespace() && !is_special(chars[j]) {
                    j += 1;
                }
                let word: String = chars[start..j].iter().collect();
                let tok = match word.as_str() {
                    "in" => Token::In,
                    "notin" => Token::NotIn,
                    _ => Token::Identifier(word),
                };
                (tok, j - start)
            }
        };
        out.push(tok);
        i += len;
    }
    out.push(Token::End);
    out
}

struct Parser {
    tokens: Vec<Token>,
    pos: usize,
}

impl Parser {
    fn new(s: &str) -> Self {
        Self {
            tokens: lex(s),
            pos: 0,
        }
    }

    fn peek(&self) -> &Token {
        self.tokens.get(self.pos).unwrap_or(&Token::End)
    }

    fn next(&mut self) -> Token {
        let t = self.peek().clone();
        if self.pos < self.tokens.len() {
            self.pos += 1;
        }
        t
    }

    /// Keywords are ordinary identifiers where a key or value is expected (`in=notin` is valid).
    fn ident_like(t: &Token) -> Option<String> {
        match t {
            Token::Identifier(s) => Some(s.clone()),
            Token::In => Some("in".into()),
            Token::NotIn => Some("notin".into()),
            _ => None,
        }
    }

    fn parse(mut self) -> Result<LabelSelector, String> {
        let mut reqs = Vec::new();
        loop {
            match self.peek().clone() {
                Token::End => break,
                Token::Identifier(_) | Token::DoesNotExist | Token::In | Token::NotIn => {
                    reqs.push(self.requirement()?);
                    match self.next() {
                        Token::End => break,
                        Token::Comma => {
                            let t = self.peek().clone();
                            if Self::ident_like(&t).is_none() && t != Token::DoesNotExist {
                                return Err(format!(
                                    "found '{}', expected: identifier after ','",
                                    t.literal()
                                ));
                            }
                        }
                        t => {
                            return Err(format!(
                                "found '{}', expected: ',' or 'end of string'",
                                t.literal()
                            ));
                        }
                    }
                }
                t => {
                    return Err(format!(
                        "found '{}', expected: !, identifier, or 'end of string'",
                        t.literal()
                    ));
                }
            }
        }
        reqs.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(LabelSelector {
            requirements: reqs,
            nothing: false,
        })
    }

    fn requirement(&mut self) -> Result<Requirement, String> {
        let mut negated = false;
        if *self.peek() == Token::DoesNotExist {
            self.next();
            negated = true;
        }
        let t = self.next();
        let Some(key) = Self::ident_like(&t) else {
            return Err(format!("found '{}', expected: identifier", t.literal()));
        };
        validate_label_key(&key).map_err(|m| req_error(&key, m))?;
        if matches!(self.peek(), Token::End | Token::Comma) || negated {
            let op = if negated {
                LabelOp::DoesNotExist
            } else {
                LabelOp::Exists
            };
            return Requirement::new(&key, op, BTreeSet::new()).map_err(|m| req_error(&key, m));
        }
        let op = match self.next() {
            Token::In => LabelOp::In,
            Token::NotIn => LabelOp::NotIn,
            Token::Equals => LabelOp::Equals,
            Token::DoubleEquals => LabelOp::DoubleEquals,
            Token::NotEquals => LabelOp::NotEquals,
            Token::GreaterThan => LabelOp::GreaterThan,
            Token::LessThan => LabelOp::LessThan,
            t => {
                return Err(format!(
                    "found '{}', expected: in, notin, =, ==, !=, gt, lt",
                    t.literal()
                ));
            }
        };
        let values = if matches!(op, LabelOp::In | LabelOp::NotIn) {
            self.value_set()?
        } else {
            self.exact_value()?
        };
        Requirement::new(&key, op, values).map_err(|m| req_error(&key, m))
    }

    fn value_set(&mut self) -> Result<BTreeSet<String>, String> {
        let t = self.next();
        if t != Token::OpenPar {
            return Err(format!("found '{}', expected: '('", t.literal()));
        }
        let mut set = BTreeSet::new();
        if *self.peek() == Token::ClosePar {
            // `in ()` is the set holding the empty value, as in apimachinery.
            self.next();
            set.insert(String::new());
            return Ok(set);
        }
        // Values separated by commas; an empty slot between commas is the empty value.
        let mut expect_value = true;
        loop {
            let t = self.next();
            match t {
                Token::ClosePar => {
                    if expect_value {
                        set.insert(String::new());
                    }
                    return Ok(set);
                }
                Token::Comma => {
                    if expect_value {
                        set.insert(String::new());
                    }
                    expect_value = true;
                }
                ref other => {
                    let Some(v) = Self::ident_like(other) else {
                        return Err(format!(
                            "found '{}', expected: ',', ')' or identifier",
                            other.literal()
                        ));
                    };
                    if !expect_value {
                        return Err(format!("found '{v}', expected: ',' or ')'"));
                    }
                    set.insert(v);
                    expect_value = false;
                }
            }
        }
    }

    fn exact_value(&mut self) -> Result<BTreeSet<String>, String> {
        match self.peek().clone() {
            Token::End | Token::Comma => Ok(BTreeSet::from([String::new()])),
            t => match Self::ident_like(&t) {
                Some(v) => {
                    self.next();
                    Ok(BTreeSet::from([v]))
                }
                None => Err(format!("found '{}', expected: identifier", t.literal())),
            },
        }
    }
}

const NAME_FMT_MSG: &str = "name part must consist of alphanumeric characters, '-', '_' or '.', \
and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or \
'123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";

const VALUE_FMT_MSG: &str = "a valid label must be an empty string or consist of alphanumeric \
characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. \
'MyValue',  or 'my_value',  or '12345', regex used for validation is \
'(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`.
fn is_qualified_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// Validates a label key as apimachinery's `IsQualifiedName` does.
pub fn validate_label_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if name.contains('/') {
        return Err(format!(
            "a qualified name must consist of alphanumeric characters, '-', '_' or '.', and \
             must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  \
             or '123-abc', regex used for validation is \
             '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix \
             and '/' (e.g. 'example.com/MyName') {key:?}"
        ));
    }
    if let Some(p) = prefix {
        if p.is_empty() {
            return Err("prefix part must be non-empty".into());
        }
        if !crate::names::is_dns1123_subdomain(p) {
            return Err(format!(
                "prefix part a lowercase RFC 1123 subdomain must consist of lower case \
                 alphanumeric characters, '-' or '.', and must start and end with an \
                 alphanumeric character (e.g. 'example.com', regex used for validation is \
                 '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*') {p:?}"
            ));
        }
    }
    if name.is_empty() {
        return Err("name part must be non-empty".into());
    }
    if name.len() > 63 {
        return Err("name part must be no more than 63 characters".into());
    }
    if !is_qualified_name_part(name) {
        return Err(NAME_FMT_MSG.into());
    }
    Ok(())
}

/// Validates a label value as apimachinery's `IsValidLabelValue` does (empty is valid).
pub fn validate_label_value(v: &str) -> Result<(), String> {
    if v.len() > 63 {
        return Err("must be no more than 63 characters".into());
    }
    if !v.is_empty() && !is_qualified_name_part(v) {
        return Err(VALUE_FMT_MSG.into());
    }
    Ok(())
}

/// The relation a field requirement checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldOp {
    /// `f=v` or `f==v`.
    Equals,
    /// `f!=v`.
    NotEquals,
}

/// One term of a field selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldRequirement {
    /// The field label, e.g. `spec.nodeName`.
    pub field: String,
    /// The relation.
    pub op: FieldOp,
    /// The unescaped value.
    pub value: String,
}

/// A parsed field selector: the AND of its terms.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FieldSelector {
    requirements: Vec<FieldRequirement>,
}

/// Field labels that read a boolean: the real server renders a missing one as `false`.
const BOOL_FIELDS: &[&str] = &["spec.hostNetwork", "spec.unschedulable"];

impl FieldSelector {
    /// Parses the `fieldSelector` query parameter for one resource type. Supported fields are
    /// `metadata.name`, `metadata.namespace` and `rt.selectable_fields`; any other →
    /// 400 `field label not supported: <field>`. Syntax errors →
    /// 400 `invalid selector: '<s>'; can't understand '<term>'`.
    pub fn parse(s: &str, rt: &ResourceType) -> Result<FieldSelector, ApiError> {
        let mut requirements = Vec::new();
        for term in split_unescaped(s, ',') {
            if term.is_empty() {
                continue;
            }
            let Some((lhs, op, rhs)) = split_term(&term) else {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: '{s}'; can't understand '{term}'"
                )));
            };
            let value = unescape(rhs).map_err(ApiError::bad_request)?;
            let supported = lhs == "metadata.name"
                || lhs == "metadata.namespace"
                || rt.selectable_fields.iter().any(|f| f == lhs);
            if !supported {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {lhs}"
                )));
            }
            requirements.push(FieldRequirement {
                field: lhs.to_owned(),
                op,
                value,
            });
        }
        Ok(Self { requirements })
    }

    /// Whether the object satisfies every term. A missing field reads as the empty string
    /// (as `false` for the boolean fields the real server exposes).
    pub fn matches(&self, obj: &Value) -> bool {
        self.requirements.iter().all(|r| {
            let have = field_value(obj, &r.field);
            match r.op {
                FieldOp::Equals => have == r.value,
                FieldOp::NotEquals => have != r.value,
            }
        })
    }

    /// Whether there are no terms (matches everything).
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// The terms in the order given.
    pub fn requirements(&self) -> &[FieldRequirement] {
        &self.requirements
    }

    /// The value a single `metadata.name=<x>` (or `==`) term asks for, so a caller can turn
    /// the common kube-rs `watch_object` shape into a point lookup.
    pub fn exact_name(&self) -> Option<&str> {
        match self.requirements.as_slice() {
            [r] if r.field == "metadata.name" && r.op == FieldOp::Equals => Some(&r.value),
            _ => None,
        }
    }
}

/// The string the real server's field-label conversion yields for `field` of `obj`.
pub fn field_value(obj: &Value, field: &str) -> String {
    let mut cur = obj;
    for part in field.split('.') {
        match cur.get(part) {
            Some(v) => cur = v,
            None => {
                return if BOOL_FIELDS.contains(&field) {
                    "false".into()
                } else {
                    String::new()
                };
            }
        }
    }
    match cur {
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::Null => {
            if BOOL_FIELDS.contains(&field) {
                "false".into()
            } else {
                String::new()
            }
        }
        // Events expose `source` as `source.component`.
        Value::Object(o) if field == "source" => o
            .get("component")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
        other => other.to_string(),
    }
}

/// Splits on `sep` where it is not escaped by a backslash; escapes are kept for `unescape`.
fn split_unescaped(s: &str, sep: char) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut escaped = false;
    for c in s.chars() {
        if escaped {
            cur.push(c);
            escaped = false;
        } else if c == '\\' {
            cur.push(c);
            escaped = true;
        } else if c == sep {
            out.push(std::mem::take(&mut cur));
        } else {
            cur.push(c);
        }
    }
    out.push(cur);
    out
}

/// Finds the first unescaped operator, trying `!=`, `==`, `=` at each position.
fn split_term(term: &str) -> Option<(&str, FieldOp, &str)> {
    let bytes = term.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' {
            i += 2;
            continue;
        }
        let rest = &term[i..];
        if rest.starts_with("!=") {
            return Some((&term[..i], FieldOp::NotEquals, &term[i + 2..]));
        }
        if rest.starts_with("==") {
            return Some((&term[..i], FieldOp::Equals, &term[i + 2..]));
        }
        if rest.starts_with('=') {
            return Some((&term[..i], FieldOp::Equals, &term[i + 1..]));
        }
        i += 1;
    }
    None
}

/// `fields.UnescapeValue`, with its error wording (a bare special character is reported by
/// its code point, as Go's `%v` prints a rune).
fn unescape(s: &str) -> Result<String, String> {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next() {
                Some(e @ ('\\' | ',' | '=')) => out.push(e),
                Some(other) => {
                    return Err(format!(
                        "invalid field selector: invalid escape sequence: \\{other}"
                    ));
                }
                None => return Err("invalid field selector: invalid escape sequence: \\".into()),
            }
        } else if c == ',' || c == '=' {
            return Err(format!(
                "invalid field selector: unescaped character in value: {}",
                u32::from(c)
            ));
        } else {
            out.push(c);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
