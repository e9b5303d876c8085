//! The driver's user-space files a GPU container needs: libraries, binaries, firmware, IPC sockets
//! and device nodes, found under a probed driver root.
//!
//! Discovery is a pure function over a [`Tree`]: stat results, directory listings and small file
//! reads, with paths as seen inside the root (`/usr/lib64/libcuda.so.1`). [`RootTree`] answers
//! those from a directory mounted in this container; tests answer them from memory. Found paths
//! stay root-relative; [`host_path`] turns one into the path on the host (the driver root's
//! `NVIDIA_DRIVER_ROOT`, not its mount under `DRIVER_ROOT_CTR_PATH` here).
//!
//! Device nodes are accepted when they are character devices or, for fake roots in tests,
//! regular files: a test cannot create device nodes without privileges.

use api::contract::paths;
use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};

mod nodes;
mod tree;

pub use nodes::{char_major, control_nodes, gpu_node, mig_caps, parse_access};
pub use tree::{Entry, RootTree, Tree, host_path, resolve};

/// Library search dirs, inside a root, in search order.
pub const LIBRARY_DIRS: [&str; 7] = paths::LIBRARY_SEARCH_DIRS;
/// Binary search dirs, inside a root, in search order.
pub const BINARY_DIRS: [&str; 5] = paths::BINARY_SEARCH_DIRS;
/// Libraries without which a claim is refused.
pub const REQUIRED_LIBRARIES: [&str; 2] = ["libnvidia-ml.so", "libcuda.so"];
/// Further user-space libraries mounted when present.
pub const OPTIONAL_LIBRARIES: [&str; 10] = [
    "libnvidia-ptxjitcompiler.so",
    "libnvidia-nvvm.so",
    "libnvidia-gpucomp.so",
    "libnvidia-opencl.so",
    "libnvidia-allocator.so",
    "libnvidia-cfg.so",
    "libnvidia-pkcs11.so",
    "libnvidia-pkcs11-openssl3.so",
    "libnvidia-nscq.so",
    "libcudadebugger.so",
];
/// Binaries mounted when present.
pub const BINARIES: [&str; 5] = [
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
];
/// IPC sockets (and the MPS pipe dir) mounted when present, inside the root.
pub const IPC_PATHS: [&str; 5] = [
    "/run/nvidia-persistenced/socket",
    "/var/run/nvidia-persistenced/socket",
    "/run/nvidia-fabricmanager/socket",
    "/var/run/nvidia-fabricmanager/socket",
    "/tmp/nvidia-mps",
];
/// Control device nodes injected when present.
pub const CONTROL_NODES: [&str; 4] = [
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
    "/dev/nvidia-modeset",
];
/// Where the driver publishes MIG capability files.
pub const CAPABILITIES_DIR: &str = "/proc/driver/nvidia/capabilities";
/// Where the MIG capability device nodes are created.
pub const CAPS_DEV_DIR: &str = "/dev/nvidia-caps";

/// A library: its real (versioned) file and the symlinks beside it that lead there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Library {
    /// The regular file, inside the root (`/usr/lib64/libcuda.so.580.95.05`).
    pub file: PathBuf,
    /// Symlinks in the same dir resolving to `file`: (link path, target as written).
    pub links: Vec<(PathBuf, PathBuf)>,
}

/// A binary: where it is looked up and the regular file that path resolves to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binary {
    /// The path in a binary dir (`/usr/bin/nvidia-smi`), inside the root.
    pub path: PathBuf,
    /// The regular file it resolves to, inside the root.
    pub file: PathBuf,
}

/// A required item that is not there, with every path looked at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Missing {
    /// What is missing (`libcuda.so`, `/dev/nvidia3`).
    pub item: String,
    /// Paths looked at, as seen inside the root, or a note on why they did not count.
    pub looked: Vec<String>,
}

impl fmt::Display for Missing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (looked at {})", self.item, self.looked.join(", "))
    }
}

