//! `node-labeler`: decides which GPU stack serves each node and writes it as node labels.

use std::net::SocketAddr;
use std::sync::Arc;

use api::AllocationMode;
use clap::Parser;
use node_labeler::controller::{self, Metrics, Settings};
use service::leader::{self, Election};
use service::logging::LogFormat;

/// Labels GPU nodes with their allocation mode and the deploy labels of the stack that serves them.
#[derive(Debug, Parser)]
#[command(name = "node-labeler", version)]
struct Args {
    /// Mode for new GPU nodes when both a GPUCluster and a ClusterPolicy exist: dra or device-plugin.
    #[arg(
        long,
        env = "DEFAULT_GPU_ALLOCATION_MODE",
        default_value = "device-plugin"
    )]
    default_gpu_allocation_mode: AllocationMode,
    /// Annotate GPU nodes with nvidia.com/gpu-driver-upgrade-enabled=true (driver auto-upgrade).
    #[arg(long, env = "DRIVER_AUTO_UPGRADE", default_value_t = false)]
    driver_auto_upgrade: bool,
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, env = "HTTP_ENDPOINT", default_value = "0.0.0.0:8080")]
    http_endpoint: SocketAddr,
    /// Elect one leader among replicas through a Lease.
    #[arg(long, env = "LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    leader_elect: bool,
    /// Namespace of the leader Lease (the pod's namespace).
    #[arg(long, env = "POD_NAMESPACE", default_value = "gpu-operator")]
    namespace: String,
    /// This replica's identity in the Lease (the pod's name).
    #[arg(long, env = "POD_NAME", default_value = "node-labeler")]
    identity: String,
    /// Log format: text or json.
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    service::logging::init(args.log_format);
    match run(args).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            eprintln!("node-labeler: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let client = service::kube_client("gpu-operator-node-labeler").await?;
    let metrics = Metrics::default();
    let mut registry = prometheus_client::registry::Registry::default();
    metrics.register(&mut registry);
    let health = service::http::Health::default();
    let shutdown = service::shutdown::Shutdown::on_signal();
    tokio::spawn(service::http::serve(
        args.http_endpoint,
        Arc::new(registry),
        health.clone(),
        shutdown.wait(),
    ));

    let election = args
        .leader_elect
        .then(|| Election::new(&args.namespace, "gpu-operator-node-labeler", &args.identity));
    // Ready while standing by too: a replica waiting for the Lease is healthy, and a rollout of
    // two replicas would otherwise never finish.
    health.set_ready(true);
    let work = async {
        controller::run(client.clone(), settings(&args), metrics, shutdown.wait()).await;
    };
    leader::lead(client.clone(), election, shutdown.wait(), work).await?;
    Ok(())
}

fn settings(args: &Args) -> Settings {
    Settings {
        default_mode: args.default_gpu_allocation_mode,
        driver_auto_upgrade: args.driver_auto_upgrade,
    }
}
