//! The packet loops: one encrypt thread per peer (its TUN → UDP), one decrypt thread (UDP →
//! the peers' TUNs) and one timer thread, which also sends the round-trip probes (`probe`);
//! the decrypt thread answers the peer's probes itself instead of writing them to a TUN. Blocking IO on dedicated threads keeps a big decrypt
//! batch from delaying the ACKs going the other way, and batching on both sides (TUN offload
//! with virtio-net headers and GRO, UDP GSO and GRO + recvmmsg) is where the throughput comes
//! from. Buffers are allocated once per thread; the per-packet path does not allocate.

use std::io::{self, IoSliceMut};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::probe::{self, Probes};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use quinn_udp::{RecvMeta, Transmit, UdpSocketState};
use tether_wg::{Decapsulated, Device, Encapsulated, MIN_OUT_BUF, MessageKind, PeerIndex};
use tun_rs::{GROTable, IDEAL_BATCH_SIZE, InterruptEvent, SyncDevice, VIRTIO_NET_HDR_LEN};

/// How often boringtun's timers run (handshake retries, keepalives, rekeys).
pub const TICK: Duration = Duration::from_millis(100);
/// Datagrams per `recvmmsg` call; each may carry up to 64 GRO segments.
const RX_MESSAGES: usize = 8;
/// Largest UDP payload a GRO receive can deliver in one buffer.
const RX_BUF: usize = 65535;
/// Ceiling on segments per GSO send (the kernel's UDP_MAX_SEGMENTS is 64 on older kernels).
const MAX_GSO_SEGMENTS: usize = 64;
/// Largest UDP payload of one GSO send: the whole train must fit one IPv4 datagram's length
/// field (65535 - 20 - 8), or the kernel rejects the send.
const MAX_GSO_BYTES: usize = 65507;
/// Socket buffer sizes: big enough to absorb a 64-segment burst from every peer.
const SOCKET_BUFFER: usize = 8 << 20;
/// How long the receive loop waits for a datagram before checking for shutdown.
const RX_POLL: Duration = Duration::from_millis(200);
/// How long one wait for send-buffer room lasts, and how many waits a send gets.
const SEND_WAIT: Duration = Duration::from_millis(100);
const SEND_RETRIES: usize = 50;
/// Largest GRO-coalesced write to a TUN.
const TUN_WRITE_MAX: usize = 65535;

/// Counters of the IO loops themselves (per-peer counters live in the WireGuard device).
#[derive(Debug, Default)]
pub struct IoCounters {
    /// UDP sends that failed.
    pub udp_send_errors: AtomicU64,
    /// UDP receives that failed (other than timeouts).
    pub udp_recv_errors: AtomicU64,
    /// TUN reads that failed.
    pub tun_read_errors: AtomicU64,
    /// TUN writes that failed.
    pub tun_write_errors: AtomicU64,
    /// GSO sends (one syscall, many datagrams).
    pub gso_sends: AtomicU64,
    /// Datagrams handed to the kernel in GSO sends.
    pub gso_segments: AtomicU64,
    /// TUN reads (each may carry a TSO super-frame).
    pub tun_reads: AtomicU64,
    /// Packets those reads were split into.
    pub tun_read_packets: AtomicU64,
    /// Packets handed to TUN writes (before GRO coalescing).
    pub tun_write_packets: AtomicU64,
    /// UDP receive calls that returned data.
    pub udp_recv_calls: AtomicU64,
    /// Datagrams those calls returned.
    pub udp_recv_datagrams: AtomicU64,
}

/// The UDP socket with quinn-udp's state (GSO/GRO, DF set: never fragmented locally).
pub struct Socket {
    socket: UdpSocket,
    state: UdpSocketState,
}

