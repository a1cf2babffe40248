//! Protobuf request bodies (`application/vnd.kubernetes.protobuf`), which kubectl 1.32+ sends
//! for its imperative commands (`create namespace|configmap|secret|deployment|token|role|...`,
//! `auth can-i`, `certificate approve`, `drain`). The bytes are parsed by the `k8s-pb` crate's
//! generated Kubernetes message types; [`messages`] turns those into the JSON object the
//! handlers take, field by field, with Kubernetes' JSON conventions (RFC 3339 times,
//! int-or-string, quantities, base64 bytes). Answers stay JSON, which every client accepts.
//!
//! The wire format cannot tell a Go field left at its zero value from one set to it, so the
//! JSON form follows what kube-apiserver's JSON encoder prints for the decoded Go struct where
//! that is knowable: empty strings, lists and maps are left out (they are `omitempty`, or absent
//! in Go), an unset timestamp is `null`, and present messages are objects even when empty
//! (`resources: {}`). Zero numbers and `false` are left out too, except in the fields that are
//! pointers in Go (a Deployment's `replicas: 0` means something) or lack `omitempty`.
//!
//! Every field of a converted message is either converted or, for the rare ones not yet
//! converted (a container's probes, a pod's volumes), refused when set: the compiler checks that
//! each message lists all its fields, so no field is ever dropped silently. Kinds without a
//! conversion are refused with 415 and the advice to send JSON.

mod messages;

use std::collections::BTreeMap;

use base64::Engine;
use k8s_pb::apimachinery::pkg::runtime::Unknown;
use prost::Message;
use serde_json::{Map, Value};

/// The four bytes that open every Kubernetes protobuf body.
const MAGIC: &[u8] = b"k8s\0";

/// Why a protobuf body could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ProtobufError {
    /// The body lacks the `k8s\0` prefix.
    #[error("the body does not start with the Kubernetes protobuf prefix \"k8s\\x00\"")]
    MissingMagic,
    /// The `runtime.Unknown` envelope does not parse.
    #[error("malformed protobuf envelope")]
    Envelope(#[source] prost::DecodeError),
    /// The envelope names a content encoding (like gzip) this server does not undo.
    #[error("protobuf content encoding {0:?} is not supported")]
    ContentEncoding(String),
    /// Kubernetes has no such kind in this group/version.
    #[error("no kind {kind:?} is registered for version {api_version:?}")]
    UnknownKind {
        /// The envelope's (or the URL's) apiVersion.
        api_version: String,
        /// The envelope's (or the URL's) kind.
        kind: String,
    },
    /// A Kubernetes kind this server does not decode from protobuf.
    #[error("protobuf bodies of {kind} ({api_version}) are not decoded by this server; send JSON")]
    UnsupportedKind {
        /// The kind's apiVersion.
        api_version: String,
        /// The kind.
        kind: String,
    },
    /// The object's bytes do not parse as the kind's message.
    #[error("malformed protobuf {kind}")]
    Message {
        /// The kind being decoded.
        kind: String,
        /// The parser's error.
        #[source]
        source: prost::DecodeError,
    },
    /// A field this server does not convert from protobuf was set.
    #[error(
        "the protobuf field {message}.{field} is not decoded by this server; send the object as JSON"
    )]
    UnsupportedField {
        /// The protobuf message holding the field.
        message: &'static str,
        /// The field's JSON name.
        field: String,
    },
    /// A field meant to hold raw JSON (`FieldsV1`) does not.
    #[error("field {field} does not hold JSON")]
    RawJson {
        /// The message the field belongs to.
        field: &'static str,
        /// The JSON parser's error.
        #[source]
        source: serde_json::Error,
    },
}

/// The group, version and kind a body is decoded as when its envelope does not say: the URL's.
#[derive(Debug, Clone, Copy)]
pub struct DefaultKind<'a> {
    /// `group/version`, or `v1` for the core group.
    pub api_version: &'a str,
    /// The kind.
    pub kind: &'a str,
}

