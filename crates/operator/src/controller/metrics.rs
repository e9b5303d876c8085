//! The operator's counters and gauges.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Labels of the reconcile error counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ErrorLabels {
    /// The cause ([`super::Error::metric_label`]).
    pub(super) error: &'static str,
}

/// Counters and gauges of the operator's work.
#[derive(Clone, Debug, Default)]
pub struct Metrics {
    pub(super) reconciles: Counter,
    pub(super) applies: Counter,
    pub(super) deletes: Counter,
    pub(super) status_writes: Counter,
    pub(super) ready: Gauge,
    pub(super) errors: Family<ErrorLabels, Counter>,
}

impl Metrics {
    /// Registers the metrics under `gpu_operator_`.
    pub fn register(&self, registry: &mut Registry) {
        let sub = registry.sub_registry_with_prefix("gpu_operator");
        sub.register(
            "reconciles",
            "GPUCluster reconciles run",
            self.reconciles.clone(),
        );
        sub.register(
            "applies",
            "Operand objects created or updated",
            self.applies.clone(),
        );
        sub.register(
            "deletes",
            "Operand objects pruned or drained",
            self.deletes.clone(),
        );
        sub.register(
            "status_writes",
            "GPUCluster status updates",
            self.status_writes.clone(),
        );
        sub.register(
            "ready",
            "1 when the GPUCluster is ready",
            self.ready.clone(),
        );
        sub.register(
            "reconcile_errors",
            "Failed reconciles by cause",
            self.errors.clone(),
        );
    }
}
