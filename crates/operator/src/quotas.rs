//! `gpu-operator migrate quotas`: the ResourceQuota changes that finish a migration to DRA. A
//! namespace's limit on device-plugin GPUs (`requests.nvidia.com/gpu`) becomes the same limit on
//! devices of the `gpu.nvidia.com` DeviceClass (`gpu.nvidia.com.deviceclass.resource.k8s.io/devices`),
//! as the migration guide's completion step asks. Printed by default; applied with `--apply`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ResourceQuota;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};

use api::contract::objects as o;

/// The device plugin's quota key.
pub const DEVICE_PLUGIN_KEY: &str = "requests.nvidia.com/gpu";

/// The DRA quota key for devices of the `gpu.nvidia.com` DeviceClass.
pub fn dra_key() -> String {
    format!(
        "{}.deviceclass.resource.k8s.io/devices",
        o::DEVICE_CLASS_GPU
    )
}

/// What to do with one ResourceQuota.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// Replace the device-plugin limit with the DRA one of the same value.
    Replace {
        /// Namespace of the quota.
        namespace: String,
        /// Its name.
        name: String,
        /// The limit.
        value: String,
    },
    /// The quota limits both, differently: left alone, for an admin to decide.
    Conflict {
        /// Namespace of the quota.
        namespace: String,
        /// Its name.
        name: String,
        /// The device-plugin limit.
        device_plugin: String,
        /// The DRA limit already there.
        dra: String,
    },
}

impl Change {
    /// The merge patch of a replacement (`None` for a conflict).
    pub fn patch(&self) -> Option<Value> {
        match self {
            Change::Replace { value, .. } => Some(json!({"spec": {"hard": {
                DEVICE_PLUGIN_KEY: null,
                dra_key(): value,
            }}})),
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
            } => format!(
                "{namespace}/{name}: {DEVICE_PLUGIN_KEY}: {value} -> {}: {value}\n  kubectl -n \
                 {namespace} patch resourcequota {name} --type merge -p '{}'",
                dra_key(),
                self.patch().unwrap_or_default()
            ),
            Change::Conflict {
                namespace,
                name,
                device_plugin,
                dra,
            } => format!(
                "{namespace}/{name}: left alone: it limits both {DEVICE_PLUGIN_KEY} ({device_plugin}) \
                 and {} ({dra}); remove one by hand",
                dra_key()
            ),
        }
    }
}

/// The change one quota needs, if it limits device-plugin GPUs.
pub fn change_for(
    namespace: &str,
    name: &str,
    hard: &BTreeMap<String, Quantity>,
) -> Option<Change> {
    let value = hard.get(DEVICE_PLUGIN_KEY)?.0.clone();
    match hard.get(&dra_key()) {
        Some(dra) if dra.0 != value => Some(Change::Conflict {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            device_plugin: value,
            dra: dra.0.clone(),
        }),
        _ => Some(Change::Replace {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            value,
        }),
    }
}

/// Lists every ResourceQuota, prints the changes and, with `apply`, makes the replacements.
/// Returns how many quotas were (or would be) changed.
pub async fn run(client: kube::Client, apply: bool) -> Result<usize, kube::Error> {
    let quotas: Api<ResourceQuota> = Api::all(client.clone());
    let mut changes = Vec::new();
    for quota in quotas.list(&ListParams::default()).await? {
        let hard = quota
            .spec
            .as_ref()
            .and_then(|s| s.hard.clone())
            .unwrap_or_default();
        let namespace = quota.namespace().unwrap_or_default();
        changes.extend(change_for(&namespace, &quota.name_any(), &hard));
    }
    if changes.is_empty() {
        println!("no ResourceQuota limits {DEVICE_PLUGIN_KEY}: nothing to change");
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

    #[test]
    fn a_device_plugin_limit_becomes_the_same_dra_limit() {
        let change = change_for(
            "team-a",
            "gpus",
            &hard(&[(DEVICE_PLUGIN_KEY, "4"), ("cpu", "8")]),
        );
        assert_eq!(
            change,
            Some(Change::Replace {
                namespace: "team-a".into(),
                name: "gpus".into(),
                value: "4".into()
            })
        );
        assert_eq!(
            change.unwrap().patch(),
            Some(json!({"spec": {"hard": {
                "requests.nvidia.com/gpu": null,
                "gpu.nvidia.com.deviceclass.resource.k8s.io/devices": "4"}}}))
        );
    }

    #[test]
    fn quotas_without_gpus_are_skipped_and_conflicts_left_alone() {
        assert_eq!(change_for("a", "q", &hard(&[("cpu", "8")])), None);
        let already = hard(&[(DEVICE_PLUGIN_KEY, "2"), (&dra_key(), "2")]);
        assert!(matches!(
            change_for("a", "q", &already),
            Some(Change::Replace { .. })
        ));
        let both = hard(&[(DEVICE_PLUGIN_KEY, "2"), (&dra_key(), "3")]);
        let conflict = change_for("a", "q", &both).unwrap();
        assert_eq!(conflict.patch(), None);
        assert!(
            conflict.describe().contains("left alone"),
            "{}",
            conflict.describe()
        );
    }
}
