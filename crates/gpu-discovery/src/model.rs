//! The plain device model: what a node's GPUs are, with no NVML types in it.

use std::fmt;

/// Everything NVML reports about a node's GPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inventory {
    /// Driver version (`580.95.05`).
    pub driver_version: String,
    /// CUDA driver version.
    pub cuda_driver_version: CudaVersion,
    /// GPUs in NVML index order.
    pub gpus: Vec<Gpu>,
    /// GPUs NVML counts but could not read (lost, or a query failed), in index order. One bad GPU
    /// never hides the others: they are in `gpus`.
    pub unreadable: Vec<UnreadableGpu>,
}

/// A GPU NVML counts but could not read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnreadableGpu {
    /// NVML index.
    pub index: u32,
    /// Why, as NVML said it (names the call and the library).
    pub error: String,
    /// Whether NVML reported the GPU lost (`NVML_ERROR_GPU_IS_LOST`, e.g. fallen off the bus).
    pub lost: bool,
}

impl Inventory {
    /// The GPU or MIG device with this UUID, as `(gpu, Some(mig))` or `(gpu, None)`.
    pub fn find_uuid(&self, uuid: &str) -> Option<(&Gpu, Option<&MigDevice>)> {
        self.gpus.iter().find_map(|g| {
            if g.uuid == uuid {
                return Some((g, None));
            }
            g.mig_devices
                .iter()
                .find(|m| m.uuid == uuid)
                .map(|m| (g, Some(m)))
        })
    }
}

/// A `major.minor` version (CUDA driver, compute capability).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct CudaVersion {
    /// Major part.
    pub major: u32,
    /// Minor part.
    pub minor: u32,
}

impl CudaVersion {
    /// Decodes NVML's CUDA driver version integer (`major * 1000 + minor * 10`).
    pub fn from_nvml(value: i32) -> Self {
        let value = value.max(0) as u32;
        Self {
            major: value / 1000,
            minor: (value % 1000) / 10,
        }
    }
}

impl fmt::Display for CudaVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// MIG state of a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MigMode {
    /// The GPU cannot do MIG.
    NotSupported,
    /// MIG capable, MIG off.
    Disabled,
    /// MIG on.
    Enabled,
}

/// One physical GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpu {
    /// NVML index.
    pub index: u32,
    /// Minor number (`/dev/nvidia<minor>`); device names use it.
    pub minor: u32,
    /// `GPU-...` UUID.
    pub uuid: String,
    /// Product name (`NVIDIA A100-SXM4-40GB`).
    pub product_name: String,
    /// Brand (`Nvidia`, `Tesla`, ...).
    pub brand: String,
    /// Architecture (`Ampere`, `Hopper`, `Ada Lovelace`, ...).
    pub architecture: String,
    /// CUDA compute capability.
    pub cuda_compute_capability: CudaVersion,
    /// Framebuffer bytes; `None` where NVML does not report memory.
    pub memory_bytes: Option<u64>,
    /// PCI bus id, lower case with a 4-digit domain (`0000:07:00.0`).
    pub pci_bus_id: String,
    /// The PCIe root complex the GPU hangs from (`pci0000:40`), from sysfs
    /// ([`crate::pcie::fill_roots`]); `None` until read, or where sysfs does not say.
    pub pcie_root: Option<String>,
    /// How the GPU addresses system memory (`None`, `HMM`, `ATS`); `None` where NVML does not say.
    pub addressing_mode: Option<String>,
    /// MIG state.
    pub mig_mode: MigMode,
    /// MIG devices present (empty unless MIG is on).
    pub mig_devices: Vec<MigDevice>,
    /// The GPU-instance profiles the GPU offers, with their placements (empty for a GPU without
    /// MIG, or a driver that lists none while MIG is off).
    pub mig_profiles: Vec<MigProfile>,
}

/// A GPU-instance profile a GPU offers, and where its instances may sit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigProfile {
    /// The `NVML_GPU_INSTANCE_PROFILE_*` value it is read by.
    pub index: u32,
    /// The profile id NVML reports and creates instances by (`nvidia-smi mig -lgip` ID).
    pub id: u32,
    /// Profile name (`1g.10gb`, `1g.10gb+me`).
    pub name: String,
    /// Compute slices.
    pub slices: u32,
    /// How many instances of it fit on the GPU.
    pub instances: u32,
    /// Memory bytes of one instance.
    pub memory_bytes: u64,
    /// Streaming multiprocessors.
    pub multiprocessors: u32,
    /// Copy engines.
    pub copy_engines: u32,
    /// Video decoders.
    pub decoders: u32,
    /// Video encoders.
    pub encoders: u32,
    /// JPEG engines.
    pub jpeg_engines: u32,
    /// Optical-flow accelerators.
    pub ofa_engines: u32,
    /// Where its instances may sit, in NVML's order.
    pub placements: Vec<MigPlacement>,
}

