//! Contract tests of admission webhooks: a webhook server written here (axum over rustls with an
//! rcgen certificate from its own CA) is registered through `MutatingWebhookConfiguration` and
//! `ValidatingWebhookConfiguration` objects, and the real kube-rs client and kubectl see what
//! kube-apiserver would make of its answers: patches applied, denials with the webhook's status,
//! warnings, selectors and rules deciding who is called, failure policies and timeouts.

mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::routing::post;
use axum::{Json, Router};
use base64::Engine as _;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use simkube::Cluster;
use simkube::admission::webhooks::{WebhookDialer, WebhookEndpoint};
use support::webhook::{TlsServer, rule, serve_https, validating, webhook};
use support::{Kubectl, kubectl_available};

/// The reviews the test webhook received, by path.
#[derive(Default)]
struct Seen(Mutex<Vec<(String, Value)>>);

impl Seen {
    fn api_versions(&self, path: &str) -> Vec<Value> {
        self.0
            .lock()
            .expect("lock")
            .iter()
            .filter(|(p, _)| p == path)
            .map(|(_, r)| r["apiVersion"].clone())
            .collect()
    }

    fn requests(&self, path: &str) -> Vec<Value> {
        self.0
            .lock()
            .expect("lock")
            .iter()
            .filter(|(p, _)| p == path)
            .map(|(_, r)| r["request"].clone())
            .collect()
    }
}

fn answer(request: &Value, response: Value) -> Json<Value> {
    let mut response = response;
    response["uid"] = request["uid"].clone();
    Json(
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}),
    )
}

fn patch(ops: &Value) -> String {
    base64::engine::general_purpose::STANDARD.encode(ops.to_string())
}

/// The webhook: `/mutate` labels and tolerates, `/deny` refuses objects labelled `deny`, `/allow`
/// admits, `/slow` admits after 3 s, `/beta` answers in v1beta1, `/uid` answers with another
/// uid, `/badpatch` sends a patch that cannot apply.
async fn hook(
    State(seen): State<Arc<Seen>>,
    Path(path): Path<String>,
    Json(review): Json<Value>,
) -> Json<Value> {
    seen.0
        .lock()
        .expect("lock")
        .push((path.clone(), review.clone()));
    let request = &review["request"];
    let object = &request["object"];
    match path.as_str() {
        "mutate" => {
            let mut ops = Vec::new();
            if object["metadata"]["labels"].is_object() {
                ops.push(
                    json!({"op": "add", "path": "/metadata/labels/webhooked", "value": "yes"}),
                );
            } else {
                ops.push(
                    json!({"op": "add", "path": "/metadata/labels", "value": {"webhooked": "yes"}}),
                );
            }
            let toleration = json!({"key": "tether.io/virtual-node", "operator": "Exists", "effect": "NoSchedule"});
            if object["spec"]["tolerations"].is_array() {
                ops.push(json!({"op": "add", "path": "/spec/tolerations/-", "value": toleration}));
            } else {
                ops.push(json!({"op": "add", "path": "/spec/tolerations", "value": [toleration]}));
            }
            answer(
                request,
                json!({"allowed": true, "patchType": "JSONPatch", "patch": patch(&json!(ops))}),
            )
        }
        "deny" if object["metadata"]["labels"]["deny"] == "yes" => answer(
            request,
            json!({"allowed": false, "status": {"code": 403, "reason": "Forbidden",
                "message": "pods labelled deny=yes are not welcome here"}}),
        ),
        "deny" => answer(
            request,
            json!({"allowed": true, "warnings": ["checked by the deny webhook"]}),
        ),
        "slow" => {
            tokio::time::sleep(Duration::from_secs(3)).await;
            answer(request, json!({"allowed": true}))
        }
        "beta" => Json(
            json!({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview",
            "response": {"uid": request["uid"], "allowed": true}}),
        ),
        "uid" => Json(
            json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "response": {"uid": "not-the-request", "allowed": true}}),
        ),
        "badpatch" => answer(
            request,
            json!({"allowed": true, "patchType": "JSONPatch",
                "patch": patch(&json!([{"op": "remove", "path": "/spec/nothing/here"}]))}),
        ),
        _ => answer(request, json!({"allowed": true})),
    }
}

