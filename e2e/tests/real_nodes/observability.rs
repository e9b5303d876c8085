//! What an admin's Prometheus sees of the product: the Prometheus of `hack/prometheus/start.sh`
//! scrapes the cluster through the chart's PodMonitors (translated as the prometheus-operator
//! would) and the apiserver, and evaluates the chart's alerts. Alerts firing live are checked where
//! their causes happen: `health::` (GPUsUnhealthy) and `planes::a_switch` (GPUNodeHeldOnDra).

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::ensure;
use api::physicalgpu::PhysicalGPU;
use e2e::real_nodes::{GPU_NODES, GPULESS_NODE, RealNodes};
use kube::api::{Api, ListParams};

/// The real nodes: the KWOK node's pods have no address anything can scrape.
const REAL_NODES: [&str; 4] = [GPU_NODES[0], GPU_NODES[1], GPU_NODES[2], GPULESS_NODE];

#[tokio::test]
#[ignore = "needs real nodes: make test-real-nodes runs it"]
async fn prometheus_scrapes_every_component_through_the_charts_pod_monitors_and_the_apiserver()
-> anyhow::Result<()> {
    let cluster = RealNodes::connect().await?;
    let prometheus = cluster.prometheus()?;
    cluster
        .step(
            "every component's target is up with its node label (the operator, the labeler, discovery on each real node, the DRA plugin on each GPU node) and so is the apiserver",
            GPU_NODES[0],
            async {
                e2e::eventually(Duration::from_secs(90), "every target up", || async {
                    let up = prometheus.query("up").await?;
                    let mut jobs: BTreeMap<String, Vec<(String, f64)>> = BTreeMap::new();
                    for (labels, value) in &up {
                        let job = labels.get("job").cloned().unwrap_or_default();
                        let node = labels.get("node").cloned().unwrap_or_default();
                        jobs.entry(job).or_default().push((node, *value));
                    }
                    let up_on = |job: &str, nodes: &[&str]| {
                        nodes.iter().all(|n| {
                            jobs.get(job)
                                .is_some_and(|t| t.iter().any(|(node, v)| node == n && *v == 1.0))
                        })
                    };
                    let one_up = |job: &str| {
                        jobs.get(job)
                            .is_some_and(|t| t.iter().any(|(node, v)| !node.is_empty() && *v == 1.0))
                    };
                    let all = one_up("gpu-operator/gpu-operator")
                        && one_up("gpu-operator/gpu-operator-node-labeler")
                        && up_on("gpu-operator/gpu-node-discovery", &REAL_NODES)
                        && up_on("gpu-operator/nvidia-dra-driver-kubelet-plugin", &GPU_NODES)
                        && jobs.get("apiserver").is_some_and(|t| t.iter().any(|(_, v)| *v == 1.0));
                    if all {
                        return Ok(Some(()));
                    }
                    Err(anyhow::anyhow!("targets by job (node, up): {jobs:?}"))
                })
                .await
            },
        )
        .await?;
    cluster
        .step(
            "the product's metrics answer queries with what the cluster holds: discovery's GPUs per node equal its PhysicalGPUs, the GPU-less node's 0",
            GPU_NODES[0],
            async {
                let gpus = Api::<PhysicalGPU>::all(cluster.client.clone())
                    .list(&ListParams::default())
                    .await?
                    .items;
                let seen: BTreeMap<String, f64> = prometheus
                    .query("max by (node) (gpu_node_discovery_gpus)")
                    .await?
                    .into_iter()
                    .filter_map(|(labels, v)| Some((labels.get("node")?.clone(), v)))
                    .collect();
                for node in REAL_NODES {
                    let have = gpus
                        .iter()
                        .filter(|g| g.status.as_ref().is_some_and(|s| s.node == node))
                        .count() as f64;
                    ensure!(
                        seen.get(node) == Some(&have),
                        "gpu_node_discovery_gpus by node {seen:?}; {node} has {have} PhysicalGPUs"
                    );
                }
                Ok(())
            },
        )
        .await
}
