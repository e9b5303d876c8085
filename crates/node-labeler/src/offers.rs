//! Whether a plane offers every GPU of a node: checked before the node's readiness labels are
//! first set, beside the plane's validator. DRA: the `gpu.nvidia.com` ResourceSlices of the node
//! offer every GPU, whole or as MIG partitions; device plugin: the node's allocatable GPU
//! resources (`nvidia.com/gpu`, time-slicing's renamed `nvidia.com/gpu.shared`, MIG `mixed`'s
//! `nvidia.com/mig-<profile>`) add up to at least its GPU count. The GPU count is the
//! `nvidia.com/gpu.count` label where GPU feature discovery set it, else one. Pure; the controller
//! reads the slices and the Node.

use std::collections::{BTreeMap, BTreeSet};

use api::contract::{DRIVER_NAME, GPU_EXTENDED_RESOURCE, labels as l};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;

/// The GPUs the node has, as far as its labels say (at least one).
pub fn gpu_count(labels: &BTreeMap<String, String>) -> u64 {
    labels
        .get(l::GPU_COUNT)
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
        .max(1)
}

/// How many physical GPUs the node's slices of our driver offer in the pool's newest generation:
/// a `gpu` device counts its own `uuid`, a `mig` device its `parentUUID` (a GPU in MIG mode
/// offers its partitions, not itself).
pub fn published_gpus(slices: &[ResourceSlice], node: &str) -> u64 {
    let ours: Vec<&ResourceSlice> = slices
        .iter()
        .filter(|s| s.spec.driver == DRIVER_NAME && s.spec.node_name.as_deref() == Some(node))
        .collect();
    let newest = ours.iter().map(|s| s.spec.pool.generation).max();
    let physical: BTreeSet<&str> = ours
        .iter()
        .filter(|s| Some(s.spec.pool.generation) == newest)
        .flat_map(|s| s.spec.devices.iter().flatten())
        .filter_map(|d| {
            let attributes = d.attributes.as_ref()?;
            let text = |key: &str| attributes.get(key).and_then(|a| a.string.as_deref());
            match text("type")? {
                "gpu" => text("uuid"),
                "mig" => text("parentUUID"),
                _ => None,
            }
        })
        .collect();
    physical.len() as u64
}

/// `nvidia.com/gpu` shared by time-slicing with `renameByDefault`.
const SHARED_GPU_RESOURCE: &str = "nvidia.com/gpu.shared";
/// The MIG devices of one profile under the `mixed` strategy.
const MIG_RESOURCE_PREFIX: &str = "nvidia.com/mig-";

/// Whether the device plugin offers GPUs under `resource`: whole (`nvidia.com/gpu`, also MIG
/// devices under the `single` strategy), in time-slicing replicas renamed by default
/// (`nvidia.com/gpu.shared`), or as MIG devices of a profile (`nvidia.com/mig-1g.5gb`).
fn is_gpu_resource(resource: &str) -> bool {
    resource == GPU_EXTENDED_RESOURCE
        || resource == SHARED_GPU_RESOURCE
        || resource.starts_with(MIG_RESOURCE_PREFIX)
}

/// What the node's allocatable says the device plugin offers: the GPU resources added up. A GPU
/// in replicas or MIG devices counts more than once, so this is a floor check (no GPU left out
/// of a node with one offer per GPU), not a count of cards.
pub fn allocatable_gpus(node: &Node) -> u64 {
    node.status
        .as_ref()
        .and_then(|s| s.allocatable.as_ref())
        .into_iter()
        .flatten()
        .filter(|(name, _)| is_gpu_resource(name))
        .filter_map(|(_, q)| q.0.parse::<u64>().ok())
        .sum()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// A slice of `node` whose devices are `(type, uuid, parent)`.
    fn slice(node: &str, generation: i64, devices: &[(&str, &str, &str)]) -> ResourceSlice {
        let devices: Vec<_> = devices
            .iter()
            .enumerate()
            .map(|(i, (kind, uuid, parent))| {
                json!({"name": format!("d{i}"), "attributes": {"type": {"string": kind},
                    "uuid": {"string": uuid}, "parentUUID": {"string": parent}}})
            })
            .collect();
        serde_json::from_value(json!({"metadata": {"name": format!("{node}-{generation}")},
            "spec": {"driver": DRIVER_NAME, "nodeName": node,
                     "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
                     "devices": devices}}))
        .unwrap()
    }

    #[test]
    fn the_gpu_count_comes_from_gfd_or_is_one() {
        let labels = |v: &str| BTreeMap::from([(l::GPU_COUNT.to_owned(), v.to_owned())]);
        assert_eq!(gpu_count(&labels("8")), 8);
        assert_eq!(gpu_count(&labels("0")), 1);
        assert_eq!(gpu_count(&labels("eight")), 1);
        assert_eq!(gpu_count(&BTreeMap::new()), 1);
    }

    #[test]
    fn physical_gpus_of_the_newest_pool_generation_of_the_node_count() {
        let slices = [
            slice(
                "a",
                1,
                &[("gpu", "G0", ""), ("gpu", "G1", ""), ("gpu", "G2", "")],
            ),
            // G1 went into MIG mode with two partitions; G0 stays whole.
            slice(
                "a",
                2,
                &[("gpu", "G0", ""), ("mig", "M0", "G1"), ("mig", "M1", "G1")],
            ),
            slice(
                "b",
                5,
                &[("gpu", "H0", ""), ("gpu", "H1", ""), ("vfio", "H2", "")],
            ),
        ];
        assert_eq!(published_gpus(&slices, "a"), 2);
        assert_eq!(published_gpus(&slices, "b"), 2);
        assert_eq!(published_gpus(&slices, "c"), 0);
    }

    #[test]
    fn allocatable_reads_the_extended_resource() {
        let node: Node = serde_json::from_value(json!({"metadata": {"name": "n"},
            "status": {"allocatable": {"nvidia.com/gpu": "4", "cpu": "8"}}}))
        .unwrap();
        assert_eq!(allocatable_gpus(&node), 4);
        assert_eq!(allocatable_gpus(&Node::default()), 0);
    }

    #[test]
    fn renamed_shares_and_mig_profiles_count_as_offers() {
        let node = |allocatable| -> Node {
            serde_json::from_value(json!({"metadata": {"name": "n"},
                "status": {"allocatable": allocatable}}))
            .unwrap()
        };
        // Time-slicing with renameByDefault: 2 GPUs in 4 replicas each, no nvidia.com/gpu.
        let shared = node(json!({"nvidia.com/gpu.shared": "8", "memory": "64Gi"}));
        assert_eq!(allocatable_gpus(&shared), 8);
        // MIG mixed: one GPU whole, one in two 1g.5gb and one 2g.10gb MIG devices.
        let mixed = node(json!({"nvidia.com/gpu": "1", "nvidia.com/mig-1g.5gb": "2",
            "nvidia.com/mig-2g.10gb": "1"}));
        assert_eq!(allocatable_gpus(&mixed), 4);
        // Nothing else counts: another vendor's resource, a malformed amount.
        let other = node(json!({"example.com/fpga": "4", "nvidia.com/gpu": "lots"}));
        assert_eq!(allocatable_gpus(&other), 0);
    }
}