impl Socket {
    /// Binds `addr` and enables GSO, GRO and large buffers.
    pub fn bind(addr: SocketAddr) -> io::Result<Self> {
        let socket = UdpSocket::bind(addr)?;
        // quinn-udp makes the socket non-blocking, and it must stay so: a blocking recvmmsg
        // waits until *every* slot is filled (or the timeout), which adds the whole timeout
        // to each handshake message. The loops poll for readiness instead.
        let state = UdpSocketState::new((&socket).into())?;
        // Bursts of 45-datagram GSO trains overflow the default 208 KB buffers. With
        // CAP_NET_ADMIN the *FORCE options pass the sysctl caps; otherwise take what the caps
        // allow.
        use nix::sys::socket::{setsockopt, sockopt};
        if setsockopt(&socket, sockopt::RcvBufForce, &SOCKET_BUFFER).is_err() {
            let _ = state.set_recv_buffer_size((&socket).into(), SOCKET_BUFFER);
        }
        if setsockopt(&socket, sockopt::SndBufForce, &SOCKET_BUFFER).is_err() {
            let _ = state.set_send_buffer_size((&socket).into(), SOCKET_BUFFER);
        }
        Ok(Self { socket, state })
    }

    /// The bound address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.socket.local_addr()
    }

    fn send(&self, to: SocketAddr, contents: &[u8], segment_size: Option<usize>) -> io::Result<()> {
        let t = Transmit {
            destination: to,
            ecn: None,
            contents,
            segment_size,
            src_ip: None,
        };
        // A full send buffer is back-pressure, not loss: wait for room (bounded, so a wedged
        // socket cannot stall shutdown forever).
        for _ in 0..SEND_RETRIES {
            match self.state.try_send((&self.socket).into(), &t) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.wait(PollFlags::POLLOUT, SEND_WAIT)?;
                }
                other => return other,
            }
        }
        Err(io::Error::from(io::ErrorKind::WouldBlock))
    }

    /// Waits until the socket is ready for `flags` or `timeout` passes; `Ok(false)` on timeout.
    fn wait(&self, flags: PollFlags, timeout: Duration) -> io::Result<bool> {
        let mut fds = [PollFd::new(self.socket.as_fd(), flags)];
        let ms = u16::try_from(timeout.as_millis()).unwrap_or(u16::MAX);
        match poll(&mut fds, PollTimeout::from(ms)) {
            Ok(n) => Ok(n > 0),
            Err(nix::errno::Errno::EINTR) => Ok(false),
            Err(e) => Err(io::Error::from(e)),
        }
    }

    fn max_gso_segments(&self) -> usize {
        self.state.max_gso_segments().clamp(1, MAX_GSO_SEGMENTS)
    }
}

/// Running packet loops; [`Dataplane::stop`] joins them.
pub struct Dataplane {
    stop: Arc<AtomicBool>,
    interrupt: Arc<InterruptEvent>,
    threads: Vec<JoinHandle<()>>,
    /// Loop counters.
    pub counters: Arc<IoCounters>,
    alive: Arc<AtomicU64>,
}

/// The shared pieces every loop needs.
struct Shared {
    device: Arc<Device>,
    socket: Arc<Socket>,
    tuns: Vec<Arc<SyncDevice>>,
    stop: Arc<AtomicBool>,
    interrupt: Arc<InterruptEvent>,
    counters: Arc<IoCounters>,
    probes: Arc<Probes>,
    mtu: usize,
}

