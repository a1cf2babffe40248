//! Pods use PersistentVolumeClaims as in a real cluster: a `WaitForFirstConsumer` claim is
//! provisioned on the node the scheduler picks, a file one pod writes is read by the next pod
//! of the claim, `readOnly` holds, and a claim bound to a volume the node cannot mount (csi)
//! holds the container back with a message naming the source (root; skipped with a printed
//! reason only when not root and CI is unset).

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::Api;
use kube::api::{DeleteParams, ListParams, LogParams, PostParams};
use serde_json::{Value, json};
use simkube::controllers::Controllers;
use simkube::controllers::persistent_volumes::default_storage_class;
use simkube_node::images::ImageEntry;
use tether_testkit::{patience, require_root_or_skip};

mod support;
use support::{Fixture, fast_backoff, phase, wait_pod, waiting_reason};

/// A cluster with the scheduler and the persistent-volume controller (provisioning under the
/// fixture's state directory) and the `standard` class; `busybox` runs the host's shell.
fn run<F, Fut>(fixture: &Fixture, body: F)
where
    F: FnOnce(kube::Client, String) -> Fut + Send,
    Fut: std::future::Future<Output = ()>,
{
    let volumes = fixture.state.path().join("volumes");
    fixture.run_with(
        fast_backoff(),
        |cluster| {
            cluster
                .controllers(Controllers {
                    scheduler: true,
                    persistent_volumes: true,
                    ..Controllers::none()
                })
                .volumes_dir(volumes)
        },
        |config| {
            config.images = config.images.clone().with_entry(ImageEntry {
                image: "busybox".into(),
                entrypoint: vec!["/bin/sh".into()],
                cmd: Vec::new(),
            });
        },
        |client, node| async move {
            Api::<StorageClass>::all(client.clone())
                .create(&PostParams::default(), &default_storage_class())
                .await
                .expect("create class");
            body(client, node).await;
        },
    );
}

/// A pod (not bound: the scheduler places it) running `script` with `claim` at `/data`.
fn claim_pod(name: &str, claim: &str, read_only: bool, script: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main", "image": "busybox", "command": ["/bin/sh", "-c", script],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}]
            }],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim, "readOnly": read_only}}]
        }
    }))
    .expect("pod")
}

