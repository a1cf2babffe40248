//! What the cluster test files share: a test's own underlay and state directory whose clusters
//! go down on drop, kubectl, polling, and the sweep of clusters that killed test runs left.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use simkube_cluster::state::StateDir;
use tether_testkit::patience;

pub(crate) const SIMKUBE: &str = env!("CARGO_BIN_EXE_simkube");

/// One test's underlay and state directory; clusters are brought down on drop (also on panic).
pub(crate) struct Env {
    pub(crate) underlay: String,
    pub(crate) state: tempfile::TempDir,
    pub(crate) clusters: Vec<String>,
}

impl Env {
    pub(crate) fn new(label: &str) -> Option<Env> {
        if !tether_testkit::require_tools_or_skip(&["kubectl"]) {
            return None;
        }
        tether_testkit::sweep_stale_namespaces();
        sweep_dead_test_clusters();
        Some(Env {
            underlay: format!("tt{}-{label}", std::process::id()),
            state: tempfile::tempdir().expect("temp state dir"),
            clusters: Vec::new(),
        })
    }

    pub(crate) fn state_dir(&self) -> &Path {
        self.state.path()
    }

    /// A cluster name unique to this process and test.
    pub(crate) fn name(&self, label: &str) -> String {
        format!("t{}{label}", std::process::id())
    }

    pub(crate) fn simkube(&self, args: &[&str]) -> Output {
        self.simkube_as(Command::new(SIMKUBE), args)
    }

    /// Runs `command` (which runs `simkube`, maybe through a wrapper) with `args` and this
    /// test's state directory.
    pub(crate) fn simkube_as(&self, mut command: Command, args: &[&str]) -> Output {
        command
            .args(args)
            .arg("--state-dir")
            .arg(self.state_dir())
            .output()
            .expect("simkube runs")
    }

    /// Processes whose command line names this test's state directory (daemons, agents).
    pub(crate) fn processes(&self) -> Vec<String> {
        let state = self.state_dir().to_string_lossy().into_owned();
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter_map(|pid| simkube_cluster::proc::cmdline(pid).map(|args| (pid, args)))
            .filter(|(_, args)| args.iter().any(|a| a.contains(&state)))
            .map(|(pid, args)| format!("{pid}: {}", args.join(" ")))
            .collect()
    }

    /// Asserts that nothing of cluster `name` is left: namespaces, underlay, state, processes.
    pub(crate) fn assert_nothing_left(&self, name: &str) {
        assert_eq!(
            simkube_cluster::net::netns_with_prefix(&format!("sk.{name}.")),
            Vec::<String>::new(),
            "node namespaces left"
        );
        assert!(
            !simkube_cluster::net::netns_exists(&self.underlay),
            "the underlay is left"
        );
        assert!(
            !self.state_dir().join(name).exists(),
            "the cluster's state is left"
        );
        let left = eventually_none(|| self.processes());
        assert!(left.is_empty(), "processes left: {left:?}");
    }

    /// `cluster up`; returns the kubeconfig path.
    pub(crate) fn up(&mut self, name: &str, nodes: u8) -> PathBuf {
        self.up_with(name, nodes, &[])
    }

    pub(crate) fn up_with(&mut self, name: &str, nodes: u8, extra: &[&str]) -> PathBuf {
        let kubeconfig = self.state_dir().join(format!("{name}.kubeconfig"));
        if !self.clusters.iter().any(|c| c == name) {
            self.clusters.push(name.to_owned());
        }
        let nodes = nodes.to_string();
        let underlay = self.underlay.clone();
        let timeout = patience(Duration::from_secs(90)).as_secs().to_string();
        let mut args = vec![
            "cluster",
            "up",
            "--name",
            name,
            "--nodes",
            &nodes,
            "--underlay",
            &underlay,
            "--kubeconfig-out",
            kubeconfig.to_str().expect("utf-8 path"),
            "--timeout",
            &timeout,
        ];
        args.extend_from_slice(extra);
        let output = self.simkube(&args);
        assert!(
            output.status.success(),
            "cluster up {name} failed:\nstdout: {}\nstderr: {}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("network created"),
            "progress lines: {stderr}"
        );
        assert!(stderr.contains("Ready (2/2)") || nodes != "2", "{stderr}");
        kubeconfig
    }

    pub(crate) fn down(&self, name: &str) -> Output {
        self.simkube(&["cluster", "down", "--name", name])
    }

    pub(crate) fn record(&self, name: &str) -> simkube_cluster::state::ClusterRecord {
        StateDir::new(self.state_dir())
            .read_record(name)
            .expect("readable state")
            .expect("the cluster has a record")
    }

