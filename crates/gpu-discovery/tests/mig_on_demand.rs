//! Dynamic MIG through the real dlopen path: the mock NVML in a fake driver root partitioned and
//! cleared one NVML step at a time, the result read back by a later session as discovery reads
//! it.

use gpu_discovery::partitioning::MigModeChange;
use gpu_discovery::testing::{FakeNode, configure, mock_config};
use gpu_discovery::{InitMode, Inventory, MigMode, MigPlacement, NvmlSession, root};
use serde_json::json;

/// H100 profile ids: 3g.40gb, 1g.10gb (`nvidia-smi mig -lgip`).
const P_3G40: u32 = 9;
const P_1G10: u32 = 19;

fn session(node: &FakeNode) -> NvmlSession {
    let found = root::probe(&node.settings()).unwrap();
    NvmlSession::open(&found.nvml_library, InitMode::Full).unwrap_or_else(|e| panic!("{e}"))
}

fn inventory(node: &FakeNode) -> Inventory {
    session(node).inventory().unwrap()
}

/// Creates a GPU instance and the compute instance spanning it; answers both ids.
fn create(
    s: &NvmlSession,
    gpu: &str,
    profile: u32,
    start: u32,
    size: u32,
    slices: u32,
) -> (u32, u32) {
    let gi = s
        .create_gpu_instance(gpu, profile, MigPlacement { start, size })
        .unwrap_or_else(|e| panic!("{e}"));
    let ci = s
        .create_compute_instance(gpu, gi, slices)
        .unwrap_or_else(|e| panic!("{e}"));
    (gi, ci)
}

#[test]
fn partitions_made_by_one_session_are_what_the_next_one_discovers_until_destroyed() {
    let node = FakeNode::new();
    node.install_host_driver(&mock_config("h100-sxm5-80gb", 2));
    let before = inventory(&node);
    let gpu = before.gpus[0].uuid.clone();
    assert_eq!(before.gpus[0].mig_mode, MigMode::Disabled);
    assert_eq!(
        before.gpus[0].mig_profiles.len(),
        7,
        "offered while MIG is off"
    );

    let made = {
        let s = session(&node);
        assert_eq!(s.set_mig(&gpu, true).unwrap(), MigModeChange::Changed);
        assert_eq!(s.set_mig(&gpu, true).unwrap(), MigModeChange::Unchanged);
        let three = create(&s, &gpu, P_3G40, 4, 4, 3);
        let one = create(&s, &gpu, P_1G10, 0, 1, 1);
        let err = s
            .create_gpu_instance(&gpu, P_1G10, MigPlacement { start: 5, size: 1 })
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("create_gpu_instance") && err.contains(&gpu) && err.contains("no room"),
            "an occupied placement names the call, the GPU and why: {err}"
        );
        let uuids = [
            s.mig_device_uuid(&gpu, three.0, three.1).unwrap(),
            s.mig_device_uuid(&gpu, one.0, one.1).unwrap(),
        ];
        (three, one, uuids)
    };

    let after = inventory(&node);
    let found: Vec<_> = after.gpus[0]
        .mig_devices
        .iter()
        .map(|m| {
            (
                m.profile.as_str(),
                m.placement_start,
                m.placement_size,
                m.uuid.clone(),
            )
        })
        .collect();
    let (three, one, uuids) = made;
    assert_eq!(
        found,
        vec![
            ("3g.40gb", 4, 4, uuids[0].clone()),
            ("1g.10gb", 0, 1, uuids[1].clone())
        ]
    );
    assert_eq!(
        after.gpus[1].mig_mode,
        MigMode::Disabled,
        "the other GPU is untouched"
    );

    let s = session(&node);
    let listed = s.gpu_instances(&gpu, &[P_3G40, P_1G10]).unwrap();
    let ids: Vec<_> = listed
        .iter()
        .map(|gi| (gi.id, gi.compute_instances.clone()))
        .collect();
    assert_eq!(ids, vec![(three.0, vec![three.1]), (one.0, vec![one.1])]);
    for (gi, ci) in [three, one] {
        s.destroy_compute_instance(&gpu, gi, ci).unwrap();
        s.destroy_gpu_instance(&gpu, gi).unwrap();
        s.destroy_gpu_instance(&gpu, gi)
            .expect("destroying what is gone is no error");
    }
    assert_eq!(s.set_mig(&gpu, false).unwrap(), MigModeChange::Changed);
    drop(s);
    let cleared = inventory(&node);
    assert!(cleared.gpus[0].mig_devices.is_empty());
    assert_eq!(cleared.gpus[0].mig_mode, MigMode::Disabled);
}

