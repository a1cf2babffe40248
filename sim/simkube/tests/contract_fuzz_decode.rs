//! The fuzz targets' entry points on stable, for CI: the seed corpus and random requests (built
//! from the shapes clients send, then mangled) go through `simkube::fuzzing::decode_request`
//! and through the whole in-process server. Nothing may panic; every refusal is a 4xx/5xx
//! `Status` whose code matches the HTTP status.

use http_body_util::BodyExt as _;
use proptest::prelude::*;
use simkube::Cluster;
use simkube::fuzzing::{RawRequest, decode_request};
use tower::ServiceExt as _;

fn corpus() -> Vec<(String, Vec<u8>)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/decode_request");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("the seed corpus is checked in")
        .map(|e| {
            let path = e.expect("entry").path();
            let name = path
                .file_name()
                .expect("name")
                .to_string_lossy()
                .into_owned();
            (name, std::fs::read(&path).expect("read seed"))
        })
        .collect();
    files.sort();
    files
}

#[test]
fn seed_corpus_decodes_as_expected() {
    let outcomes: Vec<(String, Result<(), u16>)> = corpus()
        .into_iter()
        .map(|(name, data)| {
            let outcome = decode_request(&RawRequest::from_bytes(&data))
                .map(|_| ())
                .map_err(|e| e.code);
            (name, outcome)
        })
        .collect();
    let expected: Vec<(String, Result<(), u16>)> = [
        ("apply_yaml", Ok(())),
        ("create_json", Ok(())),
        ("jsonpatch", Ok(())),
        ("list_table", Ok(())),
        ("protobuf", Ok(())),
        ("protobuf_configmap", Ok(())),
        ("smp", Ok(())),
        ("watch_fields", Ok(())),
    ]
    .into_iter()
    .map(|(n, o)| (n.to_owned(), o))
    .collect();
    assert_eq!(outcomes, expected);
}

const METHODS: &[&str] = &["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "BREW"];
const CONTENT_TYPES: &[&str] = &[
    "",
    "application/json",
    "application/yaml",
    "application/merge-patch+json",
    "application/json-patch+json",
    "application/strategic-merge-patch+json",
    "application/apply-patch+yaml",
    "application/vnd.kubernetes.protobuf",
    "text/plain",
];
const ACCEPTS: &[&str] = &[
    "",
    "application/json",
    "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
    "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1",
    "application/vnd.kubernetes.protobuf",
    "*/*;q=0.1",
];
const SEGMENTS: &[&str] = &[
    "api",
    "apis",
    "v1",
    "apps",
    "namespaces",
    "default",
    "kube-system",
    "configmaps",
    "pods",
    "deployments",
    "status",
    "scale",
    "log",
    "finalize",
    "watch",
    "nodes",
    "x",
    "",
    "..",
    "%2F",
    "apiextensions.k8s.io",
    "customresourcedefinitions",
    "openapi",
    "v3",
    "version",
];
const QUERY_KEYS: &[&str] = &[
    "labelSelector",
    "fieldSelector",
    "limit",
    "continue",
    "resourceVersion",
    "resourceVersionMatch",
    "timeoutSeconds",
    "fieldManager",
    "force",
    "dryRun",
    "propagationPolicy",
    "fieldValidation",
    "allowWatchBookmarks",
    "sendInitialEvents",
];

fn pick(options: &'static [&'static str]) -> impl Strategy<Value = String> {
    proptest::sample::select(options).prop_map(str::to_owned)
}

fn json_value() -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        "[a-z$/.~0-9]{0,8}".prop_map(serde_json::Value::from),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
            proptest::collection::btree_map(
                prop_oneof![
                    pick(&[
                        "apiVersion",
                        "kind",
                        "metadata",
                        "name",
                        "spec",
                        "data",
                        "op",
                        "path",
                        "value",
                        "from",
                        "$patch",
                        "$retainKeys",
                        "containers",
                        "finalizers",
                        "labels",
                        "resourceVersion",
                        "$setElementOrder/containers",
                    ]),
                    "[a-z]{1,4}",
                ],
                inner,
                0..5,
            )
            .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
}

fn body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        Just(Vec::new()),
        proptest::collection::vec(any::<u8>(), 0..64),
        json_value().prop_map(|v| serde_json::to_vec(&v).expect("json")),
        // Valid JSON cut short or with a stray byte: the parsers' error paths.
        (json_value(), any::<u8>()).prop_map(|(v, b)| {
            let mut s = serde_json::to_vec(&v).expect("json");
            let cut = usize::from(b) % (s.len() + 1);
            s.truncate(cut);
            s.push(b);
            s
        }),
    ]
}

