//! What the install guide promises once `helm install` is done: every GPU node served by the DRA
//! stack with its readiness labels, the GPUCluster counting them, the guide's DeviceClasses, the
//! driver validated, every GPU published (MIG devices on the MIG node, where the operands take
//! MIG devices too), and GPU discovery's labels on each node with a GPU and on no other.

use anyhow::{Context, ensure};
use api::GPUCluster;
use e2e::eventually;
use e2e::helm::{DEVICE_CLASSES, device_class_names};
use e2e::real_nodes::{
    GPU_NODES, GPULESS_NODE, GuidePod, H100_NODE, L4_NODE, MIG_NODE, OPERATOR_NS, RealNodes,
    gpu_class, ready_on,
};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{Api, ListParams};
use std::collections::BTreeMap;
use std::time::Duration;

/// Waits until `node` is ready on DRA and uncordoned.
async fn dra_ready(cluster: &RealNodes, node: &str) -> anyhow::Result<()> {
    eventually(
        Duration::from_secs(60),
        &format!("{node}'s readiness labels"),
        || async {
            let said = cluster.readiness(node).await?;
            if said == ready_on("dra") {
                Ok(Some(()))
            } else {
                Err(anyhow::anyhow!("{node} shows {said}"))
            }
        },
    )
    .await
}

#[tokio::test]
#[ignore = "needs real nodes: make test-real-nodes runs it"]
async fn the_guides_install_serves_every_gpu_node_and_publishes_its_gpus() -> anyhow::Result<()> {
    let cluster = RealNodes::connect().await?;
    cluster
        .step(
            "readiness labels on real-gpu-0 once its DRA validator passed: gpu-stack=dra, gpu-setup-complete=true",
            H100_NODE,
            dra_ready(&cluster, H100_NODE),
        )
        .await?;
    // The KWOK node counts as a GPU node in dra mode; its plugin pod, kept off by a taint, is not
    // ready.
    cluster
        .step(
            "GPUCluster status: 4 GPU nodes, 4 in dra mode, the 3 real ones with their plugin ready",
            H100_NODE,
            eventually(Duration::from_secs(30), "the GPUCluster's counts", || async {
                let gc = Api::<GPUCluster>::all(cluster.client.clone())
                    .get("gpu-cluster")
                    .await?;
                let counts = gc.status.and_then(|s| s.nodes).unwrap_or_default();
                let said = (counts.gpu, counts.dra, counts.ready_dra);
                if said == (4, 4, 3) {
                    Ok(Some(()))
                } else {
                    Err(anyhow::anyhow!("status.nodes (gpu, dra, readyDra) is {said:?}"))
                }
            }),
        )
        .await?;
    cluster
        .step(
            "the guide's DeviceClasses and the operands' own",
            H100_NODE,
            async {
                let names = device_class_names(&cluster.client).await?;
                ensure!(names == DEVICE_CLASSES, "DeviceClasses: {names:?}");
                Ok(())
            },
        )
        .await?;
    // The init container (the validator image's user overridden to root) wrote it on the node.
    cluster
        .step(
            "driver-validation wrote /run/nvidia/validations/driver-ready on real-gpu-0: the pre-installed driver, on the host",
            H100_NODE,
            async {
                let path = cluster
                    .node_dir(H100_NODE)
                    .join("run/nvidia/validations/driver-ready");
                let text = std::fs::read_to_string(&path)
                    .with_context(|| format!("reading {}", path.display()))?;
                let lines: Vec<&str> = text.lines().collect();
                ensure!(
                    lines.contains(&"IS_HOST_DRIVER=true") && lines.contains(&"NVIDIA_DRIVER_ROOT=/"),
                    "driver-ready says: {text}"
                );
                Ok(())
            },
        )
        .await?;
    cluster
        .step(
            "the kubelet plugins registered with the real kubelets and published 4 + 2 GPUs and the MIG node's MIG devices",
            MIG_NODE,
            eventually(Duration::from_secs(30), "every GPU published", || async {
                let mut said = BTreeMap::new();
                for node in GPU_NODES {
                    let devices = cluster.published_devices(node).await?;
                    let names: Vec<String> = devices.into_iter().map(|d| d.name).collect();
                    said.insert(node, names);
                }
                let whole = |node: &str| said[node].iter().filter(|n| !n.contains("-mig-")).count();
                let migs = said[MIG_NODE].iter().filter(|n| n.contains("-mig-")).count();
                if whole(H100_NODE) == 4 && whole(L4_NODE) == 2 && whole(MIG_NODE) == 0 && migs > 1 {
                    Ok(Some(()))
                } else {
                    Err(anyhow::anyhow!("published devices: {said:?}"))
                }
            }),
        )
        .await?;
    Ok(())
}

