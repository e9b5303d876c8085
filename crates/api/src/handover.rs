//! A node's hand-over between the planes, as the labeler records it in the node annotation
//! [`crate::contract::labels::HANDOVER`] and the operator summarises it in the `GPUCluster` status.

use serde::{Deserialize, Serialize};

use crate::AllocationMode;

/// Where a node's hand-over stands.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Handover {
    /// The plane the node leaves.
    pub from: AllocationMode,
    /// The plane the node goes to.
    pub to: AllocationMode,
    /// The current step.
    pub phase: Phase,
    /// When the step began, in seconds since the Unix epoch.
    pub since: i64,
    /// The hand-over cordoned the node, so it uncordons it at the end (a node an admin had
    /// cordoned stays cordoned).
    #[serde(default)]
    pub cordoned: bool,
    /// Set when this hand-over takes the node back after a failed one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollback: Option<Rollback>,
}

/// A step of a hand-over.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Phase {
    /// Cordoned; the pods that hold the old plane's GPUs are evicted (or awaited).
    Draining,
    /// The deploy labels moved; waiting for the new plane's validator to pass on the node.
    WaitingForPlane,
    /// A rollback finished: the node stays on `to` (its old plane) while the `GPUCluster` keeps
    /// the generation the failure happened under, and no other node starts a hand-over.
    RolledBack,
}

impl Phase {
    /// Whether the node is between planes (it counts against `migration.maxUnavailable`).
    pub fn in_progress(self) -> bool {
        matches!(self, Phase::Draining | Phase::WaitingForPlane)
    }
}

/// Why a node was taken back to its old plane.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Rollback {
    /// What went wrong, for people.
    pub reason: String,
    /// The `GPUCluster` generation the failure happened under; a new one resumes the rollout.
    pub generation: i64,
}

impl Phase {
    /// The name the annotation and the status use.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Draining => "Draining",
            Phase::WaitingForPlane => "WaitingForPlane",
            Phase::RolledBack => "RolledBack",
        }
    }
}

impl Handover {
    /// How the `GPUCluster` status lists this hand-over of `node`.
    pub fn status(&self, node: &str) -> crate::gpucluster::NodeHandover {
        crate::gpucluster::NodeHandover {
            node: node.to_owned(),
            from: self.from.to_string(),
            to: self.to.to_string(),
            phase: self.phase.as_str().to_owned(),
            reason: self.rollback.as_ref().map(|r| r.reason.clone()),
        }
    }

    /// Reads the annotation; `None` when absent or not a hand-over this version understands.
    pub fn parse(value: &str) -> Option<Self> {
        serde_json::from_str(value).ok()
    }

    /// The annotation's value.
    pub fn to_annotation(&self) -> String {
        serde_json::to_string(self).expect("a hand-over serialises")
    }

    /// The plane the node stays on while a rollback of `generation` holds it.
    pub fn pinned(&self, generation: i64) -> Option<AllocationMode> {
        match &self.rollback {
            Some(r) if r.generation == generation => Some(self.to),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_annotation_round_trips_and_garbage_reads_as_none() {
        let h = Handover {
            from: AllocationMode::DevicePlugin,
            to: AllocationMode::Dra,
            phase: Phase::Draining,
            since: 1_700_000_000,
            cordoned: true,
            rollback: None,
        };
        let text = h.to_annotation();
        assert_eq!(
            text,
            r#"{"from":"device-plugin","to":"dra","phase":"Draining","since":1700000000,"cordoned":true}"#
        );
        assert_eq!(Handover::parse(&text), Some(h));
        assert_eq!(Handover::parse("{not json"), None);
        assert_eq!(Handover::parse(r#"{"from":"dra","to":"gpu"}"#), None);
    }

    #[test]
    fn a_rollback_pins_the_old_plane_until_the_generation_changes() {
        let h = Handover {
            from: AllocationMode::Dra,
            to: AllocationMode::DevicePlugin,
            phase: Phase::RolledBack,
            since: 0,
            cordoned: false,
            rollback: Some(Rollback {
                reason: "r".into(),
                generation: 3,
            }),
        };
        assert_eq!(h.pinned(3), Some(AllocationMode::DevicePlugin));
        assert_eq!(h.pinned(4), None);
    }
}
