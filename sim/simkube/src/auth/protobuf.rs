//! Decoding of the protobuf request bodies kubectl 1.32+ sends for `auth can-i`, `auth whoami`
//! and `create token`: the `k8s\0` envelope (`runtime.Unknown`) around the review or
//! TokenRequest message, turned into the JSON object the handlers take. Only the fields these
//! requests carry are read; the answer goes back as JSON, which kubectl accepts.

use serde_json::{Map, Value, json};

use crate::error::ApiError;

/// The four bytes that open every Kubernetes protobuf body.
const MAGIC: &[u8] = b"k8s\0";

/// One decoded protobuf field.
enum Field<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
}

fn read_varint(data: &[u8], at: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *data.get(*at)?;
        *at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

/// The (field number, value) pairs of one message, in wire order.
fn fields(data: &[u8]) -> Option<Vec<(u64, Field<'_>)>> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < data.len() {
        let key = read_varint(data, &mut at)?;
        let (number, wire) = (key >> 3, key & 7);
        let field = match wire {
            0 => Field::Varint(read_varint(data, &mut at)?),
            2 => {
                let len = usize::try_from(read_varint(data, &mut at)?).ok()?;
                let end = at.checked_add(len).filter(|e| *e <= data.len())?;
                let bytes = &data[at..end];
                at = end;
                Field::Bytes(bytes)
            }
            1 => {
                at = at.checked_add(8).filter(|e| *e <= data.len())?;
                continue;
            }
            5 => {
                at = at.checked_add(4).filter(|e| *e <= data.len())?;
                continue;
            }
            _ => return None,
        };
        out.push((number, field));
    }
    Some(out)
}

fn text(bytes: &[u8]) -> Option<String> {
    String::from_utf8(bytes.to_vec()).ok()
}

/// Decodes a message whose fields are all strings (or repeated strings / nested messages named
/// in `nested`) into a JSON object, by a table of (number, JSON name).
fn strings_message(data: &[u8], names: &[(u64, &str)], repeated: &[u64]) -> Option<Value> {
    let mut map = Map::new();
    for (number, field) in fields(data)? {
        let Some((_, name)) = names.iter().find(|(n, _)| *n == number) else {
            continue;
        };
        let Field::Bytes(bytes) = field else {
            continue;
        };
        let value = text(bytes)?;
        if repeated.contains(&number) {
            let list = map.entry((*name).to_owned()).or_insert_with(|| json!([]));
            if let Some(list) = list.as_array_mut() {
                list.push(json!(value));
            }
        } else {
            map.insert((*name).to_owned(), json!(value));
        }
    }
    Some(Value::Object(map))
}

fn resource_attributes(data: &[u8]) -> Option<Value> {
    strings_message(
        data,
        &[
            (1, "namespace"),
            (2, "verb"),
            (3, "group"),
            (4, "version"),
            (5, "resource"),
            (6, "subresource"),
            (7, "name"),
        ],
        &[],
    )
}

fn non_resource_attributes(data: &[u8]) -> Option<Value> {
    strings_message(data, &[(1, "path"), (2, "verb")], &[])
}

/// `SubjectAccessReviewSpec` / `SelfSubjectAccessReviewSpec` (the latter uses fields 1 and 2).
fn access_review_spec(data: &[u8]) -> Option<Value> {
    let mut spec = Map::new();
    for (number, field) in fields(data)? {
        let Field::Bytes(bytes) = field else {
            continue;
        };
        match number {
            1 => {
                spec.insert("resourceAttributes".into(), resource_attributes(bytes)?);
            }
            2 => {
                spec.insert(
                    "nonResourceAttributes".into(),
                    non_resource_attributes(bytes)?,
                );
            }
            3 => {
                spec.insert("user".into(), json!(text(bytes)?));
            }
            4 => {
                let groups = spec.entry("groups").or_insert_with(|| json!([]));
                if let Some(list) = groups.as_array_mut() {
                    list.push(json!(text(bytes)?));
                }
            }
            6 => {
                spec.insert("uid".into(), json!(text(bytes)?));
            }
            _ => {}
        }
    }
    Some(Value::Object(spec))
}

