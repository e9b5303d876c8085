//! MPS per claim: the control daemon a claim's `sharing: {strategy: MPS, mpsConfig: ...}` asks
//! for, serving the claim's devices only, with the claim's limits.
//!
//! The daemon of claim `<uid>` has its pipe and log directories under `<mps root>/claim-<uid>/`
//! (beside the per-GPU daemons of GPU classes' shares, `<mps root>/<GPU UUID>`); CDI gives the
//! claim's containers both, with the limits in their environment. How the daemon runs is
//! [`MpsDaemons`]'s business ([`crate::mps_pods`] runs it in a pod of its own, so it outlives
//! a restart of the plugin). The driver checkpoints the daemon before starting it, stops it at
//! unprepare, and [`crate::driver::Driver::sweep_mps_daemons`] stops at start whatever a crash
//! left running for a claim that is no longer prepared.

use crate::opaque::MpsConfig;
use api::contract::paths;
use api::gpuclass::variants::quantity_bytes;
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The MPS control daemon of one claim, as checkpointed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MpsDaemon {
    /// UUIDs of the devices it serves (its `CUDA_VISIBLE_DEVICES`), in allocation order.
    pub devices: Vec<String>,
    /// `defaultActiveThreadPercentage`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_thread_percentage: Option<u8>,
    /// Pinned device memory limit in MiB by index into `devices`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pinned_memory_mib: BTreeMap<usize, u64>,
}

impl MpsDaemon {
    /// The daemon `config` asks for on `devices` (UUIDs): the default pinned limit applies to
    /// every device, a per-device limit (keyed by UUID or by index into `devices`) to its own.
    pub fn from_config(config: &MpsConfig, devices: Vec<String>) -> Result<Self, String> {
        if config.multi_user == Some(true) {
            return Err("mpsConfig.multiUser is not supported by this plugin yet".into());
        }
        let active_thread_percentage = config
            .default_active_thread_percentage
            .map(|p| {
                u8::try_from(p)
                    .ok()
                    .filter(|p| (1..=100).contains(p))
                    .ok_or_else(|| {
                        format!("mpsConfig.defaultActiveThreadPercentage {p} is not within 1..100")
                    })
            })
            .transpose()?;
        let mib = |field: &str, text: &str| {
            quantity_bytes(text)
                .map(|b| u64::try_from(b >> 20).unwrap_or(u64::MAX))
                .filter(|m| *m > 0)
                .ok_or_else(|| {
                    format!("mpsConfig.{field} {text:?} is not a memory quantity of at least 1Mi")
                })
        };
        let mut pinned_memory_mib = BTreeMap::new();
        if let Some(limit) = &config.default_pinned_device_memory_limit {
            let limit = mib("defaultPinnedDeviceMemoryLimit", limit)?;
            pinned_memory_mib.extend((0..devices.len()).map(|i| (i, limit)));
        }
        for (key, limit) in config
            .default_per_device_pinned_memory_limit
            .iter()
            .flatten()
        {
            let index = devices
                .iter()
                .position(|uuid| uuid == key)
                .or_else(|| key.parse().ok().filter(|i| *i < devices.len()))
                .ok_or_else(|| {
                    format!(
                        "mpsConfig.defaultPerDevicePinnedMemoryLimit names {key:?}, which is neither the UUID nor the index of one of the claim's devices ({})",
                        devices.join(", ")
                    )
                })?;
            let field = format!("defaultPerDevicePinnedMemoryLimit[{key}]");
            pinned_memory_mib.insert(index, mib(&field, limit)?);
        }
        Ok(Self {
            devices,
            active_thread_percentage,
            pinned_memory_mib,
        })
    }

    /// The limits as the MPS environment variables that set them, for the daemon and its
    /// clients alike: `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` and `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`
    /// (`<index>=<MiB>M,...`).
    pub fn limits_env(&self) -> Vec<(&'static str, String)> {
        let mut env = Vec::new();
        if let Some(p) = self.active_thread_percentage {
            env.push(("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", p.to_string()));
        }
        if !self.pinned_memory_mib.is_empty() {
            let limits: Vec<String> = self
                .pinned_memory_mib
                .iter()
                .map(|(i, mib)| format!("{i}={mib}M"))
                .collect();
            env.push(("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", limits.join(",")));
        }
        env
    }
}

