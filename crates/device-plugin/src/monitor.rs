//! Reads NVML after start, on a thread of its own: device events as they come, and a probe of
//! every GPU each interval for what events do not report (a GPU fallen off the bus, a query that
//! fails).

use gpu_discovery::{DeviceEvent, InitMode, NvmlSession};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// What the monitor saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Observation {
    /// A device event.
    Event(DeviceEvent),
    /// A probe: the UUIDs of the GPUs read fine, and the NVML index and error of those that were
    /// not.
    Probe {
        /// UUIDs read.
        readable: Vec<String>,
        /// `(index, error)` of the GPUs that could not be read.
        unreadable: Vec<(u32, String)>,
    },
    /// NVML itself failed (not one GPU): nothing is known about the devices.
    NvmlFailed(String),
}

/// Starts the monitor on NVML loaded from `library`; it runs until `tx` is closed.
pub fn spawn(
    library: PathBuf,
    interval: Duration,
    tx: mpsc::UnboundedSender<Observation>,
) -> std::thread::JoinHandle<()> {
    std::thread::Builder::new()
        .name("nvml-monitor".into())
        .spawn(move || run(&library, interval, &tx))
        .expect("spawning the NVML monitor thread")
}

fn run(library: &std::path::Path, interval: Duration, tx: &mpsc::UnboundedSender<Observation>) {
    while !tx.is_closed() {
        let session = match NvmlSession::open(library, InitMode::Full) {
            Ok(s) => s,
            Err(e) => {
                let _ = tx.send(Observation::NvmlFailed(e.to_string()));
                std::thread::sleep(interval);
                continue;
            }
        };
        watch(&session, interval, tx);
    }
}

/// Watches one session until NVML fails or `tx` closes.
fn watch(session: &NvmlSession, interval: Duration, tx: &mpsc::UnboundedSender<Observation>) {
    let events = session
        .watch_events()
        .inspect_err(|e| tracing::warn!(error = %e, "NVML events unavailable; probing only"))
        .ok();
    for e in events.iter().flat_map(|w| &w.skipped) {
        tracing::warn!(error = %e, "a GPU's NVML events are not watched; probes still cover it");
    }
    loop {
        let deadline = Instant::now() + interval;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let Some(events) = &events else {
                std::thread::sleep(left);
                break;
            };
            match events.next(left) {
                Ok(Some(event)) => {
                    if tx.send(Observation::Event(event)).is_err() {
                        return;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "waiting for NVML events failed");
                    std::thread::sleep(left);
                    break;
                }
            }
        }
        let observation = match session.inventory() {
            Ok(inventory) => Observation::Probe {
                readable: inventory.gpus.into_iter().map(|g| g.uuid).collect(),
                unreadable: inventory
                    .unreadable
                    .into_iter()
                    .map(|u| (u.index, u.error))
                    .collect(),
            },
            Err(e) => Observation::NvmlFailed(e.to_string()),
        };
        let failed = matches!(observation, Observation::NvmlFailed(_));
        if tx.send(observation).is_err() || failed {
            return;
        }
    }
}
