//! Fake nodes for tests: temp dirs laid out like a node's host root and container driver root,
//! with the mock NVML installed as the driver's `libnvidia-ml.so.1`.
//!
//! The mock library comes from `$MOCK_NVML_LIBRARY` when set, else from running
//! `cargo build -p mock-nvml` once per test process (with the `CARGO` that runs the tests, so the
//! same target dir, `CARGO_TARGET_DIR` included) and taking the cdylib path from cargo's JSON
//! messages. Each installed driver is a copy of that file, so every fake root loads its own
//! instance of the mock, configured by the `mock-nvml.json` beside it.

use crate::atomic::{Durability, replace};
use crate::driver_files::OPTIONAL_LIBRARIES;
use crate::root::{LIBRARY_NAME, ProbeSettings};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use tempfile::TempDir;

/// Env var naming a prebuilt mock library, which skips the cargo build.
pub const MOCK_LIBRARY_ENV: &str = "MOCK_NVML_LIBRARY";
/// Where drivers are installed inside a root.
pub const LIBRARY_DIR: &str = "usr/lib/x86_64-linux-gnu";
/// Versioned file name the `libnvidia-ml.so.1` link points at, as in a real install.
pub const VERSIONED_NAME: &str = "libnvidia-ml.so.580.95.05";
/// Host path the fake node's container driver root stands for.
pub const DRIVER_INSTALL_DIR: &str = crate::root::DEFAULT_DRIVER_INSTALL_DIR;

/// The built mock NVML (`libmock_nvml.so`).
///
/// # Panics
/// When the build fails or cargo reports no cdylib: tests cannot run without it.
pub fn mock_library() -> &'static Path {
    static LIBRARY: OnceLock<PathBuf> = OnceLock::new();
    LIBRARY.get_or_init(|| match std::env::var_os(MOCK_LIBRARY_ENV) {
        Some(path) => PathBuf::from(path),
        None => build_mock().unwrap_or_else(|e| panic!("building mock-nvml: {e}")),
    })
}

/// The workspace of the running test: above the folder `cargo test` names as the crate's (a test
/// binary in a target shared by clones may have been built by another clone), else above this
/// crate's.
fn workspace_dir() -> PathBuf {
    let crate_dir = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    crate_dir
        .ancestors()
        .find(|dir| {
            std::fs::read_to_string(dir.join("Cargo.toml"))
                .is_ok_and(|toml| toml.contains("[workspace]"))
        })
        .unwrap_or(&crate_dir)
        .to_path_buf()
}

fn build_mock() -> Result<PathBuf, String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let manifest = workspace_dir().join("Cargo.toml");
    let output = Command::new(&cargo)
        .args([
            "build",
            "--quiet",
            "-p",
            "mock-nvml",
            "--message-format=json",
            "--manifest-path",
        ])
        .arg(&manifest)
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("running {}: {e}", Path::new(&cargo).display()))?;
    if !output.status.success() {
        return Err(format!(
            "cargo build -p mock-nvml exited with {}",
            output.status
        ));
    }
    cdylib_from_messages(&String::from_utf8_lossy(&output.stdout))
        .ok_or_else(|| "cargo reported no mock_nvml cdylib".to_owned())
}

/// The `.so` of the `mock_nvml` target in cargo's `--message-format=json` output.
fn cdylib_from_messages(stdout: &str) -> Option<PathBuf> {
    stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find_map(|msg| {
            if msg["reason"] != "compiler-artifact" || msg["target"]["name"] != "mock_nvml" {
                return None;
            }
            msg["filenames"]
                .as_array()?
                .iter()
                .filter_map(Value::as_str)
                .find(|f| f.ends_with(".so"))
                .map(PathBuf::from)
        })
}

/// A mock configuration: a shipped profile and a GPU count, no faults.
pub fn mock_config(profile: &str, gpu_count: u32) -> Value {
    json!({ "profile": profile, "gpu_count": gpu_count })
}

/// Installs the mock as `root`'s NVML (`usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1`, a symlink to
/// a versioned copy) configured by `config`; returns the versioned file.
pub fn install_driver(root: &Path, config: &Value) -> PathBuf {
    let dir = root.join(LIBRARY_DIR);
    std::fs::create_dir_all(&dir).expect("create library dir");
    let versioned = dir.join(VERSIONED_NAME);
    std::fs::copy(mock_library(), &versioned).expect("copy mock library");
    let link = dir.join(LIBRARY_NAME);
    // Reinstalling over an existing link is fine.
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(VERSIONED_NAME, &link).expect("link libnvidia-ml.so.1");
    configure(root, config);
    versioned
}

/// Driver version of the fake roots (the versioned file names and the firmware dir).
pub const DRIVER_VERSION: &str = "580.95.05";

