//! The kubelet HTTPS endpoint the API server forwards `pods/log` to:
//! `GET /containerLogs/{namespace}/{pod}/{container}` with `follow`, `previous`, `tailLines`
//! and `limitBytes`, served from the log files the agent writes, under a self-signed certificate
//! (the API server's kubelet client does not verify it, as with a default kubelet).

use std::collections::HashSet;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse as _, Response};
use axum::routing::get;
use serde::Deserialize;
use tokio::io::{AsyncReadExt as _, AsyncSeekExt as _};
use tokio_util::sync::CancellationToken;

/// Log files that a running container still writes (a follow stream ends when its file leaves).
#[derive(Debug, Clone, Default)]
pub struct LiveLogs(Arc<Mutex<HashSet<PathBuf>>>);

impl LiveLogs {
    /// Marks `path` as being written.
    pub fn insert(&self, path: PathBuf) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(path);
    }

    /// Marks `path` as finished.
    pub fn remove(&self, path: &Path) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(path);
    }

    /// Whether `path` is still being written.
    pub fn contains(&self, path: &Path) -> bool {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(path)
    }
}

/// Why the endpoint could not start.
#[derive(Debug, thiserror::Error)]
pub enum KubeletError {
    /// The certificate could not be made.
    #[error("kubelet certificate: {0}")]
    Certificate(String),
}

/// A TLS configuration with a fresh self-signed certificate for `node` at `ip`.
pub fn tls_config(node: &str, ip: IpAddr) -> Result<Arc<rustls::ServerConfig>, KubeletError> {
    let err = |e: &dyn std::fmt::Display| KubeletError::Certificate(e.to_string());
    let certified = rcgen::generate_simple_self_signed(vec![node.to_owned(), ip.to_string()])
        .map_err(|e| err(&e))?;
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(certified.signing_key.serialize_der().into());
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| err(&e))?
        .with_no_client_auth()
        .with_single_cert(vec![certified.cert.der().clone()], key)
        .map_err(|e| err(&e))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

#[derive(Debug, Clone)]
struct Endpoint {
    state_dir: PathBuf,
    live: LiveLogs,
}

/// The endpoint's routes.
pub fn router(state_dir: PathBuf, live: LiveLogs) -> Router {
    Router::new()
        .route(
            "/containerLogs/{namespace}/{pod}/{container}",
            get(container_logs),
        )
        .route("/healthz", get(|| async { "ok" }))
        .with_state(Endpoint { state_dir, live })
}

/// Serves `router` over TLS on `listener` until `shutdown`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    tls: Arc<rustls::ServerConfig>,
    shutdown: CancellationToken,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let accepted = tokio::select! {
            () = shutdown.cancelled() => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            accepted = listener.accept() => accepted,
        };
        let Ok((tcp, peer)) = accepted else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let acceptor = acceptor.clone();
        let router = router.clone();
        let shutdown = shutdown.clone();
        connections.spawn(async move {
            let handshake = tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp));
            let Ok(Ok(tls)) = handshake.await else {
                tracing::debug!(%peer, "kubelet TLS handshake failed");
                return;
            };
            let service =
                hyper::service::service_fn(move |request: http::Request<hyper::body::Incoming>| {
                    use tower::ServiceExt as _;
                    router.clone().oneshot(request.map(Body::new))
                });
            let builder =
                hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
            let connection =
                builder.serve_connection_with_upgrades(hyper_util::rt::TokioIo::new(tls), service);
            tokio::select! {
                _ = connection => {}
                () = shutdown.cancelled() => {}
            }
        });
    }
    connections.abort_all();
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct LogQuery {
    #[serde(default)]
    follow: bool,
    #[serde(default)]
    previous: bool,
    tail_lines: Option<u64>,
    limit_bytes: Option<u64>,
}

fn text(status: StatusCode, message: String) -> Response {
    (status, [(header::CONTENT_TYPE, "text/plain")], message).into_response()
}

