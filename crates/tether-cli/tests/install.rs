//! `tether install` and `tether uninstall` against in-process simkube clusters: server-side
//! apply in order, a second install that changes nothing, the kept cluster ID, upgrades, the
//! wait and its diagnosis, `--dry-run | kubectl apply -f -` equal to `install`, and uninstall's
//! refusal, `--force` and `--keep-crds`.

mod support;

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, PostParams};
use serde_json::Value;
use simkube::controllers::Controllers;
use support::Sim;
use tether_api::ClusterId;
use tether_api::core::ForeignCluster;
use tether_api::names::{SYSTEM_NAMESPACE, objects};
use tether_cli::manifests::{self, InstallOptions, Manifest};

/// Every object `install` renders for `id`, read back from the cluster.
async fn read_back(client: &kube::Client, id: &str) -> Vec<(String, DynamicObject)> {
    let mut out = Vec::new();
    for m in manifests::render(&InstallOptions::new(ClusterId::new(id).expect("id"))) {
        let ar = api_resource(&m);
        let api: Api<DynamicObject> = match m.namespace() {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
            None => Api::all_with(client.clone(), &ar),
        };
        let obj = api
            .get(m.name())
            .await
            .unwrap_or_else(|e| panic!("{} missing: {e}", m.describe()));
        out.push((m.describe(), obj));
    }
    out
}

fn api_resource(m: &Manifest) -> ApiResource {
    let v = m.to_value();
    let api_version = v["apiVersion"].as_str().expect("apiVersion").to_owned();
    let (group, version) = api_version
        .split_once('/')
        .map_or((String::new(), api_version.clone()), |(g, v)| {
            (g.to_owned(), v.to_owned())
        });
    let kind = m.kind().to_owned();
    let plural = match kind.as_str() {
        "Namespace" => "namespaces",
        "CustomResourceDefinition" => "customresourcedefinitions",
        "ServiceAccount" => "serviceaccounts",
        "ClusterRole" => "clusterroles",
        "ClusterRoleBinding" => "clusterrolebindings",
        "Role" => "roles",
        "RoleBinding" => "rolebindings",
        "ConfigMap" => "configmaps",
        "Deployment" => "deployments",
        "DaemonSet" => "daemonsets",
        "Service" => "services",
        "MutatingWebhookConfiguration" => "mutatingwebhookconfigurations",
        "StorageClass" => "storageclasses",
        other => panic!("unexpected kind {other}"),
    };
    ApiResource {
        group,
        version,
        api_version,
        kind,
        plural: plural.to_owned(),
    }
}

fn resource_versions(objects: &[(String, DynamicObject)]) -> BTreeMap<String, String> {
    objects
        .iter()
        .map(|(d, o)| {
            (
                d.clone(),
                o.metadata.resource_version.clone().unwrap_or_default(),
            )
        })
        .collect()
}

async fn stored_id(client: &kube::Client) -> Option<String> {
    Api::<ConfigMap>::namespaced(client.clone(), SYSTEM_NAMESPACE)
        .get_opt(objects::CLUSTER_ID_CONFIGMAP)
        .await
        .expect("read ConfigMap")
        .and_then(|cm| cm.data?.get(objects::CLUSTER_ID_KEY).cloned())
}

async fn controller_image(client: &kube::Client) -> String {
    let d = Api::<Deployment>::namespaced(client.clone(), SYSTEM_NAMESPACE)
        .get(objects::CONTROLLER)
        .await
        .expect("Deployment");
    d.spec.expect("spec").template.spec.expect("pod").containers[0]
        .image
        .clone()
        .expect("image")
}

