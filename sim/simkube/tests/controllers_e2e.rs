//! The controller-manager-lite loops against a running simkube, through the real kube-rs client
//! (and kubectl for CSR approval): namespace cleanup, garbage collection, default service
//! accounts and CSR signing.

use std::collections::BTreeMap;
use std::future::Future;
use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Namespace, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ObjectMeta, Patch,
    PatchParams, PostParams, PropagationPolicy,
};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;
use simkube::controllers::Controllers;

mod support;

const WAIT: Duration = Duration::from_secs(20);

/// Polls `check` until it returns `Some`, or fails the test naming `what`.
async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {WAIT:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn cluster(controllers: Controllers) -> (simkube::Cluster, Client) {
    start(controllers, false).await
}

/// With `tls`, the cluster has a CA, which the CSR signer and `kube-root-ca.crt` need.
async fn start(controllers: Controllers, tls: bool) -> (simkube::Cluster, Client) {
    let cluster = simkube::Cluster::builder()
        .controllers(controllers)
        .tls(tls)
        .start()
        .await
        .expect("start cluster");
    let client = cluster.client();
    (cluster, client)
}

async fn create_namespace(client: &Client, name: &str) {
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .expect("create namespace");
}

fn configmap(name: &str, owners: &[&ConfigMap], finalizers: &[&str]) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            owner_references: Some(owners.iter().map(|o| owner_ref(*o, true)).collect()),
            finalizers: Some(finalizers.iter().map(|f| (*f).to_owned()).collect()),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([("k".to_owned(), "v".to_owned())])),
        ..ConfigMap::default()
    }
}

fn owner_ref<K: Resource<DynamicType = ()>>(owner: &K, block: bool) -> OwnerReference {
    let mut r = owner
        .controller_owner_ref(&())
        .expect("owner has name and uid");
    r.controller = None;
    r.block_owner_deletion = Some(block);
    r
}

async fn gone<K>(api: &Api<K>, name: &str) -> Option<()>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.get_opt(name)
        .await
        .expect("get")
        .is_none()
        .then_some(())
}

async fn remove_finalizers<K>(api: &Api<K>, name: &str)
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .expect("remove finalizers");
}

#[tokio::test]
async fn default_service_account_appears_and_is_restored() {
    let (_cluster, client) = cluster(Controllers::all()).await;
    create_namespace(&client, "team-a").await;
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), "team-a");
    let first = eventually("the default ServiceAccount", || async {
        accounts.get_opt("default").await.expect("get")
    })
    .await;
    accounts
        .delete("default", &DeleteParams::default())
        .await
        .expect("delete");
    let again = eventually("the default ServiceAccount to be re-created", || async {
        accounts
            .get_opt("default")
            .await
            .expect("get")
            .filter(|sa| sa.uid() != first.uid())
    })
    .await;
    assert_eq!(again.name_any(), "default");
    // Pre-existing namespaces get one too.
    let kube_system: Api<ServiceAccount> = Api::namespaced(client.clone(), "kube-system");
    eventually("kube-system/default", || async {
        kube_system.get_opt("default").await.expect("get")
    })
    .await;
}

#[tokio::test]
async fn root_ca_configmap_is_published_and_kept_in_sync() {
    let (cluster, client) = start(Controllers::all(), true).await;
    let ca_pem = cluster.ca_pem().expect("TLS cluster has a CA");
    create_namespace(&client, "team-b").await;
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), "team-b");
    let ca_of = |cm: &ConfigMap| cm.data.as_ref().and_then(|d| d.get("ca.crt").cloned());
    let published = eventually("kube-root-ca.crt", || async {
        maps.get_opt("kube-root-ca.crt").await.expect("get")
    })
    .await;
    assert_eq!(ca_of(&published).as_deref(), Some(ca_pem.as_str()));

    // Tampering is undone.
    maps.patch(
        "kube-root-ca.crt",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"ca.crt": "not a CA"}})),
    )
    .await
    .expect("tamper");
    eventually("the CA to be restored", || async {
        let cm = maps.get("kube-root-ca.crt").await.expect("get");
        (ca_of(&cm).as_deref() == Some(ca_pem.as_str())).then_some(())
    })
    .await;

    // Deletion is undone.
    maps.delete("kube-root-ca.crt", &DeleteParams::default())
        .await
        .expect("delete");
    eventually("the ConfigMap to be re-created", || async {
        maps.get_opt("kube-root-ca.crt")
            .await
            .expect("get")
            .filter(|cm| cm.uid() != published.uid())
    })
    .await;
}

