//! The DRA kubelet plugin DaemonSet and the ComputeDomain controller Deployment.

use api::GPUClusterSpec;
use api::contract::{env as e, labels as l, objects as o, paths, ports};
use api::gpucluster::KubeletPluginSpec;
use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde_json::{Value, json};

use super::{
    Inputs, Object, Operand, RenderError, env, meta, metrics_ports, node_name_env,
    operand_daemonset, pod_labels, resources, typed,
};

const COMPONENT: &str = "dra-driver";

/// The plugin DaemonSet, plus the ComputeDomain controller when ComputeDomains are on.
pub fn kubelet_plugin(
    spec: &GPUClusterSpec,
    inputs: &Inputs<'_>,
) -> Result<Vec<Object>, RenderError> {
    let dra = &spec.dra_driver;
    let plugin_image = dra
        .image
        .reference("spec.draDriver")?
        .unwrap_or_else(|| inputs.images.dra_driver.clone());
    let validator_image = spec
        .validator
        .image
        .reference("spec.validator")?
        .unwrap_or_else(|| inputs.images.validator.clone());
    let pull = dra.image.pull_policy().as_str();
    let kubelet_root = spec.host_paths.kubelet_root_dir.trim_end_matches('/');
    let cd = dra.compute_domains.enabled;

    let mut containers = vec![gpus_container(
        spec,
        (&plugin_image, pull),
        inputs.namespace,
        kubelet_root,
    )];
    if cd {
        containers.push(compute_domains_container(
            spec,
            &inputs.images.compute_domain,
            pull,
            kubelet_root,
        ));
    }
    let mut plugin_specs = vec![&dra.gpus.kubelet_plugin];
    if cd {
        plugin_specs.push(&dra.compute_domains.kubelet_plugin);
    }
    let init = driver_validation(spec, &validator_image, json!(max_resources(&plugin_specs)));
    let pod = json!({
        "serviceAccountName": o::KUBELET_PLUGIN_SERVICE_ACCOUNT,
        "nodeSelector": {l::DEPLOY_DRA_DRIVER: "true"},
        "affinity": gpu_node_affinity(),
        "imagePullSecrets": pull_secrets(&dra.image.image_pull_secrets),
        "initContainers": [init],
        "containers": containers,
        "volumes": node_volumes(spec, [
            host_path("plugins-registry", &format!("{kubelet_root}/plugins_registry"), "DirectoryOrCreate"),
            host_path("plugins", &format!("{kubelet_root}/plugins"), "DirectoryOrCreate"),
            host_path("mps", paths::MPS_ROOT, "DirectoryOrCreate"),
        ]),
    });
    let operand = Operand {
        name: o::KUBELET_PLUGIN_DAEMONSET,
        component: COMPONENT,
        selector: json!({"app": o::KUBELET_PLUGIN_DAEMONSET}),
        default_max_unavailable: "100%",
    };
    let mut objects = vec![operand_daemonset(
        operand,
        inputs,
        &spec.daemonsets,
        json!({}),
        pod,
    )];
    if cd {
        objects.push(compute_domain_controller(spec, inputs, pull));
    }
    Ok(objects)
}

/// The init container that waits for the driver and writes `driver-ready`, as every node-side
/// plugin's first step.
pub(super) fn driver_validation(spec: &GPUClusterSpec, image: &str, resources: Value) -> Value {
    json!({
        "name": "driver-validation",
        "image": image,
        "imagePullPolicy": spec.validator.image.pull_policy().as_str(),
        "command": ["dra-driver-validator", "driver"],
        "env": env(&[
            (e::WITH_WAIT, "true"),
            ("SKIP_GPU_INIT", "true"),
            (e::HOST_ROOT, paths::HOST_ROOT_CTR_PATH),
            (e::DRIVER_INSTALL_DIR, &spec.host_paths.driver_install_dir),
            (e::DRIVER_INSTALL_DIR_CTR_PATH, paths::DRIVER_ROOT_CTR_PATH),
        ], &spec.validator.env),
        // The validator image runs as a non-root user; writing driver-ready into the node's
        // validations folder (root's, 0755) needs root.
        "securityContext": {"privileged": true, "runAsUser": 0},
        "resources": resources,
        "volumeMounts": [
            {"name": "host-root", "mountPath": paths::HOST_ROOT_CTR_PATH, "readOnly": true, "mountPropagation": "HostToContainer"},
            {"name": "driver-root", "mountPath": paths::DRIVER_ROOT_CTR_PATH, "mountPropagation": "HostToContainer"},
            {"name": "validations", "mountPath": paths::VALIDATIONS_DIR},
        ],
    })
}

