//! The four patch types end to end through the real kube-rs client: merge, JSON (with the
//! finalizer quirk kube-runtime relies on), strategic (with merge keys) and server-side apply
//! (with ownership, conflicts and force), plus kube-runtime's `finalizer()` flow.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::Status;
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{Event, finalizer};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use simkube::Cluster;

mod support;

async fn cluster() -> Cluster {
    Cluster::builder()
        .name("patch")
        .start()
        .await
        .expect("cluster starts")
}

fn api_error(err: kube::Error) -> Status {
    match err {
        kube::Error::Api(status) => *status,
        other => panic!("expected an API error, got {other:?}"),
    }
}

fn json_patch(v: Value) -> Patch<()> {
    Patch::Json(serde_json::from_value(v).expect("valid JSON patch"))
}

async fn create_cm(api: &Api<ConfigMap>, body: Value) -> ConfigMap {
    let cm: ConfigMap = serde_json::from_value(body).expect("configmap");
    api.create(&PostParams::default(), &cm)
        .await
        .expect("create")
}

/// Creates CRD `<plural>.example.com` (namespaced, version v1, `schema` as its
/// openAPIV3Schema, a status subresource if `status`) and the API of its objects.
async fn example_crd(
    client: &Client,
    kind: &str,
    plural: &str,
    schema: Value,
    status: bool,
) -> Api<DynamicObject> {
    let mut version = json!({"name": "v1", "served": true, "storage": true,
                             "schema": {"openAPIV3Schema": schema}});
    if status {
        version["subresources"] = json!({"status": {}});
    }
    let ar = support::crd::install(
        client,
        json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": format!("{plural}.example.com")},
            "spec": {
                "group": "example.com",
                "names": {"plural": plural, "singular": kind.to_lowercase(), "kind": kind,
                          "listKind": format!("{kind}List")},
                "scope": "Namespaced",
                "versions": [version]
            }
        }),
    )
    .await;
    Api::default_namespaced_with(client.clone(), &ar)
}

/// Server-side applies `cfg` to `name` as `manager`, retrying while the new kind is not
/// served yet (a CRD takes a moment to be).
async fn apply_once_served(
    api: &Api<DynamicObject>,
    name: &str,
    manager: &str,
    cfg: &Value,
) -> DynamicObject {
    for _ in 0..100 {
        match api
            .patch(name, &PatchParams::apply(manager), &Patch::Apply(cfg))
            .await
        {
            Ok(obj) => return obj,
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    panic!("the kind of {name} is not served");
}

#[tokio::test(flavor = "multi_thread")]
async fn merge_patch_adds_and_removes_members() {
    let c = cluster().await;
    let api: Api<ConfigMap> = Api::default_namespaced(c.client());
    create_cm(
        &api,
        json!({"metadata": {"name": "m", "labels": {"a": "1", "b": "2"}}, "data": {"k": "v"}}),
    )
    .await;
    let patched = api
        .patch(
            "m",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"labels": {"a": null, "c": "3"}}, "data": {"k2": "v2"}}),
            ),
        )
        .await
        .expect("merge patch");
    let labels = patched.labels();
    assert_eq!(labels.get("a"), None);
    assert_eq!(labels.get("b").map(String::as_str), Some("2"));
    assert_eq!(labels.get("c").map(String::as_str), Some("3"));
    let data = patched.data.expect("data");
    assert_eq!((data["k"].as_str(), data["k2"].as_str()), ("v", "v2"));
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn json_patch_failed_test_is_invalid_and_changes_nothing() {
    let c = cluster().await;
    let api: Api<ConfigMap> = Api::default_namespaced(c.client());
    let created = create_cm(
        &api,
        json!({"metadata": {"name": "j", "labels": {"a": "1"}}, "data": {"k": "v"}}),
    )
    .await;
    let err = api_error(
        api.patch(
            "j",
            &PatchParams::default(),
            &json_patch(json!([
                {"op": "add", "path": "/data/new", "value": "x"},
                {"op": "test", "path": "/data/k", "value": "other"}
            ])),
        )
        .await
        .expect_err("failed test"),
    );
    assert_eq!((err.code, err.reason.as_str()), (422, "Invalid"));
    let after = api.get("j").await.expect("get");
    assert_eq!(after.data, created.data);
    assert_eq!(
        after.metadata.resource_version,
        created.metadata.resource_version
    );

    let ok = api
        .patch(
            "j",
            &PatchParams::default(),
            &json_patch(json!([
                {"op": "test", "path": "/metadata/finalizers", "value": null},
                {"op": "add", "path": "/metadata/labels/example.com~1x", "value": "escaped"},
                {"op": "move", "from": "/data/k", "path": "/data/moved"}
            ])),
        )
        .await
        .expect("json patch");
    assert_eq!(
        ok.labels().get("example.com/x").map(String::as_str),
        Some("escaped")
    );
    let data = ok.data.expect("data");
    assert_eq!(data.get("moved").map(String::as_str), Some("v"));
    assert!(!data.contains_key("k"));
    c.shutdown().await;
}

