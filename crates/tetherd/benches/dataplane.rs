//! Data-plane benchmark (prints figures; not a test): pod-to-pod TCP throughput through two
//! `tetherd gateway`s with the same pod CIDR on both sides, against the same pod-node-gateway-
//! underlay path routed plainly without the tunnel; ping RTT both ways; gateway CPU seconds
//! per GB; hypervisor steal during each run.
//!
//! Run as root: `cargo bench -p tetherd --bench dataplane` (needs `iperf3` and `ping`).
//! `TETHER_BENCH_SECONDS` sets the iperf3 duration (default 10).

#[path = "../tests/support/mod.rs"]
mod support;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::{Command, Stdio};
use std::time::Duration;

use support::*;
use tether_testkit::{Cluster, ClusterSpec, Netns, Topology};
use tether_wg::PrivateKey;

fn main() {
    if !tether_testkit::require_tools_or_skip(&["iperf3", "ping"]) {
        return;
    }
    let seconds: u32 = std::env::var("TETHER_BENCH_SECONDS").map_or(10, |s| {
        s.parse()
            .unwrap_or_else(|_| panic!("TETHER_BENCH_SECONDS={s:?} is not a number of seconds"))
    });
    println!("load average before: {}", load_average());

    // --- Through the tunnel: both clusters use 10.0.0.0/16. ---
    let (ka, kb) = (PrivateKey::generate(), PrivateKey::generate());
    let a = GatewayFiles::new(ka.clone());
    let b = GatewayFiles::new(kb.clone());
    let entry = |id: &str, key, endpoint| PeerEntry {
        id: id.into(),
        public_key: key,
        endpoint,
        pod_cidr: "10.0.0.0/16".into(),
        keepalive: None,
    };
    let probe = Topology::builder()
        .cluster(ClusterSpec::new("p"))
        .build()
        .expect("probe");
    a.write(probe.cluster("p"), &[entry("b", kb.public(), None)]);
    b.write(probe.cluster("p"), &[entry("a", ka.public(), None)]);
    let (b_in_a, a_in_b) = (local_view(&a, "b"), local_view(&b, "a"));
    drop(probe);
    let topo = Topology::builder()
        .cluster(ClusterSpec::new("a").route_to_gateway(&b_in_a.to_string()))
        .cluster(ClusterSpec::new("b").route_to_gateway(&a_in_b.to_string()))
        .build()
        .expect("topology");
    let (ca, cb) = (topo.cluster("a"), topo.cluster("b"));
    let b_ep = SocketAddr::new(IpAddr::V4(cb.gateway_underlay_ip()), PORT);
    a.write(ca, &[entry("b", kb.public(), Some(b_ep))]);
    b.write(cb, &[entry("a", ka.public(), None)]);
    let ga = start_gateway(ca, &a);
    let gb = start_gateway(cb, &b);
    let to_b = translate(cb.pod_ip(0), b_in_a);
    let to_a = translate(ca.pod_ip(0), a_in_b);
    let mut ok = false;
    for _ in 0..100 {
        if ca.pod(0).ping(IpAddr::V4(to_b)).unwrap_or(false) {
            ok = true;
            break;
        }
    }
    assert!(ok, "tunnel did not come up");
    let pids = [ga.pid(), gb.pid()];
    let mut rows = Vec::new();
    for streams in [1, 4] {
        rows.push(iperf(
            &format!("tunnel, {streams} stream(s)"),
            ca,
            cb,
            to_b,
            streams,
            seconds,
            &pids,
        ));
    }
    let rtt_tunnel = (ping_rtt(ca.pod(0), to_b), ping_rtt(cb.pod(0), to_a));
    if std::env::var_os("TETHER_BENCH_DIAG").is_some() {
        for c in [ca, cb] {
            let g = c.gateway();
            println!("--- {} gateway: drops and errors", c.name());
            let nstat = g
                .exec(&["nstat", "-az"])
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
            for l in nstat.unwrap_or_default().lines() {
                let interesting = ["Udp", "Drop", "Retrans", "Discard", "Err", "PathFilter"];
                if interesting.iter().any(|k| l.contains(k)) && !l.contains(" 0 ") {
                    println!("  {l}");
                }
            }
            println!("{}", g.ip(&["-s", "link"]).unwrap_or_default());
            if let Some((_, m)) = http_get(g, "/metrics") {
                for l in m
                    .lines()
                    .filter(|l| !l.starts_with('#') && !l.ends_with(" 0"))
                {
                    println!("  {l}");
                }
            }
        }
    }
    drop((ga, gb));
    drop(topo);

    // --- The same path shape without the tunnel: distinct pod CIDRs routed plainly. ---
    let topo = Topology::builder()
        .cluster(
            ClusterSpec::new("a")
                .pod_cidr("10.0.0.0/16")
                .route_to_gateway("10.20.0.0/16"),
        )
        .cluster(
            ClusterSpec::new("b")
                .pod_cidr("10.20.0.0/16")
                .route_to_gateway("10.0.0.0/16"),
        )
        .build()
        .expect("plain topology");
    let (ca, cb) = (topo.cluster("a"), topo.cluster("b"));
    ca.gateway()
        .ip(&[
            "route",
            "add",
            "10.20.0.0/16",
            "via",
            &cb.gateway_underlay_ip().to_string(),
        ])
        .expect("route a");
    cb.gateway()
        .ip(&[
            "route",
            "add",
            "10.0.0.0/16",
            "via",
            &ca.gateway_underlay_ip().to_string(),
        ])
        .expect("route b");
    for streams in [1, 4] {
        rows.push(iperf(
            &format!("plain routed, {streams} stream(s)"),
            ca,
            cb,
            cb.pod_ip(0),
            streams,
            seconds,
            &[],
        ));
    }
    let rtt_plain = (
        ping_rtt(ca.pod(0), cb.pod_ip(0)),
        ping_rtt(cb.pod(0), ca.pod_ip(0)),
    );
    drop(topo);

    println!();
    println!(
        "{:<28} {:>10} {:>12} {:>10} {:>8}",
        "path", "Gbit/s", "retransmits", "gw cpu-s/GB", "steal %"
    );
    for r in &rows {
        let cpu = r.cpu_per_gb.map_or("-".to_owned(), |c| format!("{c:.2}"));
        println!(
            "{:<28} {:>10.2} {:>12} {:>10} {:>8.1}",
            r.name, r.gbps, r.retransmits, cpu, r.steal_pct
        );
    }
    for (i, streams) in [1, 4].iter().enumerate() {
        println!(
            "ratio tunnel/plain, {streams} stream(s): {:.2}",
            rows[i].gbps / rows[i + 2].gbps
        );
    }
    println!(
        "ping RTT avg tunnel A->B / B->A: {:.3} / {:.3} ms",
        rtt_tunnel.0, rtt_tunnel.1
    );
    println!(
        "ping RTT avg plain  A->B / B->A: {:.3} / {:.3} ms",
        rtt_plain.0, rtt_plain.1
    );
    println!("load average after: {}", load_average());
    if rows.iter().any(|r| r.steal_pct > 8.0) {
        println!("WARNING: steal above 8 % in at least one run; treat those figures as noisy");
    }
}

