//! Pod start-up benchmark of a simulated cluster: brings up a fresh cluster of its own (unique
//! name, underlay namespace and state directory), creates N `simkube.dev/sleeper` pods through
//! the API with a bounded number of requests in flight, watches until all are Running and Ready,
//! deletes them and waits until they are gone, then brings the cluster down again (also on an
//! error, a panic or Ctrl-C).
//!
//! It prints the time until all pods are Running and Ready, pods per second, the spread of
//! per-pod creation-to-Ready latencies, the node agents' RSS before, with and after the pods (and
//! per pod), the API server daemon's RSS, the container processes' memory and the load average.
//!
//! Run as root:
//! `cargo run --release -p simkube-cluster --example pods -- [--pods 200] [--nodes 2]`

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{IsTerminal as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::Parser;
use futures::{StreamExt as _, stream};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::{self, Event};
use simkube_cluster::state::{ClusterRecord, StateDir};
use simkube_cluster::{ops, proc, topology};
use tokio::signal::unix::{Signal, SignalKind, signal};

/// The label every benchmark pod carries (value: the cluster name).
const LABEL: &str = "simkube.dev/benchmark";
/// How long the agents get after a phase before their memory is read (status writes, log
/// buffers and allocator caches settle).
const SETTLE: Duration = Duration::from_secs(3);

#[derive(Debug, Parser)]
#[command(about = "Start pods on a fresh simulated cluster and measure start-up time and memory")]
struct Args {
    /// Number of pods.
    #[arg(long, default_value_t = 200)]
    pods: usize,
    /// Number of nodes.
    #[arg(long, default_value_t = 2)]
    nodes: u8,
    /// Create and delete requests in flight at once.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Give up when the pods are not all Running and Ready (or all gone) after this many seconds.
    #[arg(long, default_value_t = 600)]
    timeout: u64,
    /// The `simkube` executable (default: the one of this example's build profile, built first
    /// when run through cargo).
    #[arg(long)]
    simkube: Option<PathBuf>,
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> anyhow::Result<()> {
    if args.pods == 0 {
        bail!("--pods 0: nothing to measure; ask for at least one pod");
    }
    if args.concurrency == 0 {
        bail!("--concurrency 0: at least one request must be in flight");
    }
    topology::validate_nodes(args.nodes)?;
    require_root()?;
    let simkube = match &args.simkube {
        Some(path) if path.is_file() => path.clone(),
        Some(path) => bail!("--simkube {}: no such file", path.display()),
        None => simkube_binary()?,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    // Registered before anything is created: from here on Ctrl-C and SIGTERM end the benchmark
    // through the cluster guard instead of killing the process with the cluster still up.
    let mut interrupts = runtime.block_on(async { Interrupts::new() })?;
    let mut cluster = ClusterGuard::new(args.nodes)?;
    let outcome = bench(args, &simkube, &runtime, &mut interrupts, &cluster);
    // A failure's logs are worth keeping; an interruption's are not.
    if outcome
        .as_ref()
        .is_err_and(|e| e.downcast_ref::<Interrupted>().is_none())
    {
        cluster.keep_logs = true;
    }
    drop(cluster);
    outcome
}

/// Everything between `cluster up` and `cluster down`.
fn bench(
    args: &Args,
    simkube: &Path,
    runtime: &tokio::runtime::Runtime,
    interrupts: &mut Interrupts,
    cluster: &ClusterGuard,
) -> anyhow::Result<()> {
    let load_start = load_average()?;
    eprintln!(
        "bringing up cluster {} ({} nodes, underlay {}, state {})",
        cluster.name,
        args.nodes,
        cluster.underlay,
        cluster.state_dir().display()
    );
    let record = runtime.block_on(cluster.up(args, simkube, interrupts))?;
    let state = StateDir::new(cluster.state_dir());
    let agents_before = agents(&state, &record)?;
    let daemon_before = daemon_rss(&record)?;
    eprintln!(
        "cluster up; creating {} pods ({} requests in flight)",
        args.pods, args.concurrency
    );
    let mut run = runtime.block_on(async {
        let client = ops::client_from(&cluster.kubeconfig()).await?;
        let api: Api<Pod> = Api::namespaced(client, "default");
        let selector = format!("{LABEL}={}", cluster.name);
        let events = watcher::watcher(api.clone(), watcher::Config::default().labels(&selector))
            .default_backoff()
            .boxed();
        let mut run = Run {
            api,
            events,
            tracker: Tracker::default(),
            args,
            cluster_name: &cluster.name,
        };
        tokio::select! {
            result = run.start() => result.map(|()| run),
            () = interrupts.recv() => Err(interrupted()),
        }
    })?;
    let agents_with_pods = runtime.block_on(settle(interrupts)).and_then(|()| {
        let now = agents(&state, &record)?;
        check_same_agents(&agents_before, &now, &state, &record)?;
        Ok(now)
    })?;
    let daemon_with_pods = daemon_rss(&record)?;
    let containers =
        containers_memory(&agents_with_pods.iter().map(|a| a.pid).collect::<Vec<_>>())?;
    if containers.processes == 0 {
        bail!("no container process found under the node agents although every pod is Ready");
    }
    let load_ready = load_average()?;
    eprintln!("all pods Running and Ready; deleting them");
    let deleted = runtime.block_on(async {
        tokio::select! {
            result = run.delete() => result,
            () = interrupts.recv() => Err(interrupted()),
        }
    })?;
    let agents_after = runtime.block_on(settle(interrupts)).and_then(|()| {
        let now = agents(&state, &record)?;
        check_same_agents(&agents_before, &now, &state, &record)?;
        Ok(now)
    })?;
    let left = containers_memory(&agents_after.iter().map(|a| a.pid).collect::<Vec<_>>())?;
    let load_end = load_average()?;

    let tracker = &run.tracker;
    let ready_after = tracker
        .all_ready
        .context("invariant: the start phase ends with every pod Ready")?;
    let latencies = tracker.latencies();
    let scheduling = tracker.scheduling_latencies();
    let pods = args.pods;
    let per_node = tracker.per_node();
    let sum = |agents: &[Agent]| agents.iter().map(|a| a.rss_kib).sum::<u64>();
    let (before, with_pods, after) = (
        sum(&agents_before),
        sum(&agents_with_pods),
        sum(&agents_after),
    );
    println!();
    println!(
        "simkube pods benchmark: {pods} simkube.dev/sleeper pods on {} nodes, {} requests in \
         flight (cluster {}, index {})",
        record.nodes, args.concurrency, record.name, record.index
    );
    println!(
        "  load average (1/5/15 min)  at start {load_start}, all Ready {load_ready}, end {load_end}"
    );
    println!(
        "  all created after          {:.2} s ({:.1} creates/s)",
        secs(tracker.all_created.unwrap_or(ready_after)),
        pods as f64 / secs(tracker.all_created.unwrap_or(ready_after)).max(1e-9)
    );
    println!(
        "  all Running and Ready      {:.2} s ({:.1} pods/s)",
        secs(ready_after),
        pods as f64 / secs(ready_after).max(1e-9)
    );
    println!(
        "  creation to bound per pod  p50 {:.2} s, p90 {:.2} s, max {:.2} s (the scheduler)",
        secs(percentile(&scheduling, 50)),
        secs(percentile(&scheduling, 90)),
        secs(percentile(&scheduling, 100)),
    );
    println!(
        "  creation to Ready per pod  p50 {:.2} s, p90 {:.2} s, max {:.2} s",
        secs(percentile(&latencies, 50)),
        secs(percentile(&latencies, 90)),
        secs(percentile(&latencies, 100)),
    );
    println!(
        "  pods per node              {}",
        per_node
            .iter()
            .map(|(node, n)| format!("{node} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "  node agents RSS (sum)      {} before, {} with the pods, {} after deleting them",
        mib(before),
        mib(with_pods),
        mib(after)
    );
    for ((b, w), a) in agents_before
        .iter()
        .zip(&agents_with_pods)
        .zip(&agents_after)
    {
        println!(
            "    {:<24} {} / {} / {} (PID {})",
            b.node,
            mib(b.rss_kib),
            mib(w.rss_kib),
            mib(a.rss_kib),
            b.pid
        );
    }
    println!(
        "  node agent RSS per pod     {:.0} KiB",
        with_pods.saturating_sub(before) as f64 / pods as f64
    );
    println!(
        "  container processes        {} running, {:.0} KiB PSS each ({} PSS, {} RSS in all)",
        containers.processes,
        containers.pss_kib as f64 / containers.processes as f64,
        mib(containers.pss_kib),
        mib(containers.rss_kib)
    );
    println!(
        "  API server daemon RSS      {} before, {} with the pods",
        mib(daemon_before),
        mib(daemon_with_pods)
    );
    println!(
        "  all deleted pods gone      {:.2} s ({:.1} pods/s)",
        secs(deleted),
        pods as f64 / secs(deleted).max(1e-9)
    );
    println!(
        "  container processes left   {} (after the pods were gone and {} s more)",
        left.processes,
        SETTLE.as_secs()
    );
    if containers.processes != pods {
        println!(
            "  note: {} container processes for {pods} pods",
            containers.processes
        );
    }
    if left.processes > 0 {
        bail!(
            "{} container processes outlived their deleted pods: the node agents did not stop \
             them (see their logs)",
            left.processes
        );
    }
    Ok(())
}

/// The two phases against the API: creating the pods until all are Ready, deleting them until
/// all are gone. One watch (label selector of this run) sees both.
struct Run<'a> {
    api: Api<Pod>,
    events: futures::stream::BoxStream<'static, Result<Event<Pod>, watcher::Error>>,
    tracker: Tracker,
    args: &'a Args,
    cluster_name: &'a str,
}

impl Run<'_> {
    /// Waits for the watch's first listing, then creates the pods and watches until all are
    /// Running and Ready.
    async fn start(&mut self) -> anyhow::Result<()> {
        // The watch is listed before the first create, so no pod's first Ready can be missed.
        while !self.tracker.listed {
            self.next_event().await?;
        }
        let pods = self.args.pods;
        let started = Instant::now();
        self.tracker.started = Some(started);
        let deadline = started + Duration::from_secs(self.args.timeout);
        let label = self.cluster_name.to_owned();
        let api = self.api.clone();
        let mut creates = stream::iter(0..pods)
            .map(|i| {
                let api = api.clone();
                let pod = sleeper(&format!("sleeper-{i}"), &label);
                async move {
                    let sent = Instant::now();
                    let result = api.create(&PostParams::default(), &pod).await;
                    (pod.metadata.name.unwrap_or_default(), sent, result)
                }
            })
            .buffer_unordered(self.args.concurrency);
        let mut creating = true;
        let mut progress = Progress::new("Running and Ready");
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                created = creates.next(), if creating => match created {
                    Some((name, sent, Ok(_))) => {
                        self.tracker.sent.insert(name, sent);
                        if self.tracker.sent.len() == pods {
                            self.tracker.all_created = Some(started.elapsed());
                        }
                    }
                    Some((name, _, Err(error))) => {
                        bail!("creating pod default/{name} failed: {error}");
                    }
                    None => creating = false,
                },
                event = self.events.next() => self.observe(event)?,
                _ = tick.tick() => {
                    progress.line(started, &format!(
                        "created {}/{pods}, scheduled {}, Running and Ready {}/{pods}",
                        self.tracker.sent.len(),
                        self.tracker.nodes.len(),
                        self.tracker.ready.len(),
                    ));
                    if Instant::now() > deadline {
                        bail!(
                            "only {} of {pods} pods Running and Ready after {} s; not ready: {}",
                            self.tracker.ready.len(),
                            self.args.timeout,
                            self.tracker.not_ready_summary(5),
                        );
                    }
                }
            }
            if self.tracker.ready.len() == pods && self.tracker.sent.len() == pods {
                self.tracker.all_ready = Some(started.elapsed());
                progress.finish(
                    started,
                    &format!("created {pods}/{pods}, Running and Ready {pods}/{pods}"),
                );
                return Ok(());
            }
        }
    }

    /// Deletes every pod and watches until all are gone; returns how long that took.
    async fn delete(&mut self) -> anyhow::Result<Duration> {
        let pods = self.args.pods;
        let started = Instant::now();
        let deadline = started + Duration::from_secs(self.args.timeout);
        let names: Vec<String> = self.tracker.present.iter().cloned().collect();
        let api = self.api.clone();
        let mut deletes = stream::iter(names)
            .map(|name| {
                let api = api.clone();
                async move {
                    let result = api.delete(&name, &DeleteParams::default()).await;
                    (name, result)
                }
            })
            .buffer_unordered(self.args.concurrency);
        let mut deleting = true;
        let mut accepted = 0usize;
        let mut progress = Progress::new("gone");
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                deleted = deletes.next(), if deleting => match deleted {
                    Some((_, Ok(_))) => accepted += 1,
                    // Already gone: fine, that is what is being waited for.
                    Some((_, Err(kube::Error::Api(status)))) if status.is_not_found() => {
                        accepted += 1;
                    }
                    Some((name, Err(error))) => {
                        bail!("deleting pod default/{name} failed: {error}");
                    }
                    None => deleting = false,
                },
                event = self.events.next() => self.observe(event)?,
                _ = tick.tick() => {
                    progress.line(started, &format!(
                        "deletes accepted {accepted}/{pods}, gone {}/{pods}",
                        pods - self.tracker.present.len().min(pods),
                    ));
                    if Instant::now() > deadline {
                        bail!(
                            "{} of {pods} pods still exist {} s after their deletion: {}",
                            self.tracker.present.len(),
                            self.args.timeout,
                            self.tracker.present.iter().take(5).cloned().collect::<Vec<_>>().join(", ")
                        );
                    }
                }
            }
            if !deleting && self.tracker.present.is_empty() {
                progress.finish(started, &format!("gone {pods}/{pods}"));
                return Ok(started.elapsed());
            }
        }
    }

    async fn next_event(&mut self) -> anyhow::Result<()> {
        let event = self.events.next().await;
        self.observe(event)
    }

    fn observe(&mut self, event: Option<Result<Event<Pod>, watcher::Error>>) -> anyhow::Result<()> {
        match event {
            Some(Ok(event)) => {
                self.tracker.observe(event, Instant::now());
                Ok(())
            }
            Some(Err(error)) => {
                // The watcher lists again after a back-off; say so, the figures may suffer.
                eprintln!("warning: the pod watch failed ({error}); it is restarted");
                Ok(())
            }
            None => bail!("the pod watch ended unexpectedly"),
        }
    }
}

