//! What the Connection says, from what the gateway observes once a second: handshakes, probe
//! answers and rejected handshakes. Pure: time is a `Duration` since the tunnel started, so
//! timelines are test data.
//!
//! - **Connected**: a probe was answered within [`PROBE_TIMEOUT`]; the latency is its round trip.
//! - **Connecting**: not yet, or no longer; the message says since when and what to check.
//! - **Error**: still not connected after [`ERROR_AFTER`], or the objects are invalid.

use std::net::SocketAddr;
use std::time::Duration;

use tether_api::networking::{ConnectionState, GatewayType};

use super::translate::NotReady;
use crate::probe::ProbeSnapshot;

/// Probes go out every second; three missed answers mean the tunnel is not carrying traffic.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(3);
/// How long Connecting may last before it is an Error a person should look at.
pub const ERROR_AFTER: Duration = Duration::from_secs(30);

/// One observation of the tunnel.
#[derive(Clone, Copy, Debug, Default)]
pub struct Sample {
    /// Time since the tunnel started.
    pub at: Duration,
    /// When the last handshake completed, as an age.
    pub last_handshake_age: Option<Duration>,
    /// Probe results.
    pub probe: ProbeSnapshot,
    /// Handshake messages this gateway refused (wrong MAC or unknown key), since it started.
    pub rejected_handshakes: u64,
}

/// The facts of the tunnel that shape the messages.
#[derive(Clone, Debug)]
pub struct Context {
    /// Which end this gateway is.
    pub type_: GatewayType,
    /// The server's address (client side).
    pub endpoint: Option<SocketAddr>,
    /// `Kind namespace/name` of the gateway object.
    pub object: String,
}

/// What the Connection should say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Assessment {
    /// `status.value`.
    pub state: ConnectionState,
    /// The `Ready` condition's reason.
    pub reason: &'static str,
    /// The `Ready` condition's message: what is wrong and what to do.
    pub message: String,
    /// Rounded round trip, e.g. `0.3ms`, while connected.
    pub latency: Option<String>,
}

/// Remembers what a single sample cannot say: since when the tunnel has been down.
#[derive(Clone, Debug, Default)]
pub struct Tracker {
    down_since: Option<Duration>,
    ever_connected: bool,
    /// Handshakes refused up to the last time the tunnel was up: only later ones say that
    /// the keys no longer match.
    rejected_while_up: u64,
}

impl Tracker {
    /// The assessment at `sample.at`.
    pub fn observe(&mut self, ctx: &Context, sample: &Sample) -> Assessment {
        let alive = sample
            .probe
            .last_reply_age
            .is_some_and(|age| age <= PROBE_TIMEOUT);
        if alive {
            self.down_since = None;
            self.ever_connected = true;
            self.rejected_while_up = sample.rejected_handshakes;
            let latency = sample.probe.rtt.map(format_latency);
            return Assessment {
                state: ConnectionState::Connected,
                reason: "ProbesAnswered",
                message: format!(
                    "the remote gateway answers probes through the tunnel (round trip {})",
                    latency.as_deref().unwrap_or("unknown")
                ),
                latency,
            };
        }
        // Down since the last answer, or since the start when there never was one.
        let since = *self.down_since.get_or_insert_with(|| {
            sample
                .probe
                .last_reply_age
                .map_or(Duration::ZERO, |age| sample.at.saturating_sub(age))
        });
        let down = sample.at.saturating_sub(since);
        let state = if down >= ERROR_AFTER {
            ConnectionState::Error
        } else {
            ConnectionState::Connecting
        };
        let secs = down.as_secs();
        let refused = sample
            .rejected_handshakes
            .saturating_sub(self.rejected_while_up);
        // Refusals count only while no handshake has completed since the tunnel went down: a
        // peer whose key changed after a good start is refused just like one that never had it.
        let no_handshake_since_down = sample.last_handshake_age.is_none_or(|age| age >= down);
        let (reason, message) = if refused > 0 && no_handshake_since_down {
            (
                "HandshakeRejected",
                format!(
                    "no handshake for {secs}s, and {refused} handshake message(s) from the remote were refused: \
                     the keys do not match. Check that the client's spec.serverPublicKey is the server's \
                     public key and the server's spec.clientPublicKey is the client's ({})",
                    ctx.object
                ),
            )
        } else if self.ever_connected || sample.last_handshake_age.is_some() {
            let last = sample
                .last_handshake_age
                .map_or_else(|| "never".to_owned(), |a| format!("{}s ago", a.as_secs()));
            (
                "ProbesUnanswered",
                format!(
                    "no probe answered through the tunnel for {secs}s (last handshake {last}): the \
                     remote gateway is down or the path between the clusters drops UDP"
                ),
            )
        } else {
            match (ctx.type_, ctx.endpoint) {
                (GatewayType::Client, Some(ep)) => (
                    "NoHandshake",
                    format!(
                        "no handshake answer from {ep} for {secs}s: check that the remote gateway runs, \
                         that UDP to {ep} is allowed, and that spec.serverPublicKey of {} is the \
                         server's public key",
                        ctx.object
                    ),
                ),
                _ => (
                    "NoHandshake",
                    format!(
                        "no handshake from the client for {secs}s: check that the remote gateway runs, \
                         that it can reach this server's endpoint over UDP, and that spec.clientPublicKey \
                         of {} is the client's public key",
                        ctx.object
                    ),
                ),
            }
        };
        Assessment {
            state,
            reason,
            message,
            latency: None,
        }
    }
}

