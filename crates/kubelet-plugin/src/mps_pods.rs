//! Claims' MPS control daemons, each in a pod of its own that the plugin creates on its node.
//!
//! A pod (not a child process) because the daemon must outlive the plugin: the containers of a
//! prepared claim keep talking to it while the plugin restarts or is upgraded, and a process in
//! the plugin's container would die with it. The pod is `mps-<claim uid>` in the plugin's
//! namespace, bound to this node by `nodeName` (no scheduler, no GPU request: the claim already
//! holds the devices), running the driver root's own `nvidia-cuda-mps-control -f` from the
//! plugin's image with the claim's devices as `CUDA_VISIBLE_DEVICES` and the claim's limits.
//! Its pipe and log directories are host paths below the MPS root, which the plugin sees at the
//! same path: the plugin creates them, waits until the daemon answers the driver's client on
//! them, and removes them once the pod is gone.

use crate::mps::{self, MpsDaemon, MpsDaemons};
use api::contract::paths;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::io::AsyncWriteExt;

/// Label naming the claim a daemon pod serves (its value is the claim's UID).
pub const CLAIM_LABEL: &str = "gpu.nvidia.com/mps-claim";
/// `app.kubernetes.io/component` of daemon pods.
pub const COMPONENT: &str = "mps-control-daemon";
/// How long a daemon may take to answer after its pod is created, or to go once deleted.
pub const WAIT: Duration = Duration::from_secs(40);
/// Where a daemon pod mounts the driver root.
const DRIVER_ROOT_IN_POD: &str = paths::DRIVER_ROOT_CTR_PATH;

/// What every daemon pod of this plugin shares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodSettings {
    /// The plugin's namespace, where daemon pods go.
    pub namespace: String,
    /// This node.
    pub node: String,
    /// The plugin's image (it carries the C library the driver's tools need).
    pub image: String,
    /// Its pull policy.
    pub pull_policy: String,
    /// The driver root on the host.
    pub driver_root: PathBuf,
    /// `nvidia-cuda-mps-control` inside the driver root.
    pub binary: PathBuf,
    /// The driver's library folder inside the driver root.
    pub library_dir: Option<PathBuf>,
    /// The MPS root on the host (and in the plugin).
    pub mps_root: PathBuf,
}

/// The name of claim `uid`'s daemon pod.
pub fn pod_name(uid: &str) -> String {
    format!("mps-{uid}")
}

fn in_pod(relative: &Path) -> String {
    Path::new(DRIVER_ROOT_IN_POD)
        .join(relative)
        .to_string_lossy()
        .into_owned()
}

/// The daemon pod of claim `uid`.
pub fn daemon_pod(settings: &PodSettings, uid: &str, daemon: &MpsDaemon) -> Pod {
    let host = |p: &Path| p.to_string_lossy().into_owned();
    let mut env = vec![
        serde_json::json!({"name": "CUDA_VISIBLE_DEVICES", "value": daemon.devices.join(",")}),
        serde_json::json!({"name": "CUDA_MPS_PIPE_DIRECTORY", "value": paths::MPS_PIPE_CTR_PATH}),
        serde_json::json!({"name": "CUDA_MPS_LOG_DIRECTORY", "value": mps::LOG_CTR_PATH}),
    ];
    if let Some(lib) = &settings.library_dir {
        env.push(serde_json::json!({"name": "LD_LIBRARY_PATH", "value": in_pod(lib)}));
    }
    env.extend(
        daemon
            .limits_env()
            .into_iter()
            .map(|(name, value)| serde_json::json!({"name": name, "value": value})),
    );
    let pod = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(uid),
            "namespace": settings.namespace,
            "labels": {
                "app.kubernetes.io/name": "nvidia-dra-driver",
                "app.kubernetes.io/component": COMPONENT,
                CLAIM_LABEL: uid,
            },
        },
        "spec": {
            "nodeName": settings.node,
            "restartPolicy": "OnFailure",
            "tolerations": [{"operator": "Exists"}],
            "automountServiceAccountToken": false,
            "enableServiceLinks": false,
            "terminationGracePeriodSeconds": 5,
            "containers": [{
                "name": COMPONENT,
                "image": settings.image,
                "imagePullPolicy": settings.pull_policy,
                "command": [in_pod(&settings.binary), "-f"],
                "env": env,
                // The daemon opens the claim's GPUs' device nodes.
                "securityContext": {"privileged": true},
                "volumeMounts": [
                    {"name": "pipe", "mountPath": paths::MPS_PIPE_CTR_PATH},
                    {"name": "log", "mountPath": mps::LOG_CTR_PATH},
                    {"name": "driver-root", "mountPath": DRIVER_ROOT_IN_POD, "readOnly": true},
                ],
            }],
            "volumes": [
                {"name": "pipe", "hostPath": {"path": host(&mps::pipe_dir(&settings.mps_root, uid)), "type": "DirectoryOrCreate"}},
                {"name": "log", "hostPath": {"path": host(&mps::log_dir(&settings.mps_root, uid)), "type": "DirectoryOrCreate"}},
                {"name": "driver-root", "hostPath": {"path": host(&settings.driver_root), "type": "Directory"}},
            ],
        },
    });
    serde_json::from_value(pod).expect("the daemon pod is a valid Pod")
}

