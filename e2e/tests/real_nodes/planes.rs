//! Moving a node between planes by its allocation-mode label (docs/migration.md): a switch waits
//! for the pods holding the old plane's GPUs (`migration.drain: wait`), one plane at a time; on
//! the device plugin's plane the kubelet offers `nvidia.com/gpu`, the plane's validator proves it,
//! a pod asking `nvidia.com/gpu: 1` gets its GPU through CDI, a lost GPU leaves the kubelet's
//! count, the GPUCluster's time-slicing multiplies it and a ClusterPolicy takes the plane over.

use crate::ran_on_gpus;
use anyhow::{bail, ensure};
use e2e::eventually;
use e2e::real_nodes::{
    DEVICE_PLUGIN, GuidePod, L4_NODE, LIST_GPUS, MODE_LABEL, OPERATOR_NS, RealNodes,
    mock_fault_env, pod_ready, ready_on, resource_pod,
};
use std::time::Duration;

/// The GPUCluster's `NodesHeldOnDRA` condition: `status message`.
fn held_on_dra(cluster: &RealNodes) -> anyhow::Result<String> {
    let [status, _, message] = cluster.gpu_cluster_condition("NodesHeldOnDRA")?;
    Ok(format!("{status} {message}"))
}

/// Waits until the L4 node's deploy labels say `validator` (a validator's label and its value),
/// `dra-driver` and `device-plugin` (`true` or empty), and its readiness `readiness`; then, 5 s
/// later, that they still do (nothing moved on behind the test's back).
async fn holds(
    cluster: &RealNodes,
    validator: (&str, &str),
    dra_driver: &str,
    device_plugin: &str,
    readiness: &str,
) -> anyhow::Result<()> {
    let check = || async {
        let said = (
            cluster.deploy_label(L4_NODE, validator.0).await?,
            cluster.deploy_label(L4_NODE, "dra-driver").await?,
            cluster.deploy_label(L4_NODE, "device-plugin").await?,
            cluster.readiness(L4_NODE).await?,
        );
        let want = (
            validator.1.to_owned(),
            dra_driver.to_owned(),
            device_plugin.to_owned(),
            readiness.to_owned(),
        );
        if said == want {
            Ok(Some(()))
        } else {
            Err(anyhow::anyhow!(
                "{} {:?}, dra-driver {:?}, device-plugin {:?}, {}",
                validator.0,
                said.0,
                said.1,
                said.2,
                said.3
            ))
        }
    };
    eventually(Duration::from_secs(60), "the node's labels", check).await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    eventually(Duration::ZERO, "the node's labels 5 s later", check).await
}

