//! The driver's device nodes: control nodes, each GPU's `/dev/nvidia<minor>`, and the
//! `nvidia-caps` nodes of a MIG device's GPU and compute instance (numbers from `/proc`).

use super::{
    CAPABILITIES_DIR, CAPS_DEV_DIR, CONTROL_NODES, CapNode, Entry, Missing, Tree, resolve,
};
use std::path::{Path, PathBuf};
fn is_node(tree: &dyn Tree, path: &Path) -> bool {
    matches!(
        resolve(tree, path),
        Some((_, Entry::CharDevice | Entry::File { .. }))
    )
}

/// The control nodes present in the dev tree.
pub fn control_nodes(dev: &dyn Tree) -> Vec<PathBuf> {
    CONTROL_NODES
        .iter()
        .map(PathBuf::from)
        .filter(|p| is_node(dev, p))
        .collect()
}

/// `/dev/nvidia<minor>`, or what is missing.
pub fn gpu_node(dev: &dyn Tree, minor: u32) -> Result<PathBuf, Missing> {
    let path = PathBuf::from(format!("/dev/nvidia{minor}"));
    if is_node(dev, &path) {
        Ok(path)
    } else {
        Err(Missing {
            item: path.display().to_string(),
            looked: vec![path.display().to_string()],
        })
    }
}

/// The major of `name` in the character-device section of `/proc/devices`.
pub fn char_major(proc_devices: &str, name: &str) -> Option<u32> {
    let mut in_char = false;
    for line in proc_devices.lines() {
        let line = line.trim();
        if line.ends_with(':') {
            in_char = line == "Character devices:";
            continue;
        }
        let mut parts = line.split_whitespace();
        if let (true, Some(major), Some(n)) = (in_char, parts.next(), parts.next())
            && n == name
        {
            return major.parse().ok();
        }
    }
    None
}

/// `DeviceFileMinor` and `DeviceFileMode` of a capability `access` file.
pub fn parse_access(text: &str) -> Option<(u32, Option<u32>)> {
    let field = |key: &str| {
        text.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k.trim() == key).then(|| v.trim().parse::<u32>().ok())?
        })
    };
    Some((field("DeviceFileMinor")?, field("DeviceFileMode")))
}

/// The capability nodes of a MIG device (GPU instance `gi`, compute instance `ci` on the GPU with
/// minor `parent_minor`), from `/proc` of the node; or what is missing.
pub fn mig_caps(
    proc: &dyn Tree,
    parent_minor: u32,
    gi: u32,
    ci: u32,
) -> Result<Vec<CapNode>, Missing> {
    let devices = Path::new("/proc/devices");
    let gi_dir = Path::new(CAPABILITIES_DIR).join(format!("gpu{parent_minor}/mig/gi{gi}"));
    let access = [
        gi_dir.join("access"),
        gi_dir.join(format!("ci{ci}")).join("access"),
    ];
    let missing = |item: String| Missing {
        item,
        looked: std::iter::once(devices)
            .chain(access.iter().map(PathBuf::as_path))
            .map(|p| p.display().to_string())
            .collect(),
    };
    let major = proc
        .read(devices)
        .and_then(|t| char_major(&t, "nvidia-caps"))
        .ok_or_else(|| missing("the nvidia-caps major".to_owned()))?;
    access
        .iter()
        .map(|path| {
            let (minor, mode) = proc
                .read(path)
                .and_then(|t| parse_access(&t))
                .ok_or_else(|| missing(format!("{}", path.display())))?;
            Ok(CapNode {
                path: Path::new(CAPS_DEV_DIR).join(format!("nvidia-cap{minor}")),
                major,
                minor,
                mode,
            })
        })
        .collect()
}