#[tokio::test]
async fn kubectl_delete_namespace_waits_until_the_namespace_is_gone() {
    let (cluster, client) = start(Controllers::all(), true).await;
    create_namespace(&client, "scratch").await;
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), "scratch");
    for i in 0..20 {
        maps.create(
            &PostParams::default(),
            &configmap(&format!("cm-{i}"), &[], &[]),
        )
        .await
        .expect("cm");
    }
    // kubectl waits for the namespace to disappear (default --wait=true).
    let Some(out) = kubectl(
        &cluster,
        &["delete", "namespace", "scratch", "--timeout=30s"],
    )
    .await
    else {
        return;
    };
    assert_eq!(out.trim(), "namespace \"scratch\" deleted");
    let namespaces: Api<Namespace> = Api::all(client.clone());
    assert!(namespaces.get_opt("scratch").await.expect("get").is_none());
}

#[tokio::test]
async fn without_the_controller_no_service_account_is_created() {
    let (_cluster, client) = cluster(Controllers::none()).await;
    create_namespace(&client, "quiet").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), "quiet");
    assert!(accounts.get_opt("default").await.expect("get").is_none());
}

async fn create_widget_crd(client: &Client) -> ApiResource {
    let ar = support::crd::install(
        client,
        json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": "widgets.example.com"},
            "spec": {
                "group": "example.com",
                "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
                "scope": "Namespaced",
                "versions": [{
                    "name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}
                }]
            }
        }),
    )
    .await;
    // The type is served once discovery lists it.
    eventually("the Widget type to be served", || async {
        kube::discovery::pinned_kind(
            client,
            &GroupVersionKind::gvk("example.com", "v1", "Widget"),
        )
        .await
        .ok()
    })
    .await;
    ar
}

#[tokio::test]
async fn namespace_deletion_drains_content_and_waits_for_finalizers() {
    let (_cluster, client) = cluster(Controllers::all()).await;
    let widgets_ar = create_widget_crd(&client).await;
    create_namespace(&client, "doomed").await;
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), "doomed");
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "doomed");
    let widgets: Api<DynamicObject> = Api::namespaced_with(client.clone(), "doomed", &widgets_ar);
    maps.create(&PostParams::default(), &configmap("plain", &[], &[]))
        .await
        .expect("cm");
    maps.create(
        &PostParams::default(),
        &configmap("held", &[], &["example.com/hold"]),
    )
    .await
    .expect("held cm");
    let secret: Secret =
        serde_json::from_value(json!({"metadata": {"name": "s"}, "stringData": {"a": "b"}}))
            .expect("secret");
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .expect("secret");
    let widget: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "example.com/v1", "kind": "Widget",
        "metadata": {"name": "w1"}, "spec": {"size": 3}
    }))
    .expect("widget");
    widgets
        .create(&PostParams::default(), &widget)
        .await
        .expect("widget");

    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .delete("doomed", &DeleteParams::default())
        .await
        .expect("delete namespace");

    eventually(
        "the plain ConfigMap, Secret and Widget to be deleted",
        || async {
            (gone(&maps, "plain").await.is_some()
                && gone(&secrets, "s").await.is_some()
                && gone(&widgets, "w1").await.is_some())
            .then_some(())
        },
    )
    .await;
    let ns = eventually("the finalizer to be reported on the namespace", || async {
        let ns = namespaces.get("doomed").await.expect("namespace stays");
        let reported = ns
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| {
                c.iter().any(|c| {
                    c.type_ == "NamespaceFinalizersRemaining"
                        && c.status == "True"
                        && c.message
                            .as_deref()
                            .is_some_and(|m| m.contains("example.com/hold in 1 resource instances"))
                })
            });
        reported.then_some(ns)
    })
    .await;
    assert_eq!(
        ns.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Terminating")
    );
    let conditions = ns.status.and_then(|s| s.conditions).unwrap_or_default();
    let remaining = conditions
        .iter()
        .find(|c| c.type_ == "NamespaceContentRemaining")
        .expect("content condition");
    assert_eq!(remaining.status, "True");
    assert_eq!(
        remaining.message.as_deref(),
        Some("Some resources are remaining: configmaps. has 1 resource instances")
    );
    let held = maps.get("held").await.expect("held stays");
    assert!(held.metadata.deletion_timestamp.is_some());

    remove_finalizers(&maps, "held").await;
    eventually("the namespace to disappear", || gone(&namespaces, "doomed")).await;
}