#[tokio::test]
#[ignore = "needs real nodes: make test-real-nodes runs it"]
async fn a_switch_waits_for_the_pods_holding_the_old_planes_gpus_and_the_device_plugin_serves_the_node()
-> anyhow::Result<()> {
    let cluster = RealNodes::connect().await?;
    const NAMES: &[&str] = &["switch", "dp-workload", "dp-hold"];
    let _cleanup = cluster.cleanup(&[("pod", NAMES), ("resourceclaimtemplate", &["switch"])]);
    let script = format!("{LIST_GPUS}; sleep 3600");
    cluster.apply(&GuidePod::new("switch").on(L4_NODE).script(&script).yaml())?;
    cluster
        .wait_running(&["switch"], Duration::from_secs(120))
        .await?;

    let mode = cluster.switch_mode(&[L4_NODE], "device-plugin").await?;
    cluster
        .step(
            "switched to device-plugin under a pod holding a DRA GPU (drain: wait): cordoned, readiness and the DRA validator's labels gone, the DRA plugin kept, no device plugin yet",
            L4_NODE,
            async {
                holds(
                    &cluster,
                    ("dra-validator", ""),
                    "true",
                    "",
                    "gpu-stack= gpu-setup-complete= unschedulable=true",
                )
                .await?;
                cluster.plugin_pod(L4_NODE).await.map(drop)
            },
        )
        .await?;
    cluster
        .step(
            "the GPUCluster's NodesHeldOnDRA names the node while its pod holds a claim",
            L4_NODE,
            eventually(Duration::from_secs(30), "NodesHeldOnDRA", || async {
                let held = held_on_dra(&cluster)?;
                if held.starts_with("True ") && held.contains(&format!("node {L4_NODE} ")) {
                    Ok(Some(()))
                } else {
                    Err(anyhow::anyhow!("NodesHeldOnDRA: {held:?}"))
                }
            }),
        )
        .await?;
    let prometheus = cluster.prometheus()?;
    cluster
        .step(
            "Prometheus: the chart's GPUNodeHeldOnDra alert fires for the node once the hold outlasts its window (20 s here)",
            L4_NODE,
            prometheus.wait_alert("GPUNodeHeldOnDra", L4_NODE, true, Duration::from_secs(120)),
        )
        .await?;

    cluster.delete("pod", &["switch"])?;
    cluster
        .step(
            "once the pod left, the DRA plugin left the node with its ResourceSlices (no GPU of the node left to allocate) and NodesHeldOnDRA turned False",
            L4_NODE,
            async { eventually(Duration::from_secs(120), "the DRA plugin gone", || async {
                let label = cluster.deploy_label(L4_NODE, "dra-driver").await?;
                let plugin = cluster.plugin_pod(L4_NODE).await.is_ok();
                let published = cluster.published_devices(L4_NODE).await?.len();
                let held = held_on_dra(&cluster)?;
                if !plugin && published > 0 {
                    // The plugin withdraws them before it exits: the scheduler would allocate
                    // GPUs no DRA plugin serves now.
                    return Ok(Some(Err(anyhow::anyhow!(
                        "the plugin pod is gone and {published} devices are still published"
                    ))));
                }
                if label.is_empty() && !plugin && published == 0 && held.starts_with("False") {
                    Ok(Some(Ok(())))
                } else {
                    Err(anyhow::anyhow!(
                        "dra-driver label {label:?}, plugin pod there: {plugin}, {published} devices published, NodesHeldOnDRA {held:?}"
                    ))
                }
            })
            .await? },
        )
        .await?;
    cluster
        .step(
            "Prometheus: GPUNodeHeldOnDra resolves",
            L4_NODE,
            prometheus.wait_alert("GPUNodeHeldOnDra", L4_NODE, false, Duration::from_secs(60)),
        )
        .await?;
    cluster
        .step(
            "the device plugin registers with the kubelet: allocatable nvidia.com/gpu 2",
            L4_NODE,
            cluster.device_plugin_serves(L4_NODE, 2),
        )
        .await?;
    cluster
        .step(
            "the plane's validator turns ready: its validation pod got a GPU from the device plugin, then went",
            L4_NODE,
            eventually(Duration::from_secs(180), "nvidia-operator-validator ready", || async {
                let validator = cluster
                    .operand_pod("app=nvidia-operator-validator", L4_NODE)
                    .await?;
                let name = validator.metadata.name.clone().unwrap_or_default();
                if !pod_ready(&validator) {
                    bail!("{name} not ready");
                }
                let log = cluster
                    .operand_log(&name, Some("plugin-validation"), 50)
                    .await;
                let left = cluster
                    .operand_pods(Some("app=nvidia-device-plugin-validator"), None)
                    .await?
                    .len();
                ensure!(
                    log.contains("offers nvidia.com/gpu") && left == 0,
                    "{left} validation pods left; {log}"
                );
                Ok(Some(()))
            }),
        )
        .await?;
    cluster
        .step(
            "the hand-over is complete (ready on device-plugin, uncordoned) and the GPUCluster counts both planes",
            L4_NODE,
            eventually(Duration::from_secs(60), "ready on device-plugin", || async {
                let readiness = cluster.readiness(L4_NODE).await?;
                let planes = cluster.gpu_cluster(
                    "dra={.status.nodes.dra} devicePlugin={.status.nodes.devicePlugin} readyDevicePlugin={.status.nodes.readyDevicePlugin}",
                )?;
                if readiness == ready_on("device-plugin")
                    && planes == "dra=3 devicePlugin=1 readyDevicePlugin=1"
                {
                    Ok(Some(()))
                } else {
                    Err(anyhow::anyhow!("{readiness}; GPUCluster nodes {planes}"))
                }
            }),
        )
        .await?;

    cluster.apply(&resource_pod(
        "dp-workload",
        "nvidia.com/gpu",
        Some(L4_NODE),
        LIST_GPUS,
    ))?;
    cluster
        .step(
            "a pod asking nvidia.com/gpu: 1 sees exactly one of the node's GPUs, through the device plugin's CDI spec",
            L4_NODE,
            ran_on_gpus(&cluster, "dp-workload", L4_NODE, 1),
        )
        .await?;
    cluster
        .step(
            "kubectl get physicalgpu: every card of the 3 GPU nodes, Ready, on the plane that serves it",
            L4_NODE,
            eventually(Duration::from_secs(60), "the PhysicalGPUs", || async {
                let rows = cluster.kubectl(
                    &[
                        "get",
                        "physicalgpu",
                        "-o",
                        "jsonpath={range .items[*]}{.status.node}/{.status.plane}/{.status.phase}{\"\\n\"}{end}",
                    ],
                    None,
                )?;
                let mut counted = std::collections::BTreeMap::<&str, usize>::new();
                for row in rows.lines() {
                    *counted.entry(row).or_default() += 1;
                }
                let want = [
                    ("real-gpu-0/dra/Ready", 4),
                    ("real-gpu-1/device-plugin/Ready", 2),
                    ("real-gpu-2/dra/Ready", 2),
                ];
                if counted == want.into_iter().collect() {
                    Ok(Some(()))
                } else {
                    Err(anyhow::anyhow!("node/plane/phase: {counted:?}"))
                }
            }),
        )
        .await?;

    cluster.apply(&resource_pod(
        "dp-hold",
        "nvidia.com/gpu",
        Some(L4_NODE),
        &script,
    ))?;
    cluster
        .wait_running(&["dp-hold"], Duration::from_secs(120))
        .await?;
    let kubelet_log = cluster.kubelet_log_end(L4_NODE)?;
    mode.switch("dra")?;
    cluster
        .step(
            "switched back under a pod holding a device-plugin GPU: the validator left, the device plugin stayed, no DRA plugin yet",
            L4_NODE,
            async {
                holds(&cluster, ("operator-validator", ""), "", "true", "gpu-stack= gpu-setup-complete= unschedulable=true").await?;
                let device_plugins = cluster.operand_pods(Some(DEVICE_PLUGIN), Some(L4_NODE)).await?;
                ensure!(!device_plugins.is_empty(), "no device plugin pod on {L4_NODE}");
                Ok(())
            },
        )
        .await?;
    cluster.delete("pod", &["dp-hold"])?;
    cluster
        .step(
            "once the pod left, the device plugin left and the DRA plugin returned, publishing the node's 2 GPUs; ready on dra, uncordoned",
            L4_NODE,
            mode.restore(&[2]),
        )
        .await?;
    cluster
        .step(
            "no pod on the node was given a claim before the DRA plugin registered (no stale ResourceSlice was left to allocate from)",
            L4_NODE,
            async {
                let logged = cluster.kubelet_log_since(L4_NODE, kubelet_log)?;
                let early: Vec<&str> = logged
                    .lines()
                    .filter(|l| l.contains("DRA driver gpu.nvidia.com is not registered"))
                    .collect();
                ensure!(early.is_empty(), "the kubelet logged: {early:#?}");
                Ok(())
            },
        )
        .await
}

