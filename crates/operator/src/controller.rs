//! The GPUCluster controller: applies the rendered operands, prunes what left the desired set,
//! drains claim consumers before the plugin on deletion, and writes status only when it changed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use api::contract::{GPU_CLUSTER_FINALIZER, GPU_CLUSTER_NAME, labels as l, objects as o};
use api::gpucluster::{GPUClusterStatus, NodeCounts};
use api::{AllocationMode, GPUCluster};
use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Namespace, Node, Service};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaimTemplate};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, PartialObjectMeta,
    Patch, PatchParams, PropagationPolicy,
};
use kube::runtime::Controller;
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::watcher;
use kube::{Api, Resource, ResourceExt};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde_json::{Value, json};

use crate::diff;
use crate::pod_creation;
use crate::render::{self, ClusterFacts, DefaultImages, Inputs, Object};
use crate::status::{self, Observed, Problem};

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

/// Why a reconcile failed; the label is the metric's `error` value.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An API call failed.
    #[error("{action}: {source}")]
    Api {
        /// What was being done, naming the object.
        action: String,
        /// The API error.
        source: kube::Error,
    },
}

impl Error {
    fn metric_label(&self) -> &'static str {
        match self {
            Error::Api { .. } => "api",
        }
    }
}

fn api_err(action: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    let action = action.into();
    move |source| Error::Api { action, source }
}

/// Counters and gauges of the operator's work.
#[derive(Clone, Debug, Default)]
pub struct Metrics {
    reconciles: Counter,
    applies: Counter,
    deletes: Counter,
    status_writes: Counter,
    ready: Gauge,
    errors: Family<Vec<(String, String)>, Counter>,
}

impl Metrics {
    /// Registers the metrics under `gpu_operator_`.
    pub fn register(&self, registry: &mut Registry) {
        let sub = registry.sub_registry_with_prefix("gpu_operator");
        sub.register(
            "reconciles",
            "GPUCluster reconciles run",
            self.reconciles.clone(),
        );
        sub.register(
            "applies",
            "Operand objects created or updated",
            self.applies.clone(),
        );
        sub.register(
            "deletes",
            "Operand objects pruned or drained",
            self.deletes.clone(),
        );
        sub.register(
            "status_writes",
            "GPUCluster status updates",
            self.status_writes.clone(),
        );
        sub.register(
            "ready",
            "1 when the GPUCluster is ready",
            self.ready.clone(),
        );
        sub.register(
            "reconcile_errors",
            "Failed reconciles by cause",
            self.errors.clone(),
        );
    }
}

struct Context {
    client: kube::Client,
    settings: Settings,
    recorder: Recorder,
    metrics: Metrics,
}

/// The kinds the operator owns: (apiVersion, kind, namespaced).
const OWNED_KINDS: [(&str, &str, bool); 8] = [
    ("apps/v1", "DaemonSet", true),
    ("apps/v1", "Deployment", true),
    ("v1", "Service", true),
    ("resource.k8s.io/v1", "ResourceClaimTemplate", true),
    ("resource.k8s.io/v1", "DeviceClass", false),
    (
        "admissionregistration.k8s.io/v1",
        "ValidatingAdmissionPolicy",
        false,
    ),
    (
        "admissionregistration.k8s.io/v1",
        "ValidatingAdmissionPolicyBinding",
        false,
    ),
    ("monitoring.coreos.com/v1", "ServiceMonitor", true),
];

fn resource(api_version: &str, kind: &str) -> ApiResource {
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind))
}

impl Context {
    fn dynamic(&self, api_version: &str, kind: &str, namespaced: bool) -> Api<DynamicObject> {
        let ar = resource(api_version, kind);
        if namespaced {
            Api::namespaced_with(self.client.clone(), &self.settings.namespace, &ar)
        } else {
            Api::all_with(self.client.clone(), &ar)
        }
    }

