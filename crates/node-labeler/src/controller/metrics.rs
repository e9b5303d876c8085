//! The labeler's metrics, under `node_labeler_`; each labelled family has its own typed label set.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Labels of the error counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    /// The cause (`patch`, `conflict`, `cordon`, `drain`, `offers`).
    error: &'static str,
}

/// Labels of the hand-over step counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StepLabels {
    /// The step (`started`, `switched`, `completed`, ...).
    step: &'static str,
}

/// Labels of the eviction counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EvictionLabels {
    /// `evicted` or `blocked`.
    result: &'static str,
}

/// Labels of the per-node gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeLabels {
    /// The node.
    node: String,
}

/// Labels of the per-node driver upgrade gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UpgradeStateLabels {
    /// The node.
    node: String,
    /// Its `nvidia.com/gpu-driver-upgrade-state`.
    state: &'static str,
}

/// Counters of the labeler's work.
#[derive(Clone, Debug, Default)]
pub struct Metrics {
    reconciles: Counter,
    writes: Counter,
    deferred: Counter,
    errors: Family<ErrorLabels, Counter>,
    cluster_policy: Gauge,
    handovers_in_progress: Gauge,
    handover_steps: Family<StepLabels, Counter>,
    evictions: Family<EvictionLabels, Counter>,
    held_on_dra: Family<NodeLabels, Gauge>,
    driver_upgrade_steps: Family<StepLabels, Counter>,
    driver_upgrade_state: Family<UpgradeStateLabels, Gauge>,
    /// The state each node's gauge shows, so a change removes the old series.
    upgrade_states: Arc<Mutex<BTreeMap<String, &'static str>>>,
}

impl Metrics {
    /// Registers the counters under `node_labeler_`.
    pub fn register(&self, registry: &mut Registry) {
        let sub = registry.sub_registry_with_prefix("node_labeler");
        sub.register("reconciles", "Node reconciles run", self.reconciles.clone());
        sub.register(
            "node_writes",
            "Node label/annotation patches sent",
            self.writes.clone(),
        );
        sub.register(
            "dra_driver_removals_deferred",
            "Times a dra-driver label removal waited for GPU claims",
            self.deferred.clone(),
        );
        sub.register(
            "errors",
            "Failed node reconciles by cause",
            self.errors.clone(),
        );
        sub.register(
            "cluster_policy_present",
            "1 while a ClusterPolicy serves the device-plugin plane",
            self.cluster_policy.clone(),
        );
        sub.register(
            "handovers_in_progress",
            "GPU nodes between planes (cordoned, draining or waiting for the new plane)",
            self.handovers_in_progress.clone(),
        );
        sub.register(
            "handover_steps",
            "Hand-over steps taken, by step (started, switched, completed, rolled_back, ...)",
            self.handover_steps.clone(),
        );
        sub.register(
            "node_held_on_dra",
            "1 for each node whose plane policy moved it off DRA while pods there still hold \
             gpu.nvidia.com claims (it stays on DRA until they leave)",
            self.held_on_dra.clone(),
        );
        sub.register(
            "evictions",
            "Evictions of pods holding the GPUs of a node a hand-over or driver upgrade drains, \
             by result",
            self.evictions.clone(),
        );
        sub.register(
            "driver_upgrade_steps",
            "Driver upgrade steps taken, by step (started, paused, unblocked, resumed, completed, \
             failed, ...)",
            self.driver_upgrade_steps.clone(),
        );
        sub.register(
            "driver_upgrade_state",
            "1 for each node in a driver upgrade the labeler runs, labelled with its state \
             (upgrade-required, drain-required, pod-restart-required, validation-required, \
             upgrade-failed); the rollout is stopped while a node is upgrade-failed",
            self.driver_upgrade_state.clone(),
        );
    }

    /// Counts a reconcile.
    pub(super) fn count_reconcile(&self) {
        self.reconciles.inc();
    }

    /// Counts a node patch sent.
    pub(super) fn count_write(&self) {
        self.writes.inc();
    }

    /// Counts a dra-driver label removal that waits for GPU claims.
    pub(super) fn count_deferred(&self) {
        self.deferred.inc();
    }

    /// Counts a failed reconcile (or a conflict retried) by cause.
    pub(super) fn count_error(&self, error: &'static str) {
        self.errors.get_or_create(&ErrorLabels { error }).inc();
    }

    /// Counts a hand-over step taken.
    pub(super) fn count_step(&self, step: &'static str) {
        self.handover_steps
            .get_or_create(&StepLabels { step })
            .inc();
    }

    /// Counts a driver upgrade step taken.
    pub(super) fn count_upgrade_step(&self, step: &'static str) {
        self.driver_upgrade_steps
            .get_or_create(&StepLabels { step })
            .inc();
    }

    /// The state of `node`'s driver upgrade (`None`: it is in none).
    pub(super) fn set_upgrade_state(&self, node: &str, state: Option<&'static str>) {
        let mut states = self
            .upgrade_states
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let before = states.get(node).copied();
        if before == state {
            return;
        }
        let key = |state| UpgradeStateLabels {
            node: node.to_owned(),
            state,
        };
        if let Some(old) = before {
            self.driver_upgrade_state.remove(&key(old));
        }
        match state {
            Some(new) => {
                self.driver_upgrade_state.get_or_create(&key(new)).set(1);
                states.insert(node.to_owned(), new);
            }
            None => {
                states.remove(node);
            }
        }
    }

    /// Counts an eviction by result.
    pub(super) fn count_eviction(&self, result: &'static str) {
        self.evictions
            .get_or_create(&EvictionLabels { result })
            .inc();
    }

    /// Whether a ClusterPolicy exists now.
    pub(super) fn set_cluster_policy(&self, present: bool) {
        self.cluster_policy.set(i64::from(present));
    }

    /// How many nodes are between planes.
    pub(super) fn set_handovers_in_progress(&self, nodes: usize) {
        self.handovers_in_progress
            .set(i64::try_from(nodes).unwrap_or(i64::MAX));
    }

    /// Whether `node` is held on DRA by claims while its policy moved it off.
    pub(super) fn set_held_on_dra(&self, node: &str, held: bool) {
        let key = NodeLabels {
            node: node.to_owned(),
        };
        if held {
            self.held_on_dra.get_or_create(&key).set(1);
        } else {
            self.held_on_dra.remove(&key);
        }
    }
}
