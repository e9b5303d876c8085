//! Guards that put the cluster back as a scenario found it: the GPUCluster's spec, the objects it
//! made.

use super::{GPU_NODES, RealNodes, plugin_ready};
use crate::eventually;
use anyhow::bail;
use std::collections::BTreeMap;
use std::time::Duration;

/// Fields of the GPUCluster's spec set for a scenario and set back to what they were when this is
/// dropped (a field that was unset is removed again).
#[derive(Debug)]
pub struct SpecEdit<'a> {
    cluster: &'a RealNodes,
    undo: serde_json::Value,
    /// Whether a changed field is the DRA driver's: the operator rolls the kubelet plugin pods.
    rolls_plugins: bool,
}

impl RealNodes {
    /// Sets each spec field of the GPUCluster named by its dotted path (`draDriver.gpus.env`) to its
    /// value, in one merge patch, and waits for the kubelet plugin pods to roll when a field of the
    /// DRA driver changed; the guard puts the old values back.
    pub async fn edit_gpu_cluster(
        &self,
        fields: &[(&str, serde_json::Value)],
    ) -> anyhow::Result<SpecEdit<'_>> {
        let current: serde_json::Value = serde_json::from_str(
            &self.kubectl(&["get", "gpucluster", "gpu-cluster", "-o", "json"], None)?,
        )?;
        let mut patch = serde_json::json!({});
        let mut undo = serde_json::json!({});
        let mut rolls_plugins = false;
        for (path, value) in fields {
            let old = path
                .split('.')
                .try_fold(&current["spec"], |v, key| v.get(key))
                .cloned()
                .unwrap_or(serde_json::Value::Null);
            rolls_plugins |= path.starts_with("draDriver.") && &old != value;
            set_path(&mut patch, path, value.clone());
            set_path(&mut undo, path, old);
        }
        let edit = SpecEdit {
            cluster: self,
            undo,
            rolls_plugins,
        };
        let before = edit.plugins_before().await?;
        self.patch_gpu_cluster(&patch)?;
        edit.settled(&before).await?;
        Ok(edit)
    }

    /// The kubelet plugin pod of each GPU node, by node.
    pub async fn plugin_pods(&self) -> anyhow::Result<BTreeMap<&'static str, String>> {
        let mut pods = BTreeMap::new();
        for node in GPU_NODES {
            let pod = self.plugin_pod(node).await?;
            pods.insert(node, pod.metadata.name.unwrap_or_default());
        }
        Ok(pods)
    }

    /// Waits until every GPU node runs a kubelet plugin pod other than its one in `before`,
    /// ready, publishing devices again.
    pub async fn plugins_replaced(
        &self,
        before: &BTreeMap<&'static str, String>,
    ) -> anyhow::Result<()> {
        eventually(
            Duration::from_secs(180),
            "every GPU node's kubelet plugin pod replaced, ready and publishing",
            || async {
                for node in GPU_NODES {
                    let pod = self.plugin_pod(node).await?;
                    let name = pod.metadata.name.clone().unwrap_or_default();
                    let ready = plugin_ready(&pod);
                    let published = self.published_devices(node).await?.len();
                    let replaced = before.get(node) != Some(&name);
                    if !(replaced && ready && published > 0 && pod.metadata.deletion_timestamp.is_none()) {
                        bail!("{node}: plugin pod {name} (replaced {replaced}, ready {ready}), {published} devices published");
                    }
                }
                Ok(Some(()))
            },
        )
        .await
    }

    fn patch_gpu_cluster(&self, spec: &serde_json::Value) -> anyhow::Result<()> {
        let patch = serde_json::json!({ "spec": spec }).to_string();
        self.kubectl(
            &[
                "patch",
                "gpucluster",
                "gpu-cluster",
                "--type",
                "merge",
                "-p",
                &patch,
            ],
            None,
        )
        .map(drop)
    }
}

impl SpecEdit<'_> {
    /// The kubelet plugin pods to see replaced, where the edit rolls them (none otherwise: a GPU
    /// node may be on the device plugin's plane then).
    async fn plugins_before(&self) -> anyhow::Result<BTreeMap<&'static str, String>> {
        if self.rolls_plugins {
            self.cluster.plugin_pods().await
        } else {
            Ok(BTreeMap::new())
        }
    }

    /// Waits, when the edit changed a field of the DRA driver, until the kubelet plugin pods of
    /// `before` are replaced (the operator rolls them for every change of their spec).
    async fn settled(&self, before: &BTreeMap<&'static str, String>) -> anyhow::Result<()> {
        if self.rolls_plugins {
            self.cluster.plugins_replaced(before).await?;
        }
        Ok(())
    }

    /// Puts the old values back and waits for the kubelet plugin pods to roll again where they
    /// rolled for the edit.
    pub async fn undo(mut self) -> anyhow::Result<()> {
        let before = self.plugins_before().await?;
        self.cluster.patch_gpu_cluster(&self.undo)?;
        let undone = std::mem::replace(&mut self.undo, serde_json::Value::Null);
        let result = self.settled(&before).await;
        drop(undone);
        result
    }
}

impl Drop for SpecEdit<'_> {
    fn drop(&mut self) {
        if self.undo.is_null() {
            return;
        }
        if let Err(e) = self.cluster.patch_gpu_cluster(&self.undo) {
            eprintln!("setting the GPUCluster's spec back: {e:#}");
        }
    }
}

/// Sets `value` at dotted `path` in the JSON object `target`, making the objects on the way.
fn set_path(target: &mut serde_json::Value, path: &str, value: serde_json::Value) {
    let mut at = target;
    for key in path.split('.') {
        at = at
            .as_object_mut()
            .expect("only objects on a spec path")
            .entry(key)
            .or_insert_with(|| serde_json::json!({}));
    }
    *at = value;
}

/// Deletes what a scenario made when it is dropped, passed or failed: objects of each kind (in the
/// workload namespace where the kind is namespaced), in the order given.
#[derive(Debug)]
pub struct Cleanup<'a> {
    cluster: &'a RealNodes,
    objects: Vec<(&'static str, Vec<&'static str>)>,
}

impl RealNodes {
    /// A guard deleting `objects` (kind, names) when it is dropped.
    pub fn cleanup(&self, objects: &[(&'static str, &[&'static str])]) -> Cleanup<'_> {
        Cleanup {
            cluster: self,
            objects: objects
                .iter()
                .map(|(kind, names)| (*kind, names.to_vec()))
                .collect(),
        }
    }
}

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        for (kind, names) in &self.objects {
            if !names.is_empty()
                && let Err(e) = self.cluster.delete(kind, names)
            {
                eprintln!("cleanup: deleting {kind} {names:?}: {e:#}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_paths_nest_into_one_merge_patch() {
        let mut patch = serde_json::json!({});
        set_path(&mut patch, "draDriver.gpus.consumableShares", "2".into());
        set_path(
            &mut patch,
            "draDriver.gpus.kubeletPlugin.env",
            serde_json::json!([]),
        );
        set_path(&mut patch, "devicePlugin.env", serde_json::Value::Null);
        assert_eq!(
            patch,
            serde_json::json!({
                "draDriver": {"gpus": {"consumableShares": "2", "kubeletPlugin": {"env": []}}},
                "devicePlugin": {"env": null}
            })
        );
    }
}
