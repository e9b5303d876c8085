//! What the scenarios read: API objects, the nodes' files, pods' states and logs.

use super::{DRIVER, OPERATOR_NS, RealNodes, WORKLOAD_NS, run};
use crate::eventually;
use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{Device, ResourceClaim, ResourceSlice};
use kube::api::{Api, ListParams, LogParams};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

impl RealNodes {
    /// The claim of workload pod `pod` (its first: the one it names, or the one made from its
    /// template), as the API holds it now.
    pub async fn claim_of(&self, pod: &str) -> anyhow::Result<ResourceClaim> {
        let pod_now = self
            .pod(pod)
            .await?
            .with_context(|| format!("no pod {pod}"))?;
        let named = pod_now
            .spec
            .and_then(|s| s.resource_claims?.into_iter().next())
            .and_then(|c| c.resource_claim_name);
        let made = || {
            pod_now
                .status
                .and_then(|s| s.resource_claim_statuses?.into_iter().next())
                .and_then(|s| s.resource_claim_name)
        };
        let name = named
            .or_else(made)
            .with_context(|| format!("pod {pod} has no claim yet"))?;
        Ok(
            Api::<ResourceClaim>::namespaced(self.client.clone(), WORKLOAD_NS)
                .get(&name)
                .await?,
        )
    }

    /// The UID of workload pod `pod`'s claim and the device it was allocated.
    pub async fn claimed(&self, pod: &str) -> anyhow::Result<(String, String)> {
        let claim = self.claim_of(pod).await?;
        let uid = claim.metadata.uid.context("the claim has no uid")?;
        let device = claim
            .status
            .and_then(|s| s.allocation?.devices?.results?.into_iter().next())
            .map(|r| r.device)
            .context("the claim is not allocated")?;
        Ok((uid, device))
    }

    /// The checkpoint of the plugin on `node`, as JSON (its payload).
    pub fn checkpoint(&self, node: &str) -> anyhow::Result<serde_json::Value> {
        let path = self
            .node_dir(node)
            .join("var/lib/kubelet/plugins/gpu.nvidia.com/checkpoint.json");
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let value: serde_json::Value =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        Ok(value["payload"].clone())
    }

    /// The CDI spec file the plugin on `node` writes for the claim with uid `uid`.
    pub fn claim_spec(&self, node: &str, uid: &str) -> PathBuf {
        self.node_dir(node)
            .join(format!("run/cdi/k8s.gpu.nvidia.com-claim_{uid}.yaml"))
    }

    /// Whether the runtimes' own CDI library (`hack/cmd/cdi-validate`) loads every spec of `node`
    /// and resolves claim `uid`'s `device` in them; what it said when not.
    pub fn cdi_resolves(&self, node: &str, uid: &str, device: &str) -> anyhow::Result<()> {
        let mut command = Command::new(self.env.tools_dir.join("cdi-validate"));
        command
            .arg("-id")
            .arg(format!("k8s.gpu.nvidia.com/claim={uid}-{device}"))
            .arg(self.node_dir(node).join("run/cdi"));
        run(&mut command, None).map(drop)
    }

    /// The state the plugin's checkpoint on `node` records for claim `uid` (empty when none).
    pub fn checkpointed(&self, node: &str, uid: &str) -> anyhow::Result<String> {
        Ok(self.checkpoint(node)?["claims"][uid]["state"]
            .as_str()
            .unwrap_or_default()
            .to_owned())
    }

