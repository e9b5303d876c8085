//! `dra-driver-validator`: the init container of the plugin pods (`driver`), the main container of
//! `nvidia-dra-validator` pods (`workload`) and of `nvidia-operator-validator` pods on
//! device-plugin nodes (`plugin`, which runs `workload` once in a pod of its own).
//!
//! Exit codes: 0 when the check passed (for `workload` and `plugin`, after a clean SIGTERM stop), 1 with one
//! line on stderr saying what is wrong and where it looked, 143 when SIGTERM ended a `driver` wait.
#![forbid(unsafe_code)]

mod cli;
mod driver;
mod plugin;
mod retry;
mod workload;

use clap::Parser;
use std::io::IsTerminal;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(&format!("cannot start the async runtime: {e}")),
    };
    runtime.block_on(run(cli))
}

async fn run(cli: cli::Cli) -> ExitCode {
    // Signal handlers are installed before any check runs, so a SIGTERM during the first wait is
    // never the default (killing) action.
    let shutdown = std::pin::pin!(termination(signals()));
    match &cli.command {
        cli::Command::Driver(args) => match driver::run(&cli.common, args, shutdown).await {
            Ok(found) => {
                tracing::info!(
                    "driver {} found in {} ({:?} driver, {} GPU(s)); wrote {}",
                    found.driver_version,
                    found.root.paths.driver_root_ctr.display(),
                    found.root.location,
                    found
                        .gpus
                        .map_or_else(|| "GPU init skipped".to_owned(), |n| n.to_string()),
                    cli.common
                        .output_dir
                        .join(gpu_discovery::driver_ready::FILE_NAME)
                        .display(),
                );
                ExitCode::SUCCESS
            }
            Err(retry::CommandError::Terminated) => {
                tracing::info!("terminated before the driver was found");
                ExitCode::from(143)
            }
            Err(e) => fail(&e.to_string()),
        },
        cli::Command::Workload(args) => match workload::run(&cli.common, args, shutdown).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => fail(&e.to_string()),
        },
        cli::Command::Plugin(args) => match plugin::run(&cli.common, args, shutdown).await {
            Ok(()) | Err(retry::CommandError::Terminated) => ExitCode::SUCCESS,
            Err(e) => fail(&e.to_string()),
        },
    }
}

fn fail(message: &str) -> ExitCode {
    eprintln!("dra-driver-validator: {message}");
    ExitCode::FAILURE
}

type Signals = std::io::Result<(tokio::signal::unix::Signal, tokio::signal::unix::Signal)>;

fn signals() -> Signals {
    use tokio::signal::unix::{SignalKind, signal};
    Ok((
        signal(SignalKind::terminate())?,
        signal(SignalKind::interrupt())?,
    ))
}

/// Resolves on SIGTERM or SIGINT.
async fn termination(signals: Signals) {
    match signals {
        Ok((mut term, mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        Err(e) => {
            tracing::warn!("cannot watch SIGTERM/SIGINT ({e}); waits end only at their timeout");
            std::future::pending::<()>().await;
        }
    }
}
