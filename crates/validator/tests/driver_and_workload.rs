//! The built `dra-driver-validator` run against fake nodes carrying the mock NVML.

use gpu_discovery::testing::{FakeNode, configure, mock_config};
use gpu_discovery::{DriverReady, InitMode, NvmlSession};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_dra-driver-validator");

/// Longest any child may run before the test gives up on it (a hang guard, not a measurement).
const HANG_GUARD: Duration = Duration::from_secs(120);

fn validator(node: &FakeNode) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.env_clear()
        .env("HOST_ROOT", node.host_root())
        .env("DRIVER_INSTALL_DIR_CTR_PATH", node.driver_root())
        .env("OUTPUT_DIR", node.status_dir())
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

fn run(cmd: &mut Command) -> (Output, String) {
    let out = cmd.output().expect("run validator");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out, stderr)
}

fn ready_file(node: &FakeNode) -> PathBuf {
    node.status_dir().join("driver-ready")
}

fn error_line(stderr: &str) -> &str {
    let lines: Vec<_> = stderr
        .lines()
        .filter(|l| l.starts_with("dra-driver-validator: "))
        .collect();
    assert_eq!(
        lines.len(),
        1,
        "exactly one error line expected in:\n{stderr}"
    );
    lines[0]
}

fn wait_for_exit(child: &mut Child) -> std::process::ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(start.elapsed() < HANG_GUARD, "validator did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn sigterm(child: &Child) {
    let ok = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
}

#[test]
fn a_host_driver_gives_the_host_paths() {
    let node = FakeNode::new();
    node.install_host_driver(&mock_config("a100-sxm4-40gb", 2));
    let (out, stderr) = run(validator(&node).arg("driver"));
    assert!(out.status.success(), "{stderr}");
    let ready = DriverReady::read(&ready_file(&node)).unwrap();
    assert_eq!(
        ready,
        DriverReady {
            is_host_driver: true,
            paths: gpu_discovery::DriverPaths {
                driver_root: "/".into(),
                driver_root_ctr: node.host_root(),
                dev_root: "/".into(),
                dev_root_ctr: node.host_root(),
            },
        }
    );
}

#[test]
fn a_container_driver_gives_the_install_dir_and_the_dev_root_follows_dev() {
    let node = FakeNode::new();
    node.install_container_driver(&mock_config("h100-sxm5-80gb", 1), false);
    let (out, stderr) = run(validator(&node).arg("driver"));
    assert!(out.status.success(), "{stderr}");
    let ready = DriverReady::read(&ready_file(&node)).unwrap();
    assert!(!ready.is_host_driver);
    assert_eq!(ready.paths.driver_root, Path::new("/run/nvidia/driver"));
    assert_eq!(ready.paths.driver_root_ctr, node.driver_root());
    assert_eq!(
        (ready.paths.dev_root, ready.paths.dev_root_ctr),
        ("/".into(), node.host_root())
    );

    std::fs::create_dir(node.driver_root().join("dev")).unwrap();
    let (out, stderr) = run(validator(&node)
        .arg("driver")
        .env("DRIVER_INSTALL_DIR", "/opt/nvidia/driver"));
    assert!(out.status.success(), "{stderr}");
    let ready = DriverReady::read(&ready_file(&node)).unwrap();
    assert_eq!(ready.paths.driver_root, Path::new("/opt/nvidia/driver"));
    assert_eq!(
        (ready.paths.dev_root, ready.paths.dev_root_ctr),
        ("/opt/nvidia/driver".into(), node.driver_root())
    );
}

#[test]
fn with_both_drivers_the_host_wins() {
    let node = FakeNode::new();
    node.install_container_driver(&mock_config("h200", 1), true);
    node.install_host_driver(&mock_config("l4", 1));
    let (out, stderr) = run(validator(&node).arg("driver"));
    assert!(out.status.success(), "{stderr}");
    assert!(
        DriverReady::read(&ready_file(&node))
            .unwrap()
            .is_host_driver
    );
    assert!(stderr.contains("Host driver"), "{stderr}");
}

