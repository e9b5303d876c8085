//! A node's driver upgrade, as a step machine, for clusters where no ClusterPolicy's upgrade
//! controller runs one: cordon, drain the pods that hold the node's GPUs, pause the driver's
//! clients (plugin, validator, exporter), let a waiting driver load, bring the clients back, wait
//! for the validator to prove the new driver, uncordon. Each step shows in the driver manager's
//! state label; a step past the deadline fails the node and stops the rollout. Pure; the
//! controller does the I/O.

use api::driver_upgrade::{DriverUpgrade, UpgradePhase, state};
use api::gpucluster::DrainPolicy;

use crate::names::named;

/// What the step machine looks at.
#[derive(Clone, Copy, Debug)]
pub struct Inputs<'a> {
    /// The node's recorded upgrade, if any.
    pub record: Option<&'a DriverUpgrade>,
    /// The node asks for an upgrade: the request annotation, a driver waiting for a safe load,
    /// or the state label set to `upgrade-required`.
    pub wanted: bool,
    /// The state label was set back to `upgrade-required` (by hand) after a failure: try again.
    pub retry: bool,
    /// A driver container waits on the node for its safe load (the annotation is set).
    pub driver_waiting: bool,
    /// Pods that hold the node's GPUs (read while draining), as `namespace/name`.
    pub holders: &'a [String],
    /// The driver's clients other than the plugins (validator, DCGM, exporter pods) still on
    /// the node (read while they are paused), as `namespace/name`.
    pub clients: &'a [String],
    /// The plugins' pods still on the node (read while the clients are paused). They go last:
    /// a pod that holds a DRA claim cannot finish terminating until its claim is unprepared.
    pub plugins: &'a [String],
    /// Every driver container pod on the node is ready (true where there is none).
    pub driver_ready: bool,
    /// The node's plane is ready: its validator passed and it offers every GPU.
    pub ready: bool,
    /// Seconds since the Unix epoch.
    pub now: i64,
    /// `migration.drain`.
    pub drain: DrainPolicy,
    /// `migration.progressDeadlineSeconds`, for each step.
    pub deadline_secs: i64,
    /// An upgrade may start: fewer than `maxUnavailable` nodes are out and no node's upgrade
    /// failed.
    pub may_start: bool,
    /// A `GPUCluster` serves the node with a plane. Without one an upgrade under way is
    /// abandoned (node uncordoned, clients back, a waiting driver let go). (Where a
    /// ClusterPolicy's upgrade controller runs upgrades the controller asks nothing of this.)
    pub served: bool,
}

/// What to do with the node now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// No upgrade concerns the node (or a failed one waits for a retry).
    Idle,
    /// An upgrade is wanted but waits for a free slot or a stopped rollout.
    Queued,
    /// Record [`UpgradePhase::Draining`] and cordon (`cordoned`: the upgrade already holds the
    /// node's cordon, from a failed try).
    Start {
        /// The node is cordoned by this upgrade already.
        cordoned: bool,
    },
    /// Pods still hold the node's GPUs: evict them (`evict`) or wait.
    Drain {
        /// Evict through the Eviction API rather than wait.
        evict: bool,
    },
    /// Nothing holds the GPUs: pause the driver's clients and record this.
    Pause(DriverUpgrade),
    /// The clients other than the plugins are paused but some still run (the plugin stays to
    /// unprepare their claims); a waiting driver stays blocked.
    WaitForClients,
    /// The other clients are gone: the plugin is paused too, and its pod still runs.
    WaitForPlugin,
    /// The clients are gone: let the waiting driver load (remove its annotation).
    Unblock,
    /// A driver container on the node is not ready yet.
    WaitForDriver,
    /// The driver is in place: bring the clients back and record this.
    Resume(DriverUpgrade),
    /// The validator has not proven the new driver yet.
    Validate,
    /// A step missed its deadline: record the failure (`uncordon`: the node goes back to
    /// service, its driver unchanged).
    Fail {
        /// Uncordon the node.
        uncordon: bool,
        /// What the annotation keeps.
        record: DriverUpgrade,
    },
    /// The new driver is proven: uncordon (when the upgrade cordoned the node), forget the
    /// upgrade and its request.
    Complete {
        /// The upgrade cordoned the node.
        uncordon: bool,
    },
    /// The upgrade is no longer wanted (before the drain finished) or no longer ours: uncordon
    /// (when it cordoned the node), bring the clients back, forget it; `unblock` lets a waiting
    /// driver go on.
    Cancel {
        /// The upgrade cordoned the node.
        uncordon: bool,
        /// Remove the safe-load annotation.
        unblock: bool,
    },
}

