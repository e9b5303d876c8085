//! The admission policies that confine each node's plugins to their own node's ResourceSlices
//! and PhysicalGPUs.

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

/// A ValidatingAdmissionPolicy and its binding: the kubelet plugin's and the device plugin's
/// ServiceAccounts may create, update or delete only PhysicalGPUs of the node their token was
/// issued for: `status.node`, the node label and the name all name it.
pub fn physical_gpu_policy(namespace: &str) -> Vec<Object> {
    let users: Vec<String> = [
        o::KUBELET_PLUGIN_SERVICE_ACCOUNT,
        o::DEVICE_PLUGIN_SERVICE_ACCOUNT,
    ]
    .iter()
    .map(|sa| format!("'system:serviceaccount:{namespace}:{sa}'"))
    .collect();
    let node_label = api::physicalgpu::NODE_LABEL;
    let policy = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": cluster_meta(o::PHYSICALGPU_POLICY, "dra-driver"),
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": [api::gpuclass::GROUP], "apiVersions": ["*"],
                "operations": ["CREATE", "UPDATE", "DELETE"], "resources": ["physicalgpus"]}]},
            "matchConditions": [{"name": "is-node-plugin",
                "expression": format!("request.userInfo.username in [{}]", users.join(", "))}],
            "variables": [
                {"name": "userNodeName", "expression":
                    "request.userInfo.extra[?'authentication.kubernetes.io/node-name'][0].orValue('')"},
                {"name": "target", "expression":
                    "request.operation == 'DELETE' ? oldObject : object"},
                {"name": "objectNodeName", "expression":
                    "variables.target.?status.?node.orValue('')"},
                {"name": "labelNodeName", "expression":
                    format!("variables.target.metadata.?labels[?'{node_label}'].orValue('')")},
            ],
            "validations": [
                {"expression": "variables.userNodeName != ''",
                 "message": "the plugin's token carries no node name; it must run in a pod bound to a node (ServiceAccountTokenPodNodeInfo)"},
                {"expression": "variables.objectNodeName == variables.userNodeName && variables.labelNodeName == variables.userNodeName && variables.target.metadata.name.startsWith(variables.userNodeName + '-')",
                 "messageExpression": "'this plugin runs on node ' + variables.userNodeName + ' and may only write PhysicalGPUs of that node, not ' + variables.target.metadata.name + ' of ' + (variables.objectNodeName == '' ? 'no node' : variables.objectNodeName)"},
            ],
        },
    });
    let binding = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": cluster_meta(o::PHYSICALGPU_POLICY, "dra-driver"),
        "spec": {"policyName": o::PHYSICALGPU_POLICY, "validationActions": ["Deny"]},
    });
    vec![
        Object::Policy(typed(policy)),
        Object::PolicyBinding(typed(binding)),
    ]
}
