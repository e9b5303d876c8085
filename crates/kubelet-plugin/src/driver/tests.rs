use super::*;
use crate::checkpoint::ClaimEntry;
use crate::claim::fixtures::claim;
use crate::opaque::Interval;
use crate::testutil::table;
use k8s_openapi::api::resource::v1::ResourceClaim;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

pub(super) const NODE: &str = "node-a";
pub(super) const DRIVER: &str = "gpu.nvidia.com";

#[derive(Default)]
pub(super) struct Claims {
    objects: std::sync::Mutex<HashMap<String, ResourceClaim>>,
    gets: AtomicUsize,
}

impl Claims {
    pub(super) fn put(&self, c: ResourceClaim) {
        let name = c.metadata.name.clone().unwrap();
        self.objects.lock().unwrap().insert(name, c);
    }
}

impl ClaimSource for Arc<Claims> {
    async fn get(&self, _ns: &str, name: &str) -> Result<ResourceClaim, ClaimFailure> {
        self.gets.fetch_add(1, Ordering::SeqCst);
        self.objects
            .lock()
            .unwrap()
            .get(name)
            .cloned()
            .ok_or(ClaimFailure::NotFound)
    }
}

pub(super) fn exclusive(name: &str, uid: &str, devices: &[&str]) -> ResourceClaim {
    let results: Vec<_> = devices
        .iter()
        .map(|d| ("gpu", DRIVER, NODE, *d, false))
        .collect();
    claim(name, uid, &results, serde_json::json!([]))
}

pub(super) fn cref(name: &str, uid: &str) -> ClaimRef {
    ClaimRef {
        namespace: "ns".into(),
        uid: uid.into(),
        name: name.into(),
    }
}

fn driver(dir: &Path, claims: &Arc<Claims>) -> (Driver<Arc<Claims>>, StartReport) {
    Driver::start(
        DRIVER,
        NODE,
        Arc::clone(claims),
        table(8),
        CdiWriter::new(&dir.join("cdi"), &crate::testutil::driver_roots(dir, 8)),
        CheckpointStore::new(&dir.join("plugin"), "boot-1"),
    )
    .unwrap()
}

pub(super) fn setup() -> (tempfile::TempDir, Arc<Claims>) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("plugin")).unwrap();
    (dir, Arc::default())
}