/// What the driver's client operands (the deploy labels of the plugin, validator and exporter)
/// do this round.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Operands {
    /// Left as they are (a driver manager's pause included).
    #[default]
    Leave,
    /// Paused: their deploy labels carry the driver manager's pause value; the plugins' only
    /// with `plugin` (once nothing else holds a claim they must unprepare).
    Pause {
        /// The plugins are paused too.
        plugin: bool,
    },
    /// Running: pause values the upgrade set are taken back.
    Resume,
}

fn failed(record: &DriverUpgrade, i: &Inputs<'_>, reason: String, uncordon: bool) -> Step {
    Step::Fail {
        uncordon,
        record: DriverUpgrade {
            phase: UpgradePhase::Failed,
            since: i.now,
            cordoned: record.cordoned && !uncordon,
            reason: Some(reason),
            failed_in: Some(record.phase),
        },
    }
}

/// Decides the node's next step.
pub fn step(i: &Inputs<'_>) -> Step {
    let Some(record) = i.record else {
        return match (i.wanted, i.served, i.may_start) {
            (true, true, true) => Step::Start { cordoned: false },
            (true, true, false) => Step::Queued,
            _ => Step::Idle,
        };
    };
    if !i.served {
        return Step::Cancel {
            uncordon: record.cordoned,
            unblock: i.driver_waiting,
        };
    }
    let overdue = i.now - record.since > i.deadline_secs;
    match record.phase {
        UpgradePhase::Draining if !i.wanted => Step::Cancel {
            uncordon: record.cordoned,
            unblock: false,
        },
        UpgradePhase::Draining if i.holders.is_empty() => Step::Pause(DriverUpgrade::at(
            UpgradePhase::DriverRestart,
            i.now,
            record.cordoned,
        )),
        UpgradePhase::Draining if overdue => failed(
            record,
            i,
            format!(
                "{} pod(s) still held the node's GPUs after {}s of draining: {}; the driver was \
                 not changed",
                i.holders.len(),
                i.deadline_secs,
                named(i.holders)
            ),
            record.cordoned,
        ),
        UpgradePhase::Draining => Step::Drain {
            evict: i.drain == DrainPolicy::Evict,
        },
        UpgradePhase::DriverRestart if overdue => {
            let running: Vec<String> = i.clients.iter().chain(i.plugins).cloned().collect();
            let why = if running.is_empty() {
                "the driver container on the node was not ready".to_owned()
            } else {
                format!("the driver's clients did not stop: {}", named(&running))
            };
            failed(
                record,
                i,
                format!("{why} {}s after they were paused", i.deadline_secs),
                false,
            )
        }
        UpgradePhase::DriverRestart if !i.clients.is_empty() => Step::WaitForClients,
        UpgradePhase::DriverRestart if !i.plugins.is_empty() => Step::WaitForPlugin,
        UpgradePhase::DriverRestart if i.driver_waiting => Step::Unblock,
        UpgradePhase::DriverRestart if !i.driver_ready => Step::WaitForDriver,
        UpgradePhase::DriverRestart => Step::Resume(DriverUpgrade::at(
            UpgradePhase::Validating,
            i.now,
            record.cordoned,
        )),
        UpgradePhase::Validating | UpgradePhase::Failed if i.ready => {
            // A failed drain left the old driver serving: only a retry goes on from there.
            if record.failed_in == Some(UpgradePhase::Draining) {
                retry_or_stay(record, i)
            } else {
                Step::Complete {
                    uncordon: record.cordoned,
                }
            }
        }
        UpgradePhase::Validating if overdue => failed(
            record,
            i,
            format!(
                "the validator did not pass within {}s of the driver's change; the node stays \
                 cordoned and the rollout is stopped",
                i.deadline_secs
            ),
            false,
        ),
        UpgradePhase::Validating => Step::Validate,
        UpgradePhase::Failed => retry_or_stay(record, i),
    }
}

