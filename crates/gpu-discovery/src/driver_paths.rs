//! Where the driver and its device nodes are: on the host (what CDI specs and the kubelet name) and
//! as this container sees them (where it looks for files). One type for the `driver-ready` file, a
//! probed driver and the plugins' CDI writers.

use std::path::{Path, PathBuf};

/// The driver root and the dev root, each on the host and in this container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverPaths {
    /// The driver root on the host (`/` for a host driver, the install dir for a driver container).
    pub driver_root: PathBuf,
    /// The driver root as this container sees it.
    pub driver_root_ctr: PathBuf,
    /// The dev root on the host.
    pub dev_root: PathBuf,
    /// The dev root as this container sees it.
    pub dev_root_ctr: PathBuf,
}

impl DriverPaths {
    /// The paths from the flags (the driver root on the host and as this container sees it), or
    /// those of a `driver-ready` file, which win when present. Without one the dev root is the
    /// driver root when that has a `dev/` dir, else the host's `/`, which this container is
    /// expected to see at `/` (its `/dev` the host's).
    pub fn decide(driver_root: &Path, driver_root_ctr: &Path, ready: Option<&DriverPaths>) -> Self {
        if let Some(ready) = ready {
            return ready.clone();
        }
        let (dev_root, dev_root_ctr) = if driver_root_ctr.join("dev").is_dir() {
            (driver_root.to_path_buf(), driver_root_ctr.to_path_buf())
        } else {
            (PathBuf::from("/"), PathBuf::from("/"))
        };
        Self {
            driver_root: driver_root.to_path_buf(),
            driver_root_ctr: driver_root_ctr.to_path_buf(),
            dev_root,
            dev_root_ctr,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_driver_ready_file_wins_over_the_flags() {
        let ready = DriverPaths {
            driver_root: "/run/nvidia/driver".into(),
            driver_root_ctr: "/driver-root".into(),
            dev_root: "/".into(),
            dev_root_ctr: "/host".into(),
        };
        let decided = DriverPaths::decide(Path::new("/x"), Path::new("/y"), Some(&ready));
        assert_eq!(decided, ready);
    }

    #[test]
    fn without_one_the_dev_root_is_the_driver_root_only_when_it_has_dev() {
        let dir = tempfile::tempdir().unwrap();
        let host = Path::new("/run/nvidia/driver");
        let plain = DriverPaths::decide(host, dir.path(), None);
        assert_eq!(
            (plain.dev_root.as_path(), plain.dev_root_ctr.as_path()),
            (Path::new("/"), Path::new("/"))
        );
        std::fs::create_dir(dir.path().join("dev")).unwrap();
        let with_dev = DriverPaths::decide(host, dir.path(), None);
        assert_eq!(with_dev.dev_root, host);
        assert_eq!(with_dev.dev_root_ctr, dir.path());
        assert_eq!(with_dev.driver_root_ctr, dir.path());
    }
}
