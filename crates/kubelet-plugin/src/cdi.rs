//! CDI specs for prepared claims: one transient spec file per claim in the CDI root, with one
//! CDI device per allocated device.
//!
//! The spec-level edits carry what every GPU container needs once: the control device nodes, the
//! driver's libraries, binaries, firmware and IPC sockets as read-only bind mounts (found by
//! [`gpu_discovery::driver_files`] under the driver root and rewritten to host paths), and
//! `NVIDIA_VISIBLE_DEVICES`. Each device adds its `/dev/nvidia<minor>` node; a MIG device also adds
//! the `nvidia-caps` character devices of its GPU and compute instance, with the major and minor the
//! kernel gives them in `/proc` (so the runtime creates them even where the host has no such node).
//! The spec is built by a pure function from a [`DriverView`]; [`CdiWriter`] does the I/O and refuses
//! a claim whose required driver files or MIG capabilities are missing.

use crate::devices::{DeviceKind, NodeDevice, ShareUse};
use crate::mps::{self, MpsDaemon};
use crate::opaque::Strategy;
use api::contract::cdi::{CLASS, VENDOR};
use api::contract::paths;
use gpu_discovery::DriverPaths;
use gpu_discovery::atomic::{Durability, replace};
use gpu_discovery::driver_files::{self, CapNode, DriverFiles, Missing, RootTree, Stamp};
use serde::Serialize;
use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Options of every bind mount the spec carries.
pub const MOUNT_OPTIONS: [&str; 4] = ["ro", "nosuid", "nodev", "bind"];

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
    /// Bind mounts.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
}

/// A bind mount: `hostPath` on the host at `containerPath` in the container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Mount {
    /// Path on the host.
    pub host_path: String,
    /// Path in the container.
    pub container_path: String,
    /// Mount options.
    pub options: Vec<String>,
}

/// A device node: `path` in the container, and either `hostPath` on the host or the character
/// device's numbers.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceNode {
    /// Path in the container.
    pub path: String,
    /// Path on the host; empty when the numbers below say what to create.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub host_path: String,
    /// `c` for a character device given by its numbers.
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Major number.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub major: Option<u32>,
    /// Minor number.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub minor: Option<u32>,
    /// File mode of the node in the container.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file_mode: Option<u32>,
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

/// The driver as a spec sees it: what was found, as paths inside the roots, and the host paths of
/// the driver root and the dev root they are rewritten to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverView {
    /// Libraries, binaries, firmware and IPC paths inside the driver root.
    pub files: DriverFiles,
    /// Control nodes present, inside the dev root.
    pub control_nodes: Vec<PathBuf>,
    /// The driver root on the host.
    pub driver_root: PathBuf,
    /// The dev root on the host.
    pub dev_root: PathBuf,
    /// The `nvidia-caps` nodes of each MIG device, by device name.
    pub mig_caps: BTreeMap<String, Vec<CapNode>>,
    /// The host directory of the per-GPU MPS control daemons ([`paths::MPS_ROOT`]).
    pub mps_root: PathBuf,
}

fn text(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

fn node(path: &Path, dev_root: &Path) -> DeviceNode {
    DeviceNode {
        path: text(path),
        host_path: text(&driver_files::host_path(dev_root, path)),
        ..DeviceNode::default()
    }
}

fn cap_node(cap: &CapNode) -> DeviceNode {
    DeviceNode {
        path: text(&cap.path),
        kind: Some("c".to_owned()),
        major: Some(cap.major),
        minor: Some(cap.minor),
        file_mode: cap.mode,
        ..DeviceNode::default()
    }
}

fn mount(inside: &Path, root: &Path) -> Mount {
    Mount {
        host_path: text(&driver_files::host_path(root, inside)),
        container_path: text(inside),
        options: MOUNT_OPTIONS.iter().map(|o| (*o).to_owned()).collect(),
    }
}

/// The mounts of the driver's files: each library's file at its own path and at each link to
/// it (so `libcuda.so.1` is there without a hook), the binaries' files at their lookup paths,
/// the firmware dir and the IPC paths.
fn driver_mounts(driver: &DriverView) -> Vec<Mount> {
    let files = &driver.files;
    let libraries = files.libraries.iter().flat_map(|lib| {
        std::iter::once(mount(&lib.file, &driver.driver_root)).chain(lib.links.iter().map(
            |(link, _)| Mount {
                container_path: text(link),
                ..mount(&lib.file, &driver.driver_root)
            },
        ))
    });
    let binaries = files.binaries.iter().map(|b| Mount {
        container_path: text(&b.path),
        ..mount(&b.file, &driver.driver_root)
    });
    let others = files
        .firmware
        .iter()
        .chain(&files.ipc)
        .map(|p| mount(p, &driver.driver_root));
    libraries.chain(binaries).chain(others).collect()
}

/// The lowest `cdiVersion` that covers the fields `spec` uses: `hostPath` on a device node needs
/// 0.5.0; mounts, env and device nodes without it are in 0.3.0, the earliest accepted.
pub fn min_version(spec: &Spec) -> &'static str {
    let edits = std::iter::once(&spec.container_edits)
        .chain(spec.devices.iter().map(|d| &d.container_edits));
    let host_paths = edits
        .flat_map(|e| &e.device_nodes)
        .any(|n| !n.host_path.is_empty());
    if host_paths { "0.5.0" } else { "0.3.0" }
}

