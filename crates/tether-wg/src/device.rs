//! The peer table: one boringtun `Tunn` per peer behind its own lock, lookups by receiver
//! index, public key and endpoint, and the rules boringtun leaves to its caller (allowed IPs,
//! roaming, reactive handshakes, failure accounting).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use boringtun::noise::errors::WireGuardError;
use boringtun::noise::handshake::parse_handshake_anon;
use boringtun::noise::rate_limiter::RateLimiter;
use boringtun::noise::{Packet, Tunn, TunnResult};

use crate::{AllowedIps, DATA_OVERHEAD, DeviceCounters, DropReason, MIN_OUT_BUF, PeerCounters};
use crate::{PeerStats, PrivateKey, PublicKey};

/// Handshake initiations per second the device answers before demanding cookies.
const HANDSHAKE_RATE_LIMIT: u64 = 100;

/// Minimum spacing of handshakes started because the peer sent data for a session we lack.
/// Long enough to not churn right after a fresh handshake, short enough that a restarted
/// peer is back within a second.
const REACTIVE_HANDSHAKE_INTERVAL: Duration = Duration::from_millis(500);

/// How often a peer with a configured endpoint re-initiates once boringtun has given up
/// (it stops after 90 s of unanswered attempts; a gateway must keep trying forever).
const EXPIRED_RETRY_INTERVAL: Duration = Duration::from_secs(5);

/// Configuration of one peer.
#[derive(Clone, Debug)]
pub struct PeerConfig {
    /// A stable, human-readable id (used in logs and metric labels).
    pub id: String,
    /// The peer's static public key.
    pub public_key: PublicKey,
    /// Where to reach the peer, if known up front (client side). The server side learns it.
    pub endpoint: Option<SocketAddr>,
    /// Send a keepalive after this many idle seconds (keeps NAT mappings open).
    pub persistent_keepalive: Option<u16>,
    /// Inner source addresses the peer may use.
    pub allowed_ips: AllowedIps,
}

/// A peer's position in the device (the order of the configuration).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PeerIndex(pub usize);

/// A configuration the device cannot run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    /// Two peers share a public key, so handshakes could not be attributed.
    #[error("peers {first:?} and {second:?} have the same public key")]
    DuplicateKey {
        /// The first peer's id.
        first: String,
        /// The second peer's id.
        second: String,
    },
    /// A peer has this device's own public key.
    #[error("peer {0:?} has this gateway's own public key")]
    OwnKey(String),
}

/// The four WireGuard message types, as boringtun's parser tells them apart (type byte,
/// reserved zeroes and exact length all checked).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MessageKind {
    /// A handshake initiation (148 bytes).
    HandshakeInit,
    /// A handshake response (92 bytes).
    HandshakeResponse,
    /// A cookie reply (64 bytes), sent under load.
    CookieReply,
    /// A transport data message (a keepalive when it carries nothing).
    Data,
}

impl MessageKind {
    /// The kind of a WireGuard message, or `None` when `message` is not one.
    pub fn of(message: &[u8]) -> Option<Self> {
        Tunn::parse_incoming_packet(message)
            .ok()
            .map(|packet| Self::from(&packet))
    }
}

impl From<&Packet<'_>> for MessageKind {
    fn from(packet: &Packet<'_>) -> Self {
        match packet {
            Packet::HandshakeInit(_) => Self::HandshakeInit,
            Packet::HandshakeResponse(_) => Self::HandshakeResponse,
            Packet::PacketCookieReply(_) => Self::CookieReply,
            Packet::PacketData(_) => Self::Data,
        }
    }
}

/// What to do with an inner packet handed to [`Device::encapsulate`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encapsulated {
    /// Send `out[..len]` to `to`: a data message, or a handshake initiation while the packet
    /// waits in the queue for the new session.
    Send {
        /// Destination.
        to: SocketAddr,
        /// Bytes at the start of the output buffer.
        len: usize,
        /// Which message it is: callers batch data messages and send an initiation alone.
        kind: MessageKind,
    },
    /// Queued until the handshake in flight completes; nothing to send now.
    Queued,
    /// Dropped, and counted.
    Dropped(DropReason),
}

