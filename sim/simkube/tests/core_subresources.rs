//! Contract tests for subresources and write semantics beyond plain CRUD: binding, eviction,
//! scale, CSR approval, deletecollection, propagation finalizers, immutable ConfigMaps, patch
//! types, server-side apply, CRDs and custom resources, and kube-runtime's finalizer helper.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::runtime::wait::{await_condition, conditions};
use serde_json::{Value, json};
use simkube::Cluster;

fn pod(name: &str, node: Option<&str>) -> Pod {
    let mut spec = json!({"containers": [{"name": "c", "image": "busybox:1"}]});
    if let Some(n) = node {
        spec["nodeName"] = json!(n);
    }
    serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).expect("pod")
}

fn code(err: &kube::Error) -> u16 {
    match err {
        kube::Error::Api(s) => s.code,
        other => panic!("expected an API error, got {other:?}"),
    }
}

async fn post<T: serde::de::DeserializeOwned>(
    client: &kube::Client,
    path: &str,
    body: Value,
) -> Result<T, kube::Error> {
    let req = http::Request::post(path)
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&body).expect("json"))
        .expect("request");
    client.request(req).await
}

#[tokio::test(flavor = "multi_thread")]
async fn binding_sets_the_node_once_and_eviction_deletes() {
    let c = Cluster::builder().start().await.expect("start");
    let client = c.client();
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    pods.create(&PostParams::default(), &pod("p", None))
        .await
        .expect("create");
    let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p"}, "target": {"kind": "Node", "name": "n1"}});
    let _: Value = post(
        &client,
        "/api/v1/namespaces/default/pods/p/binding",
        binding.clone(),
    )
    .await
    .expect("bind");
    let bound = pods.get("p").await.expect("get");
    assert_eq!(
        bound.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        Some("n1")
    );
    let scheduled = bound.status.and_then(|s| s.conditions).unwrap_or_default();
    assert!(
        scheduled
            .iter()
            .any(|c| c.type_ == "PodScheduled" && c.status == "True")
    );
    let err = post::<Value>(
        &client,
        "/api/v1/namespaces/default/pods/p/binding",
        binding,
    )
    .await
    .expect_err("rebind");
    assert_eq!(code(&err), 409);

    pods.create(&PostParams::default(), &pod("evict-me", None))
        .await
        .expect("create");
    let eviction =
        json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "evict-me"}});
    let _: Value = post(
        &client,
        "/api/v1/namespaces/default/pods/evict-me/eviction",
        eviction,
    )
    .await
    .expect("evict");
    assert!(pods.get_opt("evict-me").await.expect("get").is_none());
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn scale_subresource_reads_and_writes_replicas() {
    let c = Cluster::builder().start().await.expect("start");
    let deps: Api<Deployment> = Api::default_namespaced(c.client());
    let d: Deployment = serde_json::from_value(json!({"metadata": {"name": "d"}, "spec": {
        "replicas": 2, "selector": {"matchLabels": {"app": "d"}},
        "template": {"metadata": {"labels": {"app": "d"}}, "spec": {"containers": [{"name": "c", "image": "i:1"}]}}}}))
    .expect("deployment");
    deps.create(&PostParams::default(), &d)
        .await
        .expect("create");
    let scale = deps.get_scale("d").await.expect("scale");
    assert_eq!(scale.spec.and_then(|s| s.replicas), Some(2));
    assert_eq!(
        scale.status.map(|s| s.selector),
        Some(Some("app=d".to_owned()))
    );
    let patched = deps
        .patch_scale(
            "d",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"replicas": 5}})),
        )
        .await
        .expect("patch scale");
    assert_eq!(patched.spec.and_then(|s| s.replicas), Some(5));
    let after = deps.get("d").await.expect("get");
    assert_eq!(after.spec.and_then(|s| s.replicas), Some(5));
    assert_eq!(after.metadata.generation, Some(2));
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn csr_approval_only_changes_conditions() {
    let c = Cluster::builder().start().await.expect("start");
    let csrs: Api<CertificateSigningRequest> = Api::all(c.client());
    let csr: CertificateSigningRequest = serde_json::from_value(json!({"metadata": {"name": "alice"}, "spec": {
        "request": "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURSBSRVFVRVNULS0tLS0K", "signerName": "kubernetes.io/kube-apiserver-client",
        "usages": ["client auth"]}}))
    .expect("csr");
    let mut made = csrs
        .create(&PostParams::default(), &csr)
        .await
        .expect("create");
    made.status = Some(serde_json::from_value(json!({"conditions": [{"type": "Approved", "status": "True", "reason": "Test", "message": "ok"}]})).expect("status"));
    made.spec.usages = Some(vec!["digital signature".into()]);
    let req = http::Request::put(
        "/apis/certificates.k8s.io/v1/certificatesigningrequests/alice/approval",
    )
    .header("content-type", "application/json")
    .body(serde_json::to_vec(&made).expect("json"))
    .expect("request");
    let approved: CertificateSigningRequest = c.client().request(req).await.expect("approve");
    let conds = approved
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default();
    assert_eq!(conds.len(), 1);
    assert_eq!(conds[0].type_, "Approved");
    assert_eq!(
        approved.spec.usages,
        Some(vec!["client auth".to_owned()]),
        "approval leaves spec alone"
    );
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn delete_collection_with_selector_and_propagation_finalizers() {
    let c = Cluster::builder().start().await.expect("start");
    let cms: Api<ConfigMap> = Api::default_namespaced(c.client());
    for (n, team) in [("a", "x"), ("b", "x"), ("c", "y")] {
        let cm: ConfigMap =
            serde_json::from_value(json!({"metadata": {"name": n, "labels": {"team": team}}}))
                .expect("cm");
        cms.create(&PostParams::default(), &cm)
            .await
            .expect("create");
    }
    cms.delete_collection(
        &DeleteParams::default(),
        &ListParams::default().labels("team=x"),
    )
    .await
    .expect("deletecollection");
    let left: Vec<_> = cms
        .list(&ListParams::default())
        .await
        .expect("list")
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .collect();
    assert_eq!(left, ["c"]);

    let fg = cms
        .delete("c", &DeleteParams::foreground())
        .await
        .expect("delete")
        .left()
        .expect("kept for the GC");
    assert_eq!(
        fg.metadata.finalizers,
        Some(vec!["foregroundDeletion".to_owned()])
    );
    assert!(fg.metadata.deletion_timestamp.is_some());
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "o"}})).expect("cm");
    cms.create(&PostParams::default(), &cm)
        .await
        .expect("create");
    let orphan = cms
        .delete("o", &DeleteParams::orphan())
        .await
        .expect("delete")
        .left()
        .expect("kept");
    assert_eq!(orphan.metadata.finalizers, Some(vec!["orphan".to_owned()]));
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn immutable_configmaps_refuse_data_changes() {
    let c = Cluster::builder().start().await.expect("start");
    let cms: Api<ConfigMap> = Api::default_namespaced(c.client());
    let cm: ConfigMap = serde_json::from_value(
        json!({"metadata": {"name": "frozen"}, "data": {"a": "1"}, "immutable": true}),
    )
    .expect("cm");
    cms.create(&PostParams::default(), &cm)
        .await
        .expect("create");
    let err = cms
        .patch(
            "frozen",
            &PatchParams::default(),
            &Patch::Merge(&json!({"data": {"a": "2"}})),
        )
        .await
        .expect_err("immutable");
    assert_eq!(code(&err), 422);
    cms.patch(
        "frozen",
        &PatchParams::default(),
        &Patch::Merge(&json!({"metadata": {"labels": {"ok": "yes"}}})),
    )
    .await
    .expect("labels still change");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn patch_types_and_server_side_apply() {
    let c = Cluster::builder().start().await.expect("start");
    let cms: Api<ConfigMap> = Api::default_namespaced(c.client());
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "p"}, "data": {"a": "1", "b": "2"}}))
            .expect("cm");
    cms.create(&PostParams::default(), &cm)
        .await
        .expect("create");
    let merged = cms
        .patch(
            "p",
            &PatchParams::default(),
            &Patch::Merge(&json!({"data": {"a": null}})),
        )
        .await
        .expect("merge");
    assert_eq!(merged.data.expect("data").keys().collect::<Vec<_>>(), ["b"]);
    // JSON patch `test` of a missing path against null passes (kube-runtime's finalizer helper).
    let ops: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/finalizers", "value": null},
        {"op": "add", "path": "/metadata/finalizers", "value": ["x.example.com/f"]}
    ]))
    .expect("ops");
    let with_fin = cms
        .patch("p", &PatchParams::default(), &Patch::Json::<()>(ops))
        .await
        .expect("json patch");
    assert_eq!(
        with_fin.metadata.finalizers,
        Some(vec!["x.example.com/f".to_owned()])
    );
    let bad: json_patch::Patch =
        serde_json::from_value(json!([{"op": "test", "path": "/data/b", "value": "nope"}]))
            .expect("ops");
    let err = cms
        .patch("p", &PatchParams::default(), &Patch::Json::<()>(bad))
        .await
        .expect_err("test fails");
    assert_eq!(code(&err), 422);

    // Apply creates (201) and a second manager conflicts unless forced.
    let applied = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa"}, "data": {"k": "one"}});
    let made = cms
        .patch("ssa", &PatchParams::apply("alpha"), &Patch::Apply(&applied))
        .await
        .expect("apply creates");
    assert!(
        made.metadata
            .managed_fields
            .as_ref()
            .is_some_and(|m| m.iter().any(|e| e.manager.as_deref() == Some("alpha")))
    );
    let other = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa"}, "data": {"k": "two"}});
    let err = cms
        .patch("ssa", &PatchParams::apply("beta"), &Patch::Apply(&other))
        .await
        .expect_err("conflict");
    assert_eq!(code(&err), 409);
    let forced = cms
        .patch(
            "ssa",
            &PatchParams::apply("beta").force(),
            &Patch::Apply(&other),
        )
        .await
        .expect("forced");
    assert_eq!(forced.data.expect("data")["k"], "two");
    c.shutdown().await;
}

