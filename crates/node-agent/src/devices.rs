//! The node's devices as both planes offer them: full GPUs `gpu-<minor>` and static MIG devices
//! `gpu-<parentMinor>-mig-<profile>-<giProfileId>-<start>`, each with what its container needs
//! (the parent GPU's minor and UUID), built from the `gpu-discovery` inventory; and, on the DRA
//! plane, MIG partitions made on demand, named as the static MIG device they become.

use gpu_discovery::{Gpu, MigDevice, MigPlacement, MigProfile};
use serde::Deserialize;

/// How the pods holding shares of one GPU are kept apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum Strategy {
    /// Time-slicing between processes.
    TimeSlicing,
    /// The CUDA Multi-Process Service.
    #[serde(rename = "MPS")]
    Mps,
}

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
    /// A MIG partition not made yet: created when a claim is prepared, destroyed when it is
    /// unprepared.
    Partition(Partition),
    /// A share of a full GPU held by one claim; made when a claim is prepared, never in the
    /// table.
    Share(ShareUse),
}

/// A GPU-instance profile at one of its placements on a GPU whose MIG devices are made on demand.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partition {
    /// The profile (its `placements` left empty: `placement` is the one).
    pub profile: MigProfile,
    /// Where the GPU instance goes.
    pub placement: MigPlacement,
}

impl Partition {
    /// The MIG device this partition is once made: GPU instance `gi` with compute instance `ci`,
    /// of UUID `uuid`, on `parent`.
    pub fn made(&self, parent: &GpuCommon, gi: u32, ci: u32, uuid: &str) -> MigDevice {
        let p = &self.profile;
        MigDevice {
            parent_uuid: parent.gpu_uuid.clone(),
            parent_minor: parent.minor,
            index: 0,
            uuid: uuid.to_owned(),
            profile: p.name.clone(),
            gpu_instance_profile_id: p.id,
            gpu_instance_id: gi,
            compute_instance_id: ci,
            placement_start: self.placement.start,
            placement_size: self.placement.size,
            slices: p.slices,
            memory_bytes: p.memory_bytes,
            multiprocessors: p.multiprocessors,
            copy_engines: p.copy_engines,
            decoders: p.decoders,
            encoders: p.encoders,
            jpeg_engines: p.jpeg_engines,
            ofa_engines: p.ofa_engines,
        }
    }
}

/// How one claim uses a share of a GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareUse {
    /// Memory of the card, when NVML reports it.
    pub card_bytes: Option<u64>,
    /// Memory the claim's allocation consumed of the card.
    pub part_bytes: Option<u64>,
    /// How the pods on the card are kept apart.
    pub strategy: Strategy,
    /// The allocation's share id.
    pub share_id: Option<String>,
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

    /// A partition of `gpu`: `profile` at `placement`, not made yet (no UUID until then).
    pub fn partition(gpu: &Gpu, profile: &MigProfile, placement: MigPlacement) -> Self {
        Self {
            name: mig_name(gpu.minor, &profile.name, profile.id, placement.start),
            uuid: String::new(),
            gpu: common(gpu),
            kind: DeviceKind::Partition(Partition {
                profile: MigProfile {
                    placements: Vec::new(),
                    ..profile.clone()
                },
                placement,
            }),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profile_names_are_slugged() {
        assert_eq!(profile_slug("1g.5gb"), "1g5gb");
        assert_eq!(profile_slug("1g.5gb+me"), "1g5gb-me");
        assert_eq!(mig_name(1, "2g.20gb", 14, 0), "gpu-1-mig-2g20gb-14-0");
    }
}