#[test]
fn an_ampere_gpu_says_its_mode_waits_for_a_reset() {
    let node = FakeNode::new();
    node.install_host_driver(&mock_config("a100-sxm4-40gb", 1));
    let s = session(&node);
    let gpu = s.inventory().unwrap().gpus[0].uuid.clone();
    assert_eq!(s.set_mig(&gpu, true).unwrap(), MigModeChange::NeedsReset);
    assert_eq!(s.inventory().unwrap().gpus[0].mig_mode, MigMode::Disabled);
}

#[test]
fn an_injected_failure_names_its_step_and_leaves_what_was_made_listed() {
    let node = FakeNode::new();
    node.install_host_driver(&json!({"profile": "h100-sxm5-80gb", "gpu_count": 1,
        "faults": {"mig_failures": ["create-compute-instance"]}}));
    let s = session(&node);
    let gpu = s.inventory().unwrap().gpus[0].uuid.clone();
    s.set_mig(&gpu, true).unwrap();
    let gi = s
        .create_gpu_instance(&gpu, P_3G40, MigPlacement { start: 0, size: 4 })
        .unwrap();
    let err = s
        .create_compute_instance(&gpu, gi, 3)
        .unwrap_err()
        .to_string();
    assert!(err.contains("create_compute_instance"), "{err}");
    let listed = s.gpu_instances(&gpu, &[P_3G40]).unwrap();
    assert_eq!(listed.len(), 1);
    assert!(
        listed[0].compute_instances.is_empty(),
        "a GPU instance without compute instance"
    );

    configure(
        &node.host_root(),
        &json!({"profile": "h100-sxm5-80gb", "gpu_count": 1,
            "faults": {"mig_failures": ["destroy-gpu-instance"]}}),
    );
    let err = s.destroy_gpu_instance(&gpu, gi).unwrap_err().to_string();
    assert!(err.contains("destroy_gpu_instance"), "{err}");
    configure(&node.host_root(), &mock_config("h100-sxm5-80gb", 1));
    s.destroy_gpu_instance(&gpu, gi).unwrap();
    assert!(s.gpu_instances(&gpu, &[P_3G40]).unwrap().is_empty());
}

#[test]
fn a_stalled_step_hangs_until_the_control_file_lets_it_go() {
    let node = FakeNode::new();
    node.install_host_driver(&json!({"profile": "h100-sxm5-80gb", "gpu_count": 1,
        "faults": {"mig_stall": "create-compute-instance"}}));
    let s = std::sync::Arc::new(session(&node));
    let gpu = s.inventory().unwrap().gpus[0].uuid.clone();
    s.set_mig(&gpu, true).unwrap();
    let gi = s
        .create_gpu_instance(&gpu, P_1G10, MigPlacement { start: 0, size: 1 })
        .unwrap();
    let call = {
        let (s, gpu) = (std::sync::Arc::clone(&s), gpu.clone());
        std::thread::spawn(move || s.create_compute_instance(&gpu, gi, 1))
    };
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(!call.is_finished(), "the compute instance waits");
    assert!(
        s.gpu_instances(&gpu, &[P_1G10]).unwrap()[0]
            .compute_instances
            .is_empty(),
        "other calls go on meanwhile"
    );
    configure(&node.host_root(), &mock_config("h100-sxm5-80gb", 1));
    assert!(call.join().unwrap().is_ok());
}
