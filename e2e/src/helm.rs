//! Helpers for the chart tests: the helm binary, the chart folder, and ServiceAccount kubeconfigs
//! from `hack/cluster sa-kubeconfig`, so a host process acts with a chart ServiceAccount's rights.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use anyhow::{Context, bail};

use crate::Env;

fn repo_dir() -> PathBuf {
    crate::manifest_dir()
        .parent()
        .expect("e2e/ is inside the repository")
        .to_path_buf()
}

/// `$CACHE_DIR` (default `~/.cache/gpu-operator-rs`), where `make hack-tools` puts its binaries.
fn cache_dir() -> PathBuf {
    std::env::var_os("CACHE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME").unwrap_or_default();
            PathBuf::from(home).join(".cache/gpu-operator-rs")
        })
}

/// The chart's folder, `charts/gpu-operator`.
pub fn chart_dir() -> PathBuf {
    repo_dir().join("charts/gpu-operator")
}

/// The helm binary: `E2E_HELM`, else `$CACHE_DIR/bin/helm`.
pub fn helm_bin() -> PathBuf {
    std::env::var_os("E2E_HELM")
        .map(PathBuf::from)
        .unwrap_or_else(|| cache_dir().join("bin/helm"))
}

/// `PATH` with `$CACHE_DIR/bin` (kubectl, helm) in front.
fn tools_path() -> std::ffi::OsString {
    let mut dirs = vec![cache_dir().join("bin")];
    if let Some(path) = std::env::var_os("PATH") {
        dirs.extend(std::env::split_paths(&path));
    }
    std::env::join_paths(dirs).unwrap_or_default()
}

/// A helm command against the cluster, as cluster admin.
pub fn helm(env: &Env, args: &[&str]) -> Command {
    let mut command = Command::new(helm_bin());
    command
        .args(args)
        .env("KUBECONFIG", &env.kubeconfig)
        .env("PATH", tools_path())
        .env("HELM_CACHE_HOME", env.log_dir.join("helm/cache"))
        .env("HELM_CONFIG_HOME", env.log_dir.join("helm/config"))
        .env("HELM_DATA_HOME", env.log_dir.join("helm/data"));
    command
}

/// A kubectl command against the cluster, as cluster admin.
pub fn kubectl(env: &Env, args: &[&str]) -> Command {
    let mut command = Command::new(cache_dir().join("bin/kubectl"));
    command.args(args).env("KUBECONFIG", &env.kubeconfig);
    command
}