/// A running webhook server.
struct Hooks {
    server: TlsServer,
    seen: Arc<Seen>,
}

impl Hooks {
    /// Serves the hooks over HTTPS on 127.0.0.1 (see [`serve_https`]).
    async fn start() -> Self {
        let seen = Arc::new(Seen::default());
        let app = Router::new()
            .route("/{path}", post(hook))
            .with_state(seen.clone());
        Self {
            server: serve_https(app).await,
            seen,
        }
    }

    fn url(&self, path: &str) -> Value {
        self.server.url(path)
    }
}

async fn mutating(client: &kube::Client, name: &str, hooks: Value) -> Value {
    let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let config = serde_json::from_value(json!({"metadata": {"name": name}, "webhooks": hooks}))
        .expect("configuration");
    let created = api
        .create(&PostParams::default(), &config)
        .await
        .expect("create mutating configuration");
    serde_json::to_value(created).expect("json")
}

fn pod(name: &str, labels: Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "app", "image": "busybox:1"}]}
    }))
    .expect("pod")
}

fn api_error(result: Result<impl std::fmt::Debug, kube::Error>) -> kube::core::Status {
    match result {
        Err(kube::Error::Api(status)) => *status,
        other => panic!("expected an API error, got {other:?}"),
    }
}

async fn namespace(client: &kube::Client, name: &str, labels: Value) {
    let api: Api<Namespace> = Api::all(client.clone());
    let ns = serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}}))
        .expect("namespace");
    api.create(&PostParams::default(), &ns)
        .await
        .expect("create namespace");
}

fn has_webhook_toleration(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.tolerations.as_ref())
        .is_some_and(|ts| {
            ts.iter()
                .any(|t| t.key.as_deref() == Some("tether.io/virtual-node"))
        })
}

