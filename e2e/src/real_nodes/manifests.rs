//! The manifests the scenarios apply, written as a user writes them (flow-style YAML).

use super::{DRIVER, WORKLOAD_IMAGE, WORKLOAD_NS};

/// A ResourceClaim for one GPU of class `gpu.nvidia.com` whose GpuConfig's `sharing` is
/// `sharing` (flow-style YAML), as the upstream driver's documentation writes them.
pub fn sharing_claim(name: &str, sharing: &str) -> String {
    let config = format!(
        r#"
    config:
    - requests: [gpu]
      opaque:
        driver: gpu.nvidia.com
        parameters: {{apiVersion: resource.nvidia.com/v1beta1, kind: GpuConfig, sharing: {sharing}}}"#
    );
    resource_claim(name, "{deviceClassName: gpu.nvidia.com}", &config)
}

/// A ResourceClaim `name` of one request `gpu` whose `exactly` is `request`, then the `devices`
/// lines of `config`.
fn resource_claim(name: &str, request: &str, config: &str) -> String {
    format!(
        r#"apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {{name: {name}, namespace: {WORKLOAD_NS}}}
spec:
  devices:
    requests:
    - name: gpu
      exactly: {request}{config}
"#
    )
}

/// A pod on `node` whose containers (`name`, script) run the workload image and use claim `claim`.
pub fn claim_pod(name: &str, node: &str, claim: &str, containers: &[(&str, &str)]) -> String {
    let containers: String = containers
        .iter()
        .map(|(ctr, script)| {
            format!(
                "  - name: {ctr}\n    image: {WORKLOAD_IMAGE}\n    command: [\"sh\", \"-c\", {script:?}]\n    resources: {{claims: [{{name: gpu}}]}}\n"
            )
        })
        .collect();
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: {WORKLOAD_NS}}}
spec:
  terminationGracePeriodSeconds: 1
  nodeSelector: {{kubernetes.io/hostname: {node}}}
  resourceClaims: [{{name: gpu, resourceClaimName: {claim}}}]
  containers:
{containers}"#
    )
}

/// What a workload container runs to show what it got: the GPUs `nvidia-smi -L` lists, its
/// `/dev/nvidia<minor>` nodes, and `nvml-present` when NVML's library was injected.
pub const LIST_GPUS: &str = "nvidia-smi -L; ls /dev | grep '^nvidia[0-9]'; test -e /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1 && echo nvml-present";

/// The install guide's claim template and a pod using it: `count` devices of a class (by default
/// one of `gpu.nvidia.com`), on any node unless pinned, its container running [`LIST_GPUS`] in
/// the guide's image unless told otherwise, and ending.
#[derive(Clone, Debug)]
pub struct GuidePod<'a> {
    name: &'a str,
    node: Option<&'a str>,
    count: u32,
    class: &'a str,
    selector: Option<&'a str>,
    script: &'a str,
    image: &'a str,
}

impl<'a> GuidePod<'a> {
    /// Pod and template `name`, one `gpu.nvidia.com` device, as the guide writes them.
    pub fn new(name: &'a str) -> Self {
        Self {
            name,
            node: None,
            count: 1,
            class: DRIVER,
            selector: None,
            script: LIST_GPUS,
            image: WORKLOAD_IMAGE,
        }
    }

    /// Pinned to `node`.
    pub fn on(self, node: &'a str) -> Self {
        Self {
            node: Some(node),
            ..self
        }
    }

    /// `count` devices.
    pub fn count(self, count: u32) -> Self {
        Self { count, ..self }
    }

    /// Devices of DeviceClass `class`.
    pub fn class(self, class: &'a str) -> Self {
        Self { class, ..self }
    }

    /// Devices matching the CEL `selector`.
    pub fn selector(self, selector: &'a str) -> Self {
        Self {
            selector: Some(selector),
            ..self
        }
    }

    /// Its container runs `script` (`sh -c`).
    pub fn script(self, script: &'a str) -> Self {
        Self { script, ..self }
    }

    /// Its container runs `image`.
    pub fn image(self, image: &'a str) -> Self {
        Self { image, ..self }
    }

    /// The manifests, for `kubectl apply`.
    pub fn yaml(&self) -> String {
        let Self {
            name,
            count,
            class,
            script,
            image,
            ..
        } = self;
        let request = device_request(class, *count, self.selector, None);
        let template = format!(
            r#"apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {{name: {name}, namespace: {WORKLOAD_NS}}}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly: {request}
"#
        );
        let pod = workload_pod(
            name,
            self.node,
            &format!("\n  resourceClaims: [{{name: gpu, resourceClaimTemplateName: {name}}}]"),
            image,
            script,
            "{claims: [{name: gpu}]}",
        );
        format!("{template}---\n{pod}")
    }
}

/// A pod `name` asking one of extended resource `resource` (`nvidia.com/gpu`, a GPUClass's
/// resource) with no claim in its manifest, pinned to `node` if given, running `script`.
pub fn resource_pod(name: &str, resource: &str, node: Option<&str>, script: &str) -> String {
    let limits = format!("{{limits: {{{resource}: 1}}}}");
    workload_pod(name, node, "", WORKLOAD_IMAGE, script, &limits)
}

