//! Driver-root probing: where the NVIDIA driver lives and the paths the rest of the node needs.
//!
//! The host root (the host's `/`, mounted in this container) is searched first, then the container
//! driver root (a driver container's install dir, mounted here). A root has a driver when
//! `libnvidia-ml.so.1` is found in one of [`LIBRARY_DIRS`] as a non-empty regular file after
//! symlinks are followed inside the root. The dev root is the driver root when it has a `dev/`
//! directory, else the host's `/`.

use crate::driver_files::{self, Entry, RootTree, Tree};
use crate::driver_paths::DriverPaths;
use api::contract::paths;
use std::fmt;
use std::path::{Component, Path, PathBuf};

/// The NVML library file name looked for.
pub const LIBRARY_NAME: &str = paths::NVML_LIBRARY;
/// Library search dirs, relative to a root, in search order.
pub const LIBRARY_DIRS: [&str; 7] = paths::LIBRARY_SEARCH_DIRS;
/// `nvidia-smi` search dirs, relative to a root, in search order.
pub const SMI_DIRS: [&str; 5] = paths::BINARY_SEARCH_DIRS;

/// Default mount of the host's `/` in the validator and plugin containers.
pub const DEFAULT_HOST_ROOT: &str = paths::HOST_ROOT_CTR_PATH;
/// Default host path of a containerized driver's root.
pub const DEFAULT_DRIVER_INSTALL_DIR: &str = paths::DEFAULT_DRIVER_INSTALL_DIR;
/// Default mount of the container driver root in the validator and plugin containers.
pub const DEFAULT_DRIVER_INSTALL_DIR_CTR_PATH: &str = paths::DRIVER_ROOT_CTR_PATH;

/// Where to look: the mounts of this container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeSettings {
    /// Where the host's `/` is mounted in this container.
    pub host_root: PathBuf,
    /// Host path of the container driver root.
    pub driver_install_dir: PathBuf,
    /// Where the container driver root is mounted in this container.
    pub driver_install_dir_ctr_path: PathBuf,
}

impl Default for ProbeSettings {
    fn default() -> Self {
        Self {
            host_root: DEFAULT_HOST_ROOT.into(),
            driver_install_dir: DEFAULT_DRIVER_INSTALL_DIR.into(),
            driver_install_dir_ctr_path: DEFAULT_DRIVER_INSTALL_DIR_CTR_PATH.into(),
        }
    }
}

/// Which root the driver was found in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DriverLocation {
    /// Installed on the host.
    Host,
    /// Installed by a driver container under its install dir.
    Container,
}

/// A found driver: its root seen from the host and from this container, the dev root, and files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverRoot {
    /// Host or container driver.
    pub location: DriverLocation,
    /// The driver root (`/` or the install dir) and the dev root.
    pub paths: DriverPaths,
    /// `libnvidia-ml.so.1`, symlinks resolved, as this container sees it.
    pub nvml_library: PathBuf,
    /// `nvidia-smi`, when the root has one.
    pub nvidia_smi: Option<PathBuf>,
}

/// One root that was searched without success, with every path looked at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SearchedRoot {
    /// What the root is (`host root`, `container driver root`).
    pub role: &'static str,
    /// The root as this container sees it.
    pub root: PathBuf,
    /// Every candidate path looked at, in order.
    pub searched: Vec<PathBuf>,
    /// Candidates that exist but were rejected, with the reason.
    pub rejected: Vec<(PathBuf, String)>,
}

impl fmt::Display for SearchedRoot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let paths: Vec<_> = self
            .searched
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        write!(
            f,
            "{} {}: no {LIBRARY_NAME} in {}",
            self.role,
            self.root.display(),
            paths.join(", ")
        )?;
        for (path, why) in &self.rejected {
            write!(f, "; {} rejected: {why}", path.display())?;
        }
        Ok(())
    }
}

/// No driver in either root.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no NVIDIA driver found: {host}; {container}")]
pub struct ProbeError {
    /// The host root search.
    pub host: Box<SearchedRoot>,
    /// The container driver root search.
    pub container: Box<SearchedRoot>,
}

/// Probes the host root, then the container driver root.
pub fn probe(settings: &ProbeSettings) -> Result<DriverRoot, ProbeError> {
    let host = match find_library(&settings.host_root, "host root") {
        Ok(library) => return Ok(host_driver(settings, library)),
        Err(searched) => searched,
    };
    match find_library(
        &settings.driver_install_dir_ctr_path,
        "container driver root",
    ) {
        Ok(library) => Ok(container_driver(settings, library)),
        Err(container) => Err(ProbeError {
            host: Box::new(host),
            container: Box::new(container),
        }),
    }
}

fn host_driver(settings: &ProbeSettings, nvml_library: PathBuf) -> DriverRoot {
    let root = &settings.host_root;
    DriverRoot {
        location: DriverLocation::Host,
        paths: DriverPaths {
            driver_root: "/".into(),
            driver_root_ctr: root.clone(),
            // The host's `/` is the dev root whether or not it has `dev/`.
            dev_root: "/".into(),
            dev_root_ctr: root.clone(),
        },
        nvidia_smi: find_smi(root),
        nvml_library,
    }
}

fn container_driver(settings: &ProbeSettings, nvml_library: PathBuf) -> DriverRoot {
    let root = &settings.driver_install_dir_ctr_path;
    let (dev_root, dev_root_ctr) = if root.join("dev").is_dir() {
        (settings.driver_install_dir.clone(), root.clone())
    } else {
        (PathBuf::from("/"), settings.host_root.clone())
    };
    DriverRoot {
        location: DriverLocation::Container,
        paths: DriverPaths {
            driver_root: settings.driver_install_dir.clone(),
            driver_root_ctr: root.clone(),
            dev_root,
            dev_root_ctr,
        },
        nvidia_smi: find_smi(root),
        nvml_library,
    }
}