fn deployment(containers: Value) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": containers}}
        }
    })
}

fn container_images(d: &Deployment) -> Vec<(String, Option<String>)> {
    d.spec
        .as_ref()
        .expect("spec")
        .template
        .spec
        .as_ref()
        .expect("pod spec")
        .containers
        .iter()
        .map(|c| (c.name.clone(), c.image.clone()))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn strategic_patch_merges_containers_by_name() {
    let c = cluster().await;
    let api: Api<Deployment> = Api::default_namespaced(c.client());
    let d: Deployment = serde_json::from_value(deployment(json!([
        {"name": "app", "image": "app:1", "env": [{"name": "A", "value": "1"}]},
        {"name": "proxy", "image": "proxy:1"}
    ])))
    .expect("deployment");
    api.create(&PostParams::default(), &d)
        .await
        .expect("create");
    let patched = api
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"template": {"spec": {"containers": [
                {"name": "app", "image": "app:2", "env": [{"name": "B", "value": "2"}]}
            ]}}}})),
        )
        .await
        .expect("strategic patch");
    assert_eq!(
        container_images(&patched),
        [
            ("app".to_owned(), Some("app:2".to_owned())),
            ("proxy".to_owned(), Some("proxy:1".to_owned()))
        ]
    );
    let env: Vec<String> = patched.spec.unwrap().template.spec.unwrap().containers[0]
        .env
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|e| e.name)
        .collect();
    // upstream places patch elements the live list lacks before the live-only ones
    assert_eq!(env, ["B", "A"]);

    let deleted = api
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"template": {"spec": {
                "$setElementOrder/containers": [{"name": "app"}],
                "containers": [{"name": "proxy", "$patch": "delete"}]
            }}}})),
        )
        .await
        .expect("delete directive");
    assert_eq!(
        container_images(&deleted),
        [("app".to_owned(), Some("app:2".to_owned()))]
    );
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn server_side_apply_creates_conflicts_and_forces() {
    let c = cluster().await;
    let api: Api<ConfigMap> = Api::default_namespaced(c.client());
    let cfg = |data: Value| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa"}, "data": data});

    let created = api
        .patch(
            "ssa",
            &PatchParams::apply("alpha"),
            &Patch::Apply(cfg(json!({"a": "1", "shared": "x"}))),
        )
        .await
        .expect("apply creates");
    let mf = created
        .metadata
        .managed_fields
        .clone()
        .expect("managedFields");
    assert_eq!(mf.len(), 1);
    assert_eq!(mf[0].manager.as_deref(), Some("alpha"));
    assert_eq!(mf[0].operation.as_deref(), Some("Apply"));
    assert_eq!(
        mf[0].fields_v1.as_ref().expect("fieldsV1").0,
        json!({"f:data": {"f:a": {}, "f:shared": {}}})
    );

    let err = api_error(
        api.patch(
            "ssa",
            &PatchParams::apply("beta"),
            &Patch::Apply(cfg(json!({"shared": "y"}))),
        )
        .await
        .expect_err("conflict"),
    );
    assert_eq!((err.code, err.reason.as_str()), (409, "Conflict"));
    assert_eq!(
        err.message,
        "Apply failed with 1 conflict: conflict with \"alpha\": .data.shared"
    );
    let causes = err.details.expect("details").causes;
    assert_eq!(causes.len(), 1);
    assert_eq!(causes[0].reason, "FieldManagerConflict");
    assert_eq!(causes[0].field, ".data.shared");

    let forced = api
        .patch(
            "ssa",
            &PatchParams::apply("beta").force(),
            &Patch::Apply(cfg(json!({"shared": "y"}))),
        )
        .await
        .expect("forced apply");
    assert_eq!(forced.data.as_ref().expect("data")["shared"], "y");

    // alpha no longer owns `shared`, so dropping `a` from its config removes only `a`
    let bare = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa"}});
    let pruned = api
        .patch("ssa", &PatchParams::apply("alpha"), &Patch::Apply(bare))
        .await
        .expect("re-apply");
    let data = pruned.data.expect("data");
    assert!(!data.contains_key("a"));
    assert_eq!(data["shared"], "y");
    let managers: Vec<String> = pruned
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter_map(|e| e.manager)
        .collect();
    assert_eq!(managers, ["beta"]);
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn apply_conflicts_with_an_update_manager() {
    let c = cluster().await;
    let api: Api<Deployment> = Api::default_namespaced(c.client());
    let d: Deployment =
        serde_json::from_value(deployment(json!([{"name": "app", "image": "app:1"}]))).expect("d");
    api.create(
        &PostParams {
            field_manager: Some("creator".into()),
            ..PostParams::default()
        },
        &d,
    )
    .await
    .expect("create");
    let mut cfg = deployment(json!([{"name": "app", "image": "app:1"}]));
    cfg["spec"]["replicas"] = json!(3);
    let err = api_error(
        api.patch(
            "web",
            &PatchParams::apply("ctrl"),
            &Patch::Apply(cfg.clone()),
        )
        .await
        .expect_err("conflict with the creator"),
    );
    assert_eq!(err.code, 409);
    assert_eq!(
        err.message,
        "Apply failed with 1 conflict: conflict with \"creator\" using apps/v1: .spec.replicas"
    );
    let applied = api
        .patch(
            "web",
            &PatchParams::apply("ctrl").force(),
            &Patch::Apply(cfg),
        )
        .await
        .expect("forced");
    assert_eq!(applied.spec.expect("spec").replicas, Some(3));
    c.shutdown().await;
}

#[derive(Debug, thiserror::Error)]
#[error("never")]
struct Never;

#[tokio::test(flavor = "multi_thread")]
async fn kube_runtime_finalizer_flow_runs_end_to_end() {
    let c = cluster().await;
    let client: Client = c.client();
    let api: Api<ConfigMap> = Api::default_namespaced(client);
    create_cm(&api, json!({"metadata": {"name": "fin"}})).await;
    let cleanups = Arc::new(AtomicUsize::new(0));
    let run = |obj: ConfigMap| {
        let api = api.clone();
        let cleanups = cleanups.clone();
        async move {
            finalizer(&api, "tether.dev/test", Arc::new(obj), |event| async move {
                if let Event::Cleanup(_) = event {
                    cleanups.fetch_add(1, Ordering::SeqCst);
                }
                Ok::<_, Never>(Action::await_change())
            })
            .await
            .expect("finalizer step")
        }
    };
    // 1. no finalizers yet: `test /metadata/finalizers == null` passes on the missing field
    run(api.get("fin").await.expect("get")).await;
    let with = api.get("fin").await.expect("get");
    assert_eq!(with.finalizers(), ["tether.dev/test"]);
    // 2. another controller's finalizer joins through the `test`-guarded append
    let other = api
        .patch(
            "fin",
            &PatchParams::default(),
            &json_patch(json!([
                {"op": "test", "path": "/metadata/finalizers", "value": ["tether.dev/test"]},
                {"op": "add", "path": "/metadata/finalizers/-", "value": "other/keep"}
            ])),
        )
        .await
        .expect("second finalizer");
    assert_eq!(other.finalizers(), ["tether.dev/test", "other/keep"]);
    // 3. apply event runs with the finalizer present
    run(other).await;
    assert_eq!(cleanups.load(Ordering::SeqCst), 0);
    // 4. delete: the object stays, marked
    api.delete("fin", &DeleteParams::default())
        .await
        .expect("delete");
    let deleting = api.get("fin").await.expect("still there");
    assert!(deleting.metadata.deletion_timestamp.is_some());
    // 5. cleanup runs and the finalizer is removed by index behind a `test`
    run(deleting).await;
    assert_eq!(cleanups.load(Ordering::SeqCst), 1);
    let left = api.get("fin").await.expect("other finalizer holds it");
    assert_eq!(left.finalizers(), ["other/keep"]);
    // 6. the last finalizer going away deletes the object; an emptied list is not stored
    api.patch(
        "fin",
        &PatchParams::default(),
        &json_patch(json!([
            {"op": "test", "path": "/metadata/finalizers/0", "value": "other/keep"},
            {"op": "remove", "path": "/metadata/finalizers/0"}
        ])),
    )
    .await
    .expect("release");
    let mut gone = false;
    for _ in 0..100 {
        if api.get_opt("fin").await.expect("get_opt").is_none() {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(gone, "object deleted once its finalizers are gone");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn strategic_patch_on_a_custom_resource_is_unsupported_media_type() {
    let c = cluster().await;
    let client = c.client();
    let schema = json!({"type": "object", "properties": {
        "spec": {"type": "object", "properties": {
            "ports": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
                      "items": {"type": "object", "required": ["name"], "properties": {
                          "name": {"type": "string"}, "port": {"type": "integer"}}}}
        }}
    }});
    let api = example_crd(&client, "Gadget", "gadgets", schema, false).await;
    let cfg = |ports: Value| json!({"apiVersion": "example.com/v1", "kind": "Gadget", "metadata": {"name": "g"}, "spec": {"ports": ports}});
    apply_once_served(&api, "g", "one", &cfg(json!([{"name": "a", "port": 1}]))).await;
    // list-map keys from the CRD schema: a second manager's item merges in
    let two = api
        .patch(
            "g",
            &PatchParams::apply("two"),
            &Patch::Apply(cfg(json!([{"name": "b", "port": 2}]))),
        )
        .await
        .expect("second applier");
    assert_eq!(
        two.data["spec"]["ports"],
        json!([{"name": "a", "port": 1}, {"name": "b", "port": 2}])
    );

    let err = api_error(
        api.patch(
            "g",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {}})),
        )
        .await
        .expect_err("415"),
    );
    assert_eq!(
        (err.code, err.reason.as_str()),
        (415, "UnsupportedMediaType")
    );
    assert!(
        err.message
            .starts_with("the body of the request was in an unknown format"),
        "{}",
        err.message
    );
    c.shutdown().await;
}

