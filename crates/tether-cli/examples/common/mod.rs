//! What the benchmarks share: simulated clusters on a private underlay, driven through the
//! release binaries beside the example (`simkube`, `tetherd`, `tether`) and kubectl, and
//! removed again whatever happens.

#![allow(dead_code)] // each benchmark uses its own part

pub(crate) mod measure;

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

pub(crate) type Result<T = ()> = std::result::Result<T, String>;

/// One simulated cluster: its name and admin kubeconfig.
pub(crate) type Cluster = (String, PathBuf);

/// The clusters of one benchmark run, all on one underlay namespace of their own.
pub(crate) struct Bench {
    pub(crate) bin: PathBuf,
    pub(crate) state: PathBuf,
    pub(crate) underlay: String,
    pub(crate) clusters: Vec<Cluster>,
}

impl Drop for Bench {
    fn drop(&mut self) {
        for (name, _) in &self.clusters {
            let _ = self.simkube(&["cluster", "down", "--name", name]);
        }
        let _ = Command::new("ip")
            .args(["netns", "delete", &self.underlay])
            .output();
        let _ = std::fs::remove_dir_all(&self.state);
    }
}

impl Bench {
    /// Checks root and the release binaries, and picks names no other run uses.
    pub(crate) fn new(kind: &str) -> Result<Self> {
        if !is_root() {
            return Err("needs root (simulated clusters are network namespaces)".into());
        }
        let exe = std::env::current_exe().map_err(|e| format!("locating myself: {e}"))?;
        let bin = exe
            .parent()
            .and_then(Path::parent)
            .ok_or("unexpected executable location")?
            .to_path_buf();
        for needed in ["simkube", "tetherd", "tether"] {
            if !bin.join(needed).is_file() {
                return Err(format!(
                    "{} is missing: run `cargo build --release -p simkube-cluster -p tetherd -p \
                     tether-cli` first",
                    bin.join(needed).display()
                ));
            }
        }
        let pid = std::process::id();
        let state = std::env::temp_dir().join(format!("tether-{kind}-bench-{pid}"));
        std::fs::create_dir_all(&state).map_err(|e| format!("state dir: {e}"))?;
        Ok(Self {
            bin,
            state,
            underlay: format!("tb{pid}"),
            clusters: Vec::new(),
        })
    }

    pub(crate) fn simkube(&self, args: &[&str]) -> Result<Output> {
        Command::new(self.bin.join("simkube"))
            .args(args)
            .arg("--state-dir")
            .arg(&self.state)
            .output()
            .map_err(|e| format!("running simkube: {e}"))
    }

    /// Starts cluster `name` with `nodes` nodes on the run's underlay. Its processes (the
    /// daemon `cluster up` starts, its node agents and their pods) inherit the CPU affinity of
    /// the calling thread: see [`pin_self`].
    pub(crate) fn up(&mut self, name: &str, nodes: u8) -> Result<Cluster> {
        let kubeconfig = self.state.join(format!("{name}.kubeconfig"));
        self.clusters.push((name.to_owned(), kubeconfig.clone()));
        let out = self.simkube(&[
            "cluster",
            "up",
            "--name",
            name,
            "--nodes",
            &nodes.to_string(),
            "--underlay",
            &self.underlay,
            "--kubeconfig-out",
            kubeconfig.to_str().unwrap_or_default(),
        ])?;
        ok(&out, &format!("cluster up {name}"))?;
        Ok((name.to_owned(), kubeconfig))
    }

    pub(crate) fn tether(&self, cluster: &Cluster, args: &[&str]) -> Result {
        let out = Command::new(self.bin.join("tether"))
            .arg("--kubeconfig")
            .arg(&cluster.1)
            .args(args)
            .output()
            .map_err(|e| format!("running tether: {e}"))?;
        ok(&out, &format!("tether {}", args.join(" ")))
    }
}

/// Runs kubectl against `cluster` and returns its standard output.
pub(crate) fn kubectl(cluster: &Cluster, args: &[&str]) -> Result<String> {
    let out = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&cluster.1)
        .args(args)
        .output()
        .map_err(|e| format!("running kubectl: {e}"))?;
    ok(&out, &format!("kubectl {}", args.join(" ")))?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// `kubectl apply -f -` of `yaml` against `cluster`.