#[tokio::test]
async fn gc_background_deletes_dependents_transitively() {
    let (_cluster, client) = cluster(Controllers::all()).await;
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let owner = maps
        .create(&PostParams::default(), &configmap("owner", &[], &[]))
        .await
        .expect("owner");
    let child = maps
        .create(&PostParams::default(), &configmap("child", &[&owner], &[]))
        .await
        .expect("child");
    maps.create(
        &PostParams::default(),
        &configmap("grandchild", &[&child], &[]),
    )
    .await
    .expect("grandchild");
    let unrelated = maps
        .create(&PostParams::default(), &configmap("unrelated", &[], &[]))
        .await
        .expect("unrelated");
    // Still owned: nothing happens.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(maps.get_opt("child").await.expect("get").is_some());

    maps.delete("owner", &DeleteParams::default())
        .await
        .expect("delete owner");
    eventually("child and grandchild to be collected", || async {
        (gone(&maps, "child").await.is_some() && gone(&maps, "grandchild").await.is_some())
            .then_some(())
    })
    .await;
    assert_eq!(
        maps.get("unrelated").await.expect("kept").uid(),
        unrelated.uid()
    );
}

#[tokio::test]
async fn gc_foreground_waits_for_blocking_dependents() {
    let (_cluster, client) = cluster(Controllers::all()).await;
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let owner = maps
        .create(&PostParams::default(), &configmap("owner", &[], &[]))
        .await
        .expect("owner");
    maps.create(
        &PostParams::default(),
        &configmap("blocker", &[&owner], &["example.com/hold"]),
    )
    .await
    .expect("blocker");
    maps.delete("owner", &DeleteParams::foreground())
        .await
        .expect("delete owner");

    let blocker = eventually("the blocking dependent to be deleted", || async {
        maps.get_opt("blocker")
            .await
            .expect("get")
            .filter(|b| b.metadata.deletion_timestamp.is_some())
    })
    .await;
    assert!(blocker.finalizers().iter().any(|f| f == "example.com/hold"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let waiting = maps
        .get("owner")
        .await
        .expect("owner waits for its dependent");
    assert!(waiting.metadata.deletion_timestamp.is_some());
    assert!(
        waiting
            .finalizers()
            .iter()
            .any(|f| f == "foregroundDeletion")
    );

    remove_finalizers(&maps, "blocker").await;
    eventually("the owner to go once its dependent is gone", || {
        gone(&maps, "owner")
    })
    .await;
}

#[tokio::test]
async fn gc_orphan_keeps_dependents_without_owner_references() {
    let (_cluster, client) = cluster(Controllers::all()).await;
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let owner = maps
        .create(&PostParams::default(), &configmap("owner", &[], &[]))
        .await
        .expect("owner");
    let dep = maps
        .create(&PostParams::default(), &configmap("dep", &[&owner], &[]))
        .await
        .expect("dep");
    maps.delete(
        "owner",
        &DeleteParams {
            propagation_policy: Some(PropagationPolicy::Orphan),
            ..DeleteParams::default()
        },
    )
    .await
    .expect("delete owner");
    eventually("the owner to be deleted", || gone(&maps, "owner")).await;
    let orphan = maps.get("dep").await.expect("dependent survives");
    assert_eq!(orphan.uid(), dep.uid());
    assert!(
        orphan.owner_references().is_empty(),
        "{:?}",
        orphan.owner_references()
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(maps.get_opt("dep").await.expect("get").is_some());
}

#[tokio::test]
async fn kubectl_cascade_foreground_and_orphan() {
    let (cluster, client) = start(Controllers::all(), true).await;
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    for prefix in ["fg", "or"] {
        let owner = maps
            .create(
                &PostParams::default(),
                &configmap(&format!("{prefix}-owner"), &[], &[]),
            )
            .await
            .expect("owner");
        maps.create(
            &PostParams::default(),
            &configmap(&format!("{prefix}-dep"), &[&owner], &[]),
        )
        .await
        .expect("dependent");
    }
    // kubectl waits for the owner to disappear, which in the foreground happens only after
    // its dependent is gone.
    let Some(out) = kubectl(
        &cluster,
        &[
            "delete",
            "configmap",
            "fg-owner",
            "--cascade=foreground",
            "--timeout=30s",
        ],
    )
    .await
    else {
        return;
    };
    assert_eq!(out.trim(), "configmap \"fg-owner\" deleted");
    assert!(maps.get_opt("fg-dep").await.expect("get").is_none());

    kubectl(
        &cluster,
        &[
            "delete",
            "configmap",
            "or-owner",
            "--cascade=orphan",
            "--timeout=30s",
        ],
    )
    .await
    .expect("kubectl is present");
    let orphan = maps.get("or-dep").await.expect("the orphan stays");
    assert!(orphan.owner_references().is_empty());
}

#[tokio::test]
async fn gc_ignores_cross_namespace_and_stale_uid_owners() {
    let (_cluster, client) = cluster(Controllers::all()).await;
    create_namespace(&client, "a").await;
    create_namespace(&client, "b").await;
    let in_a: Api<ConfigMap> = Api::namespaced(client.clone(), "a");
    let in_b: Api<ConfigMap> = Api::namespaced(client.clone(), "b");
    let owner = in_a
        .create(&PostParams::default(), &configmap("owner", &[], &[]))
        .await
        .expect("owner");
    // Owner references carry no namespace: this one resolves in "b", where the owner is not.
    in_b.create(&PostParams::default(), &configmap("dep", &[&owner], &[]))
        .await
        .expect("cross-namespace dependent");
    eventually("the cross-namespace dependent to be collected", || {
        gone(&in_b, "dep")
    })
    .await;
    assert!(in_a.get_opt("owner").await.expect("get").is_some());
    let events: Api<Event> = Api::namespaced(client.clone(), "b");
    let warning = eventually("the OwnerRefInvalidNamespace warning", || async {
        events
            .list(&Default::default())
            .await
            .expect("events")
            .items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("OwnerRefInvalidNamespace"))
    })
    .await;
    assert_eq!(warning.type_.as_deref(), Some("Warning"));
    assert_eq!(
        warning.message,
        Some(format!(
            "ownerRef [v1/ConfigMap, namespace: b, name: owner, uid: {}] does not exist in \
             namespace \"b\"",
            owner.uid().expect("uid")
        ))
    );
    assert_eq!(warning.involved_object.api_version.as_deref(), Some("v1"));
    assert_eq!(warning.involved_object.name.as_deref(), Some("dep"));

    // Same name, different uid (the owner was re-created): not an owner any more.
    let mut stale = configmap("stale-dep", &[&owner], &[]);
    if let Some(refs) = stale.metadata.owner_references.as_mut() {
        refs[0].uid = "00000000-0000-0000-0000-000000000000".to_owned();
    }
    in_a.create(&PostParams::default(), &stale)
        .await
        .expect("stale dependent");
    eventually("the stale-uid dependent to be collected", || {
        gone(&in_a, "stale-dep")
    })
    .await;

    // A cluster-scoped object naming a namespaced owner kind is never collected.
    let roles: Api<ClusterRole> = Api::all(client.clone());
    let role: ClusterRole = serde_json::from_value(json!({
        "metadata": {"name": "owned-role", "ownerReferences": [owner_ref(&owner, false)]},
        "rules": []
    }))
    .expect("role");
    let role = roles
        .create(&PostParams::default(), &role)
        .await
        .expect("role");
    let default_events: Api<Event> = Api::namespaced(client.clone(), "default");
    eventually("the warning for the cluster-scoped dependent", || async {
        default_events
            .list(&Default::default())
            .await
            .expect("events")
            .items
            .into_iter()
            .find(|e| {
                e.reason.as_deref() == Some("OwnerRefInvalidNamespace")
                    && e.involved_object.name.as_deref() == Some("owned-role")
            })
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        roles.get("owned-role").await.expect("kept").uid(),
        role.uid()
    );
}

#[tokio::test]
async fn gc_cascades_into_custom_resources() {
    let (_cluster, client) = cluster(Controllers::all()).await;
    let ar = create_widget_crd(&client).await;
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let owner = maps
        .create(&PostParams::default(), &configmap("owner", &[], &[]))
        .await
        .expect("owner");
    let widgets: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &ar);
    let widget: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "example.com/v1", "kind": "Widget",
        "metadata": {"name": "w", "ownerReferences": [owner_ref(&owner, true)]},
    }))
    .expect("widget");
    widgets
        .create(&PostParams::default(), &widget)
        .await
        .expect("widget");
    maps.delete("owner", &DeleteParams::default())
        .await
        .expect("delete");
    eventually("the Widget to be collected", || gone(&widgets, "w")).await;
}

