//! Built-in workloads for simulated pods, run as `<node binary> __builtin <name> [options]`:
//! `echo` (TCP, UDP and HTTP servers that answer with the pod's name and the peer address they
//! saw; HTTP `/healthz` answers 503 while the file named by `--healthz-file` is missing, for
//! probe tests), `sleeper` (waits, optionally exits with a chosen code), `traffic` (a client
//! that talks to an echo server and prints every answer) and `apicheck` (an in-cluster kube-rs
//! client that reads its own pod, to prove the pod's service-account files work).

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs as _, UdpSocket};
use std::time::Duration;

/// Default TCP echo port.
pub const ECHO_TCP_PORT: u16 = 7000;
/// Default UDP echo port.
pub const ECHO_UDP_PORT: u16 = 7000;
/// Default HTTP echo port.
pub const ECHO_HTTP_PORT: u16 = 8080;

/// Runs the built-in named by `args[0]`; returns the process exit code.
pub fn run(args: &[String]) -> i32 {
    let Some((name, rest)) = args.split_first() else {
        eprintln!("usage: __builtin <echo|sleeper|traffic|apicheck> [options]");
        return 2;
    };
    let result = match name.as_str() {
        "echo" => echo(rest),
        "sleeper" => sleeper(rest),
        "traffic" => traffic(rest),
        "apicheck" => apicheck(rest),
        other => Err(format!(
            "unknown built-in {other:?} (echo, sleeper, traffic, apicheck)"
        )),
    };
    match result {
        Ok(code) => code,
        Err(message) => {
            eprintln!("{name}: {message}");
            2
        }
    }
}

/// `apicheck`: an unmodified kube-rs in-cluster client (service-account token, CA and
/// namespace files, `KUBERNETES_SERVICE_HOST`/`PORT`) reads its own pod and prints what it
/// got; exits 0 on success, 1 when the API refused or was unreachable.
fn apicheck(args: &[String]) -> Result<i32, String> {
    options(args, &[])?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start a runtime: {e}"))?;
    runtime.block_on(async {
        let config =
            kube::Config::incluster().map_err(|e| format!("no in-cluster configuration: {e}"))?;
        let url = config.cluster_url.clone();
        let namespace = config.default_namespace.clone();
        let client = kube::Client::try_from(config).map_err(|e| format!("client: {e}"))?;
        let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
            kube::Api::namespaced(client, &namespace);
        let name = std::env::var("HOSTNAME").unwrap_or_default();
        match pods.get(&name).await {
            Ok(pod) => {
                println!(
                    "apicheck ok: {url} pod {namespace}/{name} uid={} serviceAccount={}",
                    pod.metadata.uid.unwrap_or_default(),
                    pod.spec
                        .and_then(|s| s.service_account_name)
                        .unwrap_or_default()
                );
                Ok(0)
            }
            Err(e) => {
                println!("apicheck failed: {url} pod {namespace}/{name}: {e}");
                Ok(1)
            }
        }
    })
}

/// Parses `--key value` options; every key must be in `known`.
fn options(args: &[String], known: &[&str]) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    let mut it = args.iter();
    while let Some(key) = it.next() {
        let name = key
            .strip_prefix("--")
            .filter(|k| known.contains(k))
            .ok_or_else(|| format!("unknown option {key:?} (known: --{})", known.join(", --")))?;
        let value = it
            .next()
            .ok_or_else(|| format!("option {key} needs a value"))?;
        out.push((name.to_owned(), value.clone()));
    }
    Ok(out)
}

fn parse<T: std::str::FromStr>(key: &str, value: &str) -> Result<T, String> {
    value
        .parse()
        .map_err(|_| format!("--{key} {value:?} is not a valid value"))
}

fn pod_name() -> String {
    std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| "unknown".to_owned())
}

/// The answer line of every echo protocol.
pub fn answer(pod: &str, peer: SocketAddr, payload: &str) -> String {
    format!("pod={pod} peer={peer} {payload}")
}

/// The file whose presence makes the echo's `/healthz` answer 200 (`None`: always 200).
static HEALTHZ_FILE: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();

