//! Pod start-up benchmark of a simulated cluster: brings up a 2-node cluster with the `simkube`
//! binary of the same profile, creates 200 sleeper pods at once, and prints the time until all
//! are Running and Ready, pods per second, and the node agents' RSS per pod.
//!
//! Run as root with `cargo run --release -p simkube-cluster --example pods [-- PODS]`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::PostParams;
use simkube_cluster::state::StateDir;

const NAME: &str = "bench";
const NODES: u8 = 2;

fn main() -> anyhow::Result<()> {
    let pods: usize = match std::env::args().nth(1) {
        Some(n) => n.parse().context("the argument is the number of pods")?,
        None => 200,
    };
    let simkube = simkube_binary()?;
    let state = tempfile::tempdir().context("temporary state directory")?;
    let underlay = format!("skbench{}", std::process::id());
    let kubeconfig = state.path().join("bench.kubeconfig");
    let guard = Down {
        simkube: simkube.clone(),
        state: state.path().to_owned(),
    };
    let up = Command::new(&simkube)
        .args([
            "cluster",
            "up",
            "--name",
            NAME,
            "--nodes",
            &NODES.to_string(),
        ])
        .args(["--underlay", &underlay, "--kubeconfig-out"])
        .arg(&kubeconfig)
        .arg("--state-dir")
        .arg(state.path())
        .status()
        .context("running simkube cluster up")?;
    if !up.success() {
        bail!("simkube cluster up failed");
    }
    let agents: Vec<u32> = (1..=NODES)
        .map(|i| {
            std::fs::read_to_string(state.path().join(NAME).join(format!("node-{i}.pid")))
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .context("agent PID file")
        })
        .collect::<anyhow::Result<_>>()?;
    let before = agents_rss(&agents)?;
    let runtime = tokio::runtime::Runtime::new().context("async runtime")?;
    let elapsed = runtime.block_on(start_pods(&kubeconfig, pods))?;
    // Let the agents settle (status writes, probes) before reading their memory.
    std::thread::sleep(Duration::from_secs(2));
    let after = agents_rss(&agents)?;
    let record = StateDir::new(state.path())
        .read_record(NAME)?
        .context("cluster record")?;
    println!(
        "simkube cluster benchmark: {pods} sleeper pods on {} nodes (cluster index {})",
        record.nodes, record.index
    );
    println!(
        "  all Running and Ready after {:.2} s  ({:.1} pods/s)",
        elapsed.as_secs_f64(),
        pods as f64 / elapsed.as_secs_f64()
    );
    println!(
        "  node agents RSS: {:.1} MiB before, {:.1} MiB after, {:.1} KiB per pod",
        before as f64 / 1024.0,
        after as f64 / 1024.0,
        after.saturating_sub(before) as f64 / pods as f64
    );
    drop(guard);
    Ok(())
}

/// Brings the cluster down however the benchmark ends.
struct Down {
    simkube: PathBuf,
    state: PathBuf,
}

impl Drop for Down {
    fn drop(&mut self) {
        let _ = Command::new(&self.simkube)
            .args(["cluster", "down", "--name", NAME, "--state-dir"])
            .arg(&self.state)
            .status();
    }
}

fn agents_rss(pids: &[u32]) -> anyhow::Result<u64> {
    pids.iter()
        .map(|pid| simkube_cluster::proc::rss_kib(*pid).context("agent RSS"))
        .sum()
}

async fn start_pods(kubeconfig: &Path, count: usize) -> anyhow::Result<Duration> {
    let client = simkube_cluster::ops::client_from(kubeconfig).await?;
    let api: Api<Pod> = Api::namespaced(client, "default");
    let started = Instant::now();
    let creates = futures::stream::iter(0..count).map(|i| {
        let api = api.clone();
        async move {
            let pod: Pod = serde_json::from_value(serde_json::json!({
                "metadata": {"name": format!("sleeper-{i}"), "labels": {"app": "sleeper"}},
                "spec": {"containers": [{"name": "sleeper", "image": "simkube.dev/sleeper"}]},
            }))
            .expect("invariant: a valid Pod");
            api.create(&PostParams::default(), &pod).await
        }
    });
    let results: Vec<_> = creates.buffer_unordered(16).collect().await;
    for result in results {
        result.context("creating a pod")?;
    }
    let deadline = started + Duration::from_secs(600);
    loop {
        let list = api
            .list(&kube::api::ListParams::default().labels("app=sleeper"))
            .await?;
        let ready = list.items.iter().filter(|p| running_and_ready(p)).count();
        if ready == count {
            return Ok(started.elapsed());
        }
        if Instant::now() > deadline {
            bail!("only {ready} of {count} pods Running and Ready after 10 minutes");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn running_and_ready(pod: &Pod) -> bool {
    let Some(status) = &pod.status else {
        return false;
    };
    status.phase.as_deref() == Some("Running")
        && status
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// The `simkube` binary of this example's profile; under `cargo run` it is built first.
fn simkube_binary() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("own path")?;
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .context("unexpected example location")?;
    if let Some(cargo) = std::env::var_os("CARGO") {
        let mut build = Command::new(cargo);
        build.args(["build", "-p", "simkube-cluster", "--bin", "simkube"]);
        if profile_dir.ends_with("release") {
            build.arg("--release");
        }
        if !build.status().context("running cargo build")?.success() {
            bail!("building simkube failed");
        }
    }
    let binary = profile_dir.join("simkube");
    if !binary.exists() {
        bail!(
            "{} is missing: run `cargo build --release -p simkube-cluster` first",
            binary.display()
        );
    }
    Ok(binary)
}
