//! Watch streams: newline-delimited JSON events replayed from the event ring or a snapshot, then
//! live; selector transitions (leaving → DELETED, entering → ADDED); periodic BOOKMARKs; streaming
//! lists (`sendInitialEvents`) ending with the `k8s.io/initial-events-end` bookmark; a too-old
//! resourceVersion answered as HTTP 200 plus an in-stream ERROR 410 (the form the kube-rs watcher
//! recovers from); timeouts; slow consumers cut off.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http::{HeaderValue, StatusCode, header};
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc};

use crate::error::{ApiError, Cause};
use crate::http::{Query, Repr, Selectors, ServerState};
use crate::registry::ResourceType;
use crate::store::{Event, EventType, Expired, WatchStart};
use crate::table::{self, IncludeObject};

/// Lines buffered between the watch task and the HTTP body.
const LINE_BUFFER: usize = 32;
/// A client that does not read an event for this long is cut off.
const SEND_TIMEOUT: Duration = Duration::from_secs(30);
/// The annotation marking the end of a streaming list's initial events.
pub const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

/// How one watch renders and filters events.
struct Shape {
    rt: Arc<ResourceType>,
    namespace: Option<String>,
    selectors: Selectors,
    repr: Repr,
    include: IncludeObject,
}

impl Shape {
    fn visible(&self, obj: &Value) -> bool {
        if let Some(ns) = &self.namespace
            && obj["metadata"]["namespace"].as_str() != Some(ns.as_str())
        {
            return false;
        }
        self.selectors.matches(obj)
    }

    fn line(&self, kind: &str, obj: &Value) -> Bytes {
        let mut out = Vec::with_capacity(512);
        out.extend_from_slice(b"{\"type\":\"");
        out.extend_from_slice(kind.as_bytes());
        out.extend_from_slice(b"\",\"object\":");
        let written = match self.repr {
            Repr::Json => match crate::http::to_served(&self.rt, obj) {
                Some(o) => serde_json::to_writer(&mut out, &o),
                None => serde_json::to_writer(&mut out, obj),
            },
            Repr::Metadata => serde_json::to_writer(
                &mut out,
                &json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"]}),
            ),
            Repr::Table => {
                serde_json::to_writer(&mut out, &table::row(&self.rt, obj, self.include))
            }
        };
        if written.is_err() {
            out.truncate(0);
            return Bytes::new();
        }
        out.extend_from_slice(b"}\n");
        Bytes::from(out)
    }

    fn bookmark(&self, rv: u64, initial_end: bool) -> Bytes {
        let mut meta = json!({"resourceVersion": rv.to_string()});
        if initial_end {
            meta["annotations"] = json!({INITIAL_EVENTS_END: "true"});
        }
        let obj = match self.repr {
            Repr::Metadata => {
                json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": meta})
            }
            _ => {
                json!({"kind": self.rt.kind, "apiVersion": self.rt.api_version(), "metadata": meta})
            }
        };
        let mut out =
            serde_json::to_vec(&json!({"type": "BOOKMARK", "object": obj})).unwrap_or_default();
        out.push(b'\n');
        Bytes::from(out)
    }

    /// The line an event becomes for this watcher, with selector transitions; `None` when the
    /// watcher does not see it.
    fn event_line(&self, ev: &Event) -> Option<Bytes> {
        match ev.kind {
            EventType::Added => self
                .visible(&ev.object)
                .then(|| self.line("ADDED", &ev.object)),
            EventType::Deleted => self
                .visible(&ev.object)
                .then(|| self.line("DELETED", &ev.object)),
            EventType::Modified => {
                let was = ev.prev.as_deref().is_some_and(|p| self.visible(p));
                let is = self.visible(&ev.object);
                match (was, is) {
                    (true, true) => Some(self.line("MODIFIED", &ev.object)),
                    (true, false) => Some(self.line("DELETED", &ev.object)),
                    (false, true) => Some(self.line("ADDED", &ev.object)),
                    (false, false) => None,
                }
            }
        }
    }
}

fn expired_line(e: Expired) -> Bytes {
    let status = ApiError::gone(format!(
        "too old resource version: {} ({})",
        e.requested, e.oldest
    ))
    .to_status();
    let mut out =
        serde_json::to_vec(&json!({"type": "ERROR", "object": status})).unwrap_or_default();
    out.push(b'\n');
    Bytes::from(out)
}

fn invalid_watch(field: &str, value: &str, detail: &str) -> ApiError {
    ApiError::invalid(
        "meta.k8s.io",
        "ListOptions",
        "",
        &[Cause {
            reason: "FieldValueForbidden".into(),
            message: format!("Forbidden: {detail} (got {value:?})"),
            field: field.into(),
        }],
    )
}

