//! Claims written for the upstream driver's sharing API: time-slicing with an interval, MPS with a
//! control daemon of the claim's own, and consumable shares of a GPU.

use anyhow::{Context, ensure};
use e2e::eventually;
use e2e::real_nodes::{
    GPU_NODES, H100_NODE, L4_NODE, OPERATOR_NS, RealNodes, WORKLOAD_NS, claim_pod, gpu_uuids,
    named_claim_pod, sharing_claim,
};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::Api;
use std::time::Duration;

/// The compute time-slice the node's own `nvidia-smi` shows for GPU `uuid` (`SHORT`, `DEFAULT`).
fn node_timeslice(cluster: &RealNodes, node: &str, uuid: &str) -> anyhow::Result<String> {
    let out = cluster.node_exec(node, &["nvidia-smi", "compute-policy", "-l", "-i", uuid])?;
    out.lines()
        .find_map(|l| l.split_once("Timeslice ").map(|(_, v)| v.trim().to_owned()))
        .with_context(|| format!("no Timeslice in nvidia-smi's answer: {out}"))
}

/// The first GPU UUID pod `pod` printed, once it printed one.
async fn uuid_seen(cluster: &RealNodes, pod: &str) -> anyhow::Result<String> {
    eventually(
        Duration::from_secs(30),
        &format!("{pod} to list its GPU"),
        || async {
            Ok(gpu_uuids(&cluster.logs(pod, None).await?)
                .into_iter()
                .next())
        },
    )
    .await
}

/// The claim's `status.devices` entries of our driver: "pool uuid productName Ready=<status>".
async fn held_by(cluster: &RealNodes, claim: &str) -> anyhow::Result<Vec<String>> {
    let claim = Api::<ResourceClaim>::namespaced(cluster.client.clone(), WORKLOAD_NS)
        .get(claim)
        .await?;
    let devices = claim.status.and_then(|s| s.devices).unwrap_or_default();
    Ok(devices
        .into_iter()
        .filter(|d| d.driver == "gpu.nvidia.com")
        .map(|d| {
            let data = d.data.map(|r| r.0).unwrap_or_default();
            let ready = d
                .conditions
                .iter()
                .flatten()
                .find(|c| c.type_ == "Ready")
                .map_or("none", |c| c.status.as_str())
                .to_owned();
            format!(
                "{} {} {} Ready={ready}",
                d.pool,
                data["uuid"].as_str().unwrap_or_default(),
                data["productName"].as_str().unwrap_or_default()
            )
        })
        .collect())
}

