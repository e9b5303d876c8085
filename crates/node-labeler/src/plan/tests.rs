use super::*;
use api::gpucluster::PlaneRule;

const NFD: &str = "feature.node.kubernetes.io/pci-10de.present";
const MODE: &str = l::ALLOCATION_MODE;
const DRA: &str = l::DEPLOY_DRA_DRIVER;
const DP: &str = "nvidia.com/gpu.deploy.device-plugin";

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn cluster(gpu_cluster: bool, cluster_policy: bool) -> Cluster {
    Cluster {
        gpu_cluster,
        cluster_policy,
        gpu_cluster_device_plugin: false,
        default_mode: AllocationMode::DevicePlugin,
        driver_auto_upgrade: false,
        rules: Vec::new(),
    }
}

const GC: Cluster = Cluster {
    gpu_cluster: true,
    cluster_policy: false,
    gpu_cluster_device_plugin: false,
    default_mode: AllocationMode::DevicePlugin,
    driver_auto_upgrade: false,
    rules: Vec::new(),
};

fn labels_after(node: &[(&str, &str)], c: &Cluster, claims: GpuClaims) -> BTreeMap<String, String> {
    let mut labels = map(node);
    for (k, v) in plan(&labels.clone(), &BTreeMap::new(), c, claims).labels {
        match v {
            Some(v) => labels.insert(k, v),
            None => labels.remove(&k),
        };
    }
    labels
}

fn sets<'a>(p: &'a Plan, key: &str) -> Option<&'a str> {
    p.labels.get(key).and_then(|v| v.as_deref())
}

/// A GPUCluster that serves both planes, with `default_mode` for new nodes.
fn both_planes(default_mode: AllocationMode) -> Cluster {
    Cluster {
        gpu_cluster_device_plugin: true,
        default_mode,
        ..GC
    }
}

#[test]
fn a_gpucluster_serving_both_planes_puts_new_nodes_in_the_default_mode() {
    let dp = labels_after(
        &[(NFD, "true")],
        &both_planes(AllocationMode::DevicePlugin),
        GpuClaims::Unknown,
    );
    assert_eq!(dp.get(MODE).map(String::as_str), Some("device-plugin"));
    assert_eq!(dp.get(DP).map(String::as_str), Some("true"));
    assert!(!dp.contains_key(DRA));

    let dra = labels_after(
        &[(NFD, "true")],
        &both_planes(AllocationMode::Dra),
        GpuClaims::Unknown,
    );
    assert_eq!(dra.get(MODE).map(String::as_str), Some("dra"));
    assert_eq!(dra.get(DRA).map(String::as_str), Some("true"));
    assert!(!dra.contains_key(DP));
}

#[test]
fn switching_a_node_to_device_plugin_moves_its_deploy_labels() {
    let c = both_planes(AllocationMode::Dra);
    let on_dra = labels_after(&[(NFD, "true")], &c, GpuClaims::Unknown);
    let mut switched: Vec<(&str, &str)> = on_dra
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .filter(|(k, _)| *k != MODE)
        .collect();
    switched.push((MODE, "device-plugin"));
    let after = labels_after(&switched, &c, GpuClaims::None);
    assert_eq!(after.get(DP).map(String::as_str), Some("true"));
    assert!(!after.contains_key(DRA), "{after:?}");
    assert!(
        !after
            .keys()
            .any(|k| k.ends_with("-dra") || k.ends_with("dra-validator")),
        "{after:?}"
    );
}

/// A converged node on `mode`'s plane, with `extra` labels on top.
fn converged(c: &Cluster, mode: &str, extra: &[(&str, &str)]) -> BTreeMap<String, String> {
    let mut labels = labels_after(&[(NFD, "true"), (MODE, mode)], c, GpuClaims::None);
    labels.extend(map(extra));
    labels
}

#[test]
fn a_switch_between_served_planes_is_reported_for_the_hand_over() {
    let c = both_planes(AllocationMode::Dra);
    let mut on_dp = converged(&c, "device-plugin", &[]);
    on_dp.insert(MODE.into(), "dra".into());
    let p = plan(&on_dp, &BTreeMap::new(), &c, GpuClaims::Held);
    assert_eq!(
        p.switch,
        Some((AllocationMode::DevicePlugin, AllocationMode::Dra))
    );
    // Opting out is no switch: nothing is handed over to.
    let mut opted_out = converged(&c, "device-plugin", &[(l::ENABLED, "false")]);
    opted_out.insert(MODE.into(), "dra".into());
    assert_eq!(
        plan(&opted_out, &BTreeMap::new(), &c, GpuClaims::Held).switch,
        None
    );
    // Nor is a mode whose plane nobody serves.
    let mut to_unserved = converged(&GC, "dra", &[]);
    to_unserved.insert(MODE.into(), "device-plugin".into());
    assert_eq!(
        plan(&to_unserved, &BTreeMap::new(), &GC, GpuClaims::Held).switch,
        None
    );
}

