//! What the plugin offers the kubelet, decided from the NVML inventory and the [`Offer`]: the
//! extended resources, and for each the device IDs it lists, each backed by one CDI device.
//!
//! Device IDs are the devices' UUIDs (`GPU-…`, `MIG-…`), as the upstream device plugin's default
//! `uuid` ID strategy names them; a time-sliced device is listed once per replica as
//! `<uuid>::<replica>`. The CDI device of an ID is named by the UUID alone, so every replica of a
//! GPU injects the same GPU.

use crate::config::{MigStrategy, Offer};
use gpu_discovery::{Inventory, MigMode};
use node_agent::devices::NodeDevice;
use std::collections::BTreeMap;

/// The resource of whole GPUs (and of MIG devices under the `single` strategy).
pub const GPU_RESOURCE: &str = api::contract::GPU_EXTENDED_RESOURCE;
/// Separates a UUID from its replica number in a time-sliced device ID.
pub const REPLICA_SEPARATOR: &str = "::";

/// One device ID listed to the kubelet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// The ID.
    pub id: String,
    /// UUID of the device it injects (the CDI device name).
    pub uuid: String,
    /// UUID of the physical GPU it lives on (health follows the GPU).
    pub gpu_uuid: String,
}

/// One extended resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resource {
    /// Its name (`nvidia.com/gpu`, `nvidia.com/mig-1g.5gb`, `nvidia.com/gpu.shared`).
    pub name: String,
    /// Its devices, in ID order.
    pub devices: Vec<Listed>,
    /// Refuse allocations of more than one replica.
    pub one_replica_per_container: bool,
}

impl Resource {
    /// The socket file name serving it, in the device-plugins directory
    /// (`nvidia.com/mig-1g.5gb` → `nvidia-mig-1g.5gb.sock`).
    pub fn socket_name(&self) -> String {
        let (vendor, kind) = self.name.split_once('/').unwrap_or(("", &self.name));
        let vendor = vendor.split('.').next().unwrap_or(vendor);
        format!("{vendor}-{kind}.sock")
    }

    /// The device behind `id`, if this resource lists it.
    pub fn find(&self, id: &str) -> Option<&Listed> {
        self.devices.iter().find(|d| d.id == id)
    }
}

/// Everything offered.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Resources by name.
    pub resources: BTreeMap<String, Resource>,
    /// The devices injected, by UUID (the CDI spec has one device each).
    pub devices: BTreeMap<String, NodeDevice>,
    /// Why some GPUs are not offered, for the log.
    pub problems: Vec<String>,
}

/// The resource of a MIG profile under the `mixed` strategy. A `+` (as in `1g.10gb+me`) is not
/// allowed in a resource name and becomes `-`.
pub fn mig_resource(profile: &str) -> String {
    format!("nvidia.com/mig-{}", profile.replace('+', "-"))
}

