//! Readiness of operands and the `GPUCluster` status built from it. Pure.

use api::AllocationMode;
use api::gpucluster::{GPUClusterStatus, MigrationStatus, NodeCounts, OperandStatus, State};
use jiff::Timestamp;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::ResourceExt;

/// Readiness of a DaemonSet: the controller saw the latest spec and either no node is selected
/// (a DaemonSet with nothing to run is ready) or every desired pod is updated and available.
/// `labelled_nodes` is how many GPU nodes carry the DaemonSet's node selector: while the DaemonSet
/// controller wants no pod although such nodes exist (it lags behind the labeller right after an
/// install), the DaemonSet is not ready, so a cluster is never reported ready with no GPU served.
/// Once it wants pods, its own counts decide (a node it cannot run on, e.g. tainted, does not block).
pub fn daemonset(ds: &DaemonSet, labelled_nodes: i32) -> OperandStatus {
    let status = ds.status.clone().unwrap_or_default();
    let lagging = status.desired_number_scheduled == 0 && labelled_nodes > 0;
    let observed =
        status.observed_generation.unwrap_or(0) >= ds.metadata.generation.unwrap_or(0) && !lagging;
    let desired = if lagging {
        labelled_nodes
    } else {
        status.desired_number_scheduled
    };
    let available = status.number_available.unwrap_or(0);
    let updated = status.updated_number_scheduled.unwrap_or(0);
    let empty =
        desired == 0 && status.number_misscheduled == 0 && status.current_number_scheduled == 0;
    OperandStatus {
        name: ds.name_any(),
        kind: "DaemonSet".into(),
        ready: observed && (empty || (desired == available && desired == updated)),
        desired,
        available,
        plane: Some(plane_of(&ds.name_any()).to_string()),
    }
}

/// The plane an operand serves: the device plugin and its validator serve `device-plugin` nodes,
/// every other operand the `dra` ones.
pub fn plane_of(name: &str) -> AllocationMode {
    use api::contract::objects as o;
    if [o::DEVICE_PLUGIN_DAEMONSET, o::OPERATOR_VALIDATOR_DAEMONSET].contains(&name) {
        AllocationMode::DevicePlugin
    } else {
        AllocationMode::Dra
    }
}

/// Whether a node with `labels` matches a DaemonSet's `nodeSelector` (every entry equal).
pub fn selects(
    selector: &std::collections::BTreeMap<String, String>,
    labels: &std::collections::BTreeMap<String, String>,
) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// Readiness of a Deployment: latest spec observed, every replica updated and available.
pub fn deployment(d: &Deployment) -> OperandStatus {
    let status = d.status.clone().unwrap_or_default();
    let observed = status.observed_generation.unwrap_or(0) >= d.metadata.generation.unwrap_or(0);
    let replicas = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let available = status.available_replicas.unwrap_or(0);
    OperandStatus {
        name: d.name_any(),
        kind: "Deployment".into(),
        ready: observed
            && status.updated_replicas.unwrap_or(0) == replicas
            && available == replicas,
        desired: replicas,
        available,
        plane: Some(plane_of(&d.name_any()).to_string()),
    }
}

/// Something that keeps the GPUCluster from being ready besides operands still starting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Problem {
    /// `resource.k8s.io/v1` DeviceClasses are not served.
    DraApiNotServed,
    /// Rendering or applying failed, with a message naming the object or field.
    Reconcile(String),
    /// An operand's pods cannot be created, with the DaemonSet controller's reason.
    PodsNotCreated(String),
    /// Operand pods are stuck (image pull, crash loop, failing init container), naming the first
    /// few by node, pod, container and reason.
    PodsFailing(String),
}

/// What one reconcile observed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Observed {
    /// Operator namespace.
    pub namespace: String,
    /// Workload operands (DaemonSets and the Deployment).
    pub operands: Vec<OperandStatus>,
    /// Problems found.
    pub problems: Vec<Problem>,
    /// Node counts.
    pub nodes: NodeCounts,
    /// GPU nodes the node labeler has not given an allocation mode yet (it has not seen them, or
    /// it does not run): nothing can say yet which of their operands should run.
    pub unlabelled_gpu_nodes: i32,
    /// Hand-overs between planes.
    pub migration: MigrationStatus,
    /// What the apiserver serves of each DRA feature.
    pub features: crate::features::Support,
    /// GPU nodes no plane serves, and why.
    pub unserved: crate::coverage::Unserved,
    /// Nodes held on DRA by their claims, with when the hold began (Unix seconds).
    pub held_on_dra: Vec<(String, i64)>,
}