/// The controller pattern: spec applied by one manager, status applied through `/status` by
/// the controller, neither clobbering the other.
#[tokio::test(flavor = "multi_thread")]
async fn status_apply_through_the_subresource_keeps_spec_and_records_the_subresource() {
    let c = cluster().await;
    let client = c.client();
    let schema = json!({"type": "object", "properties": {
        "spec": {"type": "object", "properties": {"endpoint": {"type": "string"}}},
        "status": {"type": "object", "properties": {
            "phase": {"type": "string"},
            "conditions": {"type": "array", "x-kubernetes-list-type": "map",
                           "x-kubernetes-list-map-keys": ["type"],
                           // kube-apiserver requires map-list keys to be
                           // required or defaulted in structural schemas.
                           "items": {"type": "object", "required": ["type"],
                                     "properties": {
                               "type": {"type": "string"}, "status": {"type": "string"}}}}
        }}
    }});
    let api = example_crd(&client, "Peer", "peers", schema, true).await;
    let spec_cfg = json!({"apiVersion": "example.com/v1", "kind": "Peer", "metadata": {"name": "p"},
                          "spec": {"endpoint": "198.18.0.1:51820"}});
    apply_once_served(&api, "p", "cli", &spec_cfg).await;

    let status_cfg = |phase: &str, ready: &str| {
        json!({"apiVersion": "example.com/v1", "kind": "Peer", "metadata": {"name": "p"},
               "status": {"phase": phase, "conditions": [{"type": "Ready", "status": ready}]}})
    };
    let st = api
        .patch_status(
            "p",
            &PatchParams::apply("controller").force(),
            &Patch::Apply(status_cfg("Connected", "True")),
        )
        .await
        .expect("status apply");
    assert_eq!(st.data["spec"]["endpoint"], "198.18.0.1:51820");
    assert_eq!(st.data["status"]["phase"], "Connected");
    let entries = st.metadata.managed_fields.clone().expect("managedFields");
    let ctrl = entries
        .iter()
        .find(|e| e.manager.as_deref() == Some("controller"))
        .expect("controller entry");
    assert_eq!(ctrl.subresource.as_deref(), Some("status"));
    assert_eq!(
        ctrl.fields_v1.as_ref().expect("fieldsV1").0,
        json!({"f:status": {
            "f:conditions": {"k:{\"type\":\"Ready\"}": {".": {}, "f:status": {}, "f:type": {}}},
            "f:phase": {}
        }})
    );

    // re-applying the spec does not touch the status, and vice versa
    let again = api
        .patch("p", &PatchParams::apply("cli"), &Patch::Apply(spec_cfg))
        .await
        .expect("spec re-apply");
    assert_eq!(again.data["status"]["phase"], "Connected");
    let st2 = api
        .patch_status(
            "p",
            &PatchParams::apply("controller").force(),
            &Patch::Apply(status_cfg("Degraded", "False")),
        )
        .await
        .expect("second status apply");
    assert_eq!(
        st2.data["status"]["conditions"],
        json!([{"type": "Ready", "status": "False"}])
    );
    assert_eq!(st2.data["spec"]["endpoint"], "198.18.0.1:51820");
    c.shutdown().await;
}