#[tokio::test]
#[ignore = "needs real nodes: make test-real-nodes runs it"]
async fn a_time_sliced_claim_sets_the_gpus_interval_and_its_status_says_what_it_holds()
-> anyhow::Result<()> {
    let cluster = RealNodes::connect().await?;
    let _cleanup = cluster.cleanup(&[("pod", &["ts-a", "ts-b"]), ("resourceclaim", &["ts-short"])]);
    // The upstream quickstart's shape: one claim asking for TimeSlicing with interval Short,
    // named by two pods.
    cluster.apply(&sharing_claim(
        "ts-short",
        "{strategy: TimeSlicing, timeSlicingConfig: {interval: Short}}",
    ))?;
    for pod in ["ts-a", "ts-b"] {
        let script = "nvidia-smi -L; sleep 3600";
        cluster.apply(&claim_pod(pod, H100_NODE, "ts-short", &[("ctr", script)]))?;
    }
    let uuid = cluster
        .step(
            "ts-a and ts-b run on one GPU through one claim, and the node's nvidia-smi shows Timeslice SHORT for it",
            H100_NODE,
            async {
                cluster
                    .wait_running(&["ts-a", "ts-b"], Duration::from_secs(120))
                    .await?;
                let (a, b) = (uuid_seen(&cluster, "ts-a").await?, uuid_seen(&cluster, "ts-b").await?);
                ensure!(a == b, "ts-a saw {a}, ts-b saw {b}");
                let slice = node_timeslice(&cluster, H100_NODE, &a)?;
                ensure!(slice == "SHORT", "the node's nvidia-smi shows Timeslice {slice} for {a}");
                Ok(a)
            },
        )
        .await?;

    cluster
        .step(
            "ts-short's status.devices names the GPU it holds, Ready (docs/claim-status.md)",
            H100_NODE,
            eventually(
                Duration::from_secs(30),
                "the plugin's status entry",
                || async {
                    let held = held_by(&cluster, "ts-short").await?;
                    let wanted = format!("{H100_NODE} {uuid} NVIDIA ");
                    match held.as_slice() {
                        [one] if one.starts_with(&wanted) && one.ends_with(" Ready=True") => {
                            Ok(Some(()))
                        }
                        _ => Err(anyhow::anyhow!(
                            "status.devices says {held:?}, want {wanted}... Ready=True"
                        )),
                    }
                },
            ),
        )
        .await?;

    // Granular status authorization (1.36+): only the plugin of the claim's node may write our
    // entries. The token of each node's plugin pod tries a dry-run patch of the claim's status.
    if cluster.server_minor().await? >= 36 {
        cluster
            .step(
                "real-gpu-0's plugin token may change ts-short's status entries; real-gpu-1's is refused",
                H100_NODE,
                async {
                    let claim = Api::<ResourceClaim>::namespaced(cluster.client.clone(), WORKLOAD_NS)
                        .get("ts-short")
                        .await?;
                    let device = claim
                        .status
                        .and_then(|s| s.allocation)
                        .and_then(|a| a.devices)
                        .and_then(|d| d.results?.into_iter().next())
                        .map(|r| r.device)
                        .context("ts-short has no allocated device")?;
                    let entry = serde_json::json!({"status": {"devices": [
                        {"driver": "gpu.nvidia.com", "pool": H100_NODE, "device": device}]}})
                    .to_string();
                    let patch = [
                        "-n", WORKLOAD_NS, "patch", "resourceclaim", "ts-short",
                        "--subresource=status", "--type=merge", "-p", entry.as_str(), "--dry-run=server",
                    ];
                    let mut answers = Vec::new();
                    for node in [H100_NODE, L4_NODE] {
                        let kubeconfig = cluster.plugin_kubeconfig(node).await?;
                        answers.push(cluster.kubectl_as(&kubeconfig, &patch)?);
                    }
                    let [own, other] = answers.as_slice() else {
                        unreachable!("two nodes asked")
                    };
                    // kubectl says "patched" for a dry run of a subresource patch too.
                    ensure!(own.contains("ts-short patched"), "real-gpu-0's plugin token: {own}");
                    ensure!(other.contains("status.devices: Forbidden"), "real-gpu-1's plugin token: {other}");
                    Ok(())
                },
            )
            .await?;
    } else {
        eprintln!("skip the status authorization check: the apiserver is older than 1.36");
    }

    cluster.delete("pod", &["ts-a", "ts-b"])?;
    cluster
        .step(
            "once ts-a and ts-b are gone, ts-short's status.devices has no entry of the plugin's",
            H100_NODE,
            eventually(
                Duration::from_secs(60),
                "the status entry to go",
                || async {
                    let held = held_by(&cluster, "ts-short").await?;
                    if held.is_empty() {
                        Ok(Some(()))
                    } else {
                        Err(anyhow::anyhow!("status.devices still says {held:?}"))
                    }
                },
            ),
        )
        .await?;
    cluster.delete("resourceclaim", &["ts-short"])?;
    cluster
        .step(
            "after the pods and the claim are gone, the GPU is back at Timeslice DEFAULT",
            H100_NODE,
            eventually(Duration::from_secs(60), "Timeslice DEFAULT", || async {
                let slice = node_timeslice(&cluster, H100_NODE, &uuid)?;
                if slice == "DEFAULT" {
                    Ok(Some(()))
                } else {
                    Err(anyhow::anyhow!("{uuid} shows Timeslice {slice}"))
                }
            }),
        )
        .await
}

