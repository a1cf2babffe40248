//! Authentication and RBAC through the real kube-rs client over HTTPS: a ServiceAccount token
//! from TokenRequest does exactly what its Role allows in its namespace and gets kube-apiserver's
//! 403 elsewhere; client-certificate identities; requests without or with bad credentials;
//! escalation prevention on RBAC writes; access reviews.

use futures::StreamExt as _;
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, Role, RoleBinding};
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::core::Status;
use serde_json::{Value, json};
use simkube::Cluster;

async fn cluster(name: &str) -> Cluster {
    Cluster::builder()
        .name(name)
        .tls(true)
        .rbac(true)
        .start()
        .await
        .expect("cluster starts")
}

fn api_error(result: Result<impl std::fmt::Debug, kube::Error>) -> Status {
    match result {
        Err(kube::Error::Api(status)) => *status,
        other => panic!("expected an API error, got {other:?}"),
    }
}

fn object<T: serde::de::DeserializeOwned>(value: Value) -> T {
    serde_json::from_value(value).expect("valid object")
}

async fn create_namespace(admin: &Client, name: &str) {
    let api: Api<Namespace> = Api::all(admin.clone());
    api.create(
        &PostParams::default(),
        &object(json!({"metadata": {"name": name}})),
    )
    .await
    .expect("namespace");
}

/// A tenant namespace with a ServiceAccount that may read and create ConfigMaps there.
async fn tenant(admin: &Client, ns: &str) {
    create_namespace(admin, ns).await;
    let sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), ns);
    sas.create(
        &PostParams::default(),
        &object(json!({"metadata": {"name": "robot"}})),
    )
    .await
    .expect("service account");
    let roles: Api<Role> = Api::namespaced(admin.clone(), ns);
    let role = json!({
        "metadata": {"name": "configmap-editor"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch", "create"]}],
    });
    roles
        .create(&PostParams::default(), &object(role))
        .await
        .expect("role");
    let bindings: Api<RoleBinding> = Api::namespaced(admin.clone(), ns);
    let binding = json!({
        "metadata": {"name": "robot-configmaps"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "configmap-editor"},
        "subjects": [{"kind": "ServiceAccount", "name": "robot", "namespace": ns}],
    });
    bindings
        .create(&PostParams::default(), &object(binding))
        .await
        .expect("binding");
}

async fn token_for(admin: &Client, ns: &str, expiration: i64) -> (String, Value) {
    let sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), ns);
    let request: TokenRequest =
        object(json!({"spec": {"expirationSeconds": expiration, "audiences": []}}));
    let answer = sas
        .create_token_request("robot", &PostParams::default(), &request)
        .await
        .expect("token request");
    let answer = serde_json::to_value(answer).expect("json");
    (
        answer["status"]["token"]
            .as_str()
            .expect("token")
            .to_owned(),
        answer,
    )
}

fn cm(name: &str) -> ConfigMap {
    object(json!({"metadata": {"name": name}, "data": {"k": "v"}}))
}

