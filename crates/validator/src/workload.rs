//! `workload`: the GPUs this container was given are the ones NVML shows; then report ready.

use crate::cli::{Common, WorkloadArgs};
use crate::retry::{CommandError, Policy, Stop, retry};
use gpu_discovery::atomic::{Durability, replace};
use gpu_discovery::{InitMode, Inventory, NvmlError, NvmlSession, SearchedRoot, root};
use std::future::Future;
use std::path::Path;
use std::pin::Pin;

/// File name of the readiness marker in the output dir.
pub const READY_FILE: &str = "workload-ready";

/// One injected device, as `NVIDIA_VISIBLE_DEVICES` names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Injected {
    /// A GPU or MIG UUID.
    Uuid(String),
    /// An NVML index.
    Index(u32),
}

impl std::fmt::Display for Injected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Injected::Uuid(u) => f.write_str(u),
            Injected::Index(i) => write!(f, "index {i}"),
        }
    }
}

/// Why one attempt failed.
#[derive(Debug, thiserror::Error)]
pub enum AttemptError {
    /// No NVML library was injected.
    #[error("no NVML injected: {0}")]
    NoLibrary(Box<SearchedRoot>),
    /// NVML does not work.
    #[error(transparent)]
    Nvml(Box<NvmlError>),
    /// `NVIDIA_VISIBLE_DEVICES` names no device.
    #[error(
        "NVIDIA_VISIBLE_DEVICES={0:?} names no GPU; the claim's CDI edits should set GPU UUIDs"
    )]
    NothingInjected(String),
    /// NVML shows something else than was injected.
    #[error("expected {} (from NVIDIA_VISIBLE_DEVICES), NVML sees [{}]; missing: {}", list(.expected), .seen.join(", "), list(.missing))]
    Mismatch {
        /// What was injected.
        expected: Vec<Injected>,
        /// GPU and MIG UUIDs NVML shows.
        seen: Vec<String>,
        /// Injected devices NVML does not show.
        missing: Vec<Injected>,
    },
}

/// Why the `workload` command failed.
pub type WorkloadError = CommandError<AttemptError>;

fn list(items: &[Injected]) -> String {
    items
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Parses `NVIDIA_VISIBLE_DEVICES`; `all`, `none`, `void` and empty name no specific device.
pub fn parse_visible_devices(value: &str) -> Vec<Injected> {
    if matches!(value.trim(), "all" | "none" | "void") {
        return Vec::new();
    }
    value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse()
                .map_or_else(|_| Injected::Uuid(s.to_owned()), Injected::Index)
        })
        .collect()
}

/// Compares what was injected with what NVML shows.
pub fn check(expected: &[Injected], inventory: &Inventory) -> Result<(), AttemptError> {
    let missing: Vec<_> = expected
        .iter()
        .filter(|want| match want {
            Injected::Uuid(u) => inventory.find_uuid(u).is_none(),
            Injected::Index(i) => !inventory.gpus.iter().any(|g| g.index == *i),
        })
        .cloned()
        .collect();
    if missing.is_empty() && !inventory.gpus.is_empty() {
        return Ok(());
    }
    let seen = inventory
        .gpus
        .iter()
        .flat_map(|g| {
            std::iter::once(g.uuid.clone()).chain(g.mig_devices.iter().map(|m| m.uuid.clone()))
        })
        .collect();
    Err(AttemptError::Mismatch {
        expected: expected.to_vec(),
        seen,
        missing,
    })
}

fn attempt(driver_root: &Path, expected: &[Injected]) -> Result<Inventory, AttemptError> {
    let library = root::find_library(driver_root, "workload root")
        .map_err(|s| AttemptError::NoLibrary(Box::new(s)))?;
    let nvml = |e| AttemptError::Nvml(Box::new(e));
    let inventory = NvmlSession::open(&library, InitMode::Full)
        .map_err(nvml)?
        .inventory()
        .map_err(nvml)?;
    check(expected, &inventory)?;
    Ok(inventory)
}

/// The `workload` command: retries until the check passes, writes the readiness marker, then
/// stays up until SIGTERM and removes the marker.
pub async fn run<F: Future<Output = ()>>(
    common: &Common,
    args: &WorkloadArgs,
    mut shutdown: Pin<&mut F>,
) -> Result<(), WorkloadError> {
    let expected = parse_visible_devices(&args.visible_devices);
    if expected.is_empty() {
        return Err(CommandError::Failed(AttemptError::NothingInjected(
            args.visible_devices.clone(),
        )));
    }
    let policy = Policy {
        with_wait: true,
        interval: common.interval(),
        timeout: common.timeout(),
    };
    let inventory = match retry(policy, shutdown.as_mut(), || {
        attempt(&args.driver_root, &expected)
    })
    .await
    {
        Ok(inventory) => inventory,
        Err(Stop::Terminated) => return Ok(()),
        Err(stop) => return Err(stop.into()),
    };
    let path = common.output_dir.join(READY_FILE);
    let text: String = expected.iter().map(|e| format!("{e}\n")).collect();
    replace(&path, text.as_bytes(), Durability::Durable).map_err(|source| CommandError::Write {
        path: path.clone(),
        source,
    })?;
    tracing::info!(
        "ready: NVML shows the injected {} among {} GPU(s)",
        list(&expected),
        inventory.gpus.len()
    );
    if args.exit_when_ready {
        return Ok(());
    }
    shutdown.await;
    // The pod is going away; a stale marker must not make a later container look ready.
    let _ = std::fs::remove_file(&path);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn visible_devices_parse() {
        assert_eq!(
            parse_visible_devices("GPU-1, 3,MIG-9"),
            vec![
                Injected::Uuid("GPU-1".into()),
                Injected::Index(3),
                Injected::Uuid("MIG-9".into())
            ]
        );
        for nothing in ["all", "none", "void", "", " , "] {
            assert!(parse_visible_devices(nothing).is_empty(), "{nothing:?}");
        }
    }
}
