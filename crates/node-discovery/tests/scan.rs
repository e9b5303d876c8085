//! A scan of a fake node: a PCI tree in a temp sysfs and the mock NVML loaded through the real
//! `dlopen` path from a fake driver root.

use std::fs;
use std::path::Path;

use api::contract::labels as l;
use gpu_discovery::testing::{FakeNode, configure, mock_config};
use node_discovery::scan::Scanner;

fn pci_function(sysfs: &Path, address: &str, vendor: &str, class: &str) {
    let dir = sysfs.join("bus/pci/devices").join(address);
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join("vendor"), vendor).unwrap();
    fs::write(dir.join("device"), "0x2330").unwrap();
    fs::write(dir.join("class"), class).unwrap();
}

#[test]
fn a_gpu_node_is_found_on_the_bus_then_described_once_its_driver_is_there() {
    let node = FakeNode::new();
    let sysfs = tempfile::tempdir().unwrap();
    pci_function(sysfs.path(), "0000:00:1f.6", "0x8086", "0x020000");
    let mut scanner = Scanner::new(sysfs.path().to_owned(), node.settings());

    // A CPU node: nothing.
    let found = scanner.scan();
    assert!(found.labels.is_empty(), "{:?}", found.labels);
    assert_eq!(found.gpus_on_bus, 0);

    // A GPU appears on the bus before its driver: NFD's label only.
    pci_function(sysfs.path(), "0000:01:00.0", "0x10de", "0x030200");
    pci_function(sysfs.path(), "0000:02:00.0", "0x10de", "0x030200");
    let found = scanner.scan();
    assert_eq!(found.labels.keys().collect::<Vec<_>>(), [l::NFD_PCI_NVIDIA]);
    assert!(found.problems.is_empty(), "{:?}", found.problems);

    // The driver is installed: GPU feature discovery's labels, from NVML.
    node.install_host_driver(&mock_config("h100-sxm5-80gb", 2));
    let found = scanner.scan();
    assert_eq!(found.labels[l::GPU_COUNT], "2");
    assert_eq!(found.labels[l::GPU_PRODUCT], "NVIDIA-H100-80GB-HBM3");
    assert_eq!(found.labels[l::GPU_FAMILY], "hopper");
    assert_eq!(found.labels[l::MIG_CAPABLE], "true");
    assert_eq!(found.labels[l::CUDA_DRIVER_VERSION_FULL], "580.95.05");
    assert_eq!(found.gpus_on_bus, 2);
}

#[test]
fn an_nvml_failure_keeps_the_last_description_and_says_why() {
    let node = FakeNode::new();
    let sysfs = tempfile::tempdir().unwrap();
    pci_function(sysfs.path(), "0000:01:00.0", "0x10de", "0x030000");
    node.install_host_driver(&mock_config("l4", 1));
    let mut scanner = Scanner::new(sysfs.path().to_owned(), node.settings());
    let before = scanner.scan();
    assert_eq!(before.labels[l::GPU_PRODUCT], "NVIDIA-L4");
    assert_eq!(before.labels[l::MIG_CAPABLE], "false");

    let mut failing = mock_config("l4", 1);
    failing["faults"] = serde_json::json!({"init_error": "driver-not-loaded"});
    configure(&node.host_root(), &failing);
    let after = scanner.scan();
    assert_eq!(after.labels, before.labels);
    assert!(
        after.problems.iter().any(|p| p.starts_with("NVML:")),
        "{:?}",
        after.problems
    );
}
