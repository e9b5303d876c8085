//! `gpu-device-plugin`: the device plugin of gpu-operator-rs. See the library docs.

use clap::Parser;
use device_plugin::config::Config;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let config = Config::parse();
    service::logging::init(config.log_format);
    match device_plugin::app::run(config).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("gpu-device-plugin failed: {e:#}");
            eprintln!("gpu-device-plugin: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