fn token_request_spec(data: &[u8]) -> Option<Value> {
    let mut spec = Map::new();
    for (number, field) in fields(data)? {
        match (number, field) {
            (1, Field::Bytes(bytes)) => {
                let list = spec.entry("audiences").or_insert_with(|| json!([]));
                if let Some(list) = list.as_array_mut() {
                    list.push(json!(text(bytes)?));
                }
            }
            (3, Field::Bytes(bytes)) => {
                let reference = strings_message(
                    bytes,
                    &[(1, "kind"), (2, "apiVersion"), (3, "name"), (4, "uid")],
                    &[],
                )?;
                spec.insert("boundObjectRef".into(), reference);
            }
            (4, Field::Varint(seconds)) => {
                spec.insert("expirationSeconds".into(), json!(seconds));
            }
            _ => {}
        }
    }
    Some(Value::Object(spec))
}

/// The `metadata.name`/`namespace` of an `ObjectMeta` (fields 1 and 3).
fn object_meta(data: &[u8]) -> Option<Value> {
    strings_message(data, &[(1, "name"), (3, "namespace")], &[])
}

fn unsupported(detail: &str) -> ApiError {
    ApiError::unsupported_media_type(format!(
        "the body of the request was in an unknown format - accepted media types include: \
         application/json, application/yaml ({detail})"
    ))
}

