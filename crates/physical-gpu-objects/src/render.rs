//! Pure: the `PhysicalGPU` objects a node's plugin wants, from what it observes.

use std::collections::BTreeMap;

use api::gpuclass::{ARCHITECTURE_LABEL, DEVICE_LABEL, device_slug};
use api::physicalgpu::{NODE_LABEL, PhysicalGPU, PhysicalGPUSpec, PhysicalGPUStatus, object_name};
use gpu_discovery::{Gpu, MigMode};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, OwnerReference, Time};

/// Which plane serves the node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plane {
    /// The DRA kubelet plugin.
    Dra,
    /// The device plugin.
    DevicePlugin,
}

impl Plane {
    /// As `status.plane` spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Plane::Dra => "dra",
            Plane::DevicePlugin => "device-plugin",
        }
    }
}

/// What a node's plugin observes of its GPUs.
#[derive(Clone, Debug, PartialEq)]
pub struct Observed {
    /// The node's name.
    pub node: String,
    /// The node's UID (the objects are owned by the Node, so they go with it).
    pub node_uid: String,
    /// The plane the plugin serves.
    pub plane: Plane,
    /// Driver version.
    pub driver_version: String,
    /// CUDA driver version, `major.minor`.
    pub cuda_driver_version: String,
    /// The GPUs NVML reads.
    pub gpus: Vec<Gpu>,
    /// Unhealthy GPUs by UUID, with the fault in words.
    pub faults: BTreeMap<String, String>,
    /// NVML stopped answering: no GPU's health is known.
    pub health_unknown: bool,
    /// The kubelet took the plugin's registration: the GPUs are offered to pods.
    pub offered: bool,
    /// Who uses each GPU (by UUID): `<namespace>/<claim>`.
    pub consumers: BTreeMap<String, Vec<String>>,
    /// The plugin is stopping (its pod deleted: a hand-over, the operands switched off): nothing
    /// serves the GPUs until a plugin of either plane starts on the node.
    pub stopped: bool,
}

/// `Some(true)` True, `Some(false)` False, `None` Unknown.
fn condition(type_: &str, status: Option<bool>, reason: &str, message: String) -> Condition {
    Condition {
        type_: type_.into(),
        status: match status {
            Some(true) => "True",
            Some(false) => "False",
            None => "Unknown",
        }
        .into(),
        reason: reason.into(),
        message,
        observed_generation: None,
        last_transition_time: Time(Timestamp::UNIX_EPOCH),
    }
}