#[tokio::test]
async fn a_second_install_changes_nothing_and_an_upgrade_keeps_the_identity() {
    let sim = Sim::start("install-idem").await;
    let client = sim.client();

    let first = sim.tether(&["install", "--no-wait"]).await;
    first.assert_code(0);
    let id = stored_id(&client)
        .await
        .expect("a generated cluster ID is stored");
    assert!(id.starts_with("cluster-"), "{id}");
    assert!(
        first
            .stderr
            .contains(&format!("cluster ID {id} (generated")),
        "{}",
        first.stderr
    );
    for phase in [
        "tether-system",
        "11 CRDs",
        "CRDs Established",
        "RBAC",
        "Deployment",
        "Service",
    ] {
        assert!(
            first.stderr.contains(phase),
            "no {phase:?} phase in:\n{}",
            first.stderr
        );
    }
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let fc = crds
        .get("foreignclusters.core.tether.dev")
        .await
        .expect("CRD");
    assert!(
        fc.status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True")
    );
    let before = resource_versions(&read_back(&client, &id).await);

    let second = sim.tether(&["install", "--no-wait"]).await;
    second.assert_code(0);
    assert!(
        second.stderr.contains("kept from the existing install"),
        "{}",
        second.stderr
    );
    assert!(
        !second.stderr.contains("created or changed"),
        "{}",
        second.stderr
    );
    let after = resource_versions(&read_back(&client, &id).await);
    assert_eq!(
        before, after,
        "a second identical install must not write anything"
    );

    // The same ID again is fine; another one is refused, naming both.
    sim.tether(&["install", "--no-wait", "--cluster-id", &id])
        .await
        .assert_code(0);
    let other = sim
        .tether(&["install", "--no-wait", "--cluster-id", "other-1"])
        .await;
    other.assert_fails(2, &[&format!("{id:?}"), "\"other-1\"", "tether uninstall"]);
    assert_eq!(stored_id(&client).await.as_deref(), Some(id.as_str()));

    // An upgrade changes the image in place and keeps the cluster ID.
    let upgrade = sim
        .tether(&[
            "install",
            "--no-wait",
            "--image",
            "ghcr.io/tether-dev/tetherd:v9.9.9",
        ])
        .await;
    upgrade.assert_code(0);
    assert!(
        upgrade
            .stderr
            .contains("Deployment tether-system/tether-controller (1 created or changed)"),
        "{}",
        upgrade.stderr
    );
    assert_eq!(
        controller_image(&client).await,
        "ghcr.io/tether-dev/tetherd:v9.9.9"
    );
    assert_eq!(stored_id(&client).await.as_deref(), Some(id.as_str()));
    // The dry run of an installed cluster renders the stored ID.
    let dry = sim.tether(&["install", "--dry-run"]).await;
    dry.assert_code(0);
    assert!(
        dry.stdout.contains(&format!("clusterID: {id}")),
        "{}",
        dry.stdout
    );
}

/// Only what an object says, not what the server adds or how it was written.
fn comparable(obj: &DynamicObject) -> Value {
    let mut v = serde_json::to_value(obj).expect("json");
    let meta = v["metadata"].as_object_mut().expect("metadata");
    for key in [
        "resourceVersion",
        "uid",
        "creationTimestamp",
        "managedFields",
        "generation",
        "annotations",
    ] {
        meta.remove(key);
    }
    if let Some(o) = v.as_object_mut() {
        o.remove("status");
    }
    // Addresses and ports the server allocates differ between any two clusters.
    if let Some(spec) = v.get_mut("spec").and_then(Value::as_object_mut) {
        spec.remove("clusterIP");
        spec.remove("clusterIPs");
        if let Some(ports) = spec.get_mut("ports").and_then(Value::as_array_mut) {
            for p in ports.iter_mut().filter_map(Value::as_object_mut) {
                p.remove("nodePort");
            }
        }
    }
    // The webhook's CA is made per cluster (by `install`, or by the controller after a
    // `--dry-run | kubectl apply`), so no two clusters share it.
    if let Some(hooks) = v.get_mut("webhooks").and_then(Value::as_array_mut) {
        for h in hooks.iter_mut() {
            if let Some(c) = h.get_mut("clientConfig").and_then(Value::as_object_mut) {
                c.remove("caBundle");
            }
        }
    }
    numbers_as_floats(&mut v);
    v
}

