//! `kubectl gpu migration`: how far a cluster-wide move between the planes is, each node that is
//! not there yet, its step, how long it has been on it and what holds it.

use std::collections::BTreeMap;

use api::AllocationMode;
use api::contract::labels as l;
use api::handover::Phase;
use api::pods::{allocated_by_gpu_driver, claim_names, holds_device_plugin_gpus, is_daemonset_pod};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;
use serde::Serialize;

use crate::cluster::Cluster;
use crate::nodes::{handover, is_gpu_node, serving_plane};
use crate::table::{Cell, Tone, age};

/// A migration's progress.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Progress {
    /// GPU nodes a plane is wanted for (their allocation-mode label).
    pub nodes: usize,
    /// Those served by the wanted plane with no hand-over under way.
    pub done: usize,
    /// Of those, the nodes whose plane's validator has not passed (`kubectl gpu nodes` shows
    /// them): not part of a migration, but not serving GPUs either.
    pub not_ready: Vec<String>,
    /// How many nodes want each plane.
    pub wanted: BTreeMap<String, usize>,
    /// Every node not done, by name.
    pub pending: Vec<NodeStep>,
}

impl Progress {
    /// Whether every GPU node is served by the plane it wants, with no hand-over under way.
    pub fn complete(&self) -> bool {
        self.pending.is_empty()
    }
}

/// Where one node that is not done stands.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeStep {
    /// The node.
    pub node: String,
    /// The plane it leaves during a hand-over, else the plane whose plugin is deployed on it.
    pub from: Option<String>,
    /// The plane it wants (its allocation-mode label, set by the plane policy or an admin).
    pub to: String,
    /// Its step.
    pub step: Step,
    /// Since when it is on this step, in Unix seconds (hand-overs record it).
    pub since: Option<i64>,
    /// What holds it, for people.
    pub blocked_by: Vec<String>,
}

/// A step of a node not yet served by the plane it wants.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Step {
    /// Cordoned; the pods holding the old plane's GPUs are leaving.
    Draining,
    /// The plane moved; its validator has not passed yet.
    WaitingForPlane,
    /// Waiting for a free slot, or for a paused migration.
    Queued,
    /// Taken back to its old plane after a failed hand-over.
    RolledBack,
}

impl Step {
    /// How the table and the summary say it.
    pub fn as_str(self) -> &'static str {
        match self {
            Step::Draining => "draining",
            Step::WaitingForPlane => "waiting for plane",
            Step::Queued => "queued",
            Step::RolledBack => "rolled back",
        }
    }
}

/// The migration's progress as the nodes and the GPUCluster record it.
pub fn progress(cluster: &Cluster) -> Progress {
    let paused = cluster
        .gpu_cluster
        .as_ref()
        .and_then(|c| c.status.as_ref())
        .and_then(|s| {
            s.conditions
                .iter()
                .find(|c| c.type_ == "MigrationPaused" && c.status == "True")
        })
        .map(|c| c.message.clone());
    let mut p = Progress {
        nodes: 0,
        done: 0,
        not_ready: Vec::new(),
        wanted: BTreeMap::new(),
        pending: Vec::new(),
    };
    let mut nodes: Vec<&Node> = cluster
        .nodes
        .iter()
        .filter(|n| is_gpu_node(n, &cluster.gpus))
        .filter(|n| n.labels().get(l::ENABLED).is_none_or(|v| v != "false"))
        .collect();
    nodes.sort_by_key(|n| n.name_any());
    for node in nodes {
        let current = serving_plane(node);
        let Some(to) = node.labels().get(l::ALLOCATION_MODE).cloned() else {
            continue;
        };
        p.nodes += 1;
        *p.wanted.entry(to.clone()).or_default() += 1;
        let ready = node
            .labels()
            .get(l::GPU_SETUP_COMPLETE)
            .is_some_and(|v| v == "true");
        let name = node.name_any();
        let mut step = NodeStep {
            node: name.clone(),
            from: current.clone(),
            to: to.clone(),
            step: Step::Queued,
            since: None,
            blocked_by: Vec::new(),
        };
        match handover(node) {
            Some(h) if h.phase == Phase::Draining => {
                step.step = Step::Draining;
                step.from = Some(h.from.to_string());
                step.since = Some(h.since);
                step.blocked_by = holders(cluster, &name, h.from);
                if step.blocked_by.is_empty() {
                    step.blocked_by = vec![format!(
                        "nothing holds a {} GPU any more: the node labeler moves the plane next",
                        h.from
                    )];
                }
            }
            Some(h) if h.phase == Phase::WaitingForPlane => {
                step.step = Step::WaitingForPlane;
                step.from = Some(h.from.to_string());
                step.since = Some(h.since);
                step.blocked_by = vec![format!(
                    "the {} plane's validator has not passed on the node yet",
                    h.to
                )];
            }
            Some(h) => {
                step.step = Step::RolledBack;
                step.since = Some(h.since);
                step.blocked_by = vec![
                    h.rollback
                        .map(|r| r.reason)
                        .unwrap_or_else(|| "rolled back".into()),
                    "a new GPUCluster generation (a spec change) resumes the migration".into(),
                ];
            }
            None if current.as_deref() != Some(to.as_str()) => {
                step.step = Step::Queued;
                step.blocked_by = vec![match &paused {
                    Some(why) => format!("the migration is paused: {why}"),
                    None => "waiting for a free slot (spec.migration.maxUnavailable)".into(),
                }];
            }
            None => {
                p.done += 1;
                if !ready {
                    p.not_ready.push(name);
                }
                continue;
            }
        }
        p.pending.push(step);
    }
    p
}