/// A failed upgrade starts again when asked to (the state label set back to `upgrade-required`);
/// otherwise it stays, and the rollout with it.
fn retry_or_stay(record: &DriverUpgrade, i: &Inputs<'_>) -> Step {
    if i.retry {
        Step::Start {
            cordoned: record.cordoned,
        }
    } else {
        Step::Idle
    }
}

/// The record the step leaves: `Some(Some(r))` sets it, `Some(None)` removes it, `None` leaves
/// it. A start's record is made once the node's cordon is read.
pub fn record_after(step: &Step) -> Option<Option<DriverUpgrade>> {
    match step {
        Step::Pause(r) | Step::Resume(r) | Step::Fail { record: r, .. } => Some(Some(r.clone())),
        Step::Complete { .. } | Step::Cancel { .. } => Some(None),
        _ => None,
    }
}

/// The state label the step leaves (`Some(None)` removes it, `None` leaves it), given the
/// record it leaves.
pub fn state_after(step: &Step, record: Option<&DriverUpgrade>) -> Option<Option<&'static str>> {
    match step {
        Step::Idle => None,
        Step::Queued => Some(Some(state::UPGRADE_REQUIRED)),
        Step::Complete { .. } => Some(Some(state::DONE)),
        Step::Cancel { .. } => Some(None),
        _ => record.map(|r| Some(r.phase.state_label())),
    }
}

/// What the driver's clients do after `step`, from the record before it and the one it leaves
/// (`after`).
pub fn operands(
    step: &Step,
    before: Option<&DriverUpgrade>,
    after: Option<&DriverUpgrade>,
) -> Operands {
    match after.map(|r| r.phase) {
        Some(UpgradePhase::DriverRestart) => Operands::Pause {
            plugin: !matches!(step, Step::Pause(_) | Step::WaitForClients),
        },
        _ if before.is_some() => Operands::Resume,
        _ => Operands::Leave,
    }
}

impl Step {
    /// Whether the step takes one of `maxUnavailable`'s slots.
    pub fn starts(&self) -> bool {
        matches!(self, Step::Start { .. })
    }

    /// Whether the node is looked at again soon: something moves without an event to say so
    /// (pods leaving, a deadline).
    pub fn in_motion(&self) -> bool {
        !matches!(
            self,
            Step::Idle | Step::Complete { .. } | Step::Cancel { .. }
        )
    }

    /// A name for metrics and logs.
    pub fn name(&self) -> &'static str {
        match self {
            Step::Idle => "idle",
            Step::Queued => "queued",
            Step::Start { .. } => "started",
            Step::Drain { .. } => "draining",
            Step::Pause(_) => "paused",
            Step::WaitForClients => "waiting_for_clients",
            Step::WaitForPlugin => "waiting_for_plugin",
            Step::Unblock => "unblocked",
            Step::WaitForDriver => "waiting_for_driver",
            Step::Resume(_) => "resumed",
            Step::Validate => "validating",
            Step::Fail { .. } => "failed",
            Step::Complete { .. } => "completed",
            Step::Cancel { .. } => "cancelled",
        }
    }
}

#[cfg(test)]
mod tests;