#[test]
fn a_pinned_node_stays_on_its_plane_whatever_the_rules_say() {
    let rule = PlaneRule {
        name: "all-dra".into(),
        node_selector: Default::default(),
        mode: AllocationMode::Dra,
    };
    let c = Cluster {
        rules: vec![Rule::new(&rule).unwrap()],
        ..both_planes(AllocationMode::Dra)
    };
    let mut node = converged(&both_planes(AllocationMode::Dra), "dra", &[]);
    node.insert(MODE.into(), "dra".into());
    let facts = NodeFacts {
        pinned: Some(AllocationMode::DevicePlugin),
        ..NodeFacts::claims(GpuClaims::Held)
    };
    let p = plan_node(&node, &BTreeMap::new(), &c, facts);
    assert_eq!(sets(&p, MODE), Some("device-plugin"));
    assert_eq!(
        p.annotations.get(l::CHOSEN_MODE),
        Some(&Some("device-plugin".to_owned()))
    );
    assert_eq!(
        p.switch,
        Some((AllocationMode::Dra, AllocationMode::DevicePlugin))
    );
    assert!(
        !p.findings
            .iter()
            .any(|f| matches!(f, Finding::ModeChosenByRule { .. })),
        "no rule decided: {:?}",
        p.findings
    );
}

#[test]
fn a_queued_hand_over_keeps_the_old_plane_whole_and_a_draining_one_its_plugin() {
    let c = both_planes(AllocationMode::Dra);
    let mut node = converged(&c, "device-plugin", &[]);
    node.insert(MODE.into(), "dra".into());
    let hold = |hold| NodeFacts {
        hold,
        ..NodeFacts::claims(GpuClaims::Unknown)
    };
    let p = plan_node(&node, &BTreeMap::new(), &c, hold(Hold::WholePlane));
    assert!(p.labels.is_empty(), "{:?}", p.labels);
    assert!(p.findings.is_empty(), "{:?}", p.findings);
    assert_eq!(p.needs_claim_lookup, None);
    assert_eq!(
        p.switch,
        Some((AllocationMode::DevicePlugin, AllocationMode::Dra))
    );
    // Draining keeps only the plugin, as a deferral does, but says nothing.
    let draining = plan_node(&node, &BTreeMap::new(), &c, hold(Hold::Plugin));
    assert!(draining.findings.is_empty(), "{:?}", draining.findings);
    let deferred = plan(&node, &BTreeMap::new(), &c, GpuClaims::Held);
    assert_eq!(draining.labels, deferred.labels);
    assert_eq!(
        draining.labels.get(l::DEPLOY_OPERATOR_VALIDATOR),
        Some(&None),
        "{:?}",
        draining.labels
    );
    assert!(!draining.labels.contains_key(DP));
}

#[test]
fn readiness_labels_follow_the_validator_of_the_plane_the_node_keeps() {
    let c = both_planes(AllocationMode::Dra);
    let node = converged(&c, "dra", &[]);
    let ready = |dra, device_plugin| NodeFacts {
        ready: ReadyPlanes { dra, device_plugin },
        ..NodeFacts::claims(GpuClaims::None)
    };
    let p = plan_node(&node, &BTreeMap::new(), &c, ready(true, false));
    assert_eq!(sets(&p, l::GPU_STACK), Some("dra"));
    assert_eq!(sets(&p, l::GPU_SETUP_COMPLETE), Some("true"));
    // Another plane's validator proves nothing about this one.
    assert!(
        plan_node(&node, &BTreeMap::new(), &c, ready(false, true))
            .labels
            .is_empty()
    );
    // Once set, they go when the validator stops passing...
    let mut labelled = node.clone();
    labelled.extend(map(&[
        (l::GPU_STACK, "dra"),
        (l::GPU_SETUP_COMPLETE, "true"),
    ]));
    assert!(
        plan_node(&labelled, &BTreeMap::new(), &c, ready(true, false))
            .labels
            .is_empty()
    );
    let p = plan_node(&labelled, &BTreeMap::new(), &c, ready(false, false));
    assert_eq!(p.labels.get(l::GPU_STACK), Some(&None));
    assert_eq!(p.labels.get(l::GPU_SETUP_COMPLETE), Some(&None));
    // ...and when the labels move to the other plane, whatever the old validator says.
    labelled.insert(MODE.into(), "device-plugin".into());
    let p = plan_node(&labelled, &BTreeMap::new(), &c, ready(true, false));
    assert_eq!(p.labels.get(DRA), Some(&None));
    assert_eq!(p.labels.get(l::GPU_STACK), Some(&None));
    // While the old plane is kept, it is still the one that counts.
    let mut held = NodeFacts {
        claims: GpuClaims::Held,
        ..ready(true, false)
    };
    assert!(
        !plan_node(&labelled, &BTreeMap::new(), &c, held)
            .labels
            .contains_key(l::GPU_STACK)
    );
    held.ready = ReadyPlanes::default();
    let cpu = map(&[(l::GPU_STACK, "dra")]);
    assert_eq!(
        plan_node(&cpu, &BTreeMap::new(), &c, held)
            .labels
            .get(l::GPU_STACK),
        Some(&None)
    );
}

