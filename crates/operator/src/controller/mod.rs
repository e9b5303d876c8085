//! The GPUCluster controller: applies the rendered operands, prunes what left the desired set,
//! drains claim consumers before the plugin on deletion, and writes status only when it changed.
//! This module holds the reconcile loop; each step lives in its own module (`apply`, `discovery`,
//! `drain`, `nodes`, `report`, `metrics`), and `crate::status` decides what the status says.

use std::sync::Arc;
use std::time::Duration;

use api::GPUCluster;
use api::contract::{GPU_CLUSTER_FINALIZER, GPU_CLUSTER_NAME, cluster_policy, objects as o};
use jiff::Timestamp;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use kube::api::DynamicObject;
use kube::runtime::Controller;
use kube::runtime::controller::Action;
use kube::runtime::events::{EventType, Reporter};
use kube::runtime::finalizer::{self, finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, Resource, ResourceExt};
use service::events::EventPublisher;

use crate::events::RECONCILE;
use crate::features::Feature;
use crate::pod_creation;
use crate::render::{self, ClusterFacts, DefaultImages, Inputs, Object};
use crate::status::{self, Observed, Problem};

mod apply;
mod cache;
pub mod discovery;
mod drain;
mod error;
mod metrics;
mod nodes;
mod report;
#[cfg(test)]
mod tests;

pub use metrics::Metrics;

use apply::{apply, ensure_admin_access_label, owner_reference, prune};
use discovery::FeatureCache;
use drain::drain;
pub use error::Error;
use error::api_err;
use nodes::{ReadyPlugins, node_counts, node_selector};
use report::write_status;

/// Field manager of every write the operator makes.
pub const FIELD_MANAGER: &str = "gpu-operator";
const MANAGED_SELECTOR: &str = "app.kubernetes.io/managed-by=gpu-operator";

/// Operator settings from its command line.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Namespace of the operands.
    pub namespace: String,
    /// Default images.
    pub images: DefaultImages,
}

struct Context {
    client: kube::Client,
    settings: Settings,
    events: EventPublisher,
    metrics: Metrics,
    /// Which optional APIs are served, and when that was asked.
    served: tokio::sync::Mutex<Option<(std::time::Instant, discovery::Served)>>,
    /// What the apiserver serves of each DRA feature.
    features: Arc<FeatureCache>,
    /// The live operands, as the watches keep them.
    operands: cache::Operands,
    /// Whether a `ClusterPolicy` exists (known before the first reconcile).
    cluster_policy: tokio::sync::watch::Receiver<Option<bool>>,
}

impl Context {
    async fn event(&self, gc: &GPUCluster, type_: EventType, reason: &str, note: String) {
        self.events
            .tell(&gc.object_ref(&()), type_, reason, RECONCILE, note)
            .await;
    }
}

async fn reconcile(gc: Arc<GPUCluster>, ctx: Arc<Context>) -> Result<Action, Error> {
    ctx.metrics.reconciles.inc();
    if gc.name_any() != GPU_CLUSTER_NAME {
        let now = Timestamp::now();
        write_status(&ctx, &gc, status::ignored(gc.status.as_ref(), now)).await?;
        return Ok(Action::await_change());
    }
    // The finalizer goes on before any operand exists, and comes off only once `drain` is done.
    let api: Api<GPUCluster> = Api::all(ctx.client.clone());
    finalizer(&api, GPU_CLUSTER_FINALIZER, gc, |event| async {
        match event {
            finalizer::Event::Apply(gc) => apply_spec(&ctx, &gc).await,
            finalizer::Event::Cleanup(gc) => drain(&ctx, &gc).await,
        }
    })
    .await
    .map_err(Error::from_finalizer)
}