/// What one device adds to a container: its `/dev/nvidia<minor>` node (the parent GPU's for a
/// MIG device) and, for a MIG device, its `nvidia-caps` nodes.
pub fn device_edits(device: &NodeDevice, driver: &DriverView) -> ContainerEdits {
    let gpu_node = PathBuf::from(format!("/dev/nvidia{}", device.gpu.minor));
    let caps = driver.mig_caps.get(&device.name).into_iter().flatten();
    ContainerEdits {
        device_nodes: std::iter::once(node(&gpu_node, &driver.dev_root))
            .chain(caps.map(cap_node))
            .collect(),
        ..ContainerEdits::default()
    }
}

/// What every GPU container needs once: the control nodes and the driver's files as read-only
/// bind mounts.
pub fn driver_edits(driver: &DriverView) -> ContainerEdits {
    ContainerEdits {
        env: Vec::new(),
        device_nodes: driver
            .control_nodes
            .iter()
            .map(|p| node(p, &driver.dev_root))
            .collect(),
        mounts: driver_mounts(driver),
    }
}

/// A spec of `kind` from its devices and spec-level edits, with the lowest `cdiVersion` that
/// covers them.
pub fn spec(kind: String, devices: Vec<Device>, container_edits: ContainerEdits) -> Spec {
    let mut spec = Spec {
        cdi_version: String::new(),
        kind,
        devices,
        container_edits,
    };
    spec.cdi_version = min_version(&spec).to_owned();
    spec
}

/// The spec of a claim: per device its [`device_edits`] and env vars naming its UUID (and MIG
/// profile); for the whole claim the [`driver_edits`], `NVIDIA_VISIBLE_DEVICES` listing every
/// device's UUID and, for a claim with its own MPS control daemon, [`mps_edits`].
pub fn claim_spec(
    claim_uid: &str,
    devices: &[&NodeDevice],
    driver: &DriverView,
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
                share_edits(d, share, driver, &mut edits);
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
        mps_edits(claim_uid, daemon, driver, &mut edits);
    }
    spec(format!("{VENDOR}/{CLASS}"), cdi_devices, edits)
}

/// What a claim's own MPS control daemon adds to its containers: its pipe and log directories
/// and its limits in their environment.
fn mps_edits(claim_uid: &str, daemon: &MpsDaemon, driver: &DriverView, edits: &mut ContainerEdits) {
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
    for (host, inside) in mps::container_dirs(&driver.mps_root, claim_uid) {
        edits.mounts.push(Mount {
            host_path: text(&host),
            container_path: inside.to_owned(),
            options: ["rw", "nosuid", "nodev", "bind"]
                .map(str::to_owned)
                .to_vec(),
        });
    }
}

