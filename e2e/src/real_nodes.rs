//! Harness of the real-node scenarios (`e2e/tests/real_nodes/`): the cluster `hack/test/real-nodes.sh`
//! brings up (real kubelets and containerd in namespaces of their own, mock GPUs, the chart installed
//! in [`OPERATOR_NS`]), reached through its kubeconfig. Manifests go in with `kubectl apply`, as a
//! user writes them; what is asserted is read through the API, the nodes' own tools and the nodes'
//! folders. A failed step names itself and carries the logs of the components that did the work:
//! the node's kubelet plugin pod and its kubelet.
//!
//! One scenario alone, against a cluster left up with `KEEP_CLUSTER=1 make test-real-nodes`:
//! `SHARED_CLUSTER=1 CLUSTER_DIR=.cluster/real-<port base> e2e/run.sh --real-nodes <name>`.

use crate::{Env, eventually};
use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{Device, ResourceClaim, ResourceSlice};
use kube::api::{Api, ListParams, LogParams};
use std::collections::BTreeMap;
use std::future::Future;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The namespace the chart is installed in.
pub const OPERATOR_NS: &str = "gpu-operator";
/// The namespace the scenarios' workloads run in.
pub const WORKLOAD_NS: &str = "default";
/// The image of the install guide's workload (loaded into every real node).
pub const WORKLOAD_IMAGE: &str = "nvcr.io/nvidia/cuda:12.6.2-base-ubi9";
/// The H100 node (4 GPUs, two to a PCIe root).
pub const H100_NODE: &str = "real-gpu-0";
/// The L4 node (2 GPUs).
pub const L4_NODE: &str = "real-gpu-1";
/// The node whose A100s are in MIG mode: it publishes MIG devices only.
pub const MIG_NODE: &str = "real-gpu-2";
/// The node with no GPU (until a test plugs one in).
pub const GPULESS_NODE: &str = "real-gpu-3";
/// The real nodes with GPUs.
pub const GPU_NODES: [&str; 3] = [H100_NODE, L4_NODE, MIG_NODE];
/// The DRA driver's name, in slices and claims.
pub const DRIVER: &str = "gpu.nvidia.com";

/// The running real-node cluster.
#[derive(Clone)]
pub struct RealNodes {
    /// Where the cluster's state, kubeconfig and tools are.
    pub env: Env,
    /// A cluster-admin client.
    pub client: kube::Client,
    hack_dir: PathBuf,
}

impl std::fmt::Debug for RealNodes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RealNodes")
            .field("cluster_dir", &self.env.cluster_dir)
            .finish_non_exhaustive()
    }
}

impl RealNodes {
    /// The cluster `E2E_KUBECONFIG` and `E2E_CLUSTER_DIR` name; an error saying how to get one.
    pub async fn connect() -> anyhow::Result<Self> {
        let env = Env::from_env().context(
            "the real-node scenarios run on the cluster of `make test-real-nodes` \
             (KEEP_CLUSTER=1 leaves it up; then SHARED_CLUSTER=1 CLUSTER_DIR=... e2e/run.sh --real-nodes)",
        )?;
        let client = env.client().await?;
        let hack_dir = crate::manifest_dir().join("../hack");
        Ok(Self {
            env,
            client,
            hack_dir,
        })
    }

    /// Runs `kubectl` as cluster admin with `stdin`; its output, or an error with its stderr.
    pub fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> anyhow::Result<String> {
        let mut command = Command::new(self.env.tools_dir.join("kubectl"));
        command.arg("--kubeconfig").arg(&self.env.kubeconfig);
        run(command.args(args), stdin)
    }

    /// `kubectl apply -f -` of `yaml`.
    pub fn apply(&self, yaml: &str) -> anyhow::Result<()> {
        self.kubectl(&["apply", "-f", "-"], Some(yaml)).map(drop)
    }

