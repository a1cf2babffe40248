//! The node agent's kubelet endpoint through a real simkube API server, with the real kubectl
//! and kube-rs: `kubectl logs` (follow, timestamps, previous, tail, since, limit), `kubectl
//! exec` (exit codes, stdin, a terminal), kube-rs exec and attach, and `/metrics` (root and
//! kubectl; skipped with a printed reason only when missing and CI is unset).

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use futures::SinkExt as _;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{AttachParams, PostParams, TerminalSize};
use serde_json::json;
use simkube_node::AgentConfig;
use simkube_node::images::ImageEntry;
use tether_testkit::{patience, require_tools_or_skip};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

mod support;
use support::{Fixture, container_status, fast_backoff, wait_pod};

/// The image the test pods use: a shell, with the command from the pod.
const SHELL_IMAGE: &str = "test.invalid/shell";

/// A container script that idles, for sessions to exec into.
const IDLE_SCRIPT: &str = "exec sleep 100000";

fn with_shell_image(config: &mut AgentConfig) {
    config.images = config.images.clone().with_entry(ImageEntry {
        image: SHELL_IMAGE.to_owned(),
        entrypoint: vec!["/bin/sh".to_owned()],
        cmd: Vec::new(),
    });
}

fn shell_pod(name: &str, node: &str, script: &str, restart: &str, working_dir: &Path) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": node,
            "restartPolicy": restart,
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main", "image": SHELL_IMAGE,
                "command": ["sh", "-c", script],
                "workingDir": working_dir,
                "env": [
                    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "GREETING", "value": "hello from the spec"}
                ]
            }]
        }
    }))
    .expect("pod")
}

/// [`Fixture::run`] with an agent that knows the shell image.
fn run_with_shell<F, Fut>(fixture: &Fixture, body: F)
where
    F: FnOnce(kube::Client, String) -> Fut + Send,
    Fut: std::future::Future<Output = ()>,
{
    fixture.run_with(fast_backoff(), |b| b, with_shell_image, body);
}

async fn create_shell_pod(
    api: &Api<Pod>,
    name: &str,
    node: &str,
    script: &str,
    restart: &str,
    working_dir: &Path,
) {
    api.create(
        &PostParams::default(),
        &shell_pod(name, node, script, restart, working_dir),
    )
    .await
    .expect("create");
}

async fn wait_running(api: &Api<Pod>, name: &str, restarts: i32) -> Pod {
    wait_pod(api, name, Duration::from_secs(20), "running", |p| {
        container_status(p).is_some_and(|c| {
            c.restart_count == restarts && c.state.as_ref().is_some_and(|s| s.running.is_some())
        })
    })
    .await
}

/// kubectl against the fixture's cluster, started from the calling thread (so inside the node
/// namespace, where the API server listens).
struct Kubectl {
    kubeconfig: PathBuf,
    cache: tempfile::TempDir,
}

impl Kubectl {
    fn new(kubeconfig: PathBuf) -> Self {
        Self {
            kubeconfig,
            cache: tempfile::tempdir().expect("cache dir"),
        }
    }

    fn args(&self) -> Vec<String> {
        vec![
            "--kubeconfig".to_owned(),
            self.kubeconfig.display().to_string(),
            "--cache-dir".to_owned(),
            self.cache.path().display().to_string(),
        ]
    }

    fn command(&self, args: &[&str]) -> tokio::process::Command {
        let mut command = tokio::process::Command::new("kubectl");
        command
            .args(self.args())
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        command
    }

    /// Runs kubectl to completion, feeding `stdin` (then closing it).
    async fn run(&self, args: &[&str], stdin: Option<&[u8]>) -> Output {
        let mut command = self.command(args);
        if stdin.is_some() {
            command.stdin(Stdio::piped());
        }
        let mut child = command.spawn().expect("spawn kubectl");
        if let Some(data) = stdin {
            let mut pipe = child.stdin.take().expect("stdin pipe");
            pipe.write_all(data).await.expect("write stdin");
        }
        tokio::time::timeout(patience(Duration::from_secs(30)), child.wait_with_output())
            .await
            .unwrap_or_else(|_| panic!("kubectl {args:?} did not finish"))
            .expect("kubectl output")
    }

