//! Private Unix sockets for the kubelet: `0600` sockets in `0700` directories, stale sockets
//! replaced only when the path really is a socket, and removal when the guard is dropped.

use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use tokio::net::UnixListener;

/// Why a socket could not be bound.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    /// Something that is not a socket sits where the socket goes; it is left alone.
    #[error("{0} exists and is not a socket; refusing to replace it")]
    NotASocket(PathBuf),
    /// Any filesystem or bind failure.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The path it was done to.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
}

fn io_err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> SocketError + 'a {
    move |source| SocketError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// A bound listener whose socket file is removed when this is dropped, unless another socket
/// has taken its path since.
#[derive(Debug)]
pub struct BoundSocket {
    listener: Option<UnixListener>,
    path: PathBuf,
    /// `(device, inode)` of the file bound.
    identity: Option<(u64, u64)>,
}

impl BoundSocket {
    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Takes the listener out to serve it; the file is still removed on drop.
    pub fn take_listener(&mut self) -> Option<UnixListener> {
        self.listener.take()
    }

    /// Whether the file at the path is still the socket bound here (not removed, not replaced).
    pub fn is_in_place(&self) -> bool {
        self.identity.is_some() && identity(&self.path) == self.identity
    }
}

impl Drop for BoundSocket {
    fn drop(&mut self) {
        if self.is_in_place() {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

fn identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path)
        .ok()
        .filter(|m| m.file_type().is_socket())
        .map(|m| (m.dev(), m.ino()))
}

#[cfg(test)]
fn is_socket(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket())
}

/// Makes `dir` (and its parents) exist, with mode `0700` on `dir` itself.
pub fn private_dir(dir: &Path) -> Result<(), SocketError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io_err("create directory", dir))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .map_err(io_err("chmod 0700", dir))
}

/// Binds a Unix socket at `path` with mode `0600`.
///
/// A missing parent is created with mode `0700`; an existing parent (such as the kubelet's
/// `plugins_registry`) keeps its mode. The socket is bound in a private `0700` staging directory
/// beside `path`, made `0600`, then renamed into place, so it is never reachable with looser
/// permissions. An existing socket at `path` (left by a previous run) is replaced; any other
/// kind of file there is an error and is not touched. Must be called inside a tokio runtime.
pub fn bind_private(path: &Path) -> Result<BoundSocket, SocketError> {
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if !parent.is_dir() {
        private_dir(parent)?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            std::fs::remove_file(path).map_err(io_err("remove stale socket", path))?;
        }
        Ok(_) => return Err(SocketError::NotASocket(path.to_path_buf())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err("stat", path)(e)),
    }
    let staging = parent.join(format!(".bind-{}-{}", std::process::id(), unique()));
    private_dir(&staging)?;
    let staged = staging.join("s");
    let bound = (|| {
        let listener = UnixListener::bind(&staged).map_err(io_err("bind", &staged))?;
        std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o600))
            .map_err(io_err("chmod 0600", &staged))?;
        std::fs::rename(&staged, path).map_err(io_err("move socket into place", path))?;
        Ok(listener)
    })();
    let _ = std::fs::remove_file(&staged);
    let _ = std::fs::remove_dir(&staging);
    let listener = bound?;
    Ok(BoundSocket {
        listener: Some(listener),
        path: path.to_path_buf(),
        identity: identity(path),
    })
}

/// A number distinct per call within this process.
fn unique() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[tokio::test]
    async fn sockets_are_private_and_removed_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/plugin.sock");
        let bound = bind_private(&path).unwrap();
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(path.parent().unwrap()), 0o700);
        drop(bound);
        assert!(!path.exists());
    }

    #[tokio::test]
    async fn an_existing_parent_keeps_its_mode_and_no_staging_is_left() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = dir.path().join("plugin.sock");
        let bound = bind_private(&path).unwrap();
        assert_eq!(mode(dir.path()), 0o755);
        assert_eq!(mode(&path), 0o600);
        let entries: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(entries.len(), 1, "only the socket");
        std::os::unix::net::UnixStream::connect(&path).expect("reachable after the rename");
        drop(bound);
    }

    #[tokio::test]
    async fn a_stale_socket_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("plugin.sock");
        let stale = std::os::unix::net::UnixListener::bind(&path).unwrap();
        drop(stale);
        assert!(is_socket(&path));
        let bound = bind_private(&path).unwrap();
        assert!(is_socket(bound.path()));
    }

    #[tokio::test]
    async fn a_socket_that_replaced_ours_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("plugin.sock");
        let ours = bind_private(&path).unwrap();
        assert!(ours.is_in_place());
        // Another process takes the path (a restarting kubelet removed ours, a new plugin bound).
        std::fs::remove_file(&path).unwrap();
        let theirs = std::os::unix::net::UnixListener::bind(&path).unwrap();
        assert!(!ours.is_in_place());
        drop(ours);
        assert!(is_socket(&path), "their socket is still there");
        drop(theirs);
        let again = bind_private(&path).unwrap();
        drop(again);
        assert!(!path.exists(), "ours is removed on drop");
    }

    #[tokio::test]
    async fn a_regular_file_is_never_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("plugin.sock");
        std::fs::write(&path, b"keep me").unwrap();
        let err = bind_private(&path).unwrap_err();
        assert!(matches!(err, SocketError::NotASocket(_)), "{err}");
        assert_eq!(std::fs::read(&path).unwrap(), b"keep me");
    }
}
