//! The HTTPS accept loop the controller's servers share (the authentication service, the
//! admission webhook and the virtual kubelet API): TLS with a handshake deadline, HTTP/1 or 2,
//! the peer's address (and the client certificates it presented) in the request's extensions
//! for handlers that limit per source or authenticate callers.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use crate::Error;

/// The certificate chain the client presented in the TLS handshake, leaf first, in the
/// extensions of each request of that connection.
#[derive(Debug, Clone)]
pub struct PeerCertificates(pub Arc<Vec<rustls::pki_types::CertificateDer<'static>>>);

/// Binds `addr` for `what` and returns the bound address and the serving future, which runs
/// until `shutdown` is cancelled.
pub async fn serve(
    what: &'static str,
    addr: SocketAddr,
    tls: rustls::ServerConfig,
    app: Router,
    shutdown: CancellationToken,
) -> Result<(SocketAddr, impl Future<Output = ()> + use<>), Error> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(Error::io(format!("listening on {addr} for {what}")))?;
    let local = listener
        .local_addr()
        .map_err(Error::io(format!("reading the address of {what}")))?;
    let acceptor = TlsAcceptor::from(Arc::new(tls));
    let fut = async move {
        loop {
            let (tcp, peer) = tokio::select! {
                () = shutdown.cancelled() => break,
                r = listener.accept() => match r {
                    Ok(x) => x,
                    Err(e) => {
                        tracing::warn!(error = %e, "accepting a connection to {what} failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
            };
            let acceptor = acceptor.clone();
            let app = app.clone();
            tokio::spawn(async move {
                let tls = match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp))
                    .await
                {
                    Ok(Ok(t)) => t,
                    Ok(Err(e)) => {
                        tracing::debug!(%peer, error = %e, "TLS handshake with {what} failed");
                        return;
                    }
                    Err(_) => return,
                };
                let certificates = tls.get_ref().1.peer_certificates().map(|chain| {
                    PeerCertificates(Arc::new(
                        chain.iter().map(|c| c.clone().into_owned()).collect(),
                    ))
                });
                let svc = hyper::service::service_fn(
                    move |mut req: hyper::Request<hyper::body::Incoming>| {
                        req.extensions_mut().insert(ConnectInfo(peer));
                        if let Some(c) = &certificates {
                            req.extensions_mut().insert(c.clone());
                        }
                        let mut app = app.clone();
                        async move { tower::Service::call(&mut app, req).await }
                    },
                );
                let conn = hyper_util::server::conn::auto::Builder::new(
                    hyper_util::rt::TokioExecutor::new(),
                )
                .serve_connection_with_upgrades(hyper_util::rt::TokioIo::new(tls), svc)
                .await;
                if let Err(e) = conn {
                    tracing::debug!(%peer, error = %e, "a connection to {what} ended with an error");
                }
            });
        }
    };
    Ok((local, fut))
}
