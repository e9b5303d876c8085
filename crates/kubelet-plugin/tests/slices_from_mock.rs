//! ResourceSlices built from inventories read through the real dlopen path, with the mock NVML
//! serving shipped GPU profiles; snapshotted.

use gpu_discovery::testing::{FakeNode, mock_config};
use gpu_discovery::{InitMode, NvmlSession, root};
use kubelet_plugin::devices::DeviceTable;
use kubelet_plugin::slices::{NodeRef, Taints, desired_slices};

fn table(profile: &str, gpus: u32) -> DeviceTable {
    let node = FakeNode::new();
    node.install_host_driver(&mock_config(profile, gpus));
    let found = root::probe(&node.settings()).expect("mock driver found");
    let session = NvmlSession::open(&found.nvml_library, InitMode::Full).expect("mock NVML opens");
    DeviceTable::from_inventory(&session.inventory().expect("inventory"))
}

/// The resource.k8s.io/v1 limits a device must meet: at most 32 attributes and capacities,
/// string and version values at most 64 characters, names DNS labels.
fn assert_within_api_limits(table: &DeviceTable) {
    for slice in desired_slices(&node(), "gpu.nvidia.com", table, &[], &Taints::new(), 1) {
        for device in slice.spec.devices.unwrap_or_default() {
            let attributes = device.attributes.unwrap_or_default();
            let capacities = device.capacity.unwrap_or_default();
            assert!(attributes.len() + capacities.len() <= 32, "{}", device.name);
            assert!(device.name.len() <= 63, "{}", device.name);
            assert!(
                device
                    .name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
                "{}",
                device.name
            );
            for (name, value) in attributes {
                let text = value.string.or(value.version).unwrap_or_default();
                assert!(text.len() <= 64, "{}: {name} = {text:?}", device.name);
            }
        }
    }
}

#[test]
fn every_shipped_profile_fits_the_api_limits() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../mock-nvml/profiles");
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let profile = path.file_stem().unwrap().to_string_lossy().into_owned();
        assert_within_api_limits(&table(&profile, 8));
    }
}

fn node() -> NodeRef {
    NodeRef {
        name: "gpu-node-0".into(),
        uid: "0b5e6a7c-node-uid".into(),
    }
}

#[test]
fn eight_a100s() {
    let table = table("a100-sxm4-40gb", 8);
    let names: Vec<_> = table.devices.keys().cloned().collect();
    assert_eq!(
        names,
        (0..8).map(|m| format!("gpu-{m}")).collect::<Vec<_>>()
    );
    insta::assert_yaml_snapshot!(desired_slices(
        &node(),
        "gpu.nvidia.com",
        &table,
        &[],
        &Taints::new(),
        1
    ));
}

#[test]
fn a100_mig_mixed_layout() {
    let table = table("a100-sxm4-40gb-mig-mixed", 2);
    let names: Vec<_> = table.devices.keys().cloned().collect();
    assert_eq!(
        names,
        [
            "gpu-0-mig-1g5gb-19-6",
            "gpu-0-mig-2g10gb-14-4",
            "gpu-0-mig-3g20gb-9-0",
            "gpu-1-mig-1g5gb-19-6",
            "gpu-1-mig-2g10gb-14-4",
            "gpu-1-mig-3g20gb-9-0",
        ]
    );
    insta::assert_yaml_snapshot!(desired_slices(
        &node(),
        "gpu.nvidia.com",
        &table,
        &[],
        &Taints::new(),
        1
    ));
}

#[test]
fn one_l4() {
    insta::assert_yaml_snapshot!(desired_slices(
        &node(),
        "gpu.nvidia.com",
        &table("l4", 1),
        &[],
        &Taints::new(),
        1
    ));
}

/// A GPU NVML reports lost at start is left out and reported; the node's other GPUs are
/// published (before, the plugin exited and the node served none).
#[test]
fn a_lost_gpu_is_left_out_and_the_others_are_published() {
    let fake = FakeNode::new();
    fake.install_host_driver(&serde_json::json!({
        "profile": "a100-sxm4-80gb", "gpu_count": 8, "faults": {"lost_gpus": [3]}}));
    let roots = gpu_discovery::DriverPaths {
        driver_root: fake.host_root(),
        driver_root_ctr: fake.host_root(),
        dev_root: fake.host_root(),
        dev_root_ctr: fake.host_root(),
    };
    let no_sysfs = tempfile::tempdir().unwrap();
    let (table, unreadable) =
        kubelet_plugin::app::read_devices(&roots, no_sysfs.path()).expect("devices read");
    let names: Vec<&str> = table.devices.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            "gpu-0", "gpu-1", "gpu-2", "gpu-4", "gpu-5", "gpu-6", "gpu-7"
        ]
    );
    assert_eq!(unreadable.len(), 1);
    assert!(unreadable[0].lost);
    let note = kubelet_plugin::app::unreadable_note(&unreadable[0]);
    assert!(
        note.starts_with("GPU 3 is lost and is not published")
            && note.contains("GPU 3 is lost (NVML_ERROR_GPU_IS_LOST)")
            && note.contains("restart this node's gpu-kubelet-plugin pod"),
        "{note}"
    );
    let devices: usize = desired_slices(&node(), "gpu.nvidia.com", &table, &[], &Taints::new(), 1)
        .iter()
        .map(|s| s.spec.devices.as_ref().map_or(0, Vec::len))
        .sum();
    assert_eq!(devices, 7);
}

