//! Round-trip probes through the tunnel. Once a second each gateway sends every peer, inside
//! the tunnel, a small UDP packet from a reserved link-local address to another one; the
//! remote gateway's dataplane recognises it after decryption and answers it itself, so the
//! probe needs no route, no remote pod address and no process on the other side. The answer
//! carries back the send time, which only the sender interprets.
//!
//! The packet functions are pure; [`Probes`] holds the per-peer results the packet loops write
//! and the status reporter reads.

use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use ipnet::{IpNet, Ipv4Net};

/// Source of probe requests (and destination of answers). Link-local, outside the tunnel
/// addresses' `169.254.18.0/24`, never routed.
pub const PROBER: Ipv4Addr = Ipv4Addr::new(169, 254, 19, 1);
/// Destination of probe requests: whichever gateway decrypts it answers.
pub const RESPONDER: Ipv4Addr = Ipv4Addr::new(169, 254, 19, 2);
/// UDP port on both ends.
pub const PORT: u16 = 7799;
/// How often each peer is probed.
pub const INTERVAL: Duration = Duration::from_secs(1);

const MAGIC: &[u8; 8] = b"tthprobe";
const IP_HEADER: usize = 20;
const UDP_HEADER: usize = 8;
/// Length of a probe packet: IPv4 and UDP headers, the magic and the send time.
pub const LEN: usize = IP_HEADER + UDP_HEADER + MAGIC.len() + 8;

/// The inner source addresses probes use; every peer's allowed IPs include them, or the
/// receiving device would drop them as spoofed.
pub fn allowed_ips() -> [IpNet; 2] {
    [PROBER, RESPONDER].map(|a| IpNet::V4(Ipv4Net::from(a)))
}

/// What a decrypted packet is, as far as probes go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A request to answer; the value is the opaque send time to echo.
    Request(u64),
    /// An answer to one of our requests, with the send time we put in.
    Reply(u64),
}

/// A probe request carrying `sent` (nanoseconds on the sender's clock).
pub fn request(sent: u64) -> [u8; LEN] {
    packet(PROBER, RESPONDER, sent)
}

/// The answer to a request that carried `sent`.
pub fn reply(sent: u64) -> [u8; LEN] {
    packet(RESPONDER, PROBER, sent)
}

fn packet(src: Ipv4Addr, dst: Ipv4Addr, sent: u64) -> [u8; LEN] {
    let mut p = [0u8; LEN];
    p[0] = 0x45;
    p[2..4].copy_from_slice(&(LEN as u16).to_be_bytes());
    p[6] = 0x40; // don't fragment
    p[8] = 64;
    p[9] = 17; // UDP
    p[12..16].copy_from_slice(&src.octets());
    p[16..20].copy_from_slice(&dst.octets());
    let sum = checksum(&p[..IP_HEADER]);
    p[10..12].copy_from_slice(&sum.to_be_bytes());
    let udp = &mut p[IP_HEADER..];
    udp[0..2].copy_from_slice(&PORT.to_be_bytes());
    udp[2..4].copy_from_slice(&PORT.to_be_bytes());
    udp[4..6].copy_from_slice(&((LEN - IP_HEADER) as u16).to_be_bytes());
    // UDP checksum 0: "none" in IPv4; the tunnel already authenticates every byte.
    udp[UDP_HEADER..UDP_HEADER + MAGIC.len()].copy_from_slice(MAGIC);
    udp[UDP_HEADER + MAGIC.len()..].copy_from_slice(&sent.to_be_bytes());
    p
}

fn checksum(header: &[u8]) -> u16 {
    let mut sum: u32 = header
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], c.get(1).copied().unwrap_or(0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// Recognises a probe among decrypted packets; anything else is `None` and goes to the TUN.
/// Cheap on the common path: one length and one address comparison reject pod traffic.
pub fn classify(packet: &[u8]) -> Option<Kind> {
    if packet.len() != LEN || packet[0] != 0x45 || packet[9] != 17 {
        return None;
    }
    let src = Ipv4Addr::new(packet[12], packet[13], packet[14], packet[15]);
    let dst = Ipv4Addr::new(packet[16], packet[17], packet[18], packet[19]);
    let udp = &packet[IP_HEADER..];
    if udp[UDP_HEADER..UDP_HEADER + MAGIC.len()] != MAGIC[..] {
        return None;
    }
    let mut sent = [0u8; 8];
    sent.copy_from_slice(&udp[UDP_HEADER + MAGIC.len()..]);
    let sent = u64::from_be_bytes(sent);
    match (src, dst) {
        (PROBER, RESPONDER) => Some(Kind::Request(sent)),
        (RESPONDER, PROBER) => Some(Kind::Reply(sent)),
        _ => None,
    }
}

/// Per-peer probe results, written by the packet loops and read by the status reporter.
#[derive(Debug)]
pub struct Probes {
    base: Instant,
    peers: Vec<PeerProbes>,
}

#[derive(Debug, Default)]
struct PeerProbes {
    sent: AtomicU64,
    answered: AtomicU64,
    /// When the last answer arrived, in nanoseconds since `base` plus one (0: never).
    last_reply: AtomicU64,
    rtt_nanos: AtomicU64,
}

/// One peer's probe results at a moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProbeSnapshot {
    /// Requests sent.
    pub sent: u64,
    /// Answers received.
    pub answered: u64,
    /// How long ago the last answer arrived.
    pub last_reply_age: Option<Duration>,
    /// Round trip of the last answered probe.
    pub rtt: Option<Duration>,
}