    /// Deletes the named objects of `kind` (in the workload namespace where `kind` is namespaced)
    /// without waiting; what is already gone is fine.
    pub fn delete(&self, kind: &str, names: &[&str]) -> anyhow::Result<()> {
        let mut args = vec![
            "-n",
            WORKLOAD_NS,
            "delete",
            kind,
            "--wait=false",
            "--ignore-not-found",
        ];
        args.extend(names);
        self.kubectl(&args, None).map(drop)
    }

    /// Runs `kubectl` with the identity of `kubeconfig`; the API's answer (stdout and stderr),
    /// whether it allowed the request or not.
    pub fn kubectl_as(&self, kubeconfig: &Path, args: &[&str]) -> anyhow::Result<String> {
        let out = Command::new(self.env.tools_dir.join("kubectl"))
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(args)
            .output()?;
        Ok(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }

    /// `kubectl get` of one object's fields through a JSONPath template (`{.spec.x}`); what the
    /// template prints. `namespace` is `None` for a cluster-scoped kind.
    pub fn jsonpath(
        &self,
        kind: &str,
        name: &str,
        namespace: Option<&str>,
        template: &str,
    ) -> anyhow::Result<String> {
        let template = format!("jsonpath={template}");
        let mut args = vec!["get", kind, name, "-o", template.as_str()];
        if let Some(ns) = namespace {
            args.extend(["-n", ns]);
        }
        self.kubectl(&args, None)
    }

    /// Runs `hack/cluster` on this cluster with `args`.
    fn hack_cluster(&self, args: &[&str]) -> anyhow::Result<String> {
        run(&mut self.hack_cluster_command(args), None)
    }

    fn hack_cluster_command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(self.hack_dir.join("cluster"));
        command.env("CLUSTER_DIR", &self.env.cluster_dir).args(args);
        command
    }

    /// Runs `args` inside `node` (its network and mounts), as an admin logged in there would.
    pub fn node_exec(&self, node: &str, args: &[&str]) -> anyhow::Result<String> {
        self.hack_cluster(&[&["node-exec", node], args].concat())
    }

    /// Starts `args` inside `node` and leaves it running (its output discarded).
    pub fn node_spawn(&self, node: &str, args: &[&str]) -> anyhow::Result<Child> {
        self.hack_cluster_command(&[&["node-exec", node], args].concat())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {args:?} in {node}"))
    }

    /// A kubeconfig holding a token of service account `sa` of the operator's namespace, bound to
    /// its pod `pod` where one is named (as the kubelet gives a pod its token).
    pub fn sa_kubeconfig(&self, sa: &str, pod: Option<&str>) -> anyhow::Result<PathBuf> {
        let mut args = vec!["sa-kubeconfig", OPERATOR_NS, sa];
        args.extend(pod);
        Ok(PathBuf::from(self.hack_cluster(&args)?.trim()))
    }