/// The driver files of a root.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DriverFiles {
    /// Driver version, from the versioned `libnvidia-ml.so.<version>` file.
    pub version: Option<String>,
    /// Libraries found, required ones first.
    pub libraries: Vec<Library>,
    /// Binaries found.
    pub binaries: Vec<Binary>,
    /// `lib/firmware/nvidia/<version>` when present.
    pub firmware: Option<PathBuf>,
    /// IPC sockets and the MPS pipe dir present.
    pub ipc: Vec<PathBuf>,
    /// Required libraries that are missing.
    pub missing: Vec<Missing>,
}

/// A MIG capability device node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapNode {
    /// `/dev/nvidia-caps/nvidia-cap<minor>`.
    pub path: PathBuf,
    /// Major of `nvidia-caps` in `/proc/devices`.
    pub major: u32,
    /// Minor from the capability's `access` file.
    pub minor: u32,
    /// `DeviceFileMode` from the `access` file, when given.
    pub mode: Option<u32>,
}

/// Finds the library whose file names are `<stem>` or start with `<stem>.` (`libcuda.so`, `libcuda.so.1`,
/// `libcuda.so.580.95.05`): in the first search dir holding one that resolves to a non-empty
/// regular file in that same dir. Returns it or the paths looked at.
pub fn find_library(tree: &dyn Tree, stem: &str) -> Result<Library, Vec<String>> {
    let prefix = format!("{stem}.");
    let mut looked = Vec::new();
    for dir in LIBRARY_DIRS {
        let dir = Path::new(dir);
        looked.push(dir.join(format!("{stem}.*")).display().to_string());
        let names: Vec<String> = tree
            .list(dir)
            .into_iter()
            .filter(|n| *n == stem || n.starts_with(&prefix))
            .collect();
        let mut files = BTreeSet::new();
        let mut links = Vec::new();
        for name in &names {
            let path = dir.join(name);
            let Some((real, Entry::File { len })) = resolve(tree, &path) else {
                continue;
            };
            if len == 0 {
                continue;
            }
            match tree.entry(&path) {
                Some(Entry::Symlink(target)) => links.push((path, target, real)),
                _ => {
                    files.insert(real);
                }
            }
        }
        // The versioned file: the regular file the soname link leads to, else the only one.
        let file = links
            .iter()
            .map(|(_, _, real)| real.clone())
            .find(|real| real.parent() == Some(dir))
            .or_else(|| links.first().map(|(_, _, real)| real.clone()))
            .or_else(|| files.iter().next().cloned());
        if let Some(file) = file {
            let links = links
                .into_iter()
                .filter(|(_, _, real)| *real == file)
                .map(|(link, target, _)| (link, target))
                .collect();
            return Ok(Library { file, links });
        }
    }
    Err(looked)
}

/// The driver version from a versioned library file name (`libnvidia-ml.so.580.95.05`).
pub fn version_of(file: &Path, stem: &str) -> Option<String> {
    let name = file.file_name()?.to_str()?;
    let version = name.strip_prefix(stem)?.strip_prefix('.')?;
    let dotted = version.split('.').count() >= 2;
    (dotted && version.chars().all(|c| c.is_ascii_digit() || c == '.')).then(|| version.to_owned())
}

/// The first of `name` in the binary dirs that resolves to a non-empty regular file.
pub fn find_binary(tree: &dyn Tree, name: &str) -> Option<Binary> {
    BINARY_DIRS.iter().find_map(|dir| {
        let path = Path::new(dir).join(name);
        match resolve(tree, &path) {
            Some((file, Entry::File { len })) if len > 0 => Some(Binary { path, file }),
            _ => None,
        }
    })
}

