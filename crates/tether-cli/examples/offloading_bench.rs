//! Offloading benchmark (issue #11): a burst Deployment of N pods in an offloaded namespace
//! against the same Deployment on a plain simulated cluster, in one run. Three clusters on one
//! underlay: the consumer (one node, Tether installed), the provider (Tether installed, peered
//! with the consumer, enough nodes for N pods) and a plain cluster with as many nodes as the
//! provider and no Tether, so both runs start the same pods on the same number of node agents.
//! For each N, the plain burst runs first and is deleted, then the offloaded one; each burst
//! starts once the machine is quiet, so neither pays for the teardown of the one before.
//!
//! Prints, per N: time from the Deployment's create to all N pods Ready (in the consumer, and in
//! the plain cluster) and their ratio; the reflection lag per pod (the consumer's watch seeing it
//! Ready minus the provider's watch seeing its pod Ready: both watches are in this process, one
//! clock); the consumer controller's VmRSS/VmHWM before the bursts, at N Ready and after the idle
//! window, and per extra pod between two sizes; the bytes between the consumer's controller and
//! the provider (nftables counters in the controller pod's network namespace, on the provider's
//! 198.18.P.0/24 and 198.19.P.0/24) during the burst and over an idle window, as well as
//! everything between the two clusters in the underlay (the tunnel included); and which
//! requests the API servers served meanwhile. Each pod's time is also split, from the
//! watches: the consumer's create to its binding to the virtual node and to its pod at the
//! provider, that pod to Ready, and the lag; the plain cluster's pods, seen to Ready, compare
//! with the provider's. Each burst also says how busy the machine was and which processes
//! (grouped by command and cluster) used its CPU. At the last size,
//! the idle window is repeated with the consumer's controller stopped (SIGSTOP), so that the
//! provider's request counters, all clients together, tell the consumer's requests apart.
//!
//! Needs root, and release builds beside it: `cargo build --release -p simkube-cluster -p
//! tetherd -p tether-cli --examples && cargo run --release -p tether-cli --example
//! offloading_bench` (`--pods 100,1000` sizes, `--idle-secs 60`, `--attribute-secs 30` for
//! the stopped window (0: none), `--nodes K` for the provider and the plain cluster, default
//! the largest size / 100 + 1, `--cores shared|own`, default shared).
//!
//! With `--cores shared` all three clusters share every CPU, and the consumer's second
//! control plane competes with the provider's nodes for them. With `--cores own` the consumer
//! and this benchmark run on one half of the CPUs and the provider and the plain cluster on
//! the other, every process of a cluster inheriting its daemon's affinity, as peered clusters
//! are separate machines: the plain cluster gets the provider's CPUs, and the ratio shows
//! what offloading costs the provider alone.

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use kube::runtime::{WatchStreamExt as _, watcher};
use tokio::runtime::Runtime;

use common::measure::{
    Counted, NftCounters, api_requests, cpu_by_group, cpu_ticks, machine_ticks, memory_kib,
    pod_netns, tetherd_controller, top_increases,
};
use common::{Bench, Cluster, Result, arg, kubectl, path};

const NS: &str = "bench";
const CONSUMER_ID: &str = "bench-a";
const PROVIDER_ID: &str = "bench-b";
/// The longest wait for the machine to be quiet before a burst.
const QUIET_LIMIT: Duration = Duration::from_secs(90);
/// Quiet time after a burst before the idle window starts, so the window does not include the
/// tail of the burst's own work.
const SETTLE: Duration = Duration::from_secs(10);

fn main() -> std::process::ExitCode {
    common::exit("offloading_bench", run())
}

/// First-Ready times and live pods of one namespace, from a watch.
#[derive(Default)]
struct Seen {
    created: HashMap<String, Instant>,
    /// First seen bound to a node.
    bound: HashMap<String, Instant>,
    ready: HashMap<String, Instant>,
    present: HashSet<String>,
    listed: bool,
}

struct PodWatch {
    seen: Arc<Mutex<Seen>>,
}

impl Seen {
    fn forget(&mut self) {
        self.created.clear();
        self.bound.clear();
        self.ready.clear();
    }

    /// Per pod, from first seen to first seen Ready, in seconds, sorted.
    fn start_times(&self) -> Vec<f64> {
        self.since_created(&self.ready)
    }

    /// Per pod, from first seen to first seen bound to a node, in seconds, sorted.
    fn bind_times(&self) -> Vec<f64> {
        self.since_created(&self.bound)
    }

    fn since_created(&self, at: &HashMap<String, Instant>) -> Vec<f64> {
        let mut v: Vec<f64> = at
            .iter()
            .filter_map(|(p, t)| Some(secs(*self.created.get(p)?, *t)))
            .collect();
        v.sort_by(f64::total_cmp);
        v
    }
}

