//! The controller: watches Nodes (metadata only) and the GPUCluster, plans each node's labels and
//! writes only what changed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use api::contract::{GPU_CLUSTER_NAME, cluster_policy, labels as l, objects as o};
use api::handover::{Handover, Phase};
use api::{AllocationMode, GPUCluster};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{ListParams, PartialObjectMeta, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store, reflector};
use kube::runtime::watcher::{self, watcher};
use kube::runtime::{Controller, Predicate, PredicateConfig, WatchStreamExt, predicates};
use kube::{Api, Resource, ResourceExt};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde_json::{Value, json};

use crate::claims;
use crate::events::{self, QueueReason};
use crate::handover::{self, Step};
use crate::node_ops::{self, Eviction};
use crate::offers;
use crate::plan::{
    self, Cluster, DEFERRED_RECHECK, GpuClaims, Hold, NodeFacts, Plan, ReadyPlanes, Rule,
};

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

/// Why reconciling a node failed; the label is the metric's `error` value.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Patching the node's labels or annotations failed (a 409 means it changed under us and is
    /// retried).
    #[error("patching node {node}: {source}")]
    Patch {
        /// The node.
        node: String,
        /// The API error.
        source: kube::Error,
    },
    /// Cordoning or uncordoning the node failed.
    #[error("{what} node {node}: {source}")]
    Cordon {
        /// `cordoning` or `uncordoning`.
        what: &'static str,
        /// The node.
        node: String,
        /// The API error.
        source: kube::Error,
    },
    /// Reading or evicting the pods that hold the old plane's GPUs failed.
    #[error("draining node {node}: {source}")]
    Drain {
        /// The node.
        node: String,
        /// The API error.
        source: kube::Error,
    },
    /// Reading what a plane offers on the node (its ResourceSlices, or its allocatable GPUs)
    /// failed.
    #[error("reading what the {plane} plane offers on node {node}: {source}")]
    Offers {
        /// The plane.
        plane: AllocationMode,
        /// The node.
        node: String,
        /// The API error.
        source: kube::Error,
    },
}

impl Error {
    fn metric_label(&self) -> &'static str {
        match self {
            Error::Patch { .. } => "patch",
            Error::Cordon { .. } => "cordon",
            Error::Drain { .. } => "drain",
            Error::Offers { .. } => "offers",
        }
    }
}

/// Counters of the labeler's work.
#[derive(Clone, Debug, Default)]
pub struct Metrics {
    reconciles: Counter,
    writes: Counter,
    deferred: Counter,
    errors: Family<Vec<(String, String)>, Counter>,
    cluster_policy: Gauge,
    handovers_in_progress: Gauge,
    handover_steps: Family<Vec<(String, String)>, Counter>,
    evictions: Family<Vec<(String, String)>, Counter>,
    held_on_dra: Family<Vec<(String, String)>, Gauge>,
}

impl Metrics {
    /// Registers the counters under `node_labeler_`.
    pub fn register(&self, registry: &mut Registry) {
        let sub = registry.sub_registry_with_prefix("node_labeler");
        sub.register("reconciles", "Node reconciles run", self.reconciles.clone());
        sub.register(
            "node_writes",
            "Node label/annotation patches sent",
            self.writes.clone(),
        );
        sub.register(
            "dra_driver_removals_deferred",
            "Times a dra-driver label removal waited for GPU claims",
            self.deferred.clone(),
        );
        sub.register(
            "errors",
            "Failed node reconciles by cause",
            self.errors.clone(),
        );
        sub.register(
            "cluster_policy_present",
            "1 while a ClusterPolicy serves the device-plugin plane",
            self.cluster_policy.clone(),
        );
        sub.register(
            "handovers_in_progress",
            "GPU nodes between planes (cordoned, draining or waiting for the new plane)",
            self.handovers_in_progress.clone(),
        );
        sub.register(
            "handover_steps",
            "Hand-over steps taken, by step (started, switched, completed, rolled_back, ...)",
            self.handover_steps.clone(),
        );
        sub.register(
            "node_held_on_dra",
            "1 for each node whose plane policy moved it off DRA while pods there still hold \
             gpu.nvidia.com claims (it stays on DRA until they leave)",
            self.held_on_dra.clone(),
        );
        sub.register(
            "evictions",
            "Evictions of pods holding the old plane's GPUs, by result",
            self.evictions.clone(),
        );
    }

