//! The validators of both planes: on DRA nodes a DaemonSet whose pods each claim a GPU through
//! DRA; on device-plugin nodes one whose pods each run a pod asking `nvidia.com/gpu: 1`.

use api::GPUClusterSpec;
use api::contract::paths::VALIDATIONS_DIR;
use api::contract::{labels as l, objects as o};
use serde_json::json;

use super::plugin::{driver_validation, gpu_node_affinity, node_volumes, pull_secrets};
use super::{Inputs, Object, Operand, RenderError, admin_claim_template, env, operand_daemonset};

const COMPONENT: &str = "dra-validator";
const CLAIM: &str = "validation-gpu";

/// The validator DaemonSet and the ResourceClaimTemplate of its GPU claim.
pub fn validator(spec: &GPUClusterSpec, inputs: &Inputs<'_>) -> Result<Vec<Object>, RenderError> {
    let v = &spec.validator;
    let image = v
        .image
        .reference("spec.validator")?
        .unwrap_or_else(|| inputs.images.validator.clone());
    let ready_file = format!("{VALIDATIONS_DIR}/workload-ready");
    let pod = json!({
        "serviceAccountName": o::VALIDATOR_SERVICE_ACCOUNT,
        "nodeSelector": {l::DEPLOY_DRA_VALIDATOR: "true"},
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": l::GPU_PRESENT, "operator": "In", "values": ["true"]}]}]}}},
        "imagePullSecrets": pull_secrets(&v.image.image_pull_secrets),
        "resourceClaims": [{"name": CLAIM, "resourceClaimTemplateName": o::VALIDATOR_CLAIM_TEMPLATE}],
        "containers": [{
            "name": "validator",
            "image": image,
            "imagePullPolicy": v.image.pull_policy().as_str(),
            "command": ["dra-driver-validator", "workload"],
            "env": env(&[("WITH_WAIT", "true")], &v.env),
            "resources": {"claims": [{"name": CLAIM}]},
            "readinessProbe": {"exec": {"command": ["cat", ready_file]}, "periodSeconds": 5},
            // The image runs as a non-root user: the ready marker goes to a folder
            // of the pod's own that user may write.
            "volumeMounts": [{"name": "validations", "mountPath": VALIDATIONS_DIR}],
        }],
        "volumes": [{"name": "validations", "emptyDir": {}}],
    });
    let operand = Operand {
        name: o::VALIDATOR_DAEMONSET,
        component: COMPONENT,
        selector: json!({"app.kubernetes.io/name": o::VALIDATOR_DAEMONSET}),
        default_max_unavailable: "1",
    };
    let daemonset = operand_daemonset(
        operand,
        inputs,
        &spec.daemonsets,
        json!({"app": l::VALIDATOR_APP}),
        pod,
    );
    Ok(vec![
        admin_claim_template(
            o::VALIDATOR_CLAIM_TEMPLATE,
            inputs.namespace,
            COMPONENT,
            false,
        ),
        daemonset,
    ])
}

const DEVICE_PLUGIN_COMPONENT: &str = "operator-validator";
const STATUS_DIR: &str = "/validator-status";

/// `nvidia-operator-validator` on `device-plugin` nodes (upstream's name and deploy label): the
/// driver found, then the device plugin's GPUs allocatable and one of them given to a pod. Nothing
/// when that plane is not ours (`spec.devicePlugin.enabled` false, or a ClusterPolicy's).
pub fn device_plugin_validator(
    spec: &GPUClusterSpec,
    inputs: &Inputs<'_>,
) -> Result<Vec<Object>, RenderError> {
    if !spec.device_plugin.enabled || inputs.facts.cluster_policy {
        return Ok(Vec::new());
    }
    let v = &spec.validator;
    let image = v
        .image
        .reference("spec.validator")?
        .unwrap_or_else(|| inputs.images.validator.clone());
    let field = |name: &str, path: &str| json!({"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}});
    let mut env_list = vec![
        field("NODE_NAME", "spec.nodeName"),
        field("POD_NAMESPACE", "metadata.namespace"),
        field("POD_NAME", "metadata.name"),
        field("POD_UID", "metadata.uid"),
    ];
    let secrets = v.image.image_pull_secrets.join(",");
    let mut base = vec![
        ("WITH_WAIT", "true"),
        ("OUTPUT_DIR", STATUS_DIR),
        ("VALIDATOR_IMAGE", image.as_str()),
        (
            "VALIDATOR_IMAGE_PULL_POLICY",
            v.image.pull_policy().as_str(),
        ),
    ];
    if !secrets.is_empty() {
        base.push(("VALIDATOR_IMAGE_PULL_SECRETS", secrets.as_str()));
    }
    env_list.extend(env(&base, &v.env).as_array().cloned().unwrap_or_default());
    let ready_file = format!("{STATUS_DIR}/plugin-ready");
    let pod = json!({
        "serviceAccountName": o::OPERATOR_VALIDATOR_SERVICE_ACCOUNT,
        "nodeSelector": {l::DEPLOY_OPERATOR_VALIDATOR: "true"},
        "affinity": gpu_node_affinity(),
        "imagePullSecrets": pull_secrets(&v.image.image_pull_secrets),
        "initContainers": [driver_validation(spec, &image, json!({}))],
        "containers": [{
            "name": "plugin-validation",
            "image": image,
            "imagePullPolicy": v.image.pull_policy().as_str(),
            "command": ["dra-driver-validator", "plugin"],
            "env": env_list,
            "readinessProbe": {"exec": {"command": ["cat", ready_file]}, "periodSeconds": 5},
            "volumeMounts": [{"name": "status", "mountPath": STATUS_DIR}],
        }],
        "volumes": node_volumes(spec, [json!({"name": "status", "emptyDir": {}})]),
    });
    let operand = Operand {
        name: o::OPERATOR_VALIDATOR_DAEMONSET,
        component: DEVICE_PLUGIN_COMPONENT,
        selector: json!({"app": o::OPERATOR_VALIDATOR_DAEMONSET}),
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
