//! Fake nodes for tests: temp dirs laid out like a node's host root and container driver root,
//! with the mock NVML installed as the driver's `libnvidia-ml.so.1`.
//!
//! The mock library comes from `$MOCK_NVML_LIBRARY` when set, else from running
//! `cargo build -p mock-nvml` once per test process (with the `CARGO` that runs the tests, so the
//! same target dir, `CARGO_TARGET_DIR` included) and taking the cdylib path from cargo's JSON
//! messages. Each installed driver is a copy of that file, so every fake root loads its own
//! instance of the mock, configured by the `mock-nvml.json` beside it.

use crate::atomic::write_atomic;
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

fn build_mock() -> Result<PathBuf, String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.toml");
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

/// Replaces the mock configuration of the driver in `root`, atomically (a running mock re-reads
/// it, which is how faults are injected after init).
pub fn configure(root: &Path, config: &Value) {
    let path = root.join(LIBRARY_DIR).join("mock-nvml.json");
    write_atomic(&path, config.to_string().as_bytes()).expect("write mock config");
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

    /// Installs a host driver.
    pub fn install_host_driver(&self, config: &Value) -> PathBuf {
        install_driver(&self.host_root(), config)
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