/// `x-kubernetes-map-type: atomic` on an object of a CRD's schema: server-side apply owns it
/// whole (managed fields name it without its members), a second manager conflicts on it as a
/// unit, and a forced apply replaces it whole.
#[tokio::test(flavor = "multi_thread")]
async fn an_atomic_object_of_a_crd_is_owned_and_replaced_whole_by_apply() {
    let c = cluster().await;
    let client = c.client();
    let schema = json!({"type": "object", "properties": {
        "spec": {"type": "object", "properties": {
            "owner": {"type": "string"},
            "pod": {"type": "object", "x-kubernetes-map-type": "atomic", "properties": {
                "image": {"type": "string"}, "restartPolicy": {"type": "string"}}}
        }}
    }});
    let api = example_crd(&client, "Shadow", "shadows", schema, false).await;
    let cfg = |spec: Value| {
        json!({"apiVersion": "example.com/v1", "kind": "Shadow", "metadata": {"name": "s"},
               "spec": spec})
    };
    let first = cfg(json!({"owner": "a", "pod": {"image": "nginx", "restartPolicy": "Always"}}));
    let applied = apply_once_served(&api, "s", "consumer", &first).await;
    let entries = applied
        .metadata
        .managed_fields
        .clone()
        .expect("managedFields");
    assert_eq!(entries.len(), 1);
    assert_eq!(
        entries[0].fields_v1.as_ref().expect("fieldsV1").0,
        json!({"f:spec": {"f:owner": {}, "f:pod": {}}})
    );

    // Another manager setting one member of the atomic object conflicts on the whole object.
    let other = cfg(json!({"pod": {"image": "busybox"}}));
    let conflict = api_error(
        api.patch(
            "s",
            &PatchParams::apply("intruder"),
            &Patch::Apply(other.clone()),
        )
        .await
        .expect_err("a conflict"),
    );
    assert_eq!(conflict.code, 409);
    assert!(
        conflict.message.contains(".spec.pod"),
        "the conflict names the atomic object: {}",
        conflict.message
    );
    // Forced, it takes the object whole: the member it did not give is gone.
    let forced = api
        .patch(
            "s",
            &PatchParams::apply("intruder").force(),
            &Patch::Apply(other),
        )
        .await
        .expect("forced apply");
    assert_eq!(forced.data["spec"]["pod"], json!({"image": "busybox"}));
    assert_eq!(forced.data["spec"]["owner"], "a");
    let consumer = forced
        .metadata
        .managed_fields
        .as_ref()
        .expect("managedFields")
        .iter()
        .find(|e| e.manager.as_deref() == Some("consumer"))
        .expect("the first manager keeps what it still owns");
    assert_eq!(
        consumer.fields_v1.as_ref().expect("fieldsV1").0,
        json!({"f:spec": {"f:owner": {}}})
    );
}