fn csr_pem(cn: &str, orgs: &[&str]) -> String {
    let key = rcgen::KeyPair::generate().expect("key");
    let mut params = rcgen::CertificateParams::default();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, cn);
    for o in orgs {
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, *o);
    }
    params
        .serialize_request(&key)
        .expect("csr")
        .pem()
        .expect("pem")
}

fn csr_object(name: &str, pem: &str, usages: &[&str]) -> CertificateSigningRequest {
    serde_json::from_value(json!({
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": {"name": name},
        "spec": {
            "request": base64_encode(pem.as_bytes()),
            "signerName": "kubernetes.io/kube-apiserver-client",
            "expirationSeconds": 3600,
            "usages": usages,
        }
    }))
    .expect("csr object")
}

/// Runs kubectl against `cluster` and returns its stdout (failing on a non-zero exit), or
/// `None` with the reason printed when kubectl is missing outside CI.
async fn kubectl(cluster: &simkube::Cluster, args: &[&str]) -> Option<String> {
    let found = std::process::Command::new("kubectl")
        .args(["version", "--client"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        assert!(
            std::env::var_os("CI").is_none(),
            "kubectl is required in CI but was not found on PATH"
        );
        eprintln!("skipping the kubectl step: kubectl not found on PATH");
        return None;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, cluster.kubeconfig()).expect("kubeconfig");
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .arg("--cache-dir")
            .arg(dir.path().join("cache"))
            .args(&args)
            .output()
            .expect("run kubectl")
    })
    .await
    .expect("join");
    assert!(
        out.status.success(),
        "kubectl failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn base64_encode(data: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(data)
}

