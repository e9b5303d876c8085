//! The node labeler on the local cluster: 200 GPU and 20 CPU nodes converge with one write per GPU
//! node, idle means no writes, a new node is labelled promptly, and switching a node with a GPU claim
//! away from DRA keeps the plugin's label until the claim's pod is gone.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context;
use api::contract::labels as l;
use e2e::{Env, eventually, install_crd, metric};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Event, Namespace, Node, Pod};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;

const GPU_NODES: usize = 200;
const CPU_NODES: usize = 20;
const METRICS: &str = "127.0.0.1:18081";
const WRITES: &str = "node_labeler_node_writes_total";
const NS: &str = "e2e-labeler";

fn node(name: &str, gpu: bool) -> Node {
    let mut labels = BTreeMap::from([
        ("kubernetes.io/hostname".to_string(), name.to_string()),
        ("type".to_string(), "kwok".to_string()),
        ("e2e".to_string(), "node-labeler".to_string()),
    ]);
    if gpu {
        labels.insert(
            "feature.node.kubernetes.io/pci-10de.present".into(),
            "true".into(),
        );
        labels.insert(l::GPU_PRODUCT.into(), "NVIDIA-A100-SXM4-40GB".into());
    }
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels,
                     "annotations": {"kwok.x-k8s.io/node": "fake"}},
        "status": {"allocatable": {"cpu": "64", "memory": "256Gi", "pods": "110"},
                   "capacity": {"cpu": "64", "memory": "256Gi", "pods": "110"}}
    }))
    .unwrap()
}

fn has_dra_plane(node: &Node) -> bool {
    let labels = node.labels();
    labels.get(l::ALLOCATION_MODE).map(String::as_str) == Some("dra")
        && l::DRA_PLANE_KEYS
            .iter()
            .all(|k| labels.get(*k).map(String::as_str) == Some("true"))
}

