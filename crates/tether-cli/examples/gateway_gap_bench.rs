//! Gateway-loss benchmark: how long cross-cluster pod traffic stops when a gateway pod is
//! deleted and its Deployment replaces it. Two simulated two-node clusters on pod CIDR
//! 10.244.0.0/16, Tether installed in both and peered with networking, an echo pod in each.
//! For each side of the tunnel (the gateway server's cluster, then the client's), N times:
//! delete the gateway pod, probe pod → remote pod over TCP through the remap every 20 ms, and
//! note when traffic flows again for good, counted from the deletion and from the moment the new
//! pod was seen Ready (polled with kubectl, so it is late by up to a poll: tens of ms). Prints
//! every run and p50/max per side.
//!
//! Needs root and release builds beside it: `cargo build --release -p simkube-cluster -p tetherd
//! -p tether-cli && cargo run --release -p tether-cli --example gateway_gap_bench` (`--runs N`
//! per side, default 3).

mod common;

use std::io::{BufRead as _, BufReader, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{Bench, Cluster, Result, arg, kubectl, path, pod_on_node_2, seen_from_a};

const GATEWAY: &str = "tether.dev/component=gateway";
const PROBE_EVERY: Duration = Duration::from_millis(20);
/// A probe's connect and read timeout: the path is local, so a lost SYN is a failed probe
/// rather than a wait for TCP's one-second retransmission.
const PROBE_TIMEOUT: Duration = Duration::from_millis(200);
/// How long traffic must flow unbroken, after the new pod is Ready, to count as back.
const STEADY: Duration = Duration::from_secs(2);
const LIMIT: Duration = Duration::from_secs(90);

fn main() -> std::process::ExitCode {
    common::exit("gateway_gap_bench", run())
}

/// One run's figures, in ms: from the deletion, and from the new pod seen Ready (negative when
/// traffic was back before that was seen).
struct Sample {
    from_deletion: i64,
    from_ready: i64,
    failed_probes: u32,
}

fn run() -> Result {
    let runs = arg("--runs", 3)?;
    if runs == 0 {
        return Err("--runs must be at least 1".into());
    }
    let pid = std::process::id();
    let mut bench = Bench::new("gateway-gap")?;
    let a = bench.up(&format!("ga{pid}"), 2)?;
    let b = bench.up(&format!("gb{pid}"), 2)?;
    bench.tether(&a, &["install", "--cluster-id", "bench-a"])?;
    bench.tether(&b, &["install", "--cluster-id", "bench-b"])?;
    bench.tether(&a, &["peer", "--remote-kubeconfig", path(&b)])?;

    let (netns, _) = pod_on_node_2(&a, "echo-a", "simkube.dev/echo")?;
    let (_, ip_b) = pod_on_node_2(&b, "echo-b", "simkube.dev/echo")?;
    let (view, remote) = seen_from_a(&a, ip_b)?;
    let target = SocketAddr::from((remote, 7000));
    let probe = || exchange(&netns, target).is_ok_and(|a| a.starts_with("pod=echo-b "));

    let server_on_a = !kubectl(
        &a,
        &[
            "get",
            "gatewayservers.networking.tether.dev",
            "-A",
            "-o",
            "name",
        ],
    )?
    .is_empty();
    let (server, client) = if server_on_a { (&a, &b) } else { (&b, &a) };
    println!(
        "probe: TCP from pod echo-a of {} to {target} (pod echo-b of {} through the remap {view}) \
         every {} ms; {runs} deletion(s) per side",
        a.0,
        b.0,
        PROBE_EVERY.as_millis()
    );

    let mut table = Vec::new();
    for (role, cluster) in [("server", server), ("client", client)] {
        let mut samples = Vec::new();
        for i in 0..runs {
            settle(&probe)?;
            let s = gap(cluster, &probe)?;
            eprintln!(
                "{role} gateway deletion {}: traffic back {} ms after the deletion, {} ms after \
                 the new pod was Ready ({} failed probes)",
                i + 1,
                s.from_deletion,
                s.from_ready,
                s.failed_probes
            );
            samples.push(s);
        }
        table.push((role, samples));
    }

    println!(
        "\ngateway pod deleted   runs   from deletion p50 / max   from new pod Ready p50 / max"
    );
    for (role, samples) in &table {
        let (d50, dmax) = p50_max(samples.iter().map(|s| s.from_deletion));
        let (r50, rmax) = p50_max(samples.iter().map(|s| s.from_ready));
        println!(
            "{:<21} {:>4}   {:>10} / {:>6} ms   {:>15} / {:>6} ms",
            format!("{role}'s side"),
            samples.len(),
            d50,
            dmax,
            r50,
            rmax
        );
    }
    Ok(())
}

fn p50_max(values: impl Iterator<Item = i64>) -> (i64, i64) {
    let mut v: Vec<i64> = values.collect();
    v.sort_unstable();
    let p50 = v[(v.len() - 1) / 2];
    (p50, v[v.len() - 1])
}

/// Waits until traffic has flowed unbroken for [`STEADY`], so a run starts from a working path.
fn settle(probe: &impl Fn() -> bool) -> Result {
    let start = Instant::now();
    let mut since = None;
    while start.elapsed() < LIMIT {
        if probe() {
            let s = *since.get_or_insert_with(Instant::now);
            if s.elapsed() >= STEADY {
                return Ok(());
            }
        } else {
            since = None;
        }
        std::thread::sleep(PROBE_EVERY);
    }
    Err(format!(
        "cross-cluster traffic did not flow steadily within {LIMIT:?}"
    ))
}

/// Deletes `cluster`'s gateway pod and measures until traffic is back for good.
fn gap(cluster: &Cluster, probe: &impl Fn() -> bool) -> Result<Sample> {
    let pods = kubectl(
        cluster,
        &[
            "get",
            "pods",
            "-A",
            "-l",
            GATEWAY,
            "-o",
            "jsonpath={range .items[*]}{.metadata.namespace} {.metadata.name}{\"\\n\"}{end}",
        ],
    )?;
    let (ns, old) = match pods.lines().collect::<Vec<_>>()[..] {
        [one] => one
            .split_once(' ')
            .map(|(n, p)| (n.to_owned(), p.to_owned()))
            .ok_or("malformed pod list")?,
        _ => {
            return Err(format!(
                "expected one gateway pod on {}, found {pods:?}",
                cluster.0
            ));
        }
    };
    let deleted = Instant::now();
    kubectl(cluster, &["delete", "pod", "-n", &ns, &old, "--wait=false"])?;
    let stop = Arc::new(AtomicBool::new(false));
    let ready = {
        let (cluster, stop) = (cluster.clone(), stop.clone());
        std::thread::spawn(move || new_pod_ready(&cluster, &ns, &old, &stop))
    };

    let mut failed_probes = 0;
    let mut streak: Option<Instant> = None;
    let resumed = loop {
        let now = Instant::now();
        if probe() {
            let since = *streak.get_or_insert(now);
            if ready.is_finished() && now.duration_since(since) >= STEADY {
                break since;
            }
        } else {
            failed_probes += 1;
            streak = None;
        }
        if deleted.elapsed() > LIMIT {
            stop.store(true, Ordering::Relaxed);
            return Err(format!(
                "traffic not back for good within {LIMIT:?} of deleting gateway pod on {} \
                 ({failed_probes} failed probes)",
                cluster.0
            ));
        }
        std::thread::sleep(PROBE_EVERY);
    };
    let ready = ready
        .join()
        .map_err(|_| "the readiness poller panicked")??;
    // No failed probe: traffic never stopped, so it was back at the deletion itself.
    let resumed = if failed_probes == 0 { deleted } else { resumed };
    let ms = |from: Instant, to: Instant| {
        if to >= from {
            (to - from).as_millis() as i64
        } else {
            -((from - to).as_millis() as i64)
        }
    };
    Ok(Sample {
        from_deletion: ms(deleted, resumed),
        from_ready: ms(ready, resumed),
        failed_probes,
    })
}

/// Polls until a gateway pod in `ns` other than `old` is Ready; the moment it was first seen so.
fn new_pod_ready(cluster: &Cluster, ns: &str, old: &str, stop: &AtomicBool) -> Result<Instant> {
    let start = Instant::now();
    while !stop.load(Ordering::Relaxed) && start.elapsed() < LIMIT {
        let pods = kubectl(
            cluster,
            &[
                "get",
                "pods",
                "-n",
                ns,
                "-l",
                GATEWAY,
                "-o",
                "jsonpath={range .items[*]}{.metadata.name} \
                 {.status.conditions[?(@.type==\"Ready\")].status}{\"\\n\"}{end}",
            ],
        )
        .unwrap_or_default();
        let ready = pods.lines().any(|l| {
            l.split_once(' ')
                .is_some_and(|(name, status)| name != old && status == "True")
        });
        if ready {
            return Ok(Instant::now());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(format!(
        "no new gateway pod Ready on {} within {LIMIT:?}",
        cluster.0
    ))
}

/// One TCP exchange from inside `netns` (on a thread that enters it): the echo's answer.
fn exchange(netns: &str, target: SocketAddr) -> Result<String> {
    let file =
        std::fs::File::open(std::path::Path::new(simkube_cluster::net::NETNS_DIR).join(netns))
            .map_err(|e| format!("open namespace {netns}: {e}"))?;
    std::thread::scope(|scope| {
        scope
            .spawn(move || {
                nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
                    .map_err(|e| format!("enter {netns}: {e}"))?;
                let err = |e: std::io::Error| e.to_string();
                let mut s = TcpStream::connect_timeout(&target, PROBE_TIMEOUT).map_err(err)?;
                s.set_read_timeout(Some(PROBE_TIMEOUT)).map_err(err)?;
                writeln!(s, "probe").map_err(err)?;
                let mut line = String::new();
                BufReader::new(s).read_line(&mut line).map_err(err)?;
                Ok(line)
            })
            .join()
            .unwrap_or_else(|_| Err("the probe thread panicked".to_owned()))
    })
}
