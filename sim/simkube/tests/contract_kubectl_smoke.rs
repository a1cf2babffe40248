//! The everyday kubectl commands against simkube, run as the real binary with a kubeconfig file
//! and a fresh discovery cache per test: `get` in its output forms, `create -f`, `apply`
//! (client- and server-side), the three patch types, `label`/`annotate`, `replace`, `delete`
//! with and without finalizers, `describe` with events, `get -w` and a CRD's whole lifecycle
//! (imperative `create` has its own file, `contract_kubectl_create`). Skipped with a message
//! when kubectl is absent, unless `CI` is set (then it fails).

mod support;

use support::{Kubectl, kubectl_available};

use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Resource as _;
use kube::api::{Api, DynamicObject, GroupVersionKind};
use kube::discovery::ApiResource;
use kube::runtime::events::{Event as RecordedEvent, EventType, Recorder, Reporter};
use serde_json::Value;
use simkube::Cluster;

/// The words of each non-empty output line, so column spacing does not matter.
fn words(out: &str) -> Vec<Vec<String>> {
    out.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.split_whitespace().map(str::to_owned).collect())
        .collect()
}

async fn cluster(name: &str) -> Cluster {
    Cluster::builder()
        .name(name)
        .start()
        .await
        .expect("cluster starts")
}

