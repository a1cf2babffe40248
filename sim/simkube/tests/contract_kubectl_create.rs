//! kubectl's imperative `create` commands, exactly as a user types them, with every kubectl the
//! machine carries (1.27 to 1.33): 1.32 and later send their bodies as protobuf, older ones as
//! JSON. Also what `--dry-run=server` and `-o yaml` print, and `certificate approve` (another
//! protobuf body). Skipped with a message when kubectl is absent, unless `CI` is set (then it
//! fails).

mod support;

use support::{Kubectl, kubectl_available, kubectl_binaries};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authentication::v1::TokenReview;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use simkube::Cluster;

/// The commands of the test, for namespace `ns`, as a user would type them.
fn commands(ns: &str) -> Vec<Vec<String>> {
    let lines = [
        format!("create namespace {ns}"),
        format!("create serviceaccount robot -n {ns}"),
        format!("create configmap settings --from-literal=mode=fast --from-literal=size=3 -n {ns}"),
        format!("create secret generic creds --from-literal=password=s3cret -n {ns}"),
        format!("create deployment web --image=nginx:1.27 --replicas=2 --port=8080 -n {ns}"),
        format!("create role reader --verb=get,list --resource=configmaps,secrets -n {ns}"),
        format!("create rolebinding robot-reads --role=reader --serviceaccount={ns}:robot -n {ns}"),
        format!("create token robot --duration=10m -n {ns}"),
    ];
    lines
        .iter()
        .map(|l| l.split(' ').map(str::to_owned).collect())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn imperative_create_works_with_every_kubectl_version() {
    if !kubectl_available() {
        return;
    }
    let binaries = kubectl_binaries();
    if binaries.is_empty() {
        return;
    }
    let c = Cluster::builder()
        .name("kubectl-create")
        .start()
        .await
        .expect("cluster starts");
    let client = c.client();
    let minors: Vec<u32> = binaries.iter().map(|(minor, _)| *minor).collect();
    assert!(
        minors.contains(&27) && minors.contains(&33),
        "kubectl 1.27 and 1.33 at least: {minors:?}"
    );
    for (minor, binary) in binaries {
        let k = Kubectl::with_binary(&c, binary);
        let ns = format!("team-1-{minor}");
        c.clear_requests();
        let mut token = String::new();
        for args in commands(&ns) {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            token = k.ok(&args).await;
        }
        let posts: Vec<(String, Option<String>)> = c
            .requests()
            .into_iter()
            .filter(|r| r.method == "POST")
            .map(|r| (r.path, r.content_type))
            .collect();
        let wanted = if minor >= 32 {
            "application/vnd.kubernetes.protobuf"
        } else {
            "application/json"
        };
        assert_eq!(posts.len(), 8, "1.{minor}: {posts:?}");
        assert!(
            posts.iter().all(|(_, ct)| ct.as_deref() == Some(wanted)),
            "kubectl 1.{minor} sends {wanted}: {posts:?}"
        );
        check_created(&client, &ns, token.trim(), minor).await;
    }
    c.shutdown().await;
}

/// What the eight commands made, read back through kube-rs.
async fn check_created(client: &kube::Client, ns: &str, token: &str, minor: u32) {
    let namespace = Api::<Namespace>::all(client.clone())
        .get(ns)
        .await
        .expect("namespace");
    assert_eq!(
        namespace.status.and_then(|s| s.phase).as_deref(),
        Some("Active")
    );
    Api::<ServiceAccount>::namespaced(client.clone(), ns)
        .get("robot")
        .await
        .expect("service account");
    let cm = Api::<ConfigMap>::namespaced(client.clone(), ns)
        .get("settings")
        .await
        .expect("configmap");
    assert_eq!(
        serde_json::to_value(&cm.data).expect("json"),
        json!({"mode": "fast", "size": "3"})
    );
    let secret = Api::<Secret>::namespaced(client.clone(), ns)
        .get("creds")
        .await
        .expect("secret");
    assert_eq!(secret.type_.as_deref(), Some("Opaque"));
    let password = secret.data.expect("data")["password"].0.clone();
    assert_eq!(password, b"s3cret");
    let deploy = Api::<Deployment>::namespaced(client.clone(), ns)
        .get("web")
        .await
        .expect("deployment");
    let spec = serde_json::to_value(deploy.spec.expect("spec")).expect("json");
    assert_eq!(spec["replicas"], 2, "1.{minor}");
    assert_eq!(spec["selector"], json!({"matchLabels": {"app": "web"}}));
    let container = &spec["template"]["spec"]["containers"][0];
    assert_eq!(
        (&container["name"], &container["image"], &container["ports"]),
        (
            &json!("nginx"),
            &json!("nginx:1.27"),
            &json!([{"containerPort": 8080, "protocol": "TCP"}])
        ),
        "1.{minor}: {container}"
    );
    let role = Api::<Role>::namespaced(client.clone(), ns)
        .get("reader")
        .await
        .expect("role");
    assert_eq!(
        serde_json::to_value(role.rules).expect("json"),
        json!([{"apiGroups": [""], "resources": ["configmaps", "secrets"], "verbs": ["get", "list"]}])
    );
    let binding = Api::<RoleBinding>::namespaced(client.clone(), ns)
        .get("robot-reads")
        .await
        .expect("rolebinding");
    assert_eq!(
        serde_json::to_value(&binding).expect("json")["subjects"],
        json!([{"kind": "ServiceAccount", "name": "robot", "namespace": ns}])
    );
    assert_eq!(binding.role_ref.name, "reader");
    // The token is a real one for the ServiceAccount, valid for the asked ten minutes.
    let review: TokenReview = serde_json::from_value(
        json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}),
    )
    .expect("review");
    let reviewed = Api::<TokenReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .expect("token review");
    let status = reviewed.status.expect("status");
    assert_eq!(status.authenticated, Some(true), "1.{minor}: {token}");
    assert_eq!(
        status.user.and_then(|u| u.username).as_deref(),
        Some(format!("system:serviceaccount:{ns}:robot").as_str())
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn dry_run_server_and_yaml_output_show_what_the_server_made() {
    if !kubectl_available() {
        return;
    }
    let c = Cluster::builder()
        .name("kubectl-create-out")
        .start()
        .await
        .expect("cluster starts");
    let k = Kubectl::new(&c);
    let out = k
        .ok(&[
            "create",
            "deployment",
            "web",
            "--image=nginx",
            "--dry-run=server",
            "-o",
            "yaml",
        ])
        .await;
    let dry: Value = serde_yaml::from_str(&out).expect("yaml");
    // The server defaulted and validated the object, and persisted nothing.
    assert_eq!(dry["kind"], "Deployment");
    assert_eq!(dry["spec"]["replicas"], 1, "{out}");
    assert_eq!(dry["spec"]["strategy"]["type"], "RollingUpdate", "{out}");
    assert_eq!(
        dry["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"], "Always",
        "{out}"
    );
    assert_eq!(
        dry["spec"]["template"]["spec"]["containers"][0]["resources"],
        json!({}),
        "{out}"
    );
    assert!(dry["metadata"]["uid"].is_string(), "{out}");
    assert_eq!(dry["metadata"]["generation"], 1, "{out}");
    let deployments: Api<Deployment> = Api::default_namespaced(c.client());
    assert!(deployments.get_opt("web").await.expect("get").is_none());

    let out = k
        .ok(&[
            "create",
            "configmap",
            "settings",
            "--from-literal=mode=fast",
            "-o",
            "yaml",
        ])
        .await;
    let created: Value = serde_yaml::from_str(&out).expect("yaml");
    assert_eq!(created["data"], json!({"mode": "fast"}), "{out}");
    let meta = &created["metadata"];
    assert!(
        meta["uid"].is_string() && meta["resourceVersion"].is_string(),
        "{out}"
    );
    assert!(meta["creationTimestamp"].is_string(), "{out}");
    // Go's zero values in the protobuf body are not echoed back as fields.
    assert_eq!(
        meta.as_object()
            .map(|m| {
                let mut keys: Vec<&String> = m.keys().collect();
                keys.sort();
                keys
            })
            .unwrap_or_default(),
        [
            "creationTimestamp",
            "name",
            "namespace",
            "resourceVersion",
            "uid"
        ],
        "{out}"
    );
    let stored = Api::<ConfigMap>::default_namespaced(c.client())
        .get("settings")
        .await
        .expect("created");
    assert_eq!(
        stored.metadata.resource_version.as_deref(),
        meta["resourceVersion"].as_str()
    );
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn invalid_and_duplicate_imperative_creates_answer_as_kube_apiserver_does() {
    if !kubectl_available() {
        return;
    }
    let c = Cluster::builder()
        .name("kubectl-create-bad")
        .start()
        .await
        .expect("cluster starts");
    let k = Kubectl::new(&c);
    // A malformed name is refused by validation after decoding, with the field named.
    let err = k
        .fails(&["create", "configmap", "Not_Valid", "--from-literal=a=b"])
        .await;
    assert!(
        err.contains(
            "ConfigMap \"Not_Valid\" is invalid: metadata.name: Invalid value: \"Not_Valid\""
        ),
        "{err}"
    );
    k.ok(&["create", "namespace", "fresh"]).await;
    let err = k.fails(&["create", "namespace", "fresh"]).await;
    assert!(err.contains("namespaces \"fresh\" already exists"), "{err}");
    c.shutdown().await;
}
