//! The finalizer and the drain on deletion: claim consumers first, then the kubelet plugin.

use std::time::Duration;

use api::GPUCluster;
use api::contract::GPU_CLUSTER_FINALIZER;
use k8s_openapi::api::apps::v1::DaemonSet;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PropagationPolicy};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt};
use serde_json::json;

use super::{Context, Error, MANAGED_SELECTOR, api_err};

/// Adds our finalizer, guarded by the resourceVersion read.
pub(super) async fn ensure_finalizer(ctx: &Context, gc: &GPUCluster) -> Result<(), Error> {
    if gc.finalizers().iter().any(|f| f == GPU_CLUSTER_FINALIZER) {
        return Ok(());
    }
    let mut finalizers = gc.finalizers().to_vec();
    finalizers.push(GPU_CLUSTER_FINALIZER.into());
    set_finalizers(ctx, gc, finalizers).await
}

pub(super) async fn set_finalizers(
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
pub(super) async fn drain(ctx: &Context, gc: &GPUCluster) -> Result<Action, Error> {
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
