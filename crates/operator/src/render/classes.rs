//! The DeviceClasses workloads reference in their claims.

use api::GPUClusterSpec;
use api::contract::{
    COMPUTE_DOMAIN_DRIVER_NAME as COMPUTE_DOMAIN_DRIVER, DRIVER_NAME, objects as o,
};
use serde_json::json;

use super::{Object, cluster_meta, typed};

fn class(name: &str, expression: String) -> Object {
    Object::DeviceClass(typed(json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": cluster_meta(name, "dra-driver"),
        "spec": {"selectors": [{"cel": {"expression": expression}}]},
    })))
}

fn typed_device(driver: &str, kind: &str) -> String {
    format!("device.driver == '{driver}' && device.attributes['{driver}'].type == '{kind}'")
}

/// `gpu`, `mig` and `vfio` classes, and the two ComputeDomain classes when they are on.
pub fn device_classes(spec: &GPUClusterSpec) -> Vec<Object> {
    let mut classes = vec![
        class(o::DEVICE_CLASS_GPU, typed_device(DRIVER_NAME, "gpu")),
        class(o::DEVICE_CLASS_MIG, typed_device(DRIVER_NAME, "mig")),
        class(o::DEVICE_CLASS_VFIO, typed_device(DRIVER_NAME, "vfio")),
    ];
    if spec.dra_driver.compute_domains.enabled {
        classes.push(class(
            o::DEVICE_CLASS_CD_DAEMON,
            typed_device(COMPUTE_DOMAIN_DRIVER, "daemon"),
        ));
        classes.push(class(
            o::DEVICE_CLASS_CD_CHANNEL,
            format!(
                "{} && device.attributes['{COMPUTE_DOMAIN_DRIVER}'].id == 0",
                typed_device(COMPUTE_DOMAIN_DRIVER, "channel")
            ),
        ));
    }
    classes
}
