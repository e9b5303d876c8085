//! The labels a node should carry for what was found on it: NFD's PCI label from sysfs, and GPU
//! feature discovery's labels from NVML where the driver is loaded. Pure.

use std::collections::BTreeMap;

use api::contract::labels as l;
use gpu_discovery::{Inventory, MigMode};

use crate::pci::PciFunction;

/// The labels for a node with these PCI functions and, where the driver answered, this NVML
/// inventory. No NVIDIA GPU on the bus and no GPU in NVML: no label at all.
pub fn desired(functions: &[PciFunction], driver: Option<&Inventory>) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    if functions.iter().any(PciFunction::is_nvidia_gpu) {
        labels.insert(l::NFD_PCI_NVIDIA.to_owned(), "true".to_owned());
    }
    if let Some(inventory) = driver {
        driver_labels(inventory, &mut labels);
    }
    labels
}

fn driver_labels(inventory: &Inventory, labels: &mut BTreeMap<String, String>) {
    let count = inventory.gpus.len() + inventory.unreadable.len();
    if count == 0 {
        return;
    }
    let mut set = |key: &str, value: String| {
        if let Some(value) = label_value(&value) {
            labels.insert(key.to_owned(), value);
        }
    };
    set(l::GPU_COUNT, count.to_string());
    // Like GPU feature discovery, the node is described by its first GPU NVML could read.
    if let Some(gpu) = inventory.gpus.first() {
        set(l::GPU_PRODUCT, gpu.product_name.clone());
        if let Some(bytes) = gpu.memory_bytes {
            set(l::GPU_MEMORY, (bytes >> 20).to_string());
        }
        set(l::GPU_FAMILY, gpu.architecture.to_lowercase());
        set(
            l::GPU_COMPUTE_MAJOR,
            gpu.cuda_compute_capability.major.to_string(),
        );
        set(
            l::GPU_COMPUTE_MINOR,
            gpu.cuda_compute_capability.minor.to_string(),
        );
        let mig = inventory
            .gpus
            .iter()
            .any(|g| g.mig_mode != MigMode::NotSupported);
        set(l::MIG_CAPABLE, mig.to_string());
    }
    let version = inventory.driver_version.trim();
    let mut parts = version.split('.');
    let (major, minor, rev) = (parts.next(), parts.next(), parts.next());
    for (old, new, part) in [
        (l::CUDA_DRIVER_MAJOR, l::CUDA_DRIVER_VERSION_MAJOR, major),
        (l::CUDA_DRIVER_MINOR, l::CUDA_DRIVER_VERSION_MINOR, minor),
        (l::CUDA_DRIVER_REV, l::CUDA_DRIVER_VERSION_REVISION, rev),
    ] {
        if let Some(part) = part {
            set(old, part.to_owned());
            set(new, part.to_owned());
        }
    }
    set(l::CUDA_DRIVER_VERSION_FULL, version.to_owned());
    let cuda = inventory.cuda_driver_version;
    if cuda.major > 0 {
        set(l::CUDA_RUNTIME_MAJOR, cuda.major.to_string());
        set(l::CUDA_RUNTIME_VERSION_MAJOR, cuda.major.to_string());
        set(l::CUDA_RUNTIME_MINOR, cuda.minor.to_string());
        set(l::CUDA_RUNTIME_VERSION_MINOR, cuda.minor.to_string());
        set(l::CUDA_RUNTIME_VERSION_FULL, cuda.to_string());
    }
}

