//! Table tests of the persistent-volume controller's decisions and of DefaultStorageClass.

use serde_json::{Value, json};

use super::*;

fn claim(name: &str, class: &str, extra: Value) -> Arc<PersistentVolumeClaim> {
    let mut obj = json!({
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"),
            "resourceVersion": "7"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": class,
            "resources": {"requests": {"storage": "1Gi"}}},
        "status": {"phase": "Pending"},
    });
    json_patch::merge(&mut obj, &extra);
    Arc::new(serde_json::from_value(obj).expect("claim"))
}

fn volume(name: &str, capacity: &str, extra: Value) -> Arc<PersistentVolume> {
    let mut obj = json!({"metadata": {"name": name}, "spec": {
        "capacity": {"storage": capacity}, "accessModes": ["ReadWriteOnce"],
        "storageClassName": "manual", "persistentVolumeReclaimPolicy": "Retain",
        "hostPath": {"path": "/data"}},
        "status": {"phase": "Available"}});
    json_patch::merge(&mut obj, &extra);
    Arc::new(serde_json::from_value(obj).expect("volume"))
}

fn class(name: &str, mode: &str, provisioner: &str) -> Arc<StorageClass> {
    Arc::new(
        serde_json::from_value(
            json!({"metadata": {"name": name}, "provisioner": provisioner,
            "volumeBindingMode": mode, "reclaimPolicy": "Delete"}),
        )
        .expect("class"),
    )
}

fn node(name: &str, hostname: &str) -> Arc<Node> {
    Arc::new(
        serde_json::from_value(
            json!({"metadata": {"name": name, "labels": {HOSTNAME_LABEL: hostname}}}),
        )
        .expect("node"),
    )
}

fn classes() -> Vec<Arc<StorageClass>> {
    vec![
        Arc::new(default_storage_class()),
        class("fast", "Immediate", HOST_PATH_PROVISIONER),
        class("remote", "WaitForFirstConsumer", "example.com/remote"),
        class("manual", "Immediate", NO_PROVISIONER),
    ]
}

fn plan_of(
    claims: &[Arc<PersistentVolumeClaim>],
    volumes: &[Arc<PersistentVolume>],
) -> Vec<Action> {
    let nodes = [node("n1", "host-1")];
    plan(&View {
        claims,
        volumes,
        classes: &classes(),
        nodes: &nodes,
        volumes_dir: Path::new("/vols"),
    })
}

fn reasons(actions: &[Action]) -> Vec<&'static str> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Event { reason, .. } => Some(*reason),
            _ => None,
        })
        .collect()
}

#[test]
fn a_volume_pre_bound_by_name_binds_both_sides() {
    let data = claim("data", "remote", json!({}));
    let pv = volume(
        "pv-1",
        "2Gi",
        json!({"spec": {"storageClassName": "remote",
            "claimRef": {"namespace": "default", "name": "data"}}}),
    );
    let actions = plan_of(&[data], std::slice::from_ref(&pv));
    let Action::ClaimRef {
        claim_ref,
        by_controller,
        ..
    } = &actions[0]
    else {
        panic!("{actions:?}")
    };
    assert_eq!(claim_ref.uid.as_deref(), Some("uid-data"));
    assert!(by_controller, "the reference lacked the uid");
    assert_eq!(
        actions[1..],
        [
            Action::VolumePhase {
                volume: "pv-1".into(),
                phase: "Bound"
            },
            Action::VolumeName {
                namespace: "default".into(),
                claim: "data".into(),
                volume: "pv-1".into(),
                by_controller: true,
            },
            Action::ClaimStatus {
                namespace: "default".into(),
                claim: "data".into(),
                phase: "Bound",
                volume: Some(pv),
            },
        ]
    );

    // Once both sides are written, nothing is left to do.
    let bound = claim(
        "data",
        "remote",
        json!({"spec": {"volumeName": "pv-1"},
            "metadata": {"annotations": {ANN_BIND_COMPLETED: "yes"}},
            "status": {"phase": "Bound", "capacity": {"storage": "2Gi"},
                "accessModes": ["ReadWriteOnce"]}}),
    );
    let done = volume(
        "pv-1",
        "2Gi",
        json!({"spec": {"storageClassName": "remote",
            "claimRef": {"namespace": "default", "name": "data", "uid": "uid-data"}},
            "status": {"phase": "Bound"}}),
    );
    assert_eq!(plan_of(&[bound], &[done]), []);
}

