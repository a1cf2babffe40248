//! Simulated clusters for end-to-end tests: whole clusters brought up with the built `simkube`
//! command (pods are processes, so `tetherd controller` runs as a pod under its
//! ServiceAccount), the built `tether` and the real kubectl. Needs root; each test has its own
//! underlay namespace and state directory and brings its clusters down on drop, also on panic.
//!
//! The `simkube` and `tetherd` binaries are taken from beside `tether`; `cargo test
//! --workspace` builds them, `cargo test -p tether-cli` alone does not (then build them with
//! `cargo build -p simkube-cluster -p tetherd`).

#![allow(dead_code, unreachable_pub)]

pub mod net;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use tether_testkit::patience;

/// The `tether` binary under test.
pub const TETHER: &str = env!("CARGO_BIN_EXE_tether");

/// A binary built beside `tether`.
pub fn sibling(name: &str) -> PathBuf {
    let path = Path::new(TETHER).with_file_name(name);
    assert!(
        path.is_file(),
        "{} is missing: build it with `cargo build -p simkube-cluster -p tetherd` (`cargo test \
         --workspace` builds it)",
        path.display()
    );
    path
}

/// Serialises the end-to-end tests of one test binary: each brings up whole clusters, and two
/// at once on two cores only make both slow.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// One test's simulated clusters.
pub struct Env {
    underlay: String,
    state: tempfile::TempDir,
    clusters: Vec<String>,
    _serial: std::sync::MutexGuard<'static, ()>,
}

/// A cluster of an [`Env`].
#[derive(Clone, Debug)]
pub struct Sim {
    pub name: String,
    pub kubeconfig: PathBuf,
    cache: PathBuf,
}

impl Env {
    /// `None` (having said why) when not root outside CI; in CI a missing requirement fails.
    pub fn new(label: &str) -> Option<Env> {
        if !tether_testkit::require_tools_or_skip(&["kubectl"]) {
            return None;
        }
        let serial = serial();
        tether_testkit::sweep_stale_namespaces();
        Some(Env {
            underlay: format!("tt{}-{label}", std::process::id()),
            state: tempfile::tempdir().expect("state dir"),
            clusters: Vec::new(),
            _serial: serial,
        })
    }

    /// A file in this environment's state directory, removed with it.
    pub fn file(&self, name: &str) -> PathBuf {
        self.state.path().join(name)
    }

    /// A cluster name unique to this process.
    pub fn name(&self, label: &str) -> String {
        format!("t{}{label}", std::process::id())
    }

    fn simkube(&self, args: &[&str]) -> Output {
        Command::new(sibling("simkube"))
            .args(args)
            .arg("--state-dir")
            .arg(self.state.path())
            .output()
            .expect("simkube runs")
    }

    /// `simkube cluster up` with one node (plus `extra` flags).
    pub fn up(&mut self, label: &str, extra: &[&str]) -> Sim {
        self.up_nodes(label, 1, extra)
    }

    /// `simkube cluster up` with `nodes` nodes (plus `extra` flags).
    pub fn up_nodes(&mut self, label: &str, nodes: u8, extra: &[&str]) -> Sim {
        let nodes = nodes.to_string();
        let name = self.name(label);
        self.clusters.push(name.clone());
        let kubeconfig = self.state.path().join(format!("{name}.kubeconfig"));
        let timeout = patience(Duration::from_secs(90)).as_secs().to_string();
        let mut args = vec![
            "cluster",
            "up",
            "--name",
            &name,
            "--nodes",
            &nodes,
            "--underlay",
            &self.underlay,
            "--kubeconfig-out",
            kubeconfig.to_str().expect("utf-8 path"),
            "--timeout",
            &timeout,
        ];
        args.extend_from_slice(extra);
        let out = self.simkube(&args);
        assert!(
            out.status.success(),
            "cluster up {name} failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        Sim {
            cache: self.state.path().join(format!("{name}.kubectl-cache")),
            name,
            kubeconfig,
        }
    }

    /// The underlay namespace the clusters share.
    pub fn underlay(&self) -> &str {
        &self.underlay
    }