/// Where a container finds its MPS daemon's log directory.
pub const LOG_CTR_PATH: &str = "/var/log/nvidia-mps";

/// The host directory of claim `uid`'s daemon, below `mps_root`.
pub fn claim_dir(mps_root: &Path, uid: &str) -> PathBuf {
    mps_root.join(format!("{CLAIM_DIR_PREFIX}{uid}"))
}

/// Its `CUDA_MPS_PIPE_DIRECTORY` (the control socket is `control` in it).
pub fn pipe_dir(mps_root: &Path, uid: &str) -> PathBuf {
    claim_dir(mps_root, uid).join("pipe")
}

/// Its `CUDA_MPS_LOG_DIRECTORY`.
pub fn log_dir(mps_root: &Path, uid: &str) -> PathBuf {
    claim_dir(mps_root, uid).join("log")
}

const CLAIM_DIR_PREFIX: &str = "claim-";

/// The claim UIDs whose daemon directories are below `mps_root`.
pub fn claim_dirs(mps_root: &Path) -> std::io::Result<Vec<String>> {
    let entries = match std::fs::read_dir(mps_root) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        entries => entries?,
    };
    let mut uids = Vec::new();
    for entry in entries {
        let name = entry?.file_name();
        if let Some(uid) = name.to_str().and_then(|n| n.strip_prefix(CLAIM_DIR_PREFIX)) {
            uids.push(uid.to_owned());
        }
    }
    uids.sort();
    Ok(uids)
}

/// Mount paths a claim's containers get: the pipe directory at [`paths::MPS_PIPE_CTR_PATH`] and
/// the log directory at [`LOG_CTR_PATH`], as `(host, container)`.
pub fn container_dirs(mps_root: &Path, uid: &str) -> [(PathBuf, &'static str); 2] {
    [
        (pipe_dir(mps_root, uid), paths::MPS_PIPE_CTR_PATH),
        (log_dir(mps_root, uid), LOG_CTR_PATH),
    ]
}

/// Runs and stops the MPS control daemons of claims.
pub trait MpsDaemons: Send + Sync + std::fmt::Debug {
    /// Starts claim `uid`'s daemon (again, if it already runs: the same one) and returns once
    /// its control socket answers; the error says what failed.
    fn start<'a>(
        &'a self,
        uid: &'a str,
        daemon: &'a MpsDaemon,
    ) -> BoxFuture<'a, Result<(), String>>;
    /// Stops claim `uid`'s daemon and removes its directory; succeeds when there is none.
    fn stop<'a>(&'a self, uid: &'a str) -> BoxFuture<'a, Result<(), String>>;
    /// The claim UIDs that have a daemon or a daemon directory on this node.
    fn present(&self) -> BoxFuture<'_, Result<Vec<String>, String>>;
}

/// No way to run daemons: claims that ask for MPS are refused, saying why.
#[derive(Debug, Clone)]
pub struct Unavailable(pub String);

impl MpsDaemons for Unavailable {
    fn start<'a>(&'a self, _: &'a str, _: &'a MpsDaemon) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move { Err(self.0.clone()) })
    }
    fn stop<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async { Ok(()) })
    }
    fn present(&self) -> BoxFuture<'_, Result<Vec<String>, String>> {
        Box::pin(async { Ok(Vec::new()) })
    }
}

#[cfg(test)]
pub(crate) mod fake {
    use super::*;
    use std::collections::BTreeSet;
    use std::sync::Mutex;

    /// Keeps the daemons it runs in a set (and creates their pipe directories below `root`);
    /// fails to start those of UIDs told to.
    #[derive(Debug, Default)]
    pub struct Daemons {
        /// Where the daemon directories go.
        pub root: PathBuf,
        /// Running daemons by claim UID.
        pub running: Mutex<BTreeMap<String, MpsDaemon>>,
        /// Claim UIDs whose start fails.
        pub failing: Mutex<BTreeSet<String>>,
    }

