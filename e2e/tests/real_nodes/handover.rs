//! Node-by-node hand-over under a workload (docs/migration.md): both DRA-capable GPU nodes of a
//! 2-replica Deployment with a PodDisruptionBudget go to the device plugin and back with
//! `migration.drain: evict`. The labeler moves them one at a time (cordon, evict through the PDB,
//! switch, wait for the plane's validator, uncordon); the replicas ask `nvidia.com/gpu: 1`, which
//! either plane serves, and one keeps running throughout. It runs before `plugin::` restarts
//! real-gpu-0's kubelet: a kubelet restarted after a device-plugin period refuses pods asking
//! `nvidia.com/gpu` through the DeviceClass mapping (docs/migration.md), so run alone after it, it
//! fails waiting for both replicas.

use e2e::real_nodes::{
    H100_NODE, L4_NODE, RealNodes, WORKLOAD_IMAGE, WORKLOAD_NS, readiness_of, ready_on,
};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};
use std::collections::{BTreeMap, BTreeSet};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// The nodes handed over.
const NODES: [&str; 2] = [H100_NODE, L4_NODE];

/// The Deployment (and its PDB) whose replicas hold a GPU on either node.
fn app() -> String {
    format!(
        r#"apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {{name: gpu-app, namespace: {WORKLOAD_NS}}}
spec:
  maxUnavailable: 1
  selector: {{matchLabels: {{app: gpu-app}}}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: gpu-app, namespace: {WORKLOAD_NS}}}
spec:
  replicas: 2
  selector: {{matchLabels: {{app: gpu-app}}}}
  template:
    metadata: {{labels: {{app: gpu-app}}}}
    spec:
      terminationGracePeriodSeconds: 1
      affinity:
        nodeAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            nodeSelectorTerms:
            - matchExpressions: [{{key: kubernetes.io/hostname, operator: In, values: [{H100_NODE}, {L4_NODE}]}}]
      containers:
      - name: app
        image: {WORKLOAD_IMAGE}
        command: ["sh", "-c", "nvidia-smi -L; exec sleep 3600"]
        resources: {{limits: {{nvidia.com/gpu: 1}}}}
"#
    )
}

/// What one sample of the cluster shows during a hand-over.
#[derive(Debug, Default)]
struct Sample {
    /// The replicas running and not being deleted (an evicted pod runs while it terminates).
    running: BTreeSet<String>,
    /// The nodes in a hand-over (draining or waiting for the new plane).
    moving: BTreeSet<String>,
    /// The nodes with both planes' plugin labels at once.
    both_planes: BTreeSet<String>,
    /// The nodes ready on the target mode and uncordoned.
    ready: BTreeSet<String>,
}

