//! What a plan is made from: the cluster's side (which CRs exist, the policy's rules, the
//! defaults) and the node's facts beyond its labels (claims held, validators ready, a hand-over
//! in progress).

use std::collections::BTreeMap;

use api::AllocationMode;
use api::contract::labels as l;
use api::gpucluster::PlaneRule;
use kube::core::{Selector, SelectorExt};

use super::labels::is_control_plane;
use crate::driver_upgrade::Operands;
/// A plane-policy rule, ready to match nodes.
#[derive(Clone, Debug)]
pub struct Rule {
    /// Its name in the GPUCluster.
    pub name: String,
    selector: Selector,
    names_control_plane: bool,
    /// The mode it gives.
    pub mode: AllocationMode,
}

impl Rule {
    /// The rule of a GPUCluster's `spec.planePolicy.rules`; an error names it when its selector
    /// cannot be used (the CRD refuses such selectors, so this means an older CRD).
    pub fn new(rule: &PlaneRule) -> Result<Self, String> {
        let selector = Selector::try_from(rule.node_selector.to_label_selector())
            .map_err(|e| format!("planePolicy rule {}: {e}", rule.name))?;
        let names_control_plane = rule
            .node_selector
            .keys()
            .any(|k| k == l::CONTROL_PLANE_ROLE);
        Ok(Self {
            name: rule.name.clone(),
            selector,
            names_control_plane,
            mode: rule.mode,
        })
    }

    pub(super) fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        (self.names_control_plane || !is_control_plane(labels)) && self.selector.matches(labels)
    }
}

/// Cluster-wide facts the decision depends on.
#[derive(Clone, Debug)]
pub struct Cluster {
    /// A `GPUCluster` (the DRA plane's CR) exists.
    pub gpu_cluster: bool,
    /// A `ClusterPolicy` (the device-plugin plane's CR) exists.
    pub cluster_policy: bool,
    /// The `GPUCluster` serves the device-plugin plane too (`spec.devicePlugin.enabled`).
    pub gpu_cluster_device_plugin: bool,
    /// Mode for new GPU nodes when both planes are served (`DEFAULT_GPU_ALLOCATION_MODE`).
    pub default_mode: AllocationMode,
    /// The active driver upgrade policy lets the driver manager upgrade drivers automatically.
    pub driver_auto_upgrade: bool,
    /// The GPUCluster's plane-policy rules, in order.
    pub rules: Vec<Rule>,
}

impl Cluster {
    /// Whether a CR of either plane exists, so GPU nodes are expected to be served.
    pub fn any_plane_served(&self) -> bool {
        self.mode_for_new_nodes().is_some()
    }

    /// The mode a GPU node without one gets: the only plane served, or the default when both are
    /// (by one CR or two).
    pub(super) fn mode_for_new_nodes(&self) -> Option<AllocationMode> {
        match (
            self.serves(AllocationMode::Dra),
            self.serves(AllocationMode::DevicePlugin),
        ) {
            (true, false) => Some(AllocationMode::Dra),
            (false, true) => Some(AllocationMode::DevicePlugin),
            (true, true) => Some(self.default_mode),
            (false, false) => None,
        }
    }

    /// Whether a CR serves `mode` on the nodes in it.
    pub fn serves(&self, mode: AllocationMode) -> bool {
        match mode {
            AllocationMode::Dra => self.gpu_cluster,
            AllocationMode::DevicePlugin => {
                self.cluster_policy || (self.gpu_cluster && self.gpu_cluster_device_plugin)
            }
        }
    }
}

/// Whether pods on the node still hold GPUs of the plane the node is leaving: claims allocated by
/// the `gpu.nvidia.com` driver (leaving `dra`), or resources the device plugin gave (leaving
/// `device-plugin`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuClaims {
    /// Not looked up yet; the plan says when a lookup is needed.
    Unknown,
    /// No pod on the node holds one.
    None,
    /// Some pod (running, pending or terminating) holds one, or what it holds could not be read.
    Held,
}

/// Planes whose validator passed on the node (its pod is Ready).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadyPlanes {
    /// The DRA plane's validator (`nvidia-dra-validator`).
    pub dra: bool,
    /// The device-plugin plane's validator (`nvidia-operator-validator`).
    pub device_plugin: bool,
}

impl ReadyPlanes {
    /// Whether `mode`'s validator passed.
    pub fn has(self, mode: AllocationMode) -> bool {
        match mode {
            AllocationMode::Dra => self.dra,
            AllocationMode::DevicePlugin => self.device_plugin,
        }
    }
}

/// What is known about one node beyond its labels and annotations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeFacts {
    /// What pods hold of the plane the node may be leaving.
    pub claims: GpuClaims,
    /// Planes ready on the node.
    pub ready: ReadyPlanes,
    /// A rolled-back hand-over keeps the node on this plane, whatever the policy says.
    pub pinned: Option<AllocationMode>,
    /// How a hand-over holds the old plane; while it does, no deferral is reported (the
    /// hand-over reports its own steps).
    pub hold: Hold,
    /// What a driver upgrade does to the driver's client operands.
    pub operands: Operands,
}

/// How a hand-over holds the old plane on the node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Hold {
    /// No hand-over holds it: what pods hold decides, as a deferral.
    #[default]
    No,
    /// Queued: the old plane stays whole and none of the new plane's keys come.
    WholePlane,
    /// Draining: the old plane's plugin stays, its other operands leave (with their own GPU
    /// claims), none of the new plane's keys come.
    Plugin,
}

impl NodeFacts {
    /// Only what pods hold is known.
    pub fn claims(claims: GpuClaims) -> Self {
        Self {
            claims,
            ready: ReadyPlanes::default(),
            pinned: None,
            hold: Hold::No,
            operands: Operands::Leave,
        }
    }
}