    /// The CDI spec files of `node`'s workload claims (less the operands' own), sorted.
    pub async fn workload_specs(&self, node: &str) -> anyhow::Result<Vec<String>> {
        let operands: Vec<String> =
            Api::<ResourceClaim>::namespaced(self.client.clone(), OPERATOR_NS)
                .list(&ListParams::default())
                .await?
                .items
                .into_iter()
                .filter_map(|c| c.metadata.uid)
                .map(|uid| format!("k8s.gpu.nvidia.com-claim_{uid}.yaml"))
                .collect();
        let dir = self.node_dir(node).join("run/cdi");
        let mut specs: Vec<String> = std::fs::read_dir(&dir)
            .with_context(|| format!("listing {}", dir.display()))?
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|f| f.starts_with("k8s.gpu.nvidia.com-claim_") && !operands.contains(f))
            .collect();
        specs.sort();
        Ok(specs)
    }

    /// Node `name`'s labels.
    pub async fn node_labels(&self, name: &str) -> anyhow::Result<BTreeMap<String, String>> {
        let node = Api::<Node>::all(self.client.clone()).get(name).await?;
        Ok(node.metadata.labels.unwrap_or_default())
    }

    /// What node `name`'s readiness labels and cordon say, as
    /// `gpu-stack=<plane> gpu-setup-complete=<bool> unschedulable=<bool>` (empty where unset).
    pub async fn readiness(&self, name: &str) -> anyhow::Result<String> {
        let node = Api::<Node>::all(self.client.clone()).get(name).await?;
        Ok(readiness_of(&node))
    }

    /// Fields of the GPUCluster through a JSONPath template (`{.status.state}`).
    pub fn gpu_cluster(&self, template: &str) -> anyhow::Result<String> {
        self.jsonpath("gpucluster", "gpu-cluster", None, template)
    }

    /// The GPUCluster's condition of type `kind` as `[status, reason, message]`, empty where it
    /// has none.
    pub fn gpu_cluster_condition(&self, kind: &str) -> anyhow::Result<[String; 3]> {
        let json: serde_json::Value = serde_json::from_str(
            &self.kubectl(&["get", "gpucluster", "gpu-cluster", "-o", "json"], None)?,
        )?;
        let condition = json["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == kind);
        let field = |name: &str| {
            condition
                .and_then(|c| c[name].as_str())
                .unwrap_or_default()
                .to_owned()
        };
        Ok([field("status"), field("reason"), field("message")])
    }

    /// The devices `node` publishes in ResourceSlices of our driver.
    pub async fn published_devices(&self, node: &str) -> anyhow::Result<Vec<Device>> {
        let params =
            ListParams::default().fields(&format!("spec.nodeName={node},spec.driver={DRIVER}"));
        let slices = Api::<ResourceSlice>::all(self.client.clone())
            .list(&params)
            .await?;
        Ok(slices
            .items
            .into_iter()
            .flat_map(|s| s.spec.devices.unwrap_or_default())
            .collect())
    }

    /// `node`'s own folder on this host (its `/run`, `/var/lib/kubelet`, ...).
    pub fn node_dir(&self, node: &str) -> PathBuf {
        self.env.cluster_dir.join("nodes").join(node)
    }

    /// The apiserver's minor version (`36` for 1.36).
    pub async fn server_minor(&self) -> anyhow::Result<u32> {
        let info = self.client.apiserver_version().await?;
        info.minor
            .trim_end_matches('+')
            .parse()
            .with_context(|| format!("apiserver minor version {:?}", info.minor))
    }

    /// The workload pod `name`, if it exists.
    pub async fn pod(&self, name: &str) -> anyhow::Result<Option<Pod>> {
        Ok(Api::<Pod>::namespaced(self.client.clone(), WORKLOAD_NS)
            .get_opt(name)
            .await?)
    }

    /// Waits until every pod of `names` runs; fails naming the ones that do not, with their
    /// last condition.
    pub async fn wait_running(&self, names: &[&str], timeout: Duration) -> anyhow::Result<()> {
        let what = format!("pods {} Running", names.join(", "));
        eventually(timeout, &what, || async {
            let mut waiting = Vec::new();
            for name in names {
                let pod = self.pod(name).await?;
                if phase(pod.as_ref()) != "Running" {
                    waiting.push(format!("{name}: {}", describe(pod.as_ref())));
                }
            }
            if waiting.is_empty() {
                Ok(Some(()))
            } else {
                Err(anyhow::anyhow!("{}", waiting.join("; ")))
            }
        })
        .await
    }

    /// Waits until pod `name` ran to its end; its node, or why it failed.
    pub async fn wait_succeeded(&self, name: &str, timeout: Duration) -> anyhow::Result<String> {
        let pod = eventually(timeout, &format!("pod {name} to finish"), || async {
            let pod = self.pod(name).await?;
            Ok(matches!(phase(pod.as_ref()), "Succeeded" | "Failed")
                .then_some(pod)
                .flatten())
        })
        .await?;
        if phase(Some(&pod)) != "Succeeded" {
            bail!("pod {name} failed: {}", describe(Some(&pod)));
        }
        Ok(pod.spec.and_then(|s| s.node_name).unwrap_or_default())
    }

    /// The log of `container` (the only one when `None`) of workload pod `pod`.
    pub async fn logs(&self, pod: &str, container: Option<&str>) -> anyhow::Result<String> {
        let params = LogParams {
            container: container.map(str::to_owned),
            ..LogParams::default()
        };
        Ok(Api::<Pod>::namespaced(self.client.clone(), WORKLOAD_NS)
            .logs(pod, &params)
            .await?)
    }

    /// The kubelet plugin's pod on `node`.
    pub async fn plugin_pod(&self, node: &str) -> anyhow::Result<Pod> {
        self.operand_pod("app=nvidia-dra-driver-kubelet-plugin", node)
            .await
    }

    /// The pod of the operator's namespace matching label `selector` on `node`.
    pub async fn operand_pod(&self, selector: &str, node: &str) -> anyhow::Result<Pod> {
        self.operand_pods(Some(selector), Some(node))
            .await?
            .into_iter()
            .next()
            .with_context(|| format!("no pod {selector} on {node}"))
    }

    /// The pods of the operator's namespace (matching label `selector`, on `node`, where given).
    pub async fn operand_pods(
        &self,
        selector: Option<&str>,
        node: Option<&str>,
    ) -> anyhow::Result<Vec<Pod>> {
        let mut params = ListParams::default();
        if let Some(node) = node {
            params = params.fields(&format!("spec.nodeName={node}"));
        }
        if let Some(selector) = selector {
            params = params.labels(selector);
        }
        Ok(Api::<Pod>::namespaced(self.client.clone(), OPERATOR_NS)
            .list(&params)
            .await?
            .items)
    }

    /// The last `lines` of what container `container` (the only one when `None`) of pod `pod` in
    /// the operator's namespace logged, headed by its name; what went wrong when there is none.
    pub async fn operand_log(&self, pod: &str, container: Option<&str>, lines: i64) -> String {
        let params = LogParams {
            container: container.map(str::to_owned),
            tail_lines: Some(lines),
            ..LogParams::default()
        };
        let which = format!("{OPERATOR_NS}/{pod} ({})", container.unwrap_or("-"));
        match Api::<Pod>::namespaced(self.client.clone(), OPERATOR_NS)
            .logs(pod, &params)
            .await
        {
            Ok(log) => format!("--- {which}:\n{log}"),
            Err(e) => format!("--- {which}: no log ({e})"),
        }
    }

    /// `node`'s kubelet log.
    pub fn kubelet_log(&self, node: &str) -> PathBuf {
        self.env
            .cluster_dir
            .join(format!("logs/kubelet-{node}.log"))
    }

    /// Where `node`'s kubelet log ends now, to read what it logs later with
    /// [`RealNodes::kubelet_log_since`].
    pub fn kubelet_log_end(&self, node: &str) -> anyhow::Result<u64> {
        let path = self.kubelet_log(node);
        Ok(std::fs::metadata(&path)
            .with_context(|| format!("reading {}", path.display()))?
            .len())
    }

    /// What `node`'s kubelet logged after `end` (from [`RealNodes::kubelet_log_end`]).
    pub fn kubelet_log_since(&self, node: &str, end: u64) -> anyhow::Result<String> {
        let path = self.kubelet_log(node);
        let text = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        let start = usize::try_from(end).unwrap_or(usize::MAX).min(text.len());
        Ok(String::from_utf8_lossy(&text[start..]).into_owned())
    }

    /// The last lines of what the components serving `node` logged: its kubelet plugin pod, its
    /// kubelet, and the node labeler (which moves nodes between planes).
    pub async fn component_logs(&self, node: &str) -> String {
        let plugin = match self.plugin_pod(node).await {
            Ok(pod) => {
                let name = pod.metadata.name.unwrap_or_default();
                self.operand_log(&name, Some("gpus"), 30).await
            }
            Err(e) => format!("--- kubelet plugin on {node}: {e:#}"),
        };
        let labeler = match self.operand_pods(Some(LABELER), None).await {
            Ok(pods) => match pods.first().and_then(|p| p.metadata.name.as_deref()) {
                Some(name) => self.operand_log(name, None, 15).await,
                None => "--- no node labeler pod".to_owned(),
            },
            Err(e) => format!("--- node labeler: {e:#}"),
        };
        let kubelet = self.kubelet_log(node);
        format!(
            "{plugin}\n--- {}:\n{}\n{labeler}",
            kubelet.display(),
            crate::log_tail(&kubelet)
        )
    }
}

