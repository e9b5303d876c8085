//! The node's allocatable devices, named as in the ResourceSlices: full GPUs `gpu-<minor>` and
//! static MIG devices `gpu-<parentMinor>-mig-<profile>-<giProfileId>-<start>`.
//!
//! Built from the `gpu-discovery` inventory. A GPU with MIG enabled is announced only through its
//! MIG devices, each named by the placement NVML reports for its GPU instance.

use gpu_discovery::{Gpu, Inventory, MigDevice, MigMode};
use std::collections::BTreeMap;

/// Properties every device shares with its physical GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuCommon {
    /// Product name.
    pub product_name: String,
    /// Brand.
    pub brand: String,
    /// Architecture.
    pub architecture: String,
    /// `major.minor` compute capability.
    pub cuda_compute_capability: (u32, u32),
    /// PCI bus id (`0000:07:00.0`).
    pub pci_bus_id: String,
    /// PCIe root complex (`pci0000:00`), where sysfs names it.
    pub pcie_root: Option<String>,
    /// How the GPU addresses system memory (`HMM`, `ATS`, `None`), where NVML says.
    pub addressing_mode: Option<String>,
    /// Minor number of the physical GPU.
    pub minor: u32,
    /// UUID of the physical GPU.
    pub gpu_uuid: String,
}

/// What kind of device this is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceKind {
    /// A full GPU, with its memory when NVML reports it.
    Gpu {
        /// Memory bytes.
        memory_bytes: Option<u64>,
    },
    /// A static MIG device.
    Mig(MigDevice),
    /// A share of a full GPU held by one claim; made when a claim is prepared, never in the
    /// table.
    Share(ShareUse),
}

/// How one claim uses a share of a GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareUse {
    /// Memory of the card, when NVML reports it.
    pub card_bytes: Option<u64>,
    /// Memory the claim's allocation consumed of the card.
    pub part_bytes: Option<u64>,
    /// How the pods on the card are kept apart.
    pub strategy: crate::opaque::Strategy,
    /// The allocation's share id.
    pub share_id: Option<String>,
}

/// The shares of one GPU for one class.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Share {
    /// The device name, `gpu-<minor>-shared-<class>`.
    pub name: String,
    /// The full GPU's device name.
    pub gpu: String,
    /// The class they are published for.
    pub class: String,
    /// Memory of the card.
    pub card_bytes: u64,
    /// Memory one claim consumes unless it asks for more.
    pub share_bytes: u64,
    /// How the pods on the card are kept apart.
    pub strategy: api::gpuclass::SharingStrategy,
}

/// One allocatable device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeDevice {
    /// Name in the pool.
    pub name: String,
    /// The device's own UUID (`GPU-…` or `MIG-…`).
    pub uuid: String,
    /// Shared GPU properties.
    pub gpu: GpuCommon,
    /// GPU or MIG specifics.
    pub kind: DeviceKind,
}

/// Every allocatable device of the node, by name, plus driver-wide versions.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeviceTable {
    /// Driver version (`580.95.05`).
    pub driver_version: String,
    /// CUDA driver version, `major.minor`.
    pub cuda_driver_version: (u32, u32),
    /// Devices by name.
    pub devices: BTreeMap<String, NodeDevice>,
    /// Whether whole GPUs and MIG devices are offered to several claims at once.
    pub consumable_shares: crate::consumable::ConsumableShares,
}

/// A MIG profile name as it appears in device names: lower case, dots dropped, anything outside
/// `[a-z0-9-]` turned into `-` (`1g.5gb+me` → `1g5gb-me`).
pub fn profile_slug(profile: &str) -> String {
    profile
        .to_ascii_lowercase()
        .chars()
        .filter(|c| *c != '.')
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect()
}

/// Name of a full GPU.
pub fn gpu_name(minor: u32) -> String {
    format!("gpu-{minor}")
}

/// Name of the shares of a full GPU published for a GPU class: `gpu-0-shared-a100`.
pub fn shared_name(gpu: &str, class: &str) -> String {
    format!("{gpu}-shared-{class}")
}

/// The full GPU and the class of a shares device's name (`gpu-0-shared-a100` →
/// `("gpu-0", "a100")`); `None` for any other name.
pub fn shared_parts(name: &str) -> Option<(&str, &str)> {
    let (gpu, class) = name.split_once("-shared-")?;
    let minor = gpu.strip_prefix("gpu-")?;
    (!minor.is_empty() && minor.bytes().all(|b| b.is_ascii_digit()) && !class.is_empty())
        .then_some((gpu, class))
}

/// The physical GPU's device name behind a device: the GPU of shares, the name itself otherwise.
pub fn card_of(name: &str) -> &str {
    shared_parts(name).map_or(name, |(gpu, _)| gpu)
}

/// Whether two devices of one pool cannot be prepared for two claims at once: the same device
/// (unless both are shares, which many claims hold), or a GPU and shares of it.
pub fn exclusive_pair(a: &str, b: &str) -> bool {
    match (shared_parts(a), shared_parts(b)) {
        (Some(x), Some(y)) => x.0 == y.0 && x.1 != y.1,
        (Some((gpu, _)), None) => gpu == b,
        (None, Some((gpu, _))) => gpu == a,
        (None, None) => a == b,
    }
}

