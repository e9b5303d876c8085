//! The desired operands of a `GPUCluster`: pure functions of (spec, operator config, cluster facts).
//!
//! Objects are written as JSON literals for readability and converted to typed Kubernetes objects; a
//! test checks that the typed objects keep every field the JSON had, so a misspelt field cannot be
//! dropped silently.

mod classes;
mod dcgm;
mod device_plugin;
mod plugin;
mod policy;
mod validator;

use std::collections::BTreeMap;

use api::GPUClusterSpec;
use api::contract::labels as l;
use api::gpucluster::{DaemonsetsSpec, UpdateStrategy};
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{ConfigMap, EnvVar, ResourceRequirements, Service};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaimTemplate};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::DynamicObject;
use serde_json::{Value, json};

/// Images the operator uses when the `GPUCluster` names none (from the operator's env).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DefaultImages {
    /// The `gpu-kubelet-plugin` image (`DRA_DRIVER_IMAGE`).
    pub dra_driver: String,
    /// The image holding `dra-driver-validator` (`VALIDATOR_IMAGE`).
    pub validator: String,
    /// The upstream DRA driver image for ComputeDomains (`COMPUTE_DOMAIN_IMAGE`).
    pub compute_domain: String,
    /// DCGM (`DCGM_IMAGE`).
    pub dcgm: String,
    /// DCGM exporter (`DCGM_EXPORTER_IMAGE`).
    pub dcgm_exporter: String,
}

/// What the operator knows about the cluster that changes what it renders.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClusterFacts {
    /// `monitoring.coreos.com/v1` ServiceMonitors are served.
    pub service_monitors_served: bool,
    /// `DeviceClass.spec.extendedResourceName` is served (DRAExtendedResource).
    pub extended_resources_served: bool,
    /// A `ClusterPolicy` exists: the device-plugin plane is its operator's, and none of ours.
    pub cluster_policy: bool,
}

/// Everything rendering needs besides the spec.
#[derive(Clone, Debug)]
pub struct Inputs<'a> {
    /// The operator's namespace; operands live there.
    pub namespace: &'a str,
    /// Default images.
    pub images: &'a DefaultImages,
    /// Cluster facts.
    pub facts: ClusterFacts,
}

/// One object the operator owns.
#[derive(Clone, Debug, PartialEq)]
pub enum Object {
    /// An operand DaemonSet.
    DaemonSet(Box<DaemonSet>),
    /// The ComputeDomain controller.
    Deployment(Box<Deployment>),
    /// A DeviceClass.
    DeviceClass(Box<DeviceClass>),
    /// A ResourceClaimTemplate for an operand's claim.
    ResourceClaimTemplate(Box<ResourceClaimTemplate>),
    /// An operand Service.
    Service(Box<Service>),
    /// An operand's configuration.
    ConfigMap(Box<ConfigMap>),
    /// The ResourceSlice admission policy.
    Policy(Box<ValidatingAdmissionPolicy>),
    /// Its binding.
    PolicyBinding(Box<ValidatingAdmissionPolicyBinding>),
    /// A Prometheus Operator ServiceMonitor (only when that API is served).
    ServiceMonitor(Box<DynamicObject>),
}

impl Object {
    /// Kind and name, e.g. `DaemonSet/nvidia-dra-validator`.
    pub fn id(&self) -> String {
        let value = self.to_value();
        format!(
            "{}/{}",
            value["kind"].as_str().unwrap_or_default(),
            value["metadata"]["name"].as_str().unwrap_or_default()
        )
    }

    /// The object as JSON, with `apiVersion` and `kind`.
    pub fn to_value(&self) -> Value {
        let typed = match self {
            Object::DaemonSet(o) => serde_json::to_value(o),
            Object::Deployment(o) => serde_json::to_value(o),
            Object::DeviceClass(o) => serde_json::to_value(o),
            Object::ResourceClaimTemplate(o) => serde_json::to_value(o),
            Object::Service(o) => serde_json::to_value(o),
            Object::ConfigMap(o) => serde_json::to_value(o),
            Object::Policy(o) => serde_json::to_value(o),
            Object::PolicyBinding(o) => serde_json::to_value(o),
            Object::ServiceMonitor(o) => serde_json::to_value(o),
        };
        typed.expect("Kubernetes objects always serialize")
    }
}