/// `0` and `0.0` are the same schema bound whichever client wrote it.
fn numbers_as_floats(v: &mut Value) {
    match v {
        Value::Number(n) => {
            if let Some(f) = n.as_f64().and_then(serde_json::Number::from_f64) {
                *n = f;
            }
        }
        Value::Array(items) => items.iter_mut().for_each(numbers_as_floats),
        Value::Object(map) => map.values_mut().for_each(numbers_as_floats),
        _ => {}
    }
}

#[tokio::test]
async fn dry_run_piped_to_kubectl_apply_gives_what_install_creates() {
    if !support::kubectl_available() {
        return;
    }
    let via_kubectl = Sim::start("dry-kubectl").await;
    let via_install = Sim::start("dry-install").await;
    for format in ["yaml", "json"] {
        let dry = via_kubectl
            .tether(&[
                "install",
                "--dry-run",
                "-o",
                format,
                "--cluster-id",
                "same-1",
                "--pod-cidr",
                "10.244.0.0/16",
                "--service-cidr",
                "10.96.0.0/12",
            ])
            .await;
        dry.assert_code(0);
        // kubectl validates a `v1 List` against /openapi/v2, which simkube does not serve yet
        // (every real API server does); the YAML stream is validated through OpenAPI v3.
        let args: &[&str] = if format == "json" {
            &["apply", "--validate=false", "-f", "-"]
        } else {
            &["apply", "-f", "-"]
        };
        let applied = via_kubectl.kubectl(args, Some(&dry.stdout)).await;
        assert!(
            applied.status.success(),
            "kubectl apply -f - ({format}) failed: {}{}",
            String::from_utf8_lossy(&applied.stdout),
            String::from_utf8_lossy(&applied.stderr)
        );
        let out = String::from_utf8_lossy(&applied.stdout);
        assert_eq!(out.lines().count(), 39, "{out}");
    }
    // Printing changed nothing in a cluster that was never installed.
    let ns: Api<Namespace> = Api::all(via_install.client());
    assert!(ns.get_opt(SYSTEM_NAMESPACE).await.expect("read").is_none());
    via_install.install("same-1").await;

    let a = read_back(&via_kubectl.client(), "same-1").await;
    let b = read_back(&via_install.client(), "same-1").await;
    for ((name, x), (_, y)) in a.iter().zip(&b) {
        assert_eq!(comparable(x), comparable(y), "{name} differs");
    }
}