/// The node affinity every GPU operand shares: a node NFD or the labeler marks as a GPU node.
pub(super) fn gpu_node_affinity() -> Value {
    json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": l::NFD_GPU_LABELS[0], "operator": "In", "values": ["true"]}]},
        {"matchExpressions": [{"key": "feature.node.kubernetes.io/cpu-model.vendor_id", "operator": "In", "values": ["NVIDIA"]}]},
        {"matchExpressions": [{"key": l::GPU_PRESENT, "operator": "In", "values": ["true"]}]},
    ]}}})
}

/// `first`, then the host paths every node-side plugin mounts: the CDI root, the host root, the
/// driver root and the validations folder.
pub(super) fn node_volumes<const N: usize>(spec: &GPUClusterSpec, first: [Value; N]) -> Value {
    let shared = [
        host_path("cdi", paths::CDI_ROOT, "DirectoryOrCreate"),
        host_path("host-root", "/", "Directory"),
        host_path(
            "driver-root",
            &spec.host_paths.driver_install_dir,
            "DirectoryOrCreate",
        ),
        host_path("validations", paths::VALIDATIONS_DIR, "DirectoryOrCreate"),
    ];
    json!(first.into_iter().chain(shared).collect::<Vec<_>>())
}

pub(super) fn host_path(name: &str, path: &str, kind: &str) -> Value {
    json!({"name": name, "hostPath": {"path": path, "type": kind}})
}

pub(super) fn pull_secrets(names: &[String]) -> Value {
    json!(names.iter().map(|n| json!({"name": n})).collect::<Vec<_>>())
}

/// Mounts shared by both plugin containers.
fn plugin_mounts(kubelet_root: &str) -> Value {
    json!([
        {"name": "plugins-registry", "mountPath": format!("{kubelet_root}/plugins_registry")},
        {"name": "plugins", "mountPath": format!("{kubelet_root}/plugins"), "mountPropagation": "Bidirectional"},
        {"name": "cdi", "mountPath": paths::CDI_ROOT},
        {"name": "host-root", "mountPath": paths::HOST_ROOT_CTR_PATH, "readOnly": true, "mountPropagation": "HostToContainer"},
        {"name": "driver-root", "mountPath": paths::DRIVER_ROOT_CTR_PATH, "readOnly": true, "mountPropagation": "HostToContainer"},
        {"name": "validations", "mountPath": paths::VALIDATIONS_DIR, "readOnly": true},
        // The MPS control daemons' pipe directories: the per-GPU ones shares with strategy MPS
        // need, and those the plugin makes for claims' own daemons.
        {"name": "mps", "mountPath": paths::MPS_ROOT, "mountPropagation": "HostToContainer"},
    ])
}

/// Health port and probes of a plugin container; port `-1` and no probes when disabled.
fn health(plugin: &KubeletPluginSpec, default_port: u16, liveness_period: u32) -> (String, Value) {
    if !plugin.healthcheck.enabled {
        return ("-1".into(), json!({}));
    }
    let port = plugin.healthcheck.port.unwrap_or(default_port.into());
    let grpc = json!({"port": port, "service": "liveness"});
    let probes = json!({
        "startupProbe": {"grpc": grpc, "periodSeconds": 1, "failureThreshold": 600},
        "livenessProbe": {"grpc": grpc, "periodSeconds": liveness_period, "failureThreshold": 3, "timeoutSeconds": 10},
    });
    (port.to_string(), probes)
}

fn feature_gates(spec: &GPUClusterSpec) -> String {
    let gates = &spec.dra_driver.feature_gates;
    gates
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// What differs between the plugin pod's two kubelet-plugin containers.
struct PluginContainer<'a> {
    name: &'static str,
    command: Value,
    settings: &'a KubeletPluginSpec,
    default_health_port: u16,
    liveness_period: u32,
    /// Address of its metrics endpoint.
    http_endpoint: &'static str,
    /// Env beyond the node name, endpoint and kubelet paths every plugin gets (after them).
    env: Vec<(&'static str, &'a str)>,
}

