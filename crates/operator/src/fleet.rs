//! The fleet as gauges for dashboards: devices of each of our DeviceClasses published and
//! allocated (the counts the pending-pod explainer gives one pod, for the whole cluster), and
//! GPUs per plane and phase (the PhysicalGPUs). The counting is pure; [`run`] reads the cluster
//! once a minute.

use std::collections::BTreeMap;
use std::time::Duration;

use api::pending::{World, selection, supply};
use api::physicalgpu::PhysicalGPU;
use kube::Api;
use kube::api::ListParams;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::devices::Devices;

/// How often the fleet is counted.
const PERIOD: Duration = Duration::from_secs(60);

/// Labels of the per-class device gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClassLabels {
    device_class: String,
    /// `allocated` or `free`.
    state: &'static str,
}

/// Labels of the GPU gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GpuLabels {
    plane: String,
    phase: String,
}

/// The fleet gauges.
#[derive(Clone, Debug, Default)]
pub struct FleetMetrics {
    class_devices: Family<ClassLabels, Gauge>,
    gpus: Family<GpuLabels, Gauge>,
}

impl FleetMetrics {
    /// Registers the gauges under `gpu_operator_`.
    pub fn register(&self, registry: &mut Registry) {
        let sub = registry.sub_registry_with_prefix("gpu_operator");
        sub.register(
            "class_devices",
            "Devices of each of our DeviceClasses published by gpu.nvidia.com, allocated or free",
            self.class_devices.clone(),
        );
        sub.register(
            "gpus",
            "GPUs (PhysicalGPUs) by the plane that serves them and their phase",
            self.gpus.clone(),
        );
    }

    fn show(&self, classes: &[ClassDevices], gpus: &BTreeMap<(String, String), i64>) {
        // Classes and planes that went away take their series with them.
        self.class_devices.clear();
        for c in classes {
            for (state, n) in [
                ("allocated", c.allocated),
                ("free", c.published - c.allocated),
            ] {
                let labels = ClassLabels {
                    device_class: c.device_class.clone(),
                    state,
                };
                self.class_devices
                    .get_or_create(&labels)
                    .set(i64::try_from(n).unwrap_or(i64::MAX));
            }
        }
        self.gpus.clear();
        for ((plane, phase), n) in gpus {
            let labels = GpuLabels {
                plane: plane.clone(),
                phase: phase.clone(),
            };
            self.gpus.get_or_create(&labels).set(*n);
        }
    }
}

/// Devices of one DeviceClass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClassDevices {
    /// The class.
    pub device_class: String,
    /// Devices published that it selects.
    pub published: usize,
    /// Of those, held by claims (admin access holds none).
    pub allocated: usize,
}

/// For each existing DeviceClass that is ours (built in or from a GPUClass), its devices
/// published and allocated across the nodes.
pub fn class_devices(world: World<'_>) -> Vec<ClassDevices> {
    world
        .device_classes
        .iter()
        .filter_map(|class| {
            let criteria = selection(class, world.gpu_classes)?;
            let (published, allocated) = supply(&criteria, world.slices, world.claims)
                .values()
                .fold((0, 0), |(p, a), (n, m)| (p + n, a + m));
            Some(ClassDevices {
                device_class: class.clone(),
                published,
                allocated,
            })
        })
        .collect()
}

/// GPUs per (plane, phase), from the PhysicalGPUs (an object without status counts as
/// `unknown`).
pub fn gpus_by_plane(gpus: &[PhysicalGPU]) -> BTreeMap<(String, String), i64> {
    let mut counts = BTreeMap::new();
    for gpu in gpus {
        let (plane, phase) = gpu.status.as_ref().map_or(("unknown", "Unknown"), |s| {
            (s.plane.as_str(), s.phase.as_str())
        });
        let or = |v: &str, default: &str| {
            if v.is_empty() {
                default.to_owned()
            } else {
                v.to_owned()
            }
        };
        *counts
            .entry((or(plane, "unknown"), or(phase, "Unknown")))
            .or_default() += 1;
    }
    counts
}

/// Counts the fleet once a minute into `metrics`; a failed read keeps the last counts and is
/// retried at the next period.
pub async fn run(client: kube::Client, metrics: FleetMetrics) {
    loop {
        match read(&client).await {
            Ok((classes, gpus)) => metrics.show(&classes, &gpus),
            Err(e) => tracing::debug!(error = %e, "counting the fleet"),
        }
        tokio::time::sleep(PERIOD).await;
    }
}