async fn approve(client: &Client, name: &str) {
    let api: Api<CertificateSigningRequest> = Api::all(client.clone());
    let mut csr = api.get(name).await.expect("csr");
    let status = csr.status.get_or_insert_with(Default::default);
    status.conditions.get_or_insert_with(Vec::new).push(
        serde_json::from_value(json!({
            "type": "Approved", "status": "True", "reason": "TestApproval",
            "message": "approved by the test"
        }))
        .expect("condition"),
    );
    api.replace_subresource("approval", name, &PostParams::default(), &csr)
        .await
        .expect("approve");
}

#[tokio::test]
async fn csr_signer_does_not_auto_approve_and_refuses_bad_usages() {
    let (_cluster, client) = start(Controllers::all(), true).await;
    let api: Api<CertificateSigningRequest> = Api::all(client.clone());
    let pem = csr_pem("alice", &["devs"]);
    api.create(
        &PostParams::default(),
        &csr_object("pending", &pem, &["client auth"]),
    )
    .await
    .expect("create");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let pending = api.get("pending").await.expect("get");
    assert!(
        pending
            .status
            .as_ref()
            .and_then(|s| s.certificate.as_ref())
            .is_none(),
        "an unapproved CSR must not be signed"
    );

    api.create(
        &PostParams::default(),
        &csr_object("bad", &pem, &["client auth", "server auth"]),
    )
    .await
    .expect("create bad");
    approve(&client, "bad").await;
    let failed = eventually("the Failed condition", || async {
        let csr = api.get("bad").await.expect("get");
        csr.status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.type_ == "Failed")
    })
    .await;
    assert_eq!(failed.reason.as_deref(), Some("SignerValidationFailure"));
    assert_eq!(
        failed.message.as_deref(),
        Some("invalid usage for client certificate: server auth")
    );
}