/// Runs helm to the end and returns its output, whatever its exit status.
pub fn helm_output(env: &Env, args: &[&str]) -> anyhow::Result<Output> {
    helm(env, args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {} {}", helm_bin().display(), args.join(" ")))
}

/// Runs helm and fails with its output unless it succeeds; returns its stdout.
pub fn helm_ok(env: &Env, args: &[&str]) -> anyhow::Result<String> {
    let out = helm_output(env, args)?;
    if !out.status.success() {
        bail!(
            "helm {} failed ({}):\n{}{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Starts helm in the background (for commands a test must act on while they run).
pub fn helm_spawn(env: &Env, args: &[&str]) -> anyhow::Result<Child> {
    helm(env, args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting helm")
}

/// The apiserver port of the cluster, read from the admin kubeconfig's server URL.
fn apiserver_port(env: &Env) -> anyhow::Result<u16> {
    let kubeconfig = kube::config::Kubeconfig::read_from(&env.kubeconfig)?;
    let server = kubeconfig
        .clusters
        .first()
        .and_then(|c| c.cluster.as_ref())
        .and_then(|c| c.server.clone())
        .context("the kubeconfig names no server")?;
    let port = server
        .rsplit(':')
        .next()
        .and_then(|p| p.trim_end_matches('/').parse().ok())
        .with_context(|| format!("no port in {server}"))?;
    Ok(port)
}

/// A kubeconfig for ServiceAccount `ns/sa` (`hack/cluster sa-kubeconfig`); with `pod`, the token is
/// bound to that pod and so carries its node name, like a projected token inside the pod.
pub fn sa_kubeconfig(env: &Env, ns: &str, sa: &str, pod: Option<&str>) -> anyhow::Result<PathBuf> {
    let port_base = apiserver_port(env)?
        .checked_sub(443)
        .context("apiserver port below 443")?;
    let mut command = Command::new(repo_dir().join("hack/cluster"));
    command
        .args(["sa-kubeconfig", ns, sa])
        .args(pod)
        .env("CLUSTER_DIR", &env.cluster_dir)
        .env("PORT_BASE", port_base.to_string())
        .env("KUBECONFIG", &env.kubeconfig)
        .env("PATH", tools_path())
        .stdin(Stdio::null());
    let out = command
        .output()
        .context("running hack/cluster sa-kubeconfig")?;
    if !out.status.success() {
        bail!(
            "hack/cluster sa-kubeconfig {ns} {sa} {}: {}",
            pod.unwrap_or(""),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// A client that authenticates with the given kubeconfig.
pub async fn client_from(kubeconfig: &Path) -> anyhow::Result<kube::Client> {
    let kubeconfig = kube::config::Kubeconfig::read_from(kubeconfig)?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
    Ok(kube::Client::try_from(config)?)
}

/// The same environment, but processes it spawns authenticate with `kubeconfig`.
pub fn with_kubeconfig(env: &Env, kubeconfig: PathBuf) -> Env {
    Env {
        kubeconfig,
        ..env.clone()
    }
}

/// The install guide's "Validate Installation", as cluster admin: `kubectl get gpucluster` shows
/// `gpu-cluster` `ready` (waits up to 2 minutes), the five NVIDIA DeviceClasses exist, and each
/// `(node, gpus)` has ResourceSlices of `gpu.nvidia.com` with at least that many devices.
pub async fn validate_installation(
    client: &kube::Client,
    nodes: &[(&str, u32)],
) -> anyhow::Result<()> {
    use api::GPUCluster;
    use api::gpucluster::State;
    use k8s_openapi::api::resource::v1::ResourceSlice;
    use kube::api::{Api, ListParams};

    let gcs: Api<GPUCluster> = Api::all(client.clone());
    crate::eventually(
        std::time::Duration::from_secs(120),
        "kubectl get gpucluster to show gpu-cluster ready",
        || async {
            let gc = gcs.get("gpu-cluster").await?;
            Ok((gc.status.as_ref().and_then(|s| s.state) == Some(State::Ready)).then_some(()))
        },
    )
    .await?;
    let classes = device_class_names(client).await?;
    if classes != DEVICE_CLASSES {
        bail!("kubectl get deviceclass shows {classes:?}, want {DEVICE_CLASSES:?}");
    }
    let slices = Api::<ResourceSlice>::all(client.clone())
        .list(&ListParams::default())
        .await?;
    for (node, gpus) in nodes {
        let devices: usize = slices
            .items
            .iter()
            .filter(|s| {
                s.spec.node_name.as_deref() == Some(*node) && s.spec.driver == "gpu.nvidia.com"
            })
            .map(|s| s.spec.devices.as_ref().map_or(0, Vec::len))
            .sum();
        if devices < *gpus as usize {
            bail!("{node}: ResourceSlices hold {devices} devices, want at least {gpus}");
        }
    }
    Ok(())
}

/// A small cluster of its own (`hack/cluster up` in `<dir>` on `port_base`), whose apiserver gets
/// `runtime_config` as its `--runtime-config`; stopped when dropped.
#[derive(Debug)]
pub struct OwnCluster {
    /// Its state folder; `kubeconfig` inside is cluster admin.
    pub dir: PathBuf,
    port_base: u16,
    runtime_config: String,
    gates_off: String,
}

impl OwnCluster {
    /// Starts one GPU node and no CPU node. Without `resource.k8s.io/v1` the Node authorizer cannot
    /// start, so such a cluster authorizes by RBAC alone.
    pub fn up(dir: PathBuf, port_base: u16, runtime_config: &str) -> anyhow::Result<OwnCluster> {
        Self::up_with_gates_off(dir, port_base, runtime_config, "")
    }

    /// As [`OwnCluster::up`], with the feature gates `gates_off` ("Gate,Gate") off in every
    /// component.
    pub fn up_with_gates_off(
        dir: PathBuf,
        port_base: u16,
        runtime_config: &str,
        gates_off: &str,
    ) -> anyhow::Result<OwnCluster> {
        let cluster = OwnCluster {
            dir,
            port_base,
            runtime_config: runtime_config.to_owned(),
            gates_off: gates_off.to_owned(),
        };
        cluster.run("up")?;
        Ok(cluster)
    }

    fn run(&self, verb: &str) -> anyhow::Result<()> {
        let out = Command::new(repo_dir().join("hack/cluster"))
            .arg(verb)
            .env("CLUSTER_DIR", &self.dir)
            .env("PORT_BASE", self.port_base.to_string())
            .env("NODES", "1")
            .env("CPU_NODES", "0")
            .env("APISERVER_RUNTIME_CONFIG", &self.runtime_config)
            .env("FEATURE_GATES_OFF", &self.gates_off)
            .env("APISERVER_AUTHORIZATION_MODE", "RBAC")
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("hack/cluster {verb}"))?;
        if !out.status.success() {
            bail!(
                "hack/cluster {verb} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }

    /// The environment of `base` pointed at this cluster.
    pub fn env(&self, base: &Env) -> Env {
        Env {
            kubeconfig: self.dir.join("kubeconfig"),
            cluster_dir: self.dir.clone(),
            ..base.clone()
        }
    }
}

impl Drop for OwnCluster {
    fn drop(&mut self) {
        let _ = self.run("down");
    }
}

/// The DeviceClasses the chart installs, in name order: the install guide's and the operands' own.
pub const DEVICE_CLASSES: [&str; 6] = [
    "compute-domain-daemon.nvidia.com",
    "compute-domain-default-channel.nvidia.com",
    "gpu-or-mig.operands.gpu-operator-rs.dev",
    "gpu.nvidia.com",
    "mig.nvidia.com",
    "vfio.gpu.nvidia.com",
];

/// The names of the cluster's DeviceClasses, in order.
pub async fn device_class_names(client: &kube::Client) -> anyhow::Result<Vec<String>> {
    use k8s_openapi::api::resource::v1::DeviceClass;
    use kube::ResourceExt;
    use kube::api::{Api, ListParams};

    let mut names: Vec<String> = Api::<DeviceClass>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .map(|c| c.name_any())
        .collect();
    names.sort();
    Ok(names)
}