/// What to do with a datagram handed to [`Device::decapsulate`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decapsulated {
    /// Write `out[..len]`, an inner IP packet from `peer`, to that peer's tunnel device.
    ToTunnel {
        /// Who sent it.
        peer: PeerIndex,
        /// Bytes at the start of the output buffer.
        len: usize,
    },
    /// Send `out[..len]` to `to`. When `peer` is set, afterwards call [`Device::flush`] for
    /// it until it returns `None`: packets queued during the handshake are now sendable.
    ToNetwork {
        /// The peer this concerns, if any (cookie replies under load have none).
        peer: Option<PeerIndex>,
        /// Destination.
        to: SocketAddr,
        /// Bytes at the start of the output buffer.
        len: usize,
    },
    /// Authenticated and fully handled (a keepalive).
    Consumed(PeerIndex),
    /// Dropped and counted against a peer.
    Dropped(PeerIndex, DropReason),
    /// Not attributable to any peer; counted in [`DeviceCounters`].
    Rejected,
}

struct PeerState {
    tunn: Tunn,
    endpoint: Option<SocketAddr>,
    /// When we sent the first initiation of the handshake now in flight.
    pending_since: Option<Instant>,
    /// When we sent the most recent initiation (for RTT).
    last_init_sent: Option<Instant>,
    last_handshake: Option<Instant>,
    handshake_rtt: Option<Duration>,
    last_reactive: Option<Instant>,
    last_expired_retry: Option<Instant>,
}

struct Peer {
    config: PeerConfig,
    state: Mutex<PeerState>,
    counters: PeerCounters,
}

