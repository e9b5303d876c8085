//! The ResourceSlices of a node, built from its device table by pure functions.
//!
//! One pool named after the node, `spec.nodeName` set, owned by the Node, split into several
//! slices past the per-slice device limit. Attribute names and types follow the upstream driver:
//! bare names live in the driver's domain (`gpu.nvidia.com`).

use crate::consumable;
use crate::devices::Share;
use crate::devices::{DeviceKind, DeviceTable, NodeDevice};
use crate::partitions;
use api::gpuclass::SharingStrategy;
use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, CapacityRequestPolicyRange, Counter, CounterSet, Device,
    DeviceAttribute, DeviceCapacity, DeviceCounterConsumption, DeviceTaint, ResourcePool,
    ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;

/// Devices per slice allowed by resource.k8s.io/v1 when no device uses taints, counters or list
/// attributes (ours use none but taints).
pub const MAX_DEVICES_PER_SLICE: usize = 128;
/// Devices per slice allowed when a device of the slice has taints or consumes counters.
pub const MAX_TAINTED_DEVICES_PER_SLICE: usize = 64;
/// Counter sets per slice allowed by resource.k8s.io/v1.
pub const MAX_COUNTER_SETS_PER_SLICE: usize = 8;
/// The counter of a shared GPU's counter set (named after the GPU): the GPU and its shares
/// each consume it, so only one of them is ever allocated.
pub const CARD_COUNTER: &str = "card";

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
    if let Some(root) = &g.pcie_root {
        attributes.insert("resource.kubernetes.io/pcieRoot".into(), string(root));
    }
    if let Some(mode) = &g.addressing_mode {
        attributes.insert("addressingMode".into(), string(mode));
    }
    let mut capacity = BTreeMap::new();
    match &device.kind {
        DeviceKind::Gpu { memory_bytes }
        | DeviceKind::Share(crate::devices::ShareUse {
            card_bytes: memory_bytes,
            ..
        }) => {
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
        DeviceKind::Mig(m) => mig_attributes(m, g, &mut attributes, &mut capacity),
        DeviceKind::Partition(p) => {
            // Not made yet: no UUID of its own until a claim is prepared.
            attributes.remove("uuid");
            mig_attributes(&p.made(g, 0, 0, ""), g, &mut attributes, &mut capacity);
        }
    }
    let mut published = Device {
        name: device.name.clone(),
        attributes: Some(attributes),
        capacity: (!capacity.is_empty()).then_some(capacity),
        ..Default::default()
    };
    match &device.kind {
        DeviceKind::Gpu { memory_bytes } => {
            consumable::offer(&mut published, *memory_bytes, table.consumable_shares);
        }
        DeviceKind::Mig(m) => {
            consumable::offer(
                &mut published,
                Some(m.memory_bytes),
                table.consumable_shares,
            );
        }
        // A partition is made for one claim and destroyed with it: never offered to several.
        DeviceKind::Share(_) | DeviceKind::Partition(_) => {}
    }
    published
}

