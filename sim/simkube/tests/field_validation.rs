//! `fieldValidation` on creates, updates and patches, through the real kube-rs client and the
//! real kubectl: Strict fails with kube-apiserver's wording, Warn (the default) answers
//! `Warning: 299` headers and drops the fields, Ignore drops them silently. The kubectl tests
//! skip with a message when kubectl is absent, unless `CI` is set.

mod support;

use support::kubectl_available;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::ApiResource;
use kube::runtime::wait::{await_condition, conditions};
use serde_json::{Value, json};
use simkube::Cluster;

async fn cluster(name: &str) -> Cluster {
    Cluster::builder()
        .name(name)
        .start()
        .await
        .expect("cluster starts")
}

fn deployment(name: &str, extra_spec: Value) -> Value {
    let mut spec = json!({
        "replicas": 1,
        "selector": {"matchLabels": {"app": name}},
        "template": {"metadata": {"labels": {"app": name}},
                     "spec": {"containers": [{"name": "c", "image": "nginx"}]}},
    });
    for (k, v) in extra_spec.as_object().expect("spec object") {
        spec[k] = v.clone();
    }
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
           "metadata": {"name": name, "namespace": "default"}, "spec": spec})
}

/// POSTs a body with a raw kube-rs request (`PostParams` has no `fieldValidation`), returning
/// the status, the `Warning` headers and the body.
async fn post(c: &Cluster, query: &str, body: &Value) -> (u16, Vec<String>, Value) {
    let req = http::Request::post(format!(
        "/apis/apps/v1/namespaces/default/deployments{query}"
    ))
    .header("content-type", "application/json")
    .body(serde_json::to_vec(body).expect("json"))
    .expect("request");
    let resp = c.client().send(req.map(Into::into)).await.expect("send");
    let code = resp.status().as_u16();
    let warnings = resp
        .headers()
        .get_all("warning")
        .iter()
        .map(|v| v.to_str().expect("ascii warning").to_owned())
        .collect();
    let bytes = axum::body::to_bytes(axum::body::Body::new(resp.into_body()), usize::MAX)
        .await
        .expect("body");
    (
        code,
        warnings,
        serde_json::from_slice(&bytes).expect("json body"),
    )
}

