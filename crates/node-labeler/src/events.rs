//! The Events the labeler puts on nodes: what it decided, and each step of a hand-over.

use api::AllocationMode;
use api::contract::labels as l;
use api::handover::Handover;
use kube::runtime::events::{Event, EventType};

use crate::handover::Step;
use crate::plan::{DEFERRED_RECHECK, Finding};

fn event(type_: EventType, reason: &str, note: String, action: &str) -> Event {
    Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: action.into(),
        secondary: None,
    }
}

/// The Event of a GPU node that neither plane serves, saying why and what changes it.
pub fn no_plane(no_plane: &api::coverage::NoPlane) -> Event {
    event(
        if no_plane.by_choice {
            EventType::Normal
        } else {
            EventType::Warning
        },
        "NoGPUPlane",
        format!("no GPU plane serves this node: {}", no_plane.why),
        "Labeling",
    )
}

/// The Event of a plan's finding.
pub fn for_finding(finding: &Finding) -> Event {
    match finding {
        Finding::InvalidMode(value) => Event {
            type_: EventType::Warning,
            reason: "InvalidAllocationMode".into(),
            note: Some(format!(
                "label {} has invalid value {value:?}: allowed values are \"dra\" and \
                 \"device-plugin\"; deploy labels are left unchanged until it is fixed",
                l::ALLOCATION_MODE
            )),
            action: "Labeling".into(),
            secondary: None,
        },
        Finding::DraDriverRemovalDeferred => Event {
            type_: EventType::Normal,
            reason: "DraDriverRemovalDeferred".into(),
            note: Some(format!(
                "keeping {} until no pod on this node holds a claim allocated by gpu.nvidia.com; \
                 re-checking every {}s",
                l::DEPLOY_DRA_DRIVER,
                DEFERRED_RECHECK.as_secs()
            )),
            action: "Labeling".into(),
            secondary: None,
        },
        Finding::ModeChosenByRule { rule, mode } => Event {
            type_: EventType::Normal,
            reason: "AllocationModeChosen".into(),
            note: Some(format!(
                "planePolicy rule {rule:?} of the GPUCluster puts this node in {mode} mode; set {} \
                 by hand to pin another mode",
                l::ALLOCATION_MODE
            )),
            action: "Labeling".into(),
            secondary: None,
        },
        Finding::DevicePluginRemovalDeferred => Event {
            type_: EventType::Normal,
            reason: "DevicePluginRemovalDeferred".into(),
            note: Some(format!(
                "keeping {} until no pod on this node holds a GPU the device plugin gave \
                 (nvidia.com/ resources); the DRA plane follows; re-checking every {}s",
                l::DEPLOY_DEVICE_PLUGIN,
                DEFERRED_RECHECK.as_secs()
            )),
            action: "Labeling".into(),
            secondary: None,
        },
    }
}

/// Why a hand-over waits for a slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum QueueReason {
    /// `maxUnavailable` nodes are between planes.
    Full {
        /// Nodes between planes now.
        in_progress: usize,
        /// `migration.maxUnavailable`.
        max_unavailable: u32,
    },
    /// A rollback of this generation paused the rollout.
    Paused {
        /// The node that was rolled back.
        node: String,
    },
}

