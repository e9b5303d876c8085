//! Crash-safe file replacement: temp file, fsync, rename, fsync of the directory.

use std::io::{self, Write};
use std::path::Path;

/// Replaces `path` with `contents` so that a crash leaves either the old or the new file, and
/// the new one is on disk when this returns.
pub fn write_atomic(path: &Path, contents: &[u8]) -> io::Result<()> {
    replace(path, contents, true)
}

/// Replaces `path` with `contents` so that readers and a crashed process see either the old or
/// the new file, without waiting for the disk: for files that need not outlive a reboot.
pub fn write_replace(path: &Path, contents: &[u8]) -> io::Result<()> {
    replace(path, contents, false)
}

fn replace(path: &Path, contents: &[u8], durable: bool) -> io::Result<()> {
    let dir = path
        .parent()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "path has no parent"))?;
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "path has no file name"))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".tmp-{}", std::process::id()));
    let tmp = dir.join(tmp_name);
    let written = (|| {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(contents)?;
        if durable {
            file.sync_all()?;
        }
        std::fs::rename(&tmp, path)?;
        if durable {
            std::fs::File::open(dir)?.sync_all()?;
        }
        Ok(())
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_the_file_and_leaves_no_temp_behind() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        write_atomic(&path, b"one").unwrap();
        write_replace(&path, b"two").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1);
    }
}
