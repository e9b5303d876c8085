//! The ResourceSlices of a node, built from its device table by pure functions.
//!
//! One pool named after the node, `spec.nodeName` set, owned by the Node, split into several
//! slices past the per-slice device limit. Attribute names and types follow the upstream driver:
//! bare names live in the driver's domain (`gpu.nvidia.com`).

use crate::devices::{DeviceKind, DeviceTable, NodeDevice};
use k8s_openapi::api::resource::v1::{
    Device, DeviceAttribute, DeviceCapacity, DeviceTaint, ResourcePool, ResourceSlice,
    ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;

/// Devices per slice allowed by resource.k8s.io/v1 when no device uses taints, counters or list
/// attributes (ours use none but taints).
pub const MAX_DEVICES_PER_SLICE: usize = 128;
/// Devices per slice allowed when a device of the slice has taints.
pub const MAX_TAINTED_DEVICES_PER_SLICE: usize = 64;

/// Device taints by device name.
pub type Taints = BTreeMap<String, Vec<DeviceTaint>>;
/// Annotation carrying a hash of the pool's content, so a reconcile compares its own output
/// and never fields the apiserver may default.
pub const CONTENT_ANNOTATION: &str = "gpu.nvidia.com/pool-content";

/// The Node the slices belong to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRef {
    /// Node name (also the pool name).
    pub name: String,
    /// Node UID, for the owner reference.
    pub uid: String,
}

/// A semantic version from a dotted version string: missing parts become `0` and leading
/// zeros are dropped (`580.95.05` → `580.95.5`, `13.0` → `13.0.0`), as semver requires.
pub fn semver(version: &str) -> String {
    let mut parts: Vec<String> = version
        .split('.')
        .take(3)
        .map(|p| {
            let digits: String = p.chars().take_while(char::is_ascii_digit).collect();
            digits
                .parse::<u64>()
                .map(|n| n.to_string())
                .unwrap_or_else(|_| "0".into())
        })
        .collect();
    parts.resize(3, "0".into());
    parts.join(".")
}

/// A byte count as a canonical binary quantity (`42949672960` → `40Gi`).
pub fn bytes_quantity(bytes: u64) -> Quantity {
    const SUFFIXES: [(&str, u32); 6] = [
        ("Ei", 60),
        ("Pi", 50),
        ("Ti", 40),
        ("Gi", 30),
        ("Mi", 20),
        ("Ki", 10),
    ];
    let text = SUFFIXES
        .iter()
        .find(|(_, shift)| bytes != 0 && bytes.is_multiple_of(1u64 << shift))
        .map(|(suffix, shift)| format!("{}{suffix}", bytes >> shift))
        .unwrap_or_else(|| bytes.to_string());
    Quantity(text)
}

fn string(value: &str) -> DeviceAttribute {
    DeviceAttribute {
        string: Some(value.to_owned()),
        ..Default::default()
    }
}

fn version(value: &str) -> DeviceAttribute {
    DeviceAttribute {
        version: Some(semver(value)),
        ..Default::default()
    }
}

fn count(value: u64) -> DeviceCapacity {
    DeviceCapacity {
        value: Quantity(value.to_string()),
        request_policy: None,
    }
}