    /// The PID of `sim`'s daemon (its API server and controllers), from the state directory
    /// and checked against `/proc`, so a test only ever signals a process it started.
    pub fn daemon_pid(&self, sim: &Sim) -> u32 {
        let path = self.state.path().join(&sim.name).join("daemon.json");
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        let record: serde_json::Value = serde_json::from_str(&text).expect("daemon record");
        let pid = record["pid"].as_u64().expect("pid") as u32;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline);
        assert!(
            cmdline.contains("simkube") && cmdline.contains(&sim.name),
            "process {pid} is not {}'s daemon: {cmdline:?}",
            sim.name
        );
        pid
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.print_controller_logs();
        }
        for name in self.clusters.clone() {
            let out = self.simkube(&["cluster", "down", "--name", &name]);
            if !out.status.success() {
                eprintln!(
                    "cleanup: cluster down {name} failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            for ns in simkube_cluster::net::netns_with_prefix(&format!("sk.{name}.")) {
                let _ = simkube_cluster::net::delete_netns(&ns);
            }
        }
        let _ = simkube_cluster::net::delete_netns(&self.underlay);
    }
}

impl Env {
    /// The last lines of every cluster's Tether controller, so that a failed test shows what
    /// the product did (its clusters are gone afterwards).
    fn print_controller_logs(&self) {
        for name in &self.clusters {
            let kubeconfig = self.state.path().join(format!("{name}.kubeconfig"));
            let out = Command::new("kubectl")
                .arg("--kubeconfig")
                .arg(&kubeconfig)
                .args([
                    "logs",
                    "-n",
                    "tether-system",
                    "deploy/tether-controller",
                    "--tail",
                    "60",
                ])
                .output();
            if let Ok(out) = out {
                eprintln!(
                    "--- {name}: the controller's last log lines ---\n{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
    }
}

/// A finished command.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    fn from(out: Output) -> Run {
        Run {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// Asserts the exit code, showing the output otherwise.
    #[track_caller]
    pub fn ok(&self) -> &Self {
        assert_eq!(
            self.code, 0,
            "failed:\nstdout: {}\nstderr: {}",
            self.stdout, self.stderr
        );
        self
    }

    /// Asserts failure with `code` and that stderr names every needle.
    #[track_caller]
    pub fn fails(&self, code: i32, needles: &[&str]) {
        assert_eq!(
            self.code, code,
            "stdout: {}\nstderr: {}",
            self.stdout, self.stderr
        );
        for n in needles {
            assert!(
                self.stderr.contains(n),
                "stderr lacks {n:?}:\n{}",
                self.stderr
            );
        }
    }
}

impl Sim {
    pub fn kubeconfig(&self) -> &str {
        self.kubeconfig.to_str().expect("utf-8 path")
    }

    /// `tether --kubeconfig <this> args...`.
    pub fn tether(&self, args: &[&str]) -> Run {
        let mut cmd = Command::new(TETHER);
        cmd.arg("--kubeconfig").arg(&self.kubeconfig).args(args);
        Run::from(cmd.stdin(Stdio::null()).output().expect("tether runs"))
    }

    /// `tether install --cluster-id id` (plus `extra`), asserting success.
    pub fn install(&self, id: &str, extra: &[&str]) -> Run {
        let mut args = vec!["install", "--cluster-id", id, "--timeout", "120s"];
        args.extend_from_slice(extra);
        let run = self.tether(&args);
        run.ok();
        run
    }

    /// kubectl against this cluster, with a private cache.
    pub fn kubectl(&self, args: &[&str]) -> Run {
        self.kubectl_as(&self.kubeconfig, args)
    }

    /// kubectl with another kubeconfig (an issued identity) and this cluster's cache.
    ///
    /// An `exec` that lost its output to kubectl's own race is run again (twice at most, each
    /// time said): kubectl's WebSocket client reads frames from the moment the upgrade is
    /// answered but creates its streams a moment later, and drops a frame for a stream it has
    /// not created yet ("Unknown stream id 1, discarding message"), then fails with "closed
    /// all streams". A command whose output comes at once (an `echo`) can lose it so. The
    /// commands these tests exec may run twice.
    pub fn kubectl_as(&self, kubeconfig: &Path, args: &[&str]) -> Run {
        let run = || {
            let out = Command::new("kubectl")
                .arg("--kubeconfig")
                .arg(kubeconfig)
                .arg("--cache-dir")
                .arg(&self.cache)
                .args(args)
                .stdin(Stdio::null())
                .output()
                .expect("kubectl runs");
            Run::from(out)
        };
        let mut result = run();
        for _ in 0..2 {
            let raced = args
                .iter()
                .take_while(|a| **a != "--")
                .any(|a| *a == "exec")
                && result.code != 0
                && ["1", "2", "3"].iter().any(|id| {
                    result
                        .stderr
                        .contains(&format!("Unknown stream id {id}, discarding"))
                });
            if !raced {
                break;
            }
            println!("kubectl {args:?} lost its output to kubectl's stream race; running it again");
            result = run();
        }
        result
    }

    /// `kubectl apply -f -` of `yaml` with `kubeconfig`.
    pub fn apply_as(&self, kubeconfig: &Path, yaml: &str) -> Run {
        use std::io::Write as _;
        let mut child = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .arg("--cache-dir")
            .arg(&self.cache)
            .args(["apply", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("kubectl runs");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(yaml.as_bytes())
            .expect("write manifest");
        Run::from(child.wait_with_output().expect("kubectl output"))
    }

    /// `kubectl get ... -o jsonpath=...` output, or empty when the object is missing.
    pub fn jsonpath(&self, args: &[&str], path: &str) -> String {
        let mut all = vec!["get"];
        all.extend_from_slice(args);
        let jp = format!("jsonpath={path}");
        all.extend_from_slice(&["-o", &jp, "--ignore-not-found"]);
        self.kubectl(&all).stdout
    }

    /// Names of the objects `kubectl get <kind>` lists (cluster-wide or in `-n`).
    pub fn names(&self, args: &[&str]) -> Vec<String> {
        let mut all = vec!["get"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["-o", "name"]);
        let run = self.kubectl(&all);
        run.ok();
        run.stdout.lines().map(str::to_owned).collect()
    }

    /// Waits until `check` holds, polling every 200 ms.
    #[track_caller]
    pub fn wait(&self, what: &str, timeout: Duration, mut check: impl FnMut() -> bool) {
        let deadline = Instant::now() + patience(timeout);
        while Instant::now() < deadline {
            if check() {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        panic!("{} on {}: not within {timeout:?}", what, self.name);
    }

    /// The PIDs of this cluster's controller processes (pods are processes here), found by
    /// their pod name and cluster ID in the environment.
    pub fn controller_pids(&self, cluster_id: &str) -> Vec<u32> {
        let pods = self.jsonpath(
            &[
                "pods",
                "-n",
                "tether-system",
                "-l",
                "app.kubernetes.io/name=tether-controller",
            ],
            "{.items[*].metadata.name}",
        );
        let pods: Vec<String> = pods
            .split_whitespace()
            .map(|p| format!("POD_NAME={p}"))
            .collect();
        let wanted = format!("TETHER_CLUSTER_ID={cluster_id}");
        let mut pids = Vec::new();
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            let is_controller = args.first().is_some_and(|a| a.ends_with(b"tetherd"))
                && args.get(1).is_some_and(|a| *a == b"controller");
            if !is_controller {
                continue;
            }
            let environ = std::fs::read(entry.path().join("environ")).unwrap_or_default();
            let vars: Vec<&[u8]> = environ.split(|b| *b == 0).collect();
            // Without pods (say, after uninstall) any process of this cluster ID counts, so
            // that a process outliving its pod is found.
            let ours = vars.contains(&wanted.as_bytes())
                && (pods.is_empty() || pods.iter().any(|p| vars.contains(&p.as_bytes())));
            if ours {
                pids.push(pid);
            }
        }
        pids
    }

    /// `GET path` from a pod's port, from inside node 1's network namespace (a node reaches
    /// every pod of its cluster), with bash's `/dev/tcp`. Returns the whole response.
    pub fn http_from_node(&self, ip: &str, port: u16, path: &str) -> String {
        let script = format!(
            "exec 3<>/dev/tcp/{ip}/{port} && printf 'GET {path} HTTP/1.0\\r\\nHost: x\\r\\n\\r\\n' >&3 && cat <&3"
        );
        let out = Command::new("ip")
            .args([
                "netns",
                "exec",
                &format!("sk.{}.n1", self.name),
                "bash",
                "-c",
                &script,
            ])
            .output()
            .expect("ip netns exec runs");
        assert!(
            out.status.success(),
            "GET {ip}:{port}{path} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The controller's `/metrics` (of its first pod).
    pub fn controller_metrics(&self) -> String {
        let ip = self.jsonpath(
            &[
                "pods",
                "-n",
                "tether-system",
                "-l",
                "app.kubernetes.io/name=tether-controller",
            ],
            "{.items[0].status.podIP}",
        );
        self.http_from_node(&ip, 9090, "/metrics")
    }

    /// A copy of the kubeconfig this cluster holds for `provider`, with its server switched to
    /// one reachable from the host (the provider's admin kubeconfig's), so a test can act as
    /// the issued identity.
    /// Peers this cluster with `provider` for 1 CPU, 1Gi and 10 pods, then offloads namespace
    /// `ns` (created here) with the `Remote` strategy: the set-up of the suites that need one
    /// offloaded namespace and nothing special about the peering.
    pub fn peer_and_offload_remote(&self, provider: &Sim, ns: &str) {
        self.tether(&[
            "peer",
            "--remote-kubeconfig",
            provider.kubeconfig(),
            "--cpu",
            "1",
            "--memory",
            "1Gi",
            "--pods",
            "10",
            "--timeout",
            "4m",
        ])
        .ok();
        self.kubectl(&["create", "namespace", ns]).ok();
        self.tether(&[
            "offload",
            "namespace",
            ns,
            "--pod-offloading-strategy",
            "Remote",
            "--timeout",
            "90s",
        ])
        .ok();
    }

    pub fn issued_kubeconfig(&self, provider: &Sim, provider_id: &str, out: &Path) {
        let b64 = self.jsonpath(
            &[
                "secret",
                "-n",
                &format!("tether-tenant-{provider_id}"),
                "tether-provider-kubeconfig",
            ],
            "{.data.kubeconfig}",
        );
        assert!(
            !b64.is_empty(),
            "{} holds no kubeconfig for {provider_id}",
            self.name
        );
        use base64::Engine as _;
        let yaml = String::from_utf8(
            base64::engine::general_purpose::STANDARD
                .decode(b64.trim())
                .expect("base64"),
        )
        .expect("utf-8");
        let server = provider.jsonpath_config("{.clusters[0].cluster.server}");
        let rewritten: String = yaml
            .lines()
            .map(|l| {
                if l.trim_start().starts_with("server:") {
                    let indent = &l[..l.len() - l.trim_start().len()];
                    format!("{indent}server: {server}")
                } else {
                    l.to_owned()
                }
            })
            .collect::<Vec<_>>()
            .join("\n");
        std::fs::write(out, rewritten).expect("write kubeconfig");
    }

    fn jsonpath_config(&self, path: &str) -> String {
        let jp = format!("jsonpath={path}");
        self.kubectl(&["config", "view", "--minify", "-o", &jp])
            .stdout
    }
}

/// A Deployment of echo pods in namespace `ns`, with nothing about where to run (in an
/// offloaded namespace the pod webhook places them), requesting `cpu` and 32Mi when given.
pub fn echo_deployment(ns: &str, name: &str, replicas: u32, cpu: Option<&str>) -> String {
    let resources = cpu
        .map(|cpu| format!("\n        resources: {{requests: {{cpu: {cpu}, memory: 32Mi}}}}"))
        .unwrap_or_default();
    format!(
        "apiVersion: apps/v1
kind: Deployment
metadata: {{name: {name}, namespace: {ns}}}
spec:
  replicas: {replicas}
  selector:
    matchLabels: {{app: {name}}}
  template:
    metadata:
      labels: {{app: {name}}}
    spec:
      containers:
      - name: echo
        image: simkube.dev/echo{resources}
"
    )
}