/// What the watch has seen of this run's pods.
#[derive(Debug, Default)]
struct Tracker {
    /// Whether the watch's first listing is complete.
    listed: bool,
    /// When the first create request went out.
    started: Option<Instant>,
    /// When each pod's create request went out (only pods whose creation succeeded).
    sent: HashMap<String, Instant>,
    /// When each pod was first seen Running and Ready.
    ready: HashMap<String, Instant>,
    /// The node of each scheduled pod.
    nodes: HashMap<String, String>,
    /// When each pod was first seen bound to a node.
    scheduled: HashMap<String, Instant>,
    /// Why each not-yet-ready pod is not ready, as last seen.
    waiting: HashMap<String, String>,
    /// Pods that exist now.
    present: HashSet<String>,
    /// Pods listed since the watch (re)started, until the listing is complete.
    relisting: Option<HashSet<String>>,
    /// Time from the first create to the last successful one.
    all_created: Option<Duration>,
    /// Time from the first create until every pod was Running and Ready.
    all_ready: Option<Duration>,
}

impl Tracker {
    fn observe(&mut self, event: Event<Pod>, now: Instant) {
        match event {
            Event::Init => self.relisting = Some(HashSet::new()),
            Event::InitApply(pod) => {
                if let (Some(listed), Some(name)) = (&mut self.relisting, pod.metadata.name.clone())
                {
                    listed.insert(name);
                }
                self.apply(&pod, now);
            }
            Event::InitDone => {
                if let Some(listed) = self.relisting.take() {
                    // Pods deleted while the watch was down produce no Delete event.
                    self.present = listed;
                }
                self.listed = true;
            }
            Event::Apply(pod) => self.apply(&pod, now),
            Event::Delete(pod) => {
                if let Some(name) = &pod.metadata.name {
                    self.present.remove(name);
                }
            }
        }
    }

