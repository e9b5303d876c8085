//! The controller: watches Nodes (metadata only) and the GPUCluster, plans each node's labels and
//! writes only what changed. This module holds the reconcile loop and its wiring; each step lives
//! in its own module: [`context`] (caches and what is remembered between reconciles),
//! [`readiness`] (does a ready plane offer every GPU), [`execute`] (a hand-over step carried out
//! with [`node_ops`]), [`write`] (the guarded patch), [`metrics`] and [`error`]. What to do is
//! decided by `crate::plan` and `crate::handover`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use api::contract::{cluster_policy, labels as l};
use api::driver_upgrade::UpgradePhase;
use api::handover::{Handover, Phase};
use api::{AllocationMode, GPUCluster};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::PartialObjectMeta;
use kube::runtime::controller::Action;
use kube::runtime::events::Reporter;
use kube::runtime::reflector::{self, ObjectRef, reflector};
use kube::runtime::watcher::{self, watcher};
use kube::runtime::{Controller, Predicate, PredicateConfig, WatchStreamExt, predicates};
use kube::{Api, Resource, ResourceExt};

use crate::claims;
use crate::driver_upgrade::Step as UpgradeStep;
use crate::events;
use crate::handover::{self, Step};
use crate::names;
use crate::plan::{self, DEFERRED_RECHECK, GpuClaims, Hold, NodeFacts};

mod context;
mod error;
mod execute;
mod metrics;
mod node_ops;
mod readiness;
mod upgrade;
mod write;

use context::Context;
pub use error::Error;
use execute::{account, carry_out, cordon_err, handover_record};
pub use metrics::Metrics;
use readiness::confirm_offers;
pub use write::patch_body;
use write::{patch_params, write_plan};

/// Field manager of every write the labeler makes.
pub const FIELD_MANAGER: &str = "gpu-operator-node-labeler";
/// How often a node queued for a hand-over, or waiting for its plane to offer every GPU before
/// its first readiness labels, is looked at again.
pub const HANDOVER_RECHECK: Duration = Duration::from_secs(5);
/// How often a node between planes is looked at again: the drain's progress, what the new plane
/// offers, the deadline. Only nodes in a hand-over (at most `maxUnavailable`) are polled this
/// often, so each step starts about a second after the one before it could finish.
pub const HANDOVER_STEP_RECHECK: Duration = Duration::from_secs(1);

/// Labeler settings from its command line.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    /// Mode for new GPU nodes when both CRs exist.
    pub default_mode: AllocationMode,
    /// The driver upgrade policy's auto-upgrade switch.
    pub driver_auto_upgrade: bool,
}