pub(crate) fn apply(cluster: &Cluster, yaml: &str) -> Result {
    use std::io::Write as _;
    let mut child = Command::new("kubectl")
        .args(["--kubeconfig", path(cluster), "apply", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .map_err(|e| format!("running kubectl: {e}"))?;
    child
        .stdin
        .take()
        .ok_or("kubectl stdin")?
        .write_all(yaml.as_bytes())
        .map_err(|e| format!("writing to kubectl: {e}"))?;
    let status = child.wait().map_err(|e| format!("kubectl: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("kubectl apply failed on {}", cluster.0))
    }
}

/// Polls `check` every 200 ms until it gives a value, for at most `limit`.
pub(crate) fn wait_for<T>(
    what: &str,
    limit: Duration,
    mut check: impl FnMut() -> Option<T>,
) -> Result<T> {
    let start = Instant::now();
    loop {
        if let Some(v) = check() {
            return Ok(v);
        }
        if start.elapsed() > limit {
            return Err(format!("timed out after {limit:?} waiting for {what}"));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

pub(crate) fn path(c: &Cluster) -> &str {
    c.1.to_str().unwrap_or_default()
}

/// The value of `--name N` on the command line, or `default`.
pub(crate) fn arg(name: &str, default: u64) -> Result<u64> {
    let args: Vec<String> = std::env::args().collect();
    match args.iter().position(|a| a == name) {
        Some(i) => args
            .get(i + 1)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("{name} needs a number")),
        None => Ok(default),
    }
}

/// The CPUs this process may run on, in order.
pub(crate) fn cpus() -> Result<Vec<usize>> {
    let set = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0))
        .map_err(|e| format!("reading the CPU affinity: {e}"))?;
    Ok((0..nix::sched::CpuSet::count())
        .filter(|&c| set.is_set(c).unwrap_or(false))
        .collect())
}

/// Keeps the calling thread, and every thread and process it starts from now on, on `cpus`.
pub(crate) fn pin_self(cpus: &[usize]) -> Result {
    let mut set = nix::sched::CpuSet::new();
    for &c in cpus {
        set.set(c).map_err(|e| format!("CPU {c}: {e}"))?;
    }
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set)
        .map_err(|e| format!("setting the CPU affinity to {cpus:?}: {e}"))
}

pub(crate) fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(1).map(|u| u == "0"))
        })
        .unwrap_or(false)
}

pub(crate) fn ok(out: &Output, what: &str) -> Result {
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{what} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Exits with the error printed, for `main`.
pub(crate) fn exit(name: &str, result: Result) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{name}: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Starts a pod of `image` (one container, `main`) on node 2 of `c`; returns its sandbox
/// network namespace and its pod IP.
pub(crate) fn pod_on_node_2(c: &Cluster, name: &str, image: &str) -> Result<(String, Ipv4Addr)> {
    let manifest = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  \
         nodeName: {}-node-2\n  containers:\n  - name: main\n    image: {image}\n",
        c.0
    );
    apply(c, &manifest)?;
    let ip = wait_for(
        &format!("pod {name} running"),
        Duration::from_secs(60),
        || {
            let out = kubectl(
                c,
                &[
                    "get",
                    "pod",
                    name,
                    "-o",
                    "jsonpath={.status.phase} {.status.podIP}",
                ],
            )
            .ok()?;
            let (phase, ip) = out.split_once(' ')?;
            (phase == "Running").then(|| ip.parse::<Ipv4Addr>().ok())?
        },
    )?;
    let uid = kubectl(c, &["get", "pod", name, "-o", "jsonpath={.metadata.uid}"])?;
    let netns = simkube_cluster::net::netns_with_prefix(&format!("sk.{}.n2.", c.0))
        .into_iter()
        .find(|ns| ns.ends_with(&uid))
        .ok_or_else(|| format!("no sandbox namespace for pod {name} ({uid})"))?;
    Ok((netns, ip))
}

/// How cluster `a` (ID `bench-a`) addresses pod `ip_b` of its peer `bench-b`: the remap `a`
/// chose for bench-b's pod CIDR, and the address of the pod in it.
pub(crate) fn seen_from_a(a: &Cluster, ip_b: Ipv4Addr) -> Result<(ipnet::Ipv4Net, Ipv4Addr)> {
    let view: ipnet::Ipv4Net = kubectl(
        a,
        &[
            "get",
            "configurations.networking.tether.dev",
            "-n",
            "tether-tenant-bench-b",
            "bench-b",
            "-o",
            "jsonpath={.status.remote.cidr.pod[0]}",
        ],
    )?
    .parse()
    .map_err(|e| format!("the remap of bench-b's pod CIDR: {e}"))?;
    let host = u32::from(ip_b) & !u32::from(view.netmask());
    Ok((view, Ipv4Addr::from(u32::from(view.network()) | host)))
}
