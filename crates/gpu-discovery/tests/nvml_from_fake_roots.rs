//! The real dlopen path: the mock NVML installed in fake driver roots, read through nvml-wrapper.

use gpu_discovery::testing::{FakeNode, configure, mock_config};
use gpu_discovery::{
    DriverLocation, EventKind, InitMode, Inventory, MigMode, NvmlError, NvmlSession, model, root,
};
use serde_json::{Value, json};
use std::path::Path;
use std::time::Duration;

const MIB: u64 = 1 << 20;

fn shipped_profile(name: &str) -> Value {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../mock-nvml/profiles/{name}.json"));
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

fn shipped_names() -> Vec<String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../mock-nvml/profiles");
    let mut names: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            e.unwrap()
                .path()
                .file_stem()
                .unwrap()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    names.sort();
    names
}

fn open(path: &Path) -> NvmlSession {
    NvmlSession::open(path, InitMode::Full).unwrap_or_else(|e| panic!("{e}"))
}

fn inventory_of(node: &FakeNode) -> Inventory {
    let found = root::probe(&node.settings()).unwrap();
    open(&found.nvml_library).inventory().unwrap()
}

/// A GPU-instance profile as compared: id, name, placements (start, size).
type ProfileRow = (u64, String, Vec<(u32, u32)>);

/// Checks an inventory against the profile file it was served from, field by field.
fn assert_matches_profile(inv: &Inventory, p: &Value, gpus: usize) {
    assert_eq!(inv.gpus.len(), gpus);
    assert_eq!(inv.driver_version, p["driver_version"].as_str().unwrap());
    let cuda = p["cuda_driver_version"].as_u64().unwrap();
    assert_eq!(
        u64::from(inv.cuda_driver_version.major * 1000 + inv.cuda_driver_version.minor * 10),
        cuda
    );
    let arch = match p["architecture"].as_u64().unwrap() {
        6 => "Turing",
        7 => "Ampere",
        8 => "Ada Lovelace",
        9 => "Hopper",
        10 => "Blackwell",
        other => panic!("architecture {other} not expected in a shipped profile"),
    };
    let brand = match p["brand"].as_u64().unwrap() {
        2 => "Tesla",
        14 => "Nvidia",
        other => panic!("brand {other} not expected in a shipped profile"),
    };
    let mig = &p["mig"];
    for (i, gpu) in inv.gpus.iter().enumerate() {
        assert_eq!((gpu.index, gpu.minor), (i as u32, i as u32));
        assert_eq!(gpu.product_name, p["name"].as_str().unwrap());
        assert_eq!(
            gpu.memory_bytes,
            Some(p["memory_mib"].as_u64().unwrap() * MIB)
        );
        let cc = &p["compute_capability"];
        assert_eq!(
            (
                gpu.cuda_compute_capability.major,
                gpu.cuda_compute_capability.minor
            ),
            (
                cc[0].as_u64().unwrap() as u32,
                cc[1].as_u64().unwrap() as u32
            )
        );
        assert_eq!(
            (gpu.architecture.as_str(), gpu.brand.as_str()),
            (arch, brand)
        );
        assert!(gpu.uuid.starts_with("GPU-"));
        assert!(
            gpu.pci_bus_id.starts_with("0000:") && gpu.pci_bus_id == gpu.pci_bus_id.to_lowercase()
        );
        let expected_mode = match mig["enabled"].as_bool() {
            None => MigMode::NotSupported,
            Some(false) => MigMode::Disabled,
            Some(true) => MigMode::Enabled,
        };
        assert_eq!(gpu.mig_mode, expected_mode);
        let table: Vec<ProfileRow> = mig["profiles"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|gi| {
                let size = gi["placement_size"].as_u64().unwrap() as u32;
                let starts = gi["placements"].as_array().unwrap().iter();
                (
                    gi["id"].as_u64().unwrap(),
                    gi["name"].as_str().unwrap().to_owned(),
                    starts.map(|s| (s.as_u64().unwrap() as u32, size)).collect(),
                )
            })
            .collect();
        let read: Vec<ProfileRow> = gpu
            .mig_profiles
            .iter()
            .map(|p| {
                let places = p.placements.iter().map(|p| (p.start, p.size)).collect();
                (u64::from(p.id), p.name.clone(), places)
            })
            .collect();
        let sorted = |mut v: Vec<ProfileRow>| {
            v.sort();
            v
        };
        assert_eq!(sorted(read), sorted(table), "MIG profile table of GPU {i}");
        let layout = if expected_mode == MigMode::Enabled {
            mig["layout"].as_array().unwrap().clone()
        } else {
            vec![]
        };
        assert_eq!(
            gpu.mig_devices.len(),
            layout.len(),
            "MIG devices of GPU {i}"
        );
        for (entry, dev) in layout.iter().zip(&gpu.mig_devices) {
            let gi = mig["profiles"]
                .as_array()
                .unwrap()
                .iter()
                .find(|g| g["name"] == entry["profile"])
                .unwrap();
            assert_eq!(dev.profile, gi["name"].as_str().unwrap());
            assert_eq!(
                u64::from(dev.gpu_instance_profile_id),
                gi["id"].as_u64().unwrap()
            );
            assert_eq!(dev.memory_bytes, gi["memory_mib"].as_u64().unwrap() * MIB);
            assert_eq!(
                u64::from(dev.multiprocessors),
                gi["multiprocessors"].as_u64().unwrap()
            );
            assert_eq!(u64::from(dev.slices), gi["slices"].as_u64().unwrap());
            assert_eq!(
                u64::from(dev.copy_engines),
                gi["copy_engines"].as_u64().unwrap()
            );
            assert_eq!(u64::from(dev.decoders), gi["decoders"].as_u64().unwrap());
            assert_eq!(u64::from(dev.jpeg_engines), gi["jpeg"].as_u64().unwrap());
            assert_eq!(u64::from(dev.ofa_engines), gi["ofa"].as_u64().unwrap());
            assert_eq!(
                (dev.parent_uuid.as_str(), dev.parent_minor),
                (gpu.uuid.as_str(), gpu.minor)
            );
            assert!(dev.uuid.starts_with("MIG-"));
            assert_eq!(
                (dev.gpu_instance_id, dev.placement_start, dev.placement_size),
                (
                    entry["gpu_instance_id"].as_u64().unwrap() as u32,
                    entry["start"].as_u64().unwrap() as u32,
                    gi["placement_size"].as_u64().unwrap() as u32
                ),
                "instance id and placement of {} on GPU {i}",
                dev.profile
            );
            assert_eq!(
                u64::from(dev.compute_instance_id),
                entry["compute_instance_id"].as_u64().unwrap_or(0)
            );
        }
    }
}

