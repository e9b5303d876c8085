//! Shared harness of the end-to-end tests. They run against the local cluster that `make test-e2e`
//! brings up (`hack/cluster`), with our binaries as host processes. They are `#[ignore]`d, so a plain
//! `cargo test` lists them as ignored; `e2e/run.sh` runs them with `--include-ignored`, and run
//! without the cluster they fail, saying so.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde::Deserialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The e2e crate's folder: where `cargo test` says it is when it runs the tests, so a test binary
/// built in a target shared by clones still finds this clone's scripts.
pub fn manifest_dir() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

/// Where the running cluster and our built binaries are.
#[derive(Clone, Debug)]
pub struct Env {
    /// Cluster-admin kubeconfig.
    pub kubeconfig: PathBuf,
    /// Folder holding `gpu-operator`, `node-labeler`, ... (the cargo target's `debug/`).
    pub bin_dir: PathBuf,
    /// Folder for logs of the processes a test starts.
    pub log_dir: PathBuf,
    /// The cluster's state folder (`nodes/<node>/kubelet/` holds each fake node's kubelet dirs).
    pub cluster_dir: PathBuf,
    /// Folder of the `hack-tools` binaries (`cdi-validate`, ...): `$CACHE_DIR/bin`.
    pub tools_dir: PathBuf,
}

impl Env {
    /// The environment `make test-e2e` sets; an error that says how to run the tests outside it.
    pub fn from_env() -> anyhow::Result<Env> {
        let Some(kubeconfig) = std::env::var_os("E2E_KUBECONFIG") else {
            bail!(
                "E2E_KUBECONFIG is not set: the e2e tests need the local cluster; run `make test-e2e`"
            );
        };
        let bin_dir = std::env::var_os("E2E_BIN_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                let target = std::env::var_os("CARGO_TARGET_DIR")
                    .map(PathBuf::from)
                    .unwrap_or_else(|| manifest_dir().join("../target"));
                target.join("debug")
            });
        let log_dir = std::env::var_os("E2E_LOG_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(std::env::temp_dir);
        let kubeconfig = PathBuf::from(kubeconfig);
        let cluster_dir = std::env::var_os("E2E_CLUSTER_DIR")
            .map(PathBuf::from)
            .or_else(|| kubeconfig.parent().map(Path::to_path_buf))
            .unwrap_or_default();
        let tools_dir = std::env::var_os("CACHE_DIR")
            .map(PathBuf::from)
            .or_else(|| {
                std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/gpu-operator-rs"))
            })
            .unwrap_or_default()
            .join("bin");
        Ok(Env {
            kubeconfig,
            cluster_dir,
            bin_dir,
            log_dir,
            tools_dir,
        })
    }

    /// A client for the cluster, as cluster admin.
    pub async fn client(&self) -> anyhow::Result<kube::Client> {
        let kubeconfig = kube::config::Kubeconfig::read_from(&self.kubeconfig)?;
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
        Ok(kube::Client::try_from(config)?)
    }

    /// The kubelet root directory of a fake node (`plugins_registry/`, `plugins/`).
    ///
    /// `nodes` links to a short folder so that socket paths below it fit a Unix socket address; the
    /// link's target is returned, not the long path through it.
    pub fn kubelet_dir(&self, node: &str) -> PathBuf {
        let nodes = self.cluster_dir.join("nodes");
        std::fs::read_link(&nodes)
            .unwrap_or(nodes)
            .join(node)
            .join("kubelet")
    }

    /// Starts one of our binaries with `KUBECONFIG` set; its output goes to `<log_dir>/<log>.log`.
    pub fn spawn(&self, bin: &str, log: &str, envs: &[(&str, &str)]) -> anyhow::Result<Process> {
        let path = self.bin_dir.join(bin);
        std::fs::create_dir_all(&self.log_dir)?;
        let log_path = self.log_dir.join(format!("{log}.log"));
        let out = std::fs::File::create(&log_path)?;
        let child = Command::new(&path)
            .env("KUBECONFIG", &self.kubeconfig)
            .envs(envs.iter().copied())
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("starting {}", path.display()))?;
        Ok(Process { child, log_path })
    }
}

pub mod dra_node;
pub mod helm;
pub mod real_nodes;

/// A child process that is killed when the test lets go of it.
#[derive(Debug)]
pub struct Process {
    child: Child,
    /// Where its output goes.
    pub log_path: PathBuf,
}

