//! Reads NVML after start, on a thread of its own: device events as they come, and a probe of
//! every GPU each interval for what events do not report (a GPU fallen off the bus, a query that
//! fails).

use crate::{DeviceEvent, InitMode, NvmlSession, UnreadableGpu};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// What the monitor saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Observation {
    /// A device event.
    Event(DeviceEvent),
    /// A probe: the UUIDs of the GPUs read fine, and those that were not.
    Probe {
        /// UUIDs read.
        readable: Vec<String>,
        /// The GPUs that could not be read.
        unreadable: Vec<UnreadableGpu>,
    },
    /// NVML itself failed (not one GPU): nothing is known about the devices.
    NvmlFailed(String),
}

/// Where observations go: returns `false` once nobody listens, which stops the monitor.
pub trait Sink: FnMut(Observation) -> bool + Send + 'static {}
impl<F: FnMut(Observation) -> bool + Send + 'static> Sink for F {}

/// Starts the monitor on NVML loaded from `library`; it runs until `sink` returns `false`.
pub fn spawn(
    library: PathBuf,
    interval: Duration,
    mut sink: impl Sink,
) -> std::thread::JoinHandle<()> {
    std::thread::Builder::new()
        .name("nvml-monitor".into())
        .spawn(move || run(&library, interval, &mut sink))
        .expect("spawning the NVML monitor thread")
}

fn run(library: &std::path::Path, interval: Duration, sink: &mut impl Sink) {
    loop {
        let session = match NvmlSession::open(library, InitMode::Full) {
            Ok(s) => s,
            Err(e) => {
                if !sink(Observation::NvmlFailed(e.to_string())) {
                    return;
                }
                std::thread::sleep(interval);
                continue;
            }
        };
        if !watch(&session, interval, sink) {
            return;
        }
    }
}

/// Watches one session until NVML fails (returns `true`: open it again) or the sink stops
/// listening (`false`).
fn watch(session: &NvmlSession, interval: Duration, sink: &mut impl Sink) -> bool {
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
                    if !sink(Observation::Event(event)) {
                        return false;
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
                unreadable: inventory.unreadable,
            },
            Err(e) => Observation::NvmlFailed(e.to_string()),
        };
        let failed = matches!(observation, Observation::NvmlFailed(_));
        if !sink(observation) {
            return false;
        }
        if failed {
            return true;
        }
    }
}