#[test]
fn no_driver_without_wait_fails_at_once_naming_the_searched_paths() {
    let node = FakeNode::new();
    let (out, stderr) = run(validator(&node).arg("driver"));
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let line = error_line(&stderr);
    for root in [node.host_root(), node.driver_root()] {
        for dir in [
            "usr/lib64",
            "usr/lib/x86_64-linux-gnu",
            "lib/aarch64-linux-gnu",
        ] {
            let path = root.join(dir).join("libnvidia-ml.so.1");
            assert!(
                line.contains(&path.display().to_string()),
                "{} not in {line}",
                path.display()
            );
        }
    }
    assert!(!stderr.contains("retrying"), "{stderr}");
    assert!(!ready_file(&node).exists());
}

#[test]
fn no_driver_with_wait_retries_then_ends_at_the_timeout_with_the_same_message() {
    let node = FakeNode::new();
    let (out, stderr) = run(validator(&node)
        .args(["driver", "--with-wait", "--sleep-interval-seconds", "1"])
        .env("TIMEOUT_SECONDS", "2"));
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let line = error_line(&stderr);
    assert!(line.contains("gave up after 2s"), "{line}");
    let searched = node
        .host_root()
        .join("usr/lib64/libnvidia-ml.so.1")
        .display()
        .to_string();
    assert!(line.contains(&searched), "{line}");
    let retries: Vec<_> = stderr
        .lines()
        .filter(|l| l.contains("retrying in"))
        .collect();
    assert!(retries.len() >= 2, "{stderr}");
    assert!(retries.iter().all(|l| l.contains(&searched)), "{stderr}");
}

#[test]
fn with_wait_a_driver_that_appears_later_is_found() {
    let node = FakeNode::new();
    let mut child = validator(&node)
        .args(["driver", "--sleep-interval-seconds", "1"])
        .env("WITH_WAIT", "true")
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    node.install_container_driver(&mock_config("gb200", 2), true);
    assert!(wait_for_exit(&mut child).success());
    assert!(
        !DriverReady::read(&ready_file(&node))
            .unwrap()
            .is_host_driver
    );
}

#[test]
fn sigterm_ends_the_wait_cleanly() {
    let node = FakeNode::new();
    let mut child = validator(&node)
        .args(["driver", "--with-wait"])
        .spawn()
        .unwrap();
    // Let it reach the wait: its first retry line is on stderr, read after exit.
    std::thread::sleep(Duration::from_millis(500));
    sigterm(&child);
    let status = wait_for_exit(&mut child);
    assert_eq!(status.code(), Some(143));
    assert!(!ready_file(&node).exists());
}

#[test]
fn an_injected_init_failure_is_reported_as_such() {
    let node = FakeNode::new();
    let lib = node.install_host_driver(
        &json!({"profile": "t4", "faults": {"init_error": "driver-not-loaded"}}),
    );
    let (out, stderr) = run(validator(&node).arg("driver"));
    assert_eq!(out.status.code(), Some(1));
    let line = error_line(&stderr);
    assert!(line.contains("kernel driver is not loaded"), "{line}");
    assert!(line.contains(&lib.display().to_string()), "{line}");

    configure(
        &node.host_root(),
        &json!({"profile": "t4", "faults": {"init_error": "version-mismatch"}}),
    );
    let (_, stderr) = run(validator(&node).arg("driver"));
    assert!(
        error_line(&stderr).contains("NVML_ERROR_LIB_RM_VERSION_MISMATCH"),
        "{stderr}"
    );
}

#[test]
fn skipping_gpu_init_needs_only_the_driver_version() {
    let node = FakeNode::new();
    node.install_host_driver(&mock_config("a100-sxm4-80gb", 0));
    let (out, stderr) = run(validator(&node).arg("driver"));
    assert_eq!(out.status.code(), Some(1));
    assert!(error_line(&stderr).contains("reports no GPUs"), "{stderr}");
    let (out, stderr) = run(validator(&node).args(["driver", "--skip-gpu-init"]));
    assert!(out.status.success(), "{stderr}");
}