    async fn event(&self, gc: &GPUCluster, type_: EventType, reason: &str, mut note: String) {
        // The API rejects notes over 1 KiB; keep the start, which names the object.
        if note.len() > 1000 {
            let cut = (0..=1000)
                .rev()
                .find(|i| note.is_char_boundary(*i))
                .unwrap_or(0);
            note.truncate(cut);
            note.push_str(" ...");
        }
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(note),
            action: "Reconcile".into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, &gc.object_ref(&())).await {
            tracing::warn!(error = %e, "publishing an event failed");
        }
    }
}

/// What the discovery API says about the cluster.
struct Served {
    dra: bool,
    service_monitors: bool,
}

async fn served(client: &kube::Client) -> Served {
    let has = |group: &str, version: &str, plural: &str| {
        let client = client.clone();
        let (group, version, plural) = (group.to_owned(), version.to_owned(), plural.to_owned());
        async move {
            let gv = format!("/apis/{group}/{version}");
            let request = http::Request::get(gv)
                .body(Vec::new())
                .expect("a valid request");
            match client
                .request::<k8s_openapi::apimachinery::pkg::apis::meta::v1::APIResourceList>(request)
                .await
            {
                Ok(list) => list.resources.iter().any(|r| r.name == plural),
                Err(_) => false,
            }
        }
    };
    Served {
        dra: has("resource.k8s.io", "v1", "deviceclasses").await,
        service_monitors: has("monitoring.coreos.com", "v1", "servicemonitors").await,
    }
}

fn owner_reference(gc: &GPUCluster) -> OwnerReference {
    gc.controller_owner_ref(&())
        .expect("a GPUCluster from the API has a name and uid")
}

fn with_owner(object: &Object, owner: &OwnerReference) -> Value {
    let mut value = object.to_value();
    value["metadata"]["ownerReferences"] = json!([owner]);
    value
}

/// Applies `object` unless the live copy already holds everything we want. Returns the live object.
async fn apply(
    ctx: &Context,
    gc: &GPUCluster,
    object: &Object,
    owner: &OwnerReference,
) -> Result<DynamicObject, Error> {
    let want = with_owner(object, owner);
    let (api_version, kind) = (
        want["apiVersion"].as_str().unwrap_or_default(),
        want["kind"].as_str().unwrap_or_default(),
    );
    let namespaced = want["metadata"].get("namespace").is_some();
    let api = ctx.dynamic(api_version, kind, namespaced);
    let name = want["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let live = api
        .get_opt(&name)
        .await
        .map_err(api_err(format!("reading {}", object.id())))?;
    if let Some(live) = &live {
        let live_value = serde_json::to_value(live).unwrap_or_default();
        if diff::contains(&live_value, &want) {
            return Ok(live.clone());
        }
    }
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let applied = api
        .patch(&name, &params, &Patch::Apply(&want))
        .await
        .map_err(api_err(format!("applying {}", object.id())))?;
    ctx.metrics.applies.inc();
    let verb = if live.is_some() { "Updated" } else { "Created" };
    tracing::info!(object = %object.id(), "{verb}");
    ctx.event(
        gc,
        EventType::Normal,
        verb,
        format!("{verb} {}", object.id()),
    )
    .await;
    Ok(applied)
}

/// Deletes owned objects that are no longer desired.
async fn prune(
    ctx: &Context,
    gc: &GPUCluster,
    keep: &BTreeSet<String>,
    service_monitors: bool,
) -> Result<(), Error> {
    let uid = gc.uid().unwrap_or_default();
    for (api_version, kind, namespaced) in OWNED_KINDS {
        if kind == "ServiceMonitor" && !service_monitors {
            continue;
        }
        let api = ctx.dynamic(api_version, kind, namespaced);
        let list = api
            .list_metadata(&ListParams::default().labels(MANAGED_SELECTOR))
            .await
            .map_err(api_err(format!("listing {kind}s")))?;
        for item in list.items {
            let owned = item.owner_references().iter().any(|r| r.uid == uid);
            let id = format!("{kind}/{}", item.name_any());
            if owned && !keep.contains(&id) {
                api.delete(&item.name_any(), &DeleteParams::background())
                    .await
                    .map_err(api_err(format!("deleting {id}")))?;
                ctx.metrics.deletes.inc();
                ctx.event(
                    gc,
                    EventType::Normal,
                    "Deleted",
                    format!("Deleted {id}: no longer in the GPUCluster spec"),
                )
                .await;
            }
        }
    }
    Ok(())
}

async fn ensure_admin_access_label(ctx: &Context) -> Result<(), Error> {
    let namespaces: Api<Namespace> = Api::all(ctx.client.clone());
    let ns = &ctx.settings.namespace;
    let current = namespaces
        .get_metadata(ns)
        .await
        .map_err(api_err(format!("reading namespace {ns}")))?;
    if current
        .labels()
        .get(l::ADMIN_ACCESS_NAMESPACE)
        .map(String::as_str)
        != Some("true")
    {
        let patch = json!({"metadata": {"labels": {l::ADMIN_ACCESS_NAMESPACE: "true"}}});
        namespaces
            .patch_metadata(ns, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(api_err(format!("labelling namespace {ns}")))?;
    }
    Ok(())
}

/// A DaemonSet's pod `nodeSelector`.
fn node_selector(ds: &DaemonSet) -> BTreeMap<String, String> {
    ds.spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.node_selector.clone())
        .unwrap_or_default()
}

/// Counts GPU nodes, DRA-mode ones, those with no allocation mode yet, and for each of `selectors`
/// the GPU nodes it selects.
async fn node_counts(
    ctx: &Context,
    plugin_ready: i32,
    selectors: &[BTreeMap<String, String>],
) -> Result<(NodeCounts, i32, Vec<i32>), Error> {
    let nodes: Api<PartialObjectMeta<Node>> = Api::all(ctx.client.clone());
    let selector = format!("{}=true", l::GPU_PRESENT);
    let (mut gpu, mut dra) = (0usize, 0usize);
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
        dra += page
            .items
            .iter()
            .filter(|n| {
                n.labels().get(l::ALLOCATION_MODE).map(String::as_str)
                    == Some(AllocationMode::Dra.as_str())
            })
            .count();
        match page.metadata.continue_.filter(|t| !t.is_empty()) {
            Some(next) => token = Some(next),
            None => break,
        }
    }
    let counts = NodeCounts {
        gpu: gpu.try_into().unwrap_or(i32::MAX),
        dra: dra.try_into().unwrap_or(i32::MAX),
        ready_dra: plugin_ready,
    };
    Ok((counts, unlabelled, selected))
}

