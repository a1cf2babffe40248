//! Server-side printing: `meta.k8s.io/v1` Table output for kubectl, per kind as the real server.
//!
//! kubectl asks for Tables (`Accept: application/json;as=Table;v=v1;g=meta.k8s.io`) on `get`,
//! and prints the server's columns verbatim. So the columns and the computed cells (pod READY
//! and STATUS, service PORT(S), node ROLES, ages) follow kube-apiserver's printers, and CRDs
//! follow the apiextensions table convertor (`additionalPrinterColumns` evaluated by JSONPath,
//! `date` columns shown as ages).

use jiff::Timestamp;
use serde_json::{Map, Value, json};

use crate::registry::{Origin, PrinterColumn, ResourceType};

mod app_cells;
mod app_columns;
mod columns;
mod core_cells;
mod core_columns;
mod format;
mod jsonpath;
use app_cells::*;
use app_columns::*;
use columns::*;
use core_cells::*;
use core_columns::*;
pub use format::human_duration;
use format::*;
pub use jsonpath::jsonpath_first;
use jsonpath::*;

/// What each Table row carries in `object` (`includeObject` query parameter).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IncludeObject {
    /// No object.
    None,
    /// A `PartialObjectMetadata` (kubectl's default: it needs labels and namespace).
    #[default]
    Metadata,
    /// The full object.
    Object,
}

impl IncludeObject {
    /// Parses the `includeObject` query value; absent or unknown means the default, `Metadata`.
    pub fn parse(query_value: Option<&str>) -> IncludeObject {
        match query_value {
            Some("None") => IncludeObject::None,
            Some("Object") => IncludeObject::Object,
            _ => IncludeObject::Metadata,
        }
    }
}

const NAME_DESCRIPTION: &str = "Name must be unique within a namespace. Is required when creating \
    resources, although some resources may allow a client to request the generation of a name \
    automatically. Name is primarily intended for creation idempotence and configuration \
    definition. Cannot be updated. More info: \
    https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names";

const CREATION_DESCRIPTION: &str = "CreationTimestamp is a timestamp representing the server time \
    when this object was created. It is not guaranteed to be set in happens-before order across \
    separate operations. Clients may not set this value. It is represented in RFC3339 form and is \
    in UTC.";

fn col(name: &str, type_: &str, priority: i32, description: &str) -> PrinterColumn {
    PrinterColumn {
        name: name.to_owned(),
        type_: type_.to_owned(),
        format: String::new(),
        description: description.to_owned(),
        priority,
        json_path: String::new(),
    }
}

fn age_col() -> PrinterColumn {
    col("Age", "string", 0, CREATION_DESCRIPTION)
}

/// Computes a built-in kind's cells after NAME (for Events: all cells), at time `now`.
type CellFn = fn(&Value, Timestamp) -> Vec<Value>;

/// How a built-in kind prints: whether NAME leads (Events put it last, at priority 1), the
/// columns after it and the function computing their cells.
struct Layout {
    name_first: bool,
    columns: Vec<PrinterColumn>,
    cells: CellFn,
}

/// The column definitions after NAME for a built-in kind, as its Table prints them (empty: the
/// default convertor's NAME, CREATED AT). For Events, whose NAME is a wide column at the end,
/// every column is listed.
pub fn builtin_columns(group: &str, kind: &str) -> Vec<PrinterColumn> {
    layout(group, kind).map(|l| l.columns).unwrap_or_default()
}

/// The full column list of a type, NAME included, and how to compute a row's cells.
enum Printer {
    Builtin(Layout),
    /// NAME then the type's printer columns by JSONPath (CRDs).
    Columns(Vec<PrinterColumn>),
    /// kube-apiserver's default convertor: NAME, Created At.
    Default,
}

fn printer(rt: &ResourceType) -> Printer {
    if rt.origin == Origin::Builtin {
        return match layout(&rt.group, &rt.kind) {
            Some(l) => Printer::Builtin(l),
            None => Printer::Default,
        };
    }
    if rt.printer_columns.is_empty() {
        Printer::Default
    } else {
        Printer::Columns(rt.printer_columns.clone())
    }
}

fn name_col() -> PrinterColumn {
    PrinterColumn {
        format: "name".to_owned(),
        ..col("Name", "string", 0, NAME_DESCRIPTION)
    }
}