impl Process {
    /// Sends SIGKILL and reaps the process.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends SIGTERM, as the kubelet does to stop a pod, and waits for the process to exit.
    pub fn terminate(&mut self) -> anyhow::Result<()> {
        let status = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status()?;
        anyhow::ensure!(status.success(), "kill -TERM {} failed", self.child.id());
        self.child.wait()?;
        Ok(())
    }

    /// The process's resident set size in KiB, from `/proc`.
    pub fn rss_kib(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).ok()?;
        let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
        line.split_whitespace().nth(1)?.parse().ok()
    }

    /// The last lines of its log, for failure messages.
    pub fn log_tail(&self) -> String {
        log_tail(&self.log_path)
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The last 30 lines of a log file, for failure messages.
pub fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

/// Runs one behaviour of a scenario: prints how long it took, and when it fails names it in the
/// error with the tails of `logs` (of the processes that should have done the work).
pub async fn step<T>(
    behaviour: &str,
    logs: &[&Path],
    work: impl Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    step_telling(behaviour, work, || async {
        let tails: Vec<String> = logs
            .iter()
            .map(|log| format!("--- {}:\n{}", log.display(), log_tail(log)))
            .collect();
        tails.join("\n")
    })
    .await
}

/// Runs one behaviour of a scenario: prints how long it took, and when it fails names it in the
/// error with what `tell` gathers then (the logs of the components that should have done the work).
pub async fn step_telling<T, Told>(
    behaviour: &str,
    work: impl Future<Output = anyhow::Result<T>>,
    tell: impl FnOnce() -> Told,
) -> anyhow::Result<T>
where
    Told: Future<Output = String>,
{
    let start = Instant::now();
    match work.await {
        Ok(value) => {
            eprintln!("ok   {behaviour} ({:.1}s)", start.elapsed().as_secs_f64());
            Ok(value)
        }
        Err(e) => Err(e.context(format!("FAILED: {behaviour}\n{}", tell().await))),
    }
}

/// Polls `check` every 200 ms until it returns `Some`, or fails after `timeout` naming `what`.
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<Option<T>>>,
{
    let start = Instant::now();
    let mut last_error = None;
    loop {
        match check().await {
            Ok(Some(value)) => return Ok(value),
            Ok(None) => {}
            Err(e) => last_error = Some(e),
        }
        if start.elapsed() > timeout {
            match last_error {
                Some(e) => {
                    bail!("timed out after {timeout:?} waiting for {what}; last error: {e:#}")
                }
                None => bail!("timed out after {timeout:?} waiting for {what}"),
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A KWOK GPU node (NFD's NVIDIA label) labelled `e2e=<group>`, offering `gpus` device-plugin GPUs.
pub fn kwok_gpu_node(name: &str, group: &str, gpus: u32) -> k8s_openapi::api::core::v1::Node {
    let mut resources = serde_json::json!({"cpu": "8", "memory": "32Gi", "pods": "110"});
    if gpus > 0 {
        resources["nvidia.com/gpu"] = serde_json::json!(gpus.to_string());
    }
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name,
                     "labels": {"kubernetes.io/hostname": name, "type": "kwok", "e2e": group,
                                "feature.node.kubernetes.io/pci-10de.present": "true"},
                     "annotations": {"kwok.x-k8s.io/node": "fake"}},
        "status": {"allocatable": resources, "capacity": resources}
    }))
    .expect("a valid node")
}

/// Makes namespace `name` exist (waiting for one of an earlier run to finish terminating).
pub async fn fresh_namespace(client: &kube::Client, name: &str) -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::Namespace;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    eventually(
        Duration::from_secs(60),
        "no terminating namespace",
        || async {
            let ns = namespaces.get_opt(name).await?;
            let phase = ns.and_then(|n| n.status).and_then(|s| s.phase);
            Ok((phase.as_deref() != Some("Terminating")).then_some(()))
        },
    )
    .await?;
    namespaces
        .patch(
            name,
            &PatchParams::apply("e2e").force(),
            &Patch::Apply(
                serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}),
            ),
        )
        .await?;
    Ok(())
}

/// Deletes nodes `names` left by an earlier run and waits until they are gone.
pub async fn delete_nodes(client: &kube::Client, names: &[&str]) -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::Node;
    let nodes: Api<Node> = Api::all(client.clone());
    for name in names {
        let _ = nodes.delete(name, &Default::default()).await;
    }
    eventually(
        Duration::from_secs(30),
        "nodes of an earlier run gone",
        || async {
            for name in names {
                if nodes.get_opt(name).await?.is_some() {
                    return Ok(None);
                }
            }
            Ok(Some(()))
        },
    )
    .await
}