    fn apply(&mut self, pod: &Pod, now: Instant) {
        let Some(name) = pod.metadata.name.clone() else {
            return;
        };
        self.present.insert(name.clone());
        if let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) {
            self.nodes.insert(name.clone(), node);
            self.scheduled.entry(name.clone()).or_insert(now);
        }
        if running_and_ready(pod) {
            self.waiting.remove(&name);
            self.ready.entry(name).or_insert(now);
        } else if !self.ready.contains_key(&name) {
            self.waiting.insert(name, why_not_ready(pod));
        }
    }

    /// Per pod: from its create request to its first Running and Ready, sorted.
    fn latencies(&self) -> Vec<Duration> {
        self.since_sent(&self.ready)
    }

    /// Per pod: from its create request to when the watch first showed it bound, sorted.
    fn scheduling_latencies(&self) -> Vec<Duration> {
        self.since_sent(&self.scheduled)
    }

    fn since_sent(&self, seen: &HashMap<String, Instant>) -> Vec<Duration> {
        let mut latencies: Vec<Duration> = seen
            .iter()
            .filter_map(|(name, ready)| {
                self.sent
                    .get(name)
                    .map(|sent| ready.saturating_duration_since(*sent))
            })
            .collect();
        latencies.sort();
        latencies
    }

    fn per_node(&self) -> BTreeMap<String, usize> {
        let mut per_node = BTreeMap::new();
        for node in self.nodes.values() {
            *per_node.entry(node.clone()).or_default() += 1;
        }
        per_node
    }

    fn not_ready_summary(&self, at_most: usize) -> String {
        let mut waiting: Vec<_> = self.waiting.iter().collect();
        waiting.sort();
        let mut lines: Vec<String> = waiting
            .iter()
            .take(at_most)
            .map(|(name, why)| {
                let node = self.nodes.get(*name).map_or("unscheduled", String::as_str);
                format!("{name} on {node}: {why}")
            })
            .collect();
        if waiting.len() > at_most {
            lines.push(format!("and {} more", waiting.len() - at_most));
        }
        if lines.is_empty() {
            lines.push("(no status seen yet)".to_owned());
        }
        lines.join("; ")
    }
}

