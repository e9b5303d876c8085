//! The profile file format: what one kind of GPU looks like, and the profiles shipped in the crate.

use serde::Deserialize;

/// One GPU model as the mock serves it; every GPU of a topology is an instance of it.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// Product name, as `nvmlDeviceGetName` returns it.
    pub name: String,
    /// NVML brand value (`NVML_BRAND_*`).
    pub brand: u32,
    /// NVML architecture value (`NVML_DEVICE_ARCH_*`).
    pub architecture: u32,
    /// CUDA compute capability, major then minor.
    pub compute_capability: [i32; 2],
    /// Framebuffer size in MiB.
    pub memory_mib: u64,
    /// Streaming multiprocessors of the whole GPU.
    pub multiprocessors: u32,
    /// PCI device id (the upper 16 bits of NVML's `pciDeviceId`).
    pub pci_device_id: u32,
    /// Driver version string.
    pub driver_version: String,
    /// CUDA driver version as NVML encodes it (`major * 1000 + minor * 10`).
    pub cuda_driver_version: i32,
    /// GPUs served when the configuration does not say.
    pub default_gpu_count: u32,
    /// MIG support; absent for GPUs that cannot do MIG.
    #[serde(default)]
    pub mig: Option<MigSupport>,
    /// What `nvmlDeviceGetAddressingMode` reports; absent where NVML answers "not supported" (a
    /// platform without coherent system memory access).
    #[serde(default)]
    pub addressing_mode: Option<AddressingMode>,
    /// Where the numbers come from.
    #[serde(default)]
    pub source: String,
}

/// How a GPU may address system memory (`nvmlDeviceAddressingModeType_t`).
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
pub enum AddressingMode {
    /// Neither: `NVML_DEVICE_ADDRESSING_MODE_NONE`.
    None,
    /// Heterogeneous memory management: `NVML_DEVICE_ADDRESSING_MODE_HMM`.
    #[serde(rename = "HMM")]
    Hmm,
    /// Address translation services (Grace-based systems): `NVML_DEVICE_ADDRESSING_MODE_ATS`.
    #[serde(rename = "ATS")]
    Ats,
}

/// MIG capability of a GPU model and the layout the mock creates when MIG is on.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MigSupport {
    /// Whether MIG mode is on (current and pending) until a process changes it.
    pub enabled: bool,
    /// Whether a change of MIG mode waits for a GPU reset (Ampere): it stays pending and the
    /// current mode is unchanged.
    #[serde(default)]
    pub mode_change_needs_reset: bool,
    /// What `nvmlDeviceGetMaxMigDeviceCount` reports.
    pub max_devices: u32,
    /// The GPU-instance profiles the GPU offers.
    pub profiles: Vec<GiProfile>,
    /// MIG devices present on every GPU while MIG is on, until a process creates or destroys
    /// instances.
    #[serde(default)]
    pub layout: Vec<LayoutEntry>,
}

/// One GPU-instance profile (`nvmlGpuInstanceProfileInfo_t` plus its placements).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct GiProfile {
    /// The `NVML_GPU_INSTANCE_PROFILE_*` index callers pass to NVML.
    pub index: u32,
    /// The profile id NVML reports (`nvidia-smi mig -lgip` ID column).
    pub id: u32,
    /// Profile name, e.g. `1g.5gb`.
    pub name: String,
    /// Compute slices.
    pub slices: u32,
    /// Memory slices one placement covers.
    pub placement_size: u32,
    /// How many instances of this profile fit on one GPU.
    pub instances: u32,
    /// Memory of one instance in MiB.
    pub memory_mib: u64,
    /// Streaming multiprocessors of one instance.
    pub multiprocessors: u32,
    /// Copy engines.
    pub copy_engines: u32,
    /// Video decoders.
    pub decoders: u32,
    /// Video encoders.
    pub encoders: u32,
    /// JPEG engines.
    pub jpeg: u32,
    /// Optical-flow accelerators.
    pub ofa: u32,
    /// First memory slice of each possible placement.
    pub placements: Vec<u32>,
}

