//! Noticing a driver that changed under a running node agent: an upgrade, a reinstall, a driver
//! container restarted with another version. NVML stays loaded from the library found at start,
//! so an agent that did not notice would go on publishing the old driver's version and pointing
//! CDI specs at its files. The library found in the driver root now is compared with the one
//! loaded: its resolved path (the version is in its name) and its file's identity.
//!
//! Pure: [`compare`]. I/O edges: [`LibraryFile::read`] and [`watch`].

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// How often [`watch`] looks at the driver root.
pub const CHECK_INTERVAL: Duration = Duration::from_secs(10);

/// The NVML library as found in the driver root: where its name resolves to, and which file that is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LibraryFile {
    /// The resolved file (e.g. `.../libnvidia-ml.so.580.95.05`).
    pub path: PathBuf,
    /// Device and inode: a file put in its place is another file.
    pub identity: (u64, u64),
    /// Size and modification time, for a file rewritten in place.
    pub content: (u64, Option<SystemTime>),
}

impl LibraryFile {
    /// Reads `path`'s identity.
    pub fn read(path: &Path) -> std::io::Result<Self> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(path)?;
        Ok(Self {
            path: path.to_path_buf(),
            identity: (meta.dev(), meta.ino()),
            content: (meta.len(), meta.modified().ok()),
        })
    }

    /// The driver version in the file's name (`libnvidia-ml.so.580.95.05` → `580.95.05`), if it
    /// has one.
    pub fn version(&self) -> Option<&str> {
        let name = self.path.file_name()?.to_str()?;
        let version = name.strip_prefix("libnvidia-ml.so.")?;
        version.contains('.').then_some(version)
    }

    fn named(&self) -> String {
        match self.version() {
            Some(version) => format!("driver {version}"),
            None => self.path.display().to_string(),
        }
    }
}

/// How the driver root's library differs from the one loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DriverChange {
    /// Another library (another version, as a rule) is found now.
    Replaced {
        /// The one loaded.
        from: LibraryFile,
        /// The one found now.
        to: LibraryFile,
    },
    /// The same name, but another file or other content: the driver was reinstalled.
    Reinstalled(LibraryFile),
    /// No usable library is found any more (the driver is being removed or replaced).
    Gone {
        /// The one loaded.
        from: LibraryFile,
        /// Why none is found.
        why: String,
    },
}

impl std::fmt::Display for DriverChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Replaced { from, to } => write!(
                f,
                "the GPU driver changed from {} to {} ({})",
                from.named(),
                to.named(),
                to.path.display()
            ),
            Self::Reinstalled(file) => write!(
                f,
                "the GPU driver was reinstalled ({} is another file now)",
                file.path.display()
            ),
            Self::Gone { from, why } => {
                write!(f, "the GPU driver ({}) is gone: {why}", from.named())
            }
        }
    }
}

/// What the driver root holds now compared with `loaded`: `None` while it is the same library.
pub fn compare(loaded: &LibraryFile, now: &Result<LibraryFile, String>) -> Option<DriverChange> {
    match now {
        Ok(now) if now.path != loaded.path => Some(DriverChange::Replaced {
            from: loaded.clone(),
            to: now.clone(),
        }),
        Ok(now) if now != loaded => Some(DriverChange::Reinstalled(now.clone())),
        Ok(_) => None,
        Err(why) => Some(DriverChange::Gone {
            from: loaded.clone(),
            why: why.clone(),
        }),
    }
}

/// The library `find` resolves now, read.
fn current(find: &impl Fn() -> Result<PathBuf, String>) -> Result<LibraryFile, String> {
    let path = find()?;
    LibraryFile::read(&path).map_err(|e| format!("{}: {e}", path.display()))
}