/// Installs (server-side applies) the GPUCluster CRD from crates/api and waits until it is served.
pub async fn install_crd(client: &kube::Client) -> anyhow::Result<()> {
    apply_crd(client, &api::gpucluster::crd()).await
}

/// Installs (server-side applies) the product's own CRDs (`GPUClass`, `PhysicalGPU`) and waits
/// until they are established.
pub async fn install_product_crds(client: &kube::Client) -> anyhow::Result<()> {
    apply_crd(client, &api::gpuclass::crd()).await?;
    apply_crd(client, &api::physicalgpu::crd()).await
}

/// Server-side applies the `gpu-cluster` GPUCluster with `spec` (field manager `e2e`).
pub async fn set_spec(gcs: &Api<api::GPUCluster>, spec: serde_json::Value) -> anyhow::Result<()> {
    let object = serde_json::json!({
        "apiVersion": "nvidia.com/v1alpha1", "kind": "GPUCluster",
        "metadata": {"name": "gpu-cluster"}, "spec": spec});
    gcs.patch(
        "gpu-cluster",
        &PatchParams::apply("e2e").force(),
        &Patch::Apply(object),
    )
    .await?;
    Ok(())
}

/// The test stand-in for the upstream ClusterPolicy CRD and one ClusterPolicy (also applied by
/// `hack/real-nodes.sh`).
pub const CLUSTER_POLICY_YAML: &str = include_str!("../testdata/clusterpolicy-crd.yaml");

/// Installs the ClusterPolicy CRD stand-in, waits until it is served, and creates `cluster-policy`.
pub async fn install_cluster_policy(client: &kube::Client) -> anyhow::Result<()> {
    let mut docs = serde_yaml::Deserializer::from_str(CLUSTER_POLICY_YAML)
        .map(serde_json::Value::deserialize)
        .collect::<Result<Vec<_>, _>>()?
        .into_iter();
    let (Some(crd), Some(policy)) = (docs.next(), docs.next()) else {
        bail!("testdata/clusterpolicy-crd.yaml must hold the CRD and then a ClusterPolicy");
    };
    apply_crd(client, &serde_json::from_value(crd)?).await?;
    let policies = cluster_policies(client);
    policies
        .patch(
            "cluster-policy",
            &PatchParams::apply("e2e").force(),
            &Patch::Apply(&policy),
        )
        .await?;
    Ok(())
}

/// Deletes the ClusterPolicy `cluster-policy` (the CRD stays).
pub async fn delete_cluster_policy(client: &kube::Client) -> anyhow::Result<()> {
    match cluster_policies(client)
        .delete("cluster-policy", &Default::default())
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Deletes the ClusterPolicy CRD stand-in (and so every ClusterPolicy).
pub async fn uninstall_cluster_policy(client: &kube::Client) -> anyhow::Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    match crds
        .delete("clusterpolicies.nvidia.com", &Default::default())
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

fn cluster_policies(client: &kube::Client) -> Api<kube::api::DynamicObject> {
    Api::all_with(
        client.clone(),
        &api::contract::cluster_policy::api_resource(),
    )
}

async fn apply_crd(client: &kube::Client, crd: &CustomResourceDefinition) -> anyhow::Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let name = crd.metadata.name.clone().unwrap_or_default();
    crds.patch(
        &name,
        &PatchParams::apply("e2e").force(),
        &Patch::Apply(crd),
    )
    .await?;
    eventually(
        Duration::from_secs(30),
        &format!("CRD {name} to be established"),
        || {
            let crds = crds.clone();
            let name = name.clone();
            async move {
                let crd = crds.get(&name).await?;
                let established = crd
                    .status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True");
                Ok(established.then_some(()))
            }
        },
    )
    .await
}

/// Reads one sample of a Prometheus text metric from `http://<addr>/metrics`.
pub async fn metric(addr: &str, name: &str) -> anyhow::Result<f64> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let request = format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut body = String::new();
    stream.read_to_string(&mut body).await?;
    body.lines()
        .find_map(|line| {
            let (key, value) = line.rsplit_once(' ')?;
            (key == name).then(|| value.parse().ok()).flatten()
        })
        .with_context(|| format!("metric {name} not found at {addr}"))
}

/// `(reason, message)` of every Event about the object named `name`.
pub async fn events_on(
    events: &Api<k8s_openapi::api::core::v1::Event>,
    name: &str,
) -> anyhow::Result<Vec<(String, String)>> {
    let list = events
        .list(&kube::api::ListParams::default().fields(&format!("involvedObject.name={name}")))
        .await?;
    Ok(list
        .items
        .into_iter()
        .filter_map(|e| Some((e.reason?, e.message.unwrap_or_default())))
        .collect())
}
