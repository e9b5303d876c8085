//! Driver upgrades the labeler runs (docs/upgrades.md), on the containerized driver the hot-plug
//! brought up on real-gpu-3 (so `hack/test/real-nodes.sh` runs it after `hotplug::`). The test
//! plays the driver container: a pod like a driver DaemonSet's, not ready while its driver loads,
//! announces a new driver with the safe-load annotation, waits until the labeler lets it load,
//! then replaces the driver (`hack/cluster upgrade-driver`) and becomes ready.
//! First under a running GPU Deployment: the node is cordoned and drained, the driver's clients
//! are gone before the driver may load, the new driver is proven by the validator, the plugin
//! republishes with the new `driverVersion`, the node comes back and the Deployment's pod runs
//! there again. Then two nodes asked at once with `maxUnavailable: 1`: never both out. Last a
//! driver that fails validation: the node fails, stays cordoned, the rollout stops and says so
//! (Events, the GPUCluster's status, the chart's alert in Prometheus); a working driver put in
//! place finishes it and the rollout goes on.

use anyhow::{bail, ensure};
use e2e::eventually;
use e2e::real_nodes::{
    GPULESS_NODE, L4_NODE, RealNodes, WORKLOAD_IMAGE, WORKLOAD_NS, readiness_of, ready_on,
};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

const STATE: &str = "nvidia.com/gpu-driver-upgrade-state";
const SAFE_LOAD: &str = "nvidia.com/gpu-driver-upgrade.driver-wait-for-safe-load";
const REQUESTED: &str = "nvidia.com/gpu-driver-upgrade-requested";
/// The states in which a node is out of service for its upgrade.
const OUT: [&str; 3] = [
    "drain-required",
    "pod-restart-required",
    "validation-required",
];

/// A Deployment whose one replica holds a GPU of the driver container's node.
fn app() -> String {
    format!(
        r#"apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {{name: drv-app, namespace: {WORKLOAD_NS}}}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly: {{deviceClassName: gpu.nvidia.com}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: drv-app, namespace: {WORKLOAD_NS}}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: drv-app}}}}
  template:
    metadata: {{labels: {{app: drv-app}}}}
    spec:
      terminationGracePeriodSeconds: 1
      nodeSelector: {{kubernetes.io/hostname: {GPULESS_NODE}}}
      resourceClaims: [{{name: gpu, resourceClaimTemplateName: drv-app}}]
      containers:
      - name: app
        image: {WORKLOAD_IMAGE}
        command: ["sh", "-c", "nvidia-smi -L; exec sleep 3600"]
        resources: {{claims: [{{name: gpu}}]}}
"#
    )
}

/// The driver container's pod on the node, as a driver DaemonSet's would be
/// (`app=nvidia-driver-daemonset`): ready while [`LOADED`] exists in the node's `/run/nvidia`, as
/// a driver container is once its driver is loaded.
fn driver_pod() -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: drv-driver, namespace: {WORKLOAD_NS}, labels: {{app: nvidia-driver-daemonset}}}}
spec:
  nodeName: {GPULESS_NODE}
  terminationGracePeriodSeconds: 1
  tolerations: [{{operator: Exists}}]
  containers:
  - name: driver
    image: {WORKLOAD_IMAGE}
    command: ["sleep", "3600"]
    readinessProbe:
      exec: {{command: [test, -f, /host-run-nvidia/{LOADED}]}}
      periodSeconds: 1
    volumeMounts: [{{name: run-nvidia, mountPath: /host-run-nvidia}}]
  volumes:
  - name: run-nvidia
    hostPath: {{path: /run/nvidia, type: Directory}}
"#
    )
}

/// The file in the node's `/run/nvidia` that makes the driver container's pod ready.
const LOADED: &str = "driver-container-loaded";

/// Marks the driver container's driver loaded (`true`) or not (its pod ready or not).
fn driver_loaded(cluster: &RealNodes, loaded: bool) -> anyhow::Result<()> {
    let path = cluster
        .node_dir(GPULESS_NODE)
        .join("run/nvidia")
        .join(LOADED);
    if loaded {
        std::fs::write(&path, "")?;
    } else if path.exists() {
        std::fs::remove_file(&path)?;
    }
    Ok(())
}