fn memory_quantity(bytes: u64) -> String {
    const UNITS: [(&str, u32); 4] = [("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10)];
    UNITS
        .iter()
        .find(|(_, shift)| bytes != 0 && bytes.is_multiple_of(1u64 << shift))
        .map(|(unit, shift)| format!("{}{unit}", bytes >> shift))
        .unwrap_or_else(|| bytes.to_string())
}

fn conditions(observed: &Observed, gpu: &Gpu) -> (Vec<Condition>, &'static str) {
    let driver = if observed.health_unknown {
        condition(
            "DriverReady",
            None,
            "NVMLNotAnswering",
            "NVML stopped answering; the driver may be unloading or failing".into(),
        )
    } else {
        condition(
            "DriverReady",
            Some(true),
            "NVMLAnswers",
            format!("driver {} answers NVML", observed.driver_version),
        )
    };
    let healthy = match (observed.health_unknown, observed.faults.get(&gpu.uuid)) {
        (true, _) => condition(
            "Healthy",
            None,
            "HealthUnknown",
            "its health cannot be read while NVML does not answer".into(),
        ),
        (false, Some(fault)) => condition("Healthy", Some(false), "Fault", fault.clone()),
        (false, None) => condition("Healthy", Some(true), "NoFault", "no fault seen".into()),
    };
    let (ready, phase) = if observed.stopped {
        (
            condition(
                "Ready",
                Some(false),
                "NotServed",
                format!(
                    "the {} plugin on this node stopped; nothing offers this GPU until a plugin \
                     of either plane starts here",
                    observed.plane.as_str()
                ),
            ),
            "NotReady",
        )
    } else if observed.health_unknown {
        (
            condition(
                "Ready",
                None,
                "HealthUnknown",
                "NVML does not answer".into(),
            ),
            "Unknown",
        )
    } else if let Some(fault) = observed.faults.get(&gpu.uuid) {
        (
            condition(
                "Ready",
                Some(false),
                "Unhealthy",
                format!("unhealthy: {fault}"),
            ),
            "NotReady",
        )
    } else if !observed.offered {
        (
            condition(
                "Ready",
                Some(false),
                "NotRegistered",
                format!(
                    "the {} plugin is not registered with the kubelet",
                    observed.plane.as_str()
                ),
            ),
            "NotReady",
        )
    } else {
        (
            condition(
                "Ready",
                Some(true),
                "Offered",
                format!("offered to pods by the {} plane", observed.plane.as_str()),
            ),
            "Ready",
        )
    };
    (vec![driver, healthy, ready], phase)
}

/// Keeps the transition time of each condition whose status is as `previous` had it.
fn keep_transitions(conditions: &mut [Condition], previous: Option<&PhysicalGPU>, now: Timestamp) {
    let before = previous.and_then(|p| p.status.as_ref());
    for c in conditions {
        let same = before
            .into_iter()
            .flat_map(|s| &s.conditions)
            .find(|b| b.type_ == c.type_ && b.status == c.status);
        c.last_transition_time = same.map_or(Time(now), |b| b.last_transition_time.clone());
    }
}

/// The objects for `observed`, by name. `previous` are the live objects by name: a condition
/// whose status did not change keeps its transition time, so unchanged GPUs render equal to the
/// live objects and are not written.
pub fn desired(
    observed: &Observed,
    previous: &BTreeMap<String, PhysicalGPU>,
    now: Timestamp,
) -> BTreeMap<String, PhysicalGPU> {
    let owner = OwnerReference {
        api_version: "v1".into(),
        kind: "Node".into(),
        name: observed.node.clone(),
        uid: observed.node_uid.clone(),
        ..OwnerReference::default()
    };
    observed
        .gpus
        .iter()
        .map(|gpu| {
            let name = object_name(&observed.node, &gpu.pci_bus_id);
            let (mut conditions, phase) = conditions(observed, gpu);
            keep_transitions(&mut conditions, previous.get(&name), now);
            let labels = [
                (DEVICE_LABEL, device_slug(&gpu.product_name)),
                (ARCHITECTURE_LABEL, device_slug(&gpu.architecture)),
                (NODE_LABEL, observed.node.clone()),
            ];
            let mut consumers = observed
                .consumers
                .get(&gpu.uuid)
                .cloned()
                .unwrap_or_default();
            consumers.sort();
            let (major, minor) = (
                gpu.cuda_compute_capability.major,
                gpu.cuda_compute_capability.minor,
            );
            let object = PhysicalGPU {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    labels: Some(labels.map(|(k, v)| (k.to_owned(), v)).into_iter().collect()),
                    owner_references: Some(vec![owner.clone()]),
                    ..ObjectMeta::default()
                },
                spec: PhysicalGPUSpec {},
                status: Some(PhysicalGPUStatus {
                    node: observed.node.clone(),
                    uuid: gpu.uuid.clone(),
                    pci_bus_id: gpu.pci_bus_id.clone(),
                    product: gpu.product_name.clone(),
                    architecture: gpu.architecture.clone(),
                    compute_capability: format!("{major}.{minor}"),
                    memory: gpu.memory_bytes.map(memory_quantity).unwrap_or_default(),
                    driver_version: observed.driver_version.clone(),
                    cuda_driver_version: observed.cuda_driver_version.clone(),
                    mig_mode: format!("{:?}", gpu.mig_mode),
                    mig_devices: match gpu.mig_mode {
                        MigMode::Enabled => i64::try_from(gpu.mig_devices.len()).unwrap_or(0),
                        _ => 0,
                    },
                    plane: observed.plane.as_str().into(),
                    consumers,
                    phase: phase.into(),
                    conditions,
                }),
            };
            (name, object)
        })
        .collect()
}

/// Whether the live object already says what `want` says (labels, owner and status).
pub fn up_to_date(live: &PhysicalGPU, want: &PhysicalGPU) -> bool {
    let labels_kept = want.metadata.labels.iter().flatten().all(|(k, v)| {
        live.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(k))
            .is_some_and(|have| have == v)
    });
    labels_kept
        && live.status == want.status
        && live.metadata.owner_references == want.metadata.owner_references
}

#[cfg(test)]
mod tests;