/// Applies the spec: the operands, pruning, and the status that says how they are doing.
async fn apply_spec(ctx: &Context, gc: &GPUCluster) -> Result<Action, Error> {
    let now = Timestamp::now();
    let mut observed = Observed {
        namespace: ctx.settings.namespace.clone(),
        ..Observed::default()
    };
    let served = ctx.served().await;
    if !served.dra {
        observed.problems.push(Problem::DraApiNotServed);
        write_status(
            ctx,
            gc,
            status::status(&observed, gc.metadata.generation, gc.status.as_ref(), now),
        )
        .await?;
        ctx.metrics.ready.set(0);
        return Ok(Action::requeue(Duration::from_secs(60)));
    }
    ensure_admin_access_label(ctx).await?;
    // Compared against the watches' copies, which must have listed once.
    if !ctx.operands.ready().await {
        return Err(Error::NotSynced);
    }

    let cluster_policy = ctx.cluster_policy.borrow().unwrap_or(false);
    observed.features = ctx.features.get().await;
    // Unknown is an error (retried), never "not served": that would strip the field from the
    // live class.
    let extended_resources_served = observed
        .features
        .served(Feature::ExtendedResource)
        .map_err(Error::FeatureUnknown)?;
    let inputs = Inputs {
        namespace: &ctx.settings.namespace,
        images: &ctx.settings.images,
        facts: ClusterFacts {
            service_monitors_served: served.service_monitors,
            cluster_policy,
            extended_resources_served,
        },
    };
    let desired = render::desired(&gc.spec, &inputs);
    for e in &desired.errors {
        observed.problems.push(Problem::Reconcile(e.to_string()));
        ctx.event(gc, EventType::Warning, "InvalidSpec", e.to_string())
            .await;
    }
    let owner = owner_reference(gc);
    let mut ready_plugins = ReadyPlugins::default();
    let mut daemonsets = Vec::new();
    for object in &desired.objects {
        match apply(ctx, gc, object, &owner).await {
            Ok(live) => {
                // A live object that does not decode is reported, never read as an empty one
                // (which would make a quietly wrong status).
                let decoded = match object {
                    Object::DaemonSet(_) => typed::<DaemonSet>(&live).map(|ds| {
                        let ready = ds.status.as_ref().map(|s| s.number_ready).unwrap_or(0);
                        match ds.name_any().as_str() {
                            o::KUBELET_PLUGIN_DAEMONSET => ready_plugins.dra = ready,
                            o::DEVICE_PLUGIN_DAEMONSET => ready_plugins.device_plugin = ready,
                            _ => {}
                        }
                        daemonsets.push(ds);
                    }),
                    Object::Deployment(_) => typed::<Deployment>(&live)
                        .map(|d| observed.operands.push(status::deployment(&d))),
                    _ => Ok(()),
                };
                if let Err(e) = decoded {
                    let message = format!("reading back {}: {e}", object.id());
                    ctx.event(gc, EventType::Warning, "DecodeFailed", message.clone())
                        .await;
                    observed.problems.push(Problem::Reconcile(message));
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "apply failed");
                ctx.event(gc, EventType::Warning, "ApplyFailed", e.to_string())
                    .await;
                observed.problems.push(Problem::Reconcile(e.to_string()));
            }
        }
    }
    if desired.errors.is_empty() {
        let keep = desired.objects.iter().map(Object::id).collect();
        if let Err(e) = prune(ctx, gc, &keep, served.service_monitors).await {
            observed.problems.push(Problem::Reconcile(e.to_string()));
        }
    }
    let selectors: Vec<_> = daemonsets.iter().map(node_selector).collect();
    let survey = node_counts(
        ctx,
        ready_plugins,
        &selectors,
        gc.metadata.generation.unwrap_or(0),
        cluster_policy || gc.spec.device_plugin.enabled,
    )
    .await?;
    observed.nodes = survey.counts;
    observed.unserved = survey.unserved;
    observed.held_on_dra = survey.held_on_dra;
    observed.unlabelled_gpu_nodes = survey.unlabelled;
    observed.migration = survey.migration;
    for (ds, labelled) in daemonsets.iter().zip(survey.selected) {
        observed.operands.push(status::daemonset(ds, labelled));
    }
    let not_created =
        pod_creation::failures(&ctx.client, &ctx.settings.namespace, &daemonsets, now).await;
    observed
        .problems
        .extend(not_created.into_iter().map(Problem::PodsNotCreated));
    let failing =
        crate::pod_failures::read(&ctx.client, &ctx.settings.namespace, &daemonsets).await;
    observed
        .problems
        .extend(crate::pod_failures::summary(&failing).map(Problem::PodsFailing));
    let new_status = status::status(&observed, gc.metadata.generation, gc.status.as_ref(), now);
    let ready = new_status.state == Some(api::gpucluster::State::Ready);
    write_status(ctx, gc, new_status).await?;
    ctx.metrics.ready.set(i64::from(ready));
    Ok(if ready {
        Action::requeue(Duration::from_secs(300))
    } else {
        Action::requeue(Duration::from_secs(10))
    })
}

