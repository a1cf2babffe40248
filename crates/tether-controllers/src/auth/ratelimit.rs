//! Per-source failure limiting for the authentication service: after too many failed
//! credential checks from one address within a window, further requests from it are refused
//! with 429 and a `Retry-After` until the window has passed. Pure: time is passed in.

use std::collections::HashMap;
use std::net::IpAddr;

/// Limits failures per source address.
#[derive(Debug)]
pub struct FailureLimiter {
    max_failures: u32,
    window_secs: i64,
    sources: HashMap<IpAddr, Window>,
}

#[derive(Debug, Clone, Copy)]
struct Window {
    started: i64,
    failures: u32,
}

impl FailureLimiter {
    /// At most `max_failures` failures per `window_secs` from one address.
    pub fn new(max_failures: u32, window_secs: i64) -> Self {
        Self {
            max_failures,
            window_secs,
            sources: HashMap::new(),
        }
    }

    /// `Err(seconds to wait)` when `source` is blocked at `now`.
    pub fn check(&mut self, source: IpAddr, now: i64) -> Result<(), i64> {
        match self.sources.get(&source) {
            Some(w) if now >= w.started + self.window_secs => {
                self.sources.remove(&source);
                Ok(())
            }
            Some(w) if w.failures >= self.max_failures => Err(w.started + self.window_secs - now),
            _ => Ok(()),
        }
    }

    /// Records a failed credential check from `source`.
    pub fn record_failure(&mut self, source: IpAddr, now: i64) {
        let window = self.window_secs;
        let w = self.sources.entry(source).or_insert(Window {
            started: now,
            failures: 0,
        });
        if now >= w.started + window {
            *w = Window {
                started: now,
                failures: 0,
            };
        }
        w.failures += 1;
        // Forget stale sources so a scan from many addresses cannot grow the map forever.
        if self.sources.len() > 10_000 {
            self.sources.retain(|_, w| now < w.started + window);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([192, 0, 2, last])
    }

    #[test]
    fn blocks_after_the_limit_until_the_window_ends_and_only_that_source() {
        let mut l = FailureLimiter::new(3, 60);
        for t in 0..3 {
            assert_eq!(l.check(ip(1), 100 + t), Ok(()));
            l.record_failure(ip(1), 100 + t);
        }
        assert_eq!(l.check(ip(1), 110), Err(50));
        assert_eq!(l.check(ip(2), 110), Ok(()));
        assert_eq!(l.check(ip(1), 159), Err(1));
        assert_eq!(l.check(ip(1), 160), Ok(()));
        l.record_failure(ip(1), 161);
        assert_eq!(l.check(ip(1), 162), Ok(()));
    }
}
