//! Shared by the tests that run the built `tether` binary against in-process simkube clusters:
//! starting a cluster with a kubeconfig file, running the CLI and kubectl, and a stand-in for
//! the controller (it reports the Deployment available, publishes the public identity and
//! answers ForeignClusters as the contract says), since the real controller is not part of
//! this crate.

#![allow(dead_code, unreachable_pub)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use simkube::Cluster;
use simkube::controllers::Controllers;
use tether_api::core::ForeignCluster;
use tether_api::names::{SYSTEM_NAMESPACE, objects, public_identity};

/// A fingerprint the stand-in controller publishes for a cluster.
pub fn fingerprint_of(cluster_id: &str) -> String {
    tether_api::peering::fingerprint(cluster_id.as_bytes())
}

/// A simulated cluster with its admin kubeconfig on disk.
pub struct Sim {
    pub cluster: Cluster,
    pub dir: tempfile::TempDir,
    pub kubeconfig: PathBuf,
}

impl Sim {
    /// A TLS cluster with the namespace and garbage-collector controllers (what uninstall's
    /// waits need) and nothing that writes to Tether's objects behind the tests' back.
    pub async fn start(name: &str) -> Self {
        Self::with_controllers(
            name,
            Controllers {
                namespace: true,
                garbage_collector: true,
                ..Controllers::none()
            },
        )
        .await
    }

    pub async fn with_controllers(name: &str, controllers: Controllers) -> Self {
        let cluster = Cluster::builder()
            .name(name)
            .tls(true)
            .controllers(controllers)
            .start()
            .await
            .expect("start simkube");
        let dir = tempfile::tempdir().expect("tempdir");
        let kubeconfig = dir.path().join("kubeconfig");
        cluster.write_kubeconfig(&kubeconfig).expect("kubeconfig");
        kubeadm_config(&cluster.client()).await;
        Self {
            cluster,
            dir,
            kubeconfig,
        }
    }

    pub fn client(&self) -> kube::Client {
        self.cluster.client()
    }

    pub fn kubeconfig(&self) -> &str {
        self.kubeconfig.to_str().expect("utf-8 path")
    }

    /// Runs `tether --kubeconfig <this> args...`.
    pub async fn tether(&self, args: &[&str]) -> Run {
        let mut all = vec!["--kubeconfig", self.kubeconfig()];
        all.extend_from_slice(args);
        tether(&all).await
    }

    /// `tether install --no-wait --cluster-id id`, asserting success.
    pub async fn install(&self, id: &str) {
        let run = self
            .tether(&[
                "install",
                "--no-wait",
                "--cluster-id",
                id,
                "--pod-cidr",
                "10.244.0.0/16",
            ])
            .await;
        run.assert_code(0);
    }

    /// Plays the controller's part of an install: Deployment available, identity published.
    pub async fn fake_controller_ready(&self, id: &str) {
        mark_deployment_available(&self.client()).await;
        publish_identity(&self.client(), id).await;
    }

    /// Runs kubectl against this cluster with a private cache, feeding `stdin`.
    pub async fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let cache = self.dir.path().join("kubectl-cache");
        let mut cmd = tokio::process::Command::new("kubectl");
        cmd.arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(cache)
            .args(args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("run kubectl");
        if let Some(input) = stdin {
            use tokio::io::AsyncWriteExt as _;
            let mut pipe = child.stdin.take().expect("stdin");
            pipe.write_all(input.as_bytes()).await.expect("write stdin");
            drop(pipe);
        }
        child.wait_with_output().await.expect("kubectl output")
    }
}

/// Whether kubectl can run here. Without it a test skips and says so; in CI (`CI` set) a
/// missing kubectl is a failure.
pub fn kubectl_available() -> bool {
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
        eprintln!("skipping: kubectl not found on PATH (set CI to make this a failure)");
    }
    found
}

/// One CLI run.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub fn assert_code(&self, code: i32) {
        assert_eq!(
            self.code, code,
            "expected exit {code}, got {}\nstdout:\n{}\nstderr:\n{}",
            self.code, self.stdout, self.stderr
        );
    }

    /// Asserts the exit code and that stderr mentions every needle.
    pub fn assert_fails(&self, code: i32, needles: &[&str]) {
        self.assert_code(code);
        for n in needles {
            assert!(
                self.stderr.contains(n),
                "stderr lacks {n:?}:\n{}",
                self.stderr
            );
        }
    }
}

/// Runs the built `tether` binary with no inherited kubeconfig.
pub async fn tether(args: &[&str]) -> Run {
    run_binary(env!("CARGO_BIN_EXE_tether"), args).await
}

