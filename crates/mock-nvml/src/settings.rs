//! Settings an administrator changes on a GPU and the kernel driver keeps across processes: the
//! compute mode, the compute time-slice, and the MIG mode and instances once a process changed
//! them. The mock keeps them in a JSON file, so one process
//! (the driver's `nvidia-smi`, run by the DRA plugin) changes what another (`nvidia-smi` run on
//! the node) reads afterwards, as on a real node. The file is `$MOCK_NVML_STATE`, else
//! `run/mock-nvml/state.json` under the root the library is installed in (the library in
//! `<root>/usr/lib/x86_64-linux-gnu`: a node's `/run`, which every view of that root shares, the
//! plugin's through its driver-root mount included), else `mock-nvml-state.json` beside the
//! library.
//!
//! The file maps GPU UUIDs to `{"computeMode": N, "timeslice": N, "mig": {...}}`; a GPU absent
//! from it is at the driver's defaults (compute mode `DEFAULT`, time-slice `DEFAULT`, MIG as its
//! profile says). Writers lock the file, read,
//! change and replace it atomically, so concurrent `nvidia-smi` runs never lose an update. Where
//! the file cannot be written (a read-only bind mount in a workload container) a change answers
//! `NVML_ERROR_NO_PERMISSION`, as the real driver answers an unprivileged caller.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Env var naming the settings file.
pub const STATE_ENV: &str = "MOCK_NVML_STATE";
/// File name of the settings file beside a library installed elsewhere.
pub const STATE_NAME: &str = "mock-nvml-state.json";
/// Where a driver install keeps its libraries, below its root.
const LIBRARY_DIR: &str = "usr/lib/x86_64-linux-gnu";
/// The settings file below the install's root.
const STATE_UNDER_ROOT: &str = "run/mock-nvml/state.json";
/// The highest time-slice value (`LONG`); `nvidia-smi compute-policy --set-timeslice` takes 0–3.
pub const MAX_TIMESLICE: u32 = 3;

/// One GPU's settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuSettings {
    /// `nvmlComputeMode_t`: 0 default, 2 exclusive process, 1 and 3 prohibited/legacy.
    #[serde(default)]
    pub compute_mode: u32,
    /// Compute time-slice: 0 default, 1 short, 2 medium, 3 long.
    #[serde(default)]
    pub timeslice: u32,
    /// MIG mode and instances, once a process changed them (until then, the profile's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig: Option<MigRecord>,
}

/// A GPU's MIG mode and the instances on it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MigRecord {
    /// The mode in force.
    pub current: bool,
    /// The mode after the next GPU reset (equal to `current` unless a change waits for one).
    pub pending: bool,
    /// GPU instances.
    #[serde(default)]
    pub gpu_instances: Vec<GpuInstanceRecord>,
}

/// One GPU instance and its compute instances.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuInstanceRecord {
    /// GPU-instance id.
    pub id: u32,
    /// GPU-instance profile id.
    pub profile_id: u32,
    /// First memory slice.
    pub start: u32,
    /// Compute instances: id and compute-instance profile id.
    #[serde(default)]
    pub compute_instances: Vec<(u32, u32)>,
}

/// Where the settings live: a file, or (for in-process tests) memory.
#[derive(Debug, Default)]
pub struct Store {
    file: Option<PathBuf>,
    memory: BTreeMap<String, GpuSettings>,
}

/// Why a change was not kept.
#[derive(Debug, PartialEq, Eq)]
pub enum StoreError {
    /// The file cannot be written (or locked).
    NoPermission,
}

impl Store {
    /// Settings kept in `file`.
    pub fn in_file(file: PathBuf) -> Self {
        Self {
            file: Some(file),
            memory: BTreeMap::new(),
        }
    }

    /// What tells the file's content from the one last read (`None` in memory or while there is
    /// no file).
    pub fn stamp(&self) -> Option<Stamp> {
        self.file.as_deref().and_then(stamp)
    }

    /// `$MOCK_NVML_STATE`, else the settings file of the install `library` belongs to.
    pub fn for_library(library: Option<&Path>) -> Self {
        let file = std::env::var_os(STATE_ENV)
            .map(PathBuf::from)
            .or_else(|| library.and_then(Path::parent).map(state_file));
        file.map(Self::in_file).unwrap_or_default()
    }