/// Whether the driver container's pod is ready.
async fn driver_pod_ready(cluster: &RealNodes) -> anyhow::Result<bool> {
    let pod = Api::<Pod>::namespaced(cluster.client.clone(), WORKLOAD_NS)
        .get("drv-driver")
        .await?;
    Ok(pod
        .status
        .iter()
        .flat_map(|s| s.conditions.iter().flatten())
        .any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// One look at a node: its upgrade state, whether it is cordoned, its annotations and labels.
struct Look {
    state: String,
    cordoned: bool,
    annotations: BTreeMap<String, String>,
    readiness: String,
    dra_driver: String,
}

async fn look(cluster: &RealNodes, node: &str) -> anyhow::Result<Look> {
    let n = Api::<Node>::all(cluster.client.clone()).get(node).await?;
    let labels = n.metadata.labels.clone().unwrap_or_default();
    Ok(Look {
        state: labels.get(STATE).cloned().unwrap_or_default(),
        cordoned: n.spec.as_ref().and_then(|s| s.unschedulable) == Some(true),
        annotations: n.metadata.annotations.clone().unwrap_or_default(),
        readiness: readiness_of(&n),
        dra_driver: labels
            .get("nvidia.com/gpu.deploy.dra-driver")
            .cloned()
            .unwrap_or_default(),
    })
}

/// Sets (`Some`) or removes (`None`) an annotation of `node`, as an admin or a driver container.
async fn annotate(
    cluster: &RealNodes,
    node: &str,
    key: &str,
    value: Option<&str>,
) -> anyhow::Result<()> {
    let patch = serde_json::json!({"metadata": {"annotations": {key: value}}});
    Api::<Node>::all(cluster.client.clone())
        .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// The driver's client pods (plugin, validator, DCGM, exporter) on `node` whose containers may
/// still run (a pod being deleted is Failed or Succeeded once they all stopped).
async fn clients(cluster: &RealNodes, node: &str) -> anyhow::Result<Vec<String>> {
    Ok(cluster
        .operand_pods(None, Some(node))
        .await?
        .into_iter()
        .filter(|p| {
            let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
            !matches!(phase, Some("Succeeded" | "Failed"))
        })
        .filter_map(|p| p.metadata.name)
        .filter(|n| {
            [
                "nvidia-dra-driver-kubelet-plugin",
                "nvidia-dra-validator",
                "nvidia-dcgm",
            ]
            .iter()
            .any(|c| n.starts_with(c))
        })
        .collect())
}

/// The Deployment's pods: `name phase node`, those not being deleted.
async fn app_pods(cluster: &RealNodes) -> anyhow::Result<Vec<(String, String)>> {
    let pods = Api::<Pod>::namespaced(cluster.client.clone(), WORKLOAD_NS)
        .list(&ListParams::default().labels("app=drv-app"))
        .await?;
    Ok(pods
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| {
            let phase = p
                .status
                .as_ref()
                .and_then(|s| s.phase.clone())
                .unwrap_or_default();
            (p.metadata.name.unwrap_or_default(), phase)
        })
        .collect())
}

/// The `driverVersion`s the node's plugin publishes.
async fn published_versions(cluster: &RealNodes, node: &str) -> anyhow::Result<Vec<String>> {
    Ok(cluster
        .published_devices(node)
        .await?
        .into_iter()
        .filter_map(|d| d.attributes?.get("driverVersion")?.version.clone())
        .collect())
}

/// The reasons of the labeler's Events on `node`.
fn event_reasons(cluster: &RealNodes, node: &str) -> anyhow::Result<BTreeSet<String>> {
    let out = cluster.kubectl(
        &[
            "get",
            "events",
            "-A",
            "--field-selector",
            &format!("involvedObject.kind=Node,involvedObject.name={node}"),
            "-o",
            "jsonpath={range .items[*]}{.reason}{\"\\n\"}{end}",
        ],
        None,
    )?;
    Ok(out.lines().map(str::to_owned).collect())
}

/// Plays a new driver container on `node`: its pod not ready, it announces a new driver and waits
/// until the labeler lets it load, checking that by then nothing holds the GPUs, the driver's
/// clients are gone and the node is cordoned (the labeler waits for the pod to be ready before it
/// brings the clients back); returns the states it saw on the way.
async fn wait_for_safe_load(cluster: &RealNodes, node: &str) -> anyhow::Result<Vec<String>> {
    driver_loaded(cluster, false)?;
    eventually(
        Duration::from_secs(30),
        "the driver pod not ready",
        || async { Ok((!driver_pod_ready(cluster).await?).then_some(())) },
    )
    .await?;
    annotate(cluster, node, SAFE_LOAD, Some("true")).await?;
    let seen: Mutex<Vec<String>> = Mutex::default();
    eventually(Duration::from_secs(240), "the driver let in", || {
        let seen = &seen;
        async move {
            let l = look(cluster, node).await?;
            {
                let mut seen = seen.lock().unwrap();
                if seen.last() != Some(&l.state) {
                    seen.push(l.state.clone());
                }
            }
            if l.annotations.contains_key(SAFE_LOAD) {
                return Ok(None);
            }
            // Let in: what holds now is the verdict, not something to wait for.
            let clients = clients(cluster, node).await?;
            let running: Vec<_> = app_pods(cluster)
                .await?
                .into_iter()
                .filter(|(_, phase)| phase == "Running")
                .collect();
            let verdict = if !(clients.is_empty() && running.is_empty() && l.cordoned) {
                Err(anyhow::anyhow!(
                    "the driver was let in with clients {clients:?}, GPU pods running {running:?}, cordoned {}",
                    l.cordoned
                ))
            } else if !(l.state == "pod-restart-required"
                && l.dra_driver == "paused-for-driver-upgrade")
            {
                Err(anyhow::anyhow!(
                    "let in at state {:?} with dra-driver={:?}",
                    l.state,
                    l.dra_driver
                ))
            } else {
                Ok(())
            };
            Ok(Some(verdict))
        }
    })
    .await??;
    Ok(seen.into_inner().unwrap())
}

#[tokio::test]
#[ignore = "needs real nodes: make test-real-nodes runs it after hotplug::"]
async fn driver_upgrades_drain_the_node_let_the_driver_load_and_prove_it() -> anyhow::Result<()> {
    let cluster = RealNodes::connect().await?;
    if published_versions(&cluster, GPULESS_NODE).await?.is_empty() {
        bail!("{GPULESS_NODE} has no driver container (hotplug:: brings it up): run after it");
    }
    let evict = cluster
        .edit_gpu_cluster(&[("migration.drain", serde_json::json!("evict"))])
        .await?;
    driver_loaded(&cluster, true)?;
    cluster.apply(&driver_pod())?;
    cluster.apply(&app())?;
    let result = scenario(&cluster).await;
    cluster.delete("pod", &["drv-driver"])?;
    driver_loaded(&cluster, false)?;
    evict.undo().await?;
    cluster.delete("deployment", &["drv-app"])?;
    cluster.delete("resourceclaimtemplate", &["drv-app"])?;
    result
}

async fn scenario(cluster: &RealNodes) -> anyhow::Result<()> {
    let node = GPULESS_NODE;
    let first = cluster
        .step(
            "the GPU Deployment's pod running on the driver container's node, the driver container's pod ready",
            node,
            eventually(Duration::from_secs(120), "drv-app running", || async {
                let pods = app_pods(cluster).await?;
                let driver = driver_pod_ready(cluster).await?;
                match pods.as_slice() {
                    [(name, phase)] if phase == "Running" && driver => Ok(Some(name.clone())),
                    _ => Err(anyhow::anyhow!("drv-app pods: {pods:?}; driver pod ready {driver}")),
                }
            }),
        )
        .await?;
    let seen = cluster
        .step(
            "a driver waiting to load (safe-load annotation): the node is cordoned, the pod evicted, the plugin, validator and exporter paused and gone before the driver is let in",
            node,
            wait_for_safe_load(cluster, node),
        )
        .await?;
    ensure!(
        seen.iter().any(|s| s == "drain-required"),
        "states seen before the driver was let in: {seen:?}"
    );
    cluster.upgrade_driver(node, "595.45.04", false)?;
    driver_loaded(cluster, true)?;
    cluster
        .step(
            "driver 595.45.04 loaded, its pod ready: the validator proves it, the plugin publishes driverVersion 595.45.4, the node is uncordoned (upgrade-done) and the Deployment's new pod runs there",
            node,
            eventually(Duration::from_secs(240), "the upgrade done", || async {
                let l = look(cluster, node).await?;
                let versions = published_versions(cluster, node).await?;
                let pods = app_pods(cluster).await?;
                let running = matches!(pods.as_slice(), [(name, phase)] if phase == "Running" && *name != first);
                if l.state == "upgrade-done"
                    && l.readiness == ready_on("dra")
                    && l.dra_driver == "true"
                    && versions == ["595.45.4"]
                    && running
                    && !l.annotations.contains_key("gpu-operator-rs.dev/driver-upgrade")
                {
                    Ok(Some(()))
                } else {
                    Err(anyhow::anyhow!(
                        "state {:?}, {}, dra-driver={:?}, published {versions:?}, pods {pods:?}",
                        l.state,
                        l.readiness,
                        l.dra_driver
                    ))
                }
            }),
        )
        .await?;
    let reasons = event_reasons(cluster, node)?;
    for reason in [
        "DriverUpgradeStarted",
        "DriverClientsPaused",
        "DriverLoadUnblocked",
        "DriverClientsResumed",
        "DriverUpgradeDone",
    ] {
        ensure!(
            reasons.contains(reason),
            "no {reason} Event on {node}: {reasons:?}"
        );
    }

    two_nodes_never_both_out(cluster).await?;
    a_driver_failing_validation_stops_the_rollout(cluster).await
}

/// Both nodes asked for an upgrade at once (`nvidia.com/gpu-driver-upgrade-requested`), with
/// `migration.maxUnavailable: 1`: one waits (`upgrade-required`) while the other is out.
async fn two_nodes_never_both_out(cluster: &RealNodes) -> anyhow::Result<()> {
    let nodes = [GPULESS_NODE, L4_NODE];
    for node in nodes {
        annotate(cluster, node, REQUESTED, Some("true")).await?;
    }
    let both_out: Mutex<Option<Vec<String>>> = Mutex::default();
    let queued = AtomicBool::new(false);
    cluster
        .step(
            "both nodes asked at once with maxUnavailable 1: one at a time, the other waits as upgrade-required; both end upgrade-done, uncordoned, ready, the requests consumed",
            L4_NODE,
            eventually(Duration::from_secs(300), "both upgraded", || {
                let (both_out, queued) = (&both_out, &queued);
                async move {
                    let mut out = 0;
                    let mut done = 0;
                    let mut states = Vec::new();
                    for node in nodes {
                        let l = look(cluster, node).await?;
                        out += usize::from(OUT.contains(&l.state.as_str()) || l.cordoned);
                        if l.state == "upgrade-required" {
                            queued.store(true, Ordering::Relaxed);
                        }
                        done += usize::from(
                            l.state == "upgrade-done"
                                && l.readiness == ready_on("dra")
                                && !l.annotations.contains_key(REQUESTED),
                        );
                        states.push(format!("{node}: {} {}", l.state, l.readiness));
                    }
                    if out > 1 {
                        both_out.lock().unwrap().get_or_insert(states.clone());
                    }
                    if done == nodes.len() {
                        Ok(Some(()))
                    } else {
                        Err(anyhow::anyhow!("{states:?}"))
                    }
                }
            }),
        )
        .await?;
    if let Some(states) = both_out.into_inner().unwrap() {
        bail!("both nodes were out at once: {states:?}");
    }
    ensure!(
        queued.into_inner(),
        "neither node was seen waiting as upgrade-required"
    );
    Ok(())
}

/// A driver that fails validation: past `progressDeadlineSeconds` the node fails, stays cordoned,
/// says why (Event, GPUCluster status), and the other node's requested upgrade waits; a working
/// driver put in place completes it and the rollout goes on.
async fn a_driver_failing_validation_stops_the_rollout(cluster: &RealNodes) -> anyhow::Result<()> {
    let node = GPULESS_NODE;
    let deadline = cluster
        .edit_gpu_cluster(&[("migration.progressDeadlineSeconds", serde_json::json!(30))])
        .await?;
    let result = async {
        cluster
            .step(
                "another driver waiting to load on the node: let in once the node is drained and its clients gone",
                node,
                wait_for_safe_load(cluster, node),
            )
            .await?;
        cluster.upgrade_driver(node, "595.58.03", true)?;
        driver_loaded(cluster, true)?;
        annotate(cluster, L4_NODE, REQUESTED, Some("true")).await?;
        cluster
            .step(
                "the new driver cannot be loaded: 30s on, upgrade-failed, the node still cordoned, a DriverUpgradeFailed Event and the GPUCluster's status say why; the other node's upgrade waits as upgrade-required with a DriverUpgradeRolloutStopped Event",
                node,
                eventually(Duration::from_secs(180), "the upgrade failed", || async {
                    let l = look(cluster, node).await?;
                    let other = look(cluster, L4_NODE).await?;
                    let status = cluster.kubectl(
                        &[
                            "get",
                            "gpucluster",
                            "gpu-cluster",
                            "-o",
                            "jsonpath={range .status.migration.driverUpgrades[*]}{.node} {.state}: {.reason}{\"\\n\"}{end}",
                        ],
                        None,
                    )?;
                    let reasons = event_reasons(cluster, node)?;
                    let other_reasons = event_reasons(cluster, L4_NODE)?;
                    if l.state == "upgrade-failed"
                        && l.cordoned
                        && reasons.contains("DriverUpgradeFailed")
                        && status.contains(&format!("{node} upgrade-failed: the validator did not pass within 30s"))
                        && other.state == "upgrade-required"
                        && !other.cordoned
                        && other_reasons.contains("DriverUpgradeRolloutStopped")
                    {
                        Ok(Some(()))
                    } else {
                        Err(anyhow::anyhow!(
                            "{node}: {:?} cordoned {}; {L4_NODE}: {:?}; status {status:?}",
                            l.state,
                            l.cordoned,
                            other.state
                        ))
                    }
                }),
            )
            .await?;
        let prometheus = cluster.prometheus()?;
        cluster
            .step(
                "Prometheus: the chart's GPUDriverUpgradeFailed alert fires for the node",
                node,
                prometheus.wait_alert("GPUDriverUpgradeFailed", node, true, Duration::from_secs(120)),
            )
            .await?;
        cluster.upgrade_driver(node, "595.58.03", false)?;
        cluster
            .step(
                "a working 595.58.03 put in place: the validator passes, the failed node finishes (upgrade-done, uncordoned, ready) and the rollout goes on to the other node",
                node,
                eventually(Duration::from_secs(480), "the rollout finished", || async {
                    let l = look(cluster, node).await?;
                    let other = look(cluster, L4_NODE).await?;
                    let versions = published_versions(cluster, node).await?;
                    if l.state == "upgrade-done"
                        && l.readiness == ready_on("dra")
                        && versions == ["595.58.3"]
                        && other.state == "upgrade-done"
                        && other.readiness == ready_on("dra")
                    {
                        Ok(Some(()))
                    } else {
                        Err(anyhow::anyhow!(
                            "{node}: {:?} {} published {versions:?}; {L4_NODE}: {:?} {}",
                            l.state,
                            l.readiness,
                            other.state,
                            other.readiness
                        ))
                    }
                }),
            )
            .await?;
        cluster
            .step(
                "Prometheus: GPUDriverUpgradeFailed resolves",
                node,
                prometheus.wait_alert("GPUDriverUpgradeFailed", node, false, Duration::from_secs(120)),
            )
            .await
    }
    .await;
    deadline.undo().await?;
    result?;
    Ok(())
}
