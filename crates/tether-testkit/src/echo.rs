//! TCP and UDP echo servers and clients that run inside namespaces and report the addresses
//! each side saw, which is how a test proves that a remap (NAT) happened on the path.
//!
//! Protocol: the client sends its payload and shuts down its write half; the server answers with
//! the client address it saw on one line, then the payload, and closes. Payloads of any size work,
//! so a large payload exercises MTU handling.

use std::io::ErrorKind;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::netns::Netns;

/// How long the server waits on one connection before giving up on it.
const SERVER_IO_TIMEOUT: Duration = Duration::from_secs(10);

/// A TCP echo server running on a thread inside a namespace; stopped on drop.
#[derive(Debug)]
pub struct TcpEchoServer {
    local: SocketAddr,
    stop: Arc<AtomicBool>,
    peers: Arc<Mutex<Vec<SocketAddr>>>,
    thread: Option<JoinHandle<()>>,
}

impl TcpEchoServer {
    /// Binds `bind` inside `ns` (port 0 picks a free port) and starts serving.
    pub fn start(ns: &Netns, bind: SocketAddr) -> Result<Self> {
        let listener = ns
            .run(|| TcpListener::bind(bind).and_then(|l| l.set_nonblocking(true).map(|()| l)))
            .map_err(|e| {
                Error::io(
                    format!("bind TCP echo server on {bind} in {}", ns.name()),
                    e,
                )
            })?;
        let local = listener
            .local_addr()
            .map_err(|e| Error::io("echo server address", e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let peers = Arc::new(Mutex::new(Vec::new()));
        let thread = {
            let (stop, peers) = (Arc::clone(&stop), Arc::clone(&peers));
            ns.spawn_thread(move || serve(&listener, &stop, &peers))?
        };
        Ok(Self {
            local,
            stop,
            peers,
            thread: Some(thread),
        })
    }

    /// The bound address (with the real port when port 0 was requested).
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Client addresses seen so far, in order.
    pub fn peers(&self) -> Vec<SocketAddr> {
        self.peers.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Drop for TcpEchoServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn serve(listener: &TcpListener, stop: &AtomicBool, peers: &Mutex<Vec<SocketAddr>>) {
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((stream, peer)) => {
                peers.lock().unwrap_or_else(|p| p.into_inner()).push(peer);
                // One thread per connection so a stalled client (an MTU black hole) does not
                // block the others; threads inherit the namespace of this thread.
                std::thread::spawn(move || {
                    if let Err(error) = answer(stream, peer) {
                        tracing::debug!(%peer, %error, "echo connection failed");
                    }
                });
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(error) => {
                tracing::warn!(%error, "echo server accept failed");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

fn answer(mut stream: TcpStream, peer: SocketAddr) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(SERVER_IO_TIMEOUT))?;
    stream.set_write_timeout(Some(SERVER_IO_TIMEOUT))?;
    let mut payload = Vec::new();
    stream.read_to_end(&mut payload)?;
    stream.write_all(format!("{peer}\n").as_bytes())?;
    stream.write_all(&payload)?;
    stream.shutdown(Shutdown::Write)
}

/// What one echo exchange showed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EchoReply {
    /// The client's address as the server saw it (after any NAT on the path).
    pub seen_as: SocketAddr,
    /// The client's own local address.
    pub local: SocketAddr,
    /// The address the client connected to.
    pub remote: SocketAddr,
    /// The payload as echoed back.
    pub payload: Vec<u8>,
}

/// Connects from inside `ns` to an echo server at `server`, sends `payload` and reads the answer,
/// all within `timeout`.
pub fn tcp_echo(
    ns: &Netns,
    server: SocketAddr,
    payload: &[u8],
    timeout: Duration,
) -> Result<EchoReply> {
    ns.run(|| exchange(server, payload, timeout))
        .map_err(|e| Error::io(format!("TCP echo to {server} from {}", ns.name()), e))
}

fn exchange(server: SocketAddr, payload: &[u8], timeout: Duration) -> std::io::Result<EchoReply> {
    let mut stream = TcpStream::connect_timeout(&server, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let local = stream.local_addr()?;
    stream.write_all(payload)?;
    stream.shutdown(Shutdown::Write)?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer)?;
    let (seen_as, payload) = split_answer(&answer)?;
    Ok(EchoReply {
        seen_as,
        local,
        remote: server,
        payload,
    })
}

/// A UDP echo server on a thread inside a namespace: every datagram is answered with the
/// sender's address on one line followed by the payload. Stopped on drop.
#[derive(Debug)]
pub struct UdpEchoServer {
    local: SocketAddr,
    stop: Arc<AtomicBool>,
    peers: Arc<Mutex<Vec<SocketAddr>>>,
    thread: Option<JoinHandle<()>>,
}

impl UdpEchoServer {
    /// Binds `bind` inside `ns` (port 0 picks a free port) and starts answering.
    pub fn start(ns: &Netns, bind: SocketAddr) -> Result<Self> {
        let socket = ns
            .run(|| {
                let socket = UdpSocket::bind(bind)?;
                socket.set_read_timeout(Some(Duration::from_millis(20)))?;
                Ok::<_, std::io::Error>(socket)
            })
            .map_err(|e| {
                Error::io(
                    format!("bind UDP echo server on {bind} in {}", ns.name()),
                    e,
                )
            })?;
        let local = socket
            .local_addr()
            .map_err(|e| Error::io("echo server address", e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let peers = Arc::new(Mutex::new(Vec::new()));
        let thread = {
            let (stop, peers) = (Arc::clone(&stop), Arc::clone(&peers));
            ns.spawn_thread(move || serve_udp(&socket, &stop, &peers))?
        };
        Ok(Self {
            local,
            stop,
            peers,
            thread: Some(thread),
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Sender addresses seen so far, in order (one per datagram).
    pub fn peers(&self) -> Vec<SocketAddr> {
        self.peers.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Drop for UdpEchoServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn serve_udp(socket: &UdpSocket, stop: &AtomicBool, peers: &Mutex<Vec<SocketAddr>>) {
    let mut buffer = vec![0u8; 65536];
    while !stop.load(Ordering::Relaxed) {
        match socket.recv_from(&mut buffer) {
            Ok((len, peer)) => {
                peers.lock().unwrap_or_else(|p| p.into_inner()).push(peer);
                let mut answer = format!("{peer}\n").into_bytes();
                answer.extend_from_slice(&buffer[..len]);
                if let Err(error) = socket.send_to(&answer, peer) {
                    tracing::debug!(%peer, %error, "UDP echo reply failed");
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(error) => {
                tracing::debug!(%error, "UDP echo receive failed");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// Sends `payload` from inside `ns` to a UDP echo server, resending every 200 ms (datagrams may
/// be lost while a tunnel comes up) until an answer arrives or `timeout` passes.
pub fn udp_echo(
    ns: &Netns,
    server: SocketAddr,
    payload: &[u8],
    timeout: Duration,
) -> Result<EchoReply> {
    ns.run(|| udp_exchange(server, payload, timeout))
        .map_err(|e| Error::io(format!("UDP echo to {server} from {}", ns.name()), e))
}

fn udp_exchange(
    server: SocketAddr,
    payload: &[u8],
    timeout: Duration,
) -> std::io::Result<EchoReply> {
    let socket = UdpSocket::bind(("0.0.0.0", 0))?;
    socket.connect(server)?;
    socket.set_read_timeout(Some(Duration::from_millis(200)))?;
    let local = socket.local_addr()?;
    let deadline = std::time::Instant::now() + timeout;
    let mut buffer = vec![0u8; 65536];
    loop {
        socket.send(payload)?;
        match socket.recv(&mut buffer) {
            Ok(len) => {
                let (seen_as, payload) = split_answer(&buffer[..len])?;
                return Ok(EchoReply {
                    seen_as,
                    local,
                    remote: server,
                    payload,
                });
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            // ICMP unreachable while routes settle: keep trying until the deadline.
            Err(e) if e.kind() == ErrorKind::ConnectionRefused => {
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => return Err(e),
        }
        if std::time::Instant::now() >= deadline {
            return Err(std::io::Error::new(
                ErrorKind::TimedOut,
                "no UDP echo answer",
            ));
        }
    }
}

/// Splits an echo answer into the address line and the payload.
fn split_answer(answer: &[u8]) -> std::io::Result<(SocketAddr, Vec<u8>)> {
    let bad =
        |what: &str| std::io::Error::new(ErrorKind::InvalidData, format!("echo answer {what}"));
    let newline = answer
        .iter()
        .position(|&b| b == b'\n')
        .ok_or_else(|| bad("has no address line"))?;
    let seen_as = std::str::from_utf8(&answer[..newline])
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("has a bad address"))?;
    Ok((seen_as, answer[newline + 1..].to_vec()))
}