/// Reason of a Ready condition that waits for operands to start.
const OPERAND_NOT_READY: &str = "OperandNotReady";
/// Reason of a Ready condition that waits for the node labeler.
const NODES_NOT_LABELLED: &str = "NodesNotLabelled";

/// The reason and message of the Ready/Error pair for an observation.
fn verdict(observed: &Observed) -> (bool, &'static str, String) {
    if observed.problems.contains(&Problem::DraApiNotServed) {
        return (
            false,
            "DRAAPINotServed",
            "the resource.k8s.io/v1 DeviceClass API is not served by this cluster: \
             Kubernetes 1.34 or later with resource.k8s.io/v1 enabled is required"
                .into(),
        );
    }
    let failures: Vec<&str> = observed
        .problems
        .iter()
        .filter_map(|p| match p {
            Problem::Reconcile(m) => Some(m.as_str()),
            Problem::DraApiNotServed | Problem::PodsNotCreated(_) | Problem::PodsFailing(_) => None,
        })
        .collect();
    if !failures.is_empty() {
        return (false, "ReconcileFailed", failures.join("; "));
    }
    let not_created: Vec<&str> = observed
        .problems
        .iter()
        .filter_map(|p| match p {
            Problem::PodsNotCreated(m) => Some(m.as_str()),
            _ => None,
        })
        .collect();
    if !not_created.is_empty() {
        return (false, "PodCreationFailed", not_created.join("; "));
    }
    if let Some(failing) = observed.problems.iter().find_map(|p| match p {
        Problem::PodsFailing(m) => Some(m.clone()),
        _ => None,
    }) {
        return (false, "OperandPodsFailing", failing);
    }
    if observed.unlabelled_gpu_nodes > 0 {
        return (
            false,
            NODES_NOT_LABELLED,
            format!(
                "waiting for the node labeler: {} of {} GPU nodes have no {} label yet",
                observed.unlabelled_gpu_nodes,
                observed.nodes.gpu,
                api::contract::labels::ALLOCATION_MODE
            ),
        );
    }
    let waiting: Vec<String> = observed
        .operands
        .iter()
        .filter(|o| !o.ready)
        .map(|o| {
            format!(
                "{}/{}: {} of {} pods available",
                o.kind, o.name, o.available, o.desired
            )
        })
        .collect();
    if !waiting.is_empty() {
        return (
            false,
            OPERAND_NOT_READY,
            format!("waiting for {}", waiting.join(", ")),
        );
    }
    (true, "Reconciled", "all operands are ready".into())
}

/// A condition, keeping the previous transition time when its status did not change.
fn condition(
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    previous: &[Condition],
    now: Timestamp,
) -> Condition {
    let status = if status { "True" } else { "False" }.to_owned();
    let since = previous
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or(Time(now));
    Condition {
        type_: type_.into(),
        status,
        reason: reason.into(),
        message: message.into(),
        observed_generation: generation,
        last_transition_time: since,
    }
}

/// The status for an observation; equal to `previous` when nothing changed, so no write is needed.
pub fn status(
    observed: &Observed,
    generation: Option<i64>,
    previous: Option<&GPUClusterStatus>,
    now: Timestamp,
) -> GPUClusterStatus {
    let (ready, reason, message) = verdict(observed);
    let old = previous
        .map(|p| p.conditions.as_slice())
        .unwrap_or_default();
    let error_reason = if ready { "Ready" } else { reason };
    // Waiting is not an error; a problem is.
    let error_status = !ready && reason != OPERAND_NOT_READY && reason != NODES_NOT_LABELLED;
    let reports = [
        ("DRAFeaturesServed", observed.features.condition()),
        ("GPUNodesUnserved", observed.unserved.condition()),
        (
            "NodesHeldOnDRA",
            crate::coverage::held_condition(&observed.held_on_dra),
        ),
    ];
    let mut conditions = vec![
        condition("Ready", ready, reason, &message, generation, old, now),
        condition(
            "Error",
            error_status,
            error_reason,
            if error_status { &message } else { "" },
            generation,
            old,
            now,
        ),
        migration_paused(&observed.migration, generation, old, now),
    ];
    conditions.extend(reports.iter().map(|(type_, (status, reason, message))| {
        condition(type_, *status, reason, message, generation, old, now)
    }));
    GPUClusterStatus {
        state: Some(if ready { State::Ready } else { State::NotReady }),
        namespace: Some(observed.namespace.clone()),
        conditions,
        operands: observed.operands.clone(),
        nodes: Some(observed.nodes.clone()),
        migration: (observed.migration != MigrationStatus::default())
            .then(|| observed.migration.clone()),
    }
}

