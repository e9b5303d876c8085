//! `kubectl gpu` run as kubectl runs a plugin, against what the cluster really holds: the GPU
//! nodes with their planes and GPUs, a running pod's claim with the GPU its `nvidia-smi` saw, and
//! why pods wait (a DeviceClass typo, more GPUs than there are). `migration --watch` runs in the
//! hand-over scenario (`handover::`).

use anyhow::{Context, ensure};
use api::physicalgpu::PhysicalGPU;
use e2e::real_nodes::{
    GPU_NODES, GPULESS_NODE, GuidePod, L4_NODE, RealNodes, WORKLOAD_NS, gpu_uuids, named_claim_pod,
};
use kube::api::{Api, ListParams};
use serde_json::Value;
use std::time::Duration;

/// The table row of `kubectl gpu nodes` for `node`, split into its columns.
fn row<'a>(table: &'a str, node: &str) -> Option<Vec<&'a str>> {
    table
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|cols| cols.first() == Some(&node))
}

#[tokio::test]
#[ignore = "needs real nodes: make test-real-nodes runs it"]
async fn kubectl_gpu_shows_the_nodes_a_pods_gpu_and_why_pods_wait() -> anyhow::Result<()> {
    let cluster = RealNodes::connect().await?;
    const NAMES: &[&str] = &["gpu-view", "why-typo", "too-many"];
    let _cleanup = cluster.cleanup(&[
        ("pod", NAMES),
        ("resourceclaim", &NAMES[..2]),
        ("resourceclaimtemplate", &NAMES[2..]),
    ]);
    cluster.apply(&named_claim_pod(
        "gpu-view",
        L4_NODE,
        "gpu.nvidia.com",
        None,
        None,
    ))?;
    cluster
        .wait_running(&["gpu-view"], Duration::from_secs(120))
        .await?;

    cluster
        .step(
            "kubectl gpu nodes: every GPU node on dra and ready, its GPUs healthy of total as its PhysicalGPUs say, the one real-gpu-1 GPU gpu-view holds in use, no GPU-less node",
            L4_NODE,
            async {
                let table = cluster.kubectl_gpu(&["nodes"])?;
                let gpus = Api::<PhysicalGPU>::all(cluster.client.clone())
                    .list(&ListParams::default())
                    .await?
                    .items;
                for node in GPU_NODES {
                    let cols = row(&table, node).with_context(|| format!("no row for {node}:\n{table}"))?;
                    let total = gpus
                        .iter()
                        .filter(|g| g.status.as_ref().is_some_and(|s| s.node == node))
                        .count();
                    // NODE PLANE WANTED READY HANDOVER GPUS IN-USE DRIVER
                    let in_use = if node == L4_NODE { "1" } else { "0" };
                    let want = [node, "dra", "dra", "yes", "-", &format!("{total}/{total}"), in_use];
                    ensure!(cols[..7] == want, "{node}: {cols:?}, want {want:?} in\n{table}");
                }
                ensure!(row(&table, GPULESS_NODE).is_none(), "the GPU-less node is listed:\n{table}");
                let json: Value = serde_json::from_str(&cluster.kubectl_gpu(&["nodes", "-o", "json"])?)?;
                let listed: Vec<&str> = json
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|n| n["node"].as_str())
                    .collect();
                ensure!(
                    GPU_NODES.iter().all(|n| listed.contains(n)) && !listed.contains(&GPULESS_NODE),
                    "-o json: {json}"
                );
                eprintln!("{table}");
                Ok(())
            },
        )
        .await?;

    cluster
        .step(
            "kubectl gpu claims: gpu-view's claim, its pod and node, and the UUID of the GPU its nvidia-smi listed; kubectl gpu why gpu-view says the same",
            L4_NODE,
            async {
                let seen = gpu_uuids(&cluster.logs("gpu-view", None).await?);
                ensure!(seen.len() == 1, "gpu-view listed {seen:?}");
                let json: Value = serde_json::from_str(&cluster.kubectl_gpu(&["claims", "-n", WORKLOAD_NS, "-o", "json"])?)?;
                let entry = json
                    .as_array()
                    .and_then(|a| a.iter().find(|e| e["claim"] == "gpu-view"))
                    .with_context(|| format!("no gpu-view in {json}"))?;
                ensure!(
                    entry["pods"] == serde_json::json!(["gpu-view"])
                        && entry["node"] == L4_NODE
                        && entry["uuid"] == seen[0].as_str()
                        && entry["product"].as_str().is_some_and(|p| p.contains("L4")),
                    "{entry}"
                );
                let table = cluster.kubectl_gpu(&["claims"])?;
                let line = table.lines().find(|l| l.contains("gpu-view")).unwrap_or_default();
                ensure!(
                    line.contains(L4_NODE) && line.contains(&seen[0]) && table.starts_with("NAMESPACE"),
                    "{table}"
                );
                let why = cluster.kubectl_gpu(&["why", "gpu-view", "-n", WORKLOAD_NS])?;
                let device = entry["device"].as_str().unwrap_or_default();
                let want = format!(
                    "pod {WORKLOAD_NS}/gpu-view is bound to node {L4_NODE}\nclaim gpu-view holds device {device} ({}, {}) on node {L4_NODE}\n",
                    seen[0],
                    entry["product"].as_str().unwrap_or_default()
                );
                ensure!(why == want, "{why:?}, want {want:?}");
                eprintln!("{table}{why}");
                Ok(())
            },
        )
        .await?;

    cluster.apply(&named_claim_pod(
        "why-typo",
        L4_NODE,
        "gpu.nvidia.co",
        None,
        None,
    ))?;
    cluster.apply(&GuidePod::new("too-many").count(9).yaml())?;
    cluster
        .step(
            "kubectl gpu why: a claim of DeviceClass gpu.nvidia.co is told the class does not exist and the near one; a pod asking 9 GPUs is told how many each node publishes and has free",
            L4_NODE,
            async {
                let typo = e2e::eventually(Duration::from_secs(60), "why-typo explained", || async {
                    let why = cluster.kubectl_gpu(&["why", "why-typo", "-n", WORKLOAD_NS])?;
                    Ok(why.contains("does not exist").then_some(why))
                })
                .await?;
                ensure!(
                    typo.starts_with(&format!("pod {WORKLOAD_NS}/why-typo waits: "))
                        && typo.contains("DeviceClass gpu.nvidia.co does not exist (did you mean gpu.nvidia.com?)"),
                    "{typo}"
                );
                let many = e2e::eventually(Duration::from_secs(60), "too-many explained", || async {
                    let out = cluster.kubectl_gpu(&["why", "too-many", "-n", WORKLOAD_NS, "-o", "json"])?;
                    let json: Value = serde_json::from_str(&out)?;
                    Ok((json["reason"] == "GPUsUnavailable").then_some(json))
                })
                .await?;
                let notes = many["lines"].to_string();
                ensure!(
                    notes.contains("devices of DeviceClass gpu.nvidia.com (")
                        && notes.contains(&format!("{L4_NODE}: 1 of 2 allocated"))
                        && notes.contains("the pod's claims ask 9"),
                    "{many}"
                );
                eprintln!("{typo}{many:#}");
                Ok(())
            },
        )
        .await
}
