//! The `managedFields` entries: decoding and writing them, the cap on update managers, and the fields a request never owns.

#[allow(clippy::wildcard_imports)]
use super::*;

/// One `managedFields` entry.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Entry {
    pub(super) manager: String,
    pub(super) operation: String,
    pub(super) api_version: String,
    pub(super) time: Option<String>,
    pub(super) subresource: String,
    pub(super) set: FieldSet,
}

impl Entry {
    pub(super) fn is(
        &self,
        manager: &str,
        operation: &str,
        subresource: &str,
        api_version: &str,
    ) -> bool {
        self.manager == manager
            && self.operation == operation
            && self.subresource == subresource
            && (operation == "Apply" || self.api_version == api_version)
    }

    /// The manager as conflict messages name it (`printManager` upstream).
    pub(super) fn describe(&self) -> String {
        let mut s = format!("{:?}", self.manager);
        if !self.subresource.is_empty() {
            s.push_str(&format!(" with subresource {:?}", self.subresource));
        }
        if self.operation == "Update" {
            s.push_str(&format!(" using {}", self.api_version));
        }
        s
    }

    /// The identifier upstream sorts conflicting managers by.
    pub(super) fn identity(&self) -> String {
        let mut m = Map::new();
        if !self.manager.is_empty() {
            m.insert("manager".into(), json!(self.manager));
        }
        m.insert("operation".into(), json!(self.operation));
        if self.operation != "Apply" {
            m.insert("apiVersion".into(), json!(self.api_version));
        }
        if !self.subresource.is_empty() {
            m.insert("subresource".into(), json!(self.subresource));
        }
        Value::Object(m).to_string()
    }

    pub(super) fn encode(&self) -> Value {
        let mut m = Map::new();
        // Upstream leaves an empty manager out (`omitempty`).
        if !self.manager.is_empty() {
            m.insert("manager".into(), json!(self.manager));
        }
        m.insert("operation".into(), json!(self.operation));
        m.insert("apiVersion".into(), json!(self.api_version));
        if let Some(t) = &self.time {
            m.insert("time".into(), json!(t));
        }
        m.insert("fieldsType".into(), json!("FieldsV1"));
        m.insert("fieldsV1".into(), self.set.to_fields_v1());
        if !self.subresource.is_empty() {
            m.insert("subresource".into(), json!(self.subresource));
        }
        Value::Object(m)
    }

    pub(super) fn decode(v: &Value) -> Result<Entry, String> {
        let s = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
        let set = match v.get("fieldsV1") {
            Some(f) if !f.is_null() => FieldSet::from_fields_v1(f)?,
            _ => FieldSet::new(),
        };
        Ok(Entry {
            manager: s("manager").unwrap_or_default(),
            operation: s("operation").unwrap_or_default(),
            api_version: s("apiVersion").unwrap_or_default(),
            time: s("time"),
            subresource: s("subresource").unwrap_or_default(),
            set,
        })
    }
}

pub(super) fn decode_entries(list: Option<&Value>) -> Result<Vec<Entry>, String> {
    let Some(Value::Array(items)) = list else {
        return Ok(Vec::new());
    };
    let mut out: Vec<Entry> = Vec::new();
    for item in items {
        let e = Entry::decode(item)?;
        match out
            .iter_mut()
            .find(|o| o.is(&e.manager, &e.operation, &e.subresource, &e.api_version))
        {
            Some(existing) => existing.set = existing.set.union(&e.set),
            None => out.push(e),
        }
    }
    Ok(out)
}

pub(super) fn managed_fields_of(obj: &Value) -> Option<&Value> {
    obj.get("metadata").and_then(|m| m.get("managedFields"))
}

pub(super) fn without_managed_fields(obj: &Value) -> Value {
    let mut o = obj.clone();
    if let Some(m) = o.get_mut("metadata").and_then(Value::as_object_mut) {
        m.shift_remove("managedFields");
    }
    o
}

