//! What the GPUCluster's status tells an admin when an operand cannot run: the node, the pod, the
//! container and the reason, not only "n of m pods available".

use e2e::eventually;
use e2e::real_nodes::{H100_NODE, RealNodes};
use std::time::Duration;

/// The GPUCluster's Ready condition: `reason: message`.
fn ready_says(cluster: &RealNodes) -> anyhow::Result<String> {
    let [_, reason, message] = cluster.gpu_cluster_condition("Ready")?;
    Ok(format!("{reason}: {message}"))
}

#[tokio::test]
#[ignore = "needs real nodes: make test-real-nodes runs it"]
async fn an_operand_image_that_cannot_be_pulled_is_named_in_the_gpuclusters_ready_condition()
-> anyhow::Result<()> {
    let cluster = RealNodes::connect().await?;
    let image = cluster.gpu_cluster("{.spec.dcgmExporter.image}")?;
    let missing = format!("{image}-missing");
    let edit = cluster
        .edit_gpu_cluster(&[("dcgmExporter.image", missing.clone().into())])
        .await?;
    cluster
        .step(
            "the exporter's image cannot be pulled: Ready names node, pod, container, reason and image",
            H100_NODE,
            eventually(Duration::from_secs(120), "Ready naming the failing pod", || async {
                let said = ready_says(&cluster)?;
                let named = said
                    .strip_prefix("OperandPodsFailing: operand pods failing: node real-gpu-")
                    .and_then(|rest| rest.split_once(": pod nvidia-dcgm-exporter-dra-"))
                    .and_then(|(_, rest)| rest.split_once(" container "))
                    .is_some_and(|(_, rest)| {
                        (rest.contains(": ErrImagePull (") || rest.contains(": ImagePullBackOff ("))
                            && rest.contains(&missing)
                    });
                if named {
                    Ok(Some(said))
                } else {
                    Err(anyhow::anyhow!("Ready says {said:?}"))
                }
            }),
        )
        .await?;
    edit.undo().await?;
    cluster
        .step(
            "the image restored: the GPUCluster is ready again",
            H100_NODE,
            eventually(Duration::from_secs(180), "the GPUCluster ready", || async {
                let state = cluster.gpu_cluster("{.status.state}")?;
                if state == "ready" {
                    Ok(Some(()))
                } else {
                    Err(anyhow::anyhow!(
                        "state {state:?}; Ready says {:?}",
                        ready_says(&cluster)?
                    ))
                }
            }),
        )
        .await
}