/// The devices allocated to each operand claim held by a pod of the operator's namespace on
/// `node`, by claim name.
async fn operand_claims_on(
    cluster: &RealNodes,
    node: &str,
) -> anyhow::Result<BTreeMap<String, Vec<String>>> {
    let pods: Vec<String> = cluster
        .operand_pods(None, Some(node))
        .await?
        .into_iter()
        .filter_map(|p: Pod| p.metadata.name)
        .collect();
    let claims = Api::<ResourceClaim>::namespaced(cluster.client.clone(), OPERATOR_NS)
        .list(&ListParams::default())
        .await?;
    Ok(claims
        .items
        .into_iter()
        .filter_map(|c| {
            let status = c.status?;
            let held_here = status
                .reserved_for
                .iter()
                .flatten()
                .any(|r| pods.contains(&r.name));
            let devices = status
                .allocation?
                .devices?
                .results
                .unwrap_or_default()
                .into_iter()
                .map(|r| r.device)
                .collect();
            held_here.then(|| (c.metadata.name.unwrap_or_default(), devices))
        })
        .collect())
}

#[tokio::test]
#[ignore = "needs real nodes: make test-real-nodes runs it"]
async fn on_the_all_mig_node_the_operands_take_mig_devices() -> anyhow::Result<()> {
    let cluster = RealNodes::connect().await?;
    cluster
        .step(
            "readiness labels on the all-MIG node real-gpu-2 once its validator passed",
            MIG_NODE,
            dra_ready(&cluster, MIG_NODE),
        )
        .await?;
    cluster
        .step(
            "on real-gpu-2 the validator passed with one MIG device and the exporter's admin-access claim holds every MIG device",
            MIG_NODE,
            async {
                let claims = operand_claims_on(&cluster, MIG_NODE).await?;
                let migs = cluster
                    .published_devices(MIG_NODE)
                    .await?
                    .into_iter()
                    .filter(|d| d.name.contains("-mig-"))
                    .count();
                let held_by = |prefix: &str| {
                    claims
                        .iter()
                        .find(|(name, _)| name.starts_with(prefix))
                        .map(|(_, devices)| devices.clone())
                        .unwrap_or_default()
                };
                let validator = held_by("nvidia-dra-validator");
                let exporter = held_by("nvidia-dcgm-exporter");
                ensure!(
                    matches!(validator.as_slice(), [one] if one.contains("-mig-"))
                        && exporter.iter().filter(|d| d.contains("-mig-")).count() == migs,
                    "operand claims on {MIG_NODE}: {claims:?} ({migs} MIG devices published)"
                );
                Ok(())
            },
        )
        .await
}

/// Whether `key` is a label NFD or GPU feature discovery writes.
fn discovery_key(key: &str) -> bool {
    key.starts_with("feature.node.kubernetes.io/")
        || ["nvidia.com/gpu.", "nvidia.com/mig.", "nvidia.com/cuda."]
            .iter()
            .any(|p| key.starts_with(p))
}

#[tokio::test]
#[ignore = "needs real nodes: make test-real-nodes runs it"]
async fn discovery_labels_each_gpu_node_from_its_pci_bus_and_nvml_and_no_other()
-> anyhow::Result<()> {
    let cluster = RealNodes::connect().await?;
    cluster
        .step(
            "gpu-node-discovery labelled the GPU nodes from their PCI bus and NVML, as GPU feature discovery names them",
            H100_NODE,
            async {
                let expected = [
                    (H100_NODE, "true NVIDIA-H100-80GB-HBM3 4 81559 hopper 9 0 true 580.95.05 13.0"),
                    (L4_NODE, "true NVIDIA-L4 2 23034 ada-lovelace 8 9 false 580.95.05 13.0"),
                    (MIG_NODE, "true NVIDIA-A100-SXM4-40GB 2 40960 ampere 8 0 true 580.95.05 13.0"),
                ];
                for (node, want) in expected {
                    let said = crate::feature_labels(&cluster, node).await?;
                    ensure!(said == want, "{node}: {said}, want {want}");
                }
                // The agent records the keys it owns, so it can take them away again.
                let node = cluster.jsonpath(
                    "node",
                    H100_NODE,
                    None,
                    "{.metadata.annotations.gpu-operator-rs\\.dev/discovery-labels}",
                )?;
                ensure!(
                    node.contains("feature.node.kubernetes.io/pci-10de.present"),
                    "the discovery-labels annotation on {H100_NODE}: {node:?}"
                );
                Ok(())
            },
        )
        .await?;
    cluster
        .step(
            "the node with no NVIDIA function has no discovery label and runs no GPU operand, only the discovery agent",
            GPULESS_NODE,
            async {
                let labels = cluster.node_labels(GPULESS_NODE).await?;
                let stamped: Vec<&String> = labels.keys().filter(|k| discovery_key(k)).collect();
                ensure!(stamped.is_empty(), "{GPULESS_NODE} has labels {stamped:?}");
                let owned = cluster.jsonpath(
                    "node",
                    GPULESS_NODE,
                    None,
                    "{.metadata.annotations.gpu-operator-rs\\.dev/discovery-labels}",
                )?;
                ensure!(owned.is_empty(), "{GPULESS_NODE} records owned labels {owned:?}");
                // The release's node agents there: DaemonSet pods (a Deployment's pod may land on
                // any node).
                let agents: Vec<String> = cluster
                    .operand_pods(None, Some(GPULESS_NODE))
                    .await?
                    .into_iter()
                    .filter(|p| {
                        p.metadata
                            .owner_references
                            .iter()
                            .flatten()
                            .any(|o| o.kind == "DaemonSet")
                    })
                    .map(|p| {
                        let name = p.metadata.name.unwrap_or_default();
                        p.metadata
                            .labels
                            .and_then(|mut l| l.remove("app.kubernetes.io/name"))
                            .unwrap_or(name)
                    })
                    .collect();
                ensure!(
                    agents == ["gpu-node-discovery"],
                    "DaemonSet pods on {GPULESS_NODE}: {agents:?}"
                );
                Ok(())
            },
        )
        .await
}

