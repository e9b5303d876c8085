//! A node's driver upgrade, carried out: what the step machine (`crate::driver_upgrade`) needs
//! read from the API (pods holding the GPUs, the driver's clients, driver container pods), and
//! what its step asks of the node (cordon, evictions, uncordon) and of the node's labels and
//! annotations.

use std::collections::{BTreeMap, BTreeSet};

use api::AllocationMode;
use api::contract::{labels as l, objects as o};
use api::driver_upgrade::{DriverUpgrade, UpgradePhase, state};
use api::gpucluster::MigrationSpec;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::ResourceExt;
use kube::api::ListParams;

use super::context::Context;
use super::error::Error;
use super::execute::{cordon_err, drain};
use super::node_ops;
use crate::claims;
use crate::driver_upgrade::{self, Inputs, Operands, Step};
use crate::events::UpgradeQueue;
use crate::names::pod_name;

/// DaemonSets whose pods hold the driver open, the plugins aside: paused (and awaited) before
/// the driver changes.
const DRIVER_CLIENTS: [&str; 4] = [
    o::VALIDATOR_DAEMONSET,
    o::DCGM_DAEMONSET,
    o::DCGM_EXPORTER_DAEMONSET,
    o::OPERATOR_VALIDATOR_DAEMONSET,
];
/// The plugins' DaemonSets: paused last.
const PLUGINS: [&str; 2] = [o::KUBELET_PLUGIN_DAEMONSET, o::DEVICE_PLUGIN_DAEMONSET];

/// A driver upgrade step decided and carried out, and what the node's write must add.
#[derive(Debug)]
pub(super) struct Outcome {
    /// The step.
    pub step: Step,
    /// What the driver's client operands do.
    pub operands: Operands,
    /// Label changes (the state label): `Some` sets, `None` removes.
    pub labels: BTreeMap<String, Option<String>>,
    /// Annotation changes (the record, a consumed request, a released driver).
    pub annotations: BTreeMap<String, Option<String>>,
    /// Cordon once the record is written (a start on a schedulable node).
    pub cordon_after_write: bool,
    /// A PodDisruptionBudget refused an eviction.
    pub evictions_blocked: bool,
    /// Why a wanted upgrade waits.
    pub queue: Option<UpgradeQueue>,
    /// Pods that held the node's GPUs.
    pub holders: usize,
}

impl Outcome {
    fn idle() -> Self {
        Outcome {
            step: Step::Idle,
            operands: Operands::Leave,
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
            cordon_after_write: false,
            evictions_blocked: false,
            queue: None,
            holders: 0,
        }
    }
}

/// Whether the node asks for a driver upgrade (an admin's request, a driver waiting to load, or
/// the state label set to `upgrade-required`).
pub(super) fn wanted(
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
) -> bool {
    annotations
        .get(l::DRIVER_UPGRADE_REQUESTED)
        .is_some_and(|v| v == "true")
        || annotations
            .get(l::DRIVER_WAIT_FOR_SAFE_LOAD)
            .is_some_and(|v| !v.is_empty())
        || labels.get(l::DRIVER_UPGRADE_STATE).map(String::as_str) == Some(state::UPGRADE_REQUIRED)
}

/// The node's recorded upgrade.
pub(super) fn record(annotations: &BTreeMap<String, String>) -> Option<DriverUpgrade> {
    annotations
        .get(l::DRIVER_UPGRADE)
        .and_then(|v| DriverUpgrade::parse(v))
}

/// The plane whose plugin the node carries (paused or not).
fn plane(labels: &BTreeMap<String, String>) -> Option<AllocationMode> {
    let set = |key| {
        labels
            .get(key)
            .is_some_and(|v| !v.is_empty() && v != "false")
    };
    if set(l::DEPLOY_DRA_DRIVER) {
        Some(AllocationMode::Dra)
    } else if set(l::DEPLOY_DEVICE_PLUGIN) {
        Some(AllocationMode::DevicePlugin)
    } else {
        None
    }
}