#[tokio::test]
async fn create_strict_fails_warn_is_the_default_and_drops_the_field() {
    let c = cluster("fv-create").await;
    let typo = deployment("web", json!({"replicaz": 3}));

    let (code, _, status) = post(&c, "?fieldValidation=Strict", &typo).await;
    assert_eq!(code, 400, "{status}");
    assert_eq!(status["reason"], "BadRequest");
    assert_eq!(
        status["message"],
        "Deployment in version \"v1\" cannot be handled as a Deployment: strict decoding error: unknown field \"spec.replicaz\""
    );

    let (code, warnings, obj) = post(&c, "", &typo).await;
    assert_eq!(code, 201, "{obj}");
    assert_eq!(warnings, [r#"299 - "unknown field \"spec.replicaz\"""#]);
    assert!(obj["spec"].get("replicaz").is_none(), "dropped: {obj}");
    assert_eq!(obj["spec"]["replicas"], 1);

    let (code, warnings, obj) = post(
        &c,
        "?fieldValidation=Ignore",
        &deployment("quiet", json!({"replicaz": 3})),
    )
    .await;
    assert_eq!(code, 201, "{obj}");
    assert!(warnings.is_empty(), "{warnings:?}");
    assert!(obj["spec"].get("replicaz").is_none());

    let (code, _, status) = post(&c, "?fieldValidation=Sometimes", &typo).await;
    assert_eq!(code, 400, "{status}");
}

#[tokio::test]
async fn patches_validate_the_patched_object() {
    let c = cluster("fv-patch").await;
    let api: Api<Deployment> = Api::default_namespaced(c.client());
    let d: Deployment = serde_json::from_value(deployment("web", json!({}))).expect("typed");
    api.create(&Default::default(), &d).await.expect("create");

    let strict = PatchParams::default().validation_strict();
    let err = api
        .patch(
            "web",
            &strict,
            &Patch::Merge(json!({"spec": {"replicaz": 2}})),
        )
        .await
        .expect_err("strict merge patch");
    let kube::Error::Api(status) = err else {
        panic!("api error: {err:?}")
    };
    assert_eq!(status.code, 422);
    assert_eq!(status.reason, "Invalid");
    assert!(
        status
            .message
            .starts_with(" \"\" is invalid: patch: Invalid value: \"{"),
        "{}",
        status.message
    );
    assert!(
        status
            .message
            .ends_with("\": strict decoding error: unknown field \"spec.replicaz\""),
        "{}",
        status.message
    );

    let err = api
        .patch(
            "web",
            &strict,
            &Patch::Strategic(json!({"spec": {"replicaz": 2}})),
        )
        .await
        .expect_err("strict strategic patch");
    let kube::Error::Api(status) = err else {
        panic!("api error: {err:?}")
    };
    assert_eq!(
        status.message,
        " \"\" is invalid: patch: Invalid value: \"map[spec:map[replicaz:2]]\": strict decoding error: unknown field \"spec.replicaz\""
    );

    // Warn and Ignore succeed, apply the known part and drop the unknown one.
    for params in [
        PatchParams::default().validation_warn(),
        PatchParams::default().validation_ignore(),
    ] {
        let patched = api
            .patch(
                "web",
                &params,
                &Patch::Merge(json!({"spec": {"replicaz": 2, "replicas": 4}})),
            )
            .await
            .expect("lenient patch");
        assert_eq!(patched.spec.and_then(|s| s.replicas), Some(4));
    }
    let stored = c
        .state()
        .store
        .get(
            &simkube::store::TypeKey::new("apps", "deployments"),
            "default",
            "web",
        )
        .expect("stored");
    assert!(stored["spec"].get("replicaz").is_none(), "{stored}");
    // A later strict patch is not blamed for fields an earlier lenient write sent.
    api.patch(
        "web",
        &strict,
        &Patch::Merge(json!({"spec": {"replicas": 5}})),
    )
    .await
    .expect("clean strict patch");
}

const WIDGET_CRD: &str = r#"{
  "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
  "metadata": {"name": "widgets.fv.example.com"},
  "spec": {"group": "fv.example.com", "scope": "Namespaced",
    "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
    "versions": [{"name": "v1", "served": true, "storage": true,
      "schema": {"openAPIV3Schema": {"type": "object", "properties": {
        "spec": {"type": "object", "properties": {"size": {"type": "integer"}}}}}}}]}}"#;

#[tokio::test]
async fn custom_resources_are_checked_before_pruning() {
    let c = cluster("fv-cr").await;
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(c.client());
    let crd = serde_json::from_str(WIDGET_CRD).expect("crd");
    crds.create(&Default::default(), &crd).await.expect("crd");
    tokio::time::timeout(
        std::time::Duration::from_secs(10),
        await_condition(
            crds,
            "widgets.fv.example.com",
            conditions::is_crd_established(),
        ),
    )
    .await
    .expect("established in time")
    .expect("watch");
    let ar = ApiResource {
        group: "fv.example.com".into(),
        version: "v1".into(),
        api_version: "fv.example.com/v1".into(),
        kind: "Widget".into(),
        plural: "widgets".into(),
    };
    let api: Api<DynamicObject> = Api::default_namespaced_with(c.client(), &ar);
    let w = json!({"apiVersion": "fv.example.com/v1", "kind": "Widget",
                   "metadata": {"name": "w"}, "spec": {"size": 1, "colour": "red"}});
    let apply = |params: PatchParams| {
        let api = api.clone();
        let w = w.clone();
        async move {
            api.patch("w", &params, &Patch::Merge(&w))
                .await
                .map(|o| o.data)
        }
    };
    let created: DynamicObject =
        serde_json::from_value(json!({"apiVersion": "fv.example.com/v1", "kind": "Widget",
            "metadata": {"name": "w"}, "spec": {"size": 0}}))
        .expect("dynamic");
    api.create(&Default::default(), &created)
        .await
        .expect("create");
    let err = apply(PatchParams::default().validation_strict())
        .await
        .expect_err("strict");
    let kube::Error::Api(status) = err else {
        panic!("api error: {err:?}")
    };
    assert_eq!(status.code, 422);
    assert!(
        status
            .message
            .ends_with("strict decoding error: unknown field \"spec.colour\""),
        "{}",
        status.message
    );
    let pruned = apply(PatchParams::default().validation_ignore())
        .await
        .expect("ignore prunes");
    assert_eq!(pruned["spec"], json!({"size": 1}));
}

async fn kubectl(kubeconfig: &Path, cache: PathBuf, args: &[&str]) -> Output {
    let kubeconfig = kubeconfig.to_path_buf();
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    tokio::task::spawn_blocking(move || {
        Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .arg("--cache-dir")
            .arg(&cache)
            .args(&args)
            .output()
            .expect("run kubectl")
    })
    .await
    .expect("join")
}

const TYPO_DEPLOYMENT: &str = r#"apiVersion: apps/v1
kind: Deployment
metadata:
  name: typo
  namespace: default
spec:
  replicaz: 2
  selector:
    matchLabels: {app: typo}
  template:
    metadata:
      labels: {app: typo}
    spec:
      containers:
      - name: c
        image: nginx
"#;

const TYPO_WIDGET: &str = r#"apiVersion: fv.example.com/v1
kind: Widget
metadata:
  name: typo
  namespace: default
spec:
  size: 3
  colour: red
"#;

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_apply_reports_unknown_fields_unless_validation_is_off() {
    if !kubectl_available() {
        return;
    }
    let c = cluster("fv-kubectl").await;
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, c.kubeconfig()).expect("kubeconfig");
    let cache = || dir.path().join("cache");
    let deploy = dir.path().join("deploy.yaml");
    std::fs::write(&deploy, TYPO_DEPLOYMENT).expect("manifest");
    let deploy = deploy.to_str().expect("utf-8");

    let out = kubectl(&kubeconfig, cache(), &["apply", "-f", deploy]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "strict apply must fail");
    assert!(
        stderr.contains(&format!(
            "Error from server (BadRequest): error when creating \"{deploy}\": Deployment in version \"v1\" cannot be handled as a Deployment: strict decoding error: unknown field \"spec.replicaz\""
        )),
        "{stderr}"
    );
    assert!(
        c.requests()
            .iter()
            .any(|r| r.verb == "create" && r.query.contains("fieldValidation=Strict")),
        "kubectl asked for server-side strict validation"
    );

    let out = kubectl(
        &kubeconfig,
        cache(),
        &["apply", "--validate=false", "-f", deploy],
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("deployment.apps/typo created"));
    let api: Api<Deployment> = Api::default_namespaced(c.client());
    assert!(api.get("typo").await.is_ok());

    // With --validate=warn kubectl prints the server's warning and the apply succeeds.
    let out = kubectl(
        &kubeconfig,
        cache(),
        &["replace", "--validate=warn", "-f", deploy],
    )
    .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("Warning: unknown field \"spec.replicaz\""),
        "{stderr}"
    );

    // A custom resource: strict fails, --validate=false prunes the field.
    let crd = dir.path().join("crd.json");
    std::fs::write(&crd, WIDGET_CRD).expect("crd");
    let out = kubectl(
        &kubeconfig,
        cache(),
        &["apply", "-f", crd.to_str().expect("utf-8")],
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = kubectl(
        &kubeconfig,
        cache(),
        &[
            "wait",
            "--for",
            "condition=established",
            "crd/widgets.fv.example.com",
        ],
    )
    .await;
    assert!(out.status.success());
    let widget = dir.path().join("widget.yaml");
    std::fs::write(&widget, TYPO_WIDGET).expect("widget");
    let widget = widget.to_str().expect("utf-8");
    let out = kubectl(&kubeconfig, cache(), &["apply", "-f", widget]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "strict apply of a CR must fail");
    assert!(
        stderr.contains(
            "Widget in version \"v1\" cannot be handled as a Widget: strict decoding error: unknown field \"spec.colour\""
        ),
        "{stderr}"
    );
    let out = kubectl(
        &kubeconfig,
        cache(),
        &["apply", "--validate=false", "-f", widget],
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = kubectl(
        &kubeconfig,
        cache(),
        &["get", "widget", "typo", "-o", "jsonpath={.spec}"],
    )
    .await;
    assert_eq!(String::from_utf8_lossy(&out.stdout), r#"{"size":3}"#);
}