/// What a node's readiness labels and cordon say, as
/// `gpu-stack=<plane> gpu-setup-complete=<bool> unschedulable=<bool>` (empty where unset).
pub fn readiness_of(node: &Node) -> String {
    let labels = node.metadata.labels.clone().unwrap_or_default();
    let label = |key: &str| labels.get(key).cloned().unwrap_or_default();
    let cordoned = node
        .spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false);
    format!(
        "gpu-stack={} gpu-setup-complete={} unschedulable={cordoned}",
        label("gpu-operator-rs.dev/gpu-stack"),
        label("gpu-operator-rs.dev/gpu-setup-complete")
    )
}

/// What [`readiness_of`] says of a node ready on `plane` and uncordoned.
pub fn ready_on(plane: &str) -> String {
    format!("gpu-stack={plane} gpu-setup-complete=true unschedulable=false")
}

/// The node labeler's pods, by label.
const LABELER: &str = "app.kubernetes.io/component=node-labeler";

/// Whether pod `pod` is ready (its Ready condition, as `kubectl get pods` shows it).
pub fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .iter()
        .flat_map(|s| s.conditions.iter().flatten())
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// Whether a kubelet plugin pod's `gpus` container is ready.
pub fn plugin_ready(pod: &Pod) -> bool {
    pod.status
        .iter()
        .flat_map(|s| s.container_statuses.iter().flatten())
        .any(|c| c.name == "gpus" && c.ready)
}

