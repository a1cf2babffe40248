//! Contract tests for object CRUD through the real kube-rs client over HTTP: server-set
//! metadata, generateName, the error Statuses, optimistic concurrency, the status split,
//! generation, finalizers and namespace lifecycle.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Service};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::core::Status;
use serde_json::json;
use simkube::Cluster;

async fn cluster() -> Cluster {
    Cluster::builder()
        .name("crud")
        .start()
        .await
        .expect("cluster starts")
}

fn cm(name: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}, "data": {"k": "v"}}))
        .expect("configmap")
}

fn api_error(err: kube::Error) -> Status {
    match err {
        kube::Error::Api(status) => *status,
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn create_sets_uid_rv_timestamp_and_generation() {
    let c = cluster().await;
    let api: Api<ConfigMap> = Api::default_namespaced(c.client());
    let created = api
        .create(&PostParams::default(), &cm("a"))
        .await
        .expect("create");
    let meta = &created.metadata;
    assert_eq!(meta.namespace.as_deref(), Some("default"));
    assert!(
        meta.uid.as_deref().is_some_and(|u| u.len() == 36),
        "uid {:?}",
        meta.uid
    );
    let rv: u64 = meta
        .resource_version
        .as_deref()
        .expect("rv")
        .parse()
        .expect("numeric rv");
    assert!(rv > 0);
    assert_eq!(
        meta.generation, None,
        "ConfigMaps carry no generation, as on a real server"
    );
    let ts = meta.creation_timestamp.as_ref().expect("creationTimestamp");
    let raw = serde_json::to_value(ts).expect("ts");
    assert!(
        raw.as_str()
            .is_some_and(|s| s.ends_with('Z') && !s.contains('.')),
        "second precision: {raw}"
    );
    let got = api.get("a").await.expect("get");
    assert_eq!(got.metadata.uid, created.metadata.uid);
    assert_eq!(got.data, created.data);
    let list = api.list(&Default::default()).await.expect("list");
    assert_eq!(list.items.len(), 1);
    let list_rv: u64 = list
        .metadata
        .resource_version
        .as_deref()
        .expect("list rv")
        .parse()
        .expect("n");
    assert!(list_rv >= rv, "list RV is the global RV");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn generate_name_and_already_exists_and_not_found() {
    let c = cluster().await;
    let api: Api<ConfigMap> = Api::default_namespaced(c.client());
    let generated: ConfigMap =
        serde_json::from_value(json!({"metadata": {"generateName": "gen-"}})).expect("cm");
    let made = api
        .create(&PostParams::default(), &generated)
        .await
        .expect("create");
    let name = made.metadata.name.expect("name");
    assert!(name.starts_with("gen-") && name.len() == 9, "{name}");
    assert!(
        name[4..]
            .bytes()
            .all(|b| b"bcdfghjklmnpqrstvwxz2456789".contains(&b))
    );

    api.create(&PostParams::default(), &cm("dup"))
        .await
        .expect("create");
    let err = api_error(
        api.create(&PostParams::default(), &cm("dup"))
            .await
            .expect_err("dup"),
    );
    assert_eq!((err.code, err.reason.as_str()), (409, "AlreadyExists"));
    assert_eq!(err.message, "configmaps \"dup\" already exists");

    let err = api_error(api.get("missing").await.expect_err("missing"));
    assert_eq!((err.code, err.reason.as_str()), (404, "NotFound"));
    assert_eq!(err.message, "configmaps \"missing\" not found");
    assert!(api.get_opt("missing").await.expect("get_opt").is_none());
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn stale_resource_version_conflicts_and_empty_rv_replaces() {
    let c = cluster().await;
    let api: Api<ConfigMap> = Api::default_namespaced(c.client());
    let first = api
        .create(&PostParams::default(), &cm("x"))
        .await
        .expect("create");
    let mut second = first.clone();
    second.data = Some(BTreeMap::from([("k".into(), "2".into())]));
    let updated = api
        .replace("x", &PostParams::default(), &second)
        .await
        .expect("replace");
    assert_ne!(
        updated.metadata.resource_version,
        first.metadata.resource_version
    );

    let mut stale = first.clone();
    stale.data = Some(BTreeMap::from([("k".into(), "3".into())]));
    let err = api_error(
        api.replace("x", &PostParams::default(), &stale)
            .await
            .expect_err("stale"),
    );
    assert_eq!((err.code, err.reason.as_str()), (409, "Conflict"));
    assert!(
        err.message.contains("the object has been modified"),
        "{}",
        err.message
    );

    let patch = json!({"metadata": {"resourceVersion": first.metadata.resource_version}, "data": {"k": "4"}});
    let err = api_error(
        api.patch("x", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect_err("stale patch"),
    );
    assert_eq!(err.code, 409);

    stale.metadata.resource_version = None;
    let forced = api
        .replace("x", &PostParams::default(), &stale)
        .await
        .expect("unconditional");
    assert_eq!(forced.data.expect("data")["k"], "3");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn noop_update_keeps_resource_version() {
    let c = cluster().await;
    let api: Api<ConfigMap> = Api::default_namespaced(c.client());
    let created = api
        .create(&PostParams::default(), &cm("same"))
        .await
        .expect("create");
    let again = api
        .replace("same", &PostParams::default(), &created)
        .await
        .expect("replace");
    assert_eq!(
        again.metadata.resource_version,
        created.metadata.resource_version
    );
    let patched = api
        .patch(
            "same",
            &PatchParams::default(),
            &Patch::Merge(&json!({"data": {"k": "v"}})),
        )
        .await
        .expect("patch");
    assert_eq!(
        patched.metadata.resource_version,
        created.metadata.resource_version
    );
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn invalid_names_are_422_with_causes() {
    let c = cluster().await;
    let api: Api<ConfigMap> = Api::default_namespaced(c.client());
    let err = api_error(
        api.create(&PostParams::default(), &cm("Bad_Name"))
            .await
            .expect_err("invalid"),
    );
    assert_eq!((err.code, err.reason.as_str()), (422, "Invalid"));
    assert!(
        err.message.starts_with("ConfigMap \"Bad_Name\" is invalid: metadata.name: Invalid value: \"Bad_Name\": a lowercase RFC 1123 subdomain"),
        "{}",
        err.message
    );
    let svcs: Api<Service> = Api::default_namespaced(c.client());
    let svc: Service = serde_json::from_value(
        json!({"metadata": {"name": "9svc"}, "spec": {"ports": [{"port": 80}]}}),
    )
    .expect("svc");
    let err = api_error(
        svcs.create(&PostParams::default(), &svc)
            .await
            .expect_err("dns-1035"),
    );
    assert_eq!(err.code, 422);
    assert!(err.message.contains("DNS-1035"), "{}", err.message);
    let pods: Api<Pod> = Api::default_namespaced(c.client());
    let pod: Pod =
        serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": {"containers": []}}))
            .expect("pod");
    let err = api_error(
        pods.create(&PostParams::default(), &pod)
            .await
            .expect_err("no containers"),
    );
    assert_eq!(err.code, 422);
    assert!(
        err.message.contains("spec.containers: Required value"),
        "{}",
        err.message
    );
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn status_split_and_generation_rules() {
    let c = cluster().await;
    let api: Api<Deployment> = Api::default_namespaced(c.client());
    let d: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "d"},
        "spec": {"selector": {"matchLabels": {"app": "d"}},
                 "template": {"metadata": {"labels": {"app": "d"}}, "spec": {"containers": [{"name": "c", "image": "img:1"}]}}},
        "status": {"replicas": 7}
    }))
    .expect("deployment");
    let created = api
        .create(&PostParams::default(), &d)
        .await
        .expect("create");
    assert!(
        created.status.as_ref().is_none_or(|s| s.replicas.is_none()),
        "create ignores status"
    );
    assert_eq!(
        created.spec.as_ref().and_then(|s| s.replicas),
        Some(1),
        "defaulted replicas"
    );
    let template = created
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .expect("template spec");
    assert_eq!(template.restart_policy.as_deref(), Some("Always"));
    assert!(
        template.tolerations.is_none() && template.enable_service_links.is_none(),
        "pod-only defaults stay off templates"
    );

    // Main resource ignores status; labels do not bump generation.
    let p = json!({"metadata": {"labels": {"x": "y"}}, "status": {"replicas": 3}});
    let after = api
        .patch("d", &PatchParams::default(), &Patch::Merge(&p))
        .await
        .expect("patch");
    assert_eq!(after.metadata.generation, Some(1));
    assert!(after.status.as_ref().is_none_or(|s| s.replicas.is_none()));

    // The status subresource ignores spec and labels and keeps generation.
    let p = json!({"metadata": {"labels": {"x": "z"}}, "spec": {"replicas": 9}, "status": {"replicas": 3}});
    let st = api
        .patch_status("d", &PatchParams::default(), &Patch::Merge(&p))
        .await
        .expect("status");
    assert_eq!(st.status.as_ref().and_then(|s| s.replicas), Some(3));
    assert_eq!(st.spec.as_ref().and_then(|s| s.replicas), Some(1));
    assert_eq!(
        st.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("x"))
            .map(String::as_str),
        Some("y")
    );
    assert_eq!(st.metadata.generation, Some(1));

    // A spec change bumps generation and keeps status.
    let p = json!({"spec": {"replicas": 2}});
    let spec = api
        .patch("d", &PatchParams::default(), &Patch::Merge(&p))
        .await
        .expect("spec");
    assert_eq!(spec.metadata.generation, Some(2));
    assert_eq!(spec.status.as_ref().and_then(|s| s.replicas), Some(3));
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn finalizers_mark_then_delete_when_the_last_goes() {
    let c = cluster().await;
    let api: Api<ConfigMap> = Api::default_namespaced(c.client());
    let mut obj = cm("fin");
    obj.metadata.finalizers = Some(vec!["example.com/a".into()]);
    api.create(&PostParams::default(), &obj)
        .await
        .expect("create");
    let marked = api
        .delete("fin", &DeleteParams::default())
        .await
        .expect("delete");
    let marked = marked.left().expect("object still there, not a Status");
    assert!(marked.metadata.deletion_timestamp.is_some());
    assert_eq!(marked.metadata.deletion_grace_period_seconds, Some(0));

    let add = json!({"metadata": {"finalizers": ["example.com/a", "example.com/b"]}});
    let err = api_error(
        api.patch("fin", &PatchParams::default(), &Patch::Merge(&add))
            .await
            .expect_err("no adds"),
    );
    assert_eq!(err.code, 422);
    assert!(
        err.message
            .contains("no new finalizers can be added if the object is being deleted"),
        "{}",
        err.message
    );

    // An empty list is dropped like Go's omitempty, and removing the last finalizer deletes.
    let clear = json!({"metadata": {"finalizers": []}});
    api.patch("fin", &PatchParams::default(), &Patch::Merge(&clear))
        .await
        .expect("clear");
    assert!(
        api.get_opt("fin").await.expect("get").is_none(),
        "deleted once finalizers are gone"
    );

    let mut empty = cm("empty-fin");
    empty.metadata.finalizers = Some(vec![]);
    let made = api
        .create(&PostParams::default(), &empty)
        .await
        .expect("create");
    assert!(
        made.metadata.finalizers.is_none(),
        "empty finalizers dropped"
    );
    let gone = api
        .delete("empty-fin", &DeleteParams::default())
        .await
        .expect("delete");
    assert!(gone.is_right(), "immediate deletion answers a Status");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn namespaces_must_exist_and_terminating_ones_refuse_content() {
    let c = cluster().await;
    let client = c.client();
    let missing: Api<ConfigMap> = Api::namespaced(client.clone(), "nope");
    let err = api_error(
        missing
            .create(&PostParams::default(), &cm("a"))
            .await
            .expect_err("missing ns"),
    );
    assert_eq!(
        (err.code, err.message.as_str()),
        (404, "namespaces \"nope\" not found")
    );

    let nss: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace =
        serde_json::from_value(json!({"metadata": {"name": "doomed"}})).expect("ns");
    let made = nss
        .create(&PostParams::default(), &ns)
        .await
        .expect("create ns");
    assert_eq!(
        made.metadata.labels.as_ref().expect("labels")["kubernetes.io/metadata.name"],
        "doomed"
    );
    assert_eq!(
        made.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Active")
    );
    assert_eq!(
        made.spec.as_ref().and_then(|s| s.finalizers.clone()),
        Some(vec!["kubernetes".to_owned()])
    );

    let err = api_error(
        nss.delete("default", &DeleteParams::default())
            .await
            .expect_err("immortal"),
    );
    assert_eq!(
        (err.code, err.message.as_str()),
        (
            403,
            "namespaces \"default\" is forbidden: this namespace may not be deleted"
        )
    );
    let inside: Api<ConfigMap> = Api::namespaced(client.clone(), "doomed");
    inside
        .create(&PostParams::default(), &cm("before"))
        .await
        .expect("create inside");
    let deleting = nss
        .delete("doomed", &DeleteParams::default())
        .await
        .expect("delete ns")
        .left()
        .expect("kept");
    assert_eq!(
        deleting.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Terminating")
    );
    assert!(deleting.metadata.deletion_timestamp.is_some());
    let err = api_error(
        inside
            .create(&PostParams::default(), &cm("after"))
            .await
            .expect_err("terminating"),
    );
    assert_eq!(err.code, 403);
    assert_eq!(
        err.message,
        "configmaps \"after\" is forbidden: unable to create new content in namespace doomed because it is being terminated"
    );
    // The namespace controller's last step: clear spec.finalizers through /finalize.
    let mut fin = deleting.clone();
    fin.spec = Some(Default::default());
    let body = serde_json::to_vec(&fin).expect("json");
    let req = http::Request::put("/api/v1/namespaces/doomed/finalize")
        .header("content-type", "application/json")
        .body(body)
        .expect("request");
    let _: Namespace = client.request(req).await.expect("finalize");
    assert!(
        nss.get_opt("doomed").await.expect("get").is_none(),
        "finalized namespace is gone"
    );
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn dry_run_persists_nothing() {
    let c = cluster().await;
    let api: Api<ConfigMap> = Api::default_namespaced(c.client());
    let pp = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let would = api.create(&pp, &cm("dry")).await.expect("dry create");
    assert_eq!(would.metadata.name.as_deref(), Some("dry"));
    assert!(api.get_opt("dry").await.expect("get").is_none());
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn graceful_pod_deletion_waits_for_the_kubelet() {
    let c = cluster().await;
    let pods: Api<Pod> = Api::default_namespaced(c.client());
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "bound"},
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "busybox:1"}]}
    }))
    .expect("pod");
    let made = pods
        .create(&PostParams::default(), &pod)
        .await
        .expect("create");
    assert_eq!(
        made.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Pending")
    );
    assert_eq!(
        made.spec.as_ref().and_then(|s| s.restart_policy.as_deref()),
        Some("Always")
    );
    let marked = pods
        .delete("bound", &DeleteParams::default())
        .await
        .expect("delete")
        .left()
        .expect("kept");
    assert_eq!(marked.metadata.deletion_grace_period_seconds, Some(30));
    assert!(
        pods.get_opt("bound").await.expect("get").is_some(),
        "stays until the kubelet confirms"
    );
    let wrong_uid = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(kube::api::Preconditions {
            uid: Some("nope".into()),
            resource_version: None,
        }),
        ..Default::default()
    };
    let err = api_error(
        pods.delete("bound", &wrong_uid)
            .await
            .expect_err("precondition"),
    );
    assert_eq!(err.code, 409);
    let confirm = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(kube::api::Preconditions {
            uid: made.metadata.uid.clone(),
            resource_version: None,
        }),
        ..Default::default()
    };
    pods.delete("bound", &confirm).await.expect("final delete");
    assert!(pods.get_opt("bound").await.expect("get").is_none());

    let unbound: Pod = serde_json::from_value(json!({
        "metadata": {"name": "free"}, "spec": {"containers": [{"name": "c", "image": "busybox:1"}]}
    }))
    .expect("pod");
    pods.create(&PostParams::default(), &unbound)
        .await
        .expect("create");
    pods.delete("free", &DeleteParams::default())
        .await
        .expect("delete");
    assert!(
        pods.get_opt("free").await.expect("get").is_none(),
        "unbound pods go at once"
    );
    c.shutdown().await;
}