/// `to - from` in seconds, negative when `to` came first.
fn secs(from: Instant, to: Instant) -> f64 {
    if to >= from {
        (to - from).as_secs_f64()
    } else {
        -(from - to).as_secs_f64()
    }
}

/// A process stopped with SIGSTOP until dropped, so a failing run never leaves it frozen.
struct Frozen(u32);

impl Frozen {
    fn new(pid: u32) -> Result<Self> {
        signal(pid, "-STOP")?;
        Ok(Self(pid))
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        let _ = signal(self.0, "-CONT");
    }
}

fn signal(pid: u32, sig: &str) -> Result {
    let out = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .output()
        .map_err(|e| format!("running kill: {e}"))?;
    common::ok(&out, &format!("kill {sig} {pid}"))
}

impl PodWatch {
    fn start(rt: &Runtime, client: kube::Client, ns: &str) -> Self {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let api: Api<Pod> = Api::namespaced(client, ns);
        let state = seen.clone();
        rt.spawn(async move {
            let mut events = watcher(api, watcher::Config::default())
                .default_backoff()
                .boxed();
            while let Some(event) = events.next().await {
                let now = Instant::now();
                let Ok(event) = event else { continue };
                let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
                match event {
                    watcher::Event::Apply(p) | watcher::Event::InitApply(p) => {
                        let name = p.metadata.name.clone().unwrap_or_default();
                        s.created.entry(name.clone()).or_insert(now);
                        if p.spec.as_ref().is_some_and(|s| s.node_name.is_some()) {
                            s.bound.entry(name.clone()).or_insert(now);
                        }
                        if is_ready(&p) {
                            s.ready.entry(name.clone()).or_insert(now);
                        }
                        s.present.insert(name);
                    }
                    watcher::Event::Delete(p) => {
                        s.present.remove(&p.metadata.name.unwrap_or_default());
                    }
                    watcher::Event::Init => s.present.clear(),
                    watcher::Event::InitDone => s.listed = true,
                }
            }
        });
        Self { seen }
    }

    fn with<T>(&self, f: impl FnOnce(&mut Seen) -> T) -> T {
        f(&mut self.seen.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn wait_listed(&self) -> Result {
        common::wait_for("a watch's first list", Duration::from_secs(30), || {
            self.with(|s| s.listed).then_some(())
        })
    }

    /// Waits until no pod is left in the namespace.
    fn wait_empty(&self, what: &str, limit: Duration) -> Result {
        common::wait_for(what, limit, || {
            self.with(|s| s.present.is_empty()).then_some(())
        })
    }
}

fn is_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True")
}

/// The Deployment of a burst: `n` sleepers with small requests (the provider's default `soft`
/// enforcement admits only pods that request resources).
fn deployment(name: &str, n: u64) -> Result<Deployment> {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "replicas": n,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{
                        "name": "main",
                        "image": "simkube.dev/sleeper",
                        "resources": {"requests": {"cpu": "1m", "memory": "1Mi"}}
                    }]
                }
            }
        }
    }))
    .map_err(|e| format!("the Deployment: {e}"))
}

async fn client_of(c: &Cluster) -> Result<kube::Client> {
    let kc = kube::config::Kubeconfig::read_from(&c.1)
        .map_err(|e| format!("kubeconfig of {}: {e}", c.0))?;
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .map_err(|e| format!("kubeconfig of {}: {e}", c.0))?;
    kube::Client::try_from(config).map_err(|e| format!("client for {}: {e}", c.0))
}

