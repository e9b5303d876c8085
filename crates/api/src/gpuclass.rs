//! The `GPUClass` API (`gpu-operator-rs.dev/v1alpha1`): a named offering of GPUs that workloads
//! ask for by an extended resource instead of a hand-written claim. The operator derives one
//! DeviceClass per variant of a class (a whole card, a MIG partition) and reports in the status
//! which names to ask for and how many devices and nodes each variant matches now.
//!
//! The selector's labels are the ones a GPU is described by: `gpu-operator-rs.dev/device` is the
//! product's slug ([`device_slug`]: `NVIDIA A100-SXM4-40GB` is `a100-sxm4-40gb`) and
//! `gpu-operator-rs.dev/architecture` the architecture's (`Ada Lovelace` is `ada-lovelace`).

pub mod variants;

use std::collections::BTreeMap;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The API group of the product's own kinds.
pub const GROUP: &str = "gpu-operator-rs.dev";
/// Selector label: the product's slug, as [`device_slug`] makes it.
pub const DEVICE_LABEL: &str = "gpu-operator-rs.dev/device";
/// Selector label: the architecture's slug, as [`device_slug`] makes it.
pub const ARCHITECTURE_LABEL: &str = "gpu-operator-rs.dev/architecture";
/// Label on every derived DeviceClass: the GPUClass it comes from.
pub const CLASS_LABEL: &str = "gpu-operator-rs.dev/gpu-class";
/// Finalizer that keeps a class's DeviceClasses while claims use them.
pub const FINALIZER: &str = "gpu-operator-rs.dev/device-classes";

/// A named offering of GPUs: which cards (the selector) and on what terms (the variants). Each
/// variant becomes a DeviceClass whose extended resource pods ask for, e.g.
/// `gpu-operator-rs.dev/a100: 1`.
#[derive(CustomResource, KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "gpu-operator-rs.dev",
    version = "v1alpha1",
    kind = "GPUClass",
    plural = "gpuclasses",
    singular = "gpuclass",
    status = "GPUClassStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "A GPUClass names the GPUs workloads may ask for and derives a DeviceClass and an extended resource for each variant.",
    printcolumn(name = "RESOURCES", type_ = "string", json_path = ".status.extendedResourceNames", description = "Extended resources pods ask for"),
    printcolumn(name = "DEVICES", type_ = "integer", json_path = ".status.devices", description = "Devices the variants match now"),
    printcolumn(name = "READY", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status"),
    printcolumn(name = "CLASSES", type_ = "string", json_path = ".status.deviceClassNames", priority = 1),
    printcolumn(name = "AGE", type_ = "date", json_path = ".metadata.creationTimestamp"),
    validation = Rule::new("self.metadata.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$') && size(self.metadata.name) <= 40")
        .message("metadata.name: a GPUClass name is a DNS label of at most 40 characters (lower-case letters, digits, '-'): it becomes part of DeviceClass and extended-resource names"),
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.variants) || !has(self.variants.shared) || !has(self.variants.shared.memory) || !has(self.selector.minMemory) || quantity(self.variants.shared.memory).compareTo(quantity(self.selector.minMemory)) <= 0")
    .message(kube::core::Message::Expression("'a share of ' + self.variants.shared.memory + ' is larger than the card: the selector admits cards of ' + self.selector.minMemory + ' (selector.minMemory); ask for less memory per share, or raise minMemory'".into()))
    .field_path(".variants.shared.memory"))]
pub struct GPUClassSpec {
    /// Which GPUs the class offers. Every criterion given must hold; at least one is required.
    pub selector: GpuSelector,
    /// How the GPUs are offered. Without it, whole cards only.
    #[serde(default)]
    #[schemars(extend("default" = {"whole": {}}))]
    pub variants: Variants,
}