/// A privileged container that registers with the kubelet: node name, CDI root, kubelet paths and
/// health port in its env (the user's env wins), the plugin mounts and its gRPC probes.
fn kubelet_plugin_container(
    c: PluginContainer<'_>,
    image: &str,
    pull: &str,
    kubelet_root: &str,
) -> Value {
    let (port, probes) = health(c.settings, c.default_health_port, c.liveness_period);
    let registrar = format!("{kubelet_root}/plugins_registry");
    let plugins = format!("{kubelet_root}/plugins");
    let mut base = vec![
        (e::HTTP_ENDPOINT, c.http_endpoint),
        (e::CDI_ROOT, paths::CDI_ROOT),
        (e::KUBELET_REGISTRAR_DIRECTORY_PATH, registrar.as_str()),
        (e::KUBELET_PLUGINS_DIRECTORY_PATH, plugins.as_str()),
        (e::HEALTHCHECK_PORT, port.as_str()),
    ];
    base.extend(c.env);
    let mut env_list = vec![node_name_env()];
    env_list.extend(
        env(&base, &c.settings.env)
            .as_array()
            .cloned()
            .unwrap_or_default(),
    );
    let mut container = json!({
        "name": c.name,
        "image": image,
        "imagePullPolicy": pull,
        "command": c.command,
        "env": env_list,
        "securityContext": {"privileged": true},
        "resources": resources(&c.settings.resources),
        "volumeMounts": plugin_mounts(kubelet_root),
    });
    merge(&mut container, probes);
    container
}

/// The GPU plugin container; `(image, pull)` is also what its claims' MPS control daemon pods
/// run, in `namespace`.
fn gpus_container(
    spec: &GPUClusterSpec,
    (image, pull): (&str, &str),
    namespace: &str,
    kubelet_root: &str,
) -> Value {
    let driver_ready = format!("{}/{}", paths::VALIDATIONS_DIR, paths::DRIVER_READY_FILE);
    let gates = feature_gates(spec);
    let mut env = vec![
        (e::DRIVER_READY_FILE, driver_ready.as_str()),
        ("NVIDIA_VISIBLE_DEVICES", "void"),
        // The node's /proc as the host root shows it (the driver's MIG capability files and the
        // nvidia-caps major), the same tree every other driver file is read from.
        (e::PROCFS_ROOT, paths::HOST_ROOT_CTR_PATH),
        (e::POD_NAMESPACE, namespace),
        (e::MPS_CONTROL_DAEMON_IMAGE, image),
        (e::MPS_CONTROL_DAEMON_IMAGE_PULL_POLICY, pull),
    ];
    if !gates.is_empty() {
        env.push((e::FEATURE_GATES, gates.as_str()));
    }
    if let Some(mode) = &spec.dra_driver.gpus.consumable_shares {
        env.push((e::CONSUMABLE_SHARES, mode.as_str()));
    }
    if let Some(mode) = spec.dra_driver.gpus.mig_partitioning {
        env.push((e::MIG_PARTITIONING, mode.as_str()));
    }
    let container = PluginContainer {
        name: "gpus",
        command: json!(["gpu-kubelet-plugin"]),
        settings: &spec.dra_driver.gpus.kubelet_plugin,
        default_health_port: ports::GPU_PLUGIN_HEALTH,
        liveness_period: 30,
        http_endpoint: "0.0.0.0:8080",
        env,
    };
    let mut container = kubelet_plugin_container(container, image, pull, kubelet_root);
    container["ports"] = metrics_ports("0.0.0.0:8080", &spec.dra_driver.gpus.kubelet_plugin.env);
    container
}

fn compute_domains_container(
    spec: &GPUClusterSpec,
    image: &str,
    pull: &str,
    kubelet_root: &str,
) -> Value {
    let container = PluginContainer {
        name: "compute-domains",
        command: json!([
            "bash",
            "-c",
            "set -a; . /run/nvidia/validations/driver-ready; set +a; exec compute-domain-kubelet-plugin"
        ]),
        settings: &spec.dra_driver.compute_domains.kubelet_plugin,
        default_health_port: ports::COMPUTE_DOMAIN_PLUGIN_HEALTH,
        liveness_period: 10,
        http_endpoint: ":8081",
        env: vec![("GPU_CLIQUE_LABEL_ENABLED", "true")],
    };
    kubelet_plugin_container(container, image, pull, kubelet_root)
}