impl Probes {
    /// Results for `peers` peers, none probed yet.
    pub fn new(peers: usize) -> Self {
        Self {
            base: Instant::now(),
            peers: (0..peers).map(|_| PeerProbes::default()).collect(),
        }
    }

    /// The send-time stamp for a request sent at `now`.
    pub fn stamp(&self, peer: usize, now: Instant) -> u64 {
        if let Some(p) = self.peers.get(peer) {
            p.sent.fetch_add(1, Relaxed);
        }
        nanos(now.saturating_duration_since(self.base))
    }

    /// Records an answer that arrived at `now` for a request stamped `sent`.
    pub fn answered(&self, peer: usize, sent: u64, now: Instant) {
        let Some(p) = self.peers.get(peer) else {
            return;
        };
        let at = nanos(now.saturating_duration_since(self.base));
        // A forged or stale stamp from the future is ignored rather than trusted.
        if sent > at {
            return;
        }
        p.answered.fetch_add(1, Relaxed);
        p.rtt_nanos.store(at - sent, Relaxed);
        p.last_reply.store(at + 1, Relaxed);
    }

    /// One peer's results as seen at `now`.
    pub fn snapshot(&self, peer: usize, now: Instant) -> ProbeSnapshot {
        let Some(p) = self.peers.get(peer) else {
            return ProbeSnapshot::default();
        };
        let last = p.last_reply.load(Relaxed);
        let answered = p.answered.load(Relaxed);
        let now = nanos(now.saturating_duration_since(self.base));
        ProbeSnapshot {
            sent: p.sent.load(Relaxed),
            answered,
            last_reply_age: (last > 0).then(|| Duration::from_nanos(now.saturating_sub(last - 1))),
            rtt: (answered > 0).then(|| Duration::from_nanos(p.rtt_nanos.load(Relaxed))),
        }
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_replies_are_told_apart_and_carry_the_stamp() {
        assert_eq!(classify(&request(42)), Some(Kind::Request(42)));
        assert_eq!(classify(&reply(7)), Some(Kind::Reply(7)));
    }

    #[test]
    fn pod_traffic_is_not_a_probe() {
        let mut p = request(1);
        p[16..20].copy_from_slice(&[10, 0, 0, 5]);
        assert_eq!(classify(&p), None, "another destination");
        let mut p = request(1);
        p[IP_HEADER + UDP_HEADER] = b'x';
        assert_eq!(classify(&p), None, "no magic");
        assert_eq!(classify(&request(1)[..LEN - 1]), None, "another length");
        assert_eq!(classify(&[]), None);
    }

    #[test]
    fn the_ip_header_checksum_verifies() {
        let p = request(99);
        assert_eq!(checksum(&p[..IP_HEADER]), 0, "a valid header sums to zero");
    }

    #[test]
    fn round_trips_are_measured_on_the_senders_clock() {
        let probes = Probes::new(1);
        let t0 = probes.base + Duration::from_secs(1);
        let stamp = probes.stamp(0, t0);
        assert_eq!(probes.snapshot(0, t0).last_reply_age, None);
        probes.answered(0, stamp, t0 + Duration::from_millis(3));
        let s = probes.snapshot(0, t0 + Duration::from_secs(2));
        assert_eq!(s.rtt, Some(Duration::from_millis(3)));
        assert_eq!(
            s.last_reply_age,
            Some(Duration::from_secs(2) - Duration::from_millis(3))
        );
        assert_eq!((s.sent, s.answered), (1, 1));
        probes.answered(0, u64::MAX, t0);
        assert_eq!(
            probes.snapshot(0, t0).answered,
            1,
            "stamps from the future are ignored"
        );
    }
}