/// Looks every `interval` for the library `find` resolves and returns once it differs from
/// `loaded` on two looks in a row (so a driver caught half-installed is not taken for gone);
/// what changed, as the second look saw it.
pub async fn watch(
    loaded: LibraryFile,
    find: impl Fn() -> Result<PathBuf, String>,
    interval: Duration,
) -> DriverChange {
    let mut seen_once = false;
    loop {
        tokio::time::sleep(interval).await;
        match compare(&loaded, &current(&find)) {
            Some(change) if seen_once => return change,
            Some(_) => seen_once = true,
            None => seen_once = false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// A driver root's library dir holding `libnvidia-ml.so.<version>`, linked as `.so.1`.
    fn install(dir: &Path, version: &str, content: &str) -> PathBuf {
        let file = dir.join(format!("libnvidia-ml.so.{version}"));
        std::fs::write(&file, content).unwrap();
        let link = dir.join("libnvidia-ml.so.1.new");
        symlink(file.file_name().unwrap(), &link).unwrap();
        std::fs::rename(&link, dir.join("libnvidia-ml.so.1")).unwrap();
        file
    }

    fn resolve(dir: &Path) -> Result<PathBuf, String> {
        std::fs::canonicalize(dir.join("libnvidia-ml.so.1")).map_err(|e| e.to_string())
    }

    /// A library dir with driver `version` installed, and that library as loaded.
    struct Root {
        _dir: tempfile::TempDir,
        path: PathBuf,
    }

    impl Root {
        fn with(version: &str) -> (Self, LibraryFile) {
            let dir = tempfile::tempdir().unwrap();
            let path = std::fs::canonicalize(dir.path()).unwrap();
            install(&path, version, "first build");
            let root = Self { _dir: dir, path };
            let loaded = root.now().unwrap();
            (root, loaded)
        }

        fn now(&self) -> Result<LibraryFile, String> {
            current(&|| resolve(&self.path))
        }
    }

    #[test]
    fn the_same_library_is_no_change_another_version_is() {
        let (root, loaded) = Root::with("580.95.05");
        assert_eq!(loaded.version(), Some("580.95.05"));
        assert_eq!(compare(&loaded, &root.now()), None);

        install(&root.path, "590.48.01", "new");
        let change = compare(&loaded, &root.now()).unwrap();
        assert!(
            matches!(&change, DriverChange::Replaced { to, .. } if to.version() == Some("590.48.01"))
        );
        assert!(
            change
                .to_string()
                .starts_with("the GPU driver changed from driver 580.95.05 to driver 590.48.01"),
            "{change}"
        );

        std::fs::remove_file(root.path.join("libnvidia-ml.so.1")).unwrap();
        let gone = compare(&loaded, &root.now()).unwrap();
        assert!(matches!(gone, DriverChange::Gone { .. }), "{gone}");
        assert!(loaded.path.exists());
    }

    #[test]
    fn a_file_put_in_the_place_of_the_loaded_one_is_a_reinstall() {
        let (root, loaded) = Root::with("580.95.05");
        let staged = root.path.join("staged");
        std::fs::write(&staged, "second build").unwrap();
        std::fs::rename(&staged, &loaded.path).unwrap();
        let change = compare(&loaded, &root.now()).unwrap();
        assert!(matches!(change, DriverChange::Reinstalled(_)), "{change}");
    }

    #[test]
    fn a_name_without_a_version_is_shown_as_its_path() {
        let file = LibraryFile {
            path: PathBuf::from("/driver/usr/lib/libnvidia-ml.so.1"),
            identity: (1, 2),
            content: (3, None),
        };
        assert_eq!(file.version(), None);
        let gone = compare(&file, &Err("no libnvidia-ml.so.1".into())).unwrap();
        assert_eq!(
            gone.to_string(),
            "the GPU driver (/driver/usr/lib/libnvidia-ml.so.1) is gone: no libnvidia-ml.so.1"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn watch_ignores_a_blip_and_returns_a_change_seen_twice() {
        let (root, loaded) = Root::with("580.95.05");
        let dir_path = root.path.clone();
        let looks = std::sync::atomic::AtomicU32::new(0);
        // A blip (the library unreadable on one look) is not a change; a new version seen on
        // two looks is.
        let find = || {
            let look = looks.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            match look {
                0 => return Err("caught mid-write".to_owned()),
                2 => drop(install(&dir_path, "590.48.01", "new")),
                _ => {}
            }
            resolve(&dir_path)
        };
        let change = watch(loaded, find, Duration::from_secs(10)).await;
        assert!(matches!(change, DriverChange::Replaced { .. }), "{change}");
        assert_eq!(looks.load(std::sync::atomic::Ordering::SeqCst), 4);
    }
}
