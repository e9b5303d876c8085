//! The hand-over of one node between the planes, as a step machine: cordon and drain the old
//! plane's pods, move the deploy labels, wait for the new plane's validator, uncordon; past the
//! progress deadline, the same steps back. Pure; the controller does the I/O.

use api::AllocationMode;
use api::gpucluster::DrainPolicy;
use api::handover::{Handover, Phase, Rollback};

use crate::names::named;
use crate::plan::ReadyPlanes;

/// What the step machine looks at.
#[derive(Clone, Copy, Debug)]
pub struct Inputs<'a> {
    /// The node's recorded hand-over, if any.
    pub state: Option<&'a Handover>,
    /// The plane switch the plan asks for, `(from, to)`.
    pub switch: Option<(AllocationMode, AllocationMode)>,
    /// Planes whose validator passed on the node.
    pub ready: ReadyPlanes,
    /// Pods on the node that still hold the old plane's GPUs (read while draining), as
    /// `namespace/name`.
    pub holders: &'a [String],
    /// Seconds since the Unix epoch.
    pub now: i64,
    /// `migration.drain`.
    pub drain: DrainPolicy,
    /// `migration.progressDeadlineSeconds`.
    pub deadline_secs: i64,
    /// The `GPUCluster`'s generation.
    pub generation: i64,
    /// A new hand-over may start: fewer than `maxUnavailable` nodes are between planes and no
    /// rollback of this generation paused the rollout.
    pub may_start: bool,
    /// A `GPUCluster` exists and is not being deleted. Without one no hand-over starts, and one
    /// under way is forgotten (the node uncordoned): nothing is left to hand it over to, and an
    /// uninstall must not leave nodes cordoned.
    pub served: bool,
}

/// What to do with the node now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// No hand-over concerns the node.
    Idle,
    /// A switch is wanted but must wait for a free slot (or a paused rollout); the old plane stays.
    Queued,
    /// Cordon the node and record [`Phase::Draining`] from `from` to `to`.
    Start {
        /// The plane the node leaves.
        from: AllocationMode,
        /// The plane it goes to.
        to: AllocationMode,
    },
    /// Pods still hold the old plane's GPUs: evict them (`evict`) or wait; the old plane stays.
    Drain {
        /// Evict through the Eviction API rather than wait.
        evict: bool,
    },
    /// Pods still held the old plane past the progress deadline: the node stays on it,
    /// uncordoned (when the hand-over cordoned it), and `record` (a rollback marker naming the
    /// pods) pauses the rollout until the `GPUCluster` changes.
    GiveUp {
        /// The hand-over cordoned the node.
        uncordon: bool,
        /// What the annotation keeps.
        record: Handover,
    },
    /// Nothing holds the old plane: move the deploy labels and record this.
    Switch(Handover),
    /// The new plane is not ready yet; `overdue` when a rollback is past its own deadline (it
    /// keeps waiting: there is no older plane to go back to).
    Wait {
        /// Past the deadline with nowhere to go back to.
        overdue: bool,
    },
    /// The new plane is ready: uncordon (when the hand-over cordoned the node) and keep `record`
    /// (a finished rollback's marker) or nothing.
    Complete {
        /// The hand-over cordoned the node.
        uncordon: bool,
        /// What the annotation keeps.
        record: Option<Handover>,
    },
    /// The new plane missed the deadline: go back through the same steps, recorded so.
    RollBack(Handover),
    /// The policy turned back after the labels moved: hand over the other way, from draining.
    Reverse(Handover),
    /// The policy no longer asks for the switch before the labels moved: uncordon (when the
    /// hand-over cordoned the node) and forget it.
    Cancel {
        /// The hand-over cordoned the node.
        uncordon: bool,
    },
    /// A rollback's marker from an older generation: forget it, so the policy applies again.
    Release,
}

impl Step {
    /// Whether the old plane must stay on the node this round (its plugin label is kept).
    pub fn holds_old_plane(&self) -> bool {
        matches!(
            self,
            Step::Queued
                | Step::Start { .. }
                | Step::Drain { .. }
                | Step::RollBack(_)
                | Step::Reverse(_)
        )
    }

    /// Whether the node's labels may move off the old plane this round.
    pub fn moves_labels(&self) -> bool {
        matches!(self, Step::Switch(_))
    }
}

/// Why a drain gave up: how many pods held which plane's GPUs, for how long, and which.
fn drain_timeout_reason(state: &Handover, i: &Inputs<'_>) -> String {
    format!(
        "{} pod(s) still held {} GPUs after {}s of draining: {}",
        i.holders.len(),
        state.from,
        i.deadline_secs,
        named(i.holders)
    )
}

/// Decides the node's next step.
pub fn step(i: &Inputs<'_>) -> Step {
    let Some(state) = i.state else {
        return match i.switch {
            None => Step::Idle,
            Some(_) if !i.served => Step::Idle,
            Some(_) if !i.may_start => Step::Queued,
            Some((from, to)) => Step::Start { from, to },
        };
    };
    if !i.served {
        return match state.phase {
            Phase::RolledBack => Step::Release,
            Phase::Draining | Phase::WaitingForPlane => Step::Cancel {
                uncordon: state.cordoned,
            },
        };
    }
    match state.phase {
        Phase::RolledBack if state.pinned(i.generation).is_some() => Step::Idle,
        Phase::RolledBack => Step::Release,
        Phase::Draining => match i.switch {
            Some((from, to)) if (from, to) == (state.from, state.to) => {
                let overdue = i.now - state.since > i.deadline_secs;
                if !i.holders.is_empty() && overdue && state.rollback.is_none() {
                    Step::GiveUp {
                        uncordon: state.cordoned,
                        record: Handover {
                            from: state.to,
                            to: state.from,
                            phase: Phase::RolledBack,
                            since: i.now,
                            cordoned: false,
                            rollback: Some(Rollback {
                                reason: drain_timeout_reason(state, i),
                                generation: i.generation,
                            }),
                        },
                    }
                } else if !i.holders.is_empty() {
                    Step::Drain {
                        evict: i.drain == DrainPolicy::Evict,
                    }
                } else {
                    Step::Switch(Handover {
                        phase: Phase::WaitingForPlane,
                        since: i.now,
                        ..state.clone()
                    })
                }
            }
            _ => Step::Cancel {
                uncordon: state.cordoned,
            },
        },
        Phase::WaitingForPlane => {
            if i.switch == Some((state.to, state.from)) {
                return Step::Reverse(Handover {
                    from: state.to,
                    to: state.from,
                    phase: Phase::Draining,
                    since: i.now,
                    cordoned: state.cordoned,
                    rollback: None,
                });
            }
            if i.ready.has(state.to) {
                let record = state.rollback.clone().map(|rollback| Handover {
                    phase: Phase::RolledBack,
                    since: i.now,
                    cordoned: false,
                    rollback: Some(rollback),
                    ..state.clone()
                });
                return Step::Complete {
                    uncordon: state.cordoned,
                    record,
                };
            }
            let overdue = i.now - state.since > i.deadline_secs;
            match (&state.rollback, overdue) {
                (None, true) => Step::RollBack(Handover {
                    from: state.to,
                    to: state.from,
                    phase: Phase::Draining,
                    since: i.now,
                    cordoned: state.cordoned,
                    rollback: Some(Rollback {
                        reason: format!(
                            "the {} plane was not ready within {}s",
                            state.to, i.deadline_secs
                        ),
                        generation: i.generation,
                    }),
                }),
                (_, overdue) => Step::Wait {
                    overdue: overdue && state.rollback.is_some(),
                },
            }
        }
    }
}

#[cfg(test)]
mod tests;