#[test]
fn shipped_mig_profile_names_agree_with_their_memory() {
    for name in shipped_names() {
        let p = shipped_profile(&name);
        let gpu_mib = p["memory_mib"].as_u64().unwrap();
        for gi in p["mig"]["profiles"].as_array().into_iter().flatten() {
            let computed = model::mig_profile_name(
                gi["slices"].as_u64().unwrap() as u32,
                gi["memory_mib"].as_u64().unwrap(),
                gpu_mib,
                [7, 8].contains(&gi["index"].as_u64().unwrap()),
            );
            assert_eq!(computed, gi["name"].as_str().unwrap(), "{name}");
        }
    }
}

#[test]
fn every_shipped_profile_is_served_as_written_from_a_host_root() {
    let names = shipped_names();
    assert_eq!(names.len(), 9, "{names:?}");
    for name in names {
        let node = FakeNode::new();
        node.install_host_driver(&mock_config(&name, 2));
        assert_matches_profile(&inventory_of(&node), &shipped_profile(&name), 2);
    }
}

#[test]
fn a_container_driver_root_serves_the_mixed_mig_layout() {
    let node = FakeNode::new();
    node.install_container_driver(&mock_config("a100-sxm4-40gb-mig-mixed", 3), true);
    let found = root::probe(&node.settings()).unwrap();
    assert_eq!(found.location, DriverLocation::Container);
    let inv = open(&found.nvml_library).inventory().unwrap();
    assert_matches_profile(&inv, &shipped_profile("a100-sxm4-40gb-mig-mixed"), 3);
    let mig = &inv.gpus[1].mig_devices[2];
    assert_eq!(
        inv.find_uuid(&mig.uuid)
            .map(|(g, m)| (g.index, m.map(|m| m.profile.as_str()))),
        Some((1, Some("1g.5gb")))
    );
}