/// Starts a watch on a type and answers with the streaming response.
pub fn serve(
    state: &Arc<ServerState>,
    rt: &Arc<ResourceType>,
    namespace: Option<&str>,
    query: &Query,
    repr: Repr,
) -> Result<Response, ApiError> {
    let selectors = Selectors::parse(query, rt)?;
    let bookmarks = query.flag("allowWatchBookmarks")?;
    let send_initial = match query.get("sendInitialEvents") {
        None | Some("") => None,
        Some(_) => Some(query.flag("sendInitialEvents")?),
    };
    let rv_match = query.get("resourceVersionMatch").filter(|m| !m.is_empty());
    match (send_initial, rv_match) {
        (Some(_), Some("NotOlderThan")) => {}
        (Some(_), other) => {
            return Err(invalid_watch(
                "resourceVersionMatch",
                other.unwrap_or_default(),
                "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
            ));
        }
        (None, Some(m)) => {
            return Err(invalid_watch(
                "resourceVersionMatch",
                m,
                "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
            ));
        }
        (None, None) => {}
    }
    if send_initial == Some(true) && !bookmarks {
        return Err(invalid_watch(
            "allowWatchBookmarks",
            "false",
            "allowWatchBookmarks must be set to true when sendInitialEvents is set",
        ));
    }
    let rv = match query.get("resourceVersion") {
        None | Some("") | Some("0") => None,
        Some(s) => Some(
            s.parse::<u64>()
                .map_err(|_| ApiError::bad_request(format!("invalid resource version: {s}")))?,
        ),
    };
    let timeout = match query.int("timeoutSeconds")? {
        Some(s) if s > 0 => Duration::from_secs(s as u64),
        _ => state.config.default_watch_timeout,
    };
    let shape = Shape {
        rt: rt.clone(),
        namespace: namespace.map(str::to_owned),
        selectors,
        repr,
        include: IncludeObject::parse(query.get("includeObject")),
    };
    let key = ServerState::type_key(rt);
    // Streaming lists always start with the current state; otherwise unset or "0" does.
    let since = if send_initial == Some(true) { None } else { rv };
    let start = state.store.watch(&key, since);
    let (tx, rx) = mpsc::channel::<Result<Bytes, Infallible>>(LINE_BUFFER);
    let breaker = state.watch_breaker.subscribe();
    let state2 = state.clone();
    let interval = state.config.bookmark_interval;
    let counted = state.metrics.watch_started(&rt.group, &rt.plural);
    tokio::spawn(async move {
        let _counted = counted;
        match start {
            Err(e) => {
                let _ = tx.send(Ok(expired_line(e))).await;
            }
            Ok(start) => {
                let opts = Run {
                    bookmarks,
                    initial_end: send_initial == Some(true),
                    timeout,
                    interval,
                };
                run(&state2, shape, start, tx, breaker, opts).await;
            }
        }
    });
    let body = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
    let mut resp = Response::new(body);
    *resp.status_mut() = StatusCode::OK;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp.headers_mut().insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache, private"),
    );
    Ok(resp)
}

struct Run {
    bookmarks: bool,
    initial_end: bool,
    timeout: Duration,
    interval: Duration,
}

async fn send(tx: &mpsc::Sender<Result<Bytes, Infallible>>, line: Bytes) -> bool {
    if line.is_empty() {
        return true;
    }
    matches!(
        tokio::time::timeout(SEND_TIMEOUT, tx.send(Ok(line))).await,
        Ok(Ok(()))
    )
}

async fn run(
    state: &ServerState,
    shape: Shape,
    start: WatchStart,
    tx: mpsc::Sender<Result<Bytes, Infallible>>,
    mut breaker: tokio::sync::watch::Receiver<u64>,
    opts: Run,
) {
    let WatchStart {
        snapshot,
        replay,
        mut rx,
        rv,
    } = start;
    let deadline = tokio::time::Instant::now() + opts.timeout;
    let mut last_rv = rv;
    for obj in &snapshot {
        if shape.visible(obj) && !send(&tx, shape.line("ADDED", obj)).await {
            return;
        }
    }
    if opts.initial_end && !send(&tx, shape.bookmark(rv, true)).await {
        return;
    }
    drop(snapshot);
    for ev in &replay {
        if let Some(line) = shape.event_line(ev)
            && !send(&tx, line).await
        {
            return;
        }
    }
    drop(replay);
    let mut tick =
        tokio::time::interval_at(tokio::time::Instant::now() + opts.interval, opts.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            _ = breaker.changed() => return,
            () = tx.closed() => return,
            () = tokio::time::sleep_until(deadline) => {
                if opts.bookmarks {
                    let rv = drain(state, &shape, &mut rx, &tx, &mut last_rv).await;
                    if let Some(rv) = rv {
                        let _ = send(&tx, shape.bookmark(rv, false)).await;
                    }
                }
                return;
            }
            _ = tick.tick(), if opts.bookmarks => {
                match drain(state, &shape, &mut rx, &tx, &mut last_rv).await {
                    Some(rv) => {
                        if !send(&tx, shape.bookmark(rv, false)).await {
                            return;
                        }
                    }
                    None => return,
                }
            }
            received = rx.recv() => match received {
                Ok(ev) => {
                    last_rv = ev.rv;
                    if let Some(line) = shape.event_line(&ev)
                        && !send(&tx, line).await
                    {
                        return;
                    }
                }
                // Fell behind the broadcast buffer: cut off, the client resumes or re-lists.
                Err(broadcast::error::RecvError::Lagged(_) | broadcast::error::RecvError::Closed) => return,
            },
        }
    }
}

/// Delivers every event already broadcast, then answers the RV a bookmark may carry (every
/// event of this type up to it has been delivered); `None` if the watch must end.
async fn drain(
    state: &ServerState,
    shape: &Shape,
    rx: &mut broadcast::Receiver<Arc<Event>>,
    tx: &mpsc::Sender<Result<Bytes, Infallible>>,
    last_rv: &mut u64,
) -> Option<u64> {
    let published = state.store.current_rv();
    loop {
        match rx.try_recv() {
            Ok(ev) => {
                *last_rv = ev.rv;
                if let Some(line) = shape.event_line(&ev)
                    && !send(tx, line).await
                {
                    return None;
                }
            }
            Err(broadcast::error::TryRecvError::Empty) => break,
            Err(_) => return None,
        }
    }
    Some(published.max(*last_rv))
}
