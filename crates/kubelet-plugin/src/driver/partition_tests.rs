//! Dynamic MIG through prepare and unprepare, on the mock NVML loaded from a fake driver root
//! (the real dlopen path): partitions made and destroyed, injected NVML failures, and what a
//! crash between two steps leaves, found and destroyed at the next start.

use super::tests::{Claims, DRIVER, NODE, cref, exclusive, setup};
use super::*;
use crate::checkpoint::{ClaimEntry, MadePartition};
use crate::partitioner::Nvml;
use gpu_discovery::testing::{FakeNode, configure, install_mig_caps, mig_cap_minors};
use gpu_discovery::{DriverPaths, InitMode, Inventory, MigPlacement, NvmlSession, root};
use serde_json::json;
use std::path::Path;

/// H100 partitions of GPU 0: a 3g at slice 4, a 1g at slice 0; H100 profile ids 9 and 19.
const THREE: &str = "gpu-0-mig-3g40gb-9-4";
const ONE: &str = "gpu-0-mig-1g10gb-19-0";

/// A node with one H100 (the mock, with `faults`), every MIG capability file its driver shows,
/// and an NVML session on it.
struct Node {
    fake: FakeNode,
    session: Arc<NvmlSession>,
}

impl Node {
    fn new(faults: serde_json::Value) -> Self {
        let fake = FakeNode::new();
        fake.install_host_driver(
            &json!({"profile": "h100-sxm5-80gb", "gpu_count": 1, "faults": faults}),
        );
        for gi in 0..15 {
            install_mig_caps(&fake.host_root(), 0, gi, 0, mig_cap_minors(0, gi, 0));
        }
        let found = root::probe(&fake.settings()).unwrap();
        let session = Arc::new(NvmlSession::open(&found.nvml_library, InitMode::Full).unwrap());
        Self { fake, session }
    }

    fn inventory(&self) -> Inventory {
        self.session.inventory().unwrap()
    }

    /// GPU instances on GPU 0, by profile id and start.
    fn instances(&self) -> Vec<(u32, u32)> {
        let gpu = self.inventory().gpus[0].uuid.clone();
        let mut found: Vec<_> = self
            .session
            .gpu_instances(&gpu, &[0, 5, 9, 14, 15, 19, 20])
            .unwrap()
            .into_iter()
            .map(|gi| (gi.profile_id, gi.placement.start))
            .collect();
        found.sort();
        found
    }

    fn fail(&self, steps: &[&str]) {
        configure(
            &self.fake.host_root(),
            &json!({"profile": "h100-sxm5-80gb", "gpu_count": 1,
                "faults": {"mig_failures": steps}}),
        );
    }

    fn driver(&self, dir: &Path, claims: &Arc<Claims>) -> (Driver<Arc<Claims>>, StartReport) {
        let root = self.fake.host_root();
        let roots = DriverPaths {
            driver_root: root.clone(),
            driver_root_ctr: root.clone(),
            dev_root: root.clone(),
            dev_root_ctr: root.clone(),
        };
        let (driver, report) = Driver::start(
            DRIVER,
            NODE,
            Arc::clone(claims),
            DeviceTable::default(),
            CdiWriter::new(&dir.join("cdi"), &roots).with_procfs_root(&root),
            CheckpointStore::new(&dir.join("plugin"), "boot-1"),
        )
        .unwrap();
        let (table, _) = crate::partitions::table(&self.inventory(), &driver.made_gpu_instances());
        let partitioner: Arc<dyn Partitioner> = Arc::new(Nvml(Arc::clone(&self.session)));
        (
            driver.with_table(table).with_partitioner(partitioner),
            report,
        )
    }
}

fn spec(dir: &Path, uid: &str) -> String {
    std::fs::read_to_string(dir.join(format!("cdi/k8s.gpu.nvidia.com-claim_{uid}.yaml")))
        .unwrap_or_default()
}

