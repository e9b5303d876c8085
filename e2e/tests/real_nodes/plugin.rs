//! The DRA kubelet plugin on a real kubelet: it registers again after a kubelet restart, serves
//! its metrics under the upstream driver's names, keeps a running pod's claim when its own pod is
//! replaced, prepares MIG devices with their capability nodes, and loses nothing when it is
//! killed in the middle of a prepare.

use crate::ran_on_gpus;
use anyhow::{Context, ensure};
use e2e::eventually;
use e2e::real_nodes::{
    GuidePod, H100_NODE, LIST_GPUS, MIG_NODE, OPERATOR_NS, RealNodes, WORKLOAD_NS, plugin_ready,
};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{Api, ListParams};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

/// How many times `node`'s kubelet logged our plugin's registration.
fn registrations(cluster: &RealNodes, node: &str) -> usize {
    let log = cluster
        .env
        .cluster_dir
        .join(format!("logs/kubelet-{node}.log"));
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("RegisterPlugin started") && l.contains("gpu.nvidia.com-reg.sock"))
        .count()
}

/// How many whole GPUs `node` publishes.
async fn gpus_published(cluster: &RealNodes, node: &str) -> anyhow::Result<usize> {
    Ok(crate::published_gpus(cluster, node).await?.len())
}

#[tokio::test]
#[ignore = "needs real nodes: make test-real-nodes runs it"]
async fn after_a_kubelet_restart_the_plugin_registers_again_and_serves_a_new_claim()
-> anyhow::Result<()> {
    let cluster = RealNodes::connect().await?;
    const NAMES: &[&str] = &["after-restart"];
    let _cleanup = cluster.cleanup(&[("pod", NAMES), ("resourceclaimtemplate", NAMES)]);
    let before = registrations(&cluster, H100_NODE);
    cluster.restart_kubelet(H100_NODE)?;
    // The pod comes once the kubelet took the registration again (a pod that found no driver
    // would wait out the kubelet's backoff) and the plugin published its slice again (the
    // kubelet wipes it at start).
    cluster
        .step(
            "after a kubelet restart on real-gpu-0 the plugin pod registered again and republished its 4 GPUs; the node is Ready",
            H100_NODE,
            async {
                eventually(Duration::from_secs(90), "the registration and the slice", || async {
                    let (now, gpus) = (registrations(&cluster, H100_NODE), gpus_published(&cluster, H100_NODE).await?);
                    if now > before && gpus == 4 {
                        Ok(Some(()))
                    } else {
                        Err(anyhow::anyhow!("registrations {before} -> {now}, GPUs published {gpus}"))
                    }
                })
                .await?;
                eventually(Duration::from_secs(60), "the node Ready", || async {
                    let node = Api::<Node>::all(cluster.client.clone()).get(H100_NODE).await?;
                    let ready = node
                        .status
                        .and_then(|s| s.conditions)
                        .unwrap_or_default()
                        .into_iter()
                        .any(|c| c.type_ == "Ready" && c.status == "True");
                    Ok(ready.then_some(()))
                })
                .await
            },
        )
        .await?;
    cluster.apply(&GuidePod::new("after-restart").on(H100_NODE).yaml())?;
    cluster
        .step(
            "a new pod on real-gpu-0 gets its GPU after the restart",
            H100_NODE,
            ran_on_gpus(&cluster, "after-restart", H100_NODE, 1),
        )
        .await
        .map(drop)
}

/// The series a Prometheus scrape of the plugin on real-gpu-0 must show (a line starting so).
const UPSTREAM_SERIES: [&str; 6] = [
    r#"nvidia_dra_request_duration_seconds_count{driver="gpu.nvidia.com",operation="prepare"} "#,
    r#"nvidia_dra_requests_inflight{driver="gpu.nvidia.com",operation="prepare"} 0"#,
    r#"nvidia_dra_requests_total{driver="gpu.nvidia.com",operation="unprepare"} "#,
    r#"nvidia_dra_prepared_devices{node="real-gpu-0",driver="gpu.nvidia.com",device_type="gpu"} "#,
    r#"nvidia_dra_prepared_devices{node="real-gpu-0",driver="gpu.nvidia.com",device_type="mig"} 0"#,
    r#"gpu_kubelet_plugin_claim_requests_total{operation="Prepare"} "#,
];

