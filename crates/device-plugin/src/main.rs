//! `gpu-device-plugin`: the device plugin of gpu-operator-rs. See the library docs.

use clap::Parser;
use device_plugin::config::Config;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let config = Config::parse();
    service::logging::init(config.node.log_format);
    service::binary::exit_code("gpu-device-plugin", device_plugin::app::run(config).await)
}