#[tokio::test]
async fn prepare_is_answered_from_the_checkpoint_the_second_time() {
    let (dir, claims) = setup();
    claims.put(exclusive("a", "u1", &["gpu-0", "gpu-3"]));
    let (d, report) = driver(dir.path(), &claims);
    assert_eq!(report.outcome, LoadOutcome::Missing);

    let first = d.prepare(vec![cref("a", "u1")]).await;
    let devices = first["u1"].as_ref().unwrap();
    assert_eq!(devices.len(), 2);
    assert_eq!(devices[1].device, "gpu-3");
    assert_eq!(devices[1].pool, NODE);
    assert_eq!(devices[1].request_names, ["gpu"]);
    assert_eq!(
        devices[1].cdi_device_ids,
        ["k8s.gpu.nvidia.com/claim=u1-gpu-3"]
    );
    let spec = dir.path().join("cdi/k8s.gpu.nvidia.com-claim_u1.yaml");
    let checkpoint = std::fs::read(dir.path().join("plugin/checkpoint.json")).unwrap();
    assert!(spec.exists());

    let second = d.prepare(vec![cref("a", "u1")]).await;
    assert_eq!(first, second);
    assert_eq!(claims.gets.load(Ordering::SeqCst), 1, "no second GET");
    assert_eq!(
        std::fs::read(dir.path().join("plugin/checkpoint.json")).unwrap(),
        checkpoint
    );

    // A restarted plugin answers from the checkpoint too.
    drop(d);
    let (d, report) = driver(dir.path(), &claims);
    assert_eq!(
        (report.outcome, report.restored),
        (LoadOutcome::Restored, 1)
    );
    assert_eq!(d.prepare(vec![cref("a", "u1")]).await, first);
    assert_eq!(claims.gets.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn refusals_are_per_claim_and_name_claim_and_cause() {
    let (dir, claims) = setup();
    claims.put(exclusive("ok", "u1", &["gpu-0"]));
    claims.put(claim("unallocated", "u2", &[], serde_json::json!([])));
    claims.put(claim(
        "elsewhere",
        "u3",
        &[("gpu", DRIVER, "node-b", "gpu-1", false)],
        serde_json::json!([]),
    ));
    claims.put(exclusive("replaced", "u4-new", &["gpu-2"]));
    claims.put(exclusive("second", "u5", &["gpu-0"]));
    claims.put(exclusive("ghost", "u6", &["gpu-99"]));
    let (d, _) = driver(dir.path(), &claims);
    let mut registry = prometheus_client::registry::Registry::default();
    let d = d.with_metrics(Metrics::register(&mut registry, DRIVER, "node-a"));
    assert!(d.prepare(vec![cref("ok", "u1")]).await["u1"].is_ok());
    let answers = d
        .prepare(vec![
            cref("unallocated", "u2"),
            cref("elsewhere", "u3"),
            cref("replaced", "u4"),
            cref("second", "u5"),
            cref("ghost", "u6"),
            cref("missing", "u7"),
        ])
        .await;
    let err = |uid: &str| answers[uid].clone().unwrap_err();
    assert_eq!(
        err("u2"),
        "claim ns/unallocated (uid u2): not allocated (status.allocation is empty)"
    );
    assert!(
        err("u3").contains("claim ns/elsewhere") && err("u3").contains("pool node-b"),
        "{}",
        err("u3")
    );
    assert!(err("u4").contains("UID mismatch"), "{}", err("u4"));
    assert_eq!(
        err("u5"),
        "claim ns/second (uid u5): device gpu-0 is already prepared for claim u1"
    );
    assert!(
        err("u6").contains("gpu-99 is not one of this node's devices"),
        "{}",
        err("u6")
    );
    assert!(err("u7").contains("not found in the API"), "{}", err("u7"));
    let cdi: Vec<_> = std::fs::read_dir(dir.path().join("cdi")).unwrap().collect();
    assert_eq!(cdi.len(), 1, "only the good claim has a spec");
    // Each refusal is counted under its kind.
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    for (reason, count) in [("invalid_claim", 4), ("device_in_use", 1), ("not_found", 1)] {
        let line = format!(
            "gpu_kubelet_plugin_claim_errors_total{{operation=\"Prepare\",reason=\"{reason}\"}} {count}"
        );
        assert!(text.contains(&line), "{line} missing from:\n{text}");
    }
}

#[tokio::test]
async fn a_missing_device_node_fails_only_its_claim() {
    let (dir, claims) = setup();
    claims.put(exclusive("a", "u1", &["gpu-0"]));
    claims.put(exclusive("b", "u2", &["gpu-5"]));
    claims.put(exclusive("c", "u3", &["gpu-1"]));
    let (d, _) = driver(dir.path(), &claims);
    let node = dir.path().join("driver/dev/nvidia5");
    std::fs::remove_file(&node).unwrap();
    let answers = d
        .prepare(vec![cref("a", "u1"), cref("b", "u2"), cref("c", "u3")])
        .await;
    assert!(
        answers["u1"].is_ok() && answers["u3"].is_ok(),
        "{answers:?}"
    );
    let err = answers["u2"].clone().unwrap_err();
    assert!(
        err.starts_with("claim ns/b (uid u2): writing the CDI spec failed: required driver files are missing: /dev/nvidia5 (looked at /dev/nvidia5); searched driver root "),
        "{err}"
    );
    assert!(
        !dir.path()
            .join("cdi/k8s.gpu.nvidia.com-claim_u2.yaml")
            .exists()
    );
    // Nothing of the failed claim is kept: once the node is there it prepares.
    std::fs::write(&node, b"").unwrap();
    assert!(d.prepare(vec![cref("b", "u2")]).await["u2"].is_ok());
}

#[tokio::test]
async fn admin_access_shares_a_prepared_device() {
    let (dir, claims) = setup();
    claims.put(exclusive("user", "u1", &["gpu-0"]));
    claims.put(claim(
        "monitor",
        "u2",
        &[("mon", DRIVER, NODE, "gpu-0", true)],
        serde_json::json!([]),
    ));
    let (d, _) = driver(dir.path(), &claims);
    let changes = d.claim_changes();
    let answers = d
        .prepare(vec![cref("user", "u1"), cref("monitor", "u2")])
        .await;
    assert!(answers.values().all(Result::is_ok), "{answers:?}");
    // The GPU's users (its PhysicalGPU's) are the exclusive claim, not the monitor.
    assert!(
        changes.has_changed().unwrap(),
        "a prepare is a change of users"
    );
    let users: Vec<Vec<String>> = d.consumers().into_values().collect();
    assert_eq!(users.len(), 1, "{users:?}");
    assert!(
        users[0].len() == 1 && users[0][0].ends_with("/user"),
        "{users:?}"
    );
}

/// A claim holding share `share-<uid>` of `device`, having consumed `consumed`, with `config`.
fn held_share(
    name: &str,
    uid: &str,
    device: &str,
    consumed: serde_json::Value,
    config: serde_json::Value,
) -> ResourceClaim {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"namespace": "ns", "name": name, "uid": uid},
        "spec": {"devices": {}},
        "status": {"allocation": {"devices": {
            "results": [{"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device,
                         "shareID": format!("share-{uid}"), "consumedCapacity": consumed}],
            "config": config,
        }}},
    }))
    .unwrap()
}