/// The GPUCluster's `DRAFeaturesServed` condition, as `reason: message`.
fn features_condition(cluster: &RealNodes) -> anyhow::Result<String> {
    let [_, reason, message] = cluster.gpu_cluster_condition("DRAFeaturesServed")?;
    Ok(format!("{reason}: {message}"))
}

#[tokio::test]
#[ignore = "needs real nodes: make test-real-nodes runs it"]
async fn the_gpucluster_says_which_dra_features_the_apiserver_serves() -> anyhow::Result<()> {
    let cluster = RealNodes::connect().await?;
    let minor = cluster.server_minor().await?;
    if minor > 34 {
        return cluster
            .step(
                "GPUCluster DRAFeaturesServed: AllServed on the newest release",
                H100_NODE,
                async {
                    let said = features_condition(&cluster)?;
                    ensure!(said.starts_with("AllServed:"), "DRAFeaturesServed: {said}");
                    Ok(())
                },
            )
            .await;
    }
    // On 1.34 the counter sets GPU shares draw on come in an older shape, which the plugin's
    // layout cannot use: a class with a shared variant leaves every GPU published whole (and the
    // node working), and its status says why.
    cluster
        .step(
            "GPUCluster DRAFeaturesServed on 1.34 names what it lacks",
            H100_NODE,
            async {
                let said = features_condition(&cluster)?;
                ensure!(
                    said.starts_with(
                        "FeaturesMissing: DRAPartitionableDevices is served in an older shape"
                    ) && said.contains("no GPU is published in shares"),
                    "DRAFeaturesServed: {said}"
                );
                Ok(())
            },
        )
        .await?;
    const NAMES: &[&str] = &["beside-shares"];
    let _cleanup = cluster.cleanup(&[
        ("pod", NAMES),
        ("resourceclaimtemplate", NAMES),
        ("gpuclass", &["h100s"]),
    ]);
    let pool_generation = || async {
        let slices = Api::<ResourceSlice>::all(cluster.client.clone())
            .list(&ListParams::default().fields(&format!(
                "spec.nodeName={H100_NODE},spec.driver=gpu.nvidia.com"
            )))
            .await?;
        anyhow::Ok(slices.items.first().map_or(0, |s| s.spec.pool.generation))
    };
    let before = pool_generation().await?;
    cluster.apply(&gpu_class(
        "h100s",
        "h100-80gb-hbm3",
        Some((2, "TimeSlicing")),
    ))?;
    // The plugin tried the shares, was refused, and published the pool again without them (a
    // newer generation: a plugin stuck on the refusal would keep the old one).
    cluster
        .step(
            "a GPUClass with a shared variant on 1.34: real-gpu-0 republished its 4 GPUs whole, and the class says why",
            H100_NODE,
            eventually(Duration::from_secs(60), "the GPUs republished whole", || async {
                let says = cluster.jsonpath("gpuclass", "h100s", None, "{.status.conditions[0].message}")?;
                let mut names: Vec<String> = cluster
                    .published_devices(H100_NODE)
                    .await?
                    .into_iter()
                    .map(|d| d.name)
                    .collect();
                names.sort();
                let generation = pool_generation().await?;
                if says.contains("published in shares only when")
                    && names == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
                    && generation > before
                {
                    Ok(Some(()))
                } else {
                    Err(anyhow::anyhow!(
                        "the class says {says:?}; real-gpu-0 publishes {names:?} at generation {generation} (before: {before})"
                    ))
                }
            }),
        )
        .await?;
    cluster.apply(&GuidePod::new("beside-shares").on(H100_NODE).yaml())?;
    cluster
        .step(
            "a pod beside the refused shares gets its GPU",
            H100_NODE,
            crate::ran_on_gpus(&cluster, "beside-shares", H100_NODE, 1),
        )
        .await?;
    cluster
        .step(
            "GPUClass h100s deleted: it and its DeviceClass are gone",
            H100_NODE,
            crate::delete_class(&cluster, "h100s"),
        )
        .await
}