async fn write_status(
    ctx: &Context,
    gc: &GPUCluster,
    status: GPUClusterStatus,
) -> Result<(), Error> {
    if gc.status.as_ref() == Some(&status) {
        return Ok(());
    }
    tracing::info!(state = ?status.state, "writing GPUCluster status");
    tracing::debug!(old = ?gc.status, new = ?status, "GPUCluster status change");
    let api: Api<GPUCluster> = Api::all(ctx.client.clone());
    api.patch_status(
        &gc.name_any(),
        &PatchParams::default(),
        &Patch::Merge(json!({"status": status})),
    )
    .await
    .map_err(api_err("writing GPUCluster status"))?;
    ctx.metrics.status_writes.inc();
    Ok(())
}

/// Adds our finalizer, guarded by the resourceVersion read.
async fn ensure_finalizer(ctx: &Context, gc: &GPUCluster) -> Result<(), Error> {
    if gc.finalizers().iter().any(|f| f == GPU_CLUSTER_FINALIZER) {
        return Ok(());
    }
    let mut finalizers = gc.finalizers().to_vec();
    finalizers.push(GPU_CLUSTER_FINALIZER.into());
    set_finalizers(ctx, gc, finalizers).await
}

async fn set_finalizers(
    ctx: &Context,
    gc: &GPUCluster,
    finalizers: Vec<String>,
) -> Result<(), Error> {
    let api: Api<GPUCluster> = Api::all(ctx.client.clone());
    let patch =
        json!({"metadata": {"resourceVersion": gc.resource_version(), "finalizers": finalizers}});
    api.patch(
        &gc.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
    .map_err(api_err("updating GPUCluster finalizers"))?;
    Ok(())
}

/// Deletion: claim consumers go first (foreground), the plugin stays until they are gone; then the
/// finalizer is removed and garbage collection takes the rest.
async fn drain(ctx: &Context, gc: &GPUCluster) -> Result<Action, Error> {
    if !gc.finalizers().iter().any(|f| f == GPU_CLUSTER_FINALIZER) {
        return Ok(Action::await_change());
    }
    let daemonsets: Api<DaemonSet> = Api::namespaced(ctx.client.clone(), &ctx.settings.namespace);
    let uid = gc.uid().unwrap_or_default();
    let consumers: Vec<DaemonSet> = daemonsets
        .list(&ListParams::default().labels(MANAGED_SELECTOR))
        .await
        .map_err(api_err("listing operand DaemonSets"))?
        .items
        .into_iter()
        .filter(|ds| ds.owner_references().iter().any(|r| r.uid == uid))
        .filter(|ds| {
            let claims = ds
                .spec
                .as_ref()
                .and_then(|s| s.template.spec.as_ref())
                .and_then(|p| p.resource_claims.as_ref());
            claims.is_some_and(|c| !c.is_empty())
        })
        .collect();
    if consumers.is_empty() {
        let rest = gc
            .finalizers()
            .iter()
            .filter(|f| *f != GPU_CLUSTER_FINALIZER)
            .cloned()
            .collect();
        set_finalizers(ctx, gc, rest).await?;
        return Ok(Action::await_change());
    }
    let foreground = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Foreground),
        ..DeleteParams::default()
    };
    for ds in consumers
        .iter()
        .filter(|ds| ds.metadata.deletion_timestamp.is_none())
    {
        daemonsets
            .delete(&ds.name_any(), &foreground)
            .await
            .map_err(api_err(format!("deleting DaemonSet/{}", ds.name_any())))?;
        ctx.metrics.deletes.inc();
    }
    let names: Vec<String> = consumers.iter().map(|d| d.name_any()).collect();
    ctx.event(
        gc,
        EventType::Normal,
        "DrainingClaimConsumers",
        format!(
            "waiting for {} to go before the kubelet plugin",
            names.join(", ")
        ),
    )
    .await;
    Ok(Action::requeue(Duration::from_secs(2)))
}

