//! The patch shapes the real kubectl sends: client-side `apply` (a three-way strategic merge
//! patch with `$setElementOrder` and `$retainKeys`), `kubectl patch` and server-side apply with
//! conflicts. Skipped with a message when kubectl is absent, unless `CI` is set.

mod support;

use support::{Kubectl, kubectl_available};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use simkube::Cluster;

const DEPLOY_V1: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  namespace: default
  labels: {app: web, tier: front}
spec:
  replicas: 2
  strategy:
    type: RollingUpdate
    rollingUpdate: {maxSurge: 1}
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: app
        image: app:1
        env:
        - {name: A, value: "1"}
      - name: proxy
        image: proxy:1
"#;

const DEPLOY_V2: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  namespace: default
  labels: {app: web}
spec:
  replicas: 2
  strategy:
    type: Recreate
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: app
        image: app:2
        env:
        - {name: A, value: "1"}
        - {name: B, value: "2"}
"#;

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_client_side_apply_three_way_patches() {
    if !kubectl_available() {
        return;
    }
    let cluster = Cluster::builder()
        .name("kubectl-apply")
        .tls(true)
        .start()
        .await
        .expect("cluster");
    let k = Kubectl::new(&cluster);
    let v1 = k.file("v1.yaml", DEPLOY_V1);
    k.ok(&["apply", "-f", &v1]).await;
    let api: Api<Deployment> = Api::default_namespaced(cluster.client());
    let first = api.get("web").await.expect("created");
    assert!(
        first
            .metadata
            .annotations
            .unwrap_or_default()
            .contains_key("kubectl.kubernetes.io/last-applied-configuration")
    );

    // a field set by someone else survives the next apply (it is not in last-applied)
    k.ok(&["annotate", "deployment", "web", "owner=someone-else"])
        .await;
    let v2 = k.file("v2.yaml", DEPLOY_V2);
    k.ok(&["apply", "-f", &v2]).await;
    let d = api.get("web").await.expect("get");
    let labels = d.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels.get("tier"),
        None,
        "a label dropped from the manifest is removed"
    );
    assert_eq!(
        d.metadata
            .annotations
            .clone()
            .unwrap_or_default()
            .get("owner")
            .map(String::as_str),
        Some("someone-else")
    );
    let spec = d.spec.expect("spec");
    let strategy = spec.strategy.expect("strategy");
    assert_eq!(strategy.type_.as_deref(), Some("Recreate"));
    assert!(
        strategy.rolling_update.is_none(),
        "$retainKeys dropped rollingUpdate"
    );
    let containers = spec.template.spec.expect("pod spec").containers;
    let names: Vec<&str> = containers.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["app"], "the removed container is deleted");
    assert_eq!(containers[0].image.as_deref(), Some("app:2"));
    let env: Vec<&str> = containers[0]
        .env
        .as_deref()
        .unwrap_or_default()
        .iter()
        .map(|e| e.name.as_str())
        .collect();
    assert_eq!(
        env,
        ["A", "B"],
        "$setElementOrder keeps the manifest's order"
    );

    // kubectl patch sends a strategic merge patch: containers merge by name
    k.ok(&[
        "patch",
        "deployment",
        "web",
        "-p",
        r#"{"spec":{"template":{"spec":{"containers":[{"name":"sidecar","image":"s:1"}]}}}}"#,
    ])
    .await;
    let d = api.get("web").await.expect("get");
    let mut names: Vec<String> = d
        .spec
        .unwrap()
        .template
        .spec
        .unwrap()
        .containers
        .into_iter()
        .map(|c| c.name)
        .collect();
    names.sort();
    assert_eq!(names, ["app", "sidecar"]);
    cluster.shutdown().await;
}

const CM: &str = r#"
apiVersion: v1
kind: ConfigMap
metadata:
  name: ssa
  namespace: default
data:
  shared: "one"
"#;

const CM_OTHER: &str = r#"
apiVersion: v1
kind: ConfigMap
metadata:
  name: ssa
  namespace: default
data:
  shared: "two"
"#;

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_server_side_apply_reports_conflicts_and_forces() {
    if !kubectl_available() {
        return;
    }
    let cluster = Cluster::builder()
        .name("kubectl-ssa")
        .tls(true)
        .start()
        .await
        .expect("cluster");
    let k = Kubectl::new(&cluster);
    let one = k.file("one.yaml", CM);
    let two = k.file("two.yaml", CM_OTHER);
    k.ok(&[
        "apply",
        "--server-side",
        "--field-manager=first",
        "-f",
        &one,
    ])
    .await;
    let out = k
        .run(&[
            "apply",
            "--server-side",
            "--field-manager=second",
            "-f",
            &two,
        ])
        .await;
    assert!(!out.status.success(), "a conflicting apply fails");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("conflict"),
        "kubectl shows the conflict: {stderr}"
    );
    assert!(
        stderr.contains(".data.shared"),
        "kubectl names the field: {stderr}"
    );
    k.ok(&[
        "apply",
        "--server-side",
        "--force-conflicts",
        "--field-manager=second",
        "-f",
        &two,
    ])
    .await;
    let api: Api<ConfigMap> = Api::default_namespaced(cluster.client());
    let cm = api.get("ssa").await.expect("get");
    assert_eq!(
        cm.data
            .unwrap_or_default()
            .get("shared")
            .map(String::as_str),
        Some("two")
    );
    let managers: Vec<String> = cm
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter_map(|e| e.manager)
        .collect();
    assert_eq!(
        managers,
        ["second"],
        "ownership moved to the forcing manager"
    );
    cluster.shutdown().await;
}