#[test]
fn a_gpucluster_without_its_device_plugin_keeps_new_nodes_on_dra() {
    let dra = labels_after(
        &[(NFD, "true")],
        &Cluster {
            default_mode: AllocationMode::DevicePlugin,
            ..GC
        },
        GpuClaims::Unknown,
    );
    assert_eq!(dra.get(MODE).map(String::as_str), Some("dra"));
}

#[test]
fn new_gpu_node_with_gpucluster_gets_dra_mode_and_the_dra_plane() {
    let p = plan(
        &map(&[(NFD, "true")]),
        &BTreeMap::new(),
        &GC,
        GpuClaims::Unknown,
    );
    assert_eq!(sets(&p, l::GPU_PRESENT), Some("true"));
    assert_eq!(sets(&p, MODE), Some("dra"));
    for key in l::DRA_PLANE_KEYS {
        assert_eq!(sets(&p, key), Some("true"), "{key}");
    }
    assert_eq!(p.labels.len(), 2 + l::DRA_PLANE_KEYS.len(), "{p:#?}");
    assert!(p.needs_claim_lookup.is_none());
}

#[test]
fn every_nfd_gpu_label_counts_and_false_does_not() {
    for key in l::NFD_GPU_LABELS {
        assert!(is_gpu_node(&map(&[(key, "true")])), "{key}");
        assert!(!is_gpu_node(&map(&[(key, "false")])), "{key}");
    }
    assert!(!is_gpu_node(&map(&[(
        "feature.node.kubernetes.io/cpu-model.vendor_id",
        "Intel"
    )])));
}

#[test]
fn cpu_nodes_get_nothing() {
    let p = plan(
        &map(&[("kubernetes.io/os", "linux")]),
        &BTreeMap::new(),
        &GC,
        GpuClaims::Unknown,
    );
    assert_eq!(p, Plan::default());
}

#[test]
fn lost_gpu_labels_set_present_false_and_remove_our_keys() {
    let node = [
        (l::GPU_PRESENT, "true"),
        (MODE, "dra"),
        (l::DEPLOY_DRA_VALIDATOR, "true"),
        ("nvidia.com/gpu.deploy.nvsm", "true"),
    ];
    let after = labels_after(&node, &GC, GpuClaims::None);
    assert_eq!(after.get(l::GPU_PRESENT).map(String::as_str), Some("false"));
    assert!(!after.contains_key(l::DEPLOY_DRA_VALIDATOR));
    assert_eq!(
        after.get("nvidia.com/gpu.deploy.nvsm").map(String::as_str),
        Some("true")
    );
    assert_eq!(
        after.get(MODE).map(String::as_str),
        Some("dra"),
        "mode is never overwritten"
    );
}

#[test]
fn default_mode_decides_only_when_both_crs_exist() {
    let node = [(NFD, "true")];
    let mode_of = |c: Cluster| {
        plan(&map(&node), &BTreeMap::new(), &c, GpuClaims::Unknown)
            .labels
            .get(MODE)
            .cloned()
            .flatten()
    };
    assert_eq!(mode_of(cluster(true, false)), Some("dra".into()));
    assert_eq!(mode_of(cluster(false, true)), Some("device-plugin".into()));
    assert_eq!(mode_of(cluster(true, true)), Some("device-plugin".into()));
    assert_eq!(
        mode_of(Cluster {
            default_mode: AllocationMode::Dra,
            ..cluster(true, true)
        }),
        Some("dra".into())
    );
    assert_eq!(mode_of(cluster(false, false)), None);
}