    fn count(family: &Family<Vec<(String, String)>, Counter>, key: &str, value: &str) {
        family
            .get_or_create(&vec![(key.to_owned(), value.to_owned())])
            .inc();
    }
}

/// Which GPUCluster spec a set of parsed rules came from: its uid and generation.
type RulesOf = (Option<String>, Option<i64>);

struct Context {
    client: kube::Client,
    /// The same API without the client's own retries, for evictions (see
    /// [`service::kube_client_without_retries`]).
    evictions: kube::Client,
    settings: Settings,
    gpu_clusters: Store<GPUCluster>,
    nodes: Store<PartialObjectMeta<Node>>,
    /// Pods of both planes' validators (`app=nvidia-operator-validator`), any namespace.
    validators: Store<Pod>,
    /// Whether a `ClusterPolicy` exists (known before the first node is planned).
    cluster_policy: tokio::sync::watch::Receiver<Option<bool>>,
    /// Nodes this process started handing over that the node cache may not show yet; held while
    /// a start is decided, so two reconciles never take the last slot together.
    started: tokio::sync::Mutex<BTreeSet<String>>,
    /// Why no plane serves each node this process told about in a `NoGPUPlane` Event, so it is
    /// told once per change, not once per reconcile.
    no_plane_told: std::sync::Mutex<BTreeMap<String, String>>,
    /// The GPUCluster's plane-policy rules, parsed once per spec (uid and generation), so a bad
    /// rule is parsed and logged once per change, not once per node reconcile.
    rules: std::sync::Mutex<Option<(RulesOf, Vec<Rule>)>>,
    recorder: Recorder,
    metrics: Metrics,
}

