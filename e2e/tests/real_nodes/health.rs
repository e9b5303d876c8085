//! GPU health through the real kubelet: faults of the L4 node's NVML (the mock's control file in
//! the node's own folder, named to the plugin through the GPUCluster as an admin sets env) taint
//! the device in its slice and reach the kubelet through the plugin's health stream, which shows
//! them in the pod's status; after the recovery period both are healthy again. A GPU off the bus
//! makes the chart's GPUsUnhealthy alert fire in the cluster's Prometheus, and it resolves.

use anyhow::ensure;
use e2e::eventually;
use e2e::real_nodes::{
    L4_NODE, MOCK_FAULTS_IN_POD, RealNodes, SpecEdit, WORKLOAD_NS, gpu_class, mock_fault_env,
    named_claim_pod, plugin_ready,
};
use std::time::Duration;

/// Names the fault control file to the DRA plugin (with a 5 s recovery period and a 1 s probe)
/// and waits for the plugins to roll and the L4 node's to run with it; the GPUCluster is set back
/// with the guard.
async fn fault_control(cluster: &RealNodes) -> anyhow::Result<SpecEdit<'_>> {
    cluster.set_l4_faults("{}")?;
    let edit = cluster
        .edit_gpu_cluster(&[("draDriver.gpus.kubeletPlugin.env", mock_fault_env())])
        .await?;
    cluster
        .step(
            "the L4 node's plugin runs with the fault control file and publishes its 2 GPUs",
            L4_NODE,
            eventually(Duration::from_secs(120), "the plugin with its new env", || async {
                let pod = cluster.plugin_pod(L4_NODE).await?;
                let with_env = pod.spec.iter().flat_map(|s| &s.containers).any(|c| {
                    c.name == "gpus"
                        && c.env.iter().flatten().any(|e| e.value.as_deref() == Some(MOCK_FAULTS_IN_POD))
                });
                let ready = plugin_ready(&pod);
                let gpus = crate::published_gpus(cluster, L4_NODE).await?.len();
                if with_env && ready && gpus == 2 {
                    Ok(Some(()))
                } else {
                    Err(anyhow::anyhow!("plugin pod with the env: {with_env}, ready: {ready}, {gpus} GPUs published"))
                }
            }),
        )
        .await?;
    Ok(edit)
}

/// The health the kubelet shows for pod `pod`'s one DRA device (allocatedResourcesStatus).
fn pod_health(cluster: &RealNodes, pod: &str) -> anyhow::Result<String> {
    cluster.jsonpath(
        "pod",
        pod,
        Some(WORKLOAD_NS),
        "{.status.containerStatuses[0].allocatedResourcesStatus[*].resources[*].health}",
    )
}

/// The taints (`key effect`) on device `device` of the L4 node's slices.
async fn taints_of(cluster: &RealNodes, device: &str) -> anyhow::Result<Vec<String>> {
    Ok(cluster
        .published_devices(L4_NODE)
        .await?
        .into_iter()
        .filter(|d| d.name == device)
        .flat_map(|d| d.taints.unwrap_or_default())
        .map(|t| format!("{} {}", t.key, t.effect))
        .collect())
}

/// Waits until every pod of `pods` shows `health` and `device` carries `taints`.
async fn shows(
    cluster: &RealNodes,
    pods: &[&str],
    health: &str,
    device: &str,
    taints: &[&str],
) -> anyhow::Result<()> {
    eventually(
        Duration::from_secs(60),
        &format!("{pods:?} {health}, {device} tainted {taints:?}"),
        || async {
            let mut said = Vec::new();
            for pod in pods {
                said.push(pod_health(cluster, pod)?);
            }
            let tainted = taints_of(cluster, device).await?;
            if said.iter().all(|h| h == health) && tainted == taints {
                Ok(Some(()))
            } else {
                Err(anyhow::anyhow!(
                    "the pods show {said:?}; {device} is tainted {tainted:?}"
                ))
            }
        },
    )
    .await
}

