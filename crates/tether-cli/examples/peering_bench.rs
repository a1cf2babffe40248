//! Peering benchmark: two simulated clusters, Tether installed in both, peered and unpeered ten
//! times, with networking as `tether peer` does by default (or without: `--authentication-only`).
//! Prints the peer time (p50/p99, as `tether peer` sees it: until the tunnel is up), the
//! controllers' RSS and CPU while idle before peering and while peered, and the bytes the two
//! clusters exchanged (counted by nftables in the shared underlay namespace).
//!
//! Needs root, and release builds beside it:
//! `cargo build --release -p simkube-cluster -p tetherd -p tether-cli && cargo run --release -p
//! tether-cli --example peering_bench` (`--runs N`, `--idle-secs S` to change the defaults,
//! `--authentication-only` to peer without networking).

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{Bench, Result, arg, ok, path};

fn main() -> std::process::ExitCode {
    common::exit("peering_bench", run())
}

fn run() -> Result {
    let runs = arg("--runs", 10)?;
    let idle = Duration::from_secs(arg("--idle-secs", 60)?);
    let auth_only = std::env::args().any(|a| a == "--authentication-only");
    let pid = std::process::id();
    let mut bench = Bench::new("peering")?;
    let a = bench.up(&format!("pa{pid}"), 1)?;
    let b = bench.up(&format!("pb{pid}"), 1)?;
    bench.tether(&a, &["install", "--cluster-id", "bench-a"])?;
    bench.tether(&b, &["install", "--cluster-id", "bench-b"])?;
    let counters = Counters::install(&bench.underlay)?;

    let controllers = |id: &str| {
        common::measure::tetherd_controller(id).ok_or(format!("no controller process for {id}"))
    };
    let (ca, cb) = (controllers("bench-a")?, controllers("bench-b")?);
    eprintln!("measuring {}s of idle before peering ...", idle.as_secs());
    let before = counters.read()?;
    let idle_unpeered = (sample(ca, idle)?, sample(cb, idle)?);
    let idle_unpeered_bytes = counters.read()? - before;

    let mut times = Vec::new();
    let cycles_start = counters.read()?;
    for i in 0..runs {
        let start = Instant::now();
        let mut peer = vec!["peer", "--remote-kubeconfig", path(&b)];
        if auth_only {
            peer.extend(["--modules", "authentication"]);
        }
        bench.tether(&a, &peer)?;
        let took = start.elapsed();
        eprintln!("peering {}: {:.3}s", i + 1, took.as_secs_f64());
        times.push(took);
        if i + 1 < runs {
            bench.tether(&a, &["unpeer", "--remote-kubeconfig", path(&b)])?;
        }
    }
    let cycle_bytes = counters.read()? - cycles_start;
    let (ca, cb) = (controllers("bench-a")?, controllers("bench-b")?);
    eprintln!("measuring {}s of idle while peered ...", idle.as_secs());
    let before = counters.read()?;
    let idle_peered = (sample(ca, idle)?, sample(cb, idle)?);
    let idle_peered_bytes = counters.read()? - before;

    times.sort();
    let pct = |p: f64| {
        let i = ((times.len() as f64 * p).ceil() as usize).clamp(1, times.len()) - 1;
        times[i].as_secs_f64()
    };
    println!(
        "peerings: {runs} ({}, `tether peer` with two kubeconfigs)",
        if auth_only {
            "authentication only"
        } else {
            "authentication and networking: until the tunnel is up"
        }
    );
    println!(
        "peer time: p50 {:.3} s, p99 {:.3} s, min {:.3} s, max {:.3} s",
        pct(0.5),
        pct(0.99),
        times[0].as_secs_f64(),
        times[times.len() - 1].as_secs_f64()
    );
    println!("controller                  RSS (MiB)   CPU (mCPU)");
    for (label, (sa, sb)) in [
        ("idle, not peered", idle_unpeered),
        ("idle, peered", idle_peered),
    ] {
        println!(
            "  consumer, {label:<17} {:>8.1}   {:>9.2}",
            sa.rss_mib, sa.mcpu
        );
        println!(
            "  provider, {label:<17} {:>8.1}   {:>9.2}",
            sb.rss_mib, sb.mcpu
        );
    }
    println!(
        "bytes between the clusters: {} per peer+unpeer cycle, {} per minute idle unpeered, {} per \
         minute idle peered",
        cycle_bytes / runs.max(1),
        idle_unpeered_bytes * 60 / idle.as_secs().max(1),
        idle_peered_bytes * 60 / idle.as_secs().max(1)
    );
    Ok(())
}