/// Runs claims' daemons as pods through the API.
#[derive(Clone)]
pub struct PodDaemons {
    pods: Api<Pod>,
    settings: PodSettings,
    /// The driver's `nvidia-cuda-mps-control` as the plugin sees it (to ask the daemon).
    client_binary: PathBuf,
    /// The driver's library folder as the plugin sees it.
    client_library_dir: Option<PathBuf>,
}

impl std::fmt::Debug for PodDaemons {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodDaemons")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// The driver's `nvidia-cuda-mps-control` inside the driver root (as `driver_root_ctr` shows
/// it), or the paths looked at.
pub fn find_binary(driver_root_ctr: &Path) -> Result<PathBuf, String> {
    crate::driver_tools::find(driver_root_ctr, "nvidia-cuda-mps-control").map_err(|searched| {
        format!(
            "claims asking for MPS need the driver's nvidia-cuda-mps-control, which is not at {}",
            crate::driver_tools::searched(&searched)
        )
    })
}

impl PodDaemons {
    /// Daemons in pods of `settings`, asked through the driver root as `driver_root_ctr` shows it.
    pub fn new(client: kube::Client, settings: PodSettings, driver_root_ctr: &Path) -> Self {
        Self {
            pods: Api::namespaced(client, &settings.namespace),
            client_binary: driver_root_ctr.join(&settings.binary),
            client_library_dir: settings
                .library_dir
                .as_ref()
                .map(|l| driver_root_ctr.join(l)),
            settings,
        }
    }

    fn describe(&self, uid: &str) -> String {
        format!(
            "MPS control daemon pod {}/{}",
            self.settings.namespace,
            pod_name(uid)
        )
    }

