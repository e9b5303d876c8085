//! CDI specs for prepared claims: one transient spec file per claim in the CDI root, with one
//! CDI device per allocated device.
//!
//! Built on [`node_agent::cdi`] (the driver's files, control nodes and each device's nodes, the
//! same edits the device plugin writes): a claim's spec adds `NVIDIA_VISIBLE_DEVICES`, per device
//! its UUID (and MIG profile) in the environment, for a share of a GPU the sharing strategy and
//! the per-GPU MPS daemon's pipe directory, and for a claim with its own MPS control daemon that
//! daemon's directories and limits. [`CdiWriter`] does the I/O and refuses a claim whose driver
//! files, MIG capabilities or MPS daemon are missing.

use crate::devices::{DeviceKind, NodeDevice, ShareUse};
use crate::mps::{self, MpsDaemon};
use crate::opaque::Strategy;
use api::contract::cdi::{CLASS, VENDOR};
use api::contract::paths;
use gpu_discovery::DriverPaths;
pub use node_agent::cdi::{
    ContainerEdits, Device, DeviceNode, DriverView, MOUNT_OPTIONS, Mount, Spec, SpecWriter,
    device_edits, driver_edits, min_version, missing_for, rw_mount, spec,
};
use std::io;
use std::path::{Path, PathBuf};

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

/// The spec of a claim: per device its [`device_edits`] and env vars naming its UUID (and MIG
/// profile); for the whole claim the [`driver_edits`], `NVIDIA_VISIBLE_DEVICES` listing every
/// device's UUID and, for a claim with its own MPS control daemon, [`mps_edits`].
pub fn claim_spec(
    claim_uid: &str,
    devices: &[&NodeDevice],
    driver: &DriverView,
    mps_root: &Path,
    mps: Option<&MpsDaemon>,
) -> Spec {
    let cdi_devices = devices
        .iter()
        .map(|d| {
            let mut edits = device_edits(d, driver);
            edits.env.push(format!(
                "NVIDIA_DRA_DEVICE_UUID_{}={}",
                env_key(&d.name),
                d.uuid
            ));
            if let DeviceKind::Mig(m) = &d.kind {
                edits.env.push(format!(
                    "NVIDIA_DRA_MIG_PROFILE_{}={}",
                    env_key(&d.name),
                    m.profile
                ));
            }
            if let DeviceKind::Share(share) = &d.kind {
                share_edits(d, share, mps_root, &mut edits);
            }
            Device {
                name: device_name(claim_uid, &d.name),
                container_edits: edits,
            }
        })
        .collect();
    let uuids: Vec<&str> = devices.iter().map(|d| d.uuid.as_str()).collect();
    let mut edits = driver_edits(driver);
    edits.env = vec![format!("NVIDIA_VISIBLE_DEVICES={}", uuids.join(","))];
    if let Some(daemon) = mps {
        mps_edits(claim_uid, daemon, mps_root, &mut edits);
    }
    spec(format!("{VENDOR}/{CLASS}"), cdi_devices, edits)
}

/// What a claim's own MPS control daemon adds to its containers: its pipe and log directories
/// and its limits in their environment.
fn mps_edits(claim_uid: &str, daemon: &MpsDaemon, mps_root: &Path, edits: &mut ContainerEdits) {
    edits.env.push(format!(
        "CUDA_MPS_PIPE_DIRECTORY={}",
        paths::MPS_PIPE_CTR_PATH
    ));
    edits
        .env
        .push(format!("CUDA_MPS_LOG_DIRECTORY={}", mps::LOG_CTR_PATH));
    edits.env.extend(
        daemon
            .limits_env()
            .into_iter()
            .map(|(name, value)| format!("{name}={value}")),
    );
    for (host, inside) in mps::container_dirs(mps_root, claim_uid) {
        edits.mounts.push(rw_mount(&host, inside));
    }
}