#[test]
fn neither_cr_only_maintains_gpu_present() {
    let node = [(NFD, "true"), (MODE, "dra"), (DP, "true")];
    let p = plan(
        &map(&node),
        &BTreeMap::new(),
        &cluster(false, false),
        GpuClaims::Unknown,
    );
    assert_eq!(
        p.labels,
        BTreeMap::from([(l::GPU_PRESENT.to_string(), Some("true".to_string()))])
    );
}

#[test]
fn admin_set_mode_is_honoured() {
    let node = [(NFD, "true"), (MODE, "device-plugin")];
    let after = labels_after(&node, &cluster(true, true), GpuClaims::None);
    assert_eq!(after.get(MODE).map(String::as_str), Some("device-plugin"));
    assert_eq!(after.get(DP).map(String::as_str), Some("true"));
    assert!(!after.contains_key(DRA));
}

#[test]
fn invalid_mode_is_reported_never_overwritten_and_deploy_labels_are_left_alone() {
    for bad in ["DRA", "gpu", "device_plugin"] {
        let node = [(NFD, "true"), (MODE, bad), (DP, "true"), (DRA, "true")];
        let p = plan(&map(&node), &BTreeMap::new(), &GC, GpuClaims::Unknown);
        assert_eq!(p.findings, vec![Finding::InvalidMode(bad.into())]);
        assert!(!p.labels.contains_key(MODE), "{bad}: {p:?}");
        assert!(
            !p.labels.contains_key(DP) && !p.labels.contains_key(DRA),
            "{bad}: {p:?}"
        );
    }
}

#[test]
fn empty_mode_counts_as_unset() {
    let p = plan(
        &map(&[(NFD, "true"), (MODE, "")]),
        &BTreeMap::new(),
        &GC,
        GpuClaims::Unknown,
    );
    assert_eq!(sets(&p, MODE), Some("dra"));
}

#[test]
fn existing_non_empty_values_are_kept_and_empty_ones_set() {
    let pause = l::PAUSED_FOR_DRIVER_UPGRADE;
    let suffixed = "true_paused-for-driver-upgrade";
    let node = [
        (NFD, "true"),
        (MODE, "dra"),
        (l::DEPLOY_DRIVER, "pre-installed"),
        (DRA, pause),
        (l::DEPLOY_DRA_VALIDATOR, suffixed),
        (l::DEPLOY_DCGM_DRA, "false"),
        (l::DEPLOY_DCGM_EXPORTER_DRA, ""),
    ];
    let after = labels_after(&node, &GC, GpuClaims::Unknown);
    assert_eq!(after[l::DEPLOY_DRIVER], "pre-installed");
    assert_eq!(after[DRA], pause);
    assert_eq!(after[l::DEPLOY_DRA_VALIDATOR], suffixed);
    assert_eq!(after[l::DEPLOY_DCGM_DRA], "false");
    assert_eq!(after[l::DEPLOY_DCGM_EXPORTER_DRA], "true");
}

#[test]
fn dra_nodes_sweep_the_device_plugin_plane_whatever_its_values() {
    let node = [
        (NFD, "true"),
        (MODE, "dra"),
        (DP, "paused-for-driver-upgrade"),
        ("nvidia.com/gpu.deploy.mig-manager", "true"),
        ("nvidia.com/gpu.deploy.operator-validator", "false"),
    ];
    // Once no pod holds a GPU the device plugin gave.
    let after = labels_after(&node, &GC, GpuClaims::None);
    for key in l::DEVICE_PLUGIN_ONLY_KEYS {
        assert!(!after.contains_key(key), "{key} left on a DRA node");
    }
}

#[test]
fn unknown_deploy_keys_and_operands_key_are_never_touched() {
    let node = [
        (NFD, "true"),
        (MODE, "dra"),
        ("nvidia.com/gpu.deploy.nvsm", "true"),
        (l::DEPLOY_OPERANDS, "true"),
        ("nvidia.com/mig.config", "all-disabled"),
    ];
    let p = plan(&map(&node), &BTreeMap::new(), &GC, GpuClaims::Unknown);
    for key in [
        "nvidia.com/gpu.deploy.nvsm",
        l::DEPLOY_OPERANDS,
        "nvidia.com/mig.config",
    ] {
        assert!(!p.labels.contains_key(key), "{key}");
    }
}