impl Dataplane {
    /// Starts the loops. `tuns[i]` is the TUN device of peer `i` (opened with offload); probe
    /// results go into `probes`.
    pub fn start(
        device: Arc<Device>,
        socket: Arc<Socket>,
        tuns: Vec<Arc<SyncDevice>>,
        probes: Arc<Probes>,
        mtu: usize,
    ) -> io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let interrupt = Arc::new(InterruptEvent::new()?);
        let counters = Arc::new(IoCounters::default());
        let alive = Arc::new(AtomicU64::new(0));
        let shared = Arc::new(Shared {
            device,
            socket,
            tuns,
            stop: stop.clone(),
            interrupt: interrupt.clone(),
            counters: counters.clone(),
            probes,
            mtu,
        });
        let mut threads = Vec::new();
        let spawn = |name: String, f: Box<dyn FnOnce() + Send>| {
            let alive = alive.clone();
            alive.fetch_add(1, Relaxed);
            std::thread::Builder::new().name(name).spawn(move || {
                struct Exit(Arc<AtomicU64>);
                impl Drop for Exit {
                    fn drop(&mut self) {
                        self.0.fetch_sub(1, Relaxed);
                    }
                }
                let _exit = Exit(alive);
                f();
            })
        };
        // Say hello first so a restarted gateway is back without waiting for traffic.
        {
            let mut out = vec![0u8; MIN_OUT_BUF];
            shared
                .device
                .initiate_all(&mut out, Instant::now(), |to, b| {
                    send_one(&shared, to, b);
                });
        }
        for peer in shared.device.peers() {
            let s = shared.clone();
            threads.push(spawn(
                format!("tx-{}", peer.0),
                Box::new(move || encrypt_loop(&s, peer)),
            )?);
        }
        let s = shared.clone();
        threads.push(spawn("rx".into(), Box::new(move || decrypt_loop(&s)))?);
        let s = shared;
        threads.push(spawn("timers".into(), Box::new(move || timer_loop(&s)))?);
        Ok(Self {
            stop,
            interrupt,
            threads,
            counters,
            alive,
        })
    }

    /// Whether every loop is still running (a dead loop makes the gateway unhealthy).
    pub fn healthy(&self) -> bool {
        self.alive.load(Relaxed) == self.threads.len() as u64
    }

    /// Stops the loops and waits for them.
    pub fn stop(self) {
        self.stop.store(true, Relaxed);
        if let Err(e) = self.interrupt.trigger() {
            tracing::warn!(error = %e, "cannot interrupt TUN readers; they exit on the next packet");
        }
        for t in self.threads {
            let _ = t.join();
        }
    }
}

fn send_one(s: &Shared, to: SocketAddr, bytes: &[u8]) {
    if let Err(e) = s.socket.send(to, bytes, None) {
        s.counters.udp_send_errors.fetch_add(1, Relaxed);
        tracing::debug!(error = %e, %to, "udp send failed");
    }
}

/// A run of equal-size ciphertexts in the send buffer, sent with one GSO call.
struct Gso {
    start: usize,
    end: usize,
    segment: usize,
    count: usize,
    to: Option<SocketAddr>,
    closed: bool,
}

impl Gso {
    fn empty_at(pos: usize) -> Self {
        Self {
            start: pos,
            end: pos,
            segment: 0,
            count: 0,
            to: None,
            closed: false,
        }
    }

    fn accepts(&self, to: SocketAddr, len: usize, max: usize) -> bool {
        self.count == 0
            || (self.to == Some(to)
                && !self.closed
                && self.count < max
                && len <= self.segment
                && self.end - self.start + len <= MAX_GSO_BYTES)
    }

    fn push(&mut self, to: SocketAddr, len: usize) {
        if self.count == 0 {
            self.segment = len;
            self.to = Some(to);
        } else if len < self.segment {
            // A shorter datagram can only be the last of a GSO train.
            self.closed = true;
        }
        self.end += len;
        self.count += 1;
    }

    fn flush(&mut self, s: &Shared, buf: &[u8]) {
        if let Some(to) = self.to
            && self.count > 0
        {
            let seg = (self.count > 1).then_some(self.segment);
            if self.count > 1 {
                s.counters.gso_sends.fetch_add(1, Relaxed);
                s.counters
                    .gso_segments
                    .fetch_add(self.count as u64, Relaxed);
            }
            if let Err(e) = s.socket.send(to, &buf[self.start..self.end], seg) {
                s.counters.udp_send_errors.fetch_add(1, Relaxed);
                tracing::debug!(error = %e, %to, "udp send failed");
            }
        }
        *self = Self::empty_at(self.end);
    }
}