/// A workload pod that runs `script` once in `image`, pinned to `node` if given, with the pod-level
/// `extra` spec lines and the container's `resources` (flow-style YAML).
fn workload_pod(
    name: &str,
    node: Option<&str>,
    extra: &str,
    image: &str,
    script: &str,
    resources: &str,
) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: {WORKLOAD_NS}}}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  nodeSelector: {}{extra}
  containers:
  - name: workload
    image: {image}
    command: ["sh", "-c", {script:?}]
    resources: {resources}
"#,
        pinned_to(node)
    )
}

/// A ResourceClaim `name` for one device of class `class` (matching the CEL `selector`, taking
/// `shares` of a consumable GPU, where given) and a pod `name` on `node` that names it and stays
/// (the kubelet shows device health only for claims a pod names).
pub fn named_claim_pod(
    name: &str,
    node: &str,
    class: &str,
    selector: Option<&str>,
    shares: Option<u32>,
) -> String {
    let claim = resource_claim(name, &device_request(class, 1, selector, shares), "");
    // The pod's entry carries the claim's own name: kubelet 1.34 shows a device's health only
    // where the two match.
    let script = format!("{LIST_GPUS}; sleep 3600");
    let pod = workload_pod(
        name,
        Some(node),
        &format!("\n  resourceClaims: [{{name: {name}, resourceClaimName: {name}}}]"),
        WORKLOAD_IMAGE,
        &script,
        &format!("{{claims: [{{name: {name}}}]}}"),
    );
    format!("{claim}---\n{pod}")
}

/// A GPUClass `name` of the GPUs whose `gpu-operator-rs.dev/device` label is `device`, with a
/// `shared` variant of `shares` per card under `strategy` where one is given.
pub fn gpu_class(name: &str, device: &str, shared: Option<(u32, &str)>) -> String {
    let variants = shared
        .map(|(shares, strategy)| {
            format!("\n  variants:\n    shared: {{shares: {shares}, strategy: {strategy}}}")
        })
        .unwrap_or_default();
    format!(
        r#"apiVersion: gpu-operator-rs.dev/v1alpha1
kind: GPUClass
metadata: {{name: {name}}}
spec:
  selector:
    matchLabels: {{gpu-operator-rs.dev/device: {device}}}{variants}
"#
    )
}

/// A node selector pinning a pod to `node`, or none.
fn pinned_to(node: Option<&str>) -> String {
    node.map(|n| format!("{{kubernetes.io/hostname: {n}}}"))
        .unwrap_or_else(|| "{}".to_owned())
}

/// One request's `exactly` in flow-style YAML: `count` devices of class `class`, matching the CEL
/// `selector` and taking `shares` of a consumable GPU where given.
fn device_request(class: &str, count: u32, selector: Option<&str>, shares: Option<u32>) -> String {
    let mut request =
        format!("deviceClassName: {class}, allocationMode: ExactCount, count: {count}");
    if let Some(cel) = selector {
        request += &format!(", selectors: [{{cel: {{expression: {cel:?}}}}}]");
    }
    if let Some(shares) = shares {
        request += &format!(", capacity: {{requests: {{shares: \"{shares}\"}}}}");
    }
    format!("{{{request}}}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifests_are_yaml_the_api_reads() {
        for yaml in [
            sharing_claim("c", "{strategy: TimeSlicing}"),
            claim_pod("p", "n", "c", &[("a", "echo 'hi'; sleep 1"), ("b", "true")]),
            GuidePod::new("s")
                .selector("device.attributes['gpu.nvidia.com'].productName == 'x'")
                .yaml(),
            GuidePod::new("t")
                .on("n")
                .count(2)
                .class("mig.nvidia.com")
                .image("docker.io/library/ubuntu:24.04")
                .yaml(),
            resource_pod("r", "nvidia.com/gpu", Some("n"), "true"),
            resource_pod("r", "gpu-operator-rs.dev/h100", None, LIST_GPUS),
            gpu_class("c", "l4", None),
            named_claim_pod(
                "n",
                "x",
                "gpu.nvidia.com",
                Some("device.attributes['gpu.nvidia.com'].uuid == 'GPU-1'"),
                Some(1),
            ),
            gpu_class("c", "l4", Some((2, "MPS"))),
        ] {
            for doc in yaml.split("\n---\n") {
                let value: serde_yaml::Value = serde_yaml::from_str(doc).unwrap();
                assert!(value["kind"].is_string(), "{doc}");
            }
        }
        let pod: serde_yaml::Value =
            serde_yaml::from_str(&claim_pod("p", "n", "c", &[("a", "echo 'hi'; sleep 1")]))
                .unwrap();
        assert_eq!(
            pod["spec"]["containers"][0]["command"][2].as_str(),
            Some("echo 'hi'; sleep 1")
        );
    }
}