#[test]
fn a_reader_never_sees_a_partial_file_while_the_validator_rewrites_it() {
    let node = FakeNode::new();
    node.install_host_driver(&mock_config("l4", 1));
    assert!(run(validator(&node).arg("driver")).0.status.success());
    let expected = DriverReady::read(&ready_file(&node)).unwrap();
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let reader = s.spawn(|| {
            let mut reads = 0u32;
            while !done.load(std::sync::atomic::Ordering::Acquire) {
                assert_eq!(DriverReady::read(&ready_file(&node)).unwrap(), expected);
                reads += 1;
            }
            reads
        });
        for _ in 0..15 {
            let (out, stderr) = run(validator(&node).arg("driver"));
            assert!(out.status.success(), "{stderr}");
        }
        done.store(true, std::sync::atomic::Ordering::Release);
        assert!(reader.join().unwrap() > 0);
    });
}

fn uuids(lib: &Path) -> (Vec<String>, Vec<String>) {
    let inv = NvmlSession::open(lib, InitMode::Full)
        .unwrap()
        .inventory()
        .unwrap();
    let migs = inv
        .gpus
        .iter()
        .flat_map(|g| g.mig_devices.iter().map(|m| m.uuid.clone()))
        .collect();
    (inv.gpus.into_iter().map(|g| g.uuid).collect(), migs)
}

fn workload(node: &FakeNode, visible: &str) -> Command {
    let mut cmd = validator(node);
    cmd.arg("workload")
        .env("NVIDIA_VISIBLE_DEVICES", visible)
        .env("WORKLOAD_DRIVER_ROOT", node.host_root())
        .env("SLEEP_INTERVAL_SECONDS", "1");
    cmd
}

#[test]
fn the_workload_becomes_ready_when_nvml_shows_the_injected_gpu_and_stops_on_sigterm() {
    let node = FakeNode::new();
    let lib = node.install_host_driver(&mock_config("a100-sxm4-40gb-mig-mixed", 2));
    let (gpus, migs) = uuids(&lib);
    let marker = node.status_dir().join("workload-ready");
    let mut child = workload(&node, &format!("{},{}", gpus[1], migs[0]))
        .spawn()
        .unwrap();
    let start = Instant::now();
    while !marker.exists() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "workload exited before ready"
        );
        assert!(start.elapsed() < HANG_GUARD, "workload never became ready");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(std::fs::read_to_string(&marker).unwrap().contains(&gpus[1]));
    sigterm(&child);
    assert!(wait_for_exit(&mut child).success());
    assert!(!marker.exists());
}

#[test]
fn the_workload_says_what_it_expected_and_saw_when_the_uuid_is_unknown() {
    let node = FakeNode::new();
    let lib = node.install_host_driver(&mock_config("l4", 1));
    let (gpus, _) = uuids(&lib);
    let wrong = "GPU-00000000-1111-2222-3333-444444444444";
    let (out, stderr) = run(workload(&node, wrong).env("TIMEOUT_SECONDS", "1"));
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let line = error_line(&stderr);
    assert!(line.contains(&format!("expected {wrong}")), "{line}");
    assert!(line.contains(&format!("NVML sees [{}]", gpus[0])), "{line}");
    assert!(
        stderr.lines().any(|l| l.contains("retrying in")),
        "{stderr}"
    );
    assert!(!node.status_dir().join("workload-ready").exists());
}

#[test]
fn the_mock_is_configurable_by_env_in_a_real_process() {
    let node = FakeNode::new();
    node.install_host_driver(&mock_config("l4", 1));
    let (out, stderr) = run(validator(&node)
        .arg("driver")
        .env("MOCK_NVML_PROFILE", "t4"));
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("driver 550.163.01 found"), "{stderr}");

    let elsewhere = node.status_dir().with_file_name("elsewhere.json");
    std::fs::write(
        &elsewhere,
        r#"{"faults": {"init_error": "version-mismatch"}}"#,
    )
    .unwrap();
    let (out, stderr) = run(validator(&node)
        .arg("driver")
        .env("MOCK_NVML_CONFIG", &elsewhere));
    assert_eq!(out.status.code(), Some(1));
    assert!(error_line(&stderr).contains("VERSION_MISMATCH"), "{stderr}");

    let (out, stderr) = run(validator(&node)
        .arg("driver")
        .env("MOCK_NVML_GPU_COUNT", "0"));
    assert_eq!(out.status.code(), Some(1));
    assert!(error_line(&stderr).contains("reports no GPUs"), "{stderr}");
}