/// The live pods on `node` that hold GPUs of `plane`, as `pod ns/name`, as the labeler's drain
/// waits for them.
fn holders(cluster: &Cluster, node: &str, plane: AllocationMode) -> Vec<String> {
    let on_node = |p: &&Pod| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node);
    cluster
        .pods
        .iter()
        .filter(on_node)
        .filter(|p| api::pods::is_live(p))
        .filter(|p| match plane {
            AllocationMode::DevicePlugin => holds_device_plugin_gpus(p),
            AllocationMode::Dra => holds_dra_claim(cluster, p),
        })
        .map(|p| {
            let kind = if is_daemonset_pod(p) {
                " (a DaemonSet's: it leaves with its deploy label)"
            } else {
                ""
            };
            format!(
                "pod {}/{} holds a {plane} GPU{kind}",
                p.namespace().unwrap_or_default(),
                p.name_any()
            )
        })
        .collect()
}

fn holds_dra_claim(cluster: &Cluster, pod: &Pod) -> bool {
    let ns = pod.namespace();
    claim_names(pod).any(|name| {
        cluster
            .claims
            .iter()
            .any(|c| c.namespace() == ns && c.name_any() == name && allocated_by_gpu_driver(c))
    })
}

/// The headline: nodes done of all, and how many want each plane.
pub fn summary(p: &Progress) -> String {
    let wanted: Vec<String> = p.wanted.iter().map(|(k, v)| format!("{k} {v}")).collect();
    let count = |step: Step| p.pending.iter().filter(|s| s.step == step).count();
    let head = format!(
        "{} of {} GPU nodes served by the plane they want ({})",
        p.done,
        p.nodes,
        wanted.join(", ")
    );
    let not_ready = if p.not_ready.is_empty() {
        String::new()
    } else {
        format!(" (not ready: {})", p.not_ready.join(", "))
    };
    if p.complete() {
        return format!("{head}: the migration is complete{not_ready}");
    }
    format!(
        "{head}; {} handing over, {} queued, {} rolled back{not_ready}",
        count(Step::Draining) + count(Step::WaitingForPlane),
        count(Step::Queued),
        count(Step::RolledBack)
    )
}

/// The table's headers.
pub const HEADERS: [&str; 6] = ["NODE", "FROM", "TO", "STEP", "FOR", "BLOCKED BY"];

