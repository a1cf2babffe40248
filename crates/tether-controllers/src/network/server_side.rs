//! Which cluster of a peering runs the gateway server: the choice `spec.networking` asks for,
//! or the automatic one (the provider first, then the other side in turn while the tunnel
//! does not connect), kept in the ForeignCluster's `status.networking`. Pure: the consumer's
//! step does the IO and passes in what it saw and the time.

use std::time::Duration;

use tether_api::conditions::Time;
use tether_api::core::{
    GatewayServerChoice, GatewayServerSide, NetworkingOptions, NetworkingStatus,
};

/// How long the automatic choice gives one side, counted from when both gateways are in
/// place: the handshake and the first probe take a few seconds once they are, so a side
/// that has not connected by then cannot be reached.
pub const ATTEMPT_WINDOW: Duration = Duration::from_secs(20);

/// What the consumer's step saw of the tunnel of the side it applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    /// The gateway pair is not complete yet (a gateway starting, a key not yet copied).
    Starting,
    /// Both gateways are in place and the tunnel is not up.
    Down,
    /// The tunnel is connected.
    Connected,
}

/// The side to apply this pass: what the spec asks for, continuing `recorded` when it is for
/// the same request and starting afresh otherwise.
pub fn current(
    options: &NetworkingOptions,
    recorded: Option<&NetworkingStatus>,
) -> NetworkingStatus {
    let fresh = |side, choice| NetworkingStatus {
        gateway_server: Some(side),
        gateway_server_choice: Some(choice),
        ..NetworkingStatus::default()
    };
    let (side, choice) = match options.gateway_server {
        GatewayServerSide::Provider => {
            (GatewayServerSide::Provider, GatewayServerChoice::Requested)
        }
        GatewayServerSide::Consumer => {
            (GatewayServerSide::Consumer, GatewayServerChoice::Requested)
        }
        GatewayServerSide::Auto if options.address.is_some() || options.dial_port.is_some() => (
            GatewayServerSide::Provider,
            GatewayServerChoice::AddressGiven,
        ),
        GatewayServerSide::Auto => {
            return match recorded {
                Some(r)
                    if r.gateway_server_choice == Some(GatewayServerChoice::Automatic)
                        && listening(r).is_some() =>
                {
                    r.clone()
                }
                // A side that was asked for and worked is kept: switching to automatic must
                // not take down a working tunnel to try the provider first.
                Some(r) if r.connected && listening(r).is_some() => NetworkingStatus {
                    gateway_server_choice: Some(GatewayServerChoice::Automatic),
                    ..r.clone()
                },
                _ => fresh(GatewayServerSide::Provider, GatewayServerChoice::Automatic),
            };
        }
    };
    match recorded {
        Some(r) if r.gateway_server == Some(side) && r.gateway_server_choice == Some(choice) => {
            r.clone()
        }
        _ => fresh(side, choice),
    }
}

/// The side of a record, unless it is missing or (written by hand) `Auto`.
fn listening(r: &NetworkingStatus) -> Option<GatewayServerSide> {
    r.gateway_server.filter(|s| *s != GatewayServerSide::Auto)
}

/// The record after a pass of `current` that saw `seen` at `now`: an automatic choice that has
/// not connected moves to the other side once the current one had its attempt window.
pub fn advance(current: &NetworkingStatus, seen: Seen, now: &Time) -> NetworkingStatus {
    let mut next = current.clone();
    if seen == Seen::Connected {
        next.connected = true;
        next.attempt_started_at = None;
        return next;
    }
    if next.gateway_server_choice != Some(GatewayServerChoice::Automatic) || next.connected {
        return next;
    }
    // The window runs from the first pass that found the pair in place; a pass that finds a
    // gateway restarting does not reset it, or a flapping gateway would never yield the turn.
    let Some(started) = &next.attempt_started_at else {
        if seen == Seen::Down {
            next.attempt_started_at = Some(now.clone());
        }
        return next;
    };
    let elapsed = now.0.as_second().saturating_sub(started.0.as_second());
    if u64::try_from(elapsed).unwrap_or(0) >= ATTEMPT_WINDOW.as_secs() {
        next.gateway_server = Some(match listening(&next) {
            Some(GatewayServerSide::Consumer) => GatewayServerSide::Provider,
            _ => GatewayServerSide::Consumer,
        });
        next.attempt_started_at = None;
        next.switches += 1;
    }
    next
}

/// The cluster named by a side, for messages.
pub fn side_name(side: Option<GatewayServerSide>) -> &'static str {
    match side {
        Some(GatewayServerSide::Consumer) => "consumer",
        Some(GatewayServerSide::Provider) => "provider",
        Some(GatewayServerSide::Auto) | None => "(not chosen)",
    }
}

