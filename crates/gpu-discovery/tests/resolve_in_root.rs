//! Symlinks inside a driver root resolve the way they do on the node, where the root is `/`:
//! whatever their targets (absolute, relative, `..` to any depth), resolution never leaves the
//! root. Checked on real files: a secret beside the root must never be what a path resolves to.

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use gpu_discovery::driver_files::{Entry, RootTree, host_path, resolve};
use proptest::prelude::*;

const SECRET: &[u8] = b"outside the driver root";
/// The places links live at, inside the root.
const LINKS: [&str; 4] = ["/lib", "/usr/lib/libnvidia-ml.so.1", "/usr/lib/x/y", "/a"];

/// A symlink target: components among `..`, `.`, names that exist, and the secret's name, either
/// absolute or relative.
fn target() -> impl Strategy<Value = String> {
    let part = prop::sample::select(vec!["..", ".", "usr", "lib", "x", "a", "secret", "root"]);
    (any::<bool>(), prop::collection::vec(part, 1..8)).prop_map(|(absolute, parts)| {
        let joined = parts.join("/");
        if absolute {
            format!("/{joined}")
        } else {
            joined
        }
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn no_symlink_resolves_out_of_the_root(targets in prop::collection::vec(target(), LINKS.len())) {
        let dir = tempfile::tempdir().unwrap();
        // dir/secret and dir/root/secret-free tree: `..` from the root must stay at the root.
        std::fs::write(dir.path().join("secret"), SECRET).unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("usr/lib/x")).unwrap();
        std::fs::write(root.join("usr/lib/real"), b"inside").unwrap();
        for (link, target) in LINKS.iter().zip(&targets) {
            let at = host_path(&root, Path::new(link));
            let _ = std::fs::remove_dir_all(&at);
            symlink(target, &at).unwrap();
        }
        let tree = RootTree::new(&root);
        // The links themselves, and paths that go through them as directories.
        let through = ["/lib/secret", "/usr/lib/x/y/secret", "/a/secret", "/a/../secret", "/lib/x/../../secret"];
        for start in LINKS.iter().chain(&through) {
            if let Some((path, entry)) = resolve(&tree, Path::new(start)) {
                prop_assert!(path.is_absolute(), "{path:?}");
                prop_assert!(
                    path.components().all(|c| !matches!(c, std::path::Component::ParentDir)),
                    "{path:?} still has ..");
                let real: PathBuf = host_path(&root, &path);
                prop_assert!(real.starts_with(&root), "{start} -> {path:?} -> {real:?}");
                if let Entry::File { len } = entry {
                    let bytes = std::fs::read(&real).unwrap();
                    prop_assert_eq!(bytes.len() as u64, len);
                    prop_assert_ne!(bytes.as_slice(), SECRET, "{} reached the secret via {:?}", start, targets);
                }
            }
        }
    }
}

#[test]
fn a_directory_symlink_on_the_way_does_not_lead_out() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("secret"), SECRET).unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir_all(root.join("usr/lib/x")).unwrap();
    // /lib -> .. : on the node, the root's parent is the root itself.
    symlink("..", root.join("lib")).unwrap();
    symlink("../../../lib/secret", root.join("usr/lib/x/y")).unwrap();
    let tree = RootTree::new(&root);
    let found = resolve(&tree, Path::new("/usr/lib/x/y"));
    if let Some((path, Entry::File { .. })) = &found {
        let bytes = std::fs::read(host_path(&root, path)).unwrap();
        assert_ne!(
            bytes.as_slice(),
            SECRET,
            "resolved to the secret outside the root: {path:?}"
        );
    }
    assert_eq!(
        resolve(&tree, Path::new("/lib/secret")),
        None,
        "/lib/secret is /secret on the node: absent"
    );
}
