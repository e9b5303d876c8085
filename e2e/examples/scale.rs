//! Scale run (`make bench-scale`): N fake GPU nodes and N/10 CPU nodes on the local cluster; times
//! the labeler's convergence and measures labeler and operator memory and API writes at that size.
//!
//! Nodes are created without KWOK (no heartbeats) and tainted so DaemonSets schedule nothing: the
//! run measures our controllers, not the cluster's pod churn. Before the labeler starts, a raw
//! writer patches one label onto every GPU node with the labeler's concurrency: the apiserver's own
//! limit for the same writes on the same cluster, beside which the labeler's write phase is read.
//! Prints a Markdown table row.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use api::contract::labels as l;
use e2e::{Env, eventually, install_crd, metric};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::api::{DeleteParams, ListParams, PartialObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;

fn node(name: &str, gpu: bool) -> Node {
    let mut labels = BTreeMap::from([("bench".to_string(), "scale".to_string())]);
    if gpu {
        labels.insert(
            "feature.node.kubernetes.io/pci-10de.present".into(),
            "true".into(),
        );
    }
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels},
        "spec": {"taints": [{"key": "bench", "value": "scale", "effect": "NoSchedule"}]}
    }))
    .unwrap()
}

/// How many of the run's nodes carry `label=true`.
async fn carrying(nodes: &Api<PartialObjectMeta<Node>>, label: &str) -> anyhow::Result<usize> {
    let list = nodes
        .list_metadata(&ListParams::default().labels("bench=scale"))
        .await?;
    Ok(list
        .items
        .iter()
        .filter(|n| n.labels().get(label).map(String::as_str) == Some("true"))
        .count())
}

/// The labeler's reconcile concurrency: the raw writer keeps as many writes in flight.
const WRITERS: usize = 16;

/// Patches a label onto every GPU node, `WRITERS` at a time, unguarded: how long the apiserver
/// takes for as many writes as the labeler makes, with no planning and no conflicts. Timed as the
/// labeler is, until a 200 ms poll of the nodes sees every one written, so the poll's own load on
/// the apiserver is in both figures.
async fn raw_writes(
    nodes: &Api<PartialObjectMeta<Node>>,
    count: usize,
) -> anyhow::Result<Duration> {
    let start = Instant::now();
    let body = json!({"metadata": {"labels": {RAW_LABEL: "true"}}});
    let writes = futures::stream::iter(0..count)
        .map(|i| {
            let (nodes, body) = (nodes.clone(), &body);
            async move {
                nodes
                    .patch_metadata(
                        &format!("scale-gpu-{i:05}"),
                        &PatchParams::default(),
                        &Patch::Merge(body),
                    )
                    .await
                    .map(|_| ())
            }
        })
        .buffer_unordered(WRITERS)
        .try_collect::<Vec<_>>();
    let seen = eventually(
        Duration::from_secs(600),
        "every GPU node written",
        || async { Ok((carrying(nodes, RAW_LABEL).await? == count).then_some(())) },
    );
    let (written, seen) = futures::join!(writes, seen);
    written?;
    seen?;
    Ok(start.elapsed())
}