#[tokio::test(flavor = "multi_thread")]
async fn service_account_token_is_confined_to_its_role() {
    let c = cluster("rbac-sa").await;
    let admin = c.client();
    tenant(&admin, "tenant-a").await;
    create_namespace(&admin, "other").await;
    let (token, answer) = token_for(&admin, "tenant-a", 1200).await;
    assert_eq!(answer["spec"]["expirationSeconds"], 1200);
    assert!(
        answer["status"]["expirationTimestamp"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z'))
    );
    let robot = c.client_with_token(&token).expect("client");

    // Allowed: exactly what the Role grants, in its namespace.
    let own: Api<ConfigMap> = Api::namespaced(robot.clone(), "tenant-a");
    own.create(&PostParams::default(), &cm("settings"))
        .await
        .expect("create allowed");
    assert_eq!(
        own.list(&ListParams::default())
            .await
            .expect("list allowed")
            .items
            .len(),
        1
    );
    own.get("settings").await.expect("get allowed");

    // Denied: a verb the Role lacks.
    let status = api_error(own.delete("settings", &DeleteParams::default()).await);
    assert_eq!(status.code, 403);
    assert_eq!(status.reason, "Forbidden");
    assert_eq!(
        status.message,
        r#"configmaps "settings" is forbidden: User "system:serviceaccount:tenant-a:robot" cannot delete resource "configmaps" in API group "" in the namespace "tenant-a""#
    );
    // Denied: another namespace.
    let other: Api<ConfigMap> = Api::namespaced(robot.clone(), "other");
    let status = api_error(other.list(&ListParams::default()).await);
    assert_eq!(
        (status.code, status.message.as_str()),
        (
            403,
            r#"configmaps is forbidden: User "system:serviceaccount:tenant-a:robot" cannot list resource "configmaps" in API group "" in the namespace "other""#
        )
    );
    // Denied: another resource, and cluster scope.
    let secrets: Api<Secret> = Api::namespaced(robot.clone(), "tenant-a");
    assert_eq!(api_error(secrets.get("x").await).code, 403);
    let namespaces: Api<Namespace> = Api::all(robot.clone());
    let status = api_error(namespaces.list(&ListParams::default()).await);
    assert_eq!(
        status.message,
        r#"namespaces is forbidden: User "system:serviceaccount:tenant-a:robot" cannot list resource "namespaces" in API group "" at the cluster scope"#
    );
    // Watch in its namespace, but not across all namespaces.
    let mut events = own
        .watch(&kube::api::WatchParams::default().timeout(1), "0")
        .await
        .expect("watch allowed")
        .boxed();
    let first = futures::StreamExt::next(&mut events)
        .await
        .expect("an event")
        .expect("ok");
    assert!(
        matches!(first, kube::api::WatchEvent::Added(_)),
        "{first:?}"
    );
    let everywhere: Api<ConfigMap> = Api::all(robot.clone());
    let status = api_error(everywhere.list(&ListParams::default()).await);
    assert_eq!(
        status.message,
        r#"configmaps is forbidden: User "system:serviceaccount:tenant-a:robot" cannot list resource "configmaps" in API group "" at the cluster scope"#
    );
    let status = api_error(
        everywhere
            .watch(&kube::api::WatchParams::default(), "0")
            .await
            .map(|_| ()),
    );
    assert_eq!(
        status.message,
        r#"configmaps is forbidden: User "system:serviceaccount:tenant-a:robot" cannot watch resource "configmaps" in API group "" at the cluster scope"#
    );
    // Discovery is open to every authenticated user (system:discovery).
    robot.apiserver_version().await.expect("version");
    kube::discovery::Discovery::new(robot.clone())
        .run()
        .await
        .expect("discovery");

    // The token dies with its ServiceAccount (and a re-created one has another uid).
    let sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), "tenant-a");
    sas.delete("robot", &DeleteParams::default())
        .await
        .expect("delete sa");
    let status = api_error(own.list(&ListParams::default()).await);
    assert_eq!(
        (status.code, status.reason.as_str(), status.message.as_str()),
        (401, "Unauthorized", "Unauthorized")
    );
    sas.create(
        &PostParams::default(),
        &object(json!({"metadata": {"name": "robot"}})),
    )
    .await
    .expect("re-create sa");
    assert_eq!(api_error(own.list(&ListParams::default()).await).code, 401);
    // A fresh token for the new account works again.
    let (fresh, _) = token_for(&admin, "tenant-a", 600).await;
    let robot = c.client_with_token(&fresh).expect("client");
    Api::<ConfigMap>::namespaced(robot, "tenant-a")
        .list(&ListParams::default())
        .await
        .expect("fresh token works");

    // TokenRequest validation: at least ten minutes.
    let sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), "tenant-a");
    let short: TokenRequest = object(json!({"spec": {"expirationSeconds": 60, "audiences": []}}));
    let status = api_error(
        sas.create_token_request("robot", &PostParams::default(), &short)
            .await,
    );
    assert_eq!(status.code, 422);
    assert_eq!(
        status.message,
        r#"TokenRequest.authentication.k8s.io "robot" is invalid: spec.expirationSeconds: Invalid value: 60: may not specify a duration less than 10 minutes"#
    );
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_or_missing_credentials_are_unauthorized() {
    let c = cluster("rbac-anon").await;
    let admin = c.client();
    create_namespace(&admin, "ns").await;
    for token in ["not-a-token", "eyJhbGciOiJFUzI1NiJ9.eyJpc3MiOiJ4In0.AAAA"] {
        let bad = c.client_with_token(token).expect("client");
        let status = api_error(
            Api::<ConfigMap>::namespaced(bad, "ns")
                .list(&ListParams::default())
                .await,
        );
        assert_eq!(
            (status.code, status.reason.as_str()),
            (401, "Unauthorized"),
            "{token}"
        );
    }
    // A token signed by another cluster's issuer is not accepted here.
    let other = cluster("rbac-anon-2").await;
    tenant(&other.client(), "tenant-a").await;
    let (foreign, _) = token_for(&other.client(), "tenant-a", 600).await;
    tenant(&admin, "tenant-a").await;
    let client = c.client_with_token(&foreign).expect("client");
    let status = api_error(
        Api::<ConfigMap>::namespaced(client, "tenant-a")
            .list(&ListParams::default())
            .await,
    );
    assert_eq!(status.code, 401);
    other.shutdown().await;

    // No credentials at all.
    let mut config = kube::Config::new(c.url().parse().expect("url"));
    config.root_cert = Some(vec![c.ca().expect("tls").ca_der().to_vec()]);
    let anonymous = Client::try_from(config).expect("client");
    let status = api_error(
        Api::<Namespace>::all(anonymous.clone())
            .list(&ListParams::default())
            .await,
    );
    assert_eq!(status.code, 401, "{status:?}");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn client_certificates_authenticate_over_https() {
    let c = cluster("rbac-cert").await;
    let admin = c.client();
    create_namespace(&admin, "team").await;
    let bindings: Api<ClusterRoleBinding> = Api::all(admin.clone());
    let binding = json!({
        "metadata": {"name": "devs-view"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "devs"}],
    });
    bindings
        .create(&PostParams::default(), &object(binding))
        .await
        .expect("binding");
    let ca = c.ca().expect("tls on");
    let groups = vec!["devs".to_owned(), "auditors".to_owned()];
    let (cert, key) = ca
        .issue_client_cert("alice", &groups, std::time::Duration::from_secs(600))
        .expect("cert");
    let kubeconfig = simkube::tls::kubeconfig_with_client_cert(
        "rbac-cert",
        &c.url(),
        &ca.ca_pem(),
        &cert,
        &key,
        "alice",
    );
    let kubeconfig: kube::config::Kubeconfig = serde_yaml::from_str(&kubeconfig).expect("yaml");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .expect("config");
    let alice = Client::try_from(config).expect("client");

    // `view` (aggregated) lets alice read in every namespace, not write.
    let cms: Api<ConfigMap> = Api::namespaced(alice.clone(), "team");
    cms.list(&ListParams::default())
        .await
        .expect("view allows list");
    let status = api_error(cms.create(&PostParams::default(), &cm("x")).await);
    assert_eq!(
        status.message,
        r#"configmaps is forbidden: User "alice" cannot create resource "configmaps" in API group "" in the namespace "team""#
    );
    // `view` has no secrets.
    let status = api_error(
        Api::<Secret>::namespaced(alice.clone(), "team")
            .list(&ListParams::default())
            .await,
    );
    assert_eq!(status.code, 403);

    // A certificate from another CA does not get in (the TLS handshake refuses it).
    let stranger_ca = simkube::tls::CertAuthority::generate("elsewhere").expect("ca");
    let (cert, key) = stranger_ca
        .issue_client_cert(
            "admin",
            &["system:masters".to_owned()],
            std::time::Duration::from_secs(600),
        )
        .expect("cert");
    let kubeconfig = simkube::tls::kubeconfig_with_client_cert(
        "rbac-cert",
        &c.url(),
        &ca.ca_pem(),
        &cert,
        &key,
        "mallory",
    );
    let config = kube::Config::from_custom_kubeconfig(
        serde_yaml::from_str(&kubeconfig).expect("yaml"),
        &Default::default(),
    )
    .await
    .expect("config");
    let mallory = Client::try_from(config).expect("client");
    match Api::<Namespace>::all(mallory)
        .list(&ListParams::default())
        .await
    {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 401, "{status:?}"),
        Err(_) => {} // refused during the handshake
        Ok(list) => panic!("a foreign certificate was accepted: {list:?}"),
    }
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn rbac_writes_cannot_escalate() {
    let c = cluster("rbac-esc").await;
    let admin = c.client();
    create_namespace(&admin, "t").await;
    // `admin` bound in namespace t: may manage Roles and RoleBindings there.
    let bindings: Api<RoleBinding> = Api::namespaced(admin.clone(), "t");
    let binding = json!({
        "metadata": {"name": "bob-admin"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "admin"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "bob"}],
    });
    bindings
        .create(&PostParams::default(), &object(binding))
        .await
        .expect("binding");
    let ca = c.ca().expect("tls");
    let (cert, key) = ca
        .issue_client_cert("bob", &[], std::time::Duration::from_secs(600))
        .expect("cert");
    let kubeconfig = simkube::tls::kubeconfig_with_client_cert(
        "rbac-esc",
        &c.url(),
        &ca.ca_pem(),
        &cert,
        &key,
        "bob",
    );
    let config = kube::Config::from_custom_kubeconfig(
        serde_yaml::from_str(&kubeconfig).expect("yaml"),
        &Default::default(),
    )
    .await
    .expect("config");
    let bob = Client::try_from(config).expect("client");

    let roles: Api<Role> = Api::namespaced(bob.clone(), "t");
    let fine = json!({"metadata": {"name": "reader"}, "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]});
    roles
        .create(&PostParams::default(), &object(fine))
        .await
        .expect("within bob's rights");
    let nodes = json!({"metadata": {"name": "nodes"}, "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]});
    let status = api_error(roles.create(&PostParams::default(), &object(nodes)).await);
    assert_eq!(status.code, 403);
    assert_eq!(
        status.message,
        "roles.rbac.authorization.k8s.io \"nodes\" is forbidden: user \"bob\" (groups=[\"system:authenticated\"]) is attempting to grant RBAC permissions not currently held:\n{APIGroups:[\"\"], Resources:[\"nodes\"], Verbs:[\"get\"]}"
    );
    let bob_bindings: Api<RoleBinding> = Api::namespaced(bob.clone(), "t");
    let to_cluster_admin = json!({
        "metadata": {"name": "sneaky"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "bob"}],
    });
    let status = api_error(
        bob_bindings
            .create(&PostParams::default(), &object(to_cluster_admin))
            .await,
    );
    assert_eq!(status.code, 403);
    assert!(
        status.message.starts_with(
            "rolebindings.rbac.authorization.k8s.io \"sneaky\" is forbidden: user \"bob\" (groups=[\"system:authenticated\"]) is attempting to grant RBAC permissions not currently held:"
        ),
        "{}",
        status.message
    );
    let to_reader = json!({
        "metadata": {"name": "readers"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "reader"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "carol"}],
    });
    bob_bindings
        .create(&PostParams::default(), &object(to_reader))
        .await
        .expect("may bind what bob holds");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn self_subject_access_review_answers_for_the_caller() {
    let c = cluster("rbac-ssar").await;
    let admin = c.client();
    tenant(&admin, "tenant-a").await;
    let (token, _) = token_for(&admin, "tenant-a", 600).await;
    let robot = c.client_with_token(&token).expect("client");
    let ask = |ns: &str, verb: &str| {
        json!({
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": {"namespace": ns, "verb": verb, "resource": "configmaps"}},
        })
    };
    let post = |body: Value| {
        let robot = robot.clone();
        async move {
            let request =
                http::Request::post("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews")
                    .header("content-type", "application/json")
                    .body(serde_json::to_vec(&body).expect("json"))
                    .expect("request");
            robot.request::<Value>(request).await.expect("review")
        }
    };
    let yes = post(ask("tenant-a", "list")).await;
    assert_eq!(yes["status"]["allowed"], true, "{yes}");
    assert_eq!(
        yes["status"]["reason"],
        r#"RBAC: allowed by RoleBinding "robot-configmaps/tenant-a" of Role "configmap-editor" to ServiceAccount "robot/tenant-a""#
    );
    assert_eq!(
        post(ask("tenant-a", "delete")).await["status"]["allowed"],
        false
    );
    assert_eq!(post(ask("other", "list")).await["status"]["allowed"], false);
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn token_review_verifies_tokens_for_delegated_authentication() {
    let c = cluster("rbac-tokenreview").await;
    let admin = c.client();
    tenant(&admin, "tenant-a").await;
    let (token, _) = token_for(&admin, "tenant-a", 600).await;
    let review = |client: Client, token: String| async move {
        let body = json!({
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token},
        });
        let request = http::Request::post("/apis/authentication.k8s.io/v1/tokenreviews")
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&body).expect("json"))
            .expect("request");
        client.request::<Value>(request).await
    };
    let answer = review(admin.clone(), token.clone()).await.expect("review");
    assert_eq!(answer["status"]["authenticated"], true, "{answer}");
    assert_eq!(
        answer["status"]["user"]["username"],
        "system:serviceaccount:tenant-a:robot"
    );
    let answer = review(admin.clone(), "forged".into())
        .await
        .expect("review");
    assert_eq!(answer["status"]["authenticated"], false);
    // Creating TokenReviews needs system:auth-delegator (or similar).
    let robot = c.client_with_token(&token).expect("client");
    let status = api_error(review(robot.clone(), token.clone()).await);
    assert_eq!(
        status.message,
        r#"tokenreviews.authentication.k8s.io is forbidden: User "system:serviceaccount:tenant-a:robot" cannot create resource "tokenreviews" in API group "authentication.k8s.io" at the cluster scope"#
    );
    let delegator = json!({
        "metadata": {"name": "robot-delegator"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:auth-delegator"},
        "subjects": [{"kind": "ServiceAccount", "name": "robot", "namespace": "tenant-a"}],
    });
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(&PostParams::default(), &object(delegator))
        .await
        .expect("binding");
    let answer = review(robot, token).await.expect("allowed now");
    assert_eq!(answer["status"]["authenticated"], true);
    c.shutdown().await;
}