fn widget_crd(status: bool) -> CustomResourceDefinition {
    let mut version = json!({"name": "v1", "served": true, "storage": true, "schema": {"openAPIV3Schema": {
        "type": "object", "properties": {
            "spec": {"type": "object", "properties": {"size": {"type": "integer", "default": 1}, "color": {"type": "string"}}},
            "status": {"type": "object", "properties": {"ready": {"type": "boolean"}}}}}}});
    if status {
        version["subresources"] = json!({"status": {}});
    }
    serde_json::from_value(json!({"metadata": {"name": "widgets.example.com"}, "spec": {
        "group": "example.com", "scope": "Namespaced",
        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
        "versions": [version]}}))
    .expect("crd")
}

#[tokio::test(flavor = "multi_thread")]
async fn crds_register_types_and_custom_resources_follow_their_schema() {
    let c = Cluster::builder().start().await.expect("start");
    let client = c.client();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(&PostParams::default(), &widget_crd(true))
        .await
        .expect("crd");
    let established = await_condition(
        crds.clone(),
        "widgets.example.com",
        conditions::is_crd_established(),
    );
    tokio::time::timeout(Duration::from_secs(5), established)
        .await
        .expect("in time")
        .expect("established");

    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("example.com", "v1", "Widget"),
        "widgets",
    );
    let widgets: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &ar);
    let w: DynamicObject =
        serde_json::from_value(json!({"apiVersion": "example.com/v1", "kind": "Widget",
        "metadata": {"name": "w1"}, "spec": {"color": "red", "unknown": 1}}))
        .expect("widget");
    let made = widgets
        .create(&PostParams::default(), &w)
        .await
        .expect("create widget");
    assert_eq!(made.data["spec"]["size"], 1, "schema default applied");
    assert!(
        made.data["spec"].get("unknown").is_none(),
        "unknown field pruned"
    );
    assert_eq!(made.metadata.generation, Some(1));
    let err = widgets
        .patch(
            "w1",
            &PatchParams::default(),
            &Patch::Strategic(&json!({"spec": {"size": 2}})),
        )
        .await
        .expect_err("no strategic merge for custom resources");
    assert_eq!(code(&err), 415);
    let st = widgets
        .patch_status(
            "w1",
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": {"ready": true}})),
        )
        .await
        .expect("status");
    assert_eq!(st.data["status"]["ready"], true);
    assert_eq!(st.metadata.generation, Some(1));
    let discovery = kube::Discovery::new(client.clone())
        .run()
        .await
        .expect("discovery");
    assert!(discovery.has_group("example.com"));

    crds.delete("widgets.example.com", &DeleteParams::default())
        .await
        .expect("delete crd");
    let err = widgets
        .list(&ListParams::default())
        .await
        .expect_err("type gone");
    assert_eq!(code(&err), 404);
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn kube_runtime_finalizer_helper_runs_cleanup_to_completion() {
    let c = Cluster::builder().start().await.expect("start");
    let cms: Api<ConfigMap> = Api::default_namespaced(c.client());
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "guarded"}})).expect("cm");
    cms.create(&PostParams::default(), &cm)
        .await
        .expect("create");
    let cleaned = Arc::new(tokio::sync::Notify::new());
    let ctx = Arc::new((cms.clone(), cleaned.clone()));
    let controller = Controller::new(cms.clone(), Default::default())
        .run(
            |obj: Arc<ConfigMap>, ctx: Arc<(Api<ConfigMap>, Arc<tokio::sync::Notify>)>| async move {
                let (api, cleaned) = (&ctx.0, ctx.1.clone());
                finalizer(api, "example.com/cleanup", obj, |event| async move {
                    match event {
                        Finalizer::Apply(_) => Ok::<_, kube::Error>(Action::await_change()),
                        Finalizer::Cleanup(_) => {
                            cleaned.notify_one();
                            Ok(Action::await_change())
                        }
                    }
                })
                .await
            },
            |_, _, _| Action::requeue(Duration::from_millis(200)),
            ctx,
        )
        .for_each(|_| async {});
    let handle = tokio::spawn(controller);
    let deadline = Duration::from_secs(10);
    tokio::time::timeout(deadline, async {
        loop {
            let cur = cms.get("guarded").await.expect("get");
            if cur
                .metadata
                .finalizers
                .is_some_and(|f| f.contains(&"example.com/cleanup".to_owned()))
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the finalizer is added");
    cms.delete("guarded", &DeleteParams::default())
        .await
        .expect("delete");
    tokio::time::timeout(deadline, cleaned.notified())
        .await
        .expect("cleanup ran");
    tokio::time::timeout(deadline, async {
        while cms.get_opt("guarded").await.expect("get").is_some() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the object is gone once the finalizer is removed");
    handle.abort();
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn recorder_events_are_visible_as_core_events() {
    use k8s_openapi::api::core::v1::Event as CoreEvent;
    use kube::Resource as _;
    use kube::runtime::events::{Event, EventType, Recorder, Reporter};
    let c = Cluster::builder().start().await.expect("start");
    let client = c.client();
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "observed"}})).expect("cm");
    let cm = cms
        .create(&PostParams::default(), &cm)
        .await
        .expect("create");
    let reporter = Reporter {
        controller: "tether-test".into(),
        instance: Some("t-1".into()),
    };
    let recorder = Recorder::new(client.clone(), reporter);
    let ev = Event {
        type_: EventType::Normal,
        reason: "Synced".into(),
        note: Some("all good".into()),
        action: "Sync".into(),
        secondary: None,
    };
    recorder
        .publish(&ev, &cm.object_ref(&()))
        .await
        .expect("publish");
    // What `kubectl describe` asks for.
    let core: Api<CoreEvent> = Api::default_namespaced(client.clone());
    let found = core
        .list(
            &ListParams::default()
                .fields("involvedObject.name=observed,involvedObject.kind=ConfigMap"),
        )
        .await
        .expect("list core events");
    assert_eq!(found.items.len(), 1);
    let e = &found.items[0];
    assert_eq!(e.message.as_deref(), Some("all good"));
    assert_eq!(e.reason.as_deref(), Some("Synced"));
    assert_eq!(e.reporting_component.as_deref(), Some("tether-test"));
    assert_eq!(e.involved_object.uid, cm.metadata.uid);
    c.shutdown().await;
}
