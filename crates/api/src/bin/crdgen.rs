//! Prints a CustomResourceDefinition as YAML (`make generate` writes each to the chart):
//! `crdgen` or `crdgen gpuclusters` the `GPUCluster`, `crdgen gpuclasses` the `GPUClass`, `crdgen physicalgpus`
//! the `PhysicalGPU`.

use std::process::ExitCode;

fn main() -> ExitCode {
    match std::env::args().nth(1).as_deref() {
        None | Some("gpuclusters") => print!("{}", api::gpucluster::crd_yaml()),
        Some("gpuclasses") => print!("{}", api::gpuclass::crd_yaml()),
        Some("physicalgpus") => print!("{}", api::physicalgpu::crd_yaml()),
        Some(other) => {
            eprintln!("crdgen: no CRD named {other}; try gpuclusters, gpuclasses or physicalgpus");
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}
