//! The `driver-ready` env file: written by the validator, read by the kubelet plugin.
//!
//! `KEY=value` lines for `IS_HOST_DRIVER`, `NVIDIA_DRIVER_ROOT`, `DRIVER_ROOT_CTR_PATH`,
//! `NVIDIA_DEV_ROOT` and `DEV_ROOT_CTR_PATH`, written atomically so a reader never sees a part.

use crate::atomic::{Durability, replace};
use crate::driver_paths::DriverPaths;
use crate::root::{DriverLocation, DriverRoot, SearchedRoot, find_library};
use api::contract::env::{
    DEV_ROOT_CTR_PATH, DRIVER_ROOT_CTR_PATH, IS_HOST_DRIVER, NVIDIA_DEV_ROOT, NVIDIA_DRIVER_ROOT,
};
use api::contract::paths;
use std::io;
use std::path::{Path, PathBuf};

/// Default status dir of the validator.
pub const DEFAULT_STATUS_DIR: &str = paths::VALIDATIONS_DIR;
/// File name of the driver-ready file inside the status dir.
pub const FILE_NAME: &str = paths::DRIVER_READY_FILE;

/// The file's contents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverReady {
    /// The driver is installed on the host (not by a driver container).
    pub is_host_driver: bool,
    /// The driver and dev roots (`NVIDIA_DRIVER_ROOT`, `DRIVER_ROOT_CTR_PATH`, `NVIDIA_DEV_ROOT`,
    /// `DEV_ROOT_CTR_PATH`), the container paths as the validator and plugin containers see them.
    pub paths: DriverPaths,
}

impl From<&DriverRoot> for DriverReady {
    /// The file for a probed driver.
    fn from(root: &DriverRoot) -> Self {
        Self {
            is_host_driver: root.location == DriverLocation::Host,
            paths: root.paths.clone(),
        }
    }
}

/// Why a driver-ready file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    /// A line is not `KEY=value`.
    #[error("line {line}: expected KEY=value, got {text:?}")]
    Malformed {
        /// 1-based line number.
        line: usize,
        /// The line.
        text: String,
    },
    /// A key is missing.
    #[error("{0} is missing")]
    Missing(&'static str),
    /// `IS_HOST_DRIVER` is neither `true` nor `false`.
    #[error("IS_HOST_DRIVER={0:?}, expected true or false")]
    BadBool(String),
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: io::Error,
    },
}

impl DriverReady {
    /// The file text, one `KEY=value` line per key, in a fixed order.
    pub fn render(&self) -> String {
        format!(
            "{IS_HOST_DRIVER}={}\n{NVIDIA_DRIVER_ROOT}={}\n{DRIVER_ROOT_CTR_PATH}={}\n{NVIDIA_DEV_ROOT}={}\n{DEV_ROOT_CTR_PATH}={}\n",
            self.is_host_driver,
            self.paths.driver_root.display(),
            self.paths.driver_root_ctr.display(),
            self.paths.dev_root.display(),
            self.paths.dev_root_ctr.display(),
        )
    }

    /// Parses file text; blank lines and `#` comments are skipped, unknown keys ignored, and an
    /// optional `export ` prefix and quotes around values accepted (the file is also sourced by
    /// shells).
    pub fn parse(text: &str) -> Result<Self, ParseError> {
        let mut pairs = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let line = line.strip_prefix("export ").unwrap_or(line);
            let (key, value) = line.split_once('=').ok_or_else(|| ParseError::Malformed {
                line: i + 1,
                text: raw.to_owned(),
            })?;
            pairs.push((key.trim(), unquote(value.trim())));
        }
        let get = |key: &'static str| {
            pairs
                .iter()
                .rev()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| *v)
                .ok_or(ParseError::Missing(key))
        };
        let is_host_driver = match get(IS_HOST_DRIVER)? {
            "true" => true,
            "false" => false,
            other => return Err(ParseError::BadBool(other.to_owned())),
        };
        Ok(Self {
            is_host_driver,
            paths: DriverPaths {
                driver_root: get(NVIDIA_DRIVER_ROOT)?.into(),
                driver_root_ctr: get(DRIVER_ROOT_CTR_PATH)?.into(),
                dev_root: get(NVIDIA_DEV_ROOT)?.into(),
                dev_root_ctr: get(DEV_ROOT_CTR_PATH)?.into(),
            },
        })
    }

    /// Reads and parses the file at `path`.
    pub fn read(path: &Path) -> Result<Self, ParseError> {
        let text = std::fs::read_to_string(path).map_err(|source| ParseError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text)
    }

    /// Finds the driver's `libnvidia-ml.so.1` under the driver root as this container sees it
    /// (what the kubelet plugin opens NVML from after reading the file).
    pub fn nvml_library(&self) -> Result<PathBuf, SearchedRoot> {
        find_library(&self.paths.driver_root_ctr, "driver root")
    }

    /// Writes the file at `path` atomically.
    pub fn write(&self, path: &Path) -> io::Result<()> {
        replace(path, self.render().as_bytes(), Durability::Durable)
    }
}

fn unquote(value: &str) -> &str {
    for q in ['"', '\''] {
        if let Some(inner) = value.strip_prefix(q).and_then(|v| v.strip_suffix(q)) {
            return inner;
        }
    }
    value
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> DriverReady {
        DriverReady {
            is_host_driver: false,
            paths: DriverPaths {
                driver_root: "/run/nvidia/driver".into(),
                driver_root_ctr: "/driver-root".into(),
                dev_root: "/".into(),
                dev_root_ctr: "/host".into(),
            },
        }
    }

    #[test]
    fn render_then_parse_round_trips() {
        assert_eq!(DriverReady::parse(&sample().render()).unwrap(), sample());
        assert!(
            sample()
                .render()
                .starts_with("IS_HOST_DRIVER=false\nNVIDIA_DRIVER_ROOT=/run/nvidia/driver\n")
        );
    }

    #[test]
    fn shell_forms_are_accepted() {
        let text = "# written by the validator\nexport IS_HOST_DRIVER=\"false\"\nNVIDIA_DRIVER_ROOT='/run/nvidia/driver'\n\nDRIVER_ROOT_CTR_PATH=/driver-root\nNVIDIA_DEV_ROOT=/\nDEV_ROOT_CTR_PATH=/host\nEXTRA=1\n";
        assert_eq!(DriverReady::parse(text).unwrap(), sample());
    }

    #[test]
    fn missing_keys_bad_values_and_junk_are_named() {
        let text = sample().render().replace("DEV_ROOT_CTR_PATH=/host\n", "");
        assert!(matches!(
            DriverReady::parse(&text),
            Err(ParseError::Missing(DEV_ROOT_CTR_PATH))
        ));
        let text = sample().render().replace("=false", "=yes");
        assert!(matches!(DriverReady::parse(&text), Err(ParseError::BadBool(v)) if v == "yes"));
        assert!(matches!(
            DriverReady::parse("junk\n"),
            Err(ParseError::Malformed { line: 1, .. })
        ));
    }
}