    /// Sends `command` to claim `uid`'s daemon with the driver's client; `Ok` once it answered.
    async fn ask(&self, uid: &str, line: &str) -> Result<(), String> {
        let mut command =
            crate::driver_tools::command(&self.client_binary, self.client_library_dir.as_deref());
        command
            .env(
                "CUDA_MPS_PIPE_DIRECTORY",
                mps::pipe_dir(&self.settings.mps_root, uid),
            )
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = command
            .spawn()
            .map_err(|e| format!("{} could not run: {e}", self.client_binary.display()))?;
        if let Some(mut stdin) = child.stdin.take() {
            let _ = stdin.write_all(format!("{line}\n").as_bytes()).await;
        }
        let output = tokio::time::timeout(Duration::from_secs(5), child.wait_with_output())
            .await
            .map_err(|_| "the daemon did not answer within 5s".to_owned())?
            .map_err(|e| e.to_string())?;
        if output.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&output.stderr).trim().to_owned())
        }
    }

    /// Why the daemon pod cannot come up, if its status already says so.
    async fn stuck(&self, uid: &str) -> Option<String> {
        let pod = self.pods.get_opt(&pod_name(uid)).await.ok()??;
        let status = pod.status?;
        let waiting = status
            .container_statuses
            .iter()
            .flatten()
            .filter_map(|c| c.state.as_ref()?.waiting.as_ref())
            .find(|w| {
                w.reason.as_deref().is_some_and(|r| {
                    matches!(
                        r,
                        "ErrImagePull"
                            | "ImagePullBackOff"
                            | "CrashLoopBackOff"
                            | "CreateContainerError"
                            | "RunContainerError"
                    )
                })
            })?;
        Some(format!(
            "{}: {}",
            waiting.reason.clone().unwrap_or_default(),
            waiting.message.clone().unwrap_or_default()
        ))
    }

    async fn start_daemon(&self, uid: &str, daemon: &MpsDaemon) -> Result<(), String> {
        for dir in [
            mps::pipe_dir(&self.settings.mps_root, uid),
            mps::log_dir(&self.settings.mps_root, uid),
        ] {
            std::fs::create_dir_all(&dir)
                .map_err(|e| format!("creating {}: {e}", dir.display()))?;
        }
        let pod = daemon_pod(&self.settings, uid, daemon);
        match self.pods.create(&PostParams::default(), &pod).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(format!("creating the {}: {e}", self.describe(uid))),
        }
        let deadline = tokio::time::Instant::now() + WAIT;
        let mut tries = 0u32;
        loop {
            let last = match self.ask(uid, "get_default_active_thread_percentage").await {
                Ok(()) => return Ok(()),
                Err(e) => e,
            };
            tries += 1;
            if tries.is_multiple_of(8)
                && let Some(why) = self.stuck(uid).await
            {
                return Err(format!("the {} does not start: {why}", self.describe(uid)));
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(format!(
                    "the {} did not answer within {WAIT:?}: {last}",
                    self.describe(uid)
                ));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    async fn stop_daemon(&self, uid: &str) -> Result<(), String> {
        let name = pod_name(uid);
        // A clean shutdown first, as an admin stops a daemon (the pod, restarted only on
        // failure, then stays down); deleting the pod stops it in any case.
        if mps::pipe_dir(&self.settings.mps_root, uid)
            .join("control")
            .exists()
        {
            let _ = self.ask(uid, "quit").await;
        }
        match self.pods.delete(&name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(format!("deleting the {}: {e}", self.describe(uid))),
        }
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            match self.pods.get_opt(&name).await {
                Ok(None) => break,
                Ok(Some(_)) if tokio::time::Instant::now() >= deadline => {
                    return Err(format!(
                        "the {} is still there after {WAIT:?}",
                        self.describe(uid)
                    ));
                }
                Ok(Some(_)) => {}
                Err(e) => return Err(format!("reading the {}: {e}", self.describe(uid))),
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let dir = mps::claim_dir(&self.settings.mps_root, uid);
        match std::fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(format!("removing {}: {e}", dir.display()))
            }
            _ => Ok(()),
        }
    }

    async fn present_daemons(&self) -> Result<Vec<String>, String> {
        let params = ListParams::default()
            .labels(&format!(
                "app.kubernetes.io/component={COMPONENT},{CLAIM_LABEL}"
            ))
            .fields(&format!("spec.nodeName={}", self.settings.node));
        let pods = self
            .pods
            .list(&params)
            .await
            .map_err(|e| format!("listing MPS control daemon pods: {e}"))?;
        let mut uids: std::collections::BTreeSet<String> = pods
            .items
            .iter()
            .filter_map(|p| p.metadata.labels.as_ref()?.get(CLAIM_LABEL).cloned())
            .collect();
        uids.extend(
            mps::claim_dirs(&self.settings.mps_root)
                .map_err(|e| format!("listing {}: {e}", self.settings.mps_root.display()))?,
        );
        Ok(uids.into_iter().collect())
    }
}

impl MpsDaemons for PodDaemons {
    fn start<'a>(
        &'a self,
        uid: &'a str,
        daemon: &'a MpsDaemon,
    ) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(self.start_daemon(uid, daemon))
    }
    fn stop<'a>(&'a self, uid: &'a str) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(self.stop_daemon(uid))
    }
    fn present(&self) -> BoxFuture<'_, Result<Vec<String>, String>> {
        Box::pin(self.present_daemons())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> PodSettings {
        PodSettings {
            namespace: "gpu-operator".into(),
            node: "node-a".into(),
            image: "ghcr.io/gpu-operator-rs/gpu-kubelet-plugin:0.1.0".into(),
            pull_policy: "IfNotPresent".into(),
            driver_root: "/run/nvidia/driver".into(),
            binary: "usr/bin/nvidia-cuda-mps-control".into(),
            library_dir: Some("usr/lib/x86_64-linux-gnu".into()),
            mps_root: "/run/nvidia/mps".into(),
        }
    }

    #[test]
    fn the_daemon_pod_runs_the_drivers_daemon_on_the_claims_devices_only() {
        let daemon = MpsDaemon {
            devices: vec!["GPU-a".into(), "GPU-b".into()],
            active_thread_percentage: Some(50),
            pinned_memory_mib: [(0, 10240), (1, 10240)].into(),
        };
        let pod = serde_json::to_value(daemon_pod(&settings(), "u1", &daemon)).unwrap();
        insta::assert_yaml_snapshot!(pod);
    }

    #[test]
    fn the_binary_is_looked_for_where_drivers_install_it() {
        let dir = tempfile::tempdir().unwrap();
        let err = find_binary(dir.path()).unwrap_err();
        assert!(err.contains("usr/bin/nvidia-cuda-mps-control or"), "{err}");
        std::fs::create_dir_all(dir.path().join("bin")).unwrap();
        std::fs::write(dir.path().join("bin/nvidia-cuda-mps-control"), "").unwrap();
        assert_eq!(
            find_binary(dir.path()).unwrap(),
            PathBuf::from("bin/nvidia-cuda-mps-control")
        );
    }
}
