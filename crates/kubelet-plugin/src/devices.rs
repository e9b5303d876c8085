//! The node's allocatable devices as the ResourceSlices name them: the [`node_agent::devices`]
//! model (full GPUs and static MIG devices) plus the shares of a GPU published for GPU classes
//! (`gpu-<minor>-shared-<class>`).
//!
//! Built from the `gpu-discovery` inventory. A GPU with MIG enabled is announced only through its
//! MIG devices, each named by the placement NVML reports for its GPU instance.

use gpu_discovery::{Inventory, MigMode};
pub use node_agent::devices::{
    DeviceKind, GpuCommon, NodeDevice, Partition, ShareUse, gpu_name, mig_name, profile_slug,
};
use std::collections::BTreeMap;

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
                strategy: node_agent::devices::Strategy::TimeSlicing,
                share_id: share_id.map(str::to_owned),
            }),
            ..gpu.clone()
        })
    }

    /// This table without MIG partitions: what is published where counters are not served.
    pub fn without_partitions(&self) -> Self {
        let mut table = self.clone();
        table
            .devices
            .retain(|_, d| !matches!(d.kind, DeviceKind::Partition(_)));
        table
    }

    /// Whether the GPU of minor `minor` is offered in MIG partitions (dynamic MIG).
    pub fn offers_partitions(&self, minor: u32) -> bool {
        self.devices
            .values()
            .any(|d| d.gpu.minor == minor && matches!(d.kind, DeviceKind::Partition(_)))
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
}
