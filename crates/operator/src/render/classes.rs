//! The DeviceClasses workloads reference in their claims.

use api::GPUClusterSpec;
use api::contract::{
    COMPUTE_DOMAIN_DRIVER_NAME as COMPUTE_DOMAIN_DRIVER, DRIVER_NAME, objects as o,
};
use serde_json::json;

use super::{ClusterFacts, Object, cluster_meta, typed};

fn class(name: &str, expression: String, extended_resource: Option<&str>) -> Object {
    let mut spec = json!({"selectors": [{"cel": {"expression": expression}}]});
    if let Some(resource) = extended_resource {
        spec["extendedResourceName"] = json!(resource);
    }
    Object::DeviceClass(typed(json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": cluster_meta(name, "dra-driver"),
        "spec": spec,
    })))
}

fn typed_device(driver: &str, kind: &str) -> String {
    format!("device.driver == '{driver}' && device.attributes['{driver}'].type == '{kind}'")
}

/// `gpu`, `mig` and `vfio` classes, the operands' own (whole GPUs and MIG devices), and the two ComputeDomain classes when they are on. Where the
/// apiserver serves it, the `gpu` class maps the extended resource `nvidia.com/gpu`: a pod asking
/// for it on a DRA node (no device plugin offers it there) gets a claim of that class, so a
/// workload needs no change when its node moves between the planes.
pub fn device_classes(spec: &GPUClusterSpec, facts: ClusterFacts) -> Vec<Object> {
    let gpu_resource = facts
        .extended_resources_served
        .then_some(api::contract::GPU_EXTENDED_RESOURCE);
    let mut classes = vec![
        class(
            o::DEVICE_CLASS_GPU,
            typed_device(DRIVER_NAME, "gpu"),
            gpu_resource,
        ),
        class(o::DEVICE_CLASS_MIG, typed_device(DRIVER_NAME, "mig"), None),
        class(
            o::DEVICE_CLASS_OPERANDS,
            format!(
                "device.driver == '{DRIVER_NAME}' && device.attributes['{DRIVER_NAME}'].type in ['gpu', 'mig']"
            ),
            None,
        ),
        class(
            o::DEVICE_CLASS_VFIO,
            typed_device(DRIVER_NAME, "vfio"),
            None,
        ),
    ];
    if spec.dra_driver.compute_domains.enabled {
        classes.push(class(
            o::DEVICE_CLASS_CD_DAEMON,
            typed_device(COMPUTE_DOMAIN_DRIVER, "daemon"),
            None,
        ));
        classes.push(class(
            o::DEVICE_CLASS_CD_CHANNEL,
            format!(
                "{} && device.attributes['{COMPUTE_DOMAIN_DRIVER}'].id == 0",
                typed_device(COMPUTE_DOMAIN_DRIVER, "channel")
            ),
            None,
        ));
    }
    classes
}
