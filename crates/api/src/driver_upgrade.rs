//! A node's driver upgrade as the labeler runs it (where no ClusterPolicy's upgrade controller
//! does), recorded in the node annotation [`crate::contract::labels::DRIVER_UPGRADE`] and shown
//! in the driver manager's state label [`crate::contract::labels::DRIVER_UPGRADE_STATE`].

use serde::{Deserialize, Serialize};

/// Where a node's driver upgrade stands.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DriverUpgrade {
    /// The current step.
    pub phase: UpgradePhase,
    /// When the step began, in seconds since the Unix epoch.
    pub since: i64,
    /// The upgrade cordoned the node, so it uncordons it at the end (a node an admin had
    /// cordoned stays cordoned).
    #[serde(default)]
    pub cordoned: bool,
    /// Why the upgrade failed, for people; set in [`UpgradePhase::Failed`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The step the upgrade failed in; set in [`UpgradePhase::Failed`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_in: Option<UpgradePhase>,
}

/// A step of a driver upgrade.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum UpgradePhase {
    /// Cordoned; the pods that hold the node's GPUs are evicted (or awaited).
    Draining,
    /// Nothing holds the GPUs: the driver's clients (plugin, validator, exporter) are paused;
    /// once they are gone a waiting driver may load.
    DriverRestart,
    /// The clients are back; waiting for the validator to prove the new driver.
    Validating,
    /// A step missed its deadline: the rollout stops until the node recovers or is retried.
    Failed,
}

impl UpgradePhase {
    /// The driver manager's value of the state label for this step.
    pub fn state_label(self) -> &'static str {
        match self {
            UpgradePhase::Draining => state::DRAIN_REQUIRED,
            UpgradePhase::DriverRestart => state::POD_RESTART_REQUIRED,
            UpgradePhase::Validating => state::VALIDATION_REQUIRED,
            UpgradePhase::Failed => state::FAILED,
        }
    }
}

/// Values of the state label, the driver manager's.
pub mod state {
    /// The node waits for its turn.
    pub const UPGRADE_REQUIRED: &str = "upgrade-required";
    /// Cordoned, the GPUs' pods being drained.
    pub const DRAIN_REQUIRED: &str = "drain-required";
    /// The driver's clients stopped; the driver may (re)load.
    pub const POD_RESTART_REQUIRED: &str = "pod-restart-required";
    /// Waiting for the validator to prove the new driver.
    pub const VALIDATION_REQUIRED: &str = "validation-required";
    /// Done; the node is back in service.
    pub const DONE: &str = "upgrade-done";
    /// A step missed its deadline.
    pub const FAILED: &str = "upgrade-failed";
}

impl DriverUpgrade {
    /// A record of `phase` from `since`.
    pub fn at(phase: UpgradePhase, since: i64, cordoned: bool) -> Self {
        DriverUpgrade {
            phase,
            since,
            cordoned,
            reason: None,
            failed_in: None,
        }
    }

    /// Reads the annotation; `None` when absent or not a record this version understands.
    pub fn parse(value: &str) -> Option<Self> {
        serde_json::from_str(value).ok()
    }

    /// The annotation's value.
    pub fn to_annotation(&self) -> String {
        serde_json::to_string(self).expect("a driver upgrade serialises")
    }

    /// Whether the upgrade keeps the node out of service (it counts against
    /// `migration.maxUnavailable`): every step but a failure that left the node uncordoned.
    pub fn takes_node_out(&self) -> bool {
        self.phase != UpgradePhase::Failed || self.cordoned
    }

    /// How the `GPUCluster` status lists this upgrade of `node`.
    pub fn status(&self, node: &str) -> crate::gpucluster::NodeDriverUpgrade {
        crate::gpucluster::NodeDriverUpgrade {
            node: node.to_owned(),
            state: self.phase.state_label().to_owned(),
            reason: self.reason.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_annotation_round_trips_and_garbage_reads_as_none() {
        let mut u = DriverUpgrade::at(UpgradePhase::Failed, 1_700_000_000, true);
        u.reason = Some("the validator did not pass".into());
        u.failed_in = Some(UpgradePhase::Validating);
        let text = u.to_annotation();
        assert_eq!(
            text,
            r#"{"phase":"Failed","since":1700000000,"cordoned":true,"reason":"the validator did not pass","failedIn":"Validating"}"#
        );
        assert_eq!(DriverUpgrade::parse(&text), Some(u));
        assert_eq!(DriverUpgrade::parse(r#"{"phase":"Upgrading"}"#), None);
        assert_eq!(DriverUpgrade::parse("{"), None);
    }

    #[test]
    fn each_step_shows_the_driver_managers_state_value() {
        assert_eq!(UpgradePhase::Draining.state_label(), "drain-required");
        assert_eq!(
            UpgradePhase::DriverRestart.state_label(),
            "pod-restart-required"
        );
        assert_eq!(
            UpgradePhase::Validating.state_label(),
            "validation-required"
        );
        assert_eq!(UpgradePhase::Failed.state_label(), "upgrade-failed");
    }
}