async fn reconcile(node: Arc<PartialObjectMeta<Node>>, ctx: Arc<Context>) -> Result<Action, Error> {
    ctx.metrics.count_reconcile();
    let name = node.name_any();
    let gpu_cluster = ctx.gpu_cluster();
    let cluster = ctx.cluster(gpu_cluster.as_deref());
    let migration = gpu_cluster
        .as_ref()
        .map(|gc| gc.spec.migration.clone())
        .unwrap_or_default();
    let generation = gpu_cluster
        .as_ref()
        .and_then(|gc| gc.metadata.generation)
        .unwrap_or(0);
    let (labels, annotations) = (node.labels(), node.annotations());
    let served = gpu_cluster
        .as_ref()
        .is_some_and(|gc| gc.metadata.deletion_timestamp.is_none());
    let state = annotations
        .get(l::HANDOVER)
        .and_then(|v| Handover::parse(v));
    let (ready, offers_pending) =
        confirm_offers(&ctx, &name, labels, ctx.ready_planes(&name)).await?;
    let mut facts = NodeFacts {
        claims: GpuClaims::Unknown,
        ready,
        pinned: state.as_ref().and_then(|h| h.pinned(generation)),
        hold: Hold::No,
        operands: Default::default(),
    };
    let mut plan = plan::plan_node(labels, annotations, &cluster, facts);

    // Hand-overs and driver upgrades: a start is decided under the lock, so slots are never
    // over-booked.
    let upgrade_record = upgrade::record(annotations);
    let handover_may_start = state.is_none() && plan.switch.is_some();
    let upgrade_wanted = upgrade::wanted(labels, annotations);
    let upgrade_may_start = upgrade_wanted
        && upgrade_record
            .as_ref()
            .is_none_or(|u| u.phase == UpgradePhase::Failed);
    let started = if handover_may_start || upgrade_may_start {
        Some(ctx.started.lock().await)
    } else {
        None
    };
    let admission = match &started {
        Some(set) if handover_may_start => {
            ctx.admission(&name, set, migration.max_unavailable, generation)
        }
        _ => Ok(()),
    };
    let holding = match &state {
        Some(h) if h.phase == Phase::Draining && plan.switch == Some((h.from, h.to)) => {
            claims::holding_pods(&ctx.client, &name, h.from)
                .await
                .map_err(|source| Error::Drain {
                    node: name.clone(),
                    source,
                })?
        }
        _ => Vec::new(),
    };
    let step = handover::step(&handover::Inputs {
        state: state.as_ref(),
        switch: plan.switch,
        ready: facts.ready,
        holders: &holding.iter().map(names::pod_name).collect::<Vec<_>>(),
        now: jiff::Timestamp::now().as_second(),
        drain: migration.drain,
        deadline_secs: i64::from(migration.progress_deadline_seconds),
        generation,
        // A node in a driver upgrade finishes it before it changes planes.
        may_start: admission.is_ok() && upgrade_record.is_none(),
        served,
    });
    let record = handover_record(&step);
    if let Some(Some(h)) = &record {
        facts.pinned = h.pinned(generation);
    }
    let upgrade = upgrade::run(
        &ctx,
        &upgrade::Request {
            name: &name,
            labels,
            annotations,
            record: upgrade_record,
            wanted: upgrade_wanted,
            served,
            ready: facts.ready,
            migration: &migration,
            handing_over: state.as_ref().is_some_and(|h| h.phase.in_progress())
                || matches!(step, Step::Start { .. }),
            started: started.as_deref().filter(|_| upgrade_may_start),
        },
    )
    .await?;
    facts.operands = upgrade.operands;
    if step == Step::Queued {
        facts.hold = Hold::WholePlane;
    } else if step.holds_old_plane() {
        facts.hold = Hold::Plugin;
    } else if step.moves_labels() {
        facts.claims = GpuClaims::None;
    }
    plan = plan::plan_node(labels, annotations, &cluster, facts);
    if let Some(plane) = plan.needs_claim_lookup {
        facts.claims = claims::on_node(&ctx.client, &name, plane).await;
        plan = plan::plan_node(labels, annotations, &cluster, facts);
    }

    let pp = patch_params();
    let (record, evictions_blocked) =
        carry_out(&ctx, &name, &step, state.as_ref(), &holding, record).await?;
    let cordon_after_write =
        matches!((&step, &record), (Step::Start { .. }, Some(Some(h))) if h.cordoned);
    if let Some(value) = record {
        plan.annotations
            .insert(l::HANDOVER.to_owned(), value.map(|h| h.to_annotation()));
    }
    add_upgrade_changes(&mut plan, &upgrade);

    let queue = admission.err();
    let reference = node.object_ref(&());
    let step_event = events::for_step(
        &step,
        state.as_ref(),
        plan.switch,
        holding.len(),
        queue.as_ref(),
        i64::from(migration.progress_deadline_seconds),
    );
    let after = plan.labels_after(labels);
    let no_plane = (cluster.any_plane_served() && plan::is_gpu_node(&after))
        .then(|| api::coverage::unserved(&after, cluster.serves(AllocationMode::DevicePlugin)))
        .flatten();
    let no_plane_event = ctx.no_plane_news(&name, no_plane.as_ref());
    // A queued upgrade is told once per reason it waits for.
    let queued = upgrade.step == UpgradeStep::Queued;
    let queue_news = ctx.queue_news(&name, upgrade.queue.as_ref().filter(|_| queued));
    let upgrade_event = events::for_upgrade(&upgrade.step, upgrade.holders, upgrade.queue.as_ref())
        .filter(|_| !queued || queue_news);
    for event in plan
        .findings
        .iter()
        .map(events::for_finding)
        .chain(step_event)
        .chain(upgrade_event)
        .chain(no_plane_event)
    {
        ctx.events.publish(&event, &reference).await;
    }
    let deferred = plan.is_deferred();
    if deferred {
        ctx.metrics.count_deferred();
    }
    if plan.has_changes() {
        let handover_value = plan.annotations.get(l::HANDOVER).cloned();
        let replan = |labels: &BTreeMap<String, String>,
                      annotations: &BTreeMap<String, String>,
                      facts: NodeFacts| {
            let mut plan = plan::plan_node(labels, annotations, &cluster, facts);
            if let Some(value) = &handover_value {
                plan.annotations
                    .insert(l::HANDOVER.to_owned(), value.clone());
            }
            add_upgrade_changes(&mut plan, &upgrade);
            plan
        };
        write_plan(&ctx.client, &ctx.metrics, &node, plan, facts, replan).await?;
    }
    if cordon_after_write || upgrade.cordon_after_write {
        node_ops::cordon(&ctx.client, &name, &pp)
            .await
            .map_err(cordon_err("cordoning", &name))?;
    }
    account(
        &ctx,
        &name,
        &step,
        state.as_ref(),
        started,
        upgrade.step.starts(),
    )
    .await;
    let upgrade_recheck = upgrade.step.in_motion().then(|| {
        let slow = upgrade.step == UpgradeStep::Queued
            || (upgrade.evictions_blocked || upgrade.step == (UpgradeStep::Drain { evict: false }));
        if slow {
            HANDOVER_RECHECK
        } else {
            HANDOVER_STEP_RECHECK
        }
    });
    let handover_recheck = recheck(&step, evictions_blocked, offers_pending, deferred);
    Ok(match (handover_recheck, upgrade_recheck) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
    .map_or_else(Action::await_change, Action::requeue))
}

