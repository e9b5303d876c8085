//! Node counts for the status and for DaemonSet readiness.

use std::collections::BTreeMap;

use api::AllocationMode;
use api::contract::labels as l;
use api::gpucluster::NodeCounts;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Node;
use kube::api::{ListParams, PartialObjectMeta};
use kube::{Api, ResourceExt};

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

/// Counts GPU nodes, those in each mode, those with no allocation mode yet, and for each of
/// `selectors` the GPU nodes it selects.
pub(super) async fn node_counts(
    ctx: &Context,
    ready: ReadyPlugins,
    selectors: &[BTreeMap<String, String>],
) -> Result<(NodeCounts, i32, Vec<i32>), Error> {
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
            unlabelled += i32::from(!node.labels().contains_key(l::ALLOCATION_MODE));
            for (count, sel) in selected.iter_mut().zip(selectors) {
                *count += i32::from(status::selects(sel, node.labels()));
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
    Ok((counts, unlabelled, selected))
}
