//! Whether pods on a node still hold GPU claims, read from the API.

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

/// Names of the ResourceClaims a pod uses: generated from templates (from its status) and named
/// directly (from its spec).
fn claim_names(pod: &Pod) -> impl Iterator<Item = &str> {
    let generated = pod
        .status
        .iter()
        .flat_map(|s| s.resource_claim_statuses.iter().flatten())
        .filter_map(|c| c.resource_claim_name.as_deref());
    let named = pod
        .spec
        .iter()
        .flat_map(|s| s.resource_claims.iter().flatten())
        .filter_map(|c| c.resource_claim_name.as_deref());
    generated.chain(named)
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

/// Looks up whether any live pod on `node` holds a claim allocated by `gpu.nvidia.com`.
///
/// Anything that cannot be read counts as held: removing the plugin from under a prepared claim is
/// the failure this check exists to prevent. A claim that no longer exists holds nothing.
pub async fn on_node(client: &kube::Client, node: &str) -> GpuClaims {
    let pods: Api<Pod> = Api::all(client.clone());
    let params = ListParams::default().fields(&format!("spec.nodeName={node}"));
    let pods = match pods.list(&params).await {
        Ok(list) => list.items,
        Err(e) => {
            tracing::warn!(node, error = %e, "listing the node's pods failed; treating GPU claims as held");
            return GpuClaims::Held;
        }
    };
    for pod in pods.iter().filter(|p| is_live(p)) {
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
        let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), namespace);
        for name in claim_names(pod) {
            match claims.get_opt(name).await {
                Ok(Some(claim)) if allocated_by_gpu_driver(&claim) => return GpuClaims::Held,
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(node, namespace, claim = name, error = %e, "reading a claim failed; treating it as held");
                    return GpuClaims::Held;
                }
            }
        }
    }
    GpuClaims::None
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn claim_names_come_from_status_and_spec_and_terminal_pods_do_not_count() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"containers": [], "resourceClaims": [
                {"name": "a", "resourceClaimName": "shared-claim"},
                {"name": "b", "resourceClaimTemplateName": "tmpl"}]},
            "status": {"phase": "Running", "resourceClaimStatuses": [
                {"name": "b", "resourceClaimName": "p-b-x7k2"}]}
        }))
        .unwrap();
        assert_eq!(
            claim_names(&pod).collect::<Vec<_>>(),
            ["p-b-x7k2", "shared-claim"]
        );
        assert!(is_live(&pod));
        for phase in ["Succeeded", "Failed"] {
            let mut done = pod.clone();
            done.status.as_mut().unwrap().phase = Some(phase.into());
            assert!(!is_live(&done), "{phase}");
        }
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