fn echo(args: &[String]) -> Result<i32, String> {
    let (mut tcp, mut udp, mut http) = (ECHO_TCP_PORT, ECHO_UDP_PORT, ECHO_HTTP_PORT);
    for (key, value) in options(args, &["tcp", "udp", "http", "healthz-file"])? {
        match key.as_str() {
            "tcp" => tcp = parse(&key, &value)?,
            "udp" => udp = parse(&key, &value)?,
            "healthz-file" => {
                let _ = HEALTHZ_FILE.set(value.into());
            }
            _ => http = parse(&key, &value)?,
        }
    }
    let pod = pod_name();
    let any = |port| SocketAddr::from(([0, 0, 0, 0], port));
    let tcp = TcpListener::bind(any(tcp)).map_err(|e| format!("bind TCP {tcp}: {e}"))?;
    let udp = UdpSocket::bind(any(udp)).map_err(|e| format!("bind UDP {udp}: {e}"))?;
    let http = TcpListener::bind(any(http)).map_err(|e| format!("bind HTTP {http}: {e}"))?;
    println!(
        "echo {pod} serving tcp {} udp {} http {}",
        tcp.local_addr().map_err(|e| e.to_string())?,
        udp.local_addr().map_err(|e| e.to_string())?,
        http.local_addr().map_err(|e| e.to_string())?
    );
    let _ = std::io::stdout().flush();
    {
        let pod = pod.clone();
        std::thread::spawn(move || serve_udp(&pod, &udp));
    }
    {
        let pod = pod.clone();
        std::thread::spawn(move || accept(&http, &pod, serve_http));
    }
    accept(&tcp, &pod, serve_tcp);
    Ok(1)
}

fn accept(listener: &TcpListener, pod: &str, serve: fn(&str, TcpStream, SocketAddr)) {
    for stream in listener.incoming().flatten() {
        let Ok(peer) = stream.peer_addr() else {
            continue;
        };
        let pod = pod.to_owned();
        std::thread::spawn(move || serve(&pod, stream, peer));
    }
}

fn serve_tcp(pod: &str, stream: TcpStream, peer: SocketAddr) {
    println!("tcp connection from {peer}");
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    for line in BufReader::new(stream).lines() {
        let Ok(line) = line else { return };
        if writeln!(writer, "{}", answer(pod, peer, &line)).is_err() {
            return;
        }
    }
}

fn serve_udp(pod: &str, socket: &UdpSocket) {
    let mut buf = vec![0u8; 65_536];
    while let Ok((n, peer)) = socket.recv_from(&mut buf) {
        let payload = String::from_utf8_lossy(&buf[..n]);
        let _ = socket.send_to(answer(pod, peer, payload.trim_end()).as_bytes(), peer);
    }
}

fn serve_http(pod: &str, stream: TcpStream, peer: SocketAddr) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    let mut request_line = String::new();
    if reader.read_line(&mut request_line).is_err() {
        return;
    }
    // Skip the headers; the answer does not depend on them.
    let mut header = String::new();
    while reader.read_line(&mut header).is_ok_and(|n| n > 0) && header.trim() != "" {
        header.clear();
    }
    let path = request_line.split_whitespace().nth(1).unwrap_or("/");
    let healthy = HEALTHZ_FILE.get().is_none_or(|file| file.exists());
    let (status, body) = if path == "/healthz" && !healthy {
        ("503 Service Unavailable", "unhealthy\n".to_owned())
    } else {
        (
            "200 OK",
            format!("{}\n", answer(pod, peer, &format!("path={path}"))),
        )
    };
    let _ = write!(
        writer,
        "HTTP/1.1 {status}\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
}

fn sleeper(args: &[String]) -> Result<i32, String> {
    let mut seconds: Option<f64> = None;
    let mut code = 0;
    for (key, value) in options(args, &["seconds", "exit-code"])? {
        match key.as_str() {
            "seconds" => seconds = Some(parse(&key, &value)?),
            _ => code = parse(&key, &value)?,
        }
    }
    println!(
        "sleeper {} sleeping {seconds:?} s, then exit {code}",
        pod_name()
    );
    let _ = std::io::stdout().flush();
    match seconds {
        Some(s) if s.is_finite() && s >= 0.0 => std::thread::sleep(Duration::from_secs_f64(s)),
        Some(_) => return Err("--seconds must be a non-negative number".to_owned()),
        None => loop {
            std::thread::park();
        },
    }
    Ok(code)
}