#[tokio::test]
async fn partitions_are_made_at_prepare_side_by_side_and_destroyed_at_unprepare() {
    let node = Node::new(json!({}));
    let (dir, claims) = setup();
    claims.put(exclusive("three", "u3", &[THREE]));
    claims.put(exclusive("one", "u1", &[ONE]));
    let (d, _) = node.driver(dir.path(), &claims);
    assert!(d.devices().devices.contains_key(THREE) && d.devices().devices.contains_key("gpu-0"));

    let answers = d
        .prepare(vec![cref("three", "u3"), cref("one", "u1")])
        .await;
    assert!(answers.values().all(Result::is_ok), "{answers:?}");
    assert_eq!(node.instances(), vec![(9, 4), (19, 0)]);
    let migs = node.inventory().gpus[0].mig_devices.clone();
    let three = migs.iter().find(|m| m.placement_start == 4).unwrap();
    let one = migs.iter().find(|m| m.placement_start == 0).unwrap();
    assert_eq!(
        answers["u3"].as_ref().unwrap()[0].made_uuid.as_deref(),
        Some(three.uuid.as_str()),
        "the answer names the MIG device made"
    );
    let spec_three = spec(dir.path(), "u3");
    assert!(
        spec_three.contains(&three.uuid) && !spec_three.contains(&one.uuid),
        "the 3g claim's container gets its MIG device and no other:\n{spec_three}"
    );
    assert!(spec_three.contains(&format!(
        "nvidia-cap{}",
        mig_cap_minors(0, three.gpu_instance_id, 0).1
    )));

    // A restart keeps them: what the checkpoint says the plugin made stays partitions.
    drop(d);
    let (d, report) = node.driver(dir.path(), &claims);
    assert_eq!(report.restored, 2);
    let again = d.prepare(vec![cref("three", "u3")]).await;
    assert_eq!(
        again["u3"].as_ref().unwrap()[0].made_uuid.as_deref(),
        Some(three.uuid.as_str()),
        "the checkpoint keeps it"
    );
    assert!(matches!(
        d.devices().devices[THREE].kind,
        crate::devices::DeviceKind::Partition(_)
    ));

    let answers = d
        .unprepare(vec![cref("three", "u3"), cref("one", "u1")])
        .await;
    assert!(answers.values().all(Result::is_ok), "{answers:?}");
    assert!(node.instances().is_empty(), "no partition left");
}

#[tokio::test]
async fn a_whole_card_claim_turns_mig_off_where_it_was_left_on() {
    let node = Node::new(json!({}));
    let gpu = node.inventory().gpus[0].uuid.clone();
    // MIG left on with no instance (by an admin, or a plugin killed before it turned it off).
    node.session.set_mig(&gpu, true).unwrap();
    let (dir, claims) = setup();
    claims.put(exclusive("card", "u2", &["gpu-0"]));
    let (d, _) = node.driver(dir.path(), &claims);
    d.prepare(vec![cref("card", "u2")]).await["u2"]
        .as_ref()
        .unwrap();
    assert_eq!(
        node.inventory().gpus[0].mig_mode,
        gpu_discovery::MigMode::Disabled
    );
}

#[tokio::test]
async fn each_failed_nvml_step_fails_its_claim_alone_and_leaves_the_gpu_clean() {
    let node = Node::new(json!({}));
    let (dir, claims) = setup();
    claims.put(exclusive("one", "u1", &[ONE]));
    let (d, _) = node.driver(dir.path(), &claims);
    for (step, call) in [
        ("create-gpu-instance", "create_gpu_instance"),
        ("create-compute-instance", "create_compute_instance"),
    ] {
        node.fail(&[step]);
        let answer = d
            .prepare(vec![cref("one", "u1")])
            .await
            .remove("u1")
            .unwrap();
        let err = answer.unwrap_err();
        assert!(
            err.contains("claim ns/one") && err.contains(ONE) && err.contains(call),
            "{err}"
        );
        assert!(node.instances().is_empty(), "{step}: nothing left");
        assert!(spec(dir.path(), "u1").is_empty());
    }
    // Destroying fails: the claim stays for the kubelet's retry, which then succeeds.
    node.fail(&[]);
    d.prepare(vec![cref("one", "u1")]).await["u1"]
        .as_ref()
        .unwrap();
    node.fail(&["destroy-gpu-instance"]);
    let err = d.unprepare(vec![cref("one", "u1")]).await["u1"]
        .clone()
        .unwrap_err();
    assert!(err.contains("destroy_gpu_instance"), "{err}");
    node.fail(&[]);
    d.unprepare(vec![cref("one", "u1")]).await["u1"]
        .as_ref()
        .unwrap();
    assert!(node.instances().is_empty());
}

