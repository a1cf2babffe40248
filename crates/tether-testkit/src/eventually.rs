//! Bounded polling assertions for asynchronous effects (a handshake, a repaired route), scaled by
//! the `TETHER_TEST_PATIENCE` factor on slow machines.

use std::time::Duration;

/// How often `assert_eventually!` re-evaluates its condition.
pub const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// Scales `timeout` by the `TETHER_TEST_PATIENCE` environment variable (a positive number,
/// default 1), so a slow or noisy machine can be given more time without editing tests.
pub fn patience(timeout: Duration) -> Duration {
    let factor = std::env::var("TETHER_TEST_PATIENCE")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|f| f.is_finite() && *f > 0.0)
        .unwrap_or(1.0);
    timeout.mul_f64(factor)
}

/// Polls `cond` every 20 ms until it is true; panics with the message (format arguments allowed)
/// if it is still false after `timeout` (a `Duration`, scaled by [`patience`]).
///
/// ```
/// use std::time::Duration;
/// let start = std::time::Instant::now();
/// tether_testkit::assert_eventually!(
///     start.elapsed() > Duration::from_millis(30),
///     Duration::from_secs(1),
///     "time did not pass"
/// );
/// ```
#[macro_export]
macro_rules! assert_eventually {
    ($cond:expr, $timeout:expr, $($msg:tt)+) => {{
        let timeout = $crate::patience($timeout);
        let started = ::std::time::Instant::now();
        loop {
            if $cond {
                break;
            }
            if started.elapsed() >= timeout {
                panic!(
                    "not true within {:?}: {} (condition: `{}`)",
                    timeout,
                    format_args!($($msg)+),
                    stringify!($cond)
                );
            }
            ::std::thread::sleep($crate::POLL_INTERVAL);
        }
    }};
}

/// The async flavour of [`assert_eventually!`]: `cond` may contain `.await`, and waiting uses
/// `tokio::time::sleep`, so it works under a paused test clock too.
#[macro_export]
macro_rules! assert_eventually_async {
    ($cond:expr, $timeout:expr, $($msg:tt)+) => {{
        let timeout = $crate::patience($timeout);
        let started = $crate::__private::tokio::time::Instant::now();
        loop {
            if $cond {
                break;
            }
            if started.elapsed() >= timeout {
                panic!(
                    "not true within {:?}: {} (condition: `{}`)",
                    timeout,
                    format_args!($($msg)+),
                    stringify!($cond)
                );
            }
            $crate::__private::tokio::time::sleep($crate::POLL_INTERVAL).await;
        }
    }};
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    #[test]
    fn passes_once_true() {
        let start = Instant::now();
        assert_eventually!(
            start.elapsed() > Duration::from_millis(50),
            Duration::from_secs(2),
            "x"
        );
    }

    #[test]
    fn panics_with_message_after_timeout() {
        let result = std::panic::catch_unwind(|| {
            assert_eventually!(
                false,
                Duration::from_millis(50),
                "route {} missing",
                "10.0.0.0/16"
            );
        });
        let panic = result.expect_err("must time out");
        let text = panic
            .downcast_ref::<String>()
            .expect("formatted panic message");
        assert!(text.contains("route 10.0.0.0/16 missing"), "{text}");
        assert!(text.contains("condition: `false`"), "{text}");
    }

    #[tokio::test(start_paused = true)]
    async fn async_flavour_awaits() {
        let (tx, rx) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(3)).await;
            tx.send(true).unwrap();
        });
        assert_eventually_async!(*rx.borrow(), Duration::from_secs(10), "flag never set");
    }
}