#[tokio::test]
#[ignore = "needs real nodes: make test-real-nodes runs it"]
async fn the_plugins_metrics_carry_the_upstream_drivers_names() -> anyhow::Result<()> {
    let cluster = RealNodes::connect().await?;
    const NAMES: &[&str] = &["metered"];
    let _cleanup = cluster.cleanup(&[("pod", NAMES), ("resourceclaimtemplate", NAMES)]);
    cluster.apply(&GuidePod::new("metered").on(H100_NODE).yaml())?;
    ran_on_gpus(&cluster, "metered", H100_NODE, 1).await?;
    cluster.delete("pod", NAMES)?;
    // Scraped as Prometheus would: from the node, at the pod's address, once the claim was
    // prepared and (its pod gone) unprepared.
    cluster
        .step(
            "the plugin's /metrics on real-gpu-0 serves the upstream driver's series beside ours",
            H100_NODE,
            eventually(Duration::from_secs(60), "the series", || async {
                let ip = cluster
                    .plugin_pod(H100_NODE)
                    .await?
                    .status
                    .and_then(|s| s.pod_ip)
                    .context("the plugin pod has no IP")?;
                let url = format!("http://{ip}:8080/metrics");
                let scrape = cluster.node_exec(H100_NODE, &["/bin/busybox", "wget", "-qO-", &url])?;
                let prepared: u64 = scrape
                    .lines()
                    .find_map(|l| {
                        l.strip_prefix(r#"nvidia_dra_requests_total{driver="gpu.nvidia.com",operation="prepare"} "#)
                    })
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                let missing: Vec<&str> = UPSTREAM_SERIES
                    .iter()
                    .filter(|series| !scrape.lines().any(|l| l.starts_with(*series)))
                    .copied()
                    .collect();
                if prepared >= 1 && missing.is_empty() {
                    Ok(Some(()))
                } else {
                    Err(anyhow::anyhow!("{prepared} prepares counted; missing {missing:?}"))
                }
            }),
        )
        .await
}

/// The admin-access claim of the DCGM exporter that holds `device` of `node`, if one does.
async fn exporter_claim_holding(
    cluster: &RealNodes,
    node: &str,
    device: &str,
) -> anyhow::Result<Option<String>> {
    let claims = Api::<ResourceClaim>::namespaced(cluster.client.clone(), OPERATOR_NS)
        .list(&ListParams::default())
        .await?;
    Ok(claims.items.into_iter().find_map(|c| {
        let name = c.metadata.name?;
        let results = c.status?.allocation?.devices?.results?;
        let admin = results.iter().all(|r| r.admin_access == Some(true));
        let holds = results.iter().any(|r| r.pool == node && r.device == device);
        (name.starts_with("nvidia-dcgm-exporter-dra") && admin && holds).then_some(name)
    }))
}

/// The plugin pod on `node`: its name and whether its `gpus` container is ready.
async fn plugin_state(cluster: &RealNodes, node: &str) -> anyhow::Result<(String, bool)> {
    let pod = cluster.plugin_pod(node).await?;
    Ok((
        pod.metadata.name.clone().unwrap_or_default(),
        plugin_ready(&pod),
    ))
}

#[tokio::test]
#[ignore = "needs real nodes: make test-real-nodes runs it"]
async fn a_plugin_pod_replaced_under_a_running_claim_keeps_it_and_unprepares_it_later()
-> anyhow::Result<()> {
    let cluster = RealNodes::connect().await?;
    const NAMES: &[&str] = &["held"];
    let _cleanup = cluster.cleanup(&[("pod", NAMES), ("resourceclaimtemplate", NAMES)]);
    let script = format!("{LIST_GPUS}; sleep 3600");
    cluster.apply(&GuidePod::new("held").on(H100_NODE).script(&script).yaml())?;
    let (uid, device) = cluster
        .step(
            "held runs on real-gpu-0; the exporter's admin-access claim also holds its GPU; the runtimes' CDI library resolves its device",
            H100_NODE,
            async {
                cluster.wait_running(&["held"], Duration::from_secs(120)).await?;
                let (uid, device) = cluster.claimed("held").await?;
                let exporter = exporter_claim_holding(&cluster, H100_NODE, &device).await?;
                ensure!(exporter.is_some(), "no admin-access exporter claim holds {device}");
                cluster.cdi_resolves(H100_NODE, &uid, &device)?;
                Ok((uid, device))
            },
        )
        .await?;
    let spec = cluster.claim_spec(H100_NODE, &uid);
    let (old, _) = plugin_state(&cluster, H100_NODE).await?;
    cluster.kubectl(
        &["-n", OPERATOR_NS, "delete", "pod", &old, "--wait=false"],
        None,
    )?;
    cluster
        .step(
            &format!("plugin pod {old} deleted under held's claim ({device}): a new one took over and published the 4 GPUs again; the CDI spec and the pod were kept"),
            H100_NODE,
            async {
                eventually(Duration::from_secs(120), "a new ready plugin pod", || async {
                    let (name, ready) = plugin_state(&cluster, H100_NODE).await?;
                    let gpus = gpus_published(&cluster, H100_NODE).await?;
                    if name != old && ready && gpus == 4 {
                        Ok(Some(()))
                    } else {
                        Err(anyhow::anyhow!("plugin pod {name} ready {ready}, {gpus} GPUs published"))
                    }
                })
                .await?;
                ensure!(spec.exists(), "{} is gone", spec.display());
                let pod = cluster.pod("held").await?.context("held is gone")?;
                let status = pod.status.unwrap_or_default();
                let restarts: i32 = status.container_statuses.iter().flatten().map(|c| c.restart_count).sum();
                ensure!(
                    status.phase.as_deref() == Some("Running") && restarts == 0,
                    "held is {:?} with {restarts} restarts",
                    status.phase
                );
                Ok(())
            },
        )
        .await?;
    cluster.delete("pod", NAMES)?;
    cluster
        .step(
            "the new plugin unprepared the claim once its pod was deleted: its CDI spec is gone",
            H100_NODE,
            gone(&spec, Duration::from_secs(90)),
        )
        .await
}

/// Waits until `path` is gone.
async fn gone(path: &Path, timeout: Duration) -> anyhow::Result<()> {
    eventually(timeout, &format!("{} to go", path.display()), || async {
        Ok((!path.exists()).then_some(()))
    })
    .await
}

/// What a MIG workload prints: its capability nodes, its `/dev/nvidia<minor>` nodes, its GPUs.
const MIG_SH: &str =
    "ls /dev/nvidia-caps; ls /dev | grep '^nvidia[0-9]'; nvidia-smi -L; sleep 3600";

/// A pod on one `mig.nvidia.com` device (any node: only the MIG node has them), which stays.
fn mig_pod(name: &str) -> String {
    GuidePod::new(name)
        .class("mig.nvidia.com")
        .script(MIG_SH)
        .yaml()
}

/// Waits until the MIG node holds no workload claim's CDI spec.
async fn no_mig_specs(cluster: &RealNodes) -> anyhow::Result<()> {
    cluster
        .step(
            "once their pods are deleted, the MIG claims' CDI specs are gone",
            MIG_NODE,
            eventually(
                Duration::from_secs(90),
                "no workload spec on real-gpu-2",
                || async {
                    let specs = cluster.workload_specs(MIG_NODE).await?;
                    if specs.is_empty() {
                        Ok(Some(()))
                    } else {
                        Err(anyhow::anyhow!("left: {specs:?}"))
                    }
                },
            ),
        )
        .await
}

#[tokio::test]
#[ignore = "needs real nodes: make test-real-nodes runs it"]
async fn a_mig_claim_gets_its_device_its_two_capability_nodes_and_its_parent_gpu()
-> anyhow::Result<()> {
    let cluster = RealNodes::connect().await?;
    const NAMES: &[&str] = &["mig-workload"];
    let cleanup = cluster.cleanup(&[("pod", NAMES), ("resourceclaimtemplate", NAMES)]);
    cluster.apply(&mig_pod("mig-workload"))?;
    cluster
        .step(
            "mig-workload on real-gpu-2: a MIG device with its 2 capability nodes and its parent GPU, from a spec the runtimes' CDI library resolves",
            MIG_NODE,
            async {
                cluster.wait_running(NAMES, Duration::from_secs(120)).await?;
                let (uid, device) = cluster.claimed("mig-workload").await?;
                cluster.cdi_resolves(MIG_NODE, &uid, &device)?;
                let node = cluster.jsonpath("pod", "mig-workload", Some(WORKLOAD_NS), "{.spec.nodeName}")?;
                ensure!(node == MIG_NODE, "mig-workload ran on {node}");
                let log = eventually(Duration::from_secs(30), "its listing", || async {
                    let log = cluster.logs("mig-workload", None).await?;
                    Ok(log.contains("GPU 0:").then_some(log))
                })
                .await?;
                let count = |prefix: &str| {
                    log.lines()
                        .filter(|l| l.strip_prefix(prefix).is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())))
                        .count()
                };
                ensure!(
                    count("nvidia-cap") == 2 && count("nvidia") == 1 && log.lines().any(|l| l.starts_with("GPU 0: NVIDIA A100")),
                    "mig-workload ({device}) saw: {log}"
                );
                Ok(())
            },
        )
        .await?;
    drop(cleanup);
    no_mig_specs(&cluster).await
}

