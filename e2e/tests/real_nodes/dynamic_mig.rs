//! Dynamic MIG on the H100 node (`migPartitioning: dynamic`): claims for `1g` and `3g` partitions
//! of one GPU run side by side, each container seeing only its own MIG device; a whole-card claim
//! on that GPU waits, with the scheduler's reason, until both are gone; one GPU class offers whole
//! cards and partitions; two pods time-slice one partition; the plugin SIGKILLed between making a
//! GPU instance and its compute instance leaks nothing and the kubelet's retry prepares the claim.
//! After them the node's GPUs hold no partition and are back to MIG off: read from the mock
//! driver's state on the node.

use anyhow::{Context, bail, ensure};
use e2e::eventually;
use e2e::real_nodes::{
    GuidePod, H100_NODE, RealNodes, WORKLOAD_NS, claim_pod, mock_fault_env, resource_pod,
};
use std::time::Duration;

/// What a partition's workload prints: the MIG device CDI gave it, its capability nodes.
const SHOW_MIG: &str =
    "env | grep '^NVIDIA_DRA_DEVICE_UUID_' | sort; ls /dev/nvidia-caps; sleep 3600";

/// The UUID of the H100 node's GPU of minor 0, as its slices publish it.
async fn first_gpu(cluster: &RealNodes) -> anyhow::Result<String> {
    cluster
        .published_devices(H100_NODE)
        .await?
        .into_iter()
        .find(|d| d.name == "gpu-0")
        .and_then(|d| d.attributes?.get("uuid")?.string.clone())
        .context("the H100 node publishes no gpu-0")
}

/// A pod `name` on one `mig.nvidia.com` partition of `profile` on GPU `gpu`, printing [`SHOW_MIG`].
fn partition_pod(name: &str, profile: &str, gpu: &str) -> String {
    let selector = format!(
        r#"device.attributes["gpu.nvidia.com"].profile == "{profile}" && device.attributes["gpu.nvidia.com"].parentUUID == "{gpu}""#
    );
    GuidePod::new(name)
        .on(H100_NODE)
        .class("mig.nvidia.com")
        .selector(&selector)
        .script(SHOW_MIG)
        .yaml()
}