fn host_roots(fake: &FakeNode) -> gpu_discovery::DriverPaths {
    gpu_discovery::DriverPaths {
        driver_root: fake.host_root(),
        driver_root_ctr: fake.host_root(),
        dev_root: fake.host_root(),
        dev_root_ctr: fake.host_root(),
    }
}

/// The attributes of `name` in the slices of `table`, as strings.
fn attributes(table: &DeviceTable, name: &str) -> std::collections::BTreeMap<String, String> {
    desired_slices(&node(), "gpu.nvidia.com", table, &[], &Taints::new(), 1)
        .into_iter()
        .flat_map(|s| s.spec.devices.unwrap_or_default())
        .find(|d| d.name == name)
        .unwrap_or_else(|| panic!("{name} published"))
        .attributes
        .unwrap_or_default()
        .into_iter()
        .filter_map(|(k, v)| v.string.map(|s| (k, s)))
        .collect()
}

/// `resource.kubernetes.io/pcieRoot` as upstream publishes it: a string naming the root complex
/// (`pci0000:40`), read from the link sysfs keeps for the GPU's PCI function; left out where
/// sysfs has no link for it.
#[test]
fn each_gpu_carries_the_pcie_root_its_sysfs_link_names() {
    let fake = FakeNode::new();
    fake.install_host_driver(&mock_config("h100-sxm5-80gb", 4));
    let sysfs = tempfile::tempdir().unwrap();
    let bus = sysfs.path().join("bus/pci/devices");
    std::fs::create_dir_all(&bus).unwrap();
    for (address, root) in [
        ("0000:07:00.0", "pci0000:00"),
        ("0000:0f:00.0", "pci0000:00"),
        ("0000:47:00.0", "pci0000:40"),
    ] {
        let target = format!("../../../devices/{root}/{}:01.0/{address}", &root[3..]);
        std::os::unix::fs::symlink(target, bus.join(address)).unwrap();
    }
    let (table, _) =
        kubelet_plugin::app::read_devices(&host_roots(&fake), sysfs.path()).expect("devices read");
    let root_of = |gpu: &str| {
        attributes(&table, gpu)
            .get("resource.kubernetes.io/pcieRoot")
            .cloned()
    };
    assert_eq!(root_of("gpu-0").as_deref(), Some("pci0000:00"));
    assert_eq!(root_of("gpu-1").as_deref(), Some("pci0000:00"));
    assert_eq!(root_of("gpu-2").as_deref(), Some("pci0000:40"));
    assert_eq!(root_of("gpu-3"), None, "no sysfs link, no attribute");
}

/// `addressingMode` as upstream publishes it: a string (`HMM`, `ATS` or `None`) from
/// `nvmlDeviceGetAddressingMode`, on GPUs and MIG devices; left out where NVML answers "not
/// supported".
#[test]
fn addressing_modes_come_from_nvml_where_it_reports_one() {
    for (profile, device, want) in [
        ("h100-sxm5-80gb", "gpu-0", Some("HMM")),
        ("gb200", "gpu-0", Some("ATS")),
        ("a100-sxm4-40gb", "gpu-0", None),
        ("a100-sxm4-40gb-mig-mixed", "gpu-0-mig-1g5gb-19-6", None),
    ] {
        let table = table(profile, 1);
        let got = attributes(&table, device).get("addressingMode").cloned();
        assert_eq!(got.as_deref(), want, "{profile}");
    }
    // A MIG device carries its GPU's mode, `None` included.
    let dir = tempfile::tempdir().unwrap();
    let shipped = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../mock-nvml/profiles/a100-sxm4-40gb-mig-mixed.json");
    let mut profile: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(shipped).unwrap()).unwrap();
    profile["addressing_mode"] = "None".into();
    let path = dir.path().join("a100-none.json");
    std::fs::write(&path, profile.to_string()).unwrap();
    let table = table(path.to_str().unwrap(), 1);
    let mig = attributes(&table, "gpu-0-mig-1g5gb-19-6");
    assert_eq!(mig.get("addressingMode").map(String::as_str), Some("None"));
}
