//! What the kubelet is told at any moment: the plan and which GPUs are unhealthy.

use crate::plan::Plan;
use crate::proto::{self, Device};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// The plugin's current view, published to every resource's server through a watch channel.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct State {
    /// What is offered.
    pub plan: Arc<Plan>,
    /// UUIDs of the physical GPUs that are unhealthy.
    pub unhealthy: BTreeSet<String>,
    /// The fault of each unhealthy GPU, in words, by UUID.
    pub faults: BTreeMap<String, String>,
    /// NVML failed at the last look: no GPU's health is known.
    pub nvml_failing: bool,
}

impl State {
    /// The device list of `resource`, as `ListAndWatch` sends it; empty for a resource not
    /// offered.
    pub fn devices(&self, resource: &str) -> Vec<Device> {
        let Some(r) = self.plan.resources.get(resource) else {
            return Vec::new();
        };
        r.devices
            .iter()
            .map(|d| Device {
                id: d.id.clone(),
                health: if self.unhealthy.contains(&d.gpu_uuid) {
                    proto::UNHEALTHY
                } else {
                    proto::HEALTHY
                }
                .to_owned(),
                topology: None,
            })
            .collect()
    }
}
