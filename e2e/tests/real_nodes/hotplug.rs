//! GPU discovery on a running node with no GPU: a GPU appears on its PCI bus, then its driver comes
//! up (a driver container's root in `/run/nvidia/driver`); the node becomes a DRA GPU node with
//! nothing restarted or reinstalled. Then that driver is replaced by another version under the
//! running kubelet plugin, which notices, says so on the Node and republishes the GPU with the new
//! driver's version. It changes the node for good (a GPU is not unplugged from a running node), so
//! `hack/test/real-nodes.sh` runs it after every other scenario.

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
    a_driver_upgraded_under_the_plugin_is_republished(&cluster).await
}

/// The node's driver container replaced by driver 590.48.01: the plugin, whose NVML is the old
/// driver's, restarts on the new one (a `GPUDriverChanged` Event on the Node says why) and
/// publishes the GPU with the new `driverVersion`.
async fn a_driver_upgraded_under_the_plugin_is_republished(
    cluster: &RealNodes,
) -> anyhow::Result<()> {
    let plugin = cluster.plugin_pod(GPULESS_NODE).await?;
    let restarts = |pod: &k8s_openapi::api::core::v1::Pod| -> i32 {
        pod.status
            .iter()
            .flat_map(|s| s.container_statuses.iter().flatten())
            .filter(|c| c.name == "gpus")
            .map(|c| c.restart_count)
            .sum()
    };
    let before = restarts(&plugin);
    cluster.upgrade_driver(GPULESS_NODE, "590.48.01", false)?;
    cluster
        .step(
            "its driver replaced by 590.48.01 under the plugin: the plugin restarted on it, the GPU republished with driverVersion 590.48.1, a GPUDriverChanged Event on the Node",
            GPULESS_NODE,
            eventually(Duration::from_secs(120), "the new driver published", || async {
                let versions: Vec<String> = cluster
                    .published_devices(GPULESS_NODE)
                    .await?
                    .into_iter()
                    .filter_map(|d| d.attributes?.get("driverVersion")?.version.clone())
                    .collect();
                let now = cluster.plugin_pod(GPULESS_NODE).await?;
                let restarted = restarts(&now) - before;
                let event = cluster.kubectl(
                    &[
                        "get", "events", "-A", "--field-selector",
                        &format!("reason=GPUDriverChanged,involvedObject.name={GPULESS_NODE}"),
                        "-o", "jsonpath={.items[*].message}",
                    ],
                    None,
                )?;
                if versions == ["590.48.1"]
                    && restarted == 1
                    && event.contains("from driver 580.95.05 to driver 590.48.01")
                {
                    Ok(Some(()))
                } else {
                    Err(anyhow::anyhow!(
                        "published driverVersion {versions:?}; plugin restarted {restarted} times; Event {event:?}"
                    ))
                }
            }),
        )
        .await
}