/// A pod's phase, `Absent` when there is none.
fn phase(pod: Option<&Pod>) -> &str {
    pod.and_then(|p| p.status.as_ref())
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Absent")
}

/// A pod's phase and what its last condition or waiting container says.
fn describe(pod: Option<&Pod>) -> String {
    let Some(status) = pod.and_then(|p| p.status.as_ref()) else {
        return "absent".to_owned();
    };
    let waiting = status
        .container_statuses
        .iter()
        .flatten()
        .filter_map(|c| c.state.as_ref()?.waiting.as_ref())
        .map(|w| {
            format!(
                "{} {}",
                w.reason.as_deref().unwrap_or_default(),
                w.message.as_deref().unwrap_or_default()
            )
        });
    let conditions = status
        .conditions
        .iter()
        .flatten()
        .filter(|c| c.status != "True")
        .map(|c| {
            format!(
                "{} {}",
                c.reason.as_deref().unwrap_or_default(),
                c.message.as_deref().unwrap_or_default()
            )
        });
    let said: Vec<String> = waiting.chain(conditions).collect();
    format!("{} ({})", phase(pod), said.join("; "))
}

/// The GPU UUIDs in `text` (`GPU-…`), in order.
pub fn gpu_uuids(text: &str) -> Vec<String> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .filter(|w| w.starts_with("GPU-") && w.len() > 4)
        .map(str::to_owned)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_are_found_in_what_nvidia_smi_prints() {
        let log =
            "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-4a1b-77)\nGPU 1: NVIDIA L4 (UUID: GPU-9f)\n";
        assert_eq!(gpu_uuids(log), ["GPU-4a1b-77", "GPU-9f"]);
        assert!(gpu_uuids("no GPU- here").is_empty());
    }
}
