//! Pods see files as in a real cluster: ConfigMap, Secret, downward-API and projected volumes,
//! updates reaching mounted files, a missing ConfigMap holding the container back, a usable
//! ServiceAccount token, the cluster resolv.conf, and an in-cluster kube-rs client reaching the
//! API over TLS (root; skipped with a printed reason only when not root and CI is unset).

use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Event, Pod, Secret, ServiceAccount};
use kube::Api;
use kube::api::{LogParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use simkube::controllers::Controllers;
use simkube_node::images::ImageEntry;
use tether_testkit::{patience, require_root_or_skip};

mod support;
use support::{Fixture, fast_backoff, wait_pod, waiting_reason};

/// Where the fixture's API server listens, as pods reach it (the node's address).
const API: &str = "198.18.0.10:6443";

/// A cluster with TLS on the node address and the ServiceAccount controller (so `default` and
/// `kube-root-ca.crt` exist), and an agent whose pods resolve through a cluster DNS address
/// and reach the API server there; `busybox` runs the host's shell.
fn run<F, Fut>(fixture: &Fixture, body: F)
where
    F: FnOnce(kube::Client, String) -> Fut + Send,
    Fut: std::future::Future<Output = ()>,
{
    fixture.run_with(
        fast_backoff(),
        |cluster| {
            cluster
                .tls(true)
                .bind(API.parse().expect("addr"))
                .controllers(Controllers {
                    service_accounts: true,
                    ..Controllers::none()
                })
        },
        |config| {
            config.images = config.images.clone().with_entry(ImageEntry {
                image: "busybox".into(),
                entrypoint: vec!["/bin/sh".into()],
                cmd: Vec::new(),
            });
            config.pod_api_host = "198.18.0.10".into();
            config.pod_api_port = 6443;
            config.cluster_dns = vec!["10.96.0.10".parse().expect("ip")];
            config.volume_sync_period = Duration::from_millis(300);
        },
        |client, node| async move {
            wait_for_service_account(&client).await;
            body(client, node).await;
        },
    );
    assert_no_mounts_left(fixture.state.path());
}

async fn wait_for_service_account(client: &kube::Client) {
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let deadline = Instant::now() + patience(Duration::from_secs(10));
    loop {
        let sa = accounts.get_opt("default").await.expect("get sa");
        let ca = cms.get_opt("kube-root-ca.crt").await.expect("get cm");
        if sa.is_some() && ca.is_some() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no default ServiceAccount or kube-root-ca.crt"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Nothing the agent mounted is visible on the host: every bind lived in a container's mount
/// namespace and went with it.
fn assert_no_mounts_left(state: &Path) {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    let state = state.display().to_string();
    assert!(
        !mountinfo.contains(&state) && !mountinfo.contains("/secrets/kubernetes.io"),
        "host mount table mentions a pod mount: {mountinfo}"
    );
}

fn shell_pod(name: &str, node: &str, script: &str, volumes: Value, mounts: Value) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": "files", "tier": "test"}},
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main", "image": "busybox", "command": ["/bin/sh", "-c", script],
                "volumeMounts": mounts
            }],
            "volumes": volumes
        }
    }))
    .expect("pod")
}

async fn create_config_map(client: &kube::Client, name: &str, data: Value) {
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": name}, "data": data})).expect("cm");
    cms.create(&PostParams::default(), &cm)
        .await
        .expect("create configmap");
}