#[test]
fn an_admins_opt_out_outlives_a_node_not_yet_labelled_a_gpu_node() {
    // Before GPU discovery has labelled the node, it is no GPU node: our keys go, the
    // admin's `false` stays, and holds once the node turns out to have GPUs.
    let node = [
        (MODE, "dra"),
        (l::DEPLOY_DRA_VALIDATOR, "false"),
        (l::DEPLOY_DCGM_EXPORTER_DRA, "false"),
        (DRA, "true"),
    ];
    let before = labels_after(&node, &GC, GpuClaims::None);
    assert!(!before.contains_key(DRA));
    assert_eq!(before[l::DEPLOY_DRA_VALIDATOR], "false");
    assert_eq!(before[l::DEPLOY_DCGM_EXPORTER_DRA], "false");
    let mut discovered: Vec<(&str, &str)> = before
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    discovered.push((NFD, "true"));
    let after = labels_after(&discovered, &GC, GpuClaims::None);
    assert_eq!(after[DRA], "true");
    assert_eq!(after[l::DEPLOY_DRA_VALIDATOR], "false");
    assert_eq!(after[l::DEPLOY_DCGM_EXPORTER_DRA], "false");
}

#[test]
fn kill_switch_removes_every_key_we_own_but_waits_for_claims_on_dra_driver() {
    let node = [
        (NFD, "true"),
        (MODE, "dra"),
        (l::DEPLOY_OPERANDS, "false"),
        (DRA, "true"),
        (l::DEPLOY_DRA_VALIDATOR, "true"),
        (l::DEPLOY_DRIVER, "true"),
        (DP, "true"),
        ("nvidia.com/gpu.deploy.nvsm", "true"),
    ];
    let held = labels_after(&node, &GC, GpuClaims::Held);
    assert_eq!(held.get(DRA).map(String::as_str), Some("true"));
    assert!(!held.contains_key(l::DEPLOY_DRA_VALIDATOR) && !held.contains_key(DP));
    let free = labels_after(&node, &GC, GpuClaims::None);
    for key in owned_keys() {
        assert!(!free.contains_key(key), "{key}");
    }
    assert!(free.contains_key("nvidia.com/gpu.deploy.nvsm"));
    assert_eq!(
        free.get(l::DEPLOY_OPERANDS).map(String::as_str),
        Some("false")
    );
}

#[test]
fn switching_away_from_dra_defers_dra_driver_until_claims_are_gone() {
    let node = [
        (NFD, "true"),
        (MODE, "device-plugin"),
        (DRA, "true"),
        (l::DEPLOY_DRA_VALIDATOR, "true"),
        (l::DEPLOY_DRIVER, "true"),
    ];
    let both = cluster(true, true);

    let unknown = plan(&map(&node), &BTreeMap::new(), &both, GpuClaims::Unknown);
    assert_eq!(unknown.needs_claim_lookup, Some(AllocationMode::Dra));
    assert!(!unknown.labels.contains_key(DRA));

    let held = plan(&map(&node), &BTreeMap::new(), &both, GpuClaims::Held);
    assert!(!held.labels.contains_key(DRA));
    assert!(held.is_deferred());
    assert_eq!(
        held.labels.get(l::DEPLOY_DRA_VALIDATOR),
        Some(&None),
        "consumers go first"
    );
    assert_eq!(
        sets(&held, DP),
        None,
        "no device plugin while the DRA plugin serves held claims: one plane per node"
    );
    assert_eq!(sets(&unknown, DP), None);
    assert!(
        !held.labels.contains_key(l::DEPLOY_DRIVER),
        "the shared driver key stays"
    );

    let free = plan(&map(&node), &BTreeMap::new(), &both, GpuClaims::None);
    assert_eq!(free.labels.get(DRA), Some(&None));
    assert_eq!(
        sets(&free, DP),
        Some("true"),
        "the device plugin once DRA is gone"
    );
    assert!(!free.is_deferred() && free.needs_claim_lookup.is_none());
}

#[test]
fn switching_back_to_dra_keeps_the_device_plugin_until_its_gpus_are_free() {
    let node = [
        (NFD, "true"),
        (MODE, "dra"),
        (DP, "true"),
        ("nvidia.com/gpu.deploy.operator-validator", "true"),
        (l::DEPLOY_DRIVER, "true"),
    ];
    let both = cluster(true, true);
    let unknown = plan(&map(&node), &BTreeMap::new(), &both, GpuClaims::Unknown);
    assert_eq!(
        unknown.needs_claim_lookup,
        Some(AllocationMode::DevicePlugin)
    );
    let held = plan(&map(&node), &BTreeMap::new(), &both, GpuClaims::Held);
    for p in [&unknown, &held] {
        assert!(!p.labels.contains_key(DP), "the device plugin stays");
        assert_eq!(
            sets(p, DRA),
            None,
            "no DRA plugin beside it: one plane per node"
        );
        assert_eq!(
            p.labels.get("nvidia.com/gpu.deploy.operator-validator"),
            Some(&None),
            "its consumers go first"
        );
    }
    assert!(
        held.findings
            .contains(&Finding::DevicePluginRemovalDeferred)
    );
    assert!(held.is_deferred());
    let free = plan(&map(&node), &BTreeMap::new(), &both, GpuClaims::None);
    assert_eq!(free.labels.get(DP), Some(&None));
    assert_eq!(sets(&free, DRA), Some("true"));
    assert!(!free.is_deferred());
}