async fn reconcile(gc: Arc<GPUCluster>, ctx: Arc<Context>) -> Result<Action, Error> {
    ctx.metrics.reconciles.inc();
    let now = Timestamp::now();
    if gc.name_any() != GPU_CLUSTER_NAME {
        write_status(&ctx, &gc, status::ignored(gc.status.as_ref(), now)).await?;
        return Ok(Action::await_change());
    }
    if gc.meta().deletion_timestamp.is_some() {
        return drain(&ctx, &gc).await;
    }
    ensure_finalizer(&ctx, &gc).await?;

    let mut observed = Observed {
        namespace: ctx.settings.namespace.clone(),
        ..Observed::default()
    };
    let served = served(&ctx.client).await;
    if !served.dra {
        observed.problems.push(Problem::DraApiNotServed);
        write_status(
            &ctx,
            &gc,
            status::status(&observed, gc.metadata.generation, gc.status.as_ref(), now),
        )
        .await?;
        ctx.metrics.ready.set(0);
        return Ok(Action::requeue(Duration::from_secs(60)));
    }
    ensure_admin_access_label(&ctx).await?;

    let inputs = Inputs {
        namespace: &ctx.settings.namespace,
        images: &ctx.settings.images,
        facts: ClusterFacts {
            service_monitors_served: served.service_monitors,
        },
    };
    let desired = render::desired(&gc.spec, &inputs);
    for e in &desired.errors {
        observed.problems.push(Problem::Reconcile(e.to_string()));
        ctx.event(&gc, EventType::Warning, "InvalidSpec", e.to_string())
            .await;
    }
    let owner = owner_reference(&gc);
    let mut plugin_ready = 0;
    let mut daemonsets = Vec::new();
    for object in &desired.objects {
        match apply(&ctx, &gc, object, &owner).await {
            Ok(live) => {
                let value = serde_json::to_value(&live).unwrap_or_default();
                match object {
                    Object::DaemonSet(_) => {
                        let ds: DaemonSet = serde_json::from_value(value).unwrap_or_default();
                        if ds.name_any() == o::KUBELET_PLUGIN_DAEMONSET {
                            plugin_ready = ds.status.as_ref().map(|s| s.number_ready).unwrap_or(0);
                        }
                        daemonsets.push(ds);
                    }
                    Object::Deployment(_) => {
                        let d: Deployment = serde_json::from_value(value).unwrap_or_default();
                        observed.operands.push(status::deployment(&d));
                    }
                    _ => {}
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "apply failed");
                ctx.event(&gc, EventType::Warning, "ApplyFailed", e.to_string())
                    .await;
                observed.problems.push(Problem::Reconcile(e.to_string()));
            }
        }
    }
    if desired.errors.is_empty() {
        let keep = desired.objects.iter().map(Object::id).collect();
        if let Err(e) = prune(&ctx, &gc, &keep, served.service_monitors).await {
            observed.problems.push(Problem::Reconcile(e.to_string()));
        }
    }
    let selectors: Vec<_> = daemonsets.iter().map(node_selector).collect();
    let (nodes, unlabelled, labelled) = node_counts(&ctx, plugin_ready, &selectors).await?;
    observed.nodes = nodes;
    observed.unlabelled_gpu_nodes = unlabelled;
    for (ds, labelled) in daemonsets.iter().zip(labelled) {
        observed.operands.push(status::daemonset(ds, labelled));
    }
    let not_created =
        pod_creation::failures(&ctx.client, &ctx.settings.namespace, &daemonsets, now).await;
    observed
        .problems
        .extend(not_created.into_iter().map(Problem::PodsNotCreated));
    let new_status = status::status(&observed, gc.metadata.generation, gc.status.as_ref(), now);
    let ready = new_status.state == Some(api::gpucluster::State::Ready);
    write_status(&ctx, &gc, new_status).await?;
    ctx.metrics.ready.set(i64::from(ready));
    Ok(if ready {
        Action::requeue(Duration::from_secs(300))
    } else {
        Action::requeue(Duration::from_secs(10))
    })
}