    /// A kubeconfig for this cluster that presents `token`, written as `<name>.kubeconfig` in the
    /// cluster's folder.
    pub fn token_kubeconfig(&self, name: &str, token: &str) -> anyhow::Result<PathBuf> {
        let server = self.kubectl(
            &[
                "config",
                "view",
                "-o",
                "jsonpath={.clusters[0].cluster.server}",
            ],
            None,
        )?;
        let ca = self.env.cluster_dir.join("pki/ca.crt");
        let path = self.env.cluster_dir.join(format!("{name}.kubeconfig"));
        let config = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {{server: {server:?}, certificate-authority: {:?}}}\nusers:\n- name: u\n  user: {{token: {token:?}}}\ncontexts:\n- name: c\n  context: {{cluster: c, user: u}}\ncurrent-context: c\n",
            ca.display().to_string()
        );
        std::fs::write(&path, config).with_context(|| format!("writing {}", path.display()))?;
        Ok(path)
    }

    /// A kubeconfig holding the token of the kubelet plugin pod on `node`, as the kubelet gave it.
    pub async fn plugin_kubeconfig(&self, node: &str) -> anyhow::Result<PathBuf> {
        let pod = self.plugin_pod(node).await?;
        let name = pod.metadata.name.unwrap_or_default();
        let sa = pod
            .spec
            .and_then(|s| s.service_account_name)
            .unwrap_or_default();
        self.sa_kubeconfig(&sa, Some(&name))
    }

    /// Restarts `node`'s kubelet (as a kubelet upgrade or a crash does).
    pub fn restart_kubelet(&self, node: &str) -> anyhow::Result<()> {
        self.hack_cluster(&["restart-kubelet", node]).map(drop)
    }

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
        let path = self
            .node_dir(node)
            .join("var/lib/kubelet/plugins/gpu.nvidia.com/checkpoint.json");
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let value: serde_json::Value =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        Ok(value["payload"]["claims"][uid]["state"]
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
        let labels = node.metadata.labels.unwrap_or_default();
        let label = |key: &str| labels.get(key).cloned().unwrap_or_default();
        let cordoned = node.spec.and_then(|s| s.unschedulable).unwrap_or(false);
        Ok(format!(
            "gpu-stack={} gpu-setup-complete={} unschedulable={cordoned}",
            label("gpu-operator-rs.dev/gpu-stack"),
            label("gpu-operator-rs.dev/gpu-setup-complete")
        ))
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
        self.operand_pods(Some(selector), node)
            .await?
            .into_iter()
            .next()
            .with_context(|| format!("no pod {selector} on {node}"))
    }

    /// The pods of the operator's namespace on `node` (matching label `selector`, if any).
    pub async fn operand_pods(
        &self,
        selector: Option<&str>,
        node: &str,
    ) -> anyhow::Result<Vec<Pod>> {
        let mut params = ListParams::default().fields(&format!("spec.nodeName={node}"));
        if let Some(selector) = selector {
            params = params.labels(selector);
        }
        Ok(Api::<Pod>::namespaced(self.client.clone(), OPERATOR_NS)
            .list(&params)
            .await?
            .items)
    }

    /// The last lines of what the components serving `node` logged: its kubelet plugin pod and
    /// its kubelet.
    pub async fn component_logs(&self, node: &str) -> String {
        let plugin = match self.plugin_pod(node).await {
            Ok(pod) => {
                let name = pod.metadata.name.unwrap_or_default();
                let params = LogParams {
                    container: Some("gpus".into()),
                    tail_lines: Some(30),
                    ..LogParams::default()
                };
                Api::<Pod>::namespaced(self.client.clone(), OPERATOR_NS)
                    .logs(&name, &params)
                    .await
                    .map(|log| format!("--- {OPERATOR_NS}/{name} (gpus):\n{log}"))
                    .unwrap_or_else(|e| format!("--- {OPERATOR_NS}/{name}: no log ({e})"))
            }
            Err(e) => format!("--- kubelet plugin on {node}: {e:#}"),
        };
        let kubelet = self
            .env
            .cluster_dir
            .join(format!("logs/kubelet-{node}.log"));
        format!(
            "{plugin}\n--- {}:\n{}",
            kubelet.display(),
            crate::log_tail(&kubelet)
        )
    }

    /// Runs one behaviour of a scenario: prints it with how long it took; when it fails, names it
    /// and adds the logs of the components serving `node`.
    pub async fn step<T>(
        &self,
        behaviour: &str,
        node: &str,
        work: impl Future<Output = anyhow::Result<T>>,
    ) -> anyhow::Result<T> {
        crate::step_telling(behaviour, work, || self.component_logs(node)).await
    }
}

/// Fields of the GPUCluster's spec set for a scenario and set back to what they were when this is
/// dropped (a field that was unset is removed again).
#[derive(Debug)]
pub struct SpecEdit<'a> {
    cluster: &'a RealNodes,
    undo: serde_json::Value,
    changed: bool,
}

