//! Sans-IO WireGuard for the Tether gateway: keys, a multi-peer table over boringtun's
//! `noise::Tunn`, allowed-IPs enforcement, endpoint roaming, timers and per-peer counters.
//!
//! The crate owns no socket, no TUN device and no thread. Callers hand in datagrams, inner IP
//! packets and the current [`std::time::Instant`], and get back what to write where.
//!
//! # Time
//!
//! boringtun's `Tunn` reads the monotonic clock itself (its handshake retry, rekey, keepalive
//! and session-expiry timers are computed from `Instant::now()` inside `update_timers`). That
//! cannot be injected without its test-only `mock-instant` feature, so this crate is honest
//! about the split: the caller drives [`Device::tick`] every 100-250 ms and that is when
//! boringtun's timers fire; every decision *this* crate makes (roaming, reactive handshakes,
//! handshake failure accounting, last-handshake age, RTT) uses the `now` passed in.

mod allowed;
mod counters;
mod device;
mod key;

pub use allowed::AllowedIps;
pub use counters::{DeviceCounters, DropReason, PeerCounters, PeerStats};
pub use device::{
    Decapsulated, Device, DeviceError, Encapsulated, MessageKind, PeerConfig, PeerIndex,
};
pub use key::{KeyError, PrivateKey, PublicKey};

/// Bytes WireGuard adds to an inner packet (type, index, counter, tag).
pub const DATA_OVERHEAD: usize = 32;

/// Outer headers on an IPv4 underlay: IPv4 (20) + UDP (8) + [`DATA_OVERHEAD`].
pub const IPV4_TUNNEL_OVERHEAD: usize = 20 + 8 + DATA_OVERHEAD;

/// Smallest output buffer any operation may need (a handshake initiation is 148 bytes).
pub const MIN_OUT_BUF: usize = 148;
