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