/// A checkpoint with claim `u1` in `PrepareStarted`, making `partition`.
fn crashed_checkpoint(dir: &Path, partition: MadePartition) {
    let mut checkpoint = crate::checkpoint::Checkpoint::empty("boot-1");
    checkpoint.claims.insert(
        "u1".into(),
        ClaimEntry {
            state: crate::checkpoint::ClaimState::PrepareStarted,
            namespace: "ns".into(),
            name: "one".into(),
            devices: Vec::new(),
            time_slices: Default::default(),
            mps: None,
            partitions: vec![partition],
        },
    );
    CheckpointStore::new(&dir.join("plugin"), "boot-1")
        .save(&checkpoint)
        .unwrap();
}

#[tokio::test]
async fn what_a_crash_between_two_steps_left_is_destroyed_at_start_and_the_retry_succeeds() {
    let node = Node::new(json!({}));
    let gpu = node.inventory().gpus[0].uuid.clone();
    // The crash came after the GPU instance was made: once before its id was recorded, once
    // after.
    for recorded in [false, true] {
        node.session.set_mig(&gpu, true).unwrap();
        let placement = MigPlacement { start: 0, size: 1 };
        let gi = node
            .session
            .create_gpu_instance(&gpu, 19, placement)
            .unwrap();
        let (dir, claims) = setup();
        claims.put(exclusive("one", "u1", &[ONE]));
        crashed_checkpoint(
            dir.path(),
            MadePartition {
                device: ONE.into(),
                gpu: gpu.clone(),
                profile_id: 19,
                start: 0,
                size: 1,
                slices: 1,
                gpu_instance: recorded.then_some(gi),
                compute_instance: None,
                uuid: None,
            },
        );
        let (d, report) = node.driver(dir.path(), &claims);
        assert_eq!(report.unmade_partitions.len(), 1);
        assert!(
            d.clear_partitions(&report.unmade_partitions)
                .await
                .is_empty()
        );
        assert!(node.instances().is_empty(), "recorded: {recorded}");
        d.prepare(vec![cref("one", "u1")]).await["u1"]
            .as_ref()
            .unwrap();
        assert_eq!(node.instances(), vec![(19, 0)]);
        d.unprepare(vec![cref("one", "u1")]).await["u1"]
            .as_ref()
            .unwrap();
    }
}

#[tokio::test]
async fn mps_on_a_partition_is_refused_naming_why() {
    let node = Node::new(json!({}));
    let (dir, claims) = setup();
    let config = json!([{"requests": ["gpu"], "opaque": {"driver": DRIVER, "parameters": {
        "apiVersion": "resource.nvidia.com/v1beta1", "kind": "MigDeviceConfig",
        "sharing": {"strategy": "MPS"}}}}]);
    claims.put(crate::claim::fixtures::claim(
        "mps",
        "u1",
        &[("gpu", DRIVER, NODE, ONE, false)],
        config,
    ));
    let (d, _) = node.driver(dir.path(), &claims);
    let err = d.prepare(vec![cref("mps", "u1")]).await["u1"]
        .clone()
        .unwrap_err();
    assert!(
        err.contains("MPS is not supported on a MIG partition"),
        "{err}"
    );
    assert!(node.instances().is_empty());
}

#[tokio::test]
async fn a_claim_two_pods_share_is_prepared_for_both_at_once_and_made_once() {
    let node = Node::new(json!({}));
    let (dir, claims) = setup();
    claims.put(exclusive("shared", "u1", &[ONE]));
    let (d, _) = node.driver(dir.path(), &claims);
    // The kubelet prepares the claim for each pod, concurrently.
    let (a, b) = tokio::join!(
        d.prepare(vec![cref("shared", "u1")]),
        d.prepare(vec![cref("shared", "u1")])
    );
    assert!(a["u1"].is_ok() && b["u1"].is_ok(), "{a:?} {b:?}");
    assert_eq!(a, b);
    assert_eq!(node.instances(), vec![(19, 0)], "one partition made");
    d.unprepare(vec![cref("shared", "u1")]).await["u1"]
        .as_ref()
        .unwrap();
    assert!(node.instances().is_empty());
}
