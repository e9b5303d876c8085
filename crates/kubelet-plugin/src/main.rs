//! `gpu-kubelet-plugin`: the DRA kubelet plugin of gpu-operator-rs. See the library docs.

use clap::Parser;
use kubelet_plugin::config::Config;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let config = Config::parse();
    service::logging::init(config.log_format);
    match kubelet_plugin::app::run(config).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("gpu-kubelet-plugin failed: {e:#}");
            eprintln!("gpu-kubelet-plugin: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