/// An image setting the operator cannot use; the other operands are still rendered.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(transparent)]
pub struct RenderError(#[from] pub api::ImageError);

/// The desired objects, and the problems that kept some out. With errors, the set is incomplete and
/// must not be used to prune.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Desired {
    /// Objects to apply.
    pub objects: Vec<Object>,
    /// Operands left out, with why.
    pub errors: Vec<RenderError>,
}

/// Renders every object a `GPUCluster` spec asks for.
pub fn desired(spec: &GPUClusterSpec, inputs: &Inputs<'_>) -> Desired {
    let mut out = Desired::default();
    let mut push = |result: Result<Vec<Object>, RenderError>| match result {
        Ok(objects) => out.objects.extend(objects),
        Err(e) if out.errors.contains(&e) => {}
        Err(e) => out.errors.push(e),
    };
    push(Ok(classes::device_classes(spec, inputs.facts)));
    push(Ok(policy::resource_slice_policy(inputs.namespace)));
    push(Ok(policy::physical_gpu_policy(inputs.namespace)));
    push(plugin::kubelet_plugin(spec, inputs));
    push(device_plugin::device_plugin(spec, inputs));
    push(validator::validator(spec, inputs));
    push(validator::device_plugin_validator(spec, inputs));
    push(dcgm::exporter(spec, inputs));
    push(dcgm::standalone(spec, inputs));
    out
}

/// Labels on every object the operator owns.
fn managed_labels(component: &str) -> Value {
    json!({
        l::MANAGED_BY: l::MANAGED_BY_VALUE,
        "app.kubernetes.io/part-of": "gpu-operator",
        "app.kubernetes.io/component": component,
    })
}

/// Metadata of a namespaced object.
fn meta(name: &str, namespace: &str, component: &str) -> Value {
    json!({"name": name, "namespace": namespace, "labels": managed_labels(component)})
}

/// Metadata of a cluster-scoped object.
fn cluster_meta(name: &str, component: &str) -> Value {
    json!({"name": name, "labels": managed_labels(component)})
}

/// Pod labels: the selector labels, plus the spec's extra labels except the ones we own.
fn pod_labels(selector: Value, ds: &DaemonsetsSpec) -> Value {
    let mut labels: BTreeMap<String, Value> = ds
        .labels
        .iter()
        .filter(|(k, _)| !matches!(k.as_str(), "app" | "app.kubernetes.io/part-of"))
        .map(|(k, v)| (k.clone(), json!(v)))
        .collect();
    if let Value::Object(sel) = selector {
        labels.extend(sel);
    }
    json!(labels)
}

/// The DaemonSet update strategy from the spec, with `default_max_unavailable` for rolling updates.
fn update_strategy(ds: &DaemonsetsSpec, default_max_unavailable: &str) -> Value {
    match ds.update_strategy {
        UpdateStrategy::OnDelete => json!({"type": "OnDelete"}),
        UpdateStrategy::RollingUpdate => {
            let max = ds
                .rolling_update
                .as_ref()
                .and_then(|r| r.max_unavailable.clone())
                .map(|v| match v {
                    IntOrString::Int(n) => json!(n),
                    IntOrString::String(s) => int_or_percent(&s),
                })
                .unwrap_or_else(|| int_or_percent(default_max_unavailable));
            json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": max}})
        }
    }
}

/// What tells one operand DaemonSet from another.
struct Operand<'a> {
    /// Its name.
    name: &'a str,
    /// `app.kubernetes.io/component` of the DaemonSet.
    component: &'a str,
    /// The pod labels the DaemonSet selects by.
    selector: Value,
    /// `maxUnavailable` of a rolling update when the spec sets none.
    default_max_unavailable: &'a str,
}

/// An operand DaemonSet: `pod` (the pod spec's own fields, its node selector among them) with the
/// spec's DaemonSet settings around it: pod labels and annotations, priority class, tolerations
/// and update strategy. `extra_labels` are added to the pod's labels.
fn operand_daemonset(
    operand: Operand<'_>,
    inputs: &Inputs<'_>,
    ds: &DaemonsetsSpec,
    extra_labels: Value,
    mut pod: Value,
) -> Object {
    pod["priorityClassName"] = json!(ds.priority_class_name);
    pod["tolerations"] = json!(ds.tolerations);
    let mut labels = pod_labels(operand.selector.clone(), ds);
    if let (Value::Object(labels), Value::Object(extra)) = (&mut labels, extra_labels) {
        labels.extend(extra);
    }
    Object::DaemonSet(typed(json!({
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": meta(operand.name, inputs.namespace, operand.component),
        "spec": {
            "selector": {"matchLabels": operand.selector},
            "updateStrategy": update_strategy(ds, operand.default_max_unavailable),
            "template": {
                "metadata": {"labels": labels, "annotations": json!(ds.annotations)},
                "spec": pod,
            },
        },
    })))
}

