use super::*;

const NOW: i64 = 10_000;

fn inputs(record: Option<&DriverUpgrade>) -> Inputs<'_> {
    Inputs {
        record,
        wanted: true,
        retry: false,
        driver_waiting: false,
        holders: &[],
        clients: &[],
        plugins: &[],
        driver_ready: true,
        ready: false,
        now: NOW,
        drain: DrainPolicy::Evict,
        deadline_secs: 600,
        may_start: true,
        served: true,
    }
}

fn at(phase: UpgradePhase, since: i64) -> DriverUpgrade {
    DriverUpgrade::at(phase, since, true)
}

/// The record and state label a step leaves, as the controller writes them.
fn after(
    step: &Step,
    before: Option<&DriverUpgrade>,
) -> (Option<DriverUpgrade>, Option<&'static str>) {
    let record = match record_after(step) {
        Some(r) => r,
        None => before.cloned(),
    };
    let label = state_after(step, record.as_ref()).flatten();
    (record, label)
}

#[test]
fn a_wanted_upgrade_starts_only_with_a_free_slot_and_a_gpu_cluster() {
    assert_eq!(step(&inputs(None)), Step::Start { cordoned: false });
    let full = Inputs {
        may_start: false,
        ..inputs(None)
    };
    assert_eq!(step(&full), Step::Queued);
    assert_eq!(after(&Step::Queued, None).1, Some("upgrade-required"));
    let unwanted = Inputs {
        wanted: false,
        ..inputs(None)
    };
    assert_eq!(step(&unwanted), Step::Idle);
    assert_eq!(state_after(&Step::Idle, None), None);
    let unserved = Inputs {
        served: false,
        ..inputs(None)
    };
    assert_eq!(step(&unserved), Step::Idle);
}

#[test]
fn the_drain_evicts_or_waits_then_pauses_the_clients_once_nothing_holds_a_gpu() {
    let draining = at(UpgradePhase::Draining, NOW - 5);
    let pods = ["ml/train-0".to_owned()];
    let holding = Inputs {
        holders: &pods,
        ..inputs(Some(&draining))
    };
    assert_eq!(step(&holding), Step::Drain { evict: true });
    let waiting = Inputs {
        drain: DrainPolicy::Wait,
        ..holding
    };
    assert_eq!(step(&waiting), Step::Drain { evict: false });
    assert_eq!(
        after(&Step::Drain { evict: true }, Some(&draining)).1,
        Some("drain-required")
    );

    let s = step(&inputs(Some(&draining)));
    assert_eq!(s, Step::Pause(at(UpgradePhase::DriverRestart, NOW)));
    let (record, label) = after(&s, Some(&draining));
    assert_eq!(label, Some("pod-restart-required"));
    // The plugin stays until the other clients' claims are unprepared.
    assert_eq!(
        operands(&s, Some(&draining), record.as_ref()),
        Operands::Pause { plugin: false }
    );
    // Before the pause the clients run: nothing holds them, pods still leave through them.
    let drain = Step::Drain { evict: true };
    assert_eq!(
        operands(&drain, Some(&draining), Some(&draining)),
        Operands::Resume
    );
    assert_eq!(operands(&drain, None, Some(&draining)), Operands::Leave);
}

#[test]
fn a_drain_past_the_deadline_fails_the_node_back_to_service_on_its_old_driver() {
    let draining = at(UpgradePhase::Draining, NOW - 601);
    let pods: Vec<String> = (0..7).map(|i| format!("ml/p{i}")).collect();
    let s = step(&Inputs {
        holders: &pods,
        ..inputs(Some(&draining))
    });
    let Step::Fail { uncordon, record } = &s else {
        panic!("{s:?}")
    };
    assert!(uncordon);
    assert!(!record.cordoned);
    assert_eq!(record.failed_in, Some(UpgradePhase::Draining));
    let reason = record.reason.as_deref().unwrap();
    assert!(
        reason.starts_with("7 pod(s) still held the node's GPUs after 600s"),
        "{reason}"
    );
    assert!(reason.contains("ml/p4 and 2 more"), "{reason}");
    assert_eq!(after(&s, Some(&draining)).1, Some("upgrade-failed"));
    // Its validator still passes on the old driver: that is no recovery, only a retry is.
    let ready = Inputs {
        ready: true,
        ..inputs(Some(record))
    };
    assert_eq!(step(&ready), Step::Idle);
    let retry = Inputs {
        retry: true,
        ..ready
    };
    assert_eq!(step(&retry), Step::Start { cordoned: false });
}