#[tokio::test]
async fn install_waits_for_the_controller_and_says_what_to_run_next() {
    let sim = Sim::start("install-wait").await;
    let client = sim.client();
    let helper = {
        let client = client.clone();
        tokio::spawn(async move {
            // Plays the controller: once the Deployment exists, report it available and publish.
            let api: Api<Deployment> = Api::namespaced(client.clone(), SYSTEM_NAMESPACE);
            while api
                .get_opt(objects::CONTROLLER)
                .await
                .ok()
                .flatten()
                .is_none()
            {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            support::mark_deployment_available(&client).await;
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            support::publish_identity(&client, "wait-1").await;
        })
    };
    let run = sim
        .tether(&["install", "--cluster-id", "wait-1", "--timeout", "60s"])
        .await;
    helper.await.expect("helper");
    run.assert_code(0);
    for needle in [
        "cluster ID:          wait-1",
        "authentication URL:  https://wait-1.example:443",
        "tether generate peer-command",
        "tether peer --kubeconfig CONSUMER --remote-kubeconfig PROVIDER",
    ] {
        assert!(
            run.stdout.contains(needle),
            "stdout lacks {needle:?}:\n{}",
            run.stdout
        );
    }
    for needle in [
        "controller available (1/1 replicas available",
        "public identity published",
    ] {
        assert!(
            run.stderr.contains(needle),
            "stderr lacks {needle:?}:\n{}",
            run.stderr
        );
    }
}

#[tokio::test]
async fn a_controller_that_never_becomes_ready_is_explained_and_exits_4() {
    // Deployments roll out to pods, but there is no node to run them.
    let sim = Sim::with_controllers(
        "install-stuck",
        Controllers {
            namespace: true,
            garbage_collector: true,
            workloads: true,
            scheduler: true,
            service_accounts: true,
            ..Controllers::none()
        },
    )
    .await;
    let run = sim
        .tether(&["install", "--cluster-id", "stuck-1", "--timeout", "4s"])
        .await;
    run.assert_fails(
        4,
        &[
            "the controller did not become available within 4s",
            "Pod tether-system/tether-controller-",
            "phase Pending",
            "run `tether install` again",
        ],
    );
    // What was applied stays: a re-run upgrades in place once the cause is fixed.
    assert_eq!(stored_id(&sim.client()).await.as_deref(), Some("stuck-1"));
}

#[tokio::test]
async fn a_controller_that_does_not_publish_its_identity_points_at_the_load_balancer() {
    let sim = Sim::start("install-nolb").await;
    let client = sim.client();
    let helper = {
        let client = client.clone();
        tokio::spawn(async move {
            let api: Api<Deployment> = Api::namespaced(client.clone(), SYSTEM_NAMESPACE);
            while api
                .get_opt(objects::CONTROLLER)
                .await
                .ok()
                .flatten()
                .is_none()
            {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            support::mark_deployment_available(&client).await;
        })
    };
    let run = sim
        .tether(&["install", "--cluster-id", "nolb-1", "--timeout", "3s"])
        .await;
    helper.await.expect("helper");
    run.assert_fails(
        4,
        &["has not published authURL", "--auth-service-type NodePort"],
    );
}

async fn foreign_cluster(client: &kube::Client, name: &str, finalizer: bool) {
    let api: Api<ForeignCluster> = Api::all(client.clone());
    let id = ClusterId::new(name).expect("id");
    let mut fc = tether_cli::peer::foreign_cluster(
        &id,
        "https://198.51.100.7:443",
        &support::fingerprint_of(name),
        &tether_api::peering::PeeringToken::generate(id.clone()),
    );
    if finalizer {
        fc.metadata.finalizers = Some(vec![tether_api::names::finalizers::PEERING.to_owned()]);
    }
    api.create(&PostParams::default(), &fc)
        .await
        .expect("create ForeignCluster");
}

#[tokio::test]
async fn uninstall_refuses_while_peered_and_force_removes_everything() {
    let sim = Sim::start("uninstall").await;
    let client = sim.client();
    sim.install("gone-1").await;
    foreign_cluster(&client, "east-1", true).await;
    let tenant_ns = Namespace {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some("tether-tenant-east-1".to_owned()),
            labels: Some(BTreeMap::from([(
                tether_api::names::labels::TENANT_NAMESPACE.to_owned(),
                "true".to_owned(),
            )])),
            ..Default::default()
        },
        ..Default::default()
    };
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(&PostParams::default(), &tenant_ns)
        .await
        .expect("tenant namespace");
    // A twin namespace holding a consumer's pods goes too; a namespace that only looks like
    // one (not managed by Tether) stays.
    let labelled = |name: &str, managed: bool| {
        let mut l = BTreeMap::from([(
            tether_api::names::labels::ORIGIN_NAMESPACE.to_owned(),
            "shop".to_owned(),
        )]);
        if managed {
            l.insert(
                tether_api::names::labels::MANAGED_BY.to_owned(),
                "tether".to_owned(),
            );
        }
        Namespace {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some(name.to_owned()),
                labels: Some(l),
                ..Default::default()
            },
            ..Default::default()
        }
    };
    for (name, managed) in [("shop-east-1", true), ("lookalike", false)] {
        namespaces
            .create(&PostParams::default(), &labelled(name, managed))
            .await
            .expect("namespace");
    }

    let refused = sim.tether(&["uninstall", "--timeout", "20s"]).await;
    refused.assert_fails(4, &["still peers with east-1", "tether unpeer", "--force"]);
    assert!(
        read_back(&client, "gone-1").await.len() == 38,
        "nothing was removed"
    );

    let forced = sim
        .tether(&["uninstall", "--force", "--timeout", "30s"])
        .await;
    forced.assert_code(0);
    assert!(
        forced.stderr.contains("finalizers removed from 1 objects"),
        "{}",
        forced.stderr
    );
    for m in manifests::render(&InstallOptions::new(ClusterId::new("gone-1").expect("id"))) {
        let ar = api_resource(&m);
        let api: Api<DynamicObject> = match m.namespace() {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
            None => Api::all_with(client.clone(), &ar),
        };
        assert!(
            api.get_opt(m.name()).await.expect("read").is_none(),
            "{} left",
            m.describe()
        );
    }
    assert!(
        namespaces
            .get_opt("tether-tenant-east-1")
            .await
            .expect("read")
            .is_none()
    );
    assert!(
        namespaces
            .get_opt("shop-east-1")
            .await
            .expect("read")
            .is_none_or(|n| n.metadata.deletion_timestamp.is_some())
    );
    assert!(
        namespaces
            .get_opt("lookalike")
            .await
            .expect("read")
            .is_some_and(|n| n.metadata.deletion_timestamp.is_none())
    );
    // Uninstalling what is not there is a no-op.
    sim.tether(&["uninstall", "--timeout", "10s"])
        .await
        .assert_code(0);
}

