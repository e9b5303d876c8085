//! The node's allocatable devices, named as in the ResourceSlices: full GPUs `gpu-<minor>` and
//! static MIG devices `gpu-<parentMinor>-mig-<profile>-<giProfileId>-<start>`.
//!
//! Built from the `gpu-discovery` inventory. A GPU with MIG enabled is announced only through its
//! MIG devices. The inventory does not carry MIG placements (its NVML binding has no safe call
//! for them), so [`derive_placements`] reconstructs them: each MIG device takes the first free,
//! aligned run of memory slices its size needs, in NVML order — the order NVML creates them in.

use gpu_discovery::{Gpu, Inventory, MigDevice, MigMode};
use std::collections::BTreeMap;

/// Memory slices of a MIG-capable GPU (A100, H100, H200, B200 all have eight).
pub const MEMORY_SLICES: u32 = 8;

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
    /// Minor number of the physical GPU.
    pub minor: u32,
    /// UUID of the physical GPU.
    pub gpu_uuid: String,
}

/// A MIG device as NVML reports it, with its derived placement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigInfo {
    /// What NVML reports.
    pub mig: MigDevice,
    /// First memory slice.
    pub start: u32,
    /// Memory slices occupied.
    pub size: u32,
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
    Mig(MigInfo),
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

/// Name of a static MIG device.
pub fn mig_name(parent_minor: u32, profile: &str, gi_profile_id: u32, start: u32) -> String {
    format!(
        "gpu-{parent_minor}-mig-{}-{gi_profile_id}-{start}",
        profile_slug(profile)
    )
}

/// Memory slices a MIG device needs: its share of the GPU's memory in eighths, rounded up to
/// a power of two (placements are aligned to their size).
pub fn slice_count(mig_bytes: u64, gpu_bytes: u64) -> u32 {
    if gpu_bytes == 0 {
        return 1;
    }
    let per_slice = gpu_bytes.div_ceil(u64::from(MEMORY_SLICES));
    let needed = mig_bytes
        .div_ceil(per_slice)
        .clamp(1, u64::from(MEMORY_SLICES));
    (needed as u32).next_power_of_two()
}

/// `(start, size)` of each MIG device, first-fit over aligned runs of free memory slices.
pub fn derive_placements(migs: &[MigDevice], gpu_bytes: u64) -> Vec<(u32, u32)> {
    let mut used = [false; MEMORY_SLICES as usize];
    migs.iter()
        .map(|m| {
            let size = slice_count(m.memory_bytes, gpu_bytes);
            let start = (0..MEMORY_SLICES)
                .step_by(size as usize)
                .find(|s| (*s..s + size).all(|i| !used[i as usize]))
                .unwrap_or(0);
            for i in start..(start + size).min(MEMORY_SLICES) {
                used[i as usize] = true;
            }
            (start, size)
        })
        .collect()
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
        minor: gpu.minor,
        gpu_uuid: gpu.uuid.clone(),
    }
}

impl DeviceTable {
    /// The devices of an inventory.
    pub fn from_inventory(inventory: &Inventory) -> Self {
        let mut devices = BTreeMap::new();
        for gpu in &inventory.gpus {
            let shared = common(gpu);
            if gpu.mig_mode != MigMode::Enabled {
                let name = gpu_name(gpu.minor);
                devices.insert(
                    name.clone(),
                    NodeDevice {
                        name,
                        uuid: gpu.uuid.clone(),
                        gpu: shared,
                        kind: DeviceKind::Gpu {
                            memory_bytes: gpu.memory_bytes,
                        },
                    },
                );
                continue;
            }
            let placements = derive_placements(&gpu.mig_devices, gpu.memory_bytes.unwrap_or(0));
            for (mig, (start, size)) in gpu.mig_devices.iter().zip(placements) {
                let name = mig_name(gpu.minor, &mig.profile, mig.gpu_instance_profile_id, start);
                devices.insert(
                    name.clone(),
                    NodeDevice {
                        name,
                        uuid: mig.uuid.clone(),
                        gpu: shared.clone(),
                        kind: DeviceKind::Mig(MigInfo {
                            mig: mig.clone(),
                            start,
                            size,
                        }),
                    },
                );
            }
        }
        Self {
            driver_version: inventory.driver_version.clone(),
            cuda_driver_version: (
                inventory.cuda_driver_version.major,
                inventory.cuda_driver_version.minor,
            ),
            devices,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{MIB, mig};

    #[test]
    fn profile_names_are_slugged() {
        assert_eq!(profile_slug("1g.5gb"), "1g5gb");
        assert_eq!(profile_slug("1g.5gb+me"), "1g5gb-me");
        assert_eq!(mig_name(1, "2g.20gb", 14, 0), "gpu-1-mig-2g20gb-14-0");
    }

    #[test]
    fn slice_counts_follow_memory() {
        let a100 = 40960 * MIB;
        assert_eq!(slice_count(4864 * MIB, a100), 1);
        assert_eq!(slice_count(9856 * MIB, a100), 2);
        assert_eq!(slice_count(19968 * MIB, a100), 4);
        assert_eq!(slice_count(40192 * MIB, a100), 8);
    }

    #[test]
    fn placements_are_first_fit_and_aligned() {
        let migs = [
            mig("3g.20gb", 19968),
            mig("2g.10gb", 9856),
            mig("1g.5gb", 4864),
        ];
        assert_eq!(
            derive_placements(&migs, 40960 * MIB),
            [(0, 4), (4, 2), (6, 1)]
        );
        let ones: Vec<_> = (0..3).map(|_| mig("1g.5gb", 4864)).collect();
        assert_eq!(
            derive_placements(&ones, 40960 * MIB),
            [(0, 1), (1, 1), (2, 1)]
        );
    }
}