/// Name of a static MIG device.
pub fn mig_name(parent_minor: u32, profile: &str, gi_profile_id: u32, start: u32) -> String {
    format!(
        "gpu-{parent_minor}-mig-{}-{gi_profile_id}-{start}",
        profile_slug(profile)
    )
}

fn common(gpu: &Gpu) -> GpuCommon {
    GpuCommon {
        product_name: gpu.product_name.clone(),
        brand: gpu.brand.clone(),
        architecture: gpu.architecture.clone(),
        cuda_compute_capability: (
            gpu.cuda_compute_capability.major,
            gpu.cuda_compute_capability.minor,
        ),
        pci_bus_id: gpu.pci_bus_id.clone(),
        pcie_root: gpu.pcie_root.clone(),
        addressing_mode: gpu.addressing_mode.clone(),
        minor: gpu.minor,
        gpu_uuid: gpu.uuid.clone(),
    }
}

impl NodeDevice {
    /// A GPU as one whole device, whatever its MIG mode.
    pub fn whole_gpu(gpu: &Gpu) -> Self {
        Self {
            name: gpu_name(gpu.minor),
            uuid: gpu.uuid.clone(),
            gpu: common(gpu),
            kind: DeviceKind::Gpu {
                memory_bytes: gpu.memory_bytes,
            },
        }
    }

    /// One of `gpu`'s MIG devices.
    pub fn mig(gpu: &Gpu, mig: &MigDevice) -> Self {
        Self {
            name: mig_name(
                gpu.minor,
                &mig.profile,
                mig.gpu_instance_profile_id,
                mig.placement_start,
            ),
            uuid: mig.uuid.clone(),
            gpu: common(gpu),
            kind: DeviceKind::Mig(mig.clone()),
        }
    }
}

impl DeviceTable {
    /// The device a claim holds under `name`: a device of the table, or a share of one of its
    /// full GPUs (strategy `TimeSlicing` until the claim's configuration says otherwise).
    pub fn claimable(
        &self,
        name: &str,
        share_id: Option<&str>,
        part_bytes: Option<u64>,
    ) -> Option<NodeDevice> {
        if let Some(device) = self.devices.get(name) {
            return Some(device.clone());
        }
        let (gpu, _) = shared_parts(name)?;
        let gpu = self.devices.get(gpu)?;
        let DeviceKind::Gpu { memory_bytes } = gpu.kind else {
            return None;
        };
        Some(NodeDevice {
            name: name.to_owned(),
            kind: DeviceKind::Share(ShareUse {
                card_bytes: memory_bytes,
                part_bytes,
                strategy: crate::opaque::Strategy::TimeSlicing,
                share_id: share_id.map(str::to_owned),
            }),
            ..gpu.clone()
        })
    }

    /// The devices of an inventory: each GPU whole, or its MIG devices when MIG is on.
    pub fn from_inventory(inventory: &Inventory) -> Self {
        let devices = inventory
            .gpus
            .iter()
            .flat_map(|gpu| -> Vec<NodeDevice> {
                if gpu.mig_mode == MigMode::Enabled {
                    gpu.mig_devices
                        .iter()
                        .map(|m| NodeDevice::mig(gpu, m))
                        .collect()
                } else {
                    vec![NodeDevice::whole_gpu(gpu)]
                }
            })
            .map(|d| (d.name.clone(), d))
            .collect();
        Self {
            driver_version: inventory.driver_version.clone(),
            cuda_driver_version: (
                inventory.cuda_driver_version.major,
                inventory.cuda_driver_version.minor,
            ),
            devices,
            consumable_shares: Default::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_are_named_after_their_gpu_and_class() {
        assert_eq!(shared_name("gpu-3", "a100"), "gpu-3-shared-a100");
        assert_eq!(shared_parts("gpu-3-shared-a100"), Some(("gpu-3", "a100")));
        assert_eq!(
            shared_parts("gpu-3-shared-my-shared-class"),
            Some(("gpu-3", "my-shared-class"))
        );
        for other in [
            "gpu-3",
            "gpu-0-mig-1g5gb-19-6",
            "gpu--shared-a",
            "gpu-1-shared-",
            "x-shared-a",
        ] {
            assert_eq!(shared_parts(other), None, "{other}");
        }
        assert_eq!(card_of("gpu-3-shared-a100"), "gpu-3");
        assert_eq!(card_of("gpu-3"), "gpu-3");
    }

    #[test]
    fn shares_of_one_class_coexist_and_exclude_the_whole_gpu() {
        assert!(!exclusive_pair("gpu-0-shared-a", "gpu-0-shared-a"));
        assert!(exclusive_pair("gpu-0-shared-a", "gpu-0-shared-b"));
        assert!(exclusive_pair("gpu-0-shared-a", "gpu-0"));
        assert!(exclusive_pair("gpu-0", "gpu-0-shared-a"));
        assert!(exclusive_pair("gpu-0", "gpu-0"));
        assert!(!exclusive_pair("gpu-0", "gpu-1-shared-a"));
        assert!(!exclusive_pair("gpu-0", "gpu-1"));
    }

    #[test]
    fn profile_names_are_slugged() {
        assert_eq!(profile_slug("1g.5gb"), "1g5gb");
        assert_eq!(profile_slug("1g.5gb+me"), "1g5gb-me");
        assert_eq!(mig_name(1, "2g.20gb", 14, 0), "gpu-1-mig-2g20gb-14-0");
    }
}
