//! Device health from NVML, shared by both planes: which events make a GPU unhealthy, how bad
//! that is, and when it is offered again.
//!
//! A GPU turns unhealthy on a fatal XID, a double-bit ECC error, or a probe that finds it lost or
//! unreadable. It is offered again once every probe has read it fine for the whole recovery period
//! (the damping: a flapping GPU stays out until it has been quiet that long). Faults of NVML itself
//! (a probe that cannot even count the GPUs) change no device's health, since nothing new is known
//! about them, but make every device's health unknown until NVML answers again, and restart the
//! clean period of the unhealthy ones: only probes that read a GPU count towards its recovery.
//!
//! Application XIDs are ignored, as the upstream device plugin ignores them by default: 13
//! (graphics engine exception), 31 (GPU memory page fault), 43 (GPU stopped processing), 45
//! (preemptive cleanup), 68 (video processor exception) and 109 (context switch timeout) are
//! caused by a workload and leave the GPU usable (NVIDIA's XID catalogue,
//! docs.nvidia.com/deploy/xid-errors). Every other XID, 79 (fallen off the bus) and 48
//! (double-bit ECC) among them, marks the GPU unhealthy.
//!
//! [`Severity`]: a GPU that is gone (XID 79, or NVML reports it lost) can run nothing, so the
//! work on it must move; any other fault degrades it: new work must not land on it, the work
//! already there may finish.

use crate::monitor::Observation;
use crate::{DeviceEvent, EventKind};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// XIDs a workload causes; they leave the GPU usable.
pub const APPLICATION_XIDS: [u64; 6] = [13, 31, 43, 45, 68, 109];
/// The XID of a GPU that has fallen off the bus.
pub const XID_FALLEN_OFF_THE_BUS: u64 = 79;

/// How bad a fault is, in increasing order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    /// The GPU still runs what it runs, but must take no new work.
    Degraded,
    /// The GPU is gone: what ran on it must move.
    Lost,
}

/// Why a GPU is unhealthy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// A fatal XID (its number when NVML gave one).
    Xid(Option<u64>),
    /// A double-bit ECC error.
    DoubleBitEcc,
    /// NVML reports it lost (`NVML_ERROR_GPU_IS_LOST`), with what NVML said.
    Lost(String),
    /// A probe could not read it, with what NVML said.
    Unreadable(String),
}

impl Fault {
    /// How bad the fault is.
    pub fn severity(&self) -> Severity {
        match self {
            Fault::Xid(Some(XID_FALLEN_OFF_THE_BUS)) | Fault::Lost(_) => Severity::Lost,
            Fault::Xid(_) | Fault::DoubleBitEcc | Fault::Unreadable(_) => Severity::Degraded,
        }
    }
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fault::Xid(Some(x)) => write!(f, "XID {x}"),
            Fault::Xid(None) => write!(f, "a critical XID"),
            Fault::DoubleBitEcc => write!(f, "a double-bit ECC error"),
            Fault::Lost(why) => write!(f, "lost: {why}"),
            Fault::Unreadable(why) => write!(f, "unreadable: {why}"),
        }
    }
}

/// The fault an event means, if any.
pub fn classify(kind: EventKind) -> Option<Fault> {
    match kind {
        EventKind::Xid(Some(x)) if APPLICATION_XIDS.contains(&x) => None,
        EventKind::Xid(x) => Some(Fault::Xid(x)),
        EventKind::DoubleBitEcc => Some(Fault::DoubleBitEcc),
        EventKind::SingleBitEcc => None,
    }
}

#[derive(Debug, Clone)]
struct Record {
    fault: Fault,
    /// Since when every probe has read the GPU fine; `None` until one does after the last fault.
    clean_since: Option<Instant>,
}

/// The health of every GPU, by GPU UUID. GPUs never seen faulty are healthy.
#[derive(Debug, Clone)]
pub struct Tracker {
    recovery: Duration,
    faulty: BTreeMap<String, Record>,
    nvml_failing: bool,
}

/// A GPU whose health changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// It turned unhealthy, or its fault became more severe.
    Unhealthy {
        /// GPU UUID.
        gpu: String,
        /// Why.
        fault: Fault,
    },
    /// It is offered again.
    Recovered {
        /// GPU UUID.
        gpu: String,
    },
}

impl Change {
    /// Logs the change, with what it means for the GPU's devices on this plane: `unhealthy`
    /// when it turned unhealthy (a warning), `recovered` when it recovered.
    pub fn log(&self, unhealthy: &str, recovered: &str) {
        match self {
            Change::Unhealthy { gpu, fault } => {
                tracing::warn!(%gpu, %fault, "GPU unhealthy; {unhealthy}");
            }
            Change::Recovered { gpu } => tracing::info!(%gpu, "GPU healthy again; {recovered}"),
        }
    }
}

