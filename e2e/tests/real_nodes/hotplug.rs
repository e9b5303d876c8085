//! GPU discovery on a running node with no GPU: a GPU appears on its PCI bus, then its driver comes
//! up (a driver container's root in `/run/nvidia/driver`); the node becomes a DRA GPU node with
//! nothing restarted or reinstalled. It changes the node for good (a GPU is not unplugged from a
//! running node), so `hack/test/real-nodes.sh` runs it after every other scenario.

use anyhow::{bail, ensure};
use e2e::eventually;
use e2e::real_nodes::{GPULESS_NODE, RealNodes, ready_on};
use std::time::Duration;

/// The label discovery sets on a node with an NVIDIA function on its PCI bus.
const PCI_PRESENT: &str = "feature.node.kubernetes.io/pci-10de.present";

/// The discovery agent's pods, by label.
const DISCOVERY: &str = "app.kubernetes.io/name=gpu-node-discovery";

/// The discovery agent's pod on the node: `name restarts`.
async fn discovery_agent(cluster: &RealNodes) -> anyhow::Result<String> {
    let pod = cluster.operand_pod(DISCOVERY, GPULESS_NODE).await?;
    let restarts: i32 = pod
        .status
        .iter()
        .flat_map(|s| s.container_statuses.iter().flatten())
        .map(|c| c.restart_count)
        .sum();
    Ok(format!(
        "{} {restarts}",
        pod.metadata.name.unwrap_or_default()
    ))
}

#[tokio::test]
#[ignore = "needs real nodes: make test-real-nodes runs it"]
async fn a_gpu_and_then_its_driver_arriving_make_the_gpuless_node_a_dra_gpu_node()
-> anyhow::Result<()> {
    let cluster = RealNodes::connect().await?;
    let labels = cluster.node_labels(GPULESS_NODE).await?;
    if labels.contains_key(PCI_PRESENT) {
        bail!(
            "{GPULESS_NODE} has a GPU already (this scenario ran on this cluster before): it needs a fresh cluster"
        );
    }
    let agent = discovery_agent(&cluster).await?;
    cluster.plug_gpus(GPULESS_NODE, "l4", 1)?;
    cluster
        .step(
            "a GPU on the node's PCI bus, no driver yet: pci-10de.present=true from discovery, gpu.present=true from the labeler, no product label yet",
            GPULESS_NODE,
            eventually(Duration::from_secs(60), "the GPU seen", || async {
                let labels = cluster.node_labels(GPULESS_NODE).await?;
                let label = |key: &str| labels.get(key).cloned().unwrap_or_default();
                let seen = (
                    label(PCI_PRESENT),
                    label("nvidia.com/gpu.product"),
                    label("nvidia.com/gpu.present"),
                );
                if seen == ("true".into(), String::new(), "true".into()) {
                    Ok(Some(()))
                } else {
                    Err(anyhow::anyhow!("pci-10de.present, gpu.product, gpu.present: {seen:?}"))
                }
            }),
        )
        .await?;
    cluster.install_driver(GPULESS_NODE, "l4", 1)?;
    cluster
        .step(
            "its driver up: GPU feature discovery's labels, ready on dra, its GPU in a ResourceSlice",
            GPULESS_NODE,
            eventually(Duration::from_secs(240), "a DRA GPU node", || async {
                let gfd = crate::feature_labels(&cluster, GPULESS_NODE).await?;
                let readiness = cluster.readiness(GPULESS_NODE).await?;
                let gpus = crate::published_gpus(&cluster, GPULESS_NODE).await?.len();
                if gfd == "true NVIDIA-L4 1 23034 ada-lovelace 8 9 false 580.95.05 13.0"
                    && readiness == ready_on("dra")
                    && gpus == 1
                {
                    Ok(Some(()))
                } else {
                    Err(anyhow::anyhow!("labels {gfd:?}; {readiness}; {gpus} GPUs published"))
                }
            }),
        )
        .await?;
    let after = discovery_agent(&cluster).await?;
    ensure!(
        after == agent,
        "the discovery agent changed: before {agent:?}, after {after:?}"
    );
    Ok(())
}
