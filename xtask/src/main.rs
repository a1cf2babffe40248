//! `cargo xtask`: the project's own commands. Each one first installs the system packages it
//! needs on a Debian or Ubuntu machine (only the missing ones, so it is cheap to repeat), then
//! does its job: run the tests, or bring up the main job.
//!
//! ```text
//! cargo xtask up            set up, build, run the main job (clusters c1 and c2, peered, a
//!                           namespace offloaded)
//! cargo xtask down          remove what `up` brought up
//! cargo xtask test [ARGS]   set up, then cargo test --workspace --locked --no-fail-fast ARGS
//! cargo xtask setup         only install the missing system packages
//! cargo xtask fuzz-build    compile the cargo-fuzz targets of sim/simkube/fuzz on stable
//! ```

mod setup;
mod test;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

const USAGE: &str = "usage: cargo xtask <command>

commands:
  up            install what is missing, build, and run the main job: two simulated two-node
                clusters c1 and c2 (kubeconfigs c1.kubeconfig and c2.kubeconfig), Tether
                installed in both, c1 peered with c2 as its provider (2 CPUs, 4Gi, 20 pods
                granted: the virtual node c2), and namespace demo offloaded with a Deployment
                that runs on both clusters behind one Service; needs root
  down          remove what `up` brought up (both clusters); needs root
  test [ARGS]   install what is missing, then `cargo test --workspace --locked --no-fail-fast
                ARGS`; reports every test that skipped, and with CI set fails if any did
  setup         only install the missing system packages (apt-get; root when any is missing)
  fuzz-build    compile the fuzz targets of sim/simkube/fuzz with a plain stable build";

/// A failure of an xtask command, said in a sentence for the person who ran it.
type Result<T = ()> = std::result::Result<T, String>;

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let command = args.next();
    let rest: Vec<String> = args.collect();
    let result = match command.as_deref() {
        Some("up") => no_args("up", &rest).and_then(|()| main_job()),
        Some("down") => no_args("down", &rest).and_then(|()| main_job_down()),
        Some("test") => test::run(&rest),
        Some("setup") => no_args("setup", &rest).and_then(|()| setup::ensure(setup::BASE)),
        Some("fuzz-build") => no_args("fuzz-build", &rest).and_then(|()| fuzz_build()),
        Some("help" | "-h" | "--help") | None => {
            println!("{USAGE}");
            Ok(())
        }
        Some(other) => Err(format!("unknown command {other:?}\n\n{USAGE}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("xtask: error: {error}");
            ExitCode::FAILURE
        }
    }
}

fn no_args(command: &str, rest: &[String]) -> Result {
    if rest.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "`cargo xtask {command}` takes no arguments (got {rest:?})\n\n{USAGE}"
        ))
    }
}

/// The simulated clusters of the main job: the consumer first, then the provider.
const MAIN_CLUSTERS: [&str; 2] = ["c1", "c2"];

/// The main job, one step after the other: two simulated two-node clusters with their admin
/// kubeconfigs at the workspace root, Tether installed in both (cluster IDs as the names), and
/// c1 peered with c2. Steps already done are skipped, so running it again is harmless.
fn main_job() -> Result {
    require_root("`cargo xtask up` brings up simulated clusters (network namespaces)")?;
    setup::ensure(setup::BASE)?;
    // `tetherd` next to `simkube` is what Tether's image maps to in the clusters' pods.
    cargo(&[
        "build",
        "--locked",
        "-p",
        "simkube-cluster",
        "-p",
        "tetherd",
        "-p",
        "tether-cli",
    ])?;
    let running = running_clusters()?;
    for name in MAIN_CLUSTERS {
        if running.iter().any(|r| r == name) {
            println!("xtask: cluster {name} is already up");
            continue;
        }
        simkube(&[
            "cluster",
            "up",
            "--name",
            name,
            "--nodes",
            "2",
            "--kubeconfig-out",
            &kubeconfig(name),
        ])?;
    }
    for name in MAIN_CLUSTERS {
        tether(&[
            "--kubeconfig",
            &kubeconfig(name),
            "install",
            "--cluster-id",
            name,
        ])?;
    }
    let [consumer, provider] = MAIN_CLUSTERS;
    tether(&[
        "--kubeconfig",
        &kubeconfig(consumer),
        "peer",
        "--remote-kubeconfig",
        &kubeconfig(provider),
        "--cpu",
        "2",
        "--memory",
        "4Gi",
        "--pods",
        "20",
    ])?;
    demo(consumer, provider)?;
    tether(&["--kubeconfig", &kubeconfig(consumer), "status"])?;
    println!(
        "\nTwo clusters, peered: {consumer} consumes from {provider}, whose grant is the virtual \
         node {provider} of {consumer}, and a tunnel joins their pod networks. Namespace demo is \
         offloaded: its Deployment hello runs on both clusters behind one Service. Try:\n  \
         kubectl --kubeconfig {consumer}.kubeconfig get nodes\n  \
         kubectl --kubeconfig {consumer}.kubeconfig -n demo get pods -o wide\n  \
         kubectl --kubeconfig {provider}.kubeconfig -n demo-{consumer} get pods -o wide\n  \
         kubectl --kubeconfig {consumer}.kubeconfig -n demo scale deployment hello --replicas 8\n  \
         kubectl --kubeconfig {consumer}.kubeconfig get foreignclusters,resourceslices,virtualnodes -A\n  \
         cargo run -q -p tether-cli -- --kubeconfig {provider}.kubeconfig status\n  \
         cargo xtask down"
    );
    Ok(())
}