/// A write of the status subresource (an Update) records an atomic object of the CRD's
/// status under its writer as one field, as it does for apply: upstream's field sets follow
/// the schema whatever the operation.
#[tokio::test]
async fn a_status_update_owns_an_atomic_object_of_a_crd_whole() {
    let c = cluster().await;
    let client = c.client();
    let schema = json!({"type": "object", "properties": {
        "spec": {"type": "object", "properties": {"owner": {"type": "string"}}},
        "status": {"type": "object", "properties": {
            "phase": {"type": "string"},
            "pod": {"type": "object", "x-kubernetes-map-type": "atomic", "properties": {
                "phase": {"type": "string"},
                "conditions": {"type": "array", "items": {"type": "object", "properties": {
                    "type": {"type": "string"}, "status": {"type": "string"}}}}}}
        }}
    }});
    let api = example_crd(&client, "Mirror", "mirrors", schema, true).await;
    let created = api
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"apiVersion": "example.com/v1", "kind": "Mirror",
                "metadata": {"name": "m"}, "spec": {"owner": "a"}}))
            .expect("object"),
        )
        .await
        .expect("create");
    let mut next = created.clone();
    next.data["status"] = json!({"phase": "Running", "pod": {"phase": "Running",
        "conditions": [{"type": "Ready", "status": "True"}]}});
    let written = api
        .replace_status(
            "m",
            &PostParams {
                field_manager: Some("reporter".into()),
                ..PostParams::default()
            },
            &next,
        )
        .await
        .expect("status write");
    let reporter = written
        .metadata
        .managed_fields
        .as_ref()
        .expect("managedFields")
        .iter()
        .find(|e| e.manager.as_deref() == Some("reporter"))
        .expect("the status writer has an entry");
    assert_eq!(reporter.operation.as_deref(), Some("Update"));
    assert_eq!(reporter.subresource.as_deref(), Some("status"));
    assert_eq!(
        reporter.fields_v1.as_ref().expect("fieldsV1").0,
        json!({"f:status": {".": {}, "f:phase": {}, "f:pod": {}}})
    );
}