/// The GPU instances on GPU `gpu` of the H100 node, as `(profile id, first slice)`, read from the
/// mock driver's state on the node; and whether MIG is on.
fn gpu_instances(cluster: &RealNodes, gpu: &str) -> anyhow::Result<(Vec<(u64, u64)>, bool)> {
    let path = cluster.node_dir(H100_NODE).join("run/mock-nvml/state.json");
    let state: serde_json::Value = match std::fs::read_to_string(&path) {
        Ok(text) => serde_json::from_str(&text)?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => serde_json::json!({}),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let mig = &state[gpu]["mig"];
    let mut found: Vec<(u64, u64)> = mig["gpuInstances"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|gi| {
            (
                gi["profileId"].as_u64().unwrap_or(99),
                gi["start"].as_u64().unwrap_or(99),
            )
        })
        .collect();
    found.sort();
    Ok((found, mig["current"].as_bool().unwrap_or(false)))
}

/// Waits until the H100 node's GPUs hold no GPU instance and are all back to MIG off (a Hopper GPU
/// changes mode in place, so the plugin leaves it as it found it).
async fn no_partition_left(cluster: &RealNodes) -> anyhow::Result<()> {
    eventually(
        Duration::from_secs(90),
        "no partition left, MIG off",
        || async {
            let path = cluster.node_dir(H100_NODE).join("run/mock-nvml/state.json");
            let state: serde_json::Value = match std::fs::read_to_string(&path) {
                Ok(text) => serde_json::from_str(&text)?,
                Err(_) => return Ok(Some(())),
            };
            let left: Vec<String> = state
                .as_object()
                .into_iter()
                .flatten()
                .filter(|(_, s)| {
                    let mig = &s["mig"];
                    mig["current"].as_bool() == Some(true)
                        || mig["gpuInstances"]
                            .as_array()
                            .is_some_and(|g| !g.is_empty())
                })
                .map(|(gpu, s)| format!("{gpu}: {}", s["mig"]))
                .collect();
            if left.is_empty() {
                Ok(Some(()))
            } else {
                bail!("left: {left:?}")
            }
        },
    )
    .await
}

/// The MIG UUIDs pod `pod` printed, once it printed them.
async fn seen_migs(cluster: &RealNodes, pod: &str) -> anyhow::Result<(Vec<String>, usize)> {
    eventually(
        Duration::from_secs(30),
        &format!("{pod}'s listing"),
        || async {
            let log = cluster.logs(pod, None).await?;
            let uuids: Vec<String> = log
                .lines()
                .filter_map(|l| l.split_once('=').map(|(_, v)| v.to_owned()))
                .filter(|v| v.starts_with("MIG-"))
                .collect();
            let caps = log.lines().filter(|l| l.starts_with("nvidia-cap")).count();
            Ok((!uuids.is_empty()).then_some((uuids, caps)))
        },
    )
    .await
}

/// The scheduler's reason for pod `pod` not being scheduled, empty while it is not refused.
fn unschedulable(cluster: &RealNodes, pod: &str) -> anyhow::Result<String> {
    cluster.jsonpath(
        "pod",
        pod,
        Some(WORKLOAD_NS),
        r#"{.status.conditions[?(@.reason=="Unschedulable")].message}"#,
    )
}

/// Writes the H100 node's mock fault control file (read where [`mock_fault_env`] names it):
/// `faults` for its 4 H100s.
fn set_h100_faults(cluster: &RealNodes, faults: &str) -> anyhow::Result<()> {
    let path = cluster
        .node_dir(H100_NODE)
        .join("var/lib/kubelet/mock-nvml-faults.json");
    let tmp = path.with_extension("tmp");
    let control = format!(
        r#"{{"profile": "h100-sxm5-80gb", "gpu_count": 4, "visible_dev_dir": "/dev", "faults": {faults}}}"#
    );
    std::fs::write(&tmp, control)?;
    std::fs::rename(&tmp, &path)?;
    Ok(())
}

/// A GPU class of the H100s offering whole cards and `1g.10gb` partitions.
const MIXED_CLASS: &str = r#"apiVersion: gpu-operator-rs.dev/v1alpha1
kind: GPUClass
metadata: {name: h100-mixed}
spec:
  selector:
    matchLabels: {gpu-operator-rs.dev/device: h100-80gb-hbm3}
  variants:
    whole: {}
    mig: {profiles: [1g.10gb]}
"#;

/// A ResourceClaim for one `1g.10gb` partition of GPU `gpu`, time-sliced, and two pods using it.
fn shared_partition(gpu: &str) -> String {
    let claim = format!(
        r#"apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {{name: shared-1g, namespace: {WORKLOAD_NS}}}
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: mig.nvidia.com
        selectors:
        - cel: {{expression: 'device.attributes["gpu.nvidia.com"].profile == "1g.10gb" && device.attributes["gpu.nvidia.com"].parentUUID == "{gpu}"'}}
    config:
    - requests: [gpu]
      opaque:
        driver: gpu.nvidia.com
        parameters: {{apiVersion: resource.nvidia.com/v1beta1, kind: MigDeviceConfig, sharing: {{strategy: TimeSlicing}}}}
"#
    );
    let pod = |name: &str| claim_pod(name, H100_NODE, "shared-1g", &[("workload", SHOW_MIG)]);
    format!("{claim}---\n{}---\n{}", pod("shared-a"), pod("shared-b"))
}

#[tokio::test]
#[ignore = "needs real nodes: make test-real-nodes runs it"]
async fn partitions_are_made_for_claims_side_by_side_and_gone_after_them() -> anyhow::Result<()> {
    let cluster = RealNodes::connect().await?;
    const PODS: &[&str] = &[
        "dyn-1g",
        "dyn-3g",
        "dyn-card",
        "mixed-card",
        "mixed-1g",
        "shared-a",
        "shared-b",
        "dyn-crash",
    ];
    const TEMPLATES: &[&str] = &["dyn-1g", "dyn-3g", "dyn-card", "dyn-crash"];
    let _cleanup = cluster.cleanup(&[
        ("pod", PODS),
        ("resourceclaim", &["shared-1g"]),
        ("resourceclaimtemplate", TEMPLATES),
        ("gpuclass", &["h100-mixed"]),
    ]);
    let gpu = first_gpu(&cluster).await?;
    let edit = cluster
        .edit_gpu_cluster(&[
            (
                "draDriver.gpus.migPartitioning",
                serde_json::json!("dynamic"),
            ),
            ("draDriver.gpus.kubeletPlugin.env", mock_fault_env()),
        ])
        .await?;
    cluster
        .step(
            "with migPartitioning dynamic the H100 node publishes, per GPU, its card and 25 partitions not made yet",
            H100_NODE,
            eventually(Duration::from_secs(90), "the partitions published", || async {
                let devices = cluster.published_devices(H100_NODE).await?;
                let partitions: Vec<_> = devices
                    .iter()
                    .filter(|d| d.name.starts_with("gpu-0-mig-"))
                    .collect();
                let without_uuid = partitions
                    .iter()
                    .all(|d| d.attributes.as_ref().is_some_and(|a| !a.contains_key("uuid")));
                if devices.len() == 4 * 26 && partitions.len() == 25 && without_uuid {
                    Ok(Some(()))
                } else {
                    bail!("{} devices, {} partitions of gpu-0", devices.len(), partitions.len())
                }
            }),
        )
        .await?;

    cluster.apply(&partition_pod("dyn-1g", "1g.10gb", &gpu))?;
    cluster.apply(&partition_pod("dyn-3g", "3g.40gb", &gpu))?;
    let made = cluster
        .step(
            "a 1g.10gb and a 3g.40gb claim on one H100 run side by side, each container with its own MIG device and its 2 capability nodes; the claim's status names the MIG device made",
            H100_NODE,
            async {
                cluster.wait_running(&["dyn-1g", "dyn-3g"], Duration::from_secs(120)).await?;
                let (one, one_caps) = seen_migs(&cluster, "dyn-1g").await?;
                let (three, three_caps) = seen_migs(&cluster, "dyn-3g").await?;
                ensure!(
                    one.len() == 1 && three.len() == 1 && one != three && one_caps == 2 && three_caps == 2,
                    "dyn-1g saw {one:?} ({one_caps} caps), dyn-3g saw {three:?} ({three_caps} caps)"
                );
                let status = eventually(Duration::from_secs(30), "dyn-3g's claim status", || async {
                    let claim = cluster.claim_of("dyn-3g").await?;
                    let devices = claim.status.and_then(|s| s.devices).unwrap_or_default();
                    Ok(devices
                        .first()
                        .and_then(|d| d.data.as_ref())
                        .and_then(|d| d.0.get("uuid")?.as_str().map(str::to_owned)))
                })
                .await?;
                ensure!(
                    status == three[0],
                    "kubectl shows dyn-3g's claim on {status}, its container got {three:?}"
                );
                let (instances, on) = gpu_instances(&cluster, &gpu)?;
                ensure!(
                    on && instances == vec![(9, 4), (19, 0)],
                    "the GPU holds {instances:?} (MIG on: {on}), want the 3g at 4 and the 1g at 0"
                );
                Ok(instances)
            },
        )
        .await?;

    cluster.apply(
        &GuidePod::new("dyn-card")
            .on(H100_NODE)
            .selector(&format!(
                r#"device.attributes["gpu.nvidia.com"].uuid == "{gpu}""#
            ))
            .script("nvidia-smi -L; sleep 3600")
            .yaml(),
    )?;
    cluster
        .step(
            "a whole-card claim on that GPU does not fit beside its partitions: Pending, the scheduler says why",
            H100_NODE,
            async {
                let reason = eventually(Duration::from_secs(60), "the scheduler's answer", || async {
                    let reason = unschedulable(&cluster, "dyn-card")?;
                    Ok((!reason.is_empty()).then_some(reason))
                })
                .await?;
                ensure!(reason.contains("cannot allocate all claims"), "dyn-card: {reason}");
                tokio::time::sleep(Duration::from_secs(5)).await;
                let phase = cluster.jsonpath("pod", "dyn-card", Some(WORKLOAD_NS), "{.status.phase}")?;
                ensure!(phase == "Pending", "dyn-card is {phase}");
                Ok(())
            },
        )
        .await?;
    cluster.delete("pod", &["dyn-1g", "dyn-3g"])?;
    cluster
        .step(
            "once both partitions' pods are gone, their partitions are destroyed and the whole-card claim runs, MIG turned off",
            H100_NODE,
            async {
                cluster.wait_running(&["dyn-card"], Duration::from_secs(180)).await?;
                let (instances, on) = gpu_instances(&cluster, &gpu)?;
                ensure!(instances.is_empty() && !on, "after {made:?}: {instances:?}, MIG on: {on}");
                Ok(())
            },
        )
        .await?;
    cluster.delete("pod", &["dyn-card"])?;

    cluster.apply(MIXED_CLASS)?;
    cluster.apply(&resource_pod(
        "mixed-card",
        "gpu-operator-rs.dev/h100-mixed",
        Some(H100_NODE),
        "nvidia-smi -L; sleep 3600",
    ))?;
    cluster.apply(&resource_pod(
        "mixed-1g",
        "gpu-operator-rs.dev/h100-mixed-mig-1g.10gb",
        Some(H100_NODE),
        SHOW_MIG,
    ))?;
    cluster
        .step(
            "one GPU class offers whole cards and dynamic partitions: a pod of each runs on the H100 node",
            H100_NODE,
            async {
                cluster.wait_running(&["mixed-card", "mixed-1g"], Duration::from_secs(180)).await?;
                let (migs, caps) = seen_migs(&cluster, "mixed-1g").await?;
                ensure!(migs.len() == 1 && caps == 2, "mixed-1g saw {migs:?}, {caps} caps");
                Ok(())
            },
        )
        .await?;
    cluster.delete("pod", &["mixed-card", "mixed-1g"])?;

    cluster.apply(&shared_partition(&gpu))?;
    cluster
        .step(
            "two pods time-slice one 1g.10gb partition: both run on the same MIG device",
            H100_NODE,
            async {
                cluster
                    .wait_running(&["shared-a", "shared-b"], Duration::from_secs(120))
                    .await?;
                let (a, _) = seen_migs(&cluster, "shared-a").await?;
                let (b, _) = seen_migs(&cluster, "shared-b").await?;
                ensure!(a.len() == 1 && a == b, "shared-a saw {a:?}, shared-b {b:?}");
                let (instances, _) = gpu_instances(&cluster, &gpu)?;
                ensure!(
                    instances == vec![(19, 0)],
                    "one partition made: {instances:?}"
                );
                Ok(())
            },
        )
        .await?;
    cluster.delete("pod", &["shared-a", "shared-b"])?;
    cluster.delete("resourceclaim", &["shared-1g"])?;
    no_partition_left(&cluster).await?;

    // The plugin is SIGKILLed while NVML makes the compute instance of a GPU instance it made.
    set_h100_faults(&cluster, r#"{"mig_stall": "create-compute-instance"}"#)?;
    cluster.apply(&partition_pod("dyn-crash", "1g.10gb", &gpu))?;
    let uid = cluster
        .step(
            "the claim's GPU instance is made and recorded, its compute instance hangs",
            H100_NODE,
            eventually(
                Duration::from_secs(90),
                "the GPU instance recorded",
                || async {
                    let Ok((uid, _)) = cluster.claimed("dyn-crash").await else {
                        return Ok(None);
                    };
                    let partition =
                        &cluster.checkpoint(H100_NODE)?["claims"][&uid]["partitions"][0];
                    Ok(partition["gpuInstance"].as_u64().map(|_| uid))
                },
            ),
        )
        .await?;
    cluster.kill_plugin(H100_NODE).await?;
    set_h100_faults(&cluster, "{}")?;
    cluster
        .step(
            "after the kill, the restarted plugin destroys the half-made partition and the kubelet's retry prepares the claim: one partition on the GPU",
            H100_NODE,
            async {
                cluster.wait_running(&["dyn-crash"], Duration::from_secs(180)).await?;
                let state = cluster.checkpointed(H100_NODE, &uid)?;
                let (instances, _) = gpu_instances(&cluster, &gpu)?;
                ensure!(
                    state == "PrepareCompleted" && instances == vec![(19, 0)],
                    "claim {state}, GPU instances {instances:?}"
                );
                let (migs, caps) = seen_migs(&cluster, "dyn-crash").await?;
                ensure!(migs.len() == 1 && caps == 2, "dyn-crash saw {migs:?}, {caps} caps");
                Ok(())
            },
        )
        .await?;
    cluster.delete("pod", &["dyn-crash"])?;
    cluster
        .step(
            "no partition left on the node's GPUs, each back to MIG off",
            H100_NODE,
            no_partition_left(&cluster),
        )
        .await?;
    edit.undo().await
}
