//! CDI specs both planes write: the generic spec types, the edits every GPU container needs and
//! those of one device, and [`SpecWriter`], which finds the driver's files and writes a spec
//! file atomically.
//!
//! The spec-level edits carry what every GPU container needs once: the control device nodes, the
//! driver's libraries, binaries, firmware and IPC sockets as read-only bind mounts (found by
//! [`gpu_discovery::driver_files`] under the driver root and rewritten to host paths). Each device
//! adds its `/dev/nvidia<minor>` node; a MIG device also adds the `nvidia-caps` character devices of
//! its GPU and compute instance, with the major and minor the kernel gives them in `/proc` (so the
//! runtime creates them even where the host has no such node). Specs are built by pure functions
//! from a [`DriverView`]; [`SpecWriter`] does the I/O and refuses devices whose required driver
//! files or MIG capabilities are missing. What a plane adds (claim names, shares, MPS) stays with
//! the plane.

use crate::devices::{DeviceKind, NodeDevice};
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
}

/// A path as the spec writes it.
pub fn text(path: &Path) -> String {
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
pub fn mig_caps_for(
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

/// A read-write bind mount of `host` at `container_path`.
pub fn rw_mount(host: &Path, container_path: &str) -> Mount {
    Mount {
        host_path: text(host),
        container_path: container_path.to_owned(),
        options: ["rw", "nosuid", "nodev", "bind"]
            .map(str::to_owned)
            .to_vec(),
    }
}

/// Why a spec was not written.
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
    /// Writing failed.
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// Looks the driver up and writes and removes spec files in a CDI root.
#[derive(Debug, Clone)]
pub struct SpecWriter {
    root: PathBuf,
    roots: DriverPaths,
    procfs_root: PathBuf,
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

impl SpecWriter {
    /// Specs go to `root`; the driver's files are looked up in `roots`, MIG capabilities in the
    /// `proc/` of `/`.
    pub fn new(root: &Path, roots: &DriverPaths) -> Self {
        Self {
            root: root.to_path_buf(),
            roots: roots.clone(),
            procfs_root: PathBuf::from("/"),
            discovered: Arc::default(),
        }
    }

    /// Reads MIG capabilities (`proc/devices`, `proc/driver/nvidia/capabilities`) below
    /// `procfs_root` instead of `/`.
    pub fn with_procfs_root(mut self, procfs_root: &Path) -> Self {
        self.procfs_root = procfs_root.to_path_buf();
        self
    }

    /// The path of spec file `file`.
    pub fn path(&self, file: &str) -> PathBuf {
        self.root.join(file)
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
        Ok(DriverView {
            files,
            control_nodes,
            driver_root: self.roots.driver_root.clone(),
            dev_root: self.roots.dev_root.clone(),
            mig_caps,
        })
    }

    /// The driver's files and control nodes: discovered again only when a directory they are
    /// looked up in changed since the last discovery (see [`Stamp`]), so a spec costs a few
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

    /// Writes `spec` as `file` in the CDI root, atomically, and returns its path. No fsync: a
    /// spec only matters within this boot (it is written again at start), and the rename alone
    /// keeps readers and a crashed writer from a partial file.
    pub fn write_spec(&self, file: &str, spec: &Spec) -> io::Result<PathBuf> {
        std::fs::create_dir_all(&self.root)?;
        let yaml = serde_yaml::to_string(spec).map_err(io::Error::other)?;
        let path = self.root.join(file);
        replace(&path, yaml.as_bytes(), Durability::ProcessCrash)?;
        Ok(path)
    }

    /// The middle parts of the spec files named `<prefix><part>.yaml`, sorted. Temp files that a
    /// killed write of such a file left behind are removed on the way.
    pub fn spec_files(&self, prefix: &str) -> io::Result<Vec<String>> {
        let entries = match std::fs::read_dir(&self.root) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            entries => entries?,
        };
        let mut parts = Vec::new();
        for entry in entries {
            let name = entry?.file_name();
            let name = name.to_string_lossy();
            if let Some(part) = name
                .strip_prefix(prefix)
                .and_then(|rest| rest.strip_suffix(".yaml"))
            {
                parts.push(part.to_owned());
            } else if name.starts_with(&format!(".{prefix}")) && name.ends_with(".tmp") {
                self.remove_spec(&name)?;
            }
        }
        parts.sort();
        Ok(parts)
    }

    /// Removes spec file `file`; a missing file is fine.
    pub fn remove_spec(&self, file: &str) -> io::Result<()> {
        match std::fs::remove_file(self.path(file)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }
}