#[test]
fn a_reference_to_another_claim_uid_releases_the_volume() {
    let data = claim("data", "remote", json!({}));
    let stale = volume(
        "pv-1",
        "1Gi",
        json!({"spec": {"claimRef": {"namespace": "default", "name": "data", "uid": "old"}}}),
    );
    let actions = plan_of(&[data], &[stale]);
    assert!(actions.contains(&Action::VolumePhase {
        volume: "pv-1".into(),
        phase: "Released"
    }));
    assert!(
        !actions
            .iter()
            .any(|a| matches!(a, Action::Delete { .. } | Action::ClaimRef { .. })),
        "a Retain volume stays, and a released one is not matched again: {actions:?}"
    );
}

#[test]
fn wait_for_first_consumer_provisions_on_the_selected_node() {
    let waiting = claim("data", "standard", json!({}));
    let actions = plan_of(&[waiting], &[]);
    assert_eq!(reasons(&actions), ["WaitForFirstConsumer"]);
    assert!(!actions.iter().any(|a| matches!(a, Action::Provision(_))));

    let selected = claim(
        "data",
        "standard",
        json!({"metadata": {"annotations": {ANN_SELECTED_NODE: "n1"}}}),
    );
    let actions = plan_of(&[selected], &[]);
    assert!(actions.contains(&Action::Provisioner {
        namespace: "default".into(),
        claim: "data".into(),
        provisioner: HOST_PATH_PROVISIONER.into(),
    }));
    assert_eq!(reasons(&actions), ["ProvisioningSucceeded"]);
    let Some(Action::Provision(pv)) = actions.iter().find(|a| matches!(a, Action::Provision(_)))
    else {
        panic!("{actions:?}")
    };
    let pv = serde_json::to_value(pv).expect("json");
    assert_eq!(pv["metadata"]["name"], "pvc-uid-data");
    assert_eq!(
        pv["metadata"]["annotations"][ANN_PROVISIONED_BY],
        HOST_PATH_PROVISIONER
    );
    assert_eq!(pv["spec"]["capacity"]["storage"], "1Gi");
    assert_eq!(pv["spec"]["persistentVolumeReclaimPolicy"], "Delete");
    assert_eq!(pv["spec"]["storageClassName"], "standard");
    assert_eq!(pv["spec"]["claimRef"]["uid"], "uid-data");
    assert_eq!(
        pv["spec"]["hostPath"]["path"],
        "/vols/pvc-uid-data_default_data"
    );
    assert_eq!(
        pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"][0],
        json!({"key": HOSTNAME_LABEL, "operator": "In", "values": ["host-1"]}),
        "pinned by the node's hostname label"
    );
}

#[test]
fn immediate_classes_provision_at_once_and_external_ones_are_handed_over() {
    let fast = claim("fast", "fast", json!({}));
    let actions = plan_of(&[fast], &[]);
    let Some(Action::Provision(pv)) = actions.iter().find(|a| matches!(a, Action::Provision(_)))
    else {
        panic!("{actions:?}")
    };
    assert!(
        pv.spec
            .as_ref()
            .and_then(|s| s.node_affinity.as_ref())
            .is_none(),
        "no node chosen, no pinning"
    );

    let remote = claim(
        "remote",
        "remote",
        json!({"metadata": {"annotations": {ANN_SELECTED_NODE: "n1"}}}),
    );
    let actions = plan_of(&[remote], &[]);
    assert!(actions.contains(&Action::Provisioner {
        namespace: "default".into(),
        claim: "remote".into(),
        provisioner: "example.com/remote".into(),
    }));
    assert_eq!(reasons(&actions), ["ExternalProvisioning"]);
    assert!(!actions.iter().any(|a| matches!(a, Action::Provision(_))));

    let missing = claim("lost", "nope", json!({}));
    assert_eq!(reasons(&plan_of(&[missing], &[])), ["ProvisioningFailed"]);
    let classless = claim("none", "", json!({}));
    assert_eq!(reasons(&plan_of(&[classless], &[])), ["FailedBinding"]);
}