/// The directories whose entries decide what [`discover`] finds in a driver root: the library and
/// binary search dirs, the firmware dir, and those holding the IPC sockets. Adding, removing or
/// renaming a file in one changes its modification time.
pub fn search_dirs() -> BTreeSet<PathBuf> {
    let ipc_parents = IPC_PATHS
        .iter()
        .filter_map(|p| Path::new(p).parent().map(Path::to_path_buf));
    LIBRARY_DIRS
        .iter()
        .chain(BINARY_DIRS.iter())
        .map(PathBuf::from)
        .chain(std::iter::once(PathBuf::from("/lib/firmware/nvidia")))
        .chain(ipc_parents)
        .collect()
}

/// What a discovery in a driver root and its dev root depended on: the modification times of
/// [`search_dirs`] and of `/dev`. Equal stamps, equal discovery, so it is redone only when the
/// stamp changes (a few `stat`s instead of a walk).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stamp(Vec<Option<std::time::SystemTime>>);

impl Stamp {
    /// The stamp of `driver` and `dev` now.
    pub fn of(driver: &RootTree, dev: &RootTree) -> Stamp {
        let mtime = |tree: &RootTree, dir: &Path| {
            std::fs::metadata(tree.real(dir))
                .and_then(|m| m.modified())
                .ok()
        };
        let mut times: Vec<_> = search_dirs().iter().map(|d| mtime(driver, d)).collect();
        times.push(mtime(dev, Path::new("/dev")));
        Stamp(times)
    }
}

