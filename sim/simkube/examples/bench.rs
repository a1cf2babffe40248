//! Throughput, watch latency and memory of `simkube serve`, measured from real kube-rs clients
//! over TCP: 10,000 ConfigMaps created by 8 concurrent writers while 10 watchers stay open, then
//! one full list. The server runs as a child process so its peak RSS is its own.
//!
//! Run with `cargo build --release -p simkube-cluster && cargo run --release -p simkube --example bench`
//! (it builds the server binary itself when it is missing and `cargo` is at hand).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, PostParams, WatchEvent, WatchParams};
use kube::{Client, ResourceExt as _};
use serde_json::json;
use tokio::io::AsyncBufReadExt as _;
use tokio::sync::Mutex;

/// Objects created unless the first argument says otherwise (`-- 500` for a quick check).
const DEFAULT_OBJECTS: usize = 10_000;
const WRITERS: usize = 8;
const WATCHERS: usize = 10;
const NAMESPACE: &str = "default";
/// The annotation carrying the send time, in nanoseconds since the benchmark's origin.
const SENT: &str = "bench.simkube.dev/sent-ns";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let binary = server_binary()?;
    // Read after any build, so the figure describes the machine during the measurement.
    let load_before = load_average();
    let dir = tempfile::tempdir().context("temporary directory")?;
    let kubeconfig = dir.path().join("kubeconfig");
    let mut server = tokio::process::Command::new(&binary)
        .args([
            "serve",
            "--name",
            "bench",
            "--listen",
            "127.0.0.1:0",
            "--log",
            "warn",
        ])
        .arg("--kubeconfig-out")
        .arg(&kubeconfig)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", binary.display()))?;
    let pid = server.id().context("server pid")?;
    let stdout = server.stdout.take().context("server stdout")?;
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let url = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(line) = lines.next_line().await? {
            if let Some((_, url)) = line.split_once(" serving at ") {
                return Ok::<_, std::io::Error>(Some(url.trim().to_owned()));
            }
        }
        Ok(None)
    })
    .await
    .context("the server did not start within 10 s")??
    .context("the server exited before listening")?;
    let objects = match std::env::args().nth(1) {
        Some(n) => n.parse().context("the argument is the number of objects")?,
        None => DEFAULT_OBJECTS,
    };
    let result = run(&kubeconfig, pid, objects).await;
    // End the server this benchmark started, by its handle.
    server.start_kill().ok();
    let _ = server.wait().await;
    let report = result?;
    let build = if cfg!(debug_assertions) {
        "DEBUG build: figures are not representative"
    } else {
        "release build"
    };
    println!("simkube benchmark against {url} (server pid {pid}, {build})");
    println!(
        "  machine: {} cores, load average before {load_before}, after {}",
        cores(),
        load_average()
    );
    report.print();
    Ok(())
}

/// The `simkube` binary of the same profile as this example. Under `cargo run` it is (re)built
/// first, a no-op when it is up to date; run directly, it must exist.
fn server_binary() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("own path")?;
    // target/<profile>/examples/bench -> target/<profile>/simkube
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .context("unexpected example location")?;
    let binary = profile_dir.join("simkube");
    if let Some(cargo) = std::env::var_os("CARGO") {
        let mut cmd = std::process::Command::new(cargo);
        cmd.args(["build", "-p", "simkube-cluster", "--bin", "simkube"]);
        if profile_dir.ends_with("release") {
            cmd.arg("--release");
        }
        let status = cmd.status().context("running cargo build for the server")?;
        if !status.success() {
            bail!("building the server failed");
        }
    }
    if !binary.exists() {
        bail!(
            "{} is missing: run `cargo build --release -p simkube-cluster` first",
            binary.display()
        );
    }
    Ok(binary)
}

async fn client(kubeconfig: &Path) -> anyhow::Result<Client> {
    let config = kube::config::Kubeconfig::read_from(kubeconfig)?;
    let config = kube::Config::from_custom_kubeconfig(config, &Default::default()).await?;
    Ok(Client::try_from(config)?)
}

struct Report {
    objects: usize,
    writes_per_sec: f64,
    write_wall: Duration,
    write_latency: Vec<Duration>,
    delivery_latency: Vec<Duration>,
    delivered_all: Duration,
    list_time: Duration,
    listed: usize,
    paged_list_time: Duration,
    rss_hwm_kib: u64,
    rss_now_kib: u64,
}

impl Report {
    fn print(&self) {
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        println!(
            "  writes: {} creates from {WRITERS} clients in {:.2} s = {:.0} writes/s (target >= 5000)",
            self.objects,
            self.write_wall.as_secs_f64(),
            self.writes_per_sec
        );
        println!(
            "  write latency: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            ms(percentile(&self.write_latency, 50.0)),
            ms(percentile(&self.write_latency, 99.0)),
            ms(percentile(&self.write_latency, 100.0)),
        );
        println!(
            "  watch delivery ({WATCHERS} watchers, {} events): p50 {:.2} ms, p99 {:.2} ms (target < 5), max {:.2} ms; all delivered {:.2} s after the first send",
            self.delivery_latency.len(),
            ms(percentile(&self.delivery_latency, 50.0)),
            ms(percentile(&self.delivery_latency, 99.0)),
            ms(percentile(&self.delivery_latency, 100.0)),
            self.delivered_all.as_secs_f64(),
        );
        println!(
            "  list: {} objects in one response in {:.1} ms; paged (limit=500) in {:.1} ms",
            self.listed,
            ms(self.list_time),
            ms(self.paged_list_time)
        );
        println!(
            "  server memory: peak RSS (VmHWM) {:.1} MiB (target < 100), RSS now {:.1} MiB",
            self.rss_hwm_kib as f64 / 1024.0,
            self.rss_now_kib as f64 / 1024.0
        );
    }
}

