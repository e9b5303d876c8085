//! The allocation-path validator: a DaemonSet whose pods each claim a GPU through DRA.

use api::GPUClusterSpec;
use api::contract::paths::VALIDATIONS_DIR;
use api::contract::{labels as l, objects as o};
use serde_json::json;

use super::plugin::pull_secrets;
use super::{
    Inputs, Object, RenderError, admin_claim_template, env, meta, pod_labels, typed,
    update_strategy,
};

const COMPONENT: &str = "dra-validator";
const CLAIM: &str = "validation-gpu";

/// The validator DaemonSet and the ResourceClaimTemplate of its GPU claim.
pub fn validator(spec: &GPUClusterSpec, inputs: &Inputs<'_>) -> Result<Vec<Object>, RenderError> {
    let v = &spec.validator;
    let image = v
        .image
        .reference("spec.validator")?
        .unwrap_or_else(|| inputs.images.validator.clone());
    let ds = &spec.daemonsets;
    let selector = json!({"app.kubernetes.io/name": o::VALIDATOR_DAEMONSET});
    let mut labels = pod_labels(selector.clone(), ds);
    labels["app"] = json!(l::VALIDATOR_APP);
    let ready_file = format!("{VALIDATIONS_DIR}/workload-ready");
    let daemonset = json!({
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": meta(o::VALIDATOR_DAEMONSET, inputs.namespace, COMPONENT),
        "spec": {
            "selector": {"matchLabels": selector},
            "updateStrategy": update_strategy(ds, "1"),
            "template": {
                "metadata": {"labels": labels, "annotations": json!(ds.annotations)},
                "spec": {
                    "serviceAccountName": o::VALIDATOR_SERVICE_ACCOUNT,
                    "priorityClassName": ds.priority_class_name,
                    "nodeSelector": {l::DEPLOY_DRA_VALIDATOR: "true"},
                    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                        {"matchExpressions": [{"key": l::GPU_PRESENT, "operator": "In", "values": ["true"]}]}]}}},
                    "tolerations": json!(ds.tolerations),
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
                },
            },
        },
    });
    Ok(vec![
        admin_claim_template(
            o::VALIDATOR_CLAIM_TEMPLATE,
            inputs.namespace,
            COMPONENT,
            false,
        ),
        Object::DaemonSet(typed(daemonset)),
    ])
}
