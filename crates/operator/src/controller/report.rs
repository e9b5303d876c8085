//! Writing the GPUCluster status, only when it changed, by server-side apply with the operator's
//! field manager: fields the status no longer has (an operand gone, a count unset) are removed, and
//! another writer of the status subresource keeps its own fields.

use api::GPUCluster;
use api::gpucluster::GPUClusterStatus;
use kube::api::{Patch, PatchParams};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;

use super::{Context, Error, FIELD_MANAGER, api_err};

pub(super) async fn write_status(
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
    let name = gc.name_any();
    let applied = json!({"apiVersion": GPUCluster::api_version(&()), "kind": GPUCluster::kind(&()),
                         "metadata": {"name": name}, "status": status});
    api.patch_status(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(applied),
    )
    .await
    .map_err(api_err("writing GPUCluster status"))?;
    ctx.metrics.status_writes.inc();
    Ok(())
}
