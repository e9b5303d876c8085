//! Which plane serves a node: the allocation-mode label an admin sets to move it between DRA and
//! the device plugin, what shows the move (labels, pods, the kubelet's allocatable), and a guard
//! that moves the nodes back.

use super::{RealNodes, plugin_ready, pod_ready, ready_on};
use crate::eventually;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use std::time::Duration;

/// The label an admin sets to choose a node's plane (`dra` or `device-plugin`).
pub const MODE_LABEL: &str = "nvidia.com/gpu-operator.resource-allocation.mode";
/// The device plugin's pods, by label.
pub const DEVICE_PLUGIN: &str = "app=nvidia-device-plugin-daemonset";

impl RealNodes {
    /// Sets the allocation mode of `nodes` to `mode`; the guard puts their old mode back.
    pub async fn switch_mode(
        &self,
        nodes: &[&'static str],
        mode: &str,
    ) -> anyhow::Result<ModeGuard<'_>> {
        let mut before = Vec::new();
        for node in nodes {
            before.push((*node, self.node_labels(node).await?.remove(MODE_LABEL)));
        }
        let guard = ModeGuard {
            cluster: self,
            before,
            restored: false,
        };
        guard.switch(mode)?;
        Ok(guard)
    }

    /// `node`'s `nvidia.com/gpu.deploy.<component>` label (which operands it runs), empty when
    /// unset.
    pub async fn deploy_label(&self, node: &str, component: &str) -> anyhow::Result<String> {
        let key = format!("nvidia.com/gpu.deploy.{component}");
        Ok(self
            .node_labels(node)
            .await?
            .remove(&key)
            .unwrap_or_default())
    }

    /// The `nvidia.com/gpu` the kubelet on `node` shows allocatable, empty when none.
    pub async fn allocatable_gpus(&self, node: &str) -> anyhow::Result<String> {
        let node = Api::<Node>::all(self.client.clone()).get(node).await?;
        Ok(node
            .status
            .and_then(|s| s.allocatable)
            .and_then(|a| a.get("nvidia.com/gpu").map(|q| q.0.clone()))
            .unwrap_or_default())
    }

    /// Waits until the device plugin's pod on `node` is ready and the kubelet shows `gpus`
    /// allocatable `nvidia.com/gpu`.
    pub async fn device_plugin_serves(&self, node: &str, gpus: u32) -> anyhow::Result<()> {
        let what = format!("the device plugin on {node} offering {gpus} nvidia.com/gpu");
        eventually(Duration::from_secs(180), &what, || async {
            let pods = self.operand_pods(Some(DEVICE_PLUGIN), Some(node)).await?;
            let ready = pods.iter().any(pod_ready);
            let allocatable = self.allocatable_gpus(node).await?;
            if ready && allocatable == gpus.to_string() {
                Ok(Some(()))
            } else {
                Err(anyhow::anyhow!(
                    "device plugin pod ready: {ready}, allocatable nvidia.com/gpu {allocatable:?}"
                ))
            }
        })
        .await
    }

    /// Waits until `node` is served by DRA again: its kubelet plugin ready and publishing `gpus`
    /// devices, the hand-over complete (ready on `dra`, uncordoned), no device plugin pod left and
    /// no `nvidia.com/gpu` allocatable.
    pub async fn back_on_dra(&self, node: &str, gpus: usize) -> anyhow::Result<()> {
        let what = format!("{node} served by DRA again, publishing {gpus} devices");
        eventually(Duration::from_secs(180), &what, || async {
            let plugin = self.plugin_pod(node).await.ok();
            let ready = plugin.as_ref().is_some_and(plugin_ready);
            let published = self.published_devices(node).await?.len();
            let readiness = self.readiness(node).await?;
            let device_plugins = self
                .operand_pods(Some(DEVICE_PLUGIN), Some(node))
                .await?
                .len();
            let allocatable = self.allocatable_gpus(node).await?;
            if ready
                && published == gpus
                && readiness == ready_on("dra")
                && device_plugins == 0
                && matches!(allocatable.as_str(), "" | "0")
            {
                Ok(Some(()))
            } else {
                Err(anyhow::anyhow!(
                    "kubelet plugin ready: {ready}, {published} devices published, {readiness}, \
                     {device_plugins} device plugin pods, allocatable nvidia.com/gpu {allocatable:?}"
                ))
            }
        })
        .await
    }
}

/// Nodes whose allocation mode a scenario changed: dropped, it sets their old mode back without
/// waiting; [`ModeGuard::restore`] waits until DRA serves them again.
#[derive(Debug)]
pub struct ModeGuard<'a> {
    cluster: &'a RealNodes,
    before: Vec<(&'static str, Option<String>)>,
    restored: bool,
}

impl ModeGuard<'_> {
    /// Sets the guarded nodes' allocation mode to `mode`.
    pub fn switch(&self, mode: &str) -> anyhow::Result<()> {
        let label = format!("{MODE_LABEL}={mode}");
        let mut args = vec!["label", "node", "--overwrite"];
        args.extend(self.before.iter().map(|(node, _)| *node));
        args.push(&label);
        self.cluster.kubectl(&args, None).map(drop)
    }

    /// Sets each node's old mode back (DRA's, in these scenarios) and waits until DRA serves it
    /// again with `gpus` devices published by each.
    pub async fn restore(mut self, gpus: &[usize]) -> anyhow::Result<()> {
        self.put_back()?;
        self.restored = true;
        for ((node, _), gpus) in self.before.iter().zip(gpus) {
            self.cluster.back_on_dra(node, *gpus).await?;
        }
        Ok(())
    }

    fn put_back(&self) -> anyhow::Result<()> {
        for (node, old) in &self.before {
            let label = match old {
                Some(mode) => format!("{MODE_LABEL}={mode}"),
                None => format!("{MODE_LABEL}-"),
            };
            self.cluster
                .kubectl(&["label", "node", "--overwrite", node, &label], None)?;
        }
        Ok(())
    }
}

impl Drop for ModeGuard<'_> {
    fn drop(&mut self) {
        if !self.restored
            && let Err(e) = self.put_back()
        {
            eprintln!("setting the nodes' allocation mode back: {e:#}");
        }
    }
}