/// One MIG device of a layout.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LayoutEntry {
    /// Name of the GPU-instance profile.
    pub profile: String,
    /// First memory slice of its placement.
    pub start: u32,
    /// The GPU-instance id NVML reports for it.
    pub gpu_instance_id: u32,
    /// The compute-instance id inside that GPU instance.
    #[serde(default)]
    pub compute_instance_id: u32,
}

/// The profiles compiled into the library, by the name a configuration uses.
const SHIPPED: &[(&str, &str)] = &[
    (
        "a100-sxm4-40gb",
        include_str!("../profiles/a100-sxm4-40gb.json"),
    ),
    (
        "a100-sxm4-40gb-mig-mixed",
        include_str!("../profiles/a100-sxm4-40gb-mig-mixed.json"),
    ),
    (
        "a100-sxm4-80gb",
        include_str!("../profiles/a100-sxm4-80gb.json"),
    ),
    (
        "h100-sxm5-80gb",
        include_str!("../profiles/h100-sxm5-80gb.json"),
    ),
    ("h200", include_str!("../profiles/h200.json")),
    ("b200", include_str!("../profiles/b200.json")),
    ("l4", include_str!("../profiles/l4.json")),
    ("t4", include_str!("../profiles/t4.json")),
    ("gb200", include_str!("../profiles/gb200.json")),
];

/// Profile used when nothing is configured.
pub const DEFAULT_PROFILE: &str = "a100-sxm4-40gb";

/// Names of the shipped profiles.
pub fn shipped_names() -> impl Iterator<Item = &'static str> {
    SHIPPED.iter().map(|(name, _)| *name)
}

/// Parses a profile and checks that its MIG layout refers to profiles and placements it offers.
pub fn parse(text: &str) -> Result<Profile, String> {
    let profile: Profile = serde_json::from_str(text).map_err(|e| e.to_string())?;
    if let Some(mig) = &profile.mig {
        for entry in &mig.layout {
            let gi = mig
                .profiles
                .iter()
                .find(|p| p.name == entry.profile)
                .ok_or_else(|| format!("layout names unknown MIG profile {}", entry.profile))?;
            if !gi.placements.contains(&entry.start) {
                return Err(format!(
                    "{} cannot start at memory slice {}",
                    gi.name, entry.start
                ));
            }
        }
    }
    Ok(profile)
}

/// Resolves a profile reference: a shipped name, or else a path to a profile file.
pub fn load(reference: &str) -> Result<Profile, String> {
    match SHIPPED.iter().find(|(name, _)| *name == reference) {
        Some((_, text)) => parse(text),
        None => {
            let text = std::fs::read_to_string(reference).map_err(|e| {
                let names: Vec<_> = shipped_names().collect();
                format!(
                    "profile {reference:?} is neither shipped ({}) nor a readable file: {e}",
                    names.join(", ")
                )
            })?;
            parse(&text).map_err(|e| format!("profile file {reference}: {e}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shipped_profile_parses_and_its_layout_fits() {
        for name in shipped_names() {
            let profile = load(name).unwrap_or_else(|e| panic!("{name}: {e}"));
            if let Some(mig) = &profile.mig {
                let used: u32 = mig
                    .layout
                    .iter()
                    .map(|e| {
                        mig.profiles
                            .iter()
                            .find(|p| p.name == e.profile)
                            .unwrap()
                            .placement_size
                    })
                    .sum();
                assert!(used <= 8, "{name}: layout uses {used} memory slices");
            }
        }
    }

    #[test]
    fn a_layout_entry_on_an_impossible_placement_is_rejected() {
        let text = include_str!("../profiles/a100-sxm4-40gb-mig-mixed.json")
            .replace("\"start\": 6", "\"start\": 7");
        assert!(
            parse(&text)
                .unwrap_err()
                .contains("cannot start at memory slice 7")
        );
    }

    #[test]
    fn an_unknown_reference_lists_the_shipped_names() {
        let err = load("/nonexistent/profile.json").unwrap_err();
        assert!(
            err.contains("a100-sxm4-40gb") && err.contains("gb200"),
            "{err}"
        );
    }
}