#[tokio::test]
#[ignore = "needs real nodes: make test-real-nodes runs it"]
async fn on_the_device_plugins_plane_a_lost_gpu_time_slicing_and_a_clusterpolicy_change_what_the_kubelet_offers()
-> anyhow::Result<()> {
    let cluster = RealNodes::connect().await?;
    let _crd = cluster.cleanup(&[("crd", &["clusterpolicies.nvidia.com"])]);
    cluster.set_l4_faults("{}")?;
    let _faults = cluster
        .edit_gpu_cluster(&[("devicePlugin.env", mock_fault_env())])
        .await?;
    let mode = cluster.switch_mode(&[L4_NODE], "device-plugin").await?;
    cluster
        .step(
            "on device-plugin with no pod to wait for: allocatable nvidia.com/gpu 2",
            L4_NODE,
            cluster.device_plugin_serves(L4_NODE, 2),
        )
        .await?;

    cluster.set_l4_faults(r#"{"lost_gpus": [1]}"#)?;
    cluster
        .step(
            "a GPU lost: the kubelet's allocatable nvidia.com/gpu drops to 1",
            L4_NODE,
            cluster.device_plugin_serves(L4_NODE, 1),
        )
        .await?;
    cluster.set_l4_faults("{}")?;
    cluster
        .step(
            "readable again: after the 5 s recovery period it is back to 2",
            L4_NODE,
            cluster.device_plugin_serves(L4_NODE, 2),
        )
        .await?;

    let sliced = cluster
        .edit_gpu_cluster(&[(
            "devicePlugin.config.sharing",
            serde_json::json!({"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}}),
        )])
        .await?;
    cluster
        .step(
            "time-slicing with 2 replicas in the GPUCluster: the device plugin rolls and offers each GPU twice",
            L4_NODE,
            cluster.device_plugin_serves(L4_NODE, 4),
        )
        .await?;
    sliced.undo().await?;
    cluster
        .step(
            "time-slicing taken out: each GPU offered once again",
            L4_NODE,
            cluster.device_plugin_serves(L4_NODE, 2),
        )
        .await?;

    let policy =
        std::fs::read_to_string(e2e::manifest_dir().join("testdata/clusterpolicy-crd.yaml"))?;
    cluster
        .step(
            "a ClusterPolicy appears: the operator leaves the device-plugin plane to it and removes its device plugin",
            L4_NODE,
            async {
                // The ClusterPolicy goes in once its CRD is served.
                eventually(Duration::from_secs(30), "the ClusterPolicy applied", || async {
                    cluster.apply(&policy).map(Some)
                })
                .await?;
                eventually(Duration::from_secs(60), "our device plugin gone", || async {
                    let daemonset = cluster.kubectl(&["-n", OPERATOR_NS, "get", "daemonset", "-o", "name"], None)?;
                    let pods = cluster.operand_pods(Some(DEVICE_PLUGIN), Some(L4_NODE)).await?.len();
                    if daemonset.contains("nvidia-device-plugin-daemonset") || pods > 0 {
                        bail!("daemonsets: {daemonset:?}; {pods} device plugin pods on {L4_NODE}");
                    }
                    Ok(Some(()))
                })
                .await
            },
        )
        .await?;
    cluster.kubectl(
        &["delete", "crd", "clusterpolicies.nvidia.com", "--wait=true"],
        None,
    )?;
    cluster
        .step(
            "the ClusterPolicy CRD deleted: our device plugin returns",
            L4_NODE,
            cluster.device_plugin_serves(L4_NODE, 2),
        )
        .await?;
    let labels = cluster.node_labels(L4_NODE).await?;
    ensure!(
        labels.get(MODE_LABEL).map(String::as_str) == Some("device-plugin"),
        "the node's mode moved: {:?}",
        labels.get(MODE_LABEL)
    );
    cluster
        .step(
            "switched back to dra: the device plugin leaves, the DRA plugin publishes the node's 2 GPUs",
            L4_NODE,
            mode.restore(&[2]),
        )
        .await
}