fn compute_domain_controller(spec: &GPUClusterSpec, inputs: &Inputs<'_>, pull: &str) -> Object {
    let controller = &spec.dra_driver.compute_domains.controller;
    let selector = json!({"app": o::COMPUTE_DOMAIN_CONTROLLER});
    let mut tolerations = vec![
        json!({"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"}),
        json!({"key": "node-role.kubernetes.io/master", "operator": "Exists", "effect": "NoSchedule"}),
        json!({"key": "CriticalAddonsOnly", "operator": "Exists"}),
    ];
    tolerations.extend(spec.daemonsets.tolerations.iter().map(|t| json!(t)));
    Object::Deployment(typed(json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta(o::COMPUTE_DOMAIN_CONTROLLER, inputs.namespace, COMPONENT),
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": pod_labels(selector, &spec.daemonsets)},
                "spec": {
                    "serviceAccountName": o::COMPUTE_DOMAIN_CONTROLLER_SERVICE_ACCOUNT,
                    "priorityClassName": spec.daemonsets.priority_class_name,
                    "tolerations": tolerations,
                    "imagePullSecrets": pull_secrets(&spec.dra_driver.image.image_pull_secrets),
                    "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                        {"weight": 1, "preference": {"matchExpressions": [
                            {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}]}}]}},
                    "containers": [{
                        "name": "compute-domain-controller",
                        "image": inputs.images.compute_domain,
                        "imagePullPolicy": pull,
                        "command": ["compute-domain-controller"],
                        "env": env(&[
                            ("LEADER_ELECTION_ENABLED", "false"),
                            ("LEADER_ELECTION_LEASE_DURATION", "15s"),
                            ("LEADER_ELECTION_RENEW_DEADLINE", "10s"),
                            ("LEADER_ELECTION_RETRY_PERIOD", "2s"),
                        ], &controller.env),
                        "resources": resources(&controller.resources),
                    }],
                },
            },
        },
    })))
}

/// Merges the keys of `extra` (an object) into `target`.
fn merge(target: &mut Value, extra: Value) {
    if let (Value::Object(t), Value::Object(x)) = (target, extra) {
        t.extend(x);
    }
}

/// Element-wise maximum of the plugin containers' requests and limits, with each limit raised to
/// at least its request, for the init container.
fn max_resources(plugins: &[&KubeletPluginSpec]) -> ResourceRequirements {
    use std::collections::BTreeMap;
    let mut requests: BTreeMap<String, Quantity> = BTreeMap::new();
    let mut limits: BTreeMap<String, Quantity> = BTreeMap::new();
    let keep_max = |map: &mut BTreeMap<String, Quantity>, name: &String, q: &Quantity| {
        let bigger = map
            .get(name)
            .is_none_or(|cur| quantity_value(q) > quantity_value(cur));
        if bigger {
            map.insert(name.clone(), q.clone());
        }
    };
    for r in plugins.iter().filter_map(|p| p.resources.as_ref()) {
        for (name, q) in r.requests.iter().flatten() {
            keep_max(&mut requests, name, q);
        }
        for (name, q) in r.limits.iter().flatten() {
            keep_max(&mut limits, name, q);
        }
    }
    for (name, q) in &requests {
        if limits.contains_key(name) {
            keep_max(&mut limits, name, q);
        }
    }
    ResourceRequirements {
        requests: (!requests.is_empty()).then_some(requests),
        limits: (!limits.is_empty()).then_some(limits),
        ..ResourceRequirements::default()
    }
}

/// A quantity's value as a float, enough to compare CPU and memory amounts.
fn quantity_value(q: &Quantity) -> f64 {
    let s = q.0.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-' || c == '+'))
        .unwrap_or(s.len());
    let (num, suffix) = s.split_at(split);
    let n: f64 = num.parse().unwrap_or(0.0);
    let scale = match suffix {
        "" => 1.0,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        "Ti" => 1024.0f64.powi(4),
        _ => 1.0,
    };
    n * scale
}
