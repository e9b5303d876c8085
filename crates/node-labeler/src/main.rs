//! `node-labeler`: decides which GPU stack serves each node and writes it as node labels.

use std::net::SocketAddr;

use api::AllocationMode;
use clap::Parser;
use node_labeler::controller::{self, Metrics, Settings};
use service::leader::Election;
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
    service::binary::exit_code("node-labeler", run(args).await)
}

async fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let metrics = Metrics::default();
    let mut registry = prometheus_client::registry::Registry::default();
    metrics.register(&mut registry);
    let process = service::binary::Controller {
        user_agent: "gpu-operator-node-labeler",
        http_endpoint: args.http_endpoint,
        election: args
            .leader_elect
            .then(|| Election::new(&args.namespace, "gpu-operator-node-labeler", &args.identity)),
    };
    let settings = settings(&args);
    // Evictions go through a client that does not retry: a 429 from one is a PodDisruptionBudget's
    // refusal, which the hand-over counts and asks again about on its own schedule.
    let evictions = service::kube_client_without_retries("gpu-operator-node-labeler").await?;
    process
        .run(registry, |client, shutdown| {
            controller::run(client, evictions, settings, metrics, shutdown.wait())
        })
        .await
}

fn settings(args: &Args) -> Settings {
    Settings {
        default_mode: args.default_gpu_allocation_mode,
        driver_auto_upgrade: args.driver_auto_upgrade,
    }
}