fn traffic(args: &[String]) -> Result<i32, String> {
    let mut target = None;
    let mut proto = "tcp".to_owned();
    let mut count: u64 = 0;
    let mut interval = Duration::from_secs(1);
    for (key, value) in options(args, &["target", "proto", "count", "interval-ms"])? {
        match key.as_str() {
            "target" => target = Some(value),
            "proto" => proto = value,
            "count" => count = parse(&key, &value)?,
            _ => interval = Duration::from_millis(parse(&key, &value)?),
        }
    }
    let target = target.ok_or("--target host:port is required")?;
    let addr = target
        .to_socket_addrs()
        .map_err(|e| format!("--target {target:?}: {e}"))?
        .next()
        .ok_or_else(|| format!("--target {target:?} resolves to nothing"))?;
    let pod = pod_name();
    let mut failures = 0u64;
    let mut sent = 0u64;
    while count == 0 || sent < count {
        sent += 1;
        let message = format!("from {pod} #{sent}");
        match exchange(&proto, addr, &message) {
            Ok(reply) => println!("{} {}", proto, reply.trim_end()),
            Err(e) => {
                failures += 1;
                println!("{proto} error {e}");
            }
        }
        let _ = std::io::stdout().flush();
        if count == 0 || sent < count {
            std::thread::sleep(interval);
        }
    }
    Ok(i32::from(failures > 0))
}

fn exchange(proto: &str, addr: SocketAddr, message: &str) -> Result<String, String> {
    let timeout = Duration::from_secs(3);
    let err = |e: std::io::Error| e.to_string();
    match proto {
        "tcp" => {
            let mut s = TcpStream::connect_timeout(&addr, timeout).map_err(err)?;
            s.set_read_timeout(Some(timeout)).map_err(err)?;
            writeln!(s, "{message}").map_err(err)?;
            let mut line = String::new();
            BufReader::new(s).read_line(&mut line).map_err(err)?;
            Ok(line)
        }
        "udp" => {
            let bind = if addr.is_ipv4() {
                "0.0.0.0:0"
            } else {
                "[::]:0"
            };
            let s = UdpSocket::bind(bind).map_err(err)?;
            s.set_read_timeout(Some(timeout)).map_err(err)?;
            s.send_to(message.as_bytes(), addr).map_err(err)?;
            let mut buf = vec![0u8; 65_536];
            let n = s.recv(&mut buf).map_err(err)?;
            Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
        }
        "http" => {
            let mut s = TcpStream::connect_timeout(&addr, timeout).map_err(err)?;
            s.set_read_timeout(Some(timeout)).map_err(err)?;
            write!(
                s,
                "GET / HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n"
            )
            .map_err(err)?;
            let mut response = String::new();
            s.read_to_string(&mut response).map_err(err)?;
            response
                .split_once("\r\n\r\n")
                .map(|(_, body)| body.to_owned())
                .ok_or_else(|| "malformed HTTP response".to_owned())
        }
        other => Err(format!("unknown --proto {other:?} (tcp, udp, http)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_checked() {
        let args = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert!(options(&args(&["--tcp", "1"]), &["tcp"]).is_ok());
        let err = options(&args(&["--tpc", "1"]), &["tcp"]).expect_err("typo");
        assert!(err.contains("unknown option \"--tpc\""), "{err}");
        assert!(options(&args(&["--tcp"]), &["tcp"]).is_err());
        assert_eq!(run(&args(&["nope"])), 2);
    }

    #[test]
    fn echo_answers_name_the_pod_and_the_peer() {
        let peer: SocketAddr = "10.244.1.1:5555".parse().expect("addr");
        assert_eq!(
            answer("web-1", peer, "hi"),
            "pod=web-1 peer=10.244.1.1:5555 hi"
        );
    }
}