/// Polls the pod's log until it contains every `needle`.
async fn wait_log(pods: &Api<Pod>, name: &str, needles: &[&str]) -> String {
    let deadline = Instant::now() + patience(Duration::from_secs(20));
    loop {
        let log = pods
            .logs(name, &LogParams::default())
            .await
            .unwrap_or_default();
        if needles.iter().all(|n| log.contains(n)) {
            return log;
        }
        assert!(
            Instant::now() < deadline,
            "pod {name}: log lacks one of {needles:?}: {log}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn temp_mount(fixture: &Fixture, leaf: &str) -> String {
    // Mount points in the fixture's state directory: missing ones are created on the host,
    // and this one is removed with the fixture.
    fixture
        .state
        .path()
        .join("mnt")
        .join(leaf)
        .display()
        .to_string()
}

#[test]
fn pod_reads_configmap_secret_downward_and_projected_volumes() {
    if !require_root_or_skip() {
        return;
    }
    let fixture = Fixture::new("skn-vol-files");
    let (cfg, sec, info, proj) = (
        temp_mount(&fixture, "cfg"),
        temp_mount(&fixture, "sec"),
        temp_mount(&fixture, "info"),
        temp_mount(&fixture, "proj"),
    );
    let state = fixture.state.path().to_owned();
    run(&fixture, |client, node| async move {
        create_config_map(
            &client,
            "settings",
            json!({"greeting": "hello-from-cm", "other": "x"}),
        )
        .await;
        let secrets: Api<Secret> = Api::namespaced(client.clone(), "default");
        let secret: Secret = serde_json::from_value(
            json!({"metadata": {"name": "creds"}, "stringData": {"password": "pw-from-secret"}}),
        )
        .expect("secret");
        secrets
            .create(&PostParams::default(), &secret)
            .await
            .expect("create secret");
        let script = format!(
            "echo cm=$(cat {cfg}/hello); echo secret=$(cat {sec}/password); \
             echo name=$(cat {info}/name); echo labels=$(cat {info}/labels | tr '\\n' ','); \
             echo projns=$(cat {proj}/namespace) projcm=$(cat {proj}/greeting); \
             echo mode=$(stat -L -c %a {sec}/password); \
             echo sa-ns=$(cat /var/run/secrets/kubernetes.io/serviceaccount/namespace); \
             touch {cfg}/new 2>/dev/null || echo cm-read-only; sleep 30"
        );
        let pod = shell_pod(
            "files",
            &node,
            &script,
            json!([
                {"name": "cfg", "configMap": {"name": "settings", "items": [{"key": "greeting", "path": "hello"}]}},
                {"name": "sec", "secret": {"secretName": "creds", "defaultMode": 0o400}},
                {"name": "info", "downwardAPI": {"items": [
                    {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}},
                    {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}},
                {"name": "proj", "projected": {"sources": [
                    {"configMap": {"name": "settings", "items": [{"key": "greeting", "path": "greeting"}]}},
                    {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}},
                    {"serviceAccountToken": {"path": "token", "expirationSeconds": 3600}}]}}
            ]),
            json!([
                {"name": "cfg", "mountPath": cfg},
                {"name": "sec", "mountPath": sec},
                {"name": "info", "mountPath": info},
                {"name": "proj", "mountPath": proj}
            ]),
        );
        let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
        let created = pods
            .create(&PostParams::default(), &pod)
            .await
            .expect("create pod");
        let log = wait_log(
            &pods,
            "files",
            &[
                "cm=hello-from-cm",
                "secret=pw-from-secret",
                "name=files",
                "labels=app=\"files\",tier=\"test\"",
                "projns=default projcm=hello-from-cm",
                "mode=400",
                "sa-ns=default",
                "cm-read-only",
            ],
        )
        .await;
        assert!(!log.contains("pw-from-secret\n\n"), "{log}");

        // The projected token authenticates as the pod's ServiceAccount, bound to the pod.
        let uid = created.metadata.uid.clone().expect("uid");
        let volume_dir = state
            .join("pods")
            .join(format!("default_files_{uid}"))
            .join("volumes");
        let token = std::fs::read_to_string(volume_dir.join("proj").join("token"))
            .expect("token on the node");
        let review: Value = client
            .request(
                http::Request::post("/apis/authentication.k8s.io/v1/tokenreviews")
                    .header("content-type", "application/json")
                    .body(
                        serde_json::to_vec(&json!({
                            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                            "spec": {"token": token}
                        }))
                        .expect("body"),
                    )
                    .expect("request"),
            )
            .await
            .expect("token review");
        assert_eq!(review["status"]["authenticated"], true, "{review}");
        assert_eq!(
            review["status"]["user"]["username"],
            "system:serviceaccount:default:default"
        );
        assert_eq!(
            review["status"]["user"]["extra"]["authentication.kubernetes.io/pod-name"],
            json!(["files"])
        );
        // The atomic writer's layout.
        let data = std::fs::read_link(volume_dir.join("cfg").join("..data")).expect("..data");
        assert!(data.to_string_lossy().starts_with(".."), "{data:?}");
        assert_eq!(
            std::fs::read_link(volume_dir.join("cfg").join("hello")).expect("link"),
            Path::new("..data/hello")
        );

        pods.delete("files", &Default::default())
            .await
            .expect("delete");
        let deadline = Instant::now() + patience(Duration::from_secs(15));
        while pods.get_opt("files").await.expect("get").is_some() {
            assert!(Instant::now() < deadline, "pod not deleted");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(!volume_dir.exists(), "volumes removed with the pod");
    });
}

#[test]
fn configmap_updates_reach_mounted_files_and_missing_ones_hold_the_container() {
    if !require_root_or_skip() {
        return;
    }
    let fixture = Fixture::new("skn-vol-update");
    let dir = temp_mount(&fixture, "live");
    let info = temp_mount(&fixture, "info");
    run(&fixture, |client, node| async move {
        let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
        let script = format!(
            "while true; do echo value=$(cat {dir}/key) tier=$(cat {info}/tier); sleep 0.2; done"
        );
        let pod = shell_pod(
            "watcher",
            &node,
            &script,
            json!([
                {"name": "live", "configMap": {"name": "late"}},
                {"name": "info", "downwardAPI": {"items": [
                    {"path": "tier", "fieldRef": {"fieldPath": "metadata.labels['tier']"}}]}}
            ]),
            json!([{"name": "live", "mountPath": dir}, {"name": "info", "mountPath": info}]),
        );
        pods.create(&PostParams::default(), &pod)
            .await
            .expect("create pod");
        // Not there yet: the container waits, with the kubelet's words.
        let waiting = wait_pod(
            &pods,
            "watcher",
            Duration::from_secs(10),
            "config error",
            |p| waiting_reason(p).as_deref() == Some("CreateContainerConfigError"),
        )
        .await;
        let message = support::container_status(&waiting)
            .and_then(|s| s.state.as_ref()?.waiting.as_ref()?.message.clone())
            .unwrap_or_default();
        assert_eq!(
            message,
            "MountVolume.SetUp failed for volume \"live\" : configmap \"late\" not found"
        );
        let events: Api<Event> = Api::namespaced(client.clone(), "default");
        let failed_mount = events
            .list(&Default::default())
            .await
            .expect("list events")
            .items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("FailedMount"))
            .expect("a FailedMount event");
        assert_eq!(failed_mount.type_.as_deref(), Some("Warning"));
        assert_eq!(
            failed_mount.involved_object.name.as_deref(),
            Some("watcher")
        );
        assert_eq!(failed_mount.message.as_deref(), Some(message.as_str()));
        create_config_map(&client, "late", json!({"key": "first"})).await;
        wait_log(&pods, "watcher", &["value=first"]).await;
        let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
        cms.patch(
            "late",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"key": "second"}})),
        )
        .await
        .expect("update configmap");
        wait_log(&pods, "watcher", &["value=first", "value=second tier=test"]).await;
        // A label change reaches the downward-API file the same way.
        pods.patch(
            "watcher",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"tier": "prod"}}})),
        )
        .await
        .expect("relabel pod");
        wait_log(&pods, "watcher", &["value=second tier=prod"]).await;
    });
}