/// What a share adds: `NVIDIA_DRA_SHARING_<device>` naming the strategy and, for MPS, the
/// daemon's pipe directory (`<mps root>/<GPU UUID>` at [`paths::MPS_PIPE_CTR_PATH`]) with the
/// share's part of the card as the client's limits: the active thread percentage and the
/// pinned device memory.
fn share_edits(
    device: &NodeDevice,
    share: &ShareUse,
    driver: &DriverView,
    edits: &mut ContainerEdits,
) {
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
    edits.mounts.push(Mount {
        host_path: text(&mps_pipe_dir(&driver.mps_root, &device.gpu.gpu_uuid)),
        container_path: paths::MPS_PIPE_CTR_PATH.to_owned(),
        options: ["rw", "nosuid", "nodev", "bind"]
            .map(str::to_owned)
            .to_vec(),
    });
}

/// The pipe directory of a GPU's MPS control daemon.
pub fn mps_pipe_dir(mps_root: &Path, gpu_uuid: &str) -> PathBuf {
    mps_root.join(gpu_uuid)
}

/// The required items missing for `devices`: `libnvidia-ml`, `libcuda` and each device's
/// `/dev/nvidia<minor>`.
pub fn missing_for(
    files: &DriverFiles,
    dev: &dyn driver_files::Tree,
    devices: &[&NodeDevice],
) -> Vec<Missing> {
    let mut missing = files.missing.clone();
    let mut minors: Vec<u32> = devices.iter().map(|d| d.gpu.minor).collect();
    minors.sort_unstable();
    minors.dedup();
    missing.extend(
        minors
            .into_iter()
            .filter_map(|m| driver_files::gpu_node(dev, m).err()),
    );
    missing
}