/// The ResourceSlice device for one node device.
pub fn slice_device(device: &NodeDevice, table: &DeviceTable) -> Device {
    let g = &device.gpu;
    let (cc_major, cc_minor) = g.cuda_compute_capability;
    let (cuda_major, cuda_minor) = table.cuda_driver_version;
    let mut attributes = BTreeMap::from([
        ("uuid".to_owned(), string(&device.uuid)),
        ("productName".to_owned(), string(&g.product_name)),
        ("brand".to_owned(), string(&g.brand)),
        ("architecture".to_owned(), string(&g.architecture)),
        (
            "cudaComputeCapability".to_owned(),
            version(&format!("{cc_major}.{cc_minor}")),
        ),
        ("driverVersion".to_owned(), version(&table.driver_version)),
        (
            "cudaDriverVersion".to_owned(),
            version(&format!("{cuda_major}.{cuda_minor}")),
        ),
        (
            "resource.kubernetes.io/pciBusID".to_owned(),
            string(&g.pci_bus_id),
        ),
    ]);
    let mut capacity = BTreeMap::new();
    match &device.kind {
        DeviceKind::Gpu { memory_bytes } => {
            attributes.insert("type".into(), string("gpu"));
            if let Some(bytes) = memory_bytes {
                capacity.insert(
                    "memory".to_owned(),
                    DeviceCapacity {
                        value: bytes_quantity(*bytes),
                        request_policy: None,
                    },
                );
            }
        }
        DeviceKind::Mig(m) => {
            attributes.insert("type".into(), string("mig"));
            attributes.insert("parentUUID".into(), string(&g.gpu_uuid));
            attributes.insert("profile".into(), string(&m.profile));
            let engines = [
                ("multiprocessors", m.multiprocessors),
                ("copyEngines", m.copy_engines),
                ("decoders", m.decoders),
                ("encoders", m.encoders),
                ("jpegEngines", m.jpeg_engines),
                ("ofaEngines", m.ofa_engines),
            ];
            for (name, value) in engines {
                capacity.insert(name.to_owned(), count(u64::from(value)));
            }
            capacity.insert(
                "memory".to_owned(),
                DeviceCapacity {
                    value: bytes_quantity(m.memory_bytes),
                    request_policy: None,
                },
            );
            for slice in m.placement_start..m.placement_start + m.placement_size {
                capacity.insert(format!("memorySlice{slice}"), count(1));
            }
        }
    }
    Device {
        name: device.name.clone(),
        attributes: Some(attributes),
        capacity: (!capacity.is_empty()).then_some(capacity),
        ..Default::default()
    }
}

/// Name of the `index`-th slice of a node's pool.
pub fn slice_name(node: &str, driver: &str, index: usize) -> String {
    format!("{node}-{driver}-{index}")
}

/// A hash of the devices of a pool (their JSON), independent of the generation.
pub fn content_hash(devices: &[Device]) -> String {
    let json = serde_json::to_vec(devices).expect("devices serialise");
    Sha256::digest(&json)
        .iter()
        .take(16)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The slices that publish `table` for `node`, with `taints` on the devices they name: devices
/// in name order, at most [`MAX_DEVICES_PER_SLICE`] per slice ([`MAX_TAINTED_DEVICES_PER_SLICE`]
/// while any device is tainted), every slice carrying the pool `generation`, the slice count,
/// the content hash and an owner reference to the Node. A node without devices gets one empty
/// slice, so the pool still exists.
pub fn desired_slices(
    node: &NodeRef,
    driver: &str,
    table: &DeviceTable,
    taints: &Taints,
    generation: i64,
) -> Vec<ResourceSlice> {
    let devices: Vec<Device> = table
        .devices
        .values()
        .map(|d| Device {
            taints: taints.get(&d.name).cloned(),
            ..slice_device(d, table)
        })
        .collect();
    let hash = content_hash(&devices);
    let per_slice = if devices.iter().any(|d| d.taints.is_some()) {
        MAX_TAINTED_DEVICES_PER_SLICE
    } else {
        MAX_DEVICES_PER_SLICE
    };
    let chunks: Vec<Vec<Device>> = if devices.is_empty() {
        vec![Vec::new()]
    } else {
        devices.chunks(per_slice).map(<[Device]>::to_vec).collect()
    };
    let count = chunks.len() as i64;
    chunks
        .into_iter()
        .enumerate()
        .map(|(index, devices)| ResourceSlice {
            metadata: ObjectMeta {
                name: Some(slice_name(&node.name, driver, index)),
                annotations: Some(BTreeMap::from([(
                    CONTENT_ANNOTATION.to_owned(),
                    hash.clone(),
                )])),
                owner_references: Some(vec![OwnerReference {
                    api_version: "v1".into(),
                    kind: "Node".into(),
                    name: node.name.clone(),
                    uid: node.uid.clone(),
                    controller: Some(true),
                    block_owner_deletion: None,
                }]),
                ..Default::default()
            },
            spec: ResourceSliceSpec {
                driver: driver.to_owned(),
                node_name: Some(node.name.clone()),
                pool: ResourcePool {
                    name: node.name.clone(),
                    generation,
                    resource_slice_count: count,
                },
                devices: Some(devices),
                ..Default::default()
            },
        })
        .collect()
}

/// Whether the slices found in the API already publish exactly `desired` (same names, same
/// content hash, one generation, no others).
pub fn up_to_date(existing: &[ResourceSlice], desired: &[ResourceSlice]) -> bool {
    let hash = |s: &ResourceSlice| {
        s.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(CONTENT_ANNOTATION).cloned())
    };
    let mut names: Vec<_> = existing.iter().map(|s| s.metadata.name.clone()).collect();
    names.sort();
    let mut wanted: Vec<_> = desired.iter().map(|s| s.metadata.name.clone()).collect();
    wanted.sort();
    let generations: std::collections::BTreeSet<_> =
        existing.iter().map(|s| s.spec.pool.generation).collect();
    names == wanted
        && generations.len() == 1
        && existing
            .iter()
            .all(|s| hash(s).is_some() && hash(s) == desired.first().and_then(hash))
        && existing
            .iter()
            .all(|s| s.spec.pool.resource_slice_count == desired.len() as i64)
}

