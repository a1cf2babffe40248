//! Discovery, OpenAPI v3, Table output and CRDs as the real kubectl uses them: `api-resources`,
//! `get` with the server's columns, `apply` (client- and server-side) with default validation,
//! `wait` for an established CRD, `explain`, and `get -w`. Each test uses a fresh discovery cache.
//! Skipped with a message when kubectl is absent, unless `CI` is set (then it fails).

mod support;

use support::{Kubectl, kubectl_available};

use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use simkube::Cluster;

/// The words of each output line, so column spacing does not matter.
fn words(out: &str) -> Vec<Vec<String>> {
    out.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.split_whitespace().map(str::to_owned).collect())
        .collect()
}

/// Header columns, split on runs of two or more spaces (headers like `NOMINATED NODE`).
fn header(out: &str) -> Vec<String> {
    out.lines()
        .next()
        .unwrap_or_default()
        .split("  ")
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

const WIDGET_CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.com
spec:
  group: example.com
  scope: Namespaced
  names: {plural: widgets, kind: Widget, shortNames: [wd], categories: [all]}
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {status: {}}
    additionalPrinterColumns:
    - {name: Color, type: string, jsonPath: .spec.color}
    - {name: Replicas, type: integer, jsonPath: .spec.replicas}
    - {name: Age, type: date, jsonPath: .metadata.creationTimestamp}
    schema:
      openAPIV3Schema:
        type: object
        description: A widget for tests.
        properties:
          spec:
            type: object
            description: Desired state of the widget.
            required: [color]
            properties:
              color: {type: string, enum: [red, green], description: The colour of the widget.}
              replicas: {type: integer, minimum: 1, default: 1}
          status:
            type: object
            properties:
              ready: {type: boolean}
"#;

fn widget(name: &str, color: &str, replicas: &str) -> String {
    format!(
        "apiVersion: example.com/v1\nkind: Widget\nmetadata: {{name: {name}}}\nspec: {{color: {color}, replicas: {replicas}}}\n"
    )
}

async fn cluster(name: &str) -> Cluster {
    Cluster::builder()
        .name(name)
        .start()
        .await
        .expect("cluster starts")
}

/// Installs the Widget CRD with `kubectl apply` and waits for it with `kubectl wait`.
async fn install_widgets(k: &Kubectl) {
    let crd = k.file("crd.yaml", WIDGET_CRD);
    let out = k.ok(&["apply", "-f", &crd]).await;
    assert_eq!(
        out.trim(),
        "customresourcedefinition.apiextensions.k8s.io/widgets.example.com created"
    );
    let out = k
        .ok(&[
            "wait",
            "--for",
            "condition=established",
            "--timeout=10s",
            "crd/widgets.example.com",
        ])
        .await;
    assert!(out.contains("condition met"), "{out}");
}

#[tokio::test(flavor = "multi_thread")]
async fn api_resources_lists_builtins_and_then_a_new_crd() {
    if !kubectl_available() {
        return;
    }
    let c = cluster("kubectl-discovery").await;
    let k = Kubectl::new(&c);
    let version = k.ok(&["version"]).await;
    assert!(version.contains("Server Version: v1.33"), "{version}");

    let out = k.ok(&["api-resources"]).await;
    let rows = words(&out);
    assert_eq!(
        rows[0],
        ["NAME", "SHORTNAMES", "APIVERSION", "NAMESPACED", "KIND"]
    );
    for expected in [
        vec!["pods", "po", "v1", "true", "Pod"],
        vec!["nodes", "no", "v1", "false", "Node"],
        vec!["deployments", "deploy", "apps/v1", "true", "Deployment"],
        vec![
            "customresourcedefinitions",
            "crd,crds",
            "apiextensions.k8s.io/v1",
            "false",
            "CustomResourceDefinition",
        ],
        vec!["leases", "coordination.k8s.io/v1", "true", "Lease"],
        vec!["events", "ev", "events.k8s.io/v1", "true", "Event"],
        vec![
            "certificatesigningrequests",
            "csr",
            "certificates.k8s.io/v1",
            "false",
            "CertificateSigningRequest",
        ],
    ] {
        assert!(
            rows.iter().any(|r| *r == expected),
            "missing {expected:?} in\n{out}"
        );
    }
    assert!(!out.contains("Widget"));

    install_widgets(&k).await;
    // The discovery cache is now stale; kubectl refreshes it on an unknown type.
    let out = k.ok(&["get", "wd"]).await;
    assert!(out.is_empty(), "no widgets yet: {out}");
    let out = k.ok(&["api-resources", "--api-group=example.com"]).await;
    assert_eq!(
        words(&out),
        [
            vec!["NAME", "SHORTNAMES", "APIVERSION", "NAMESPACED", "KIND"],
            vec!["widgets", "wd", "example.com/v1", "true", "Widget"],
        ]
    );
    let out = k.ok(&["get", "crd"]).await;
    let rows = words(&out);
    assert_eq!(rows[0], ["NAME", "CREATED", "AT"]);
    assert_eq!(rows[1][0], "widgets.example.com");
}

#[tokio::test(flavor = "multi_thread")]
async fn get_prints_the_server_side_columns() {
    if !kubectl_available() {
        return;
    }
    let c = cluster("kubectl-tables").await;
    let k = Kubectl::new(&c);
    let pods: Api<Pod> = Api::default_namespaced(c.client());
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"nodeName": "node-a", "containers": [{"name": "a", "image": "nginx"}, {"name": "b", "image": "busybox"}]},
    }))
    .expect("pod");
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("create pod");
    let status = json!({"status": {"phase": "Running", "podIP": "10.244.0.7", "containerStatuses": [
        {"name": "a", "ready": true, "restartCount": 1, "image": "nginx", "imageID": "", "state": {"running": {}}},
        {"name": "b", "ready": false, "restartCount": 0, "image": "busybox", "imageID": "", "state": {"waiting": {"reason": "ImagePullBackOff"}}}]}});
    pods.patch_status("web", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("status");

    let out = k.ok(&["get", "pods"]).await;
    assert_eq!(header(&out), ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]);
    let row = &words(&out)[1];
    assert_eq!(row[..4], ["web", "1/2", "ImagePullBackOff", "1"]);

    let out = k.ok(&["get", "pods", "-o", "wide"]).await;
    assert_eq!(
        header(&out),
        [
            "NAME",
            "READY",
            "STATUS",
            "RESTARTS",
            "AGE",
            "IP",
            "NODE",
            "NOMINATED NODE",
            "READINESS GATES"
        ]
    );
    assert_eq!(
        words(&out)[1][5..],
        ["10.244.0.7", "node-a", "<none>", "<none>"]
    );

    let out = k.ok(&["get", "pods", "-A", "--show-labels"]).await;
    assert_eq!(
        header(&out),
        [
            "NAMESPACE",
            "NAME",
            "READY",
            "STATUS",
            "RESTARTS",
            "AGE",
            "LABELS"
        ]
    );

    let out = k.ok(&["get", "svc"]).await;
    assert_eq!(
        header(&out),
        [
            "NAME",
            "TYPE",
            "CLUSTER-IP",
            "EXTERNAL-IP",
            "PORT(S)",
            "AGE"
        ]
    );
    assert_eq!(
        words(&out)[1][..5],
        ["kubernetes", "ClusterIP", "10.96.0.1", "<none>", "443/TCP"]
    );

    let out = k.ok(&["get", "ns"]).await;
    assert_eq!(header(&out), ["NAME", "STATUS", "AGE"]);
    assert!(
        words(&out).iter().any(|r| r[..2] == ["default", "Active"]),
        "{out}"
    );

    let deploy = k.file(
        "deploy.yaml",
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\nspec:\n  replicas: 2\n  selector: {matchLabels: {app: d}}\n  template:\n    metadata: {labels: {app: d}}\n    spec: {containers: [{name: c, image: nginx}]}\n",
    );
    k.ok(&["apply", "-f", &deploy]).await;
    let out = k.ok(&["get", "deploy", "-o", "wide"]).await;
    assert_eq!(
        header(&out),
        [
            "NAME",
            "READY",
            "UP-TO-DATE",
            "AVAILABLE",
            "AGE",
            "CONTAINERS",
            "IMAGES",
            "SELECTOR"
        ]
    );
    let row = &words(&out)[1];
    assert_eq!(row[..4], ["d", "0/2", "0", "0"]);
    assert_eq!(row[5..], ["c", "nginx", "app=d"]);

    let cm = k.file(
        "cm.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings}\ndata: {a: '1', b: '2'}\n",
    );
    k.ok(&["apply", "-f", &cm]).await;
    let out = k.ok(&["get", "cm", "settings"]).await;
    assert_eq!(words(&out)[0], ["NAME", "DATA", "AGE"]);
    assert_eq!(words(&out)[1][..2], ["settings", "2"]);

    let out = k.ok(&["get", "clusterroles"]).await;
    assert_eq!(header(&out), ["NAME", "CREATED AT"]);

    let events: Api<k8s_openapi::api::core::v1::Event> = Api::default_namespaced(c.client());
    let event = serde_json::from_value(json!({
        "metadata": {"name": "web.1"},
        "involvedObject": {"kind": "Pod", "name": "web", "namespace": "default"},
        "reason": "Pulled", "type": "Normal", "message": "Container image pulled",
        "firstTimestamp": "2025-01-01T00:00:00Z", "lastTimestamp": "2025-01-01T00:00:00Z", "count": 1,
        "source": {"component": "kubelet"},
    }))
    .expect("event");
    events
        .create(&PostParams::default(), &event)
        .await
        .expect("create event");
    let out = k.ok(&["get", "events"]).await;
    assert_eq!(
        header(&out),
        ["LAST SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]
    );
    let row = &words(&out)[1];
    assert_eq!(
        row[1..],
        [
            "Normal",
            "Pulled",
            "pod/web",
            "Container",
            "image",
            "pulled"
        ]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn apply_custom_resources_with_default_validation() {
    if !kubectl_available() {
        return;
    }
    let c = cluster("kubectl-crs").await;
    let k = Kubectl::new(&c);
    install_widgets(&k).await;

    let w = k.file("w.yaml", &widget("w1", "red", "2"));
    assert_eq!(
        k.ok(&["apply", "-f", &w]).await.trim(),
        "widget.example.com/w1 created"
    );
    let out = k.ok(&["get", "widgets"]).await;
    assert_eq!(header(&out), ["NAME", "COLOR", "REPLICAS", "AGE"]);
    assert_eq!(words(&out)[1][..3], ["w1", "red", "2"]);

    // Client-side apply of a change: a three-way JSON merge patch for custom resources.
    let w = k.file("w.yaml", &widget("w1", "green", "3"));
    assert_eq!(
        k.ok(&["apply", "-f", &w]).await.trim(),
        "widget.example.com/w1 configured"
    );
    let out = k
        .ok(&[
            "get",
            "wd",
            "w1",
            "-o",
            "jsonpath={.spec.color}/{.spec.replicas}",
        ])
        .await;
    assert_eq!(out, "green/3");

    // Server-side apply of another object, found by short name and category afterwards.
    let w2 = k.file("w2.yaml", &widget("w2", "red", "1"));
    assert_eq!(
        k.ok(&["apply", "--server-side", "-f", &w2]).await.trim(),
        "widget.example.com/w2 serverside-applied"
    );
    let out = k.ok(&["get", "all"]).await;
    assert!(out.contains("widget.example.com/w2"), "{out}");

    // Defaults from the schema.
    let d = k.file(
        "d.yaml",
        "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: dflt}\nspec: {color: red}\n",
    );
    k.ok(&["apply", "-f", &d]).await;
    assert_eq!(
        k.ok(&["get", "wd", "dflt", "-o", "jsonpath={.spec.replicas}"])
            .await,
        "1"
    );

    // Schema violations come back as the server's field errors.
    let bad = k.file("bad.yaml", &widget("bad", "blue", "\"x\""));
    let err = k.fails(&["apply", "-f", &bad]).await;
    assert!(err.contains("The Widget \"bad\" is invalid"), "{err}");
    assert!(
        err.contains(
            "spec.color: Unsupported value: \"blue\": supported values: \"red\", \"green\""
        ),
        "{err}"
    );
    assert!(
        err.contains("spec.replicas: Invalid value: \"string\": spec.replicas in body must be of type integer: \"string\""),
        "{err}"
    );
    let out = k.run(&["get", "wd", "bad"]).await;
    assert!(!out.status.success(), "invalid widget must not be stored");
}

#[tokio::test(flavor = "multi_thread")]
async fn explain_reads_crd_schemas_and_names_builtin_kinds() {
    if !kubectl_available() {
        return;
    }
    let c = cluster("kubectl-explain").await;
    let k = Kubectl::new(&c);
    install_widgets(&k).await;
    let out = k.ok(&["explain", "widgets.spec"]).await;
    assert!(out.contains("KIND:       Widget"), "{out}");
    assert!(out.contains("Desired state of the widget."), "{out}");
    assert!(out.contains("color\t<string> -required-"), "{out}");
    assert!(out.contains("The colour of the widget."), "{out}");
    // Built-in kinds are known by name but carry no field documentation.
    let out = k.ok(&["explain", "pods"]).await;
    assert!(
        out.contains("KIND:       Pod") && out.contains("VERSION:    v1"),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn get_watch_prints_table_rows_for_custom_resources() {
    if !kubectl_available() {
        return;
    }
    let c = cluster("kubectl-watch").await;
    let k = Kubectl::new(&c);
    install_widgets(&k).await;
    let w = k.file("w.yaml", &widget("w1", "red", "2"));
    k.ok(&["apply", "-f", &w]).await;

    let mut cmd = k.command(&["get", "wd", "-w", "--request-timeout=0"]);
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn kubectl get -w");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let w = k.file("w.yaml", &widget("w1", "green", "5"));
    k.ok(&["apply", "-f", &w]).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // End only the kubectl this test started.
    child.kill().expect("stop kubectl get -w");
    let out = tokio::task::spawn_blocking(move || child.wait_with_output().expect("wait"))
        .await
        .expect("join");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let rows = words(&stdout);
    assert_eq!(rows[0], ["NAME", "COLOR", "REPLICAS", "AGE"], "{stdout}");
    assert_eq!(rows[1][..3], ["w1", "red", "2"], "{stdout}");
    assert!(
        rows.iter().any(|r| r[..3] == ["w1", "green", "5"]),
        "update shown as a table row:\n{stdout}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn crd_versions_are_addressable_and_the_preferred_one_is_the_default() {
    if !kubectl_available() {
        return;
    }
    let c = cluster("kubectl-versions").await;
    let k = Kubectl::new(&c);
    let two_versions = WIDGET_CRD.replace(
        "  versions:\n",
        "  versions:\n  - name: v1beta1\n    served: true\n    storage: false\n    schema:\n      openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}\n",
    );
    let crd = k.file("crd.yaml", &two_versions);
    k.ok(&["apply", "-f", &crd]).await;
    k.ok(&[
        "wait",
        "--for",
        "condition=established",
        "--timeout=10s",
        "crd/widgets.example.com",
    ])
    .await;
    let out = k.ok(&["api-versions"]).await;
    let versions: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("example.com/"))
        .collect();
    assert_eq!(versions, ["example.com/v1", "example.com/v1beta1"]);

    let w = k.file("w.yaml", &widget("w1", "red", "2"));
    k.ok(&["apply", "-f", &w]).await;
    // Unqualified, kubectl uses the preferred (GA) version and its printer columns.
    let out = k.ok(&["get", "widgets"]).await;
    assert_eq!(header(&out), ["NAME", "COLOR", "REPLICAS", "AGE"]);
    let out = k
        .ok(&["get", "widgets", "-o", "jsonpath={.items[0].apiVersion}"])
        .await;
    assert_eq!(out, "example.com/v1");
    // Fully qualified, the other served version; it has no columns, so NAME and AGE.
    let out = k.ok(&["get", "widgets.v1beta1.example.com"]).await;
    assert_eq!(header(&out), ["NAME", "AGE"]);
    let out = k
        .ok(&[
            "get",
            "widgets.v1beta1.example.com",
            "w1",
            "-o",
            "jsonpath={.apiVersion}/{.spec.color}",
        ])
        .await;
    assert_eq!(out, "example.com/v1beta1/red");
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_uses_aggregated_discovery_and_the_openapi_it_is_offered() {
    if !kubectl_available() {
        return;
    }
    let c = cluster("kubectl-requests").await;
    let k = Kubectl::new(&c);
    k.ok(&["version"]).await;
    c.clear_requests();
    k.ok(&["get", "cm"]).await;
    let paths: Vec<String> = c
        .requests()
        .iter()
        .map(|r| format!("{} {} {}", r.method, r.path, r.code))
        .collect();
    // Cold cache, aggregated discovery: two discovery requests, then the list.
    assert_eq!(
        paths,
        [
            "GET /api 200",
            "GET /apis 200",
            "GET /api/v1/namespaces/default/configmaps 200"
        ],
        "{paths:#?}"
    );

    c.clear_requests();
    let cm = k.file(
        "cm.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata: {a: '1'}\n",
    );
    k.ok(&["apply", "-f", &cm]).await;
    let records = c.requests();
    let openapi: Vec<(String, String)> = records
        .iter()
        .filter(|r| r.path.starts_with("/openapi"))
        .map(|r| (r.path.clone(), r.query.clone()))
        .collect();
    assert_eq!(openapi[0].0, "/openapi/v3");
    assert!(
        openapi
            .iter()
            .any(|(p, q)| p == "/openapi/v3/api/v1" && q.starts_with("hash=")),
        "{openapi:?}"
    );
    assert!(
        !records.iter().any(|r| r.path == "/openapi/v2"),
        "v3 suffices: {openapi:?}"
    );
    let create = records
        .iter()
        .find(|r| r.method == "POST")
        .expect("create request");
    assert!(
        create.query.contains("fieldValidation=Strict"),
        "server-side validation chosen: {}",
        create.query
    );
}
