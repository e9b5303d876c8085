//! Prometheus metrics of the device plugin.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::time::Duration;

/// Labels of the per-resource device gauge.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DeviceLabels {
    /// The extended resource.
    pub resource: String,
    /// `Healthy` or `Unhealthy`.
    pub health: String,
}

/// Labels of the allocation counter.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AllocationLabels {
    /// The extended resource.
    pub resource: String,
    /// `ok`, or the kind of refusal.
    pub outcome: String,
}

fn latency_histogram() -> Histogram {
    // 50 µs to about 0.8 s.
    Histogram::new(exponential_buckets(0.000_05, 2.0, 14))
}

/// The plugin's metrics; cheap to clone.
#[derive(Debug, Clone)]
pub struct Metrics {
    devices: Family<DeviceLabels, Gauge>,
    allocations: Family<AllocationLabels, Counter>,
    allocate_seconds: Family<AllocationLabels, Histogram, fn() -> Histogram>,
}

impl Metrics {
    /// Creates the metrics and registers them under `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self {
            devices: Family::default(),
            allocations: Family::default(),
            allocate_seconds: Family::new_with_constructor(latency_histogram as fn() -> Histogram),
        };
        registry.register(
            "gpu_device_plugin_devices",
            "Devices listed to the kubelet, by resource and health",
            m.devices.clone(),
        );
        registry.register(
            "gpu_device_plugin_allocations",
            "Allocate calls per container, by resource and outcome",
            m.allocations.clone(),
        );
        registry.register(
            "gpu_device_plugin_allocate_seconds",
            "Time to answer one container of an Allocate call",
            m.allocate_seconds.clone(),
        );
        m
    }

    /// Sets the number of `resource` devices in `health`.
    pub fn set_devices(&self, resource: &str, health: &str, count: usize) {
        self.devices
            .get_or_create(&DeviceLabels {
                resource: resource.to_owned(),
                health: health.to_owned(),
            })
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    /// Counts one container's allocation.
    pub fn allocated(&self, resource: &str, outcome: &str, took: Duration) {
        let labels = AllocationLabels {
            resource: resource.to_owned(),
            outcome: outcome.to_owned(),
        };
        self.allocations.get_or_create(&labels).inc();
        self.allocate_seconds
            .get_or_create(&labels)
            .observe(took.as_secs_f64());
    }
}
