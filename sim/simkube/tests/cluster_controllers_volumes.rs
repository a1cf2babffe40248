//! Persistent volumes against a running simkube through the real kube-rs client and kubectl:
//! DefaultStorageClass admission, `WaitForFirstConsumer` provisioning after the scheduler picks
//! a node, pre-bound volumes of an external provisioner, reclaiming released volumes, the
//! scheduler's VolumeBinding messages, and volume expansion (PersistentVolumeClaimResize
//! admission, claim update validation and the host-path provisioner as its own resizer).

mod cluster_controllers_support;
mod support;

use cluster_controllers_support::{condition, create_node, eventually, node, node_of, pod};
use k8s_openapi::api::core::v1::{Event, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use simkube::controllers::Controllers;
use simkube::controllers::persistent_volumes::{
    ANN_BIND_COMPLETED, ANN_BOUND_BY_CONTROLLER, ANN_PROVISIONED_BY, ANN_SELECTED_NODE,
    ANN_STORAGE_PROVISIONER, ANN_STORAGE_PROVISIONER_BETA, HOST_PATH_PROVISIONER, RESIZING,
    default_storage_class,
};
use support::{Kubectl, kubectl_available};

/// A cluster running every controller, provisioning under a directory of its own, with the
/// `standard` class simulated clusters start with.
async fn cluster() -> (simkube::Cluster, Client, tempfile::TempDir) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let volumes = tempfile::tempdir().expect("volumes dir");
    let cluster = simkube::Cluster::builder()
        .controllers(Controllers::all())
        .volumes_dir(volumes.path())
        .start()
        .await
        .expect("start cluster");
    let client = cluster.client();
    create_class(&client, &default_storage_class()).await;
    (cluster, client, volumes)
}

async fn create_class(client: &Client, class: &StorageClass) {
    Api::<StorageClass>::all(client.clone())
        .create(&PostParams::default(), class)
        .await
        .expect("create class");
}

fn class(name: &str, mode: &str, provisioner: &str, reclaim: &str) -> StorageClass {
    serde_json::from_value(
        json!({"metadata": {"name": name}, "provisioner": provisioner,
        "volumeBindingMode": mode, "reclaimPolicy": reclaim}),
    )
    .expect("class")
}

