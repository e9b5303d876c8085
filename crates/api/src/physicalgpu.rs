//! The `PhysicalGPU` API (`gpu-operator-rs.dev/v1alpha1`): one object per physical GPU of the
//! cluster, written by the plugin that serves its node (DRA or device plugin) and only for that
//! node. It tells an admin what cards exist, which plane serves each, who uses it, and whether it
//! is ready: `kubectl get physicalgpu -o wide`.
//!
//! Everything is observed, so everything is in `status`, and the CRD has no status subresource:
//! one write creates or changes an object.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Label: the node the GPU is in.
pub const NODE_LABEL: &str = "gpu-operator-rs.dev/node";

/// Nothing to ask for: a PhysicalGPU only reports (see `status`).
#[derive(CustomResource, JsonSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "gpu-operator-rs.dev",
    version = "v1alpha1",
    kind = "PhysicalGPU",
    plural = "physicalgpus",
    singular = "physicalgpu",
    shortname = "pgpu",
    status = "PhysicalGPUStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "A PhysicalGPU is one GPU of a node as the plugin serving that node sees it: what it is, which plane serves it, who uses it, whether it is ready."
)]
pub struct PhysicalGPUSpec {}

/// What the plugin serving the node sees of the GPU.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PhysicalGPUStatus {
    /// The node the GPU is in.
    pub node: String,
    /// GPU UUID (`GPU-...`).
    pub uuid: String,
    /// PCI bus id (`0000:07:00.0`).
    #[serde(rename = "pciBusID")]
    pub pci_bus_id: String,
    /// Product name as the driver reports it.
    pub product: String,
    /// Architecture (`Ampere`, `Hopper`, ...).
    pub architecture: String,
    /// CUDA compute capability, `major.minor`.
    pub compute_capability: String,
    /// Memory, as a quantity (`80Gi`); empty when the driver does not report it.
    #[serde(default)]
    pub memory: String,
    /// Driver version.
    pub driver_version: String,
    /// CUDA driver version, `major.minor`.
    pub cuda_driver_version: String,
    /// MIG: `NotSupported`, `Disabled` or `Enabled`.
    pub mig_mode: String,
    /// MIG devices on it, when MIG is enabled.
    #[serde(default)]
    pub mig_devices: i64,
    /// Which plane serves it: `dra` or `device-plugin`.
    pub plane: String,
    /// Who uses it now: `<namespace>/<claim>` for the DRA plane's prepared claims.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub consumers: Vec<String>,
    /// `Ready` when the driver works, the GPU is healthy and it is offered to pods; else
    /// `NotReady`, or `Unknown` while its health cannot be read.
    pub phase: String,
    /// `DriverReady`, `Healthy` and `Ready`.
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// The printer columns: `kubectl get physicalgpu` shows the first five and `AGE`, `-o wide`
/// the rest too. (name, JSON path, description, shown only with `-o wide`)
const COLUMNS: [(&str, &str, &str, bool); 11] = [
    ("NODE", ".status.node", "The node the GPU is in", false),
    ("PRODUCT", ".status.product", "Product name", false),
    ("MEMORY", ".status.memory", "GPU memory", false),
    (
        "PLANE",
        ".status.plane",
        "The plane serving its node",
        false,
    ),
    (
        "PHASE",
        ".status.phase",
        "Ready, NotReady or Unknown",
        false,
    ),
    ("PCI", ".status.pciBusID", "PCI bus id", true),
    ("UUID", ".status.uuid", "GPU UUID", true),
    ("DRIVER", ".status.driverVersion", "Driver version", true),
    (
        "CUDA",
        ".status.cudaDriverVersion",
        "CUDA driver version",
        true,
    ),
    ("MIG", ".status.migMode", "MIG mode", true),
    (
        "USED-BY",
        ".status.consumers",
        "Claims prepared on it",
        true,
    ),
];

/// The `PhysicalGPU` CustomResourceDefinition, without a status subresource (see the module).
pub fn crd() -> CustomResourceDefinition {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceColumnDefinition as Column;
    let mut crd = <PhysicalGPU as kube::CustomResourceExt>::crd();
    for version in &mut crd.spec.versions {
        version.subresources = None;
        let mut columns: Vec<Column> = COLUMNS
            .iter()
            .map(|(name, path, description, wide)| Column {
                name: (*name).into(),
                type_: "string".into(),
                json_path: (*path).into(),
                description: Some((*description).into()),
                priority: wide.then_some(1),
                format: None,
            })
            .collect();
        columns.push(Column {
            name: "AGE".into(),
            type_: "date".into(),
            json_path: ".metadata.creationTimestamp".into(),
            ..Column::default()
        });
        version.additional_printer_columns = Some(columns);
        if let Some(required) = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
            .and_then(|s| s.required.as_mut())
        {
            required.retain(|field| field != "spec");
        }
        if let Some(schema) = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
            .filter(|s| s.required.as_ref().is_some_and(Vec::is_empty))
        {
            schema.required = None;
        }
    }
    crd
}

/// The `PhysicalGPU` CustomResourceDefinition as YAML, exactly as committed in the chart's `crds/`.
pub fn crd_yaml() -> String {
    crate::gpucluster::generated_yaml(&crd())
}

/// The object name of the GPU at `pci_bus_id` on `node`: `<node>-<pci bus id with : and . as ->`,
/// lower case (`gpu-node-0-0000-07-00-0`).
pub fn object_name(node: &str, pci_bus_id: &str) -> String {
    format!(
        "{node}-{}",
        pci_bus_id.to_ascii_lowercase().replace([':', '.'], "-")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_come_from_node_and_pci_address() {
        assert_eq!(
            object_name("gpu-node-0", "0000:07:00.0"),
            "gpu-node-0-0000-07-00-0"
        );
        assert_eq!(
            object_name("n.example", "0000:AB:00.0"),
            "n.example-0000-ab-00-0"
        );
    }

    #[test]
    fn the_crd_has_no_status_subresource_so_one_write_changes_an_object() {
        let crd = crd();
        assert!(crd.spec.versions.iter().all(|v| v.subresources.is_none()));
    }
}