/// A claim holding a share of `device` (10 GiB of a 40 GiB card) with the class's strategy.
fn share(name: &str, uid: &str, device: &str, strategy: &str) -> ResourceClaim {
    let config = serde_json::json!([{"source": "FromClass", "requests": [], "opaque": {"driver": DRIVER,
        "parameters": {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
            "sharing": {"strategy": strategy}}}}]);
    held_share(
        name,
        uid,
        device,
        serde_json::json!({"memory": "10Gi"}),
        config,
    )
}

#[tokio::test]
async fn shares_of_a_gpu_prepare_together_and_keep_the_whole_gpu_out() {
    let (dir, claims) = setup();
    claims.put(share("s1", "u1", "gpu-0-shared-a100", "TimeSlicing"));
    claims.put(share("s2", "u2", "gpu-0-shared-a100", "TimeSlicing"));
    claims.put(exclusive("whole", "u3", &["gpu-0"]));
    claims.put(share("other", "u4", "gpu-0-shared-b", "TimeSlicing"));
    let (d, _) = driver(dir.path(), &claims);
    let answers = d.prepare(vec![cref("s1", "u1"), cref("s2", "u2")]).await;
    let s1 = answers["u1"].as_ref().unwrap();
    assert_eq!(s1[0].device, "gpu-0-shared-a100");
    assert_eq!(s1[0].share_id.as_deref(), Some("share-u1"));
    assert!(answers["u2"].is_ok(), "{answers:?}");
    let whole = d.prepare(vec![cref("whole", "u3")]).await;
    let refused = whole["u3"].as_ref().unwrap_err();
    assert!(
        refused.contains("device gpu-0 is already prepared for claim u"),
        "{refused}"
    );
    let other = d.prepare(vec![cref("other", "u4")]).await;
    assert!(
        other["u4"].is_err(),
        "shares of one GPU for two classes: {other:?}"
    );
    let spec = std::fs::read_to_string(d.cdi.path("u1")).unwrap();
    assert!(
        spec.contains("NVIDIA_DRA_SHARING_GPU_0_SHARED_A100=TimeSlicing"),
        "{spec}"
    );
    assert!(spec.contains("/dev/nvidia0"), "{spec}");
    let users = d.consumers();
    assert_eq!(users["GPU-0"], ["ns/s1", "ns/s2"]);
}

/// `claim` with one config asking for time-slicing with `interval` (upstream's spelling).
fn time_sliced(claim: ResourceClaim, interval: &str) -> ResourceClaim {
    let mut value = serde_json::to_value(claim).unwrap();
    value["status"]["allocation"]["devices"]["config"] = serde_json::json!([{
        "source": "FromClaim", "requests": [], "opaque": {"driver": DRIVER, "parameters": {
            "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
            "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": interval}}}}}]);
    serde_json::from_value(value).unwrap()
}

fn driver_slicing(
    dir: &Path,
    claims: &Arc<Claims>,
) -> (Driver<Arc<Claims>>, Arc<crate::time_slice::fake::Recorder>) {
    let recorder = Arc::new(crate::time_slice::fake::Recorder::default());
    let (d, _) = driver(dir, claims);
    (d.with_time_slicer(recorder.clone()), recorder)
}

#[tokio::test]
async fn a_time_sliced_claim_sets_its_gpus_interval_until_it_is_unprepared() {
    let (dir, claims) = setup();
    claims.put(time_sliced(exclusive("ts", "u1", &["gpu-2"]), "Short"));
    let (d, slicer) = driver_slicing(dir.path(), &claims);
    let answers = d.prepare(vec![cref("ts", "u1")]).await;
    assert!(answers["u1"].is_ok(), "{answers:?}");
    assert_eq!(slicer.last("GPU-2"), Some(Interval::Short));
    let again = d.prepare(vec![cref("ts", "u1")]).await;
    assert!(again["u1"].is_ok());
    assert_eq!(
        slicer.calls.lock().unwrap().len(),
        1,
        "a repeated prepare sets nothing"
    );
    assert!(d.unprepare(vec![cref("ts", "u1")]).await["u1"].is_ok());
    assert_eq!(slicer.last("GPU-2"), Some(Interval::Default));
    assert!(d.unprepare(vec![cref("ts", "u1")]).await["u1"].is_ok());
    assert_eq!(
        slicer.calls.lock().unwrap().len(),
        2,
        "a repeated unprepare sets nothing"
    );
}

