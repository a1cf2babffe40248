//! Field sets of objects and the merge of an applied configuration into the live object: map lists by key, set lists by value, atomic values whole.

#[allow(clippy::wildcard_imports)]
use super::*;

/// The path element of a list item.
pub(super) fn item_pe(lt: &ListType, index: usize, item: &Value) -> PathElement {
    match lt {
        ListType::Atomic => PathElement::Index(index),
        ListType::Set => PathElement::value(item),
        ListType::Map(keys) => {
            let fields: Vec<(String, Value)> = keys
                .iter()
                .filter_map(|(k, default)| {
                    item.get(k)
                        .or(default.as_ref())
                        .map(|v| (k.clone(), v.clone()))
                })
                .collect();
            if fields.is_empty() {
                PathElement::Index(index)
            } else {
                PathElement::key(&fields)
            }
        }
    }
}

/// The ownership set of a value. With `all_nodes`, every node a change touches is included
/// (the "added"/"removed" sets of a comparison); otherwise only what applying the value claims.
pub(super) fn collect(
    v: &Value,
    node: Node<'_>,
    top: bool,
    path: &mut Vec<PathElement>,
    set: &mut FieldSet,
    all_nodes: bool,
) {
    match v {
        Value::Object(m) => {
            let kind = node.obj_kind();
            if kind == ObjKind::Atomic {
                set.insert(path);
                return;
            }
            if all_nodes && (kind == ObjKind::Map || m.is_empty()) {
                set.insert(path);
            }
            for (k, cv) in m {
                let (child, declared) = node.child(k, top);
                path.push(PathElement::Field(k.clone()));
                collect(cv, child, false, path, set, all_nodes);
                let empty = cv.is_null() || cv.as_object().is_some_and(Map::is_empty);
                if empty || !declared {
                    set.insert(path);
                }
                path.pop();
            }
        }
        Value::Array(a) => {
            let (lt, elem) = node.list();
            if lt == ListType::Atomic || all_nodes {
                set.insert(path);
            }
            if lt == ListType::Atomic {
                return;
            }
            for (i, item) in a.iter().enumerate() {
                path.push(item_pe(&lt, i, item));
                if matches!(lt, ListType::Map(_)) {
                    collect(item, elem, false, path, set, all_nodes);
                }
                set.insert(path);
                path.pop();
            }
        }
        _ => set.insert(path),
    }
}

pub(super) fn field_set(v: &Value, node: Node<'_>) -> FieldSet {
    let mut set = FieldSet::new();
    collect(v, node, true, &mut Vec::new(), &mut set, false);
    set
}

/// What changed between two versions of an object.
#[derive(Debug, Default)]
pub(super) struct Comparison {
    pub(super) added: FieldSet,
    pub(super) modified: FieldSet,
    pub(super) removed: FieldSet,
}

pub(super) fn compare(
    l: Option<&Value>,
    r: Option<&Value>,
    node: Node<'_>,
    top: bool,
    path: &mut Vec<PathElement>,
    out: &mut Comparison,
) {
    match (l, r) {
        (None, None) => {}
        (None, Some(b)) => {
            out.added.insert(path);
            collect(b, node, top, path, &mut out.added, true);
        }
        (Some(a), None) => {
            out.removed.insert(path);
            collect(a, node, top, path, &mut out.removed, true);
        }
        (Some(Value::Object(a)), Some(Value::Object(b))) if node.obj_kind() != ObjKind::Atomic => {
            let keys: Vec<&String> = a
                .keys()
                .chain(b.keys().filter(|k| !a.contains_key(*k)))
                .collect();
            for k in keys {
                let (child, _) = node.child(k, top);
                path.push(PathElement::Field(k.clone()));
                compare(a.get(k), b.get(k), child, false, path, out);
                path.pop();
            }
        }
        (Some(Value::Array(a)), Some(Value::Array(b))) if node.list().0 != ListType::Atomic => {
            let (lt, elem) = node.list();
            let la: Vec<(PathElement, &Value)> = a
                .iter()
                .enumerate()
                .map(|(i, v)| (item_pe(&lt, i, v), v))
                .collect();
            let lb: Vec<(PathElement, &Value)> = b
                .iter()
                .enumerate()
                .map(|(i, v)| (item_pe(&lt, i, v), v))
                .collect();
            let mut seen: Vec<&PathElement> = Vec::new();
            for (pe, _) in la.iter().chain(lb.iter()) {
                if seen.contains(&pe) {
                    continue;
                }
                seen.push(pe);
                path.push(pe.clone());
                let (x, y) = (find_item(&la, pe), find_item(&lb, pe));
                if matches!(lt, ListType::Map(_)) {
                    compare(x, y, elem, false, path, out);
                } else {
                    compare(x, y, Node::Deduced, false, path, out);
                }
                path.pop();
            }
        }
        (Some(a), Some(b)) => {
            if a != b {
                out.modified.insert(path);
            }
        }
    }
}

impl Comparison {
    /// The comparison with the given top-level fields (and everything below) left out.
    pub(super) fn without(self, top_level: &[&str]) -> Comparison {
        Comparison {
            added: without_top_level(self.added, top_level),
            modified: without_top_level(self.modified, top_level),
            removed: without_top_level(self.removed, top_level),
        }
    }
}

pub(super) fn find_item<'v>(l: &[(PathElement, &'v Value)], pe: &PathElement) -> Option<&'v Value> {
    l.iter().find(|(p, _)| p == pe).map(|(_, v)| *v)
}