impl RealNodes {
    /// Sets each spec field of the GPUCluster named by its dotted path (`draDriver.gpus.env`) to its
    /// value, in one merge patch, and waits for the kubelet plugin pods to roll when anything
    /// changed; the guard puts the old values back.
    pub async fn edit_gpu_cluster(
        &self,
        fields: &[(&str, serde_json::Value)],
    ) -> anyhow::Result<SpecEdit<'_>> {
        let current: serde_json::Value = serde_json::from_str(
            &self.kubectl(&["get", "gpucluster", "gpu-cluster", "-o", "json"], None)?,
        )?;
        let mut patch = serde_json::json!({});
        let mut undo = serde_json::json!({});
        let mut changed = false;
        for (path, value) in fields {
            let old = path
                .split('.')
                .try_fold(&current["spec"], |v, key| v.get(key))
                .cloned()
                .unwrap_or(serde_json::Value::Null);
            changed |= &old != value;
            set_path(&mut patch, path, value.clone());
            set_path(&mut undo, path, old);
        }
        let before = self.plugin_pods().await?;
        self.patch_gpu_cluster(&patch)?;
        let edit = SpecEdit {
            cluster: self,
            undo,
            changed,
        };
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
    /// Waits, when the edit changed anything, until the kubelet plugin pods of `before` are
    /// replaced (the operator rolls them for every change of their spec).
    async fn settled(&self, before: &BTreeMap<&'static str, String>) -> anyhow::Result<()> {
        if self.changed {
            self.cluster.plugins_replaced(before).await?;
        }
        Ok(())
    }

    /// Puts the old values back and waits for the kubelet plugin pods to roll again.
    pub async fn undo(mut self) -> anyhow::Result<()> {
        let before = self.cluster.plugin_pods().await?;
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

/// Whether a kubelet plugin pod's `gpus` container is ready.
pub fn plugin_ready(pod: &Pod) -> bool {
    pod.status
        .iter()
        .flat_map(|s| s.container_statuses.iter().flatten())
        .any(|c| c.name == "gpus" && c.ready)
}

/// A request's CEL selector in flow-style YAML (`selectors: [...]`).
fn cel_selectors(cel: &str) -> String {
    format!("selectors: [{{cel: {{expression: {cel:?}}}}}]")
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

/// Runs `command` with `stdin`; its stdout, or an error naming it with its stderr.
fn run(command: &mut Command, stdin: Option<&str>) -> anyhow::Result<String> {
    let mut child = command
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {command:?}"))?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(text.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "{command:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A ResourceClaim for one GPU of class `gpu.nvidia.com` whose GpuConfig's `sharing` is
/// `sharing` (flow-style YAML), as the upstream driver's documentation writes them.
pub fn sharing_claim(name: &str, sharing: &str) -> String {
    format!(
        r#"apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {{name: {name}, namespace: {WORKLOAD_NS}}}
spec:
  devices:
    requests:
    - name: gpu
      exactly: {{deviceClassName: gpu.nvidia.com}}
    config:
    - requests: [gpu]
      opaque:
        driver: gpu.nvidia.com
        parameters: {{apiVersion: resource.nvidia.com/v1beta1, kind: GpuConfig, sharing: {sharing}}}
"#
    )
}

/// A pod on `node` whose containers (`name`, script) run the workload image and use claim `claim`.
pub fn claim_pod(name: &str, node: &str, claim: &str, containers: &[(&str, &str)]) -> String {
    let containers: String = containers
        .iter()
        .map(|(ctr, script)| {
            format!(
                "  - name: {ctr}\n    image: {WORKLOAD_IMAGE}\n    command: [\"sh\", \"-c\", {script:?}]\n    resources: {{claims: [{{name: gpu}}]}}\n"
            )
        })
        .collect();
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: {WORKLOAD_NS}}}
spec:
  terminationGracePeriodSeconds: 1
  nodeSelector: {{kubernetes.io/hostname: {node}}}
  resourceClaims: [{{name: gpu, resourceClaimName: {claim}}}]
  containers:
{containers}"#
    )
}

/// What a workload container runs to show what it got: the GPUs `nvidia-smi -L` lists, its
/// `/dev/nvidia<minor>` nodes, and `nvml-present` when NVML's library was injected.
pub const LIST_GPUS: &str = "nvidia-smi -L; ls /dev | grep '^nvidia[0-9]'; test -e /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1 && echo nvml-present";

/// The install guide's claim template and a pod using it: `count` devices of a class (by default
/// one of `gpu.nvidia.com`), on any node unless pinned, its container running [`LIST_GPUS`] in
/// the guide's image unless told otherwise, and ending.
#[derive(Clone, Debug)]
pub struct GuidePod<'a> {
    name: &'a str,
    node: Option<&'a str>,
    count: u32,
    class: &'a str,
    selector: Option<&'a str>,
    script: &'a str,
    image: &'a str,
}

impl<'a> GuidePod<'a> {
    /// Pod and template `name`, one `gpu.nvidia.com` device, as the guide writes them.
    pub fn new(name: &'a str) -> Self {
        Self {
            name,
            node: None,
            count: 1,
            class: DRIVER,
            selector: None,
            script: LIST_GPUS,
            image: WORKLOAD_IMAGE,
        }
    }

