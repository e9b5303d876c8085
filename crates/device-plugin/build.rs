//! Compiles the kubelet's device-plugin proto in `<repo>/proto` with protox (no system `protoc`)
//! and generates the tonic server and client into `OUT_DIR`.

use std::path::PathBuf;

const PROTO: &str = "deviceplugin/v1beta1/api.proto";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../../proto");
    println!("cargo:rerun-if-changed={}", root.join(PROTO).display());
    let fds = protox::compile([PROTO], [&root])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}