impl Tracker {
    /// A tracker that offers a GPU again `recovery` after its last fault.
    pub fn new(recovery: Duration) -> Self {
        Self {
            recovery,
            faulty: BTreeMap::new(),
            nvml_failing: false,
        }
    }

    /// Records a fault; returns the change when the GPU was healthy or the fault is more severe
    /// than the one it has. A fault no worse than the one it has keeps the first, and restarts
    /// the clean period.
    pub fn fault(&mut self, gpu: &str, fault: Fault) -> Option<Change> {
        if let Some(record) = self.faulty.get_mut(gpu) {
            record.clean_since = None;
            if fault.severity() <= record.fault.severity() {
                return None;
            }
            record.fault = fault.clone();
        } else {
            self.faulty.insert(
                gpu.to_owned(),
                Record {
                    fault: fault.clone(),
                    clean_since: None,
                },
            );
        }
        Some(Change::Unhealthy {
            gpu: gpu.to_owned(),
            fault,
        })
    }

    /// Records an NVML event.
    pub fn event(&mut self, event: &DeviceEvent) -> Option<Change> {
        let fault = classify(event.kind)?;
        self.fault(&event.uuid, fault)
    }

    /// Records that NVML itself failed: no GPU was read, so no clean period goes on, and every
    /// GPU's health is unknown until NVML answers again.
    pub fn nvml_failed(&mut self) {
        self.nvml_failing = true;
        for record in self.faulty.values_mut() {
            record.clean_since = None;
        }
    }

    /// Whether NVML failed at the last look, so that no GPU's health is known.
    pub fn nvml_failing(&self) -> bool {
        self.nvml_failing
    }

    /// Applies one observation of the NVML monitor; `gpus_by_index` names the GPUs a probe
    /// reports by NVML index. Returns the changes.
    pub fn observe(
        &mut self,
        observation: &Observation,
        gpus_by_index: &BTreeMap<u32, String>,
        now: Instant,
    ) -> Vec<Change> {
        match observation {
            Observation::Event(event) => {
                self.nvml_failing = false;
                self.event(event).into_iter().collect()
            }
            Observation::Probe {
                readable,
                unreadable,
            } => self.probe(
                readable.iter().map(String::as_str),
                unreadable.iter().filter_map(|gpu| {
                    let fault = if gpu.lost {
                        Fault::Lost(gpu.error.clone())
                    } else {
                        Fault::Unreadable(gpu.error.clone())
                    };
                    gpus_by_index
                        .get(&gpu.index)
                        .map(|uuid| (uuid.as_str(), fault))
                }),
                now,
            ),
            Observation::NvmlFailed(_) => {
                self.nvml_failed();
                Vec::new()
            }
        }
    }

    /// Records a probe: `readable` GPUs read fine, `unreadable` ones (by UUID, where known) did
    /// not, with their fault. Returns the GPUs that turned unhealthy or recovered.
    pub fn probe<'a>(
        &mut self,
        readable: impl IntoIterator<Item = &'a str>,
        unreadable: impl IntoIterator<Item = (&'a str, Fault)>,
        now: Instant,
    ) -> Vec<Change> {
        self.nvml_failing = false;
        let mut changes: Vec<Change> = unreadable
            .into_iter()
            .filter_map(|(gpu, fault)| self.fault(gpu, fault))
            .collect();
        for gpu in readable {
            let Some(record) = self.faulty.get_mut(gpu) else {
                continue;
            };
            let since = *record.clean_since.get_or_insert(now);
            if now.saturating_duration_since(since) >= self.recovery {
                self.faulty.remove(gpu);
                changes.push(Change::Recovered {
                    gpu: gpu.to_owned(),
                });
            }
        }
        changes
    }

    /// Whether `gpu` may be offered.
    pub fn is_healthy(&self, gpu: &str) -> bool {
        !self.faulty.contains_key(gpu)
    }

    /// Why `gpu` is unhealthy, if it is.
    pub fn fault_of(&self, gpu: &str) -> Option<&Fault> {
        self.faulty.get(gpu).map(|r| &r.fault)
    }