/// Creates the Deployment and waits until `watch` saw all `n` pods Ready; the time from just
/// before the create to the last of them.
fn burst(
    rt: &Runtime,
    client: &kube::Client,
    watch: &PodWatch,
    name: &str,
    n: u64,
    label: &str,
) -> Result<(Instant, Duration)> {
    watch.with(Seen::forget);
    let api: Api<Deployment> = Api::namespaced(client.clone(), NS);
    let d = deployment(name, n)?;
    let t0 = Instant::now();
    rt.block_on(api.create(&PostParams::default(), &d))
        .map_err(|e| format!("creating Deployment {name} ({label}): {e}"))?;
    let limit = Duration::from_secs(120 + n * 6 / 10);
    let mut last_report = Instant::now();
    loop {
        let (count, last) = watch.with(|s| {
            let mine: Vec<Instant> = s
                .ready
                .iter()
                .filter(|(p, _)| p.starts_with(&format!("{name}-")))
                .map(|(_, t)| *t)
                .collect();
            (mine.len() as u64, mine.into_iter().max())
        });
        if count >= n {
            let took = last.map_or(Duration::ZERO, |l| l - t0);
            eprintln!("{label}: all {n} pods Ready in {:.2}s", took.as_secs_f64());
            return Ok((t0, took));
        }
        if t0.elapsed() > limit {
            return Err(format!(
                "{label}: only {count} of {n} pods Ready after {limit:?}"
            ));
        }
        if last_report.elapsed() > Duration::from_secs(10) {
            eprintln!(
                "{label}: {count}/{n} Ready after {:.0}s",
                t0.elapsed().as_secs_f64()
            );
            last_report = Instant::now();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until the machine is quiet (its dirty pages written out, then under 10% busy for
/// two seconds in a row, at most `limit`), so a burst does not pay for what the one before
/// left behind: a deleted burst's pods take their processes and network namespaces down
/// after the API has forgotten them, and the files a burst wrote reach the disk some 30 s
/// later, in the kernel's writeback, unless they are synced first.
fn quiet(label: &str, limit: Duration) -> Result {
    let start = Instant::now();
    let out = std::process::Command::new("sync")
        .output()
        .map_err(|e| format!("running sync: {e}"))?;
    common::ok(&out, "sync")?;
    let synced = start.elapsed();
    let mut calm = 0;
    let mut last = machine_ticks()?;
    while calm < 2 {
        if start.elapsed() > limit {
            eprintln!("{label}: the machine is still busy after {limit:?}; going on");
            return Ok(());
        }
        std::thread::sleep(Duration::from_secs(1));
        let now = machine_ticks()?;
        let busy = (now.0 - last.0) as f64 / (now.1 - last.1).max(1) as f64;
        calm = if busy < 0.10 { calm + 1 } else { 0 };
        last = now;
    }
    eprintln!(
        "{label}: the machine was quiet after {:.0}s (sync took {:.1}s)",
        start.elapsed().as_secs_f64(),
        synced.as_secs_f64()
    );
    Ok(())
}

fn delete(c: &Cluster, name: &str) -> Result {
    kubectl(c, &["delete", "deployment", "-n", NS, name, "--wait=false"]).map(|_| ())
}

/// Nearest-rank percentile of sorted values.
fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

/// The sizes to run: `--pods 100,1000`.
/// Where the clusters run on the machine's CPUs (`--cores`).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Cores {
    /// The consumer (and this benchmark) on one half of the CPUs, the provider and the plain
    /// cluster on the other: separate clusters run on separate machines, and the plain cluster
    /// gets exactly the provider's CPUs.
    Own {
        consumer: Vec<usize>,
        provider: Vec<usize>,
    },
    /// Every cluster on every CPU: the consumer's control plane competes with the provider's
    /// nodes, which no pair of real clusters does.
    Shared,
}

impl Cores {
    fn parse() -> Result<Self> {
        let args: Vec<String> = std::env::args().collect();
        let layout = args
            .iter()
            .position(|a| a == "--cores")
            .map(|i| args.get(i + 1).map(String::as_str).unwrap_or_default())
            .unwrap_or("shared");
        match layout {
            "shared" => Ok(Self::Shared),
            "own" => {
                let all = common::cpus()?;
                if all.len() < 2 {
                    return Err(format!(
                        "--cores own needs two CPUs or more, this process may use {all:?}; \
                         give --cores shared"
                    ));
                }
                let (consumer, provider) = all.split_at(all.len() / 2);
                Ok(Self::Own {
                    consumer: consumer.to_vec(),
                    provider: provider.to_vec(),
                })
            }
            other => Err(format!("--cores {other:?}: give own or shared")),
        }
    }

    fn consumer(&self) -> Option<&[usize]> {
        match self {
            Self::Own { consumer, .. } => Some(consumer),
            Self::Shared => None,
        }
    }

    fn provider(&self) -> Option<&[usize]> {
        match self {
            Self::Own { provider, .. } => Some(provider),
            Self::Shared => None,
        }
    }

    fn describe(&self) -> String {
        match self {
            Self::Own { consumer, provider } => format!(
                "own cores: consumer and benchmark on CPUs {consumer:?}, provider and plain \
                 cluster on CPUs {provider:?}"
            ),
            Self::Shared => "shared cores: every cluster on every CPU".to_owned(),
        }
    }
}

fn sizes() -> Result<Vec<u64>> {
    let args: Vec<String> = std::env::args().collect();
    let Some(i) = args.iter().position(|a| a == "--pods") else {
        return Ok(vec![100, 1000]);
    };
    let list = args
        .get(i + 1)
        .ok_or("--pods needs a list such as 100,1000")?;
    let sizes: Vec<u64> = list
        .split(',')
        .map(|v| v.trim().parse::<u64>())
        .collect::<std::result::Result<_, _>>()
        .map_err(|_| format!("--pods {list}: give pod counts such as 100,1000"))?;
    if sizes.is_empty() || sizes.contains(&0) {
        return Err(format!("--pods {list}: every size must be at least 1"));
    }
    Ok(sizes)
}

struct Idle {
    controller_bytes: u64,
    underlay_bytes: u64,
    secs: f64,
    mcpu: f64,
    provider_requests: Vec<(String, u64)>,
    consumer_requests: Vec<(String, u64)>,
    /// Every request key's increase at the provider, for the attribution.
    provider_all: BTreeMap<String, u64>,
}

/// What one size gave.
struct Row {
    pods: u64,
    plain: Duration,
    offloaded: Duration,
    provider_all_ready: Duration,
    lags: Vec<f64>,
    /// Per pod: first seen in the consumer to first seen at the provider.
    to_provider: Vec<f64>,
    /// Per pod: first seen at the provider to Ready there.
    provider_start: Vec<f64>,
    /// Per pod: first seen in the consumer to first seen bound to the virtual node.
    to_bound: Vec<f64>,
    /// Where the CPU went during the plain and the offloaded burst.
    plain_cpu: CpuUse,
    offloaded_cpu: CpuUse,
    /// Per pod in the plain cluster: first seen to Ready, and to bound to a node.
    plain_start: Vec<f64>,
    plain_bound: Vec<f64>,
    unmatched: usize,
    /// The idle window again with the consumer's controller stopped (the last size only).
    frozen: Option<Idle>,
    rss_ready_kib: (u64, u64),
    rss_idle_kib: (u64, u64),
    burst_controller_bytes: u64,
    /// The controller's burst traffic by direction: to the provider, from it.
    burst_directions: [Counted; 2],
    burst_underlay_bytes: u64,
    burst_provider_requests: Vec<(String, u64)>,
    burst_consumer_requests: Vec<(String, u64)>,
    idle: Idle,
    deletion: Duration,
}

/// The machine's CPU over a burst: busy share of all cores, and the largest users by process
/// group (see [`cpu_by_group`]) in CPU-seconds.
struct CpuUse {
    busy: f64,
    top: Vec<(String, u64)>,
}

/// Readings to take a [`CpuUse`] from.
struct CpuMark {
    machine: (u64, u64),
    groups: BTreeMap<String, u64>,
}

impl CpuMark {
    fn now(tags: &[&str]) -> Result<Self> {
        Ok(Self {
            machine: machine_ticks()?,
            groups: cpu_by_group(tags),
        })
    }

    fn since(&self, tags: &[&str]) -> Result<CpuUse> {
        let later = Self::now(tags)?;
        let busy = (later.machine.0 - self.machine.0) as f64
            / (later.machine.1 - self.machine.1).max(1) as f64;
        Ok(CpuUse {
            busy,
            top: top_increases(&self.groups, &later.groups, 10),
        })
    }
}

impl std::fmt::Display for CpuUse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "machine {:.0}% busy; CPU-s:", self.busy * 100.0)?;
        for (k, ticks) in &self.top {
            // USER_HZ is 100.
            write!(f, " {k} {:.1}", *ticks as f64 / 100.0)?;
        }
        Ok(())
    }
}

