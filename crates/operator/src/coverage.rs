//! How many GPU nodes no plane serves and why ([`api::coverage::unserved`] decides), which nodes stay on DRA for their claims, and the
//! `GPUCluster` conditions that say so. Pure.

use api::AllocationMode;
use api::handover::{Handover, Phase};

/// GPU nodes no plane serves: how many, and the first few by name with why.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Unserved {
    /// How many.
    pub count: usize,
    /// `(node, why)`, at most [`Unserved::LISTED`].
    pub listed: Vec<(String, String)>,
}

impl Unserved {
    /// Nodes named in the condition at most.
    pub const LISTED: usize = 10;

    /// Counts a node, listing it while there is room.
    pub fn add(&mut self, node: &str, why: String) {
        self.count += 1;
        if self.listed.len() < Self::LISTED {
            self.listed.push((node.to_owned(), why));
        }
    }

    /// The `GPUNodesUnserved` condition: `(status, reason, message)`.
    pub fn condition(&self) -> (bool, &'static str, String) {
        if self.count == 0 {
            return (false, "AllServed", String::new());
        }
        let each: Vec<String> = self
            .listed
            .iter()
            .map(|(node, why)| format!("node {node}: {why}"))
            .collect();
        let more = self.count - self.listed.len();
        let tail = if more > 0 {
            format!("; and {more} more")
        } else {
            String::new()
        };
        let nodes = if self.count == 1 {
            "node gets"
        } else {
            "nodes get"
        };
        (
            true,
            "NoPlane",
            format!(
                "{} GPU {nodes} no GPUs from either plane: {}{tail}",
                self.count,
                each.join("; ")
            ),
        )
    }
}

/// Whether a hand-over keeps its node on DRA because pods there still hold `gpu.nvidia.com`
/// claims: the node drains away from DRA (the labeler moves nothing while they run).
pub fn held_on_dra(handover: &Handover) -> bool {
    handover.from == AllocationMode::Dra && handover.phase == Phase::Draining
}

/// The `NodesHeldOnDRA` condition for `(node, held since, in Unix seconds)`: `(status, reason,
/// message)`.
pub fn held_condition(held: &[(String, i64)]) -> (bool, &'static str, String) {
    if held.is_empty() {
        return (false, "NoneHeld", String::new());
    }
    let each: Vec<String> = held
        .iter()
        .map(|(node, since)| {
            let since = jiff::Timestamp::from_second(*since)
                .map(|t| t.to_string())
                .unwrap_or_else(|_| since.to_string());
            format!("node {node} (since {since})")
        })
        .collect();
    (
        true,
        "ClaimsInUse",
        format!(
            "held on the dra plane while pods hold gpu.nvidia.com claims there: {}. Each node \
             moves once they are gone (spec.migration.drain=evict asks them to leave through the \
             Eviction API, which a PodDisruptionBudget may refuse; wait waits for them)",
            each.join(", ")
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_unserved_condition_counts_all_and_names_the_first_ones() {
        assert!(!Unserved::default().condition().0);
        let mut u = Unserved::default();
        for i in 0..12 {
            u.add(&format!("n{i}"), "opted out".into());
        }
        let (status, reason, message) = u.condition();
        assert!(status);
        assert_eq!(reason, "NoPlane");
        assert!(
            message.starts_with("12 GPU nodes get no GPUs from either plane: node n0: opted out;")
        );
        assert!(message.ends_with("; and 2 more"), "{message}");
        assert!(!message.contains("n10"));
    }

    #[test]
    fn only_a_node_draining_away_from_dra_is_held() {
        let h = |from, phase| Handover {
            from,
            to: from.other(),
            phase,
            since: 1_700_000_000,
            cordoned: true,
            rollback: None,
        };
        assert!(held_on_dra(&h(AllocationMode::Dra, Phase::Draining)));
        assert!(!held_on_dra(&h(
            AllocationMode::Dra,
            Phase::WaitingForPlane
        )));
        assert!(!held_on_dra(&h(
            AllocationMode::DevicePlugin,
            Phase::Draining
        )));
        let (status, reason, message) = held_condition(&[("gpu-a".into(), 1_700_000_000)]);
        assert!(status);
        assert_eq!(reason, "ClaimsInUse");
        assert!(
            message.starts_with("held on the dra plane while pods hold gpu.nvidia.com claims there: node gpu-a (since 2023-11-14T22:13:20Z). "),
            "{message}"
        );
        assert!(!held_condition(&[]).0);
    }
}
