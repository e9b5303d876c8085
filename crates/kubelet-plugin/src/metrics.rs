//! Prometheus metrics of the prepare and unprepare paths: ours (`gpu_kubelet_plugin_*`) and,
//! beside them, the upstream DRA driver's names ([`crate::upstream_metrics`]).

use crate::types::Operation;
use crate::upstream_metrics::{InFlight, UpstreamMetrics};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::time::Duration;

/// Labels of the per-operation metrics.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationLabels {
    /// The call.
    pub operation: Operation,
}

/// Labels of the failure counter: the call and the kind of failure
/// (`kubelet_plugin::driver::ClaimFailure::reason`).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FailureLabels {
    /// The call.
    pub operation: Operation,
    /// The kind of failure.
    pub reason: String,
}

/// Labels of the unhealthy-GPU gauge.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SeverityLabels {
    /// `degraded` (tainted `NoSchedule`) or `lost` (tainted `NoExecute`).
    pub severity: String,
}

fn latency_histogram() -> Histogram {
    // 0.5 ms to about 4 s.
    Histogram::new(exponential_buckets(0.0005, 2.0, 14))
}

/// The plugin's metrics; cheap to clone (shared counters).
#[derive(Debug, Clone)]
pub struct Metrics {
    requests: Family<OperationLabels, Counter>,
    errors: Family<FailureLabels, Counter>,
    duration: Family<OperationLabels, Histogram, fn() -> Histogram>,
    claim_reads: Histogram,
    checkpoint_writes: Counter,
    prepared_devices: Gauge,
    unreadable_gpus: Gauge,
    unhealthy_gpus: Family<SeverityLabels, Gauge>,
    health_unknown: Gauge,
    upstream: UpstreamMetrics,
}

impl Metrics {
    /// Creates the metrics of the plugin of `driver` on `node` and registers them under `registry`.
    pub fn register(registry: &mut Registry, driver: &str, node: &str) -> Self {
        let metrics = Self {
            requests: Family::default(),
            errors: Family::default(),
            duration: Family::new_with_constructor(latency_histogram as fn() -> Histogram),
            claim_reads: latency_histogram(),
            checkpoint_writes: Counter::default(),
            prepared_devices: Gauge::default(),
            unreadable_gpus: Gauge::default(),
            unhealthy_gpus: Family::default(),
            health_unknown: Gauge::default(),
            upstream: UpstreamMetrics::register(registry, driver, node),
        };
        let sub = registry.sub_registry_with_prefix("gpu_kubelet_plugin");
        sub.register(
            "claim_requests",
            "Claims handled, per operation",
            metrics.requests.clone(),
        );
        sub.register(
            "claim_errors",
            "Claims that failed, per operation and reason",
            metrics.errors.clone(),
        );
        sub.register(
            "claim_duration_seconds",
            "Time to prepare or unprepare one claim",
            metrics.duration.clone(),
        );
        sub.register(
            "claim_read_duration_seconds",
            "Time to read one claim from the API server (part of its prepare)",
            metrics.claim_reads.clone(),
        );
        sub.register(
            "checkpoint_writes",
            "Checkpoint writes: at most one per call, shared by concurrent calls",
            metrics.checkpoint_writes.clone(),
        );
        sub.register(
            "prepared_devices",
            "Devices currently prepared",
            metrics.prepared_devices.clone(),
        );
        sub.register(
            "unreadable_gpus",
            "GPUs NVML counts but could not read at start (lost or failing), left unpublished",
            metrics.unreadable_gpus.clone(),
        );
        sub.register(
            "unhealthy_gpus",
            "GPUs whose devices are tainted for an NVML fault, per severity",
            metrics.unhealthy_gpus.clone(),
        );
        sub.register(
            "health_unknown",
            "1 while NVML is not answering, so no GPU's health is known",
            metrics.health_unknown.clone(),
        );
        metrics
    }

    /// Sets the unhealthy-GPU gauges: `degraded` and `lost` counts, and whether NVML answers.
    pub fn set_health(&self, degraded: usize, lost: usize, unknown: bool) {
        for (severity, count) in [("degraded", degraded), ("lost", lost)] {
            self.unhealthy_gpus
                .get_or_create(&SeverityLabels {
                    severity: severity.into(),
                })
                .set(i64::try_from(count).unwrap_or(i64::MAX));
        }
        self.health_unknown.set(i64::from(unknown));
    }

    /// Counts `claims` claims of `operation` in flight until the guard is dropped.
    pub fn in_flight(&self, operation: Operation, claims: usize) -> InFlight {
        self.upstream.in_flight(operation, claims)
    }

    /// Records one claim's time and outcome: `failure` is the reason when it failed.
    pub fn observe(&self, operation: Operation, failure: Option<&str>, took: Duration) {
        self.upstream.observe(operation, failure.is_some(), took);
        let labels = OperationLabels { operation };
        self.requests.get_or_create(&labels).inc();
        if let Some(reason) = failure {
            let failed = FailureLabels {
                operation,
                reason: reason.to_owned(),
            };
            self.errors.get_or_create(&failed).inc();
        }
        self.duration
            .get_or_create(&labels)
            .observe(took.as_secs_f64());
    }

    /// Records one claim read from the API server.
    pub fn observe_claim_read(&self, took: Duration) {
        self.claim_reads.observe(took.as_secs_f64());
    }

    /// Counts one checkpoint write.
    pub fn count_checkpoint_write(&self) {
        self.checkpoint_writes.inc();
    }

    /// Sets the number of GPUs left out because NVML could not read them.
    pub fn set_unreadable_gpus(&self, count: usize) {
        self.unreadable_gpus
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    /// Sets the prepared-device gauges: `count` devices in the checkpoint, of which `completed`
    /// (by name) belong to completely prepared claims.
    pub fn set_prepared_devices<'a>(
        &self,
        count: usize,
        completed: impl IntoIterator<Item = &'a str>,
    ) {
        self.prepared_devices
            .set(i64::try_from(count).unwrap_or(i64::MAX));
        self.upstream.set_prepared(completed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_show_up_in_the_exposition() {
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry, "gpu.nvidia.com", "node-a");
        metrics.observe(Operation::Prepare, None, Duration::from_millis(1));
        metrics.observe(
            Operation::Prepare,
            Some("device_in_use"),
            Duration::from_millis(1),
        );
        metrics.set_prepared_devices(3, ["gpu-0"]);
        metrics.set_unreadable_gpus(1);
        metrics.observe_claim_read(Duration::from_millis(1));
        metrics.count_checkpoint_write();
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains("gpu_kubelet_plugin_claim_requests_total{operation=\"Prepare\"} 2"),
            "{text}"
        );
        assert!(
            text.contains(
                "gpu_kubelet_plugin_claim_errors_total{operation=\"Prepare\",reason=\"device_in_use\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains("gpu_kubelet_plugin_prepared_devices 3"),
            "{text}"
        );
        assert!(
            text.contains("gpu_kubelet_plugin_unreadable_gpus 1"),
            "{text}"
        );
        assert!(
            text.contains("gpu_kubelet_plugin_claim_read_duration_seconds_count 1"),
            "{text}"
        );
        assert!(
            text.contains("gpu_kubelet_plugin_checkpoint_writes_total 1"),
            "{text}"
        );
        assert!(
            text.contains(
                "gpu_kubelet_plugin_claim_duration_seconds_count{operation=\"Prepare\"} 2"
            ),
            "{text}"
        );
    }
}