/// `MigrationPaused`: true while a node rolled back under this generation holds the rollout,
/// naming the nodes and why.
fn migration_paused(
    migration: &MigrationStatus,
    generation: Option<i64>,
    previous: &[Condition],
    now: Timestamp,
) -> Condition {
    match migration.rolled_back.as_slice() {
        [] => condition(
            "MigrationPaused",
            false,
            "NoRollback",
            "",
            generation,
            previous,
            now,
        ),
        nodes => {
            let each: Vec<String> = nodes
                .iter()
                .map(|n| {
                    format!(
                        "node {}: {}; it is on the {} plane",
                        n.node,
                        n.reason.as_deref().unwrap_or("rolled back"),
                        n.to
                    )
                })
                .collect();
            let message = format!(
                "{}. No other node changes plane until the GPUCluster is edited (or the \
                 {} annotation is removed from the node)",
                each.join("; "),
                api::contract::labels::HANDOVER
            );
            condition(
                "MigrationPaused",
                true,
                "ProgressDeadlineExceeded",
                &message,
                generation,
                previous,
                now,
            )
        }
    }
}

/// The status of a GPUCluster that is not the singleton.
pub fn ignored(previous: Option<&GPUClusterStatus>, now: Timestamp) -> GPUClusterStatus {
    let old = previous
        .map(|p| p.conditions.as_slice())
        .unwrap_or_default();
    let message = "only the GPUCluster named gpu-cluster is reconciled; delete this one";
    GPUClusterStatus {
        state: Some(State::Ignored),
        conditions: vec![
            condition("Ready", false, "Ignored", message, None, old, now),
            condition("Error", true, "Ignored", message, None, old, now),
        ],
        ..GPUClusterStatus::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ds(generation: i64, status: serde_json::Value) -> DaemonSet {
        serde_json::from_value(
            json!({"metadata": {"name": "d", "generation": generation}, "status": status}),
        )
        .unwrap()
    }

    #[test]
    fn daemonset_readiness_rules() {
        let zero = json!({"observedGeneration": 1, "desiredNumberScheduled": 0, "currentNumberScheduled": 0, "numberMisscheduled": 0, "numberReady": 0});
        assert!(
            daemonset(&ds(1, zero.clone()), 0).ready,
            "nothing to run is ready"
        );
        assert!(
            !daemonset(&ds(2, zero.clone()), 0).ready,
            "a new generation not yet observed"
        );
        let full = json!({"observedGeneration": 2, "desiredNumberScheduled": 3, "currentNumberScheduled": 3, "numberMisscheduled": 0,
                          "numberReady": 3, "numberAvailable": 3, "updatedNumberScheduled": 3});
        assert!(daemonset(&ds(2, full.clone()), 3).ready);
        let mut pending = full.clone();
        pending["numberAvailable"] = json!(2);
        let s = daemonset(&ds(2, pending), 3);
        assert!(!s.ready);
        assert_eq!((s.desired, s.available), (3, 2));
        let mut rolling = full.clone();
        rolling["updatedNumberScheduled"] = json!(1);
        assert!(!daemonset(&ds(2, rolling), 3).ready);
        // Nodes were labelled but the DaemonSet controller has not caught up yet: not ready.
        let lagging = daemonset(&ds(1, zero), 2);
        assert!(!lagging.ready, "two labelled nodes and no pod wanted yet");
        assert_eq!((lagging.desired, lagging.available), (2, 0));
        // A labelled node the DaemonSet cannot run on (tainted) does not block the others.
        assert!(daemonset(&ds(2, full.clone()), 4).ready);
    }

    #[test]
    fn node_selectors_match_every_entry() {
        let map =
            |kv: &[(&str, &str)]| kv.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect();
        let sel = map(&[("nvidia.com/gpu.deploy.dra-driver", "true")]);
        assert!(selects(
            &sel,
            &map(&[("nvidia.com/gpu.deploy.dra-driver", "true"), ("x", "y")])
        ));
        assert!(!selects(
            &sel,
            &map(&[("nvidia.com/gpu.deploy.dra-driver", "false")])
        ));
        assert!(!selects(&sel, &map(&[])));
        assert!(selects(&map(&[]), &map(&[])));
    }

    #[test]
    fn deployment_readiness_rules() {
        let d = |status: serde_json::Value| -> Deployment {
            serde_json::from_value(json!({"metadata": {"name": "c", "generation": 1}, "spec": {"selector": {}, "template": {}}, "status": status})).unwrap()
        };
        assert!(
            deployment(&d(
                json!({"observedGeneration": 1, "updatedReplicas": 1, "availableReplicas": 1})
            ))
            .ready
        );
        assert!(
            !deployment(&d(
                json!({"observedGeneration": 1, "updatedReplicas": 1, "availableReplicas": 0})
            ))
            .ready
        );
        assert!(!deployment(&d(json!({}))).ready);
    }

    fn operand(name: &str, ready: bool) -> OperandStatus {
        OperandStatus {
            name: name.into(),
            kind: "DaemonSet".into(),
            ready,
            desired: 3,
            available: if ready { 3 } else { 1 },
            plane: Some("dra".into()),
        }
    }

    #[test]
    fn operands_say_which_plane_they_serve() {
        assert_eq!(
            plane_of("nvidia-device-plugin-daemonset"),
            AllocationMode::DevicePlugin
        );
        assert_eq!(plane_of("nvidia-dra-validator"), AllocationMode::Dra);
        assert_eq!(
            plane_of("nvidia-operator-validator"),
            AllocationMode::DevicePlugin
        );
        let ds: DaemonSet = serde_json::from_value(
            json!({"metadata": {"name": "nvidia-device-plugin-daemonset", "generation": 1},
                   "status": {"observedGeneration": 1, "desiredNumberScheduled": 0,
                              "currentNumberScheduled": 0, "numberMisscheduled": 0, "numberReady": 0}}),
        )
        .unwrap();
        let op = daemonset(&ds, 0);
        assert_eq!(op.plane.as_deref(), Some("device-plugin"));
        assert!(op.ready, "a plane with no node is ready");
    }

    #[test]
    fn state_and_conditions_say_what_waits_for_what() {
        let now = Timestamp::from_second(1_000).unwrap();
        let obs = Observed {
            namespace: "gpu-operator".into(),
            operands: vec![
                operand("nvidia-dra-driver-kubelet-plugin", true),
                operand("nvidia-dra-validator", false),
            ],
            ..Observed::default()
        };
        let s = status(&obs, Some(1), None, now);
        assert_eq!(s.state, Some(State::NotReady));
        let ready = &s.conditions[0];
        assert_eq!(
            (
                ready.type_.as_str(),
                ready.status.as_str(),
                ready.reason.as_str()
            ),
            ("Ready", "False", "OperandNotReady")
        );
        assert_eq!(
            ready.message,
            "waiting for DaemonSet/nvidia-dra-validator: 1 of 3 pods available"
        );
        assert_eq!(s.conditions[1].status, "False", "waiting is not an error");

        // Every operand ready but a GPU node not yet labelled: nothing says its operands run.
        let unlabelled = Observed {
            operands: vec![operand("a", true)],
            nodes: NodeCounts {
                gpu: 3,
                ..NodeCounts::default()
            },
            unlabelled_gpu_nodes: 1,
            ..obs.clone()
        };
        let u = status(&unlabelled, Some(1), None, now);
        assert_eq!(u.state, Some(State::NotReady));
        assert_eq!(u.conditions[0].reason, "NodesNotLabelled");
        assert_eq!(
            u.conditions[0].message,
            "waiting for the node labeler: 1 of 3 GPU nodes have no \
             nvidia.com/gpu-operator.resource-allocation.mode label yet"
        );
        assert_eq!(u.conditions[1].status, "False", "waiting is not an error");

        let all_ready = Observed {
            operands: vec![operand("a", true)],
            ..obs.clone()
        };
        let later = Timestamp::from_second(2_000).unwrap();
        let r = status(&all_ready, Some(1), Some(&s), later);
        assert_eq!(r.state, Some(State::Ready));
        assert_eq!(r.conditions[0].reason, "Reconciled");
        assert_eq!(r.conditions[0].last_transition_time, Time(later));
        assert_eq!(
            r.conditions[1].last_transition_time,
            Time(now),
            "Error stayed False"
        );
        assert_eq!(
            status(
                &all_ready,
                Some(1),
                Some(&r),
                Timestamp::from_second(3_000).unwrap()
            ),
            r,
            "unchanged means equal"
        );
    }

    #[test]
    fn a_rollback_pauses_the_migration_and_names_the_node() {
        use api::gpucluster::NodeHandover;
        let now = Timestamp::from_second(1_000).unwrap();
        let calm = status(&Observed::default(), Some(4), None, now);
        let paused = |s: &GPUClusterStatus| {
            s.conditions
                .iter()
                .find(|c| c.type_ == "MigrationPaused")
                .cloned()
                .expect("a MigrationPaused condition")
        };
        assert_eq!(paused(&calm).status, "False");
        assert_eq!(calm.migration, None);
        let moving = NodeHandover {
            node: "gpu-b".into(),
            from: "device-plugin".into(),
            to: "dra".into(),
            phase: "WaitingForPlane".into(),
            reason: None,
        };
        let back = NodeHandover {
            node: "gpu-a".into(),
            from: "device-plugin".into(),
            to: "dra".into(),
            phase: "RolledBack".into(),
            reason: Some("the device-plugin plane was not ready within 600s".into()),
        };
        let obs = Observed {
            migration: MigrationStatus {
                in_progress: vec![moving],
                rolled_back: vec![back],
                ..MigrationStatus::default()
            },
            ..Observed::default()
        };
        let s = status(&obs, Some(4), Some(&calm), now);
        let c = paused(&s);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("True", "ProgressDeadlineExceeded")
        );
        assert!(
            c.message.starts_with(
                "node gpu-a: the device-plugin plane was not ready within 600s; it is on the \
                 dra plane. No other node changes plane"
            ),
            "{}",
            c.message
        );
        assert_eq!(s.migration.as_ref(), Some(&obs.migration));
    }

    #[test]
    fn problems_win_over_readiness() {
        let now = Timestamp::from_second(1_000).unwrap();
        let obs = Observed {
            problems: vec![Problem::DraApiNotServed],
            ..Observed::default()
        };
        let s = status(&obs, None, None, now);
        assert_eq!(s.state, Some(State::NotReady));
        assert_eq!(s.conditions[1].status, "True");
        assert!(
            s.conditions[1].message.contains("resource.k8s.io/v1")
                && s.conditions[1].message.contains("1.34")
        );

        let bad = Observed {
            problems: vec![Problem::Reconcile(
                "spec.validator: incomplete image reference".into(),
            )],
            ..Observed::default()
        };
        let s = status(&bad, None, None, now);
        assert_eq!(s.conditions[1].reason, "ReconcileFailed");
        assert!(s.conditions[1].message.starts_with("spec.validator"));

        // Pods that cannot be created are an error, not a wait, and the reason is named.
        let blocked = Observed {
            operands: vec![operand("nvidia-dra-driver-kubelet-plugin", false)],
            problems: vec![Problem::PodsNotCreated(
                "DaemonSet/nvidia-dra-driver-kubelet-plugin cannot create pods: \
                 no PriorityClass with name gpu-high was found"
                    .into(),
            )],
            ..Observed::default()
        };
        let s = status(&blocked, None, None, now);
        assert_eq!(s.state, Some(State::NotReady));
        for c in &s.conditions[..2] {
            assert_eq!(c.reason, "PodCreationFailed", "{c:?}");
            assert!(
                c.message.contains("no PriorityClass with name gpu-high"),
                "{c:?}"
            );
        }
        assert_eq!(s.conditions[1].status, "True");

        // Pods that run but are stuck are an error too, naming node, container and reason.
        let stuck = Observed {
            operands: vec![operand("nvidia-dra-driver-kubelet-plugin", false)],
            problems: vec![Problem::PodsFailing(
                "operand pods failing: node real-gpu-1: pod plugin-x container gpus: ImagePullBackOff"
                    .into(),
            )],
            ..Observed::default()
        };
        let s = status(&stuck, None, None, now);
        for c in &s.conditions[..2] {
            assert_eq!(c.reason, "OperandPodsFailing", "{c:?}");
            assert!(c.message.contains("real-gpu-1") && c.message.contains("ImagePullBackOff"));
        }
        assert_eq!(s.conditions[1].status, "True");
    }
}
