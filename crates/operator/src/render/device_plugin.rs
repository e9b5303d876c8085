//! The device plugin's DaemonSet, on nodes the labeler puts in `device-plugin` mode.

use api::GPUClusterSpec;
use api::contract::{env as e, labels as l, objects as o, paths};
use api::gpucluster::DevicePluginConfig;
use serde_json::{Value, json};

use super::plugin::{driver_validation, gpu_node_affinity, host_path, node_volumes, pull_secrets};
use super::{
    Inputs, Object, Operand, RenderError, env, meta, metrics_ports, node_name_env,
    operand_daemonset, resources, typed,
};

const COMPONENT: &str = "device-plugin";
/// Where the device plugin serves its metrics and probes.
const METRICS_ENDPOINT: &str = "0.0.0.0:8080";

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
    let config = ConfigFile::of(&dp.config);
    let mut env_list = vec![node_name_env()];
    if config.is_some() {
        env_list.push(json!({"name": e::CONFIG_FILE, "value": CONFIG_PATH}));
    }
    env_list.extend(
        env(
            &[
                (e::HTTP_ENDPOINT, METRICS_ENDPOINT),
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
    let ports = metrics_ports(METRICS_ENDPOINT, &dp.env);
    // Readiness is served beside the metrics, wherever HTTP_ENDPOINT puts them (nowhere when an
    // admin turns the endpoint off: then there is nothing to probe).
    let readiness = if ports.as_array().is_some_and(|p| !p.is_empty()) {
        json!({"httpGet": {"path": "/readyz", "port": "http"}, "periodSeconds": 5})
    } else {
        Value::Null
    };
    let container = json!({
        "name": "nvidia-device-plugin",
        "image": image,
        "imagePullPolicy": dp.image.pull_policy().as_str(),
        "command": ["gpu-device-plugin"],
        "env": env_list,
        "securityContext": {"privileged": true},
        "resources": resources(&dp.resources),
        "ports": ports,
        "readinessProbe": readiness,
        "volumeMounts": [
            {"name": "device-plugins", "mountPath": device_plugins},
            {"name": "cdi", "mountPath": paths::CDI_ROOT},
            {"name": "host-root", "mountPath": paths::HOST_ROOT_CTR_PATH, "readOnly": true, "mountPropagation": "HostToContainer"},
            {"name": "driver-root", "mountPath": paths::DRIVER_ROOT_CTR_PATH, "readOnly": true, "mountPropagation": "HostToContainer"},
            {"name": "validations", "mountPath": paths::VALIDATIONS_DIR, "readOnly": true},
        ],
    });
    let mut container = container;
    let mut volumes = node_volumes(
        spec,
        [host_path(
            "device-plugins",
            &device_plugins,
            "DirectoryOrCreate",
        )],
    );
    if let Some(config) = &config {
        container["volumeMounts"]
            .as_array_mut()
            .expect("a list")
            .push(json!({"name": "config", "mountPath": CONFIG_DIR, "readOnly": true}));
        volumes
            .as_array_mut()
            .expect("a list")
            .push(config.volume());
    }
    let pod = json!({
        // The API is used for the node's PhysicalGPUs only (confined to the node by the
        // operator's admission policy).
        "serviceAccountName": o::DEVICE_PLUGIN_SERVICE_ACCOUNT,
        "nodeSelector": {l::DEPLOY_DEVICE_PLUGIN: "true"},
        "affinity": gpu_node_affinity(),
        "imagePullSecrets": pull_secrets(pull_secret_names),
        "initContainers": [driver_validation(spec, &validator_image, resources(&dp.resources))],
        "containers": [container],
        "volumes": volumes,
    });
    let operand = Operand {
        name: o::DEVICE_PLUGIN_DAEMONSET,
        component: COMPONENT,
        selector: json!({"app": o::DEVICE_PLUGIN_DAEMONSET}),
        default_max_unavailable: "1",
    };
    let mut daemonset = operand_daemonset(operand, inputs, &spec.daemonsets, json!({}), pod);
    let mut objects = Vec::new();
    if let Some(ConfigFile::Rendered(text)) = &config {
        // The plugin reads its config once: a new config rolls the pods.
        if let Object::DaemonSet(ds) = &mut daemonset {
            ds.spec
                .get_or_insert_default()
                .template
                .metadata
                .get_or_insert_default()
                .annotations
                .get_or_insert_default()
                .insert(CONFIG_HASH_ANNOTATION.into(), digest(text));
        }
        objects.push(Object::ConfigMap(typed(json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": meta(o::DEVICE_PLUGIN_CONFIGMAP, inputs.namespace, COMPONENT),
            "data": {CONFIG_KEY: text},
        }))));
    }
    objects.push(daemonset);
    Ok(objects)
}

/// Where the plugin container finds its config file.
const CONFIG_DIR: &str = "/etc/gpu-device-plugin";
const CONFIG_KEY: &str = "config.yaml";
const CONFIG_PATH: &str = "/etc/gpu-device-plugin/config.yaml";
/// Pod annotation with a digest of the rendered config file.
const CONFIG_HASH_ANNOTATION: &str = "gpu-operator-rs.dev/device-plugin-config";

/// The plugin's config file: rendered from `config.sharing`, or an admin's ConfigMap key.
enum ConfigFile<'a> {
    Rendered(String),
    Referenced { name: &'a str, key: &'a str },
}

impl<'a> ConfigFile<'a> {
    fn of(config: &'a DevicePluginConfig) -> Option<Self> {
        if let (Some(name), Some(key)) = (&config.name, &config.default) {
            return Some(ConfigFile::Referenced { name, key });
        }
        config.file().map(ConfigFile::Rendered)
    }

    fn volume(&self) -> Value {
        let (name, key) = match self {
            ConfigFile::Rendered(_) => (o::DEVICE_PLUGIN_CONFIGMAP, CONFIG_KEY),
            ConfigFile::Referenced { name, key } => (*name, *key),
        };
        json!({"name": "config", "configMap": {"name": name, "items": [{"key": key, "path": CONFIG_KEY}]}})
    }
}

fn digest(text: &str) -> String {
    use sha2::{Digest, Sha256};
    let hash = Sha256::digest(text.as_bytes());
    hash.iter().take(8).map(|b| format!("{b:02x}")).collect()
}
