//! The `GPUCluster` custom resource (`nvidia.com/v1alpha1`, cluster-scoped singleton).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{EnvVar, ResourceRequirements, Toleration};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSON,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::contract::paths;
use crate::image::ImageSpec;

/// Desired state of the DRA GPU stack in the cluster. Only the object named `gpu-cluster` is
/// accepted; it configures the DRA kubelet plugin, the validator, DCGM and the DCGM exporter.
#[derive(CustomResource, KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "nvidia.com",
    version = "v1alpha1",
    kind = "GPUCluster",
    plural = "gpuclusters",
    singular = "gpucluster",
    shortname = "gc",
    status = "GPUClusterStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "A GPUCluster configures the DRA GPU stack of the whole cluster. It is a singleton named `gpu-cluster`.",
    printcolumn(name = "STATUS", type_ = "string", json_path = ".status.state", description = "Overall state of the DRA GPU stack"),
    printcolumn(name = "AGE", type_ = "date", json_path = ".metadata.creationTimestamp"),
    validation = Rule::new("self.metadata.name == 'gpu-cluster'").message("GPUCluster is a singleton: its name must be 'gpu-cluster'"),
)]
#[serde(rename_all = "camelCase")]
pub struct GPUClusterSpec {
    /// The NVIDIA DRA driver: its image, feature gates and the GPU and ComputeDomain kubelet plugins.
    #[serde(default)]
    #[schemars(extend("default" = {}))]
    pub dra_driver: DraDriverSpec,
    /// The DRA driver validator: image and extra environment.
    #[serde(default)]
    #[schemars(extend("default" = {}))]
    pub validator: ValidatorSpec,
    /// The device plugin (`nvidia.com/gpu` extended resources) on nodes in `device-plugin` mode.
    /// Enabled unless `enabled` is false; it runs only where the node labeler puts that mode.
    #[serde(default)]
    #[schemars(extend("default" = {}))]
    pub device_plugin: DevicePluginSpec,
    /// The DCGM exporter on DRA nodes. Enabled unless `enabled` is false.
    #[serde(default)]
    #[schemars(extend("default" = {}))]
    pub dcgm_exporter: DcgmExporterSpec,
    /// Standalone DCGM host engine on DRA nodes. Disabled unless `enabled` is true.
    #[serde(default)]
    #[schemars(extend("default" = {}))]
    pub dcgm: DcgmSpec,
    /// Host paths the operands mount.
    #[serde(default)]
    #[schemars(extend("default" = {}))]
    pub host_paths: HostPathsSpec,
    /// Settings applied to every operand DaemonSet.
    #[serde(default)]
    #[schemars(extend("default" = {}))]
    pub daemonsets: DaemonsetsSpec,
    /// Which plane serves which GPU nodes (docs/planes.md).
    #[serde(default)]
    #[schemars(extend("default" = {}))]
    pub plane_policy: PlanePolicy,
    /// How a node is handed over when its plane changes (docs/migration.md).
    #[serde(default)]
    #[schemars(extend("default" = {}))]
    pub migration: MigrationSpec,
}

/// How GPU nodes move between the planes: cordon, drain the pods holding the old plane's GPUs,
/// move the deploy labels, wait for the new plane to be ready, uncordon.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MigrationSpec {
    /// Nodes handed over at the same time.
    #[serde(default = "default_max_unavailable")]
    #[schemars(range(min = 1))]
    pub max_unavailable: u32,
    /// What happens to pods that hold the old plane's GPUs: `evict` them through the Eviction API
    /// (PodDisruptionBudgets respected), or `wait` for them to leave.
    #[serde(default)]
    pub drain: DrainPolicy,
    /// Seconds the new plane has to become ready on a node; past it the node goes back to its old
    /// plane and no further node starts until the policy changes.
    #[serde(default = "default_progress_deadline")]
    #[schemars(range(min = 1))]
    pub progress_deadline_seconds: u32,
}

impl Default for MigrationSpec {
    fn default() -> Self {
        Self {
            max_unavailable: default_max_unavailable(),
            drain: DrainPolicy::default(),
            progress_deadline_seconds: default_progress_deadline(),
        }
    }
}

