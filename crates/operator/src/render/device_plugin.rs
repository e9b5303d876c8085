//! The device plugin's DaemonSet, on nodes the labeler puts in `device-plugin` mode.

use api::GPUClusterSpec;
use api::contract::{env as e, labels as l, objects as o, paths};
use serde_json::json;

use super::plugin::{driver_validation, gpu_node_affinity, host_path, node_volumes, pull_secrets};
use super::{
    Inputs, Object, Operand, RenderError, env, node_name_env, operand_daemonset, resources,
};

const COMPONENT: &str = "device-plugin";

/// `nvidia-device-plugin-daemonset`, selecting `nvidia.com/gpu.deploy.device-plugin=true`;
/// nothing when `spec.devicePlugin.enabled` is false or a `ClusterPolicy` serves that plane.
pub fn device_plugin(
    spec: &GPUClusterSpec,
    inputs: &Inputs<'_>,
) -> Result<Vec<Object>, RenderError> {
    let dp = &spec.device_plugin;
    if !dp.enabled || inputs.facts.cluster_policy {
        return Ok(Vec::new());
    }
    // The plugin image carries both plugins: the DRA driver's image (and its pull secrets)
    // unless this one is set.
    let (image, pull_secret_names) = match dp.image.reference("spec.devicePlugin")? {
        Some(image) => (image, &dp.image.image_pull_secrets),
        None => (
            spec.dra_driver
                .image
                .reference("spec.draDriver")?
                .unwrap_or_else(|| inputs.images.dra_driver.clone()),
            &spec.dra_driver.image.image_pull_secrets,
        ),
    };
    let validator_image = spec
        .validator
        .image
        .reference("spec.validator")?
        .unwrap_or_else(|| inputs.images.validator.clone());
    let kubelet_root = spec.host_paths.kubelet_root_dir.trim_end_matches('/');
    let device_plugins = format!("{kubelet_root}/device-plugins");
    let driver_ready = format!("{}/{}", paths::VALIDATIONS_DIR, paths::DRIVER_READY_FILE);
    let mut env_list = vec![node_name_env()];
    env_list.extend(
        env(
            &[
                (e::HTTP_ENDPOINT, "0.0.0.0:8080"),
                (e::CDI_ROOT, paths::CDI_ROOT),
                (e::DEVICE_PLUGIN_PATH, device_plugins.as_str()),
                (e::DRIVER_READY_FILE, driver_ready.as_str()),
                (e::MIG_STRATEGY, dp.config.mig_strategy.as_str()),
                ("NVIDIA_VISIBLE_DEVICES", "void"),
                (e::PROCFS_ROOT, paths::HOST_ROOT_CTR_PATH),
            ],
            &dp.env,
        )
        .as_array()
        .cloned()
        .unwrap_or_default(),
    );
    let container = json!({
        "name": "nvidia-device-plugin",
        "image": image,
        "imagePullPolicy": dp.image.pull_policy().as_str(),
        "command": ["gpu-device-plugin"],
        "env": env_list,
        "securityContext": {"privileged": true},
        "resources": resources(&dp.resources),
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": 8080}, "periodSeconds": 5},
        "volumeMounts": [
            {"name": "device-plugins", "mountPath": device_plugins},
            {"name": "cdi", "mountPath": paths::CDI_ROOT},
            {"name": "host-root", "mountPath": paths::HOST_ROOT_CTR_PATH, "readOnly": true, "mountPropagation": "HostToContainer"},
            {"name": "driver-root", "mountPath": paths::DRIVER_ROOT_CTR_PATH, "readOnly": true, "mountPropagation": "HostToContainer"},
            {"name": "validations", "mountPath": paths::VALIDATIONS_DIR, "readOnly": true},
        ],
    });
    let pod = json!({
        // The plugin talks to the kubelet only, never to the API.
        "automountServiceAccountToken": false,
        "nodeSelector": {l::DEPLOY_DEVICE_PLUGIN: "true"},
        "affinity": gpu_node_affinity(),
        "imagePullSecrets": pull_secrets(pull_secret_names),
        "initContainers": [driver_validation(spec, &validator_image, resources(&dp.resources))],
        "containers": [container],
        "volumes": node_volumes(spec, [host_path("device-plugins", &device_plugins, "DirectoryOrCreate")]),
    });
    let operand = Operand {
        name: o::DEVICE_PLUGIN_DAEMONSET,
        component: COMPONENT,
        selector: json!({"app": o::DEVICE_PLUGIN_DAEMONSET}),
        default_max_unavailable: "1",
    };
    Ok(vec![operand_daemonset(
        operand,
        inputs,
        &spec.daemonsets,
        json!({}),
        pod,
    )])
}
