//! Whether pods on a node still hold GPUs of the plane it is leaving (DRA claims or device-plugin
//! resources), read from the API.

use api::AllocationMode;
use api::contract::DRIVER_NAME;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use kube::api::ListParams;

use crate::plan::GpuClaims;

/// Whether the pod still counts: running, pending or terminating (not Succeeded or Failed).
fn is_live(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    !matches!(phase, Some("Succeeded" | "Failed"))
}

/// Names of the ResourceClaims a pod uses: generated from templates (from its status), made by
/// the scheduler for its extended resources (`nvidia.com/gpu` on a DRA node, from its status), and
/// named directly (from its spec).
fn claim_names(pod: &Pod) -> impl Iterator<Item = &str> {
    let generated = pod
        .status
        .iter()
        .flat_map(|s| s.resource_claim_statuses.iter().flatten())
        .filter_map(|c| c.resource_claim_name.as_deref());
    let extended = pod
        .status
        .iter()
        .filter_map(|s| s.extended_resource_claim_status.as_ref())
        .map(|c| c.resource_claim_name.as_str());
    let named = pod
        .spec
        .iter()
        .flat_map(|s| s.resource_claims.iter().flatten())
        .filter_map(|c| c.resource_claim_name.as_deref());
    generated.chain(extended).chain(named)
}

/// Whether the claim has a device allocated by our driver (admin-access results included).
pub fn allocated_by_gpu_driver(claim: &ResourceClaim) -> bool {
    claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .is_some_and(|d| d.results.iter().flatten().any(|r| r.driver == DRIVER_NAME))
}

/// Whether a pod holds GPUs from the device plugin: a container (or init container) asks for an
/// `nvidia.com/` extended resource and the pod was not given it through a DRA claim (the
/// scheduler's extended-resource mapping records that claim in the pod's status).
pub fn holds_device_plugin_gpus(pod: &Pod) -> bool {
    let Some(spec) = &pod.spec else { return false };
    let through_dra = pod
        .status
        .as_ref()
        .is_some_and(|s| s.extended_resource_claim_status.is_some());
    let asks = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .filter_map(|c| c.resources.as_ref())
        .flat_map(|r| {
            r.limits
                .iter()
                .chain(r.requests.iter())
                .flat_map(|m| m.keys())
        })
        .any(|k| k.starts_with("nvidia.com/"));
    asks && !through_dra
}

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

/// Whether a DaemonSet runs the pod (it leaves with its deploy label; eviction would only bring
/// it back).
pub fn is_daemonset_pod(pod: &Pod) -> bool {
    pod.metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.kind == "DaemonSet" && o.controller == Some(true))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn claim_names_come_from_status_extended_resources_and_spec_and_terminal_pods_do_not_count() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"containers": [], "resourceClaims": [
                {"name": "a", "resourceClaimName": "shared-claim"},
                {"name": "b", "resourceClaimTemplateName": "tmpl"}]},
            "status": {"phase": "Running", "resourceClaimStatuses": [
                {"name": "b", "resourceClaimName": "p-b-x7k2"}],
                "extendedResourceClaimStatus": {"resourceClaimName": "p-extended-resources-q9",
                    "requestMappings": [{"containerName": "c", "resourceName": "nvidia.com/gpu",
                                         "requestName": "container-0-request-0"}]}}
        }))
        .unwrap();
        assert_eq!(
            claim_names(&pod).collect::<Vec<_>>(),
            ["p-b-x7k2", "p-extended-resources-q9", "shared-claim"]
        );
        assert!(is_live(&pod));
        for phase in ["Succeeded", "Failed"] {
            let mut done = pod.clone();
            done.status.as_mut().unwrap().phase = Some(phase.into());
            assert!(!is_live(&done), "{phase}");
        }
    }

    #[test]
    fn device_plugin_gpus_are_nvidia_resources_not_given_through_a_claim() {
        let pod = |resources: serde_json::Value, status: serde_json::Value| -> Pod {
            serde_json::from_value(json!({
                "metadata": {"name": "p"},
                "spec": {"containers": [{"name": "c", "resources": resources}]},
                "status": status,
            }))
            .unwrap()
        };
        let gpu = json!({"limits": {"nvidia.com/gpu": "1"}});
        assert!(holds_device_plugin_gpus(&pod(gpu.clone(), json!({}))));
        let mig = json!({"requests": {"nvidia.com/mig-1g.10gb": "1"}});
        assert!(holds_device_plugin_gpus(&pod(mig, json!({}))));
        assert!(!holds_device_plugin_gpus(&pod(
            json!({"limits": {"cpu": "1"}}),
            json!({})
        )));
        let mapped = json!({"extendedResourceClaimStatus": {"resourceClaimName": "p-extended-resources-x",
            "requestMappings": [{"containerName": "c", "resourceName": "nvidia.com/gpu", "requestName": "container-0-request-0"}]}});
        assert!(
            !holds_device_plugin_gpus(&pod(gpu, mapped)),
            "served by DRA"
        );
    }

    #[test]
    fn only_our_driver_allocations_count() {
        let claim = |driver: &str, admin: bool| -> ResourceClaim {
            serde_json::from_value(json!({
                "metadata": {"name": "c"},
                "spec": {},
                "status": {"allocation": {"devices": {"results": [
                    {"request": "r", "driver": driver, "pool": "node-a", "device": "gpu-0", "adminAccess": admin}]}}}
            }))
            .unwrap()
        };
        assert!(allocated_by_gpu_driver(&claim("gpu.nvidia.com", false)));
        assert!(allocated_by_gpu_driver(&claim("gpu.nvidia.com", true)));
        assert!(!allocated_by_gpu_driver(&claim(
            "compute-domain.nvidia.com",
            false
        )));
        let unallocated: ResourceClaim =
            serde_json::from_value(json!({"metadata": {"name": "c"}, "spec": {}})).unwrap();
        assert!(!allocated_by_gpu_driver(&unallocated));
    }
}