/// A sleeper pod of this run.
fn sleeper(name: &str, run: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": {LABEL: run}},
        "spec": {
            "containers": [{"name": "sleeper", "image": "simkube.dev/sleeper"}],
            // A sleeper ends at once on SIGTERM; the default 30 s would only matter if it hung.
            "terminationGracePeriodSeconds": 5,
        },
    }))
    .expect("invariant: a valid Pod")
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

/// The phase and the first container's waiting or termination reason, for error messages.
fn why_not_ready(pod: &Pod) -> String {
    let Some(status) = &pod.status else {
        return "no status".to_owned();
    };
    let mut why = status
        .phase
        .clone()
        .unwrap_or_else(|| "no phase".to_owned());
    let container = status.container_statuses.iter().flatten().next();
    if let Some(state) = container.and_then(|c| c.state.as_ref()) {
        if let Some(waiting) = &state.waiting {
            why.push_str(&format!(
                ", waiting: {} {}",
                waiting.reason.as_deref().unwrap_or(""),
                waiting.message.as_deref().unwrap_or("")
            ));
        } else if let Some(terminated) = &state.terminated {
            why.push_str(&format!(
                ", terminated: exit {} {}",
                terminated.exit_code,
                terminated.reason.as_deref().unwrap_or("")
            ));
        }
    }
    why.trim_end().to_owned()
}