/// What a share adds: `NVIDIA_DRA_SHARING_<device>` naming the strategy and, for MPS, the
/// daemon's pipe directory (`<mps root>/<GPU UUID>` at [`paths::MPS_PIPE_CTR_PATH`]) with the
/// share's part of the card as the client's limits: the active thread percentage and the
/// pinned device memory.
fn share_edits(device: &NodeDevice, share: &ShareUse, mps_root: &Path, edits: &mut ContainerEdits) {
    let strategy = match share.strategy {
        Strategy::TimeSlicing => "TimeSlicing",
        Strategy::Mps => "MPS",
    };
    edits.env.push(format!(
        "NVIDIA_DRA_SHARING_{}={strategy}",
        env_key(&device.name)
    ));
    if share.strategy != Strategy::Mps {
        return;
    }
    edits.env.push(format!(
        "CUDA_MPS_PIPE_DIRECTORY={}",
        paths::MPS_PIPE_CTR_PATH
    ));
    if let (Some(part), Some(card)) = (share.part_bytes, share.card_bytes.filter(|c| *c > 0)) {
        let percent = (u128::from(part) * 100 / u128::from(card)).clamp(1, 100);
        edits
            .env
            .push(format!("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={percent}"));
    }
    if let Some(part) = share.part_bytes {
        edits.env.push(format!(
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0={}M",
            part >> 20
        ));
    }
    edits.mounts.push(rw_mount(
        &mps_pipe_dir(mps_root, &device.gpu.gpu_uuid),
        paths::MPS_PIPE_CTR_PATH,
    ));
}

