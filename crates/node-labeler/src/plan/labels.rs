//! Reading a node's labels: set values, whether it is a GPU node, whether its GPUs can do MIG, and
//! which of the labeler's keys belong to which plane.

use std::collections::BTreeMap;

use api::AllocationMode;
use api::contract::labels as l;
/// A label value that counts as set (`""` counts as absent).
pub(super) fn value<'a>(labels: &'a BTreeMap<String, String>, key: &str) -> Option<&'a str> {
    labels
        .get(key)
        .map(String::as_str)
        .filter(|v| !v.is_empty())
}

/// Whether NFD says the node has an NVIDIA GPU.
pub fn is_gpu_node(labels: &BTreeMap<String, String>) -> bool {
    l::NFD_GPU_LABELS
        .iter()
        .any(|k| value(labels, k) == Some("true"))
}

/// Whether the node's GPUs can do MIG: what discovery found (`nvidia.com/mig.capable`), else by
/// product name; never on a vGPU host.
pub(super) fn is_mig_capable(labels: &BTreeMap<String, String>) -> bool {
    if labels.contains_key(l::VGPU_HOST_DRIVER_VERSION) {
        return false;
    }
    match value(labels, l::MIG_CAPABLE) {
        Some(found) => found == "true",
        None => mig_capable_by_name(value(labels, l::GPU_PRODUCT).unwrap_or_default()),
    }
}

/// The MIG-capable data-center GPUs, as words of their product names (`NVIDIA-H100-80GB-HBM3`):
/// the fallback for a node whose discovery did not say (`nvidia.com/mig.capable` absent).
const MIG_CAPABLE_MODELS: &[&str] = &[
    "a30", "a30x", "a100", "a100x", "a800", "h100", "h800", "h20", "h200", "gh200", "b100", "b200",
    "gb200", "b300", "gb300",
];

/// Whether `product` names a MIG-capable GPU: one of its words is a model of
/// [`MIG_CAPABLE_MODELS`] (whole words, so `RTX A3000` is not an `A30`), or it is an RTX PRO 6000
/// Blackwell.
pub(super) fn mig_capable_by_name(product: &str) -> bool {
    let product = product.to_lowercase();
    let words: Vec<&str> = product
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .collect();
    let has = |word: &str| words.contains(&word);
    words.iter().any(|w| MIG_CAPABLE_MODELS.contains(w))
        || (has("rtx") && has("pro") && has("6000") && has("blackwell"))
}

/// Whether `key` is one of `mode`'s deploy keys (MIG manager included).
pub(super) fn in_plane(mode: AllocationMode, key: &str) -> bool {
    match mode {
        AllocationMode::Dra => l::DRA_PLANE_KEYS.contains(&key),
        AllocationMode::DevicePlugin => {
            l::DEVICE_PLUGIN_PLANE_KEYS.contains(&key) || key == l::DEPLOY_MIG_MANAGER
        }
    }
}

/// Every deploy key the labeler owns.
pub(super) fn owned_keys() -> impl Iterator<Item = &'static str> {
    l::DRA_PLANE_KEYS
        .into_iter()
        .chain(l::DEVICE_PLUGIN_ONLY_KEYS)
}

/// Deploy keys a node in `mode` should carry.
pub(super) fn plane_keys(
    mode: AllocationMode,
    labels: &BTreeMap<String, String>,
) -> Vec<&'static str> {
    match mode {
        AllocationMode::Dra => l::DRA_PLANE_KEYS.to_vec(),
        AllocationMode::DevicePlugin => {
            let mut keys = l::DEVICE_PLUGIN_PLANE_KEYS.to_vec();
            if is_mig_capable(labels) {
                keys.push(l::DEPLOY_MIG_MANAGER);
            }
            keys
        }
    }
}

pub(super) fn is_control_plane(labels: &BTreeMap<String, String>) -> bool {
    labels.contains_key(l::CONTROL_PLANE_ROLE)
}