#[tokio::test]
#[ignore = "needs real nodes: make test-real-nodes runs it"]
async fn an_mps_claim_runs_its_own_control_daemon_until_its_pod_goes() -> anyhow::Result<()> {
    let cluster = RealNodes::connect().await?;
    let _cleanup = cluster.cleanup(&[("pod", &["mps-pod"]), ("resourceclaim", &["mps-claim"])]);
    // The upstream driver's documented shape: MPS with a thread percentage and a pinned memory
    // limit, used by two containers of one pod.
    cluster.apply(&sharing_claim(
        "mps-claim",
        "{strategy: MPS, mpsConfig: {defaultActiveThreadPercentage: 50, defaultPinnedDeviceMemoryLimit: 10Gi}}",
    ))?;
    let script = "env | grep ^CUDA_MPS_; echo get_default_active_thread_percentage | nvidia-cuda-mps-control; sleep 3600";
    cluster.apply(&claim_pod(
        "mps-pod",
        H100_NODE,
        "mps-claim",
        &[("ctr-a", script), ("ctr-b", script)],
    ))?;
    let uid = Api::<ResourceClaim>::namespaced(cluster.client.clone(), WORKLOAD_NS)
        .get("mps-claim")
        .await?
        .metadata
        .uid
        .context("mps-claim has no uid")?;
    let daemon_pod = format!("mps-{uid}");
    let claim_dir = cluster
        .node_dir(H100_NODE)
        .join(format!("run/nvidia/mps/claim-{uid}"));

    cluster
        .step(
            "both containers see the claim's MPS limits and pipe directory, and its daemon answers 50.0",
            H100_NODE,
            async {
                cluster
                    .wait_running(&["mps-pod"], Duration::from_secs(120))
                    .await?;
                for ctr in ["ctr-a", "ctr-b"] {
                    let log = eventually(Duration::from_secs(60), &format!("{ctr}'s answer"), || async {
                        let log = cluster.logs("mps-pod", Some(ctr)).await?;
                        Ok((log.lines().count() >= 5).then_some(log))
                    })
                    .await?;
                    let lines: Vec<&str> = log.lines().map(str::trim).collect();
                    for wanted in [
                        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50",
                        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=10240M",
                        "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",
                        "50.0",
                    ] {
                        ensure!(lines.contains(&wanted), "{ctr} did not print {wanted}: {log}");
                    }
                }
                Ok(())
            },
        )
        .await?;

    cluster
        .step(
            "the claim's daemon runs in its own pod on the node with the claim's GPU and limits",
            H100_NODE,
            async {
                let pod = Api::<Pod>::namespaced(cluster.client.clone(), OPERATOR_NS)
                    .get(&daemon_pod)
                    .await?;
                let node = pod.spec.and_then(|s| s.node_name).unwrap_or_default();
                let phase = pod.status.and_then(|s| s.phase).unwrap_or_default();
                ensure!(
                    node == H100_NODE && phase == "Running",
                    "{OPERATOR_NS}/{daemon_pod} is {phase} on {node}"
                );
                let log = std::fs::read_to_string(claim_dir.join("log/control.log"))
                    .with_context(|| format!("the daemon's log in {}", claim_dir.display()))?;
                let started = log
                    .lines()
                    .find(|l| l.contains("Startup:"))
                    .unwrap_or_default();
                let in_order = ["devices GPU-", "percentage 50.0", "10240M"]
                    .iter()
                    .try_fold(0, |from, part| {
                        started[from..].find(part).map(|i| from + i + part.len())
                    });
                ensure!(in_order.is_some(), "the daemon's startup line: {started:?}");
                Ok(())
            },
        )
        .await?;

    cluster.delete("pod", &["mps-pod"])?;
    cluster.delete("resourceclaim", &["mps-claim"])?;
    cluster
        .step(
            "once the pod is gone, so are the claim's daemon pod and its directory on the node",
            H100_NODE,
            eventually(Duration::from_secs(90), "the daemon to go", || async {
                let pod = Api::<Pod>::namespaced(cluster.client.clone(), OPERATOR_NS)
                    .get_opt(&daemon_pod)
                    .await?;
                match (pod, claim_dir.exists()) {
                    (None, false) => Ok(Some(())),
                    (pod, dir) => Err(anyhow::anyhow!(
                        "daemon pod present: {}, {} present: {dir}",
                        pod.is_some(),
                        claim_dir.display()
                    )),
                }
            }),
        )
        .await
}

/// The shares offered on the L4 whose UUID is `uuid`.
async fn offered_shares(cluster: &RealNodes, uuid: &str) -> anyhow::Result<Option<String>> {
    Ok(cluster
        .published_devices(L4_NODE)
        .await?
        .into_iter()
        .find(|d| {
            d.attributes
                .as_ref()
                .and_then(|a| a.get("uuid")?.string.as_deref())
                == Some(uuid)
        })
        .and_then(|d| Some(d.capacity?.get("shares")?.value.0.clone())))
}

/// The phases of workload pods `names`, in order.
async fn phases(cluster: &RealNodes, names: &[&str]) -> anyhow::Result<Vec<String>> {
    let mut said = Vec::new();
    for name in names {
        let pod = cluster.pod(name).await?;
        said.push(
            pod.and_then(|p| p.status?.phase)
                .unwrap_or_else(|| "Absent".into()),
        );
    }
    Ok(said)
}

