//! `gpu-operator`: reconciles the `GPUCluster` singleton into the DRA stack's operands.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use operator::controller::discovery::FeatureCache;
use operator::controller::{self, Metrics, Settings};
use operator::render::DefaultImages;
use service::events::EventPublisher;
use service::leader::Election;
use service::logging::LogFormat;

/// Turns the GPUCluster into the DRA GPU stack and reports whether it works.
#[derive(Debug, Parser)]
#[command(name = "gpu-operator", version)]
struct Args {
    /// Namespace the operands run in (the operator's own).
    #[arg(long, env = "OPERATOR_NAMESPACE")]
    namespace: String,
    /// Default image of the GPU kubelet plugin (`gpu-kubelet-plugin`).
    #[arg(
        long,
        env = "DRA_DRIVER_IMAGE",
        default_value = "ghcr.io/gpu-operator-rs/gpu-kubelet-plugin:v0.1.0"
    )]
    dra_driver_image: String,
    /// Default image holding `dra-driver-validator`.
    #[arg(
        long,
        env = "VALIDATOR_IMAGE",
        default_value = "ghcr.io/gpu-operator-rs/gpu-operator:v0.1.0"
    )]
    validator_image: String,
    /// Image of the ComputeDomain controller and kubelet plugin (the upstream DRA driver).
    #[arg(
        long,
        env = "COMPUTE_DOMAIN_IMAGE",
        default_value = "nvcr.io/nvidia/dra-driver-nvidia-gpu:v0.5.0"
    )]
    compute_domain_image: String,
    /// Default DCGM image.
    #[arg(
        long,
        env = "DCGM_IMAGE",
        default_value = "nvcr.io/nvidia/cloud-native/dcgm:4.6.0-1-ubuntu24.04"
    )]
    dcgm_image: String,
    /// Default DCGM exporter image.
    #[arg(
        long,
        env = "DCGM_EXPORTER_IMAGE",
        default_value = "nvcr.io/nvidia/k8s/dcgm-exporter:4.6.0-4.8.3-distroless"
    )]
    dcgm_exporter_image: String,
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, env = "HTTP_ENDPOINT", default_value = "0.0.0.0:8080")]
    http_endpoint: SocketAddr,
    /// Elect one leader among replicas through a Lease.
    #[arg(long, env = "LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    leader_elect: bool,
    /// This replica's identity in the Lease (the pod's name).
    #[arg(long, env = "POD_NAME", default_value = "gpu-operator")]
    identity: String,
    /// Log format: text or json.
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

/// `gpu-operator cleanup`: the chart's pre-delete hook (see `operator::cleanup`).
#[derive(Debug, Parser)]
#[command(name = "gpu-operator cleanup", version)]
struct CleanupArgs {
    /// How long to wait for the GPUCluster's finalizer: 300s, 5m, 1h30m.
    #[arg(long, env = "CLEANUP_TIMEOUT", default_value = "300s", value_parser = operator::cleanup::parse_timeout)]
    timeout: Duration,
    /// Log format: text or json.
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

/// `gpu-operator migrate quotas`: the ResourceQuota changes that finish a migration to DRA
/// (`requests.nvidia.com/gpu` becomes the same limit on `gpu.nvidia.com` devices).
#[derive(Debug, Parser)]
#[command(name = "gpu-operator migrate", version)]
struct MigrateArgs {
    /// What to migrate.
    #[command(subcommand)]
    what: MigrateWhat,
}

#[derive(Debug, clap::Subcommand)]
enum MigrateWhat {
    /// Print (and with --apply make) the ResourceQuota changes.
    Quotas {
        /// Make the changes instead of only printing them.
        #[arg(long)]
        apply: bool,
    },
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    // A subcommand of its own parser, so the operator's required settings do not apply to it.
    if std::env::args().nth(1).as_deref() == Some("cleanup") {
        let args = CleanupArgs::parse_from(std::env::args().skip(1));
        service::logging::init(args.log_format);
        return service::binary::exit_code("gpu-operator", cleanup(args.timeout).await);
    }
    if std::env::args().nth(1).as_deref() == Some("migrate") {
        let MigrateArgs {
            what: MigrateWhat::Quotas { apply },
        } = MigrateArgs::parse_from(std::env::args().skip(1));
        service::logging::init(LogFormat::Text);
        return service::binary::exit_code("gpu-operator", migrate_quotas(apply).await);
    }
    let args = Args::parse();
    service::logging::init(args.log_format);
    service::binary::exit_code("gpu-operator", run(args).await)
}

async fn migrate_quotas(apply: bool) -> Result<(), Box<dyn std::error::Error>> {
    let client = service::kube_client("gpu-operator").await?;
    operator::quotas::run(client, apply).await?;
    Ok(())
}

async fn cleanup(timeout: Duration) -> Result<(), Box<dyn std::error::Error>> {
    let client = service::kube_client("gpu-operator").await?;
    Ok(operator::cleanup::run(client, timeout).await?)
}

async fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let metrics = Metrics::default();
    let fleet = operator::fleet::FleetMetrics::default();
    let mut registry = prometheus_client::registry::Registry::default();
    metrics.register(&mut registry);
    fleet.register(&mut registry);
    let settings = Settings {
        namespace: args.namespace.clone(),
        images: DefaultImages {
            dra_driver: args.dra_driver_image,
            validator: args.validator_image,
            compute_domain: args.compute_domain_image,
            dcgm: args.dcgm_image,
            dcgm_exporter: args.dcgm_exporter_image,
        },
    };
    let process = service::binary::Controller {
        user_agent: "gpu-operator",
        http_endpoint: args.http_endpoint,
        election: args
            .leader_elect
            .then(|| Election::new(&args.namespace, "gpu-operator", &args.identity)),
    };
    process
        .run(registry, |client, shutdown| async move {
            // The GPUCluster and GPUClass controllers share what the apiserver serves of DRA; the
            // GPUClass controller, the pending-pod explainer and the fleet gauges live as long as
            // the GPUCluster controller, which ends on shutdown.
            let features = Arc::new(FeatureCache::new(client.clone()));
            let events = || EventPublisher::new(client.clone(), controller::reporter());
            tokio::select! {
                () = controller::run(client.clone(), settings, metrics, features.clone(), shutdown.wait()) => {}
                () = operator::classes::run(client.clone(), features, events()) => {}
                () = operator::pending::run(client.clone(), events()) => {}
                () = operator::fleet::run(client.clone(), fleet) => {}
            }
        })
        .await
}
