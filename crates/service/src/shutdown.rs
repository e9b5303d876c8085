//! Graceful shutdown.

/// Resolves when the process receives SIGTERM or SIGINT.
pub async fn signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("installing a SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("installing a SIGINT handler");
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received, shutting down"),
        _ = int.recv() => tracing::info!("SIGINT received, shutting down"),
    }
}

/// A cloneable handle that resolves, in every holder, once SIGTERM or SIGINT arrives.
#[derive(Clone, Debug)]
pub struct Shutdown(tokio::sync::watch::Receiver<bool>);

impl Shutdown {
    /// Starts listening for the signals (needs a tokio runtime).
    pub fn on_signal() -> Self {
        let (tx, rx) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            signal().await;
            let _ = tx.send(true);
        });
        Shutdown(rx)
    }

    /// Resolves once shutdown was requested.
    pub fn wait(&self) -> impl std::future::Future<Output = ()> + Send + Sync + use<> {
        let mut rx = self.0.clone();
        async move {
            let _ = rx.wait_for(|stop| *stop).await;
        }
    }
}