/// The label the raw writer sets.
const RAW_LABEL: &str = "bench/raw-writer";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let count: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1000);
    let env = Env::from_env()?;
    let client = env.client().await?;
    install_crd(&client).await?;
    let apply = PatchParams::apply("bench").force();
    Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .patch("gpu-operator", &apply, &Patch::Apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gpu-operator"}})))
        .await?;
    Api::<api::GPUCluster>::all(client.clone())
        .patch("gpu-cluster", &apply, &Patch::Apply(json!({"apiVersion": "nvidia.com/v1alpha1", "kind": "GPUCluster", "metadata": {"name": "gpu-cluster"}, "spec": {}})))
        .await?;

    let typed: Api<Node> = Api::all(client.clone());
    let started = Instant::now();
    let names: Vec<(String, bool)> = (0..count)
        .map(|i| (format!("scale-gpu-{i:05}"), true))
        .chain((0..count / 10).map(|i| (format!("scale-cpu-{i:05}"), false)))
        .collect();
    futures::stream::iter(names.iter())
        .map(|(name, gpu)| {
            let typed = typed.clone();
            async move {
                typed
                    .create(&PostParams::default(), &node(name, *gpu))
                    .await
                    .map(|_| ())
            }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<_>>()
        .await?;
    eprintln!(
        "scale: created {} nodes in {:.1}s",
        names.len(),
        started.elapsed().as_secs_f64()
    );

    let nodes: Api<PartialObjectMeta<Node>> = Api::all(client.clone());
    let raw = raw_writes(&nodes, count).await?;
    let start = Instant::now();
    let labeler = env.spawn(
        "node-labeler",
        "scale-node-labeler",
        &[
            ("HTTP_ENDPOINT", "127.0.0.1:18281"),
            ("LEADER_ELECT", "false"),
            ("DEFAULT_GPU_ALLOCATION_MODE", "dra"),
        ],
    )?;
    eventually(
        Duration::from_secs(600),
        "every GPU node labelled",
        || async { Ok((carrying(&nodes, l::DEPLOY_DRA_DRIVER).await? == count).then_some(())) },
    )
    .await?;
    let converge = start.elapsed();
    let labeler_rss = labeler.rss_kib().unwrap_or_default();
    let writes = metric("127.0.0.1:18281", "node_labeler_node_writes_total").await?;
    let conflicts = metric(
        "127.0.0.1:18281",
        r#"node_labeler_errors_total{error="conflict"}"#,
    )
    .await
    .unwrap_or(0.0);

    let operator = env.spawn(
        "gpu-operator",
        "scale-gpu-operator",
        &[
            ("HTTP_ENDPOINT", "127.0.0.1:18282"),
            ("LEADER_ELECT", "false"),
            ("OPERATOR_NAMESPACE", "gpu-operator"),
        ],
    )?;
    eventually(
        Duration::from_secs(120),
        "the operator's first status",
        || async {
            let gc = Api::<api::GPUCluster>::all(client.clone())
                .get("gpu-cluster")
                .await?;
            Ok(gc
                .status
                .and_then(|s| s.nodes)
                .filter(|n| n.gpu as usize >= count)
                .map(|_| ()))
        },
    )
    .await?;
    let idle = Duration::from_secs(
        std::env::var("BENCH_IDLE_SECONDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(60),
    );
    let counters = [
        "gpu_operator_applies_total",
        "gpu_operator_status_writes_total",
        "gpu_operator_deletes_total",
    ];
    let mut before = Vec::new();
    for c in counters {
        before.push(metric("127.0.0.1:18282", c).await?);
    }
    let labeler_before = metric("127.0.0.1:18281", "node_labeler_node_writes_total").await?;
    tokio::time::sleep(idle).await;
    let labeler_idle =
        metric("127.0.0.1:18281", "node_labeler_node_writes_total").await? - labeler_before;
    let mut operator_idle = 0.0;
    for (c, b) in counters.iter().zip(&before) {
        operator_idle += metric("127.0.0.1:18282", c).await? - b;
    }
    let idle_writes = format!("labeler {labeler_idle}, operator {operator_idle}");
    println!(
        "| {count} GPU + {} CPU nodes | {:.1} s | {:.1} s | {writes} ({conflicts} conflicts) | {:.1} MiB | {:.1} MiB | {idle_writes} in {} s |",
        count / 10,
        raw.as_secs_f64(),
        converge.as_secs_f64(),
        labeler_rss as f64 / 1024.0,
        operator.rss_kib().unwrap_or_default() as f64 / 1024.0,
        idle.as_secs()
    );
    typed
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels("bench=scale"),
        )
        .await?;
    Ok(())
}
