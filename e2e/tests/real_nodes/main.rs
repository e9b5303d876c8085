//! Scenarios on real nodes (real kubelets and containerd, mock GPUs, the chart installed), one
//! test function per behaviour: what the install guide promises on every GPU node (`install`),
//! what each component's own token may do (`access`), the guide's workloads (`workloads`), the
//! kubelet plugin's life on a real kubelet: a restart, its metrics, its pod replaced, MIG, a crash
//! mid-prepare (`plugin`), GPU health through the kubelet (`health`), claims written for the
//! upstream driver's sharing API and consumable shares (`sharing`), CEL selection on the published
//! attributes (`selection`), GPUClasses: extended resources and shares of a card (`classes`), MIG
//! partitions made when claims are prepared (`dynamic_mig`), a
//! node moved between DRA and the device plugin and that plane's behaviours (`planes`), two nodes
//! handed over under a PodDisruptionBudget (`handover`), an operand's failure in the GPUCluster's
//! status (`status`), `kubectl gpu`'s views of all that (`kubectl_gpu`), the cluster as a Prometheus scraping the chart's PodMonitors sees it (`observability`), the chart's dashboard drawing data after them all (`dashboard`, run after the others), the product upgraded from earlier releases and back under running claims (`upgrade`, after that) a GPU arriving on a running node (`hotplug`: it changes the node for good) and
//! driver upgrades the labeler runs on that node's driver container (`driver_upgrade`, last). `hack/test/real-nodes.sh` brings the cluster up, installs the chart and runs them in
//! `make test` (`e2e/run.sh --real-nodes`); each leaves the cluster as it found it.
//!
//! One alone, on a cluster left up with `KEEP_CLUSTER=1 make test-real-nodes`:
//! `SHARED_CLUSTER=1 CLUSTER_DIR=.cluster/real-<port base> e2e/run.sh --real-nodes <part of a name>`.

mod access;
mod classes;
mod dashboard;
mod driver_upgrade;
mod dynamic_mig;
mod handover;
mod health;
mod hotplug;
mod install;
mod kubectl_gpu;
mod observability;
mod planes;
mod plugin;
mod selection;
mod sharing;
mod status;
mod upgrade;
mod workloads;

use anyhow::{bail, ensure};
use api::GPUClass;
use e2e::eventually;
use e2e::real_nodes::{RealNodes, gpu_uuids};
use k8s_openapi::api::resource::v1::DeviceClass;
use kube::api::Api;
use std::time::Duration;

/// Deletes GPUClass `name` and waits until it and the DeviceClasses it made are gone, so the next
/// scenario finds the cluster's classes as the install left them.
async fn delete_class(cluster: &RealNodes, name: &str) -> anyhow::Result<()> {
    let classes = Api::<GPUClass>::all(cluster.client.clone());
    let made = classes
        .get_opt(name)
        .await?
        .and_then(|c| c.status)
        .map(|s| s.device_class_names)
        .unwrap_or_default();
    cluster.delete("gpuclass", &[name])?;
    let device_classes = Api::<DeviceClass>::all(cluster.client.clone());
    eventually(
        Duration::from_secs(60),
        &format!("GPUClass {name} and its DeviceClasses {made:?} to go"),
        || async {
            let mut left = Vec::new();
            if classes.get_opt(name).await?.is_some() {
                left.push(format!("GPUClass {name}"));
            }
            for made in &made {
                if device_classes.get_opt(made).await?.is_some() {
                    left.push(format!("DeviceClass {made}"));
                }
            }
            if left.is_empty() {
                Ok(Some(()))
            } else {
                Err(anyhow::anyhow!("left: {left:?}"))
            }
        },
    )
    .await
}

/// A node's labels that a workload author selects on, as GPU feature discovery names them.
const FEATURE_LABELS: [&str; 10] = [
    "feature.node.kubernetes.io/pci-10de.present",
    "nvidia.com/gpu.product",
    "nvidia.com/gpu.count",
    "nvidia.com/gpu.memory",
    "nvidia.com/gpu.family",
    "nvidia.com/gpu.compute.major",
    "nvidia.com/gpu.compute.minor",
    "nvidia.com/mig.capable",
    "nvidia.com/cuda.driver-version.full",
    "nvidia.com/cuda.runtime-version.full",
];

/// `node`'s [`FEATURE_LABELS`]' values in that order, space-separated, `-` where unset.
async fn feature_labels(cluster: &RealNodes, node: &str) -> anyhow::Result<String> {
    let labels = cluster.node_labels(node).await?;
    let values: Vec<&str> = FEATURE_LABELS
        .iter()
        .map(|key| labels.get(*key).map_or("-", String::as_str))
        .collect();
    Ok(values.join(" "))
}

/// The GPU UUIDs `node` publishes, with the PCIe root each is under.
async fn published_gpus(
    cluster: &RealNodes,
    node: &str,
) -> anyhow::Result<Vec<(String, Option<String>)>> {
    Ok(cluster
        .published_devices(node)
        .await?
        .into_iter()
        .filter_map(|d| {
            let attributes = d.attributes.unwrap_or_default();
            let uuid = attributes.get("uuid")?.string.clone()?;
            let root = attributes
                .get("resource.kubernetes.io/pcieRoot")
                .and_then(|a| a.string.clone());
            Some((uuid, root))
        })
        .collect())
}

/// Pod `name` succeeded on `node` and saw exactly `count` GPUs, all served by `node`, with as
/// many `/dev/nvidia<minor>` nodes and NVML's library; those GPUs' UUIDs.
async fn ran_on_gpus(
    cluster: &RealNodes,
    name: &str,
    node: &str,
    count: usize,
) -> anyhow::Result<Vec<String>> {
    let ran_on = cluster
        .wait_succeeded(name, Duration::from_secs(120))
        .await?;
    ensure!(ran_on == node, "{name} ran on {ran_on}, not on {node}");
    let log = cluster.logs(name, None).await?;
    let seen = gpu_uuids(&log);
    if seen.len() != count {
        bail!("{name} saw {} GPUs, not {count}: {log}", seen.len());
    }
    let device_nodes = log
        .lines()
        .filter(|l| {
            l.strip_prefix("nvidia")
                .is_some_and(|m| !m.is_empty() && m.bytes().all(|b| b.is_ascii_digit()))
        })
        .count();
    let nvml = log.lines().any(|l| l == "nvml-present");
    ensure!(
        device_nodes == count && nvml,
        "{name} got {device_nodes} /dev/nvidia<minor> nodes, NVML {}: {log}",
        if nvml { "present" } else { "missing" }
    );
    let mut node_gpus: Vec<String> = published_gpus(cluster, node)
        .await?
        .into_iter()
        .map(|(uuid, _)| uuid)
        .collect();
    // On the device plugin's plane a node's GPUs are in the device plugin's CDI spec.
    let device_plugin_spec = cluster
        .node_dir(node)
        .join("run/cdi/k8s.device-plugin.nvidia.com-gpu.yaml");
    node_gpus.extend(gpu_uuids(
        &std::fs::read_to_string(device_plugin_spec).unwrap_or_default(),
    ));
    for uuid in &seen {
        ensure!(
            node_gpus.contains(uuid),
            "{name} saw {uuid}, which {node} does not serve"
        );
    }
    Ok(seen)
}
