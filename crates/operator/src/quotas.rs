//! `gpu-operator migrate quotas`: the ResourceQuota changes that finish a migration to DRA. A
//! namespace's limit on device-plugin GPUs (`requests.nvidia.com/gpu`) becomes the same limit on the
//! devices of every DeviceClass that hands out the product's GPUs (`gpu.nvidia.com`,
//! `mig.nvidia.com`, `vfio.gpu.nvidia.com`, the operands' class, each GPUClass's:
//! `<class>.deviceclass.resource.k8s.io/devices`), as the migration guide's completion step asks: a
//! limit on one class alone would let a claim of another class past it. Kubernetes counts each
//! class apart, so the limit holds per class. Printed by default; applied with `--apply`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ResourceQuota;
use k8s_openapi::api::resource::v1::DeviceClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::{Map, Value, json};

use api::contract::objects as o;

/// The device plugin's quota key.
pub const DEVICE_PLUGIN_KEY: &str = "requests.nvidia.com/gpu";

/// The DRA quota key for the devices of DeviceClass `class`.
pub fn dra_key(class: &str) -> String {
    format!("{class}.deviceclass.resource.k8s.io/devices")
}

/// The DeviceClasses that hand out the product's GPUs, sorted: the GPUCluster's own (but the
/// ComputeDomain ones) and those derived from GPUClasses, by their `managed-by` label.
pub fn gpu_classes(classes: &[DeviceClass]) -> Vec<String> {
    let mut names: Vec<String> = classes
        .iter()
        .filter(|c| {
            matches!(
                c.labels()
                    .get("app.kubernetes.io/managed-by")
                    .map(String::as_str),
                Some("gpu-operator" | crate::classes::render::MANAGED_BY)
            )
        })
        .map(ResourceExt::name_any)
        .filter(|n| n != o::DEVICE_CLASS_CD_DAEMON && n != o::DEVICE_CLASS_CD_CHANNEL)
        .collect();
    if !names.iter().any(|n| n == o::DEVICE_CLASS_GPU) {
        names.push(o::DEVICE_CLASS_GPU.to_owned());
    }
    names.sort();
    names
}

/// What to do with one ResourceQuota.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// Set the limit on every GPU DeviceClass (dropping the device-plugin one).
    Replace {
        /// Namespace of the quota.
        namespace: String,
        /// Its name.
        name: String,
        /// The limit.
        value: String,
        /// The DRA keys to set.
        keys: Vec<String>,
    },
    /// The quota limits a class differently: left alone, for an admin to decide.
    Conflict {
        /// Namespace of the quota.
        namespace: String,
        /// Its name.
        name: String,
        /// The limit to carry over.
        device_plugin: String,
        /// The differing DRA limit, as `key (value)`.
        dra: String,
    },
}

impl Change {
    /// The merge patch of a replacement (`None` for a conflict).
    pub fn patch(&self) -> Option<Value> {
        match self {
            Change::Replace { value, keys, .. } => {
                let mut hard = Map::new();
                hard.insert(DEVICE_PLUGIN_KEY.to_owned(), Value::Null);
                for key in keys {
                    hard.insert(key.clone(), json!(value));
                }
                Some(json!({"spec": {"hard": hard}}))
            }
            Change::Conflict { .. } => None,
        }
    }

    /// One line for people, with the `kubectl` command of a replacement.
    pub fn describe(&self) -> String {
        match self {
            Change::Replace {
                namespace,
                name,
                value,
                keys,
            } => format!(
                "{namespace}/{name}: {DEVICE_PLUGIN_KEY}: {value} -> {}: {value} each\n  kubectl -n \
                 {namespace} patch resourcequota {name} --type merge -p '{}'",
                keys.join(", "),
                self.patch().unwrap_or_default()
            ),
            Change::Conflict {
                namespace,
                name,
                device_plugin,
                dra,
            } => format!(
                "{namespace}/{name}: left alone: it limits GPUs to {device_plugin} but {dra}; \
                 make them agree by hand"
            ),
        }
    }
}

/// The change one quota needs so that each of `classes` is limited as its device-plugin GPUs are
/// (or, once that key is gone, as its `gpu.nvidia.com` devices are); `None` when it limits no GPU
/// or already limits every class so.
pub fn change_for(
    namespace: &str,
    name: &str,
    hard: &BTreeMap<String, Quantity>,
    classes: &[String],
) -> Option<Change> {
    let dp = hard.get(DEVICE_PLUGIN_KEY);
    let value = dp
        .or_else(|| hard.get(&dra_key(o::DEVICE_CLASS_GPU)))?
        .0
        .clone();
    let keys: Vec<String> = classes.iter().map(|c| dra_key(c)).collect();
    if let Some((key, other)) = keys
        .iter()
        .find_map(|k| hard.get(k).filter(|q| q.0 != value).map(|q| (k, q)))
    {
        return Some(Change::Conflict {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            device_plugin: value,
            dra: format!("{key} ({})", other.0),
        });
    }
    let complete = dp.is_none() && keys.iter().all(|k| hard.contains_key(k));
    (!complete).then(|| Change::Replace {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        value,
        keys,
    })
}

