//! The allocation-path validator: a DaemonSet whose pods each claim a GPU through DRA.

use api::GPUClusterSpec;
use api::contract::paths::VALIDATIONS_DIR;
use api::contract::{labels as l, objects as o};
use serde_json::json;

use super::plugin::pull_secrets;
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