/// The playground's demo: namespace `demo` offloaded from `consumer` to `provider`, the
/// Deployment of docs/examples/demo.yaml in it, and a check that its Service answers from a
/// pod of each cluster.
fn demo(consumer: &str, provider: &str) -> Result {
    let kc = kubeconfig(consumer);
    if kubectl_output(&kc, &["get", "namespace", "demo", "-o", "name"]).is_err() {
        run(Command::new("kubectl")
            .args(["--kubeconfig", &kc, "create", "namespace", "demo"])
            .current_dir(workspace_root()))?;
    }
    tether(&["--kubeconfig", &kc, "offload", "namespace", "demo"])?;
    run(Command::new("kubectl")
        .args([
            "--kubeconfig",
            &kc,
            "apply",
            "-f",
            "docs/examples/demo.yaml",
        ])
        .current_dir(workspace_root()))?;
    run(Command::new("kubectl")
        .args([
            "--kubeconfig",
            &kc,
            "-n",
            "demo",
            "rollout",
            "status",
            "deployment/hello",
            "--timeout=180s",
        ])
        .current_dir(workspace_root()))?;
    let pods = kubectl_output(
        &kc,
        &[
            "-n",
            "demo",
            "get",
            "pods",
            "-l",
            "app=hello",
            "--field-selector",
            "status.phase=Running",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name} {.spec.nodeName}{\"\\n\"}{end}",
        ],
    )?;
    let pods: Vec<(String, String)> = pods
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(p, n)| (p.to_owned(), n.to_owned()))
        .collect();
    let remote: Vec<&str> = pods
        .iter()
        .filter(|(_, n)| n == provider)
        .map(|(p, _)| p.as_str())
        .collect();
    let Some((local, _)) = pods.iter().find(|(_, n)| n != provider) else {
        return Err(format!(
            "every pod of the demo runs on the virtual node {provider}; scale it up \
             (`kubectl -n demo scale deployment hello --replicas 8`) to see both clusters"
        ));
    };
    if remote.is_empty() {
        // What the scheduler weighs, as it is now: a taint or a Ready that has changed since
        // would not show in `describe` later.
        let node = kubectl_output(
            &kc,
            &[
                "get",
                "node",
                provider,
                "-o",
                "jsonpath=taints {.spec.taints}, Ready {.status.conditions[?(@.type==\"Ready\")]}, allocatable {.status.allocatable}",
            ],
        )
        .unwrap_or_else(|e| e);
        let placed = pods
            .iter()
            .map(|(p, n)| format!("{p} on {n}"))
            .collect::<Vec<_>>()
            .join(", ");
        return Err(format!(
            "no pod of the demo landed on the virtual node {provider} ({placed}; node {provider}: \
             {node}): `kubectl --kubeconfig {kc} describe node {provider}` and `kubectl \
             --kubeconfig {kc} -n demo get events` say why"
        ));
    }
    // The Service, asked from a pod of this cluster, answers from both clusters.
    let mut answered = std::collections::BTreeSet::new();
    for _ in 0..16 {
        let out = kubectl_output(
            &kc,
            &[
                "-n",
                "demo",
                "exec",
                local,
                "--",
                "curl",
                "-s",
                "--max-time",
                "3",
                "http://hello.demo/",
            ],
        )
        .unwrap_or_default();
        if let Some(pod) = out.split_whitespace().find_map(|w| w.strip_prefix("pod=")) {
            answered.insert(pod.to_owned());
        }
        if answered.iter().any(|p| remote.contains(&p.as_str()))
            && answered.iter().any(|p| !remote.contains(&p.as_str()))
        {
            break;
        }
    }
    let from_remote: Vec<&String> = answered
        .iter()
        .filter(|p| remote.contains(&p.as_str()))
        .collect();
    if from_remote.is_empty() {
        return Err(format!(
            "the Service hello answered only from {consumer}'s own pods ({answered:?}), not from \
             the offloaded ones {remote:?}; `kubectl --kubeconfig {kc} -n demo get \
             endpointslices` and `tether status` show where traffic stops"
        ));
    }
    println!(
        "xtask: the Service demo/hello answered from {} pod(s), {} of them offloaded to {provider} \
         ({})",
        answered.len(),
        from_remote.len(),
        from_remote
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(())
}