/// The MIG node's capability files turned into FIFOs, each held open by a writer that never
/// writes: the plugin's read of one blocks its prepare until the plugin is killed. The files come
/// back (and the writers go) on [`HeldCapabilities::restore`] or when dropped.
struct HeldCapabilities {
    caps: PathBuf,
    saved: PathBuf,
    /// Made by the first writer whose FIFO the plugin opened.
    held: PathBuf,
    writers: Vec<Child>,
    restored: bool,
}

impl HeldCapabilities {
    fn hold(cluster: &RealNodes, node: &str) -> anyhow::Result<Self> {
        let caps = cluster
            .node_dir(node)
            .join("driver/proc/driver/nvidia/capabilities");
        let saved = cluster.env.cluster_dir.join("caps-saved");
        let held = cluster.env.cluster_dir.join("caps-held");
        let _ = std::fs::remove_dir_all(&saved);
        let _ = std::fs::remove_file(&held);
        shell(&["cp", "-a"], &[&caps, &saved])?;
        let mut this = Self {
            caps,
            saved,
            held,
            writers: Vec::new(),
            restored: false,
        };
        for access in access_files(&this.caps)? {
            std::fs::remove_file(&access)?;
            shell(&["mkfifo"], &[&access])?;
            let writer = Command::new("sh")
                .args(["-c", r#"exec 3>"$0" && touch "$1" && exec sleep 300"#])
                .arg(&access)
                .arg(&this.held)
                .spawn()?;
            this.writers.push(writer);
        }
        Ok(this)
    }

    /// Whether the plugin opened one of the FIFOs.
    fn holding(&self) -> bool {
        self.held.exists()
    }

    /// Puts the files back (a prepare blocked on a FIFO it opened stays blocked).
    fn restore(&mut self) -> anyhow::Result<()> {
        if !self.restored {
            std::fs::remove_dir_all(&self.caps)?;
            shell(&["cp", "-a"], &[&self.saved, &self.caps])?;
            self.restored = true;
        }
        Ok(())
    }

    /// Ends the writers.
    fn release(&mut self) {
        for writer in &mut self.writers {
            let _ = writer.kill();
            let _ = writer.wait();
        }
        self.writers.clear();
    }
}

impl Drop for HeldCapabilities {
    fn drop(&mut self) {
        self.release();
        if let Err(e) = self.restore() {
            eprintln!("restoring {}: {e:#}", self.caps.display());
        }
    }
}

/// Every file named `access` under `dir`.
fn access_files(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            found.extend(access_files(&path)?);
        } else if path.file_name().is_some_and(|n| n == "access") {
            found.push(path);
        }
    }
    Ok(found)
}