#[tokio::test]
async fn claims_sharing_a_gpu_with_other_intervals_are_refused_naming_both() {
    let (dir, claims) = setup();
    claims.put(time_sliced(
        share("s1", "u1", "gpu-0-shared-a100", "TimeSlicing"),
        "Short",
    ));
    claims.put(time_sliced(
        share("s2", "u2", "gpu-0-shared-a100", "TimeSlicing"),
        "Long",
    ));
    claims.put(time_sliced(
        share("s3", "u3", "gpu-0-shared-a100", "TimeSlicing"),
        "Short",
    ));
    let (d, slicer) = driver_slicing(dir.path(), &claims);
    assert!(d.prepare(vec![cref("s1", "u1")]).await["u1"].is_ok());
    let refused = d.prepare(vec![cref("s2", "u2")]).await;
    let message = refused["u2"].as_ref().unwrap_err();
    assert!(
        message.contains(
            "GPU GPU-0 is time-sliced with interval Short for claim ns/s1; this claim asks for Long"
        ),
        "{message}"
    );
    assert!(d.prepare(vec![cref("s3", "u3")]).await["u3"].is_ok());
    assert!(d.unprepare(vec![cref("s1", "u1")]).await["u1"].is_ok());
    assert_eq!(
        slicer.last("GPU-0"),
        Some(Interval::Short),
        "s3 still wants Short"
    );
    assert!(d.unprepare(vec![cref("s3", "u3")]).await["u3"].is_ok());
    assert_eq!(slicer.last("GPU-0"), Some(Interval::Default));
    assert!(
        d.prepare(vec![cref("s2", "u2")]).await["u2"].is_ok(),
        "Long once no claim holds Short"
    );
}

#[tokio::test]
async fn a_failed_interval_change_fails_only_its_claim_and_keeps_nothing() {
    let (dir, claims) = setup();
    claims.put(time_sliced(exclusive("bad", "u1", &["gpu-4"]), "Medium"));
    claims.put(exclusive("plain", "u2", &["gpu-4"]));
    let (d, slicer) = driver_slicing(dir.path(), &claims);
    slicer.failing.lock().unwrap().push("GPU-4".into());
    let answers = d.prepare(vec![cref("bad", "u1")]).await;
    let message = answers["u1"].as_ref().unwrap_err();
    assert!(
        message.contains("setting the time-slice interval of GPU GPU-4 failed: nvidia-smi failed"),
        "{message}"
    );
    assert!(!d.cdi.path("u1").exists());
    assert!(
        d.prepare(vec![cref("plain", "u2")]).await["u2"].is_ok(),
        "the failed claim holds nothing"
    );
    let (held, _) = d.ledger.read(|cp| cp.claims.contains_key("u1"));
    assert!(!held);
}

#[tokio::test]
async fn gpus_a_crash_left_unsettled_get_what_the_remaining_claims_want() {
    let (dir, claims) = setup();
    claims.put(time_sliced(exclusive("kept", "u1", &["gpu-1"]), "Long"));
    let (d, slicer) = driver_slicing(dir.path(), &claims);
    assert!(d.prepare(vec![cref("kept", "u1")]).await["u1"].is_ok());
    let failed = d
        .settle_time_slices(&BTreeSet::from(["GPU-1".to_owned(), "GPU-6".to_owned()]))
        .await;
    assert!(failed.is_empty(), "{failed:?}");
    assert_eq!(slicer.last("GPU-1"), Some(Interval::Long));
    assert_eq!(slicer.last("GPU-6"), Some(Interval::Default));
}