#[tokio::test]
async fn uninstall_keep_crds_leaves_only_the_crds() {
    let sim = Sim::start("uninstall-keep").await;
    let client = sim.client();
    sim.install("keep-1").await;
    let run = sim
        .tether(&["uninstall", "--keep-crds", "--timeout", "30s"])
        .await;
    run.assert_code(0);
    assert!(run.stdout.contains("the CRDs were kept"), "{}", run.stdout);
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in tether_api::crds::all() {
        let name = crd.metadata.name.expect("name");
        assert!(
            crds.get_opt(&name).await.expect("read").is_some(),
            "{name} removed"
        );
    }
    let ns: Api<Namespace> = Api::all(client.clone());
    assert!(ns.get_opt(SYSTEM_NAMESPACE).await.expect("read").is_none());
}

async fn controller_args(client: &kube::Client) -> Vec<String> {
    Api::<Deployment>::namespaced(client.clone(), SYSTEM_NAMESPACE)
        .get(objects::CONTROLLER)
        .await
        .expect("controller Deployment")
        .spec
        .and_then(|s| s.template.spec)
        .map(|s| s.containers[0].args.clone().unwrap_or_default())
        .unwrap_or_default()
}

#[tokio::test]
async fn the_resource_enforcement_is_kept_until_a_flag_changes_it() {
    let sim = Sim::start("install-enforcement").await;
    let client = sim.client();
    let bad = sim
        .tether(&["install", "--no-wait", "--resource-enforcement", "strict"])
        .await;
    bad.assert_fails(2, &["strict", "none, soft, hard"]);

    sim.tether(&["install", "--no-wait"]).await.assert_code(0);
    assert!(
        controller_args(&client)
            .await
            .contains(&"--resource-enforcement=soft".to_owned())
    );
    sim.tether(&["install", "--no-wait", "--resource-enforcement", "hard"])
        .await
        .assert_code(0);
    assert!(
        controller_args(&client)
            .await
            .contains(&"--resource-enforcement=hard".to_owned())
    );
    // A re-install without the flag keeps what was chosen.
    sim.tether(&["install", "--no-wait"]).await.assert_code(0);
    let args = controller_args(&client).await;
    assert!(
        args.contains(&"--resource-enforcement=hard".to_owned()),
        "{args:?}"
    );
    sim.tether(&["install", "--no-wait", "--resource-enforcement", "none"])
        .await
        .assert_code(0);
    assert!(
        controller_args(&client)
            .await
            .contains(&"--resource-enforcement=none".to_owned())
    );
}
