//! DCGM and the DCGM exporter on DRA nodes, each with an admin-access claim on all the node's GPUs.

use api::GPUClusterSpec;
use api::contract::{labels as l, objects as o, ports};
use kube::api::DynamicObject;
use serde_json::{Value, json};

use super::plugin::pull_secrets;
use super::{
    Inputs, Object, Operand, RenderError, admin_claim_template, env, meta, operand_daemonset,
    resources, typed,
};

const EXPORTER_PORT: u16 = 9400;

/// The DCGM exporter's DaemonSet, claim template, Service and (when served) ServiceMonitor.
pub fn exporter(spec: &GPUClusterSpec, inputs: &Inputs<'_>) -> Result<Vec<Object>, RenderError> {
    let x = &spec.dcgm_exporter;
    if !x.enabled {
        return Ok(vec![]);
    }
    let image = x
        .image
        .reference("spec.dcgmExporter")?
        .unwrap_or_else(|| inputs.images.dcgm_exporter.clone());
    let name = o::DCGM_EXPORTER_DAEMONSET;
    let component = "dcgm-exporter";
    let listen = format!(":{EXPORTER_PORT}");
    let remote = format!(
        "{}:{}",
        o::DCGM_DAEMONSET,
        spec.dcgm.host_port.unwrap_or(ports::DCGM.into())
    );
    let mut base = vec![
        ("DCGM_EXPORTER_LISTEN", listen.as_str()),
        ("DCGM_EXPORTER_KUBERNETES", "true"),
        ("KUBERNETES_ENABLE_DRA", "true"),
    ];
    if spec.dcgm.enabled {
        base.push(("DCGM_REMOTE_HOSTENGINE_INFO", remote.as_str()));
    }
    let collectors = x
        .config
        .as_ref()
        .map(|_| "/etc/dcgm-exporter/dcgm-metrics.csv");
    if let Some(path) = collectors {
        base.push(("DCGM_EXPORTER_COLLECTORS", path));
    }
    let kubelet_root = spec.host_paths.kubelet_root_dir.trim_end_matches('/');
    let mut mounts = vec![
        json!({"name": "pod-resources", "mountPath": "/var/lib/kubelet/pod-resources", "readOnly": true}),
    ];
    let mut volumes = vec![
        json!({"name": "pod-resources", "hostPath": {"path": format!("{kubelet_root}/pod-resources")}}),
    ];
    if let Some(config) = &x.config {
        mounts.push(json!({"name": "metrics-config", "mountPath": "/etc/dcgm-exporter/dcgm-metrics.csv", "subPath": "dcgm-metrics.csv", "readOnly": true}));
        volumes.push(json!({"name": "metrics-config", "configMap": {"name": config.name}}));
    }
    let container = json!({
        "name": "nvidia-dcgm-exporter",
        "image": image,
        "imagePullPolicy": x.image.pull_policy().as_str(),
        "args": x.args,
        "env": env(&base, &x.env),
        "ports": [{"name": "metrics", "containerPort": EXPORTER_PORT}],
        "resources": merge_claim(resources(&x.resources), "gpus"),
        "volumeMounts": mounts,
    });
    let mut objects = vec![
        admin_claim_template(
            o::DCGM_EXPORTER_CLAIM_TEMPLATE,
            inputs.namespace,
            component,
            true,
        ),
        daemonset(
            spec,
            inputs,
            name,
            component,
            l::DEPLOY_DCGM_EXPORTER_DRA,
            o::DCGM_EXPORTER_SERVICE_ACCOUNT,
            o::DCGM_EXPORTER_CLAIM_TEMPLATE,
            container,
            volumes,
            &x.image.image_pull_secrets,
        ),
        service(inputs, name, component, "gpu-metrics", EXPORTER_PORT),
    ];
    let monitor = x.service_monitor.as_ref();
    if inputs.facts.service_monitors_served && monitor.and_then(|m| m.enabled) != Some(false) {
        let mut labels = super::managed_labels(component);
        for (k, v) in monitor
            .map(|m| m.additional_labels.clone())
            .unwrap_or_default()
        {
            labels[k] = json!(v);
        }
        let endpoint = json!({
            "port": "gpu-metrics",
            "path": "/metrics",
            "interval": monitor.and_then(|m| m.interval.clone()).unwrap_or_else(|| "15s".into()),
            "honorLabels": monitor.and_then(|m| m.honor_labels).unwrap_or(false),
        });
        objects.push(Object::ServiceMonitor(typed::<DynamicObject>(json!({
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "ServiceMonitor",
            "metadata": {"name": name, "namespace": inputs.namespace, "labels": labels},
            "spec": {
                "selector": {"matchLabels": {"app": name}},
                "namespaceSelector": {"matchNames": [inputs.namespace]},
                "endpoints": [endpoint],
            },
        }))));
    }
    Ok(objects)
}