/// The attributes and capacities of a MIG device (made or to be made) of `parent`.
fn mig_attributes(
    m: &gpu_discovery::MigDevice,
    parent: &crate::devices::GpuCommon,
    attributes: &mut BTreeMap<String, DeviceAttribute>,
    capacity: &mut BTreeMap<String, DeviceCapacity>,
) {
    attributes.insert("type".into(), string("mig"));
    attributes.insert("parentUUID".into(), string(&parent.gpu_uuid));
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

/// The counters one GPU's counter set (named after the GPU) holds, with their capacity: `card`
/// where the GPU is shared for a class, the partitions' counters where it is offered in MIG
/// partitions ([`crate::partitions`]).
#[derive(Debug, Clone, Default)]
struct GpuSet {
    shared: bool,
    partitions: Option<partitions::GpuCounters>,
}

impl GpuSet {
    fn capacities(&self) -> BTreeMap<String, Counter> {
        let mut counters: BTreeMap<String, u64> = self
            .partitions
            .as_ref()
            .map(partitions::GpuCounters::capacities)
            .unwrap_or_default();
        if self.shared {
            counters.insert(CARD_COUNTER.to_owned(), 1);
        }
        as_counters(counters)
    }

    /// What the whole card (or a share of it) consumes: the card, and every memory slice.
    fn whole(&self) -> BTreeMap<String, u64> {
        let mut used = self
            .partitions
            .as_ref()
            .map(partitions::GpuCounters::whole)
            .unwrap_or_default();
        if self.shared {
            used.insert(CARD_COUNTER.to_owned(), 1);
        }
        used
    }
}

fn as_counters(counters: BTreeMap<String, u64>) -> BTreeMap<String, Counter> {
    counters
        .into_iter()
        .map(|(name, n)| {
            (
                name,
                Counter {
                    value: Quantity(n.to_string()),
                },
            )
        })
        .collect()
}

/// `used` of the counter set `gpu`; `None` when nothing is used.
fn consumption(gpu: &str, used: BTreeMap<String, u64>) -> Option<Vec<DeviceCounterConsumption>> {
    (!used.is_empty()).then(|| {
        vec![DeviceCounterConsumption {
            counter_set: gpu.to_owned(),
            counters: as_counters(used),
        }]
    })
}

/// The counter sets of `table`'s GPUs that are shared (`shares`) or offered in partitions, by
/// GPU device name.
fn gpu_sets(table: &DeviceTable, shares: &[Share]) -> BTreeMap<String, GpuSet> {
    let mut sets: BTreeMap<String, GpuSet> = BTreeMap::new();
    for share in shares {
        sets.entry(share.gpu.clone()).or_default().shared = true;
    }
    let mut by_gpu: BTreeMap<String, Vec<&crate::devices::Partition>> = BTreeMap::new();
    for device in table.devices.values() {
        if let DeviceKind::Partition(p) = &device.kind {
            by_gpu
                .entry(crate::devices::gpu_name(device.gpu.minor))
                .or_default()
                .push(p);
        }
    }
    for (gpu, parts) in by_gpu {
        sets.entry(gpu).or_default().partitions = Some(partitions::gpu_counters(parts));
    }
    sets
}

/// The device of `share`: its GPU's attributes with `type` `shared`, the class (`gpuClass`) and
/// the strategy (`sharing`); the card's `memory` as a capacity many claims consume from, one
/// share each unless a claim asks for more; one unit of the GPU's counter (and every memory
/// slice of a GPU offered in partitions). `None` when the table lacks the GPU.
pub fn share_device(share: &Share, table: &DeviceTable) -> Option<Device> {
    let sets = gpu_sets(table, std::slice::from_ref(share));
    shared_device(share, table, &sets)
}

fn shared_device(
    share: &Share,
    table: &DeviceTable,
    sets: &BTreeMap<String, GpuSet>,
) -> Option<Device> {
    let gpu = table.devices.get(&share.gpu)?;
    let mut device = slice_device(gpu, table);
    let attributes = device.attributes.get_or_insert_default();
    attributes.insert("type".into(), string("shared"));
    attributes.insert("gpuClass".into(), string(&share.class));
    let strategy = match share.strategy {
        SharingStrategy::TimeSlicing => "TimeSlicing",
        SharingStrategy::Mps => "MPS",
    };
    attributes.insert("sharing".into(), string(strategy));
    let share_bytes = bytes_quantity(share.share_bytes);
    device.capacity = Some(BTreeMap::from([(
        "memory".to_owned(),
        DeviceCapacity {
            value: bytes_quantity(share.card_bytes),
            request_policy: Some(CapacityRequestPolicy {
                default: Some(share_bytes.clone()),
                valid_range: Some(CapacityRequestPolicyRange {
                    min: share_bytes,
                    max: None,
                    step: None,
                }),
                valid_values: None,
            }),
        },
    )]));
    device.name = share.name.clone();
    device.allow_multiple_allocations = Some(true);
    device.consumes_counters = sets
        .get(&share.gpu)
        .and_then(|set| consumption(&share.gpu, set.whole()));
    Some(device)
}

/// Name of the `index`-th slice of a node's pool.
pub fn slice_name(node: &str, driver: &str, index: usize) -> String {
    format!("{node}-{driver}-{index}")
}

/// A hash of the devices and counter sets of a pool (their JSON), independent of the
/// generation.
pub fn content_hash(devices: &[Device], counter_sets: &[CounterSet]) -> String {
    let mut json = serde_json::to_vec(devices).expect("devices serialise");
    if !counter_sets.is_empty() {
        json.extend(serde_json::to_vec(counter_sets).expect("counter sets serialise"));
    }
    Sha256::digest(&json)
        .iter()
        .take(16)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// What one slice of the pool carries: devices, or counter sets (never both).
enum Part {
    Devices(Vec<Device>),
    Counters(Vec<CounterSet>),
}

/// The slices that publish `table` and its `shares` for `node`, with `taints` on the devices they
/// name (a share carries its GPU's): devices in name order, at most [`MAX_DEVICES_PER_SLICE`] per
/// slice ([`MAX_TAINTED_DEVICES_PER_SLICE`] while a device is tainted or consumes counters), then
/// the shared GPUs' counter sets in slices of their own, every slice carrying the pool
/// `generation`, the slice count, the content hash and an owner reference to the Node. A node
/// without devices gets one empty slice, so the pool still exists.
pub fn desired_slices(
    node: &NodeRef,
    driver: &str,
    table: &DeviceTable,
    shares: &[Share],
    taints: &Taints,
    generation: i64,
) -> Vec<ResourceSlice> {
    let sets = gpu_sets(table, shares);
    let mut devices: Vec<Device> = table
        .devices
        .values()
        .map(|d| {
            let used = match &d.kind {
                DeviceKind::Partition(p) => sets
                    .get(&crate::devices::gpu_name(d.gpu.minor))
                    .and_then(|set| set.partitions.as_ref())
                    .map(|counters| counters.partition(p))
                    .unwrap_or_default(),
                _ => sets.get(&d.name).map(GpuSet::whole).unwrap_or_default(),
            };
            let set = match &d.kind {
                DeviceKind::Partition(_) => crate::devices::gpu_name(d.gpu.minor),
                _ => d.name.clone(),
            };
            Device {
                taints: taints.get(&d.name).cloned(),
                consumes_counters: consumption(&set, used),
                ..slice_device(d, table)
            }
        })
        .collect();
    devices.extend(shares.iter().filter_map(|share| {
        Some(Device {
            taints: taints.get(&share.gpu).cloned(),
            ..shared_device(share, table, &sets)?
        })
    }));
    devices.sort_by(|a, b| a.name.cmp(&b.name));
    let counter_sets: Vec<CounterSet> = sets
        .iter()
        .map(|(gpu, set)| CounterSet {
            name: gpu.clone(),
            counters: set.capacities(),
        })
        .collect();
    let hash = content_hash(&devices, &counter_sets);
    let per_slice = if devices
        .iter()
        .any(|d| d.taints.is_some() || d.consumes_counters.is_some())
    {
        MAX_TAINTED_DEVICES_PER_SLICE
    } else {
        MAX_DEVICES_PER_SLICE
    };
    let mut parts: Vec<Part> = if devices.is_empty() {
        vec![Part::Devices(Vec::new())]
    } else {
        devices
            .chunks(per_slice)
            .map(|c| Part::Devices(c.to_vec()))
            .collect()
    };
    parts.extend(
        counter_sets
            .chunks(MAX_COUNTER_SETS_PER_SLICE)
            .map(|c| Part::Counters(c.to_vec())),
    );
    let count = parts.len() as i64;
    parts
        .into_iter()
        .enumerate()
        .map(|(index, part)| ResourceSlice {
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
                devices: match &part {
                    Part::Devices(devices) => Some(devices.clone()),
                    Part::Counters(_) => None,
                },
                shared_counters: match part {
                    Part::Counters(sets) => Some(sets),
                    Part::Devices(_) => None,
                },
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
        let slices = desired_slices(
            &node(),
            "gpu.nvidia.com",
            &table(130),
            &[],
            &Taints::new(),
            4,
        );
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
        let desired = desired_slices(&node(), "gpu.nvidia.com", &table(2), &[], &Taints::new(), 1);
        assert!(up_to_date(&desired, &desired));
        assert!(!up_to_date(&[], &desired));
        let other = desired_slices(&node(), "gpu.nvidia.com", &table(3), &[], &Taints::new(), 1);
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
        let slices = desired_slices(&node(), "gpu.nvidia.com", &table, &[], &taints, 1);
        assert_eq!(slices.len(), 2, "64 devices per slice while one is tainted");
        let devices: Vec<_> = slices
            .iter()
            .flat_map(|s| s.spec.devices.clone().unwrap())
            .filter(|d| d.taints.is_some())
            .collect();
        assert_eq!(devices.len(), 1);
        assert_eq!(devices[0].taints.as_deref(), Some(&[taint][..]));
        let untainted = desired_slices(&node(), "gpu.nvidia.com", &table, &[], &Taints::new(), 1);
        assert_eq!(untainted.len(), 1);
        assert!(
            !up_to_date(&untainted, &slices),
            "a taint changes the content"
        );
    }

    fn share(gpu: &str, class: &str) -> Share {
        Share {
            name: crate::devices::shared_name(gpu, class),
            gpu: gpu.into(),
            class: class.into(),
            card_bytes: 40 << 30,
            share_bytes: 10 << 30,
            strategy: SharingStrategy::TimeSlicing,
        }
    }

    #[test]
    fn consumable_shares_open_whole_gpus_and_mig_devices_but_not_class_shares() {
        let mut table = table(2);
        table.consumable_shares = crate::consumable::ConsumableShares::Shares(3);
        let mig = crate::testutil::mig("1g.5gb", 4864);
        let mig_device = NodeDevice {
            name: "gpu-1-mig-1g5gb-19-0".into(),
            kind: DeviceKind::Mig(mig),
            ..table.devices["gpu-1"].clone()
        };
        table.devices.insert(mig_device.name.clone(), mig_device);
        table.devices.remove("gpu-1");
        let slices = desired_slices(
            &node(),
            "gpu.nvidia.com",
            &table,
            &[share("gpu-0", "a100")],
            &Taints::new(),
            1,
        );
        let devices = slices[0].spec.devices.clone().unwrap();
        let shares = |d: &Device| {
            d.capacity
                .as_ref()
                .and_then(|c| c.get("shares"))
                .map(|c| c.value.0.clone())
        };
        let by_name: BTreeMap<_, _> = devices.iter().map(|d| (d.name.as_str(), d)).collect();
        for name in ["gpu-0", "gpu-1-mig-1g5gb-19-0"] {
            assert_eq!(
                by_name[name].allow_multiple_allocations,
                Some(true),
                "{name}"
            );
            assert_eq!(shares(by_name[name]).as_deref(), Some("3"), "{name}");
        }
        assert_eq!(
            by_name["gpu-1-mig-1g5gb-19-0"].capacity.as_ref().unwrap()["memory"]
                .value
                .0,
            "4864Mi"
        );
        assert_eq!(
            shares(by_name["gpu-0-shared-a100"]),
            None,
            "a class's share keeps its own capacity"
        );
    }

    #[test]
    fn a_shared_gpu_and_its_shares_consume_one_counter_published_apart() {
        let table = table(2);
        let slices = desired_slices(
            &node(),
            "gpu.nvidia.com",
            &table,
            &[share("gpu-0", "a100")],
            &Taints::new(),
            1,
        );
        assert_eq!(slices.len(), 2, "the devices, then the counter sets");
        let devices = slices[0].spec.devices.clone().unwrap();
        let names: Vec<_> = devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["gpu-0", "gpu-0-shared-a100", "gpu-1"]);
        let consumption = |d: &Device| {
            d.consumes_counters
                .clone()
                .map(|c| c[0].counter_set.clone())
        };
        assert_eq!(consumption(&devices[0]).as_deref(), Some("gpu-0"));
        assert_eq!(consumption(&devices[1]).as_deref(), Some("gpu-0"));
        assert_eq!(
            consumption(&devices[2]),
            None,
            "an unshared GPU is as before"
        );
        let shared = &devices[1];
        assert_eq!(shared.allow_multiple_allocations, Some(true));
        let attributes = shared.attributes.as_ref().unwrap();
        assert_eq!(attributes["type"].string.as_deref(), Some("shared"));
        assert_eq!(attributes["gpuClass"].string.as_deref(), Some("a100"));
        let memory = &shared.capacity.as_ref().unwrap()["memory"];
        assert_eq!(memory.value.0, "40Gi");
        let policy = memory.request_policy.as_ref().unwrap();
        assert_eq!(policy.default.as_ref().map(|q| q.0.as_str()), Some("10Gi"));
        assert_eq!(slices[1].spec.devices, None);
        let sets = slices[1].spec.shared_counters.clone().unwrap();
        assert_eq!(sets.len(), 1);
        assert_eq!(
            (
                sets[0].name.as_str(),
                sets[0].counters[CARD_COUNTER].value.0.as_str()
            ),
            ("gpu-0", "1")
        );
        assert!(slices.iter().all(|s| s.spec.pool.resource_slice_count == 2));
        let unshared = desired_slices(&node(), "gpu.nvidia.com", &table, &[], &Taints::new(), 1);
        assert!(!up_to_date(&unshared, &slices), "shares change the content");
    }

    #[test]
    fn counter_sets_fill_slices_of_eight() {
        let table = table(10);
        let shares: Vec<_> = (0..10).map(|i| share(&format!("gpu-{i}"), "a")).collect();
        let slices = desired_slices(
            &node(),
            "gpu.nvidia.com",
            &table,
            &shares,
            &Taints::new(),
            1,
        );
        let sets: Vec<usize> = slices
            .iter()
            .filter_map(|s| s.spec.shared_counters.as_ref().map(Vec::len))
            .collect();
        assert_eq!(sets, [8, 2]);
        assert_eq!(slices[0].spec.devices.as_ref().unwrap().len(), 20);
    }

    #[test]
    fn a_node_without_devices_still_has_its_pool() {
        let slices = desired_slices(&node(), "gpu.nvidia.com", &table(0), &[], &Taints::new(), 1);
        assert_eq!(slices.len(), 1);
        assert_eq!(slices[0].spec.devices.as_deref(), Some(&[][..]));
    }
}
