//! What to change on the node so it carries the desired discovery labels, touching only labels
//! this agent owns: those recorded in the node's [`DISCOVERY_OWNED`](l::DISCOVERY_OWNED)
//! annotation, which only ever names keys of [`DISCOVERY_KEYS`](l::DISCOVERY_KEYS). Pure.

use std::collections::{BTreeMap, BTreeSet};

use api::contract::labels as l;

/// A change to the node's metadata; `None` values remove.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Patch {
    /// Labels to set or remove.
    pub labels: BTreeMap<String, Option<String>>,
    /// The ownership annotation's new value, or `None` to remove it.
    pub owned: Option<String>,
}

impl Patch {
    /// The JSON merge patch of this change.
    pub fn to_merge_patch(&self) -> serde_json::Value {
        serde_json::json!({
            "metadata": {
                "labels": self.labels,
                "annotations": { l::DISCOVERY_OWNED: self.owned },
            }
        })
    }
}

/// The labels the annotation says this agent wrote, keeping only keys it may write (a tampered
/// annotation never makes it remove someone else's label).
pub fn owned_keys(annotations: &BTreeMap<String, String>) -> BTreeSet<String> {
    annotations
        .get(l::DISCOVERY_OWNED)
        .map(|v| {
            v.split(',')
                .map(str::trim)
                .filter(|k| l::DISCOVERY_KEYS.contains(k))
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// The change that brings `labels` to `desired` for the keys this agent owns or may take, or
/// `None` when nothing would change. A desired label already set by another writer (NFD, GPU
/// feature discovery, an admin) is left alone and not taken over; a label this agent wrote and no
/// longer wants is removed.
pub fn plan(
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
    desired: &BTreeMap<String, String>,
) -> Option<Patch> {
    let before = owned_keys(annotations);
    let mut owned = BTreeSet::new();
    let mut changes = BTreeMap::new();
    for (key, value) in desired {
        let current = labels.get(key).filter(|v| !v.is_empty());
        if current.is_some() && !before.contains(key) {
            continue;
        }
        owned.insert(key.clone());
        if current != Some(value) {
            changes.insert(key.clone(), Some(value.clone()));
        }
    }
    for key in before.difference(&owned) {
        if labels.contains_key(key) {
            changes.insert(key.clone(), None);
        }
    }
    let owned_value = (!owned.is_empty()).then(|| owned.into_iter().collect::<Vec<_>>().join(","));
    let annotation_changes = annotations.get(l::DISCOVERY_OWNED) != owned_value.as_ref();
    (annotation_changes || !changes.is_empty()).then_some(Patch {
        labels: changes,
        owned: owned_value,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    const PCI: &str = l::NFD_PCI_NVIDIA;
    const PRODUCT: &str = l::GPU_PRODUCT;
    const COUNT: &str = l::GPU_COUNT;

    #[test]
    fn a_new_gpu_node_gets_its_labels_and_the_record_of_them() {
        let desired = map(&[(PCI, "true"), (PRODUCT, "NVIDIA-L4")]);
        let patch = plan(
            &map(&[("kubernetes.io/os", "linux")]),
            &BTreeMap::new(),
            &desired,
        )
        .unwrap();
        assert_eq!(patch.labels.len(), 2);
        assert_eq!(
            patch.owned.as_deref(),
            Some("feature.node.kubernetes.io/pci-10de.present,nvidia.com/gpu.product")
        );
        assert_eq!(
            patch.to_merge_patch()["metadata"]["labels"][PRODUCT],
            serde_json::json!("NVIDIA-L4")
        );
    }

    #[test]
    fn nothing_changes_when_the_node_already_says_it() {
        let desired = map(&[(PCI, "true"), (PRODUCT, "NVIDIA-L4")]);
        let annotations = map(&[(
            l::DISCOVERY_OWNED,
            "feature.node.kubernetes.io/pci-10de.present,nvidia.com/gpu.product",
        )]);
        assert_eq!(plan(&desired, &annotations, &desired), None);
    }

    #[test]
    fn labels_another_writer_set_are_neither_written_nor_taken_over() {
        // NFD and GPU feature discovery already run: their values stay, even where ours differ.
        let labels = map(&[(PCI, "true"), (PRODUCT, "NVIDIA-L4-from-gfd")]);
        let desired = map(&[(PCI, "true"), (PRODUCT, "NVIDIA-L4"), (COUNT, "2")]);
        let patch = plan(&labels, &BTreeMap::new(), &desired).unwrap();
        assert_eq!(
            patch.labels,
            BTreeMap::from([(COUNT.to_owned(), Some("2".to_owned()))])
        );
        assert_eq!(patch.owned.as_deref(), Some(COUNT));
        // With every desired label set by others, nothing is written at all.
        assert_eq!(
            plan(&labels, &BTreeMap::new(), &map(&[(PCI, "true")])),
            None
        );
    }

    #[test]
    fn labels_it_wrote_go_when_the_gpu_or_driver_goes_and_others_stay() {
        let labels = map(&[(PCI, "true"), (PRODUCT, "NVIDIA-L4"), (COUNT, "2")]);
        let annotations = map(&[(
            l::DISCOVERY_OWNED,
            "feature.node.kubernetes.io/pci-10de.present,nvidia.com/gpu.product",
        )]);
        // The driver went: the product goes, the count (not ours) stays.
        let patch = plan(&labels, &annotations, &map(&[(PCI, "true")])).unwrap();
        assert_eq!(patch.labels, BTreeMap::from([(PRODUCT.to_owned(), None)]));
        assert_eq!(patch.owned.as_deref(), Some(PCI));
        // The GPU went too: the record goes with the last label.
        let patch = plan(&labels, &annotations, &BTreeMap::new()).unwrap();
        assert_eq!(patch.labels.len(), 2);
        assert_eq!(patch.owned, None);
        assert_eq!(
            patch.to_merge_patch()["metadata"]["annotations"][l::DISCOVERY_OWNED],
            serde_json::Value::Null
        );
    }

    #[test]
    fn a_changed_value_of_its_own_is_rewritten_and_an_empty_value_counts_as_absent() {
        let annotations = map(&[(l::DISCOVERY_OWNED, COUNT)]);
        let patch = plan(&map(&[(COUNT, "1")]), &annotations, &map(&[(COUNT, "2")])).unwrap();
        assert_eq!(patch.labels[COUNT].as_deref(), Some("2"));
        let patch = plan(
            &map(&[(PRODUCT, "")]),
            &BTreeMap::new(),
            &map(&[(PRODUCT, "NVIDIA-L4")]),
        )
        .unwrap();
        assert_eq!(patch.labels[PRODUCT].as_deref(), Some("NVIDIA-L4"));
    }

    #[test]
    fn a_tampered_record_never_removes_a_label_discovery_may_not_write() {
        let labels = map(&[("kubernetes.io/hostname", "n1"), (PRODUCT, "NVIDIA-L4")]);
        let annotations = map(&[(
            l::DISCOVERY_OWNED,
            "kubernetes.io/hostname, nvidia.com/gpu.product",
        )]);
        let patch = plan(&labels, &annotations, &BTreeMap::new()).unwrap();
        assert_eq!(patch.labels, BTreeMap::from([(PRODUCT.to_owned(), None)]));
    }
}
