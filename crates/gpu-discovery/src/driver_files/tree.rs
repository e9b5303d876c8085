//! The driver root as discovery sees it: a [`Tree`] of stat results, listings and small reads
//! with paths inside the root, [`RootTree`] answering from a mounted directory, symlinks
//! resolved inside the root, and [`host_path`] for where a found path is on the host.

use std::path::{Component, Path, PathBuf};
/// One stat result, symlinks not followed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// A regular file of this many bytes.
    File {
        /// Size in bytes.
        len: u64,
    },
    /// A directory.
    Dir,
    /// A symlink with its target as written.
    Symlink(PathBuf),
    /// A Unix socket.
    Socket,
    /// A character device.
    CharDevice,
    /// Anything else.
    Other,
}

/// What discovery reads; every path is absolute as seen inside the root.
pub trait Tree {
    /// The entry at `path`, symlinks not followed; `None` when nothing is there.
    fn entry(&self, path: &Path) -> Option<Entry>;
    /// Names in the directory at `path` (empty when it is not one).
    fn list(&self, path: &Path) -> Vec<String>;
    /// A small text file's contents.
    fn read(&self, path: &Path) -> Option<String>;
}

/// A [`Tree`] over a directory of this container.
#[derive(Debug, Clone)]
pub struct RootTree {
    root: PathBuf,
}

impl RootTree {
    /// The tree rooted at `root`.
    pub fn new(root: &Path) -> Self {
        Self {
            root: root.to_path_buf(),
        }
    }

    pub(super) fn real(&self, path: &Path) -> PathBuf {
        self.root.join(relative(path))
    }
}

impl Tree for RootTree {
    fn entry(&self, path: &Path) -> Option<Entry> {
        use std::os::unix::fs::FileTypeExt;
        let real = self.real(path);
        let meta = std::fs::symlink_metadata(&real).ok()?;
        let kind = meta.file_type();
        Some(if kind.is_symlink() {
            Entry::Symlink(std::fs::read_link(&real).ok()?)
        } else if kind.is_file() {
            Entry::File { len: meta.len() }
        } else if kind.is_dir() {
            Entry::Dir
        } else if kind.is_socket() {
            Entry::Socket
        } else if kind.is_char_device() {
            Entry::CharDevice
        } else {
            Entry::Other
        })
    }

    fn list(&self, path: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.real(path))
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .collect();
        names.sort();
        names
    }

    fn read(&self, path: &Path) -> Option<String> {
        std::fs::read_to_string(self.real(path)).ok()
    }
}

/// `path` made relative (its normal components only).
fn relative(path: &Path) -> PathBuf {
    path.components()
        .filter(|c| matches!(c, Component::Normal(_)))
        .collect()
}

/// The host path of `inside` (a path inside the root) when the root is at `host_root` on the host.
pub fn host_path(host_root: &Path, inside: &Path) -> PathBuf {
    host_root.join(relative(inside))
}

/// Follows `start` inside the tree the way the node resolves it with the tree as its `/`: one
/// component at a time, a symlink met anywhere on the way (not only at the end) replaced by its
/// target, absolute targets taken from the root, and `..` at the root staying there. Returns the
/// final path (absolute, without symlinks or `..`) and its entry; `None` when something on the
/// way is missing or not a directory, or the links loop (40 hops, as Linux allows).
pub fn resolve(tree: &dyn Tree, start: &Path) -> Option<(PathBuf, Entry)> {
    // `done` holds only real directories of the tree, so looking a name up below it follows no
    // symlink of the container's own filesystem view.
    let mut done = PathBuf::from("/");
    let mut todo = steps(start);
    let mut hops = 0;
    let mut last = Entry::Dir;
    while let Some(step) = todo.pop_front() {
        match step {
            Step::Root => {
                done = PathBuf::from("/");
                last = Entry::Dir;
            }
            Step::Parent => {
                done.pop();
                last = Entry::Dir;
            }
            Step::Name(name) => {
                let next = done.join(name);
                match tree.entry(&next)? {
                    Entry::Symlink(target) => {
                        hops += 1;
                        if hops > 40 {
                            return None;
                        }
                        for step in steps(&target).into_iter().rev() {
                            todo.push_front(step);
                        }
                    }
                    entry => {
                        if !todo.is_empty() && entry != Entry::Dir {
                            return None;
                        }
                        done = next;
                        last = entry;
                    }
                }
            }
        }
    }
    Some((done, last))
}

/// One step of a path walk.
enum Step {
    Root,
    Parent,
    Name(std::ffi::OsString),
}

fn steps(path: &Path) -> std::collections::VecDeque<Step> {
    path.components()
        .filter_map(|c| match c {
            Component::RootDir | Component::Prefix(_) => Some(Step::Root),
            Component::ParentDir => Some(Step::Parent),
            Component::Normal(n) => Some(Step::Name(n.to_os_string())),
            Component::CurDir => None,
        })
        .collect()
}
