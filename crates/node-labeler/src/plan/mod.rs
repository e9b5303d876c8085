//! The labeler's decision: from what a node carries and what the cluster has, the label and
//! annotation changes that node needs. Pure; the controller does the I/O.

use std::collections::BTreeMap;
use std::time::Duration;

use api::AllocationMode;
use api::contract::labels as l;

/// How often a node whose plugin label's removal is deferred (a pod still holds one of its
/// GPUs) is looked at again.
pub const DEFERRED_RECHECK: Duration = Duration::from_secs(30);

mod inputs;
mod labels;

pub use inputs::{Cluster, GpuClaims, Hold, NodeFacts, ReadyPlanes, Rule};

use crate::driver_upgrade::Operands;
pub use labels::is_gpu_node;
use labels::{in_plane, is_control_plane, owned_keys, plane_keys, value};

/// Something worth telling an admin about the node, as an Event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Finding {
    /// The mode label holds a value that is not a mode; the node's deploy labels are left alone.
    InvalidMode(String),
    /// `gpu.deploy.dra-driver` stays until the node's GPU claims are released.
    DraDriverRemovalDeferred,
    /// `gpu.deploy.device-plugin` stays until no pod on the node holds a GPU it gave.
    DevicePluginRemovalDeferred,
    /// A plane-policy rule set the node's mode.
    ModeChosenByRule {
        /// The rule.
        rule: String,
        /// The mode it set.
        mode: AllocationMode,
    },
}

/// The changes one node needs. Empty means no write.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Label changes: `Some(value)` sets, `None` removes.
    pub labels: BTreeMap<String, Option<String>>,
    /// Annotation changes: `Some(value)` sets, `None` removes.
    pub annotations: BTreeMap<String, Option<String>>,
    /// Events to report.
    pub findings: Vec<Finding>,
    /// The plan wants to remove a plane's plugin label (`gpu.deploy.dra-driver` or
    /// `gpu.deploy.device-plugin`) but what pods hold of that plane was not looked up: look it up
    /// and plan again.
    pub needs_claim_lookup: Option<AllocationMode>,
    /// The node carries one plane's plugin and its mode asks for the other, served one:
    /// `(from, to)`. The hand-over decides when the labels may move.
    pub switch: Option<(AllocationMode, AllocationMode)>,
}

impl Plan {
    /// The node's labels once the plan is written.
    pub fn labels_after(&self, labels: &BTreeMap<String, String>) -> BTreeMap<String, String> {
        let mut after = labels.clone();
        for (key, want) in &self.labels {
            match want {
                Some(v) => after.insert(key.clone(), v.clone()),
                None => after.remove(key),
            };
        }
        after
    }

    /// Whether the node needs a write.
    pub fn has_changes(&self) -> bool {
        !self.labels.is_empty() || !self.annotations.is_empty()
    }

    /// Whether the node must be looked at again later even without a change event.
    pub fn is_deferred(&self) -> bool {
        self.findings.iter().any(|f| {
            matches!(
                f,
                Finding::DraDriverRemovalDeferred | Finding::DevicePluginRemovalDeferred
            )
        })
    }
}

/// Plans the label and annotation changes of one node when only what pods hold is known.
pub fn plan(
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
    cluster: &Cluster,
    claims: GpuClaims,
) -> Plan {
    plan_node(labels, annotations, cluster, NodeFacts::claims(claims))
}

