use super::*;
use api::GPUCluster;

fn images() -> DefaultImages {
    DefaultImages {
        dra_driver: "registry.example/gpu-operator-rs/gpu-kubelet-plugin:0.1.0".into(),
        validator: "registry.example/gpu-operator-rs/gpu-operator:0.1.0".into(),
        compute_domain: "nvcr.io/nvidia/dra-driver-nvidia-gpu:v0.5.0".into(),
        dcgm: "nvcr.io/nvidia/cloud-native/dcgm:4.6.0-1-ubuntu24.04".into(),
        dcgm_exporter: "nvcr.io/nvidia/k8s/dcgm-exporter:4.6.0-4.8.3-distroless".into(),
    }
}

fn spec(json: Value) -> GPUClusterSpec {
    let gc: GPUCluster = serde_json::from_value(json!({
        "apiVersion": "nvidia.com/v1alpha1", "kind": "GPUCluster",
        "metadata": {"name": "gpu-cluster"}, "spec": json}))
    .unwrap();
    gc.spec
}

fn render(spec: &GPUClusterSpec, facts: ClusterFacts) -> Desired {
    let images = images();
    desired(
        spec,
        &Inputs {
            namespace: "gpu-operator",
            images: &images,
            facts,
        },
    )
}

fn yaml(d: &Desired) -> String {
    d.objects
        .iter()
        .map(|o| serde_yaml::to_string(&o.to_value()).unwrap())
        .collect::<Vec<_>>()
        .join("---\n")
}

fn ids(d: &Desired) -> Vec<String> {
    d.objects.iter().map(Object::id).collect()
}

#[test]
fn default_spec_renders_every_default_operand() {
    let d = render(&spec(json!({})), ClusterFacts::default());
    assert!(d.errors.is_empty());
    assert_eq!(
        ids(&d),
        [
            "DeviceClass/gpu.nvidia.com",
            "DeviceClass/mig.nvidia.com",
            "DeviceClass/vfio.gpu.nvidia.com",
            "DeviceClass/compute-domain-daemon.nvidia.com",
            "DeviceClass/compute-domain-default-channel.nvidia.com",
            "ValidatingAdmissionPolicy/resourceslices-policy-nvidia-dra-driver",
            "ValidatingAdmissionPolicyBinding/resourceslices-policy-nvidia-dra-driver",
            "DaemonSet/nvidia-dra-driver-kubelet-plugin",
            "Deployment/nvidia-dra-driver-controller",
            "DaemonSet/nvidia-device-plugin-daemonset",
            "ResourceClaimTemplate/nvidia-dra-validator-gpu",
            "DaemonSet/nvidia-dra-validator",
            "ResourceClaimTemplate/nvidia-dcgm-exporter-admin",
            "DaemonSet/nvidia-dcgm-exporter-dra",
            "Service/nvidia-dcgm-exporter-dra",
        ]
    );
    insta::assert_snapshot!("default", yaml(&d));
}

#[test]
fn fully_customised_spec() {
    let s = spec(json!({
        "draDriver": {
            "repository": "registry.example/custom", "image": "plugin", "version": "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "imagePullPolicy": "Always", "imagePullSecrets": ["regcred"],
            "featureGates": {"PassthroughSupport": true, "MPSSupport": false},
            "gpus": {"kubeletPlugin": {
                "env": [{"name": "LOG_VERBOSITY", "value": "6"}, {"name": "HTTP_ENDPOINT", "value": "0.0.0.0:9090"}],
                "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
                "healthcheck": {"port": 52000}}},
            "computeDomains": {"enabled": true,
                "controller": {"env": [{"name": "LOG_VERBOSITY", "value": "2"}]},
                "kubeletPlugin": {"resources": {"requests": {"cpu": "200m", "memory": "32Mi"}, "limits": {"memory": "128Mi"}},
                                  "healthcheck": {"enabled": false}}}
        },
        "validator": {"image": "registry.example/custom/validator:dev", "env": [{"name": "SLEEP_INTERVAL_SECONDS", "value": "2"}]},
        "devicePlugin": {"image": "registry.example/custom/device-plugin:dev", "config": {"migStrategy": "mixed"},
                         "env": [{"name": "HEALTH_RECOVERY_PERIOD", "value": "300"}],
                         "resources": {"limits": {"memory": "64Mi"}}},
        "dcgmExporter": {"args": ["-f", "/etc/custom.csv"], "config": {"name": "metrics"},
                         "serviceMonitor": {"interval": "30s", "honorLabels": true, "additionalLabels": {"release": "prom"}}},
        "dcgm": {"enabled": true, "hostPort": 5556},
        "hostPaths": {"driverInstallDir": "/opt/nvidia/driver", "kubeletRootDir": "/var/lib/k0s/kubelet/"},
        "daemonsets": {"labels": {"team": "gpu", "app": "ignored"}, "annotations": {"note": "x"},
                       "priorityClassName": "gpu-critical",
                       "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                       "updateStrategy": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%"}}
    }));
    let d = render(
        &s,
        ClusterFacts {
            service_monitors_served: true,
            ..ClusterFacts::default()
        },
    );
    assert!(d.errors.is_empty(), "{:?}", d.errors);
    assert!(ids(&d).contains(&"ServiceMonitor/nvidia-dcgm-exporter-dra".to_string()));
    assert!(ids(&d).contains(&"DaemonSet/nvidia-dcgm-dra".to_string()));
    insta::assert_snapshot!("customised", yaml(&d));
}

