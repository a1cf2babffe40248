//! Fuzzes the whole in-process server: any request must get an answer, and every error answer
//! must be a `Status` whose code matches the HTTP status.
#![no_main]

use std::sync::OnceLock;

use http_body_util::BodyExt as _;
use libfuzzer_sys::fuzz_target;
use simkube::Cluster;
use simkube::fuzzing::RawRequest;
use tower::ServiceExt as _;

struct Server {
    runtime: tokio::runtime::Runtime,
    cluster: Cluster,
}

fn server() -> &'static Server {
    static SERVER: OnceLock<Server> = OnceLock::new();
    SERVER.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let cluster = runtime
            .block_on(Cluster::builder().start())
            .expect("cluster");
        Server { runtime, cluster }
    })
}

fuzz_target!(|data: &[u8]| {
    let req = RawRequest::from_bytes(data);
    // Watches would never end: the fuzzer asks for lists instead.
    let query = req.query.replace("watch", "w");
    let uri = if query.is_empty() {
        req.path.clone()
    } else {
        format!("{}?{query}", req.path)
    };
    let Ok(mut builder) = axum::http::Request::builder()
        .method(req.method.as_str())
        .uri(uri.as_str())
        .body(())
        .map(|r| r.into_parts().0)
    else {
        return;
    };
    if let Some(ct) = req.content_type.as_deref().and_then(|v| v.parse().ok()) {
        builder.headers.insert(axum::http::header::CONTENT_TYPE, ct);
    }
    if let Some(accept) = req.accept.as_deref().and_then(|v| v.parse().ok()) {
        builder.headers.insert(axum::http::header::ACCEPT, accept);
    }
    let request = axum::http::Request::from_parts(builder, axum::body::Body::from(req.body));
    let s = server();
    s.runtime.block_on(async {
        let resp = s
            .cluster
            .service()
            .oneshot(request)
            .await
            .expect("infallible");
        let code = resp.status().as_u16();
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        if code >= 400 {
            let status: serde_json::Value =
                serde_json::from_slice(&body).expect("error bodies are JSON Status");
            assert_eq!(status["kind"], "Status");
            assert_eq!(status["code"].as_u64(), Some(u64::from(code)));
        }
    });
});
