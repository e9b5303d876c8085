//! `gpu-node-discovery`: labels its own node with the GPUs found on it (see the library's docs).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use api::contract::env;
use clap::Parser;
use gpu_discovery::ProbeSettings;
use gpu_discovery::root::{
    DEFAULT_DRIVER_INSTALL_DIR, DEFAULT_DRIVER_INSTALL_DIR_CTR_PATH, DEFAULT_HOST_ROOT,
};
use node_discovery::agent::{Agent, Metrics};
use node_discovery::scan::Scanner;
use prometheus_client::registry::Registry;
use service::http::{self, Health};
use service::logging::LogFormat;
use service::shutdown::Shutdown;

const NAME: &str = "gpu-node-discovery";

/// Finds this node's NVIDIA GPUs (PCI, then NVML) and labels the node with NFD's and GPU feature
/// discovery's label names.
#[derive(Debug, Parser)]
#[command(name = NAME, version)]
struct Cli {
    /// The node this agent runs on (the downward API's `spec.nodeName`).
    #[arg(long, env = env::NODE_NAME)]
    node_name: String,
    /// Where the host's sysfs is mounted in this container.
    #[arg(long, env = env::SYSFS_ROOT, default_value = "/host/sys")]
    sysfs_root: PathBuf,
    /// Where the host's `/` is mounted in this container (driver probing).
    #[arg(long, env = env::HOST_ROOT, default_value = DEFAULT_HOST_ROOT)]
    host_root: PathBuf,
    /// Host path of a containerized driver's root.
    #[arg(long, env = env::DRIVER_INSTALL_DIR, default_value = DEFAULT_DRIVER_INSTALL_DIR)]
    driver_install_dir: PathBuf,
    /// Where that root is mounted in this container.
    #[arg(long, env = env::DRIVER_INSTALL_DIR_CTR_PATH, default_value = DEFAULT_DRIVER_INSTALL_DIR_CTR_PATH)]
    driver_install_dir_ctr_path: PathBuf,
    /// Seconds between two scans (a GPU or driver added later is found within one).
    #[arg(long, env = env::DISCOVERY_INTERVAL_SECONDS, default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    interval_seconds: u64,
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, env = env::HTTP_ENDPOINT, default_value = "0.0.0.0:8080")]
    http_endpoint: SocketAddr,
    /// Log format.
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    service::logging::init(cli.log_format);
    // One thread: the agent does one small thing at a time, and a node agent on every node should
    // cost little memory.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    let result = match runtime {
        Ok(runtime) => runtime.block_on(run(cli)),
        Err(e) => Err(e.into()),
    };
    service::binary::exit_code(NAME, result)
}

async fn run(cli: Cli) -> Result<(), Box<dyn std::error::Error>> {
    let client = service::kube_client(NAME).await?;
    let mut registry = Registry::default();
    let metrics = Metrics::default();
    metrics.register(&mut registry);
    let health = Health::default();
    let shutdown = Shutdown::on_signal();
    http::spawn(cli.http_endpoint, registry, health.clone(), shutdown.wait());
    let agent = Agent {
        scanner: Scanner::new(
            cli.sysfs_root,
            ProbeSettings {
                host_root: cli.host_root,
                driver_install_dir: cli.driver_install_dir,
                driver_install_dir_ctr_path: cli.driver_install_dir_ctr_path,
            },
        ),
        node: cli.node_name,
        interval: Duration::from_secs(cli.interval_seconds),
        metrics,
    };
    tracing::info!(node = %agent.node, interval = ?agent.interval, "discovering GPUs");
    agent.run(client, health, shutdown).await;
    Ok(())
}
