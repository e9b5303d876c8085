//! Command line, environment and config file of `gpu-device-plugin`.
//!
//! The config file is the upstream device plugin's (`version: v1`, `flags.migStrategy`,
//! `sharing.timeSlicing`), so a ConfigMap written for it serves this plugin unchanged; the
//! `MIG_STRATEGY` flag applies when the file does not set one.

use api::contract::{env, paths};
use clap::Parser;
use node_agent::flags::NodeFlags;
use serde::Deserialize;
use std::path::{Path, PathBuf};

pub use api::gpucluster::MigStrategy;

/// The config file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// Format version; only `v1`.
    pub version: String,
    /// Flags that override the command line.
    #[serde(default)]
    pub flags: Flags,
    /// How devices are shared.
    #[serde(default)]
    pub sharing: Sharing,
}

/// Flags of the config file. Unknown upstream flags are accepted and ignored.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Flags {
    /// The MIG strategy.
    #[serde(default)]
    pub mig_strategy: Option<MigStrategy>,
}

/// Sharing settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Sharing {
    /// Time-slicing: each device offered as several replicas.
    #[serde(default)]
    pub time_slicing: Option<TimeSlicing>,
}

/// Time-slicing settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TimeSlicing {
    /// Rename every shared resource to `<name>.shared` unless it names its own.
    #[serde(default)]
    pub rename_by_default: bool,
    /// Refuse an allocation of more than one replica (a container asking for two replicas of one
    /// GPU gets no more compute than with one).
    #[serde(default)]
    pub fail_requests_greater_than_one: bool,
    /// The resources shared.
    #[serde(default)]
    pub resources: Vec<SharedResource>,
}

/// One shared resource.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SharedResource {
    /// The resource as it would be offered unshared (`nvidia.com/gpu`, `nvidia.com/mig-1g.5gb`).
    pub name: String,
    /// The name to offer it under instead.
    #[serde(default)]
    pub rename: Option<String>,
    /// Replicas per device, at least 2.
    pub replicas: u32,
    /// Accepted for compatibility; devices are always split whole.
    #[serde(default)]
    pub devices: Option<serde_json::Value>,
}

/// Why the config file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// Unreadable.
    #[error("reading the config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Not the expected YAML.
    #[error("the config file {path} is not a device plugin config: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Why.
        source: serde_yaml::Error,
    },
    /// Parsed, but not valid.
    #[error("the config file {path}: {reason}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong and how to fix it.
        reason: String,
    },
}

impl FileConfig {
    /// Reads and checks the file at `path`.
    pub fn read(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text).map_err(|e| match e {
            ParseError::Yaml(source) => ConfigError::Parse {
                path: path.to_path_buf(),
                source,
            },
            ParseError::Invalid(reason) => ConfigError::Invalid {
                path: path.to_path_buf(),
                reason,
            },
        })
    }

    /// Parses and checks a config.
    pub fn parse(text: &str) -> Result<Self, ParseError> {
        let config: Self = serde_yaml::from_str(text).map_err(ParseError::Yaml)?;
        config.check().map_err(ParseError::Invalid)?;
        Ok(config)
    }

    fn check(&self) -> Result<(), String> {
        if self.version != "v1" {
            return Err(format!(
                "version {:?} is not supported; set version: v1",
                self.version
            ));
        }
        let Some(ts) = &self.sharing.time_slicing else {
            return Ok(());
        };
        let mut seen = std::collections::BTreeSet::new();
        for r in &ts.resources {
            for name in std::iter::once(&r.name).chain(&r.rename) {
                if !is_resource_name(name) {
                    return Err(format!(
                        "sharing.timeSlicing.resources: {name:?} is not an extended resource name; use <domain>/<name>, such as nvidia.com/gpu"
                    ));
                }
            }
            if r.replicas < 2 {
                return Err(format!(
                    "sharing.timeSlicing.resources[{}].replicas is {}; a shared resource needs at least 2 replicas",
                    r.name, r.replicas
                ));
            }
            if !seen.insert(r.name.as_str()) {
                return Err(format!(
                    "sharing.timeSlicing.resources lists {} twice",
                    r.name
                ));
            }
        }
        Ok(())
    }
}

/// Whether `name` can name an extended resource: `<domain>/<name>`, a lower-case DNS domain and a
/// name of letters, digits, `-`, `_` and `.` starting and ending with a letter or digit, at most
/// 63 characters (which also keeps its socket path short).
pub fn is_resource_name(name: &str) -> bool {
    let Some((domain, rest)) = name.split_once('/') else {
        return false;
    };
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    !domain.is_empty()
        && domain.len() <= 253
        && domain
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        && rest.len() <= 63
        && edge(rest.chars().next())
        && edge(rest.chars().last())
        && rest
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// Why a config text was refused.
#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    /// Not the expected YAML.
    #[error(transparent)]
    Yaml(serde_yaml::Error),
    /// Parsed, but not valid.
    #[error("{0}")]
    Invalid(String),
}

/// The time-slicing replicas of one resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replicas {
    /// Replicas per device.
    pub count: u32,
    /// The name offered.
    pub offered_as: String,
}

impl TimeSlicing {
    /// The replicas of `resource`, or `None` when it is not shared.
    pub fn replicas(&self, resource: &str) -> Option<Replicas> {
        let r = self.resources.iter().find(|r| r.name == resource)?;
        let offered_as = match (&r.rename, self.rename_by_default) {
            (Some(name), _) => name.clone(),
            (None, true) => format!("{resource}.shared"),
            (None, false) => resource.to_owned(),
        };
        Some(Replicas {
            count: r.replicas,
            offered_as,
        })
    }
}

