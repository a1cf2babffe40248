//! Shared fixtures of the gateway tests: configuration files for simulated clusters, starting
//! `tetherd gateway` inside a cluster's gateway namespace, probes (UDP echo, metrics scrape)
//! and kernel-state listings.

#![allow(dead_code, unreachable_pub)]

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream, UdpSocket};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tether_testkit::{Cluster, Netns, ProcessGuard};
use tether_wg::{PrivateKey, PublicKey};

/// Where every test gateway serves metrics, inside its own namespace.
pub const METRICS: &str = "127.0.0.1:9090";
/// Gateway UDP port.
pub const PORT: u16 = 51840;

/// One peer entry of a gateway config.
pub struct PeerEntry {
    pub id: String,
    pub public_key: PublicKey,
    pub endpoint: Option<SocketAddr>,
    pub pod_cidr: String,
    pub keepalive: Option<u16>,
}

/// A gateway's identity and configuration file.
pub struct GatewayFiles {
    pub key: PrivateKey,
    pub dir: tempfile::TempDir,
    pub path: PathBuf,
}

impl GatewayFiles {
    pub fn new(key: PrivateKey) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("gateway.yaml");
        Self { key, dir, path }
    }

    /// Writes the config for `cluster` with `peers`.
    pub fn write(&self, cluster: &Cluster, peers: &[PeerEntry]) {
        let mut y = format!(
            "privateKey: {}\nlisten: 0.0.0.0:{PORT}\nmetricsAddress: {METRICS}\nreconcileIntervalSeconds: 1\n\
             local:\n  podCidrs: [{}]\n  reservedCidrs: [10.254.0.0/30]\npodInterfaces: [{}]\npeers:\n",
            self.key.to_base64(),
            cluster.pod_cidr(),
            cluster.pod_facing_interface(),
        );
        for p in peers {
            y.push_str(&format!(
                "  - id: {}\n    publicKey: {}\n    podCidr: {}\n",
                p.id, p.public_key, p.pod_cidr
            ));
            if let Some(e) = p.endpoint {
                y.push_str(&format!("    endpoint: {e}\n"));
            }
            if let Some(k) = p.keepalive {
                y.push_str(&format!("    persistentKeepalive: {k}\n"));
            }
        }
        std::fs::write(&self.path, y).expect("write config");
    }
}

/// Starts `tetherd gateway` in the cluster's gateway namespace.
pub fn start_gateway(cluster: &Cluster, files: &GatewayFiles) -> ProcessGuard {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tetherd"));
    cmd.args(["gateway", "--config"])
        .arg(&files.path)
        .env(
            "TETHER_LOG",
            std::env::var("TETHER_TEST_GATEWAY_LOG").unwrap_or_else(|_| "info".to_owned()),
        )
        .stdin(Stdio::null());
    cluster
        .gateway()
        .spawn(cmd)
        .expect("spawn gateway")
        .with_stop_timeout(Duration::from_secs(10))
}

/// The local view under which `config`'s gateway sees peer `id`'s pods (what its IPAM chose).
pub fn local_view(files: &GatewayFiles, id: &str) -> ipnet::Ipv4Net {
    let config = tether_gateway::Config::load(&files.path).expect("config");
    let input = tether_gateway::remap::gateway_input(&config).expect("plannable");
    input
        .peers
        .iter()
        .find(|p| p.id == id)
        .expect("peer")
        .pod
        .local_view
}

/// The same host part in another network (a pod address as seen through a remap).
pub fn translate(addr: Ipv4Addr, to: ipnet::Ipv4Net) -> Ipv4Addr {
    let host = u32::from(addr) & !u32::from(to.netmask());
    Ipv4Addr::from(u32::from(to.network()) | host)
}

/// GET `path` from the gateway's admin server; `None` while it is not up.
pub fn http_get(ns: &Netns, path: &str) -> Option<(u16, String)> {
    let addr: SocketAddr = METRICS.parse().expect("addr");
    ns.run(|| -> std::io::Result<(u16, String)> {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(500))?;
        s.set_read_timeout(Some(Duration::from_secs(2)))?;
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n"
        )?;
        let mut body = String::new();
        s.read_to_string(&mut body)?;
        let status = body.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
        Ok((status, body))
    })
    .ok()
}

/// A metric value from the exposition text: the first line starting with `series`.
pub fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// A UDP echo server in `ns` that answers each datagram with the sender address it saw.
pub struct UdpEcho {
    pub addr: SocketAddr,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl UdpEcho {
    pub fn start(ns: &Netns, ip: Ipv4Addr) -> Self {
        let sock = ns
            .run(|| UdpSocket::bind(SocketAddr::new(IpAddr::V4(ip), 0)))
            .expect("bind udp echo");
        sock.set_read_timeout(Some(Duration::from_millis(100)))
            .expect("timeout");
        let addr = sock.local_addr().expect("addr");
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s2 = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut buf = [0u8; 2048];
            while !s2.load(std::sync::atomic::Ordering::Relaxed) {
                if let Ok((_, from)) = sock.recv_from(&mut buf) {
                    let _ = sock.send_to(from.to_string().as_bytes(), from);
                }
            }
        });
        Self {
            addr,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for UdpEcho {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One UDP exchange from `ns` to `to`; returns the address the server saw.
pub fn udp_probe(ns: &Netns, to: SocketAddr, timeout: Duration) -> Option<SocketAddr> {
    ns.run(|| -> std::io::Result<SocketAddr> {
        let s = UdpSocket::bind("0.0.0.0:0")?;
        s.set_read_timeout(Some(timeout))?;
        s.send_to(b"probe", to)?;
        let mut buf = [0u8; 128];
        let (n, _) = s.recv_from(&mut buf)?;
        String::from_utf8_lossy(&buf[..n])
            .parse()
            .map_err(|_| std::io::Error::other("bad reply"))
    })
    .ok()
}

/// Probes every `interval` until a UDP exchange succeeds; returns how long it took.
pub fn wait_udp(ns: &Netns, to: SocketAddr, limit: Duration) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if udp_probe(ns, to, Duration::from_millis(50)).is_some() {
            return Some(start.elapsed());
        }
    }
    None
}

/// Our policy rules, routes and nft table in a gateway namespace, as sorted text lines.
pub fn owned_kernel_state(ns: &Netns) -> Vec<String> {
    let mut lines = Vec::new();
    for l in ns.ip(&["rule", "show"]).expect("ip rule").lines() {
        if l.starts_with("7700:") {
            lines.push(format!("rule {l}"));
        }
    }
    for l in ns
        .ip(&["route", "show", "table", "all"])
        .expect("ip route")
        .lines()
    {
        if l.contains("proto 116") {
            lines.push(format!("route {l}"));
        }
    }
    if let Ok(out) = ns.exec(&["nft", "list", "table", "ip", "tether"])
        && out.status.success()
    {
        lines.push("nft table ip tether".into());
    }
    lines.sort();
    lines
}