struct Meters {
    consumer: Cluster,
    provider: Cluster,
    controller: NftCounters,
    underlay: NftCounters,
}

impl Meters {
    fn pid(&self) -> Result<u32> {
        tetherd_controller(CONSUMER_ID).ok_or_else(|| "no consumer controller process".to_owned())
    }

    /// `over` of quiet: bytes, controller CPU and the API servers' requests.
    fn idle(&self, over: Duration) -> Result<Idle> {
        let pid = self.pid()?;
        let (p0, c0) = (api_requests(&self.provider)?, api_requests(&self.consumer)?);
        let (b0, u0, t0) = (
            self.controller.read()?,
            self.underlay.read()?,
            cpu_ticks(pid)?,
        );
        let start = Instant::now();
        std::thread::sleep(over);
        let (b1, u1, t1) = (
            self.controller.read()?,
            self.underlay.read()?,
            cpu_ticks(pid)?,
        );
        let secs = start.elapsed().as_secs_f64();
        let (p1, c1) = (api_requests(&self.provider)?, api_requests(&self.consumer)?);
        Ok(Idle {
            controller_bytes: b1 - b0,
            underlay_bytes: u1 - u0,
            secs,
            // USER_HZ is 100: a tick is 10 ms.
            mcpu: (t1 - t0) as f64 * 10.0 / secs,
            provider_requests: top_increases(&p0, &p1, 6),
            provider_all: top_increases(&p0, &p1, usize::MAX).into_iter().collect(),
            consumer_requests: top_increases(&c0, &c1, 6),
        })
    }
}

