//! Carrying out a hand-over step on the node and its pods (cordon, evictions, uncordon through
//! [`super::node_ops`]), what the hand-over record becomes, and the step's accounting: its metric
//! and the node's hand-over slot.

use std::collections::BTreeSet;

use api::AllocationMode;
use api::handover::{Handover, Phase};
use k8s_openapi::api::core::v1::Pod;

use super::context::Context;
use super::error::Error;
use super::node_ops::{self, Eviction};
use super::write::patch_params;
use crate::handover::Step;

/// Counts the step, keeps the held-on-DRA gauge, and books or frees the node's slot
/// (`started`: the slot lock, when this reconcile took it; `upgrade_starts`: a driver upgrade
/// starts this round).
pub(super) async fn account(
    ctx: &Context,
    name: &str,
    step: &Step,
    state: Option<&Handover>,
    started: Option<tokio::sync::MutexGuard<'_, BTreeSet<String>>>,
    upgrade_starts: bool,
) {
    if let Some(label) = step_metric(step) {
        ctx.metrics.count_step(label);
    }
    let held_on_dra =
        matches!(step, Step::Drain { .. }) && state.is_some_and(|h| h.from == AllocationMode::Dra);
    ctx.metrics.set_held_on_dra(name, held_on_dra);
    if let Some(mut set) = started {
        if matches!(step, Step::Start { .. }) || upgrade_starts {
            set.insert(name.to_owned());
        } else {
            set.remove(name);
        }
    } else if matches!(
        step,
        Step::Complete { .. }
            | Step::Cancel { .. }
            | Step::GiveUp { .. }
            | Step::Idle
            | Step::Release
    ) {
        ctx.started.lock().await.remove(name);
    }
}

/// The error of a failed cordon step (`what`: reading, cordoning, uncordoning) on `node`.
pub(super) fn cordon_err(what: &'static str, node: &str) -> impl FnOnce(kube::Error) -> Error {
    let node = node.to_owned();
    move |source| Error::Cordon { what, node, source }
}

/// Does what a hand-over step asks of the node and its pods (cordon, evictions, uncordon);
/// returns the hand-over record to write (`record` unless the step starts a hand-over) and
/// whether a PodDisruptionBudget refused an eviction.
pub(super) async fn carry_out(
    ctx: &Context,
    name: &str,
    step: &Step,
    state: Option<&Handover>,
    holding: &[Pod],
    record: Option<Option<Handover>>,
) -> Result<(Option<Option<Handover>>, bool), Error> {
    let pp = patch_params();
    let mut record = record;
    let mut blocked = false;
    match step {
        Step::Start { from, to } => {
            // Recorded first, cordoned after: a cordon whose record failed to land would read
            // as an admin's on the next try and never be lifted.
            let cordoned = !node_ops::is_cordoned(&ctx.client, name)
                .await
                .map_err(cordon_err("reading", name))?;
            record = Some(Some(Handover {
                from: *from,
                to: *to,
                phase: Phase::Draining,
                since: jiff::Timestamp::now().as_second(),
                cordoned,
                rollback: None,
            }));
        }
        Step::Drain { evict } => {
            let ours = state.is_some_and(|h| h.cordoned);
            blocked = drain(ctx, name, ours, holding, *evict).await?;
        }
        Step::Complete { uncordon: true, .. }
        | Step::Cancel { uncordon: true }
        | Step::GiveUp { uncordon: true, .. } => {
            node_ops::uncordon(&ctx.client, name, &pp)
                .await
                .map_err(cordon_err("uncordoning", name))?;
        }
        _ => {}
    }
    Ok((record, blocked))
}

/// One round of a drain: keeps the node cordoned (`ours`: the drain's own cordon, which may not
/// have landed yet) and evicts the pods `holding` its GPUs (`evict`; DaemonSet pods are never
/// evicted). Returns whether a PodDisruptionBudget refused an eviction.
pub(super) async fn drain(
    ctx: &Context,
    name: &str,
    ours: bool,
    holding: &[Pod],
    evict: bool,
) -> Result<bool, Error> {
    // Read before writing, so a node draining for minutes is not patched every round.
    if ours
        && !node_ops::is_cordoned(&ctx.client, name)
            .await
            .map_err(cordon_err("reading", name))?
    {
        node_ops::cordon(&ctx.client, name, &patch_params())
            .await
            .map_err(cordon_err("cordoning", name))?;
    }
    let mut blocked = false;
    for pod in holding
        .iter()
        .filter(|p| evict && !api::pods::is_daemonset_pod(p))
    {
        let result = node_ops::evict(&ctx.evictions, pod)
            .await
            .map_err(|source| Error::Drain {
                node: name.to_owned(),
                source,
            })?;
        let pod_name = crate::names::pod_name(pod);
        match &result {
            Eviction::Evicted => {
                tracing::info!(node = %name, pod = %pod_name, "evicted");
                ctx.metrics.count_eviction("evicted");
            }
            Eviction::Blocked(why) => {
                blocked = true;
                tracing::info!(node = %name, pod = %pod_name, why, "eviction blocked");
                ctx.metrics.count_eviction("blocked");
            }
            Eviction::Gone => {}
        }
    }
    Ok(blocked)
}

/// What the hand-over annotation becomes: `Some(Some(h))` sets it, `Some(None)` removes it,
/// `None` leaves it. A start's record is made once the node is cordoned.
pub(super) fn handover_record(step: &Step) -> Option<Option<Handover>> {
    match step {
        Step::Switch(h) | Step::RollBack(h) | Step::Reverse(h) => Some(Some(h.clone())),
        Step::Complete { record, .. } => Some(record.clone()),
        Step::GiveUp { record, .. } => Some(Some(record.clone())),
        Step::Cancel { .. } | Step::Release => Some(None),
        _ => None,
    }
}

fn step_metric(step: &Step) -> Option<&'static str> {
    Some(match step {
        Step::Start { .. } => "started",
        Step::Switch(_) => "switched",
        Step::Complete { record: None, .. } => "completed",
        Step::Complete {
            record: Some(_), ..
        } => "rollback_completed",
        Step::RollBack(_) => "rolled_back",
        Step::Reverse(_) => "reversed",
        Step::Cancel { .. } => "cancelled",
        Step::GiveUp { .. } => "drain_timed_out",
        Step::Release => "released",
        Step::Idle | Step::Queued | Step::Drain { .. } | Step::Wait { .. } => return None,
    })
}