/// One table row per node not done, at `now`.
pub fn table_rows(p: &Progress, now: i64) -> Vec<Vec<Cell>> {
    p.pending
        .iter()
        .map(|s| {
            let tone = match s.step {
                Step::RolledBack => Tone::Bad,
                Step::Queued => Tone::Plain,
                Step::Draining | Step::WaitingForPlane => Tone::Warn,
            };
            vec![
                Cell::plain(s.node.clone()),
                Cell::plain(s.from.clone().unwrap_or_default()),
                Cell::plain(s.to.clone()),
                Cell::new(s.step.as_str(), tone),
                Cell::plain(s.since.map(|t| age(now - t)).unwrap_or_default()),
                Cell::plain(s.blocked_by.join("; ")),
            ]
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// Node `name` served by `serving`, wanting `wanted`.
    fn node(name: &str, serving: &str, wanted: &str, ready: bool, handover: Option<&str>) -> Node {
        let mut annotations = json!({});
        if let Some(h) = handover {
            annotations[l::HANDOVER] = json!(h);
        }
        let deploy = if serving == "dra" {
            l::DEPLOY_DRA_DRIVER
        } else {
            l::DEPLOY_DEVICE_PLUGIN
        };
        serde_json::from_value(
            json!({"metadata": {"name": name, "annotations": annotations,
            "labels": {l::GPU_PRESENT: "true", l::ALLOCATION_MODE: wanted, deploy: "true",
                       l::GPU_SETUP_COMPLETE: ready.to_string()}}}),
        )
        .unwrap()
    }

    #[test]
    fn each_node_not_served_by_the_plane_it_wants_says_its_step_and_what_holds_it() {
        let draining = r#"{"from":"dra","to":"device-plugin","phase":"Draining","since":100}"#;
        let waiting =
            r#"{"from":"dra","to":"device-plugin","phase":"WaitingForPlane","since":150}"#;
        let rolled = r#"{"from":"device-plugin","to":"dra","phase":"RolledBack","since":90,
            "rollback":{"reason":"the device-plugin plane was not ready within 600s","generation":3}}"#;
        let cluster = Cluster {
            nodes: vec![
                node("a", "dra", "device-plugin", true, Some(draining)),
                node("b", "device-plugin", "device-plugin", false, Some(waiting)),
                node("c", "dra", "device-plugin", true, None),
                node("d", "dra", "dra", true, None),
                node("f", "dra", "dra", false, None),
                node("e", "dra", "device-plugin", true, Some(rolled)),
            ],
            claims: vec![serde_json::from_value(json!({"metadata": {"name": "c1", "namespace": "ns"}, "spec": {},
                "status": {"allocation": {"devices": {"results": [
                    {"request": "r", "driver": "gpu.nvidia.com", "pool": "a", "device": "gpu-0"}]}}}})).unwrap()],
            pods: vec![serde_json::from_value(json!({"metadata": {"name": "trainer", "namespace": "ns"},
                "spec": {"nodeName": "a", "containers": [], "resourceClaims": [{"name": "g", "resourceClaimName": "c1"}]}}))
                .unwrap()],
            ..Cluster::default()
        };
        let p = progress(&cluster);
        assert_eq!((p.done, p.nodes), (2, 6));
        assert_eq!(p.not_ready, ["f"]);
        let steps: Vec<(&str, Step)> = p
            .pending
            .iter()
            .map(|s| (s.node.as_str(), s.step))
            .collect();
        assert_eq!(
            steps,
            [
                ("a", Step::Draining),
                ("b", Step::WaitingForPlane),
                ("c", Step::Queued),
                ("e", Step::RolledBack)
            ]
        );
        assert_eq!(p.pending[0].blocked_by, ["pod ns/trainer holds a dra GPU"]);
        assert_eq!(
            p.pending[1].from.as_deref(),
            Some("dra"),
            "the plane it leaves"
        );
        assert!(p.pending[3].blocked_by[0].contains("not ready within 600s"));
        assert_eq!(
            summary(&p),
            "2 of 6 GPU nodes served by the plane they want (device-plugin 4, dra 2); 2 handing over, 1 queued, 1 rolled back (not ready: f)"
        );
        let rows = table_rows(&p, 130);
        assert_eq!(rows[0][4].text, "30s");
        assert_eq!(rows[2][4].text, "-");
    }

    #[test]
    fn a_cluster_whose_nodes_are_all_served_by_the_plane_they_want_is_complete() {
        let cluster = Cluster {
            nodes: vec![
                node("a", "dra", "dra", true, None),
                node("b", "device-plugin", "device-plugin", true, None),
            ],
            ..Cluster::default()
        };
        let p = progress(&cluster);
        assert!(p.complete());
        assert_eq!(
            summary(&p),
            "2 of 2 GPU nodes served by the plane they want (device-plugin 1, dra 1): the migration is complete"
        );
    }
}
