//! Shared fixture of the node-agent tests: one simulated node (a network namespace holding the
//! API server, the agent and the test's client), plus pod builders and polling helpers.
#![allow(dead_code)] // each test file uses a different part of it

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use serde_json::json;
use simkube_node::backoff::Backoff;
use simkube_node::images::ImageTable;
use simkube_node::node_status::NodeIdentity;
use simkube_node::{Agent, AgentConfig, sandbox};
use tether_testkit::{Netns, patience};
use tokio_util::sync::CancellationToken;

static SEQ: AtomicU32 = AtomicU32::new(0);

/// One simulated node: its namespace (where the API server, the agent and the test client run),
/// the agent's sandbox prefix, and a guard removing leftover sandboxes even after a panic.
pub(crate) struct Fixture {
    pub(crate) netns: Netns,
    pub(crate) node: String,
    pub(crate) prefix: String,
    pub(crate) state: tempfile::TempDir,
}

impl Fixture {
    pub(crate) fn new(label: &str) -> Self {
        let netns = Netns::new(label).expect("node namespace");
        // The node's InternalIP; on `lo` because this kernel may lack the dummy link type.
        netns
            .ip(&["addr", "add", "198.18.0.10/32", "dev", "lo"])
            .expect("node address");
        let seq = SEQ.fetch_add(1, Ordering::Relaxed);
        let node = format!("node-{seq}");
        // Sandbox names carry this process's PID in the testkit's format, so the testkit's sweep
        // also removes them if this run is killed.
        let prefix = format!("tt{}-sk{seq}-", std::process::id());
        Self {
            netns,
            node,
            prefix,
            state: tempfile::tempdir().expect("state dir"),
        }
    }

    /// The cluster's admin kubeconfig while [`Fixture::run`] runs, for kubectl started from the
    /// body (a child process inherits the node namespace of the thread that starts it).
    pub(crate) fn kubeconfig(&self) -> PathBuf {
        self.state.path().join("kubeconfig")
    }

    pub(crate) fn config(&self, backoff: Backoff) -> AgentConfig {
        let identity = NodeIdentity {
            name: self.node.clone(),
            pod_cidr: "10.244.7.0/24".parse().expect("cidr"),
            internal_ip: "198.18.0.10".parse().expect("ip"),
            kubelet_port: 10250,
            cpu: "2".into(),
            memory: "4Gi".into(),
            max_pods: 20,
            labels: Default::default(),
        };
        let images = ImageTable::new(env!("CARGO_BIN_EXE_simkube-node"));
        let mut config = AgentConfig::new(identity, images, self.state.path().to_owned());
        config.backoff = backoff;
        config.lease_renew = Duration::from_millis(300);
        config.netns_prefix = self.prefix.clone();
        config.shutdown_grace = Duration::from_millis(500);
        config
    }

    /// Runs `body` with a fresh cluster and a running agent, all inside the node namespace.
    pub(crate) fn run<F, Fut>(&self, backoff: Backoff, body: F)
    where
        F: FnOnce(kube::Client, String) -> Fut + Send,
        Fut: std::future::Future<Output = ()>,
    {
        self.run_with(backoff, |b| b, |_| {}, body);
    }

    /// [`Fixture::run`] with the cluster builder and the agent's configuration adjusted first
    /// (controllers, a load-balancer pool, probes' timing, ...).
    pub(crate) fn run_with<F, Fut>(
        &self,
        backoff: Backoff,
        cluster: impl FnOnce(simkube::ClusterBuilder) -> simkube::ClusterBuilder + Send,
        adjust: impl FnOnce(&mut AgentConfig),
        body: F,
    ) where
        F: FnOnce(kube::Client, String) -> Fut + Send,
        Fut: std::future::Future<Output = ()>,
    {
        self.run_stoppable(
            backoff,
            cluster,
            adjust,
            |client, node, control| async move {
                body(client, node).await;
                control
            },
        );
    }
}

/// The agent of [`Fixture::run_stoppable`]: the body may stop it while the cluster runs on.
pub(crate) struct AgentControl {
    shutdown: CancellationToken,
    handle: Option<tokio::task::JoinHandle<Result<(), simkube_node::Error>>>,
}

impl AgentControl {
    /// Stops the agent as a stopped kubelet (its containers and sandboxes go, the pods stay in
    /// the API and its Lease is no longer renewed) and waits until it has finished.
    pub(crate) async fn stop(&mut self) {
        self.shutdown.cancel();
        if let Some(handle) = self.handle.take() {
            handle.await.expect("agent task").expect("agent ran");
        }
    }
}