fn default_max_unavailable() -> u32 {
    1
}

fn default_progress_deadline() -> u32 {
    600
}

/// What a hand-over does with pods that hold the old plane's GPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum DrainPolicy {
    /// Evict them (DaemonSet pods and pods without GPUs are left alone).
    #[default]
    Evict,
    /// Only wait for them to leave.
    Wait,
}

/// Which plane serves which GPU nodes. A node's mode label set by hand wins; otherwise the first
/// rule whose selector matches the node decides; a new GPU node no rule matches gets
/// `DEFAULT_GPU_ALLOCATION_MODE`, and one that has a mode keeps it. Control-plane nodes
/// (`node-role.kubernetes.io/control-plane`) get a mode only from a rule that names that label.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlanePolicy {
    /// Ordered rules; names are unique.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub rules: Vec<PlaneRule>,
}

/// One rule of the plane policy.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "!has(self.nodeSelector.matchExpressions) || self.nodeSelector.matchExpressions.all(e, (e.operator in ['In', 'NotIn']) == (has(e.values) && size(e.values) > 0))",
     "messageExpression": "'planePolicy rule ' + self.name + ': In and NotIn need values, Exists and DoesNotExist take none'"},
]))]
pub struct PlaneRule {
    /// The rule's name, reported where it decides a node.
    #[schemars(regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"), length(max = 63))]
    pub name: String,
    /// The nodes it applies to (empty: every node but control-plane ones).
    #[serde(default)]
    #[schemars(extend("default" = {}))]
    pub node_selector: NodeLabelSelector,
    /// The plane that serves them.
    pub mode: crate::AllocationMode,
}

/// A label selector over nodes, as Kubernetes writes one, with bounds the API server can check.
/// Both parts must hold; an empty selector matches every node.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeLabelSelector {
    /// Labels a node must carry with these values.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 32))]
    pub match_labels: BTreeMap<String, String>,
    /// Requirements a node's labels must meet, all of them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub match_expressions: Vec<LabelRequirement>,
}

/// One requirement of a node label selector.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LabelRequirement {
    /// The label key.
    #[schemars(length(min = 1, max = 317))]
    pub key: String,
    /// How the key relates to the values.
    pub operator: LabelOperator,
    /// The values, for `In` and `NotIn`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), inner(length(max = 63)))]
    pub values: Vec<String>,
}

/// The operator of a label requirement.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum LabelOperator {
    /// The label has one of the values.
    In,
    /// The label is absent or has none of the values.
    NotIn,
    /// The label is present.
    Exists,
    /// The label is absent.
    DoesNotExist,
}

impl NodeLabelSelector {
    /// The selector as Kubernetes types it.
    pub fn to_label_selector(
        &self,
    ) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
            LabelSelector, LabelSelectorRequirement,
        };
        LabelSelector {
            match_labels: (!self.match_labels.is_empty()).then(|| self.match_labels.clone()),
            match_expressions: (!self.match_expressions.is_empty()).then(|| {
                self.match_expressions
                    .iter()
                    .map(|r| LabelSelectorRequirement {
                        key: r.key.clone(),
                        operator: format!("{:?}", r.operator),
                        values: (!r.values.is_empty()).then(|| r.values.clone()),
                    })
                    .collect()
            }),
        }
    }

    /// Every label key it looks at.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.match_labels
            .keys()
            .chain(self.match_expressions.iter().map(|r| &r.key))
            .map(String::as_str)
    }
}

/// Implements `Default` as "what `{}` deserializes to", so the Rust default of a section always
/// equals the defaults its schema gives an empty object.
macro_rules! default_from_empty_object {
    ($($ty:ty),+) => {$(
        impl Default for $ty {
            fn default() -> Self {
                serde_json::from_value(serde_json::json!({}))
                    .expect("every spec section deserializes from {}")
            }
        }
    )+};
}

default_from_empty_object!(
    DraDriverSpec,
    GpusSpec,
    ComputeDomainsSpec,
    KubeletPluginSpec,
    HealthcheckSpec,
    ValidatorSpec,
    DevicePluginSpec,
    DevicePluginConfig,
    DcgmExporterSpec,
    DcgmSpec,
    HostPathsSpec,
    DaemonsetsSpec
);