    /// Pinned to `node`.
    pub fn on(self, node: &'a str) -> Self {
        Self {
            node: Some(node),
            ..self
        }
    }

    /// `count` devices.
    pub fn count(self, count: u32) -> Self {
        Self { count, ..self }
    }

    /// Devices of DeviceClass `class`.
    pub fn class(self, class: &'a str) -> Self {
        Self { class, ..self }
    }

    /// Devices matching the CEL `selector`.
    pub fn selector(self, selector: &'a str) -> Self {
        Self {
            selector: Some(selector),
            ..self
        }
    }

    /// Its container runs `script` (`sh -c`).
    pub fn script(self, script: &'a str) -> Self {
        Self { script, ..self }
    }

    /// Its container runs `image`.
    pub fn image(self, image: &'a str) -> Self {
        Self { image, ..self }
    }

    /// The manifests, for `kubectl apply`.
    pub fn yaml(&self) -> String {
        let Self {
            name,
            count,
            class,
            script,
            image,
            ..
        } = self;
        let selectors = self
            .selector
            .map(|cel| format!("\n          {}", cel_selectors(cel)))
            .unwrap_or_default();
        let template = format!(
            r#"apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {{name: {name}, namespace: {WORKLOAD_NS}}}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: {class}
          allocationMode: ExactCount
          count: {count}{selectors}
"#
        );
        let pod = workload_pod(
            name,
            self.node,
            &format!("\n  resourceClaims: [{{name: gpu, resourceClaimTemplateName: {name}}}]"),
            image,
            script,
            "{claims: [{name: gpu}]}",
        );
        format!("{template}---\n{pod}")
    }
}

/// A pod `name` asking one of extended resource `resource` (`nvidia.com/gpu`, a GPUClass's
/// resource) with no claim in its manifest, pinned to `node` if given, running `script`.
pub fn resource_pod(name: &str, resource: &str, node: Option<&str>, script: &str) -> String {
    let limits = format!("{{limits: {{{resource}: 1}}}}");
    workload_pod(name, node, "", WORKLOAD_IMAGE, script, &limits)
}

/// A workload pod that runs `script` once in `image`, pinned to `node` if given, with the pod-level
/// `extra` spec lines and the container's `resources` (flow-style YAML).
fn workload_pod(
    name: &str,
    node: Option<&str>,
    extra: &str,
    image: &str,
    script: &str,
    resources: &str,
) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: {WORKLOAD_NS}}}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  nodeSelector: {}{extra}
  containers:
  - name: workload
    image: {image}
    command: ["sh", "-c", {script:?}]
    resources: {resources}
"#,
        pinned_to(node)
    )
}

