//! The concrete GPUs and MIG devices a profile and a GPU count produce.

use crate::profile::{GiProfile, MigSupport, Profile};
use crate::settings::{GpuInstanceRecord, MigRecord};

/// Most GPUs one topology may hold (the handle encoding leaves room for more; real nodes have 8).
pub const MAX_GPUS: u32 = 64;

/// Everything the library serves for one session.
#[derive(Debug, Clone)]
pub struct Topology {
    /// The model every GPU is an instance of.
    pub profile: Profile,
    /// GPUs in NVML index order.
    pub gpus: Vec<Gpu>,
    /// What UUIDs derive from.
    seed: u64,
}

/// One physical GPU.
#[derive(Debug, Clone)]
pub struct Gpu {
    /// NVML index.
    pub index: u32,
    /// Minor number (`/dev/nvidia<minor>`).
    pub minor: u32,
    /// `GPU-...` UUID.
    pub uuid: String,
    /// PCI bus id as NVML formats it (`00000000:07:00.0`).
    pub pci_bus_id: String,
    /// PCI bus number.
    pub pci_bus: u32,
    /// PCI domain (one per 8 GPUs).
    pub pci_domain: u32,
    /// MIG mode and instances.
    pub mig: MigRecord,
    /// MIG devices present on it: one per compute instance, while MIG is on.
    pub migs: Vec<MigDevice>,
}

/// One MIG device (a GPU instance with one compute instance).
#[derive(Debug, Clone)]
pub struct MigDevice {
    /// `MIG-...` UUID.
    pub uuid: String,
    /// The GPU-instance profile it was created from.
    pub profile: GiProfile,
    /// GPU-instance id.
    pub gpu_instance_id: u32,
    /// Compute-instance id.
    pub compute_instance_id: u32,
}

/// The `NVML_COMPUTE_INSTANCE_PROFILE_*` index of a compute instance spanning `slices` compute
/// slices (the header's order: 1, 2, 3, 4, 7, 8, 6 slices).
pub fn compute_profile_for(slices: u32) -> Option<u32> {
    [1, 2, 3, 4, 7, 8, 6]
        .iter()
        .position(|s| *s == slices)
        .map(|i| i as u32)
}

/// Compute slices of the `NVML_COMPUTE_INSTANCE_PROFILE_*` index `profile` (`1_SLICE_REV1` is 1).
pub fn compute_profile_slices(profile: u32) -> Option<u32> {
    [1, 2, 3, 4, 7, 8, 6, 1].get(profile as usize).copied()
}

impl Topology {
    /// Builds `count` GPUs of `profile`.
    pub fn build(profile: Profile, count: u32) -> Result<Self, String> {
        if count > MAX_GPUS {
            return Err(format!(
                "gpu_count {count} exceeds the mock's limit of {MAX_GPUS}"
            ));
        }
        let seed = fnv1a(profile.name.as_bytes());
        let gpus = (0..count)
            .map(|index| build_gpu(&profile, seed, index))
            .collect();
        Ok(Self {
            profile,
            gpus,
            seed,
        })
    }

    /// Keeps the GPUs whose device node `visible(minor)` says this process can see, renumbering
    /// the NVML indices from 0 as the driver does inside a container given only some of them.
    pub fn keep_visible(&mut self, visible: impl Fn(u32) -> bool) {
        self.gpus.retain(|g| visible(g.minor));
        for (index, gpu) in (0..).zip(&mut self.gpus) {
            gpu.index = index;
        }
    }

    /// The GPU with this NVML index.
    pub fn gpu(&self, index: u32) -> Option<&Gpu> {
        self.gpus.get(index as usize)
    }

    /// The MIG capability of the GPUs' model.
    pub fn mig_support(&self) -> Option<&MigSupport> {
        self.profile.mig.as_ref()
    }

    /// Puts the GPU with NVML index `index` in MIG state `record` (`None`: the profile's), and
    /// lists its MIG devices anew. GPU instances of profiles the model lacks are dropped.
    pub fn set_mig(&mut self, index: u32, record: Option<MigRecord>) {
        let seed = self.seed;
        let Some(mig) = self.profile.mig.clone() else {
            return;
        };
        let Some(gpu) = self.gpus.get_mut(index as usize) else {
            return;
        };
        gpu.mig = record.unwrap_or_else(|| initial_mig(&mig));
        gpu.migs = mig_devices(&mig, &gpu.mig, seed, gpu.minor);
    }
}

/// The MIG state a GPU of this model starts in: its mode and layout.
pub fn initial_mig(mig: &MigSupport) -> MigRecord {
    let gpu_instances = if mig.enabled {
        mig.layout
            .iter()
            .filter_map(|entry| {
                let gi = mig.profiles.iter().find(|p| p.name == entry.profile)?;
                Some(GpuInstanceRecord {
                    id: entry.gpu_instance_id,
                    profile_id: gi.id,
                    start: entry.start,
                    compute_instances: vec![(
                        entry.compute_instance_id,
                        compute_profile_for(gi.slices)?,
                    )],
                })
            })
            .collect()
    } else {
        Vec::new()
    };
    MigRecord {
        current: mig.enabled,
        pending: mig.enabled,
        gpu_instances,
    }
}