/// The benchmark's own cluster: unique name, underlay and state directory; brought down on drop
/// (after copying its logs somewhere that outlives it when the benchmark failed).
struct ClusterGuard {
    name: String,
    underlay: String,
    nodes: u8,
    /// `None` once kept on disk (its cluster could not be removed).
    state: Option<tempfile::TempDir>,
    /// Set when the benchmark failed: the logs are copied out before the cluster goes.
    keep_logs: bool,
}

impl ClusterGuard {
    fn new(nodes: u8) -> anyhow::Result<Self> {
        let pid = std::process::id();
        let state = tempfile::Builder::new()
            .prefix("simkube-bench-")
            .tempdir()
            .context("creating a temporary state directory")?;
        Ok(Self {
            name: format!("bench{pid}"),
            underlay: format!("skbench{pid}"),
            nodes,
            state: Some(state),
            keep_logs: false,
        })
    }

    fn state_dir(&self) -> &Path {
        self.state
            .as_ref()
            .map(tempfile::TempDir::path)
            .expect("invariant: the state directory is only kept while dropping")
    }

    fn kubeconfig(&self) -> PathBuf {
        self.state_dir().join("bench.kubeconfig")
    }

    /// `cluster up` (on a thread: it blocks); Ctrl-C meanwhile waits for it to finish, so the
    /// guard can then remove whatever it created.
    async fn up(
        &self,
        args: &Args,
        simkube: &Path,
        interrupts: &mut Interrupts,
    ) -> anyhow::Result<ClusterRecord> {
        let options = ops::UpOptions {
            name: self.name.clone(),
            nodes: self.nodes,
            kubeconfig_out: self.kubeconfig(),
            underlay: self.underlay.clone(),
            state_dir: self.state_dir().to_owned(),
            pod_cidr: "10.244.0.0/16".parse().expect("invariant: a valid CIDR"),
            service_cidr: "10.96.0.0/12".parse().expect("invariant: a valid CIDR"),
            images: Vec::new(),
            timeout: Duration::from_secs(args.timeout.min(300)),
            node_grace_seconds: simkube_cluster::state::DEFAULT_NODE_GRACE_SECONDS,
            cluster_signing_seconds: simkube_cluster::state::DEFAULT_CLUSTER_SIGNING_SECONDS,
            private_api: false,
            behind_nat: false,
            exe: simkube.to_owned(),
        };
        let mut up = tokio::task::spawn_blocking(move || {
            std::thread::spawn(move || ops::up(&options, &mut |line| eprintln!("  {line}")))
                .join()
                .map_err(|_| anyhow::anyhow!("cluster up panicked"))
        });
        let summary = tokio::select! {
            summary = &mut up => summary,
            () = interrupts.recv() => {
                eprintln!("interrupted: waiting for cluster up to finish, then removing the cluster");
                let _ = up.await;
                return Err(interrupted());
            }
        };
        let summary = summary
            .context("cluster up task")??
            .with_context(|| format!("bringing cluster {} up", self.name))?;
        Ok(summary.record)
    }
}