fn yes() -> bool {
    true
}

fn no() -> bool {
    false
}

/// The NVIDIA DRA driver. Its GPU capability is always deployed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DraDriverSpec {
    #[serde(flatten)]
    #[allow(missing_docs)]
    pub image: ImageSpec,
    /// Feature gates passed to the kubelet plugins, by name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub feature_gates: BTreeMap<String, bool>,
    /// The GPU kubelet plugin.
    #[serde(default)]
    #[schemars(extend("default" = {}))]
    pub gpus: GpusSpec,
    /// ComputeDomains (multi-node NVLink): the controller and the compute-domain kubelet plugin.
    #[serde(default)]
    #[schemars(extend("default" = {}))]
    pub compute_domains: ComputeDomainsSpec,
}

/// The GPU capability of the DRA driver.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpusSpec {
    /// The `gpus` container of the kubelet-plugin DaemonSet.
    #[serde(default)]
    #[schemars(extend("default" = {}))]
    pub kubelet_plugin: KubeletPluginSpec,
    /// Whether several claims may be allocated one whole GPU or MIG device, the upstream driver's
    /// `consumableShares`: `disabled` (the default), `memory` (claims consume the device's memory;
    /// one asking for none takes all of it), `unlimited` (any number of claims), or a number of
    /// `shares` per device (a claim asking for none takes all of them). Needs the apiserver's
    /// DRAConsumableCapacity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^(disabled|memory|unlimited|[1-9][0-9]{0,5})$"))]
    pub consumable_shares: Option<String>,
    /// How MIG devices come to be on DRA nodes: `static` (the default: an admin partitions GPUs
    /// beforehand and the plugin publishes the MIG devices it finds) or `dynamic` (every
    /// partition a GPU supports is published, and the one a claim is given is made when the claim
    /// is prepared and destroyed after it; docs/mig.md). The upstream driver's feature gate
    /// `DynamicMIG: true` asks for `dynamic` too. Needs the apiserver's DRAPartitionableDevices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_partitioning: Option<MigPartitioning>,
}

/// How MIG devices come to be on DRA nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum MigPartitioning {
    /// An admin partitions GPUs beforehand.
    Static,
    /// Partitions are made when claims are prepared.
    Dynamic,
}

impl MigPartitioning {
    /// The plugin's flag value.
    pub fn as_str(self) -> &'static str {
        match self {
            MigPartitioning::Static => "static",
            MigPartitioning::Dynamic => "dynamic",
        }
    }
}

/// ComputeDomain support of the DRA driver.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ComputeDomainsSpec {
    /// Deploy the ComputeDomain controller, the `compute-domains` plugin container and its classes.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// The ComputeDomain controller Deployment.
    #[serde(default)]
    #[schemars(extend("default" = {}))]
    pub controller: ContainerSpec,
    /// The `compute-domains` container of the kubelet-plugin DaemonSet.
    #[serde(default)]
    #[schemars(extend("default" = {}))]
    pub kubelet_plugin: KubeletPluginSpec,
}

/// Extra environment and resources of one container.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContainerSpec {
    /// Extra environment variables for the container.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
    /// Compute resources of the container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
}

/// One container of the kubelet-plugin DaemonSet.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KubeletPluginSpec {
    /// Extra environment variables for the container.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
    /// Compute resources of the container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// The plugin's gRPC health endpoint and the probes that use it.
    #[serde(default)]
    #[schemars(extend("default" = {}))]
    pub healthcheck: HealthcheckSpec,
}

/// gRPC health checking of a kubelet plugin.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HealthcheckSpec {
    /// Serve the gRPC health service and probe it; false removes the probes.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Port of the gRPC health service (51516 for `gpus`, 51515 for `compute-domains` when unset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: Option<i32>,
}

/// The DRA driver validator.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ValidatorSpec {
    #[serde(flatten)]
    #[allow(missing_docs)]
    pub image: ImageSpec,
    /// Extra environment variables for the validator containers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
}