#[tokio::test]
#[ignore = "needs real nodes: make test-real-nodes runs it"]
async fn an_ecc_error_shows_in_the_pods_status_and_taints_the_device_until_it_recovers()
-> anyhow::Result<()> {
    let cluster = RealNodes::connect().await?;
    // Beside a pod on a whole L4 (from 1.35: 1.34 publishes no shares), one on a share of the
    // other L4 through a GPUClass's shared variant: a share is in the health stream like a GPU.
    let with_share = cluster.server_minor().await? > 34;
    let pods: &[&str] = if with_share {
        &["sick", "sick-share"]
    } else {
        &["sick"]
    };
    let control = fault_control(&cluster).await?;
    let cleanup = cluster.cleanup(&[
        ("pod", pods),
        ("resourceclaim", pods),
        ("gpuclass", &["l4s"]),
    ]);
    cluster.apply(&named_claim_pod(
        "sick",
        L4_NODE,
        "gpu.nvidia.com",
        None,
        None,
    ))?;
    if with_share {
        cluster.apply(&gpu_class("l4s", "l4", Some((2, "TimeSlicing"))))?;
        cluster.apply(&named_claim_pod(
            "sick-share",
            L4_NODE,
            "l4s-shared.gpu-operator-rs.dev",
            None,
            None,
        ))?;
    }
    let device = cluster
        .step(
            "the kubelet shows the pods' devices Healthy in their status, from the plugin's health stream",
            L4_NODE,
            async {
                cluster.wait_running(pods, Duration::from_secs(120)).await?;
                let claim = cluster.claim_of("sick").await?;
                let device = claim
                    .status
                    .and_then(|s| s.allocation?.devices?.results?.into_iter().next())
                    .map(|r| r.device)
                    .unwrap_or_default();
                shows(&cluster, pods, "Healthy", &device, &[]).await?;
                Ok(device)
            },
        )
        .await?;
    // The error hits both L4s: sick's and the one the share pod is on.
    cluster.set_l4_faults(
        r#"{"ecc_events": [{"gpu": 0, "kind": "double-bit"}, {"gpu": 1, "kind": "double-bit"}]}"#,
    )?;
    cluster
        .step(
            &format!("a double-bit ECC error: {device} tainted gpu.nvidia.com/ecc:NoSchedule, the kubelet shows the pods' devices Unhealthy, the pods keep running"),
            L4_NODE,
            async {
                shows(&cluster, pods, "Unhealthy", &device, &["gpu.nvidia.com/ecc NoSchedule"]).await?;
                let said = cluster.jsonpath("pod", "sick", Some(WORKLOAD_NS), "{.status.phase}")?;
                ensure!(said == "Running", "sick is {said}");
                Ok(())
            },
        )
        .await?;
    cluster.set_l4_faults("{}")?;
    cluster
        .step(
            "after the recovery period the taint is gone and the kubelet shows the devices Healthy again",
            L4_NODE,
            shows(&cluster, pods, "Healthy", &device, &[]),
        )
        .await?;
    drop(cleanup);
    // An ECC error is over within the recovery period; a GPU off the bus stays out of service
    // until it answers again, long enough for the alert's window.
    let prometheus = cluster.prometheus()?;
    cluster.set_l4_faults(r#"{"lost_gpus": [1]}"#)?;
    cluster
        .step(
            "Prometheus: a GPU off the bus makes the chart's GPUsUnhealthy alert fire for the node (health lost) once its window (20 s here) passes",
            L4_NODE,
            prometheus.wait_alert("GPUsUnhealthy", L4_NODE, true, Duration::from_secs(120)),
        )
        .await?;
    cluster.set_l4_faults("{}")?;
    cluster
        .step(
            "Prometheus: GPUsUnhealthy resolves once the GPU answers again",
            L4_NODE,
            prometheus.wait_alert("GPUsUnhealthy", L4_NODE, false, Duration::from_secs(90)),
        )
        .await?;
    cluster
        .step(
            "GPUClass l4s gone with its DeviceClass; the GPUCluster's plugin env set back, every GPU node's plugin rolled and publishing",
            L4_NODE,
            async {
                crate::delete_class(&cluster, "l4s").await?;
                control.undo().await
            },
        )
        .await
}
