//! Whether a watch's first listing has arrived, for any number of tasks waiting on it at once.
//!
//! kube-runtime's `Store::wait_until_ready` wakes only one of several tasks that wait at the
//! same time: its `DelayedInit` polls a single oneshot receiver, which keeps only the waker of
//! its last poll. The others stay asleep until something polls them again; under a timeout,
//! that is the timeout itself, so a burst of reconciles opening a new watch together saw some
//! of them wait out the full timeout (5 or 10 s) although the listing came in milliseconds.

use std::time::Duration;

use kube::runtime::watcher;

/// The watch's side: told every event the watch yields, after its store applied it.
#[derive(Debug)]
pub struct Lister(tokio::sync::watch::Sender<bool>);

/// The readers' side: cloned freely, awaited by any number of tasks.
#[derive(Clone, Debug)]
pub struct Listed(tokio::sync::watch::Receiver<bool>);

/// A linked pair, not listed yet.
pub fn pair() -> (Lister, Listed) {
    let (tx, rx) = tokio::sync::watch::channel(false);
    (Lister(tx), Listed(rx))
}

impl Lister {
    /// Notes `event`: the end of a listing makes the store ready.
    pub fn saw<K, E>(&self, event: &Result<watcher::Event<K>, E>) {
        if matches!(event, Ok(watcher::Event::InitDone)) {
            self.0.send_replace(true);
        }
    }
}

impl Listed {
    /// Whether the first listing arrives within `within` (at once if it has); false also when
    /// the watch ended first.
    pub async fn wait(&self, within: Duration) -> bool {
        let mut rx = self.0.clone();
        matches!(
            tokio::time::timeout(within, rx.wait_for(|listed| *listed)).await,
            Ok(Ok(_))
        )
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use k8s_openapi::api::core::v1::Pod;

    use super::*;

    type Event = Result<watcher::Event<Pod>, watcher::Error>;

    #[tokio::test]
    async fn every_concurrent_waiter_wakes_when_the_listing_ends() {
        let (lister, listed) = pair();
        let waiters: Vec<_> = (0..16)
            .map(|_| {
                let listed = listed.clone();
                tokio::spawn(async move {
                    let began = Instant::now();
                    (listed.wait(Duration::from_secs(5)).await, began.elapsed())
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(50)).await;
        // Events before the end of the listing do not make it ready.
        lister.saw(&Event::Ok(watcher::Event::Init));
        lister.saw(&Event::Ok(watcher::Event::InitApply(Pod::default())));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(waiters.iter().all(|w| !w.is_finished()));
        lister.saw(&Event::Ok(watcher::Event::InitDone));
        for waiter in waiters {
            let (ready, waited) = waiter.await.expect("waiter");
            assert!(ready);
            assert!(waited < Duration::from_secs(1), "woke after {waited:?}");
        }
        // A late reader finds it listed at once.
        assert!(listed.wait(Duration::ZERO).await);
    }

    #[tokio::test]
    async fn a_watch_that_never_lists_or_ends_first_is_not_ready() {
        let (lister, listed) = pair();
        assert!(!listed.wait(Duration::from_millis(20)).await);
        lister.saw(&Event::Err(watcher::Error::NoResourceVersion));
        assert!(!listed.wait(Duration::from_millis(20)).await);
        drop(lister);
        assert!(!listed.wait(Duration::from_secs(5)).await);
    }
}