/// kubectl's standard output, or an error with its standard error.
fn kubectl_output(kubeconfig: &str, args: &[&str]) -> Result<String> {
    let out = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .current_dir(workspace_root())
        .output()
        .map_err(|e| format!("cannot run kubectl: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
    }
}

fn kubeconfig(cluster: &str) -> String {
    format!("{cluster}.kubeconfig")
}

/// Names of the simulated clusters whose daemon runs (`simkube cluster list`).
fn running_clusters() -> Result<Vec<String>> {
    let output = Command::new(cargo_program())
        .args([
            "run",
            "--locked",
            "--quiet",
            "-p",
            "simkube-cluster",
            "--bin",
            "simkube",
            "--",
            "cluster",
            "list",
        ])
        .current_dir(workspace_root())
        .output()
        .map_err(|e| format!("cannot run `simkube cluster list`: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "`simkube cluster list` failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&output.stdout)
        .lines()
        .skip(1)
        .filter(|l| l.trim_end().ends_with("running"))
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect())
}

/// Undoes [`main_job`].
fn main_job_down() -> Result {
    require_root("`cargo xtask down` removes simulated clusters (network namespaces)")?;
    setup::ensure(setup::BASE)?;
    for name in MAIN_CLUSTERS {
        simkube(&["cluster", "down", "--name", name])?;
    }
    Ok(())
}

/// Compiles the cargo-fuzz targets as a normal stable build: libFuzzer's C++ part needs g++.
/// Their lockfile is their own; a stale one is updated (and reported) rather than failing.
fn fuzz_build() -> Result {
    setup::ensure(setup::FUZZ)?;
    let dir = workspace_root().join("sim/simkube/fuzz");
    let lock = std::fs::read(dir.join("Cargo.lock")).unwrap_or_default();
    let target = workspace_root().join("target/fuzz");
    let mut command = Command::new(cargo_program());
    command
        .args(["build", "--bins", "--target-dir"])
        .arg(&target)
        .current_dir(&dir);
    run(&mut command)?;
    if std::fs::read(dir.join("Cargo.lock")).unwrap_or_default() != lock {
        println!(
            "xtask: note: sim/simkube/fuzz/Cargo.lock was out of date with the workspace and was \
             updated; commit it"
        );
    }
    Ok(())
}

/// Runs the `simkube` command of this workspace with `args` (built if needed).
fn simkube(args: &[&str]) -> Result {
    let mut all = vec![
        "run",
        "--locked",
        "--quiet",
        "-p",
        "simkube-cluster",
        "--bin",
        "simkube",
        "--",
    ];
    all.extend_from_slice(args);
    cargo(&all)
}

/// Runs the `tether` command of this workspace with `args`.
fn tether(args: &[&str]) -> Result {
    let mut all = vec![
        "run",
        "--locked",
        "--quiet",
        "-p",
        "tether-cli",
        "--bin",
        "tether",
        "--",
    ];
    all.extend_from_slice(args);
    cargo(&all)
}

/// Runs cargo with `args` in the workspace root.
fn cargo(args: &[&str]) -> Result {
    let mut command = Command::new(cargo_program());
    command.args(args).current_dir(workspace_root());
    run(&mut command)
}

/// The cargo that runs this xtask (`CARGO`), so that a toolchain chosen by rustup is kept.
fn cargo_program() -> OsString {
    std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into())
}

/// The workspace root: the parent of this crate.
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

/// Runs `command`, showing it first; a non-zero exit is an error naming it.
fn run(command: &mut Command) -> Result {
    let line = command_line(command);
    println!("xtask: $ {line}");
    let status = command
        .status()
        .map_err(|e| format!("cannot run `{line}`: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("`{line}` failed ({status})"))
    }
}

fn command_line(command: &Command) -> String {
    std::iter::once(command.get_program())
        .chain(command.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Whether this process runs with effective UID 0 (read from `/proc/self/status`).
fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|ids| ids.split_whitespace().nth(1).map(|euid| euid == "0"))
        })
        .unwrap_or(false)
}

fn require_root(why: &str) -> Result {
    if is_root() {
        Ok(())
    } else {
        Err(format!(
            "{why}: run it as root (e.g. `sudo -E cargo xtask ...`)"
        ))
    }
}

/// Whether `CI` is set: then a skipped privileged test or a missing tool is a failure.
fn in_ci() -> bool {
    std::env::var_os("CI").is_some_and(|v| !v.is_empty())
}
