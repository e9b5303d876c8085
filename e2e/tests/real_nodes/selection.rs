//! CEL selection on the attributes the plugin publishes, as a claim written for the upstream
//! driver selects.

use crate::{published_gpus, ran_on_gpus};
use anyhow::ensure;
use e2e::real_nodes::{GuidePod, H100_NODE, L4_NODE, RealNodes};

#[tokio::test]
#[ignore = "needs real nodes: make test-real-nodes runs it"]
async fn cel_selects_gpus_by_product_memory_pcie_root_and_addressing_mode() -> anyhow::Result<()> {
    let cluster = RealNodes::connect().await?;
    const NAMES: &[&str] = &["l4-workload", "big-memory", "pcie-root"];
    let _cleanup = cluster.cleanup(&[("pod", NAMES), ("resourceclaimtemplate", NAMES)]);
    cluster.apply(
        &GuidePod::new("l4-workload")
            .selector("device.attributes['gpu.nvidia.com'].productName.lowerAscii().contains('l4')")
            .yaml(),
    )?;
    cluster.apply(
        &GuidePod::new("big-memory")
            .selector("device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('70Gi')) >= 0")
            .yaml(),
    )?;
    // Attributes a claim written for the upstream driver selects on: the standard PCIe root (two
    // H100s to a root, gpu-2 and gpu-3 under pci0000:40) and NVML's addressing mode.
    cluster.apply(
        &GuidePod::new("pcie-root")
            .selector("device.attributes['resource.kubernetes.io'].pcieRoot == 'pci0000:40' && device.attributes['gpu.nvidia.com'].addressingMode == 'HMM'")
            .yaml(),
    )?;
    cluster
        .step("a selector on the product name got an L4", L4_NODE, async {
            ran_on_gpus(&cluster, "l4-workload", L4_NODE, 1)
                .await
                .map(drop)
        })
        .await?;
    cluster
        .step(
            "a selector on at least 70 GiB of memory got an H100",
            H100_NODE,
            async {
                ran_on_gpus(&cluster, "big-memory", H100_NODE, 1)
                    .await
                    .map(drop)
            },
        )
        .await?;
    cluster
        .step(
            "a selector on resource.kubernetes.io/pcieRoot and addressingMode got one of the 2 H100s under pci0000:40",
            H100_NODE,
            async {
                let seen = ran_on_gpus(&cluster, "pcie-root", H100_NODE, 1).await?;
                let under: Vec<String> = published_gpus(&cluster, H100_NODE)
                    .await?
                    .into_iter()
                    .filter(|(_, root)| root.as_deref() == Some("pci0000:40"))
                    .map(|(uuid, _)| uuid)
                    .collect();
                ensure!(under.len() == 2, "GPUs under pci0000:40: {under:?}");
                ensure!(under.contains(&seen[0]), "the pod saw {seen:?}, not one of {under:?}");
                Ok(())
            },
        )
        .await
}
