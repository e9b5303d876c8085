//! `gpu-kubelet-plugin`: the DRA kubelet plugin of gpu-operator-rs. See the library docs.

use clap::Parser;
use kubelet_plugin::config::Config;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let config = Config::parse();
    service::logging::init(config.node.log_format);
    service::binary::exit_code("gpu-kubelet-plugin", kubelet_plugin::app::run(config).await)
}