/// Adds what the node's driver upgrade changes (the state label, its annotations) to `plan`.
fn add_upgrade_changes(plan: &mut plan::Plan, upgrade: &upgrade::Outcome) {
    plan.labels.extend(upgrade.labels.clone());
    plan.annotations.extend(upgrade.annotations.clone());
}

/// When to look at a node again without a change event (`None`: only on one), after `step`.
fn recheck(
    step: &Step,
    evictions_blocked: bool,
    offers_pending: bool,
    deferred: bool,
) -> Option<Duration> {
    match step {
        Step::Idle | Step::Release | Step::Complete { .. } | Step::Cancel { .. } => {
            if offers_pending {
                Some(HANDOVER_RECHECK)
            } else if deferred {
                Some(DEFERRED_RECHECK)
            } else {
                None
            }
        }
        // Waiting for a slot, for pods that leave on their own, or for a PodDisruptionBudget
        // (asked again as `kubectl drain` does): no need to look every second.
        Step::Queued => Some(HANDOVER_RECHECK),
        Step::Drain { evict } if !evict || evictions_blocked => Some(HANDOVER_RECHECK),
        // Evicted pods terminating, the new plane coming up, the deadline: each step starts
        // about a second after the one before it could.
        _ => Some(HANDOVER_STEP_RECHECK),
    }
}

fn error_policy(node: Arc<PartialObjectMeta<Node>>, error: &Error, ctx: Arc<Context>) -> Action {
    if let Error::Patch {
        source: kube::Error::Api(status),
        ..
    } = error
        && status.code == 409
    {
        // Still conflicting after the fresh reads (or the hand-over record changed): plan again
        // from the watch's newer copy.
        tracing::debug!(node = %node.name_any(), "node kept changing while planning; planning again");
        ctx.metrics.count_error("conflict");
        return Action::requeue(Duration::from_millis(500));
    }
    tracing::warn!(%error, "reconcile failed");
    ctx.metrics.count_error(error.metric_label());
    Action::requeue(Duration::from_secs(2))
}