fn percentile(samples: &[Duration], p: f64) -> Duration {
    if samples.is_empty() {
        return Duration::ZERO;
    }
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

async fn run(kubeconfig: &Path, pid: u32, objects: usize) -> anyhow::Result<Report> {
    let origin = Instant::now();
    let admin = client(kubeconfig).await?;
    let api: Api<ConfigMap> = Api::namespaced(admin.clone(), NAMESPACE);
    let start_rv = api
        .list(&ListParams::default().limit(1))
        .await?
        .metadata
        .resource_version
        .context("list RV")?;

    // Watchers: each its own client and connection, all from the same RV.
    let delivered: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let mut watchers = Vec::new();
    for _ in 0..WATCHERS {
        let api: Api<ConfigMap> = Api::namespaced(client(kubeconfig).await?, NAMESPACE);
        let mut stream = api.watch(&WatchParams::default(), &start_rv).await?.boxed();
        let delivered = delivered.clone();
        watchers.push(tokio::spawn(async move {
            let mut mine = Vec::with_capacity(objects);
            while mine.len() < objects {
                match stream.next().await {
                    Some(Ok(WatchEvent::Added(cm))) => {
                        let now = origin.elapsed();
                        let sent = cm
                            .annotations()
                            .get(SENT)
                            .and_then(|s| s.parse::<u64>().ok())
                            .context("object without a send time")?;
                        mine.push(now.saturating_sub(Duration::from_nanos(sent)));
                    }
                    Some(Ok(WatchEvent::Error(e))) => bail!("watch error: {e:?}"),
                    Some(Ok(_)) => {}
                    Some(Err(e)) => bail!("watch stream failed: {e}"),
                    None => bail!("watch ended after {} events", mine.len()),
                }
            }
            delivered.lock().await.extend(mine);
            Ok(origin.elapsed())
        }));
    }

    // Writers: each its own client, a share of the names.
    let first_send = origin.elapsed();
    let started = Instant::now();
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let api: Api<ConfigMap> = Api::namespaced(client(kubeconfig).await?, NAMESPACE);
        writers.push(tokio::spawn(async move {
            let mut latencies = Vec::with_capacity(objects / WRITERS + 1);
            for i in (w..objects).step_by(WRITERS) {
                let sent = origin.elapsed();
                let cm: ConfigMap = serde_json::from_value(json!({
                    "metadata": {
                        "name": format!("bench-{i:05}"),
                        "labels": {"app": "bench", "writer": w.to_string()},
                        "annotations": {SENT: sent.as_nanos().to_string()},
                    },
                    "data": {"index": i.to_string(), "payload": "x".repeat(64)},
                }))?;
                api.create(&PostParams::default(), &cm).await?;
                latencies.push(origin.elapsed() - sent);
            }
            Ok::<_, anyhow::Error>(latencies)
        }));
    }
    let mut write_latency = Vec::with_capacity(objects);
    for w in writers {
        write_latency.extend(w.await??);
    }
    let write_wall = started.elapsed();

    let mut last_delivery = Duration::ZERO;
    for w in watchers {
        let done = tokio::time::timeout(Duration::from_secs(120), w)
            .await
            .context("watchers did not receive every event within 120 s")???;
        last_delivery = last_delivery.max(done);
    }

    let t = Instant::now();
    let all = api.list(&ListParams::default()).await?;
    let list_time = t.elapsed();
    let t = Instant::now();
    let mut paged = 0;
    let mut params = ListParams::default().limit(500);
    loop {
        let page = api.list(&params).await?;
        paged += page.items.len();
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => break,
        }
    }
    let paged_list_time = t.elapsed();
    if all.items.len() != objects || paged != objects {
        bail!(
            "listed {} and {paged} objects, expected {objects}",
            all.items.len()
        );
    }
    let (rss_hwm_kib, rss_now_kib) = rss(pid)?;
    let delivery_latency = std::mem::take(&mut *delivered.lock().await);
    Ok(Report {
        objects,
        writes_per_sec: objects as f64 / write_wall.as_secs_f64(),
        write_wall,
        write_latency,
        delivery_latency,
        delivered_all: last_delivery.saturating_sub(first_send),
        list_time,
        listed: all.items.len(),
        paged_list_time,
        rss_hwm_kib,
        rss_now_kib,
    })
}

/// `VmHWM` and `VmRSS` of a process, in KiB.
fn rss(pid: u32) -> anyhow::Result<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .context("reading the server's /proc status")?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
    };
    Ok((
        field("VmHWM:").context("VmHWM")?,
        field("VmRSS:").context("VmRSS")?,
    ))
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}