#[test]
fn the_gpu_class_maps_nvidia_com_gpu_only_where_the_apiserver_serves_it() {
    let class = |facts| {
        render(&spec(json!({})), facts)
            .objects
            .iter()
            .find(|o| o.id() == "DeviceClass/gpu.nvidia.com")
            .unwrap()
            .to_value()
    };
    let served = class(ClusterFacts {
        extended_resources_served: true,
        ..ClusterFacts::default()
    });
    assert_eq!(served["spec"]["extendedResourceName"], "nvidia.com/gpu");
    assert!(
        class(ClusterFacts::default())["spec"]
            .get("extendedResourceName")
            .is_none()
    );
    let mig = render(
        &spec(json!({})),
        ClusterFacts {
            extended_resources_served: true,
            ..ClusterFacts::default()
        },
    );
    let mig = mig
        .objects
        .iter()
        .find(|o| o.id() == "DeviceClass/mig.nvidia.com")
        .unwrap()
        .to_value();
    assert!(mig["spec"].get("extendedResourceName").is_none());
}

#[test]
fn the_device_plugin_uses_the_plugin_image_and_can_be_turned_off() {
    let d = render(&spec(json!({})), ClusterFacts::default());
    let dp = d
        .objects
        .iter()
        .find(|o| o.id() == "DaemonSet/nvidia-device-plugin-daemonset")
        .unwrap()
        .to_value();
    let pod = &dp["spec"]["template"]["spec"];
    assert_eq!(
        pod["nodeSelector"]["nvidia.com/gpu.deploy.device-plugin"],
        "true"
    );
    assert_eq!(pod["containers"][0]["image"], images().dra_driver);
    assert_eq!(pod["initContainers"][0]["name"], "driver-validation");
    let off = render(
        &spec(json!({"devicePlugin": {"enabled": false}})),
        ClusterFacts::default(),
    );
    assert!(!ids(&off).iter().any(|i| i.contains("device-plugin")));
}

#[test]
fn a_cluster_policy_keeps_the_device_plugin_plane_to_itself() {
    let with_policy = render(
        &spec(json!({})),
        ClusterFacts {
            cluster_policy: true,
            ..ClusterFacts::default()
        },
    );
    let ids = ids(&with_policy);
    assert!(!ids.iter().any(|i| i.contains("device-plugin")), "{ids:?}");
    // The DRA plane stays.
    assert!(
        ids.contains(&"DaemonSet/nvidia-dra-driver-kubelet-plugin".to_owned()),
        "{ids:?}"
    );
}

#[test]
fn disabling_compute_domains_drops_container_controller_and_classes() {
    let d = render(
        &spec(json!({"draDriver": {"computeDomains": {"enabled": false}}})),
        ClusterFacts::default(),
    );
    let ids = ids(&d);
    assert!(
        !ids.iter()
            .any(|i| i.contains("compute-domain") || i.contains("controller")),
        "{ids:?}"
    );
    let plugin = d
        .objects
        .iter()
        .find(|o| o.id() == "DaemonSet/nvidia-dra-driver-kubelet-plugin")
        .unwrap();
    let containers = &plugin.to_value()["spec"]["template"]["spec"]["containers"];
    assert_eq!(containers.as_array().unwrap().len(), 1);
    assert_eq!(containers[0]["name"], "gpus");
}

#[test]
fn exporter_off_and_dcgm_on() {
    let d = render(
        &spec(json!({"dcgmExporter": {"enabled": false}, "dcgm": {"enabled": true}})),
        ClusterFacts::default(),
    );
    let ids = ids(&d);
    assert!(!ids.iter().any(|i| i.contains("exporter")), "{ids:?}");
    for want in [
        "DaemonSet/nvidia-dcgm-dra",
        "Service/nvidia-dcgm-dra",
        "ResourceClaimTemplate/nvidia-dcgm-admin",
    ] {
        assert!(ids.contains(&want.to_string()), "{want} missing: {ids:?}");
    }
}

#[test]
fn service_monitor_only_when_served() {
    let s = spec(json!({}));
    assert!(
        !ids(&render(&s, ClusterFacts::default()))
            .iter()
            .any(|i| i.starts_with("ServiceMonitor"))
    );
    assert!(
        ids(&render(
            &s,
            ClusterFacts {
                service_monitors_served: true,
                ..ClusterFacts::default()
            }
        ))
        .iter()
        .any(|i| i.starts_with("ServiceMonitor"))
    );
}

#[test]
fn a_bad_image_is_an_error_naming_the_field_and_other_operands_still_render() {
    let d = render(
        &spec(json!({"validator": {"repository": "r", "image": "v"}})),
        ClusterFacts::default(),
    );
    assert_eq!(d.errors.len(), 1);
    let message = d.errors[0].to_string();
    assert!(
        message.starts_with("spec.validator:") && message.contains("version"),
        "{message}"
    );
    let ids = ids(&d);
    assert!(ids.contains(&"DaemonSet/nvidia-dcgm-exporter-dra".to_string()));
    assert!(!ids.contains(&"DaemonSet/nvidia-dra-validator".to_string()));
}

#[test]
fn healthcheck_off_renders_port_minus_one_and_no_probes() {
    let d = render(
        &spec(
            json!({"draDriver": {"gpus": {"kubeletPlugin": {"healthcheck": {"enabled": false}}}}}),
        ),
        ClusterFacts::default(),
    );
    let plugin = d
        .objects
        .iter()
        .find(|o| o.id() == "DaemonSet/nvidia-dra-driver-kubelet-plugin")
        .unwrap()
        .to_value();
    let gpus = &plugin["spec"]["template"]["spec"]["containers"][0];
    assert!(gpus.get("livenessProbe").is_none() && gpus.get("startupProbe").is_none());
    let port = gpus["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "HEALTHCHECK_PORT")
        .unwrap();
    assert_eq!(port["value"], "-1");
}