/// The device plugin: serves `nvidia.com/gpu` (and MIG resources) on `device-plugin` nodes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DevicePluginSpec {
    /// Serve the device-plugin plane; false leaves `device-plugin` nodes without a plugin of ours.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Image of `gpu-device-plugin`; the DRA driver's image when unset (it carries both plugins).
    #[serde(flatten)]
    pub image: ImageSpec,
    /// What the plugin offers.
    #[serde(default)]
    #[schemars(extend("default" = {}))]
    pub config: DevicePluginConfig,
    /// Extra environment variables for the plugin container.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
    /// Compute resources of the plugin container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
}

/// What the device plugin offers: a MIG strategy and sharing written here, or an upstream config
/// file from a ConfigMap (`name` and `default`, as the upstream ClusterPolicy names them).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "!(has(self.name) && has(self.sharing))",
     "message": "set either devicePlugin.config.sharing or devicePlugin.config.name (a ConfigMap with an upstream config file), not both"},
    {"rule": "has(self.name) == has(self.default)",
     "message": "devicePlugin.config.name and devicePlugin.config.default go together: the ConfigMap and its key holding the config file"},
]))]
pub struct DevicePluginConfig {
    /// How MIG devices are offered, as the upstream device plugin names the strategies: `none`
    /// (every GPU whole), `single` (MIG devices as `nvidia.com/gpu`), `mixed`
    /// (`nvidia.com/mig-<profile>`). A config file's `flags.migStrategy` wins over it.
    #[serde(default)]
    pub mig_strategy: MigStrategy,
    /// How GPUs are shared between containers (the upstream config file's `sharing`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sharing: Option<DevicePluginSharing>,
    /// A ConfigMap in the operator's namespace holding an upstream device-plugin config file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The key of that ConfigMap holding the config file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<String>,
}

impl DevicePluginConfig {
    /// The upstream-format config file (`version: v1`, `flags.migStrategy`, `sharing`) for the
    /// sharing written here; `None` when there is none (the MIG strategy alone goes by env).
    pub fn file(&self) -> Option<String> {
        let sharing = self.sharing.as_ref()?;
        let file = serde_json::json!({
            "version": "v1",
            "flags": {"migStrategy": self.mig_strategy.as_str()},
            "sharing": sharing,
        });
        Some(serde_yaml::to_string(&file).expect("a JSON value always serializes to YAML"))
    }
}

/// Sharing on the device-plugin plane.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DevicePluginSharing {
    /// Time-slicing: each device offered as several replicas that take turns on it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_slicing: Option<TimeSlicing>,
}

/// Time-slicing, as the upstream device plugin's config file writes it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TimeSlicing {
    /// Offer every shared resource as `<name>.shared` unless it names its own.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rename_by_default: bool,
    /// Refuse a container more than one replica of a resource.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fail_requests_greater_than_one: bool,
    /// The resources shared.
    #[schemars(length(min = 1))]
    pub resources: Vec<SharedResource>,
}

/// One time-sliced resource.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SharedResource {
    /// The resource as it is offered unshared: `nvidia.com/gpu` or `nvidia.com/mig-<profile>`.
    #[schemars(regex(pattern = r"^nvidia\.com/(gpu|mig-[0-9a-z.+-]+)$"))]
    pub name: String,
    /// The name to offer it under instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rename: Option<String>,
    /// Replicas per device.
    #[schemars(range(min = 2))]
    pub replicas: u32,
}

/// A MIG strategy of the device plugin.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum MigStrategy {
    /// Every GPU whole.
    #[default]
    None,
    /// MIG devices as `nvidia.com/gpu`; every GPU of the node needs MIG on with one profile (a
    /// node with MIG off everywhere gets whole GPUs).
    Single,
    /// GPUs without MIG as `nvidia.com/gpu`, MIG devices as `nvidia.com/mig-<profile>`.
    Mixed,
}

impl MigStrategy {
    /// Every strategy.
    pub const ALL: [MigStrategy; 3] = [MigStrategy::None, MigStrategy::Single, MigStrategy::Mixed];