/// The generation to publish with: above every generation seen for this pool.
pub fn next_generation(existing: &[ResourceSlice], last_published: i64) -> i64 {
    existing
        .iter()
        .map(|s| s.spec.pool.generation)
        .chain([last_published])
        .max()
        .unwrap_or(0)
        + 1
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::table;

    fn node() -> NodeRef {
        NodeRef {
            name: "node-a".into(),
            uid: "node-uid".into(),
        }
    }

    #[test]
    fn versions_and_quantities_are_canonical() {
        assert_eq!(semver("580.95.05"), "580.95.5");
        assert_eq!(semver("13.0"), "13.0.0");
        assert_eq!(semver("8.9"), "8.9.0");
        assert_eq!(bytes_quantity(40 << 30).0, "40Gi");
        assert_eq!(bytes_quantity(4864 << 20).0, "4864Mi");
        assert_eq!(bytes_quantity(1000).0, "1000");
        assert_eq!(bytes_quantity(0).0, "0");
    }

    #[test]
    fn big_pools_are_split_and_counted() {
        let slices = desired_slices(&node(), "gpu.nvidia.com", &table(130), &Taints::new(), 4);
        assert_eq!(slices.len(), 2);
        assert_eq!(slices[0].spec.devices.as_ref().unwrap().len(), 128);
        assert_eq!(slices[1].spec.devices.as_ref().unwrap().len(), 2);
        for (i, s) in slices.iter().enumerate() {
            assert_eq!(
                s.metadata.name.as_deref(),
                Some(slice_name("node-a", "gpu.nvidia.com", i).as_str())
            );
            assert_eq!(s.spec.pool.resource_slice_count, 2);
            assert_eq!(s.spec.pool.generation, 4);
            assert_eq!(s.spec.node_name.as_deref(), Some("node-a"));
        }
    }

    #[test]
    fn up_to_date_needs_same_names_content_and_one_generation() {
        let desired = desired_slices(&node(), "gpu.nvidia.com", &table(2), &Taints::new(), 1);
        assert!(up_to_date(&desired, &desired));
        assert!(!up_to_date(&[], &desired));
        let other = desired_slices(&node(), "gpu.nvidia.com", &table(3), &Taints::new(), 1);
        assert!(!up_to_date(&other, &desired));
        assert_eq!(next_generation(&other, 0), 2);
        assert_eq!(next_generation(&[], 5), 6);
    }

    #[test]
    fn a_tainted_device_carries_its_taint_and_halves_the_slices() {
        let taint = DeviceTaint {
            key: "gpu.nvidia.com/ecc".into(),
            effect: "NoSchedule".into(),
            ..Default::default()
        };
        let taints = Taints::from([("gpu-3".to_owned(), vec![taint.clone()])]);
        let table = table(100);
        let slices = desired_slices(&node(), "gpu.nvidia.com", &table, &taints, 1);
        assert_eq!(slices.len(), 2, "64 devices per slice while one is tainted");
        let devices: Vec<_> = slices
            .iter()
            .flat_map(|s| s.spec.devices.clone().unwrap())
            .filter(|d| d.taints.is_some())
            .collect();
        assert_eq!(devices.len(), 1);
        assert_eq!(devices[0].taints.as_deref(), Some(&[taint][..]));
        let untainted = desired_slices(&node(), "gpu.nvidia.com", &table, &Taints::new(), 1);
        assert_eq!(untainted.len(), 1);
        assert!(
            !up_to_date(&untainted, &slices),
            "a taint changes the content"
        );
    }

    #[test]
    fn a_node_without_devices_still_has_its_pool() {
        let slices = desired_slices(&node(), "gpu.nvidia.com", &table(0), &Taints::new(), 1);
        assert_eq!(slices.len(), 1);
        assert_eq!(slices[0].spec.devices.as_deref(), Some(&[][..]));
    }
}