fn error_policy(_gc: Arc<GPUCluster>, error: &Error, ctx: Arc<Context>) -> Action {
    tracing::warn!(%error, "reconcile failed");
    ctx.metrics
        .errors
        .get_or_create(&vec![("error".into(), error.metric_label().into())])
        .inc();
    Action::requeue(Duration::from_secs(5))
}

/// Runs the controller until `shutdown` resolves.
pub async fn run(
    client: kube::Client,
    settings: Settings,
    metrics: Metrics,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let ns = settings.namespace.clone();
    let owned = watcher::Config::default().labels(MANAGED_SELECTOR);
    let reporter = Reporter {
        controller: FIELD_MANAGER.into(),
        instance: std::env::var("POD_NAME").ok(),
    };
    let ctx = Arc::new(Context {
        recorder: Recorder::new(client.clone(), reporter),
        client: client.clone(),
        settings,
        metrics,
    });
    Controller::new(
        Api::<GPUCluster>::all(client.clone()),
        watcher::Config::default(),
    )
    .owns(
        Api::<DaemonSet>::namespaced(client.clone(), &ns),
        owned.clone(),
    )
    .owns(
        Api::<Deployment>::namespaced(client.clone(), &ns),
        owned.clone(),
    )
    .owns(
        Api::<Service>::namespaced(client.clone(), &ns),
        owned.clone(),
    )
    .owns(
        Api::<ResourceClaimTemplate>::namespaced(client.clone(), &ns),
        owned.clone(),
    )
    .owns(Api::<DeviceClass>::all(client.clone()), owned.clone())
    .owns(
        Api::<ValidatingAdmissionPolicy>::all(client.clone()),
        owned.clone(),
    )
    .owns(
        Api::<ValidatingAdmissionPolicyBinding>::all(client.clone()),
        owned,
    )
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
