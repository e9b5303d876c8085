//! GPUClasses and extended resources: a pod that asks `nvidia.com/gpu` or a class's resource, with
//! no claim in its manifest, is served by a DRA claim the scheduler makes; a class's shared variant
//! puts pods on shares of one card, time-sliced or through the MPS daemons an admin runs.

use crate::{delete_class, ran_on_gpus};
use anyhow::ensure;
use api::GPUClass;
use e2e::eventually;
use e2e::real_nodes::{
    Cleanup, H100_NODE, LIST_GPUS, RealNodes, WORKLOAD_NS, gpu_class, resource_pod,
};
use kube::api::Api;
use std::process::Child;
use std::time::Duration;

/// The H100s' `gpu-operator-rs.dev/device` label.
const H100: &str = "h100-80gb-hbm3";
/// The extended resource of class `h100s`'s shared variant.
const H100_SHARE: &str = "gpu-operator-rs.dev/h100s-shared";

/// The claim the scheduler made for pod `pod`'s extended resource.
fn extended_claim(cluster: &RealNodes, pod: &str) -> anyhow::Result<String> {
    let claim = cluster.jsonpath(
        "pod",
        pod,
        Some(WORKLOAD_NS),
        "{.status.extendedResourceClaimStatus.resourceClaimName}",
    )?;
    ensure!(!claim.is_empty(), "{pod} has no extended-resource claim");
    Ok(claim)
}

/// The device and share id allocated to pod `pod`'s extended-resource claim.
fn share_of(cluster: &RealNodes, pod: &str) -> anyhow::Result<(String, String)> {
    let claim = extended_claim(cluster, pod)?;
    let said = cluster.jsonpath(
        "resourceclaim",
        &claim,
        Some(WORKLOAD_NS),
        "{.status.allocation.devices.results[0].device} {.status.allocation.devices.results[0].shareID}",
    )?;
    let (device, share) = said.split_once(' ').unwrap_or((said.as_str(), ""));
    Ok((device.to_owned(), share.to_owned()))
}

/// Waits until GPUClass `name` counts `devices` devices; its status when it does not.
async fn class_counts(cluster: &RealNodes, name: &str, devices: i64) -> anyhow::Result<()> {
    eventually(
        Duration::from_secs(60),
        &format!("GPUClass {name} to count {devices} devices"),
        || async {
            let class = Api::<GPUClass>::all(cluster.client.clone())
                .get(name)
                .await?;
            let status = class.status.unwrap_or_default();
            if status.devices == devices {
                Ok(Some(status))
            } else {
                Err(anyhow::anyhow!("its status: {status:?}"))
            }
        },
    )
    .await
    .map(drop)
}

/// Waits until no GPUClass shares of the H100s are published (a class of an earlier scenario
/// is gone with its shares).
async fn no_h100_shares(cluster: &RealNodes) -> anyhow::Result<()> {
    eventually(
        Duration::from_secs(60),
        "the H100s published whole only",
        || async {
            let shared: Vec<String> = cluster
                .published_devices(H100_NODE)
                .await?
                .into_iter()
                .map(|d| d.name)
                .filter(|n| n.contains("shared"))
                .collect();
            if shared.is_empty() {
                Ok(Some(()))
            } else {
                Err(anyhow::anyhow!("{H100_NODE} publishes {shared:?}"))
            }
        },
    )
    .await
}

/// Deletes the scenario's pods (`cleanup`) and GPUClass h100s, then waits for the class and its
/// DeviceClasses to go and the H100s to be published whole again.
async fn unshared_once_deleted(cluster: &RealNodes, cleanup: Cleanup<'_>) -> anyhow::Result<()> {
    drop(cleanup);
    cluster
        .step(
            "once GPUClass h100s is deleted, its DeviceClasses are gone and the H100s are published whole only",
            H100_NODE,
            async {
                delete_class(cluster, "h100s").await?;
                no_h100_shares(cluster).await
            },
        )
        .await
}

