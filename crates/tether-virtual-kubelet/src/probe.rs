//! The provider probe: asks the provider's API server whether it is ready (`/readyz`, the
//! smallest answer it gives, open to every identity) every probe interval, under a timeout,
//! and once more at once after a first failure, and records answers and errors for the node
//! task. It runs apart from the node task so that
//! a provider that hangs never delays the Node's writes or its Lease.

use k8s_openapi::jiff::Timestamp;
use tokio::sync::watch;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use crate::Timing;
use crate::desired::Probes;

pub(crate) async fn run(
    name: String,
    mut provider: watch::Receiver<Option<kube::Client>>,
    out: watch::Sender<Probes>,
    timing: Timing,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(timing.probe_interval);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    // A dropped sender leaves the last client in place: keep probing it.
    let mut open = true;
    loop {
        let client = provider.borrow_and_update().clone();
        let now = Timestamp::now();
        out.send_if_modified(|p| match &client {
            None => {
                let changed = *p != Probes::default();
                *p = Probes::default();
                changed
            }
            // A replaced client (a renewed certificate) keeps the record: the provider is the
            // same, and its readiness must not flap on every renewal.
            Some(_) if p.client_since.is_none() => {
                p.client_since = Some(now);
                true
            }
            Some(_) => false,
        });
        let Some(client) = client else {
            tokio::select! {
                () = stop.cancelled() => return,
                changed = provider.changed(), if open => open = changed.is_ok(),
            }
            if !open {
                // No client and none coming: nothing to probe until the stop.
                stop.cancelled().await;
                return;
            }
            continue;
        };
        tokio::select! {
            () = stop.cancelled() => return,
            changed = provider.changed(), if open => {
                open = changed.is_ok();
                continue;
            }
            _ = tick.tick() => {}
        }
        let result = tokio::select! {
            () = stop.cancelled() => return,
            r = tokio::time::timeout(timing.probe_timeout, readyz(&client)) => r,
        };
        let now = Timestamp::now();
        let error = match result {
            Ok(Ok(_)) => None,
            Ok(Err(e)) => Some(chain(&e)),
            Err(_) => Some(format!(
                "no answer within {}ms",
                timing.probe_timeout.as_millis()
            )),
        };
        // The first failure after an answer is checked again at once rather than a whole
        // interval later: one lost probe is then forgiven within `unreachable_after` (the
        // retry answers about interval + timeout after the last answer).
        if error.is_some() && out.borrow().last_error.is_none() {
            tick.reset_immediately();
        }
        out.send_modify(|p| match error {
            None => {
                if p.last_error.is_some() {
                    tracing::info!(node = %name, "the provider's API server answers again");
                }
                p.last_answer = Some(now);
                p.last_error = None;
            }
            Some(error) => {
                if p.last_error.is_none() {
                    tracing::warn!(node = %name, %error, "the provider's API server did not answer");
                }
                p.last_error = Some(error);
            }
        });
    }
}

/// An error with its sources: kube's own message ("client error (Connect)") hides the useful
/// part ("Connection refused") in the chain.
fn chain(error: &dyn std::error::Error) -> String {
    let mut out = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        let text = e.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = e.source();
    }
    out
}

/// One `GET /readyz`; an error unless the API server answers 2xx.
async fn readyz(client: &kube::Client) -> Result<String, kube::Error> {
    let request = http::Request::get("/readyz")
        .body(Vec::new())
        .map_err(kube::Error::HttpError)?;
    client.request_text(request).await
}