impl Context {
    /// The `NoGPUPlane` Event for `node`, when why no plane serves it changed since last told.
    fn no_plane_news(
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

    fn gpu_cluster(&self) -> Option<Arc<GPUCluster>> {
        self.gpu_clusters
            .state()
            .into_iter()
            .find(|gc| gc.name_any() == GPU_CLUSTER_NAME)
    }

    fn cluster(&self, gpu_cluster: Option<&GPUCluster>) -> Cluster {
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
    fn ready_planes(&self, node: &str) -> ReadyPlanes {
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

    /// Whether another hand-over may start, and why not. Call with `started` locked.
    fn admission(
        &self,
        node: &str,
        started: &BTreeSet<String>,
        max_unavailable: u32,
        generation: i64,
    ) -> Result<(), QueueReason> {
        let mut in_progress: BTreeSet<String> = started.clone();
        for other in self.nodes.state() {
            let Some(h) = other
                .annotations()
                .get(l::HANDOVER)
                .and_then(|v| Handover::parse(v))
            else {
                continue;
            };
            if h.rollback
                .as_ref()
                .is_some_and(|r| r.generation == generation)
            {
                return Err(QueueReason::Paused {
                    node: other.name_any(),
                });
            }
            if h.phase.in_progress() {
                in_progress.insert(other.name_any());
            }
        }
        in_progress.remove(node);
        self.metrics
            .handovers_in_progress
            .set(i64::try_from(in_progress.len()).unwrap_or(i64::MAX));
        if in_progress.len() >= max_unavailable as usize {
            return Err(QueueReason::Full {
                in_progress: in_progress.len(),
                max_unavailable,
            });
        }
        Ok(())
    }
}

fn is_ready(pod: &Pod) -> bool {
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

/// The merge patch for a plan, guarded by the resourceVersion the plan was made from.
pub fn patch_body(plan: &Plan, resource_version: Option<&str>) -> Value {
    let mut metadata = json!({});
    if let Some(rv) = resource_version {
        metadata["resourceVersion"] = json!(rv);
    }
    if !plan.labels.is_empty() {
        metadata["labels"] = json!(plan.labels);
    }
    if !plan.annotations.is_empty() {
        metadata["annotations"] = json!(plan.annotations);
    }
    json!({ "metadata": metadata })
}

fn patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    }
}

async fn reconcile(node: Arc<PartialObjectMeta<Node>>, ctx: Arc<Context>) -> Result<Action, Error> {
    ctx.metrics.reconciles.inc();
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
    };
    let mut plan = plan::plan_node(labels, annotations, &cluster, facts);

    // The hand-over: a start is decided under the lock, so slots are never over-booked.
    let started = if state.is_none() && plan.switch.is_some() {
        Some(ctx.started.lock().await)
    } else {
        None
    };
    let admission = match &started {
        Some(set) => ctx.admission(&name, set, migration.max_unavailable, generation),
        None => Ok(()),
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
        holders: &holding
            .iter()
            .map(|p| format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any()))
            .collect::<Vec<_>>(),
        now: jiff::Timestamp::now().as_second(),
        drain: migration.drain,
        deadline_secs: i64::from(migration.progress_deadline_seconds),
        generation,
        may_start: admission.is_ok(),
        served: gpu_cluster
            .as_ref()
            .is_some_and(|gc| gc.metadata.deletion_timestamp.is_none()),
    });
    let record = handover_record(&step);
    if let Some(Some(h)) = &record {
        facts.pinned = h.pinned(generation);
    }
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
    for event in plan
        .findings
        .iter()
        .map(events::for_finding)
        .chain(step_event)
        .chain(no_plane_event)
    {
        if let Err(e) = ctx.recorder.publish(&event, &reference).await {
            tracing::warn!(node = %name, error = %e, "publishing an event failed");
        }
    }
    let deferred = plan.is_deferred();
    if deferred {
        ctx.metrics.deferred.inc();
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
            plan
        };
        write_plan(&ctx.client, &ctx.metrics, &node, plan, facts, replan).await?;
    }
    if cordon_after_write {
        node_ops::cordon(&ctx.client, &name, &pp)
            .await
            .map_err(cordon_err("cordoning", &name))?;
    }
    account(&ctx, &name, &step, state.as_ref(), started).await;
    Ok(recheck(&step, evictions_blocked, offers_pending, deferred)
        .map_or_else(Action::await_change, Action::requeue))
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

/// How many times a write that conflicted is planned again from a fresh read before the node is
/// left to the controller's requeue.
const CONFLICT_RETRIES: usize = 3;

/// Writes `plan`, guarded by the resourceVersion of the copy it was made from. On a conflict
/// (another writer changed the node since that copy) the node is read afresh and planned again
/// with `replan` from the same facts, at once and at most [`CONFLICT_RETRIES`] times, instead of
/// waiting for the watch to bring the newer copy. A fresh read whose hand-over record differs from
/// the one this round decided on ends the retries: the next round decides again.
async fn write_plan(
    client: &kube::Client,
    metrics: &Metrics,
    node: &PartialObjectMeta<Node>,
    plan: Plan,
    mut facts: NodeFacts,
    replan: impl Fn(&BTreeMap<String, String>, &BTreeMap<String, String>, NodeFacts) -> Plan,
) -> Result<(), Error> {
    let name = node.name_any();
    let nodes: Api<Node> = Api::all(client.clone());
    let pp = patch_params();
    let record = node.annotations().get(l::HANDOVER).cloned();
    let (mut plan, mut version) = (plan, node.resource_version());
    let mut attempt = 0;
    loop {
        let body = patch_body(&plan, version.as_deref());
        let source = match nodes.patch_metadata(&name, &pp, &Patch::Merge(&body)).await {
            Ok(_) => {
                metrics.writes.inc();
                tracing::info!(node = %name, labels = ?plan.labels, annotations = ?plan.annotations, "node updated");
                return Ok(());
            }
            Err(source) => source,
        };
        let conflict = matches!(&source, kube::Error::Api(status) if status.code == 409);
        if !conflict || attempt == CONFLICT_RETRIES {
            return Err(Error::Patch { node: name, source });
        }
        Metrics::count(&metrics.errors, "error", "conflict");
        let fresh = nodes
            .get_metadata(&name)
            .await
            .map_err(|source| Error::Patch {
                node: name.clone(),
                source,
            })?;
        if fresh.annotations().get(l::HANDOVER) != record.as_ref() {
            return Err(Error::Patch { node: name, source });
        }
        tracing::debug!(node = %name, attempt, "node changed while planning; planning again from a fresh read");
        plan = replan(fresh.labels(), fresh.annotations(), facts);
        if let Some(plane) = plan.needs_claim_lookup
            && facts.claims == GpuClaims::Unknown
        {
            facts.claims = claims::on_node(client, &name, plane).await;
            plan = replan(fresh.labels(), fresh.annotations(), facts);
        }
        if !plan.has_changes() {
            return Ok(());
        }
        version = fresh.resource_version();
        attempt += 1;
    }
}