/// What the `Networking` condition adds about an automatic choice that has not connected yet;
/// `port` is the gateway server's UDP port.
pub fn explain(record: &NetworkingStatus, port: u16) -> Option<String> {
    if record.gateway_server_choice != Some(GatewayServerChoice::Automatic) || record.connected {
        return None;
    }
    let side = side_name(record.gateway_server);
    let window = ATTEMPT_WINDOW.as_secs();
    Some(match record.switches {
        0 => format!(
            "gateway server chosen automatically: trying the provider's; the consumer's is tried \
             if the tunnel is not up within {window}s"
        ),
        1 => format!(
            "gateway server chosen automatically: the provider's gateway could not be reached \
             from the consumer, trying the consumer's (for {window}s)"
        ),
        n => format!(
            "neither cluster's gateway could be reached from the other ({n} switches so far; \
             trying the {side}'s again for {window}s). If the provider is behind a NAT that maps \
             a UDP port to its gateway, peer again with --gateway-address/--gateway-port naming \
             that mapping; otherwise expose the gateway with a Service type the other cluster can \
             reach (--gateway-service-type) and allow UDP to port {port} between the clusters"
        ),
    })
}

#[cfg(test)]
mod tests {
    use expect_test::expect;

    use super::*;

    fn at(secs: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(secs).expect("a time"))
    }

    fn opts(
        side: GatewayServerSide,
        address: Option<&str>,
        dial_port: Option<u16>,
    ) -> NetworkingOptions {
        NetworkingOptions {
            gateway_server: side,
            address: address.map(str::to_owned),
            dial_port,
            ..NetworkingOptions::default()
        }
    }

    fn auto(
        side: GatewayServerSide,
        started: Option<i64>,
        switches: u32,
        connected: bool,
    ) -> NetworkingStatus {
        NetworkingStatus {
            gateway_server: Some(side),
            gateway_server_choice: Some(GatewayServerChoice::Automatic),
            attempt_started_at: started.map(at),
            switches,
            connected,
        }
    }

    fn show(r: &NetworkingStatus) -> String {
        format!(
            "{} {:?} start={:?} switches={} connected={}",
            side_name(r.gateway_server),
            r.gateway_server_choice.expect("a choice"),
            r.attempt_started_at.as_ref().map(|t| t.0.as_second()),
            r.switches,
            r.connected
        )
    }

    /// One line per case: the request, what the status recorded, and the side applied.
    #[test]
    fn the_side_applied_by_request_and_record() {
        use GatewayServerSide::{Auto, Consumer, Provider};
        let requested = NetworkingStatus {
            gateway_server: Some(Consumer),
            gateway_server_choice: Some(GatewayServerChoice::Requested),
            connected: true,
            ..NetworkingStatus::default()
        };
        let cases: Vec<(&str, NetworkingOptions, Option<NetworkingStatus>)> = vec![
            ("auto, nothing recorded", opts(Auto, None, None), None),
            (
                "auto, on the consumer",
                opts(Auto, None, None),
                Some(auto(Consumer, Some(5), 1, false)),
            ),
            (
                "auto, address given",
                opts(Auto, Some("203.0.113.9"), None),
                Some(auto(Consumer, None, 1, true)),
            ),
            ("auto, dial port given", opts(Auto, None, Some(31000)), None),
            (
                "auto after a working consumer",
                opts(Auto, None, None),
                Some(requested.clone()),
            ),
            (
                "auto after a failing consumer",
                opts(Auto, None, None),
                Some(NetworkingStatus {
                    connected: false,
                    ..requested.clone()
                }),
            ),
            (
                "provider, was automatic",
                opts(Provider, None, None),
                Some(auto(Consumer, None, 1, true)),
            ),
            (
                "consumer, nothing recorded",
                opts(Consumer, None, None),
                None,
            ),
            (
                "consumer, same recorded",
                opts(Consumer, None, None),
                Some(requested),
            ),
            (
                "auto, hand-written Auto recorded",
                opts(Auto, None, None),
                Some(auto(Auto, Some(5), 3, false)),
            ),
        ];
        let out: String = cases
            .iter()
            .map(|(what, o, r)| format!("{what}: {}\n", show(&current(o, r.as_ref()))))
            .collect();
        expect![[r#"
            auto, nothing recorded: provider Automatic start=None switches=0 connected=false
            auto, on the consumer: consumer Automatic start=Some(5) switches=1 connected=false
            auto, address given: provider AddressGiven start=None switches=0 connected=false
            auto, dial port given: provider AddressGiven start=None switches=0 connected=false
            auto after a working consumer: consumer Automatic start=None switches=0 connected=true
            auto after a failing consumer: provider Automatic start=None switches=0 connected=false
            provider, was automatic: provider Requested start=None switches=0 connected=false
            consumer, nothing recorded: consumer Requested start=None switches=0 connected=false
            consumer, same recorded: consumer Requested start=None switches=0 connected=true
            auto, hand-written Auto recorded: provider Automatic start=None switches=0 connected=false
        "#]]
        .assert_eq(&out);
    }

    /// One line per case: the record, what the pass saw and when, and the record after it.
    #[test]
    fn the_record_after_a_pass() {
        use GatewayServerSide::{Consumer, Provider};
        let requested = NetworkingStatus {
            gateway_server: Some(Provider),
            gateway_server_choice: Some(GatewayServerChoice::Requested),
            ..NetworkingStatus::default()
        };
        let cases: Vec<(&str, NetworkingStatus, Seen, i64)> = vec![
            (
                "pair not in place",
                auto(Provider, None, 0, false),
                Seen::Starting,
                100,
            ),
            (
                "pair in place: window opens",
                auto(Provider, None, 0, false),
                Seen::Down,
                100,
            ),
            (
                "inside the window",
                auto(Provider, Some(100), 0, false),
                Seen::Down,
                119,
            ),
            (
                "window over",
                auto(Provider, Some(100), 0, false),
                Seen::Down,
                120,
            ),
            (
                "window over while restarting",
                auto(Provider, Some(100), 0, false),
                Seen::Starting,
                130,
            ),
            (
                "consumer's window over",
                auto(Consumer, Some(200), 1, false),
                Seen::Down,
                225,
            ),
            (
                "connects",
                auto(Consumer, Some(200), 1, false),
                Seen::Connected,
                210,
            ),
            (
                "down after connecting",
                auto(Consumer, None, 1, true),
                Seen::Down,
                900,
            ),
            (
                "requested, never connects",
                requested.clone(),
                Seen::Down,
                900,
            ),
            ("requested, connects", requested, Seen::Connected, 900),
            (
                "clock behind the start",
                auto(Provider, Some(100), 0, false),
                Seen::Down,
                50,
            ),
        ];
        let out: String = cases
            .iter()
            .map(|(what, r, seen, now)| {
                format!("{what}: {}\n", show(&advance(r, *seen, &at(*now))))
            })
            .collect();
        expect![[r#"
            pair not in place: provider Automatic start=None switches=0 connected=false
            pair in place: window opens: provider Automatic start=Some(100) switches=0 connected=false
            inside the window: provider Automatic start=Some(100) switches=0 connected=false
            window over: consumer Automatic start=None switches=1 connected=false
            window over while restarting: consumer Automatic start=None switches=1 connected=false
            consumer's window over: provider Automatic start=None switches=2 connected=false
            connects: consumer Automatic start=None switches=1 connected=true
            down after connecting: consumer Automatic start=None switches=1 connected=true
            requested, never connects: provider Requested start=None switches=0 connected=false
            requested, connects: provider Requested start=None switches=0 connected=true
            clock behind the start: provider Automatic start=Some(100) switches=0 connected=false
        "#]]
        .assert_eq(&out);
    }

    #[test]
    fn the_condition_says_what_was_tried_and_what_to_check() {
        use GatewayServerSide::{Consumer, Provider};
        assert_eq!(explain(&auto(Provider, None, 0, true), 51840), None);
        let first = explain(&auto(Provider, None, 0, false), 51840).expect("a note");
        assert!(first.contains("trying the provider's"), "{first}");
        let second = explain(&auto(Consumer, None, 1, false), 51840).expect("a note");
        assert!(
            second.contains("provider's gateway could not be reached"),
            "{second}"
        );
        let third = explain(&auto(Provider, None, 2, false), 51840).expect("a note");
        for needle in [
            "neither cluster's gateway could be reached",
            "--gateway-address/--gateway-port",
            "--gateway-service-type",
            "port 51840",
        ] {
            assert!(third.contains(needle), "{needle:?} missing: {third}");
        }
    }

    proptest::proptest! {
        /// Whatever happens, the side applied is a real one, and an automatic choice that has
        /// connected never changes side again.
        #[test]
        fn connected_automatic_choices_stick(
            steps in proptest::collection::vec((0u8..3, 0i64..40), 1..40),
        ) {
            let o = opts(GatewayServerSide::Auto, None, None);
            let mut rec: Option<NetworkingStatus> = None;
            let mut now = 1_000;
            let mut stuck: Option<GatewayServerSide> = None;
            for (seen, dt) in steps {
                now += dt;
                let cur = current(&o, rec.as_ref());
                let side = listening(&cur);
                proptest::prop_assert!(side.is_some());
                if let Some(s) = stuck {
                    proptest::prop_assert_eq!(side, Some(s));
                }
                let seen = [Seen::Starting, Seen::Down, Seen::Connected][usize::from(seen)];
                let next = advance(&cur, seen, &at(now));
                if next.connected {
                    stuck = next.gateway_server;
                }
                rec = Some(next);
            }
        }
    }
}
