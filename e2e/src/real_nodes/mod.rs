//! Harness of the real-node scenarios (`e2e/tests/real_nodes/`): the cluster `hack/test/real-nodes.sh`
//! brings up (real kubelets and containerd in namespaces of their own, mock GPUs, the chart installed
//! in [`OPERATOR_NS`]), reached through its kubeconfig. Manifests go in with `kubectl apply`, as a
//! user writes them; what is asserted is read through the API, the nodes' own tools and the nodes'
//! folders. A failed step names itself and carries the logs of the components that did the work:
//! the node's kubelet plugin pod and its kubelet.
//!
//! One scenario alone, against a cluster left up with `KEEP_CLUSTER=1 make test-real-nodes`:
//! `SHARED_CLUSTER=1 CLUSTER_DIR=.cluster/real-<port base> e2e/run.sh --real-nodes <name>`.

mod guards;
mod manifests;
mod planes;
mod prometheus;
mod reads;

pub use guards::{Cleanup, SpecEdit};
pub use manifests::{
    GuidePod, LIST_GPUS, claim_pod, gpu_class, named_claim_pod, resource_pod, sharing_claim,
};
pub use planes::{DEVICE_PLUGIN, MODE_LABEL, ModeGuard};
pub use prometheus::{Prometheus, Sample};
pub use reads::{gpu_uuids, plugin_ready, pod_ready, readiness_of, ready_on};

use crate::Env;
use anyhow::{Context, bail};
use std::future::Future;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

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

/// The env (a GPUCluster `env` list) that points a plugin's NVML at the mock's fault control file
/// of [`RealNodes::set_l4_faults`], as the plugin's container sees it, with a 5 s recovery period
/// and a 1 s probe.
pub fn mock_fault_env() -> serde_json::Value {
    serde_json::json!([
        {"name": "MOCK_NVML_CONFIG", "value": MOCK_FAULTS_IN_POD},
        {"name": "HEALTH_RECOVERY_PERIOD", "value": "5"},
        {"name": "HEALTH_PROBE_INTERVAL", "value": "1"},
    ])
}

/// Where a plugin's container sees the L4 node's mock fault control file.
pub const MOCK_FAULTS_IN_POD: &str = "/host/var/lib/kubelet/mock-nvml-faults.json";

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

    /// `kubectl gpu ARGS` as kubectl runs the plugin: `kubectl-gpu` found on the `PATH` (the
    /// workspace's build), the cluster admin's kubeconfig in `KUBECONFIG`. Not started.
    pub fn kubectl_gpu_command(&self, args: &[&str]) -> Command {
        let path = std::env::var_os("PATH").unwrap_or_default();
        let mut dirs = vec![self.env.bin_dir.clone()];
        dirs.extend(std::env::split_paths(&path));
        let mut command = Command::new(self.env.tools_dir.join("kubectl"));
        command
            .env("PATH", std::env::join_paths(dirs).unwrap_or(path))
            .env("KUBECONFIG", &self.env.kubeconfig)
            .arg("gpu")
            .args(args);
        command
    }

    /// Runs `kubectl gpu ARGS` ([`Self::kubectl_gpu_command`]); its output, or an error with its
    /// stderr.
    pub fn kubectl_gpu(&self, args: &[&str]) -> anyhow::Result<String> {
        run(&mut self.kubectl_gpu_command(args), None)
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

    /// Writes the control file of the L4 node's mock NVML: `faults` (a JSON object, `{}` for
    /// none) for its 2 L4s, replaced whole so a reader never sees half of it. The plugins read it
    /// where [`mock_fault_env`] names it.
    pub fn set_l4_faults(&self, faults: &str) -> anyhow::Result<()> {
        let path = self
            .node_dir(L4_NODE)
            .join("var/lib/kubelet/mock-nvml-faults.json");
        let tmp = path.with_extension("tmp");
        let control = format!(
            r#"{{"profile": "l4", "gpu_count": 2, "visible_dev_dir": "/dev", "faults": {faults}}}"#
        );
        std::fs::write(&tmp, control).with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, &path).with_context(|| format!("writing {}", path.display()))
    }

    /// Puts `count` GPUs of mock `profile` (`l4`, `h100`, ...) on `node`'s PCI bus, with no driver
    /// for them yet (as a hot-plug or a rescan shows them).
    pub fn plug_gpus(&self, node: &str, profile: &str, count: u32) -> anyhow::Result<()> {
        self.hack_cluster(&["plug-gpus", node, profile, &count.to_string()])
            .map(drop)
    }

    /// Brings a containerized driver up on `node` for `count` GPUs of `profile`: its root in
    /// `/run/nvidia/driver`, the GPUs' device files in the node's `/dev`.
    pub fn install_driver(&self, node: &str, profile: &str, count: u32) -> anyhow::Result<()> {
        self.hack_cluster(&["install-driver", node, profile, &count.to_string()])
            .map(drop)
    }

    /// Replaces the containerized driver of `node` (see [`Self::install_driver`]) by one of
    /// driver `version`, as a driver upgrade does; `broken`: one whose library cannot be loaded.
    pub fn upgrade_driver(&self, node: &str, version: &str, broken: bool) -> anyhow::Result<()> {
        let mut args = vec!["upgrade-driver", node, version];
        if broken {
            args.push("broken");
        }
        self.hack_cluster(&args).map(drop)
    }

    /// SIGKILLs the `gpus` container of the kubelet plugin pod on `node` (the kubelet restarts it).
    pub async fn kill_plugin(&self, node: &str) -> anyhow::Result<()> {
        let container = self
            .plugin_pod(node)
            .await?
            .status
            .and_then(|s| s.container_statuses)
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.name == "gpus")
            .and_then(|c| c.container_id)
            .context("the plugin's gpus container has no id")?;
        let ctr = self.env.tools_dir.join("ctr").display().to_string();
        let id = container.trim_start_matches("containerd://");
        self.node_exec(
            node,
            &[
                &ctr,
                "--address",
                "/run/containerd/containerd.sock",
                "-n",
                "k8s.io",
                "tasks",
                "kill",
                "-s",
                "SIGKILL",
                id,
            ],
        )
        .map(drop)
    }

    /// Restarts `node`'s kubelet (as a kubelet upgrade or a crash does).
    pub fn restart_kubelet(&self, node: &str) -> anyhow::Result<()> {
        self.hack_cluster(&["restart-kubelet", node]).map(drop)
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

/// Runs `command` with `stdin`; its stdout, or an error naming it with its stderr.
pub(crate) fn run(command: &mut Command, stdin: Option<&str>) -> anyhow::Result<String> {
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
