//! Device health from NVML: which events make a GPU unhealthy, and when it is offered again.
//!
//! A GPU turns unhealthy on a fatal XID, a double-bit ECC error, or a probe that finds it lost or
//! unreadable. It is offered again once probes have read it fine for the whole recovery period
//! since its last fault, so a flapping GPU stays out until it has been quiet that long (the
//! damping). Faults of NVML itself (a probe that cannot even count the GPUs) change nothing: the
//! devices keep the health they had, since nothing new is known about them.
//!
//! Application XIDs are ignored, as the upstream device plugin ignores them by default: 13
//! (graphics engine exception), 31 (GPU memory page fault), 43 (GPU stopped processing), 45
//! (preemptive cleanup), 68 (video processor exception) and 109 (context switch timeout) are
//! caused by a workload and leave the GPU usable (NVIDIA's XID catalogue,
//! docs.nvidia.com/deploy/xid-errors). Every other XID, 79 (fallen off the bus) and 48
//! (double-bit ECC) among them, marks the GPU unhealthy.

use gpu_discovery::{DeviceEvent, EventKind};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// XIDs a workload causes; they leave the GPU usable.
pub const APPLICATION_XIDS: [u64; 6] = [13, 31, 43, 45, 68, 109];

/// Why a GPU is unhealthy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// A fatal XID (its number when NVML gave one).
    Xid(Option<u64>),
    /// A double-bit ECC error.
    DoubleBitEcc,
    /// A probe found it lost or unreadable.
    Unreadable(String),
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fault::Xid(Some(x)) => write!(f, "XID {x}"),
            Fault::Xid(None) => write!(f, "a critical XID"),
            Fault::DoubleBitEcc => write!(f, "a double-bit ECC error"),
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
    last_bad: Instant,
}

/// The health of every GPU, by GPU UUID. GPUs never seen faulty are healthy.
#[derive(Debug, Clone)]
pub struct Tracker {
    recovery: Duration,
    faulty: BTreeMap<String, Record>,
}

/// A GPU whose health changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// It turned unhealthy.
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

impl Tracker {
    /// A tracker that offers a GPU again `recovery` after its last fault.
    pub fn new(recovery: Duration) -> Self {
        Self {
            recovery,
            faulty: BTreeMap::new(),
        }
    }

    /// Records a fault; returns the change when the GPU was healthy.
    pub fn fault(&mut self, gpu: &str, fault: Fault, now: Instant) -> Option<Change> {
        let was_healthy = !self.faulty.contains_key(gpu);
        self.faulty.insert(
            gpu.to_owned(),
            Record {
                fault: fault.clone(),
                last_bad: now,
            },
        );
        was_healthy.then(|| Change::Unhealthy {
            gpu: gpu.to_owned(),
            fault,
        })
    }

    /// Records an NVML event.
    pub fn event(&mut self, event: &DeviceEvent, now: Instant) -> Option<Change> {
        let fault = classify(event.kind)?;
        self.fault(&event.uuid, fault, now)
    }

    /// Records a probe: `readable` GPUs read fine, `unreadable` ones (by UUID, where known) did
    /// not. Returns the GPUs that turned unhealthy or recovered.
    pub fn probe<'a>(
        &mut self,
        readable: impl IntoIterator<Item = &'a str>,
        unreadable: impl IntoIterator<Item = (&'a str, String)>,
        now: Instant,
    ) -> Vec<Change> {
        let mut changes: Vec<Change> = unreadable
            .into_iter()
            .filter_map(|(gpu, why)| self.fault(gpu, Fault::Unreadable(why), now))
            .collect();
        for gpu in readable {
            let quiet = self
                .faulty
                .get(gpu)
                .is_some_and(|r| now.saturating_duration_since(r.last_bad) >= self.recovery);
            if quiet {
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
    fn a_gpu_recovers_only_after_a_quiet_recovery_period() {
        let t0 = Instant::now();
        let secs = |s| t0 + Duration::from_secs(s);
        let mut t = Tracker::new(Duration::from_secs(10));
        assert!(matches!(
            t.event(&event("GPU-3", EventKind::Xid(Some(79))), t0),
            Some(Change::Unhealthy { .. })
        ));
        assert!(!t.is_healthy("GPU-3"));
        assert!(t.is_healthy("GPU-0"));
        // A second fault while unhealthy is no change, but restarts the period (damping).
        assert_eq!(
            t.event(&event("GPU-3", EventKind::DoubleBitEcc), secs(5)),
            None
        );
        assert!(t.probe(["GPU-3", "GPU-0"], [], secs(12)).is_empty());
        assert_eq!(
            t.probe(["GPU-3"], [], secs(15)),
            [Change::Recovered {
                gpu: "GPU-3".into()
            }]
        );
        assert!(t.is_healthy("GPU-3"));
    }

    #[test]
    fn an_unreadable_gpu_stays_out_while_probes_fail() {
        let t0 = Instant::now();
        let mut t = Tracker::new(Duration::from_secs(1));
        let lost = || [("GPU-1", "GPU is lost".to_owned())];
        assert_eq!(t.probe([], lost(), t0).len(), 1);
        assert!(t.probe([], lost(), t0 + Duration::from_secs(5)).is_empty());
        assert_eq!(
            t.fault_of("GPU-1"),
            Some(&Fault::Unreadable("GPU is lost".into()))
        );
        assert_eq!(t.probe(["GPU-1"], [], t0 + Duration::from_secs(6)).len(), 1);
    }
}