/// Finds `libnvidia-ml.so.1` under `root`, or says where it looked.
pub fn find_library(root: &Path, role: &'static str) -> Result<PathBuf, SearchedRoot> {
    let mut searched = Vec::new();
    let mut rejected = Vec::new();
    for dir in LIBRARY_DIRS {
        let inside = Path::new(dir).join(LIBRARY_NAME);
        let candidate = under(root, &inside);
        match usable_file(root, &inside) {
            Ok(Some(found)) => return Ok(found),
            Ok(None) => {}
            Err(why) => rejected.push((candidate.clone(), why)),
        }
        searched.push(candidate);
    }
    Err(SearchedRoot {
        role,
        root: root.to_path_buf(),
        searched,
        rejected,
    })
}

fn find_smi(root: &Path) -> Option<PathBuf> {
    SMI_DIRS.iter().find_map(|dir| {
        usable_file(root, &Path::new(dir).join("nvidia-smi"))
            .ok()
            .flatten()
    })
}

/// The file at `inside` (a path as seen inside `root`), its symlinks followed the way they resolve
/// on the node, never out of the root (`driver_files::resolve`): `Ok(None)` when nothing is there;
/// `Err` when something is there but unusable. Returns the path under `root`.
fn usable_file(root: &Path, inside: &Path) -> Result<Option<PathBuf>, String> {
    let tree = RootTree::new(root);
    if tree.entry(inside).is_none() {
        return Ok(None);
    }
    let shown = under(root, inside);
    match driver_files::resolve(&tree, inside) {
        None => {
            let target = std::fs::read_link(&shown).unwrap_or_default();
            Err(format!(
                "{} -> {}: a dangling or looping symlink",
                shown.display(),
                target.display()
            ))
        }
        Some((path, Entry::File { len })) if len > 0 => Ok(Some(under(root, &path))),
        Some((path, Entry::File { .. })) => {
            Err(format!("{} is empty", under(root, &path).display()))
        }
        Some((path, _)) => Err(format!(
            "{} is not a regular file",
            under(root, &path).display()
        )),
    }
}

/// `path` (absolute, as seen inside the root) placed under `root`.
fn under(root: &Path, path: &Path) -> PathBuf {
    let relative: PathBuf = path
        .components()
        .filter(|c| matches!(c, Component::Normal(_)))
        .collect();
    root.join(relative)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::symlink;

    fn settings(dir: &Path) -> ProbeSettings {
        ProbeSettings {
            host_root: dir.join("host"),
            driver_install_dir: "/run/nvidia/driver".into(),
            driver_install_dir_ctr_path: dir.join("driver-root"),
        }
    }

    fn put(root: &Path, rel: &str, bytes: &[u8]) -> PathBuf {
        let path = under(root, Path::new(rel));
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(&path, bytes).unwrap();
        path
    }

    #[test]
    fn an_absolute_symlink_resolves_inside_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("host");
        let real = put(&root, "/usr/lib64/libnvidia-ml.so.580.95.05", b"elf");
        symlink(
            "/usr/lib64/libnvidia-ml.so.580.95.05",
            root.join("usr/lib64").join(LIBRARY_NAME),
        )
        .unwrap();
        assert_eq!(probe(&settings(dir.path())).unwrap().nvml_library, real);
    }

    #[test]
    fn empty_and_dangling_candidates_are_rejected_with_a_reason() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("host");
        put(&root, "/usr/lib64/libnvidia-ml.so.1", b"");
        fs::create_dir_all(root.join("lib64")).unwrap();
        symlink("/nowhere", root.join("lib64").join(LIBRARY_NAME)).unwrap();
        let err = probe(&settings(dir.path())).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("usr/lib64/libnvidia-ml.so.1 is empty"),
            "{text}"
        );
        assert!(text.contains("nowhere"), "{text}");
        assert_eq!(err.host.searched.len(), LIBRARY_DIRS.len());
        assert_eq!(err.container.searched.len(), LIBRARY_DIRS.len());
    }

    #[test]
    fn the_container_dev_root_needs_a_dev_dir() {
        let dir = tempfile::tempdir().unwrap();
        let s = settings(dir.path());
        put(
            &s.driver_install_dir_ctr_path,
            "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
            b"elf",
        );
        let found = probe(&s).unwrap();
        assert_eq!(
            (
                found.paths.dev_root.as_path(),
                found.paths.dev_root_ctr.as_path()
            ),
            (Path::new("/"), s.host_root.as_path())
        );
        fs::create_dir(s.driver_install_dir_ctr_path.join("dev")).unwrap();
        let found = probe(&s).unwrap();
        assert_eq!(found.paths.dev_root, s.driver_install_dir);
        assert_eq!(found.paths.dev_root_ctr, s.driver_install_dir_ctr_path);
    }

    #[test]
    fn nvidia_smi_is_recorded_when_present() {
        let dir = tempfile::tempdir().unwrap();
        let s = settings(dir.path());
        put(&s.host_root, "/lib64/libnvidia-ml.so.1", b"elf");
        assert_eq!(probe(&s).unwrap().nvidia_smi, None);
        let smi = put(&s.host_root, "/usr/bin/nvidia-smi", b"#!");
        assert_eq!(probe(&s).unwrap().nvidia_smi, Some(smi));
    }
}