/// `"25%"` stays a string; `"1"` becomes the number the apiserver requires (Helm values often quote it).
fn int_or_percent(value: &str) -> Value {
    value
        .trim()
        .parse::<i32>()
        .map(|n| json!(n))
        .unwrap_or_else(|_| json!(value.trim()))
}

/// `base` env vars followed by the user's; a user variable replaces a base one of the same name.
fn env(base: &[(&str, &str)], user: &[EnvVar]) -> Value {
    let mut out: Vec<Value> = base
        .iter()
        .filter(|(name, _)| !user.iter().any(|u| u.name == *name))
        .map(|(name, value)| json!({"name": name, "value": value}))
        .collect();
    out.extend(user.iter().map(|u| json!(u)));
    json!(out)
}

/// The container port named `http` (what the chart's PodMonitors scrape) of a metrics endpoint:
/// `default` (`HOST:PORT`), or the one the user's env sets instead; none when it has no port.
fn metrics_ports(default: &str, user: &[EnvVar]) -> Value {
    let endpoint = user
        .iter()
        .find(|u| u.name == api::contract::env::HTTP_ENDPOINT)
        .and_then(|u| u.value.as_deref())
        .unwrap_or(default);
    match endpoint
        .rsplit_once(':')
        .and_then(|(_, port)| port.parse::<u16>().ok())
        .filter(|port| *port > 0)
    {
        Some(port) => json!([{"name": "http", "containerPort": port}]),
        None => json!([]),
    }
}

/// The env var that gives a container its node's name.
fn node_name_env() -> Value {
    json!({"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}})
}

fn resources(r: &Option<ResourceRequirements>) -> Value {
    r.as_ref().map(|r| json!(r)).unwrap_or_else(|| json!({}))
}

/// A ResourceClaimTemplate with one admin-access request for one device, or `all` the node's
/// devices, of the operands' class: whole GPUs and MIG devices alike.
fn admin_claim_template(name: &str, namespace: &str, component: &str, all: bool) -> Object {
    let class = api::contract::objects::DEVICE_CLASS_OPERANDS;
    let exactly = if all {
        json!({"deviceClassName": class, "allocationMode": "All", "adminAccess": true})
    } else {
        json!({"deviceClassName": class, "allocationMode": "ExactCount", "count": 1, "adminAccess": true})
    };
    Object::ResourceClaimTemplate(typed(json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": meta(name, namespace, component),
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}},
    })))
}

/// Converts a JSON literal into its typed object. Debug builds (the tests) check that the typed
/// object kept every field of the literal, so a misspelt field name fails loudly.
fn typed<T: serde::de::DeserializeOwned + serde::Serialize>(value: Value) -> Box<T> {
    let object: T =
        serde_json::from_value(value.clone()).expect("operand literals match their types");
    debug_assert!(
        crate::diff::contains(
            &serde_json::to_value(&object).unwrap_or_default(),
            &value,
            ""
        ),
        "a field was dropped converting {value:#}"
    );
    Box::new(object)
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn max_unavailable_numbers_are_numbers_and_percentages_stay_strings() {
        assert_eq!(int_or_percent("1"), json!(1));
        assert_eq!(int_or_percent(" 3 "), json!(3));
        assert_eq!(int_or_percent("100%"), json!("100%"));
    }

    #[test]
    fn the_metrics_port_follows_the_endpoint_the_user_sets_and_is_left_out_without_one() {
        let user = |value: &str| {
            vec![EnvVar {
                name: api::contract::env::HTTP_ENDPOINT.into(),
                value: Some(value.into()),
                ..EnvVar::default()
            }]
        };
        let http = |port: u16| json!([{"name": "http", "containerPort": port}]);
        assert_eq!(metrics_ports("0.0.0.0:8080", &[]), http(8080));
        assert_eq!(
            metrics_ports("0.0.0.0:8080", &user("[::]:9400")),
            http(9400)
        );
        assert_eq!(metrics_ports("0.0.0.0:8080", &user("")), json!([]));
        assert_eq!(metrics_ports("0.0.0.0:8080", &user("host:0")), json!([]));
    }
}
