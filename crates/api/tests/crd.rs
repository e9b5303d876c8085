//! The generated CRD: committed copy, shape, descriptions, defaults and schema validation.

use api::gpucluster::{GPUCluster, crd, crd_yaml};
use serde_json::{Value, json};

const COMMITTED: &str =
    include_str!("../../../charts/gpu-operator/crds/nvidia.com_gpuclusters.yaml");

fn schema() -> Value {
    let crd = crd();
    let version = &crd.spec.versions[0];
    serde_json::to_value(
        version
            .schema
            .as_ref()
            .unwrap()
            .open_api_v3_schema
            .as_ref()
            .unwrap(),
    )
    .unwrap()
}

#[test]
fn committed_crd_matches_crdgen() {
    assert!(
        COMMITTED == crd_yaml(),
        "charts/gpu-operator/crds/nvidia.com_gpuclusters.yaml is stale: run `make generate`"
    );
}

#[test]
fn crd_identity_columns_subresource_and_singleton_rule() {
    let crd: Value = serde_yaml::from_str(COMMITTED).unwrap();
    let spec = &crd["spec"];
    assert_eq!(crd["metadata"]["name"], "gpuclusters.nvidia.com");
    assert_eq!(spec["group"], "nvidia.com");
    assert_eq!(spec["scope"], "Cluster");
    assert_eq!(spec["names"]["kind"], "GPUCluster");
    assert_eq!(spec["names"]["shortNames"], json!(["gc"]));
    let version = &spec["versions"][0];
    assert_eq!(version["name"], "v1alpha1");
    assert_eq!(version["subresources"]["status"], json!({}));
    let columns = version["additionalPrinterColumns"].as_array().unwrap();
    assert!(
        columns
            .iter()
            .any(|c| c["name"] == "STATUS" && c["jsonPath"] == ".status.state"),
        "{columns:?}"
    );
    assert!(columns.iter().any(|c| c["name"] == "AGE"), "{columns:?}");
    let rules = &version["schema"]["openAPIV3Schema"]["x-kubernetes-validations"][0];
    assert_eq!(rules["rule"], "self.metadata.name == 'gpu-cluster'");
    assert!(rules["message"].as_str().unwrap().contains("'gpu-cluster'"));
}

/// Collects the JSON path of every property in `schema` that has no description.
fn undocumented(schema: &Value, path: &str, out: &mut Vec<String>) {
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        for (name, prop) in props {
            let here = format!("{path}.{name}");
            // apiVersion/kind/metadata are Kubernetes' own and described by the apiserver.
            if prop.get("description").is_none() && !matches!(path, "") {
                out.push(here.clone());
            }
            undocumented(prop, &here, out);
        }
    }
    for key in ["items", "additionalProperties"] {
        if let Some(sub) = schema.get(key).filter(|v| v.is_object()) {
            undocumented(sub, &format!("{path}[]"), out);
        }
    }
}

#[test]
fn every_field_has_a_description() {
    let schema = schema();
    let mut missing = Vec::new();
    for top in ["spec", "status"] {
        let sub = &schema["properties"][top];
        assert!(sub.get("description").is_some(), "{top} has no description");
        undocumented(sub, top, &mut missing);
    }
    assert!(
        missing.is_empty(),
        "fields without a description: {missing:#?}"
    );
}

/// Applies schema defaults the way the apiserver does for structural schemas: a missing property
/// with a `default` gets it, and defaulting then continues inside the (possibly new) value.
fn apply_defaults(schema: &Value, value: &mut Value) {
    if let (Some(props), Some(obj)) = (
        schema.get("properties").and_then(Value::as_object),
        value.as_object_mut(),
    ) {
        for (name, prop) in props {
            if let (false, Some(default)) = (obj.contains_key(name), prop.get("default")) {
                obj.insert(name.clone(), default.clone());
            }
            if let Some(child) = obj.get_mut(name) {
                apply_defaults(prop, child);
            }
        }
    }
    if let (Some(items), Some(arr)) = (schema.get("items"), value.as_array_mut()) {
        arr.iter_mut().for_each(|v| apply_defaults(items, v));
    }
}

fn minimal() -> Value {
    json!({"apiVersion": "nvidia.com/v1alpha1", "kind": "GPUCluster", "metadata": {"name": "gpu-cluster"}})
}

#[test]
fn minimal_gpucluster_gets_every_default() {
    let mut obj = minimal();
    apply_defaults(&schema(), &mut obj);
    let spec = &obj["spec"];
    let expect = [
        ("/dcgmExporter/enabled", json!(true)),
        ("/dcgm/enabled", json!(false)),
        ("/draDriver/computeDomains/enabled", json!(true)),
        (
            "/draDriver/gpus/kubeletPlugin/healthcheck/enabled",
            json!(true),
        ),
        (
            "/draDriver/computeDomains/kubeletPlugin/healthcheck/enabled",
            json!(true),
        ),
        ("/hostPaths/driverInstallDir", json!("/run/nvidia/driver")),
        ("/hostPaths/kubeletRootDir", json!("/var/lib/kubelet")),
        (
            "/daemonsets/priorityClassName",
            json!("system-node-critical"),
        ),
        ("/daemonsets/updateStrategy", json!("RollingUpdate")),
    ];
    for (pointer, want) in expect {
        assert_eq!(
            spec.pointer(pointer),
            Some(&want),
            "spec{pointer} in {spec:#}"
        );
    }
}