#[tokio::test]
async fn cleared_managed_fields_stay_cleared_through_updates_until_an_apply() {
    let c = cluster().await;
    let client = c.client();
    let schema = json!({"type": "object", "properties": {
        "spec": {"type": "object", "properties": {"owner": {"type": "string"}}},
        "status": {"type": "object", "properties": {"phase": {"type": "string"}}}
    }});
    let api = example_crd(&client, "Report", "reports", schema, true).await;
    let config = |labels: Value| {
        json!({"apiVersion": "example.com/v1", "kind": "Report",
               "metadata": {"name": "r", "labels": labels}, "spec": {"owner": "a"}})
    };
    let by = |manager: &str| PatchParams::apply(manager).force();
    api.patch(
        "r",
        &by("consumer"),
        &Patch::Apply(config(json!({"a": "1", "b": "1"}))),
    )
    .await
    .expect("first apply");
    // A merge patch that adds a label and clears the managed fields: neither it nor the
    // status write after it is recorded.
    let marked = api
        .patch(
            "r",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"mark": "true"}, "managedFields": [{}]}})),
        )
        .await
        .expect("mark");
    assert_eq!(
        marked.labels().get("mark").map(String::as_str),
        Some("true")
    );
    assert_eq!(marked.metadata.managed_fields, None);
    let mut next = marked.clone();
    next.data["status"] = json!({"phase": "Running"});
    let reported = api
        .replace_status("r", &PostParams::default(), &next)
        .await
        .expect("status write");
    assert_eq!(reported.data["status"]["phase"], "Running");
    assert_eq!(reported.metadata.managed_fields, None);
    // The next apply gives the fields there to `before-first-apply`: a label the applier
    // stops sending is no longer its to remove, so it stays until removed by a patch.
    let applied = api
        .patch(
            "r",
            &by("consumer"),
            &Patch::Apply(config(json!({"a": "1"}))),
        )
        .await
        .expect("second apply");
    let managers: Vec<_> = applied
        .managed_fields()
        .iter()
        .filter_map(|e| e.manager.clone())
        .collect();
    assert_eq!(managers, ["consumer", "before-first-apply"]);
    assert_eq!(applied.labels().get("b").map(String::as_str), Some("1"));
    let removed = api
        .patch(
            "r",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"b": null}}})),
        )
        .await
        .expect("removal");
    assert_eq!(
        removed.labels().keys().cloned().collect::<Vec<_>>(),
        ["a", "mark"]
    );
}

#[tokio::test]
async fn a_write_from_a_client_that_names_no_manager_is_recorded_without_one() {
    let c = cluster().await;
    let api: Api<ConfigMap> = Api::default_namespaced(c.client());
    let created = create_cm(
        &api,
        json!({"metadata": {"name": "anonymous"}, "data": {"a": "1"}}),
    )
    .await;
    let entry = created
        .managed_fields()
        .first()
        .cloned()
        .expect("managedFields");
    assert_eq!(
        (entry.manager, entry.operation.as_deref()),
        (None, Some("Update"))
    );
    assert_eq!(
        entry.fields_v1.expect("fieldsV1").0,
        json!({"f:data": {".": {}, "f:a": {}}})
    );
}
