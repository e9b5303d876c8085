//! Prints the `GPUCluster` CustomResourceDefinition as YAML (`make generate` writes it to the chart).

fn main() {
    print!("{}", api::gpucluster::crd_yaml());
}