/// Runs the labeler until `shutdown` resolves.
pub async fn run(
    client: kube::Client,
    evictions: kube::Client,
    settings: Settings,
    metrics: Metrics,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let reporter = Reporter {
        controller: FIELD_MANAGER.into(),
        instance: std::env::var("POD_NAME").ok(),
    };

    // The GPUCluster store must be complete before any node is planned, so a restart never sees
    // "no GPUCluster" for a moment.
    let (gc_reader, gc_writer) = reflector::store();
    let gc_events = reflector(
        gc_writer,
        watcher(
            Api::<GPUCluster>::all(client.clone()),
            watcher::Config::default(),
        ),
    )
    .default_backoff()
    .touched_objects();
    let (trigger_tx, trigger_rx) = futures::channel::mpsc::unbounded::<()>();
    let gc_trigger = trigger_tx.clone();
    tokio::spawn(gc_events.for_each(move |event| {
        if let Err(e) = &event {
            tracing::warn!(error = %e, "GPUCluster watch error");
        } else {
            let _ = gc_trigger.unbounded_send(());
        }
        futures::future::ready(())
    }));
    gc_reader.wait_until_ready().await.ok();

    // Likewise whether a ClusterPolicy exists; a change re-plans every node.
    let (mut cluster_policy, follow) =
        service::presence::follow(client.clone(), cluster_policy::api_resource());
    tokio::spawn(follow);
    let present = service::presence::first_answer(&mut cluster_policy).await;
    metrics.set_cluster_policy(present);
    let mut changes = cluster_policy.clone();
    let gauge = metrics.clone();
    tokio::spawn(async move {
        while changes.changed().await.is_ok() {
            let present = changes.borrow_and_update().unwrap_or(false);
            gauge.set_cluster_policy(present);
            let _ = trigger_tx.unbounded_send(());
        }
    });

    // Validator pods of both planes: their readiness is the nodes' readiness labels and the end
    // of a hand-over.
    let (validator_reader, validator_writer) = reflector::store();
    let validator_events = reflector(
        validator_writer,
        watcher(
            Api::<Pod>::all(client.clone()),
            watcher::Config::default().labels(&format!("app={}", l::VALIDATOR_APP)),
        ),
    )
    .default_backoff()
    .touched_objects();

    let (node_reader, node_writer) = reflector::store();
    // Only labels and annotations matter here; managedFields are most of a Node's metadata, so they
    // are dropped before the cache keeps thousands of them.
    let node_events = watcher(
        Api::<PartialObjectMeta<Node>>::all(client.clone()),
        watcher::Config::default(),
    )
    .modify(|node| node.managed_fields_mut().clear());
    let nodes = reflector(node_writer, node_events)
        .default_backoff()
        .touched_objects()
        .predicate_filter(
            predicates::labels.combine(predicates::annotations),
            PredicateConfig::default(),
        );

    let ctx = Arc::new(Context {
        events: service::events::EventPublisher::new(client.clone(), reporter),
        client,
        evictions,
        settings,
        gpu_clusters: gc_reader,
        nodes: node_reader.clone(),
        validators: validator_reader,
        cluster_policy,
        started: tokio::sync::Mutex::default(),
        no_plane_told: std::sync::Mutex::default(),
        queue_told: std::sync::Mutex::default(),
        rules: std::sync::Mutex::default(),
        metrics,
    });
    // Bounded concurrency: thousands of new nodes must not become thousands of parallel requests
    // (and connections) at once.
    let controller = Controller::for_stream(nodes, node_reader)
        .with_config(kube::runtime::controller::Config::default().concurrency(16))
        .reconcile_all_on(trigger_rx)
        .watches_stream(validator_events, |pod: Pod| {
            pod.spec
                .and_then(|s| s.node_name)
                .map(|node| ObjectRef::<PartialObjectMeta<Node>>::new(&node))
        })
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx);
    service::binary::drain_results(controller).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_between_planes_is_looked_at_every_second_and_a_waiting_one_every_five() {
        let record = Handover {
            from: AllocationMode::DevicePlugin,
            to: AllocationMode::Dra,
            phase: Phase::WaitingForPlane,
            since: 0,
            cordoned: true,
            rollback: None,
        };
        let evicting = Step::Drain { evict: true };
        assert_eq!(
            recheck(&evicting, false, false, false),
            Some(HANDOVER_STEP_RECHECK)
        );
        assert_eq!(
            recheck(&Step::Switch(record), false, false, false),
            Some(HANDOVER_STEP_RECHECK)
        );
        let start = Step::Start {
            from: AllocationMode::DevicePlugin,
            to: AllocationMode::Dra,
        };
        assert_eq!(
            recheck(&start, false, false, false),
            Some(HANDOVER_STEP_RECHECK)
        );
        // A PodDisruptionBudget said no, pods leave on their own, or no slot is free.
        assert_eq!(
            recheck(&evicting, true, false, false),
            Some(HANDOVER_RECHECK)
        );
        assert_eq!(
            recheck(&Step::Drain { evict: false }, false, false, false),
            Some(HANDOVER_RECHECK)
        );
        assert_eq!(
            recheck(&Step::Queued, false, false, false),
            Some(HANDOVER_RECHECK)
        );
        // Settled nodes wait for a change, unless their offers or a deferral need a look.
        assert_eq!(recheck(&Step::Idle, false, false, false), None);
        assert_eq!(
            recheck(&Step::Idle, false, true, false),
            Some(HANDOVER_RECHECK)
        );
        assert_eq!(
            recheck(&Step::Idle, false, false, true),
            Some(DEFERRED_RECHECK)
        );
    }
}