fn claim(name: &str, spec: Value) -> PersistentVolumeClaim {
    let mut obj = json!({"metadata": {"name": name}, "spec": {
        "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}});
    json_patch::merge(&mut obj, &json!({"spec": spec}));
    serde_json::from_value(obj).expect("claim")
}

fn pod_with_claim(name: &str, claim: &str, spec: Value) -> Pod {
    let mut extra =
        json!({"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]});
    json_patch::merge(&mut extra, &spec);
    pod(name, extra)
}

fn annotation(meta: &kube::api::ObjectMeta, key: &str) -> Option<String> {
    meta.annotations.as_ref()?.get(key).cloned()
}

fn claim_phase(claim: &PersistentVolumeClaim) -> Option<String> {
    claim.status.as_ref()?.phase.clone()
}

fn volume_phase(volume: &PersistentVolume) -> Option<String> {
    volume.status.as_ref()?.phase.clone()
}

async fn bound_claim(claims: &Api<PersistentVolumeClaim>, name: &str) -> PersistentVolumeClaim {
    eventually(&format!("claim {name} Bound"), || async {
        let c = claims.get(name).await.ok()?;
        (claim_phase(&c).as_deref() == Some("Bound")).then_some(c)
    })
    .await
}

async fn claim_events(client: &Client, claim: &str) -> Vec<(String, String)> {
    Api::<Event>::namespaced(client.clone(), "default")
        .list(&ListParams::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .filter(|e| e.involved_object.name.as_deref() == Some(claim))
        .map(|e| (e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
        .collect()
}

/// The hostname node affinity a volume is pinned with, if any.
fn pinned_to(volume: &PersistentVolume) -> Option<Vec<String>> {
    let term = volume
        .spec
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required
        .as_ref()?
        .node_selector_terms
        .first()?
        .clone();
    let expr = term.match_expressions?.first()?.clone();
    (expr.key == "kubernetes.io/hostname").then_some(expr.values.unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread")]
async fn claims_get_the_default_class_unless_they_ask_for_none() {
    let (cluster, client, _volumes) = cluster().await;
    let claims: Api<PersistentVolumeClaim> = Api::default_namespaced(client.clone());
    let pp = PostParams::default();
    let plain = claims
        .create(&pp, &claim("plain", json!({})))
        .await
        .expect("create");
    let spec = plain.spec.expect("spec");
    assert_eq!(spec.storage_class_name.as_deref(), Some("standard"));
    assert_eq!(spec.volume_mode.as_deref(), Some("Filesystem"));
    let none = claims
        .create(&pp, &claim("none", json!({"storageClassName": ""})))
        .await
        .expect("create");
    assert_eq!(
        none.spec.and_then(|s| s.storage_class_name).as_deref(),
        Some(""),
        "an empty class asks for none"
    );
    // The class waits for a consumer: the claim stays Pending and says why.
    let waiting = eventually("WaitForFirstConsumer event", || async {
        claim_events(&client, "plain")
            .await
            .into_iter()
            .find(|(reason, _)| reason == "WaitForFirstConsumer")
    })
    .await;
    assert_eq!(
        waiting.1,
        "waiting for first consumer to be created before binding"
    );
    let plain = claims.get("plain").await.expect("get");
    assert_eq!(claim_phase(&plain).as_deref(), Some("Pending"));
    assert!(plain.spec.and_then(|s| s.volume_name).is_none());

    if !kubectl_available() {
        return;
    }
    let k = Kubectl::new(&cluster);
    let manifest = k.file(
        "pvc.yaml",
        "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: from-kubectl\n\
         spec:\n  accessModes: [ReadWriteOnce]\n  resources:\n    requests:\n      storage: 2Gi\n",
    );
    k.ok(&["create", "-f", &manifest]).await;
    let shown = k
        .ok(&[
            "get",
            "pvc",
            "from-kubectl",
            "-o",
            "jsonpath={.spec.storageClassName} {.status.phase}",
        ])
        .await;
    assert_eq!(shown, "standard Pending");
    let classes = k.ok(&["get", "storageclass"]).await;
    assert!(
        classes.contains("standard (default)")
            && classes.contains(HOST_PATH_PROVISIONER)
            && classes.contains("WaitForFirstConsumer"),
        "{classes}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn wait_for_first_consumer_provisions_on_the_chosen_node_and_then_binds_the_pod() {
    let (_cluster, client, volumes) = cluster().await;
    // n1 is tainted: the node the claim follows is still chosen by the usual filters.
    let taint =
        json!({"spec": {"taints": [{"key": "dedicated", "value": "db", "effect": "NoSchedule"}]}});
    create_node(&client, &node("n1", "2", "4Gi", taint)).await;
    create_node(&client, &node("n2", "2", "4Gi", json!({}))).await;
    let claims: Api<PersistentVolumeClaim> = Api::default_namespaced(client.clone());
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let pp = PostParams::default();
    let created = claims
        .create(&pp, &claim("data", json!({})))
        .await
        .expect("claim");
    pods.create(&pp, &pod_with_claim("writer", "data", json!({})))
        .await
        .expect("pod");

    let bound = bound_claim(&claims, "data").await;
    assert_eq!(
        annotation(&bound.metadata, ANN_SELECTED_NODE).as_deref(),
        Some("n2")
    );
    for key in [ANN_STORAGE_PROVISIONER, ANN_STORAGE_PROVISIONER_BETA] {
        assert_eq!(
            annotation(&bound.metadata, key).as_deref(),
            Some(HOST_PATH_PROVISIONER)
        );
    }
    assert_eq!(
        annotation(&bound.metadata, ANN_BIND_COMPLETED).as_deref(),
        Some("yes")
    );
    let uid = created.metadata.uid.expect("uid");
    let pv_name = format!("pvc-{uid}");
    assert_eq!(
        bound.spec.as_ref().and_then(|s| s.volume_name.as_deref()),
        Some(pv_name.as_str())
    );
    let status = bound.status.expect("status");
    assert_eq!(status.capacity.expect("capacity")["storage"].0, "1Gi");
    assert_eq!(status.access_modes, Some(vec!["ReadWriteOnce".to_owned()]));

    let pv = pvs.get(&pv_name).await.expect("provisioned volume");
    assert_eq!(volume_phase(&pv).as_deref(), Some("Bound"));
    assert_eq!(
        annotation(&pv.metadata, ANN_PROVISIONED_BY).as_deref(),
        Some(HOST_PATH_PROVISIONER)
    );
    assert_eq!(pinned_to(&pv), Some(vec!["n2".to_owned()]));
    let spec = pv.spec.clone().expect("spec");
    assert_eq!(
        spec.persistent_volume_reclaim_policy.as_deref(),
        Some("Delete")
    );
    assert_eq!(spec.storage_class_name.as_deref(), Some("standard"));
    let path = spec.host_path.expect("hostPath").path;
    assert_eq!(
        std::path::Path::new(&path).parent(),
        Some(volumes.path()),
        "under the cluster's volumes directory"
    );

    let node = eventually("writer bound", || async {
        node_of(&pods.get("writer").await.ok()?)
    })
    .await;
    assert_eq!(node, "n2");
    let events = claim_events(&client, "data").await;
    assert!(
        events
            .iter()
            .any(|(r, m)| r == "ProvisioningSucceeded" && m.contains(&pv_name)),
        "{events:?}"
    );

    // A second consumer of the bound claim follows the volume's node affinity, even when
    // that node is the tainted one it tolerates and n2 would also fit otherwise.
    let tolerate = json!({"tolerations": [{"key": "dedicated", "operator": "Exists"}]});
    pods.create(&pp, &pod_with_claim("reader", "data", tolerate))
        .await
        .expect("pod");
    let node = eventually("reader bound", || async {
        node_of(&pods.get("reader").await.ok()?)
    })
    .await;
    assert_eq!(node, "n2");
}

#[tokio::test(flavor = "multi_thread")]
async fn pre_bound_volumes_of_an_external_provisioner_bind_their_claims() {
    let (_cluster, client, _volumes) = cluster().await;
    create_node(&client, &node("n1", "2", "4Gi", json!({}))).await;
    create_class(
        &client,
        &class(
            "remote",
            "WaitForFirstConsumer",
            "example.com/remote",
            "Delete",
        ),
    )
    .await;
    let claims: Api<PersistentVolumeClaim> = Api::default_namespaced(client.clone());
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let pp = PostParams::default();
    let created = claims
        .create(&pp, &claim("data", json!({"storageClassName": "remote"})))
        .await
        .expect("claim");
    pods.create(&pp, &pod_with_claim("app", "data", json!({})))
        .await
        .expect("pod");

    // The scheduler picks the node and the controller hands the claim to its provisioner;
    // the pod waits for the volume.
    let handed = eventually("claim handed to its provisioner", || async {
        let c = claims.get("data").await.ok()?;
        annotation(&c.metadata, ANN_STORAGE_PROVISIONER).map(|p| (p, c))
    })
    .await;
    assert_eq!(handed.0, "example.com/remote");
    assert_eq!(
        annotation(&handed.1.metadata, ANN_STORAGE_PROVISIONER_BETA).as_deref(),
        Some("example.com/remote")
    );
    assert_eq!(
        annotation(&handed.1.metadata, ANN_SELECTED_NODE).as_deref(),
        Some("n1")
    );
    let events = eventually("ExternalProvisioning event", || async {
        let e = claim_events(&client, "data").await;
        e.iter()
            .any(|(r, _)| r == "ExternalProvisioning")
            .then_some(e)
    })
    .await;
    assert!(
        events
            .iter()
            .any(|(_, m)| m.contains("external provisioner 'example.com/remote'")),
        "{events:?}"
    );
    assert!(node_of(&pods.get("app").await.expect("pod")).is_none());
    assert!(
        pvs.list(&ListParams::default())
            .await
            .expect("pvs")
            .items
            .is_empty(),
        "nothing provisions for another provisioner"
    );

    // The external provisioner's volume, pre-bound to the claim by uid.
    let uid = created.metadata.uid.clone().expect("uid");
    let volume: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": "remote-data", "annotations": {ANN_PROVISIONED_BY: "example.com/remote"}},
        "spec": {
            "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
            "storageClassName": "remote", "persistentVolumeReclaimPolicy": "Delete",
            "claimRef": {"namespace": "default", "name": "data", "uid": uid},
            "csi": {"driver": "example.com/remote", "volumeHandle": "far/away"},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1"]}]}]}},
        },
    }))
    .expect("volume");
    pvs.create(&pp, &volume).await.expect("create volume");
    let bound = bound_claim(&claims, "data").await;
    assert_eq!(
        bound.spec.as_ref().and_then(|s| s.volume_name.as_deref()),
        Some("remote-data")
    );
    assert_eq!(
        annotation(&bound.metadata, ANN_BOUND_BY_CONTROLLER).as_deref(),
        Some("yes"),
        "the controller named the volume in the claim"
    );
    let pv = eventually("volume Bound", || async {
        let v = pvs.get("remote-data").await.ok()?;
        (volume_phase(&v).as_deref() == Some("Bound")).then_some(v)
    })
    .await;
    assert_eq!(
        annotation(&pv.metadata, ANN_BOUND_BY_CONTROLLER),
        None,
        "the claim reference was complete"
    );
    let node = eventually("pod bound once its claim is", || async {
        node_of(&pods.get("app").await.ok()?)
    })
    .await;
    assert_eq!(node, "n1");

    // A volume pre-bound by name only (no uid) gets the uid and the controller's mark.
    create_class(
        &client,
        &class(
            "manual",
            "Immediate",
            "kubernetes.io/no-provisioner",
            "Retain",
        ),
    )
    .await;
    let manual: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": "manual-1"},
        "spec": {"capacity": {"storage": "5Gi"}, "accessModes": ["ReadWriteOnce"],
            "storageClassName": "manual", "hostPath": {"path": "/srv/manual"},
            "claimRef": {"namespace": "default", "name": "logs"}},
    }))
    .expect("volume");
    pvs.create(&pp, &manual).await.expect("create volume");
    let logs = claims
        .create(&pp, &claim("logs", json!({"storageClassName": "manual"})))
        .await
        .expect("claim");
    let bound = bound_claim(&claims, "logs").await;
    assert_eq!(
        bound.status.and_then(|s| s.capacity).expect("capacity")["storage"].0,
        "5Gi",
        "the claim reports the volume's capacity"
    );
    let pv = eventually("manual volume Bound", || async {
        let v = pvs.get("manual-1").await.ok()?;
        (volume_phase(&v).as_deref() == Some("Bound")).then_some(v)
    })
    .await;
    assert_eq!(
        annotation(&pv.metadata, ANN_BOUND_BY_CONTROLLER).as_deref(),
        Some("yes")
    );
    assert_eq!(
        pv.spec.and_then(|s| s.claim_ref).and_then(|r| r.uid),
        logs.metadata.uid
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn released_volumes_are_deleted_or_kept_as_their_reclaim_policy_and_provisioner_say() {
    let (_cluster, client, volumes) = cluster().await;
    create_class(
        &client,
        &class("fast", "Immediate", HOST_PATH_PROVISIONER, "Delete"),
    )
    .await;
    create_class(
        &client,
        &class("keep", "Immediate", HOST_PATH_PROVISIONER, "Retain"),
    )
    .await;
    let claims: Api<PersistentVolumeClaim> = Api::default_namespaced(client.clone());
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let pp = PostParams::default();
    for (name, class) in [("scratch", "fast"), ("precious", "keep")] {
        claims
            .create(&pp, &claim(name, json!({"storageClassName": class})))
            .await
            .expect("claim");
    }
    // Immediate classes provision without a consumer, and without pinning to a node.
    let scratch = bound_claim(&claims, "scratch").await;
    let precious = bound_claim(&claims, "precious").await;
    let volume_of = |c: &PersistentVolumeClaim| {
        c.spec
            .as_ref()
            .and_then(|s| s.volume_name.clone())
            .expect("volume")
    };
    let (scratch_pv, precious_pv) = (volume_of(&scratch), volume_of(&precious));
    let pv = pvs.get(&scratch_pv).await.expect("pv");
    assert_eq!(pinned_to(&pv), None);
    // The node agent creates the directories when a pod mounts them; stand in for it.
    let dir_of = |pv: &PersistentVolume| {
        std::path::PathBuf::from(
            pv.spec
                .clone()
                .and_then(|s| s.host_path)
                .expect("hostPath")
                .path,
        )
    };
    let scratch_dir = dir_of(&pv);
    let precious_dir = dir_of(&pvs.get(&precious_pv).await.expect("pv"));
    for dir in [&scratch_dir, &precious_dir] {
        std::fs::create_dir_all(dir).expect("volume dir");
        std::fs::write(dir.join("file"), b"data").expect("data");
    }

    for name in ["scratch", "precious"] {
        claims
            .delete(name, &DeleteParams::default())
            .await
            .expect("delete claim");
    }
    eventually("the Delete volume is gone", || async {
        pvs.get_opt(&scratch_pv)
            .await
            .expect("get")
            .is_none()
            .then_some(())
    })
    .await;
    assert!(!scratch_dir.exists(), "its directory went with it");
    let kept = eventually("the Retain volume Released", || async {
        let v = pvs.get(&precious_pv).await.ok()?;
        (volume_phase(&v).as_deref() == Some("Released")).then_some(v)
    })
    .await;
    assert!(precious_dir.join("file").exists(), "retained data stays");
    assert!(volumes.path().exists());
    assert!(kept.spec.and_then(|s| s.claim_ref).is_some());

    // Another provisioner's volume is left to it once Released.
    let theirs: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": "theirs", "annotations": {ANN_PROVISIONED_BY: "example.com/remote"}},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Delete", "csi": {"driver": "example.com/remote", "volumeHandle": "h"},
            "claimRef": {"namespace": "default", "name": "gone", "uid": "no-such-uid"}},
    }))
    .expect("volume");
    pvs.create(&pp, &theirs).await.expect("create");
    eventually("their volume Released", || async {
        let v = pvs.get("theirs").await.ok()?;
        (volume_phase(&v).as_deref() == Some("Released")).then_some(())
    })
    .await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(
        pvs.get_opt("theirs").await.expect("get").is_some(),
        "left to its provisioner"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn pods_whose_claims_no_node_can_serve_are_unschedulable_with_the_real_messages() {
    let (_cluster, client, _volumes) = cluster().await;
    create_node(&client, &node("n1", "2", "4Gi", json!({}))).await;
    create_class(
        &client,
        &class(
            "manual",
            "Immediate",
            "kubernetes.io/no-provisioner",
            "Retain",
        ),
    )
    .await;
    let claims: Api<PersistentVolumeClaim> = Api::default_namespaced(client.clone());
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let pp = PostParams::default();
    let unschedulable = |name: &'static str| {
        let pods = pods.clone();
        async move {
            eventually(&format!("{name} unschedulable"), || async {
                let (status, reason, message) =
                    condition(&pods.get(name).await.ok()?, "PodScheduled")?;
                (status == "False").then_some((reason, message))
            })
            .await
        }
    };
    let tail = "preemption: 0/1 nodes are available: 1 Preemption is not helpful for scheduling.";

    pods.create(&pp, &pod_with_claim("orphan", "absent", json!({})))
        .await
        .expect("pod");
    let (reason, message) = unschedulable("orphan").await;
    assert_eq!(reason, "Unschedulable");
    assert_eq!(
        message,
        format!("0/1 nodes are available: persistentvolumeclaim \"absent\" not found. {tail}")
    );

    claims
        .create(&pp, &claim("static", json!({"storageClassName": "manual"})))
        .await
        .expect("claim");
    pods.create(&pp, &pod_with_claim("waiting", "static", json!({})))
        .await
        .expect("pod");
    let (_, message) = unschedulable("waiting").await;
    assert_eq!(
        message,
        format!(
            "0/1 nodes are available: pod has unbound immediate PersistentVolumeClaims. {tail}"
        )
    );

    // A volume pinned to a node that does not exist: the claim binds, no node fits.
    let pinned: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": "elsewhere"},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
            "storageClassName": "manual", "local": {"path": "/mnt/disk"},
            "claimRef": {"namespace": "default", "name": "static"},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": ["n9"]}]}]}}},
    }))
    .expect("volume");
    pvs.create(&pp, &pinned).await.expect("volume");
    bound_claim(&claims, "static").await;
    let message = eventually("affinity conflict", || async {
        let (_, _, message) = condition(&pods.get("waiting").await.ok()?, "PodScheduled")?;
        message.contains("volume node affinity").then_some(message)
    })
    .await;
    assert_eq!(
        message,
        "0/1 nodes are available: 1 node(s) had volume node affinity conflict. \
         preemption: 0/1 nodes are available: 1 Preemption is not helpful for scheduling."
    );

    // The missing claim appears (a WaitForFirstConsumer one): the orphan is scheduled.
    claims
        .create(&pp, &claim("absent", json!({})))
        .await
        .expect("claim");
    let node = eventually("orphan bound", || async {
        node_of(&pods.get("orphan").await.ok()?)
    })
    .await;
    assert_eq!(node, "n1");
    assert_eq!(
        bound_claim(&claims, "absent")
            .await
            .spec
            .and_then(|s| s.storage_class_name),
        Some("standard".into())
    );
    assert!(node_of(&pods.get("waiting").await.expect("pod")).is_none());
}

fn expandable(name: &str) -> StorageClass {
    let mut c = class(name, "Immediate", HOST_PATH_PROVISIONER, "Delete");
    c.allow_volume_expansion = Some(true);
    c
}

/// Asks for `size` of storage in `claim` with a merge patch, as `kubectl patch` sends it.
async fn request(
    claims: &Api<PersistentVolumeClaim>,
    claim: &str,
    size: &str,
) -> Result<PersistentVolumeClaim, kube::Error> {
    let patch = json!({"spec": {"resources": {"requests": {"storage": size}}}});
    claims
        .patch(claim, &PatchParams::default(), &Patch::Merge(&patch))
        .await
}

fn refusal(result: Result<PersistentVolumeClaim, kube::Error>) -> (u16, String, String) {
    match result {
        Err(kube::Error::Api(status)) => (status.code, status.reason, status.message),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

fn capacity(claim: &PersistentVolumeClaim) -> Option<String> {
    Some(
        claim
            .status
            .as_ref()?
            .capacity
            .as_ref()?
            .get("storage")?
            .0
            .clone(),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn bound_claims_of_an_expandable_class_grow_through_the_host_path_resizer() {
    let (cluster, client, _volumes) = cluster().await;
    create_class(&client, &expandable("growing")).await;
    let claims: Api<PersistentVolumeClaim> = Api::default_namespaced(client.clone());
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    claims
        .create(
            &PostParams::default(),
            &claim("grow", json!({"storageClassName": "growing"})),
        )
        .await
        .expect("claim");
    let bound = bound_claim(&claims, "grow").await;
    assert_eq!(capacity(&bound).as_deref(), Some("1Gi"));
    let pv = bound.spec.and_then(|s| s.volume_name).expect("volume");

    request(&claims, "grow", "2Gi").await.expect("grow");
    let grown = eventually("claim capacity 2Gi", || async {
        let c = claims.get("grow").await.ok()?;
        (capacity(&c).as_deref() == Some("2Gi")).then_some(c)
    })
    .await;
    let status = grown.status.expect("status");
    assert_eq!(
        status
            .allocated_resources
            .as_ref()
            .and_then(|r| r.get("storage"))
            .map(|q| q.0.as_str()),
        Some("2Gi")
    );
    assert!(
        status
            .conditions
            .iter()
            .flatten()
            .all(|c| c.type_ != RESIZING),
        "no Resizing condition once done: {:?}",
        status.conditions
    );
    assert!(
        status
            .allocated_resource_statuses
            .as_ref()
            .is_none_or(|s| !s.contains_key("storage")),
        "{:?}",
        status.allocated_resource_statuses
    );
    let volume = pvs.get(&pv).await.expect("pv");
    assert_eq!(
        volume
            .spec
            .and_then(|s| s.capacity)
            .and_then(|c| c.get("storage").cloned())
            .map(|q| q.0)
            .as_deref(),
        Some("2Gi")
    );
    let events = eventually("the resizer's events", || async {
        let events = claim_events(&client, "grow").await;
        events
            .iter()
            .any(|(r, _)| r == "VolumeResizeSuccessful")
            .then_some(events)
    })
    .await;
    assert!(
        events.contains(&(
            "Resizing".to_owned(),
            format!("External resizer is resizing volume {pv}")
        )),
        "{events:?}"
    );
    assert!(
        events.contains(&(
            "VolumeResizeSuccessful".to_owned(),
            "Resize volume succeeded".to_owned()
        )),
        "{events:?}"
    );

    if !kubectl_available() {
        return;
    }
    let k = Kubectl::new(&cluster);
    k.ok(&[
        "patch",
        "pvc",
        "grow",
        "-p",
        r#"{"spec":{"resources":{"requests":{"storage":"3Gi"}}}}"#,
    ])
    .await;
    eventually("claim capacity 3Gi through kubectl", || async {
        let c = claims.get("grow").await.ok()?;
        (capacity(&c).as_deref() == Some("3Gi")).then_some(())
    })
    .await;
    let shrink = k
        .fails(&[
            "patch",
            "pvc",
            "grow",
            "-p",
            r#"{"spec":{"resources":{"requests":{"storage":"1Gi"}}}}"#,
        ])
        .await;
    assert!(
        shrink.contains(
            r#"The PersistentVolumeClaim "grow" is invalid: spec.resources.requests.storage: Forbidden: field can not be less than status.capacity"#
        ),
        "{shrink}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn resizes_are_refused_as_kube_apiserver_refuses_them() {
    let (_cluster, client, _volumes) = cluster().await;
    create_class(
        &client,
        &class("fixed", "Immediate", HOST_PATH_PROVISIONER, "Delete"),
    )
    .await;
    create_class(&client, &expandable("growing")).await;
    let claims: Api<PersistentVolumeClaim> = Api::default_namespaced(client.clone());
    let pp = PostParams::default();
    for (name, class) in [("fixed", "fixed"), ("grow", "growing")] {
        claims
            .create(&pp, &claim(name, json!({"storageClassName": class})))
            .await
            .expect("claim");
        bound_claim(&claims, name).await;
    }
    // A class without allowVolumeExpansion (like kind's `standard`): PersistentVolumeClaimResize.
    let (code, reason, message) = refusal(request(&claims, "fixed", "2Gi").await);
    assert_eq!((code, reason.as_str()), (403, "Forbidden"));
    assert_eq!(
        message,
        "persistentvolumeclaims \"fixed\" is forbidden: only dynamically provisioned pvc can be \
         resized and the storageclass that provisions the pvc must support resize"
    );
    // Shrinking to (or below) what the volume has is invalid, before admission is asked.
    for claim_name in ["fixed", "grow"] {
        let (code, _, message) = refusal(request(&claims, claim_name, "512Mi").await);
        assert_eq!(code, 422, "{message}");
        assert_eq!(
            message,
            format!(
                "PersistentVolumeClaim \"{claim_name}\" is invalid: spec.resources.requests.storage: \
                 Forbidden: field can not be less than status.capacity"
            )
        );
    }
    // The same size in other words is no change.
    request(&claims, "fixed", "1024Mi")
        .await
        .expect("an equal request");
    // The rest of a bound claim's spec stays as it was created.
    let patch = json!({"spec": {"accessModes": ["ReadWriteMany"]}});
    let (code, _, message) = refusal(
        claims
            .patch("grow", &PatchParams::default(), &Patch::Merge(&patch))
            .await,
    );
    assert_eq!(code, 422);
    assert_eq!(
        message,
        "PersistentVolumeClaim \"grow\" is invalid: spec: Forbidden: spec is immutable after \
         creation except resources.requests and volumeAttributesClassName for bound claims"
    );
    // A claim not yet bound cannot change its request at all.
    claims
        .create(&pp, &claim("waiting", json!({})))
        .await
        .expect("claim");
    let (code, _, message) = refusal(request(&claims, "waiting", "2Gi").await);
    assert_eq!(code, 422);
    assert!(
        message.starts_with(
            "PersistentVolumeClaim \"waiting\" is invalid: spec: Forbidden: spec is immutable"
        ),
        "{message}"
    );
    // Nothing refused was written, and nothing was resized.
    let fixed = claims.get("fixed").await.expect("claim");
    assert_eq!(capacity(&fixed).as_deref(), Some("1Gi"));
    assert_eq!(
        fixed
            .spec
            .and_then(|s| s.resources)
            .and_then(|r| r.requests)
            .and_then(|r| r.get("storage").cloned())
            .map(|q| q.0)
            .as_deref(),
        Some("1024Mi")
    );
}