pub(super) fn comparison(l: &Value, r: &Value, node: Node<'_>) -> Comparison {
    let mut out = Comparison::default();
    compare(Some(l), Some(r), node, true, &mut Vec::new(), &mut out);
    out
}

/// Merges an applied configuration into a live value (the configuration wins).
pub(super) fn merge(lhs: Option<&Value>, rhs: &Value, node: Node<'_>, top: bool) -> Value {
    match (lhs, rhs) {
        (Some(Value::Object(l)), Value::Object(r)) if node.obj_kind() != ObjKind::Atomic => {
            let mut out = l.clone();
            for (k, rv) in r {
                let (child, _) = node.child(k, top);
                let merged = merge(l.get(k), rv, child, false);
                out.insert(k.clone(), merged);
            }
            Value::Object(out)
        }
        (Some(Value::Array(l)), Value::Array(r)) => {
            let (lt, elem) = node.list();
            match lt {
                ListType::Atomic => rhs.clone(),
                _ => Value::Array(merge_list(l, r, &lt, elem)),
            }
        }
        _ => rhs.clone(),
    }
}

/// Merges associative lists with upstream's ordering: live-only items stay where they were,
/// applied items follow the applied order, shared items move to the applied order.
pub(super) fn merge_list(l: &[Value], r: &[Value], lt: &ListType, elem: Node<'_>) -> Vec<Value> {
    let lpe: Vec<PathElement> = l
        .iter()
        .enumerate()
        .map(|(i, v)| item_pe(lt, i, v))
        .collect();
    let rpe: Vec<PathElement> = r
        .iter()
        .enumerate()
        .map(|(i, v)| item_pe(lt, i, v))
        .collect();
    let l_at = |pe: &PathElement| lpe.iter().position(|p| p == pe).map(|i| &l[i]);
    let r_has = |pe: &PathElement| rpe.contains(pe);
    let mut shared: std::collections::VecDeque<&PathElement> =
        rpe.iter().filter(|pe| lpe.contains(pe)).collect();
    let mut next_shared = shared.pop_front();
    let mut merged_r: Vec<PathElement> = Vec::new();
    let item = |lv: Option<&Value>, rv: &Value| match lt {
        ListType::Map(_) => merge(lv, rv, elem, false),
        _ => rv.clone(),
    };
    let mut out = Vec::with_capacity(l.len().max(r.len()));
    let (mut li, mut ri) = (0, 0);
    while li < l.len() || ri < r.len() {
        if li < l.len() && ri < r.len() {
            let pe = &lpe[li];
            if *pe == rpe[ri] {
                merged_r.push(pe.clone());
                out.push(item(Some(&l[li]), &r[ri]));
                li += 1;
                ri += 1;
                next_shared = shared.pop_front();
                continue;
            }
            if r_has(pe) && next_shared.is_some_and(|n| n != pe) {
                li += 1;
                continue;
            }
        }
        if li < l.len() {
            let pe = &lpe[li];
            if !r_has(pe) {
                out.push(l[li].clone());
                li += 1;
                continue;
            } else if merged_r.contains(pe) || ri >= r.len() {
                // The second condition cannot hold (every applied item is merged by the time
                // `ri` ends) but guarantees progress.
                li += 1;
                continue;
            }
        }
        if ri < r.len() {
            let pe = &rpe[ri];
            merged_r.push(pe.clone());
            out.push(item(l_at(pe), &r[ri]));
            ri += 1;
            if next_shared == Some(pe) {
                next_shared = shared.pop_front();
            }
        }
    }
    out
}

/// Adds, as members, the declared struct fields on the way to every path of `set` (upstream
/// `EnsureNamedFieldsAreMembers`), so dropping the last owned field of a struct drops the struct.
pub(super) fn ensure_named(set: &FieldSet, node: Node<'_>, top: bool) -> FieldSet {
    let mut out = FieldSet::new();
    for m in set.members() {
        out.insert_member(m.clone());
    }
    for (pe, sub) in set.children() {
        let child = match pe {
            PathElement::Field(name) => {
                let (child, declared) = node.child(name, top);
                if declared && node.obj_kind() == ObjKind::Struct && !sub.is_empty() {
                    out.insert_member(pe.clone());
                }
                child
            }
            _ => node.list().1,
        };
        *out.child_mut(pe.clone()) = ensure_named(sub, child, false);
    }
    out.normalized()
}

/// Removes the member paths of `set` from `v`.
pub(super) fn remove_items(v: &mut Value, set: &FieldSet, node: Node<'_>, top: bool) {
    match v {
        Value::Object(m) => {
            for pe in set.members() {
                if let PathElement::Field(name) = pe {
                    m.shift_remove(name);
                }
            }
            for (pe, sub) in set.children() {
                if let PathElement::Field(name) = pe
                    && let Some(cv) = m.get_mut(name)
                {
                    let (child, _) = node.child(name, top);
                    remove_items(cv, sub, child, false);
                }
            }
        }
        Value::Array(a) => {
            let (lt, elem) = node.list();
            let items = std::mem::take(a);
            for (i, mut item) in items.into_iter().enumerate() {
                let pe = item_pe(&lt, i, &item);
                if set.has_member(&pe) {
                    continue;
                }
                if let Some(sub) = set.child(&pe) {
                    remove_items(&mut item, sub, elem, false);
                }
                a.push(item);
            }
        }
        _ => {}
    }
}