fn with_rules(rules: serde_json::Value) -> Cluster {
    let rules: Vec<PlaneRule> = serde_json::from_value(rules).unwrap();
    Cluster {
        rules: rules.iter().map(|r| Rule::new(r).unwrap()).collect(),
        ..both_planes(AllocationMode::Dra)
    }
}

fn policy() -> Cluster {
    with_rules(serde_json::json!([
        {"name": "a100-on-dra", "mode": "dra",
         "nodeSelector": {"matchExpressions": [{"key": l::GPU_PRODUCT, "operator": "In",
                                                "values": ["NVIDIA-A100-SXM4-40GB"]}]}},
        {"name": "rest-on-device-plugin", "mode": "device-plugin", "nodeSelector": {}},
    ]))
}

const CHOSEN: &str = l::CHOSEN_MODE;

fn annotated(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    map(pairs)
}

#[test]
fn the_first_matching_rule_chooses_a_new_nodes_mode_and_says_so() {
    let a100 = map(&[(NFD, "true"), (l::GPU_PRODUCT, "NVIDIA-A100-SXM4-40GB")]);
    let p = plan(&a100, &BTreeMap::new(), &policy(), GpuClaims::None);
    assert_eq!(sets(&p, MODE), Some("dra"));
    assert_eq!(p.annotations.get(CHOSEN), Some(&Some("dra".to_owned())));
    assert!(p.findings.contains(&Finding::ModeChosenByRule {
        rule: "a100-on-dra".into(),
        mode: AllocationMode::Dra
    }));
    let t4 = map(&[(NFD, "true"), (l::GPU_PRODUCT, "Tesla-T4")]);
    let p = plan(&t4, &BTreeMap::new(), &policy(), GpuClaims::None);
    assert_eq!(sets(&p, MODE), Some("device-plugin"));
    assert_eq!(sets(&p, DP), Some("true"));
}

#[test]
fn a_changed_rule_moves_the_nodes_the_labeler_chose_for_but_not_hand_set_ones() {
    let moved = with_rules(serde_json::json!([
        {"name": "all-on-device-plugin", "mode": "device-plugin", "nodeSelector": {}}]));
    let node = map(&[
        (NFD, "true"),
        (MODE, "dra"),
        (DRA, "true"),
        (l::DEPLOY_DRIVER, "true"),
    ]);
    let ours = annotated(&[(CHOSEN, "dra")]);
    let p = plan(&node, &ours, &moved, GpuClaims::None);
    assert_eq!(sets(&p, MODE), Some("device-plugin"));
    assert_eq!(
        p.annotations.get(CHOSEN),
        Some(&Some("device-plugin".to_owned()))
    );
    assert_eq!(p.labels.get(DRA), Some(&None));
    // Claims still held: the switch waits for them, as any switch does.
    let held = plan(&node, &ours, &moved, GpuClaims::Held);
    assert!(held.is_deferred() && !held.labels.contains_key(DRA));

    // The label differs from what the labeler chose: an admin's, kept; the annotation goes.
    let hand_set = annotated(&[(CHOSEN, "device-plugin")]);
    let p = plan(&node, &hand_set, &moved, GpuClaims::None);
    assert!(!p.labels.contains_key(MODE));
    assert_eq!(p.annotations.get(CHOSEN), Some(&None));
    // A label without the annotation (set by hand, or by a labeler before the policy) too.
    let p = plan(&node, &BTreeMap::new(), &moved, GpuClaims::None);
    assert!(!p.labels.contains_key(MODE) && !p.annotations.contains_key(CHOSEN));
}

#[test]
fn the_default_is_for_new_nodes_only() {
    let node = map(&[(NFD, "true"), (MODE, "device-plugin"), (DP, "true")]);
    let ours = annotated(&[(CHOSEN, "device-plugin")]);
    // No rule matches and the default is dra: the node keeps the mode it has.
    let p = plan(
        &node,
        &ours,
        &with_rules(serde_json::json!([])),
        GpuClaims::None,
    );
    assert!(!p.labels.contains_key(MODE) && !p.annotations.contains_key(CHOSEN));
}

