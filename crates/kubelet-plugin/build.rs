//! Compiles the kubelet protos in `<repo>/proto` with protox (no system `protoc`) and generates
//! the tonic servers and clients into `OUT_DIR`.

use std::path::PathBuf;

const PROTOS: [&str; 6] = [
    "dra/v1/api.proto",
    "dra/v1beta1/api.proto",
    "pluginregistration/v1/api.proto",
    "dra-health/v1/api.proto",
    "dra-health/v1alpha1/api.proto",
    "grpc/health/v1/health.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../../proto");
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={}", root.join(proto).display());
    }
    let fds = protox::compile(PROTOS, [&root])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}