/// Sorts entries as the server stores them and writes them into `obj.metadata.managedFields`
/// (removing the key when there are none).
pub(super) fn write_entries(obj: &mut Value, mut entries: Vec<Entry>) {
    entries.retain(|e| !e.set.is_empty());
    cap_update_managers(&mut entries);
    entries.sort_by(|p, q| {
        p.operation
            .cmp(&q.operation)
            .then_with(|| {
                p.time
                    .as_deref()
                    .unwrap_or("")
                    .cmp(q.time.as_deref().unwrap_or(""))
            })
            .then_with(|| p.manager.cmp(&q.manager))
            .then_with(|| p.api_version.cmp(&q.api_version))
            .then_with(|| p.subresource.cmp(&q.subresource))
    });
    let Some(root) = obj.as_object_mut() else {
        return;
    };
    let meta = root.entry("metadata").or_insert_with(|| json!({}));
    let Some(meta) = meta.as_object_mut() else {
        return;
    };
    if entries.is_empty() {
        meta.shift_remove("managedFields");
    } else {
        meta.insert(
            "managedFields".into(),
            Value::Array(entries.iter().map(Entry::encode).collect()),
        );
    }
}

/// The most Update entries an object keeps (upstream `DefaultMaxUpdateManagers`).
pub(super) const MAX_UPDATE_MANAGERS: usize = 10;

/// Folds the oldest Update entries into `ancient-changes` entries (one per apiVersion) until at
/// most [`MAX_UPDATE_MANAGERS`] Update entries remain, as upstream `capManagersManager` does.
pub(super) fn cap_update_managers(entries: &mut Vec<Entry>) {
    let mut updaters: Vec<usize> = (0..entries.len())
        .filter(|i| entries[*i].operation != "Apply")
        .collect();
    if updaters.len() <= MAX_UPDATE_MANAGERS {
        return;
    }
    updaters.sort_by(|a, b| {
        let (x, y) = (&entries[*a], &entries[*b]);
        x.time
            .as_deref()
            .unwrap_or("")
            .cmp(y.time.as_deref().unwrap_or(""))
            .then_with(|| x.identity().cmp(&y.identity()))
    });
    let mut remaining = updaters.len();
    let mut first_of_version: Vec<(String, usize)> = Vec::new();
    let mut dropped: Vec<usize> = Vec::new();
    for i in updaters {
        if remaining <= MAX_UPDATE_MANAGERS {
            break;
        }
        let version = entries[i].api_version.clone();
        match first_of_version
            .iter()
            .find(|(v, _)| *v == version)
            .map(|(_, f)| *f)
        {
            Some(bucket) => {
                let (set, time) = (entries[i].set.clone(), entries[i].time.clone());
                let b = &mut entries[bucket];
                b.manager = "ancient-changes".into();
                b.set = b.set.union(&set);
                b.time = time;
                dropped.push(i);
                remaining -= 1;
            }
            None => first_of_version.push((version, i)),
        }
    }
    dropped.sort_unstable();
    for i in dropped.into_iter().rev() {
        entries.remove(i);
    }
}

/// Paths the server never records as owned (upstream `stripMetaManager`).
pub(super) fn strip_set() -> FieldSet {
    let mut s = FieldSet::new();
    for p in [&["apiVersion"][..], &["kind"], &["metadata"]] {
        s.insert(&fields(p));
    }
    for f in [
        "name",
        "namespace",
        "creationTimestamp",
        "selfLink",
        "uid",
        "clusterName",
        "generation",
        "managedFields",
        "resourceVersion",
    ] {
        s.insert(&fields(&["metadata", f]));
    }
    s
}

pub(super) fn fields(names: &[&str]) -> Vec<PathElement> {
    names
        .iter()
        .map(|n| PathElement::Field((*n).to_owned()))
        .collect()
}

/// Top-level fields a write through this endpoint may not own (the strategy resets them).
pub(super) fn reset_fields(
    rt: Option<&ResourceType>,
    subresource: &str,
) -> &'static [&'static str] {
    match (rt.is_some_and(ResourceType::has_status), subresource) {
        (_, "status") => &["spec"],
        (true, "") => &["status"],
        _ => &[],
    }
}

/// Removes top-level fields and everything below them.
pub(super) fn without_top_level(mut set: FieldSet, names: &[&str]) -> FieldSet {
    let mut drop = FieldSet::new();
    for n in names {
        let pe = PathElement::Field((*n).to_owned());
        if let Some(c) = set.child(&pe) {
            let mut sub = FieldSet::new();
            *sub.child_mut(pe.clone()) = c.clone();
            drop = drop.union(&sub);
        }
        drop.insert_member(pe);
    }
    set = set.difference(&drop);
    set
}