/// The GPUCluster key of an operand that names a GPUCluster as its controller.
fn to_gpu_cluster<K: Resource>(operand: K) -> Option<ObjectRef<GPUCluster>> {
    let owned = operand
        .meta()
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.kind == "GPUCluster" && o.controller == Some(true));
    owned.then(|| ObjectRef::new(GPU_CLUSTER_NAME))
}

/// A live object as its typed kind.
fn typed<T: serde::de::DeserializeOwned>(live: &DynamicObject) -> Result<T, serde_json::Error> {
    serde_json::from_value(serde_json::to_value(live)?)
}

fn error_policy(_gc: Arc<GPUCluster>, error: &Error, ctx: Arc<Context>) -> Action {
    if let Error::Draining(_) = error {
        // Deletion in progress, not a failure: look again soon.
        tracing::info!(%error, "deleting");
        return Action::requeue(Duration::from_secs(2));
    }
    tracing::warn!(%error, "reconcile failed");
    ctx.metrics
        .errors
        .get_or_create(&metrics::ErrorLabels {
            error: error.metric_label(),
        })
        .inc();
    Action::requeue(Duration::from_secs(5))
}

/// Who the operator's Events say reported them: its field manager and this replica's pod.
pub fn reporter() -> Reporter {
    Reporter {
        controller: FIELD_MANAGER.into(),
        instance: std::env::var("POD_NAME").ok(),
    }
}

/// Runs the GPUCluster controller until `shutdown` resolves; `features` is the DRA feature cache
/// it shares with the GPUClass controller.
pub async fn run(
    client: kube::Client,
    settings: Settings,
    metrics: Metrics,
    features: Arc<FeatureCache>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let ns = settings.namespace.clone();
    // Whether a ClusterPolicy serves the device-plugin plane is known before the first render, so
    // a restart never puts our device plugin beside its operator's for a moment.
    let (mut cluster_policy, follow) =
        service::presence::follow(client.clone(), cluster_policy::api_resource());
    tokio::spawn(follow);
    service::presence::first_answer(&mut cluster_policy).await;
    let changes = futures::stream::unfold(cluster_policy.clone(), |mut rx| async move {
        rx.changed().await.ok().map(|()| ((), rx))
    });
    let (operands, writers) = cache::Operands::new(&ns);
    let ctx = Arc::new(Context {
        operands,
        events: EventPublisher::new(client.clone(), reporter()),
        client: client.clone(),
        settings,
        metrics,
        served: tokio::sync::Mutex::new(None),
        features,
        cluster_policy,
    });
    let mut controller = Controller::new(
        Api::<GPUCluster>::all(client.clone()),
        watcher::Config::default(),
    );
    // Every operand maps to the one GPUCluster key. (`owns` would key a namespaced operand's owner
    // under the operand's namespace: a second key for the same cluster-scoped object, so one change
    // ran two reconciles.) The same watches keep the stores reconciles read.
    for (stream, ar) in writers.watch(&client, &ns) {
        controller = controller.watches_stream_with(stream, to_gpu_cluster, ar);
    }
    let controller = controller
        .watches_stream(nodes::handover_changes(&client), |_| {
            Some(ObjectRef::<GPUCluster>::new(GPU_CLUSTER_NAME))
        })
        .reconcile_all_on(changes)
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx);
    service::binary::drain_results(controller).await;
}