/// Decodes a protobuf body into its JSON form, with `apiVersion` and `kind` from the envelope
/// (taken from `default` where the envelope leaves them empty, as kube-apiserver does).
pub fn decode(body: &[u8], default: DefaultKind<'_>) -> Result<Value, ProtobufError> {
    let payload = body
        .strip_prefix(MAGIC)
        .ok_or(ProtobufError::MissingMagic)?;
    let envelope = Unknown::decode(payload).map_err(ProtobufError::Envelope)?;
    if let Some(encoding) = envelope.content_encoding.filter(|e| !e.is_empty()) {
        return Err(ProtobufError::ContentEncoding(encoding));
    }
    let type_meta = envelope.type_meta.unwrap_or_default();
    let non_empty = |s: Option<String>, default: &str| {
        s.filter(|s| !s.is_empty())
            .unwrap_or_else(|| default.to_owned())
    };
    let api_version = non_empty(type_meta.api_version, default.api_version);
    let kind = non_empty(type_meta.kind, default.kind);
    let raw = envelope.raw.unwrap_or_default();
    let fields = match messages::decoder(&api_version, &kind) {
        Some(decode) => decode(&raw).map_err(|source| ProtobufError::Message {
            kind: kind.clone(),
            source,
        })??,
        None if crate::registry::is_known_kind(&api_version, &kind) => {
            return Err(ProtobufError::UnsupportedKind { api_version, kind });
        }
        None => return Err(ProtobufError::UnknownKind { api_version, kind }),
    };
    let mut object = Map::new();
    object.insert("apiVersion".into(), Value::String(api_version));
    object.insert("kind".into(), Value::String(kind));
    if let Value::Object(fields) = fields {
        object.extend(fields);
    }
    Ok(Value::Object(object))
}

/// Parses one message of type `M` and converts it to JSON.
fn parse<M: Message + Default + ToJson>(
    raw: &[u8],
) -> Result<Result<Value, ProtobufError>, prost::DecodeError> {
    Ok(M::decode(raw)?.element())
}

/// A decoded protobuf value as JSON.
trait ToJson {
    /// The value as an element of a list or a map (where an empty string is still a value).
    fn element(&self) -> Result<Value, ProtobufError>;

    /// The value as a field of an object: `None` leaves the field out.
    fn field(&self) -> Result<Option<Value>, ProtobufError> {
        self.element().map(Some)
    }
}

impl ToJson for String {
    fn element(&self) -> Result<Value, ProtobufError> {
        Ok(Value::String(self.clone()))
    }

    /// Go's `omitempty` (or a nil pointer): an empty string is not printed.
    fn field(&self) -> Result<Option<Value>, ProtobufError> {
        Ok((!self.is_empty()).then(|| Value::String(self.clone())))
    }
}

macro_rules! scalar_to_json {
    ($($ty:ty),*) => {
        $(impl ToJson for $ty {
            fn element(&self) -> Result<Value, ProtobufError> {
                Ok(Value::from(*self))
            }
        })*
    };
}
scalar_to_json!(bool, i32, i64);

/// Bytes are base64 in JSON.
impl ToJson for Vec<u8> {
    fn element(&self) -> Result<Value, ProtobufError> {
        Ok(Value::String(
            base64::engine::general_purpose::STANDARD.encode(self),
        ))
    }

    fn field(&self) -> Result<Option<Value>, ProtobufError> {
        if self.is_empty() {
            return Ok(None);
        }
        self.element().map(Some)
    }
}

impl<T: ToJson> ToJson for Option<T> {
    fn element(&self) -> Result<Value, ProtobufError> {
        self.as_ref().map_or(Ok(Value::Null), ToJson::element)
    }

    fn field(&self) -> Result<Option<Value>, ProtobufError> {
        self.as_ref().map_or(Ok(None), ToJson::field)
    }
}

impl<T: ToJson> ToJson for Box<T> {
    fn element(&self) -> Result<Value, ProtobufError> {
        (**self).element()
    }

    fn field(&self) -> Result<Option<Value>, ProtobufError> {
        (**self).field()
    }
}

/// Repeated fields: an empty list is absent in protobuf, and `omitempty` or `null` in Go.
impl<T: ToJson> ToJson for Vec<T> {
    fn element(&self) -> Result<Value, ProtobufError> {
        self.iter()
            .map(ToJson::element)
            .collect::<Result<_, _>>()
            .map(Value::Array)
    }

    fn field(&self) -> Result<Option<Value>, ProtobufError> {
        if self.is_empty() {
            return Ok(None);
        }
        self.element().map(Some)
    }
}

