//! Graceful shutdown: one [`Shutdown`] handle per process, resolving in every holder once SIGTERM
//! or SIGINT arrives.

use tokio::signal::unix::{Signal, SignalKind, signal};

/// A cloneable handle that resolves, in every holder, once SIGTERM or SIGINT arrives.
#[derive(Clone, Debug)]
pub struct Shutdown(tokio::sync::watch::Receiver<bool>);

impl Shutdown {
    /// Installs the SIGTERM and SIGINT handlers now (so a signal arriving from here on never
    /// takes its default, killing action) and listens for them (needs a tokio runtime). Where a
    /// handler cannot be installed, that is logged and the handle never resolves.
    pub fn on_signal() -> Self {
        let (tx, rx) = tokio::sync::watch::channel(false);
        let handlers = signal(SignalKind::terminate())
            .and_then(|term| Ok((term, signal(SignalKind::interrupt())?)));
        tokio::spawn(async move {
            match handlers {
                Ok((term, int)) => {
                    first_of(term, int).await;
                    let _ = tx.send(true);
                }
                Err(error) => {
                    tracing::error!(%error, "cannot watch SIGTERM/SIGINT; shutting down gracefully is not possible");
                    // The sender stays, so holders wait rather than stop.
                    let _keep = tx;
                    std::future::pending::<()>().await;
                }
            }
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

async fn first_of(mut term: Signal, mut int: Signal) {
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received, shutting down"),
        _ = int.recv() => tracing::info!("SIGINT received, shutting down"),
    }
}