/// How many of [`OPTIONAL_LIBRARIES`] (from the first) [`install_driver_files`] lays out.
pub const FAKE_OPTIONAL_LIBRARIES: usize = 6;

/// The libraries installed beside the mock NVML by [`install_driver_files`], each as
/// `<stem>.<version>` with a `<stem>.1` link to it: `libcuda.so` and the first
/// [`FAKE_OPTIONAL_LIBRARIES`] optional ones.
pub fn fake_libraries() -> impl Iterator<Item = &'static str> {
    std::iter::once("libcuda.so").chain(
        OPTIONAL_LIBRARIES[..FAKE_OPTIONAL_LIBRARIES]
            .iter()
            .copied(),
    )
}

fn put(path: &Path, bytes: &[u8]) {
    std::fs::create_dir_all(path.parent().expect("a parent")).expect("create dir");
    std::fs::write(path, bytes).expect("write stand-in");
}

fn relink(target: &str, link: &Path) {
    let _ = std::fs::remove_file(link);
    std::os::unix::fs::symlink(target, link).expect("create symlink");
}

/// Lays out the rest of a driver install in `root` next to the mock NVML, as a real one looks:
/// the libraries of [`fake_libraries`] (versioned file, `.so.1` link, and `libcuda.so` /
/// `libnvidia-ml.so` dev links), the binaries in `usr/bin`, firmware in
/// `lib/firmware/nvidia/<version>/`, and stand-ins for `/dev` and `/proc`: `dev/nvidiactl`,
/// `dev/nvidia-uvm`, `dev/nvidia-uvm-tools`, `dev/nvidia-modeset` and `dev/nvidia<minor>` for
/// each of `minors` are empty regular files (device nodes need privileges; discovery accepts
/// regular files in their place), `proc/devices` names the `nvidia-caps` major.
/// The library stand-ins are small text files, not ELF objects: nothing loads them.
pub fn install_driver_files(root: &Path, minors: impl IntoIterator<Item = u32>) {
    let lib = root.join(LIBRARY_DIR);
    for stem in fake_libraries() {
        let versioned = format!("{stem}.{DRIVER_VERSION}");
        put(
            &lib.join(&versioned),
            format!("stand-in for {versioned}\n").as_bytes(),
        );
        relink(&versioned, &lib.join(format!("{stem}.1")));
    }
    relink("libcuda.so.1", &lib.join("libcuda.so"));
    relink(LIBRARY_NAME, &lib.join("libnvidia-ml.so"));
    for bin in ["nvidia-smi", "nvidia-debugdump", "nvidia-persistenced"] {
        put(&root.join("usr/bin").join(bin), b"#!/bin/sh\nexit 0\n");
    }
    put(
        &root
            .join("lib/firmware/nvidia")
            .join(DRIVER_VERSION)
            .join("gsp_ga10x.bin"),
        b"firmware stand-in",
    );
    for node in [
        "nvidiactl",
        "nvidia-uvm",
        "nvidia-uvm-tools",
        "nvidia-modeset",
    ] {
        put(&root.join("dev").join(node), b"");
    }
    for minor in minors {
        put(&root.join(format!("dev/nvidia{minor}")), b"");
    }
    put(
        &root.join("proc/devices"),
        b"Character devices:\n  1 mem\n195 nvidia\n234 nvidia-caps\n\nBlock devices:\n  7 loop\n",
    );
}

/// Adds a MIG device's capability files to `root`'s `/proc` stand-in and its `nvidia-caps` nodes
/// (regular files) to `dev/`: GPU instance `gi` with `gi_minor`, compute instance `ci` with
/// `ci_minor`, on the GPU with minor `parent_minor`.
pub fn install_mig_caps(root: &Path, parent_minor: u32, gi: u32, ci: u32, minors: (u32, u32)) {
    let dir = root.join(format!(
        "proc/driver/nvidia/capabilities/gpu{parent_minor}/mig/gi{gi}"
    ));
    for (access, minor) in [
        (dir.join("access"), minors.0),
        (dir.join(format!("ci{ci}/access")), minors.1),
    ] {
        put(
            &access,
            format!("DeviceFileMinor: {minor}\nDeviceFileMode: 292\n").as_bytes(),
        );
        put(
            &root.join(format!("dev/nvidia-caps/nvidia-cap{minor}")),
            b"",
        );
    }
}

/// The `nvidia-caps` minors of GPU instance `gi` and its compute instance `ci` on the GPU with minor
/// `parent_minor`, laid out as the driver's `mig-minors` table numbers them: `config` 1, `monitor` 2,
/// then per GPU 15 GPU instances of 9 minors each (the instance's `access`, then 8 compute instances).
pub fn mig_cap_minors(parent_minor: u32, gi: u32, ci: u32) -> (u32, u32) {
    let gi_minor = 3 + parent_minor * 135 + gi * 9;
    (gi_minor, gi_minor + 1 + ci)
}