#[tokio::test]
#[ignore = "needs real nodes: make test-real-nodes runs it"]
async fn consumable_shares_of_one_l4_fill_up_and_a_freed_share_is_taken() -> anyhow::Result<()> {
    let cluster = RealNodes::connect().await?;
    if cluster.server_minor().await? <= 34 {
        eprintln!(
            "skip consumable shares: the apiserver serves consumable capacity only as alpha before 1.35"
        );
        return Ok(());
    }
    const NAMES: &[&str] = &["cs-a", "cs-b", "cs-c", "cs-whole"];
    // Dropped last: the GPUs go back to whole once the claims are gone.
    let whole_again = cluster
        .edit_gpu_cluster(&[("draDriver.gpus.consumableShares", "2".into())])
        .await?;
    let cleanup = cluster.cleanup(&[("pod", NAMES), ("resourceclaim", NAMES)]);
    let l4 = cluster
        .step(
            "with consumableShares: 2 in the GPUCluster, real-gpu-1's GPUs are offered as 2 consumable shares",
            L4_NODE,
            eventually(Duration::from_secs(90), "shares offered", || async {
                let mut uuids: Vec<String> = crate::published_gpus(&cluster, L4_NODE)
                    .await?
                    .into_iter()
                    .map(|(uuid, _)| uuid)
                    .collect();
                uuids.sort();
                let Some(l4) = uuids.into_iter().next() else {
                    return Ok(None);
                };
                let offered = offered_shares(&cluster, &l4).await?;
                if offered.as_deref() == Some("2") {
                    Ok(Some(l4))
                } else {
                    Err(anyhow::anyhow!("{l4} offers shares {offered:?}"))
                }
            }),
        )
        .await?;
    // Claims as upstream documents them: `shares: 1` of the one L4, pinned by its UUID.
    let on_l4 = format!("device.attributes['gpu.nvidia.com'].uuid == '{l4}'");
    let share_pod = |name: &str, shares: Option<u32>| {
        named_claim_pod(name, L4_NODE, "gpu.nvidia.com", Some(&on_l4), shares)
    };
    cluster.apply(&share_pod("cs-a", Some(1)))?;
    cluster.apply(&share_pod("cs-b", Some(1)))?;
    cluster
        .step(
            "cs-a and cs-b run together on that L4, with shares: 1 each",
            L4_NODE,
            cluster.wait_running(&["cs-a", "cs-b"], Duration::from_secs(120)),
        )
        .await?;
    cluster.apply(&share_pod("cs-c", Some(1)))?;
    cluster.apply(&share_pod("cs-whole", None))?;
    cluster
        .step(
            "with both shares used, a third share claim and a whole-GPU claim for that L4 wait (Pending)",
            L4_NODE,
            async {
                tokio::time::sleep(Duration::from_secs(10)).await;
                let said = phases(&cluster, &["cs-c", "cs-whole"]).await?;
                ensure!(said == ["Pending", "Pending"], "cs-c and cs-whole are {said:?}");
                Ok(())
            },
        )
        .await?;
    cluster.delete("pod", &["cs-a"])?;
    cluster.delete("resourceclaim", &["cs-a"])?;
    cluster
        .step(
            "once cs-a's share is freed cs-c runs on it; the whole-GPU claim still waits",
            L4_NODE,
            async {
                cluster
                    .wait_running(&["cs-c"], Duration::from_secs(90))
                    .await?;
                let said = phases(&cluster, &["cs-whole"]).await?;
                ensure!(said == ["Pending"], "cs-whole is {said:?}");
                Ok(())
            },
        )
        .await?;
    drop(cleanup);
    cluster
        .step(
            "once the share pods are gone and consumableShares is set back, every node publishes its GPUs whole",
            L4_NODE,
            async {
                eventually(Duration::from_secs(60), "the share pods to go", || async {
                    let said = phases(&cluster, NAMES).await?;
                    Ok(said.iter().all(|p| p == "Absent").then_some(()))
                })
                .await?;
                whole_again.undo().await?;
                eventually(Duration::from_secs(30), "no shares offered", || async {
                    for node in GPU_NODES {
                        let shared = cluster
                            .published_devices(node)
                            .await?
                            .into_iter()
                            .filter(|d| d.capacity.as_ref().is_some_and(|c| c.contains_key("shares")))
                            .count();
                        ensure!(shared == 0, "{node} still offers {shared} devices in shares");
                    }
                    Ok(Some(()))
                })
                .await
            },
        )
        .await
}
