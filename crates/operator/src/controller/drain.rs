//! The finalizer's cleanup arm: on deletion claim consumers go first, then the kubelet plugin.

use api::GPUCluster;
use k8s_openapi::api::apps::v1::DaemonSet;
use kube::api::{DeleteParams, ListParams, PropagationPolicy};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt};

use super::{Context, Error, MANAGED_SELECTOR, api_err};

/// Deletion: claim consumers go first (foreground), the plugin stays until they are gone. Done
/// (`Ok`) once none is left, so `kube::runtime::finalizer` removes the finalizer and garbage
/// collection takes the rest; [`Error::Draining`] while some remain, which keeps the finalizer.
pub(super) async fn drain(ctx: &Context, gc: &GPUCluster) -> Result<Action, Error> {
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
    Err(Error::Draining(names))
}