/// `text` as a label value the way GPU feature discovery writes product names: spaces and other
/// characters a label value may not hold become `-`, at most 63 characters, starting and ending
/// with a letter or digit. `None` when nothing is left.
pub fn label_value(text: &str) -> Option<String> {
    let mapped: String = text
        .trim()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '-'
            }
        })
        .take(63)
        .collect();
    let value = mapped.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    (!value.is_empty()).then(|| value.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpu_discovery::testing::inventory;
    use gpu_discovery::{CudaVersion, Gpu, UnreadableGpu};

    fn gpu(product: &str, architecture: &str, mig: MigMode) -> Gpu {
        Gpu {
            index: 0,
            minor: 0,
            uuid: "GPU-0".into(),
            product_name: product.into(),
            brand: "Nvidia".into(),
            architecture: architecture.into(),
            cuda_compute_capability: CudaVersion { major: 9, minor: 0 },
            memory_bytes: Some(81_559 << 20),
            pci_bus_id: "0000:01:00.0".into(),
            pcie_root: None,
            addressing_mode: None,
            mig_mode: mig,
            mig_devices: Vec::new(),
            mig_profiles: Vec::new(),
        }
    }

    fn nvidia(address: &str) -> PciFunction {
        PciFunction {
            address: address.into(),
            vendor: 0x10de,
            device: 0x2330,
            class: 0x030200,
        }
    }

    fn pairs(labels: &BTreeMap<String, String>) -> Vec<String> {
        labels.iter().map(|(k, v)| format!("{k}={v}")).collect()
    }

    #[test]
    fn a_gpu_node_with_its_driver_gets_nfd_and_gfd_labels_by_their_names() {
        let h100 = gpu("NVIDIA H100 80GB HBM3", "Hopper", MigMode::Disabled);
        let labels = desired(
            &[nvidia("0000:01:00.0")],
            Some(&inventory(vec![h100.clone(), h100])),
        );
        assert_eq!(
            pairs(&labels),
            [
                "feature.node.kubernetes.io/pci-10de.present=true",
                "nvidia.com/cuda.driver-version.full=580.95.05",
                "nvidia.com/cuda.driver-version.major=580",
                "nvidia.com/cuda.driver-version.minor=95",
                "nvidia.com/cuda.driver-version.revision=05",
                "nvidia.com/cuda.driver.major=580",
                "nvidia.com/cuda.driver.minor=95",
                "nvidia.com/cuda.driver.rev=05",
                "nvidia.com/cuda.runtime-version.full=13.0",
                "nvidia.com/cuda.runtime-version.major=13",
                "nvidia.com/cuda.runtime-version.minor=0",
                "nvidia.com/cuda.runtime.major=13",
                "nvidia.com/cuda.runtime.minor=0",
                "nvidia.com/gpu.compute.major=9",
                "nvidia.com/gpu.compute.minor=0",
                "nvidia.com/gpu.count=2",
                "nvidia.com/gpu.family=hopper",
                "nvidia.com/gpu.memory=81559",
                "nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3",
                "nvidia.com/mig.capable=true",
            ]
        );
        assert!(
            labels
                .keys()
                .all(|k| l::DISCOVERY_KEYS.contains(&k.as_str()))
        );
    }

    #[test]
    fn without_a_driver_only_the_pci_label_and_without_a_gpu_nothing() {
        assert_eq!(
            pairs(&desired(&[nvidia("0000:01:00.0")], None)),
            ["feature.node.kubernetes.io/pci-10de.present=true"]
        );
        let nic = PciFunction {
            address: "0000:04:00.0".into(),
            vendor: 0x8086,
            device: 1,
            class: 0x020000,
        };
        assert!(desired(&[nic], None).is_empty());
        // A driver that sees no GPU adds nothing either.
        assert!(desired(&[], Some(&inventory(Vec::new()))).is_empty());
    }

    #[test]
    fn mig_capability_comes_from_nvml_and_family_names_have_no_spaces() {
        let l4 = gpu("NVIDIA L4", "Ada Lovelace", MigMode::NotSupported);
        let labels = desired(&[], Some(&inventory(vec![l4])));
        assert_eq!(labels[l::MIG_CAPABLE], "false");
        assert_eq!(labels[l::GPU_FAMILY], "ada-lovelace");
        assert_eq!(labels[l::GPU_PRODUCT], "NVIDIA-L4");
    }

    #[test]
    fn unreadable_gpus_count_and_an_all_unreadable_node_keeps_its_count() {
        let mut inv = inventory(Vec::new());
        inv.unreadable.push(UnreadableGpu {
            index: 0,
            error: "lost".into(),
            lost: true,
        });
        let labels = desired(&[nvidia("0000:01:00.0")], Some(&inv));
        assert_eq!(labels[l::GPU_COUNT], "1");
        assert!(!labels.contains_key(l::GPU_PRODUCT));
    }

    #[test]
    fn label_values_are_always_valid() {
        assert_eq!(
            label_value("NVIDIA A100-SXM4-40GB").as_deref(),
            Some("NVIDIA-A100-SXM4-40GB")
        );
        assert_eq!(label_value(" (Tesla) T4 ").as_deref(), Some("Tesla--T4"));
        assert_eq!(label_value("---").as_deref(), None);
        assert_eq!(label_value(&"x".repeat(80)).map(|v| v.len()), Some(63));
    }
}