/// Discovers the user-space files of the driver in `tree`.
pub fn discover(tree: &dyn Tree) -> DriverFiles {
    let mut files = DriverFiles::default();
    for stem in REQUIRED_LIBRARIES {
        match find_library(tree, stem) {
            Ok(lib) => files.libraries.push(lib),
            Err(looked) => files.missing.push(Missing {
                item: stem.to_owned(),
                looked,
            }),
        }
    }
    files.libraries.extend(
        OPTIONAL_LIBRARIES
            .iter()
            .filter_map(|stem| find_library(tree, stem).ok()),
    );
    files.version = files
        .libraries
        .iter()
        .find_map(|l| version_of(&l.file, REQUIRED_LIBRARIES[0]));
    files.binaries = BINARIES
        .iter()
        .filter_map(|b| find_binary(tree, b))
        .collect();
    if let Some(version) = &files.version {
        let dir = Path::new("/lib/firmware/nvidia").join(version);
        if let Some((real, Entry::Dir)) = resolve(tree, &dir) {
            files.firmware = Some(real);
        }
    }
    files.ipc = IPC_PATHS
        .iter()
        .map(Path::new)
        .filter(|p| {
            matches!(tree.entry(p), Some(Entry::Socket))
                || (p.ends_with("nvidia-mps") && matches!(tree.entry(p), Some(Entry::Dir)))
        })
        .map(Path::to_path_buf)
        .collect();
    files
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[derive(Default)]
    struct Mem(BTreeMap<PathBuf, (Entry, String)>);

    impl Mem {
        fn put(&mut self, path: &str, entry: Entry) -> &mut Self {
            self.put_text(path, entry, "")
        }
        fn put_text(&mut self, path: &str, entry: Entry, text: &str) -> &mut Self {
            self.0.insert(path.into(), (entry, text.to_owned()));
            self
        }
        fn file(&mut self, path: &str) -> &mut Self {
            self.put(path, Entry::File { len: 10 })
        }
        fn link(&mut self, path: &str, target: &str) -> &mut Self {
            self.put(path, Entry::Symlink(target.into()))
        }
    }

    impl Tree for Mem {
        fn entry(&self, path: &Path) -> Option<Entry> {
            if let Some((e, _)) = self.0.get(path) {
                return Some(e.clone());
            }
            // A directory: the root, or the parent of something in the tree.
            (path == Path::new("/") || self.0.keys().any(|p| p.starts_with(path)))
                .then_some(Entry::Dir)
        }
        fn list(&self, path: &Path) -> Vec<String> {
            self.0
                .keys()
                .filter(|p| p.parent() == Some(path))
                .filter_map(|p| Some(p.file_name()?.to_str()?.to_owned()))
                .collect()
        }
        fn read(&self, path: &Path) -> Option<String> {
            self.0.get(path).map(|(_, t)| t.clone())
        }
    }

    const LIB: &str = "/usr/lib/x86_64-linux-gnu";

    fn driver() -> Mem {
        let mut m = Mem::default();
        for stem in ["libnvidia-ml.so", "libcuda.so"] {
            m.file(&format!("{LIB}/{stem}.580.95.05"))
                .link(&format!("{LIB}/{stem}.1"), &format!("{stem}.580.95.05"))
                .link(&format!("{LIB}/{stem}"), &format!("{stem}.1"));
        }
        m
    }

    #[test]
    fn a_library_is_its_versioned_file_and_the_links_to_it() {
        let lib = find_library(&driver(), "libcuda.so").unwrap();
        assert_eq!(lib.file, Path::new(LIB).join("libcuda.so.580.95.05"));
        assert_eq!(
            lib.links,
            vec![
                (
                    Path::new(LIB).join("libcuda.so"),
                    PathBuf::from("libcuda.so.1")
                ),
                (
                    Path::new(LIB).join("libcuda.so.1"),
                    PathBuf::from("libcuda.so.580.95.05")
                ),
            ]
        );
    }

    #[test]
    fn a_link_leaving_the_dir_yields_the_file_it_reaches() {
        let mut m = Mem::default();
        m.file("/opt/nvidia/libcuda.so.580.95.05")
            .link("/lib64/libcuda.so.1", "/opt/nvidia/libcuda.so.580.95.05");
        let lib = find_library(&m, "libcuda.so").unwrap();
        assert_eq!(lib.file, Path::new("/opt/nvidia/libcuda.so.580.95.05"));
        assert_eq!(lib.links.len(), 1);
    }

    #[test]
    fn empty_dangling_and_lookalike_files_do_not_count() {
        let mut m = Mem::default();
        m.put(
            &format!("{LIB}/libcuda.so.580.95.05"),
            Entry::File { len: 0 },
        )
        .link("/lib64/libcuda.so.1", "/nowhere")
        .file("/usr/lib64/libcudart.so.12");
        let looked = find_library(&m, "libcuda.so").unwrap_err();
        assert_eq!(looked.len(), LIBRARY_DIRS.len());
        assert!(
            looked.contains(&"/usr/lib64/libcuda.so.*".to_owned()),
            "{looked:?}"
        );
    }

    #[test]
    fn discovery_reports_the_version_firmware_and_what_is_missing() {
        let mut m = driver();
        m.0.retain(|p, _| !p.to_string_lossy().contains("libcuda"));
        m.put("/lib/firmware/nvidia/580.95.05", Entry::Dir)
            .file("/usr/bin/nvidia-smi")
            .file("/opt/nvidia/nvidia-debugdump")
            .link(
                "/usr/bin/nvidia-debugdump",
                "../../opt/nvidia/nvidia-debugdump",
            )
            .put("/run/nvidia-persistenced/socket", Entry::Socket)
            .file("/run/nvidia-fabricmanager/socket")
            .put("/tmp/nvidia-mps", Entry::Dir);
        let found = discover(&m);
        assert_eq!(found.version.as_deref(), Some("580.95.05"));
        assert_eq!(
            found.firmware.as_deref(),
            Some(Path::new("/lib/firmware/nvidia/580.95.05"))
        );
        assert_eq!(
            found.binaries,
            vec![
                Binary {
                    path: "/usr/bin/nvidia-smi".into(),
                    file: "/usr/bin/nvidia-smi".into()
                },
                Binary {
                    path: "/usr/bin/nvidia-debugdump".into(),
                    file: "/opt/nvidia/nvidia-debugdump".into()
                }
            ]
        );
        assert_eq!(
            found.ipc,
            vec![
                PathBuf::from("/run/nvidia-persistenced/socket"),
                PathBuf::from("/tmp/nvidia-mps")
            ],
            "a regular file is no socket"
        );
        assert_eq!(found.missing.len(), 1);
        assert_eq!(found.missing[0].item, "libcuda.so");
        assert_eq!(found.libraries.len(), 1);
    }

    #[test]
    fn device_nodes_and_host_paths() {
        let mut m = Mem::default();
        m.put("/dev/nvidiactl", Entry::CharDevice)
            .file("/dev/nvidia-uvm")
            .put("/dev/nvidia-modeset", Entry::Dir)
            .put("/dev/nvidia0", Entry::CharDevice);
        assert_eq!(
            control_nodes(&m),
            vec![
                PathBuf::from("/dev/nvidiactl"),
                PathBuf::from("/dev/nvidia-uvm")
            ]
        );
        assert_eq!(gpu_node(&m, 0).unwrap(), Path::new("/dev/nvidia0"));
        assert_eq!(gpu_node(&m, 1).unwrap_err().item, "/dev/nvidia1");
        assert_eq!(
            host_path(
                Path::new("/run/nvidia/driver"),
                Path::new("/usr/lib64/libcuda.so.1")
            ),
            Path::new("/run/nvidia/driver/usr/lib64/libcuda.so.1")
        );
    }

    #[test]
    fn mig_caps_come_from_proc() {
        let devices =
            "Character devices:\n195 nvidia\n234 nvidia-caps\n\nBlock devices:\n235 nvidia-caps\n";
        assert_eq!(char_major(devices, "nvidia-caps"), Some(234));
        assert_eq!(
            char_major("Block devices:\n235 nvidia-caps\n", "nvidia-caps"),
            None
        );
        let mut m = Mem::default();
        m.put_text("/proc/devices", Entry::File { len: 1 }, devices)
            .put_text(
                "/proc/driver/nvidia/capabilities/gpu1/mig/gi3/access",
                Entry::File { len: 1 },
                "DeviceFileMinor: 30\nDeviceFileMode: 292\n",
            )
            .put_text(
                "/proc/driver/nvidia/capabilities/gpu1/mig/gi3/ci0/access",
                Entry::File { len: 1 },
                "DeviceFileMinor: 31\nDeviceFileMode: 292\n",
            );
        let caps = mig_caps(&m, 1, 3, 0).unwrap();
        assert_eq!(
            caps.iter()
                .map(|c| (c.path.clone(), c.major, c.minor, c.mode))
                .collect::<Vec<_>>(),
            vec![
                ("/dev/nvidia-caps/nvidia-cap30".into(), 234, 30, Some(292)),
                ("/dev/nvidia-caps/nvidia-cap31".into(), 234, 31, Some(292)),
            ]
        );
        let missing = mig_caps(&m, 1, 4, 0).unwrap_err();
        assert!(missing.item.ends_with("gpu1/mig/gi4/access"), "{missing}");
        assert_eq!(missing.looked.len(), 3);
    }

    #[test]
    fn the_root_tree_reads_a_real_directory() {
        let dir = tempfile::tempdir().unwrap();
        let lib = dir.path().join("usr/lib64");
        std::fs::create_dir_all(&lib).unwrap();
        std::fs::write(lib.join("libcuda.so.580.95.05"), b"elf").unwrap();
        std::os::unix::fs::symlink("libcuda.so.580.95.05", lib.join("libcuda.so.1")).unwrap();
        let tree = RootTree::new(dir.path());
        let found = find_library(&tree, "libcuda.so").unwrap();
        assert_eq!(found.file, Path::new("/usr/lib64/libcuda.so.580.95.05"));
        assert_eq!(tree.entry(Path::new("/usr/lib64")), Some(Entry::Dir));
    }
}