/// Counts the step, keeps the held-on-DRA gauge, and books or frees the node's hand-over slot
/// (`started`: the slot lock, when this reconcile took it).
async fn account(
    ctx: &Context,
    name: &str,
    step: &Step,
    state: Option<&Handover>,
    started: Option<tokio::sync::MutexGuard<'_, BTreeSet<String>>>,
) {
    if let Some(label) = step_metric(step) {
        Metrics::count(&ctx.metrics.handover_steps, "step", label);
    }
    let held_on_dra =
        matches!(step, Step::Drain { .. }) && state.is_some_and(|h| h.from == AllocationMode::Dra);
    let key = vec![("node".to_owned(), name.to_owned())];
    if held_on_dra {
        ctx.metrics.held_on_dra.get_or_create(&key).set(1);
    } else {
        ctx.metrics.held_on_dra.remove(&key);
    }
    if let Some(mut set) = started {
        match step {
            Step::Start { .. } => {
                set.insert(name.to_owned());
            }
            _ => {
                set.remove(name);
            }
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

/// Keeps a plane's validator-ready flag only while the plane offers every GPU of the node (see
/// [`crate::offers`]), checked while the node does not carry that plane's readiness label yet.
/// The second value says a check held a plane back, so the node is looked at again soon.
async fn confirm_offers(
    ctx: &Context,
    name: &str,
    labels: &BTreeMap<String, String>,
    mut ready: ReadyPlanes,
) -> Result<(ReadyPlanes, bool), Error> {
    let wanted = offers::gpu_count(labels);
    let labelled = |plane: AllocationMode| {
        labels.get(l::GPU_STACK).map(String::as_str) == Some(plane.as_str())
    };
    let err = |plane| {
        let node = name.to_owned();
        move |source| Error::Offers {
            plane,
            node,
            source,
        }
    };
    let mut held = false;
    if ready.dra && !labelled(AllocationMode::Dra) {
        let selector = format!(
            "spec.nodeName={name},spec.driver={}",
            api::contract::DRIVER_NAME
        );
        let slices = Api::<ResourceSlice>::all(ctx.client.clone())
            .list(&ListParams::default().fields(&selector))
            .await
            .map_err(err(AllocationMode::Dra))?;
        if offers::published_gpus(&slices.items, name) < wanted {
            ready.dra = false;
            held = true;
        }
    }
    if ready.device_plugin && !labelled(AllocationMode::DevicePlugin) {
        let node = Api::<Node>::all(ctx.client.clone())
            .get(name)
            .await
            .map_err(err(AllocationMode::DevicePlugin))?;
        if offers::allocatable_gpus(&node) < wanted {
            ready.device_plugin = false;
            held = true;
        }
    }
    Ok((ready, held))
}

/// The error of a failed cordon step (`what`: reading, cordoning, uncordoning) on `node`.
fn cordon_err(what: &'static str, node: &str) -> impl FnOnce(kube::Error) -> Error {
    let node = node.to_owned();
    move |source| Error::Cordon { what, node, source }
}

/// Does what a hand-over step asks of the node and its pods (cordon, evictions, uncordon);
/// returns the hand-over record to write (`record` unless the step starts a hand-over) and
/// whether a PodDisruptionBudget refused an eviction.
async fn carry_out(
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
            // The start's cordon may not have landed; read before writing, so a node draining
            // for minutes is not patched every round.
            let ours = state.is_some_and(|h| h.cordoned);
            if ours
                && !node_ops::is_cordoned(&ctx.client, name)
                    .await
                    .map_err(cordon_err("reading", name))?
            {
                node_ops::cordon(&ctx.client, name, &pp)
                    .await
                    .map_err(cordon_err("cordoning", name))?;
            }
            for pod in holding
                .iter()
                .filter(|p| *evict && !claims::is_daemonset_pod(p))
            {
                let result = node_ops::evict(&ctx.evictions, pod)
                    .await
                    .map_err(|source| Error::Drain {
                        node: name.to_owned(),
                        source,
                    })?;
                let pod_name =
                    format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any());
                match &result {
                    Eviction::Evicted => {
                        tracing::info!(node = %name, pod = %pod_name, "evicted");
                        Metrics::count(&ctx.metrics.evictions, "result", "evicted");
                    }
                    Eviction::Blocked(why) => {
                        blocked = true;
                        tracing::info!(node = %name, pod = %pod_name, why, "eviction blocked");
                        Metrics::count(&ctx.metrics.evictions, "result", "blocked");
                    }
                    Eviction::Gone => {}
                }
            }
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

/// What the hand-over annotation becomes: `Some(Some(h))` sets it, `Some(None)` removes it,
/// `None` leaves it. A start's record is made once the node is cordoned.
fn handover_record(step: &Step) -> Option<Option<Handover>> {
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
        Metrics::count(&ctx.metrics.errors, "error", "conflict");
        return Action::requeue(Duration::from_millis(500));
    }
    tracing::warn!(%error, "reconcile failed");
    Metrics::count(&ctx.metrics.errors, "error", error.metric_label());
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
    metrics.cluster_policy.set(i64::from(present));
    let mut changes = cluster_policy.clone();
    let gauge = metrics.cluster_policy.clone();
    tokio::spawn(async move {
        while changes.changed().await.is_ok() {
            let present = changes.borrow_and_update().unwrap_or(false);
            gauge.set(i64::from(present));
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
        recorder: Recorder::new(client.clone(), reporter),
        client,
        evictions,
        settings,
        gpu_clusters: gc_reader,
        nodes: node_reader.clone(),
        validators: validator_reader,
        cluster_policy,
        started: tokio::sync::Mutex::default(),
        no_plane_told: std::sync::Mutex::default(),
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

/// Whether to tell that no plane serves `node` for reason `why` (`None`: a plane serves it):
/// once per change of reason. `told` keeps the last reason told per node; nodes `live` no longer
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
    use std::collections::BTreeMap;

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

    #[test]
    fn patch_sets_and_removes_only_planned_keys_guarded_by_resource_version() {
        let plan = Plan {
            labels: BTreeMap::from([
                ("a".to_string(), Some("true".to_string())),
                ("b".to_string(), None),
            ]),
            ..Plan::default()
        };
        assert_eq!(
            patch_body(&plan, Some("42")),
            json!({"metadata": {"resourceVersion": "42", "labels": {"a": "true", "b": null}}})
        );
    }

    /// The requests a fake API saw (method, resourceVersion or `-` for a read), and its node.
    type Seen = std::sync::Arc<std::sync::Mutex<Vec<String>>>;

    /// An API whose node `n` answers every PATCH with `conflicts` 409s before it takes one, and
    /// every GET with `fresh` (resourceVersion 43).
    fn conflicting_api(conflicts: usize, fresh: Value) -> (kube::Client, Seen) {
        use http::{Method, StatusCode};
        use service::fake_api::{client, failure, reply};
        let seen = Seen::default();
        let log = seen.clone();
        let client = client("default", move |method, path, body| {
            assert_eq!(path, "/api/v1/nodes/n");
            let mut log = log.lock().unwrap();
            if method == Method::GET {
                log.push("GET".into());
                return reply(StatusCode::OK, &fresh);
            }
            let body: Value = serde_json::from_slice(body).unwrap();
            log.push(format!("PATCH {}", body["metadata"]));
            let patches = log.iter().filter(|r| r.starts_with("PATCH")).count();
            if patches <= conflicts {
                return failure(
                    StatusCode::CONFLICT,
                    "Conflict",
                    "the object has been modified",
                );
            }
            reply(StatusCode::OK, &fresh)
        });
        (client, seen)
    }

    fn meta(version: &str, labels: Value, annotations: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n",
               "resourceVersion": version, "labels": labels, "annotations": annotations}})
    }

    /// Plans `want=yes` unless the node has it, as the planner plans only what differs.
    fn replan(
        labels: &BTreeMap<String, String>,
        _: &BTreeMap<String, String>,
        _: NodeFacts,
    ) -> Plan {
        let mut plan = Plan::default();
        if labels.get("want").map(String::as_str) != Some("yes") {
            plan.labels.insert("want".into(), Some("yes".into()));
        }
        plan
    }

    fn facts() -> NodeFacts {
        NodeFacts {
            claims: GpuClaims::None,
            ready: ReadyPlanes::default(),
            pinned: None,
            hold: Hold::No,
        }
    }

    async fn write(client: &kube::Client, cached: Value) -> Result<(), Error> {
        let node: PartialObjectMeta<Node> = serde_json::from_value(cached).unwrap();
        let plan = replan(node.labels(), node.annotations(), facts());
        write_plan(client, &Metrics::default(), &node, plan, facts(), replan).await
    }

    #[tokio::test]
    async fn a_conflicting_write_is_planned_again_from_a_fresh_read_at_once() {
        // Another writer added a label after the cache's copy (42) was taken.
        let fresh = meta("43", json!({"other": "x"}), json!({}));
        let (client, seen) = conflicting_api(1, fresh);
        write(&client, meta("42", json!({}), json!({})))
            .await
            .unwrap();
        assert_eq!(
            *seen.lock().unwrap(),
            [
                r#"PATCH {"labels":{"want":"yes"},"resourceVersion":"42"}"#,
                "GET",
                r#"PATCH {"labels":{"want":"yes"},"resourceVersion":"43"}"#,
            ]
        );
    }

    #[tokio::test]
    async fn a_fresh_read_that_already_shows_the_change_writes_nothing_more() {
        let (client, seen) = conflicting_api(1, meta("43", json!({"want": "yes"}), json!({})));
        write(&client, meta("42", json!({}), json!({})))
            .await
            .unwrap();
        assert_eq!(seen.lock().unwrap().len(), 2, "{seen:?}");
    }

    #[tokio::test]
    async fn conflicts_are_retried_a_bounded_number_of_times() {
        let (client, seen) = conflicting_api(usize::MAX, meta("43", json!({}), json!({})));
        let error = write(&client, meta("42", json!({}), json!({})))
            .await
            .unwrap_err();
        assert!(
            matches!(error, Error::Patch { source: kube::Error::Api(ref s), .. } if s.code == 409)
        );
        let patches = seen
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.starts_with("PATCH"))
            .count();
        assert_eq!(patches, CONFLICT_RETRIES + 1);
    }

    #[tokio::test]
    async fn a_hand_over_record_changed_meanwhile_ends_the_retries() {
        let moved = json!({l::HANDOVER: "{}"});
        let (client, seen) = conflicting_api(1, meta("43", json!({}), moved));
        let error = write(&client, meta("42", json!({}), json!({})))
            .await
            .unwrap_err();
        assert!(matches!(error, Error::Patch { .. }), "{error}");
        assert_eq!(
            seen.lock().unwrap().len(),
            2,
            "a read, no second write: {seen:?}"
        );
    }
}