pub async fn run_binary(bin: &str, args: &[&str]) -> Run {
    let home = tempfile::tempdir().expect("home");
    let out = tokio::process::Command::new(bin)
        .args(args)
        .env_remove("KUBECONFIG")
        .env("HOME", home.path())
        .stdin(Stdio::null())
        .output()
        .await
        .expect("run tether");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Writes a kubeconfig pointing at a port where nothing listens.
pub fn unreachable_kubeconfig(dir: &Path) -> PathBuf {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    drop(listener);
    let path = dir.join("unreachable.kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: gone\n  cluster:\n    server: https://127.0.0.1:{port}\ncontexts:\n- name: gone\n  context:\n    cluster: gone\n    user: gone\ncurrent-context: gone\nusers:\n- name: gone\n  user:\n    token: nothing\n"
        ),
    )
    .expect("write kubeconfig");
    path
}

/// Sets the controller Deployment's status as a rolled-out Deployment has it.
pub async fn mark_deployment_available(client: &kube::Client) {
    let api: Api<Deployment> = Api::namespaced(client.clone(), SYSTEM_NAMESPACE);
    let d = api
        .get(objects::CONTROLLER)
        .await
        .expect("controller Deployment");
    let replicas = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let status = serde_json::json!({"status": {
        "observedGeneration": d.metadata.generation,
        "replicas": replicas,
        "updatedReplicas": replicas,
        "readyReplicas": replicas,
        "availableReplicas": replicas,
        "conditions": [{"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable",
            "message": "Deployment has minimum availability."}],
    }});
    api.patch_status(
        objects::CONTROLLER,
        &PatchParams::default(),
        &Patch::Merge(&status),
    )
    .await
    .expect("patch Deployment status");
}

/// Writes `tether-public-identity` as the controller does.
pub async fn publish_identity(client: &kube::Client, id: &str) {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), SYSTEM_NAMESPACE);
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some(objects::PUBLIC_IDENTITY_CONFIGMAP.to_owned()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([
            (public_identity::CLUSTER_ID.to_owned(), id.to_owned()),
            (
                public_identity::AUTH_FINGERPRINT.to_owned(),
                fingerprint_of(id),
            ),
            (
                public_identity::AUTH_URL.to_owned(),
                format!("https://{id}.example:443"),
            ),
            (
                public_identity::API_SERVER_URL.to_owned(),
                format!("https://{id}.example:6443"),
            ),
            (public_identity::PUBLIC_KEY.to_owned(), "AAAA".to_owned()),
        ])),
        ..Default::default()
    };
    match api.create(&PostParams::default(), &cm).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("publish identity: {e}"),
    }
}

/// How the stand-in controller answers a new ForeignCluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// Authentication True, phase Established.
    Authenticate,
    /// Phase Failed, Authentication False with TokenRejected.
    RejectToken,
}

/// Answers every ForeignCluster without a status until `stop` is cancelled.
pub fn answer_foreign_clusters(
    client: kube::Client,
    answer: Answer,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let api: Api<ForeignCluster> = Api::all(client);
        loop {
            if let Ok(list) = api.list(&ListParams::default()).await {
                for fc in list.items {
                    if fc.status.is_some() {
                        continue;
                    }
                    let name = fc.metadata.name.clone().unwrap_or_default();
                    let now = "2030-01-01T00:00:00Z";
                    let status = match answer {
                        Answer::Authenticate => serde_json::json!({"status": {
                        "phase": "Established", "role": "Provider",
                        "conditions": [
                            {"type": "Authentication", "status": "True", "reason": "IdentityIssued",
                             "message": "the provider issued an identity", "lastTransitionTime": now},
                            {"type": "Networking", "status": "Unknown", "reason": "ModuleDisabled",
                             "message": "the networking module is off", "lastTransitionTime": now},
                        ]}}),
                        Answer::RejectToken => serde_json::json!({"status": {
                        "phase": "Failed", "role": "Unknown",
                        "conditions": [
                            {"type": "Authentication", "status": "False", "reason": "TokenRejected",
                             "message": "the provider rejected the token: it expired; ask the provider's admin for a new `tether generate peer-command`",
                             "lastTransitionTime": now},
                        ]}}),
                    };
                    let _ = api
                        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                        .await;
                }
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    })
}

/// What kubeadm writes about a cluster's networks (`kube-system/kubeadm-config`), so that
/// `tether install` detects the pod CIDR here as it does on a kubeadm cluster.
pub async fn kubeadm_config(client: &kube::Client) {
    let cm: k8s_openapi::api::core::v1::ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "kubeadm-config", "namespace": "kube-system" },
        "data": { "ClusterConfiguration": "apiVersion: kubeadm.k8s.io/v1beta3\nkind: ClusterConfiguration\nnetworking:\n  podSubnet: 10.244.0.0/16\n  serviceSubnet: 10.96.0.0/12\n" },
    }))
    .expect("ConfigMap");
    kube::Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), "kube-system")
        .create(&Default::default(), &cm)
        .await
        .expect("kubeadm-config");
}
