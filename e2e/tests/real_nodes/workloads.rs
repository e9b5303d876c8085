//! The install guide's workloads: a pod through the guide's claim template sees exactly the GPUs
//! it claimed, with the driver's `nvidia-smi` and NVML injected through CDI, in the guide's image
//! or a plain one.

use crate::ran_on_gpus;
use anyhow::ensure;
use e2e::real_nodes::{GuidePod, H100_NODE, L4_NODE, RealNodes, WORKLOAD_NS};
use std::time::Duration;

/// An image with no NVIDIA tool in it.
const PLAIN_IMAGE: &str = "docker.io/library/ubuntu:24.04";

#[tokio::test]
#[ignore = "needs real nodes: make test-real-nodes runs it"]
async fn the_guides_pod_sees_exactly_its_one_gpu() -> anyhow::Result<()> {
    let cluster = RealNodes::connect().await?;
    const NAMES: &[&str] = &["gpu-workload"];
    let _cleanup = cluster.cleanup(&[("pod", NAMES), ("resourceclaimtemplate", NAMES)]);
    cluster.apply(&GuidePod::new("gpu-workload").on(H100_NODE).yaml())?;
    cluster
        .step(
            "gpu-workload: nvidia-smi -L lists exactly its one GPU of real-gpu-0, one /dev/nvidia<minor>, libnvidia-ml.so.1 injected",
            H100_NODE,
            ran_on_gpus(&cluster, "gpu-workload", H100_NODE, 1),
        )
        .await
        .map(drop)
}

#[tokio::test]
#[ignore = "needs real nodes: make test-real-nodes runs it"]
async fn a_two_gpu_claim_sees_both_gpus_of_its_node() -> anyhow::Result<()> {
    let cluster = RealNodes::connect().await?;
    const NAMES: &[&str] = &["two-gpus"];
    let _cleanup = cluster.cleanup(&[("pod", NAMES), ("resourceclaimtemplate", NAMES)]);
    cluster.apply(&GuidePod::new("two-gpus").on(L4_NODE).count(2).yaml())?;
    cluster
        .step(
            "two-gpus: nvidia-smi -L lists both GPUs of real-gpu-1, with their two /dev/nvidia<minor>",
            L4_NODE,
            async {
                let seen = ran_on_gpus(&cluster, "two-gpus", L4_NODE, 2).await?;
                ensure!(seen[0] != seen[1], "two-gpus saw one GPU twice: {seen:?}");
                Ok(())
            },
        )
        .await
}

#[tokio::test]
#[ignore = "needs real nodes: make test-real-nodes runs it"]
async fn a_plain_image_gets_the_drivers_nvidia_smi_with_its_claim_only() -> anyhow::Result<()> {
    let cluster = RealNodes::connect().await?;
    const NAMES: &[&str] = &["plain-image", "plain-no-claim"];
    let _cleanup = cluster.cleanup(&[("pod", NAMES), ("resourceclaimtemplate", &NAMES[..1])]);
    cluster.apply(
        &GuidePod::new("plain-image")
            .on(L4_NODE)
            .image(PLAIN_IMAGE)
            .yaml(),
    )?;
    cluster
        .step(
            "plain-image (ubuntu, no NVIDIA tool) on real-gpu-1: nvidia-smi and NVML from the node's driver through CDI, one GPU",
            L4_NODE,
            ran_on_gpus(&cluster, "plain-image", L4_NODE, 1),
        )
        .await?;
    cluster.apply(&format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: plain-no-claim, namespace: {WORKLOAD_NS}}}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  nodeSelector: {{kubernetes.io/hostname: {L4_NODE}}}
  containers:
  - {{name: plain, image: {PLAIN_IMAGE:?}, command: [sh, -c, "command -v nvidia-smi || echo no-nvidia-smi"]}}
"#
    ))?;
    cluster
        .step(
            "the same plain image without a claim has no nvidia-smi: the driver's came with the GPU",
            L4_NODE,
            async {
                cluster
                    .wait_succeeded("plain-no-claim", Duration::from_secs(60))
                    .await?;
                let log = cluster.logs("plain-no-claim", None).await?;
                ensure!(log.trim() == "no-nvidia-smi", "plain-no-claim printed {log:?}");
                Ok(())
            },
        )
        .await
}