/// One MIG device per compute instance of `record` while MIG is on, in GPU-instance order.
fn mig_devices(mig: &MigSupport, record: &MigRecord, seed: u64, minor: u32) -> Vec<MigDevice> {
    if !record.current {
        return Vec::new();
    }
    let mut devices = Vec::new();
    for gi in &record.gpu_instances {
        let Some(profile) = mig.profiles.iter().find(|p| p.id == gi.profile_id) else {
            continue;
        };
        for (ci, _) in &gi.compute_instances {
            let key = seed ^ (u64::from(minor) << 32) ^ (u64::from(gi.id) << 8) ^ u64::from(*ci);
            devices.push(MigDevice {
                uuid: format_uuid("MIG-", fnv1a(&key.to_le_bytes())),
                profile: profile.clone(),
                gpu_instance_id: gi.id,
                compute_instance_id: *ci,
            });
        }
    }
    devices
}

fn build_gpu(profile: &Profile, seed: u64, index: u32) -> Gpu {
    let uuid = format_uuid(
        "GPU-",
        seed ^ u64::from(index).wrapping_mul(0x9e37_79b9_7f4a_7c15),
    );
    // Spread GPUs over buses the way an 8-GPU baseboard does (0x07, 0x0f, 0x47, ...), one PCI
    // domain per baseboard, so bus numbers stay below 0x100 however many GPUs there are.
    let (pci_domain, slot) = (index / 8, index % 8);
    let pci_bus = 0x07 + slot * 8 + (slot / 2) * 0x30;
    let mig = profile.mig.as_ref().map(initial_mig).unwrap_or_default();
    let migs = profile
        .mig
        .as_ref()
        .map(|support| mig_devices(support, &mig, seed, index))
        .unwrap_or_default();
    Gpu {
        index,
        minor: index,
        uuid,
        pci_bus_id: format!("{pci_domain:08X}:{pci_bus:02X}:00.0"),
        pci_domain,
        pci_bus,
        mig,
        migs,
    }
}

/// A UUID-shaped string derived from `value`, stable across runs.
fn format_uuid(prefix: &str, value: u64) -> String {
    let hi = fnv1a(&value.to_le_bytes());
    let lo = fnv1a(&hi.to_be_bytes());
    format!(
        "{prefix}{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        hi >> 32,
        (hi >> 16) & 0xffff,
        hi & 0xffff,
        lo >> 48,
        lo & 0xffff_ffff_ffff
    )
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::load;
    use std::collections::HashSet;

    #[test]
    fn only_visible_gpus_are_kept_and_renumbered() {
        let all = Topology::build(load("h100-sxm5-80gb").unwrap(), 4).unwrap();
        let mut seen = all.clone();
        seen.keep_visible(|minor| minor == 2);
        assert_eq!(seen.gpus.len(), 1);
        let gpu = &seen.gpus[0];
        assert_eq!((gpu.index, gpu.minor, &gpu.uuid), (0, 2, &all.gpus[2].uuid));
        assert!(seen.gpu(0).is_some() && seen.gpu(1).is_none());
    }

    #[test]
    fn gpus_get_distinct_stable_identities() {
        let a = Topology::build(load("h100-sxm5-80gb").unwrap(), 8).unwrap();
        let b = Topology::build(load("h100-sxm5-80gb").unwrap(), 8).unwrap();
        let uuids: HashSet<_> = a.gpus.iter().map(|g| g.uuid.clone()).collect();
        let buses: HashSet<_> = a.gpus.iter().map(|g| g.pci_bus_id.clone()).collect();
        assert_eq!((uuids.len(), buses.len()), (8, 8));
        assert_eq!(a.gpus[3].uuid, b.gpus[3].uuid);
        // Past one baseboard, GPUs move to the next PCI domain with well-formed bus ids.
        let big = Topology::build(load("a100-sxm4-40gb").unwrap(), 32).unwrap();
        let buses: HashSet<_> = big.gpus.iter().map(|g| g.pci_bus_id.clone()).collect();
        assert_eq!(buses.len(), 32);
        assert_eq!(big.gpus[9].pci_bus_id, "00000001:0F:00.0");
        assert!(big.gpus.iter().all(|g| g.pci_bus < 0x100));
        assert!(a.gpus[0].uuid.starts_with("GPU-") && a.gpus[0].uuid.len() == 40);
    }

    #[test]
    fn the_mixed_layout_puts_three_mig_devices_on_every_gpu() {
        let t = Topology::build(load("a100-sxm4-40gb-mig-mixed").unwrap(), 2).unwrap();
        for gpu in &t.gpus {
            let got: Vec<_> = gpu
                .migs
                .iter()
                .zip(&gpu.mig.gpu_instances)
                .map(|(m, gi)| (m.profile.name.as_str(), gi.start, m.gpu_instance_id))
                .collect();
            assert_eq!(
                got,
                vec![("3g.20gb", 0, 1), ("2g.10gb", 4, 5), ("1g.5gb", 6, 13)]
            );
        }
        assert_ne!(t.gpus[0].migs[0].uuid, t.gpus[1].migs[0].uuid);
    }

    #[test]
    fn mig_off_means_no_mig_devices_and_too_many_gpus_is_refused() {
        let t = Topology::build(load("a100-sxm4-40gb").unwrap(), 1).unwrap();
        assert!(t.gpus[0].migs.is_empty() && !t.gpus[0].mig.current);
        assert!(Topology::build(load("l4").unwrap(), MAX_GPUS + 1).is_err());
    }
}