/// Lists every ResourceQuota, prints the changes and, with `apply`, makes the replacements.
/// Returns how many quotas were (or would be) changed.
pub async fn run(client: kube::Client, apply: bool) -> Result<usize, kube::Error> {
    let classes = gpu_classes(
        &Api::<DeviceClass>::all(client.clone())
            .list(&ListParams::default())
            .await?
            .items,
    );
    let quotas: Api<ResourceQuota> = Api::all(client.clone());
    let mut changes = Vec::new();
    for quota in quotas.list(&ListParams::default()).await? {
        let hard = quota
            .spec
            .as_ref()
            .and_then(|s| s.hard.clone())
            .unwrap_or_default();
        let namespace = quota.namespace().unwrap_or_default();
        changes.extend(change_for(&namespace, &quota.name_any(), &hard, &classes));
    }
    if changes.is_empty() {
        println!(
            "no ResourceQuota needs a change: none limits {DEVICE_PLUGIN_KEY}, or each already limits every GPU DeviceClass"
        );
        return Ok(0);
    }
    let mut replaced = 0;
    for change in &changes {
        println!("{}", change.describe());
        let (
            Change::Replace {
                namespace, name, ..
            },
            Some(patch),
        ) = (change, change.patch())
        else {
            continue;
        };
        replaced += 1;
        if apply {
            Api::<ResourceQuota>::namespaced(client.clone(), namespace)
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            println!("  applied");
        }
    }
    if !apply {
        println!("{replaced} quota(s) to change; run again with --apply to make the changes");
    }
    Ok(replaced)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hard(pairs: &[(&str, &str)]) -> BTreeMap<String, Quantity> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
            .collect()
    }

    fn classes() -> Vec<String> {
        [
            "gpu.nvidia.com",
            "h100.gpu-operator-rs.dev",
            "mig.nvidia.com",
        ]
        .map(String::from)
        .to_vec()
    }

    #[test]
    fn a_device_plugin_limit_becomes_the_same_limit_on_every_gpu_class() {
        let change = change_for(
            "team-a",
            "gpus",
            &hard(&[(DEVICE_PLUGIN_KEY, "4"), ("cpu", "8")]),
            &classes(),
        );
        assert_eq!(
            change.as_ref().unwrap().patch(),
            Some(json!({"spec": {"hard": {
                "requests.nvidia.com/gpu": null,
                "gpu.nvidia.com.deviceclass.resource.k8s.io/devices": "4",
                "h100.gpu-operator-rs.dev.deviceclass.resource.k8s.io/devices": "4",
                "mig.nvidia.com.deviceclass.resource.k8s.io/devices": "4"}}}))
        );
        // A quota migrated before to gpu.nvidia.com only gets the other classes too.
        let earlier = hard(&[(&dra_key("gpu.nvidia.com"), "4")]);
        assert!(matches!(
            change_for("a", "q", &earlier, &classes()),
            Some(Change::Replace { value, .. }) if value == "4"
        ));
        let done: Vec<(String, &str)> = classes().iter().map(|c| (dra_key(c), "4")).collect();
        let done: Vec<(&str, &str)> = done.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        assert_eq!(change_for("a", "q", &hard(&done), &classes()), None);
    }

    #[test]
    fn quotas_without_gpus_are_skipped_and_conflicts_left_alone() {
        assert_eq!(
            change_for("a", "q", &hard(&[("cpu", "8")]), &classes()),
            None
        );
        let both = hard(&[(DEVICE_PLUGIN_KEY, "2"), (&dra_key("mig.nvidia.com"), "3")]);
        let conflict = change_for("a", "q", &both, &classes()).unwrap();
        assert_eq!(conflict.patch(), None);
        assert!(
            conflict.describe().contains("left alone")
                && conflict.describe().contains("mig.nvidia.com"),
            "{}",
            conflict.describe()
        );
    }

    #[test]
    fn the_gpu_classes_are_ours_but_the_compute_domain_ones() {
        let class = |name: &str, by: &str| -> DeviceClass {
            serde_json::from_value(json!({"metadata": {"name": name,
                "labels": {"app.kubernetes.io/managed-by": by}}, "spec": {}}))
            .unwrap()
        };
        let found = gpu_classes(&[
            class("mig.nvidia.com", "gpu-operator"),
            class("gpu.nvidia.com", "gpu-operator"),
            class("compute-domain-daemon.nvidia.com", "gpu-operator"),
            class(
                "h100.gpu-operator-rs.dev",
                crate::classes::render::MANAGED_BY,
            ),
            class("fpga.example.com", "someone-else"),
        ]);
        assert_eq!(found, classes());
    }
}