fn encrypt_loop(s: &Shared, peer: PeerIndex) {
    let tun = &s.tuns[peer.0];
    let mut max_segments = s.socket.max_gso_segments();
    let slot = s.mtu + tether_wg::DATA_OVERHEAD;
    let mut original = vec![0u8; VIRTIO_NET_HDR_LEN + 65535];
    let mut bufs: Vec<Vec<u8>> = (0..IDEAL_BATCH_SIZE)
        .map(|_| vec![0u8; s.mtu + 128])
        .collect();
    let mut sizes = vec![0usize; IDEAL_BATCH_SIZE];
    let mut out = vec![0u8; max_segments.max(2) * slot + MIN_OUT_BUF];
    loop {
        if s.stop.load(Relaxed) {
            return;
        }
        let n = match tun.recv_multiple_intr(&mut original, &mut bufs, &mut sizes, 0, &s.interrupt)
        {
            Ok(n) => n,
            Err(_) if s.stop.load(Relaxed) => return,
            Err(e) => {
                s.counters.tun_read_errors.fetch_add(1, Relaxed);
                tracing::debug!(error = %e, "tun read failed");
                continue;
            }
        };
        s.counters.tun_reads.fetch_add(1, Relaxed);
        s.counters.tun_read_packets.fetch_add(n as u64, Relaxed);
        let now = Instant::now();
        // Re-read: quinn-udp turns GSO off for good if the kernel rejects it.
        max_segments = max_segments.min(s.socket.max_gso_segments());
        let mut gso = Gso::empty_at(0);
        for (buf, &size) in bufs.iter().zip(&sizes).take(n) {
            let packet = &buf[..size];
            let need = (size + tether_wg::DATA_OVERHEAD).max(MIN_OUT_BUF);
            if out.len() - gso.end < need {
                gso.flush(s, &out);
                gso = Gso::empty_at(0);
            }
            let pos = gso.end;
            match s.device.encapsulate(peer, packet, &mut out[pos..], now) {
                Encapsulated::Send { to, len, kind } => {
                    if kind != MessageKind::Data {
                        // A handshake initiation (the packet waits in the queue): send it
                        // alone, after whatever data precedes it.
                        gso.flush(s, &out);
                        send_one(s, to, &out[pos..pos + len]);
                        gso = Gso::empty_at(0);
                        continue;
                    }
                    if !gso.accepts(to, len, max_segments) {
                        // Send what came before; this datagram starts the next train where it
                        // already lies.
                        gso.flush(s, &out);
                    }
                    gso.push(to, len);
                }
                Encapsulated::Queued | Encapsulated::Dropped(_) => {}
            }
        }
        gso.flush(s, &out);
    }
}

/// Decrypted packets waiting to be written to one peer's TUN, coalesced by GRO on write.
struct TunBatch {
    bufs: Vec<Vec<u8>>,
    count: usize,
    gro: GROTable,
}

fn decrypt_loop(s: &Shared) {
    let n_peers = s.tuns.len();
    let cap = VIRTIO_NET_HDR_LEN + (s.mtu + tether_wg::DATA_OVERHEAD).max(MIN_OUT_BUF);
    let mut batches: Vec<TunBatch> = (0..n_peers)
        .map(|_| TunBatch {
            // GRO coalesces a flow into its first buffer only if that buffer can already
            // hold a full 64 KB super-packet (it never reallocates), so reserve that much.
            // Untouched capacity costs address space, not memory.
            bufs: (0..IDEAL_BATCH_SIZE)
                .map(|_| {
                    let mut b = Vec::with_capacity(TUN_WRITE_MAX + 2 * VIRTIO_NET_HDR_LEN);
                    b.resize(cap, 0);
                    b
                })
                .collect(),
            count: 0,
            gro: GROTable::default(),
        })
        .collect();
    let mut rx: Vec<Vec<u8>> = (0..RX_MESSAGES).map(|_| vec![0u8; RX_BUF]).collect();
    let mut metas = [RecvMeta::default(); RX_MESSAGES];
    let mut scratch = vec![0u8; RX_BUF];
    loop {
        if s.stop.load(Relaxed) {
            return;
        }
        match s.socket.wait(PollFlags::POLLIN, RX_POLL) {
            Ok(true) => {}
            Ok(false) => continue,
            Err(e) => {
                s.counters.udp_recv_errors.fetch_add(1, Relaxed);
                tracing::debug!(error = %e, "poll failed");
                continue;
            }
        }
        let n = {
            let mut iovs: Vec<IoSliceMut<'_>> = rx.iter_mut().map(|b| IoSliceMut::new(b)).collect();
            match s
                .socket
                .state
                .recv((&s.socket.socket).into(), &mut iovs, &mut metas)
            {
                Ok(n) => n,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock
                            | io::ErrorKind::TimedOut
                            | io::ErrorKind::Interrupted
                    ) =>
                {
                    continue;
                }
                Err(e) => {
                    s.counters.udp_recv_errors.fetch_add(1, Relaxed);
                    tracing::debug!(error = %e, "udp receive failed");
                    continue;
                }
            }
        };
        let now = Instant::now();
        s.counters.udp_recv_calls.fetch_add(1, Relaxed);
        for (meta, buf) in metas.iter().zip(&rx).take(n) {
            let stride = if meta.stride == 0 {
                meta.len
            } else {
                meta.stride
            };
            s.counters
                .udp_recv_datagrams
                .fetch_add(meta.len.div_ceil(stride.max(1)) as u64, Relaxed);
            for datagram in buf[..meta.len].chunks(stride) {
                handle_datagram(s, &mut batches, &mut scratch, meta.addr, datagram, now);
            }
        }
        for (i, b) in batches.iter_mut().enumerate() {
            write_batch(s, PeerIndex(i), b, cap);
        }
    }
}