/// The Event of a hand-over step, if it deserves one. `state` is the node's record before the
/// step; `wanted` the switch the plan asks for.
pub fn for_step(
    step: &Step,
    state: Option<&Handover>,
    wanted: Option<(AllocationMode, AllocationMode)>,
    holders: usize,
    queue: Option<&QueueReason>,
    deadline_secs: i64,
) -> Option<Event> {
    const ACTION: &str = "HandingOver";
    let n = EventType::Normal;
    Some(match step {
        Step::Idle => return None,
        Step::Queued => {
            let (from, to) = wanted?;
            // Distinct reasons: the recorder folds Events of one reason into a series that keeps
            // its first note.
            match queue? {
                QueueReason::Full {
                    in_progress,
                    max_unavailable,
                } => event(
                    n,
                    "HandoverQueued",
                    format!(
                        "waiting to move from the {from} plane to {to}: {in_progress} node(s) \
                         are between planes and migration.maxUnavailable is {max_unavailable}"
                    ),
                    ACTION,
                ),
                QueueReason::Paused { node } => event(
                    EventType::Warning,
                    "HandoverPaused",
                    format!(
                        "not moving from the {from} plane to {to}: the rollout is paused because \
                         node {node} was rolled back; edit the GPUCluster (or remove the {} \
                         annotation from {node}) to resume",
                        l::HANDOVER
                    ),
                    ACTION,
                ),
            }
        }
        Step::Start { from, to } => event(
            n,
            "HandoverStarted",
            format!(
                "moving from the {from} plane to {to}: node cordoned; pods holding {from} GPUs \
                 leave before the {from} plane does"
            ),
            ACTION,
        ),
        Step::Drain { evict } => {
            let state = state?;
            let what = if *evict {
                "evicting them (PodDisruptionBudgets respected)"
            } else {
                "waiting for them to leave (migration.drain: wait)"
            };
            event(
                n,
                "HandoverDraining",
                format!("{holders} pod(s) still hold {} GPUs; {what}", state.from),
                ACTION,
            )
        }
        Step::Switch(h) => event(
            n,
            "PlaneSwitched",
            format!(
                "no pod holds {} GPUs any more: the {} plane's labels are set; waiting up to \
                 {deadline_secs}s for its validator",
                h.from, h.to
            ),
            ACTION,
        ),
        Step::Wait { overdue: false } => return None,
        Step::Wait { overdue: true } => {
            let state = state?;
            event(
                EventType::Warning,
                "RollbackStalled",
                format!(
                    "rolled back to the {} plane, which is still not ready after {deadline_secs}s; \
                     check its pods on this node",
                    state.to
                ),
                ACTION,
            )
        }
        Step::Complete { record, .. } => {
            let state = state?;
            match record {
                None => event(
                    n,
                    "HandoverComplete",
                    format!("the {} plane is ready; node uncordoned", state.to),
                    ACTION,
                ),
                Some(_) => event(
                    n,
                    "RollbackComplete",
                    format!(
                        "back on the {} plane, which is ready; node uncordoned; it stays there \
                         until the GPUCluster changes",
                        state.to
                    ),
                    ACTION,
                ),
            }
        }
        Step::GiveUp { record, .. } => event(
            EventType::Warning,
            "HandoverDrainTimedOut",
            format!(
                "{}; the node stays on the {} plane, uncordoned; the rollout pauses until the \
                 GPUCluster changes",
                record.rollback.as_ref().map_or("", |r| r.reason.as_str()),
                record.to
            ),
            ACTION,
        ),
        Step::RollBack(h) => event(
            EventType::Warning,
            "HandoverRolledBack",
            format!(
                "{}: going back to the {} plane; the rollout pauses until the GPUCluster changes",
                h.rollback.as_ref().map_or("", |r| r.reason.as_str()),
                h.to
            ),
            ACTION,
        ),
        Step::Reverse(h) => event(
            n,
            "HandoverReversed",
            format!(
                "the policy asks for the {} plane again: handing the node back",
                h.to
            ),
            ACTION,
        ),
        Step::Cancel { .. } => event(
            n,
            "HandoverCancelled",
            "hand-over stopped: the policy no longer asks for another plane, or no GPUCluster \
             serves the node any more; node uncordoned (when the hand-over had cordoned it)"
                .into(),
            ACTION,
        ),
        Step::Release => event(
            n,
            "RolloutResumed",
            "the GPUCluster changed since this node was rolled back: the plane policy applies \
             again"
                .into(),
            ACTION,
        ),
    })
}