/// A ConfigMap manifest. Empty label maps are left out: the server drops them (as kube-apiserver
/// does with `omitempty`), so a manifest carrying one makes every `apply` a patch.
fn configmap(name: &str, namespace: &str, labels: &str, data: &str) -> String {
    let labels = if labels.is_empty() {
        String::new()
    } else {
        format!("  labels: {{{labels}}}\n")
    };
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: {namespace}\n{labels}data: {{{data}}}\n"
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn get_in_table_yaml_json_with_selectors_and_all_namespaces() {
    if !kubectl_available() {
        return;
    }
    let c = cluster("kubectl-get").await;
    let k = Kubectl::new(&c);
    let ns = k.file(
        "ns.yaml",
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: team}\n",
    );
    assert_eq!(
        k.ok(&["create", "-f", &ns]).await.trim(),
        "namespace/team created"
    );
    let web = k.file(
        "web.yaml",
        &configmap("web", "default", "app: web", "a: '1', b: '2'"),
    );
    let db = k.file("db.yaml", &configmap("db", "default", "app: db", "a: '1'"));
    let other = k.file("other.yaml", &configmap("other", "team", "app: web", ""));
    for f in [&web, &db, &other] {
        k.ok(&["create", "-f", f]).await;
    }

    let rows = words(&k.ok(&["get", "configmaps"]).await);
    assert_eq!(rows[0], ["NAME", "DATA", "AGE"]);
    let names: Vec<_> = rows[1..]
        .iter()
        .map(|r| (r[0].as_str(), r[1].as_str()))
        .collect();
    assert_eq!(names, [("db", "1"), ("web", "2")]);

    let rows = words(&k.ok(&["get", "cm", "-l", "app=web"]).await);
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(rows[1][0], "web");
    let rows = words(
        &k.ok(&["get", "cm", "-l", "app in (web,db),app!=db", "-o", "name"])
            .await,
    );
    assert_eq!(rows, [["configmap/web"]]);

    let rows = words(&k.ok(&["get", "cm", "-A", "-l", "app"]).await);
    assert_eq!(rows[0], ["NAMESPACE", "NAME", "DATA", "AGE"]);
    let seen: Vec<_> = rows[1..]
        .iter()
        .map(|r| (r[0].as_str(), r[1].as_str()))
        .collect();
    assert_eq!(
        seen,
        [("default", "db"), ("default", "web"), ("team", "other")]
    );

    let yaml: Value =
        serde_yaml::from_str(&k.ok(&["get", "cm", "web", "-o", "yaml"]).await).expect("yaml");
    assert_eq!(yaml["kind"], "ConfigMap");
    assert_eq!(yaml["data"]["b"], "2");
    assert_eq!(yaml["metadata"]["labels"]["app"], "web");
    assert!(
        yaml["metadata"]["uid"]
            .as_str()
            .is_some_and(|u| u.len() == 36)
    );

    let list: Value = serde_json::from_str(&k.ok(&["get", "cm", "-n", "team", "-o", "json"]).await)
        .expect("json");
    assert_eq!(list["kind"], "List");
    let items = list["items"].as_array().expect("items");
    assert_eq!(items.len(), 1);
    assert_eq!(items[0]["metadata"]["name"], "other");
    assert_eq!(items[0]["metadata"]["namespace"], "team");

    let err = k.fails(&["get", "cm", "nope"]).await;
    assert_eq!(
        err.trim(),
        r#"Error from server (NotFound): configmaps "nope" not found"#
    );
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn create_apply_twice_and_server_side_apply() {
    if !kubectl_available() {
        return;
    }
    let c = cluster("kubectl-apply").await;
    let k = Kubectl::new(&c);
    let api: Api<ConfigMap> = Api::default_namespaced(c.client());

    let created = k.file("c.yaml", &configmap("created", "default", "", "a: '1'"));
    assert_eq!(
        k.ok(&["create", "-f", &created]).await.trim(),
        "configmap/created created"
    );
    let err = k.fails(&["create", "-f", &created]).await;
    assert!(
        err.contains(r#"Error from server (AlreadyExists): error when creating"#)
            && err.contains(r#"configmaps "created" already exists"#),
        "{err}"
    );

    let v1 = k.file("v1.yaml", &configmap("applied", "default", "", "a: '1'"));
    assert_eq!(
        k.ok(&["apply", "-f", &v1]).await.trim(),
        "configmap/applied created"
    );
    let first = api.get("applied").await.expect("get");
    assert_eq!(
        k.ok(&["apply", "-f", &v1]).await.trim(),
        "configmap/applied unchanged"
    );
    let again = api.get("applied").await.expect("get");
    assert_eq!(
        first.metadata.resource_version, again.metadata.resource_version,
        "an unchanged apply writes nothing"
    );
    let v2 = k.file("v2.yaml", &configmap("applied", "default", "", "b: '2'"));
    assert_eq!(
        k.ok(&["apply", "-f", &v2]).await.trim(),
        "configmap/applied configured"
    );
    let data = api.get("applied").await.expect("get").data.expect("data");
    assert_eq!(
        data.into_iter().collect::<Vec<_>>(),
        [("b".to_owned(), "2".to_owned())],
        "the three-way patch removed the key the manifest dropped"
    );

    let ssa = k.file("ssa.yaml", &configmap("ssa", "default", "", "x: '1'"));
    assert_eq!(
        k.ok(&["apply", "--server-side", "-f", &ssa]).await.trim(),
        "configmap/ssa serverside-applied"
    );
    let cm = api.get("ssa").await.expect("get");
    let managers: Vec<_> = cm
        .metadata
        .managed_fields
        .expect("managedFields")
        .into_iter()
        .map(|m| (m.manager.expect("manager"), m.operation.expect("operation")))
        .collect();
    assert_eq!(managers, [("kubectl".to_owned(), "Apply".to_owned())]);
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn patch_label_annotate_and_replace() {
    if !kubectl_available() {
        return;
    }
    let c = cluster("kubectl-patch").await;
    let k = Kubectl::new(&c);
    let api: Api<ConfigMap> = Api::default_namespaced(c.client());
    let cm = k.file("cm.yaml", &configmap("cfg", "default", "", "a: '1'"));
    k.ok(&["create", "-f", &cm]).await;

    let out = k
        .ok(&[
            "patch",
            "cm",
            "cfg",
            "--type",
            "merge",
            "-p",
            r#"{"data":{"b":"2","a":null}}"#,
        ])
        .await;
    assert_eq!(out.trim(), "configmap/cfg patched");
    let out = k
        .ok(&[
            "patch",
            "cm",
            "cfg",
            "--type",
            "json",
            "-p",
            r#"[{"op":"add","path":"/data/c","value":"3"}]"#,
        ])
        .await;
    assert_eq!(out.trim(), "configmap/cfg patched");
    let data = api.get("cfg").await.expect("get").data.expect("data");
    assert_eq!(
        data.into_iter().collect::<Vec<_>>(),
        [
            ("b".to_owned(), "2".to_owned()),
            ("c".to_owned(), "3".to_owned())
        ]
    );
    let err = k
        .fails(&[
            "patch",
            "cm",
            "cfg",
            "--type",
            "json",
            "-p",
            r#"[{"op":"test","path":"/data/b","value":"9"}]"#,
        ])
        .await;
    // kube-apiserver answers a failed `test` with a generic 422, which kubectl prints so.
    assert_eq!(
        err.trim(),
        "The request is invalid: the server rejected our request due to an error in our request"
    );

    // Strategic merge (kubectl's default patch type) merges containers by name.
    let pod = k.file(
        "pod.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n  - {name: a, image: img-a}\n  - {name: b, image: img-b}\n",
    );
    k.ok(&["create", "-f", &pod]).await;
    k.ok(&[
        "patch",
        "pod",
        "p",
        "-p",
        r#"{"spec":{"containers":[{"name":"b","image":"img-b:2"}]}}"#,
    ])
    .await;
    let images = k
        .ok(&[
            "get",
            "pod",
            "p",
            "-o",
            "jsonpath={range .spec.containers[*]}{.name}={.image} {end}",
        ])
        .await;
    assert_eq!(images.trim(), "a=img-a b=img-b:2");

    assert_eq!(
        k.ok(&["label", "cm", "cfg", "tier=web"]).await.trim(),
        "configmap/cfg labeled"
    );
    let err = k.fails(&["label", "cm", "cfg", "tier=db"]).await;
    assert!(err.contains("already has a value (web)"), "{err}");
    k.ok(&["label", "cm", "cfg", "tier=db", "--overwrite"])
        .await;
    assert_eq!(
        k.ok(&["annotate", "cm", "cfg", "note=hello"]).await.trim(),
        "configmap/cfg annotated"
    );
    let got = api.get("cfg").await.expect("get");
    assert_eq!(got.metadata.labels.expect("labels")["tier"], "db");
    assert_eq!(
        got.metadata.annotations.expect("annotations")["note"],
        "hello"
    );
    k.ok(&["label", "cm", "cfg", "tier-"]).await;
    assert!(
        api.get("cfg")
            .await
            .expect("get")
            .metadata
            .labels
            .unwrap_or_default()
            .is_empty(),
        "the label was removed"
    );

    let replacement = k.file(
        "r.yaml",
        &configmap("cfg", "default", "replaced: 'yes'", "z: '26'"),
    );
    assert_eq!(
        k.ok(&["replace", "-f", &replacement]).await.trim(),
        "configmap/cfg replaced"
    );
    let got = api.get("cfg").await.expect("get");
    assert_eq!(
        got.data.expect("data").into_iter().collect::<Vec<_>>(),
        [("z".to_owned(), "26".to_owned())]
    );
    assert_eq!(got.metadata.labels.expect("labels")["replaced"], "yes");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn delete_waits_for_finalizers_and_without_wait_only_marks() {
    if !kubectl_available() {
        return;
    }
    let c = cluster("kubectl-delete").await;
    let k = Kubectl::new(&c);
    let api: Api<ConfigMap> = Api::default_namespaced(c.client());
    let plain = k.file("plain.yaml", &configmap("plain", "default", "", ""));
    k.ok(&["create", "-f", &plain]).await;
    assert_eq!(
        k.ok(&["delete", "cm", "plain"]).await.trim(),
        r#"configmap "plain" deleted"#
    );
    assert!(api.get_opt("plain").await.expect("get").is_none());

    let held = k.file(
        "held.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: held\n  finalizers: [example.com/hold]\n",
    );
    k.ok(&["create", "-f", &held]).await;
    assert_eq!(
        k.ok(&["delete", "cm", "held", "--wait=false"]).await.trim(),
        r#"configmap "held" deleted"#
    );
    let marked = api.get("held").await.expect("still there");
    assert!(marked.metadata.deletion_timestamp.is_some());
    assert_eq!(
        marked.metadata.finalizers.expect("finalizers"),
        ["example.com/hold"]
    );

    // The default `--wait` polls until the object is gone: it times out while the finalizer
    // holds it.
    let out = k.run(&["delete", "cm", "held", "--timeout=2s"]).await;
    assert!(
        !out.status.success(),
        "delete must not report the object gone"
    );
    assert!(api.get_opt("held").await.expect("get").is_some());

    k.ok(&[
        "patch",
        "cm",
        "held",
        "--type",
        "merge",
        "-p",
        r#"{"metadata":{"finalizers":null}}"#,
    ])
    .await;
    assert!(
        api.get_opt("held").await.expect("get").is_none(),
        "the last finalizer's removal deletes it"
    );
    let err = k.fails(&["get", "cm", "held"]).await;
    assert!(err.contains("NotFound"), "{err}");
    c.shutdown().await;
}

fn event(
    name: &str,
    kind: &str,
    api_version: &str,
    obj: &str,
    uid: &str,
    ns: &str,
    reason: &str,
) -> String {
    format!(
        "apiVersion: v1\nkind: Event\nmetadata: {{name: {name}, namespace: {ns}}}\n\
         involvedObject: {{kind: {kind}, apiVersion: {api_version}, name: {obj}, namespace: '{ns}', uid: {uid}}}\n\
         reason: {reason}\nmessage: {reason} happened to {obj}\ntype: Warning\ncount: 1\n\
         firstTimestamp: '2026-01-01T00:00:00Z'\nlastTimestamp: '2026-01-01T00:00:00Z'\n\
         source: {{component: contract-test}}\n"
    )
}

fn events_section(out: &str) -> Vec<Vec<String>> {
    let start = out
        .find("Events:")
        .unwrap_or_else(|| panic!("no Events section:\n{out}"));
    words(&out[start..])
}

#[tokio::test(flavor = "multi_thread")]
async fn describe_pod_and_custom_resource_show_events_and_namespace_its_quotas() {
    if !kubectl_available() {
        return;
    }
    let c = cluster("kubectl-describe").await;
    let k = Kubectl::new(&c);
    let pod = k.file(
        "pod.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: c, image: nginx}]}\n",
    );
    k.ok(&["create", "-f", &pod]).await;
    let uid = k
        .ok(&["get", "pod", "p", "-o", "jsonpath={.metadata.uid}"])
        .await;
    let ev = k.file(
        "e1.yaml",
        &event("p.1", "Pod", "v1", "p", &uid, "default", "BackOff"),
    );
    k.ok(&["create", "-f", &ev]).await;
    let out = k.ok(&["describe", "pod", "p"]).await;
    assert!(out.contains("Name:") && out.contains("nginx"), "{out}");
    let rows = events_section(&out);
    assert_eq!(
        rows[1],
        ["Type", "Reason", "Age", "From", "Message"],
        "{out}"
    );
    assert_eq!(rows[3][..2], ["Warning", "BackOff"], "{out}");
    assert!(
        rows[3]
            .join(" ")
            .ends_with("contract-test BackOff happened to p"),
        "{out}"
    );

    let ns = k.file(
        "ns.yaml",
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: shop}\n",
    );
    k.ok(&["create", "-f", &ns]).await;
    // kubectl's namespace describer shows quotas and limit ranges, never events (as upstream).
    let out = k.ok(&["describe", "namespace", "shop"]).await;
    assert!(out.contains("Status:       Active"), "{out}");
    assert!(
        out.contains("No resource quota.") && out.contains("No LimitRange resource."),
        "{out}"
    );
    let looked_up: Vec<_> = c
        .requests()
        .into_iter()
        .filter(|r| r.path.starts_with("/api/v1/namespaces/shop/"))
        .map(|r| (r.path, r.code))
        .collect();
    assert_eq!(
        looked_up,
        [
            ("/api/v1/namespaces/shop/resourcequotas".to_owned(), 200),
            ("/api/v1/namespaces/shop/limitranges".to_owned(), 200)
        ]
    );

    let crd = k.file("crd.yaml", GADGET_CRD);
    k.ok(&["apply", "-f", &crd]).await;
    k.ok(&[
        "wait",
        "--for",
        "condition=established",
        "--timeout=10s",
        "crd/gadgets.example.com",
    ])
    .await;
    let g = k.file("g.yaml", &gadget("g1", 3));
    k.ok(&["create", "-f", &g]).await;
    // The custom resource's event comes from kube-runtime's Recorder (events.k8s.io/v1), the
    // way an operator publishes them; kubectl reads it back as a core Event.
    let gvk = GroupVersionKind::gvk("example.com", "v1", "Gadget");
    let ar = ApiResource::from_gvk(&gvk);
    let gadgets: Api<DynamicObject> = Api::default_namespaced_with(c.client(), &ar);
    let g1 = gadgets.get("g1").await.expect("get gadget");
    let recorder = Recorder::new(
        c.client(),
        Reporter {
            controller: "gadget-operator".into(),
            instance: None,
        },
    );
    let resized = RecordedEvent {
        type_: EventType::Warning,
        reason: "Resized".into(),
        note: Some("Resized happened to g1".into()),
        action: "Resize".into(),
        secondary: None,
    };
    recorder
        .publish(&resized, &g1.object_ref(&ar))
        .await
        .expect("publish");
    let out = k.ok(&["describe", "gadget", "g1"]).await;
    assert!(out.contains("Kind:         Gadget"), "{out}");
    assert!(out.contains("Size:  3"), "{out}");
    let rows = events_section(&out);
    assert!(
        rows.iter().any(|r| r.len() > 2
            && r[..2] == ["Warning", "Resized"]
            && r.join(" ")
                .ends_with("gadget-operator Resized happened to g1")),
        "{out}"
    );
    c.shutdown().await;
}

const GADGET_CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: gadgets.example.com}
spec:
  group: example.com
  scope: Namespaced
  names: {plural: gadgets, singular: gadget, kind: Gadget}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec: {type: object, properties: {size: {type: integer}}}
"#;

fn gadget(name: &str, size: u32) -> String {
    format!(
        "apiVersion: example.com/v1\nkind: Gadget\nmetadata: {{name: {name}}}\nspec: {{size: {size}}}\n"
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn crd_lifecycle_serves_then_withdraws_the_kind() {
    if !kubectl_available() {
        return;
    }
    let c = cluster("kubectl-crd").await;
    let k = Kubectl::new(&c);
    let err = k.fails(&["get", "gadgets"]).await;
    assert!(
        err.contains(r#"the server doesn't have a resource type "gadgets""#),
        "{err}"
    );
    let crd = k.file("crd.yaml", GADGET_CRD);
    k.ok(&["create", "-f", &crd]).await;
    k.ok(&[
        "wait",
        "--for",
        "condition=established",
        "--timeout=10s",
        "crd/gadgets.example.com",
    ])
    .await;
    // The cache saw no `gadgets` a moment ago: kubectl refreshes discovery by itself.
    let out = k.run(&["get", "gadgets"]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim(),
        "No resources found in default namespace."
    );
    let g = k.file("g.yaml", &gadget("g1", 3));
    assert_eq!(
        k.ok(&["create", "-f", &g]).await.trim(),
        "gadget.example.com/g1 created"
    );
    let rows = words(&k.ok(&["get", "gadget"]).await);
    assert_eq!(rows[0], ["NAME", "AGE"]);
    assert_eq!(rows[1][0], "g1");
    let g2 = k.file("g2.yaml", &gadget("g1", 4));
    assert_eq!(
        k.ok(&["replace", "-f", &g2]).await.trim(),
        "gadget.example.com/g1 replaced"
    );
    assert_eq!(
        k.ok(&["get", "gadget", "g1", "-o", "jsonpath={.spec.size}"])
            .await,
        "4"
    );

    let gvk = GroupVersionKind::gvk("example.com", "v1", "Gadget");
    let gadgets: Api<DynamicObject> =
        Api::default_namespaced_with(c.client(), &ApiResource::from_gvk(&gvk));
    assert_eq!(
        gadgets
            .list(&Default::default())
            .await
            .expect("list")
            .items
            .len(),
        1
    );

    k.ok(&["delete", "crd", "gadgets.example.com"]).await;
    // A fresh discovery cache no longer finds the kind, and the server no longer serves it.
    let out = Kubectl::output(k.command_with_cache("cache-after", &["get", "gadgets"])).await;
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains(r#"the server doesn't have a resource type "gadgets""#),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = gadgets
        .list(&Default::default())
        .await
        .expect_err("not served");
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 404),
        "{err:?}"
    );

    // Re-creating the CRD does not bring the old custom resources back.
    k.ok(&["create", "-f", &crd]).await;
    k.ok(&[
        "wait",
        "--for",
        "condition=established",
        "--timeout=10s",
        "crd/gadgets.example.com",
    ])
    .await;
    assert!(
        gadgets
            .list(&Default::default())
            .await
            .expect("list")
            .items
            .is_empty()
    );
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn get_watch_prints_rows_for_later_changes() {
    if !kubectl_available() {
        return;
    }
    let c = cluster("kubectl-get-w").await;
    let k = Kubectl::new(&c);
    let first = k.file("first.yaml", &configmap("first", "default", "", "a: '1'"));
    k.ok(&["create", "-f", &first]).await;
    // Warm the discovery cache so the watch starts quickly.
    k.ok(&["get", "cm"]).await;

    let mut cmd: tokio::process::Command =
        k.command_with_cache("cache", &["get", "cm", "-w"]).into();
    cmd.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let child = cmd.spawn().expect("spawn kubectl get -w");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let second = k.file(
        "second.yaml",
        &configmap("second", "default", "", "a: '1', b: '2', c: '3'"),
    );
    k.ok(&["create", "-f", &second]).await;
    k.ok(&[
        "patch",
        "cm",
        "first",
        "--type",
        "merge",
        "-p",
        r#"{"data":{"b":"2"}}"#,
    ])
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // Bounded: the watch never ends by itself, so this test ends the kubectl it started.
    let mut child = child;
    child.start_kill().expect("stop kubectl get -w");
    let out = tokio::time::timeout(Duration::from_secs(10), child.wait_with_output())
        .await
        .expect("kubectl exits after the kill")
        .expect("output");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let rows = words(&stdout);
    assert_eq!(rows[0], ["NAME", "DATA", "AGE"], "{stdout}");
    assert_eq!(rows[1][..2], ["first", "1"], "{stdout}");
    assert!(
        rows.iter().any(|r| r[..2] == ["second", "3"]),
        "the new object as a row:\n{stdout}"
    );
    assert!(
        rows.iter().any(|r| r[..2] == ["first", "2"]),
        "the update as a row:\n{stdout}"
    );
    c.shutdown().await;
}