fn definitions(p: &Printer) -> Vec<Value> {
    let cols: Vec<PrinterColumn> = match p {
        Printer::Builtin(l) if l.name_first => std::iter::once(name_col())
            .chain(l.columns.clone())
            .collect(),
        Printer::Builtin(l) => l.columns.clone(),
        Printer::Columns(c) => std::iter::once(name_col())
            .chain(c.iter().cloned())
            .collect(),
        Printer::Default => vec![
            name_col(),
            col("Created At", "date", 0, CREATION_DESCRIPTION),
        ],
    };
    cols.iter()
        .map(|c| {
            json!({
                "name": c.name,
                "type": c.type_,
                "format": c.format,
                "description": c.description,
                "priority": c.priority,
            })
        })
        .collect()
}

fn cells(p: &Printer, obj: &Value, now: Timestamp) -> Vec<Value> {
    let name = json!(str_at(obj, &["metadata", "name"]));
    match p {
        Printer::Builtin(l) if l.name_first => std::iter::once(builtin_name(obj))
            .chain((l.cells)(obj, now))
            .collect(),
        Printer::Builtin(l) => (l.cells)(obj, now),
        Printer::Columns(cols) => std::iter::once(name)
            .chain(cols.iter().map(|c| column_cell(c, obj, now)))
            .collect(),
        Printer::Default => vec![name, json!(str_at(obj, &["metadata", "creationTimestamp"]))],
    }
}

/// NAME of a built-in object; the default StorageClass is marked as kubectl users know it.
fn builtin_name(obj: &Value) -> Value {
    let name = str_at(obj, &["metadata", "name"]);
    let default_class = [
        "storageclass.kubernetes.io/is-default-class",
        "storageclass.beta.kubernetes.io/is-default-class",
    ]
    .iter()
    .any(|a| {
        obj.pointer("/metadata/annotations")
            .and_then(|m| m.get(*a))
            .and_then(Value::as_str)
            == Some("true")
    });
    if default_class {
        json!(format!("{name} (default)"))
    } else {
        json!(name)
    }
}

fn row_value(p: &Printer, obj: &Value, include: IncludeObject, now: Timestamp) -> Value {
    let mut row = Map::new();
    row.insert("cells".into(), Value::Array(cells(p, obj, now)));
    match include {
        IncludeObject::None => {}
        IncludeObject::Metadata => {
            row.insert("object".into(), partial_metadata(obj));
        }
        IncludeObject::Object => {
            row.insert("object".into(), obj.clone());
        }
    }
    Value::Object(row)
}

/// `PartialObjectMetadata` of an object: what kubectl needs for labels and namespaces.
pub fn partial_metadata(obj: &Value) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj.get("metadata").cloned().unwrap_or_else(|| json!({})),
    })
}

/// A Table of `objects`, with `list_metadata` (`resourceVersion`, `continue`,
/// `remainingItemCount`) as the Table's metadata. Ages are relative to the current time.
pub fn to_table(
    rt: &ResourceType,
    objects: &[Value],
    include: IncludeObject,
    list_metadata: Value,
) -> Value {
    to_table_at(rt, objects, include, list_metadata, Timestamp::now())
}

/// [`to_table`] with ages relative to `now`, for reproducible output.
pub fn to_table_at(
    rt: &ResourceType,
    objects: &[Value],
    include: IncludeObject,
    list_metadata: Value,
    now: Timestamp,
) -> Value {
    let p = printer(rt);
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": list_metadata,
        "columnDefinitions": definitions(&p),
        "rows": objects.iter().map(|o| row_value(&p, o, include, now)).collect::<Vec<_>>(),
    })
}

/// A one-row Table for a single GET or a watch event (ADDED, MODIFIED and DELETED alike), with
/// the column definitions repeated so every event stands alone.
pub fn row(rt: &ResourceType, obj: &Value, include: IncludeObject) -> Value {
    row_at(rt, obj, include, Timestamp::now())
}

/// [`row`] with ages relative to `now`.
pub fn row_at(rt: &ResourceType, obj: &Value, include: IncludeObject, now: Timestamp) -> Value {
    let rv = obj
        .pointer("/metadata/resourceVersion")
        .cloned()
        .unwrap_or(Value::Null);
    let meta = if rv.is_null() {
        json!({})
    } else {
        json!({ "resourceVersion": rv })
    };
    to_table_at(rt, std::slice::from_ref(obj), include, meta, now)
}

#[cfg(test)]
mod tests;