impl Drop for ClusterGuard {
    fn drop(&mut self) {
        let from = self.state_dir().join(&self.name);
        if (self.keep_logs || std::thread::panicking()) && from.is_dir() {
            let to = std::env::temp_dir().join(format!("{}-logs", self.name));
            match copy_logs(&from, &to) {
                Ok(()) => eprintln!("the cluster's logs are kept in {}", to.display()),
                Err(e) => eprintln!("could not keep the cluster's logs: {e}"),
            }
        }
        eprintln!("bringing cluster {} down", self.name);
        if let Err(error) = ops::down(self.state_dir(), &self.name, &mut |line| {
            eprintln!("  {line}");
        }) {
            eprintln!(
                "error: bringing cluster {} down failed: {error}; remove it with `simkube \
                 cluster down --name {} --state-dir {}`",
                self.name,
                self.name,
                self.state_dir().display()
            );
            // The state directory is what `cluster down` needs to finish the job: keep it.
            if let Some(state) = self.state.take() {
                let _ = state.keep();
            }
        }
    }
}

/// Copies `*.log` of the cluster directory and of its node directories (container logs).
fn copy_logs(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)?.flatten() {
        let path = entry.path();
        if path.is_dir() {
            copy_logs(&path, &to.join(entry.file_name()))?;
        } else if path.extension().is_some_and(|e| e == "log") {
            std::fs::copy(&path, to.join(entry.file_name()))?;
        }
    }
    Ok(())
}

/// Ctrl-C and SIGTERM, registered once for the whole run.
struct Interrupts {
    interrupt: Signal,
    terminate: Signal,
}

impl Interrupts {
    fn new() -> anyhow::Result<Self> {
        Ok(Self {
            interrupt: signal(SignalKind::interrupt()).context("installing the SIGINT handler")?,
            terminate: signal(SignalKind::terminate()).context("installing the SIGTERM handler")?,
        })
    }

    async fn recv(&mut self) {
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
        }
    }
}

/// The benchmark was interrupted (Ctrl-C or SIGTERM): not a failure of the cluster.
#[derive(Debug, thiserror::Error)]
#[error("interrupted")]
struct Interrupted;

fn interrupted() -> anyhow::Error {
    Interrupted.into()
}

/// Gives the agents a moment before their memory is read; Ctrl-C still ends the benchmark.
async fn settle(interrupts: &mut Interrupts) -> anyhow::Result<()> {
    tokio::select! {
        () = tokio::time::sleep(SETTLE) => Ok(()),
        () = interrupts.recv() => Err(interrupted()),
    }
}

/// A progress line per second: rewritten in place on a terminal, one line each 5 s otherwise.
struct Progress {
    what: &'static str,
    terminal: bool,
    last: Option<Instant>,
}

impl Progress {
    fn new(what: &'static str) -> Self {
        Self {
            what,
            terminal: std::io::stderr().is_terminal(),
            last: None,
        }
    }

    fn line(&mut self, started: Instant, text: &str) {
        let elapsed = started.elapsed().as_secs_f64();
        if self.terminal {
            eprint!("\r  {elapsed:6.1} s  {text}\x1b[K");
            let _ = std::io::stderr().flush();
        } else if self
            .last
            .is_none_or(|last| last.elapsed() >= Duration::from_secs(5))
        {
            self.last = Some(Instant::now());
            eprintln!("  {elapsed:6.1} s  {text}");
        }
    }