#[test]
fn an_unbound_claim_takes_the_smallest_available_volume_that_fits() {
    let want = claim(
        "want",
        "manual",
        json!({"spec": {"resources": {"requests": {"storage": "3Gi"}}}}),
    );
    let volumes = [
        volume("big", "10Gi", json!({})),
        volume("small", "1Gi", json!({})),
        volume("right", "5Gi", json!({})),
        volume(
            "rwx-only",
            "4Gi",
            json!({"spec": {"accessModes": ["ReadWriteMany"]}}),
        ),
        volume(
            "other-class",
            "3Gi",
            json!({"spec": {"storageClassName": "fast"}}),
        ),
    ];
    let actions = plan_of(&[want], &volumes);
    let picked: Vec<&str> = actions
        .iter()
        .filter_map(|a| match a {
            Action::ClaimRef { volume, .. } => Some(volume.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(picked, ["right"]);
    let none = claim(
        "huge",
        "manual",
        json!({"spec": {"resources": {"requests": {"storage": "1Ti"}}}}),
    );
    assert_eq!(reasons(&plan_of(&[none], &volumes)), ["ProvisioningFailed"]);
}

#[test]
fn released_volumes_are_reclaimed_only_when_provisioned_here_with_delete() {
    let provisioned = |name: &str, by: &str, policy: &str| {
        volume(
            name,
            "1Gi",
            json!({"metadata": {"annotations": {ANN_PROVISIONED_BY: by}},
                "spec": {"persistentVolumeReclaimPolicy": policy,
                    "hostPath": {"path": format!("/vols/{name}")},
                    "claimRef": {"namespace": "default", "name": "gone", "uid": "uid-gone"}},
                "status": {"phase": "Bound"}}),
        )
    };
    let actions = plan_of(
        &[],
        &[
            provisioned("mine", HOST_PATH_PROVISIONER, "Delete"),
            provisioned("kept", HOST_PATH_PROVISIONER, "Retain"),
            provisioned("theirs", "example.com/remote", "Delete"),
        ],
    );
    let released: Vec<&str> = actions
        .iter()
        .filter_map(|a| match a {
            Action::VolumePhase {
                volume,
                phase: "Released",
            } => Some(volume.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(released, ["kept", "mine", "theirs"]);
    let deleted: Vec<(&str, Option<&Path>)> = actions
        .iter()
        .filter_map(|a| match a {
            Action::Delete { volume, dir } => Some((volume.as_str(), dir.as_deref())),
            _ => None,
        })
        .collect();
    assert_eq!(deleted, [("mine", Some(Path::new("/vols/mine")))]);

    // A path outside the volumes directory is never removed, only the object.
    let stray = volume(
        "stray",
        "1Gi",
        json!({"metadata": {"annotations": {ANN_PROVISIONED_BY: HOST_PATH_PROVISIONER}},
            "spec": {"persistentVolumeReclaimPolicy": "Delete", "hostPath": {"path": "/etc"},
                "claimRef": {"namespace": "default", "name": "gone", "uid": "uid-gone"}}}),
    );
    assert!(plan_of(&[], &[stray]).contains(&Action::Delete {
        volume: "stray".into(),
        dir: None
    }));
}

#[test]
fn default_storage_class_admission_fills_only_unnamed_classes() {
    let classes = [
        json!({"metadata": {"name": "old", "creationTimestamp": "2026-01-01T00:00:00Z",
            "annotations": {ANN_DEFAULT_CLASS: "true"}}}),
        json!({"metadata": {"name": "new", "creationTimestamp": "2026-02-01T00:00:00Z",
            "annotations": {ANN_DEFAULT_CLASS_BETA: "true"}}}),
        json!({"metadata": {"name": "plain", "creationTimestamp": "2026-03-01T00:00:00Z"}}),
    ];
    let admitted = |spec: Value| {
        let mut pvc = json!({"metadata": {"name": "c"}, "spec": spec});
        admit_claim(&mut pvc, &classes);
        pvc["spec"]["storageClassName"].clone()
    };
    assert_eq!(admitted(json!({})), "new", "the newest default wins");
    assert_eq!(admitted(json!({"storageClassName": ""})), "");
    assert_eq!(admitted(json!({"storageClassName": "plain"})), "plain");
    let mut no_defaults = json!({"metadata": {"name": "c"}, "spec": {}});
    admit_claim(&mut no_defaults, &classes[2..]);
    assert!(no_defaults["spec"].get("storageClassName").is_none());
    let standard = serde_json::to_value(default_storage_class()).expect("json");
    assert_eq!(
        default_class_name([&standard]).as_deref(),
        Some(DEFAULT_CLASS)
    );
}

fn bound_pair(request: &str, capacity: &str, pv_capacity: &str, provisioner: &str) -> Vec<Action> {
    let data = claim(
        "data",
        "fast",
        json!({"spec": {"volumeName": "pv-1", "resources": {"requests": {"storage": request}}},
            "metadata": {"annotations": {ANN_BIND_COMPLETED: "yes"}},
            "status": {"phase": "Bound", "capacity": {"storage": capacity},
                "accessModes": ["ReadWriteOnce"]}}),
    );
    let pv = volume(
        "pv-1",
        pv_capacity,
        json!({"metadata": {"annotations": {ANN_PROVISIONED_BY: provisioner}},
            "spec": {"storageClassName": "fast",
            "claimRef": {"namespace": "default", "name": "data", "uid": "uid-data"}},
            "status": {"phase": "Bound"}}),
    );
    plan_of(&[data], &[pv])
}

#[test]
fn a_bound_claim_asking_for_more_than_it_has_is_expanded_by_its_provisioner() {
    assert_eq!(
        bound_pair("2Gi", "1Gi", "1Gi", HOST_PATH_PROVISIONER),
        [Action::Expand {
            namespace: "default".into(),
            claim: "data".into(),
            volume: "pv-1".into(),
            size: "2Gi".into(),
            grow_volume: true,
        }]
    );
    // The volume grew but the claim was not told yet: only the claim's side is left.
    assert_eq!(
        bound_pair("2Gi", "1Gi", "2Gi", HOST_PATH_PROVISIONER),
        [Action::Expand {
            namespace: "default".into(),
            claim: "data".into(),
            volume: "pv-1".into(),
            size: "2Gi".into(),
            grow_volume: false,
        }]
    );
    // Done, or the same size in other words: nothing to do.
    assert_eq!(bound_pair("2Gi", "2Gi", "2Gi", HOST_PATH_PROVISIONER), []);
    assert_eq!(
        bound_pair("1024Mi", "1Gi", "1Gi", HOST_PATH_PROVISIONER),
        []
    );
    // Another provisioner's volume is its resizer's, and the binder leaves the claim's
    // capacity alone even where the volume already shows more.
    assert_eq!(bound_pair("2Gi", "1Gi", "2Gi", "example.com/remote"), []);
}

#[test]
fn resize_admission_wants_a_bound_claim_of_a_class_that_allows_expansion() {
    let claim = |request: &str, class: &str, phase: &str| {
        json!({"metadata": {"name": "data"},
            "spec": {"storageClassName": class, "resources": {"requests": {"storage": request}}},
            "status": {"phase": phase}})
    };
    let classes = |name: &str| match name {
        "growing" => Some(json!({"metadata": {"name": name}, "allowVolumeExpansion": true})),
        "fixed" => Some(json!({"metadata": {"name": name}, "allowVolumeExpansion": false})),
        "unsaid" => Some(json!({"metadata": {"name": name}})),
        _ => None,
    };
    let old = claim("1Gi", "growing", "Bound");
    assert_eq!(
        resize_refusal(&old, &claim("2Gi", "growing", "Bound"), classes),
        None
    );
    assert_eq!(
        resize_refusal(&old, &claim("1024Mi", "growing", "Bound"), classes),
        None,
        "no growth"
    );
    let refused = Some(
        "only dynamically provisioned pvc can be resized and the storageclass that provisions the pvc must support resize",
    );
    for class in ["fixed", "unsaid", "gone"] {
        let old = claim("1Gi", class, "Bound");
        assert_eq!(
            resize_refusal(&old, &claim("2Gi", class, "Bound"), classes),
            refused,
            "{class}"
        );
    }
    assert_eq!(
        resize_refusal(&old, &claim("2Gi", "fixed", "Bound"), classes),
        refused,
        "a class change"
    );
    assert_eq!(
        resize_refusal(
            &claim("1Gi", "growing", "Pending"),
            &claim("2Gi", "growing", "Pending"),
            classes
        ),
        Some("Only bound persistent volume claims can be expanded")
    );
}
