use std::collections::BTreeMap;

use gpu_discovery::{CudaVersion, Gpu, MigMode};
use jiff::{SignedDuration, Timestamp};

use super::{Observed, Plane, desired};

fn gpu(index: u32, product: &str, memory_gib: u64) -> Gpu {
    Gpu {
        index,
        minor: index,
        uuid: format!("GPU-0000000{index}"),
        product_name: product.into(),
        brand: "Nvidia".into(),
        architecture: "Ampere".into(),
        cuda_compute_capability: CudaVersion { major: 8, minor: 0 },
        memory_bytes: Some(memory_gib << 30),
        pci_bus_id: format!("0000:0{index}:00.0"),
        pcie_root: None,
        addressing_mode: None,
        mig_mode: MigMode::Disabled,
        mig_devices: Vec::new(),
        mig_profiles: Vec::new(),
    }
}

fn observed() -> Observed {
    Observed {
        node: "gpu-node-0".into(),
        node_uid: "node-uid".into(),
        plane: Plane::Dra,
        driver_version: "580.95.05".into(),
        cuda_driver_version: "13.0".into(),
        gpus: vec![
            gpu(0, "NVIDIA A100-SXM4-40GB", 40),
            gpu(1, "NVIDIA A100-SXM4-40GB", 40),
        ],
        faults: BTreeMap::new(),
        health_unknown: false,
        offered: true,
        consumers: BTreeMap::from([("GPU-00000001".into(), vec!["team-a/train-gpu".into()])]),
        stopped: false,
    }
}

fn phases(observed: &Observed) -> Vec<(String, String)> {
    desired(observed, &BTreeMap::new(), Timestamp::UNIX_EPOCH)
        .into_iter()
        .map(|(name, o)| (name, o.status.unwrap().phase))
        .collect()
}

#[test]
fn one_object_per_gpu_named_by_node_and_pci_address() {
    let objects = desired(&observed(), &BTreeMap::new(), Timestamp::UNIX_EPOCH);
    let names: Vec<&String> = objects.keys().collect();
    assert_eq!(
        names,
        ["gpu-node-0-0000-00-00-0", "gpu-node-0-0000-01-00-0"]
    );
    insta::assert_yaml_snapshot!(objects["gpu-node-0-0000-01-00-0"]);
}

#[test]
fn a_fault_a_silent_nvml_and_a_missing_registration_each_say_why() {
    let mut sick = observed();
    sick.faults.insert("GPU-00000000".into(), "XID 79".into());
    assert_eq!(
        phases(&sick),
        [
            ("gpu-node-0-0000-00-00-0".into(), "NotReady".into()),
            ("gpu-node-0-0000-01-00-0".into(), "Ready".into())
        ]
    );
    let object =
        &desired(&sick, &BTreeMap::new(), Timestamp::UNIX_EPOCH)["gpu-node-0-0000-00-00-0"];
    let healthy = &object.status.as_ref().unwrap().conditions[1];
    assert_eq!(
        (healthy.status.as_str(), healthy.message.as_str()),
        ("False", "XID 79")
    );

    let mut silent = observed();
    silent.health_unknown = true;
    assert!(phases(&silent).iter().all(|(_, p)| p == "Unknown"));

    let mut unregistered = observed();
    unregistered.offered = false;
    let object =
        &desired(&unregistered, &BTreeMap::new(), Timestamp::UNIX_EPOCH)["gpu-node-0-0000-00-00-0"];
    let ready = &object.status.as_ref().unwrap().conditions[2];
    assert_eq!(ready.reason, "NotRegistered");
    assert_eq!(object.status.as_ref().unwrap().phase, "NotReady");

    // The plugin stopping (a hand-over, the operands switched off): nothing serves the GPUs, even
    // a healthy, registered one.
    let mut stopped = observed();
    stopped.stopped = true;
    let object =
        &desired(&stopped, &BTreeMap::new(), Timestamp::UNIX_EPOCH)["gpu-node-0-0000-01-00-0"];
    let ready = &object.status.as_ref().unwrap().conditions[2];
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "NotServed")
    );
    assert!(
        ready
            .message
            .starts_with("the dra plugin on this node stopped")
    );
    assert_eq!(object.status.as_ref().unwrap().phase, "NotReady");
}

#[test]
fn nothing_changed_renders_the_live_objects_so_nothing_is_written() {
    let first = desired(&observed(), &BTreeMap::new(), Timestamp::UNIX_EPOCH);
    let later = Timestamp::UNIX_EPOCH + SignedDuration::from_hours(5);
    let again = desired(&observed(), &first, later);
    assert!(
        first
            .iter()
            .all(|(name, o)| super::up_to_date(o, &again[name]))
    );

    let mut used = observed();
    used.consumers
        .insert("GPU-00000000".into(), vec!["team-b/infer-gpu".into()]);
    let changed = desired(&used, &first, later);
    let differ: Vec<&String> = changed
        .iter()
        .filter(|(name, o)| !super::up_to_date(&first[*name], o))
        .map(|(name, _)| name)
        .collect();
    assert_eq!(
        differ,
        ["gpu-node-0-0000-00-00-0"],
        "only the GPU whose users changed"
    );
    let ready = &changed["gpu-node-0-0000-00-00-0"]
        .status
        .as_ref()
        .unwrap()
        .conditions[2];
    assert_eq!(
        ready.last_transition_time.0,
        Timestamp::UNIX_EPOCH,
        "Ready did not transition"
    );
}