/// A claim holding one of the consumable shares of whole device `device`, with `sharing` as
/// its config when given.
fn consumed(
    name: &str,
    uid: &str,
    device: &str,
    sharing: Option<serde_json::Value>,
) -> ResourceClaim {
    let config = sharing.map_or_else(Vec::new, |sharing| {
        vec![serde_json::json!({"source": "FromClaim", "requests": [], "opaque": {"driver": DRIVER,
            "parameters": {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": sharing}}})]
    });
    held_share(
        name,
        uid,
        device,
        serde_json::json!({"shares": "1"}),
        config.into(),
    )
}

#[tokio::test]
async fn consumable_shares_of_a_gpu_prepare_together_but_mps_is_refused() {
    let (dir, claims) = setup();
    claims.put(consumed("c1", "u1", "gpu-1", None));
    claims.put(consumed("c2", "u2", "gpu-1", None));
    claims.put(exclusive("whole", "u3", &["gpu-1"]));
    claims.put(consumed(
        "mps",
        "u4",
        "gpu-2",
        Some(serde_json::json!({"strategy": "MPS"})),
    ));
    let (d, _) = driver(dir.path(), &claims);
    let answers = d.prepare(vec![cref("c1", "u1"), cref("c2", "u2")]).await;
    assert!(answers.values().all(Result::is_ok), "{answers:?}");
    assert_eq!(d.consumers()["GPU-1"], ["ns/c1", "ns/c2"]);
    let whole = d.prepare(vec![cref("whole", "u3")]).await;
    assert!(
        whole["u3"]
            .as_ref()
            .unwrap_err()
            .contains("device gpu-1 is already prepared"),
        "{whole:?}"
    );
    let mps = d.prepare(vec![cref("mps", "u4")]).await;
    let refused = mps["u4"].as_ref().unwrap_err();
    assert!(
        refused.contains("MPS sharing is not supported on a device offered as consumable shares"),
        "{refused}"
    );
}

#[tokio::test]
async fn an_mps_share_needs_its_daemon_and_gets_its_part_as_limits() {
    let (dir, claims) = setup();
    claims.put(share("mps", "u1", "gpu-1-shared-a100", "MPS"));
    let (d, _) = driver(dir.path(), &claims);
    let d = Driver {
        cdi: d.cdi.clone().with_mps_root(&dir.path().join("mps")),
        ..d
    };
    let refused = d.prepare(vec![cref("mps", "u1")]).await;
    let message = refused["u1"].as_ref().unwrap_err();
    assert!(
        message.contains("no MPS control daemon for GPU GPU-1"),
        "{message}"
    );
    std::fs::create_dir_all(dir.path().join("mps/GPU-1")).unwrap();
    let answers = d.prepare(vec![cref("mps", "u1")]).await;
    assert!(answers["u1"].is_ok(), "{answers:?}");
    let spec = std::fs::read_to_string(d.cdi.path("u1")).unwrap();
    for expected in [
        "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=10240M",
        "mps/GPU-1",
    ] {
        assert!(spec.contains(expected), "{expected} in {spec}");
    }
}

/// `claim` with the config upstream documents for MPS.
fn with_mps(claim: ResourceClaim) -> ResourceClaim {
    let mut value = serde_json::to_value(claim).unwrap();
    value["status"]["allocation"]["devices"]["config"] = serde_json::json!([{
        "source": "FromClaim", "requests": [], "opaque": {"driver": DRIVER, "parameters": {
            "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
            "sharing": {"strategy": "MPS", "mpsConfig": {
                "defaultActiveThreadPercentage": 50, "defaultPinnedDeviceMemoryLimit": "10Gi"}}}}}]);
    serde_json::from_value(value).unwrap()
}

fn driver_with_daemons(
    dir: &Path,
    claims: &Arc<Claims>,
) -> (Driver<Arc<Claims>>, Arc<crate::mps::fake::Daemons>) {
    let daemons = Arc::new(crate::mps::fake::Daemons {
        root: dir.join("mps"),
        ..Default::default()
    });
    let (d, _) = driver(dir, claims);
    let d = Driver {
        cdi: d.cdi.clone().with_mps_root(&dir.join("mps")),
        ..d
    };
    (d.with_mps_daemons(daemons.clone()), daemons)
}

#[tokio::test]
async fn an_mps_claim_runs_its_own_daemon_until_it_is_unprepared() {
    let (dir, claims) = setup();
    claims.put(with_mps(exclusive("mps", "u1", &["gpu-1", "gpu-2"])));
    let (d, daemons) = driver_with_daemons(dir.path(), &claims);
    let answers = d.prepare(vec![cref("mps", "u1")]).await;
    assert!(answers["u1"].is_ok(), "{answers:?}");
    let running = daemons.running.lock().unwrap().clone();
    assert_eq!(running["u1"].devices, ["GPU-1", "GPU-2"]);
    let spec = std::fs::read_to_string(d.cdi.path("u1")).unwrap();
    for expected in [
        "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",
        "CUDA_MPS_LOG_DIRECTORY=/var/log/nvidia-mps",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=10240M,1=10240M",
        "mps/claim-u1/pipe",
        "mps/claim-u1/log",
    ] {
        assert!(spec.contains(expected), "{expected} in {spec}");
    }
    let stored = CheckpointStore::new(&dir.path().join("plugin"), "boot-1");
    let (checkpoint, _) = stored.load().unwrap();
    assert_eq!(checkpoint.claims["u1"].mps.as_ref(), Some(&running["u1"]));

    assert!(d.unprepare(vec![cref("mps", "u1")]).await["u1"].is_ok());
    assert!(daemons.running.lock().unwrap().is_empty());
    assert!(!dir.path().join("mps/claim-u1").exists());
}

#[tokio::test]
async fn an_mps_daemon_that_does_not_come_up_fails_the_claim_and_leaves_nothing() {
    let (dir, claims) = setup();
    claims.put(with_mps(exclusive("mps", "u1", &["gpu-1"])));
    let (d, daemons) = driver_with_daemons(dir.path(), &claims);
    daemons.failing.lock().unwrap().insert("u1".into());
    let answers = d.prepare(vec![cref("mps", "u1")]).await;
    let message = answers["u1"].as_ref().unwrap_err();
    assert!(
        message.contains("MPS control daemon: the daemon of u1 did not come up"),
        "{message}"
    );
    assert!(daemons.running.lock().unwrap().is_empty());
    assert!(!dir.path().join("mps/claim-u1").exists());
    assert!(!d.cdi.path("u1").exists());
    let (checkpoint, _) = d.ledger.read(Clone::clone);
    assert!(checkpoint.claims.is_empty(), "{checkpoint:?}");
    // The device is free again.
    claims.put(exclusive("plain", "u2", &["gpu-1"]));
    assert!(d.prepare(vec![cref("plain", "u2")]).await["u2"].is_ok());
}

#[tokio::test]
async fn without_a_way_to_run_daemons_an_mps_claim_is_refused_saying_so() {
    let (dir, claims) = setup();
    claims.put(with_mps(exclusive("mps", "u1", &["gpu-1"])));
    let (d, _) = driver(dir.path(), &claims);
    let answers = d.prepare(vec![cref("mps", "u1")]).await;
    let message = answers["u1"].as_ref().unwrap_err();
    assert!(
        message.contains("without a way to run MPS control daemons"),
        "{message}"
    );
}

#[tokio::test]
async fn daemons_of_claims_that_are_not_prepared_are_swept_at_start() {
    let (dir, claims) = setup();
    claims.put(with_mps(exclusive("kept", "u1", &["gpu-1"])));
    let (d, daemons) = driver_with_daemons(dir.path(), &claims);
    assert!(d.prepare(vec![cref("kept", "u1")]).await["u1"].is_ok());
    // A crash after a daemon started, before its claim was recorded prepared.
    std::fs::create_dir_all(crate::mps::pipe_dir(&dir.path().join("mps"), "u-lost")).unwrap();
    let (restarted, _) = driver(dir.path(), &claims);
    let restarted = restarted.with_mps_daemons(daemons.clone());
    assert!(restarted.sweep_mps_daemons().await.is_empty());
    assert_eq!(
        daemons.running.lock().unwrap().keys().collect::<Vec<_>>(),
        ["u1"]
    );
    assert!(dir.path().join("mps/claim-u1").exists());
    assert!(!dir.path().join("mps/claim-u-lost").exists());
}

#[tokio::test]
async fn concurrent_claims_for_one_device_let_exactly_one_through() {
    let (dir, claims) = setup();
    for i in 0..8 {
        claims.put(exclusive(&format!("c{i}"), &format!("u{i}"), &["gpu-5"]));
    }
    let (d, _) = driver(dir.path(), &claims);
    let d = Arc::new(d);
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let d = Arc::clone(&d);
            tokio::spawn(async move {
                d.prepare(vec![cref(&format!("c{i}"), &format!("u{i}"))])
                    .await
            })
        })
        .collect();
    let mut ok = 0;
    for t in tasks {
        ok += t.await.unwrap().values().filter(|r| r.is_ok()).count();
    }
    assert_eq!(ok, 1);
}

#[tokio::test]
async fn unprepare_is_idempotent_and_unknown_claims_succeed() {
    let (dir, claims) = setup();
    claims.put(exclusive("a", "u1", &["gpu-0"]));
    let (d, _) = driver(dir.path(), &claims);
    assert!(d.prepare(vec![cref("a", "u1")]).await["u1"].is_ok());
    for _ in 0..2 {
        let answers = d
            .unprepare(vec![cref("a", "u1"), cref("never", "u9")])
            .await;
        assert_eq!(
            answers,
            [("u1".to_owned(), Ok(())), ("u9".to_owned(), Ok(()))].into()
        );
    }
    assert!(
        !dir.path()
            .join("cdi/k8s.gpu.nvidia.com-claim_u1.yaml")
            .exists()
    );
    // The device is free again.
    claims.put(exclusive("b", "u2", &["gpu-0"]));
    assert!(d.prepare(vec![cref("b", "u2")]).await["u2"].is_ok());
}

#[tokio::test]
async fn the_devices_prepared_claims_hold_are_told_after_each_call() {
    let (dir, claims) = setup();
    claims.put(exclusive("a", "u1", &["gpu-0"]));
    claims.put(exclusive("b", "u2", &["gpu-1"]));
    let (d, _) = driver(dir.path(), &claims);
    assert!(d.prepare(vec![cref("a", "u1")]).await["u1"].is_ok());
    drop(d);
    // A restarted plugin tells what its checkpoint holds at once.
    let (d, _) = driver(dir.path(), &claims);
    let (tx, held) = tokio::sync::watch::channel(std::collections::BTreeSet::new());
    let d = d.with_held_devices(tx);
    assert_eq!(*held.borrow(), ["gpu-0".to_owned()].into());
    assert!(d.prepare(vec![cref("b", "u2")]).await["u2"].is_ok());
    assert_eq!(
        *held.borrow(),
        ["gpu-0".to_owned(), "gpu-1".to_owned()].into()
    );
    assert!(d.unprepare(vec![cref("a", "u1")]).await["u1"].is_ok());
    assert_eq!(*held.borrow(), ["gpu-1".to_owned()].into());
}

#[tokio::test]
async fn a_crash_mid_prepare_is_rolled_back_at_start() {
    let (dir, claims) = setup();
    claims.put(exclusive("done", "u1", &["gpu-0"]));
    let (d, _) = driver(dir.path(), &claims);
    assert!(d.prepare(vec![cref("done", "u1")]).await["u1"].is_ok());
    drop(d);
    // What a kill between PrepareStarted and PrepareCompleted leaves: the entry and a spec.
    let store = CheckpointStore::new(&dir.path().join("plugin"), "boot-1");
    let (mut cp, _) = store.load().unwrap();
    cp.claims.insert(
        "u2".into(),
        ClaimEntry {
            state: ClaimState::PrepareStarted,
            namespace: "ns".into(),
            name: "half".into(),
            devices: vec![],
            time_slices: BTreeMap::from([("GPU-half".into(), Interval::Medium)]),
            mps: None,
            partitions: Vec::new(),
        },
    );
    store.save(&cp).unwrap();
    let half = dir.path().join("cdi/k8s.gpu.nvidia.com-claim_u2.yaml");
    std::fs::write(&half, b"partial").unwrap();

    let (d, report) = driver(dir.path(), &claims);
    assert_eq!(report.rolled_back, [cref("half", "u2")]);
    assert_eq!(
        report.unsettled_time_slices,
        BTreeSet::from(["GPU-half".to_owned()]),
        "the GPU a half-prepared claim may have changed is to be put back"
    );
    assert_eq!(report.restored, 1);
    assert!(!half.exists(), "no leaked CDI file");
    assert!(
        dir.path()
            .join("cdi/k8s.gpu.nvidia.com-claim_u1.yaml")
            .exists()
    );
    assert!(d.prepare(vec![cref("done", "u1")]).await["u1"].is_ok());
    assert_eq!(
        claims.gets.load(Ordering::SeqCst),
        1,
        "completed claim kept"
    );
}

#[tokio::test]
async fn a_crash_between_spec_and_checkpoint_leaves_no_spec_behind() {
    let (dir, claims) = setup();
    claims.put(exclusive("done", "u1", &["gpu-0"]));
    let (d, _) = driver(dir.path(), &claims);
    assert!(d.prepare(vec![cref("done", "u1")]).await["u1"].is_ok());
    drop(d);
    // What a kill after the spec write and before the commit leaves: a spec the checkpoint
    // does not know, and the temp file of a spec write cut short.
    let cdi = dir.path().join("cdi");
    let stray = cdi.join("k8s.gpu.nvidia.com-claim_u2.yaml");
    let temp = cdi.join(".k8s.gpu.nvidia.com-claim_u3.yaml.77.0.tmp");
    let foreign = cdi.join("example.com-other.yaml");
    for file in [&stray, &temp, &foreign] {
        std::fs::write(file, b"x").unwrap();
    }

    let (d, report) = driver(dir.path(), &claims);
    assert_eq!(report.stray_specs, ["u2"]);
    assert_eq!(report.restored, 1);
    assert!(!stray.exists() && !temp.exists(), "no leaked CDI file");
    assert!(foreign.exists(), "another producer's spec is left alone");
    assert!(cdi.join("k8s.gpu.nvidia.com-claim_u1.yaml").exists());
    assert!(d.prepare(vec![cref("done", "u1")]).await["u1"].is_ok());
}

#[tokio::test]
async fn one_call_writes_the_checkpoint_once_whatever_its_number_of_claims() {
    let (dir, claims) = setup();
    let refs: Vec<_> = (0..8)
        .map(|i| {
            let (name, uid) = (format!("c{i}"), format!("u{i}"));
            claims.put(exclusive(&name, &uid, &[&format!("gpu-{i}")]));
            cref(&name, &uid)
        })
        .collect();
    let (d, _) = driver(dir.path(), &claims);
    let answers = d.prepare(refs.clone()).await;
    assert!(answers.values().all(Result::is_ok), "{answers:?}");
    assert_eq!(d.checkpoint_writes(), 1);
    let store = CheckpointStore::new(&dir.path().join("plugin"), "boot-1");
    let (on_disk, _) = store.load().unwrap();
    assert_eq!(on_disk.claims.len(), 8);
    assert!(
        on_disk
            .claims
            .values()
            .all(|e| e.state == ClaimState::PrepareCompleted)
    );
    // Answered from memory: no write.
    assert!(d.prepare(refs.clone()).await.values().all(Result::is_ok));
    assert_eq!(d.checkpoint_writes(), 1);
    assert!(d.unprepare(refs).await.values().all(Result::is_ok));
    assert_eq!(d.checkpoint_writes(), 2);
    assert!(store.load().unwrap().0.claims.is_empty());
}

/// Turns the checkpoint's folder into a file, so checkpoint writes fail (even as root).
fn refuse_writes(plugin: &Path) {
    std::fs::remove_dir_all(plugin).unwrap();
    std::fs::write(plugin, b"not a directory").unwrap();
}

/// Undoes [`refuse_writes`] with an empty folder.
fn take_writes(plugin: &Path) {
    std::fs::remove_file(plugin).unwrap();
    std::fs::create_dir(plugin).unwrap();
}

#[tokio::test]
async fn a_failed_commit_fails_the_call_and_keeps_nothing() {
    let (dir, claims) = setup();
    claims.put(exclusive("a", "u1", &["gpu-0"]));
    claims.put(exclusive("b", "u2", &["gpu-1"]));
    let (d, _) = driver(dir.path(), &claims);
    let plugin = dir.path().join("plugin");
    refuse_writes(&plugin);

    let answers = d.prepare(vec![cref("a", "u1"), cref("b", "u2")]).await;
    for uid in ["u1", "u2"] {
        let err = answers[uid].clone().unwrap_err();
        assert!(err.contains("writing the checkpoint failed"), "{err}");
    }
    let specs: Vec<_> = std::fs::read_dir(dir.path().join("cdi")).unwrap().collect();
    assert!(specs.is_empty(), "no spec of an unrecorded claim");

    // Once the disk takes writes again, the kubelet's retry prepares both.
    take_writes(&plugin);
    let answers = d.prepare(vec![cref("a", "u1"), cref("b", "u2")]).await;
    assert!(answers.values().all(Result::is_ok), "{answers:?}");
    let (on_disk, _) = CheckpointStore::new(&plugin, "boot-1").load().unwrap();
    assert_eq!(on_disk.claims.len(), 2);
}

#[tokio::test]
async fn an_unprepare_whose_commit_failed_is_written_on_the_retry() {
    let (dir, claims) = setup();
    claims.put(exclusive("a", "u1", &["gpu-0"]));
    let (d, _) = driver(dir.path(), &claims);
    assert!(d.prepare(vec![cref("a", "u1")]).await["u1"].is_ok());
    let plugin = dir.path().join("plugin");
    let checkpoint = std::fs::read(plugin.join("checkpoint.json")).unwrap();
    refuse_writes(&plugin);
    assert!(d.unprepare(vec![cref("a", "u1")]).await["u1"].is_err());

    take_writes(&plugin);
    std::fs::write(plugin.join("checkpoint.json"), checkpoint).unwrap();
    assert!(d.unprepare(vec![cref("a", "u1")]).await["u1"].is_ok());
    let (on_disk, _) = CheckpointStore::new(&plugin, "boot-1").load().unwrap();
    assert!(on_disk.claims.is_empty(), "the retry wrote the removal");
}

#[tokio::test]
async fn a_corrupted_checkpoint_starts_empty() {
    let (dir, claims) = setup();
    std::fs::write(dir.path().join("plugin/checkpoint.json"), b"garbage").unwrap();
    let (_, report) = driver(dir.path(), &claims);
    assert!(
        matches!(report.outcome, LoadOutcome::Corrupted { .. }),
        "{report:?}"
    );
    let (_, report) = driver(dir.path(), &claims);
    assert_eq!(report.outcome, LoadOutcome::Restored);
}