#[tokio::test]
async fn kubelet_client_signer_checks_the_node_identity() {
    let (_cluster, client) = start(Controllers::all(), true).await;
    let api: Api<CertificateSigningRequest> = Api::all(client.clone());
    let kubelet_csr = |name: &str, pem: &str| {
        let mut csr = csr_object(
            name,
            pem,
            &["digital signature", "key encipherment", "client auth"],
        );
        csr.spec.signer_name = "kubernetes.io/kube-apiserver-client-kubelet".to_owned();
        csr
    };
    let node = csr_pem("system:node:n1", &["system:nodes"]);
    let impostor = csr_pem("system:node:n2", &["admins"]);
    for (name, pem) in [("node-n1", &node), ("impostor", &impostor)] {
        api.create(&PostParams::default(), &kubelet_csr(name, pem))
            .await
            .expect("create");
        approve(&client, name).await;
    }
    eventually("the node's certificate", || async {
        api.get("node-n1")
            .await
            .expect("get")
            .status
            .and_then(|s| s.certificate)
    })
    .await;
    let failed = eventually("the impostor to be refused", || async {
        api.get("impostor")
            .await
            .expect("get")
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.type_ == "Failed")
    })
    .await;
    assert_eq!(
        failed.message.as_deref(),
        Some("subject organization is not system:nodes")
    );
}

