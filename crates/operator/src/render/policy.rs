//! The admission policy that confines each kubelet plugin to its own node's ResourceSlices.

use api::contract::{COMPUTE_DOMAIN_DRIVER_NAME, DRIVER_NAME, objects as o};
use serde_json::json;

use super::{Object, cluster_meta, typed};

/// A ValidatingAdmissionPolicy and its binding: the plugin's ServiceAccount may create, update or
/// delete only slices whose `spec.nodeName` is the node its token was issued for, and only of our
/// two drivers (GPUs and ComputeDomains).
pub fn resource_slice_policy(namespace: &str) -> Vec<Object> {
    let user = format!(
        "system:serviceaccount:{namespace}:{}",
        o::KUBELET_PLUGIN_SERVICE_ACCOUNT
    );
    let policy = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": cluster_meta(o::RESOURCESLICE_POLICY, "dra-driver"),
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": ["resource.k8s.io"], "apiVersions": ["*"],
                "operations": ["CREATE", "UPDATE", "DELETE"], "resources": ["resourceslices"]}]},
            "matchConditions": [{"name": "is-kubelet-plugin", "expression": format!("request.userInfo.username == '{user}'")}],
            "variables": [
                {"name": "userNodeName", "expression":
                    "request.userInfo.extra[?'authentication.kubernetes.io/node-name'][0].orValue('')"},
                {"name": "objectNodeName", "expression":
                    "(request.operation == 'DELETE' ? oldObject : object).spec.?nodeName.orValue('')"},
                {"name": "objectDriver", "expression":
                    "(request.operation == 'DELETE' ? oldObject : object).spec.driver"},
            ],
            "validations": [
                {"expression": "variables.userNodeName != ''",
                 "message": "the kubelet plugin's token carries no node name; it must run in a pod bound to a node (ServiceAccountTokenPodNodeInfo)"},
                {"expression": "variables.userNodeName == variables.objectNodeName",
                 "messageExpression": "'this kubelet plugin runs on node ' + variables.userNodeName + ' and may only write ResourceSlices of that node, not of ' + (variables.objectNodeName == '' ? 'no node' : variables.objectNodeName)"},
                {"expression": format!("variables.objectDriver in ['{DRIVER_NAME}', '{COMPUTE_DOMAIN_DRIVER_NAME}']"),
                 "messageExpression": format!("'the kubelet plugin may only write ResourceSlices of the drivers {DRIVER_NAME} and {COMPUTE_DOMAIN_DRIVER_NAME}, not of ' + variables.objectDriver")},
            ],
        },
    });
    let binding = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": cluster_meta(o::RESOURCESLICE_POLICY, "dra-driver"),
        "spec": {"policyName": o::RESOURCESLICE_POLICY, "validationActions": ["Deny"]},
    });
    vec![
        Object::Policy(typed(policy)),
        Object::PolicyBinding(typed(binding)),
    ]
}
