//! What a reconcile reads besides its node: the caches of GPUClusters, nodes and validator pods,
//! whether a ClusterPolicy exists, the hand-over slots this process booked, and the plane-policy
//! rules parsed once per spec.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use api::contract::{GPU_CLUSTER_NAME, labels as l, objects as o};
use api::driver_upgrade::{DriverUpgrade, UpgradePhase};
use api::handover::Handover;
use api::{AllocationMode, GPUCluster};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;
use kube::api::PartialObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};

use super::Settings;
use super::metrics::Metrics;
use crate::events::{self, QueueReason, UpgradeQueue};
use crate::plan::{Cluster, ReadyPlanes, Rule};

/// Which GPUCluster spec a set of parsed rules came from: its uid and generation.
type RulesOf = (Option<String>, Option<i64>);

pub(super) struct Context {
    pub(super) client: kube::Client,
    /// The same API without the client's own retries, for evictions (see
    /// [`service::kube_client_without_retries`]).
    pub(super) evictions: kube::Client,
    pub(super) settings: Settings,
    pub(super) gpu_clusters: Store<GPUCluster>,
    pub(super) nodes: Store<PartialObjectMeta<Node>>,
    /// Pods of both planes' validators (`app=nvidia-operator-validator`), any namespace.
    pub(super) validators: Store<Pod>,
    /// Whether a `ClusterPolicy` exists (known before the first node is planned).
    pub(super) cluster_policy: tokio::sync::watch::Receiver<Option<bool>>,
    /// Nodes this process started handing over that the node cache may not show yet; held while
    /// a start is decided, so two reconciles never take the last slot together.
    pub(super) started: tokio::sync::Mutex<BTreeSet<String>>,
    /// Why no plane serves each node this process told about in a `NoGPUPlane` Event, so it is
    /// told once per change, not once per reconcile.
    pub(super) no_plane_told: std::sync::Mutex<BTreeMap<String, String>>,
    /// Why each node's driver upgrade waits, as last told in an Event (told once per change).
    pub(super) queue_told: std::sync::Mutex<BTreeMap<String, String>>,
    /// The GPUCluster's plane-policy rules, parsed once per spec (uid and generation), so a bad
    /// rule is parsed and logged once per change, not once per node reconcile.
    pub(super) rules: std::sync::Mutex<Option<(RulesOf, Vec<Rule>)>>,
    pub(super) events: service::events::EventPublisher,
    pub(super) metrics: Metrics,
}

impl Context {
    /// The `NoGPUPlane` Event for `node`, when why no plane serves it changed since last told.
    pub(super) fn no_plane_news(
        &self,
        node: &str,
        no_plane: Option<&api::coverage::NoPlane>,
    ) -> Option<kube::runtime::events::Event> {
        let mut told = self.no_plane_told.lock().unwrap_or_else(|e| e.into_inner());
        let live = |name: &str| self.nodes.get(&ObjectRef::new(name)).is_some();
        if tell_once(&mut told, node, no_plane.map(|n| &n.why), live) {
            no_plane.map(events::no_plane)
        } else {
            None
        }
    }

    /// Whether to tell why `node`'s driver upgrade waits (`None`: it does not): once per change
    /// of reason, so a node waiting for minutes is not an Event every round.
    pub(super) fn queue_news(&self, node: &str, queue: Option<&UpgradeQueue>) -> bool {
        let why = queue.map(|q| match q {
            UpgradeQueue::Full { .. } => "full".to_owned(),
            UpgradeQueue::Stopped { node } => format!("stopped by {node}"),
            UpgradeQueue::HandingOver => "handing over".to_owned(),
        });
        let mut told = self.queue_told.lock().unwrap_or_else(|e| e.into_inner());
        let live = |name: &str| self.nodes.get(&ObjectRef::new(name)).is_some();
        tell_once(&mut told, node, why.as_ref(), live)
    }

    pub(super) fn gpu_cluster(&self) -> Option<Arc<GPUCluster>> {
        self.gpu_clusters
            .state()
            .into_iter()
            .find(|gc| gc.name_any() == GPU_CLUSTER_NAME)
    }

    pub(super) fn cluster(&self, gpu_cluster: Option<&GPUCluster>) -> Cluster {
        Cluster {
            gpu_cluster: gpu_cluster.is_some(),
            cluster_policy: self.cluster_policy.borrow().unwrap_or(false),
            gpu_cluster_device_plugin: gpu_cluster.is_some_and(|gc| gc.spec.device_plugin.enabled),
            default_mode: self.settings.default_mode,
            driver_auto_upgrade: self.settings.driver_auto_upgrade,
            rules: self.rules(gpu_cluster),
        }
    }

    fn rules(&self, gpu_cluster: Option<&GPUCluster>) -> Vec<Rule> {
        let Some(gc) = gpu_cluster else {
            return Vec::new();
        };
        let of = (gc.uid(), gc.metadata.generation);
        let mut cached = self.rules.lock().unwrap_or_else(|e| e.into_inner());
        match &*cached {
            Some((parsed_of, rules)) if *parsed_of == of => rules.clone(),
            _ => {
                let rules: Vec<Rule> = gc
                    .spec
                    .plane_policy
                    .rules
                    .iter()
                    .filter_map(|rule| {
                        Rule::new(rule)
                            .inspect_err(
                                |e| tracing::warn!(error = %e, "plane-policy rule skipped"),
                            )
                            .ok()
                    })
                    .collect();
                *cached = Some((of, rules.clone()));
                rules
            }
        }
    }