#[tokio::test]
#[ignore = "needs the local cluster: make test-e2e runs it"]
async fn node_labeler_on_the_local_cluster() -> anyhow::Result<()> {
    let env = Env::from_env()?;
    let client = env.client().await?;
    install_crd(&client).await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let apply = PatchParams::apply("e2e").force();
    namespaces
        .patch(
            NS,
            &apply,
            &Patch::Apply(
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}),
            ),
        )
        .await?;
    let gcs: Api<api::GPUCluster> = Api::all(client.clone());
    gcs.patch(
        "gpu-cluster",
        &apply,
        &Patch::Apply(
            json!({"apiVersion": "nvidia.com/v1alpha1", "kind": "GPUCluster",
                             "metadata": {"name": "gpu-cluster"},
                             // The switch below waits for its pod (drain: wait); no validator
                             // runs here, so hand-overs never finish and must not queue.
                             "spec": {"migration": {"drain": "wait", "maxUnavailable": 1000}}}),
        ),
    )
    .await?;

    let names: Vec<(String, bool)> = (0..GPU_NODES)
        .map(|i| (format!("lab-gpu-{i:03}"), true))
        .chain((0..CPU_NODES).map(|i| (format!("lab-cpu-{i:02}"), false)))
        .collect();
    futures::stream::iter(names.iter())
        .map(|(name, gpu)| {
            let nodes = nodes.clone();
            async move {
                match nodes
                    .create(&PostParams::default(), &node(name, *gpu))
                    .await
                {
                    Ok(_) => Ok(()),
                    Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
                    Err(e) => Err(e),
                }
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await?;

    // Nodes earlier tests left converged need no write; every other GPU node needs exactly one.
    let needing_a_write = nodes
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|n| api_is_gpu(n) && !has_dra_plane(n))
        .count();
    let start = Instant::now();
    let labeler = env.spawn(
        "node-labeler",
        "node-labeler",
        &[
            ("HTTP_ENDPOINT", METRICS),
            ("POD_NAMESPACE", NS),
            ("POD_NAME", "labeler-e2e"),
            // The install guide's flag: unset, new GPU nodes would go to the device-plugin plane,
            // which the GPUCluster serves too.
            ("DEFAULT_GPU_ALLOCATION_MODE", "dra"),
        ],
    )?;
    let gpu_node_count = eventually(
        Duration::from_secs(120),
        "every GPU node to carry the DRA plane",
        || {
            let nodes = nodes.clone();
            async move {
                let all = nodes.list(&ListParams::default()).await?;
                let gpu: Vec<&Node> = all.items.iter().filter(|n| api_is_gpu(n)).collect();
                Ok(gpu.iter().all(|n| has_dra_plane(n)).then_some(gpu.len()))
            }
        },
    )
    .await
    .with_context(|| labeler.log_tail())?;
    let converge = start.elapsed();

    let cpu = nodes
        .list(&ListParams::default().labels("e2e=node-labeler"))
        .await?;
    for n in cpu.items.iter().filter(|n| !api_is_gpu(n)) {
        let ours: Vec<&String> = n
            .labels()
            .keys()
            .filter(|k| k.starts_with("nvidia.com/"))
            .collect();
        assert!(ours.is_empty(), "CPU node {} got {ours:?}", n.name_any());
    }
    let writes = metric(METRICS, WRITES).await?;
    assert_eq!(
        writes as usize, needing_a_write,
        "one write per GPU node that needed one"
    );
    eprintln!(
        "labeler: {gpu_node_count} GPU nodes converged in {:.1}s with {writes} writes; RSS {} KiB",
        converge.as_secs_f64(),
        labeler.rss_kib().unwrap_or_default()
    );

    tokio::time::sleep(Duration::from_secs(15)).await;
    assert_eq!(metric(METRICS, WRITES).await?, writes, "writes while idle");

    let added = Instant::now();
    nodes
        .create(&PostParams::default(), &node("lab-gpu-new", true))
        .await?;
    eventually(
        Duration::from_secs(30),
        "the new GPU node to be labelled",
        || {
            let nodes = nodes.clone();
            async move { Ok(has_dra_plane(&nodes.get("lab-gpu-new").await?).then_some(())) }
        },
    )
    .await?;
    eprintln!(
        "labeler: a new GPU node was labelled {:.2}s after it was created",
        added.elapsed().as_secs_f64()
    );

    deferred_switch(&client, &nodes)
        .await
        .with_context(|| labeler.log_tail())?;

    for (name, _) in &names {
        let _ = nodes.delete(name, &DeleteParams::default()).await;
    }
    let _ = nodes.delete("lab-gpu-new", &DeleteParams::default()).await;
    let _ = namespaces.delete(NS, &DeleteParams::default()).await;
    let _ = gcs.delete("gpu-cluster", &DeleteParams::default()).await;
    Ok(())
}

fn api_is_gpu(n: &Node) -> bool {
    l::NFD_GPU_LABELS
        .iter()
        .any(|k| n.labels().get(*k).map(String::as_str) == Some("true"))
}

/// A pod with an allocated gpu.nvidia.com claim on `lab-gpu-000`, then the node is switched to
/// device-plugin: consumers' labels go at once, `dra-driver` only after the pod is deleted.
async fn deferred_switch(client: &kube::Client, nodes: &Api<Node>) -> anyhow::Result<()> {
    let node = "lab-gpu-000";
    let apply = PatchParams::apply("e2e").force();
    let classes: Api<DeviceClass> = Api::all(client.clone());
    classes
        .patch("e2e-gpu.nvidia.com", &apply, &Patch::Apply(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": "e2e-gpu.nvidia.com"},
            "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}]}})))
        .await?;
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    slices
        .patch(
            "e2e-lab-gpu-000",
            &apply,
            &Patch::Apply(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": "e2e-lab-gpu-000"},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": "gpu-0"}]}})),
        )
        .await?;
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), NS);
    claims
        .patch("gpu", &apply, &Patch::Apply(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "gpu", "namespace": NS},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "e2e-gpu.nvidia.com"}}]}}})))
        .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    pods.patch(
        "gpu-pod",
        &apply,
        &Patch::Apply(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "gpu-pod", "namespace": NS},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": node},
                     "tolerations": [{"operator": "Exists"}],
                     "resourceClaims": [{"name": "gpu", "resourceClaimName": "gpu"}],
                     "containers": [{"name": "c", "image": "busybox",
                                     "resources": {"claims": [{"name": "gpu"}]}}]}})),
    )
    .await?;
    eventually(
        Duration::from_secs(60),
        "the claim to be allocated on lab-gpu-000",
        || {
            let claims = claims.clone();
            async move {
                let claim = claims.get("gpu").await?;
                Ok(claim.status.and_then(|s| s.allocation).map(|_| ()))
            }
        },
    )
    .await?;

    nodes
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {l::ALLOCATION_MODE: "device-plugin"}}})),
        )
        .await?;
    eventually(
        Duration::from_secs(30),
        "the DRA consumers' labels to go while dra-driver stays",
        || {
            let nodes = nodes.clone();
            async move {
                let n = nodes.get(node).await?;
                let labels = n.labels();
                let consumers_gone = !labels.contains_key(l::DEPLOY_DRA_VALIDATOR)
                    && !labels.contains_key(l::DEPLOY_DCGM_EXPORTER_DRA);
                anyhow::ensure!(
                    labels.get(l::DEPLOY_DRA_DRIVER).map(String::as_str) == Some("true"),
                    "dra-driver was removed while a pod holds a GPU claim"
                );
                Ok(consumers_gone.then_some(()))
            }
        },
    )
    .await?;
    let events: Api<Event> = Api::all(client.clone());
    eventually(
        Duration::from_secs(30),
        "a HandoverDraining event on the node",
        || {
            let events = events.clone();
            async move {
                let list = events
                    .list(&ListParams::default().fields(&format!("involvedObject.name={node}")))
                    .await?;
                Ok(list
                    .items
                    .iter()
                    .any(|e| {
                        e.reason.as_deref() == Some("HandoverDraining")
                            && e.message
                                .as_deref()
                                .is_some_and(|m| m.contains("waiting for them"))
                    })
                    .then_some(()))
            }
        },
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let n = nodes.get(node).await?;
    assert_eq!(
        n.labels().get(l::DEPLOY_DRA_DRIVER).map(String::as_str),
        Some("true")
    );

    pods.delete(
        "gpu-pod",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        },
    )
    .await?;
    let removed = Instant::now();
    eventually(
        Duration::from_secs(75),
        "dra-driver to be removed once the pod is gone",
        || {
            let nodes = nodes.clone();
            async move {
                Ok((!nodes
                    .get(node)
                    .await?
                    .labels()
                    .contains_key(l::DEPLOY_DRA_DRIVER))
                .then_some(()))
            }
        },
    )
    .await?;
    eprintln!(
        "labeler: dra-driver removed {:.1}s after the GPU pod was deleted",
        removed.elapsed().as_secs_f64()
    );
    let _ = claims.delete("gpu", &DeleteParams::default()).await;
    let _ = slices
        .delete("e2e-lab-gpu-000", &DeleteParams::default())
        .await;
    let _ = classes
        .delete("e2e-gpu.nvidia.com", &DeleteParams::default())
        .await;
    Ok(())
}
