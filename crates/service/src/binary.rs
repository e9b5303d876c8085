//! The skeleton the binaries share: the exit code of a run, and the life of a leader-elected
//! controller process (metrics and health served, ready while standing by, work while leading,
//! stop on SIGTERM).

use std::error::Error;
use std::future::Future;
use std::net::SocketAddr;
use std::process::ExitCode;

use prometheus_client::registry::Registry;

use crate::http::{self, Health};
use crate::leader::{self, Election};
use crate::shutdown::Shutdown;

/// The exit code of a binary's run: success, or the error (with its causes) logged and printed on
/// stderr after the binary's name.
pub fn exit_code<E: std::fmt::Display>(binary: &str, result: Result<(), E>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{binary} failed: {e:#}");
            eprintln!("{binary}: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// How a controller process runs.
#[derive(Debug)]
pub struct Controller {
    /// The User-Agent of its API requests, also its name in logs.
    pub user_agent: &'static str,
    /// Address of /metrics, /healthz and /readyz.
    pub http_endpoint: SocketAddr,
    /// The Lease to lead through; `None` leads at once.
    pub election: Option<Election>,
}

impl Controller {
    /// Serves `registry` and health, then runs `work` (given the client and a shutdown future)
    /// once this replica leads, until SIGTERM or a lost lease. The process is ready while standing
    /// by too: a replica waiting for the Lease is healthy, and a rollout of two replicas would
    /// otherwise never finish.
    pub async fn run<W, F>(self, registry: Registry, work: W) -> Result<(), Box<dyn Error>>
    where
        W: FnOnce(kube::Client, Shutdown) -> F,
        F: Future<Output = ()>,
    {
        let client = crate::kube_client(self.user_agent).await?;
        let health = Health::default();
        let shutdown = Shutdown::on_signal();
        http::spawn(
            self.http_endpoint,
            registry,
            health.clone(),
            shutdown.wait(),
        );
        health.set_ready(true);
        let work = work(client.clone(), shutdown.clone());
        leader::lead(client, self.election, shutdown.wait(), work).await?;
        Ok(())
    }
}

/// Runs a controller's result stream to its end, logging failed reconciles and watch errors at
/// debug level (the error policy already logged what matters).
pub async fn drain_results<S, T, E>(results: S)
where
    S: futures::Stream<Item = Result<T, E>>,
    E: std::fmt::Display,
{
    use futures::StreamExt;
    results
        .for_each(|result| {
            if let Err(e) = result {
                tracing::debug!(error = %e, "controller event");
            }
            futures::future::ready(())
        })
        .await;
}
