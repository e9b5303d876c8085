//! `kubectl gpu`: the planes, hand-overs, GPUs and claims of a cluster the product serves. kubectl
//! runs it as a plugin (`kubectl-gpu` on the `PATH`); it reads the cluster with the current
//! kubeconfig and writes nothing.

mod claims;
mod cluster;
mod migration;
mod nodes;
mod table;
mod why;

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::{Parser, Subcommand, ValueEnum};
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, Client};
use serde::Serialize;

use crate::cluster::Cluster;
use crate::table::render;

/// The planes, hand-overs, GPUs and claims of a cluster the GPU operator serves.
#[derive(Debug, Parser)]
#[command(name = "kubectl gpu", version)]
struct Cli {
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = Output::Table, global = true)]
    output: Output,
    #[command(subcommand)]
    view: View,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Output {
    /// Aligned columns, in colour on a terminal.
    Table,
    /// JSON (one document per refresh with `--watch`).
    Json,
}

#[derive(Debug, Subcommand)]
enum View {
    /// Each GPU node: its plane, hand-over, GPUs healthy of total, and GPUs in use.
    Nodes,
    /// Each claim on our GPUs: its pods, node, device, GPU UUID, product and partition.
    Claims {
        /// Only this namespace's claims (every namespace by default).
        #[arg(short, long)]
        namespace: Option<String>,
        /// Also the operands' admin-access claims (DCGM, the validator).
        #[arg(long)]
        admin: bool,
    },
    /// How far a move between the planes is: nodes done, and each other node's step and blocker.
    Migration {
        /// Keep showing it until the migration completes (exit 0) or `--timeout` passes (exit 1).
        #[arg(short, long)]
        watch: bool,
        /// How long `--watch` waits at most (`90s`, `10m`; 0 for ever).
        #[arg(long, default_value = "0", value_parser = parse_duration)]
        timeout: Duration,
        /// How often `--watch` reads the cluster.
        #[arg(long, default_value = "2s", value_parser = parse_duration)]
        interval: Duration,
    },
    /// What a pod holds of the GPUs, or why it waits for them.
    Why {
        /// The pod.
        pod: String,
        /// Its namespace (the kubeconfig's by default).
        #[arg(short, long)]
        namespace: Option<String>,
    },
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("kubectl gpu: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let client = Client::try_default()
        .await
        .map_err(|e| anyhow::anyhow!("no cluster to read (the kubeconfig kubectl uses): {e}"))?;
    let colour = std::io::stdout().is_terminal();
    let json = cli.output == Output::Json;
    match cli.view {
        View::Nodes => {
            let rows = nodes::rows(&Cluster::read(&client).await?);
            if json {
                print_json(&rows)?;
            } else {
                print!(
                    "{}",
                    render(&nodes::HEADERS, &nodes::table_rows(&rows, now()), colour)
                );
            }
        }
        View::Claims { namespace, admin } => {
            let mut devices = claims::claim_devices(&Cluster::read(&client).await?, admin);
            devices.retain(|d| namespace.as_ref().is_none_or(|ns| &d.namespace == ns));
            if json {
                print_json(&devices)?;
            } else {
                print!(
                    "{}",
                    render(&claims::HEADERS, &claims::table_rows(&devices), colour)
                );
            }
        }
        View::Migration {
            watch,
            timeout,
            interval,
        } => return watch_migration(&client, watch, timeout, interval, json, colour).await,
        View::Why { pod, namespace } => {
            let ns = namespace.unwrap_or_else(|| client.default_namespace().to_owned());
            let found = Api::<Pod>::namespaced(client.clone(), &ns)
                .get_opt(&pod)
                .await?
                .ok_or_else(|| anyhow::anyhow!("pod {ns}/{pod} not found"))?;
            let answer = why::answer(&found, &Cluster::read(&client).await?);
            if json {
                print_json(&answer)?;
            } else {
                for line in &answer.lines {
                    println!("{line}");
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Shows the migration once, or with `watch` every `interval` until it completes or `timeout`
/// passes. Off a terminal, a refresh is printed only when something other than the clock changed.
async fn watch_migration(
    client: &Client,
    watch: bool,
    timeout: Duration,
    interval: Duration,
    json: bool,
    colour: bool,
) -> anyhow::Result<ExitCode> {
    let started = Instant::now();
    let mut last: Option<migration::Progress> = None;
    loop {
        let progress = migration::progress(&Cluster::read(client).await?);
        if !watch || last.as_ref() != Some(&progress) || colour {
            if json {
                println!("{}", serde_json::to_string(&progress)?);
            } else {
                let mut frame = migration::summary(&progress);
                frame.push('\n');
                if !progress.pending.is_empty() {
                    let rows = migration::table_rows(&progress, now());
                    frame.push_str(&render(&migration::HEADERS, &rows, colour));
                }
                if watch && colour {
                    // Redraw in place, like `watch`.
                    print!("\x1b[H\x1b[2J");
                } else if watch && last.is_some() {
                    println!();
                }
                print!("{frame}");
            }
        }
        if !watch || progress.complete() {
            return Ok(ExitCode::SUCCESS);
        }
        last = Some(progress);
        if !timeout.is_zero() && started.elapsed() >= timeout {
            eprintln!(
                "kubectl gpu: the migration is not complete after {}",
                table::age(i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX))
            );
            return Ok(ExitCode::FAILURE);
        }
        tokio::time::sleep(interval).await;
    }
}

fn print_json<T: Serialize>(value: &T) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

fn now() -> i64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(since.as_secs()).unwrap_or(i64::MAX)
}

/// `90s`, `10m`, `1h`, or plain seconds.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (digits, unit) = text.split_at(text.trim_end_matches(char::is_alphabetic).len());
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a duration such as 90s, 10m or 1h"))?;
    let seconds = match unit {
        "" | "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        _ => return Err(format!("{text:?}: the unit is s, m or h")),
    };
    Ok(Duration::from_secs(seconds))
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn durations_take_seconds_minutes_and_hours() {
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("2"), Ok(Duration::from_secs(2)));
        assert!(parse_duration("5d").unwrap_err().contains("unit"));
        assert!(parse_duration("soon").is_err());
    }

    #[test]
    fn the_command_line_parses_as_documented() {
        Cli::command().debug_assert();
        let cli = Cli::try_parse_from([
            "kubectl-gpu",
            "migration",
            "--watch",
            "--timeout",
            "2m",
            "-o",
            "json",
        ])
        .unwrap();
        assert_eq!(cli.output, Output::Json);
        assert!(
            matches!(cli.view, View::Migration { watch: true, timeout, .. } if timeout == Duration::from_secs(120))
        );
    }
}