/// Paths the server serves (with short random names, so writes collide) or random segments.
fn path() -> impl Strategy<Value = String> {
    const TEMPLATES: &[&str] = &[
        "/api/v1/namespaces/default/configmaps",
        "/api/v1/namespaces/default/configmaps/{}",
        "/api/v1/namespaces/{}/configmaps",
        "/api/v1/namespaces/default/pods/{}",
        "/api/v1/namespaces/default/pods/{}/status",
        "/apis/apps/v1/namespaces/default/deployments/{}",
        "/apis/apps/v1/namespaces/default/deployments/{}/scale",
        "/api/v1/namespaces/{}",
        "/api/v1/configmaps",
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{}",
        "/apis/rbac.authorization.k8s.io/v1/clusterroles/{}",
    ];
    prop_oneof![
        3 => (proptest::sample::select(TEMPLATES), "[a-z]{1,2}")
            .prop_map(|(t, name)| t.replace("{}", &name)),
        1 => proptest::collection::vec(prop_oneof![pick(SEGMENTS), "[a-z0-9.%-]{0,6}"], 0..8)
            .prop_map(|segments| format!("/{}", segments.join("/"))),
    ]
}

/// A ConfigMap-shaped body with a random name and random data.
fn object_body() -> impl Strategy<Value = Vec<u8>> {
    ("[a-z]{1,2}", json_value()).prop_map(|(name, data)| {
        serde_json::to_vec(&serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data,
        }))
        .expect("json")
    })
}

fn request() -> impl Strategy<Value = RawRequest> {
    (
        pick(METHODS),
        path(),
        proptest::collection::vec((pick(QUERY_KEYS), "[ -~]{0,12}"), 0..4),
        pick(CONTENT_TYPES),
        pick(ACCEPTS),
        prop_oneof![body(), object_body()],
    )
        .prop_map(|(method, path, query, ct, accept, body)| RawRequest {
            method,
            path,
            query: query
                .into_iter()
                .map(|(k, v)| {
                    let v: String = form_urlencoded::byte_serialize(v.as_bytes()).collect();
                    format!("{k}={v}")
                })
                .collect::<Vec<_>>()
                .join("&"),
            content_type: (!ct.is_empty()).then_some(ct),
            accept: (!accept.is_empty()).then_some(accept),
            body,
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn decoding_never_panics_and_errors_are_http_errors(req in request()) {
        if let Err(e) = decode_request(&req) {
            prop_assert!((400..600).contains(&e.code), "{e:?}");
            prop_assert!(!e.message.is_empty());
        }
    }

    #[test]
    fn decoding_raw_bytes_never_panics(data in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = decode_request(&RawRequest::from_bytes(&data));
    }
}

/// The whole server in process: every answer to a random request is a response, and every
/// error response is a `Status` carrying the HTTP code.
#[test]
fn the_server_answers_random_requests_with_statuses() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let cluster = runtime
        .block_on(Cluster::builder().start())
        .expect("cluster");
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 1500,
        ..ProptestConfig::default()
    });
    let seen = std::cell::RefCell::new(std::collections::BTreeSet::new());
    runner
        .run(&request(), |req| {
            // Watches never end by themselves: ask for lists instead.
            let query = req
                .query
                .replace("watch", "w")
                .replace("sendInitialEvents", "s");
            let uri = if query.is_empty() {
                req.path.clone()
            } else {
                format!("{}?{query}", req.path)
            };
            let Ok(mut request) = axum::http::Request::builder()
                .method(req.method.as_str())
                .uri(uri.as_str())
                .body(axum::body::Body::from(req.body.clone()))
            else {
                return Ok(());
            };
            for (name, value) in [
                (axum::http::header::CONTENT_TYPE, &req.content_type),
                (axum::http::header::ACCEPT, &req.accept),
            ] {
                if let Some(v) = value.as_deref().and_then(|v| v.parse().ok()) {
                    request.headers_mut().insert(name, v);
                }
            }
            let (code, body) = runtime.block_on(async {
                let resp = cluster
                    .service()
                    .oneshot(request)
                    .await
                    .expect("infallible");
                let code = resp.status().as_u16();
                let body = resp.into_body().collect().await.expect("body").to_bytes();
                (code, body)
            });
            seen.borrow_mut().insert(code);
            if code >= 400 {
                let status: serde_json::Value = serde_json::from_slice(&body).map_err(|e| {
                    TestCaseError::fail(format!(
                        "{code} body is not JSON ({e}): {}",
                        String::from_utf8_lossy(&body)
                    ))
                })?;
                prop_assert_eq!(&status["kind"], "Status");
                prop_assert_eq!(status["code"].as_u64(), Some(u64::from(code)));
            }
            Ok(())
        })
        .expect("every request is answered with a Status");
    // The generator reaches both sides: successes and several kinds of refusal.
    let seen = seen.into_inner();
    eprintln!("status codes seen: {seen:?}");
    assert!(seen.iter().any(|c| *c < 300), "{seen:?}");
    assert!(seen.iter().filter(|c| **c >= 400).count() >= 3, "{seen:?}");
    runtime.block_on(cluster.shutdown());
}