struct Row {
    name: String,
    gbps: f64,
    retransmits: u64,
    cpu_per_gb: Option<f64>,
    steal_pct: f64,
}

fn iperf(
    name: &str,
    ca: &Cluster,
    cb: &Cluster,
    to: Ipv4Addr,
    streams: u32,
    seconds: u32,
    pids: &[u32],
) -> Row {
    let mut server = cb
        .pod(0)
        .spawn({
            let mut c = Command::new("iperf3");
            c.args(["-s", "-1", "-p", "5201"])
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            c
        })
        .expect("iperf3 server");
    std::thread::sleep(Duration::from_millis(300));
    let cpu0: u64 = pids.iter().map(|p| cpu_ticks(*p)).sum();
    let steal0 = steal();
    let out = ca
        .pod(0)
        .exec(&[
            "iperf3",
            "-c",
            &to.to_string(),
            "-p",
            "5201",
            "-t",
            &seconds.to_string(),
            "-P",
            &streams.to_string(),
            "-J",
        ])
        .expect("iperf3 client");
    let cpu1: u64 = pids.iter().map(|p| cpu_ticks(*p)).sum();
    let steal1 = steal();
    let _ = server.wait_timeout(Duration::from_secs(5));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("iperf3 JSON");
    let end = &json["end"];
    let bps = end["sum_received"]["bits_per_second"]
        .as_f64()
        .expect("bits_per_second");
    let bytes = end["sum_received"]["bytes"].as_f64().expect("bytes");
    let retransmits = end["sum_sent"]["retransmits"]
        .as_u64()
        .expect("iperf3 JSON: end.sum_sent.retransmits");
    let cpu_per_gb = (!pids.is_empty()).then(|| (cpu1 - cpu0) as f64 / 100.0 / (bytes / 1e9));
    let steal_pct = 100.0 * (steal1.0 - steal0.0) as f64 / ((steal1.1 - steal0.1).max(1)) as f64;
    println!("{name}: {:.2} Gbit/s (steal {steal_pct:.1} %)", bps / 1e9);
    Row {
        name: name.to_owned(),
        gbps: bps / 1e9,
        retransmits,
        cpu_per_gb,
        steal_pct,
    }
}

/// `/proc/loadavg`, trimmed. A figure that cannot be read stops the benchmark: a silent 0 or
/// NaN would pass for a measurement.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .expect("reading /proc/loadavg")
        .trim()
        .to_owned()
}

/// utime + stime of a process and all its threads, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
    // Fields after the command (which is in parentheses and may contain spaces).
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .unwrap_or_else(|| panic!("{path} has no command in parentheses: {stat:?}"));
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state); utime is field 14, stime 15.
    let field = |i: usize| -> u64 {
        f.get(i)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{path}: field {} is not a number: {stat:?}", i + 3))
    };
    field(11) + field(12)
}

/// (steal, total) jiffies from the aggregate `cpu` line of /proc/stat.
fn steal() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").expect("reading /proc/stat");
    let line = stat.lines().next().unwrap_or_default();
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse().unwrap_or_else(|_| panic!("/proc/stat: {line:?}")))
        .collect();
    assert!(v.len() >= 8, "/proc/stat has no steal column: {line:?}");
    (v[7], v.iter().take(8).sum())
}

/// Average RTT of 100 pings at 10 ms intervals, in ms.
fn ping_rtt(ns: &Netns, to: Ipv4Addr) -> f64 {
    let out = ns
        .exec(&[
            "ping",
            "-n",
            "-q",
            "-c",
            "100",
            "-i",
            "0.01",
            &to.to_string(),
        ])
        .expect("ping");
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find(|l| l.contains("min/avg/max"))
        .and_then(|l| l.split('=').nth(1))
        .and_then(|v| v.trim().split('/').nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no average RTT in the output of ping: {text}"))
}