/// Installs, below `root`, the capability files of every MIG device of `inventory` (see
/// [`install_mig_caps`]), numbered by [`mig_cap_minors`]: what the driver shows a node's `/proc`.
pub fn install_inventory_mig_caps(root: &Path, inventory: &crate::Inventory) {
    for mig in inventory.gpus.iter().flat_map(|g| &g.mig_devices) {
        let (gi, ci) = (mig.gpu_instance_id, mig.compute_instance_id);
        install_mig_caps(
            root,
            mig.parent_minor,
            gi,
            ci,
            mig_cap_minors(mig.parent_minor, gi, ci),
        );
    }
}

/// Binds a Unix socket at `root`'s `run/nvidia-persistenced/socket` and leaves the file there.
///
/// # Panics
/// When the path is too long for a socket address or the bind fails.
pub fn install_persistenced_socket(root: &Path) {
    let path = root.join("run/nvidia-persistenced/socket");
    std::fs::create_dir_all(path.parent().expect("a parent")).expect("create run dir");
    let _ = std::fs::remove_file(&path);
    drop(std::os::unix::net::UnixListener::bind(&path).expect("bind socket stand-in"));
}

/// Replaces the mock configuration of the driver in `root`, atomically (a running mock re-reads
/// it, which is how faults are injected after init).
pub fn configure(root: &Path, config: &Value) {
    let path = root.join(LIBRARY_DIR).join("mock-nvml.json");
    replace(&path, config.to_string().as_bytes(), Durability::Durable).expect("write mock config");
}

/// A temp dir standing for a node: `host/` (the host's `/`) and `driver-root/` (a driver
/// container's root), both empty until a driver is installed.
#[derive(Debug)]
pub struct FakeNode {
    dir: TempDir,
}

impl FakeNode {
    /// An empty node.
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        for sub in ["host", "driver-root"] {
            std::fs::create_dir_all(dir.path().join(sub)).expect("create root");
        }
        Self { dir }
    }

    /// The host root as the validator container sees it.
    pub fn host_root(&self) -> PathBuf {
        self.dir.path().join("host")
    }

    /// The container driver root as the validator container sees it.
    pub fn driver_root(&self) -> PathBuf {
        self.dir.path().join("driver-root")
    }

    /// A status dir for `driver-ready`.
    pub fn status_dir(&self) -> PathBuf {
        self.dir.path().join("validations")
    }

    /// Probe settings pointing at this node's roots.
    pub fn settings(&self) -> ProbeSettings {
        ProbeSettings {
            host_root: self.host_root(),
            driver_install_dir: DRIVER_INSTALL_DIR.into(),
            driver_install_dir_ctr_path: self.driver_root(),
        }
    }

    /// Installs a host driver: the mock NVML and [`install_driver_files`] with a `/dev/nvidia<minor>`
    /// stand-in for each of the config's `gpu_count` GPUs (8 when it names none).
    pub fn install_host_driver(&self, config: &Value) -> PathBuf {
        let lib = install_driver(&self.host_root(), config);
        let gpus = config["gpu_count"]
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .unwrap_or(8);
        install_driver_files(&self.host_root(), 0..gpus);
        lib
    }

    /// Installs a container driver, with a `dev/` dir in its root when `with_dev`.
    pub fn install_container_driver(&self, config: &Value, with_dev: bool) -> PathBuf {
        if with_dev {
            std::fs::create_dir_all(self.driver_root().join("dev")).expect("create dev");
        }
        install_driver(&self.driver_root(), config)
    }
}

impl Default for FakeNode {
    fn default() -> Self {
        Self::new()
    }
}

/// An inventory of these GPUs under driver 580.95.05 (CUDA 13.0), nothing unreadable.
pub fn inventory(gpus: Vec<crate::Gpu>) -> crate::Inventory {
    crate::Inventory {
        driver_version: "580.95.05".into(),
        cuda_driver_version: crate::CudaVersion {
            major: 13,
            minor: 0,
        },
        gpus,
        unreadable: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cdylib_is_picked_from_cargo_messages() {
        let out = concat!(
            r#"{"reason":"compiler-artifact","target":{"name":"serde"},"filenames":["/t/libserde.rlib"]}"#,
            "\n",
            r#"{"reason":"compiler-artifact","target":{"name":"mock_nvml"},"filenames":["/t/debug/libmock_nvml.so"]}"#,
            "\n",
            r#"{"reason":"build-finished","success":true}"#
        );
        assert_eq!(
            cdylib_from_messages(out),
            Some(PathBuf::from("/t/debug/libmock_nvml.so"))
        );
        assert_eq!(cdylib_from_messages("not json\n"), None);
    }
}
