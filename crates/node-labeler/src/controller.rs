//! The controller: watches Nodes (metadata only) and the GPUCluster, plans each node's labels and
//! writes only what changed.

use std::sync::Arc;
use std::time::Duration;

use api::contract::{GPU_CLUSTER_NAME, cluster_policy, labels as l};
use api::{AllocationMode, GPUCluster};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::{PartialObjectMeta, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, Store, reflector};
use kube::runtime::watcher::{self, watcher};
use kube::runtime::{Controller, Predicate, PredicateConfig, WatchStreamExt, predicates};
use kube::{Api, Resource, ResourceExt};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde_json::{Value, json};

use crate::claims;
use crate::plan::{self, Cluster, Finding, GpuClaims, Plan, Rule};

/// Field manager of every write the labeler makes.
pub const FIELD_MANAGER: &str = "gpu-operator-node-labeler";
/// How often a node whose `dra-driver` removal is deferred is looked at again.
pub const DEFERRED_RECHECK: Duration = Duration::from_secs(30);

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
    /// Patching the node failed (a 409 means it changed under us and is retried).
    #[error("patching node {node}: {source}")]
    Patch {
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
    }
}

struct Context {
    client: kube::Client,
    settings: Settings,
    gpu_clusters: Store<GPUCluster>,
    /// Whether a `ClusterPolicy` exists (known before the first node is planned).
    cluster_policy: tokio::sync::watch::Receiver<Option<bool>>,
    recorder: Recorder,
    metrics: Metrics,
}

impl Context {
    fn cluster(&self) -> Cluster {
        let gpu_cluster = self
            .gpu_clusters
            .state()
            .into_iter()
            .find(|gc| gc.name_any() == GPU_CLUSTER_NAME);
        Cluster {
            gpu_cluster: gpu_cluster.is_some(),
            cluster_policy: self.cluster_policy.borrow().unwrap_or(false),
            gpu_cluster_device_plugin: gpu_cluster
                .as_ref()
                .is_some_and(|gc| gc.spec.device_plugin.enabled),
            default_mode: self.settings.default_mode,
            driver_auto_upgrade: self.settings.driver_auto_upgrade,
            rules: gpu_cluster
                .iter()
                .flat_map(|gc| &gc.spec.plane_policy.rules)
                .filter_map(|rule| {
                    Rule::new(rule)
                        .inspect_err(|e| tracing::warn!(error = %e, "plane-policy rule skipped"))
                        .ok()
                })
                .collect(),
        }
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

fn event_for(finding: &Finding) -> Event {
    match finding {
        Finding::InvalidMode(value) => Event {
            type_: EventType::Warning,
            reason: "InvalidAllocationMode".into(),
            note: Some(format!(
                "label {} has invalid value {value:?}: allowed values are \"dra\" and \
                 \"device-plugin\"; deploy labels are left unchanged until it is fixed",
                l::ALLOCATION_MODE
            )),
            action: "Labeling".into(),
            secondary: None,
        },
        Finding::DraDriverRemovalDeferred => Event {
            type_: EventType::Normal,
            reason: "DraDriverRemovalDeferred".into(),
            note: Some(format!(
                "keeping {} until no pod on this node holds a claim allocated by gpu.nvidia.com; \
                 re-checking every {}s",
                l::DEPLOY_DRA_DRIVER,
                DEFERRED_RECHECK.as_secs()
            )),
            action: "Labeling".into(),
            secondary: None,
        },
        Finding::ModeChosenByRule { rule, mode } => Event {
            type_: EventType::Normal,
            reason: "AllocationModeChosen".into(),
            note: Some(format!(
                "planePolicy rule {rule:?} of the GPUCluster puts this node in {mode} mode; set {} \
                 by hand to pin another mode",
                l::ALLOCATION_MODE
            )),
            action: "Labeling".into(),
            secondary: None,
        },
        Finding::DevicePluginRemovalDeferred => Event {
            type_: EventType::Normal,
            reason: "DevicePluginRemovalDeferred".into(),
            note: Some(format!(
                "keeping {} until no pod on this node holds a GPU the device plugin gave \
                 (nvidia.com/ resources); the DRA plane follows; re-checking every {}s",
                l::DEPLOY_DEVICE_PLUGIN,
                DEFERRED_RECHECK.as_secs()
            )),
            action: "Labeling".into(),
            secondary: None,
        },
    }
}

async fn reconcile(node: Arc<PartialObjectMeta<Node>>, ctx: Arc<Context>) -> Result<Action, Error> {
    ctx.metrics.reconciles.inc();
    let name = node.name_any();
    let cluster = ctx.cluster();
    let (labels, annotations) = (node.labels(), node.annotations());
    let mut plan = plan::plan(labels, annotations, &cluster, GpuClaims::Unknown);
    if let Some(plane) = plan.needs_claim_lookup {
        let held = match plane {
            AllocationMode::Dra => claims::on_node(&ctx.client, &name).await,
            AllocationMode::DevicePlugin => {
                claims::device_plugin_gpus_on_node(&ctx.client, &name).await
            }
        };
        plan = plan::plan(labels, annotations, &cluster, held);
    }
    for finding in &plan.findings {
        let reference = node.object_ref(&());
        if let Err(e) = ctx.recorder.publish(&event_for(finding), &reference).await {
            tracing::warn!(node = %name, error = %e, "publishing an event failed");
        }
    }
    if plan.is_deferred() {
        ctx.metrics.deferred.inc();
    }
    if plan.has_changes() {
        let nodes: Api<Node> = Api::all(ctx.client.clone());
        let body = patch_body(&plan, node.resource_version().as_deref());
        nodes
            .patch_metadata(&name, &patch_params(), &Patch::Merge(&body))
            .await
            .map_err(|source| Error::Patch {
                node: name.clone(),
                source,
            })?;
        ctx.metrics.writes.inc();
        tracing::info!(node = %name, labels = ?plan.labels, annotations = ?plan.annotations, "node updated");
    }
    Ok(if plan.is_deferred() {
        Action::requeue(DEFERRED_RECHECK)
    } else {
        Action::await_change()
    })
}

fn error_policy(_node: Arc<PartialObjectMeta<Node>>, error: &Error, ctx: Arc<Context>) -> Action {
    tracing::warn!(%error, "reconcile failed");
    ctx.metrics
        .errors
        .get_or_create(&vec![("error".into(), error.metric_label().into())])
        .inc();
    Action::requeue(Duration::from_secs(2))
}

/// Runs the labeler until `shutdown` resolves.
pub async fn run(
    client: kube::Client,
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
        settings,
        gpu_clusters: gc_reader,
        cluster_policy,
        metrics,
    });
    // Bounded concurrency: thousands of new nodes must not become thousands of parallel requests
    // (and connections) at once.
    Controller::for_stream(nodes, node_reader)
        .with_config(kube::runtime::controller::Config::default().concurrency(16))
        .reconcile_all_on(trigger_rx)
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|result| {
            if let Err(e) = result {
                tracing::debug!(error = %e, "controller event");
            }
            futures::future::ready(())
        })
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

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
}