    fn finish(&mut self, started: Instant, text: &str) {
        let elapsed = started.elapsed().as_secs_f64();
        if self.terminal {
            eprintln!("\r  {elapsed:6.1} s  {text} ({} reached)\x1b[K", self.what);
        } else {
            eprintln!("  {elapsed:6.1} s  {text} ({} reached)", self.what);
        }
    }
}

/// One node agent as measured.
#[derive(Debug, Clone)]
struct Agent {
    node: String,
    pid: u32,
    rss_kib: u64,
}

/// The node agents by the PIDs the daemon recorded (`node-I.pid`), checked to be the agents.
fn agents(state: &StateDir, record: &ClusterRecord) -> anyhow::Result<Vec<Agent>> {
    record
        .plan()
        .node_plans()
        .into_iter()
        .map(|node| {
            let pid_file = state.file(&record.name, &format!("node-{}.pid", node.number));
            let pid: u32 = std::fs::read_to_string(&pid_file)
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .with_context(|| {
                    format!(
                        "the agent of {} has no PID in {}: is it running? (see node-{}.log)",
                        node.name,
                        pid_file.display(),
                        node.number
                    )
                })?;
            if !proc::is_agent(pid, &node.netns) {
                bail!(
                    "PID {pid} of {} is not its agent (any more): see {}",
                    node.name,
                    state
                        .file(&record.name, &format!("node-{}.log", node.number))
                        .display()
                );
            }
            let rss_kib = proc::rss_kib(pid)
                .with_context(|| format!("reading the RSS of the agent of {}", node.name))?;
            Ok(Agent {
                node: node.name,
                pid,
                rss_kib,
            })
        })
        .collect()
}

/// A restarted agent would make the memory figures meaningless (and is a bug worth reporting).
fn check_same_agents(
    before: &[Agent],
    now: &[Agent],
    state: &StateDir,
    record: &ClusterRecord,
) -> anyhow::Result<()> {
    for (b, n) in before.iter().zip(now) {
        if b.pid != n.pid {
            bail!(
                "the agent of {} was restarted during the benchmark (PID {} then {}): see {}",
                b.node,
                b.pid,
                n.pid,
                state.cluster_dir(&record.name).display()
            );
        }
    }
    Ok(())
}

fn daemon_rss(record: &ClusterRecord) -> anyhow::Result<u64> {
    let pid = record
        .daemon_pid
        .filter(|pid| proc::is_daemon(*pid, &record.name))
        .with_context(|| format!("the daemon of cluster {} is not running", record.name))?;
    proc::rss_kib(pid).context("reading the daemon's RSS")
}

/// Memory of the agents' descendants (the container processes).
#[derive(Debug, Default)]
struct Containers {
    processes: usize,
    rss_kib: u64,
    pss_kib: u64,
}