    /// The unhealthy GPUs, by UUID, with their fault.
    pub fn faults(&self) -> impl Iterator<Item = (&str, &Fault)> {
        self.faulty.iter().map(|(gpu, r)| (gpu.as_str(), &r.fault))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(uuid: &str, kind: EventKind) -> DeviceEvent {
        DeviceEvent {
            uuid: uuid.into(),
            kind,
        }
    }

    #[test]
    fn application_xids_and_single_bit_errors_leave_the_gpu_healthy() {
        for x in APPLICATION_XIDS {
            assert_eq!(classify(EventKind::Xid(Some(x))), None, "XID {x}");
        }
        assert_eq!(classify(EventKind::SingleBitEcc), None);
        assert_eq!(
            classify(EventKind::Xid(Some(79))),
            Some(Fault::Xid(Some(79)))
        );
        assert_eq!(classify(EventKind::Xid(None)), Some(Fault::Xid(None)));
        assert_eq!(classify(EventKind::DoubleBitEcc), Some(Fault::DoubleBitEcc));
    }

    #[test]
    fn a_gpu_recovers_only_after_a_whole_clean_recovery_period() {
        let t0 = Instant::now();
        let secs = |s| t0 + Duration::from_secs(s);
        let mut t = Tracker::new(Duration::from_secs(10));
        assert!(matches!(
            t.event(&event("GPU-3", EventKind::Xid(Some(79)))),
            Some(Change::Unhealthy { .. })
        ));
        assert!(!t.is_healthy("GPU-3"));
        assert!(t.is_healthy("GPU-0"));
        // The clean period starts at the first probe that reads the GPU after the fault.
        assert!(t.probe(["GPU-3", "GPU-0"], [], secs(2)).is_empty());
        // A second fault while unhealthy is no change, but restarts the period (damping).
        assert_eq!(t.event(&event("GPU-3", EventKind::DoubleBitEcc)), None);
        assert!(t.probe(["GPU-3"], [], secs(5)).is_empty());
        assert!(t.probe(["GPU-3"], [], secs(14)).is_empty());
        assert_eq!(
            t.probe(["GPU-3"], [], secs(15)),
            [Change::Recovered {
                gpu: "GPU-3".into()
            }]
        );
        assert!(t.is_healthy("GPU-3"));
    }

    #[test]
    fn nvml_failing_restarts_the_clean_period() {
        let t0 = Instant::now();
        let secs = |s| t0 + Duration::from_secs(s);
        let mut t = Tracker::new(Duration::from_secs(10));
        t.fault("GPU-1", Fault::DoubleBitEcc);
        assert!(t.probe(["GPU-1"], [], secs(1)).is_empty());
        t.nvml_failed();
        // Read fine again only at 30 s: one probe after a long silence is not a clean period.
        assert!(t.probe(["GPU-1"], [], secs(30)).is_empty());
        assert_eq!(t.probe(["GPU-1"], [], secs(40)).len(), 1);
    }

    #[test]
    fn an_unreadable_gpu_stays_out_while_probes_fail() {
        let t0 = Instant::now();
        let secs = |s| t0 + Duration::from_secs(s);
        let mut t = Tracker::new(Duration::from_secs(1));
        let lost = || [("GPU-1", Fault::Lost("GPU is lost".into()))];
        assert_eq!(t.probe([], lost(), t0).len(), 1);
        assert!(t.probe([], lost(), secs(5)).is_empty());
        assert_eq!(
            t.fault_of("GPU-1"),
            Some(&Fault::Lost("GPU is lost".into()))
        );
        assert!(
            t.probe(["GPU-1"], [], secs(6)).is_empty(),
            "the clean period starts"
        );
        assert_eq!(t.probe(["GPU-1"], [], secs(7)).len(), 1);
    }

    #[test]
    fn a_worse_fault_is_a_change_and_a_milder_one_is_not() {
        let mut t = Tracker::new(Duration::from_secs(10));
        let degraded = t.event(&event("GPU-2", EventKind::DoubleBitEcc));
        assert!(
            matches!(degraded, Some(Change::Unhealthy { fault, .. }) if fault.severity() == Severity::Degraded)
        );
        let lost = t.event(&event("GPU-2", EventKind::Xid(Some(79))));
        assert!(
            matches!(lost, Some(Change::Unhealthy { fault, .. }) if fault.severity() == Severity::Lost)
        );
        assert_eq!(t.event(&event("GPU-2", EventKind::Xid(Some(62)))), None);
        assert_eq!(t.fault_of("GPU-2"), Some(&Fault::Xid(Some(79))));
    }

    #[test]
    fn nvml_failing_makes_health_unknown_until_nvml_answers() {
        let mut t = Tracker::new(Duration::from_secs(10));
        let by_index = BTreeMap::from([(0, "GPU-0".to_owned())]);
        let now = Instant::now();
        t.observe(
            &Observation::NvmlFailed("driver gone".into()),
            &by_index,
            now,
        );
        assert!(t.nvml_failing());
        assert!(
            t.is_healthy("GPU-0"),
            "an NVML failure is no fault of the GPU"
        );
        let lost = Observation::Probe {
            readable: vec![],
            unreadable: vec![crate::UnreadableGpu {
                index: 0,
                error: "GPU is lost".into(),
                lost: true,
            }],
        };
        assert_eq!(
            t.observe(&lost, &by_index, now),
            [Change::Unhealthy {
                gpu: "GPU-0".into(),
                fault: Fault::Lost("GPU is lost".into())
            }]
        );
        assert!(!t.nvml_failing());
    }
}
