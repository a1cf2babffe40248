//! A process-wide shutdown signal: cancelled on Ctrl-C, SIGTERM, or by any task that fails.

use tokio_util::sync::CancellationToken;

/// A cloneable shutdown token. Tasks await [`Shutdown::cancelled`]; anyone may trigger it.
#[derive(Clone, Debug, Default)]
pub struct Shutdown {
    token: CancellationToken,
}

impl Shutdown {
    /// A token that only fires when [`Shutdown::trigger`] is called.
    pub fn new() -> Self {
        Self::default()
    }

    /// A token that also fires on Ctrl-C (SIGINT) or SIGTERM. Must be called inside a runtime.
    pub fn on_signals() -> std::io::Result<Self> {
        let this = Self::new();
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let token = this.token.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => tracing::info!("received Ctrl-C, shutting down"),
                _ = term.recv() => tracing::info!("received SIGTERM, shutting down"),
                () = token.cancelled() => return,
            }
            token.cancel();
        });
        Ok(this)
    }

    /// Starts the shutdown. Idempotent.
    pub fn trigger(&self) {
        self.token.cancel();
    }

    /// Whether shutdown has started (for synchronous loops that poll).
    pub fn is_triggered(&self) -> bool {
        self.token.is_cancelled()
    }

    /// Resolves once shutdown has started.
    pub async fn cancelled(&self) {
        self.token.cancelled().await;
    }

    /// The underlying token, for APIs that take one.
    pub fn token(&self) -> CancellationToken {
        self.token.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn trigger_wakes_waiters() {
        let s = Shutdown::new();
        let waiter = tokio::spawn({
            let s = s.clone();
            async move { s.cancelled().await }
        });
        assert!(!s.is_triggered());
        s.trigger();
        tokio::time::timeout(std::time::Duration::from_secs(1), waiter)
            .await
            .expect("waiter must wake")
            .expect("task ok");
        assert!(s.is_triggered());
    }
}