/// Where a GPU instance sits: its first memory slice and how many it spans.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MigPlacement {
    /// First memory slice.
    pub start: u32,
    /// Memory slices spanned.
    pub size: u32,
}

impl MigPlacement {
    /// The memory slices it covers.
    pub fn slices(self) -> std::ops::Range<u32> {
        self.start..self.start + self.size
    }

    /// Whether it shares a memory slice with `other`.
    pub fn overlaps(self, other: MigPlacement) -> bool {
        self.start < other.start + other.size && other.start < self.start + self.size
    }
}

/// One MIG device present on a GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigDevice {
    /// UUID of the parent GPU.
    pub parent_uuid: String,
    /// Minor number of the parent GPU.
    pub parent_minor: u32,
    /// Position among the parent's MIG devices.
    pub index: u32,
    /// `MIG-...` UUID.
    pub uuid: String,
    /// Profile name (`1g.5gb`, `1g.5gb+me`, ...).
    pub profile: String,
    /// The GPU-instance profile id NVML reports for that profile (`nvidia-smi mig -lgip` ID).
    pub gpu_instance_profile_id: u32,
    /// GPU-instance id (`nvidia-smi mig -lgi` ID); names the `nvidia-caps` node `gi<id>`.
    pub gpu_instance_id: u32,
    /// Compute-instance id within the GPU instance; names the `nvidia-caps` node `ci<id>`.
    pub compute_instance_id: u32,
    /// First memory slice of the GPU instance; device names carry it.
    pub placement_start: u32,
    /// Memory slices the GPU instance spans.
    pub placement_size: u32,
    /// Compute slices.
    pub slices: u32,
    /// Memory bytes.
    pub memory_bytes: u64,
    /// Streaming multiprocessors.
    pub multiprocessors: u32,
    /// Copy engines.
    pub copy_engines: u32,
    /// Video decoders.
    pub decoders: u32,
    /// Video encoders.
    pub encoders: u32,
    /// JPEG engines.
    pub jpeg_engines: u32,
    /// Optical-flow accelerators.
    pub ofa_engines: u32,
}

/// Normalises an NVML bus id (`00000000:07:00.0`) to the form Kubernetes attributes use
/// (`0000:07:00.0`).
pub fn normalise_pci_bus_id(bus_id: &str) -> String {
    let lower = bus_id.trim().to_ascii_lowercase();
    match lower.split_once(':') {
        Some((domain, rest)) if domain.len() == 8 && domain.starts_with("0000") => {
            format!("{}:{rest}", &domain[4..])
        }
        _ => lower,
    }
}

/// The profile name in a MIG device's NVML name (`NVIDIA A100-SXM4-40GB MIG 1g.5gb` → `1g.5gb`).
pub fn mig_profile_from_name(name: &str) -> Option<&str> {
    name.rsplit_once("MIG ")
        .map(|(_, p)| p.trim())
        .filter(|p| !p.is_empty())
}

/// The name NVML tools give a GPU-instance profile, from its size: `<slices>g.<GB>gb`, where GB is
/// the instance's memory in eighths of the GPU (rounded up) times the GPU's GiB (rounded up),
/// rounded half up; `+me` marks the media-extension variants. Used when a MIG device's NVML name
/// does not carry the profile.
pub fn mig_profile_name(
    slices: u32,
    memory_mib: u64,
    gpu_memory_mib: u64,
    media_extensions: bool,
) -> String {
    let eighths = (memory_mib * 8).div_ceil(gpu_memory_mib.max(1));
    let gpu_gib = gpu_memory_mib.div_ceil(1024);
    let gb = (eighths * gpu_gib + 4) / 8;
    let suffix = if media_extensions { "+me" } else { "" };
    format!("{slices}g.{gb}gb{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_versions_decode() {
        assert_eq!(CudaVersion::from_nvml(13000).to_string(), "13.0");
        assert_eq!(CudaVersion::from_nvml(12040).to_string(), "12.4");
    }

    #[test]
    fn bus_ids_normalise() {
        assert_eq!(normalise_pci_bus_id("00000000:0F:00.0"), "0000:0f:00.0");
        assert_eq!(normalise_pci_bus_id("0001:0f:00.0"), "0001:0f:00.0");
    }

    #[test]
    fn profile_names_follow_the_memory_fraction() {
        assert_eq!(mig_profile_name(1, 4864, 40960, false), "1g.5gb");
        assert_eq!(mig_profile_name(1, 4864, 40960, true), "1g.5gb+me");
        assert_eq!(mig_profile_name(3, 71424, 143771, false), "3g.71gb");
        assert_eq!(mig_profile_name(1, 35584, 143771, false), "1g.35gb");
    }

    #[test]
    fn mig_profiles_come_from_names() {
        assert_eq!(
            mig_profile_from_name("NVIDIA H100 80GB HBM3 MIG 1g.10gb+me"),
            Some("1g.10gb+me")
        );
        assert_eq!(mig_profile_from_name("NVIDIA L4"), None);
    }
}