/// Approval, signing, kubectl reading the certificate, and the signed certificate authenticating
/// over HTTPS as the CSR's CN with its O values as groups.
#[tokio::test]
async fn csr_flow_end_to_end_signs_and_the_certificate_authenticates() {
    let cluster = simkube::Cluster::builder()
        .controllers(Controllers::all())
        .tls(true)
        .rbac(true)
        .start()
        .await
        .expect("start TLS cluster with RBAC");
    let client = cluster.client();
    let key = rcgen::KeyPair::generate().expect("key");
    let mut params = rcgen::CertificateParams::default();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "carol");
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "auditors");
    let pem = params
        .serialize_request(&key)
        .expect("csr")
        .pem()
        .expect("pem");
    let api: Api<CertificateSigningRequest> = Api::all(client.clone());
    api.create(
        &PostParams::default(),
        &csr_object("carol", &pem, &["digital signature", "client auth"]),
    )
    .await
    .expect("create csr");

    // `kubectl certificate approve` (1.32+) PUTs the `approval` subresource as protobuf; without
    // kubectl (outside CI) the same PUT is made in JSON.
    if kubectl(&cluster, &["certificate", "approve", "carol"])
        .await
        .is_none()
    {
        approve(&client, "carol").await;
    }

    let signed = eventually("the signed certificate", || async {
        api.get("carol")
            .await
            .expect("get")
            .status
            .and_then(|s| s.certificate)
            .filter(|c| !c.0.is_empty())
    })
    .await;
    let cert_pem = String::from_utf8(signed.0).expect("PEM text");
    if let Some(kubectl_output) = kubectl(
        &cluster,
        &[
            "get",
            "csr",
            "carol",
            "-o",
            "jsonpath={.status.certificate}",
        ],
    )
    .await
    {
        assert_eq!(kubectl_output.trim(), base64_encode(cert_pem.as_bytes()));
    }
    let (_, pem) = x509_parser::pem::parse_x509_pem(cert_pem.as_bytes()).expect("pem");
    let cert = pem.parse_x509().expect("x509");
    let lifetime = cert.validity().not_after.timestamp() - cert.validity().not_before.timestamp();
    // One hour as asked, plus the five-minute backdating.
    assert_eq!(lifetime, 3600 + 300);

    let mut config = kube::Config::new(cluster.url().parse().expect("cluster URL"));
    config.root_cert = Some(vec![
        cluster
            .ca()
            .expect("TLS cluster has a CA")
            .ca_der()
            .to_vec(),
    ]);
    config.auth_info = kube::config::AuthInfo {
        client_certificate_data: Some(base64_encode(cert_pem.as_bytes())),
        client_key_data: Some(base64_encode(key.serialize_pem().as_bytes()).into()),
        ..kube::config::AuthInfo::default()
    };
    let carol = Client::try_from(config).expect("client with the signed certificate");
    // RBAC grants the group "auditors" (the certificate's O) reading ConfigMaps only.
    let role: Role = serde_json::from_value(json!({
        "metadata": {"name": "cm-reader", "namespace": "default"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]}]
    }))
    .expect("role");
    Api::<Role>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &role)
        .await
        .expect("role");
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "auditors-read", "namespace": "default"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "cm-reader"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "auditors"}]
    }))
    .expect("binding");
    Api::<RoleBinding>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &binding)
        .await
        .expect("binding");
    let as_carol: Api<ConfigMap> = Api::namespaced(carol.clone(), "default");
    eventually("carol to list ConfigMaps through her group", || async {
        as_carol.list(&Default::default()).await.ok()
    })
    .await;
    let denied = Api::<Secret>::namespaced(carol, "default")
        .list(&Default::default())
        .await
        .expect_err("no access to Secrets");
    let message = match denied {
        kube::Error::Api(status) => {
            assert_eq!(status.code, 403);
            status.message
        }
        other => panic!("expected 403, got {other:?}"),
    };
    assert!(message.contains("User \"carol\""), "{message}");
}

/// kube-controller-manager's `--cluster-signing-duration` caps every certificate the signer
/// issues, whatever `expirationSeconds` asks for.
#[tokio::test]
async fn the_cluster_signing_duration_caps_certificate_lifetimes() {
    let cluster = simkube::Cluster::builder()
        .controllers(Controllers::all())
        .tls(true)
        .cluster_signing_duration(std::time::Duration::from_secs(90))
        .start()
        .await
        .expect("start TLS cluster");
    let client = cluster.client();
    let api: Api<CertificateSigningRequest> = Api::all(client.clone());
    for (name, asked) in [("short", Some(600)), ("default", None)] {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut params = rcgen::CertificateParams::default();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let pem = params
            .serialize_request(&key)
            .expect("csr")
            .pem()
            .expect("pem");
        let mut csr = csr_object(name, &pem, &["digital signature", "client auth"]);
        csr.spec.expiration_seconds = asked;
        api.create(&PostParams::default(), &csr)
            .await
            .expect("create csr");
        approve(&client, name).await;
        let signed = eventually("the signed certificate", || async {
            api.get(name)
                .await
                .expect("get")
                .status
                .and_then(|s| s.certificate)
                .filter(|c| !c.0.is_empty())
        })
        .await;
        let (_, pem) = x509_parser::pem::parse_x509_pem(&signed.0).expect("pem");
        let cert = pem.parse_x509().expect("x509");
        let lifetime =
            cert.validity().not_after.timestamp() - cert.validity().not_before.timestamp();
        // 90 s of signing duration plus the five-minute backdating, for both requests.
        assert_eq!(lifetime, 90 + 300, "{name}");
    }
}