/// The `nvidia-caps` nodes of each MIG device among `devices`, read from `proc`; or what is
/// missing for those that have none.
fn mig_caps_for(
    proc: &dyn driver_files::Tree,
    devices: &[&NodeDevice],
) -> (BTreeMap<String, Vec<CapNode>>, Vec<Missing>) {
    let mut caps = BTreeMap::new();
    let mut missing = Vec::new();
    for d in devices {
        let DeviceKind::Mig(m) = &d.kind else {
            continue;
        };
        match driver_files::mig_caps(
            proc,
            m.parent_minor,
            m.gpu_instance_id,
            m.compute_instance_id,
        ) {
            Ok(nodes) => {
                caps.insert(d.name.clone(), nodes);
            }
            Err(e) => missing.push(e),
        }
    }
    (caps, missing)
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
    /// Required driver files are missing.
    #[error("required driver files are missing: {}; searched driver root {} (host {}) and dev root {} (host {})", .missing.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "), .roots.driver_root_ctr.display(), .roots.driver_root.display(), .roots.dev_root_ctr.display(), .roots.dev_root.display())]
    Missing {
        /// What is missing, with the paths looked at inside the roots.
        missing: Vec<Missing>,
        /// The roots searched.
        roots: DriverPaths,
    },
    /// A share with strategy MPS on a GPU whose MPS control daemon is not running.
    #[error("no MPS control daemon for GPU {gpu}: its pipe directory {} does not exist; start one per shared GPU with `CUDA_MPS_PIPE_DIRECTORY={} nvidia-cuda-mps-control -d` (docs/gpu-classes.md), or share with strategy TimeSlicing", .dir.display(), .dir.display())]
    NoMpsDaemon {
        /// The GPU's UUID.
        gpu: String,
        /// The pipe directory looked for.
        dir: PathBuf,
    },
    /// Writing failed.
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// Writes and removes claim specs in a CDI root.
#[derive(Debug, Clone)]
pub struct CdiWriter {
    root: PathBuf,
    roots: DriverPaths,
    procfs_root: PathBuf,
    mps_root: PathBuf,
    /// The driver's files and control nodes as last discovered, shared by the clones.
    discovered: Arc<Mutex<Discovered>>,
}

/// The last discovery of the driver's files, with the stamp it was made under.
#[derive(Debug, Default)]
struct Discovered {
    last: Option<(Stamp, DriverFiles, Vec<PathBuf>)>,
    /// How many discoveries ran (walks of the driver root).
    count: usize,
}

impl CdiWriter {
    /// Specs go to `root`; the driver's files are looked up in `roots`, MIG capabilities in the
    /// `proc/` of `/`.
    pub fn new(root: &Path, roots: &DriverPaths) -> Self {
        Self {
            root: root.to_path_buf(),
            roots: roots.clone(),
            procfs_root: PathBuf::from("/"),
            mps_root: PathBuf::from(paths::MPS_ROOT),
            discovered: Arc::default(),
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
        self.procfs_root = procfs_root.to_path_buf();
        self
    }

    /// The spec file of a claim.
    pub fn path(&self, claim_uid: &str) -> PathBuf {
        self.root.join(file_name(claim_uid))
    }

    /// Looks the driver up for `devices`: its view, or what is missing.
    pub fn driver_view(&self, devices: &[&NodeDevice]) -> Result<DriverView, WriteError> {
        let dev = RootTree::new(&self.roots.dev_root_ctr);
        let (files, control_nodes) = self.driver_files(&dev);
        let (mig_caps, missing_caps) = mig_caps_for(&RootTree::new(&self.procfs_root), devices);
        let mut missing = missing_for(&files, &dev, devices);
        missing.extend(missing_caps);
        if !missing.is_empty() {
            return Err(WriteError::Missing {
                missing,
                roots: self.roots.clone(),
            });
        }
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
        Ok(DriverView {
            files,
            control_nodes,
            driver_root: self.roots.driver_root.clone(),
            dev_root: self.roots.dev_root.clone(),
            mig_caps,
            mps_root: self.mps_root.clone(),
        })
    }

    /// The driver's files and control nodes: discovered again only when a directory they are
    /// looked up in changed since the last discovery (see [`Stamp`]), so a claim costs a few
    /// `stat`s, not a walk of the driver root, and a driver upgrade is still seen at once.
    fn driver_files(&self, dev: &RootTree) -> (DriverFiles, Vec<PathBuf>) {
        let driver = RootTree::new(&self.roots.driver_root_ctr);
        let stamp = Stamp::of(&driver, dev);
        let mut discovered = self.discovered.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((last, files, nodes)) = &discovered.last
            && *last == stamp
        {
            return (files.clone(), nodes.clone());
        }
        let files = driver_files::discover(&driver);
        let nodes = driver_files::control_nodes(dev);
        discovered.last = Some((stamp, files.clone(), nodes.clone()));
        discovered.count += 1;
        (files, nodes)
    }

    /// How many times the driver root was walked (discovered) so far.
    pub fn discoveries(&self) -> usize {
        self.discovered
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .count
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
        Ok(self.write_spec(
            &file_name(claim_uid),
            &claim_spec(claim_uid, devices, &driver, mps),
        )?)
    }

    /// Writes `spec` as `file` in the CDI root, atomically, and returns its path (no fsync: see
    /// [`CdiWriter::write`]).
    pub fn write_spec(&self, file: &str, spec: &Spec) -> io::Result<PathBuf> {
        std::fs::create_dir_all(&self.root)?;
        let yaml = serde_yaml::to_string(spec).map_err(io::Error::other)?;
        let path = self.root.join(file);
        replace(&path, yaml.as_bytes(), Durability::ProcessCrash)?;
        Ok(path)
    }

    /// The UIDs of the claims that have a spec in the CDI root. Temp files that a killed write
    /// left behind are removed on the way.
    pub fn claim_uids(&self) -> io::Result<Vec<String>> {
        let prefix = file_name("");
        let prefix = prefix.trim_end_matches(".yaml");
        let entries = match std::fs::read_dir(&self.root) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            entries => entries?,
        };
        let mut uids = Vec::new();
        for entry in entries {
            let name = entry?.file_name();
            let name = name.to_string_lossy();
            if let Some(uid) = name
                .strip_prefix(prefix)
                .and_then(|rest| rest.strip_suffix(".yaml"))
            {
                uids.push(uid.to_owned());
            } else if name.starts_with(&format!(".{prefix}")) && name.ends_with(".tmp") {
                remove_if_present(&self.root.join(&*name))?;
            }
        }
        uids.sort();
        Ok(uids)
    }

    /// Removes a claim's spec; a missing file is fine.
    pub fn remove(&self, claim_uid: &str) -> io::Result<()> {
        remove_if_present(&self.path(claim_uid))
    }
}

fn remove_if_present(path: &Path) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{self, gpu};

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
            mps_root: paths::MPS_ROOT.into(),
        };
        let mut spec = claim_spec("u1", &[&gpu(0)], &driver, None);
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
        let spec = claim_spec("u1", &[&mig_device(), &gpu(0)], &view, None);
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