/// Which GPUs a class offers.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "has(self.matchLabels) || has(self.productNames) || has(self.minMemory) || has(self.minComputeCapability)",
     "message": "the selector is empty: name GPUs by matchLabels (gpu-operator-rs.dev/device, gpu-operator-rs.dev/architecture), productNames, minMemory or minComputeCapability"},
]))]
pub struct GpuSelector {
    /// GPU labels, all of which must match: `gpu-operator-rs.dev/device` (the product, e.g.
    /// `a100-sxm4-40gb`) and `gpu-operator-rs.dev/architecture` (e.g. `hopper`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("minProperties" = 1, "maxProperties" = 2, "x-kubernetes-validations" = [
        {"rule": "self.all(k, k in ['gpu-operator-rs.dev/device', 'gpu-operator-rs.dev/architecture'])",
         "message": "only gpu-operator-rs.dev/device and gpu-operator-rs.dev/architecture select GPUs"},
        {"rule": "self.all(k, size(self[k]) <= 63 && self[k].matches('^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$'))",
         "message": "label values are lower-case slugs such as a100-sxm4-40gb or hopper"},
    ]))]
    pub match_labels: BTreeMap<String, String>,
    /// Product names exactly as the driver reports them, any of which matches, e.g.
    /// `NVIDIA A100-SXM4-40GB`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(min = 1, max = 16), inner(length(min = 1, max = 64)))]
    pub product_names: Vec<String>,
    /// At least this much memory on the device offered: the card for `whole`, the partition for
    /// `mig`. A quantity, e.g. `40Gi`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "isQuantity(self) && quantity(self).isGreaterThan(quantity('0'))",
         "message": "must be a positive quantity such as 40Gi"},
    ]))]
    pub min_memory: Option<String>,
    /// At least this CUDA compute capability, `major.minor`, e.g. `8.0`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]{1,3}\.[0-9]{1,3}$"))]
    pub min_compute_capability: Option<String>,
}

/// The ways a class offers its GPUs; each one given becomes a DeviceClass.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "has(self.whole) || has(self.mig) || has(self.shared)",
     "message": "no variant: offer whole cards (whole: {}), MIG partitions (mig: {profiles: [...]}), shares of cards (shared: {shares: 4}) or several"},
]))]
pub struct Variants {
    /// Whole cards not in MIG mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub whole: Option<WholeVariant>,
    /// MIG partitions of the given profiles, each its own DeviceClass and extended resource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig: Option<MigVariant>,
    /// Shares of whole cards: several pods on one card, which then serves no whole-card claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared: Option<SharedVariant>,
}

impl Default for Variants {
    fn default() -> Self {
        Variants {
            whole: Some(WholeVariant::default()),
            mig: None,
            shared: None,
        }
    }
}

/// Whole cards.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WholeVariant {
    /// The extended resource pods ask for; `gpu-operator-rs.dev/<class>` when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extended_resource_name: Option<ExtendedResourceName>,
}

/// MIG partitions.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MigVariant {
    /// MIG profiles as the driver names them, e.g. `1g.10gb`, `3g.40gb`, `1g.10gb+me`.
    #[schemars(length(min = 1, max = 16))]
    #[schemars(inner(length(max = 16)))]
    #[schemars(extend("x-kubernetes-list-type" = "set", "x-kubernetes-validations" = [
        {"rule": "self.all(p, p.matches('^[1-8]g[.][1-9][0-9]{0,2}gb([+](me|gfx|me[.]all))?$'))",
         "message": "not a MIG profile: profiles are named like 1g.10gb, 3g.40gb or 1g.10gb+me (nvidia-smi mig -lgip lists a GPU's)"},
    ]))]
    pub profiles: Vec<String>,
}

/// Shares of whole cards. A card serves `shares` pods at once, or as many as `memory` fits;
/// while one share is out the card serves no whole-card claim, and the scheduler decides.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "has(self.shares) != has(self.memory)",
     "message": "give shares (pods per card, e.g. shares: 4) or memory (memory per pod, e.g. memory: 10Gi), one of the two"},
]))]
pub struct SharedVariant {
    /// Pods one card serves at once, 2 to 64; each is counted for an equal part of its memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "self >= 2 && self <= 64",
         "message": "shares is how many pods one card serves, 2 to 64: fewer than 2 is a share as large as the card or larger (offer whole: {} for that)"},
    ]))]
    pub shares: Option<i32>,
    /// Memory each pod is counted for, e.g. `10Gi`; a card serves as many pods as fit in it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "isQuantity(self) && quantity(self).isGreaterThan(quantity('0'))",
         "message": "must be a positive quantity such as 10Gi"},
    ]))]
    pub memory: Option<String>,
    /// How the pods share the card: `TimeSlicing` (the default) or `MPS` (the CUDA Multi-Process
    /// Service; each pod gets its part of the compute and memory as limits).
    #[serde(default)]
    pub strategy: SharingStrategy,
    /// The extended resource pods ask for; `gpu-operator-rs.dev/<class>-shared` when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extended_resource_name: Option<ExtendedResourceName>,
}