/// Why a driver upgrade waits for its turn.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UpgradeQueue {
    /// `maxUnavailable` nodes are out (between planes or in a driver upgrade).
    Full {
        /// Nodes out now.
        out: usize,
        /// `migration.maxUnavailable`.
        max_unavailable: u32,
    },
    /// Another node's driver upgrade failed: the rollout stopped.
    Stopped {
        /// The node whose upgrade failed.
        node: String,
    },
    /// The node is between planes.
    HandingOver,
}

/// The Event of a driver upgrade step, if it deserves one (`holders`: pods holding the node's
/// GPUs when the step was decided).
pub fn for_upgrade(
    step: &crate::driver_upgrade::Step,
    holders: usize,
    queue: Option<&UpgradeQueue>,
) -> Option<Event> {
    use crate::driver_upgrade::Step as S;
    const ACTION: &str = "UpgradingDriver";
    let n = EventType::Normal;
    Some(match step {
        S::Queued => match queue? {
            UpgradeQueue::Full {
                out,
                max_unavailable,
            } => event(
                n,
                "DriverUpgradeQueued",
                format!(
                    "driver upgrade waiting: {out} node(s) are out of service (driver upgrades \
                     and plane hand-overs) and migration.maxUnavailable is {max_unavailable}"
                ),
                ACTION,
            ),
            UpgradeQueue::Stopped { node } => event(
                EventType::Warning,
                "DriverUpgradeRolloutStopped",
                format!(
                    "driver upgrade waiting: the driver upgrade of node {node} failed; fix it \
                     there, or set {}=upgrade-required on it to try again",
                    l::DRIVER_UPGRADE_STATE
                ),
                ACTION,
            ),
            UpgradeQueue::HandingOver => event(
                n,
                "DriverUpgradeQueued",
                "driver upgrade waiting for the node's hand-over between planes to finish".into(),
                ACTION,
            ),
        },
        S::Start { .. } => event(
            n,
            "DriverUpgradeStarted",
            format!(
                "driver upgrade: node cordoned; {holders} pod(s) holding its GPUs leave before \
                 the driver's clients are paused"
            ),
            ACTION,
        ),
        S::Pause(_) => event(
            n,
            "DriverClientsPaused",
            "no pod holds the node's GPUs: the validator and exporter are paused (deploy labels \
             set to paused-for-driver-upgrade), then the plugin once their claims are unprepared"
                .into(),
            ACTION,
        ),
        S::Unblock => event(
            n,
            "DriverLoadUnblocked",
            format!(
                "the driver's clients are gone: the waiting driver may load ({} removed)",
                l::DRIVER_WAIT_FOR_SAFE_LOAD
            ),
            ACTION,
        ),
        S::Resume(_) => event(
            n,
            "DriverClientsResumed",
            "the driver is in place: the kubelet plugin, validator and exporter are back; \
             waiting for the validator to prove the driver"
                .into(),
            ACTION,
        ),
        S::Complete { .. } => event(
            n,
            "DriverUpgradeDone",
            "the validator passed on the new driver: node back in service (uncordoned when the \
             upgrade had cordoned it)"
                .into(),
            ACTION,
        ),
        S::Fail { record, .. } => event(
            EventType::Warning,
            "DriverUpgradeFailed",
            format!(
                "driver upgrade failed: {}; no other node starts one until this node passes \
                 validation or {}=upgrade-required is set on it to try again",
                record
                    .reason
                    .as_deref()
                    .unwrap_or("a step missed its deadline"),
                l::DRIVER_UPGRADE_STATE
            ),
            ACTION,
        ),
        S::Cancel { .. } => event(
            n,
            "DriverUpgradeCancelled",
            "driver upgrade stopped: it is no longer asked for, or no GPUCluster serves the node \
             any more; node uncordoned and the driver's clients back"
                .into(),
            ACTION,
        ),
        S::Idle
        | S::Drain { .. }
        | S::WaitForClients
        | S::WaitForPlugin
        | S::WaitForDriver
        | S::Validate => return None,
    })
}