    /// The stdout of a successful run.
    async fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args, None).await;
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {}",
            text(&out.stderr)
        );
        text(&out.stdout)
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Polls kubectl until its output is `want`.
async fn eventually_output(kubectl: &Kubectl, args: &[&str], want: &str) {
    let deadline = Instant::now() + patience(Duration::from_secs(15));
    loop {
        let out = kubectl.run(args, None).await;
        if out.status.success() && text(&out.stdout) == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "kubectl {args:?}: wanted {want:?}, last output {:?} (stderr {:?})",
            text(&out.stdout),
            text(&out.stderr)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Reads `reader` until what was read contains `want`; returns everything read.
async fn read_until(reader: &mut (impl tokio::io::AsyncRead + Unpin), want: &str) -> String {
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + patience(Duration::from_secs(15));
    while !text(&seen).contains(want) {
        match tokio::time::timeout_at(deadline, reader.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => seen.extend_from_slice(&buf[..n]),
            other => panic!(
                "waiting for {want:?}: {other:?}; read so far {:?}",
                text(&seen)
            ),
        }
    }
    text(&seen)
}

#[test]
fn kubectl_logs_follow_timestamps_previous_and_limits() {
    if !require_tools_or_skip(&["kubectl"]) {
        return;
    }
    let fixture = Fixture::new("skn-logs");
    let kubectl = Kubectl::new(fixture.kubeconfig());
    let dir = tempfile::tempdir().expect("dir");
    let d = dir.path().display().to_string();
    // Each run counts itself, says so on stdout and stderr, waits for its go file, then ends
    // with an unterminated line and restarts (restartPolicy Always).
    let script = format!(
        "n=$(cat {d}/count 2>/dev/null || echo 0); n=$((n+1)); echo $n > {d}/count; \
         echo \"start $n\"; echo \"to stderr\" >&2; \
         while [ ! -e {d}/go$n ]; do sleep 0.05; done; printf 'after go %s' $n"
    );
    run_with_shell(&fixture, |client, node| async move {
        let api: Api<Pod> = Api::namespaced(client, "default");
        create_shell_pod(&api, "talker", &node, &script, "Always", dir.path()).await;
        wait_running(&api, "talker", 0).await;
        eventually_output(&kubectl, &["logs", "talker"], "start 1\nto stderr\n").await;
        let out = kubectl.run(&["logs", "--previous", "talker"], None).await;
        assert!(!out.status.success(), "no previous run yet");
        assert!(
            text(&out.stderr)
                .contains("previous terminated container \"main\" in pod \"talker\" not found"),
            "{}",
            text(&out.stderr)
        );

        // `logs -f` prints what is there, then a line written after it started, and ends
        // when the container exits.
        let mut follow = kubectl
            .command(&["logs", "-f", "talker"])
            .spawn()
            .expect("kubectl logs -f");
        let mut stdout = follow.stdout.take().expect("stdout");
        read_until(&mut stdout, "start 1\nto stderr\n").await;
        std::fs::write(dir.path().join("go1"), "").expect("go1");
        let mut rest = Vec::new();
        tokio::time::timeout(
            patience(Duration::from_secs(15)),
            stdout.read_to_end(&mut rest),
        )
        .await
        .expect("logs -f ends when the container exits")
        .expect("read");
        let status = follow.wait().await.expect("wait");
        assert!(status.success(), "kubectl logs -f: {status}");
        assert_eq!(text(&rest), "after go 1");

        // The container restarted: --previous is the first run, byte for byte.
        wait_running(&api, "talker", 1).await;
        assert_eq!(
            kubectl.ok(&["logs", "--previous", "talker"]).await,
            "start 1\nto stderr\nafter go 1"
        );
        eventually_output(&kubectl, &["logs", "talker"], "start 2\nto stderr\n").await;

        let stamped = kubectl.ok(&["logs", "--timestamps", "talker"]).await;
        let lines: Vec<&str> = stamped.lines().collect();
        assert_eq!(lines.len(), 2, "{stamped:?}");
        for (line, want) in lines.iter().zip(["start 2", "to stderr"]) {
            let (time, rest) = line.split_once(' ').expect("a time, then the line");
            let time: jiff::Timestamp = time.parse().expect("an RFC 3339 time");
            let age = jiff::Timestamp::now().duration_since(time);
            assert!(
                age >= jiff::SignedDuration::ZERO && age.as_secs() < 60,
                "{line:?} is not stamped with a recent time"
            );
            assert_eq!(rest, want);
        }

        assert_eq!(
            kubectl.ok(&["logs", "--tail=1", "talker"]).await,
            "to stderr\n"
        );
        assert_eq!(
            kubectl.ok(&["logs", "--limit-bytes=7", "talker"]).await,
            "start 2"
        );
        assert_eq!(
            kubectl.ok(&["logs", "--since=1h", "talker"]).await,
            "start 2\nto stderr\n"
        );
        let later = jiff::Timestamp::now() + jiff::SignedDuration::from_secs(3600);
        let since = format!("--since-time={}", later.strftime("%Y-%m-%dT%H:%M:%SZ"));
        assert_eq!(kubectl.ok(&["logs", &since, "talker"]).await, "");
    });
}

#[test]
fn kubectl_exec_runs_commands_inside_the_container() {
    if !require_tools_or_skip(&["kubectl", "script"]) {
        return;
    }
    let fixture = Fixture::new("skn-exec");
    let kubectl = Kubectl::new(fixture.kubeconfig());
    let work = tempfile::tempdir().expect("working dir");
    run_with_shell(&fixture, |client, node| async move {
        let api: Api<Pod> = Api::namespaced(client, "default");
        create_shell_pod(&api, "shell", &node, IDLE_SCRIPT, "Always", work.path()).await;
        let pod = wait_running(&api, "shell", 0).await;
        let pod_ip = pod
            .status
            .and_then(|s| s.pod_ip)
            .expect("a running pod has an IP");

        // The container's environment, and its exit code through kubectl.
        let out = kubectl
            .run(
                &["exec", "shell", "--", "sh", "-c", "echo $POD_NAME; exit 3"],
                None,
            )
            .await;
        assert_eq!(out.status.code(), Some(3), "stderr: {}", text(&out.stderr));
        assert_eq!(text(&out.stdout), "shell\n");

        // Its working directory and network namespace (the pod's address is there).
        let out = kubectl
            .ok(&[
                "exec",
                "shell",
                "--",
                "sh",
                "-c",
                "pwd; echo $GREETING; ip -o -4 addr",
            ])
            .await;
        let mut lines = out.lines();
        assert_eq!(lines.next(), Some(work.path().to_str().expect("utf-8")));
        assert_eq!(lines.next(), Some("hello from the spec"));
        assert!(
            out.contains(&format!("inet {pod_ip}/")),
            "exec does not run in the pod's network namespace: {out}"
        );

        // Stdin until its end.
        let out = kubectl
            .run(
                &["exec", "-i", "shell", "--", "cat"],
                Some(b"data\nmore data\n"),
            )
            .await;
        assert!(
            out.status.success(),
            "kubectl exec -i: {}",
            text(&out.stderr)
        );
        assert_eq!(text(&out.stdout), "data\nmore data\n");

        // stderr stays stderr.
        let out = kubectl
            .run(
                &["exec", "shell", "--", "sh", "-c", "echo out; echo err >&2"],
                None,
            )
            .await;
        assert!(out.status.success());
        assert_eq!(
            (text(&out.stdout), text(&out.stderr)),
            ("out\n".into(), "err\n".into())
        );

        // A program that does not exist is a clear error.
        let out = kubectl
            .run(&["exec", "shell", "--", "/no/such/program"], None)
            .await;
        assert!(!out.status.success());
        assert!(
            text(&out.stderr).contains("/no/such/program"),
            "{}",
            text(&out.stderr)
        );

        // An interactive terminal: a prompt, a command's output, and the exit code.
        let inner = format!("kubectl {} exec -it shell -- sh", kubectl.args().join(" "));
        let mut session = tokio::process::Command::new("script")
            .args(["-qec", &inner, "/dev/null"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("script");
        let mut stdin = session.stdin.take().expect("stdin");
        let mut stdout = session.stdout.take().expect("stdout");
        stdin
            .write_all(b"tty -s && echo tty-$((6*7))\n")
            .await
            .expect("type");
        let seen = read_until(&mut stdout, "tty-42").await;
        assert!(seen.contains("# "), "no shell prompt in {seen:?}");
        stdin.write_all(b"exit 5\n").await.expect("type");
        let status = tokio::time::timeout(patience(Duration::from_secs(15)), session.wait())
            .await
            .expect("the terminal session ends")
            .expect("wait");
        drop(stdin);
        assert_eq!(status.code(), Some(5), "kubectl exec -it exit code");

        // A working directory gone from the container is named as such.
        let moved = work.path().with_extension("moved");
        std::fs::rename(work.path(), &moved).expect("move the working dir away");
        let out = kubectl.run(&["exec", "shell", "--", "true"], None).await;
        std::fs::rename(&moved, work.path()).expect("put the working dir back");
        assert!(!out.status.success());
        assert!(
            text(&out.stderr).contains("does not exist in the container"),
            "{}",
            text(&out.stderr)
        );
    });
}

#[test]
fn kube_rs_exec_attach_and_metrics() {
    if !require_tools_or_skip(&[]) {
        return;
    }
    let fixture = Fixture::new("skn-kexec");
    let dir = tempfile::tempdir().expect("dir");
    let d = dir.path().display().to_string();
    let poker = format!(
        "while [ ! -e {d}/stop ]; do if [ -e {d}/poke ]; then rm {d}/poke; echo poked; \
         echo also >&2; fi; sleep 0.05; done; echo bye"
    );
    run_with_shell(&fixture, |client, node| async move {
        let api: Api<Pod> = Api::namespaced(client.clone(), "default");
        create_shell_pod(&api, "shell", &node, IDLE_SCRIPT, "Always", dir.path()).await;
        create_shell_pod(&api, "poker", &node, &poker, "Never", dir.path()).await;
        wait_running(&api, "shell", 0).await;
        wait_running(&api, "poker", 0).await;

        // stdout and stderr arrive apart, and the status says how the command ended.
        let mut process = api
            .exec(
                "shell",
                ["sh", "-c", "echo out; echo err >&2; exit 7"],
                &AttachParams::default().stderr(true),
            )
            .await
            .expect("exec");
        let mut out = String::new();
        let mut err = String::new();
        let mut stdout = process.stdout().expect("stdout");
        let mut stderr = process.stderr().expect("stderr");
        let status = process.take_status().expect("status");
        let (o, e) = tokio::join!(
            stdout.read_to_string(&mut out),
            stderr.read_to_string(&mut err)
        );
        o.expect("stdout");
        e.expect("stderr");
        let status = status.await.expect("a status");
        assert_eq!((out.as_str(), err.as_str()), ("out\n", "err\n"));
        assert_eq!(status.status.as_deref(), Some("Failure"));
        assert_eq!(status.reason.as_deref(), Some("NonZeroExitCode"));
        let causes = status.details.and_then(|d| d.causes).unwrap_or_default();
        assert_eq!(causes[0].reason.as_deref(), Some("ExitCode"));
        assert_eq!(causes[0].message.as_deref(), Some("7"));
        process.join().await.expect("exec ends");

        // A terminal resized by the client.
        let mut process = api
            .exec("shell", ["sh"], &AttachParams::interactive_tty())
            .await
            .expect("exec -it");
        let mut resize = process.terminal_size().expect("terminal size channel");
        resize
            .send(TerminalSize {
                width: 123,
                height: 45,
            })
            .await
            .expect("resize");
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut stdin = process.stdin().expect("stdin");
        let mut stdout = process.stdout().expect("stdout");
        stdin.write_all(b"stty size\n").await.expect("type");
        read_until(&mut stdout, "45 123").await;
        stdin.write_all(b"exit\n").await.expect("type");
        drop(stdin);
        let status = process.take_status().expect("status").await;
        assert_eq!(status.and_then(|s| s.status).as_deref(), Some("Success"));

        // Attach streams the container's output as it is written, until it exits.
        let mut attached = api
            .attach("poker", &AttachParams::default().stdin(false).stderr(true))
            .await
            .expect("attach");
        let mut stdout = attached.stdout().expect("stdout");
        let mut stderr = attached.stderr().expect("stderr");
        let status = attached.take_status().expect("status");
        tokio::time::sleep(Duration::from_millis(300)).await;
        std::fs::write(dir.path().join("poke"), "").expect("poke");
        read_until(&mut stdout, "poked\n").await;
        read_until(&mut stderr, "also\n").await;
        std::fs::write(dir.path().join("stop"), "").expect("stop");
        read_until(&mut stdout, "bye\n").await;
        let status = tokio::time::timeout(patience(Duration::from_secs(10)), status)
            .await
            .expect("attach ends with the container");
        assert_eq!(status.and_then(|s| s.status).as_deref(), Some("Success"));

        // Attaching stdin is refused with the reason.
        let refused = api.attach("shell", &AttachParams::interactive_tty()).await;
        assert!(refused.is_err(), "attach with stdin must be refused");

        // The endpoint's metrics and health.
        let mut config = kube::Config::new("https://198.18.0.10:10250".parse().expect("url"));
        config.accept_invalid_certs = true;
        let kubelet = kube::Client::try_from(config).expect("kubelet client");
        let get = |path: &str| http::Request::get(path).body(Vec::new()).expect("request");
        assert_eq!(
            kubelet
                .request_text(get("/healthz"))
                .await
                .expect("healthz"),
            "ok"
        );
        // Sessions count as closed once their tasks finish, just after the client saw the end.
        let deadline = Instant::now() + patience(Duration::from_secs(5));
        let metrics = loop {
            let metrics = kubelet
                .request_text(get("/metrics"))
                .await
                .expect("metrics");
            let missing: Vec<&str> = [
                "simkube_node_running_pods 2",
                "simkube_node_stream_sessions_total{kind=\"Exec\"} 2",
                "simkube_node_stream_sessions_total{kind=\"Attach\"} 1",
                "simkube_node_stream_sessions_active 0",
                "simkube_node_sandbox_setup_seconds_count 2",
            ]
            .into_iter()
            .filter(|want| !metrics.lines().any(|l| l == *want))
            .collect();
            if missing.is_empty() {
                break metrics;
            }
            assert!(
                Instant::now() < deadline,
                "{missing:?} missing in:\n{metrics}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let started = metrics
            .lines()
            .find_map(|l| l.strip_prefix("simkube_node_containers_started_total "))
            .and_then(|v| v.parse::<u64>().ok())
            .expect("containers started");
        assert!(started >= 2, "{metrics}");

        // The endpoint's own answers for what cannot be served.
        let refusal = |path: &'static str| {
            let kubelet = kubelet.clone();
            async move {
                match kubelet.request_text(get(path)).await {
                    Err(kube::Error::Api(status)) => (status.code, status.message),
                    other => panic!("{path}: expected an error, got {other:?}"),
                }
            }
        };
        for (path, code, says) in [
            (
                "/exec/default/poker/main?command=true&output=1",
                400,
                "container \"main\" in pod \"poker\" is not running",
            ),
            (
                "/exec/default/nosuch/main?command=true&output=1",
                404,
                "pod default/nosuch does not exist on this node",
            ),
            (
                "/exec/default/shell/main?command=true&output=1",
                400,
                "exec is served as a WebSocket upgrade",
            ),
            (
                "/exec/default/shell/main?command=true",
                400,
                "you must specify at least 1 of stdin, stdout, stderr",
            ),
            (
                "/containerLogs/default/shell/main?sinceTime=yesterday",
                400,
                "invalid sinceTime \"yesterday\"",
            ),
        ] {
            let (got, message) = refusal(path).await;
            assert_eq!(got, code, "{path}: {message}");
            assert!(message.contains(says), "{path}: {message}");
        }

        // A command still running when its container stops dies with it (SIGKILL: 137).
        let mut process = api
            .exec("shell", ["sleep", "1000"], &AttachParams::default())
            .await
            .expect("exec");
        let status = process.take_status().expect("status");
        tokio::time::sleep(Duration::from_millis(200)).await;
        api.delete("shell", &Default::default())
            .await
            .expect("delete");
        let status = tokio::time::timeout(patience(Duration::from_secs(15)), status)
            .await
            .expect("exec ends with its container")
            .expect("a status");
        let causes = status.details.and_then(|d| d.causes).unwrap_or_default();
        assert_eq!(causes[0].message.as_deref(), Some("137"), "{causes:?}");
    });
}