    /// The settings of the GPU with `uuid`.
    pub fn get(&self, uuid: &str) -> GpuSettings {
        match &self.file {
            Some(file) => read(file).remove(uuid).unwrap_or_default(),
            None => self.memory.get(uuid).cloned().unwrap_or_default(),
        }
    }

    /// Changes the settings of the GPU with `uuid`.
    pub fn update(
        &mut self,
        uuid: &str,
        change: impl FnOnce(&mut GpuSettings),
    ) -> Result<(), StoreError> {
        let Some(file) = &self.file else {
            change(self.memory.entry(uuid.to_owned()).or_default());
            return Ok(());
        };
        if let Some(dir) = file.parent() {
            std::fs::create_dir_all(dir).map_err(|_| StoreError::NoPermission)?;
        }
        let lock = lock_file(file).map_err(|_| StoreError::NoPermission)?;
        let mut all = read(file);
        change(all.entry(uuid.to_owned()).or_default());
        all.retain(|_, s| *s != GpuSettings::default());
        let text = serde_json::to_vec_pretty(&all).unwrap_or_default();
        let temp = file.with_extension(format!("tmp.{}", std::process::id()));
        let written = std::fs::write(&temp, text).and_then(|()| std::fs::rename(&temp, file));
        drop(lock);
        written.map_err(|_| {
            let _ = std::fs::remove_file(&temp);
            StoreError::NoPermission
        })
    }
}

/// What tells a changed file (the control file, the settings file) from the one last read (an
/// atomic replace changes the inode).
pub type Stamp = (std::time::SystemTime, u64, u64);

/// The stamp of `path`; `None` while it does not exist.
pub fn stamp(path: &Path) -> Option<Stamp> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len(), meta.ino()))
}

/// The settings file of the install whose library folder is `dir`.
fn state_file(dir: &Path) -> PathBuf {
    match dir.to_str().and_then(|d| d.strip_suffix(LIBRARY_DIR)) {
        Some(root) => Path::new(root).join(STATE_UNDER_ROOT),
        None => dir.join(STATE_NAME),
    }
}

/// Takes the writers' lock: an exclusive lock on `<file>.lock`, released when dropped.
fn lock_file(file: &Path) -> std::io::Result<std::fs::File> {
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(file.with_extension("lock"))?;
    lock.lock()?;
    Ok(lock)
}

/// The file's settings; a missing or unreadable file holds none (every GPU at its defaults).
fn read(file: &Path) -> BTreeMap<String, GpuSettings> {
    std::fs::read(file)
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_is_seen_by_a_later_reader_of_the_same_file() {
        let dir = std::env::temp_dir().join(format!("mock-nvml-settings-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join(STATE_NAME);
        let mut writer = Store::in_file(file.clone());
        writer.update("GPU-a", |s| s.timeslice = 1).unwrap();
        let reader = Store::in_file(file.clone());
        assert_eq!(reader.get("GPU-a").timeslice, 1);
        assert_eq!(reader.get("GPU-b"), GpuSettings::default());
        writer.update("GPU-a", |s| s.timeslice = 0).unwrap();
        assert_eq!(
            std::fs::read_to_string(&file).unwrap().trim(),
            "{}",
            "GPUs back at their defaults leave the file"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn an_installed_library_keeps_its_settings_in_its_roots_run() {
        assert_eq!(
            state_file(Path::new("/driver-root/usr/lib/x86_64-linux-gnu")),
            Path::new("/driver-root/run/mock-nvml/state.json")
        );
        assert_eq!(
            state_file(Path::new("/usr/lib/x86_64-linux-gnu")),
            Path::new("/run/mock-nvml/state.json")
        );
        assert_eq!(
            state_file(Path::new("/work/target/debug")),
            Path::new("/work/target/debug/mock-nvml-state.json")
        );
    }

    #[test]
    fn an_unwritable_place_answers_no_permission() {
        let mut store = Store::in_file(PathBuf::from("/proc/no-such-dir/state.json"));
        assert_eq!(
            store.update("GPU-a", |s| s.timeslice = 2),
            Err(StoreError::NoPermission)
        );
        assert_eq!(store.get("GPU-a"), GpuSettings::default());
    }
}