#[tokio::test]
#[ignore = "needs real nodes: make test-real-nodes runs it"]
async fn a_pod_asking_an_extended_resource_is_served_through_a_dra_claim() -> anyhow::Result<()> {
    let cluster = RealNodes::connect().await?;
    let _cleanup = cluster.cleanup(&[
        ("pod", &["mapped-workload", "class-workload"]),
        ("gpuclass", &["h100"]),
    ]);
    // The same extended resource a device-plugin node offers: DeviceClass gpu.nvidia.com maps it,
    // so the scheduler gives the pod a claim of that class and the DRA plugin prepares it.
    cluster
        .step(
            "a pod asking nvidia.com/gpu: 1 on a DRA node ran with one of its GPUs, through a DRA claim of class gpu.nvidia.com",
            H100_NODE,
            async {
                let mapped = cluster.jsonpath(
                    "deviceclass",
                    "gpu.nvidia.com",
                    None,
                    "{.spec.extendedResourceName}",
                )?;
                ensure!(mapped == "nvidia.com/gpu", "DeviceClass gpu.nvidia.com maps {mapped:?}");
                cluster.apply(&resource_pod("mapped-workload", "nvidia.com/gpu", Some(H100_NODE), LIST_GPUS))?;
                ran_on_gpus(&cluster, "mapped-workload", H100_NODE, 1).await?;
                extended_claim(&cluster, "mapped-workload").map(drop)
            },
        )
        .await?;
    // The guide's application move: a GPUClass names the H100s, and a pod that asked
    // nvidia.com/gpu asks the class's extended resource instead, with no node binding.
    cluster.apply(&gpu_class("h100", H100, None))?;
    cluster
        .step(
            "GPUClass h100 offers gpu-operator-rs.dev/h100 on the 4 H100s, and a pod asking it lands on one of them",
            H100_NODE,
            async {
                class_counts(&cluster, "h100", 4).await?;
                let offered = cluster.jsonpath("gpuclass", "h100", None, "{.status.extendedResourceNames}")?;
                ensure!(offered == r#"["gpu-operator-rs.dev/h100"]"#, "GPUClass h100 offers {offered}");
                cluster.apply(&resource_pod("class-workload", "gpu-operator-rs.dev/h100", None, LIST_GPUS))?;
                ran_on_gpus(&cluster, "class-workload", H100_NODE, 1).await?;
                extended_claim(&cluster, "class-workload").map(drop)
            },
        )
        .await?;
    cluster
        .step(
            "GPUClass h100 deleted: it and its DeviceClass are gone",
            H100_NODE,
            delete_class(&cluster, "h100"),
        )
        .await
}

#[tokio::test]
#[ignore = "needs real nodes: make test-real-nodes runs it"]
async fn two_pods_share_one_h100_through_a_time_sliced_class() -> anyhow::Result<()> {
    let cluster = RealNodes::connect().await?;
    let cleanup = cluster.cleanup(&[("pod", &["share-a", "share-b"]), ("gpuclass", &["h100s"])]);
    no_h100_shares(&cluster).await?;
    cluster.apply(&gpu_class("h100s", H100, Some((2, "TimeSlicing"))))?;
    cluster
        .step(
            "GPUClass h100s (2 shares a card, time-sliced) counts the 4 H100s",
            H100_NODE,
            class_counts(&cluster, "h100s", 4),
        )
        .await?;
    let script = format!("{LIST_GPUS}; sleep 20");
    for pod in ["share-a", "share-b"] {
        cluster.apply(&resource_pod(pod, H100_SHARE, None, &script))?;
    }
    cluster
        .step(
            "share-a and share-b run at once on two shares of one H100, each through the claim the scheduler made",
            H100_NODE,
            async {
                cluster
                    .wait_running(&["share-a", "share-b"], Duration::from_secs(120))
                    .await?;
                let (a, b) = (share_of(&cluster, "share-a")?, share_of(&cluster, "share-b")?);
                ensure!(
                    a.0 == b.0 && a.0.ends_with("-shared-h100s") && !a.1.is_empty() && a.1 != b.1,
                    "share-a holds {a:?}, share-b {b:?}: not two shares of one H100"
                );
                Ok(())
            },
        )
        .await?;
    cluster
        .step(
            "both shared pods saw that same H100, and only it, through nvidia-smi -L",
            H100_NODE,
            async {
                let a = ran_on_gpus(&cluster, "share-a", H100_NODE, 1).await?;
                let b = ran_on_gpus(&cluster, "share-b", H100_NODE, 1).await?;
                ensure!(a == b, "share-a saw {a:?}, share-b {b:?}");
                Ok(())
            },
        )
        .await?;
    unshared_once_deleted(&cluster, cleanup).await
}

/// The MPS control daemons an admin runs on a node, one per GPU with its pipe directory at
/// `/run/nvidia/mps/<GPU UUID>` (docs/gpu-classes.md): the driver's stand-in run inside the node.
/// Dropping them asks each to quit, kills what does not, and removes their directories.
struct AdminDaemons<'a> {
    cluster: &'a RealNodes,
    node: &'a str,
    uuids: Vec<String>,
    children: Vec<Child>,
}

impl<'a> AdminDaemons<'a> {
    fn start(cluster: &'a RealNodes, node: &'a str, uuids: Vec<String>) -> anyhow::Result<Self> {
        let mut daemons = Self {
            cluster,
            node,
            uuids: Vec::new(),
            children: Vec::new(),
        };
        for uuid in uuids {
            let pipes = format!("CUDA_MPS_PIPE_DIRECTORY=/run/nvidia/mps/{uuid}");
            let logs = format!("CUDA_MPS_LOG_DIRECTORY=/run/nvidia/mps/{uuid}/log");
            let child = cluster.node_spawn(
                node,
                &["env", &pipes, &logs, "nvidia-cuda-mps-control", "-f"],
            )?;
            daemons.children.push(child);
            daemons.uuids.push(uuid);
        }
        Ok(daemons)
    }