impl Fixture {
    /// [`Fixture::run_with`] whose body also gets the agent's [`AgentControl`].
    pub(crate) fn run_stoppable<F, Fut>(
        &self,
        backoff: Backoff,
        cluster: impl FnOnce(simkube::ClusterBuilder) -> simkube::ClusterBuilder + Send,
        adjust: impl FnOnce(&mut AgentConfig),
        body: F,
    ) where
        F: FnOnce(kube::Client, String, AgentControl) -> Fut + Send,
        Fut: std::future::Future<Output = AgentControl>,
    {
        let mut config = self.config(backoff);
        adjust(&mut config);
        let node = self.node.clone();
        let kubeconfig = self.kubeconfig();
        self.netns.run_async(|| async move {
            let cluster = cluster(simkube::Cluster::builder())
                .start()
                .await
                .expect("cluster");
            let client = cluster.client();
            cluster
                .write_kubeconfig(&kubeconfig)
                .expect("write kubeconfig");
            let agent = Agent::new(client.clone(), config).expect("agent");
            let shutdown = CancellationToken::new();
            let handle = tokio::spawn(agent.run(shutdown.clone()));
            let control = AgentControl {
                shutdown,
                handle: Some(handle),
            };
            let mut control = body(client, node, control).await;
            control.stop().await;
            cluster.shutdown().await;
        });
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        for (netns, _) in sandbox::list(&self.prefix) {
            eprintln!("removing leftover sandbox {netns}");
            let _ = std::process::Command::new("ip")
                .args(["netns", "del", &netns])
                .status();
        }
    }
}

pub(crate) fn fast_backoff() -> Backoff {
    Backoff {
        initial: Duration::from_millis(300),
        max: Duration::from_secs(2),
        reset_after: Duration::from_secs(60),
    }
}

pub(crate) fn pod(name: &str, node: &str, image: &str, args: &[&str], restart: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": node,
            "restartPolicy": restart,
            "terminationGracePeriodSeconds": 2,
            "containers": [{
                "name": "main", "image": image, "args": args,
                "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
            }]
        }
    }))
    .expect("pod")
}

/// A sleeper pod whose container exits at once with `exit_code` (a crash loop under
/// restartPolicy Always).
pub(crate) async fn create_exiting_sleeper(
    api: &Api<Pod>,
    name: &str,
    node: &str,
    exit_code: &str,
    restart: &str,
) {
    let spec = pod(
        name,
        node,
        "simkube.dev/sleeper",
        &["--seconds", "0", "--exit-code", exit_code],
        restart,
    );
    api.create(&kube::api::PostParams::default(), &spec)
        .await
        .expect("create");
}

/// Polls `get` until `check` accepts the pod; panics with the last pod seen after `timeout`.
pub(crate) async fn wait_pod(
    api: &Api<Pod>,
    name: &str,
    timeout: Duration,
    what: &str,
    check: impl Fn(&Pod) -> bool,
) -> Pod {
    let deadline = Instant::now() + patience(timeout);
    loop {
        let pod = api.get_opt(name).await.expect("get pod");
        if let Some(pod) = &pod
            && check(pod)
        {
            return pod.clone();
        }
        assert!(
            Instant::now() < deadline,
            "pod {name}: {what} not reached; last status: {}",
            serde_json::to_string_pretty(&pod.and_then(|p| p.status)).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The condition of this type on a pod: (status, reason, message).
pub(crate) fn pod_condition(pod: &Pod, type_: &str) -> Option<(String, String, String)> {
    let c = pod
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)?;
    Some((
        c.status.clone(),
        c.reason.clone().unwrap_or_default(),
        c.message.clone().unwrap_or_default(),
    ))
}

/// The pod's phase, if it has one yet.
pub(crate) fn phase(pod: &Pod) -> Option<&str> {
    pod.status.as_ref()?.phase.as_deref()
}

pub(crate) fn container_status(pod: &Pod) -> Option<&k8s_openapi::api::core::v1::ContainerStatus> {
    pod.status.as_ref()?.container_statuses.as_ref()?.first()
}

pub(crate) fn waiting_reason(pod: &Pod) -> Option<String> {
    container_status(pod)?
        .state
        .as_ref()?
        .waiting
        .as_ref()?
        .reason
        .clone()
}

pub(crate) fn netns_exists(name: &str) -> bool {
    PathBuf::from(sandbox::NETNS_DIR).join(name).exists()
}