/// Reads one sample: `mode` is the plane the nodes go to.
async fn sample(cluster: &RealNodes, mode: &str) -> anyhow::Result<Sample> {
    let mut sample = Sample::default();
    let pods = Api::<Pod>::namespaced(cluster.client.clone(), WORKLOAD_NS)
        .list(&ListParams::default().labels("app=gpu-app"))
        .await?;
    sample.running = pods
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .filter_map(|p| p.metadata.name)
        .collect();
    let nodes = Api::<Node>::all(cluster.client.clone());
    for name in NODES {
        let node = nodes.get(name).await?;
        let labels = node.metadata.labels.clone().unwrap_or_default();
        let annotations = node.metadata.annotations.clone().unwrap_or_default();
        let label = |key: &str| labels.get(key).is_some_and(|v| !v.is_empty());
        let handover = annotations
            .get("gpu-operator-rs.dev/plane-handover")
            .map(String::as_str)
            .unwrap_or_default();
        if handover.contains(r#""phase":"Draining""#)
            || handover.contains(r#""phase":"WaitingForPlane""#)
        {
            sample.moving.insert(name.to_owned());
        }
        if label("nvidia.com/gpu.deploy.dra-driver") && label("nvidia.com/gpu.deploy.device-plugin")
        {
            sample.both_planes.insert(name.to_owned());
        }
        if readiness_of(&node) == ready_on(mode) {
            sample.ready.insert(name.to_owned());
        }
    }
    Ok(sample)
}

/// What a whole hand-over showed, sampled every second.
#[derive(Debug, Default)]
struct Watched {
    fewest_running: usize,
    most_moving: usize,
    both_planes_seen: BTreeSet<String>,
    /// Per node: seconds after the label change to its first sample in a hand-over, and to its
    /// first sample ready on the new plane after that.
    began: BTreeMap<String, u64>,
    ended: BTreeMap<String, u64>,
    seconds: u64,
    replaced: usize,
    /// What `kubectl gpu migration --watch`, started with the label change, printed.
    watch_output: String,
}

/// Sets both nodes to `mode` and samples every second until both are ready on it with 2 replicas
/// running (at most 420 s); what it saw.
async fn hand_over(
    cluster: &RealNodes,
    guard: &e2e::real_nodes::ModeGuard<'_>,
    mode: &str,
) -> anyhow::Result<Watched> {
    let before = sample(cluster, mode).await?.running;
    guard.switch(mode)?;
    let start = Instant::now();
    let mut watch = Watch(Some(
        cluster
            .kubectl_gpu_command(&[
                "migration",
                "--watch",
                "--interval",
                "1s",
                "--timeout",
                "450s",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?,
    ));
    let mut watched = Watched {
        fewest_running: 2,
        ..Watched::default()
    };
    loop {
        let now = sample(cluster, mode).await?;
        let at = start.elapsed().as_secs();
        watched.fewest_running = watched.fewest_running.min(now.running.len());
        watched.most_moving = watched.most_moving.max(now.moving.len());
        watched
            .both_planes_seen
            .extend(now.both_planes.iter().cloned());
        for node in &now.moving {
            watched.began.entry(node.clone()).or_insert(at);
        }
        for node in &now.ready {
            if watched.began.contains_key(node) {
                watched.ended.entry(node.clone()).or_insert(at);
            }
        }
        if now.ready.len() == NODES.len() && now.running.len() == 2 {
            watched.seconds = at;
            watched.replaced = before.difference(&now.running).count();
            watched.watch_output = watch_ended(watch.0.take().expect("started")).await?;
            return Ok(watched);
        }
        anyhow::ensure!(
            at < 420,
            "not done after {at}s: {now:?}; so far {watched:?}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// A running `kubectl gpu migration --watch`, stopped if the scenario fails before it ends.
struct Watch(Option<Child>);

impl Drop for Watch {
    fn drop(&mut self) {
        if let Some(child) = self.0.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// What `kubectl gpu migration --watch` printed once it ended on its own (the migration complete)
/// within 30 s; an error with its output otherwise.
async fn watch_ended(mut watch: Child) -> anyhow::Result<String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while watch.try_wait()?.is_none() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    if watch.try_wait()?.is_none() {
        watch.kill()?;
    }
    let out = watch.wait_with_output()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    anyhow::ensure!(
        out.status.success(),
        "kubectl gpu migration --watch did not end with the migration ({}): {text}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(text)
}

/// Whether the watch showed `node` handing over to `mode` and ended with every GPU node served by
/// the plane it wants.
fn watch_showed(output: &str, node: &str, mode: &str) -> bool {
    let handing_over = output.lines().any(|l| {
        let cols: Vec<&str> = l.split_whitespace().collect();
        cols.first() == Some(&node)
            && cols.get(2) == Some(&mode)
            && (l.contains("draining") || l.contains("waiting for plane"))
    });
    let last = output.lines().last().unwrap_or_default();
    handing_over
        && last.contains("GPU nodes served by the plane they want")
        && last.contains("the migration is complete")
}

#[tokio::test]
#[ignore = "needs real nodes: make test-real-nodes runs it"]
async fn both_gpu_nodes_move_between_planes_one_at_a_time_under_a_pdb_and_a_replica_keeps_running()
-> anyhow::Result<()> {
    let cluster = RealNodes::connect().await?;
    let _app = cluster.cleanup(&[
        ("deployment", &["gpu-app"]),
        ("poddisruptionbudget", &["gpu-app"]),
    ]);
    let _evict = cluster
        .edit_gpu_cluster(&[("migration.drain", "evict".into())])
        .await?;
    cluster.apply(&app())?;
    cluster
        .step("both replicas of gpu-app run", H100_NODE, async {
            e2e::eventually(Duration::from_secs(180), "2 replicas running", || async {
                let running = sample(&cluster, "dra").await?.running;
                Ok((running.len() == 2).then_some(()))
            })
            .await
        })
        .await?;
    let guard = cluster.switch_mode(&NODES, "dra").await?;
    for mode in ["device-plugin", "dra"] {
        let watched = cluster
            .step(
                &format!("both nodes handed over to {mode}, one at a time, a replica running throughout, never both planes on a node, both replicas evicted and replaced; kubectl gpu migration --watch showed each node's hand-over and ended when both were done"),
                H100_NODE,
                async {
                    let watched = hand_over(&cluster, &guard, mode).await?;
                    anyhow::ensure!(
                        watched.fewest_running >= 1
                            && watched.most_moving == 1
                            && watched.both_planes_seen.is_empty()
                            && watched.replaced == 2,
                        "{watched:?}"
                    );
                    anyhow::ensure!(
                        NODES.iter().all(|n| watch_showed(&watched.watch_output, n, mode)),
                        "kubectl gpu migration --watch printed:\n{}",
                        watched.watch_output
                    );
                    eprintln!("{}", watched.watch_output);
                    Ok(watched)
                },
            )
            .await?;
        eprintln!(
            "     to {mode} in {}s (per node, seconds after the label change from its hand-over's start to ready: {:?} .. {:?}); at least {} running, at most {} moving",
            watched.seconds,
            watched.began,
            watched.ended,
            watched.fewest_running,
            watched.most_moving
        );
    }
    guard.restore(&[4, 2]).await
}