/// Decides the plan.
pub fn plan(inventory: &Inventory, offer: &Offer) -> Plan {
    let mut plain: BTreeMap<String, Vec<NodeDevice>> = BTreeMap::new();
    let mut problems = Vec::new();
    let single_profiles: std::collections::BTreeSet<&str> = inventory
        .gpus
        .iter()
        .flat_map(|g| g.mig_devices.iter().map(|m| m.profile.as_str()))
        .collect();
    // Under `single`, a node with MIG off on every GPU is offered whole GPUs, as with `none`.
    let any_mig = inventory
        .gpus
        .iter()
        .any(|g| g.mig_mode == MigMode::Enabled);
    let strategy = match offer.mig_strategy {
        MigStrategy::Single if !any_mig => MigStrategy::None,
        other => other,
    };
    for gpu in &inventory.gpus {
        let mig_on = gpu.mig_mode == MigMode::Enabled;
        match strategy {
            MigStrategy::None => plain
                .entry(GPU_RESOURCE.to_owned())
                .or_default()
                .push(NodeDevice::whole_gpu(gpu)),
            MigStrategy::Single if !mig_on => problems.push(format!(
                "GPU {} ({}) has MIG off, but the single MIG strategy offers only MIG devices; \
                 enable MIG on every GPU of the node or use the mixed strategy",
                gpu.index, gpu.uuid
            )),
            MigStrategy::Single if single_profiles.len() > 1 => problems.push(format!(
                "GPU {} ({}) is not offered: the single MIG strategy needs one MIG profile on the \
                 whole node, found {}; use the mixed strategy",
                gpu.index,
                gpu.uuid,
                single_profiles
                    .iter()
                    .copied()
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
            MigStrategy::Single => plain
                .entry(GPU_RESOURCE.to_owned())
                .or_default()
                .extend(gpu.mig_devices.iter().map(|m| NodeDevice::mig(gpu, m))),
            MigStrategy::Mixed if mig_on => {
                for m in &gpu.mig_devices {
                    plain
                        .entry(mig_resource(&m.profile))
                        .or_default()
                        .push(NodeDevice::mig(gpu, m));
                }
            }
            MigStrategy::Mixed => plain
                .entry(GPU_RESOURCE.to_owned())
                .or_default()
                .push(NodeDevice::whole_gpu(gpu)),
        }
        if mig_on && gpu.mig_devices.is_empty() && strategy != MigStrategy::None {
            problems.push(format!(
                "GPU {} ({}) has MIG on but no MIG devices; create them (nvidia-smi mig -cgi ... -C) to offer it",
                gpu.index, gpu.uuid
            ));
        }
    }

    let mut resources = BTreeMap::new();
    let mut devices = BTreeMap::new();
    for (name, members) in plain {
        let replicas = offer
            .time_slicing
            .as_ref()
            .and_then(|ts| ts.replicas(&name));
        let listed: Vec<Listed> = members
            .iter()
            .flat_map(|d| {
                let count = replicas.as_ref().map(|r| r.count);
                listed(d, count)
            })
            .collect();
        let offered_as = replicas
            .as_ref()
            .map_or(name.clone(), |r| r.offered_as.clone());
        let one_replica_per_container = replicas.is_some()
            && offer
                .time_slicing
                .as_ref()
                .is_some_and(|ts| ts.fail_requests_greater_than_one);
        devices.extend(members.into_iter().map(|d| (d.uuid.clone(), d)));
        let entry = resources
            .entry(offered_as.clone())
            .or_insert_with(|| Resource {
                name: offered_as,
                devices: Vec::new(),
                one_replica_per_container,
            });
        entry.devices.extend(listed);
        entry.devices.sort_by(|a: &Listed, b| a.id.cmp(&b.id));
    }
    Plan {
        resources,
        devices,
        problems,
    }
}

fn listed(device: &NodeDevice, replicas: Option<u32>) -> Vec<Listed> {
    let one = |id: String| Listed {
        id,
        uuid: device.uuid.clone(),
        gpu_uuid: device.gpu.gpu_uuid.clone(),
    };
    match replicas {
        None => vec![one(device.uuid.clone())],
        Some(n) => (0..n)
            .map(|i| one(format!("{}{REPLICA_SEPARATOR}{i}", device.uuid)))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{SharedResource, TimeSlicing};
    use gpu_discovery::testing::inventory;
    use gpu_discovery::{CudaVersion, Gpu, MigDevice};

    fn gpu(index: u32, mig: &[&str]) -> Gpu {
        Gpu {
            index,
            minor: index,
            uuid: format!("GPU-{index}"),
            product_name: "NVIDIA A100-SXM4-40GB".into(),
            brand: "Nvidia".into(),
            architecture: "Ampere".into(),
            cuda_compute_capability: CudaVersion { major: 8, minor: 0 },
            memory_bytes: Some(40 << 30),
            pci_bus_id: format!("0000:0{index}:00.0"),
            pcie_root: None,
            addressing_mode: None,
            mig_mode: if mig.is_empty() {
                MigMode::Disabled
            } else {
                MigMode::Enabled
            },
            mig_devices: mig
                .iter()
                .enumerate()
                .map(|(i, profile)| MigDevice {
                    parent_uuid: format!("GPU-{index}"),
                    parent_minor: index,
                    index: i as u32,
                    uuid: format!("MIG-{index}-{i}"),
                    profile: (*profile).into(),
                    gpu_instance_profile_id: 19,
                    gpu_instance_id: i as u32 + 1,
                    compute_instance_id: 0,
                    placement_start: i as u32,
                    placement_size: 1,
                    slices: 1,
                    memory_bytes: 5 << 30,
                    multiprocessors: 14,
                    copy_engines: 1,
                    decoders: 0,
                    encoders: 0,
                    jpeg_engines: 0,
                    ofa_engines: 0,
                })
                .collect(),
            mig_profiles: Vec::new(),
        }
    }

    fn ids(plan: &Plan, resource: &str) -> Vec<String> {
        plan.resources[resource]
            .devices
            .iter()
            .map(|d| d.id.clone())
            .collect()
    }

    fn offer(mig_strategy: MigStrategy) -> Offer {
        Offer {
            mig_strategy,
            time_slicing: None,
        }
    }

    #[test]
    fn none_offers_every_gpu_whole() {
        let inv = inventory(vec![gpu(0, &[]), gpu(1, &["1g.5gb", "1g.5gb"])]);
        let p = plan(&inv, &offer(MigStrategy::None));
        assert_eq!(p.resources.keys().collect::<Vec<_>>(), ["nvidia.com/gpu"]);
        assert_eq!(ids(&p, "nvidia.com/gpu"), ["GPU-0", "GPU-1"]);
        assert!(p.problems.is_empty());
    }

    #[test]
    fn mixed_offers_mig_devices_by_profile() {
        let inv = inventory(vec![gpu(0, &[]), gpu(1, &["1g.5gb", "2g.10gb+me"])]);
        let p = plan(&inv, &offer(MigStrategy::Mixed));
        assert_eq!(ids(&p, "nvidia.com/gpu"), ["GPU-0"]);
        assert_eq!(ids(&p, "nvidia.com/mig-1g.5gb"), ["MIG-1-0"]);
        assert_eq!(ids(&p, "nvidia.com/mig-2g.10gb-me"), ["MIG-1-1"]);
        assert_eq!(
            p.resources["nvidia.com/mig-1g.5gb"].devices[0].gpu_uuid,
            "GPU-1"
        );
        assert_eq!(
            p.resources["nvidia.com/mig-1g.5gb"].socket_name(),
            "nvidia-mig-1g.5gb.sock"
        );
        assert_eq!(p.devices.len(), 3);
    }

    #[test]
    fn single_needs_one_profile_on_every_gpu() {
        let uniform = inventory(vec![gpu(0, &["1g.5gb"]), gpu(1, &["1g.5gb", "1g.5gb"])]);
        let p = plan(&uniform, &offer(MigStrategy::Single));
        assert_eq!(ids(&p, "nvidia.com/gpu"), ["MIG-0-0", "MIG-1-0", "MIG-1-1"]);
        assert!(p.problems.is_empty());

        let no_mig = inventory(vec![gpu(0, &[]), gpu(1, &[])]);
        let p = plan(&no_mig, &offer(MigStrategy::Single));
        assert_eq!(ids(&p, "nvidia.com/gpu"), ["GPU-0", "GPU-1"]);
        assert!(p.problems.is_empty());

        let mixed = inventory(vec![gpu(0, &[]), gpu(1, &["1g.5gb"])]);
        let p = plan(&mixed, &offer(MigStrategy::Single));
        assert_eq!(ids(&p, "nvidia.com/gpu"), ["MIG-1-0"]);
        assert!(
            p.problems[0].contains("GPU 0 (GPU-0) has MIG off"),
            "{:?}",
            p.problems
        );

        let two = inventory(vec![gpu(0, &["1g.5gb"]), gpu(1, &["2g.10gb"])]);
        let p = plan(&two, &offer(MigStrategy::Single));
        assert!(p.resources.is_empty());
        assert!(
            p.problems[0].contains("found 1g.5gb, 2g.10gb"),
            "{:?}",
            p.problems
        );
    }

    #[test]
    fn time_slicing_lists_replicas_under_the_shared_name() {
        let inv = inventory(vec![gpu(0, &[]), gpu(1, &[])]);
        let offer = Offer {
            mig_strategy: MigStrategy::None,
            time_slicing: Some(TimeSlicing {
                rename_by_default: true,
                fail_requests_greater_than_one: true,
                resources: vec![SharedResource {
                    name: "nvidia.com/gpu".into(),
                    rename: None,
                    replicas: 2,
                    devices: None,
                }],
            }),
        };
        let p = plan(&inv, &offer);
        assert_eq!(
            ids(&p, "nvidia.com/gpu.shared"),
            ["GPU-0::0", "GPU-0::1", "GPU-1::0", "GPU-1::1"]
        );
        let r = &p.resources["nvidia.com/gpu.shared"];
        assert!(r.one_replica_per_container);
        assert_eq!(r.find("GPU-1::0").unwrap().uuid, "GPU-1");
        assert_eq!(r.socket_name(), "nvidia-gpu.shared.sock");
        assert_eq!(p.devices.keys().collect::<Vec<_>>(), ["GPU-0", "GPU-1"]);
    }
}
