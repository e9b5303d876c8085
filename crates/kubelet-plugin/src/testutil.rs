//! Test fixtures shared by the unit tests.

use crate::devices::{DeviceKind, DeviceTable, GpuCommon, NodeDevice};
use gpu_discovery::DriverPaths;
use gpu_discovery::MigDevice;
use std::path::Path;

/// Lays out a fake driver in `dir/driver` (a stand-in `libnvidia-ml`, then
/// [`gpu_discovery::testing::install_driver_files`] with `/dev/nvidia0..gpus`) and returns roots
/// that see it at the same path from the host and from this container.
pub fn driver_roots(dir: &Path, gpus: u32) -> DriverPaths {
    use gpu_discovery::testing::{self, LIBRARY_DIR, VERSIONED_NAME};
    let root = dir.join("driver");
    let lib = root.join(LIBRARY_DIR);
    std::fs::create_dir_all(&lib).unwrap();
    std::fs::write(lib.join(VERSIONED_NAME), b"stand-in for libnvidia-ml\n").unwrap();
    let link = lib.join(gpu_discovery::root::LIBRARY_NAME);
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(VERSIONED_NAME, link).unwrap();
    testing::install_driver_files(&root, 0..gpus);
    DriverPaths {
        driver_root: root.clone(),
        driver_root_ctr: root.clone(),
        dev_root: root.clone(),
        dev_root_ctr: root,
    }
}

/// One MiB.
pub const MIB: u64 = 1 << 20;

/// A full A100 with minor `minor`.
pub fn gpu(minor: u32) -> NodeDevice {
    NodeDevice {
        name: format!("gpu-{minor}"),
        uuid: format!("GPU-{minor}"),
        gpu: GpuCommon {
            product_name: "NVIDIA A100-SXM4-40GB".into(),
            brand: "Nvidia".into(),
            architecture: "Ampere".into(),
            cuda_compute_capability: (8, 0),
            pci_bus_id: format!("0000:{:02x}:00.0", minor + 7),
            pcie_root: Some("pci0000:00".into()),
            addressing_mode: Some("HMM".into()),
            minor,
            gpu_uuid: format!("GPU-{minor}"),
        },
        kind: DeviceKind::Gpu {
            memory_bytes: Some(40 << 30),
        },
    }
}

/// A table of `n` full GPUs.
pub fn table(n: u32) -> DeviceTable {
    DeviceTable {
        driver_version: "580.95.05".into(),
        cuda_driver_version: (13, 0),
        devices: (0..n).map(|m| (format!("gpu-{m}"), gpu(m))).collect(),
        consumable_shares: Default::default(),
    }
}

/// A MIG device of `profile` with `mib` of memory on GPU 0.
pub fn mig(profile: &str, mib: u64) -> MigDevice {
    MigDevice {
        parent_uuid: "GPU-0".into(),
        parent_minor: 0,
        index: 0,
        uuid: format!("MIG-{profile}"),
        profile: profile.into(),
        gpu_instance_profile_id: 19,
        gpu_instance_id: 13,
        compute_instance_id: 0,
        placement_start: 6,
        placement_size: 1,
        slices: 1,
        memory_bytes: mib * MIB,
        multiprocessors: 14,
        copy_engines: 1,
        decoders: 0,
        encoders: 0,
        jpeg_engines: 0,
        ofa_engines: 0,
    }
}
