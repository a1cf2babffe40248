//! Per-peer and per-device counters. Plain atomics, so metrics scrapes never take the tunnel
//! lock and the packet path never allocates.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Why a packet was dropped instead of delivered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DropReason {
    /// A decrypted packet's inner source is outside the peer's allowed IPs.
    AllowedIps,
    /// A decrypted packet was not a well-formed IP packet.
    Malformed,
    /// There is no endpoint to send to yet (server side before the peer first connects).
    NoEndpoint,
    /// A data packet for a session this side does not have (e.g. after a restart).
    NoSession,
    /// Authentication, replay or counter checks failed on a data packet.
    Decrypt,
    /// The packet does not fit the output buffer (inner packet above the tunnel MTU).
    TooLarge,
    /// boringtun reported some other error.
    Other,
}

impl DropReason {
    /// Every reason, for exporting zero-valued series.
    pub const ALL: [DropReason; 7] = [
        Self::AllowedIps,
        Self::Malformed,
        Self::NoEndpoint,
        Self::NoSession,
        Self::Decrypt,
        Self::TooLarge,
        Self::Other,
    ];

    /// A stable `snake_case` name, used as a metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::AllowedIps => "allowed_ips",
            Self::Malformed => "malformed",
            Self::NoEndpoint => "no_endpoint",
            Self::NoSession => "no_session",
            Self::Decrypt => "decrypt",
            Self::TooLarge => "too_large",
            Self::Other => "other",
        }
    }

    fn slot(self) -> usize {
        self as usize
    }
}

/// Live counters of one peer.
#[derive(Debug, Default)]
pub struct PeerCounters {
    pub(crate) rx_bytes: AtomicU64,
    pub(crate) rx_packets: AtomicU64,
    pub(crate) tx_bytes: AtomicU64,
    pub(crate) tx_packets: AtomicU64,
    pub(crate) handshakes: AtomicU64,
    pub(crate) handshake_failures: AtomicU64,
    pub(crate) drops: [AtomicU64; DropReason::ALL.len()],
}

impl PeerCounters {
    pub(crate) fn rx(&self, bytes: usize) {
        self.rx_packets.fetch_add(1, Relaxed);
        self.rx_bytes.fetch_add(bytes as u64, Relaxed);
    }

    pub(crate) fn tx(&self, bytes: usize) {
        self.tx_packets.fetch_add(1, Relaxed);
        self.tx_bytes.fetch_add(bytes as u64, Relaxed);
    }

    pub(crate) fn drop(&self, reason: DropReason) {
        self.drops[reason.slot()].fetch_add(1, Relaxed);
    }
}

/// Counters for datagrams that cannot be attributed to a configured peer.
#[derive(Debug, Default)]
pub struct DeviceCounters {
    pub(crate) unknown_index: AtomicU64,
    pub(crate) invalid_mac: AtomicU64,
    pub(crate) unknown_key: AtomicU64,
    pub(crate) malformed: AtomicU64,
    pub(crate) cookies_sent: AtomicU64,
}

impl DeviceCounters {
    /// Data/response packets naming a receiver index that belongs to no peer.
    pub fn unknown_index(&self) -> u64 {
        self.unknown_index.load(Relaxed)
    }
    /// Handshake messages whose MAC1 is wrong: the sender used the wrong public key for us.
    pub fn invalid_mac(&self) -> u64 {
        self.invalid_mac.load(Relaxed)
    }
    /// Handshake initiations from a static key that is not a configured peer (or that failed
    /// to decrypt).
    pub fn unknown_key(&self) -> u64 {
        self.unknown_key.load(Relaxed)
    }
    /// Datagrams that are not WireGuard messages.
    pub fn malformed(&self) -> u64 {
        self.malformed.load(Relaxed)
    }
    /// Cookie replies sent because the handshake rate limiter was under load.
    pub fn cookies_sent(&self) -> u64 {
        self.cookies_sent.load(Relaxed)
    }
}

/// A point-in-time copy of one peer's state, for metrics and status.
#[derive(Clone, Debug, PartialEq)]
pub struct PeerStats {
    /// The peer's configured id.
    pub id: String,
    /// Where packets for the peer go now (configured or learned).
    pub endpoint: Option<SocketAddr>,
    /// Wire bytes (UDP payload, handshakes included) received from the peer.
    pub rx_bytes: u64,
    /// Authenticated datagrams received from the peer.
    pub rx_packets: u64,
    /// Wire bytes sent to the peer.
    pub tx_bytes: u64,
    /// Datagrams sent to the peer.
    pub tx_packets: u64,
    /// Handshakes completed (as initiator or responder).
    pub handshakes: u64,
    /// Handshakes that failed: our initiation went unanswered for the retry timeout, or the
    /// peer's handshake message did not verify.
    pub handshake_failures: u64,
    /// Time since the last completed handshake.
    pub last_handshake_age: Option<Duration>,
    /// Round-trip time of the last handshake this side initiated (initiation sent to
    /// response processed).
    pub handshake_rtt: Option<Duration>,
    /// Whether a session key is usable for sending now.
    pub has_session: bool,
    /// Drops per reason, in [`DropReason::ALL`] order.
    pub drops: [(DropReason, u64); DropReason::ALL.len()],
}

impl PeerCounters {
    pub(crate) fn drops_snapshot(&self) -> [(DropReason, u64); DropReason::ALL.len()] {
        DropReason::ALL.map(|r| (r, self.drops[r.slot()].load(Relaxed)))
    }
}