/// nftables counters in the underlay for traffic forwarded between the two clusters'
/// ranges (198.18.X.0/24 and 198.19.X.0/24 of cluster indexes 1 and 2 of this underlay).
struct Counters {
    underlay: String,
}

impl Counters {
    fn install(underlay: &str) -> Result<Self> {
        // The API servers listen in the underlay namespace itself (198.18.X.1), so traffic to
        // them is input and output there; traffic to LoadBalancer addresses is forwarded.
        let rules = "ip saddr { 198.18.1.0/24, 198.19.1.0/24 } ip daddr { 198.18.2.0/24, 198.19.2.0/24 } counter\n\
                     ip saddr { 198.18.2.0/24, 198.19.2.0/24 } ip daddr { 198.18.1.0/24, 198.19.1.0/24 } counter\n";
        let mut script = String::from("table inet tetherbench {\n");
        for hook in ["forward", "input", "output"] {
            script.push_str(&format!(
                "chain {hook}_between {{\n type filter hook {hook} priority -300; policy accept;\n{rules}}}\n"
            ));
        }
        script.push_str("}\n");
        let mut child = Command::new("ip")
            .args(["netns", "exec", underlay, "nft", "-f", "-"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| format!("running nft: {e}"))?;
        use std::io::Write as _;
        child
            .stdin
            .take()
            .ok_or("nft stdin")?
            .write_all(script.as_bytes())
            .map_err(|e| format!("writing to nft: {e}"))?;
        let status = child.wait().map_err(|e| format!("nft: {e}"))?;
        if !status.success() {
            return Err("installing the byte counters failed".into());
        }
        Ok(Self {
            underlay: underlay.to_owned(),
        })
    }

    /// Bytes counted so far in both directions.
    fn read(&self) -> Result<u64> {
        let out = Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.underlay,
                "nft",
                "list",
                "table",
                "inet",
                "tetherbench",
            ])
            .output()
            .map_err(|e| format!("reading counters: {e}"))?;
        ok(&out, "nft list table")?;
        let text = String::from_utf8_lossy(&out.stdout);
        let mut total = 0u64;
        let mut found = 0;
        for line in text.lines() {
            if let Some(rest) = line.split("bytes ").nth(1) {
                let n: u64 = rest
                    .split_whitespace()
                    .next()
                    .and_then(|v| v.parse().ok())
                    .ok_or_else(|| format!("unreadable counter line: {line}"))?;
                total += n;
                found += 1;
            }
        }
        if found != 6 {
            return Err(format!("expected six counters, found {found}:\n{text}"));
        }
        Ok(total)
    }
}

struct Sample {
    rss_mib: f64,
    mcpu: f64,
}

/// RSS at the end of `over` and average CPU over it, from /proc.
fn sample(pid: u32, over: Duration) -> Result<Sample> {
    let cpu = |pid: u32| -> Result<u64> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map_err(|e| format!("reading /proc/{pid}/stat: {e}"))?;
        let after = stat.rsplit_once(')').ok_or("malformed stat")?.1;
        let f: Vec<&str> = after.split_whitespace().collect();
        let ticks = |i: usize| -> Result<u64> {
            f.get(i)
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| format!("stat field {i} unreadable"))
        };
        // utime and stime are fields 14 and 15 of stat, 12 and 13 after the command.
        Ok(ticks(11)? + ticks(12)?)
    };
    let start = cpu(pid)?;
    let started = Instant::now();
    std::thread::sleep(over);
    let used = cpu(pid)? - start;
    let hz = 100.0; // USER_HZ on Linux
    let mcpu = used as f64 / hz / started.elapsed().as_secs_f64() * 1000.0;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map_err(|e| format!("reading /proc/{pid}/status: {e}"))?;
    let rss_kib: f64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .ok_or("VmRSS unreadable")?;
    Ok(Sample {
        rss_mib: rss_kib / 1024.0,
        mcpu,
    })
}