    /// The value as the plugin's `MIG_STRATEGY` takes it.
    pub fn as_str(self) -> &'static str {
        match self {
            MigStrategy::None => "none",
            MigStrategy::Single => "single",
            MigStrategy::Mixed => "mixed",
        }
    }
}

impl std::str::FromStr for MigStrategy {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|s| s.as_str() == value)
            .ok_or_else(|| format!("{value:?} is not a MIG strategy: use none, single or mixed"))
    }
}

/// The DCGM exporter on DRA nodes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DcgmExporterSpec {
    /// Deploy the DCGM exporter.
    #[serde(default = "yes")]
    pub enabled: bool,
    #[serde(flatten)]
    #[allow(missing_docs)]
    pub image: ImageSpec,
    /// Extra environment variables for the exporter.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
    /// Extra command-line arguments for the exporter.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Compute resources of the exporter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// A ConfigMap with a custom metrics CSV.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<ConfigMapRef>,
    /// A Prometheus Operator ServiceMonitor for the exporter (created only when that API is served).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_monitor: Option<ServiceMonitorSpec>,
}

/// A ConfigMap in the operator namespace.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConfigMapRef {
    /// Name of the ConfigMap.
    pub name: String,
}

/// ServiceMonitor settings.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceMonitorSpec {
    /// Create the ServiceMonitor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Scrape interval, e.g. `15s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<String>,
    /// Keep the exporter's labels when they clash with the target's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub honor_labels: Option<bool>,
    /// Extra labels on the ServiceMonitor.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub additional_labels: BTreeMap<String, String>,
}

/// Standalone DCGM host engine on DRA nodes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DcgmSpec {
    /// Deploy the standalone DCGM host engine.
    #[serde(default = "no")]
    pub enabled: bool,
    #[serde(flatten)]
    #[allow(missing_docs)]
    pub image: ImageSpec,
    /// Extra environment variables for DCGM.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
    /// Extra command-line arguments for DCGM.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Compute resources of DCGM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Host port of the DCGM host engine (5555 when unset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub host_port: Option<i32>,
}

/// Host paths used by the operands.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostPathsSpec {
    /// Root of a containerized driver on the host; probed after the host root. An absolute path.
    #[serde(default = "default_driver_install_dir")]
    #[schemars(regex(pattern = r"^/"))]
    pub driver_install_dir: String,
    /// The kubelet's root directory (plugin sockets, registration, pods); an absolute path.
    #[serde(default = "default_kubelet_root_dir")]
    #[schemars(regex(pattern = r"^/"))]
    pub kubelet_root_dir: String,
}

fn default_driver_install_dir() -> String {
    paths::DEFAULT_DRIVER_INSTALL_DIR.to_owned()
}

fn default_kubelet_root_dir() -> String {
    paths::DEFAULT_KUBELET_ROOT.to_owned()
}

/// Settings applied to every operand DaemonSet.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DaemonsetsSpec {
    /// Extra labels on operand pods (`app` and `app.kubernetes.io/part-of` are ignored).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Extra annotations on operand pods.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// PriorityClass of operand pods.
    #[serde(default = "default_priority_class")]
    pub priority_class_name: String,
    /// Tolerations added to operand pods.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    /// DaemonSet update strategy: `RollingUpdate` or `OnDelete`.
    #[serde(default)]
    pub update_strategy: UpdateStrategy,
    /// Rolling update settings, used with `RollingUpdate`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rolling_update: Option<RollingUpdateSpec>,
}

fn default_priority_class() -> String {
    "system-node-critical".to_owned()
}

/// DaemonSet update strategy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum UpdateStrategy {
    /// Replace pods node by node, bounded by `maxUnavailable`.
    #[default]
    RollingUpdate,
    /// Replace a pod only when it is deleted.
    OnDelete,
}

/// Rolling update bounds.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RollingUpdateSpec {
    /// Pods that may be unavailable during an update: a number or a percentage such as `25%`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<IntOrString>,
}