fn handle_datagram(
    s: &Shared,
    batches: &mut [TunBatch],
    scratch: &mut [u8],
    from: SocketAddr,
    datagram: &[u8],
    now: Instant,
) {
    // Data packets go straight into their peer's TUN batch; the receiver index says whose.
    if let Some(peer) = s.device.data_message_peer(datagram) {
        let cap = VIRTIO_NET_HDR_LEN + (s.mtu + tether_wg::DATA_OVERHEAD).max(MIN_OUT_BUF);
        if batches[peer.0].count == IDEAL_BATCH_SIZE {
            write_batch(s, peer, &mut batches[peer.0], cap);
        }
        let b = &mut batches[peer.0];
        let buf = &mut b.bufs[b.count];
        let need = VIRTIO_NET_HDR_LEN + datagram.len().max(MIN_OUT_BUF);
        if buf.len() < need {
            buf.resize(need, 0);
        }
        match s
            .device
            .decapsulate(from, datagram, &mut buf[VIRTIO_NET_HDR_LEN..], now)
        {
            Decapsulated::ToTunnel { peer: p, len } if p == peer => {
                let inner = &buf[VIRTIO_NET_HDR_LEN..VIRTIO_NET_HDR_LEN + len];
                if let Some(kind) = probe::classify(inner) {
                    on_probe(s, peer, kind, scratch, now);
                    return;
                }
                buf.truncate(VIRTIO_NET_HDR_LEN + len);
                b.count += 1;
            }
            Decapsulated::ToNetwork { peer: p, to, len } => {
                send_one(s, to, &buf[VIRTIO_NET_HDR_LEN..VIRTIO_NET_HDR_LEN + len]);
                if let Some(p) = p {
                    while let Some((to, len)) = s.device.flush(p, scratch, now) {
                        send_one(s, to, &scratch[..len]);
                    }
                }
            }
            _ => {}
        }
        return;
    }
    match s.device.decapsulate(from, datagram, scratch, now) {
        Decapsulated::ToNetwork { peer, to, len } => {
            send_one(s, to, &scratch[..len]);
            if let Some(p) = peer {
                while let Some((to, len)) = s.device.flush(p, scratch, now) {
                    send_one(s, to, &scratch[..len]);
                }
            }
        }
        Decapsulated::ToTunnel { peer, len } => {
            if let Some(kind) = probe::classify(&scratch[..len]) {
                let mut out = vec![0u8; MIN_OUT_BUF];
                on_probe(s, peer, kind, &mut out, now);
                return;
            }
            // Rare (a data packet whose index we could not pre-resolve): copy it over.
            let b = &mut batches[peer.0];
            if b.count < IDEAL_BATCH_SIZE {
                let buf = &mut b.bufs[b.count];
                buf.clear();
                buf.resize(VIRTIO_NET_HDR_LEN, 0);
                buf.extend_from_slice(&scratch[..len]);
                b.count += 1;
            }
        }
        Decapsulated::Consumed(_) | Decapsulated::Dropped(..) | Decapsulated::Rejected => {}
    }
}

