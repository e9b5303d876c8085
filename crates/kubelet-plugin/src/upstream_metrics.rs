//! The upstream DRA driver's metrics, under its names and labels, so dashboards and alerts written
//! for it read this plugin too (`docs/upstream-claims.md`).
//!
//! Their meaning follows upstream's: `nvidia_dra_requests_total` and
//! `nvidia_dra_request_duration_seconds` count and time the claims that succeeded, one per claim;
//! a failed claim counts in `nvidia_dra_node_{prepare,unprepare}_errors_total` instead;
//! `nvidia_dra_prepared_devices` counts the devices of completely prepared claims by type.

use crate::types::Operation;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::time::Duration;

/// The device types upstream counts, each always exported.
pub const DEVICE_TYPES: [&str; 4] = ["gpu", "mig", "vfio", "unknown"];

/// `driver` and `operation` (`prepare`, `unprepare`).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    driver: String,
    operation: String,
}

/// `node`, `driver` and `device_type`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DeviceLabels {
    node: String,
    driver: String,
    device_type: String,
}

/// `driver` and `error_type`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    driver: String,
    error_type: String,
}

fn request_histogram() -> Histogram {
    // Upstream's buckets: 0.05 s doubling to 12.8 s.
    Histogram::new(exponential_buckets(0.05, 2.0, 9))
}

/// The type upstream gives a prepared device, from its name: `gpu-<minor>` and shares of it are
/// `gpu`, `gpu-<minor>-mig-…` is `mig`.
pub fn device_type(device: &str) -> &'static str {
    if device.contains("-mig-") {
        "mig"
    } else if device.starts_with("gpu-") {
        "gpu"
    } else {
        "unknown"
    }
}

fn operation_name(operation: Operation) -> &'static str {
    match operation {
        Operation::Prepare => "prepare",
        Operation::Unprepare => "unprepare",
    }
}

/// The upstream-named metrics of one plugin; cheap to clone.
#[derive(Debug, Clone)]
pub struct UpstreamMetrics {
    driver: String,
    node: String,
    requests: Family<RequestLabels, Counter>,
    duration: Family<RequestLabels, Histogram, fn() -> Histogram>,
    inflight: Family<RequestLabels, Gauge>,
    prepared: Family<DeviceLabels, Gauge>,
    prepare_errors: Family<ErrorLabels, Counter>,
    unprepare_errors: Family<ErrorLabels, Counter>,
}

impl UpstreamMetrics {
    /// Registers them at the root of `registry` (no prefix: the names are upstream's), with the
    /// series of both operations and every device type present at zero, as upstream starts.
    pub fn register(registry: &mut Registry, driver: &str, node: &str) -> Self {
        let metrics = Self {
            driver: driver.to_owned(),
            node: node.to_owned(),
            requests: Family::default(),
            duration: Family::new_with_constructor(request_histogram as fn() -> Histogram),
            inflight: Family::default(),
            prepared: Family::default(),
            prepare_errors: Family::default(),
            unprepare_errors: Family::default(),
        };
        registry.register(
            "nvidia_dra_requests",
            "Total number of DRA prepare and unprepare requests that succeeded, one per claim",
            metrics.requests.clone(),
        );
        registry.register(
            "nvidia_dra_request_duration_seconds",
            "Duration of DRA prepare and unprepare requests that succeeded, per claim",
            metrics.duration.clone(),
        );
        registry.register(
            "nvidia_dra_requests_inflight",
            "Number of DRA prepare and unprepare requests (claims) in flight",
            metrics.inflight.clone(),
        );
        registry.register(
            "nvidia_dra_prepared_devices",
            "Devices of completely prepared claims, per device type",
            metrics.prepared.clone(),
        );
        registry.register(
            "nvidia_dra_node_prepare_errors",
            "Claims whose prepare failed, per error type",
            metrics.prepare_errors.clone(),
        );
        registry.register(
            "nvidia_dra_node_unprepare_errors",
            "Claims whose unprepare failed, per error type",
            metrics.unprepare_errors.clone(),
        );
        for operation in [Operation::Prepare, Operation::Unprepare] {
            let labels = metrics.request(operation);
            // Creating a series is what exports it; the guards are dropped at once.
            drop(metrics.requests.get_or_create(&labels));
            drop(metrics.duration.get_or_create(&labels));
            drop(metrics.inflight.get_or_create(&labels));
        }
        metrics.set_prepared([]);
        metrics
    }

    fn request(&self, operation: Operation) -> RequestLabels {
        RequestLabels {
            driver: self.driver.clone(),
            operation: operation_name(operation).to_owned(),
        }
    }

    /// Counts `claims` claims of `operation` in flight until the guard is dropped.
    pub fn in_flight(&self, operation: Operation, claims: usize) -> InFlight {
        let gauge = self
            .inflight
            .get_or_create(&self.request(operation))
            .clone();
        let claims = i64::try_from(claims).unwrap_or(i64::MAX);
        gauge.inc_by(claims);
        InFlight { gauge, claims }
    }

