//! Writing the GPUCluster status, only when it changed.

use api::GPUCluster;
use api::gpucluster::GPUClusterStatus;
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;

use super::{Context, Error, api_err};

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
