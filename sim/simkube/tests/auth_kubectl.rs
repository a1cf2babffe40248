//! The real kubectl against an HTTPS, RBAC-enforcing simkube: kubeconfigs rendered by
//! `simkube::tls` work as written, `kubectl auth can-i`/`whoami` answer for a restricted
//! ServiceAccount, and denials print kube-apiserver's Forbidden message.

mod support;

use support::kubectl_available;

use std::path::{Path, PathBuf};

use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::Client;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use simkube::Cluster;

struct Kubectl {
    kubeconfig: PathBuf,
    cache: PathBuf,
}

struct Output {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Kubectl {
    fn new(dir: &Path, name: &str, kubeconfig: &str) -> Kubectl {
        let path = dir.join(format!("{name}.kubeconfig"));
        std::fs::write(&path, kubeconfig).expect("write kubeconfig");
        Kubectl {
            kubeconfig: path,
            cache: dir.join(format!("{name}-cache")),
        }
    }

    async fn run(&self, args: &[&str]) -> Output {
        let out = tokio::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(&self.cache)
            .arg("--request-timeout=20s")
            .args(args)
            .output()
            .await
            .expect("run kubectl");
        Output {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
}

fn object<T: serde::de::DeserializeOwned>(value: Value) -> T {
    serde_json::from_value(value).expect("valid object")
}

async fn restricted_service_account(admin: &Client) -> String {
    for ns in ["tenant-a", "other"] {
        Api::<Namespace>::all(admin.clone())
            .create(
                &PostParams::default(),
                &object(json!({"metadata": {"name": ns}})),
            )
            .await
            .expect("namespace");
    }
    let sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), "tenant-a");
    sas.create(
        &PostParams::default(),
        &object(json!({"metadata": {"name": "robot"}})),
    )
    .await
    .expect("service account");
    let role = json!({
        "metadata": {"name": "configmap-reader"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]}],
    });
    Api::<Role>::namespaced(admin.clone(), "tenant-a")
        .create(&PostParams::default(), &object(role))
        .await
        .expect("role");
    let binding = json!({
        "metadata": {"name": "robot"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "configmap-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "robot", "namespace": "tenant-a"}],
    });
    Api::<RoleBinding>::namespaced(admin.clone(), "tenant-a")
        .create(&PostParams::default(), &object(binding))
        .await
        .expect("binding");
    let request: TokenRequest = object(json!({"spec": {"audiences": []}}));
    let answer = sas
        .create_token_request("robot", &PostParams::default(), &request)
        .await
        .expect("token");
    answer.status.expect("status").token
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_over_https_with_rbac() {
    if !kubectl_available() {
        return;
    }
    let c = Cluster::builder()
        .name("kctl-auth")
        .tls(true)
        .rbac(true)
        .start()
        .await
        .expect("start");
    let dir = tempfile::tempdir().expect("tempdir");
    let ca_pem = c.ca_pem().expect("tls on");
    assert!(c.url().starts_with("https://"), "{}", c.url());

    // The admin kubeconfig (token + CA data) works as rendered.
    let admin = Kubectl::new(
        dir.path(),
        "admin",
        &simkube::tls::kubeconfig("kctl-auth", &c.url(), Some(&ca_pem), c.admin_token()),
    );
    let out = admin.run(&["get", "ns", "-o", "name"]).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stdout.lines().any(|l| l == "namespace/default"),
        "{}",
        out.stdout
    );
    let out = admin.run(&["auth", "can-i", "delete", "nodes"]).await;
    assert_eq!((out.code, out.stdout.trim()), (0, "yes"), "{}", out.stderr);

    // A ServiceAccount confined to reading ConfigMaps in tenant-a.
    let token = restricted_service_account(&c.client()).await;
    let robot = Kubectl::new(
        dir.path(),
        "robot",
        &simkube::tls::kubeconfig("kctl-auth", &c.url(), Some(&ca_pem), &token),
    );
    for (args, answer, code) in [
        (
            vec!["auth", "can-i", "list", "configmaps", "-n", "tenant-a"],
            "yes",
            0,
        ),
        (
            vec!["auth", "can-i", "watch", "configmaps", "-n", "tenant-a"],
            "yes",
            0,
        ),
        (
            vec!["auth", "can-i", "delete", "configmaps", "-n", "tenant-a"],
            "no",
            1,
        ),
        (
            vec!["auth", "can-i", "list", "configmaps", "-n", "other"],
            "no",
            1,
        ),
        (
            vec!["auth", "can-i", "list", "secrets", "-n", "tenant-a"],
            "no",
            1,
        ),
        (vec!["auth", "can-i", "list", "namespaces"], "no", 1),
    ] {
        let out = robot.run(&args).await;
        assert_eq!(
            (out.stdout.trim(), out.code),
            (answer, code),
            "{args:?}: {}",
            out.stderr
        );
    }
    let out = robot
        .run(&["get", "configmaps", "-n", "tenant-a", "-o", "name"])
        .await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let out = robot.run(&["get", "configmaps", "-n", "other"]).await;
    assert_eq!(out.code, 1);
    assert!(
        out.stderr.contains(
            r#"Error from server (Forbidden): configmaps is forbidden: User "system:serviceaccount:tenant-a:robot" cannot list resource "configmaps" in API group "" in the namespace "other""#
        ),
        "{}",
        out.stderr
    );
    let out = robot.run(&["auth", "whoami", "-o", "json"]).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let whoami: Value = serde_json::from_str(&out.stdout).expect("json");
    assert_eq!(
        whoami["status"]["userInfo"]["username"],
        "system:serviceaccount:tenant-a:robot"
    );
    assert_eq!(
        whoami["status"]["userInfo"]["groups"],
        json!([
            "system:serviceaccounts",
            "system:serviceaccounts:tenant-a",
            "system:authenticated"
        ])
    );
    let out = robot
        .run(&["auth", "can-i", "--list", "-n", "tenant-a"])
        .await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stdout
            .lines()
            .any(|l| l.starts_with("configmaps ") && l.contains("[get list watch]")),
        "{}",
        out.stdout
    );

    // Impersonation: the admin may act as the robot and sees exactly its rights; the robot may
    // not impersonate anyone.
    let as_robot = "--as=system:serviceaccount:tenant-a:robot";
    let out = admin
        .run(&[
            "auth",
            "can-i",
            "list",
            "configmaps",
            "-n",
            "other",
            as_robot,
        ])
        .await;
    assert_eq!((out.stdout.trim(), out.code), ("no", 1), "{}", out.stderr);
    let out = admin
        .run(&["get", "configmaps", "-n", "other", as_robot])
        .await;
    assert!(
        out.stderr.contains(r#"configmaps is forbidden: User "system:serviceaccount:tenant-a:robot" cannot list resource "configmaps""#),
        "{}",
        out.stderr
    );
    let out = admin
        .run(&["get", "configmaps", "-n", "tenant-a", as_robot])
        .await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let out = robot
        .run(&["get", "configmaps", "-n", "tenant-a", "--as=admin"])
        .await;
    assert!(
        out.stderr.contains(r#"users "admin" is forbidden: User "system:serviceaccount:tenant-a:robot" cannot impersonate resource "users" in API group "" at the cluster scope"#),
        "{}",
        out.stderr
    );

    // `kubectl create token` (a protobuf TokenRequest from kubectl 1.32+) honours --duration,
    // and the token it prints authenticates.
    let out = admin
        .run(&[
            "create",
            "token",
            "robot",
            "-n",
            "tenant-a",
            "--duration=20m",
            "--audience=https://kubernetes.default.svc.cluster.local",
        ])
        .await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let printed = out.stdout.trim().to_owned();
    let claims = printed.split('.').nth(1).expect("JWT");
    let claims: Value = serde_json::from_slice(
        &base64::Engine::decode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, claims)
            .expect("base64url"),
    )
    .expect("claims");
    assert_eq!(
        claims["exp"].as_i64().expect("exp") - claims["iat"].as_i64().expect("iat"),
        1200
    );
    assert_eq!(claims["sub"], "system:serviceaccount:tenant-a:robot");
    let printed_robot = Kubectl::new(
        dir.path(),
        "printed",
        &simkube::tls::kubeconfig("kctl-auth", &c.url(), Some(&ca_pem), &printed),
    );
    let out = printed_robot
        .run(&["auth", "can-i", "list", "configmaps", "-n", "tenant-a"])
        .await;
    assert_eq!((out.stdout.trim(), out.code), ("yes", 0), "{}", out.stderr);

    // A client-certificate identity rendered by `kubeconfig_with_client_cert`.
    let ca = c.ca().expect("tls on");
    let (cert, key) = ca
        .issue_client_cert(
            "auditor",
            &["system:masters".to_owned()],
            std::time::Duration::from_secs(600),
        )
        .expect("cert");
    let auditor = Kubectl::new(
        dir.path(),
        "auditor",
        &simkube::tls::kubeconfig_with_client_cert(
            "kctl-auth",
            &c.url(),
            &ca_pem,
            &cert,
            &key,
            "auditor",
        ),
    );
    let out = auditor.run(&["auth", "whoami", "-o", "json"]).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let whoami: Value = serde_json::from_str(&out.stdout).expect("json");
    assert_eq!(whoami["status"]["userInfo"]["username"], "auditor");
    assert_eq!(
        whoami["status"]["userInfo"]["groups"],
        json!(["system:masters", "system:authenticated"])
    );
    let out = auditor.run(&["get", "ns", "tenant-a", "-o", "name"]).await;
    assert_eq!(
        (out.code, out.stdout.trim()),
        (0, "namespace/tenant-a"),
        "{}",
        out.stderr
    );
    c.shutdown().await;
}