fn write_batch(s: &Shared, peer: PeerIndex, b: &mut TunBatch, cap: usize) {
    if b.count == 0 {
        return;
    }
    let tun = &s.tuns[peer.0];
    s.counters
        .tun_write_packets
        .fetch_add(b.count as u64, Relaxed);
    if let Err(e) = tun.send_multiple(&mut b.gro, &mut b.bufs[..b.count], VIRTIO_NET_HDR_LEN) {
        s.counters.tun_write_errors.fetch_add(1, Relaxed);
        tracing::debug!(error = %e, "tun write failed");
    }
    for buf in &mut b.bufs[..b.count] {
        // Restore the working length for the next decrypt (a coalesced buffer shrinks back;
        // its capacity stays).
        buf.resize(cap, 0);
    }
    b.count = 0;
}

/// Answers a peer's probe request, or records the answer to ours.
fn on_probe(s: &Shared, peer: PeerIndex, kind: probe::Kind, out: &mut [u8], now: Instant) {
    match kind {
        probe::Kind::Request(sent) => send_inner(s, peer, &probe::reply(sent), out, now),
        probe::Kind::Reply(sent) => s.probes.answered(peer.0, sent, now),
    }
}

/// Encrypts one packet the gateway itself originates (probes) and sends it.
fn send_inner(s: &Shared, peer: PeerIndex, packet: &[u8], out: &mut [u8], now: Instant) {
    if let Encapsulated::Send { to, len, .. } = s.device.encapsulate(peer, packet, out, now) {
        send_one(s, to, &out[..len]);
    }
}

fn timer_loop(s: &Shared) {
    let mut out = vec![0u8; 2048];
    let mut next_probe = Instant::now();
    while !s.stop.load(Relaxed) {
        std::thread::sleep(TICK);
        let now = Instant::now();
        s.device.tick(&mut out, now, |to, b| send_one(s, to, b));
        if now >= next_probe {
            next_probe = now + probe::INTERVAL;
            for peer in s.device.peers() {
                // Without a session this queues the probe and starts a handshake, which is
                // what a gateway wants anyway.
                let request = probe::request(s.probes.stamp(peer.0, now));
                send_inner(s, peer, &request, &mut out, now);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([198, 18, 0, 2], port))
    }

    #[test]
    fn gso_trains_follow_the_kernel_rules() {
        let mut g = Gso::empty_at(0);
        assert!(g.accepts(addr(1), 1452, 64));
        g.push(addr(1), 1452);
        assert!(g.accepts(addr(1), 1452, 64), "equal sizes join");
        assert!(
            !g.accepts(addr(2), 1452, 64),
            "another destination starts a new train"
        );
        assert!(
            !g.accepts(addr(1), 1500, 64),
            "a bigger datagram cannot follow"
        );
        g.push(addr(1), 100);
        assert!(
            !g.accepts(addr(1), 100, 64),
            "a shorter datagram ends the train"
        );
        assert_eq!((g.start, g.end, g.count, g.segment), (0, 1552, 2, 1452));
    }

    #[test]
    fn gso_trains_stay_below_64_kib_and_the_segment_limit() {
        let mut g = Gso::empty_at(0);
        let mut n = 0;
        while g.accepts(addr(1), 1452, 64) {
            g.push(addr(1), 1452);
            n += 1;
        }
        assert_eq!(
            n,
            MAX_GSO_BYTES / 1452,
            "a 1420-MTU train holds 45 datagrams, not 64"
        );
        assert!(g.end - g.start <= MAX_GSO_BYTES);
        let mut g = Gso::empty_at(0);
        for _ in 0..4 {
            g.push(addr(1), 100);
        }
        assert!(
            !g.accepts(addr(1), 100, 4),
            "the socket's segment limit is honoured"
        );
    }
}