/// A 1Gi ReadWriteOnce claim; `class` `None` leaves the class to admission.
fn claim(name: &str, class: Option<&str>) -> PersistentVolumeClaim {
    let mut obj = json!({"metadata": {"name": name}, "spec": {
        "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}});
    if let Some(class) = class {
        obj["spec"]["storageClassName"] = Value::from(class);
    }
    serde_json::from_value(obj).expect("claim")
}

async fn log_of(pods: &Api<Pod>, name: &str) -> String {
    pods.logs(name, &LogParams::default())
        .await
        .unwrap_or_default()
}

async fn wait_gone(pods: &Api<Pod>, name: &str) {
    let deadline = Instant::now() + patience(Duration::from_secs(20));
    while pods.get_opt(name).await.expect("get pod").is_some() {
        assert!(Instant::now() < deadline, "pod {name} not deleted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[test]
fn a_provisioned_claim_keeps_its_data_from_one_pod_to_the_next() {
    if !require_root_or_skip() {
        return;
    }
    let fixture = Fixture::new("skn-pvc-data");
    let volumes = fixture.state.path().join("volumes");
    run(&fixture, |client, node| async move {
        let pp = PostParams::default();
        let claims: Api<PersistentVolumeClaim> = Api::default_namespaced(client.clone());
        let pods: Api<Pod> = Api::default_namespaced(client.clone());
        claims
            .create(&pp, &claim("data", None))
            .await
            .expect("claim");
        pods.create(
            &pp,
            &claim_pod(
                "writer",
                "data",
                false,
                "echo kept-across-pods > /data/note && echo wrote",
            ),
        )
        .await
        .expect("writer");
        let done = wait_pod(&pods, "writer", Duration::from_secs(20), "Succeeded", |p| {
            phase(p) == Some("Succeeded")
        })
        .await;
        assert_eq!(
            done.spec.and_then(|s| s.node_name).as_deref(),
            Some(node.as_str())
        );
        assert_eq!(log_of(&pods, "writer").await.trim(), "wrote");
        let bound = claims.get("data").await.expect("claim");
        let pv_name = bound.spec.and_then(|s| s.volume_name).expect("bound claim");
        let pv = Api::<PersistentVolume>::all(client.clone())
            .get(&pv_name)
            .await
            .expect("pv");
        let dir =
            std::path::PathBuf::from(pv.spec.and_then(|s| s.host_path).expect("hostPath").path);
        assert_eq!(dir.parent(), Some(volumes.as_path()));

        pods.delete("writer", &DeleteParams::default())
            .await
            .expect("delete writer");
        wait_gone(&pods, "writer").await;
        assert_eq!(
            std::fs::read_to_string(dir.join("note")).expect("data outlives the pod"),
            "kept-across-pods\n"
        );

        pods.create(
            &pp,
            &claim_pod(
                "reader",
                "data",
                true,
                "cat /data/note; touch /data/other 2>/dev/null || echo read-only",
            ),
        )
        .await
        .expect("reader");
        wait_pod(&pods, "reader", Duration::from_secs(20), "Succeeded", |p| {
            phase(p) == Some("Succeeded")
        })
        .await;
        assert_eq!(
            log_of(&pods, "reader").await,
            "kept-across-pods\nread-only\n"
        );
        assert!(!dir.join("other").exists());
    });
}

#[test]
fn a_claim_on_a_volume_the_node_cannot_mount_names_its_source() {
    if !require_root_or_skip() {
        return;
    }
    let fixture = Fixture::new("skn-pvc-csi");
    run(&fixture, |client, _node| async move {
        let pp = PostParams::default();
        let claims: Api<PersistentVolumeClaim> = Api::default_namespaced(client.clone());
        let pods: Api<Pod> = Api::default_namespaced(client.clone());
        let created = claims
            .create(&pp, &claim("remote", Some("")))
            .await
            .expect("claim");
        let volume: PersistentVolume = serde_json::from_value(json!({
            "metadata": {"name": "remote-1"},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                "storageClassName": "",
                "claimRef": {"namespace": "default", "name": "remote", "uid": created.metadata.uid},
                "csi": {"driver": "example.com/remote", "volumeHandle": "h"}},
        }))
        .expect("volume");
        Api::<PersistentVolume>::all(client.clone())
            .create(&pp, &volume)
            .await
            .expect("volume");
        pods.create(&pp, &claim_pod("app", "remote", false, "echo never"))
            .await
            .expect("pod");
        let pod = wait_pod(
            &pods,
            "app",
            Duration::from_secs(20),
            "CreateContainerConfigError",
            |p| waiting_reason(p).as_deref() == Some("CreateContainerConfigError"),
        )
        .await;
        let message = pod
            .status
            .and_then(|s| s.container_statuses)
            .and_then(|c| c.first()?.state.as_ref()?.waiting.as_ref()?.message.clone())
            .unwrap_or_default();
        assert_eq!(
            message,
            "MountVolume.SetUp failed for volume \"data\" : persistentvolume \"remote-1\" \
             (claim \"remote\") has a csi (driver \"example.com/remote\") source, which \
             simulated nodes cannot mount (supported: hostPath, local)"
        );
        let events = Api::<Event>::default_namespaced(client.clone())
            .list(&ListParams::default())
            .await
            .expect("events");
        assert!(
            events
                .items
                .iter()
                .any(|e| e.reason.as_deref() == Some("FailedMount")
                    && e.message.as_deref() == Some(message.as_str())),
            "a FailedMount event with the message"
        );
    });
}