fn default_device_plugin_dir() -> PathBuf {
    PathBuf::from(paths::DEFAULT_KUBELET_ROOT).join("device-plugins")
}

/// `gpu-device-plugin`: serves this node's GPUs to the kubelet as extended resources, injected
/// into containers through CDI.
#[derive(Debug, Clone, Parser)]
#[command(name = "gpu-device-plugin", version)]
pub struct Config {
    /// The node served (for logs and events).
    #[arg(long, env = env::NODE_NAME, default_value = "")]
    pub node_name: String,
    /// What every node agent takes: the driver's roots, CDI, health timings, metrics, logs.
    #[command(flatten)]
    pub node: NodeFlags,
    /// MIG strategy when the config file sets none.
    #[arg(long, env = env::MIG_STRATEGY, default_value = "none")]
    pub mig_strategy: MigStrategy,
    /// The upstream-format config file (MIG strategy, time-slicing); none when unset or empty.
    #[arg(long, env = env::CONFIG_FILE)]
    pub config_file: Option<PathBuf>,
    /// The kubelet's device-plugins directory (its `kubelet.sock` and the plugin sockets).
    #[arg(long, env = env::DEVICE_PLUGIN_PATH, default_value_os_t = default_device_plugin_dir())]
    pub device_plugin_path: PathBuf,
}

/// What the plugin offers, from the flags and the config file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Offer {
    /// The MIG strategy in force.
    pub mig_strategy: MigStrategy,
    /// Time-slicing, when configured.
    pub time_slicing: Option<TimeSlicing>,
}

impl Config {
    /// The offer: the config file's settings over the flags.
    pub fn offer(&self) -> Result<Offer, ConfigError> {
        let Some(path) = self
            .config_file
            .as_ref()
            .filter(|p| !p.as_os_str().is_empty())
        else {
            return Ok(Offer {
                mig_strategy: self.mig_strategy,
                time_slicing: None,
            });
        };
        let file = FileConfig::read(path)?;
        Ok(Offer {
            mig_strategy: file.flags.mig_strategy.unwrap_or(self.mig_strategy),
            time_slicing: file.sharing.time_slicing,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_the_operator_renders_from_a_gpucluster_is_read_as_written() {
        let config: api::gpucluster::DevicePluginConfig = serde_json::from_value(serde_json::json!({
            "migStrategy": "mixed",
            "sharing": {"timeSlicing": {"failRequestsGreaterThanOne": true, "resources": [
                {"name": "nvidia.com/gpu", "replicas": 3},
                {"name": "nvidia.com/mig-1g.10gb", "rename": "example.com/small", "replicas": 2}]}}
        }))
        .unwrap();
        let c = FileConfig::parse(&config.file().unwrap()).unwrap();
        assert_eq!(c.flags.mig_strategy, Some(MigStrategy::Mixed));
        let ts = c.sharing.time_slicing.unwrap();
        assert!(ts.fail_requests_greater_than_one && !ts.rename_by_default);
        assert_eq!(ts.replicas("nvidia.com/gpu").unwrap().count, 3);
        assert_eq!(
            ts.replicas("nvidia.com/mig-1g.10gb").unwrap().offered_as,
            "example.com/small"
        );
    }

    #[test]
    fn upstream_config_parses() {
        let c = FileConfig::parse(
            "version: v1\nflags:\n  migStrategy: mixed\n  failOnInitError: true\nsharing:\n  timeSlicing:\n    renameByDefault: true\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n    - name: nvidia.com/mig-1g.5gb\n      rename: example.com/small\n      replicas: 2\n",
        )
        .unwrap();
        assert_eq!(c.flags.mig_strategy, Some(MigStrategy::Mixed));
        let ts = c.sharing.time_slicing.unwrap();
        assert_eq!(
            ts.replicas("nvidia.com/gpu"),
            Some(Replicas {
                count: 4,
                offered_as: "nvidia.com/gpu.shared".into()
            })
        );
        assert_eq!(
            ts.replicas("nvidia.com/mig-1g.5gb").unwrap().offered_as,
            "example.com/small"
        );
        assert_eq!(ts.replicas("nvidia.com/mig-2g.10gb"), None);
    }

    #[test]
    fn bad_configs_say_what_to_fix() {
        let err = |t: &str| FileConfig::parse(t).unwrap_err().to_string();
        assert!(err("version: v2\n").contains("set version: v1"));
        assert!(
            err("version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 1}\n")
                .contains("resources[nvidia.com/gpu].replicas is 1")
        );
        assert!(err("version: v1\nflags: {migStrategy: half}\n").contains("unknown variant"));
        assert!(err("version: v1\nsharing: {mps: {}}\n").contains("unknown field"));
        assert!(
            err("version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, rename: shared gpu, replicas: 2}\n")
                .contains("\"shared gpu\" is not an extended resource name")
        );
    }

    #[test]
    fn flags_apply_without_a_file() {
        let c = Config::try_parse_from(["p", "--mig-strategy", "single"]).unwrap();
        assert_eq!(c.offer().unwrap().mig_strategy, MigStrategy::Single);
        assert_eq!(
            c.device_plugin_path,
            PathBuf::from("/var/lib/kubelet/device-plugins")
        );
        let err = Config::try_parse_from(["p", "--mig-strategy", "half"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("use none, single or mixed"), "{err}");
        let c = Config::try_parse_from(["p", "--config-file", "/nonexistent/config.yaml"]).unwrap();
        let err = c.offer().unwrap_err().to_string();
        assert!(err.contains("/nonexistent/config.yaml"), "{err}");
    }
}
