//! `GET /containerLogs/{namespace}/{pod}/{container}` with the kubelet's options (`follow`,
//! `previous`, `timestamps`, `sinceSeconds`, `sinceTime`, `tailLines`, `limitBytes`), served
//! from the CRI-format files the agent writes; plus the file following that `attach` shares.

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse as _, Response};
use jiff::Timestamp;
use serde::Deserialize;
use tokio::io::{AsyncReadExt as _, AsyncSeekExt as _};

use super::{Endpoint, LiveLogs, text};
use crate::container_log::{self, Selection};

/// How often a follower looks for new output (the kubelet waits on inotify; polling keeps this
/// simple at a cost of this much latency).
const POLL: Duration = Duration::from_millis(100);

/// Largest piece read from a log file at once (entries are at most 16 KiB).
const CHUNK: u64 = 64 * 1024;

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct LogQuery {
    #[serde(default)]
    follow: bool,
    #[serde(default)]
    previous: bool,
    #[serde(default)]
    timestamps: bool,
    tail_lines: Option<u64>,
    limit_bytes: Option<u64>,
    since_seconds: Option<u64>,
    since_time: Option<String>,
}

impl LogQuery {
    fn selection(&self, now: Timestamp) -> Result<Selection, String> {
        let since = match (&self.since_time, self.since_seconds) {
            (Some(_), Some(_)) => {
                return Err("at most one of sinceTime or sinceSeconds may be specified".to_owned());
            }
            (Some(time), None) => Some(time.parse::<Timestamp>().map_err(|e| {
                format!(
                    "invalid sinceTime {time:?}: {e} (expected RFC 3339, e.g. 2025-01-02T03:04:05Z)"
                )
            })?),
            (None, Some(seconds)) => {
                let back =
                    jiff::SignedDuration::from_secs(i64::try_from(seconds).unwrap_or(i64::MAX));
                Some(now.checked_sub(back).unwrap_or(Timestamp::MIN))
            }
            (None, None) => None,
        };
        Ok(Selection {
            since,
            tail: self.tail_lines,
            timestamps: self.timestamps,
        })
    }
}

/// The directory of pod `namespace/pod` on this node, if it has one.
pub(super) fn pod_dir(state_dir: &Path, namespace: &str, pod: &str) -> Option<PathBuf> {
    // Namespace and pod names cannot contain '_', so the prefix is unambiguous; a pod recreated
    // under the same name has a new UID, and the newest directory is the live one.
    let prefix = format!("{namespace}_{pod}_");
    Some(
        std::fs::read_dir(state_dir.join("pods"))
            .ok()?
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
            .max_by_key(|e| e.metadata().and_then(|m| m.modified()).ok())?
            .path(),
    )
}

/// The log files of a container, oldest run first (`None`: it never started).
pub(super) fn runs(pod_dir: &Path, container: &str) -> Option<Vec<PathBuf>> {
    let mut runs: Vec<(u64, PathBuf)> = std::fs::read_dir(pod_dir.join(container))
        .ok()?
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let n = name.strip_suffix(".log")?.parse().ok()?;
            Some((n, e.path()))
        })
        .collect();
    runs.sort();
    Some(runs.into_iter().map(|(_, p)| p).collect())
}

pub(super) async fn container_logs(
    State(endpoint): State<Endpoint>,
    UrlPath((namespace, pod, container)): UrlPath<(String, String, String)>,
    Query(query): Query<LogQuery>,
) -> Response {
    let selection = match query.selection(Timestamp::now()) {
        Ok(selection) => selection,
        Err(message) => return text(StatusCode::BAD_REQUEST, message),
    };
    let Some(dir) = pod_dir(&endpoint.state_dir, &namespace, &pod) else {
        return text(
            StatusCode::NOT_FOUND,
            format!("pod {namespace}/{pod} does not exist on this node"),
        );
    };
    let Some(mut runs) = runs(&dir, &container) else {
        return text(
            StatusCode::BAD_REQUEST,
            format!("container {container:?} in pod {pod:?} is waiting to start"),
        );
    };
    if query.previous {
        runs.pop();
    }
    let Some(path) = runs.pop() else {
        let message = if query.previous {
            format!("previous terminated container {container:?} in pod {pod:?} not found")
        } else {
            format!("container {container:?} in pod {pod:?} is waiting to start")
        };
        return text(StatusCode::BAD_REQUEST, message);
    };
    let data = match tokio::fs::read(&path).await {
        Ok(data) => data,
        Err(e) => {
            return text(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("reading logs: {e}"),
            );
        }
    };
    let (_, consumed) = container_log::lines(&data);
    let mut first = container_log::select(&data[..consumed], &selection);
    let limit = query.limit_bytes.unwrap_or(u64::MAX);
    let done = first.len() as u64 >= limit || !query.follow || query.previous;
    first.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
    if done {
        return (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "text/plain")],
            first,
        )
            .into_response();
    }
    let budget = limit - first.len() as u64;
    let follow = Follow::new(path, consumed as u64, endpoint.live.clone());
    let stream = futures::stream::unfold(
        (Some(first), follow, budget),
        move |(first, mut follow, budget)| async move {
            if let Some(first) = first {
                return Some((
                    Ok::<_, std::io::Error>(bytes::Bytes::from(first)),
                    (None, follow, budget),
                ));
            }
            loop {
                if budget == 0 {
                    return None;
                }
                let chunk = follow.next().await?;
                let mut out = Vec::new();
                let (lines, _) = container_log::lines(&chunk);
                for entry in lines.into_iter().filter_map(container_log::parse) {
                    if selection.since.is_none_or(|since| entry.time >= since) {
                        container_log::render(&mut out, &entry, selection.timestamps);
                    }
                }
                out.truncate(usize::try_from(budget).unwrap_or(usize::MAX));
                if !out.is_empty() {
                    let n = out.len() as u64;
                    return Some((Ok(bytes::Bytes::from(out)), (None, follow, budget - n)));
                }
            }
        },
    );
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/plain")],
        Body::from_stream(stream),
    )
        .into_response()
}

