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
            "DeviceClass/gpu-or-mig.operands.gpu-operator-rs.dev",
            "DeviceClass/vfio.gpu.nvidia.com",
            "DeviceClass/compute-domain-daemon.nvidia.com",
            "DeviceClass/compute-domain-default-channel.nvidia.com",
            "ValidatingAdmissionPolicy/resourceslices-policy-nvidia-dra-driver",
            "ValidatingAdmissionPolicyBinding/resourceslices-policy-nvidia-dra-driver",
            "ValidatingAdmissionPolicy/physicalgpus-policy-gpu-operator",
            "ValidatingAdmissionPolicyBinding/physicalgpus-policy-gpu-operator",
            "DaemonSet/nvidia-dra-driver-kubelet-plugin",
            "Deployment/nvidia-dra-driver-controller",
            "DaemonSet/nvidia-device-plugin-daemonset",
            "ResourceClaimTemplate/nvidia-dra-validator-gpu",
            "DaemonSet/nvidia-dra-validator",
            "DaemonSet/nvidia-operator-validator",
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
            "gpus": {"consumableShares": "4", "migPartitioning": "dynamic", "kubeletPlugin": {
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
    assert!(
        !ids(&off)
            .iter()
            .any(|i| i.contains("device-plugin") || i.contains("operator-validator"))
    );
}

#[test]
fn the_device_plugin_planes_validator_runs_a_validation_pod_on_its_nodes() {
    let d = render(
        &spec(json!({"validator": {"imagePullSecrets": ["regcred"]}})),
        ClusterFacts::default(),
    );
    let ds = d
        .objects
        .iter()
        .find(|o| o.id() == "DaemonSet/nvidia-operator-validator")
        .expect("the device-plugin plane's validator")
        .to_value();
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(
        pod["nodeSelector"]["nvidia.com/gpu.deploy.operator-validator"],
        "true"
    );
    assert_eq!(pod["serviceAccountName"], "nvidia-operator-validator");
    assert_eq!(pod["initContainers"][0]["name"], "driver-validation");
    let main = &pod["containers"][0];
    assert_eq!(main["command"], json!(["dra-driver-validator", "plugin"]));
    let env = |name: &str| {
        main["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == name)
            .cloned()
            .unwrap_or(Value::Null)
    };
    // The validation pod runs the validator's own image, with its pull secrets.
    assert_eq!(env("VALIDATOR_IMAGE")["value"], images().validator);
    assert_eq!(env("VALIDATOR_IMAGE_PULL_SECRETS")["value"], "regcred");
    assert_eq!(
        env("POD_UID")["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.uid"
    );
}

#[test]
fn the_device_plugins_readiness_probe_follows_its_http_endpoint() {
    let probe = |env: Value| {
        let d = render(
            &spec(json!({"devicePlugin": {"env": env}})),
            ClusterFacts::default(),
        );
        let container = device_plugin_pod(&d)["spec"]["containers"][0].clone();
        (
            container["ports"].clone(),
            container["readinessProbe"].clone(),
        )
    };
    let (ports, readiness) = probe(json!([]));
    assert_eq!(ports, json!([{"name": "http", "containerPort": 8080}]));
    assert_eq!(
        readiness["httpGet"],
        json!({"path": "/readyz", "port": "http"})
    );
    let (ports, readiness) = probe(json!([{"name": "HTTP_ENDPOINT", "value": "0.0.0.0:9091"}]));
    assert_eq!(ports, json!([{"name": "http", "containerPort": 9091}]));
    assert_eq!(
        readiness["httpGet"]["port"], "http",
        "the moved port, by name"
    );
    let (ports, readiness) = probe(json!([{"name": "HTTP_ENDPOINT", "value": ""}]));
    assert_eq!(
        (ports, readiness),
        (json!([]), Value::Null),
        "nothing to probe"
    );
}

fn device_plugin_pod(d: &Desired) -> Value {
    let ds = d
        .objects
        .iter()
        .find(|o| o.id() == "DaemonSet/nvidia-device-plugin-daemonset")
        .unwrap()
        .to_value();
    ds["spec"]["template"].clone()
}

fn config_file_env(template: &Value) -> Option<String> {
    template["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "CONFIG_FILE")
        .map(|e| e["value"].as_str().unwrap().to_owned())
}

#[test]
fn time_slicing_becomes_a_config_file_that_rolls_the_plugin_when_it_changes() {
    let sharing = |replicas: u32| {
        spec(
            json!({"devicePlugin": {"config": {"migStrategy": "mixed", "sharing": {"timeSlicing": {
            "renameByDefault": true,
            "resources": [{"name": "nvidia.com/gpu", "replicas": replicas}]}}}}}),
        )
    };
    let d = render(&sharing(4), ClusterFacts::default());
    let map = d
        .objects
        .iter()
        .find(|o| o.id() == "ConfigMap/nvidia-device-plugin-config")
        .expect("the config's ConfigMap")
        .to_value();
    let file: Value = serde_yaml::from_str(map["data"]["config.yaml"].as_str().unwrap()).unwrap();
    assert_eq!(
        file,
        json!({"version": "v1", "flags": {"migStrategy": "mixed"}, "sharing": {"timeSlicing": {
            "renameByDefault": true, "resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}})
    );
    let template = device_plugin_pod(&d);
    let path = config_file_env(&template).expect("CONFIG_FILE");
    let mount = template["spec"]["containers"][0]["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "config")
        .unwrap()
        .clone();
    assert!(path.starts_with(mount["mountPath"].as_str().unwrap()));
    let hash = |d: &Desired| {
        device_plugin_pod(d)["metadata"]["annotations"]["gpu-operator-rs.dev/device-plugin-config"]
            .clone()
    };
    assert_ne!(hash(&d), Value::Null);
    assert_eq!(
        hash(&d),
        hash(&render(&sharing(4), ClusterFacts::default()))
    );
    assert_ne!(
        hash(&d),
        hash(&render(&sharing(2), ClusterFacts::default()))
    );
}

#[test]
fn an_admins_config_map_is_mounted_by_its_key_and_no_config_means_no_file() {
    let d = render(
        &spec(json!({"devicePlugin": {"config": {"name": "my-plugin-config", "default": "a100"}}})),
        ClusterFacts::default(),
    );
    assert!(!ids(&d).contains(&"ConfigMap/nvidia-device-plugin-config".to_owned()));
    let template = device_plugin_pod(&d);
    assert!(config_file_env(&template).is_some());
    let volume = template["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "config")
        .unwrap()
        .clone();
    assert_eq!(
        volume["configMap"],
        json!({"name": "my-plugin-config", "items": [{"key": "a100", "path": "config.yaml"}]})
    );
    let plain = render(&spec(json!({})), ClusterFacts::default());
    assert_eq!(config_file_env(&device_plugin_pod(&plain)), None);
    assert!(!ids(&plain).iter().any(|i| i.starts_with("ConfigMap/")));
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
    let device_plugin_plane =
        |i: &String| i.contains("device-plugin") || i.contains("operator-validator");
    assert!(!ids.iter().any(device_plugin_plane), "{ids:?}");
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
