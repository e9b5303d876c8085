//! Driver file discovery over the realistic fake driver root of `testing`.

use gpu_discovery::driver_files::{self, RootTree, Tree};
use gpu_discovery::testing::{self, DRIVER_VERSION, FakeNode, mock_config};
use std::path::{Path, PathBuf};

#[test]
fn everything_in_the_fake_root_is_found_and_resolved() {
    let node = FakeNode::new();
    node.install_host_driver(&mock_config("a100-sxm4-40gb", 2));
    testing::install_persistenced_socket(&node.host_root());
    let tree = RootTree::new(&node.host_root());
    let found = driver_files::discover(&tree);
    assert!(found.missing.is_empty(), "{:?}", found.missing);
    assert_eq!(found.version.as_deref(), Some(DRIVER_VERSION));
    let lib = Path::new("/usr/lib/x86_64-linux-gnu");
    let nvml = &found.libraries[0];
    assert_eq!(nvml.file, lib.join(testing::VERSIONED_NAME));
    let cuda = &found.libraries[1];
    assert_eq!(cuda.file, lib.join(format!("libcuda.so.{DRIVER_VERSION}")));
    assert_eq!(
        cuda.links
            .iter()
            .map(|(l, _)| l.clone())
            .collect::<Vec<_>>(),
        vec![lib.join("libcuda.so"), lib.join("libcuda.so.1")]
    );
    assert_eq!(found.libraries.len(), 1 + testing::fake_libraries().count());
    assert_eq!(found.binaries.len(), 3);
    assert_eq!(
        found.firmware,
        Some(Path::new("/lib/firmware/nvidia").join(DRIVER_VERSION))
    );
    assert_eq!(
        found.ipc,
        vec![PathBuf::from("/run/nvidia-persistenced/socket")]
    );
    assert_eq!(driver_files::control_nodes(&tree).len(), 4);
    assert!(driver_files::gpu_node(&tree, 1).is_ok());
    assert!(driver_files::gpu_node(&tree, 2).is_err());
}

#[test]
fn mig_caps_are_read_from_the_fake_proc() {
    let node = FakeNode::new();
    node.install_host_driver(&mock_config("a100-sxm4-40gb-mig-mixed", 1));
    testing::install_mig_caps(&node.host_root(), 0, 7, 0, (66, 67));
    let tree = RootTree::new(&node.host_root());
    let caps = driver_files::mig_caps(&tree, 0, 7, 0).unwrap();
    assert_eq!(
        caps.iter().map(|c| (c.major, c.minor)).collect::<Vec<_>>(),
        vec![(234, 66), (234, 67)]
    );
    for cap in caps {
        assert!(
            tree.entry(&cap.path).is_some(),
            "{} has a stand-in",
            cap.path.display()
        );
    }
}