#[test]
fn control_plane_nodes_get_a_mode_only_from_a_rule_that_names_them() {
    let cp = map(&[(NFD, "true"), (l::CONTROL_PLANE_ROLE, "")]);
    let p = plan(&cp, &BTreeMap::new(), &policy(), GpuClaims::None);
    assert!(
        !p.labels.contains_key(MODE),
        "the empty selector does not take it"
    );
    assert!(
        !p.labels
            .iter()
            .any(|(k, v)| k.starts_with(l::DEPLOY_PREFIX) && v.is_some()),
        "no plane's keys: {:?}",
        p.labels
    );
    let named = with_rules(serde_json::json!([
        {"name": "gpu-control-plane", "mode": "dra",
         "nodeSelector": {"matchExpressions": [{"key": l::CONTROL_PLANE_ROLE, "operator": "Exists"}]}}]));
    let p = plan(&cp, &BTreeMap::new(), &named, GpuClaims::None);
    assert_eq!(sets(&p, MODE), Some("dra"));
    assert_eq!(sets(&p, DRA), Some("true"));
    // Chosen before, no rule names it now: its mode and our keys go.
    let served = map(&[
        (NFD, "true"),
        (l::CONTROL_PLANE_ROLE, ""),
        (MODE, "dra"),
        (DRA, "true"),
    ]);
    let p = plan(
        &served,
        &annotated(&[(CHOSEN, "dra")]),
        &policy(),
        GpuClaims::None,
    );
    assert_eq!(p.labels.get(MODE), Some(&None));
    assert_eq!(p.labels.get(DRA), Some(&None));
    assert_eq!(p.annotations.get(CHOSEN), Some(&None));
}

#[test]
fn an_opted_out_node_gets_no_mode_and_loses_our_keys() {
    let node = map(&[(NFD, "true"), (l::ENABLED, "false"), (DP, "true")]);
    let p = plan(&node, &BTreeMap::new(), &policy(), GpuClaims::None);
    assert!(!p.labels.contains_key(MODE));
    assert_eq!(p.labels.get(DP), Some(&None));
    // Claims of the plane it leaves are waited for, as for any removal.
    let held = plan(&node, &BTreeMap::new(), &policy(), GpuClaims::Held);
    assert!(!held.labels.contains_key(DP));
}

#[test]
fn device_plugin_plane_adds_mig_manager_on_mig_capable_non_vgpu_nodes() {
    let cp = cluster(false, true);
    for (extra, want) in [
        (vec![(l::MIG_CAPABLE, "true")], true),
        (vec![(l::GPU_PRODUCT, "NVIDIA-A100-SXM4-40GB")], true),
        (vec![(l::GPU_PRODUCT, "NVIDIA-H100-80GB-HBM3")], true),
        (vec![(l::GPU_PRODUCT, "Tesla-T4")], false),
        // Without the discovered label, every MIG-capable product by name...
        (vec![(l::GPU_PRODUCT, "NVIDIA-H200")], true),
        (vec![(l::GPU_PRODUCT, "NVIDIA-H20")], true),
        (vec![(l::GPU_PRODUCT, "NVIDIA-GH200-480GB")], true),
        (vec![(l::GPU_PRODUCT, "NVIDIA-B200")], true),
        (vec![(l::GPU_PRODUCT, "NVIDIA-GB200")], true),
        (vec![(l::GPU_PRODUCT, "NVIDIA-B300-SXM6-AC")], true),
        (vec![(l::GPU_PRODUCT, "NVIDIA-A30")], true),
        (
            vec![(
                l::GPU_PRODUCT,
                "NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition",
            )],
            true,
        ),
        // ...and no product whose name merely contains one.
        (vec![(l::GPU_PRODUCT, "NVIDIA-RTX-A3000-Laptop-GPU")], false),
        (vec![(l::GPU_PRODUCT, "NVIDIA-L4")], false),
        // What discovery found wins over the name.
        (
            vec![
                (l::MIG_CAPABLE, "false"),
                (l::GPU_PRODUCT, "NVIDIA-H100-80GB-HBM3"),
            ],
            false,
        ),
        (
            vec![
                (l::MIG_CAPABLE, "true"),
                (l::VGPU_HOST_DRIVER_VERSION, "550.1"),
            ],
            false,
        ),
    ] {
        let mut node = vec![(NFD, "true")];
        node.extend(extra.clone());
        let after = labels_after(&node, &cp, GpuClaims::None);
        assert_eq!(after.contains_key(l::DEPLOY_MIG_MANAGER), want, "{extra:?}");
    }
}