    impl MpsDaemons for Daemons {
        fn start<'a>(
            &'a self,
            uid: &'a str,
            daemon: &'a MpsDaemon,
        ) -> BoxFuture<'a, Result<(), String>> {
            Box::pin(async move {
                std::fs::create_dir_all(pipe_dir(&self.root, uid)).map_err(|e| e.to_string())?;
                self.running
                    .lock()
                    .unwrap()
                    .insert(uid.to_owned(), daemon.clone());
                if self.failing.lock().unwrap().contains(uid) {
                    return Err(format!("the daemon of {uid} did not come up"));
                }
                Ok(())
            })
        }
        fn stop<'a>(&'a self, uid: &'a str) -> BoxFuture<'a, Result<(), String>> {
            Box::pin(async move {
                self.running.lock().unwrap().remove(uid);
                match std::fs::remove_dir_all(claim_dir(&self.root, uid)) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.to_string()),
                    _ => Ok(()),
                }
            })
        }
        fn present(&self) -> BoxFuture<'_, Result<Vec<String>, String>> {
            Box::pin(async move {
                let mut uids: BTreeSet<String> =
                    self.running.lock().unwrap().keys().cloned().collect();
                uids.extend(claim_dirs(&self.root).map_err(|e| e.to_string())?);
                Ok(uids.into_iter().collect())
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(json: &str) -> MpsConfig {
        serde_json::from_str(json).unwrap()
    }

    fn uuids() -> Vec<String> {
        vec!["GPU-a".into(), "GPU-b".into()]
    }

    #[test]
    fn the_upstream_documented_config_becomes_the_mps_environment() {
        let daemon = MpsDaemon::from_config(
            &config(
                r#"{"defaultActiveThreadPercentage":50,"defaultPinnedDeviceMemoryLimit":"10Gi"}"#,
            ),
            uuids(),
        )
        .unwrap();
        assert_eq!(
            daemon.limits_env(),
            vec![
                ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "50".to_owned()),
                (
                    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
                    "0=10240M,1=10240M".to_owned()
                ),
            ]
        );
    }

    #[test]
    fn a_per_device_limit_by_uuid_or_index_overrides_the_default() {
        let daemon = MpsDaemon::from_config(
            &config(
                r#"{"defaultPinnedDeviceMemoryLimit":"4Gi",
                    "defaultPerDevicePinnedMemoryLimit":{"GPU-b":"1Gi"}}"#,
            ),
            uuids(),
        )
        .unwrap();
        assert_eq!(
            daemon.pinned_memory_mib,
            BTreeMap::from([(0, 4096), (1, 1024)])
        );
        let by_index = MpsDaemon::from_config(
            &config(r#"{"defaultPerDevicePinnedMemoryLimit":{"0":"512Mi"}}"#),
            uuids(),
        )
        .unwrap();
        assert_eq!(by_index.limits_env()[0].1, "0=512M");
        assert!(
            MpsDaemon::from_config(&config("{}"), uuids())
                .unwrap()
                .limits_env()
                .is_empty()
        );
    }

    #[test]
    fn bad_settings_are_refused_naming_the_field() {
        let refused = |json: &str| MpsDaemon::from_config(&config(json), uuids()).unwrap_err();
        assert!(
            refused(r#"{"defaultActiveThreadPercentage":150}"#)
                .contains("150 is not within 1..100")
        );
        assert!(
            refused(r#"{"defaultPinnedDeviceMemoryLimit":"lots"}"#)
                .contains("defaultPinnedDeviceMemoryLimit \"lots\"")
        );
        let unknown = refused(r#"{"defaultPerDevicePinnedMemoryLimit":{"GPU-z":"1Gi"}}"#);
        assert!(
            unknown.contains("\"GPU-z\"") && unknown.contains("GPU-a, GPU-b"),
            "{unknown}"
        );
        assert!(refused(r#"{"defaultPerDevicePinnedMemoryLimit":{"2":"1Gi"}}"#).contains("\"2\""));
        assert!(refused(r#"{"multiUser":true}"#).contains("multiUser"));
    }

    #[test]
    fn claim_directories_are_found_beside_the_per_gpu_ones() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(pipe_dir(dir.path(), "u1")).unwrap();
        std::fs::create_dir_all(dir.path().join("GPU-a")).unwrap();
        assert_eq!(claim_dirs(dir.path()).unwrap(), vec!["u1".to_owned()]);
        assert!(claim_dirs(&dir.path().join("absent")).unwrap().is_empty());
        assert_eq!(
            container_dirs(Path::new("/run/nvidia/mps"), "u1")[0],
            (
                PathBuf::from("/run/nvidia/mps/claim-u1/pipe"),
                "/tmp/nvidia-mps"
            )
        );
    }
}
