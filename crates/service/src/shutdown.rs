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

    /// This handle, resolving also once `trigger` does (a process that must stop on its own, as
    /// a node agent whose driver changed under it).
    pub fn or(self, trigger: impl std::future::Future<Output = ()> + Send + 'static) -> Self {
        let (tx, rx) = tokio::sync::watch::channel(false);
        let signalled = self.wait();
        tokio::spawn(async move {
            tokio::select! {
                () = signalled => {}
                () = trigger => {}
            }
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

async fn first_of(mut term: Signal, mut int: Signal) {
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received, shutting down"),
        _ = int.recv() => tracing::info!("SIGINT received, shutting down"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_trigger_shuts_down_every_holder_and_a_pending_one_never_does() {
        let (fire, fired) = tokio::sync::oneshot::channel::<()>();
        let shutdown = Shutdown::on_signal().or(async move {
            let _ = fired.await;
        });
        let holder = shutdown.clone();
        let never = Shutdown::on_signal().or(std::future::pending());
        assert!(
            tokio::time::timeout(Duration::from_millis(50), holder.wait())
                .await
                .is_err(),
            "resolved before the trigger"
        );
        fire.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(5), holder.wait())
            .await
            .expect("the trigger shuts down");
        shutdown.wait().await;
        assert!(
            tokio::time::timeout(Duration::from_millis(50), never.wait())
                .await
                .is_err()
        );
    }
}