#[test]
fn converged_node_needs_no_write() {
    let node = [(NFD, "true")];
    let after = labels_after(&node, &GC, GpuClaims::Unknown);
    let pairs: Vec<(&str, &str)> = after
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let p = plan(&map(&pairs), &BTreeMap::new(), &GC, GpuClaims::Unknown);
    assert!(!p.has_changes(), "{p:#?}");
}

#[test]
fn driver_upgrade_annotation_follows_the_policy_on_gpu_nodes() {
    let node = map(&[(NFD, "true")]);
    let on = Cluster {
        driver_auto_upgrade: true,
        ..GC
    };
    let p = plan(&node, &BTreeMap::new(), &on, GpuClaims::Unknown);
    assert_eq!(
        p.annotations.get(l::DRIVER_UPGRADE_ENABLED),
        Some(&Some("true".into()))
    );
    let annotated = map(&[(l::DRIVER_UPGRADE_ENABLED, "true")]);
    assert!(
        !plan(&node, &annotated, &on, GpuClaims::Unknown)
            .annotations
            .contains_key(l::DRIVER_UPGRADE_ENABLED)
    );
    let off = plan(&node, &annotated, &GC, GpuClaims::Unknown);
    assert_eq!(off.annotations.get(l::DRIVER_UPGRADE_ENABLED), Some(&None));
    let cpu = plan(&map(&[]), &BTreeMap::new(), &on, GpuClaims::Unknown);
    assert!(cpu.annotations.is_empty());
}

#[test]
fn a_driver_upgrade_pauses_the_drivers_clients_and_takes_back_only_its_pauses() {
    let c = both_planes(AllocationMode::Dra);
    let mut node = converged(&c, "dra", &[]);
    node.insert(l::DEPLOY_DCGM_DRA.into(), "false".into());
    node.insert(l::DEPLOY_DCGM_EXPORTER_DRA.into(), "pinned".into());
    let facts = |operands| NodeFacts {
        operands,
        ..NodeFacts::claims(GpuClaims::None)
    };
    let first = plan_node(
        &node,
        &BTreeMap::new(),
        &c,
        facts(Operands::Pause { plugin: false }),
    );
    // The plugin stays until the other clients' claims are unprepared, then goes too.
    assert!(!first.labels.contains_key(DRA), "{:?}", first.labels);
    assert_eq!(
        sets(&first, l::DEPLOY_DRA_VALIDATOR),
        Some(l::PAUSED_FOR_DRIVER_UPGRADE)
    );
    let pause = Operands::Pause { plugin: true };
    let half = first.labels_after(&node);
    let paused = plan_node(&half, &BTreeMap::new(), &c, facts(pause));
    let after = paused.labels_after(&half);
    let value = |key: &str| after.get(key).map(String::as_str);
    assert_eq!(value(DRA), Some(l::PAUSED_FOR_DRIVER_UPGRADE));
    assert_eq!(
        value(l::DEPLOY_DRA_VALIDATOR),
        Some(l::PAUSED_FOR_DRIVER_UPGRADE)
    );
    assert_eq!(
        value(l::DEPLOY_DCGM_EXPORTER_DRA),
        Some("pinned_paused-for-driver-upgrade")
    );
    // The driver itself and an admin's `false` are no clients to pause.
    assert_eq!(value(l::DEPLOY_DRIVER), Some("true"));
    assert_eq!(value(l::DEPLOY_DCGM_DRA), Some("false"));
    // Paused, it stays paused, and the node is no longer ready on its plane.
    let again = plan_node(&after, &BTreeMap::new(), &c, facts(pause));
    assert!(
        again
            .labels
            .keys()
            .all(|k| k == l::GPU_STACK || k == l::GPU_SETUP_COMPLETE),
        "{:?}",
        again.labels
    );
    // Left alone (a driver manager's pause), nothing moves.
    let left = plan_node(&after, &BTreeMap::new(), &c, facts(Operands::Leave));
    assert!(!left.labels.contains_key(DRA), "{:?}", left.labels);
    // Resumed, every value is what it was.
    let resumed = plan_node(&after, &BTreeMap::new(), &c, facts(Operands::Resume));
    let back = resumed.labels_after(&after);
    for key in l::DRIVER_CLIENT_KEYS {
        assert_eq!(back.get(key), node.get(key), "{key}");
    }
}