/// What the Connection says while the objects do not yet describe a tunnel.
pub fn not_ready(why: &NotReady) -> Assessment {
    match why {
        NotReady::Waiting { reason, message } => Assessment {
            state: ConnectionState::Connecting,
            reason,
            message: message.clone(),
            latency: None,
        },
        NotReady::Invalid { .. } => Assessment {
            state: ConnectionState::Error,
            reason: "InvalidConfiguration",
            message: format!("{why}; fix the object, the gateway applies it without a restart"),
            latency: None,
        },
    }
}

/// A round trip rounded so that jitter does not rewrite the status every second: tenths of a
/// millisecond below 10 ms, whole milliseconds above.
pub fn format_latency(rtt: Duration) -> String {
    let ms = rtt.as_secs_f64() * 1000.0;
    if ms < 10.0 {
        format!("{:.1}ms", (ms * 10.0).round() / 10.0)
    } else {
        format!("{}ms", ms.round() as u64)
    }
}

#[cfg(test)]
mod tests {
    use expect_test::expect;

    use super::*;

    fn s(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    /// Runs a timeline of samples through a tracker, one line per sample.
    fn timeline(ctx: &Context, samples: &[Sample]) -> String {
        let mut t = Tracker::default();
        samples
            .iter()
            .map(|x| {
                let a = t.observe(ctx, x);
                format!(
                    "t={:>2}s {:?} {} latency={:?}: {}\n",
                    x.at.as_secs(),
                    a.state,
                    a.reason,
                    a.latency,
                    a.message
                )
            })
            .collect()
    }

    fn client() -> Context {
        Context {
            type_: GatewayType::Client,
            endpoint: Some(SocketAddr::from(([198, 18, 0, 11], 51840))),
            object: "GatewayClient tether-tenant-b/tether-gateway".into(),
        }
    }

    fn answered(at: u64, reply_age_ms: u64, rtt_us: u64) -> Sample {
        Sample {
            at: s(at),
            last_handshake_age: Some(s(at.min(5))),
            probe: ProbeSnapshot {
                sent: at,
                answered: at,
                last_reply_age: Some(Duration::from_millis(reply_age_ms)),
                rtt: Some(Duration::from_micros(rtt_us)),
            },
            rejected_handshakes: 0,
        }
    }

    #[test]
    fn a_healthy_tunnel_then_a_dead_remote() {
        let mut samples = vec![
            Sample {
                at: s(0),
                ..Sample::default()
            },
            answered(1, 200, 340),
            answered(2, 100, 1234),
            answered(3, 900, 15_600),
        ];
        // The remote dies after t=3: answers age from there.
        for at in [5, 7, 8, 20, 33, 34] {
            let mut x = answered(at, (at - 3) * 1000 + 900, 15_600);
            x.last_handshake_age = Some(s(at - 2));
            samples.push(x);
        }
        samples.push(answered(35, 100, 400));
        expect![[r#"
            t= 0s Connecting NoHandshake latency=None: no handshake answer from 198.18.0.11:51840 for 0s: check that the remote gateway runs, that UDP to 198.18.0.11:51840 is allowed, and that spec.serverPublicKey of GatewayClient tether-tenant-b/tether-gateway is the server's public key
            t= 1s Connected ProbesAnswered latency=Some("0.3ms"): the remote gateway answers probes through the tunnel (round trip 0.3ms)
            t= 2s Connected ProbesAnswered latency=Some("1.2ms"): the remote gateway answers probes through the tunnel (round trip 1.2ms)
            t= 3s Connected ProbesAnswered latency=Some("16ms"): the remote gateway answers probes through the tunnel (round trip 16ms)
            t= 5s Connected ProbesAnswered latency=Some("16ms"): the remote gateway answers probes through the tunnel (round trip 16ms)
            t= 7s Connecting ProbesUnanswered latency=None: no probe answered through the tunnel for 4s (last handshake 5s ago): the remote gateway is down or the path between the clusters drops UDP
            t= 8s Connecting ProbesUnanswered latency=None: no probe answered through the tunnel for 5s (last handshake 6s ago): the remote gateway is down or the path between the clusters drops UDP
            t=20s Connecting ProbesUnanswered latency=None: no probe answered through the tunnel for 17s (last handshake 18s ago): the remote gateway is down or the path between the clusters drops UDP
            t=33s Error ProbesUnanswered latency=None: no probe answered through the tunnel for 30s (last handshake 31s ago): the remote gateway is down or the path between the clusters drops UDP
            t=34s Error ProbesUnanswered latency=None: no probe answered through the tunnel for 31s (last handshake 32s ago): the remote gateway is down or the path between the clusters drops UDP
            t=35s Connected ProbesAnswered latency=Some("0.4ms"): the remote gateway answers probes through the tunnel (round trip 0.4ms)
        "#]].assert_eq(&timeline(&client(), &samples));
    }

    #[test]
    fn a_client_without_answers_and_a_server_refusing_the_keys() {
        let never: Vec<Sample> = [0, 2, 10, 31]
            .map(|at| Sample {
                at: s(at),
                ..Sample::default()
            })
            .to_vec();
        let server = Context {
            type_: GatewayType::Server,
            endpoint: None,
            object: "GatewayServer tether-tenant-a/tether-gateway".into(),
        };
        let rejected: Vec<Sample> = [1, 4]
            .map(|at| Sample {
                at: s(at),
                rejected_handshakes: at,
                ..Sample::default()
            })
            .to_vec();
        expect![[r#"
            t= 0s Connecting NoHandshake latency=None: no handshake answer from 198.18.0.11:51840 for 0s: check that the remote gateway runs, that UDP to 198.18.0.11:51840 is allowed, and that spec.serverPublicKey of GatewayClient tether-tenant-b/tether-gateway is the server's public key
            t= 2s Connecting NoHandshake latency=None: no handshake answer from 198.18.0.11:51840 for 2s: check that the remote gateway runs, that UDP to 198.18.0.11:51840 is allowed, and that spec.serverPublicKey of GatewayClient tether-tenant-b/tether-gateway is the server's public key
            t=10s Connecting NoHandshake latency=None: no handshake answer from 198.18.0.11:51840 for 10s: check that the remote gateway runs, that UDP to 198.18.0.11:51840 is allowed, and that spec.serverPublicKey of GatewayClient tether-tenant-b/tether-gateway is the server's public key
            t=31s Error NoHandshake latency=None: no handshake answer from 198.18.0.11:51840 for 31s: check that the remote gateway runs, that UDP to 198.18.0.11:51840 is allowed, and that spec.serverPublicKey of GatewayClient tether-tenant-b/tether-gateway is the server's public key
            t= 0s Connecting NoHandshake latency=None: no handshake from the client for 0s: check that the remote gateway runs, that it can reach this server's endpoint over UDP, and that spec.clientPublicKey of GatewayServer tether-tenant-a/tether-gateway is the client's public key
            t= 2s Connecting NoHandshake latency=None: no handshake from the client for 2s: check that the remote gateway runs, that it can reach this server's endpoint over UDP, and that spec.clientPublicKey of GatewayServer tether-tenant-a/tether-gateway is the client's public key
            t=10s Connecting NoHandshake latency=None: no handshake from the client for 10s: check that the remote gateway runs, that it can reach this server's endpoint over UDP, and that spec.clientPublicKey of GatewayServer tether-tenant-a/tether-gateway is the client's public key
            t=31s Error NoHandshake latency=None: no handshake from the client for 31s: check that the remote gateway runs, that it can reach this server's endpoint over UDP, and that spec.clientPublicKey of GatewayServer tether-tenant-a/tether-gateway is the client's public key
            t= 1s Connecting HandshakeRejected latency=None: no handshake for 1s, and 1 handshake message(s) from the remote were refused: the keys do not match. Check that the client's spec.serverPublicKey is the server's public key and the server's spec.clientPublicKey is the client's (GatewayServer tether-tenant-a/tether-gateway)
            t= 4s Connecting HandshakeRejected latency=None: no handshake for 4s, and 4 handshake message(s) from the remote were refused: the keys do not match. Check that the client's spec.serverPublicKey is the server's public key and the server's spec.clientPublicKey is the client's (GatewayServer tether-tenant-a/tether-gateway)
        "#]].assert_eq(
            &(timeline(&client(), &never)
                + &timeline(&server, &never)
                + &timeline(&server, &rejected)),
        );
    }

    #[test]
    fn refusals_after_a_good_start_blame_the_keys_older_ones_do_not() {
        let server = Context {
            type_: GatewayType::Server,
            endpoint: None,
            object: "GatewayServer tether-tenant-a/tether-gateway".into(),
        };
        // Up until t=3 with 2 stray refusals from before; then the client's idea of our key
        // changes: its handshakes are refused from t=6 on, and the old session's probes die.
        let mut samples: Vec<Sample> = (1..=3)
            .map(|at| Sample {
                rejected_handshakes: 2,
                ..answered(at, 200, 300)
            })
            .collect();
        for (at, rejected) in [(6, 2), (8, 4), (40, 30)] {
            let mut x = answered(at, (at - 3) * 1000 + 900, 300);
            x.last_handshake_age = Some(s(at - 1));
            x.rejected_handshakes = rejected;
            samples.push(x);
        }
        expect![[r#"
            t= 1s Connected ProbesAnswered latency=Some("0.3ms"): the remote gateway answers probes through the tunnel (round trip 0.3ms)
            t= 2s Connected ProbesAnswered latency=Some("0.3ms"): the remote gateway answers probes through the tunnel (round trip 0.3ms)
            t= 3s Connected ProbesAnswered latency=Some("0.3ms"): the remote gateway answers probes through the tunnel (round trip 0.3ms)
            t= 6s Connecting ProbesUnanswered latency=None: no probe answered through the tunnel for 3s (last handshake 5s ago): the remote gateway is down or the path between the clusters drops UDP
            t= 8s Connecting HandshakeRejected latency=None: no handshake for 5s, and 2 handshake message(s) from the remote were refused: the keys do not match. Check that the client's spec.serverPublicKey is the server's public key and the server's spec.clientPublicKey is the client's (GatewayServer tether-tenant-a/tether-gateway)
            t=40s Error HandshakeRejected latency=None: no handshake for 37s, and 28 handshake message(s) from the remote were refused: the keys do not match. Check that the client's spec.serverPublicKey is the server's public key and the server's spec.clientPublicKey is the client's (GatewayServer tether-tenant-a/tether-gateway)
        "#]].assert_eq(&timeline(&server, &samples));
    }

    #[test]
    fn objects_not_ready_are_connecting_or_error() {
        let w = not_ready(&NotReady::Waiting {
            reason: "RemapPending",
            message: "waiting".into(),
        });
        assert_eq!(
            (w.state, w.reason),
            (ConnectionState::Connecting, "RemapPending")
        );
        let e = not_ready(&NotReady::Invalid {
            object: "Configuration ns/b".into(),
            field: "spec.remote.cidr.pod[0]".into(),
            message: "bad".into(),
        });
        assert_eq!(e.state, ConnectionState::Error);
        assert!(
            e.message
                .starts_with("Configuration ns/b: spec.remote.cidr.pod[0]: bad"),
            "{}",
            e.message
        );
    }

    #[test]
    fn latency_is_rounded() {
        assert_eq!(format_latency(Duration::from_micros(340)), "0.3ms");
        assert_eq!(format_latency(Duration::from_micros(9_960)), "10.0ms");
        assert_eq!(format_latency(Duration::from_micros(15_600)), "16ms");
    }
}