/// Plans the label and annotation changes of one node.
pub fn plan_node(
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
    cluster: &Cluster,
    facts: NodeFacts,
) -> Plan {
    let claims = facts.claims;
    let mut desired: BTreeMap<&str, Option<String>> = BTreeMap::new();
    let mut findings = Vec::new();
    let gpu = is_gpu_node(labels);

    if gpu {
        desired.insert(l::GPU_PRESENT, Some("true".into()));
    } else if labels.contains_key(l::GPU_PRESENT) {
        desired.insert(l::GPU_PRESENT, Some("false".into()));
    }

    let new_node_mode = cluster.mode_for_new_nodes();
    let active_cr = new_node_mode.is_some();
    let opted_out = value(labels, l::ENABLED) == Some("false");
    let label = value(labels, l::ALLOCATION_MODE);
    let chosen_before = annotations.get(l::CHOSEN_MODE).map(String::as_str);
    // The labeler's own choice may change; a label it did not choose is an admin's and wins.
    let chosen_by_us = label.is_some() && label == chosen_before;
    let mut chosen_after = chosen_before.map(str::to_owned);
    let mut excluded = false;
    let mode = match label {
        _ if gpu && facts.pinned.is_some() => {
            let pinned = facts.pinned;
            if label != pinned.map(AllocationMode::as_str) {
                desired.insert(l::ALLOCATION_MODE, pinned.map(|m| m.to_string()));
            }
            chosen_after = pinned.map(|m| m.to_string());
            pinned
        }
        Some(v) if !chosen_by_us => {
            chosen_after = None;
            match v.parse::<AllocationMode>() {
                Ok(mode) => Some(mode),
                Err(_) => {
                    findings.push(Finding::InvalidMode(v.to_owned()));
                    None
                }
            }
        }
        _ if !gpu || opted_out => label.and_then(|v| v.parse().ok()),
        _ => {
            let rule = cluster.rules.iter().find(|r| r.matches(labels));
            let want = match (rule, label) {
                (Some(rule), _) => Some(rule.mode),
                // Served by neither plane unless a rule names them.
                (None, _) if is_control_plane(labels) => None,
                // The default is for new nodes; a node with a mode keeps it.
                (None, Some(v)) => v.parse().ok(),
                (None, None) => new_node_mode,
            };
            match want {
                Some(mode) => {
                    if label != Some(mode.as_str()) {
                        desired.insert(l::ALLOCATION_MODE, Some(mode.to_string()));
                        if let Some(rule) = rule {
                            findings.push(Finding::ModeChosenByRule {
                                rule: rule.name.clone(),
                                mode,
                            });
                        }
                    }
                    chosen_after = Some(mode.to_string());
                }
                None => {
                    excluded = active_cr;
                    if label.is_some() {
                        desired.insert(l::ALLOCATION_MODE, None);
                    }
                    chosen_after = None;
                }
            }
            want
        }
    };

    let kill_switch = value(labels, l::DEPLOY_OPERANDS) == Some("false");
    let stripped = !gpu || kill_switch || (active_cr && (opted_out || excluded));
    if stripped {
        // Not (or not yet) a GPU node, operands switched off, opted out, or a control-plane
        // node no rule names: nothing of ours stays. A `false` is an admin's opt-out, never
        // ours, and stays: it still holds when GPU discovery labels the node later.
        for key in owned_keys().filter(|k| value(labels, k) != Some("false")) {
            desired.insert(key, None);
        }
    } else if let (Some(mode), true) = (mode, active_cr) {
        let keep = plane_keys(mode, labels);
        for key in owned_keys().filter(|k| !keep.contains(k)) {
            desired.insert(key, None);
        }
        if cluster.serves(mode) {
            for key in keep.into_iter().filter(|k| value(labels, k).is_none()) {
                desired.insert(key, Some("true".into()));
            }
        }
    }

    // A plane's plugin leaves only once no pod holds GPUs it gave (claims, or device-plugin
    // resources); meanwhile the other plane's keys wait, so no GPU is offered by both planes.
    // `claims` speaks of one plane: the first whose plugin label goes (a node carrying both,
    // which the labeler never makes, has only its DRA plugin guarded).
    let mut needs_claim_lookup = None;
    let leaving = [
        (
            AllocationMode::Dra,
            l::DEPLOY_DRA_DRIVER,
            Finding::DraDriverRemovalDeferred,
        ),
        (
            AllocationMode::DevicePlugin,
            l::DEPLOY_DEVICE_PLUGIN,
            Finding::DevicePluginRemovalDeferred,
        ),
    ]
    .into_iter()
    // An empty value selects no plugin pod, so only a real value needs the check.
    .find(|(_, key, _)| matches!(desired.get(key), Some(None)) && value(labels, key).is_some());
    let mut switch = None;
    if let Some((plane, plugin_key, deferred)) = leaving {
        switch = mode
            .filter(|m| *m != plane && active_cr && !stripped && cluster.serves(*m))
            .map(|m| (plane, m));
        let kept = match claims {
            _ if facts.hold != Hold::No => true,
            GpuClaims::None => false,
            GpuClaims::Unknown => {
                needs_claim_lookup = Some(plane);
                true
            }
            GpuClaims::Held => {
                findings.push(deferred);
                true
            }
        };
        if kept {
            desired.remove(plugin_key);
            let other_plane = |key: &str| in_plane(plane.other(), key);
            // The shared driver key is never added or removed by a switch.
            desired.retain(|key, want| {
                want.is_none() || *key == l::DEPLOY_DRIVER || !other_plane(key)
            });
            if facts.hold == Hold::WholePlane {
                desired.retain(|key, want| want.is_some() || !in_plane(plane, key));
            }
        }
    }

    // A driver upgrade pauses the driver's clients with the driver manager's values, and takes
    // its pauses back afterwards.
    if facts.operands != Operands::Leave {
        for key in l::DRIVER_CLIENT_KEYS {
            let now = match desired.get(key) {
                Some(want) => want.clone(),
                None => labels.get(key).cloned(),
            };
            let Some(now) = now.filter(|v| !v.is_empty()) else {
                continue;
            };
            let plugin = key == l::DEPLOY_DRA_DRIVER || key == l::DEPLOY_DEVICE_PLUGIN;
            let want = match facts.operands {
                Operands::Pause { plugin: true } => paused(&now),
                Operands::Pause { plugin: false } if !plugin => paused(&now),
                _ => resumed(&now),
            };
            if want != now {
                desired.insert(key, Some(want));
            }
        }
    }

    // Readiness labels follow the plane whose plugin the node keeps, and only while its
    // validator passes there.
    if gpu && active_cr {
        let after = |key: &str| match desired.get(key) {
            Some(want) => want.as_deref().is_some_and(|v| !v.is_empty()),
            None => value(labels, key).is_some(),
        };
        let plane = match (after(l::DEPLOY_DRA_DRIVER), after(l::DEPLOY_DEVICE_PLUGIN)) {
            (true, false) => Some(AllocationMode::Dra),
            (false, true) => Some(AllocationMode::DevicePlugin),
            _ => None,
        };
        let ready = plane.filter(|p| facts.ready.has(*p));
        desired.insert(l::GPU_STACK, ready.map(|p| p.to_string()));
        desired.insert(l::GPU_SETUP_COMPLETE, ready.map(|_| "true".to_owned()));
    } else {
        desired.insert(l::GPU_STACK, None);
        desired.insert(l::GPU_SETUP_COMPLETE, None);
    }

    let mut annotations_plan = BTreeMap::new();
    if chosen_after.as_deref() != chosen_before {
        annotations_plan.insert(l::CHOSEN_MODE.to_owned(), chosen_after);
    }
    if gpu && active_cr {
        let want = cluster.driver_auto_upgrade.then(|| "true".to_owned());
        if annotations.get(l::DRIVER_UPGRADE_ENABLED) != want.as_ref() {
            annotations_plan.insert(l::DRIVER_UPGRADE_ENABLED.to_owned(), want);
        }
    }

    Plan {
        labels: desired
            .into_iter()
            .filter(|(key, want)| labels.get(*key) != want.as_ref())
            .map(|(key, want)| (key.to_owned(), want))
            .collect(),
        annotations: annotations_plan,
        findings,
        needs_claim_lookup,
        switch,
    }
}

/// A deploy label's value while a driver upgrade pauses its operand, as the driver manager
/// writes it (`false` stays: nothing runs to pause).
fn paused(value: &str) -> String {
    match value {
        "true" => l::PAUSED_FOR_DRIVER_UPGRADE.to_owned(),
        "false" => value.to_owned(),
        v if v == l::PAUSED_FOR_DRIVER_UPGRADE || v.ends_with(l::PAUSED_SUFFIX) => v.to_owned(),
        v => format!("{v}{}", l::PAUSED_SUFFIX),
    }
}

/// A deploy label's value once a driver upgrade's pause is taken back.
fn resumed(value: &str) -> String {
    if value == l::PAUSED_FOR_DRIVER_UPGRADE {
        return "true".to_owned();
    }
    value
        .strip_suffix(l::PAUSED_SUFFIX)
        .unwrap_or(value)
        .to_owned()
}

#[cfg(test)]
mod tests;