    pub(crate) fn agent_pid(&self, name: &str, node: u8) -> Option<u32> {
        std::fs::read_to_string(self.state_dir().join(name).join(format!("node-{node}.pid")))
            .ok()
            .and_then(|s| s.trim().parse().ok())
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        for name in self.clusters.clone() {
            let output = self.down(&name);
            if !output.status.success() {
                eprintln!(
                    "cleanup: cluster down {name} failed: {}",
                    String::from_utf8_lossy(&output.stderr)
                );
            }
        }
        // Whatever a failed `down` left, the namespaces go.
        for ns in simkube_cluster::net::netns_with_prefix("sk.t") {
            if self
                .clusters
                .iter()
                .any(|c| ns.starts_with(&format!("sk.{c}.")))
            {
                let _ = simkube_cluster::net::delete_netns(&ns);
            }
        }
        let _ = simkube_cluster::net::delete_netns(&self.underlay);
    }
}

/// The labels of the test files' clusters (`t<pid><label>`).
const LABELS: &[&str] = &[
    "life", "crash", "fail", "svc", "xa", "xb", "nonft", "noproxy", "nodns",
];

/// Removes the node and pod namespaces of clusters of test runs that were killed before their
/// guards ran (the testkit sweep removes their underlays, which stops their daemons).
pub(crate) fn sweep_dead_test_clusters() {
    for ns in simkube_cluster::net::netns_with_prefix("sk.t") {
        let Some(cluster) = ns.strip_prefix("sk.").and_then(|r| r.split('.').next()) else {
            continue;
        };
        let digits: String = cluster[1..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        let label = &cluster[1 + digits.len()..];
        let Ok(pid) = digits.parse::<u32>() else {
            continue;
        };
        if LABELS.contains(&label) && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = simkube_cluster::net::delete_netns(&ns);
        }
    }
}

pub(crate) fn kubectl(kubeconfig: &Path, args: &[&str]) -> Output {
    Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .output()
        .expect("kubectl runs")
}

pub(crate) fn kubectl_ok(kubeconfig: &Path, args: &[&str]) -> String {
    let output = kubectl(kubeconfig, args);
    assert!(
        output.status.success(),
        "kubectl {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

pub(crate) fn apply(kubeconfig: &Path, yaml: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("objects.yaml");
    std::fs::write(&file, yaml).expect("write manifest");
    kubectl_ok(kubeconfig, &["apply", "-f", file.to_str().expect("utf-8")]);
}

/// Polls `probe` until it returns `Some`, panicking with `what` and the last state after
/// `timeout` (scaled by the test patience).
pub(crate) fn eventually<T>(
    what: &str,
    timeout: Duration,
    mut probe: impl FnMut() -> Result<T, String>,
) -> T {
    let deadline = Instant::now() + patience(timeout);
    loop {
        match probe() {
            Ok(value) => return value,
            Err(last) if Instant::now() > deadline => panic!("{what}: still not so: {last}"),
            Err(_) => std::thread::sleep(Duration::from_millis(300)),
        }
    }
}

/// A plain HTTP/1.0 GET on 127.0.0.1; the body of a 200 answer.
pub(crate) fn http_get(port: u16, path: &str) -> Result<String, String> {
    use std::io::{Read as _, Write as _};
    let mut stream =
        std::net::TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").map_err(|e| e.to_string())?;
    let mut answer = String::new();
    stream
        .read_to_string(&mut answer)
        .map_err(|e| e.to_string())?;
    let (head, body) = answer.split_once("\r\n\r\n").ok_or(answer.clone())?;
    if head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200") {
        Ok(body.to_owned())
    } else {
        Err(answer)
    }
}

pub(crate) fn pid_alive(pid: u32) -> bool {
    simkube_cluster::proc::cmdline(pid).is_some()
}

pub(crate) fn ready_nodes(kubeconfig: &Path) -> Vec<String> {
    let out = kubectl_ok(
        kubeconfig,
        &[
            "get",
            "nodes",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name}={.status.conditions[?(@.type==\"Ready\")].status}{\"\\n\"}{end}",
        ],
    );
    out.lines()
        .filter_map(|l| l.strip_suffix("=True"))
        .map(str::to_owned)
        .collect()
}

/// `probe()` once it is empty, or its last value after a few seconds (processes that were
/// signalled may take a moment to be reaped).
fn eventually_none(probe: impl Fn() -> Vec<String>) -> Vec<String> {
    let deadline = Instant::now() + patience(Duration::from_secs(5));
    loop {
        let left = probe();
        if left.is_empty() || Instant::now() > deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