/// Reads the complete entries appended to a log file after an offset, until the container run
/// that writes it has ended and everything it wrote was read.
#[derive(Debug)]
pub(super) struct Follow {
    path: PathBuf,
    offset: u64,
    /// The file the offset is in (a rotation puts a new file at the path).
    inode: Option<u64>,
    live: LiveLogs,
}

impl Follow {
    /// Follows `path` from `offset` (which must be the start of an entry).
    pub(super) fn new(path: PathBuf, offset: u64, live: LiveLogs) -> Self {
        Self {
            path,
            offset,
            inode: None,
            live,
        }
    }

    /// Follows from the end of what `path` holds now (the start of the entry being written).
    pub(super) async fn from_end(path: PathBuf, live: LiveLogs) -> std::io::Result<Self> {
        let data = tokio::fs::read(&path).await?;
        let (_, consumed) = container_log::lines(&data);
        Ok(Self::new(path, consumed as u64, live))
    }

    /// The next complete entries (file lines, each ending in a newline); `None` at the end.
    pub(super) async fn next(&mut self) -> Option<Vec<u8>> {
        loop {
            // Check liveness before reading, so the last output is never lost.
            let still_live = self.live.contains(&self.path);
            let meta = tokio::fs::metadata(&self.path).await.ok()?;
            if self.inode.is_some_and(|ino| ino != meta.ino()) || meta.len() < self.offset {
                // The writer rotated the file: the new one starts with a whole entry.
                self.offset = 0;
            }
            self.inode = Some(meta.ino());
            let chunk = read_from(&self.path, self.offset).await.ok()?;
            let (_, consumed) = container_log::lines(&chunk);
            if consumed > 0 {
                self.offset += consumed as u64;
                let mut chunk = chunk;
                chunk.truncate(consumed);
                return Some(chunk);
            }
            if !still_live {
                return None;
            }
            tokio::time::sleep(POLL).await;
        }
    }
}

async fn read_from(path: &Path, offset: u64) -> std::io::Result<Vec<u8>> {
    let mut file = tokio::fs::File::open(path).await?;
    file.seek(std::io::SeekFrom::Start(offset)).await?;
    let mut buf = Vec::new();
    file.take(CHUNK).read_to_end(&mut buf).await?;
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decodes a query the way the handler's extractor does.
    fn query(q: &str) -> LogQuery {
        let uri: http::Uri = format!("http://x/?{q}").parse().expect("uri");
        Query::<LogQuery>::try_from_uri(&uri).expect("query").0
    }

    #[test]
    fn since_options_become_a_start_time() {
        let now: Timestamp = "2025-01-02T03:04:05Z".parse().expect("time");
        let s = query("sinceSeconds=5&timestamps=true&tailLines=3")
            .selection(now)
            .expect("valid");
        assert_eq!(s.since, Some("2025-01-02T03:04:00Z".parse().expect("time")));
        assert_eq!(s.tail, Some(3));
        assert!(s.timestamps);
        let s = query("sinceTime=2025-01-01T00:00:00Z")
            .selection(now)
            .expect("valid");
        assert_eq!(s.since, Some("2025-01-01T00:00:00Z".parse().expect("time")));
        let e = query("sinceTime=yesterday")
            .selection(now)
            .expect_err("bad");
        assert!(e.starts_with("invalid sinceTime \"yesterday\""), "{e}");
        assert!(
            query("sinceTime=2025-01-01T00:00:00Z&sinceSeconds=1")
                .selection(now)
                .is_err()
        );
    }
}
