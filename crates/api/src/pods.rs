//! What a pod holds of the GPUs, read from the pod and its claims: the claims it uses, whether it
//! still counts, whether the device plugin gave it GPUs. Shared by the controllers and `kubectl gpu`.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;

use crate::contract::DRIVER_NAME;

/// Whether the pod still counts: running, pending or terminating (not Succeeded or Failed).
pub fn is_live(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    !matches!(phase, Some("Succeeded" | "Failed"))
}

/// Names of the ResourceClaims a pod uses, in its namespace: generated from templates (from its
/// status), made by the scheduler for its extended resources (`nvidia.com/gpu` on a DRA node, from
/// its status), and named directly (from its spec).
pub fn claim_names(pod: &Pod) -> impl Iterator<Item = &str> {
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

/// How many `nvidia.com/` devices the device plugin gave the pod: the most any container asks
/// for each resource summed over the containers (an init container's ask counts where it is the
/// larger), nothing when the scheduler mapped the ask to a DRA claim (recorded in the pod's
/// status).
pub fn device_plugin_gpus(pod: &Pod) -> i64 {
    let Some(spec) = &pod.spec else { return 0 };
    let through_dra = pod
        .status
        .as_ref()
        .is_some_and(|s| s.extended_resource_claim_status.is_some());
    if through_dra {
        return 0;
    }
    let asked = |c: &k8s_openapi::api::core::v1::Container| -> i64 {
        let Some(r) = c.resources.as_ref() else {
            return 0;
        };
        // A limit is the request for extended resources; either may be written alone.
        let keys: std::collections::BTreeSet<&String> = r
            .limits
            .iter()
            .chain(r.requests.iter())
            .flat_map(|m| m.keys())
            .filter(|k| k.starts_with("nvidia.com/"))
            .collect();
        keys.into_iter()
            .map(|k| {
                let q = r.limits.as_ref().and_then(|m| m.get(k));
                let q = q.or_else(|| r.requests.as_ref().and_then(|m| m.get(k)));
                q.and_then(|q| q.0.parse::<i64>().ok()).unwrap_or(1)
            })
            .sum()
    };
    let containers: i64 = spec.containers.iter().map(asked).sum();
    let init = spec.init_containers.iter().flatten().map(asked).max();
    containers.max(init.unwrap_or(0))
}

/// Whether the device plugin gave the pod GPUs: a container (or init container) asks for an
/// `nvidia.com/` extended resource and the scheduler did not map it to a DRA claim.
pub fn holds_device_plugin_gpus(pod: &Pod) -> bool {
    device_plugin_gpus(pod) > 0
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
    use serde_json::json;

    use super::*;

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
                "spec": {"containers": [{"name": "c", "resources": resources},
                                        {"name": "d", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]},
                "status": status,
            }))
            .unwrap()
        };
        let gpu = json!({"limits": {"nvidia.com/gpu": "1"}});
        assert!(holds_device_plugin_gpus(&pod(gpu.clone(), json!({}))));
        assert_eq!(device_plugin_gpus(&pod(gpu.clone(), json!({}))), 3);
        let mig = json!({"requests": {"nvidia.com/mig-1g.10gb": "1"}});
        assert_eq!(device_plugin_gpus(&pod(mig, json!({}))), 3);
        assert_eq!(
            device_plugin_gpus(&pod(json!({"limits": {"cpu": "1"}}), json!({}))),
            2
        );
        let none: Pod = serde_json::from_value(json!({"metadata": {"name": "p"},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {"cpu": "1"}}}]}}))
        .unwrap();
        assert!(!holds_device_plugin_gpus(&none));
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