#[test]
fn pods_resolve_through_the_cluster_dns_and_the_host_file_stays() {
    if !require_root_or_skip() {
        return;
    }
    let before = std::fs::read("/etc/resolv.conf").expect("host resolv.conf");
    let hosts_before = std::fs::read("/etc/hosts").expect("host hosts");
    let fixture = Fixture::new("skn-vol-dns");
    run(&fixture, |client, node| async move {
        let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
        let pod = shell_pod(
            "dns",
            &node,
            "cat /etc/resolv.conf /etc/hosts; sleep 30",
            json!([]),
            json!([]),
        );
        let mut pod = pod;
        if let Some(spec) = pod.spec.as_mut() {
            spec.hostname = Some("db-0".into());
            spec.subdomain = Some("db".into());
        }
        pods.create(&PostParams::default(), &pod)
            .await
            .expect("create pod");
        let running = wait_pod(&pods, "dns", Duration::from_secs(10), "an IP", |p| {
            p.status.as_ref().and_then(|s| s.pod_ip.as_ref()).is_some()
        })
        .await;
        let ip = running.status.and_then(|s| s.pod_ip).expect("ip");
        wait_log(
            &pods,
            "dns",
            &[
                "nameserver 10.96.0.10",
                "search default.svc.cluster.local svc.cluster.local cluster.local",
                "options ndots:5",
                &format!("{ip}\tdb-0.db.default.svc.cluster.local\tdb-0"),
            ],
        )
        .await;
    });
    assert_eq!(std::fs::read("/etc/resolv.conf").expect("host"), before);
    assert_eq!(std::fs::read("/etc/hosts").expect("host"), hosts_before);
}

#[test]
fn in_cluster_kube_client_reaches_the_api_with_its_service_account() {
    if !require_root_or_skip() {
        return;
    }
    let fixture = Fixture::new("skn-vol-api");
    run(&fixture, |client, node| async move {
        let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
        let mut pod = support::pod("apicheck", &node, "simkube.dev/apicheck", &[], "Never");
        if let Some(c) = pod.spec.as_mut().and_then(|s| s.containers.first_mut()) {
            c.env = None;
        }
        pods.create(&PostParams::default(), &pod)
            .await
            .expect("create pod");
        let done = wait_pod(&pods, "apicheck", Duration::from_secs(20), "done", |p| {
            matches!(
                p.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Succeeded" | "Failed")
            )
        })
        .await;
        let log = pods
            .logs("apicheck", &LogParams::default())
            .await
            .expect("logs");
        assert_eq!(
            done.status.and_then(|s| s.phase).as_deref(),
            Some("Succeeded"),
            "{log}"
        );
        let uid = done.metadata.uid.expect("uid");
        assert!(
            log.contains(&format!(
                "apicheck ok: https://198.18.0.10:6443/ pod default/apicheck uid={uid} serviceAccount=default"
            )),
            "{log}"
        );
    });
}