/// The log files of a container, oldest run first.
fn runs(state_dir: &Path, namespace: &str, pod: &str, container: &str) -> Option<Vec<PathBuf>> {
    // Namespace and pod names cannot contain '_', so the prefix is unambiguous; a pod recreated
    // under the same name has a new UID, and the newest directory is the live one.
    let prefix = format!("{namespace}_{pod}_");
    let dir = std::fs::read_dir(state_dir.join("pods"))
        .ok()?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .max_by_key(|e| e.metadata().and_then(|m| m.modified()).ok())?
        .path()
        .join(container);
    let mut runs: Vec<(u64, PathBuf)> = std::fs::read_dir(dir)
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

/// The last `lines` lines of `data`.
pub fn tail(data: &[u8], lines: u64) -> &[u8] {
    if lines == 0 {
        return &[];
    }
    let body = data.strip_suffix(b"\n").unwrap_or(data);
    let mut seen = 0;
    for (i, b) in body.iter().enumerate().rev() {
        if *b == b'\n' {
            seen += 1;
            if seen == lines {
                return &data[i + 1..];
            }
        }
    }
    data
}

async fn container_logs(
    State(endpoint): State<Endpoint>,
    UrlPath((namespace, pod, container)): UrlPath<(String, String, String)>,
    Query(query): Query<LogQuery>,
) -> Response {
    let Some(mut runs) = runs(&endpoint.state_dir, &namespace, &pod, &container) else {
        return text(
            StatusCode::NOT_FOUND,
            format!(
                "container {container:?} in pod {namespace}/{pod} is not on this node or has not started"
            ),
        );
    };
    if query.previous {
        runs.pop();
    }
    let Some(path) = runs.pop() else {
        let which = if query.previous {
            "previous terminated"
        } else {
            "started"
        };
        return text(
            StatusCode::BAD_REQUEST,
            format!("container {container:?} in pod {namespace}/{pod}: no {which} container found"),
        );
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
    let mut start = query
        .tail_lines
        .map_or(data.as_slice(), |n| tail(&data, n))
        .to_vec();
    let limit = query.limit_bytes.unwrap_or(u64::MAX);
    if start.len() as u64 >= limit || !query.follow || query.previous {
        start.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
        return (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "text/plain")],
            start,
        )
            .into_response();
    }
    let offset = data.len() as u64;
    let live = endpoint.live.clone();
    let budget = limit - start.len() as u64;
    let stream = futures::stream::unfold(
        (Some(start), offset, budget, path, live),
        |(first, offset, budget, path, live)| async move {
            if let Some(first) = first {
                return Some((
                    Ok::<_, std::io::Error>(bytes::Bytes::from(first)),
                    (None, offset, budget, path, live),
                ));
            }
            loop {
                if budget == 0 {
                    return None;
                }
                // Check liveness before reading, so the last output is never lost.
                let still_live = live.contains(&path);
                let chunk = read_from(&path, offset, budget).await;
                match chunk {
                    Ok(chunk) if !chunk.is_empty() => {
                        let n = chunk.len() as u64;
                        return Some((
                            Ok(bytes::Bytes::from(chunk)),
                            (None, offset + n, budget - n, path, live),
                        ));
                    }
                    Ok(_) if still_live => tokio::time::sleep(Duration::from_millis(100)).await,
                    _ => return None,
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

async fn read_from(path: &Path, offset: u64, budget: u64) -> std::io::Result<Vec<u8>> {
    let mut file = tokio::fs::File::open(path).await?;
    file.seek(std::io::SeekFrom::Start(offset)).await?;
    let mut buf = Vec::new();
    file.take(budget.min(64 * 1024))
        .read_to_end(&mut buf)
        .await?;
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_counts_lines_from_the_end() {
        assert_eq!(tail(b"a\nb\nc\n", 2), b"b\nc\n");
        assert_eq!(tail(b"a\nb\nc", 2), b"b\nc");
        assert_eq!(tail(b"a\nb\n", 5), b"a\nb\n");
        assert_eq!(tail(b"a\nb\n", 0), b"");
        assert_eq!(tail(b"", 3), b"");
    }
}