#[test]
fn a_waiting_driver_is_let_go_only_once_its_clients_and_then_the_plugin_are_gone() {
    let restarting = at(UpgradePhase::DriverRestart, NOW - 5);
    let clients = ["gpu-operator/nvidia-dra-validator-x".to_owned()];
    let plugins = ["gpu-operator/nvidia-dra-driver-kubelet-plugin-x".to_owned()];
    let running = Inputs {
        clients: &clients,
        plugins: &plugins,
        driver_waiting: true,
        ..inputs(Some(&restarting))
    };
    assert_eq!(step(&running), Step::WaitForClients);
    assert_eq!(
        operands(&Step::WaitForClients, Some(&restarting), Some(&restarting)),
        Operands::Pause { plugin: false }
    );
    let plugin_left = Inputs {
        clients: &[],
        ..running
    };
    assert_eq!(step(&plugin_left), Step::WaitForPlugin);
    let gone = Inputs {
        plugins: &[],
        ..plugin_left
    };
    assert_eq!(step(&gone), Step::Unblock);
    let loading = Inputs {
        driver_waiting: false,
        driver_ready: false,
        ..gone
    };
    assert_eq!(step(&loading), Step::WaitForDriver);
    for s in [Step::WaitForPlugin, Step::Unblock, Step::WaitForDriver] {
        let (record, label) = after(&s, Some(&restarting));
        assert_eq!(label, Some("pod-restart-required"));
        assert_eq!(
            operands(&s, Some(&restarting), record.as_ref()),
            Operands::Pause { plugin: true }
        );
    }
    let loaded = Inputs {
        driver_ready: true,
        ..loading
    };
    let s = step(&loaded);
    assert_eq!(s, Step::Resume(at(UpgradePhase::Validating, NOW)));
    let (record, label) = after(&s, Some(&restarting));
    assert_eq!(label, Some("validation-required"));
    assert_eq!(
        operands(&s, Some(&restarting), record.as_ref()),
        Operands::Resume
    );
}

#[test]
fn clients_that_do_not_stop_fail_the_node_and_bring_them_back() {
    let restarting = at(UpgradePhase::DriverRestart, NOW - 601);
    let clients = ["gpu-operator/nvidia-dra-validator-x".to_owned()];
    let s = step(&Inputs {
        clients: &clients,
        ..inputs(Some(&restarting))
    });
    let Step::Fail { uncordon, record } = &s else {
        panic!("{s:?}")
    };
    assert!(!uncordon);
    assert!(record.cordoned);
    assert!(
        record
            .reason
            .as_deref()
            .unwrap()
            .contains("did not stop: gpu-operator/nvidia-dra-validator-x")
    );
    assert_eq!(
        operands(&s, Some(&restarting), Some(record)),
        Operands::Resume
    );
}

#[test]
fn the_validator_completes_the_upgrade_or_its_deadline_fails_it_cordoned() {
    let validating = at(UpgradePhase::Validating, NOW - 30);
    assert_eq!(step(&inputs(Some(&validating))), Step::Validate);
    let ready = Inputs {
        ready: true,
        // The request stays until the upgrade is done.
        wanted: true,
        ..inputs(Some(&validating))
    };
    let s = step(&ready);
    assert_eq!(s, Step::Complete { uncordon: true });
    assert_eq!(after(&s, Some(&validating)), (None, Some("upgrade-done")));

    let late = at(UpgradePhase::Validating, NOW - 601);
    let s = step(&inputs(Some(&late)));
    let Step::Fail { uncordon, record } = &s else {
        panic!("{s:?}")
    };
    assert!(!uncordon);
    assert!(record.takes_node_out());
    assert!(
        record
            .reason
            .as_deref()
            .unwrap()
            .starts_with("the validator did not pass within 600s")
    );
    // Failed, it waits; a driver fixed in place that passes validation completes it.
    assert_eq!(step(&inputs(Some(record))), Step::Idle);
    let fixed = Inputs {
        ready: true,
        ..inputs(Some(record))
    };
    assert_eq!(step(&fixed), Step::Complete { uncordon: true });
    let retry = Inputs {
        retry: true,
        ..inputs(Some(record))
    };
    assert_eq!(step(&retry), Step::Start { cordoned: true });
}

#[test]
fn a_withdrawn_request_cancels_only_before_the_clients_pause() {
    let draining = at(UpgradePhase::Draining, NOW - 5);
    let withdrawn = Inputs {
        wanted: false,
        ..inputs(Some(&draining))
    };
    let s = step(&withdrawn);
    assert_eq!(
        s,
        Step::Cancel {
            uncordon: true,
            unblock: false
        }
    );
    assert_eq!(after(&s, Some(&draining)), (None, None));
    assert_eq!(operands(&s, Some(&draining), None), Operands::Resume);
    // Past the pause the driver may be changing: the request was consumed, the upgrade goes on.
    let validating = at(UpgradePhase::Validating, NOW - 5);
    assert_eq!(
        step(&Inputs {
            wanted: false,
            ..inputs(Some(&validating))
        }),
        Step::Validate
    );
}

#[test]
fn without_a_gpu_cluster_an_upgrade_under_way_lets_the_node_and_its_driver_go() {
    for phase in [
        UpgradePhase::Draining,
        UpgradePhase::DriverRestart,
        UpgradePhase::Validating,
    ] {
        let record = at(phase, NOW - 5);
        let gone = Inputs {
            served: false,
            driver_waiting: true,
            ..inputs(Some(&record))
        };
        assert_eq!(
            step(&gone),
            Step::Cancel {
                uncordon: true,
                unblock: true
            },
            "{phase:?}"
        );
    }
}

#[test]
fn only_steps_that_wait_on_something_moving_are_polled() {
    assert!(Step::Drain { evict: true }.in_motion());
    assert!(Step::Queued.in_motion());
    assert!(Step::Validate.in_motion());
    assert!(!Step::Idle.in_motion());
    assert!(!Step::Complete { uncordon: true }.in_motion());
    assert!(Step::Start { cordoned: false }.starts());
    assert!(!Step::Queued.starts());
}