/// Runs `command` with `paths` appended; an error with its stderr when it fails.
fn shell(command: &[&str], paths: &[&Path]) -> anyhow::Result<()> {
    let out = Command::new(command[0])
        .args(&command[1..])
        .args(paths)
        .output()?;
    ensure!(
        out.status.success(),
        "{command:?} {paths:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

#[tokio::test]
#[ignore = "needs real nodes: make test-real-nodes runs it"]
async fn a_plugin_killed_mid_prepare_records_nothing_and_the_kubelets_retry_prepares_the_claim()
-> anyhow::Result<()> {
    let cluster = RealNodes::connect().await?;
    const NAMES: &[&str] = &["mig-first", "mig-crash"];
    let cleanup = cluster.cleanup(&[("pod", NAMES), ("resourceclaimtemplate", NAMES)]);
    cluster.apply(&mig_pod("mig-first"))?;
    let first = cluster
        .step(
            "a first MIG claim is prepared and its pod runs",
            MIG_NODE,
            async {
                cluster
                    .wait_running(&["mig-first"], Duration::from_secs(120))
                    .await?;
                Ok(cluster.claimed("mig-first").await?.0)
            },
        )
        .await?;
    // The second claim's prepare blocks after its devices are reserved and before its CDI spec
    // exists; then the plugin is SIGKILLed.
    let mut caps = HeldCapabilities::hold(&cluster, MIG_NODE)?;
    cluster.apply(&mig_pod("mig-crash"))?;
    let crashed = cluster
        .step(
            "the second MIG claim's prepare opened a held capability file",
            MIG_NODE,
            eventually(Duration::from_secs(90), "the prepare to hold", || async {
                if !caps.holding() {
                    return Ok(None);
                }
                Ok(Some(cluster.claimed("mig-crash").await?.0))
            }),
        )
        .await?;
    caps.restore()?;
    let recorded_before_kill = cluster.checkpointed(MIG_NODE, &crashed)?;
    cluster.kill_plugin(MIG_NODE).await?;
    caps.release();
    let crash_spec = cluster.claim_spec(MIG_NODE, &crashed);
    cluster
        .step(
            "nothing of the held prepare was written before the kill: no CDI spec, no checkpoint entry",
            MIG_NODE,
            async {
                ensure!(!crash_spec.exists(), "the held prepare wrote {}", crash_spec.display());
                ensure!(
                    recorded_before_kill.is_empty(),
                    "the held prepare was recorded ({recorded_before_kill}) before its CDI spec existed"
                );
                Ok(())
            },
        )
        .await?;
    cluster
        .step(
            "the kubelet's retry prepared the claim on the restarted plugin: both claims PrepareCompleted, one CDI spec each",
            MIG_NODE,
            async {
                cluster.wait_running(&["mig-crash"], Duration::from_secs(120)).await?;
                let states = (
                    cluster.checkpointed(MIG_NODE, &first)?,
                    cluster.checkpointed(MIG_NODE, &crashed)?,
                );
                ensure!(
                    states == ("PrepareCompleted".into(), "PrepareCompleted".into()),
                    "checkpoint states (first, crashed): {states:?}"
                );
                let specs = cluster.workload_specs(MIG_NODE).await?;
                let mut want: Vec<String> = [&first, &crashed]
                    .iter()
                    .map(|uid| format!("k8s.gpu.nvidia.com-claim_{uid}.yaml"))
                    .collect();
                want.sort();
                ensure!(specs == want, "CDI specs on {MIG_NODE}: {specs:?}, want {want:?}");
                Ok(())
            },
        )
        .await?;
    drop(cleanup);
    no_mig_specs(&cluster).await
}