    /// Records one claim: on success its time, on failure an error. Upstream's error types for
    /// what failed in preparing or unpreparing the devices are `prepare_devices` and
    /// `unprepare_devices`; every failure of ours is one of those (our own metric keeps the
    /// finer reason).
    pub fn observe(&self, operation: Operation, failed: bool, took: Duration) {
        if failed {
            let (family, error_type) = match operation {
                Operation::Prepare => (&self.prepare_errors, "prepare_devices"),
                Operation::Unprepare => (&self.unprepare_errors, "unprepare_devices"),
            };
            family
                .get_or_create(&ErrorLabels {
                    driver: self.driver.clone(),
                    error_type: error_type.to_owned(),
                })
                .inc();
            return;
        }
        let labels = self.request(operation);
        self.requests.get_or_create(&labels).inc();
        self.duration
            .get_or_create(&labels)
            .observe(took.as_secs_f64());
    }

    /// Sets the prepared-device gauges from the names of the devices of completely prepared claims.
    pub fn set_prepared<'a>(&self, devices: impl IntoIterator<Item = &'a str>) {
        let mut counts = [0i64; DEVICE_TYPES.len()];
        for device in devices {
            let kind = device_type(device);
            if let Some(i) = DEVICE_TYPES.iter().position(|t| *t == kind) {
                counts[i] += 1;
            }
        }
        for (kind, count) in DEVICE_TYPES.iter().zip(counts) {
            self.prepared
                .get_or_create(&DeviceLabels {
                    node: self.node.clone(),
                    driver: self.driver.clone(),
                    device_type: (*kind).to_owned(),
                })
                .set(count);
        }
    }
}

/// Claims in flight; dropping it takes them off the gauge.
#[derive(Debug)]
pub struct InFlight {
    gauge: Gauge,
    claims: i64,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.gauge.dec_by(self.claims);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exposition(registry: &Registry) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
        text
    }

    #[test]
    fn devices_are_typed_as_upstream_types_them() {
        assert_eq!(device_type("gpu-3"), "gpu");
        assert_eq!(device_type("gpu-0-shared-h100s"), "gpu");
        assert_eq!(device_type("gpu-1-mig-1g5gb-19-6"), "mig");
        assert_eq!(device_type("nic-0"), "unknown");
    }

    #[test]
    fn a_fresh_plugin_exports_every_series_at_zero() {
        let mut registry = Registry::default();
        UpstreamMetrics::register(&mut registry, "gpu.nvidia.com", "node-a");
        let text = exposition(&registry);
        for line in [
            r#"nvidia_dra_requests_total{driver="gpu.nvidia.com",operation="prepare"} 0"#,
            r#"nvidia_dra_requests_total{driver="gpu.nvidia.com",operation="unprepare"} 0"#,
            r#"nvidia_dra_requests_inflight{driver="gpu.nvidia.com",operation="prepare"} 0"#,
            r#"nvidia_dra_request_duration_seconds_count{driver="gpu.nvidia.com",operation="unprepare"} 0"#,
            r#"nvidia_dra_prepared_devices{node="node-a",driver="gpu.nvidia.com",device_type="vfio"} 0"#,
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
    }

    #[test]
    fn successes_are_timed_failures_counted_and_in_flight_claims_come_and_go() {
        let mut registry = Registry::default();
        let m = UpstreamMetrics::register(&mut registry, "gpu.nvidia.com", "node-a");
        let guard = m.in_flight(Operation::Prepare, 3);
        assert!(exposition(&registry).contains(
            r#"nvidia_dra_requests_inflight{driver="gpu.nvidia.com",operation="prepare"} 3"#
        ));
        m.observe(Operation::Prepare, false, Duration::from_millis(70));
        m.observe(Operation::Prepare, true, Duration::from_millis(1));
        m.observe(Operation::Unprepare, true, Duration::from_millis(1));
        drop(guard);
        m.set_prepared(["gpu-0", "gpu-1-mig-1g5gb-19-6", "gpu-2-shared-a"]);
        let text = exposition(&registry);
        for line in [
            r#"nvidia_dra_requests_inflight{driver="gpu.nvidia.com",operation="prepare"} 0"#,
            r#"nvidia_dra_requests_total{driver="gpu.nvidia.com",operation="prepare"} 1"#,
            r#"nvidia_dra_request_duration_seconds_bucket{le="0.1",driver="gpu.nvidia.com",operation="prepare"} 1"#,
            r#"nvidia_dra_request_duration_seconds_bucket{le="0.05",driver="gpu.nvidia.com",operation="prepare"} 0"#,
            r#"nvidia_dra_node_prepare_errors_total{driver="gpu.nvidia.com",error_type="prepare_devices"} 1"#,
            r#"nvidia_dra_node_unprepare_errors_total{driver="gpu.nvidia.com",error_type="unprepare_devices"} 1"#,
            r#"nvidia_dra_prepared_devices{node="node-a",driver="gpu.nvidia.com",device_type="gpu"} 2"#,
            r#"nvidia_dra_prepared_devices{node="node-a",driver="gpu.nvidia.com",device_type="mig"} 1"#,
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
    }
}