fn webhooked(pod: &Pod) -> bool {
    pod.metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.get("webhooked").map(String::as_str) == Some("yes"))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_mutating_webhook_behind_a_service_labels_and_tolerates_pods() {
    let hooks = Hooks::start().await;
    let cluster = Cluster::builder().start().await.expect("cluster");
    let client = cluster.client();
    // The webhook is reached as Service webhooks/hooks, whose EndpointSlice names the server.
    namespace(&client, "webhooks", json!({})).await;
    let services: Api<kube::api::DynamicObject> = Api::namespaced_with(
        client.clone(),
        "webhooks",
        &kube::discovery::ApiResource::erase::<k8s_openapi::api::core::v1::Service>(&()),
    );
    let svc = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "hooks"},
        "spec": {"ports": [{"name": "https", "port": 443, "targetPort": "https"}]}}))
    .expect("service");
    services
        .create(&PostParams::default(), &svc)
        .await
        .expect("create service");
    let slices: Api<k8s_openapi::api::discovery::v1::EndpointSlice> =
        Api::namespaced(client.clone(), "webhooks");
    let slice = serde_json::from_value(json!({
        "metadata": {"name": "hooks-1", "labels": {"kubernetes.io/service-name": "hooks"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": true}}],
        "ports": [{"name": "https", "port": hooks.server.port, "protocol": "TCP"}]
    }))
    .expect("slice");
    slices
        .create(&PostParams::default(), &slice)
        .await
        .expect("create slice");
    let stored = mutating(
        &client,
        "offload",
        json!([webhook(
            "offload.tether.test",
            json!({"service": {"namespace": "webhooks", "name": "hooks", "path": "/mutate"},
                "caBundle": hooks.server.ca_bundle}),
            rule(&["CREATE"], &[""], &["pods"]),
            json!({}),
        )]),
    )
    .await;
    let defaulted = &stored["webhooks"][0];
    assert_eq!(defaulted["failurePolicy"], "Fail");
    assert_eq!(defaulted["matchPolicy"], "Equivalent");
    assert_eq!(defaulted["timeoutSeconds"], 10);
    assert_eq!(defaulted["reinvocationPolicy"], "Never");
    assert_eq!(defaulted["clientConfig"]["service"]["port"], 443);
    assert_eq!(defaulted["rules"][0]["scope"], "*");

    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let created = pods
        .create(&PostParams::default(), &pod("web", json!({"app": "web"})))
        .await
        .expect("create pod");
    assert!(webhooked(&created), "{:?}", created.metadata.labels);
    assert!(has_webhook_toleration(&created));
    let fetched = pods.get("web").await.expect("get");
    assert_eq!(fetched, created, "what create answered is what was stored");

    let reviews = hooks.seen.requests("mutate");
    assert_eq!(reviews.len(), 1);
    let request = &reviews[0];
    assert_eq!(request["operation"], "CREATE");
    assert_eq!(
        request["kind"],
        json!({"group": "", "version": "v1", "kind": "Pod"})
    );
    assert_eq!(
        request["resource"],
        json!({"group": "", "version": "v1", "resource": "pods"})
    );
    assert_eq!(request["namespace"], "default");
    assert_eq!(request["name"], "web");
    assert_eq!(request["dryRun"], false);
    assert_eq!(request["options"]["kind"], "CreateOptions");
    assert!(request["oldObject"].is_null());
    assert!(
        !request["userInfo"]["username"]
            .as_str()
            .unwrap_or_default()
            .is_empty(),
        "the caller is named: {}",
        request["userInfo"]
    );
    // The built-in admission ran before the webhook: it sees the defaulted ServiceAccount and
    // the DefaultTolerationSeconds tolerations.
    assert_eq!(request["object"]["spec"]["serviceAccountName"], "default");
    assert_eq!(
        request["object"]["spec"]["restartPolicy"], "Always",
        "decoding defaults are applied before webhooks"
    );
    assert!(
        request["object"]["spec"]["tolerations"]
            .as_array()
            .is_some_and(|t| t.iter().any(|t| t["key"] == "node.kubernetes.io/not-ready")),
        "{}",
        request["object"]["spec"]
    );

    // A generated name is made after the mutating webhooks, as kube-apiserver does it.
    let mut generated = pod("", json!({}));
    generated.metadata.name = None;
    generated.metadata.generate_name = Some("gen-".to_owned());
    let generated = pods
        .create(&PostParams::default(), &generated)
        .await
        .expect("create with generateName");
    assert!(webhooked(&generated));
    assert!(
        generated
            .metadata
            .name
            .as_deref()
            .is_some_and(|n| n.starts_with("gen-") && n.len() > 4)
    );
    let reviews = hooks.seen.requests("mutate");
    assert_eq!(reviews.len(), 2);
    assert!(reviews[1].get("name").is_none(), "{}", reviews[1]);
    assert_eq!(reviews[1]["object"]["metadata"]["generateName"], "gen-");

    // Updates are not in the rule: no call, the pod keeps what it had.
    let patched = pods
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"v": "2"}}})),
        )
        .await
        .expect("patch");
    assert!(webhooked(&patched));
    assert_eq!(hooks.seen.requests("mutate").len(), 2);

    // Pod addresses of a simulated cluster are reached through the dialer the cluster installs:
    // it is handed the endpoint (address, port, node) and connects however it can.
    let dialled = Arc::new(Mutex::new(Vec::new()));
    let (record, port) = (dialled.clone(), hooks.server.port);
    let dialer: WebhookDialer = Arc::new(move |endpoint| {
        record.lock().expect("lock").push(endpoint);
        Box::pin(async move { tokio::net::TcpStream::connect(("127.0.0.1", port)).await })
    });
    *cluster.state().webhook_dialer.write().expect("lock") = Some(dialer);
    slices
        .patch(
            "hooks-1",
            &PatchParams::default(),
            &Patch::Merge(json!({
                "endpoints": [{"addresses": ["10.244.7.9"], "nodeName": "n7", "conditions": {"ready": true}}],
                "ports": [{"name": "https", "port": 9443, "protocol": "TCP"}]
            })),
        )
        .await
        .expect("move the endpoint");
    let remote = pods
        .create(&PostParams::default(), &pod("remote", json!({})))
        .await
        .expect("create pod through the dialer");
    assert!(webhooked(&remote));
    assert_eq!(
        *dialled.lock().expect("lock"),
        [WebhookEndpoint {
            ip: "10.244.7.9".parse().expect("ip"),
            port: 9443,
            node_name: Some("n7".to_owned()),
        }]
    );

    // Without its endpoints the service cannot be called: failurePolicy Fail refuses.
    slices
        .delete("hooks-1", &DeleteParams::default())
        .await
        .expect("delete slice");
    let err = api_error(
        pods.create(&PostParams::default(), &pod("lonely", json!({})))
            .await,
    );
    assert_eq!(err.code, 500);
    assert_eq!(
        err.message,
        "Internal error occurred: failed calling webhook \"offload.tether.test\": failed to call webhook: no endpoints available for service \"hooks\""
    );
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_validating_webhook_denies_with_its_status_and_warns() {
    let hooks = Hooks::start().await;
    let cluster = Cluster::builder().start().await.expect("cluster");
    let client = cluster.client();
    validating(
        &client,
        "policy",
        json!([webhook(
            "deny.tether.test",
            hooks.url("deny"),
            rule(&["CREATE", "UPDATE"], &[""], &["pods"]),
            json!({}),
        )]),
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let err = api_error(
        pods.create(&PostParams::default(), &pod("bad", json!({"deny": "yes"})))
            .await,
    );
    assert_eq!(err.code, 403);
    assert_eq!(err.reason, "Forbidden");
    assert_eq!(
        err.message,
        "admission webhook \"deny.tether.test\" denied the request: pods labelled deny=yes are not welcome here"
    );
    assert!(pods.get_opt("bad").await.expect("get").is_none());
    // The validating webhook sees the object as it is stored: with its uid.
    let seen = hooks.seen.requests("deny");
    assert!(seen[0]["object"]["metadata"]["uid"].is_string());
    let metrics = client
        .request_text(
            http::Request::get("/metrics")
                .body(Vec::new())
                .expect("request"),
        )
        .await
        .expect("metrics");
    assert!(
        metrics.lines().any(|l| l
            == "apiserver_admission_webhook_request_total{name=\"deny.tether.test\",type=\"validating\",operation=\"CREATE\",code=\"200\",rejected=\"true\"} 1"),
        "{metrics}"
    );

    if kubectl_available() {
        let k = Kubectl::new(&cluster);
        let manifest = |name: &str, deny: &str| {
            format!(
                "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  labels: {{deny: \"{deny}\"}}\nspec:\n  containers: [{{name: app, image: busybox:1}}]\n"
            )
        };
        let bad = k.file("bad.yaml", &manifest("bad", "yes"));
        let stderr = k.fails(&["create", "-f", &bad]).await;
        assert!(
            stderr.contains(
                "admission webhook \"deny.tether.test\" denied the request: pods labelled deny=yes are not welcome here"
            ),
            "{stderr}"
        );
        let good = k.file("good.yaml", &manifest("good", "no"));
        let out = k.run(&["create", "-f", &good]).await;
        assert!(out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("Warning: checked by the deny webhook"),
            "{stderr}"
        );
        // An update to a denied state is refused too, and kubectl says why.
        let stderr = k
            .fails(&["label", "pod", "good", "deny=yes", "--overwrite"])
            .await;
        assert!(
            stderr.contains("denied the request: pods labelled deny=yes"),
            "{stderr}"
        );
    }
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn namespace_and_object_selectors_choose_who_is_called() {
    let hooks = Hooks::start().await;
    let cluster = Cluster::builder().start().await.expect("cluster");
    let client = cluster.client();
    namespace(
        &client,
        "offloaded",
        json!({"tether.io/offloading": "enabled"}),
    )
    .await;
    namespace(&client, "local", json!({})).await;
    mutating(
        &client,
        "offload",
        json!([webhook(
            "offload.tether.test",
            hooks.url("mutate"),
            rule(&["CREATE"], &[""], &["pods"]),
            json!({
                "namespaceSelector": {"matchLabels": {"tether.io/offloading": "enabled"}},
                "objectSelector": {"matchExpressions": [{"key": "tether.io/local", "operator": "DoesNotExist"}]},
            }),
        )]),
    )
    .await;
    let create = |ns: &str, name: &str, labels: Value| {
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        let pod = pod(name, labels);
        async move {
            pods.create(&PostParams::default(), &pod)
                .await
                .expect("create pod")
        }
    };
    assert!(webhooked(&create("offloaded", "a", json!({})).await));
    assert!(!webhooked(&create("local", "b", json!({})).await));
    assert!(!webhooked(
        &create("offloaded", "c", json!({"tether.io/local": "true"})).await
    ));
    let names: Vec<Value> = hooks
        .seen
        .requests("mutate")
        .iter()
        .map(|r| r["name"].clone())
        .collect();
    assert_eq!(names, [json!("a")]);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn calls_reuse_the_connection_to_a_webhook() {
    let hooks = Hooks::start().await;
    let cluster = Cluster::builder().start().await.expect("cluster");
    let client = cluster.client();
    mutating(
        &client,
        "reuse",
        json!([webhook(
            "reuse.tether.test",
            hooks.url("mutate"),
            rule(&["CREATE"], &[""], &["pods"]),
            json!({}),
        )]),
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    for i in 0..10 {
        let created = pods
            .create(&PostParams::default(), &pod(&format!("p{i}"), json!({})))
            .await
            .expect("create pod");
        assert!(webhooked(&created), "call {i} went through");
    }
    assert_eq!(hooks.seen.requests("mutate").len(), 10);
    assert_eq!(
        hooks
            .server
            .accepted
            .load(std::sync::atomic::Ordering::SeqCst),
        1,
        "ten calls one after the other share one connection"
    );
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn rules_match_operations_subresources_and_custom_resources() {
    let hooks = Hooks::start().await;
    let cluster = Cluster::builder().start().await.expect("cluster");
    let client = cluster.client();
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(client.clone());
    let crd = serde_json::from_value(json!({
        "metadata": {"name": "widgets.example.com"},
        "spec": {"group": "example.com", "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}
    }))
    .expect("crd");
    crds.create(&PostParams::default(), &crd)
        .await
        .expect("create crd");
    validating(
        &client,
        "audit",
        json!([
            webhook("creates.tether.test", hooks.url("creates"), rule(&["CREATE"], &[""], &["configmaps"]), json!({})),
            webhook("status.tether.test", hooks.url("status"), rule(&["UPDATE"], &[""], &["pods/status"]), json!({})),
            webhook("widgets.tether.test", hooks.url("widgets"),
                json!([{"operations": ["*"], "apiGroups": ["example.com"], "apiVersions": ["*"], "resources": ["widgets"], "scope": "Cluster"}]),
                json!({})),
            webhook("widgets-ns.tether.test", hooks.url("widgets-ns"),
                json!([{"operations": ["*"], "apiGroups": ["example.com"], "apiVersions": ["v1"], "resources": ["widgets"], "scope": "Namespaced"}]),
                json!({})),
        ]),
    )
    .await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let cm = serde_json::from_value(json!({"metadata": {"name": "cm"}, "data": {"a": "1"}}))
        .expect("cm");
    cms.create(&PostParams::default(), &cm)
        .await
        .expect("create");
    cms.patch(
        "cm",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"a": "2"}})),
    )
    .await
    .expect("patch");
    let creates = hooks.seen.requests("creates");
    assert_eq!(creates.len(), 1, "CREATE only: the patch is not sent");
    assert_eq!(creates[0]["operation"], "CREATE");

    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.create(&PostParams::default(), &pod("p", json!({})))
        .await
        .expect("create pod");
    pods.patch(
        "p",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
    )
    .await
    .expect("patch pod");
    assert!(
        hooks.seen.requests("status").is_empty(),
        "pods/status does not cover pods"
    );
    pods.patch_status(
        "p",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Running"}})),
    )
    .await
    .expect("patch status");
    let status = hooks.seen.requests("status");
    assert_eq!(status.len(), 1);
    assert_eq!(status[0]["subResource"], "status");
    assert_eq!(status[0]["operation"], "UPDATE");
    assert_eq!(status[0]["options"]["kind"], "UpdateOptions");
    assert_eq!(status[0]["oldObject"]["metadata"]["name"], "p");

    let widgets: Api<kube::api::DynamicObject> = Api::namespaced_with(
        client.clone(),
        "default",
        &kube::discovery::ApiResource {
            group: "example.com".into(),
            version: "v1".into(),
            api_version: "example.com/v1".into(),
            kind: "Widget".into(),
            plural: "widgets".into(),
        },
    );
    let widget = serde_json::from_value(json!({"apiVersion": "example.com/v1", "kind": "Widget",
        "metadata": {"name": "w"}, "spec": {"size": 3}}))
    .expect("widget");
    widgets
        .create(&PostParams::default(), &widget)
        .await
        .expect("create widget");
    assert!(
        hooks.seen.requests("widgets").is_empty(),
        "a Cluster-scoped rule does not cover namespaced widgets"
    );
    let seen = hooks.seen.requests("widgets-ns");
    assert_eq!(seen.len(), 1);
    assert_eq!(
        seen[0]["kind"],
        json!({"group": "example.com", "version": "v1", "kind": "Widget"})
    );
    assert_eq!(seen[0]["object"]["spec"]["size"], 3);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn failure_policies_timeouts_and_bad_answers() {
    let hooks = Hooks::start().await;
    let cluster = Cluster::builder().start().await.expect("cluster");
    let client = cluster.client();
    // A port nothing listens on.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let down = json!({"url": format!("https://127.0.0.1:{closed}/down"), "caBundle": hooks.server.ca_bundle});
    validating(
        &client,
        "down",
        json!([
            webhook("fail.tether.test", down.clone(), rule(&["CREATE"], &[""], &["configmaps"]),
                json!({"objectSelector": {"matchLabels": {"case": "fail"}}})),
            webhook("ignore.tether.test", down, rule(&["CREATE"], &[""], &["configmaps"]),
                json!({"failurePolicy": "Ignore", "objectSelector": {"matchLabels": {"case": "ignore"}}})),
            webhook("slow.tether.test", hooks.url("slow"), rule(&["CREATE"], &[""], &["configmaps"]),
                json!({"timeoutSeconds": 1, "objectSelector": {"matchLabels": {"case": "slow"}}})),
            webhook("uid.tether.test", hooks.url("uid"), rule(&["CREATE"], &[""], &["configmaps"]),
                json!({"objectSelector": {"matchLabels": {"case": "uid"}}})),
        ]),
    )
    .await;
    mutating(
        &client,
        "broken",
        json!([webhook("badpatch.tether.test", hooks.url("badpatch"), rule(&["CREATE"], &[""], &["configmaps"]),
            json!({"failurePolicy": "Ignore", "objectSelector": {"matchLabels": {"case": "badpatch"}}}))]),
    )
    .await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let cm = |case: &str| -> ConfigMap {
        serde_json::from_value(json!({"metadata": {"name": case, "labels": {"case": case}}}))
            .expect("cm")
    };
    let err = api_error(cms.create(&PostParams::default(), &cm("fail")).await);
    assert_eq!((err.code, err.reason.as_str()), (500, "InternalError"));
    assert_eq!(
        err.message,
        format!(
            "Internal error occurred: failed calling webhook \"fail.tether.test\": failed to call webhook: Post \"https://127.0.0.1:{closed}/down?timeout=10s\": dial tcp 127.0.0.1:{closed}: connect: connection refused"
        )
    );
    cms.create(&PostParams::default(), &cm("ignore"))
        .await
        .expect("Ignore lets the request through");
    let metrics = client
        .request_text(
            http::Request::get("/metrics")
                .body(Vec::new())
                .expect("request"),
        )
        .await
        .expect("metrics");
    for (name, rejected) in [("fail", true), ("ignore", false)] {
        let line = format!(
            "apiserver_admission_webhook_request_total{{name=\"{name}.tether.test\",type=\"validating\",operation=\"CREATE\",code=\"400\",rejected=\"{rejected}\"}} 1"
        );
        assert!(metrics.lines().any(|l| l == line), "{line} in {metrics}");
    }

    let started = Instant::now();
    let err = api_error(cms.create(&PostParams::default(), &cm("slow")).await);
    let took = started.elapsed();
    assert_eq!(err.code, 500);
    assert!(
        err.message.ends_with(&format!(
            "failed calling webhook \"slow.tether.test\": failed to call webhook: Post \"https://127.0.0.1:{}/slow?timeout=1s\": context deadline exceeded",
            hooks.server.port
        )),
        "{}",
        err.message
    );
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_millis(2500),
        "timed out after {took:?}"
    );

    let err = api_error(cms.create(&PostParams::default(), &cm("uid")).await);
    assert_eq!(err.code, 500);
    assert!(
        err.message.contains(
            "failed calling webhook \"uid.tether.test\": received invalid webhook response: expected response.uid="
        ),
        "{}",
        err.message
    );
    // A patch that does not apply fails the request whatever the failure policy.
    let err = api_error(cms.create(&PostParams::default(), &cm("badpatch")).await);
    assert_eq!(err.code, 500, "{}", err.message);
    assert!(
        err.message.starts_with("Internal error occurred: "),
        "{}",
        err.message
    );
    assert!(cms.get_opt("badpatch").await.expect("get").is_none());
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn deletes_send_the_old_object_and_dry_runs_are_flagged() {
    let hooks = Hooks::start().await;
    let cluster = Cluster::builder().start().await.expect("cluster");
    let client = cluster.client();
    validating(
        &client,
        "audit",
        json!([webhook(
            "audit.tether.test",
            hooks.url("audit"),
            rule(&["*"], &[""], &["configmaps"]),
            json!({"sideEffects": "NoneOnDryRun"}),
        )]),
    )
    .await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "cm"}, "data": {"k": "v"}}))
            .expect("cm");
    cms.create(&PostParams::default(), &cm)
        .await
        .expect("create");
    cms.delete("cm", &DeleteParams::default())
        .await
        .expect("delete");
    let reviews = hooks.seen.requests("audit");
    let delete = reviews.last().expect("a review");
    assert_eq!(delete["operation"], "DELETE");
    assert!(delete["object"].is_null());
    assert_eq!(delete["oldObject"]["data"]["k"], "v");
    assert_eq!(delete["name"], "cm");
    assert_eq!(delete["options"]["kind"], "DeleteOptions");

    // A deletecollection sends each object it deletes.
    for (name, group) in [("x1", "x"), ("x2", "x"), ("y1", "y")] {
        let item =
            serde_json::from_value(json!({"metadata": {"name": name, "labels": {"group": group}}}))
                .expect("cm");
        cms.create(&PostParams::default(), &item)
            .await
            .expect("create");
    }
    cms.delete_collection(
        &DeleteParams::default(),
        &kube::api::ListParams::default().labels("group=x"),
    )
    .await
    .expect("delete collection");
    let mut deleted: Vec<Value> = hooks
        .seen
        .requests("audit")
        .iter()
        .filter(|r| r["operation"] == "DELETE" && r["name"] != "cm")
        .map(|r| json!([r["name"], r["oldObject"]["metadata"]["labels"]["group"]]))
        .collect();
    deleted.sort_by_key(Value::to_string);
    assert_eq!(deleted, [json!(["x1", "x"]), json!(["x2", "x"])]);
    assert!(cms.get_opt("y1").await.expect("get").is_some());

    // Server-side apply creates, then updates, through the webhooks; ownership is kept.
    let ssa = PatchParams::apply("tether-test");
    let applied = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "applied"}, "data": {"k": "1"}});
    cms.patch("applied", &ssa, &Patch::Apply(&applied))
        .await
        .expect("apply creates");
    let mut again = applied.clone();
    again["data"]["k"] = json!("2");
    let updated = cms
        .patch("applied", &ssa, &Patch::Apply(&again))
        .await
        .expect("apply updates");
    assert_eq!(
        updated
            .data
            .as_ref()
            .and_then(|d| d.get("k"))
            .map(String::as_str),
        Some("2")
    );
    let managers: Vec<_> = updated
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .map(|m| (m.manager.clone(), m.operation.clone()))
        .collect();
    assert_eq!(
        managers,
        [(Some("tether-test".to_owned()), Some("Apply".to_owned()))]
    );
    let ops: Vec<Value> = hooks
        .seen
        .requests("audit")
        .iter()
        .filter(|r| r["name"] == "applied")
        .map(|r| {
            json!([
                r["operation"],
                r["options"]["kind"],
                r["options"]["fieldManager"]
            ])
        })
        .collect();
    assert_eq!(
        ops,
        [
            json!(["CREATE", "CreateOptions", "tether-test"]),
            json!(["UPDATE", "UpdateOptions", "tether-test"])
        ]
    );

    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    cms.create(&dry, &cm).await.expect("dry-run create");
    let reviews = hooks.seen.requests("audit");
    let last = reviews.last().expect("a review");
    assert_eq!(last["operation"], "CREATE");
    assert_eq!(last["dryRun"], true);
    assert!(
        cms.get_opt("cm").await.expect("get").is_none(),
        "nothing stored"
    );

    // A webhook that speaks only v1beta1 gets (and must answer) a v1beta1 review.
    validating(
        &client,
        "beta",
        json!([webhook(
            "beta.tether.test",
            hooks.url("beta"),
            rule(&["CREATE"], &[""], &["configmaps"]),
            json!({"admissionReviewVersions": ["v2", "v1beta1"]}),
        )]),
    )
    .await;
    cms.create(&PostParams::default(), &cm)
        .await
        .expect("create through the v1beta1 webhook");
    assert_eq!(
        hooks.seen.api_versions("beta"),
        [json!("admission.k8s.io/v1beta1")]
    );
    assert_eq!(
        hooks.seen.api_versions("audit").last(),
        Some(&json!("admission.k8s.io/v1"))
    );

    // v1 allows only side-effect-free webhooks, so one that may have side effects is refused.
    let api: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let config = serde_json::from_value(json!({"metadata": {"name": "effects"}, "webhooks": [
        webhook("effects.tether.test", hooks.url("allow"), rule(&["*"], &[""], &["configmaps"]),
            json!({"sideEffects": "Unknown", "admissionReviewVersions": ["v2"]}))]}))
    .expect("configuration");
    let err = api_error(api.create(&PostParams::default(), &config).await);
    assert_eq!(err.code, 422);
    assert_eq!(
        err.message,
        "ValidatingWebhookConfiguration.admissionregistration.k8s.io \"effects\" is invalid: [webhooks[0].sideEffects: Unsupported value: \"Unknown\": supported values: \"None\", \"NoneOnDryRun\", webhooks[0].admissionReviewVersions: Invalid value: []string{\"v2\"}: must include at least one of v1, v1beta1]"
    );
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn if_needed_webhooks_are_called_again_after_a_later_change() {
    let hooks = Hooks::start().await;
    let cluster = Cluster::builder().start().await.expect("cluster");
    let client = cluster.client();
    // Configurations run in name order: `a-observe` first, then `b-mutate` changes the pod.
    mutating(
        &client,
        "a-observe",
        json!([
            webhook(
                "again.tether.test",
                hooks.url("again"),
                rule(&["CREATE"], &[""], &["pods"]),
                json!({"reinvocationPolicy": "IfNeeded"})
            ),
            webhook(
                "once.tether.test",
                hooks.url("once"),
                rule(&["CREATE"], &[""], &["pods"]),
                json!({})
            ),
        ]),
    )
    .await;
    mutating(
        &client,
        "b-mutate",
        json!([webhook(
            "offload.tether.test",
            hooks.url("mutate"),
            rule(&["CREATE"], &[""], &["pods"]),
            json!({"objectSelector": {"matchLabels": {"offload": "yes"}}})
        )]),
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.create(
        &PostParams::default(),
        &pod("changed", json!({"offload": "yes"})),
    )
    .await
    .expect("create");
    let again = hooks.seen.requests("again");
    assert_eq!(
        again.len(),
        2,
        "called again after b-mutate changed the pod"
    );
    assert!(again[0]["object"]["metadata"]["labels"]["webhooked"].is_null());
    assert_eq!(again[1]["object"]["metadata"]["labels"]["webhooked"], "yes");
    assert_eq!(hooks.seen.requests("once").len(), 1, "Never is called once");
    pods.create(&PostParams::default(), &pod("unchanged", json!({})))
        .await
        .expect("create");
    assert_eq!(
        hooks.seen.requests("again").len(),
        3,
        "nothing changed after it: no second call"
    );
    cluster.shutdown().await;
}
