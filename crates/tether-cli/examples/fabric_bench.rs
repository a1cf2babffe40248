//! Fabric benchmark: the pod-to-pod path a user gets after `tether peer`, measured side by side
//! with the plain underlay in the same run. Two simulated two-node clusters on pod CIDR
//! 10.244.0.0/16, Tether installed in both and peered with networking; a pod on node 2 of each.
//! The fabric path is pod (node 2 of A) → fabric → gateway A → WireGuard → gateway B → fabric
//! → pod (node 2 of B), to the address A gives that pod through its remap; the plain path is
//! node 2 of A → underlay → node 2 of B. Prints iperf3 throughput (1 and 4 streams, TCP
//! retransmits) and ping RTT for both, and the ratio.
//!
//! Needs root, iperf3 (installed by `cargo xtask setup`) and release builds beside it:
//! `cargo build --release -p simkube-cluster -p tetherd -p tether-cli && cargo run --release -p
//! tether-cli --example fabric_bench` (`--secs S` per iperf3 run, default 10).

mod common;

use std::net::Ipv4Addr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{Bench, Cluster, Result, arg, kubectl, path, pod_on_node_2, seen_from_a};

fn main() -> std::process::ExitCode {
    common::exit("fabric_bench", run())
}

/// An iperf3 server in a namespace, ended (by its PID) when dropped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn run() -> Result {
    let secs = arg("--secs", 10)?;
    let pid = std::process::id();
    let mut bench = Bench::new("fabric")?;
    let a = bench.up(&format!("fa{pid}"), 2)?;
    let b = bench.up(&format!("fb{pid}"), 2)?;
    bench.tether(&a, &["install", "--cluster-id", "bench-a"])?;
    bench.tether(&b, &["install", "--cluster-id", "bench-b"])?;
    bench.tether(&a, &["peer", "--remote-kubeconfig", path(&b)])?;

    let (netns_a, _) = pod_on_node_2(&a, "bench-client", "simkube.dev/sleeper")?;
    let (netns_b, ip_b) = pod_on_node_2(&b, "bench-server", "simkube.dev/sleeper")?;
    let (view, remote) = seen_from_a(&a, ip_b)?;
    let tunnel_mtu = kubectl(
        &a,
        &[
            "get",
            "connections.networking.tether.dev",
            "-n",
            "tether-tenant-bench-b",
            "tether-gateway",
            "-o",
            "jsonpath={.status.mtu}",
        ],
    )?;

    let node_a = format!("sk.{}.n2", a.0);
    let node_b = format!("sk.{}.n2", b.0);
    let plain_target: Ipv4Addr = Ipv4Addr::new(198, 18, cluster_index(&b)?, 12);

    println!(
        "fabric: pod {netns_a} → {remote} (pod {ip_b} of bench-b through the remap {view}), tunnel \
         MTU {tunnel_mtu}"
    );
    println!("plain: node {node_a} → {plain_target} (node 2 of bench-b) over the underlay");
    println!("{secs} s per iperf3 run\n");
    println!("path     streams   Gbit/s   retransmits");
    let mut rows = Vec::new();
    for (label, client_ns, server_ns, target) in [
        ("fabric", netns_a.as_str(), netns_b.as_str(), remote),
        ("plain", node_a.as_str(), node_b.as_str(), plain_target),
    ] {
        for streams in [1, 4] {
            let (gbps, retrans) = iperf(client_ns, server_ns, target, streams, secs)?;
            println!("{label:<8} {streams:>7}   {gbps:>6.2}   {retrans:>11}");
            rows.push((label, streams, gbps));
        }
    }
    let gbps = |label: &str, streams: u32| {
        rows.iter()
            .find(|r| r.0 == label && r.1 == streams)
            .map_or(0.0, |r| r.2)
    };
    for streams in [1, 4] {
        println!(
            "fabric/plain, {streams} stream(s): {:.2}",
            gbps("fabric", streams) / gbps("plain", streams).max(f64::EPSILON)
        );
    }
    let fabric_rtt = rtt(&netns_a, remote)?;
    let plain_rtt = rtt(&node_a, plain_target)?;
    println!(
        "ping RTT (avg of 50): fabric {fabric_rtt:.3} ms, plain {plain_rtt:.3} ms, the fabric adds \
         {:.3} ms",
        fabric_rtt - plain_rtt
    );
    Ok(())
}

/// The underlay index of a cluster (its 198.18.X.0/24), from its API server address as nodes
/// see it.
fn cluster_index(c: &Cluster) -> Result<u8> {
    let ip = kubectl(
        c,
        &[
            "get",
            "node",
            &format!("{}-node-2", c.0),
            "-o",
            "jsonpath={.status.addresses[?(@.type==\"InternalIP\")].address}",
        ],
    )?;
    let ip: Ipv4Addr = ip
        .parse()
        .map_err(|e| format!("node 2 of {} has no InternalIP ({ip:?}): {e}", c.0))?;
    Ok(ip.octets()[2])
}

/// One iperf3 run from `client_ns` to a server in `server_ns` at `target`: Gbit/s received
/// and TCP retransmits.
fn iperf(
    client_ns: &str,
    server_ns: &str,
    target: Ipv4Addr,
    streams: u32,
    secs: u64,
) -> Result<(f64, u64)> {
    let server = Server(
        Command::new("ip")
            .args([
                "netns", "exec", server_ns, "iperf3", "-s", "-1", "-p", "5201",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("starting iperf3 -s in {server_ns}: {e}"))?,
    );
    // The server needs a moment to listen; a refused first attempt is retried.
    let mut last = String::new();
    for _ in 0..20 {
        std::thread::sleep(Duration::from_millis(200));
        let out = Command::new("ip")
            .args(["netns", "exec", client_ns, "iperf3", "-J", "-c"])
            .arg(target.to_string())
            .args([
                "-p",
                "5201",
                "-t",
                &secs.to_string(),
                "-P",
                &streams.to_string(),
            ])
            .output()
            .map_err(|e| format!("running iperf3 -c in {client_ns}: {e}"))?;
        let report: serde_json::Value = serde_json::from_slice(&out.stdout)
            .map_err(|e| format!("iperf3 printed no JSON report: {e}"))?;
        if let Some(error) = report.get("error").and_then(|e| e.as_str()) {
            last = error.to_owned();
            if error.contains("refused") {
                continue;
            }
            return Err(format!("iperf3 to {target}: {error}"));
        }
        let end = &report["end"];
        let bits = end["sum_received"]["bits_per_second"]
            .as_f64()
            .ok_or("iperf3 report without sum_received")?;
        let retransmits = end["sum_sent"]["retransmits"].as_u64().unwrap_or(0);
        drop(server);
        return Ok((bits / 1e9, retransmits));
    }
    Err(format!("iperf3 to {target} kept failing: {last}"))
}

/// Average ping RTT in ms over 50 echoes.
fn rtt(netns: &str, target: Ipv4Addr) -> Result<f64> {
    let out = Command::new("ip")
        .args([
            "netns", "exec", netns, "ping", "-q", "-c", "50", "-i", "0.05",
        ])
        .arg(target.to_string())
        .output()
        .map_err(|e| format!("running ping in {netns}: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    // rtt min/avg/max/mdev = 0.084/0.102/0.153/0.014 ms
    text.lines()
        .find_map(|l| l.split(" = ").nth(1))
        .and_then(|v| v.split('/').nth(1))
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("ping {target} from {netns} gave no RTT:\n{text}"))
}