    /// The daemons' folder on this host.
    fn root(&self) -> std::path::PathBuf {
        self.cluster.node_dir(self.node).join("run/nvidia/mps")
    }

    /// How many times the daemons logged `command` from a client.
    fn logged(&self, command: &str) -> usize {
        self.uuids
            .iter()
            .map(|u| {
                let log = self.root().join(u).join("log/control.log");
                let text = std::fs::read_to_string(log).unwrap_or_default();
                text.matches(&format!("Command: {command}")).count()
            })
            .sum()
    }
}

impl Drop for AdminDaemons<'_> {
    fn drop(&mut self) {
        for uuid in &self.uuids {
            let quit = format!(
                "echo quit | CUDA_MPS_PIPE_DIRECTORY=/run/nvidia/mps/{uuid} nvidia-cuda-mps-control"
            );
            if let Err(e) = self.cluster.node_exec(self.node, &["sh", "-c", &quit]) {
                eprintln!("asking the MPS daemon of {uuid} to quit: {e:#}");
            }
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        for child in &mut self.children {
            while matches!(child.try_wait(), Ok(None)) && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(200));
            }
            if matches!(child.try_wait(), Ok(None)) {
                eprintln!("an MPS daemon did not quit: killing it");
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        for uuid in &self.uuids {
            let _ = std::fs::remove_dir_all(self.root().join(uuid));
        }
    }
}

#[tokio::test]
#[ignore = "needs real nodes: make test-real-nodes runs it"]
async fn pods_on_an_mps_class_reach_the_admins_daemons_with_half_the_card_each()
-> anyhow::Result<()> {
    let cluster = RealNodes::connect().await?;
    no_h100_shares(&cluster).await?;
    let uuids: Vec<String> = crate::published_gpus(&cluster, H100_NODE)
        .await?
        .into_iter()
        .map(|(uuid, _)| uuid)
        .collect();
    let daemons = AdminDaemons::start(&cluster, H100_NODE, uuids)?;
    // Dropped before the daemons: the pods and the class go first.
    let cleanup = cluster.cleanup(&[("pod", &["mps-a", "mps-b"]), ("gpuclass", &["h100s"])]);
    cluster
        .step(
            "the admin's MPS control daemons listen, one per H100",
            H100_NODE,
            eventually(
                Duration::from_secs(30),
                "each daemon's control socket",
                || async {
                    let missing: Vec<&String> = daemons
                        .uuids
                        .iter()
                        .filter(|u| !daemons.root().join(u).join("control").exists())
                        .collect();
                    if missing.is_empty() {
                        Ok(Some(()))
                    } else {
                        Err(anyhow::anyhow!("no control socket for {missing:?}"))
                    }
                },
            ),
        )
        .await?;
    cluster.apply(&gpu_class("h100s", H100, Some((2, "MPS"))))?;
    cluster
        .step(
            "GPUClass h100s (2 shares a card, MPS) counts the 4 H100s",
            H100_NODE,
            class_counts(&cluster, "h100s", 4),
        )
        .await?;
    let script = "env | grep ^CUDA_MPS_ | sort; echo get_default_active_thread_percentage | nvidia-cuda-mps-control; sleep 20";
    for pod in ["mps-a", "mps-b"] {
        cluster.apply(&resource_pod(pod, H100_SHARE, None, script))?;
    }
    cluster
        .step(
            "mps-a and mps-b get their daemon's pipe directory and half the card as limits, and reach that daemon with the driver's client",
            H100_NODE,
            async {
                cluster
                    .wait_running(&["mps-a", "mps-b"], Duration::from_secs(120))
                    .await?;
                for pod in ["mps-a", "mps-b"] {
                    let log = eventually(Duration::from_secs(30), &format!("{pod}'s answer"), || async {
                        let log = cluster.logs(pod, None).await?;
                        Ok((log.lines().count() >= 4).then_some(log))
                    })
                    .await?;
                    let lines: Vec<&str> = log.lines().map(str::trim).collect();
                    // Half the card's memory, as a share of its threads too (49 where the half
                    // is rounded down); the admin's daemon answers its own default.
                    let half = lines.iter().any(|l| {
                        matches!(
                            l.strip_prefix("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="),
                            Some("49" | "50")
                        )
                    });
                    let memory = lines
                        .iter()
                        .any(|l| l.starts_with("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0="));
                    ensure!(
                        half && memory
                            && lines.contains(&"CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps")
                            && lines.contains(&"100.0"),
                        "{pod} on {:?} saw: {log}",
                        share_of(&cluster, pod)?
                    );
                }
                Ok(())
            },
        )
        .await?;
    cluster
        .step(
            "the admin's daemons logged the 2 pods' queries",
            H100_NODE,
            async {
                let asked = daemons.logged("get_default_active_thread_percentage");
                ensure!(asked == 2, "the daemons logged {asked} queries, not 2");
                Ok(())
            },
        )
        .await?;
    unshared_once_deleted(&cluster, cleanup).await
}