    /// Planes whose validator pod is Ready on `node`.
    pub(super) fn ready_planes(&self, node: &str) -> ReadyPlanes {
        let mut ready = ReadyPlanes::default();
        for pod in self.validators.state() {
            if pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) != Some(node)
                || pod.metadata.deletion_timestamp.is_some()
                || !is_ready(&pod)
            {
                continue;
            }
            match validator_plane(&pod) {
                AllocationMode::Dra => ready.dra = true,
                AllocationMode::DevicePlugin => ready.device_plugin = true,
            }
        }
        ready
    }

    /// Whether a hand-over of `node` may start now: fewer than `max_unavailable` other nodes
    /// are out of service (between planes, or in a driver upgrade) and no rollback of
    /// `generation` paused the rollout. `started` holds the nodes whose start is not in the store
    /// yet. Keeps the in-progress gauge.
    pub(super) fn admission(
        &self,
        node: &str,
        started: &BTreeSet<String>,
        max_unavailable: u32,
        generation: i64,
    ) -> Result<(), QueueReason> {
        let out = self.out_of_service(node, started, generation);
        self.metrics.set_handovers_in_progress(out.handovers);
        if let Some(node) = out.rolled_back {
            return Err(QueueReason::Paused { node });
        }
        if out.nodes >= max_unavailable as usize {
            return Err(QueueReason::Full {
                in_progress: out.nodes,
                max_unavailable,
            });
        }
        Ok(())
    }

    /// Whether a driver upgrade of `node` may start now: fewer than `max_unavailable` other
    /// nodes are out of service and no node's driver upgrade failed.
    pub(super) fn upgrade_admission(
        &self,
        node: &str,
        started: &BTreeSet<String>,
        max_unavailable: u32,
    ) -> Result<(), UpgradeQueue> {
        let out = self.out_of_service(node, started, i64::MIN);
        if let Some(node) = out.failed_upgrade {
            return Err(UpgradeQueue::Stopped { node });
        }
        if out.nodes >= max_unavailable as usize {
            return Err(UpgradeQueue::Full {
                out: out.nodes,
                max_unavailable,
            });
        }
        Ok(())
    }

    /// Nodes other than `node` out of service now, from the node store and `started`.
    fn out_of_service(&self, node: &str, started: &BTreeSet<String>, generation: i64) -> Out {
        let mut out = Out::default();
        let mut names: BTreeSet<String> = started.clone();
        for other in self.nodes.state() {
            let name = other.name_any();
            let annotations = other.annotations();
            if let Some(h) = annotations
                .get(l::HANDOVER)
                .and_then(|v| Handover::parse(v))
            {
                if h.pinned(generation).is_some() && name != node {
                    out.rolled_back.get_or_insert(name.clone());
                }
                if h.phase.in_progress() {
                    out.handovers += 1;
                    names.insert(name.clone());
                }
            }
            if let Some(u) = annotations
                .get(l::DRIVER_UPGRADE)
                .and_then(|v| DriverUpgrade::parse(v))
            {
                if u.phase == UpgradePhase::Failed && name != node {
                    out.failed_upgrade.get_or_insert(name.clone());
                }
                if u.takes_node_out() {
                    names.insert(name);
                }
            }
        }
        names.remove(node);
        out.nodes = names.len();
        out
    }
}

/// Nodes out of service, as [`Context::out_of_service`] counts them.
#[derive(Default)]
struct Out {
    /// Nodes out, hand-overs and driver upgrades together.
    nodes: usize,
    /// Of them, nodes between planes (this node included).
    handovers: usize,
    /// A node rolled back under the generation asked about.
    rolled_back: Option<String>,
    /// A node whose driver upgrade failed.
    failed_upgrade: Option<String>,
}

/// Whether the pod's Ready condition is true.
pub(super) fn is_ready(pod: &Pod) -> bool {
    pod.status
        .iter()
        .flat_map(|s| s.conditions.iter().flatten())
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// The plane a validator pod proves: ours for DRA, any other `nvidia-operator-validator`
/// (ours or a ClusterPolicy's) for the device plugin.
fn validator_plane(pod: &Pod) -> AllocationMode {
    let dra = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.kind == "DaemonSet" && o.name == o::VALIDATOR_DAEMONSET);
    if dra {
        AllocationMode::Dra
    } else {
        AllocationMode::DevicePlugin
    }
}

/// Whether to tell about `node` for reason `why` (`None`: nothing to tell): once per change of
/// reason. `told` keeps the last reason told per node; nodes `live` no longer
/// knows are dropped from it whenever a new reason is recorded, so it never outgrows the cluster.
fn tell_once(
    told: &mut BTreeMap<String, String>,
    node: &str,
    why: Option<&String>,
    live: impl Fn(&str) -> bool,
) -> bool {
    match why {
        None => {
            told.remove(node);
            false
        }
        Some(why) if told.get(node) == Some(why) => false,
        Some(why) => {
            told.retain(|name, _| name == node || live(name));
            told.insert(node.to_owned(), why.clone());
            true
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_plane_is_told_once_per_reason_and_deleted_nodes_are_forgotten() {
        let mut told = BTreeMap::new();
        let why = |s: &str| Some(s.to_owned());
        assert!(tell_once(&mut told, "a", why("opted out").as_ref(), |_| {
            true
        }));
        assert!(!tell_once(
            &mut told,
            "a",
            why("opted out").as_ref(),
            |_| true
        ));
        assert!(tell_once(
            &mut told,
            "a",
            why("operands off").as_ref(),
            |_| true
        ));
        assert!(!tell_once(&mut told, "a", None, |_| true));
        assert!(tell_once(&mut told, "a", why("opted out").as_ref(), |_| {
            true
        }));
        // Node a is deleted; the next news of another node drops it.
        assert!(tell_once(&mut told, "b", why("opted out").as_ref(), |n| n != "a"));
        assert_eq!(told.keys().collect::<Vec<_>>(), ["b"]);
    }
}