#[test]
fn a_reader_of_driver_ready_opens_the_same_nvml() {
    let node = FakeNode::new();
    node.install_container_driver(&mock_config("t4", 1), false);
    let found = root::probe(&node.settings()).unwrap();
    let ready = gpu_discovery::DriverReady::from(&found);
    assert_eq!(ready.nvml_library().unwrap(), found.nvml_library);
    let inv = open(&ready.nvml_library().unwrap()).inventory().unwrap();
    assert_eq!(inv.gpus[0].product_name, "Tesla T4");
}

#[test]
fn the_host_driver_wins_over_the_container_driver() {
    let node = FakeNode::new();
    node.install_container_driver(&mock_config("h100-sxm5-80gb", 1), true);
    node.install_host_driver(&mock_config("l4", 1));
    let found = root::probe(&node.settings()).unwrap();
    assert_eq!(found.location, DriverLocation::Host);
    assert!(found.nvml_library.starts_with(node.host_root()));
    assert_eq!(
        open(&found.nvml_library).inventory().unwrap().gpus[0].product_name,
        "NVIDIA L4"
    );
}

#[test]
fn a_node_without_nvml_names_every_path_searched() {
    let node = FakeNode::new();
    let err = root::probe(&node.settings()).unwrap_err();
    let text = err.to_string();
    for dir in root::LIBRARY_DIRS {
        let rel = dir.trim_start_matches('/');
        for base in [node.host_root(), node.driver_root()] {
            let path = base.join(rel).join(root::LIBRARY_NAME);
            assert!(
                text.contains(&path.display().to_string()),
                "{} missing from: {text}",
                path.display()
            );
        }
    }
}

fn init_fault(fault: &str) -> NvmlError {
    let node = FakeNode::new();
    let lib = node.install_host_driver(&json!({"profile": "t4", "faults": {"init_error": fault}}));
    let err = NvmlSession::open(&lib, InitMode::Full).unwrap_err();
    assert!(
        err.to_string().contains(&lib.display().to_string()),
        "{err}"
    );
    err
}

#[test]
fn init_faults_surface_as_typed_errors() {
    assert!(matches!(
        init_fault("driver-not-loaded"),
        NvmlError::DriverNotLoaded { .. }
    ));
    assert!(matches!(
        init_fault("version-mismatch"),
        NvmlError::VersionMismatch { .. }
    ));
    assert!(matches!(
        init_fault("no-permission"),
        NvmlError::NoPermission { .. }
    ));
}

#[test]
fn a_file_that_is_not_a_library_is_a_load_error() {
    let dir = tempfile::tempdir().unwrap();
    let lib = dir.path().join("libnvidia-ml.so.1");
    std::fs::write(&lib, b"not an ELF file").unwrap();
    assert!(matches!(
        NvmlSession::open(&lib, InitMode::Full),
        Err(NvmlError::Load { .. })
    ));
}

/// (indexes read, indexes unreadable and lost) of an inventory.
fn split(inv: &Inventory) -> (Vec<u32>, Vec<(u32, bool)>) {
    (
        inv.gpus.iter().map(|g| g.index).collect(),
        inv.unreadable.iter().map(|u| (u.index, u.lost)).collect(),
    )
}