/// The pipe directory of a GPU's MPS control daemon.
pub fn mps_pipe_dir(mps_root: &Path, gpu_uuid: &str) -> PathBuf {
    mps_root.join(gpu_uuid)
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

/// Why a claim's spec was not written.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// The driver's files are missing, or writing failed.
    #[error(transparent)]
    Driver(#[from] node_agent::cdi::WriteError),
    /// A share with strategy MPS on a GPU whose MPS control daemon is not running.
    #[error("no MPS control daemon for GPU {gpu}: its pipe directory {} does not exist; start one per shared GPU with `CUDA_MPS_PIPE_DIRECTORY={} nvidia-cuda-mps-control -d` (docs/gpu-classes.md), or share with strategy TimeSlicing", .dir.display(), .dir.display())]
    NoMpsDaemon {
        /// The GPU's UUID.
        gpu: String,
        /// The pipe directory looked for.
        dir: PathBuf,
    },
}

impl From<io::Error> for WriteError {
    fn from(e: io::Error) -> Self {
        Self::Driver(e.into())
    }
}

/// Writes and removes claim specs in a CDI root.
#[derive(Debug, Clone)]
pub struct CdiWriter {
    specs: SpecWriter,
    mps_root: PathBuf,
}

impl CdiWriter {
    /// Specs go to `root`; the driver's files are looked up in `roots`, MIG capabilities in the
    /// `proc/` of `/`.
    pub fn new(root: &Path, roots: &DriverPaths) -> Self {
        Self {
            specs: SpecWriter::new(root, roots),
            mps_root: PathBuf::from(paths::MPS_ROOT),
        }
    }

    /// Looks for the MPS control daemons' pipe directories below `mps_root` (the same path on
    /// the host and here) instead of [`paths::MPS_ROOT`].
    pub fn with_mps_root(mut self, mps_root: &Path) -> Self {
        self.mps_root = mps_root.to_path_buf();
        self
    }

    /// Reads MIG capabilities (`proc/devices`, `proc/driver/nvidia/capabilities`) below
    /// `procfs_root` instead of `/`.
    pub fn with_procfs_root(mut self, procfs_root: &Path) -> Self {
        self.specs = self.specs.with_procfs_root(procfs_root);
        self
    }

    /// The host directory of the MPS control daemons.
    pub fn mps_root(&self) -> &Path {
        &self.mps_root
    }

    /// The spec file of a claim.
    pub fn path(&self, claim_uid: &str) -> PathBuf {
        self.specs.path(&file_name(claim_uid))
    }

    /// Looks the driver up for `devices`: its view, or what is missing (driver files, MIG
    /// capabilities, the MPS control daemon of a GPU shared with strategy MPS).
    pub fn driver_view(&self, devices: &[&NodeDevice]) -> Result<DriverView, WriteError> {
        let view = self.specs.driver_view(devices)?;
        for device in devices {
            if let DeviceKind::Share(ShareUse {
                strategy: Strategy::Mps,
                ..
            }) = device.kind
            {
                let dir = mps_pipe_dir(&self.mps_root, &device.gpu.gpu_uuid);
                if !dir.is_dir() {
                    return Err(WriteError::NoMpsDaemon {
                        gpu: device.gpu.gpu_uuid.clone(),
                        dir,
                    });
                }
            }
        }
        Ok(view)
    }

    /// How many times the driver root was walked (discovered) so far.
    pub fn discoveries(&self) -> usize {
        self.specs.discoveries()
    }

    /// Writes a claim's spec atomically and returns its path. No fsync: a spec only matters
    /// within this boot (after a reboot the checkpoint is discarded and claims are prepared
    /// again), and the rename alone keeps readers and a crashed plugin from a partial file.
    pub fn write(
        &self,
        claim_uid: &str,
        devices: &[&NodeDevice],
        mps: Option<&MpsDaemon>,
    ) -> Result<PathBuf, WriteError> {
        let driver = self.driver_view(devices)?;
        Ok(self.specs.write_spec(
            &file_name(claim_uid),
            &claim_spec(claim_uid, devices, &driver, &self.mps_root, mps),
        )?)
    }

    /// The UIDs of the claims that have a spec in the CDI root. Temp files that a killed write
    /// left behind are removed on the way.
    pub fn claim_uids(&self) -> io::Result<Vec<String>> {
        let prefix = file_name("");
        self.specs.spec_files(prefix.trim_end_matches(".yaml"))
    }

    /// Removes a claim's spec; a missing file is fine.
    pub fn remove(&self, claim_uid: &str) -> io::Result<()> {
        self.specs.remove_spec(&file_name(claim_uid))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{self, gpu};
    use gpu_discovery::driver_files::DriverFiles;
    use std::collections::BTreeMap;

    #[test]
    fn names_follow_the_contract() {
        assert_eq!(
            device_id("u1", "gpu-0"),
            "k8s.gpu.nvidia.com/claim=u1-gpu-0"
        );
        assert_eq!(file_name("u1"), "k8s.gpu.nvidia.com-claim_u1.yaml");
    }

    fn mig_device() -> NodeDevice {
        let mut mig = gpu(1);
        mig.name = "gpu-1-mig-1g5gb-19-6".into();
        mig.uuid = "MIG-1".into();
        mig.kind = DeviceKind::Mig(gpu_discovery::MigDevice {
            parent_uuid: "GPU-1".into(),
            parent_minor: 1,
            ..testutil::mig("1g.5gb", 4864)
        });
        mig
    }

    /// Every `hostPath` in a written spec, from its YAML.
    fn host_paths(yaml: &str) -> Vec<PathBuf> {
        let value: serde_yaml::Value = serde_yaml::from_str(yaml).unwrap();
        let mut out = Vec::new();
        let mut stack = vec![&value];
        while let Some(v) = stack.pop() {
            match v {
                serde_yaml::Value::Mapping(m) => {
                    for (k, v) in m {
                        match (k.as_str(), v.as_str()) {
                            (Some("hostPath"), Some(p)) => out.push(PathBuf::from(p)),
                            _ => stack.push(v),
                        }
                    }
                }
                serde_yaml::Value::Sequence(s) => stack.extend(s),
                _ => {}
            }
        }
        out
    }

    /// Writes the spec of `devices` over the fake driver root, checks every host path in it
    /// exists there, and snapshots it with the temp dir written as `<root>`.
    fn spec_over_fixture(name: &str, devices: &[&NodeDevice]) {
        let dir = tempfile::tempdir().unwrap();
        let roots = testutil::driver_roots(dir.path(), 2);
        gpu_discovery::testing::install_persistenced_socket(&roots.driver_root);
        gpu_discovery::testing::install_mig_caps(&roots.driver_root, 1, 13, 0, (120, 121));
        let writer =
            CdiWriter::new(&dir.path().join("cdi"), &roots).with_procfs_root(&roots.driver_root);
        let yaml = std::fs::read_to_string(writer.write("u1", devices, None).unwrap()).unwrap();
        let paths = host_paths(&yaml);
        assert!(paths.len() > 20, "{yaml}");
        for path in &paths {
            assert!(
                std::fs::symlink_metadata(path).is_ok(),
                "{} is in the spec but not in the fixture",
                path.display()
            );
        }
        let root = roots.driver_root.to_string_lossy().into_owned();
        insta::assert_snapshot!(name, yaml.replace(&root, "<root>"));
    }

    #[test]
    fn the_spec_of_a_full_gpu() {
        spec_over_fixture("full_gpu", &[&gpu(0)]);
    }

    #[test]
    fn the_spec_of_two_gpus() {
        spec_over_fixture("two_gpus", &[&gpu(0), &gpu(1)]);
    }

    #[test]
    fn the_spec_of_a_mig_device() {
        spec_over_fixture("mig_device", &[&mig_device()]);
    }

    #[test]
    fn the_version_is_the_lowest_covering_the_fields() {
        let driver = DriverView {
            files: DriverFiles::default(),
            control_nodes: Vec::new(),
            driver_root: "/".into(),
            dev_root: "/".into(),
            mig_caps: BTreeMap::new(),
        };
        let mut spec = claim_spec("u1", &[&gpu(0)], &driver, Path::new(paths::MPS_ROOT), None);
        assert_eq!(spec.cdi_version, "0.5.0");
        spec.devices[0].container_edits.device_nodes[0].host_path = String::new();
        assert_eq!(min_version(&spec), "0.3.0");
    }

    #[test]
    fn missing_required_files_are_listed_with_where_they_were_looked_for() {
        let dir = tempfile::tempdir().unwrap();
        let roots = testutil::driver_roots(dir.path(), 1);
        let lib = roots.driver_root.join(gpu_discovery::testing::LIBRARY_DIR);
        for name in ["libcuda.so", "libcuda.so.1", "libcuda.so.580.95.05"] {
            std::fs::remove_file(lib.join(name)).unwrap();
        }
        let writer = CdiWriter::new(&dir.path().join("cdi"), &roots);
        let err = writer.write("u1", &[&gpu(0), &gpu(1)], None).unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with(
                "required driver files are missing: libcuda.so (looked at /libcuda.so.*, /usr/lib64/libcuda.so.*,"
            ),
            "{text}"
        );
        assert!(
            text.contains("; /dev/nvidia1 (looked at /dev/nvidia1)"),
            "{text}"
        );
        assert!(!text.contains("/dev/nvidia0"), "{text}");
        assert!(
            text.contains(&roots.driver_root.display().to_string()),
            "{text}"
        );
        assert!(!writer.path("u1").exists());
    }

    #[test]
    fn a_mig_device_gets_its_instances_caps_nodes() {
        let dir = tempfile::tempdir().unwrap();
        let roots = testutil::driver_roots(dir.path(), 2);
        gpu_discovery::testing::install_mig_caps(&roots.driver_root, 1, 13, 0, (120, 121));
        let writer =
            CdiWriter::new(&dir.path().join("cdi"), &roots).with_procfs_root(&roots.driver_root);
        let view = writer.driver_view(&[&mig_device(), &gpu(0)]).unwrap();
        let spec = claim_spec(
            "u1",
            &[&mig_device(), &gpu(0)],
            &view,
            writer.mps_root(),
            None,
        );
        let nodes = &spec.devices[0].container_edits.device_nodes;
        let caps: Vec<_> = nodes[1..]
            .iter()
            .map(|n| {
                (
                    n.path.as_str(),
                    n.kind.as_deref(),
                    n.major,
                    n.minor,
                    n.file_mode,
                )
            })
            .collect();
        assert_eq!(
            caps,
            [
                (
                    "/dev/nvidia-caps/nvidia-cap120",
                    Some("c"),
                    Some(234),
                    Some(120),
                    Some(292)
                ),
                (
                    "/dev/nvidia-caps/nvidia-cap121",
                    Some("c"),
                    Some(234),
                    Some(121),
                    Some(292)
                ),
            ]
        );
        assert_eq!(nodes[0].path, "/dev/nvidia1");
        assert_eq!(spec.devices[1].container_edits.device_nodes.len(), 1);
    }

    #[test]
    fn a_mig_device_without_caps_in_proc_is_refused_naming_the_files() {
        let dir = tempfile::tempdir().unwrap();
        let roots = testutil::driver_roots(dir.path(), 2);
        let writer =
            CdiWriter::new(&dir.path().join("cdi"), &roots).with_procfs_root(&roots.driver_root);
        let text = writer
            .write("u1", &[&mig_device()], None)
            .unwrap_err()
            .to_string();
        assert!(
            text.contains("/proc/driver/nvidia/capabilities/gpu1/mig/gi13/access (looked at"),
            "{text}"
        );
        assert!(!writer.path("u1").exists());
    }

    #[test]
    fn the_driver_root_is_walked_once_until_a_library_comes_or_goes() {
        let dir = tempfile::tempdir().unwrap();
        let roots = testutil::driver_roots(dir.path(), 2);
        let lib = roots.driver_root.join(gpu_discovery::testing::LIBRARY_DIR);
        let cuda = ["libcuda.so", "libcuda.so.1", "libcuda.so.580.95.05"];
        let saved = dir.path().join("saved");
        std::fs::create_dir_all(&saved).unwrap();
        for name in cuda {
            std::fs::rename(lib.join(name), saved.join(name)).unwrap();
        }
        let writer = CdiWriter::new(&dir.path().join("cdi"), &roots);
        // Refused while libcuda is missing, however often asked, with one walk.
        for uid in ["u1", "u2"] {
            assert!(writer.write(uid, &[&gpu(0)], None).is_err());
        }
        assert_eq!(writer.discoveries(), 1);
        // The driver's libcuda arrives: the next claim sees it.
        for name in cuda {
            std::fs::rename(saved.join(name), lib.join(name)).unwrap();
        }
        let spec = std::fs::read_to_string(writer.write("u3", &[&gpu(0)], None).unwrap()).unwrap();
        assert!(spec.contains("libcuda.so.580.95.05"), "{spec}");
        assert_eq!(writer.discoveries(), 2);
        // Claims on other devices and clones of the writer reuse that walk.
        let clone = writer.clone();
        for (uid, minor) in [("u4", 1), ("u5", 0)] {
            clone.write(uid, &[&gpu(minor)], None).unwrap();
        }
        assert_eq!(writer.discoveries(), 2);
    }

    #[test]
    fn write_and_remove_are_idempotent() {
        let dir = tempfile::tempdir().unwrap();
        let writer = CdiWriter::new(
            &dir.path().join("cdi"),
            &testutil::driver_roots(dir.path(), 1),
        );
        let path = writer.write("u1", &[&gpu(0)], None).unwrap();
        assert!(path.exists());
        writer.remove("u1").unwrap();
        assert!(!path.exists());
        writer.remove("u1").unwrap();
    }
}