impl<V: ToJson> ToJson for BTreeMap<String, V> {
    fn element(&self) -> Result<Value, ProtobufError> {
        let mut object = Map::new();
        for (key, value) in self {
            object.insert(key.clone(), value.element()?);
        }
        Ok(Value::Object(object))
    }

    fn field(&self) -> Result<Option<Value>, ProtobufError> {
        if self.is_empty() {
            return Ok(None);
        }
        self.element().map(Some)
    }
}

/// The JSON name of a field: the protobuf name, which is the JSON name with `k8s-pb`'s snake
/// case undone (`working_dir` is `workingDir`), unless the message spells it out
/// (`hostIP`, `nonResourceURLs`).
fn json_name(rust_name: &str, explicit: Option<&'static str>) -> String {
    if let Some(name) = explicit {
        return name.to_owned();
    }
    let rust_name = rust_name.trim_start_matches("r#");
    let mut out = String::with_capacity(rust_name.len());
    let mut upper = false;
    for c in rust_name.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            out.push(c.to_ascii_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

/// A field this server does not convert, which is fine as long as it is unset: absent, empty,
/// or a message of zero values (what Go sends for a non-pointer struct it never filled).
trait Refusable {
    fn is_unset(&self) -> bool;
}

impl<M: Message> Refusable for Option<M> {
    fn is_unset(&self) -> bool {
        self.as_ref()
            .is_none_or(|m| wire_is_zero(&m.encode_to_vec()))
    }
}

impl<M: Message> Refusable for Vec<M> {
    fn is_unset(&self) -> bool {
        self.is_empty()
    }
}

impl<V> Refusable for BTreeMap<String, V> {
    fn is_unset(&self) -> bool {
        self.is_empty()
    }
}

/// Whether encoded protobuf fields all hold zero values: numbers 0, empty strings and bytes,
/// and nested messages made of zero values.
fn wire_is_zero(mut buf: &[u8]) -> bool {
    use prost::encoding::{WireType, decode_key, decode_varint};
    fn take<'a>(buf: &mut &'a [u8], len: u64) -> Option<&'a [u8]> {
        let len = usize::try_from(len).ok().filter(|l| *l <= buf.len())?;
        let (head, tail) = buf.split_at(len);
        *buf = tail;
        Some(head)
    }
    while !buf.is_empty() {
        let Ok((_, wire_type)) = decode_key(&mut buf) else {
            return false;
        };
        let zero = match wire_type {
            WireType::Varint => decode_varint(&mut buf).is_ok_and(|v| v == 0),
            WireType::SixtyFourBit => take(&mut buf, 8).is_some_and(|b| b.iter().all(|x| *x == 0)),
            WireType::ThirtyTwoBit => take(&mut buf, 4).is_some_and(|b| b.iter().all(|x| *x == 0)),
            WireType::LengthDelimited => decode_varint(&mut buf)
                .ok()
                .and_then(|len| take(&mut buf, len))
                .is_some_and(wire_is_zero),
            WireType::StartGroup | WireType::EndGroup => false,
        };
        if !zero {
            return false;
        }
    }
    true
}

/// Refuses a field this server does not convert when it is set.
fn refuse_if_set(
    message: &'static str,
    rust_name: &str,
    value: &impl Refusable,
) -> Result<(), ProtobufError> {
    if value.is_unset() {
        return Ok(());
    }
    Err(ProtobufError::UnsupportedField {
        message,
        field: json_name(rust_name, None),
    })
}

/// The JSON of a `metav1.Time`: RFC 3339 seconds, or `null` for Go's zero time.
fn time_json(seconds: Option<i64>, nanos: Option<i32>) -> Value {
    // `metav1.Time{}` (Go's zero time) as protobuf seconds: what an unset timestamp encodes to.
    const GO_ZERO_TIME_SECONDS: i64 = -62_135_596_800;
    match (seconds, nanos.unwrap_or_default()) {
        // Go writes its zero time as an empty message, older encoders as year 1.
        (None | Some(GO_ZERO_TIME_SECONDS), 0) => Value::Null,
        (Some(seconds), _) => Value::String(crate::timefmt::rfc3339(seconds)),
        (None, _) => Value::String(crate::timefmt::rfc3339(0)),
    }
}

#[cfg(test)]
mod tests;
