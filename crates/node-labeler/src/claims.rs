//! Whether pods on a node still hold GPUs of the plane it is leaving (DRA claims or device-plugin
//! resources), read from the API.

use api::AllocationMode;
use api::pods::{allocated_by_gpu_driver, claim_names, holds_device_plugin_gpus, is_live};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use kube::api::ListParams;

use crate::plan::GpuClaims;

/// Live pods on `node` that hold GPUs of `plane`: claims allocated by `gpu.nvidia.com` (a claim
/// that no longer exists holds nothing), or resources the device plugin gave.
pub async fn holding_pods(
    client: &kube::Client,
    node: &str,
    plane: AllocationMode,
) -> Result<Vec<Pod>, kube::Error> {
    let pods: Api<Pod> = Api::all(client.clone());
    let params = ListParams::default().fields(&format!("spec.nodeName={node}"));
    let mut holding = Vec::new();
    for pod in pods.list(&params).await?.items {
        if !is_live(&pod) {
            continue;
        }
        let holds = match plane {
            AllocationMode::DevicePlugin => holds_device_plugin_gpus(&pod),
            AllocationMode::Dra => holds_dra_claims(client, &pod).await?,
        };
        if holds {
            holding.push(pod);
        }
    }
    Ok(holding)
}

async fn holds_dra_claims(client: &kube::Client, pod: &Pod) -> Result<bool, kube::Error> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), namespace);
    for name in claim_names(pod) {
        if claims
            .get_opt(name)
            .await?
            .is_some_and(|c| allocated_by_gpu_driver(&c))
        {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Looks up whether any live pod on `node` holds GPUs of `plane`.
///
/// Anything that cannot be read counts as held: removing a plugin from under a GPU in use is the
/// failure this check exists to prevent.
pub async fn on_node(client: &kube::Client, node: &str, plane: AllocationMode) -> GpuClaims {
    match holding_pods(client, node, plane).await {
        Ok(pods) if pods.is_empty() => GpuClaims::None,
        Ok(_) => GpuClaims::Held,
        Err(e) => {
            tracing::warn!(node, %plane, error = %e, "reading what the node's pods hold failed; treating its GPUs as held");
            GpuClaims::Held
        }
    }
}