/// Decodes a protobuf body (`application/vnd.kubernetes.protobuf`) of a SelfSubjectAccessReview,
/// SubjectAccessReview, LocalSubjectAccessReview, SelfSubjectRulesReview, SelfSubjectReview,
/// TokenReview or TokenRequest into its JSON form. Other kinds are refused with 415, like every protobuf body
/// this server does not understand.
pub fn decode_protobuf_request(body: &[u8]) -> Result<Value, ApiError> {
    let malformed = || unsupported("malformed protobuf envelope");
    let payload = body.strip_prefix(MAGIC).ok_or_else(malformed)?;
    let mut api_version = String::new();
    let mut kind = String::new();
    let mut raw: &[u8] = &[];
    for (number, field) in fields(payload).ok_or_else(malformed)? {
        match (number, field) {
            (1, Field::Bytes(type_meta)) => {
                let meta = strings_message(type_meta, &[(1, "apiVersion"), (2, "kind")], &[])
                    .ok_or_else(malformed)?;
                api_version = meta["apiVersion"].as_str().unwrap_or_default().to_owned();
                kind = meta["kind"].as_str().unwrap_or_default().to_owned();
            }
            (2, Field::Bytes(bytes)) => raw = bytes,
            _ => {}
        }
    }
    let mut object = json!({"apiVersion": api_version, "kind": kind, "metadata": {}, "spec": {}});
    let decode_spec: fn(&[u8]) -> Option<Value> = match kind.as_str() {
        "SelfSubjectAccessReview" | "SubjectAccessReview" | "LocalSubjectAccessReview" => {
            access_review_spec
        }
        "SelfSubjectRulesReview" => |d| strings_message(d, &[(1, "namespace")], &[]),
        "SelfSubjectReview" => |_| Some(json!({})),
        "TokenRequest" => token_request_spec,
        "TokenReview" => |d| strings_message(d, &[(1, "token"), (2, "audiences")], &[2]),
        other => {
            return Err(unsupported(&format!(
                "protobuf request bodies are only understood for access reviews and \
                 TokenRequest, not {other:?}; send JSON"
            )));
        }
    };
    for (number, field) in fields(raw).ok_or_else(malformed)? {
        let Field::Bytes(bytes) = field else {
            continue;
        };
        match number {
            1 => object["metadata"] = object_meta(bytes).ok_or_else(malformed)?,
            2 if kind != "SelfSubjectReview" => {
                object["spec"] = decode_spec(bytes).ok_or_else(malformed)?;
            }
            _ => {}
        }
    }
    if kind == "SelfSubjectReview"
        && let Some(map) = object.as_object_mut()
    {
        map.remove("spec");
    }
    Ok(object)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn varint(mut v: u64, out: &mut Vec<u8>) {
        loop {
            let byte = u8::try_from(v & 0x7f).expect("7 bits");
            v >>= 7;
            if v == 0 {
                out.push(byte);
                return;
            }
            out.push(byte | 0x80);
        }
    }

    fn bytes_field(number: u64, data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        varint(number << 3 | 2, &mut out);
        varint(data.len() as u64, &mut out);
        out.extend_from_slice(data);
        out
    }

    fn envelope(api_version: &str, kind: &str, raw: &[u8]) -> Vec<u8> {
        let type_meta = [
            bytes_field(1, api_version.as_bytes()),
            bytes_field(2, kind.as_bytes()),
        ]
        .concat();
        let mut body = MAGIC.to_vec();
        body.extend(bytes_field(1, &type_meta));
        body.extend(bytes_field(2, raw));
        body.extend(bytes_field(4, b"application/vnd.kubernetes.protobuf"));
        body
    }

    #[test]
    fn decodes_a_self_subject_access_review() {
        let attributes = [
            bytes_field(1, b"tenant-a"),
            bytes_field(2, b"list"),
            bytes_field(5, b"configmaps"),
        ]
        .concat();
        let raw = [
            bytes_field(1, &[]),
            bytes_field(2, &bytes_field(1, &attributes)),
        ]
        .concat();
        let body = envelope("authorization.k8s.io/v1", "SelfSubjectAccessReview", &raw);
        assert_eq!(
            decode_protobuf_request(&body).expect("decodes"),
            json!({
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SelfSubjectAccessReview",
                "metadata": {},
                "spec": {"resourceAttributes": {"namespace": "tenant-a", "verb": "list", "resource": "configmaps"}},
            })
        );
        let url = [bytes_field(1, b"/healthz"), bytes_field(2, b"get")].concat();
        let raw = bytes_field(2, &bytes_field(2, &url));
        let body = envelope("authorization.k8s.io/v1", "SelfSubjectAccessReview", &raw);
        assert_eq!(
            decode_protobuf_request(&body).expect("decodes")["spec"],
            json!({"nonResourceAttributes": {"path": "/healthz", "verb": "get"}})
        );
    }

    #[test]
    fn decodes_a_token_request() {
        let mut expiration = Vec::new();
        varint(4 << 3, &mut expiration);
        varint(1200, &mut expiration);
        let reference = [
            bytes_field(1, b"Pod"),
            bytes_field(2, b"v1"),
            bytes_field(3, b"web"),
        ]
        .concat();
        let spec = [
            bytes_field(1, b"vault"),
            bytes_field(1, b"api"),
            bytes_field(3, &reference),
            expiration,
        ]
        .concat();
        let raw = [
            bytes_field(1, &bytes_field(1, b"robot")),
            bytes_field(2, &spec),
        ]
        .concat();
        let body = envelope("authentication.k8s.io/v1", "TokenRequest", &raw);
        assert_eq!(
            decode_protobuf_request(&body).expect("decodes"),
            json!({
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "metadata": {"name": "robot"},
                "spec": {
                    "audiences": ["vault", "api"],
                    "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "web"},
                    "expirationSeconds": 1200,
                },
            })
        );
    }

    #[test]
    fn refuses_other_kinds_and_garbage() {
        let body = envelope("v1", "ConfigMap", &[]);
        let error = decode_protobuf_request(&body).expect_err("refused");
        assert_eq!(error.code, 415);
        assert!(
            error.message.contains("not \"ConfigMap\""),
            "{}",
            error.message
        );
        for garbage in [&b"{}"[..], b"k8s\0\x0a\xff", b"k8s\0\x0a\x05ab"] {
            assert_eq!(
                decode_protobuf_request(garbage).expect_err("garbage").code,
                415
            );
        }
    }
}
