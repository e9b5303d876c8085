//! CDI specs for prepared claims: one transient spec file per claim in the CDI root, with one
//! CDI device per allocated device.
//!
//! For now a spec carries device nodes and environment; driver libraries and hooks are added by
//! the CDI work that follows. The spec is built by a pure function; [`CdiWriter`] does the I/O.

use crate::atomic::write_replace;
use crate::devices::{DeviceKind, NodeDevice};
use api::contract::cdi::{CLASS, VENDOR};
use serde::Serialize;
use std::io;
use std::path::{Path, PathBuf};

/// CDI version written: the lowest that allows `hostPath` on device nodes.
pub const CDI_VERSION: &str = "0.5.0";
/// Control device nodes injected with every claim when present on the host.
pub const CONTROL_NODES: [&str; 3] = ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"];

/// A CDI spec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    /// Spec format version.
    pub cdi_version: String,
    /// `<vendor>/<class>`.
    pub kind: String,
    /// Devices.
    pub devices: Vec<Device>,
    /// Edits applied with any device of the spec.
    pub container_edits: ContainerEdits,
}

/// A CDI device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    /// Name, unique per claim: `<claimUID>-<deviceName>`.
    pub name: String,
    /// Its edits.
    pub container_edits: ContainerEdits,
}

/// Container edits.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerEdits {
    /// `KEY=value` entries.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// Device nodes.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<DeviceNode>,
}

/// A device node: `path` in the container, `hostPath` on the host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceNode {
    /// Path in the container.
    pub path: String,
    /// Path on the host.
    pub host_path: String,
}

/// The CDI device name of `device` in `claim_uid`'s spec.
pub fn device_name(claim_uid: &str, device: &str) -> String {
    format!("{claim_uid}-{device}")
}

/// The fully qualified CDI ID the kubelet passes to the runtime.
pub fn device_id(claim_uid: &str, device: &str) -> String {
    format!("{VENDOR}/{CLASS}={}", device_name(claim_uid, device))
}

/// The spec file name of a claim.
pub fn file_name(claim_uid: &str) -> String {
    format!("{VENDOR}-{CLASS}_{claim_uid}.yaml")
}

fn node(path: &str, dev_root: &Path) -> DeviceNode {
    let relative = path.trim_start_matches('/');
    DeviceNode {
        path: path.to_owned(),
        host_path: dev_root.join(relative).to_string_lossy().into_owned(),
    }
}

/// The spec of a claim: per device its `/dev/nvidia<minor>` node (the parent GPU's for a MIG
/// device), and for the whole claim the present control nodes and `NVIDIA_VISIBLE_DEVICES`
/// listing every device's UUID. `dev_root` is the host root of the driver's device nodes.
pub fn claim_spec(
    claim_uid: &str,
    devices: &[&NodeDevice],
    dev_root: &Path,
    control_nodes: &[&str],
) -> Spec {
    let cdi_devices = devices
        .iter()
        .map(|d| {
            let mut env = vec![format!(
                "NVIDIA_DRA_DEVICE_UUID_{}={}",
                env_key(&d.name),
                d.uuid
            )];
            if let DeviceKind::Mig(m) = &d.kind {
                env.push(format!(
                    "NVIDIA_DRA_MIG_PROFILE_{}={}",
                    env_key(&d.name),
                    m.mig.profile
                ));
            }
            Device {
                name: device_name(claim_uid, &d.name),
                container_edits: ContainerEdits {
                    env,
                    device_nodes: vec![node(&format!("/dev/nvidia{}", d.gpu.minor), dev_root)],
                },
            }
        })
        .collect();
    let uuids: Vec<&str> = devices.iter().map(|d| d.uuid.as_str()).collect();
    Spec {
        cdi_version: CDI_VERSION.to_owned(),
        kind: format!("{VENDOR}/{CLASS}"),
        devices: cdi_devices,
        container_edits: ContainerEdits {
            env: vec![format!("NVIDIA_VISIBLE_DEVICES={}", uuids.join(","))],
            device_nodes: control_nodes.iter().map(|p| node(p, dev_root)).collect(),
        },
    }
}

/// An environment-variable-safe form of a device name (`gpu-0-mig-1g5gb-19-6` →
/// `GPU_0_MIG_1G5GB_19_6`).
fn env_key(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect()
}

/// Writes and removes claim specs in a CDI root.
#[derive(Debug, Clone)]
pub struct CdiWriter {
    root: PathBuf,
    dev_root: PathBuf,
}

impl CdiWriter {
    /// Specs go to `root`; device nodes live under `dev_root` on the host.
    pub fn new(root: &Path, dev_root: &Path) -> Self {
        Self {
            root: root.to_path_buf(),
            dev_root: dev_root.to_path_buf(),
        }
    }

    /// The spec file of a claim.
    pub fn path(&self, claim_uid: &str) -> PathBuf {
        self.root.join(file_name(claim_uid))
    }

    /// Writes a claim's spec atomically and returns its path. No fsync: a spec only matters
    /// within this boot (after a reboot the checkpoint is discarded and claims are prepared
    /// again), and the rename alone keeps readers and a crashed plugin from a partial file.
    pub fn write(&self, claim_uid: &str, devices: &[&NodeDevice]) -> io::Result<PathBuf> {
        std::fs::create_dir_all(&self.root)?;
        let present: Vec<&str> = CONTROL_NODES
            .into_iter()
            .filter(|p| self.dev_root.join(p.trim_start_matches('/')).exists())
            .collect();
        let spec = claim_spec(claim_uid, devices, &self.dev_root, &present);
        let yaml = serde_yaml::to_string(&spec).map_err(io::Error::other)?;
        let path = self.path(claim_uid);
        write_replace(&path, yaml.as_bytes())?;
        Ok(path)
    }

    /// Removes a claim's spec; a missing file is fine.
    pub fn remove(&self, claim_uid: &str) -> io::Result<()> {
        match std::fs::remove_file(self.path(claim_uid)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::MigInfo;
    use crate::testutil::{self, gpu};

    #[test]
    fn names_follow_the_contract() {
        assert_eq!(
            device_id("u1", "gpu-0"),
            "k8s.gpu.nvidia.com/claim=u1-gpu-0"
        );
        assert_eq!(file_name("u1"), "k8s.gpu.nvidia.com-claim_u1.yaml");
    }

    #[test]
    fn a_claim_spec_snapshot() {
        let mut mig = gpu(1);
        mig.name = "gpu-1-mig-1g5gb-19-6".into();
        mig.uuid = "MIG-1".into();
        mig.kind = DeviceKind::Mig(MigInfo {
            mig: testutil::mig("1g.5gb", 4864),
            start: 6,
            size: 1,
        });
        let spec = claim_spec(
            "u1",
            &[&gpu(0), &mig],
            Path::new("/run/nvidia/driver"),
            &["/dev/nvidiactl"],
        );
        insta::assert_yaml_snapshot!(spec);
    }

    #[test]
    fn write_and_remove_are_idempotent() {
        let dir = tempfile::tempdir().unwrap();
        let dev = dir.path().join("devroot");
        std::fs::create_dir_all(dev.join("dev")).unwrap();
        std::fs::write(dev.join("dev/nvidiactl"), b"").unwrap();
        let writer = CdiWriter::new(&dir.path().join("cdi"), &dev);
        let path = writer.write("u1", &[&gpu(0)]).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.contains("nvidiactl") && !text.contains("nvidia-uvm"),
            "{text}"
        );
        writer.remove("u1").unwrap();
        assert!(!path.exists());
        writer.remove("u1").unwrap();
    }
}