/// An extended resource a class names for a variant instead of the derived one, e.g.
/// `example.com/inference`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(transparent)]
pub struct ExtendedResourceName(
    #[schemars(
        regex(
            pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
        ),
        length(max = 253)
    )]
    #[schemars(extend("x-kubernetes-validations" = [
            {"rule": "!self.startsWith('nvidia.com/') && !self.startsWith('kubernetes.io/') && !self.startsWith('requests.')",
             "message": "nvidia.com/ and kubernetes.io/ names are taken; use a domain of your own, e.g. example.com/a100"},
            {"rule": "size(self.split('/')[1]) <= 63", "message": "the name after '/' is at most 63 characters"},
        ]))]
    pub String,
);

/// How pods share a card, as the driver's `GpuConfig.sharing.strategy` names it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum SharingStrategy {
    /// The GPU's time-slicing between processes.
    #[default]
    TimeSlicing,
    /// The CUDA Multi-Process Service.
    #[serde(rename = "MPS")]
    Mps,
}

/// What the operator made of a class.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GPUClassStatus {
    /// The generation of the spec this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The derived DeviceClasses, one per variant.
    #[serde(default)]
    pub device_class_names: Vec<String>,
    /// The extended resources pods ask for, one per variant (none while the apiserver does not
    /// serve `DeviceClass.spec.extendedResourceName`).
    #[serde(default)]
    pub extended_resource_names: Vec<String>,
    /// Devices published now that some variant matches.
    #[serde(default)]
    pub devices: i64,
    /// Each variant, its names and what it matches now.
    #[serde(default)]
    pub variants: Vec<VariantStatus>,
    /// `Ready`: the DeviceClasses are in place (reason and message say what does not match).
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// One variant of a class.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VariantStatus {
    /// `whole`, `mig-<profile>` or `shared`.
    pub name: String,
    /// Its DeviceClass.
    pub device_class_name: String,
    /// Its extended resource, where the apiserver serves the field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extended_resource_name: Option<String>,
    /// Devices published now that it matches.
    pub devices: i64,
    /// Nodes publishing them.
    pub nodes: i64,
}

/// The slug of a product or architecture name, as the selector's labels spell it: lower case,
/// the `NVIDIA ` brand dropped, spaces as `-`. `NVIDIA H100 80GB HBM3` is `h100-80gb-hbm3`.
/// The derived DeviceClasses compute the same in CEL.
pub fn device_slug(name: &str) -> String {
    name.to_ascii_lowercase()
        .replace("nvidia ", "")
        .replace(' ', "-")
}

/// The `GPUClass` CustomResourceDefinition.
pub fn crd() -> CustomResourceDefinition {
    <GPUClass as kube::CustomResourceExt>::crd()
}

/// The `GPUClass` CustomResourceDefinition as YAML, exactly as committed in the chart's `crds/`.
pub fn crd_yaml() -> String {
    crate::gpucluster::generated_yaml(&crd())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slugs_match_the_guides_labels() {
        assert_eq!(device_slug("NVIDIA A100-SXM4-40GB"), "a100-sxm4-40gb");
        assert_eq!(device_slug("NVIDIA H100 80GB HBM3"), "h100-80gb-hbm3");
        assert_eq!(device_slug("Ada Lovelace"), "ada-lovelace");
        assert_eq!(device_slug("Tesla T4"), "tesla-t4");
    }

    #[test]
    fn a_class_without_variants_offers_whole_cards() {
        let spec: GPUClassSpec = serde_json::from_value(serde_json::json!({
            "selector": {"matchLabels": {DEVICE_LABEL: "a100-sxm4-40gb"}}
        }))
        .unwrap();
        assert_eq!(spec.variants.whole, Some(WholeVariant::default()));
        assert_eq!(spec.variants.mig, None);
    }
}