#[test]
fn a_lost_gpu_is_reported_and_the_others_still_read_even_when_lost_after_init() {
    let node = FakeNode::new();
    let lib = node.install_host_driver(
        &json!({"profile": "h200", "gpu_count": 3, "faults": {"lost_gpus": [1]}}),
    );
    let session = open(&lib);
    let inv = session.inventory().unwrap();
    assert_eq!(split(&inv), (vec![0, 2], vec![(1, true)]));
    assert!(
        inv.unreadable[0].error.contains("GPU 1 is lost"),
        "{}",
        inv.unreadable[0].error
    );
    configure(&node.host_root(), &mock_config("h200", 3));
    assert_eq!(
        split(&session.inventory().unwrap()),
        (vec![0, 1, 2], vec![])
    );
    configure(
        &node.host_root(),
        &json!({"profile": "h200", "gpu_count": 3, "faults": {"lost_gpus": [0, 2]}}),
    );
    assert_eq!(
        split(&session.inventory().unwrap()),
        (vec![1], vec![(0, true), (2, true)])
    );
}

fn gpu_uuids(session: &NvmlSession) -> Vec<String> {
    let inventory = session.inventory().unwrap();
    inventory.gpus.into_iter().map(|g| g.uuid).collect()
}

#[test]
fn queued_and_later_xid_and_ecc_events_reach_the_watcher() {
    let node = FakeNode::new();
    let lib = node.install_host_driver(&json!({"profile": "a100-sxm4-80gb", "gpu_count": 2,
        "faults": {"xid_events": [{"gpu": 1, "xid": 79}]}}));
    let session = open(&lib);
    let uuids = gpu_uuids(&session);
    let watch = session.watch_events().unwrap();
    let event = watch
        .next(Duration::from_secs(5))
        .unwrap()
        .expect("queued XID");
    assert_eq!(
        (event.uuid.as_str(), event.kind),
        (uuids[1].as_str(), EventKind::Xid(Some(79)))
    );
    assert_eq!(watch.next(Duration::from_millis(10)).unwrap(), None);
    configure(
        &node.host_root(),
        &json!({"profile": "a100-sxm4-80gb", "gpu_count": 2,
        "faults": {"xid_events": [{"gpu": 0, "xid": 48}],
                   "ecc_events": [{"gpu": 1, "kind": "double-bit"}, {"gpu": 0, "kind": "single-bit"}]}}),
    );
    let mut got = Vec::new();
    while let Some(event) = watch.next(Duration::from_secs(5)).unwrap() {
        got.push((event.uuid, event.kind));
        if got.len() == 3 {
            break;
        }
    }
    assert_eq!(
        got,
        vec![
            (uuids[0].clone(), EventKind::Xid(Some(48))),
            (uuids[1].clone(), EventKind::DoubleBitEcc),
            (uuids[0].clone(), EventKind::SingleBitEcc),
        ]
    );
}

/// After XID 79 the GPU has fallen off the bus and answers no query, its UUID included: the event
/// still names it, from what was read when the watch began.
#[test]
fn an_xid_79_names_its_gpu_though_the_gpu_is_lost_by_then() {
    let node = FakeNode::new();
    let lib = node.install_host_driver(&mock_config("a100-sxm4-80gb", 2));
    let session = open(&lib);
    let uuids = gpu_uuids(&session);
    let watch = session.watch_events().unwrap();
    configure(
        &node.host_root(),
        &json!({"profile": "a100-sxm4-80gb", "gpu_count": 2,
        "faults": {"xid_events": [{"gpu": 1, "xid": 79}], "lost_gpus": [1]}}),
    );
    let event = watch
        .next(Duration::from_secs(5))
        .unwrap()
        .expect("the XID");
    assert_eq!(
        (event.uuid.as_str(), event.kind),
        (uuids[1].as_str(), EventKind::Xid(Some(79)))
    );
}

#[test]
fn one_session_serves_many_threads() {
    let node = FakeNode::new();
    let lib = node.install_host_driver(&mock_config("a100-sxm4-40gb-mig-mixed", 8));
    let session = open(&lib);
    let first = session.inventory().unwrap();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|_| s.spawn(|| session.inventory().unwrap()))
            .collect();
        for h in handles {
            assert_eq!(h.join().unwrap(), first);
        }
    });
}

#[test]
fn no_gpu_mode_reads_the_driver_version() {
    let node = FakeNode::new();
    let lib = node.install_host_driver(&mock_config("gb200", 4));
    let session = NvmlSession::open(&lib, InitMode::NoGpus).unwrap();
    assert_eq!(session.driver_version().unwrap(), "580.95.05");
}
