//! GPU health as both planes follow it: the NVML monitor runs on its own thread, its
//! observations are folded into a [`Tracker`], each change is logged with what it means on the
//! plane, and the plane's [`HealthSink`] is told, once per observation that changed something.

use crate::flags::NodeFlags;
use gpu_discovery::health::{Change, Tracker};
use gpu_discovery::monitor::{self, Observation};
use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::time::Instant;
use tokio::sync::mpsc;

/// What a plane does when GPU health changed.
pub trait HealthSink: Send + 'static {
    /// Called after an observation changed a GPU's health or whether NVML answers, once the
    /// changes are logged; `tracker` holds every GPU's health after it.
    fn changed(&mut self, tracker: &Tracker, changes: &[Change])
    -> impl Future<Output = ()> + Send;
}

/// What a change means for a plane's devices, as the log says it.
#[derive(Debug, Clone, Copy)]
pub struct Wording {
    /// When a GPU turns unhealthy (`its devices are no longer offered`).
    pub unhealthy: &'static str,
    /// When it recovers.
    pub recovered: &'static str,
    /// When NVML itself fails (`keeping what was last known`).
    pub unknown: &'static str,
}

/// The running health follower.
#[derive(Debug)]
pub struct Following {
    /// The NVML monitor's thread; it ends when the loop stops listening.
    pub monitor: std::thread::JoinHandle<()>,
    /// The loop; it ends only when the monitor died.
    pub task: tokio::task::JoinHandle<()>,
}

/// Starts the NVML monitor on `library` (probing at the flags' interval) and the loop that
/// keeps `sink` told; `gpus_by_index` names the GPUs a probe reports by NVML index.
pub fn follow(
    library: PathBuf,
    gpus_by_index: BTreeMap<u32, String>,
    flags: &NodeFlags,
    wording: Wording,
    sink: impl HealthSink,
) -> Following {
    let (tx, rx) = mpsc::unbounded_channel();
    let monitor = monitor::spawn(library, flags.health_probe_interval, move |o| {
        tx.send(o).is_ok()
    });
    let tracker = Tracker::new(flags.health_recovery_period);
    let task = tokio::spawn(track(rx, tracker, gpus_by_index, wording, sink));
    Following { monitor, task }
}

/// Folds `observations` into `tracker` until the channel closes, telling `sink` of each change.
pub async fn track(
    mut observations: mpsc::UnboundedReceiver<Observation>,
    mut tracker: Tracker,
    gpus_by_index: BTreeMap<u32, String>,
    wording: Wording,
    mut sink: impl HealthSink,
) {
    let mut nvml_failing = false;
    while let Some(observation) = observations.recv().await {
        if let (Observation::NvmlFailed(error), false) = (&observation, nvml_failing) {
            tracing::error!(%error, "NVML failed; device health unknown, {}", wording.unknown);
        }
        let changes = tracker.observe(&observation, &gpus_by_index, Instant::now());
        let failing_changed = nvml_failing != tracker.nvml_failing();
        nvml_failing = tracker.nvml_failing();
        if changes.is_empty() && !failing_changed {
            continue;
        }
        for change in &changes {
            change.log(wording.unhealthy, wording.recovered);
        }
        sink.changed(&tracker, &changes).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpu_discovery::health::Fault;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    /// One telling: the changes, and whether NVML was failing.
    type Told = (Vec<Change>, bool);

    /// Records what it was told.
    #[derive(Clone, Default)]
    struct Recorded(Arc<Mutex<Vec<Told>>>);

    impl HealthSink for Recorded {
        async fn changed(&mut self, tracker: &Tracker, changes: &[Change]) {
            self.0
                .lock()
                .unwrap()
                .push((changes.to_vec(), tracker.nvml_failing()));
        }
    }

    const WORDING: Wording = Wording {
        unhealthy: "gone",
        recovered: "back",
        unknown: "kept",
    };

    #[tokio::test]
    async fn the_sink_hears_only_of_observations_that_changed_something() {
        let (tx, rx) = mpsc::unbounded_channel();
        let by_index = BTreeMap::from([(0, "GPU-0".to_owned())]);
        let lost = gpu_discovery::UnreadableGpu {
            index: 0,
            lost: true,
            error: "fell off the bus".into(),
        };
        let probe = |unreadable: Vec<gpu_discovery::UnreadableGpu>| Observation::Probe {
            readable: if unreadable.is_empty() {
                vec!["GPU-0".into()]
            } else {
                vec![]
            },
            unreadable,
        };
        tx.send(probe(vec![])).unwrap();
        tx.send(probe(vec![lost.clone()])).unwrap();
        tx.send(probe(vec![lost])).unwrap();
        tx.send(Observation::NvmlFailed("gone".into())).unwrap();
        tx.send(Observation::NvmlFailed("still".into())).unwrap();
        drop(tx);
        let sink = Recorded::default();
        track(
            rx,
            Tracker::new(Duration::from_secs(60)),
            by_index,
            WORDING,
            sink.clone(),
        )
        .await;
        let told = sink.0.lock().unwrap().clone();
        assert_eq!(
            told,
            vec![
                (
                    vec![Change::Unhealthy {
                        gpu: "GPU-0".into(),
                        fault: Fault::Lost("fell off the bus".into()),
                    }],
                    false
                ),
                (vec![], true),
            ]
        );
    }
}