/// Fails when a process that still exists cannot be read: a figure of 0 would look like a
/// measurement.
fn containers_memory(agents: &[u32]) -> anyhow::Result<Containers> {
    let mut parents = HashMap::new();
    for entry in std::fs::read_dir("/proc")
        .context("listing /proc")?
        .flatten()
    {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid ...`: comm may contain anything, so split after its last ')'.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if let Some(ppid) = ppid {
            parents.insert(pid, ppid);
        }
    }
    let descends = |mut pid: u32| {
        // Bounded walk: PID 1's parent is 0.
        for _ in 0..64 {
            match parents.get(&pid) {
                Some(parent) if agents.contains(parent) => return true,
                Some(parent) if *parent > 1 => pid = *parent,
                _ => return false,
            }
        }
        false
    };
    let mut containers = Containers::default();
    for pid in parents.keys().copied().filter(|pid| descends(*pid)) {
        let rss = proc::rss_kib(pid);
        let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"));
        if !Path::new(&format!("/proc/{pid}")).exists() {
            // It exited between the listing and the reads: it is not counted at all.
            continue;
        }
        let rss = rss.with_context(|| format!("reading the RSS of container process {pid}"))?;
        let smaps = smaps.with_context(|| format!("reading /proc/{pid}/smaps_rollup"))?;
        let pss = smaps
            .lines()
            .find_map(|l| l.strip_prefix("Pss:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .with_context(|| format!("no Pss line in /proc/{pid}/smaps_rollup"))?;
        containers.processes += 1;
        containers.rss_kib += rss;
        containers.pss_kib += pss;
    }
    Ok(containers)
}

/// `/proc/loadavg`'s three averages.
fn load_average() -> anyhow::Result<String> {
    let text = std::fs::read_to_string("/proc/loadavg").context("reading /proc/loadavg")?;
    Ok(text
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" "))
}

/// Nearest-rank percentile of sorted durations.
fn percentile(sorted: &[Duration], p: usize) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = (p * sorted.len()).div_ceil(100).max(1);
    sorted[rank.min(sorted.len()) - 1]
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

fn require_root() -> anyhow::Result<()> {
    if simkube_cluster::ops::is_root() {
        Ok(())
    } else {
        bail!(
            "the pods benchmark brings up a simulated cluster (network namespaces, bridges): run \
             it as root, e.g. `sudo -E cargo run --release -p simkube-cluster --example pods`"
        )
    }
}

/// The `simkube` binary of this example's profile; under `cargo run` it is built first so that
/// it matches the sources.
fn simkube_binary() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("locating this example's executable")?;
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .context("this example is not in <target>/<profile>/examples/: pass --simkube PATH")?;
    if let Some(cargo) = std::env::var_os("CARGO") {
        let mut build = Command::new(cargo);
        build.args(["build", "-p", "simkube-cluster", "--bin", "simkube"]);
        if profile_dir.ends_with("release") {
            build.arg("--release");
        }
        let status = build
            .status()
            .context("running cargo build for the simkube binary")?;
        if !status.success() {
            bail!("building the simkube binary failed ({status})");
        }
    }
    let binary = profile_dir.join("simkube");
    if !binary.is_file() {
        bail!(
            "the simkube binary {} is missing: build it with `cargo build --release -p \
             simkube-cluster --bin simkube` or pass --simkube PATH",
            binary.display()
        );
    }
    Ok(binary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let sorted: Vec<Duration> = (1..=10).map(Duration::from_secs).collect();
        assert_eq!(percentile(&sorted, 50), Duration::from_secs(5));
        assert_eq!(percentile(&sorted, 90), Duration::from_secs(9));
        assert_eq!(percentile(&sorted, 100), Duration::from_secs(10));
        assert_eq!(percentile(&sorted[..1], 50), Duration::from_secs(1));
        assert_eq!(percentile(&[], 50), Duration::ZERO);
    }

    #[test]
    fn the_watch_tracks_readiness_and_deletion() {
        let mut tracker = Tracker::default();
        let t0 = Instant::now();
        tracker.observe(Event::Init, t0);
        tracker.observe(Event::InitDone, t0);
        assert!(tracker.listed);
        let mut pod = sleeper("sleeper-0", "b");
        tracker.sent.insert("sleeper-0".into(), t0);
        tracker.observe(Event::Apply(pod.clone()), t0);
        assert!(tracker.ready.is_empty());
        assert_eq!(
            tracker.not_ready_summary(5),
            "sleeper-0 on unscheduled: no status"
        );
        pod.spec.as_mut().expect("spec").node_name = Some("n1".into());
        pod.status = serde_json::from_value(serde_json::json!({
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
        }))
        .expect("status");
        let t1 = t0 + Duration::from_secs(2);
        tracker.observe(Event::Apply(pod.clone()), t1);
        tracker.observe(Event::Apply(pod.clone()), t1 + Duration::from_secs(5));
        assert_eq!(tracker.latencies(), vec![Duration::from_secs(2)]);
        assert_eq!(tracker.scheduling_latencies(), vec![Duration::from_secs(2)]);
        assert_eq!(tracker.per_node(), BTreeMap::from([("n1".to_owned(), 1)]));
        tracker.observe(Event::Delete(pod), t1);
        assert!(tracker.present.is_empty());
    }

    #[test]
    fn a_relisting_forgets_pods_deleted_meanwhile() {
        let mut tracker = Tracker::default();
        let now = Instant::now();
        tracker.observe(Event::Apply(sleeper("a", "b")), now);
        tracker.observe(Event::Apply(sleeper("b", "b")), now);
        tracker.observe(Event::Init, now);
        tracker.observe(Event::InitApply(sleeper("b", "b")), now);
        tracker.observe(Event::InitDone, now);
        assert_eq!(tracker.present, HashSet::from(["b".to_owned()]));
    }
}