/// What the node needs for its upgrade this round.
pub(super) struct Request<'a> {
    pub name: &'a str,
    pub labels: &'a BTreeMap<String, String>,
    pub annotations: &'a BTreeMap<String, String>,
    /// The node's recorded upgrade ([`record`]).
    pub record: Option<DriverUpgrade>,
    /// The node asks for an upgrade ([`wanted`]).
    pub wanted: bool,
    /// A `GPUCluster` exists and is not being deleted.
    pub served: bool,
    /// Planes ready on the node (validator passed, every GPU offered).
    pub ready: crate::plan::ReadyPlanes,
    pub migration: &'a MigrationSpec,
    /// The node's hand-over is under way (or starts this round).
    pub handing_over: bool,
    /// Nodes whose start is not in the store yet (locked), when this round may start one.
    pub started: Option<&'a BTreeSet<String>>,
}

/// Decides the node's driver upgrade step and carries out what it asks of the node and its
/// pods; the label and annotation changes are left for the node's write.
pub(super) async fn run(ctx: &Context, r: &Request<'_>) -> Result<Outcome, Error> {
    // Where a ClusterPolicy exists its upgrade controller runs driver upgrades.
    if ctx.cluster_policy.borrow().unwrap_or(false) {
        return Ok(Outcome::idle());
    }
    let (record, wanted) = (r.record.clone(), r.wanted);
    if record.is_none() && !wanted {
        ctx.metrics.set_upgrade_state(r.name, None);
        return Ok(Outcome::idle());
    }
    let plane = plane(r.labels);
    let served = r.served && crate::plan::is_gpu_node(r.labels) && plane.is_some();
    let phase = record.as_ref().map(|u| u.phase);

    let holding = match (phase, plane) {
        // DaemonSet pods stay, as with `kubectl drain --ignore-daemonsets`: ours (the validator
        // and exporter hold GPUs too) are the clients paused next.
        (Some(UpgradePhase::Draining), Some(plane)) => {
            claims::holding_pods(&ctx.client, r.name, plane)
                .await
                .map_err(|source| Error::Drain {
                    node: r.name.to_owned(),
                    source,
                })?
                .into_iter()
                .filter(|p| !api::pods::is_daemonset_pod(p))
                .collect()
        }
        _ => Vec::new(),
    };
    let pods = if phase == Some(UpgradePhase::DriverRestart) {
        driver_pods(ctx, r.name).await?
    } else {
        DriverPods::default()
    };
    let queue = if r.handing_over {
        Some(UpgradeQueue::HandingOver)
    } else {
        r.started.and_then(|set| {
            ctx.upgrade_admission(r.name, set, r.migration.max_unavailable)
                .err()
        })
    };
    let holder_names: Vec<String> = holding.iter().map(pod_name).collect();
    let step = driver_upgrade::step(&Inputs {
        record: record.as_ref(),
        wanted,
        retry: record.is_some()
            && r.labels.get(l::DRIVER_UPGRADE_STATE).map(String::as_str)
                == Some(state::UPGRADE_REQUIRED),
        driver_waiting: r
            .annotations
            .get(l::DRIVER_WAIT_FOR_SAFE_LOAD)
            .is_some_and(|v| !v.is_empty()),
        holders: &holder_names,
        clients: &pods.clients,
        plugins: &pods.plugins,
        driver_ready: pods.driver_unready.is_empty(),
        ready: plane.is_some_and(|p| r.ready.has(p)),
        now: jiff::Timestamp::now().as_second(),
        drain: r.migration.drain,
        deadline_secs: i64::from(r.migration.progress_deadline_seconds),
        may_start: r.started.is_some() && queue.is_none(),
        served,
    });

    let mut out = Outcome {
        queue,
        holders: holding.len(),
        ..Outcome::idle()
    };
    let pp = super::write::patch_params();
    let mut after = driver_upgrade::record_after(&step);
    match &step {
        Step::Start { cordoned } => {
            let schedulable = !node_ops::is_cordoned(&ctx.client, r.name)
                .await
                .map_err(cordon_err("reading", r.name))?;
            let now = jiff::Timestamp::now().as_second();
            after = Some(Some(DriverUpgrade::at(
                UpgradePhase::Draining,
                now,
                *cordoned || schedulable,
            )));
            out.cordon_after_write = schedulable;
        }
        Step::Drain { evict } => {
            let ours = record.as_ref().is_some_and(|u| u.cordoned);
            out.evictions_blocked = drain(ctx, r.name, ours, &holding, *evict).await?;
        }
        Step::Complete { uncordon: true }
        | Step::Cancel { uncordon: true, .. }
        | Step::Fail { uncordon: true, .. } => {
            node_ops::uncordon(&ctx.client, r.name, &pp)
                .await
                .map_err(cordon_err("uncordoning", r.name))?;
        }
        _ => {}
    }
    if matches!(step, Step::Unblock | Step::Cancel { unblock: true, .. }) {
        out.annotations
            .insert(l::DRIVER_WAIT_FOR_SAFE_LOAD.to_owned(), None);
    }
    if matches!(step, Step::Complete { .. })
        && r.annotations.contains_key(l::DRIVER_UPGRADE_REQUESTED)
    {
        out.annotations
            .insert(l::DRIVER_UPGRADE_REQUESTED.to_owned(), None);
    }
    let kept = match &after {
        Some(a) => a.clone(),
        None => record.clone(),
    };
    if let Some(a) = after {
        out.annotations
            .insert(l::DRIVER_UPGRADE.to_owned(), a.map(|u| u.to_annotation()));
    }
    if let Some(want) = driver_upgrade::state_after(&step, kept.as_ref())
        && r.labels.get(l::DRIVER_UPGRADE_STATE).map(String::as_str) != want
    {
        out.labels
            .insert(l::DRIVER_UPGRADE_STATE.to_owned(), want.map(str::to_owned));
    }
    out.operands = driver_upgrade::operands(&step, record.as_ref(), kept.as_ref());
    let shown = match (&step, &kept) {
        (Step::Queued, _) => Some(state::UPGRADE_REQUIRED),
        (_, Some(u)) => Some(u.phase.state_label()),
        _ => None,
    };
    ctx.metrics.set_upgrade_state(r.name, shown);
    if !matches!(
        step,
        Step::Idle
            | Step::Queued
            | Step::Drain { .. }
            | Step::WaitForClients
            | Step::WaitForPlugin
            | Step::WaitForDriver
            | Step::Validate
    ) {
        ctx.metrics.count_upgrade_step(step.name());
        tracing::info!(node = %r.name, step = step.name(), "driver upgrade");
    }
    out.step = step;
    Ok(out)
}