/// A ResourceClaim `name` for one device of class `class` (matching the CEL `selector`, taking
/// `shares` of a consumable GPU, where given) and a pod `name` on `node` that names it and stays
/// (the kubelet shows device health only for claims a pod names).
pub fn named_claim_pod(
    name: &str,
    node: &str,
    class: &str,
    selector: Option<&str>,
    shares: Option<u32>,
) -> String {
    let mut request = format!("deviceClassName: {class}, count: 1");
    if let Some(cel) = selector {
        request += &format!(", {}", cel_selectors(cel));
    }
    if let Some(shares) = shares {
        request += &format!(", capacity: {{requests: {{shares: \"{shares}\"}}}}");
    }
    let claim = format!(
        r#"apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {{name: {name}, namespace: {WORKLOAD_NS}}}
spec:
  devices:
    requests:
    - name: gpu
      exactly: {{{request}}}
"#
    );
    // The pod's entry carries the claim's own name: kubelet 1.34 shows a device's health only
    // where the two match.
    let script = format!("{LIST_GPUS}; sleep 3600");
    let pod = workload_pod(
        name,
        Some(node),
        &format!("\n  resourceClaims: [{{name: {name}, resourceClaimName: {name}}}]"),
        WORKLOAD_IMAGE,
        &script,
        &format!("{{claims: [{{name: {name}}}]}}"),
    );
    format!("{claim}---\n{pod}")
}

/// A GPUClass `name` of the GPUs whose `gpu-operator-rs.dev/device` label is `device`, with a
/// `shared` variant of `shares` per card under `strategy` where one is given.
pub fn gpu_class(name: &str, device: &str, shared: Option<(u32, &str)>) -> String {
    let variants = shared
        .map(|(shares, strategy)| {
            format!("\n  variants:\n    shared: {{shares: {shares}, strategy: {strategy}}}")
        })
        .unwrap_or_default();
    format!(
        r#"apiVersion: gpu-operator-rs.dev/v1alpha1
kind: GPUClass
metadata: {{name: {name}}}
spec:
  selector:
    matchLabels: {{gpu-operator-rs.dev/device: {device}}}{variants}
"#
    )
}

/// A node selector pinning a pod to `node`, or none.
fn pinned_to(node: Option<&str>) -> String {
    node.map(|n| format!("{{kubernetes.io/hostname: {n}}}"))
        .unwrap_or_else(|| "{}".to_owned())
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

    #[test]
    fn uuids_are_found_in_what_nvidia_smi_prints() {
        let log =
            "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-4a1b-77)\nGPU 1: NVIDIA L4 (UUID: GPU-9f)\n";
        assert_eq!(gpu_uuids(log), ["GPU-4a1b-77", "GPU-9f"]);
        assert!(gpu_uuids("no GPU- here").is_empty());
    }

    #[test]
    fn manifests_are_yaml_the_api_reads() {
        for yaml in [
            sharing_claim("c", "{strategy: TimeSlicing}"),
            claim_pod("p", "n", "c", &[("a", "echo 'hi'; sleep 1"), ("b", "true")]),
            GuidePod::new("s")
                .selector("device.attributes['gpu.nvidia.com'].productName == 'x'")
                .yaml(),
            GuidePod::new("t")
                .on("n")
                .count(2)
                .class("mig.nvidia.com")
                .image("docker.io/library/ubuntu:24.04")
                .yaml(),
            resource_pod("r", "nvidia.com/gpu", Some("n"), "true"),
            resource_pod("r", "gpu-operator-rs.dev/h100", None, LIST_GPUS),
            gpu_class("c", "l4", None),
            named_claim_pod(
                "n",
                "x",
                "gpu.nvidia.com",
                Some("device.attributes['gpu.nvidia.com'].uuid == 'GPU-1'"),
                Some(1),
            ),
            gpu_class("c", "l4", Some((2, "MPS"))),
        ] {
            for doc in yaml.split("\n---\n") {
                let value: serde_yaml::Value = serde_yaml::from_str(doc).unwrap();
                assert!(value["kind"].is_string(), "{doc}");
            }
        }
        let pod: serde_yaml::Value =
            serde_yaml::from_str(&claim_pod("p", "n", "c", &[("a", "echo 'hi'; sleep 1")]))
                .unwrap();
        assert_eq!(
            pod["spec"]["containers"][0]["command"][2].as_str(),
            Some("echo 'hi'; sleep 1")
        );
    }
}