/// A WireGuard device with several peers. All methods take `&self`; each peer has its own
/// lock, held only while its `Tunn` works, so the two IO directions can share the device.
pub struct Device {
    private: PrivateKey,
    public: PublicKey,
    rate_limiter: Arc<RateLimiter>,
    peers: Vec<Peer>,
    by_key: HashMap<[u8; 32], usize>,
    by_slot: HashMap<u32, usize>,
    counters: DeviceCounters,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("public", &self.public)
            .field(
                "peers",
                &self.peers.iter().map(|p| &p.config.id).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

/// A 24-bit slot derived from both public keys. Deterministic across restarts, so a packet
/// that still carries a receiver index from before a restart is attributed to the right peer
/// and answered with a handshake instead of waiting out WireGuard's 15 s timeout.
fn derive_slot(own: &PublicKey, peer: &PublicKey) -> u32 {
    // FNV-1a: only spread matters here, not collision resistance (collisions are probed).
    let mut h: u32 = 0x811c_9dc5;
    for b in own.as_bytes().iter().chain(peer.as_bytes()) {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    (h >> 8) ^ (h & 0xff)
}

fn lock(state: &Mutex<PeerState>) -> MutexGuard<'_, PeerState> {
    // The state stays consistent even if a holder panicked mid-packet: every field is
    // written atomically with respect to the others' invariants.
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

fn classify(e: &WireGuardError) -> DropReason {
    match e {
        WireGuardError::NoCurrentSession | WireGuardError::WrongIndex => DropReason::NoSession,
        WireGuardError::InvalidAeadTag
        | WireGuardError::InvalidCounter
        | WireGuardError::DuplicateCounter => DropReason::Decrypt,
        WireGuardError::InvalidPacket | WireGuardError::IncorrectPacketLength => {
            DropReason::Malformed
        }
        WireGuardError::DestinationBufferTooSmall => DropReason::TooLarge,
        _ => DropReason::Other,
    }
}

impl Device {
    /// A device with our private key and the given peers.
    pub fn new(private: PrivateKey, peers: Vec<PeerConfig>) -> Result<Self, DeviceError> {
        let public = private.public();
        let rate_limiter = Arc::new(RateLimiter::new(&public.inner(), HANDSHAKE_RATE_LIMIT));
        let mut by_key: HashMap<[u8; 32], usize> = HashMap::new();
        let mut by_slot = HashMap::new();
        let mut built = Vec::with_capacity(peers.len());
        for (i, config) in peers.into_iter().enumerate() {
            if config.public_key == public {
                return Err(DeviceError::OwnKey(config.id));
            }
            if let Some(&j) = by_key.get(config.public_key.as_bytes()) {
                let first: &Peer = &built[j];
                return Err(DeviceError::DuplicateKey {
                    first: first.config.id.clone(),
                    second: config.id,
                });
            }
            by_key.insert(*config.public_key.as_bytes(), i);
            let mut slot = derive_slot(&public, &config.public_key);
            while by_slot.contains_key(&slot) {
                slot = (slot + 1) & 0x00ff_ffff;
            }
            by_slot.insert(slot, i);
            let tunn = Tunn::new(
                private.secret().clone(),
                config.public_key.inner(),
                None,
                config.persistent_keepalive,
                slot,
                Some(rate_limiter.clone()),
            );
            let state = PeerState {
                tunn,
                endpoint: config.endpoint,
                pending_since: None,
                last_init_sent: None,
                last_handshake: None,
                handshake_rtt: None,
                last_reactive: None,
                last_expired_retry: None,
            };
            built.push(Peer {
                config,
                state: Mutex::new(state),
                counters: Default::default(),
            });
        }
        Ok(Self {
            private,
            public,
            rate_limiter,
            peers: built,
            by_key,
            by_slot,
            counters: Default::default(),
        })
    }

    /// This device's public key.
    pub fn public_key(&self) -> PublicKey {
        self.public
    }

    /// Number of peers.
    pub fn peer_count(&self) -> usize {
        self.peers.len()
    }

    /// All peer indices, in configuration order.
    pub fn peers(&self) -> impl Iterator<Item = PeerIndex> + '_ {
        (0..self.peers.len()).map(PeerIndex)
    }

    /// A peer's configuration.
    pub fn config(&self, peer: PeerIndex) -> &PeerConfig {
        &self.peers[peer.0].config
    }

    /// The peer with this public key.
    pub fn find_by_public_key(&self, key: &PublicKey) -> Option<PeerIndex> {
        self.by_key.get(key.as_bytes()).copied().map(PeerIndex)
    }

    /// The peer whose current endpoint is `addr`.
    pub fn find_by_endpoint(&self, addr: SocketAddr) -> Option<PeerIndex> {
        self.peers()
            .find(|&p| lock(&self.peers[p.0].state).endpoint == Some(addr))
    }

    /// The peer a WireGuard receiver index belongs to (its upper 24 bits are the slot).
    pub fn find_by_receiver_index(&self, index: u32) -> Option<PeerIndex> {
        self.by_slot.get(&(index >> 8)).copied().map(PeerIndex)
    }

    /// The peer a received datagram is addressed to, when it is a data message with a known
    /// receiver index; `None` for handshake messages, unknown indexes and non-WireGuard bytes.
    /// Lets an IO loop pick the destination buffer before decrypting into it.
    pub fn data_message_peer(&self, datagram: &[u8]) -> Option<PeerIndex> {
        match Tunn::parse_incoming_packet(datagram) {
            Ok(Packet::PacketData(data)) => self.find_by_receiver_index(data.receiver_idx),
            _ => None,
        }
    }

    /// Counters of datagrams not attributable to a peer.
    pub fn counters(&self) -> &DeviceCounters {
        &self.counters
    }

    /// A snapshot of one peer's counters and state.
    pub fn stats(&self, peer: PeerIndex, now: Instant) -> PeerStats {
        let p = &self.peers[peer.0];
        let st = lock(&p.state);
        let c = &p.counters;
        PeerStats {
            id: p.config.id.clone(),
            endpoint: st.endpoint,
            rx_bytes: c.rx_bytes.load(Relaxed),
            rx_packets: c.rx_packets.load(Relaxed),
            tx_bytes: c.tx_bytes.load(Relaxed),
            tx_packets: c.tx_packets.load(Relaxed),
            handshakes: c.handshakes.load(Relaxed),
            handshake_failures: c.handshake_failures.load(Relaxed),
            last_handshake_age: st.last_handshake.map(|t| now.saturating_duration_since(t)),
            handshake_rtt: st.handshake_rtt,
            has_session: st.tunn.time_since_last_handshake().is_some(),
            drops: c.drops_snapshot(),
        }
    }

    /// Encrypts one inner packet for `peer` into `out`. `out` must hold the packet plus
    /// [`DATA_OVERHEAD`] and at least [`MIN_OUT_BUF`] bytes, else the packet is dropped as
    /// [`DropReason::TooLarge`].
    pub fn encapsulate(
        &self,
        peer: PeerIndex,
        packet: &[u8],
        out: &mut [u8],
        now: Instant,
    ) -> Encapsulated {
        let p = &self.peers[peer.0];
        if out.len() < (packet.len() + DATA_OVERHEAD).max(MIN_OUT_BUF) {
            p.counters.drop(DropReason::TooLarge);
            return Encapsulated::Dropped(DropReason::TooLarge);
        }
        let mut st = lock(&p.state);
        let Some(to) = st.endpoint else {
            p.counters.drop(DropReason::NoEndpoint);
            return Encapsulated::Dropped(DropReason::NoEndpoint);
        };
        match st.tunn.encapsulate(packet, out) {
            TunnResult::WriteToNetwork(buf) => {
                let len = buf.len();
                // boringtun emits either the data message or, without a session, an
                // initiation; anything it could not parse back is sent as data would be.
                let kind = MessageKind::of(&out[..len]).unwrap_or(MessageKind::Data);
                if kind == MessageKind::HandshakeInit {
                    note_initiation(&mut st, &p.counters, now, false);
                }
                p.counters.tx(len);
                Encapsulated::Send { to, len, kind }
            }
            TunnResult::Done => Encapsulated::Queued,
            TunnResult::Err(e) => {
                let r = classify(&e);
                p.counters.drop(r);
                Encapsulated::Dropped(r)
            }
            TunnResult::WriteToTunnelV4(..) | TunnResult::WriteToTunnelV6(..) => {
                p.counters.drop(DropReason::Other);
                Encapsulated::Dropped(DropReason::Other)
            }
        }
    }

    /// Handles one datagram received from `from`. `out` must be at least as large as the
    /// datagram (and [`MIN_OUT_BUF`]).
    pub fn decapsulate(
        &self,
        from: SocketAddr,
        datagram: &[u8],
        out: &mut [u8],
        now: Instant,
    ) -> Decapsulated {
        if out.len() < datagram.len().max(MIN_OUT_BUF) {
            self.counters.malformed.fetch_add(1, Relaxed);
            return Decapsulated::Rejected;
        }
        let Ok(packet) = Tunn::parse_incoming_packet(datagram) else {
            self.counters.malformed.fetch_add(1, Relaxed);
            return Decapsulated::Rejected;
        };
        let peer = match packet {
            Packet::HandshakeInit(ref init) => {
                // MAC1 first (cheap, proves the sender knows our public key) and the rate
                // limiter; then the anonymous parse tells us which peer is calling.
                match self
                    .rate_limiter
                    .verify_packet(Some(from.ip()), datagram, out)
                {
                    Ok(_) => {}
                    Err(TunnResult::WriteToNetwork(cookie)) => {
                        let len = cookie.len();
                        self.counters.cookies_sent.fetch_add(1, Relaxed);
                        return Decapsulated::ToNetwork {
                            peer: None,
                            to: from,
                            len,
                        };
                    }
                    Err(_) => {
                        self.counters.invalid_mac.fetch_add(1, Relaxed);
                        return Decapsulated::Rejected;
                    }
                }
                let Ok(half) =
                    parse_handshake_anon(self.private.secret(), &self.public.inner(), init)
                else {
                    self.counters.unknown_key.fetch_add(1, Relaxed);
                    return Decapsulated::Rejected;
                };
                match self.by_key.get(&half.peer_static_public) {
                    Some(&i) => i,
                    None => {
                        self.counters.unknown_key.fetch_add(1, Relaxed);
                        return Decapsulated::Rejected;
                    }
                }
            }
            Packet::HandshakeResponse(ref r) => match self.by_slot.get(&(r.receiver_idx >> 8)) {
                Some(&i) => i,
                None => return self.unknown_index(),
            },
            Packet::PacketCookieReply(ref c) => match self.by_slot.get(&(c.receiver_idx >> 8)) {
                Some(&i) => i,
                None => return self.unknown_index(),
            },
            Packet::PacketData(ref d) => match self.by_slot.get(&(d.receiver_idx >> 8)) {
                Some(&i) => i,
                None => return self.unknown_index(),
            },
        };
        let kind = MessageKind::from(&packet);
        self.decapsulate_for(PeerIndex(peer), kind, from, datagram, out, now)
    }

    fn unknown_index(&self) -> Decapsulated {
        self.counters.unknown_index.fetch_add(1, Relaxed);
        Decapsulated::Rejected
    }

    fn decapsulate_for(
        &self,
        peer: PeerIndex,
        kind: MessageKind,
        from: SocketAddr,
        datagram: &[u8],
        out: &mut [u8],
        now: Instant,
    ) -> Decapsulated {
        let p = &self.peers[peer.0];
        let mut st = lock(&p.state);
        let result = st.tunn.decapsulate(Some(from.ip()), datagram, out);
        match result {
            TunnResult::WriteToTunnelV4(buf, src) => {
                let len = buf.len();
                st.endpoint = Some(from);
                p.counters.rx(datagram.len());
                if !p.config.allowed_ips.contains(src.into()) {
                    p.counters.drop(DropReason::AllowedIps);
                    return Decapsulated::Dropped(peer, DropReason::AllowedIps);
                }
                Decapsulated::ToTunnel { peer, len }
            }
            TunnResult::WriteToTunnelV6(buf, src) => {
                let len = buf.len();
                st.endpoint = Some(from);
                p.counters.rx(datagram.len());
                if !p.config.allowed_ips.contains(src.into()) {
                    p.counters.drop(DropReason::AllowedIps);
                    return Decapsulated::Dropped(peer, DropReason::AllowedIps);
                }
                Decapsulated::ToTunnel { peer, len }
            }
            TunnResult::WriteToNetwork(buf) => {
                let len = buf.len();
                // Whatever boringtun answers to (init → response, response → keepalive) was
                // authenticated, so the source is where the peer is now.
                st.endpoint = Some(from);
                p.counters.rx(datagram.len());
                p.counters.tx(len);
                match kind {
                    MessageKind::HandshakeInit | MessageKind::HandshakeResponse => {
                        if kind == MessageKind::HandshakeResponse {
                            st.handshake_rtt =
                                st.last_init_sent.map(|t| now.saturating_duration_since(t));
                        }
                        st.pending_since = None;
                        st.last_handshake = Some(now);
                        p.counters.handshakes.fetch_add(1, Relaxed);
                    }
                    MessageKind::CookieReply | MessageKind::Data => {}
                }
                Decapsulated::ToNetwork {
                    peer: Some(peer),
                    to: from,
                    len,
                }
            }
            TunnResult::Done => {
                if kind == MessageKind::Data {
                    // A keepalive: authenticated, so roam.
                    st.endpoint = Some(from);
                }
                p.counters.rx(datagram.len());
                Decapsulated::Consumed(peer)
            }
            TunnResult::Err(e) => {
                let reason = classify(&e);
                if matches!(
                    kind,
                    MessageKind::HandshakeInit | MessageKind::HandshakeResponse
                ) {
                    p.counters.handshake_failures.fetch_add(1, Relaxed);
                }
                p.counters.drop(reason);
                if reason == DropReason::NoSession
                    && kind == MessageKind::Data
                    && let Some(len) = self.reactive_handshake(&mut st, &p.counters, out, now)
                {
                    // Unauthenticated source: answer there but do not adopt it; the
                    // response, once verified, sets the endpoint.
                    p.counters.tx(len);
                    return Decapsulated::ToNetwork {
                        peer: Some(peer),
                        to: from,
                        len,
                    };
                }
                Decapsulated::Dropped(peer, reason)
            }
        }
    }

    /// The peer sent data under a session we do not have (we restarted, or it kept an old
    /// one). Waiting for its 15 s keepalive-timeout rekey would stall traffic, so start a
    /// handshake now, rate-limited and never right after one completed.
    fn reactive_handshake(
        &self,
        st: &mut PeerState,
        counters: &PeerCounters,
        out: &mut [u8],
        now: Instant,
    ) -> Option<usize> {
        let recent = |t: Option<Instant>| {
            t.is_some_and(|t| now.saturating_duration_since(t) < REACTIVE_HANDSHAKE_INTERVAL)
        };
        if recent(st.last_reactive) || recent(st.last_handshake) || recent(st.last_init_sent) {
            return None;
        }
        st.last_reactive = Some(now);
        match st.tunn.format_handshake_initiation(out, true) {
            TunnResult::WriteToNetwork(buf) => {
                let len = buf.len();
                note_initiation(st, counters, now, false);
                Some(len)
            }
            _ => None,
        }
    }

    /// After a [`Decapsulated::ToNetwork`] for `peer`: the next queued packet to send, if any.
    pub fn flush(
        &self,
        peer: PeerIndex,
        out: &mut [u8],
        now: Instant,
    ) -> Option<(SocketAddr, usize)> {
        let p = &self.peers[peer.0];
        let mut st = lock(&p.state);
        let to = st.endpoint?;
        match st.tunn.decapsulate(None, &[], out) {
            TunnResult::WriteToNetwork(buf) => {
                let len = buf.len();
                if MessageKind::of(&out[..len]) == Some(MessageKind::HandshakeInit) {
                    note_initiation(&mut st, &p.counters, now, false);
                }
                p.counters.tx(len);
                Some((to, len))
            }
            _ => None,
        }
    }

    /// Starts a handshake with every peer that has an endpoint (call at start-up so a
    /// restarted gateway is back at once instead of when the first packet arrives).
    pub fn initiate_all(
        &self,
        out: &mut [u8],
        now: Instant,
        mut send: impl FnMut(SocketAddr, &[u8]),
    ) {
        for p in &self.peers {
            let mut st = lock(&p.state);
            let Some(to) = st.endpoint else { continue };
            if let TunnResult::WriteToNetwork(buf) = st.tunn.format_handshake_initiation(out, false)
            {
                let len = buf.len();
                note_initiation(&mut st, &p.counters, now, false);
                p.counters.tx(len);
                send(to, &out[..len]);
            }
        }
    }

    /// Drives every peer's timers (handshake retries, rekeys, keepalives). Call every
    /// 100-250 ms; `send` receives each datagram to transmit.
    pub fn tick(&self, out: &mut [u8], now: Instant, mut send: impl FnMut(SocketAddr, &[u8])) {
        self.rate_limiter.reset_count();
        for p in &self.peers {
            let mut st = lock(&p.state);
            let result = st.tunn.update_timers(out);
            let len = match result {
                TunnResult::WriteToNetwork(buf) => buf.len(),
                TunnResult::Err(WireGuardError::ConnectionExpired) => {
                    // boringtun gave up; a peer we know how to reach is retried regardless.
                    if p.config.endpoint.is_none() || st.endpoint.is_none() {
                        continue;
                    }
                    let due = st
                        .last_expired_retry
                        .is_none_or(|t| now.saturating_duration_since(t) >= EXPIRED_RETRY_INTERVAL);
                    if !due {
                        continue;
                    }
                    st.last_expired_retry = Some(now);
                    match st.tunn.format_handshake_initiation(out, true) {
                        TunnResult::WriteToNetwork(buf) => buf.len(),
                        _ => continue,
                    }
                }
                _ => continue,
            };
            let Some(to) = st.endpoint else { continue };
            if MessageKind::of(&out[..len]) == Some(MessageKind::HandshakeInit) {
                note_initiation(&mut st, &p.counters, now, true);
            }
            p.counters.tx(len);
            send(to, &out[..len]);
        }
    }
}

/// Records that an initiation leaves now. A retry of one still pending means the previous
/// attempt failed (no valid response within the rekey timeout).
fn note_initiation(st: &mut PeerState, counters: &PeerCounters, now: Instant, from_timer: bool) {
    if from_timer && st.pending_since.is_some() {
        counters.handshake_failures.fetch_add(1, Relaxed);
    }
    st.pending_since.get_or_insert(now);
    st.last_init_sent = Some(now);
}
