//! Node counts for the status and for DaemonSet readiness.

use std::collections::BTreeMap;

use api::AllocationMode;
use api::contract::labels as l;
use api::driver_upgrade::DriverUpgrade;
use api::gpucluster::{MigrationStatus, NodeCounts};
use api::handover::Handover;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Node;
use kube::api::{ListParams, PartialObjectMeta};
use kube::runtime::watcher::{self, watcher};
use kube::runtime::{PredicateConfig, WatchStreamExt};
use kube::{Api, ResourceExt};

use crate::coverage::{self, Unserved};
use crate::status;

use super::{Context, Error, api_err};

/// A DaemonSet's pod `nodeSelector`.
pub(super) fn node_selector(ds: &DaemonSet) -> BTreeMap<String, String> {
    ds.spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.node_selector.clone())
        .unwrap_or_default()
}

/// Nodes whose plane's plugin pod is ready, as the plugins' DaemonSets count them.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct ReadyPlugins {
    /// `nvidia-dra-driver-kubelet-plugin` pods ready.
    pub(super) dra: i32,
    /// `nvidia-device-plugin-daemonset` pods ready.
    pub(super) device_plugin: i32,
}

/// What one pass over the GPU nodes found.
pub(super) struct NodeSurvey {
    /// GPU nodes, in each mode, with a ready plugin.
    pub(super) counts: NodeCounts,
    /// GPU nodes with no allocation mode yet.
    pub(super) unlabelled: i32,
    /// For each selector given, the GPU nodes it selects.
    pub(super) selected: Vec<i32>,
    /// Hand-overs between planes the nodes record.
    pub(super) migration: MigrationStatus,
    /// GPU nodes no plane serves, and why.
    pub(super) unserved: Unserved,
    /// Nodes held on DRA by their claims, with when the hold began.
    pub(super) held_on_dra: Vec<(String, i64)>,
}

/// Nodes listed in `status.migration.inProgress` at most.
const LISTED_HANDOVERS: usize = 50;

/// Counts GPU nodes, those in each mode, those with no allocation mode yet, and for each of
/// `selectors` the GPU nodes it selects; collects hand-overs in progress and rollbacks of
/// `generation`, nodes held on DRA, and nodes no plane serves (`device_plugin_served`: something
/// serves the device-plugin plane).
pub(super) async fn node_counts(
    ctx: &Context,
    ready: ReadyPlugins,
    selectors: &[BTreeMap<String, String>],
    generation: i64,
    device_plugin_served: bool,
) -> Result<NodeSurvey, Error> {
    let mut migration = MigrationStatus::default();
    let mut unserved = Unserved::default();
    let mut held_on_dra = Vec::new();
    let nodes: Api<PartialObjectMeta<Node>> = Api::all(ctx.client.clone());
    let selector = format!("{}=true", l::GPU_PRESENT);
    let (mut gpu, mut dra, mut device_plugin) = (0usize, 0usize, 0usize);
    let mut selected = vec![0i32; selectors.len()];
    let mut unlabelled = 0i32;
    let mut token: Option<String> = None;
    // Pages keep the operator's memory flat on large clusters; only counts are kept.
    loop {
        let mut params = ListParams::default().labels(&selector).limit(500);
        if let Some(t) = token.take() {
            params = params.continue_token(&t);
        }
        let page = nodes
            .list_metadata(&params)
            .await
            .map_err(api_err("listing GPU nodes"))?;
        gpu += page.items.len();
        for node in &page.items {
            match api::coverage::unserved(node.labels(), device_plugin_served) {
                Some(no_plane) => unserved.add(&node.name_any(), no_plane.why),
                None => {
                    unlabelled += i32::from(!node.labels().contains_key(l::ALLOCATION_MODE));
                }
            }
            for (count, sel) in selected.iter_mut().zip(selectors) {
                *count += i32::from(status::selects(sel, node.labels()));
            }
            let handover = node
                .annotations()
                .get(l::HANDOVER)
                .and_then(|v| Handover::parse(v));
            if let Some(h) = handover.as_ref().filter(|h| coverage::held_on_dra(h)) {
                held_on_dra.push((node.name_any(), h.since));
            }
            match handover {
                Some(h) if h.phase.in_progress() => {
                    migration.in_progress.push(h.status(&node.name_any()));
                }
                Some(h) if h.pinned(generation).is_some() => {
                    migration.rolled_back.push(h.status(&node.name_any()));
                }
                _ => {}
            }
            if let Some(u) = node
                .annotations()
                .get(l::DRIVER_UPGRADE)
                .and_then(|v| DriverUpgrade::parse(v))
            {
                migration.driver_upgrades.push(u.status(&node.name_any()));
            }
        }
        let in_mode = |mode: AllocationMode| {
            page.items
                .iter()
                .filter(|n| {
                    n.labels().get(l::ALLOCATION_MODE).map(String::as_str) == Some(mode.as_str())
                })
                .count()
        };
        dra += in_mode(AllocationMode::Dra);
        device_plugin += in_mode(AllocationMode::DevicePlugin);
        match page.metadata.continue_.filter(|t| !t.is_empty()) {
            Some(next) => token = Some(next),
            None => break,
        }
    }
    let counts = NodeCounts {
        gpu: gpu.try_into().unwrap_or(i32::MAX),
        dra: dra.try_into().unwrap_or(i32::MAX),
        ready_dra: ready.dra,
        device_plugin: device_plugin.try_into().unwrap_or(i32::MAX),
        ready_device_plugin: ready.device_plugin,
    };
    // The API lists nodes by name, so the first ones listed are kept.
    migration.in_progress.truncate(LISTED_HANDOVERS);
    migration.driver_upgrades.truncate(LISTED_HANDOVERS);
    held_on_dra.truncate(LISTED_HANDOVERS);
    Ok(NodeSurvey {
        counts,
        unlabelled,
        selected,
        migration,
        unserved,
        held_on_dra,
    })
}

/// GPU nodes whose hand-over or driver-upgrade annotation changed (metadata only, nothing
/// cached): the status lists both, so each change re-runs the reconcile.
pub(super) fn handover_changes(
    client: &kube::Client,
) -> impl futures::Stream<Item = Result<PartialObjectMeta<Node>, watcher::Error>> + Send + 'static {
    let config = watcher::Config::default().labels(&format!("{}=true", l::GPU_PRESENT));
    watcher(Api::<PartialObjectMeta<Node>>::all(client.clone()), config)
        .default_backoff()
        .touched_objects()
        .predicate_filter(handover_hash, PredicateConfig::default())
}

fn handover_hash(node: &PartialObjectMeta<Node>) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    node.annotations().get(l::HANDOVER).hash(&mut hasher);
    node.annotations().get(l::DRIVER_UPGRADE).hash(&mut hasher);
    Some(hasher.finish())
}
