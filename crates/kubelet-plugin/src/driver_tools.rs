//! The driver's own command-line tools (`nvidia-smi`, `nvidia-cuda-mps-control`), found in the
//! driver root and run against the driver's libraries.

use std::path::{Path, PathBuf};

/// Where a driver install keeps its tools, inside its root.
const TOOL_DIRS: [&str; 2] = ["usr/bin", "bin"];

/// The tool `name` inside `driver_root` (relative to it), or the full paths looked at.
pub fn find(driver_root: &Path, name: &str) -> Result<PathBuf, Vec<PathBuf>> {
    let candidates: Vec<PathBuf> = TOOL_DIRS.iter().map(|d| Path::new(d).join(name)).collect();
    candidates
        .iter()
        .find(|p| driver_root.join(p).is_file())
        .cloned()
        .ok_or_else(|| candidates.iter().map(|c| driver_root.join(c)).collect())
}

/// "`<a>` or `<b>`": the paths a tool was looked for at, for an error message.
pub fn searched(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(" or ")
}

/// A command running `binary` with the driver's `library_dir` first on the loader's path, killed
/// when dropped.
pub fn command(binary: &Path, library_dir: Option<&Path>) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(binary);
    command.kill_on_drop(true);
    if let Some(dir) = library_dir {
        let mut path = dir.as_os_str().to_owned();
        if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
            path.push(":");
            path.push(old);
        }
        command.env("LD_LIBRARY_PATH", path);
    }
    command
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tool_is_found_in_either_folder_or_the_paths_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let missing = find(dir.path(), "nvidia-smi").unwrap_err();
        assert_eq!(
            searched(&missing),
            format!(
                "{0}/usr/bin/nvidia-smi or {0}/bin/nvidia-smi",
                dir.path().display()
            )
        );
        std::fs::create_dir_all(dir.path().join("bin")).unwrap();
        std::fs::write(dir.path().join("bin/nvidia-smi"), "").unwrap();
        assert_eq!(
            find(dir.path(), "nvidia-smi").unwrap(),
            PathBuf::from("bin/nvidia-smi")
        );
    }
}
