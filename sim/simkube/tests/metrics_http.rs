//! `/metrics` over HTTP: request counters and latencies labelled by verb and served resource,
//! open watches, stored objects per resource and the resourceVersion; with RBAC on, only
//! callers allowed `get` on the `/metrics` non-resource URL may read it.

use futures::StreamExt;
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::api::{Api, PostParams, WatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use simkube::Cluster;

async fn scrape(client: &Client) -> Result<String, kube::Error> {
    client
        .request_text(
            http::Request::get("/metrics")
                .body(Vec::new())
                .expect("request"),
        )
        .await
}

/// The value of the sample whose line starts with `prefix` (name and labels).
fn sample(text: &str, prefix: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

fn object<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).expect("object")
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_count_requests_watches_objects_and_the_resource_version() {
    let c = Cluster::builder()
        .name("metrics")
        .start()
        .await
        .expect("cluster starts");
    let client = c.client();
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    for i in 0..3 {
        let cm: ConfigMap = object(json!({"metadata": {"name": format!("cm{i}")}}));
        cms.create(&PostParams::default(), &cm)
            .await
            .expect("create");
    }
    let _ = cms.get("nope").await.expect_err("404");
    cms.list(&Default::default()).await.expect("list");
    let mut watch = cms
        .watch(&WatchParams::default(), "0")
        .await
        .expect("watch")
        .boxed();
    assert!(watch.next().await.is_some(), "a first event");
    // A resource nobody serves is counted without its name.
    let _ = client
        .request_text(
            http::Request::get("/api/v1/namespaces/default/secretz-of-mine")
                .body(Vec::new())
                .expect("request"),
        )
        .await;

    let text = scrape(&client).await.expect("scrape");
    let created = r#"apiserver_request_total{verb="POST",group="",resource="configmaps",subresource="",code="201"}"#;
    assert_eq!(sample(&text, created), Some(3.0), "{text}");
    assert_eq!(
        sample(
            &text,
            r#"apiserver_request_total{verb="GET",group="",resource="configmaps",subresource="",code="404"}"#
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &text,
            r#"apiserver_request_total{verb="LIST",group="",resource="configmaps",subresource="",code="200"}"#
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &text,
            r#"apiserver_request_total{verb="GET",group="",resource="",subresource="",code="404"}"#
        ),
        Some(1.0),
        "{text}"
    );
    assert!(
        !text.contains("secretz-of-mine") && !text.contains("cm1"),
        "no names in labels"
    );
    assert_eq!(
        sample(
            &text,
            r#"apiserver_request_duration_seconds_count{verb="POST",group="",resource="configmaps",subresource=""}"#
        ),
        Some(3.0)
    );
    assert_eq!(
        sample(
            &text,
            r#"apiserver_longrunning_requests{verb="WATCH",group="",resource="configmaps"}"#
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(&text, r#"apiserver_storage_objects{resource="configmaps"}"#),
        Some(3.0)
    );
    let rv = cms.get("cm2").await.expect("get").resource_version();
    let rv: f64 = rv.expect("rv").parse().expect("numeric rv");
    assert_eq!(sample(&text, "simkube_resource_version "), Some(rv));
    assert!(text.trim_end().ends_with("# EOF"));

    // The watch ends: the gauge goes back to zero.
    drop(watch);
    let mut open = Some(1.0);
    for _ in 0..50 {
        open = sample(
            &scrape(&client).await.expect("scrape"),
            r#"apiserver_longrunning_requests{verb="WATCH",group="",resource="configmaps"}"#,
        );
        if open == Some(0.0) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(open, Some(0.0), "closed watches are uncounted");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_need_the_non_resource_url_permission_under_rbac() {
    let c = Cluster::builder()
        .name("metrics-rbac")
        .rbac(true)
        .start()
        .await
        .expect("cluster starts");
    let admin = c.client();
    scrape(&admin).await.expect("system:masters may scrape");
    let sas: Api<ServiceAccount> = Api::default_namespaced(admin.clone());
    sas.create(
        &PostParams::default(),
        &object(json!({"metadata": {"name": "prom"}})),
    )
    .await
    .expect("sa");
    let request: TokenRequest = object(json!({"spec": {"audiences": []}}));
    let token = sas
        .create_token_request("prom", &PostParams::default(), &request)
        .await
        .expect("token")
        .status
        .expect("status")
        .token;
    let prom = c.client_with_token(&token).expect("client");
    let err = scrape(&prom).await.expect_err("forbidden");
    let kube::Error::Api(status) = err else {
        panic!("api error: {err:?}")
    };
    assert_eq!(status.code, 403);
    assert!(
        status.message.contains("cannot get path \"/metrics\""),
        "{}",
        status.message
    );
    let bindings: Api<ClusterRoleBinding> = Api::all(admin.clone());
    bindings
        .create(
            &PostParams::default(),
            &object(json!({"metadata": {"name": "prom-monitoring"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:monitoring"},
                "subjects": [{"kind": "ServiceAccount", "name": "prom", "namespace": "default"}]})),
        )
        .await
        .expect("binding");
    let text = scrape(&prom).await.expect("allowed by system:monitoring");
    assert!(text.contains("apiserver_request_total"));
    c.shutdown().await;
}
