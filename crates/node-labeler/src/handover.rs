//! The hand-over of one node between the planes, as a step machine: cordon and drain the old
//! plane's pods, move the deploy labels, wait for the new plane's validator, uncordon; past the
//! progress deadline, the same steps back. Pure; the controller does the I/O.

use api::AllocationMode;
use api::gpucluster::DrainPolicy;
use api::handover::{Handover, Phase, Rollback};

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

/// Pods named in a drain timeout's reason at most.
const NAMED_PODS: usize = 5;

/// Why a drain gave up: how many pods held which plane's GPUs, for how long, and which.
fn drain_timeout_reason(state: &Handover, i: &Inputs<'_>) -> String {
    let mut pods = i.holders[..i.holders.len().min(NAMED_PODS)].join(", ");
    if i.holders.len() > NAMED_PODS {
        pods.push_str(&format!(" and {} more", i.holders.len() - NAMED_PODS));
    }
    format!(
        "{} pod(s) still held {} GPUs after {}s of draining: {pods}",
        i.holders.len(),
        state.from,
        i.deadline_secs
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
mod tests {
    use super::*;
    use AllocationMode::{DevicePlugin as DP, Dra};

    const NOW: i64 = 10_000;

    fn inputs<'a>(
        state: Option<&'a Handover>,
        switch: Option<(AllocationMode, AllocationMode)>,
    ) -> Inputs<'a> {
        Inputs {
            state,
            switch,
            ready: ReadyPlanes::default(),
            holders: &[],
            now: NOW,
            drain: DrainPolicy::Evict,
            deadline_secs: 600,
            generation: 2,
            may_start: true,
            served: true,
        }
    }

    fn record(phase: Phase, since: i64) -> Handover {
        Handover {
            from: DP,
            to: Dra,
            phase,
            since,
            cordoned: true,
            rollback: None,
        }
    }

    fn rollback(generation: i64) -> Option<Rollback> {
        Some(Rollback {
            reason: "the dra plane was not ready within 600s".into(),
            generation,
        })
    }

    #[test]
    fn a_wanted_switch_starts_only_with_a_free_slot() {
        assert_eq!(step(&inputs(None, None)), Step::Idle);
        assert_eq!(
            step(&inputs(None, Some((DP, Dra)))),
            Step::Start { from: DP, to: Dra }
        );
        let full = Inputs {
            may_start: false,
            ..inputs(None, Some((DP, Dra)))
        };
        assert_eq!(step(&full), Step::Queued);
        assert!(step(&full).holds_old_plane());
    }

    #[test]
    fn draining_evicts_or_waits_then_switches_when_nothing_holds_the_old_plane() {
        let state = record(Phase::Draining, NOW - 5);
        let pods = ["default/a".to_owned(), "default/b".to_owned()];
        let held = Inputs {
            holders: &pods,
            ..inputs(Some(&state), Some((DP, Dra)))
        };
        assert_eq!(step(&held), Step::Drain { evict: true });
        let wait = Inputs {
            drain: DrainPolicy::Wait,
            ..held
        };
        assert_eq!(step(&wait), Step::Drain { evict: false });
        assert!(step(&wait).holds_old_plane());
        let free = step(&inputs(Some(&state), Some((DP, Dra))));
        assert_eq!(
            free,
            Step::Switch(Handover {
                phase: Phase::WaitingForPlane,
                since: NOW,
                ..state.clone()
            })
        );
        assert!(free.moves_labels());
    }

    #[test]
    fn a_drain_past_the_deadline_stays_on_the_old_plane_and_names_the_pods() {
        let pods = ["team-a/trainer-0".to_owned(), "team-a/trainer-1".to_owned()];
        let state = record(Phase::Draining, NOW - 601);
        let held = Inputs {
            holders: &pods,
            drain: DrainPolicy::Wait,
            ..inputs(Some(&state), Some((DP, Dra)))
        };
        let Step::GiveUp {
            uncordon,
            record: marker,
        } = step(&held)
        else {
            panic!("{:?}", step(&held));
        };
        assert!(uncordon, "the hand-over cordoned the node");
        assert_eq!(marker.phase, Phase::RolledBack);
        assert_eq!(
            marker.pinned(2),
            Some(DP),
            "it stays on the plane it never left"
        );
        let reason = &marker.rollback.as_ref().unwrap().reason;
        assert_eq!(
            reason,
            "2 pod(s) still held device-plugin GPUs after 600s of draining: team-a/trainer-0, team-a/trainer-1"
        );
        // Within the deadline it keeps draining; a rollback's own drain never gives up.
        let recent = record(Phase::Draining, NOW - 600);
        assert_eq!(
            step(&Inputs {
                state: Some(&recent),
                ..held
            }),
            Step::Drain { evict: false }
        );
        let rolling_back = Handover {
            rollback: rollback(2),
            ..state.clone()
        };
        assert_eq!(
            step(&Inputs {
                state: Some(&rolling_back),
                ..held
            }),
            Step::Drain { evict: false }
        );
    }

    #[test]
    fn draining_is_cancelled_when_the_policy_no_longer_asks() {
        let state = record(Phase::Draining, NOW);
        assert_eq!(
            step(&inputs(Some(&state), None)),
            Step::Cancel { uncordon: true }
        );
        let admin_cordoned = Handover {
            cordoned: false,
            ..state
        };
        assert_eq!(
            step(&inputs(Some(&admin_cordoned), None)),
            Step::Cancel { uncordon: false }
        );
    }

    #[test]
    fn the_new_plane_ready_completes_and_uncordons() {
        let state = record(Phase::WaitingForPlane, NOW - 30);
        assert_eq!(
            step(&inputs(Some(&state), None)),
            Step::Wait { overdue: false }
        );
        let ready = Inputs {
            ready: ReadyPlanes {
                dra: true,
                device_plugin: false,
            },
            ..inputs(Some(&state), None)
        };
        assert_eq!(
            step(&ready),
            Step::Complete {
                uncordon: true,
                record: None
            }
        );
        // The old plane's validator still passing means nothing.
        let old_ready = Inputs {
            ready: ReadyPlanes {
                dra: false,
                device_plugin: true,
            },
            ..inputs(Some(&state), None)
        };
        assert_eq!(step(&old_ready), Step::Wait { overdue: false });
    }

    #[test]
    fn past_the_deadline_the_node_goes_back_and_the_rollback_is_recorded() {
        let state = record(Phase::WaitingForPlane, NOW - 601);
        let at_deadline = record(Phase::WaitingForPlane, NOW - 600);
        assert_eq!(
            step(&inputs(Some(&at_deadline), None)),
            Step::Wait { overdue: false }
        );
        let back = step(&inputs(Some(&state), None));
        let expected = Handover {
            from: Dra,
            to: DP,
            phase: Phase::Draining,
            since: NOW,
            cordoned: true,
            rollback: rollback(2),
        };
        assert_eq!(back, Step::RollBack(expected.clone()));
        assert!(back.holds_old_plane());
        // The rollback pins the old plane, so the plan asks for the switch back.
        assert_eq!(expected.pinned(2), Some(DP));
        let switched = step(&inputs(Some(&expected), Some((Dra, DP))));
        let Step::Switch(waiting) = switched else {
            panic!("{switched:?}")
        };
        // A rollback past its own deadline keeps waiting and says so.
        let late = Handover {
            since: NOW - 601,
            ..waiting.clone()
        };
        assert_eq!(
            step(&inputs(Some(&late), None)),
            Step::Wait { overdue: true }
        );
        let ready = Inputs {
            ready: ReadyPlanes {
                dra: false,
                device_plugin: true,
            },
            ..inputs(Some(&waiting), None)
        };
        assert_eq!(
            step(&ready),
            Step::Complete {
                uncordon: true,
                record: Some(Handover {
                    phase: Phase::RolledBack,
                    cordoned: false,
                    ..waiting
                })
            }
        );
    }

    #[test]
    fn a_finished_rollback_holds_until_the_generation_changes() {
        let marker = Handover {
            from: Dra,
            to: DP,
            phase: Phase::RolledBack,
            since: NOW - 100,
            cordoned: false,
            rollback: rollback(2),
        };
        assert_eq!(step(&inputs(Some(&marker), None)), Step::Idle);
        let edited = Inputs {
            generation: 3,
            ..inputs(Some(&marker), None)
        };
        assert_eq!(step(&edited), Step::Release);
    }

    #[test]
    fn without_a_gpucluster_nothing_starts_and_a_hand_over_under_way_is_dropped() {
        fn gone(state: Option<&Handover>) -> Step {
            step(&Inputs {
                served: false,
                ..inputs(state, Some((DP, Dra)))
            })
        }
        assert_eq!(gone(None), Step::Idle);
        for phase in [Phase::Draining, Phase::WaitingForPlane] {
            let state = record(phase, NOW);
            assert_eq!(
                gone(Some(&state)),
                Step::Cancel { uncordon: true },
                "{phase:?}"
            );
        }
        let marker = Handover {
            rollback: rollback(2),
            ..record(Phase::RolledBack, NOW)
        };
        assert_eq!(gone(Some(&marker)), Step::Release);
    }

    #[test]
    fn turning_the_policy_back_after_the_switch_hands_over_the_other_way() {
        let state = record(Phase::WaitingForPlane, NOW - 30);
        assert_eq!(
            step(&inputs(Some(&state), Some((Dra, DP)))),
            Step::Reverse(Handover {
                from: Dra,
                to: DP,
                phase: Phase::Draining,
                since: NOW,
                cordoned: true,
                rollback: None,
            })
        );
    }
}