/// Standalone DCGM's DaemonSet, claim template and Service, when enabled.
pub fn standalone(spec: &GPUClusterSpec, inputs: &Inputs<'_>) -> Result<Vec<Object>, RenderError> {
    let d = &spec.dcgm;
    if !d.enabled {
        return Ok(vec![]);
    }
    let image = d
        .image
        .reference("spec.dcgm")?
        .unwrap_or_else(|| inputs.images.dcgm.clone());
    let port = d.host_port.unwrap_or(ports::DCGM.into());
    let component = "dcgm";
    let container = json!({
        "name": "nvidia-dcgm",
        "image": image,
        "imagePullPolicy": d.image.pull_policy().as_str(),
        "args": d.args,
        "env": env(&[], &d.env),
        "ports": [{"name": "dcgm", "containerPort": ports::DCGM, "hostPort": port}],
        "resources": merge_claim(resources(&d.resources), "gpus"),
    });
    Ok(vec![
        admin_claim_template(o::DCGM_CLAIM_TEMPLATE, inputs.namespace, component, true),
        daemonset(
            spec,
            inputs,
            o::DCGM_DAEMONSET,
            component,
            l::DEPLOY_DCGM_DRA,
            o::DCGM_SERVICE_ACCOUNT,
            o::DCGM_CLAIM_TEMPLATE,
            container,
            vec![],
            &d.image.image_pull_secrets,
        ),
        service(inputs, o::DCGM_DAEMONSET, component, "dcgm", ports::DCGM),
    ])
}

fn merge_claim(mut resources: Value, claim: &str) -> Value {
    resources["claims"] = json!([{"name": claim}]);
    resources
}

#[allow(clippy::too_many_arguments)]
fn daemonset(
    spec: &GPUClusterSpec,
    inputs: &Inputs<'_>,
    name: &str,
    component: &str,
    deploy_label: &str,
    service_account: &str,
    claim_template: &str,
    container: Value,
    volumes: Vec<Value>,
    pull_secret_names: &[String],
) -> Object {
    let pod = json!({
        "serviceAccountName": service_account,
        "nodeSelector": {deploy_label: "true"},
        "imagePullSecrets": pull_secrets(pull_secret_names),
        "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": claim_template}],
        "containers": [container],
        "volumes": volumes,
    });
    let operand = Operand {
        name,
        component,
        selector: json!({"app": name}),
        default_max_unavailable: "1",
    };
    operand_daemonset(operand, inputs, &spec.daemonsets, json!({}), pod)
}

fn service(inputs: &Inputs<'_>, name: &str, component: &str, port_name: &str, port: u16) -> Object {
    let mut metadata = meta(name, inputs.namespace, component);
    metadata["labels"]["app"] = json!(name);
    Object::Service(typed(json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata,
        "spec": {
            "selector": {"app": name},
            "ports": [{"name": port_name, "port": port, "targetPort": port, "protocol": "TCP"}],
        },
    })))
}