/// What runs on a node whose driver's clients are paused.
#[derive(Default)]
struct DriverPods {
    /// Client pods other than the plugins', as `namespace/name`.
    clients: Vec<String>,
    /// The plugins' pods.
    plugins: Vec<String>,
    /// Driver container pods not ready.
    driver_unready: Vec<String>,
}

/// The driver's client pods still on the node, and its driver container pods not ready.
async fn driver_pods(ctx: &Context, node: &str) -> Result<DriverPods, Error> {
    let pods: Api<Pod> = Api::all(ctx.client.clone());
    let list = pods
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await
        .map_err(|source| Error::Drain {
            node: node.to_owned(),
            source,
        })?;
    let mut found = DriverPods::default();
    for pod in list.items.iter().filter(|p| api::pods::is_live(p)) {
        let owner = |names: &[&str]| {
            pod.owner_references()
                .iter()
                .any(|o| o.kind == "DaemonSet" && names.contains(&o.name.as_str()))
        };
        if owner(&DRIVER_CLIENTS) {
            found.clients.push(pod_name(pod));
        } else if owner(&PLUGINS) {
            found.plugins.push(pod_name(pod));
        } else if pod.labels().get("app").map(String::as_str) == Some(l::DRIVER_POD_APP)
            && !super::context::is_ready(pod)
        {
            found.driver_unready.push(pod_name(pod));
        }
    }
    Ok(found)
}
