//! What the plugin tells on its Node: GPUs whose health changed (with the DRA plane's answer to
//! it: the health view the taints follow, and the gauges), GPUs left unread, and what the start
//! found in the checkpoint.

use crate::checkpoint::LoadOutcome;
use crate::device_health::{self, GpuFault, HealthView};
use crate::devices::DeviceTable;
use crate::driver::StartReport;
use crate::metrics::Metrics;
use gpu_discovery::UnreadableGpu;
use gpu_discovery::health::{Change, Severity, Tracker};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{EventType, Reporter};
use node_agent::gpu_health::HealthSink;
use service::events::EventPublisher;
use std::sync::Arc;
use tokio::sync::watch;
/// The Event reason and note for a GPU whose health changed, and whether it is a warning.
pub fn health_event(change: &Change, table: &DeviceTable) -> (&'static str, String, bool) {
    let gpu = match change {
        Change::Unhealthy { gpu, .. } | Change::Recovered { gpu } => gpu,
    };
    let devices: Vec<&str> = table
        .devices
        .values()
        .filter(|d| &d.gpu.gpu_uuid == gpu)
        .map(|d| d.name.as_str())
        .collect();
    let devices = devices.join(", ");
    match change {
        Change::Unhealthy { fault, .. } => {
            let taint = device_health::taint(&device_health::GpuFault {
                fault: fault.clone(),
                since: jiff::Timestamp::UNIX_EPOCH,
            });
            let consequence = match fault.severity() {
                Severity::Lost => "pods using them are evicted and no new claim gets them",
                Severity::Degraded => "no new claim gets them; pods using them keep running",
            };
            let note = format!(
                "GPU {gpu} is unhealthy ({fault}): its devices ({devices}) are tainted {key}:{effect}; \
                 {consequence}. The taint goes once NVML reads the GPU fine for the recovery \
                 period. Check the GPU (nvidia-smi -q, the kernel log for XID errors).",
                key = taint.key,
                effect = taint.effect,
            );
            ("GPUUnhealthy", note, true)
        }
        Change::Recovered { .. } => (
            "GPURecovered",
            format!(
                "GPU {gpu} is healthy again: the taints of its devices ({devices}) are removed"
            ),
            false,
        ),
    }
}

/// The DRA plane's answer to GPU health changes: `view` (which the slices' taints and the
/// kubelet's health stream follow), an Event on the Node per GPU, and the health gauges.
pub(super) struct DraHealth {
    pub(super) view: watch::Sender<HealthView>,
    pub(super) recorder: NodeEvents,
    pub(super) table: Arc<DeviceTable>,
    pub(super) metrics: Metrics,
}

impl HealthSink for DraHealth {
    async fn changed(&mut self, tracker: &Tracker, changes: &[Change]) {
        let now = jiff::Timestamp::from_second(jiff::Timestamp::now().as_second())
            .unwrap_or(jiff::Timestamp::UNIX_EPOCH);
        self.view.send_if_modified(|v| {
            let before = v.clone();
            v.unknown = tracker.nvml_failing();
            for change in changes {
                match change {
                    Change::Unhealthy { gpu, fault } => {
                        v.faults.insert(
                            gpu.clone(),
                            GpuFault {
                                fault: fault.clone(),
                                since: now,
                            },
                        );
                    }
                    Change::Recovered { gpu } => {
                        v.faults.remove(gpu);
                    }
                }
            }
            *v != before
        });
        for change in changes {
            let (reason, note, warning) = health_event(change, &self.table);
            self.recorder.publish(reason, note, warning).await;
        }
        let v = self.view.borrow().clone();
        let lost = v
            .faults
            .values()
            .filter(|f| f.fault.severity() == Severity::Lost)
            .count();
        self.metrics
            .set_health(v.faults.len() - lost, lost, v.unknown);
    }
}

/// The Event note for a GPU left out because NVML could not read it.
pub fn unreadable_note(gpu: &UnreadableGpu) -> String {
    let what = if gpu.lost {
        "is lost"
    } else {
        "could not be read"
    };
    format!(
        "GPU {index} {what} and is not published; the node's other GPUs still are. NVML said: \
         {error}. Check the GPU (nvidia-smi -q -i {index}, the kernel log for XID errors), then \
         restart this node's gpu-kubelet-plugin pod to publish it again.",
        index = gpu.index,
        error = gpu.error,
    )
}

/// Publishes Events on the plugin's Node.
#[derive(Clone)]
pub(super) struct NodeEvents {
    events: EventPublisher,
    node: ObjectReference,
}

impl NodeEvents {
    pub(super) fn new(client: &kube::Client, node: &str) -> Self {
        let events = EventPublisher::new(
            client.clone(),
            Reporter {
                controller: "gpu-kubelet-plugin".into(),
                instance: Some(node.to_owned()),
            },
        );
        let node = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(node.to_owned()),
            ..Default::default()
        };
        Self { events, node }
    }

    /// Publishes a Warning (or Normal) Event; a failure is logged.
    pub(super) async fn publish(&self, reason: &str, note: String, warning: bool) {
        let (type_, action) = if warning {
            (EventType::Warning, "Recover")
        } else {
            (EventType::Normal, "Recovered")
        };
        self.events
            .tell(&self.node, type_, reason, action, note)
            .await;
    }
}

pub(super) async fn report_start(events: &NodeEvents, report: &StartReport) {
    for claim in &report.rolled_back {
        tracing::warn!(%claim, "rolled back a claim left half-prepared by a crash");
    }
    for uid in &report.stray_specs {
        tracing::warn!(claim_uid = %uid, "rolled back a claim left half-prepared by a crash: removed its CDI spec, which the checkpoint did not record");
    }
    match &report.outcome {
        LoadOutcome::Corrupted { moved_to, reason } => {
            tracing::error!(moved_to = %moved_to.display(), %reason, "checkpoint corrupted; moved aside, starting empty");
            let note = format!(
                "gpu-kubelet-plugin checkpoint was corrupted ({reason}); moved to {} and started empty",
                moved_to.display()
            );
            events.publish("CheckpointCorrupted", note, true).await;
        }
        LoadOutcome::NewBoot { previous } => {
            tracing::info!(%previous, "checkpoint from an earlier boot discarded");
        }
        LoadOutcome::Missing | LoadOutcome::Restored => {}
    }
    tracing::info!(restored = report.restored, "checkpoint loaded");
}