type Counts = (Vec<ClassDevices>, BTreeMap<(String, String), i64>);

async fn read(client: &kube::Client) -> kube::Result<Counts> {
    let devices = Devices::read(client).await?;
    // Without the PhysicalGPU CRD there are no GPUs to count.
    let gpus = Api::<PhysicalGPU>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    Ok((class_devices(devices.world()), gpus_by_plane(&gpus)))
}

#[cfg(test)]
mod tests {
    use api::contract::{DRIVER_NAME, objects as o};
    use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
    use serde_json::json;

    use super::*;

    #[test]
    fn each_of_our_classes_counts_its_devices_published_and_allocated() {
        let slice: ResourceSlice = serde_json::from_value(json!({"metadata": {"name": "a"},
            "spec": {"driver": DRIVER_NAME, "nodeName": "a", "pool": {"name": "a", "generation": 1, "resourceSliceCount": 1},
                "devices": [{"name": "gpu-0", "attributes": {"type": {"string": "gpu"}}},
                            {"name": "gpu-1", "attributes": {"type": {"string": "gpu"}}},
                            {"name": "mig-0", "attributes": {"type": {"string": "mig"}}}]}}))
        .unwrap();
        let claim: ResourceClaim = serde_json::from_value(
            json!({"metadata": {"name": "c", "namespace": "ns"}, "spec": {},
            "status": {"allocation": {"devices": {"results": [
                {"request": "r", "driver": DRIVER_NAME, "pool": "a", "device": "gpu-1"}]}}}}),
        )
        .unwrap();
        let classes = [
            o::DEVICE_CLASS_GPU.to_owned(),
            o::DEVICE_CLASS_MIG.to_owned(),
            "example.com".to_owned(),
        ];
        let world = World {
            device_classes: &classes,
            gpu_classes: &[],
            slices: &[slice],
            claims: &[claim],
        };
        let counted = class_devices(world);
        assert_eq!(
            counted,
            [
                ClassDevices {
                    device_class: o::DEVICE_CLASS_GPU.into(),
                    published: 2,
                    allocated: 1
                },
                ClassDevices {
                    device_class: o::DEVICE_CLASS_MIG.into(),
                    published: 1,
                    allocated: 0
                },
            ],
            "another vendor's class is not counted"
        );
    }

    #[test]
    fn gpus_are_counted_by_plane_and_phase_and_the_gauges_follow() {
        let gpu = |plane: &str, phase: &str| -> PhysicalGPU {
            serde_json::from_value(json!({"apiVersion": "gpu-operator-rs.dev/v1alpha1", "kind": "PhysicalGPU",
                "metadata": {"name": "g"}, "spec": {},
                "status": {"node": "n", "uuid": "u", "pciBusID": "", "product": "", "architecture": "",
                    "computeCapability": "", "memory": "", "driverVersion": "", "cudaDriverVersion": "",
                    "migMode": "", "migDevices": 0, "plane": plane, "consumers": [], "phase": phase, "conditions": []}}))
            .unwrap()
        };
        let counts = gpus_by_plane(&[
            gpu("dra", "Ready"),
            gpu("dra", "Ready"),
            gpu("device-plugin", "NotReady"),
            gpu("", ""),
        ]);
        assert_eq!(
            counts,
            BTreeMap::from([
                (("device-plugin".into(), "NotReady".into()), 1),
                (("dra".into(), "Ready".into()), 2),
                (("unknown".into(), "Unknown".into()), 1),
            ])
        );
        let metrics = FleetMetrics::default();
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let class = ClassDevices {
            device_class: "gpu.nvidia.com".into(),
            published: 3,
            allocated: 1,
        };
        metrics.show(&[class], &counts);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains(
                r#"gpu_operator_class_devices{device_class="gpu.nvidia.com",state="free"} 2"#
            ),
            "{text}"
        );
        assert!(
            text.contains(r#"gpu_operator_gpus{plane="dra",phase="Ready"} 2"#),
            "{text}"
        );
        metrics.show(&[], &BTreeMap::new());
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            !text.contains("gpu.nvidia.com"),
            "gone classes leave: {text}"
        );
    }
}
