//! Atomic file replacement: readers, and a process that crashed mid-write, see the old file or
//! the new one, never a part. The one way the workspace replaces a file; the caller says how much
//! the new contents must survive.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// What a replaced file must survive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// A power loss or kernel crash too: the file and its directory are fsynced before the call
    /// returns (checkpoints, `driver-ready`, validation flags).
    Durable,
    /// A crash of the writing process, not of the machine: no fsync (files that are rebuilt after
    /// a reboot anyway, such as CDI specs).
    ProcessCrash,
}

/// Replaces `path` with `contents`: a temp file in the same dir, renamed over `path`; with
/// [`Durability::Durable`] the temp file is fsynced before the rename and the dir after it.
/// Creates the dir when missing.
pub fn replace(path: &Path, contents: &[u8], durability: Durability) -> io::Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    fs::create_dir_all(dir)?;
    let temp = temp_path(path);
    let result = write_new(&temp, contents, durability).and_then(|()| fs::rename(&temp, path));
    if result.is_err() {
        // Best effort: the temp file is ours and useless now; the original error is what matters.
        let _ = fs::remove_file(&temp);
    }
    result?;
    match durability {
        Durability::Durable => File::open(dir)?.sync_all(),
        Durability::ProcessCrash => Ok(()),
    }
}

fn write_new(path: &Path, contents: &[u8], durability: Durability) -> io::Result<()> {
    let mut file = OpenOptions::new().write(true).create_new(true).open(path)?;
    file.write_all(contents)?;
    match durability {
        Durability::Durable => file.sync_all(),
        Durability::ProcessCrash => Ok(()),
    }
}

/// A sibling name unique within this process and across processes.
fn temp_path(path: &Path) -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.{}.{n}.tmp", std::process::id()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_contents_and_leaves_no_temp_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/driver-ready");
        for durability in [Durability::Durable, Durability::ProcessCrash] {
            replace(&path, b"one", durability).unwrap();
            replace(&path, b"two", durability).unwrap();
            assert_eq!(fs::read(&path).unwrap(), b"two");
            let names: Vec<_> = fs::read_dir(dir.path().join("sub"))
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            assert_eq!(names, vec!["driver-ready"]);
        }
    }

    #[test]
    fn a_failed_write_keeps_the_old_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        replace(&path, b"old", Durability::Durable).unwrap();
        // A directory in the way of the rename target makes the rename fail.
        let blocked = dir.path().join("d");
        fs::create_dir_all(blocked.join("x")).unwrap();
        assert!(replace(&blocked, b"new", Durability::ProcessCrash).is_err());
        assert_eq!(fs::read(&path).unwrap(), b"old");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 2);
    }
}