#[test]
fn rust_defaults_equal_schema_defaults() {
    let mut from_schema = minimal();
    apply_defaults(&schema(), &mut from_schema);
    let from_rust: GPUCluster = serde_json::from_value(json!({
        "apiVersion": "nvidia.com/v1alpha1", "kind": "GPUCluster",
        "metadata": {"name": "gpu-cluster"}, "spec": {}
    }))
    .unwrap();
    assert_eq!(
        serde_json::to_value(&from_rust.spec).unwrap(),
        from_schema["spec"]
    );
}

fn validate(obj: &Value) -> Vec<String> {
    let validator = jsonschema::validator_for(&schema()).unwrap();
    validator
        .iter_errors(obj)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect()
}

#[test]
fn schema_accepts_a_full_spec_and_rejects_unknown_enum_values() {
    let mut good = minimal();
    good["spec"] = json!({
        "draDriver": {"repository": "nvcr.io/nvidia", "image": "dra-driver-nvidia-gpu",
                      "version": "v0.5.0", "imagePullPolicy": "Always",
                      "featureGates": {"PassthroughSupport": true},
                      "gpus": {"kubeletPlugin": {"healthcheck": {"port": 51516}}}},
        "daemonsets": {"updateStrategy": "OnDelete", "rollingUpdate": {"maxUnavailable": "25%"}}
    });
    assert_eq!(validate(&good), Vec::<String>::new());

    let mut bad = minimal();
    bad["spec"] = json!({"draDriver": {"imagePullPolicy": "Sometimes"}});
    let errors = validate(&bad);
    assert!(
        errors
            .iter()
            .any(|e| e.contains("/spec/draDriver/imagePullPolicy")),
        "unknown imagePullPolicy accepted: {errors:?}"
    );

    let mut bad_port = minimal();
    bad_port["spec"] =
        json!({"draDriver": {"gpus": {"kubeletPlugin": {"healthcheck": {"port": 0}}}}});
    assert!(!validate(&bad_port).is_empty(), "port 0 accepted");

    for field in ["kubeletRootDir", "driverInstallDir"] {
        let mut relative = minimal();
        relative["spec"] = json!({"hostPaths": {field: "var/lib/kubelet"}});
        let errors = validate(&relative);
        assert!(
            errors
                .iter()
                .any(|e| e.contains(&format!("/spec/hostPaths/{field}"))),
            "relative {field} accepted: {errors:?}"
        );
    }

    let mut bad_state = minimal();
    bad_state["status"] = json!({"state": "disabled"});
    assert!(
        !validate(&bad_state).is_empty(),
        "status.state 'disabled' accepted"
    );
}

const COMMITTED_GPU_CLASS: &str =
    include_str!("../../../charts/gpu-operator/crds/gpu-operator-rs.dev_gpuclasses.yaml");

#[test]
fn committed_gpuclass_crd_matches_crdgen() {
    assert!(
        COMMITTED_GPU_CLASS == api::gpuclass::crd_yaml(),
        "charts/gpu-operator/crds/gpu-operator-rs.dev_gpuclasses.yaml is stale: run `make generate`"
    );
}

#[test]
fn gpuclass_is_cluster_scoped_in_the_products_group_and_shows_its_resources() {
    let crd: Value = serde_yaml::from_str(COMMITTED_GPU_CLASS).unwrap();
    let spec = &crd["spec"];
    assert_eq!(crd["metadata"]["name"], "gpuclasses.gpu-operator-rs.dev");
    assert_eq!(spec["scope"], "Cluster");
    let version = &spec["versions"][0];
    assert_eq!(version["subresources"]["status"], json!({}));
    let columns: Vec<(&str, &str)> = version["additionalPrinterColumns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["name"].as_str().unwrap(), c["jsonPath"].as_str().unwrap()))
        .collect();
    assert!(
        columns.contains(&("RESOURCES", ".status.extendedResourceNames")),
        "{columns:?}"
    );
    assert!(
        columns.contains(&("DEVICES", ".status.devices")),
        "{columns:?}"
    );
    let schema = &version["schema"]["openAPIV3Schema"];
    let mut missing = Vec::new();
    for top in ["spec", "status"] {
        undocumented(&schema["properties"][top], top, &mut missing);
    }
    assert!(
        missing.is_empty(),
        "fields without a description: {missing:#?}"
    );
    assert_eq!(
        schema["properties"]["spec"]["properties"]["variants"]["default"],
        json!({"whole": {}}),
        "a class without variants offers whole cards"
    );
}

#[test]
fn committed_physicalgpu_crd_matches_crdgen_and_shows_cards_wide() {
    let committed =
        include_str!("../../../charts/gpu-operator/crds/gpu-operator-rs.dev_physicalgpus.yaml");
    assert!(
        committed == api::physicalgpu::crd_yaml(),
        "charts/gpu-operator/crds/gpu-operator-rs.dev_physicalgpus.yaml is stale: run `make generate`"
    );
    let crd: Value = serde_yaml::from_str(committed).unwrap();
    let version = &crd["spec"]["versions"][0];
    assert!(
        version.get("subresources").is_none(),
        "one write creates or changes a PhysicalGPU: no status subresource"
    );
    let columns: Vec<(&str, bool)> = version["additionalPrinterColumns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["name"].as_str().unwrap(), c.get("priority").is_some()))
        .collect();
    for (name, wide) in [
        ("NODE", false),
        ("PHASE", false),
        ("UUID", true),
        ("PCI", true),
    ] {
        assert!(columns.contains(&(name, wide)), "{name}: {columns:?}");
    }
    let mut missing = Vec::new();
    undocumented(
        &version["schema"]["openAPIV3Schema"]["properties"]["status"],
        "status",
        &mut missing,
    );
    assert!(
        missing.is_empty(),
        "fields without a description: {missing:#?}"
    );
}