fn run() -> Result {
    let sizes = sizes()?;
    let idle_for = Duration::from_secs(arg("--idle-secs", 60)?);
    let attribute = Duration::from_secs(arg("--attribute-secs", 30)?);
    let largest = sizes.iter().copied().max().unwrap_or(100);
    let nodes = arg("--nodes", largest / 100 + 1)?;
    let nodes = u8::try_from(nodes)
        .ok()
        .filter(|n| *n >= 1)
        .ok_or_else(|| format!("--nodes {nodes}: give 1 to 100"))?;
    if u64::from(nodes) * 110 < largest + 20 {
        return Err(format!(
            "--nodes {nodes}: {largest} pods need more nodes (110 pods each, some taken by Tether)"
        ));
    }
    let cores = Cores::parse()?;
    let pid = std::process::id();
    let mut bench = Bench::new("offloading")?;
    let started = Instant::now();
    // Each cluster's processes inherit this thread's CPUs, and so does every thread and
    // child this benchmark starts after the last change: all before the first thread.
    if let Some(cpus) = cores.provider() {
        common::pin_self(cpus)?;
    }
    let provider = bench.up(&format!("op{pid}"), nodes)?;
    let plain = bench.up(&format!("ob{pid}"), nodes)?;
    if let Some(cpus) = cores.consumer() {
        common::pin_self(cpus)?;
    }
    let consumer = bench.up(&format!("oc{pid}"), 1)?;
    eprintln!(
        "clusters up in {:.0}s ({nodes} nodes each for the provider and the plain cluster; {})",
        started.elapsed().as_secs_f64(),
        cores.describe()
    );
    bench.tether(&consumer, &["install", "--cluster-id", CONSUMER_ID])?;
    bench.tether(&provider, &["install", "--cluster-id", PROVIDER_ID])?;
    let pods = (largest + 20).to_string();
    bench.tether(
        &consumer,
        &[
            "peer",
            "--remote-kubeconfig",
            path(&provider),
            "--cpu",
            "2",
            "--memory",
            "4Gi",
            "--pods",
            &pods,
            "--timeout",
            "5m",
        ],
    )?;
    kubectl(&consumer, &["create", "namespace", NS])?;
    kubectl(&plain, &["create", "namespace", NS])?;
    bench.tether(
        &consumer,
        &[
            "offload",
            "namespace",
            NS,
            "--pod-offloading-strategy",
            "Remote",
            "--timeout",
            "2m",
        ],
    )?;
    let twin = kubectl(
        &consumer,
        &[
            "get",
            "namespaceoffloadings.offloading.tether.dev",
            "-n",
            NS,
            "offloading",
            "-o",
            "jsonpath={.status.remoteNamespaceName}",
        ],
    )?;
    if twin.is_empty() {
        return Err("the NamespaceOffloading names no twin namespace".into());
    }
    eprintln!(
        "Tether installed, peered and {NS} offloaded (twin {twin}) after {:.0}s",
        started.elapsed().as_secs_f64()
    );

    // The provider's ranges in the underlay, from its first node's address (198.18.P.11).
    let node_ip = kubectl(
        &provider,
        &[
            "get",
            "nodes",
            "-o",
            "jsonpath={.items[0].status.addresses[?(@.type==\"InternalIP\")].address}",
        ],
    )?;
    let p = node_ip
        .split('.')
        .nth(2)
        .ok_or_else(|| format!("unexpected node address {node_ip:?}"))?;
    let consumer_ip = kubectl(
        &consumer,
        &[
            "get",
            "nodes",
            &format!("{}-node-1", consumer.0),
            "-o",
            "jsonpath={.status.addresses[?(@.type==\"InternalIP\")].address}",
        ],
    )?;
    let c = consumer_ip
        .split('.')
        .nth(2)
        .ok_or_else(|| format!("unexpected node address {consumer_ip:?}"))?;
    let provider_ranges = format!("{{ 198.18.{p}.0/24, 198.19.{p}.0/24 }}");
    let consumer_ranges = format!("{{ 198.18.{c}.0/24, 198.19.{c}.0/24 }}");
    let controller_ns = pod_netns(
        &consumer,
        "tether-system",
        "app.kubernetes.io/name=tether-controller",
    )?;
    let meters = Meters {
        controller: NftCounters::install(
            &controller_ns,
            "tetherbench",
            &[
                format!("ip daddr {provider_ranges}"),
                format!("ip saddr {provider_ranges}"),
            ],
        )?,
        underlay: NftCounters::install(
            &bench.underlay,
            "tetherbench",
            &[
                format!("ip saddr {consumer_ranges} ip daddr {provider_ranges}"),
                format!("ip saddr {provider_ranges} ip daddr {consumer_ranges}"),
            ],
        )?,
        consumer: consumer.clone(),
        provider: provider.clone(),
    };

    let rt = Runtime::new().map_err(|e| format!("tokio runtime: {e}"))?;
    let (cc, pc, bc) = rt.block_on(async {
        Ok::<_, String>((
            client_of(&consumer).await?,
            client_of(&provider).await?,
            client_of(&plain).await?,
        ))
    })?;
    let consumer_pods = PodWatch::start(&rt, cc.clone(), NS);
    let provider_pods = PodWatch::start(&rt, pc, &twin);
    let plain_pods = PodWatch::start(&rt, bc.clone(), NS);
    for w in [&consumer_pods, &provider_pods, &plain_pods] {
        w.wait_listed()?;
    }

    eprintln!(
        "measuring {}s idle with no pod offloaded ...",
        idle_for.as_secs()
    );
    let idle0 = meters.idle(idle_for)?;
    let rss0 = memory_kib(meters.pid()?)?;

    let tags = [
        CONSUMER_ID,
        PROVIDER_ID,
        consumer.0.as_str(),
        provider.0.as_str(),
        plain.0.as_str(),
    ];
    let mut rows = Vec::new();
    for &n in &sizes {
        let name = format!("burst-{n}");
        // The plain cluster first, gone again before the offloaded burst starts.
        quiet("before the plain burst", QUIET_LIMIT)?;
        let mark = CpuMark::now(&tags)?;
        let (_, plain_took) = burst(&rt, &bc, &plain_pods, &name, n, "plain")?;
        let plain_cpu = mark.since(&tags)?;
        let (plain_start, plain_bound) = plain_pods.with(|s| (s.start_times(), s.bind_times()));
        delete(&plain, &name)?;
        plain_pods.wait_empty("the plain burst's pods gone", Duration::from_secs(300))?;

        quiet("before the offloaded burst", QUIET_LIMIT)?;
        provider_pods.with(Seen::forget);
        let (d0, u0) = (meters.controller.by_match()?, meters.underlay.read()?);
        let (req0, creq0) = (api_requests(&provider)?, api_requests(&consumer)?);
        let mark = CpuMark::now(&tags)?;
        let (t0, took) = burst(&rt, &cc, &consumer_pods, &name, n, "offloaded")?;
        let offloaded_cpu = mark.since(&tags)?;
        let (d1, u1) = (meters.controller.by_match()?, meters.underlay.read()?);
        let (req1, creq1) = (api_requests(&provider)?, api_requests(&consumer)?);
        let rss_ready = memory_kib(meters.pid()?)?;
        let (remote_created, remote_ready) =
            provider_pods.with(|s| (s.created.clone(), s.ready.clone()));
        let provider_last = remote_ready.values().max().copied();
        let (mut lags, mut to_provider, mut provider_start, mut unmatched) =
            (Vec::new(), Vec::new(), Vec::new(), 0);
        let to_bound = consumer_pods.with(|s| s.bind_times());
        consumer_pods.with(|s| {
            for (pod, here) in &s.ready {
                match (remote_created.get(pod), remote_ready.get(pod)) {
                    (Some(made), Some(there)) => {
                        lags.push(secs(*there, *here));
                        provider_start.push(secs(*made, *there));
                        if let Some(asked) = s.created.get(pod) {
                            to_provider.push(secs(*asked, *made));
                        }
                    }
                    _ => unmatched += 1,
                }
            }
        });
        for v in [&mut lags, &mut to_provider, &mut provider_start] {
            v.sort_by(f64::total_cmp);
        }
        eprintln!(
            "settling {}s, then {}s idle ...",
            SETTLE.as_secs(),
            idle_for.as_secs()
        );
        std::thread::sleep(SETTLE);
        let idle = meters.idle(idle_for)?;
        let rss_idle = memory_kib(meters.pid()?)?;
        let frozen = if n == *sizes.last().unwrap_or(&n) && !attribute.is_zero() {
            eprintln!(
                "{}s idle with the consumer's controller stopped ...",
                attribute.as_secs()
            );
            let stopped = Frozen::new(meters.pid()?)?;
            let f = meters.idle(attribute);
            drop(stopped);
            Some(f?)
        } else {
            None
        };

        let deleting = Instant::now();
        delete(&consumer, &name)?;
        let limit = Duration::from_secs(120 + n * 6 / 10);
        consumer_pods.wait_empty("the offloaded pods gone from the consumer", limit)?;
        provider_pods.wait_empty("the offloaded pods gone from the provider", limit)?;
        let deletion = deleting.elapsed();
        eprintln!("offloaded pods deleted in {:.1}s", deletion.as_secs_f64());
        rows.push(Row {
            pods: n,
            plain: plain_took,
            offloaded: took,
            provider_all_ready: provider_last.map_or(Duration::ZERO, |l| l - t0),
            lags,
            to_provider,
            provider_start,
            to_bound,
            plain_cpu,
            offloaded_cpu,
            plain_start,
            plain_bound,
            unmatched,
            frozen,
            rss_ready_kib: rss_ready,
            rss_idle_kib: rss_idle,
            burst_controller_bytes: (0..2).map(|i| (d1[i] - d0[i]).bytes).sum(),
            burst_directions: [d1[0] - d0[0], d1[1] - d0[1]],
            burst_underlay_bytes: u1 - u0,
            burst_provider_requests: top_increases(&req0, &req1, 8),
            burst_consumer_requests: top_increases(&creq0, &creq1, 10),
            idle,
            deletion,
        });
    }

    report(nodes, &cores, &idle0, rss0, &rows);
    Ok(())
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn kbit_s(bytes: u64, secs: f64) -> f64 {
    bytes as f64 * 8.0 / 1000.0 / secs.max(1e-9)
}

fn requests(list: &[(String, u64)]) -> String {
    list.iter()
        .map(|(k, n)| format!("{k} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn report(nodes: u8, cores: &Cores, idle0: &Idle, rss0: (u64, u64), rows: &[Row]) {
    println!(
        "\nprovider and plain cluster: {nodes} nodes each; consumer: 1 node; pods: sleeper, \
         requests cpu 1m memory 1Mi; {}",
        cores.describe()
    );
    println!(
        "controller before any burst: VmRSS {:.1} MiB, VmHWM {:.1} MiB; idle {:.0}s with no pod: \
         controller<->provider {:.2} kbit/s ({} B), all consumer<->provider {:.2} kbit/s, \
         controller {:.2} mCPU",
        mib(rss0.0),
        mib(rss0.1),
        idle0.secs,
        kbit_s(idle0.controller_bytes, idle0.secs),
        idle0.controller_bytes,
        kbit_s(idle0.underlay_bytes, idle0.secs),
        idle0.mcpu
    );
    println!(
        "  provider API requests: {}",
        requests(&idle0.provider_requests)
    );
    println!(
        "\n| pods | plain all Ready | offloaded all Ready | ratio | provider all Ready | lag p50 / p99 \
         | controller RSS / HWM at N | RSS after idle | burst ctrl<->provider | idle ctrl<->provider |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for r in rows {
        let secs = r.offloaded.as_secs_f64();
        println!(
            "| {} | {:.2} s | {:.2} s | {:.2}x | {:.2} s | {:.3} / {:.3} s | {:.1} / {:.1} MiB | \
             {:.1} MiB | {:.3} Mbit/s | {:.2} kbit/s |",
            r.pods,
            r.plain.as_secs_f64(),
            secs,
            secs / r.plain.as_secs_f64().max(1e-9),
            r.provider_all_ready.as_secs_f64(),
            pct(&r.lags, 0.5),
            pct(&r.lags, 0.99),
            mib(r.rss_ready_kib.0),
            mib(r.rss_ready_kib.1),
            mib(r.rss_idle_kib.0),
            kbit_s(r.burst_controller_bytes, secs) / 1000.0,
            kbit_s(r.idle.controller_bytes, r.idle.secs),
        );
    }
    for r in rows {
        let secs = r.offloaded.as_secs_f64();
        println!("\n{} pods:", r.pods);
        println!(
            "  lag: {} pods matched ({} without a provider Ready seen), min {:.3} s, max {:.3} s",
            r.lags.len(),
            r.unmatched,
            r.lags.first().copied().unwrap_or(f64::NAN),
            r.lags.last().copied().unwrap_or(f64::NAN)
        );
        let p50_max = |v: &[f64]| {
            format!(
                "p50 {:.3} s, p99 {:.3} s, max {:.3} s",
                pct(v, 0.5),
                pct(v, 0.99),
                v.last().copied().unwrap_or(f64::NAN)
            )
        };
        println!(
            "  per pod: consumer create seen -> bound to the virtual node {}",
            p50_max(&r.to_bound)
        );
        println!(
            "  per pod: plain cluster, pod seen -> bound to a node {}",
            p50_max(&r.plain_bound)
        );
        println!("  CPU, plain burst: {}", r.plain_cpu);
        println!("  CPU, offloaded burst: {}", r.offloaded_cpu);
        println!(
            "  per pod: consumer create seen -> pod at the provider {}",
            p50_max(&r.to_provider)
        );
        println!(
            "  per pod: pod at the provider -> Ready there {}",
            p50_max(&r.provider_start)
        );
        println!(
            "  per pod: plain cluster, pod seen -> Ready {}",
            p50_max(&r.plain_start)
        );
        println!(
            "  burst: controller<->provider {} B ({:.0} B per pod, {:.3} Mbit/s); all \
             consumer<->provider {} B ({:.3} Mbit/s)",
            r.burst_controller_bytes,
            r.burst_controller_bytes as f64 / r.pods as f64,
            kbit_s(r.burst_controller_bytes, secs) / 1000.0,
            r.burst_underlay_bytes,
            kbit_s(r.burst_underlay_bytes, secs) / 1000.0
        );
        let [to, from] = r.burst_directions;
        let per_pod = |c: Counted| {
            (
                c.bytes as f64 / r.pods as f64,
                c.packets as f64 / r.pods as f64,
            )
        };
        let ((tb, tp), (fb, fp)) = (per_pod(to), per_pod(from));
        println!(
            "  burst, per pod: controller->provider {tb:.0} B in {tp:.1} packets; \
             provider->controller {fb:.0} B in {fp:.1} packets"
        );
        println!(
            "  burst: provider API requests (all clients): {}",
            requests(&r.burst_provider_requests)
        );
        println!(
            "  burst: consumer API requests (all clients): {}",
            requests(&r.burst_consumer_requests)
        );
        println!(
            "  idle {:.0}s with {} pods: controller<->provider {} B ({:.2} kbit/s); all \
             consumer<->provider {:.2} kbit/s; controller {:.2} mCPU",
            r.idle.secs,
            r.pods,
            r.idle.controller_bytes,
            kbit_s(r.idle.controller_bytes, r.idle.secs),
            kbit_s(r.idle.underlay_bytes, r.idle.secs),
            r.idle.mcpu
        );
        println!(
            "  idle: provider API requests: {}",
            requests(&r.idle.provider_requests)
        );
        println!(
            "  idle: consumer API requests: {}",
            requests(&r.idle.consumer_requests)
        );
        println!(
            "  controller RSS before any burst {:.1} MiB -> {:.1} MiB after idle: {:.1} KiB per \
             pod; deletion of all {} took {:.1} s",
            mib(rss0.0),
            mib(r.rss_idle_kib.0),
            (r.rss_idle_kib.0 as f64 - rss0.0 as f64) / r.pods as f64,
            r.pods,
            r.deletion.as_secs_f64()
        );
    }
    for r in rows {
        let Some(f) = &r.frozen else { continue };
        println!(
            "\nattribution at {} pods: {:.0}s with the consumer's controller stopped: \
             controller<->provider {} B, all consumer<->provider {:.2} kbit/s",
            r.pods,
            f.secs,
            f.controller_bytes,
            kbit_s(f.underlay_bytes, f.secs)
        );
        // What the provider served per minute while idle, less what it served per minute with
        // the consumer's controller stopped: the consumer controller's own requests.
        let mut share: Vec<(String, f64)> = r
            .idle
            .provider_all
            .iter()
            .map(|(k, n)| {
                let without = f.provider_all.get(k).copied().unwrap_or(0) as f64 * 60.0 / f.secs;
                (k.clone(), *n as f64 * 60.0 / r.idle.secs - without)
            })
            .filter(|(_, d)| *d >= 1.0)
            .collect();
        share.sort_by(|a, b| b.1.total_cmp(&a.1));
        println!(
            "  the consumer controller's requests to the provider per minute (idle less stopped): \
             {}",
            share
                .iter()
                .map(|(k, d)| format!("{k} {d:.0}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    for w in rows.windows(2) {
        let (a, b) = (&w[0], &w[1]);
        if b.pods > a.pods {
            println!(
                "\ncontroller RSS per extra offloaded pod, {} -> {}: {:.1} KiB at N Ready, {:.1} \
                 KiB after idle",
                a.pods,
                b.pods,
                (b.rss_ready_kib.0 as f64 - a.rss_ready_kib.0 as f64) / (b.pods - a.pods) as f64,
                (b.rss_idle_kib.0 as f64 - a.rss_idle_kib.0 as f64) / (b.pods - a.pods) as f64,
            );
        }
    }
}