/// Observed state of the DRA GPU stack.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GPUClusterStatus {
    /// `ready` when every enabled operand is ready, `notReady` otherwise, `ignored` for a
    /// GPUCluster that is not the singleton.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<State>,
    /// Namespace the operands run in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// `Ready` and `Error` conditions with reasons and messages.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Readiness of each operand workload.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub operands: Vec<OperandStatus>,
    /// GPU node counts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<NodeCounts>,
    /// Nodes moving between planes, and nodes rolled back (docs/migration.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub migration: Option<MigrationStatus>,
}

/// Hand-overs between planes as the nodes record them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MigrationStatus {
    /// Nodes between planes now (cordoned, draining, or waiting for the new plane), in name order;
    /// at most 50 are listed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub in_progress: Vec<NodeHandover>,
    /// Nodes rolled back under the current generation: while any is listed, no other node starts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rolled_back: Vec<NodeHandover>,
    /// Nodes in a driver upgrade the labeler runs (docs/upgrades.md), failed ones included, in
    /// name order; at most 50 are listed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub driver_upgrades: Vec<NodeDriverUpgrade>,
}

/// One node's driver upgrade.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeDriverUpgrade {
    /// The node.
    pub node: String,
    /// The driver manager's state value: `drain-required`, `pod-restart-required`,
    /// `validation-required` or `upgrade-failed`.
    pub state: String,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// One node's hand-over.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeHandover {
    /// The node.
    pub node: String,
    /// The plane it leaves.
    pub from: String,
    /// The plane it goes to.
    pub to: String,
    /// `Draining`, `WaitingForPlane` or `RolledBack`.
    pub phase: String,
    /// Why it was rolled back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Overall state of a `GPUCluster`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum State {
    /// Every enabled operand is ready.
    Ready,
    /// Some operand is not ready, or reconciling failed.
    NotReady,
    /// This object is not the singleton and is not reconciled.
    Ignored,
}

/// Readiness of one operand workload.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OperandStatus {
    /// Object name, e.g. `nvidia-dra-driver-kubelet-plugin`.
    pub name: String,
    /// Object kind, `DaemonSet` or `Deployment`.
    pub kind: String,
    /// Whether the operand counts as ready.
    pub ready: bool,
    /// Pods desired (DaemonSet: nodes selected; Deployment: replicas).
    pub desired: i32,
    /// Pods available.
    pub available: i32,
    /// The plane it serves: `dra` or `device-plugin`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plane: Option<String>,
}

/// GPU node counts.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeCounts {
    /// Nodes labelled `nvidia.com/gpu.present=true`.
    pub gpu: i32,
    /// GPU nodes in `dra` allocation mode.
    pub dra: i32,
    /// DRA nodes whose kubelet plugin pod is ready.
    pub ready_dra: i32,
    /// GPU nodes in `device-plugin` allocation mode.
    #[serde(default)]
    pub device_plugin: i32,
    /// Device-plugin nodes whose device plugin pod (ours) is ready.
    #[serde(default)]
    pub ready_device_plugin: i32,
}

/// The `GPUCluster` CustomResourceDefinition.
///
/// Unlike the derived one, `spec` is optional and defaults to `{}`, so a bare
/// `metadata.name: gpu-cluster` object is valid and receives every default.
pub fn crd() -> CustomResourceDefinition {
    let mut crd = <GPUCluster as kube::CustomResourceExt>::crd();
    for version in &mut crd.spec.versions {
        let Some(schema) = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
        else {
            continue;
        };
        if let Some(required) = schema.required.as_mut() {
            required.retain(|field| field != "spec");
            if required.is_empty() {
                schema.required = None;
            }
        }
        if let Some(spec) = schema.properties.as_mut().and_then(|p| p.get_mut("spec")) {
            spec.default = Some(JSON(serde_json::json!({})));
        }
    }
    crd
}

/// The `GPUCluster` CustomResourceDefinition as YAML, exactly as committed in the chart's `crds/`.
pub fn crd_yaml() -> String {
    generated_yaml(&crd())
}

/// A CRD as the YAML committed in the chart's `crds/`, headed by where it comes from.
pub(crate) fn generated_yaml(crd: &CustomResourceDefinition) -> String {
    let body = serde_yaml::to_string(crd).expect("a CRD always serializes to YAML");
    format!("# Generated from crates/api by `make generate`; do not edit by hand.\n{body}")
}
