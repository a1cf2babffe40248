//! Container restart back-off, as the kubelet does it: the first restart waits `initial`, each
//! further consecutive crash doubles the wait up to `max`, and a container that ran for
//! `reset_after` without crashing starts again from `initial` (pure: time is passed in).

use std::time::Duration;

/// The restart back-off policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// Wait before the first restart (kubelet: 10 s).
    pub initial: Duration,
    /// Largest wait (kubelet: 5 min).
    pub max: Duration,
    /// A run at least this long resets the back-off (kubelet: 10 min).
    pub reset_after: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            initial: Duration::from_secs(10),
            max: Duration::from_secs(300),
            reset_after: Duration::from_secs(600),
        }
    }
}

impl Backoff {
    /// The wait before the next start, given how many consecutive crashes came before (1 for
    /// the first crash).
    pub fn delay(&self, consecutive_crashes: u32) -> Duration {
        if consecutive_crashes == 0 {
            return Duration::ZERO;
        }
        let doublings = (consecutive_crashes - 1).min(31);
        self.initial
            .checked_mul(1u32 << doublings)
            .map_or(self.max, |d| d.min(self.max))
    }

    /// The consecutive-crash count after a container exits having run for `ran`.
    pub fn next_crash_count(&self, previous: u32, ran: Duration) -> u32 {
        if ran >= self.reset_after {
            1
        } else {
            previous.saturating_add(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubelet_schedule() {
        let b = Backoff::default();
        let secs: Vec<u64> = (0..8).map(|n| b.delay(n).as_secs()).collect();
        assert_eq!(secs, [0, 10, 20, 40, 80, 160, 300, 300]);
        assert_eq!(b.delay(u32::MAX), b.max);
    }

    #[test]
    fn long_runs_reset_the_count() {
        let b = Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(1),
            reset_after: Duration::from_secs(5),
        };
        assert_eq!(b.next_crash_count(4, Duration::from_secs(1)), 5);
        assert_eq!(b.next_crash_count(4, Duration::from_secs(5)), 1);
        assert_eq!(b.delay(5), Duration::from_secs(1));
        assert_eq!(b.delay(2), Duration::from_millis(200));
    }
}
