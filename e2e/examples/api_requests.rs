//! API requests run (`make bench-requests`): what the kubelet plugin's slice publisher and the
//! operator ask of the apiserver for ordinary events, on the local cluster. The plugin serves 8
//! mock H100s on `gpu-node-0`; its slices are wiped twice, 10 s apart, as a kubelet does when a
//! plugin goes away; the apiserver's own request counters give the ResourceSlice LISTs and writes
//! over those 30 s. Then the operator reconciles a `GPUCluster`, and one spec change is counted
//! in its `gpu_operator_reconciles_total` over 20 s, with the GETs and LISTs of operand kinds the
//! apiserver served meanwhile. Prints a Markdown table row.

use std::time::Duration;

use api::GPUCluster;
use e2e::dra_node::DraNode;
use e2e::{Env, install_crd, metric};
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use serde_json::json;

const OPERATOR_METRICS: &str = "127.0.0.1:18198";

/// The apiserver's `apiserver_request_total` for `verbs` on `resource`, summed.
fn apiserver_requests(env: &Env, verbs: &[&str], resource: &str) -> anyhow::Result<f64> {
    let out = e2e::helm::kubectl(env, &["get", "--raw", "/metrics"]).output()?;
    anyhow::ensure!(out.status.success(), "kubectl get --raw /metrics failed");
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
        .filter(|l| l.contains(&format!("resource=\"{resource}\"")))
        .filter(|l| verbs.iter().any(|v| l.contains(&format!("verb=\"{v}\""))))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum())
}

/// GETs and LISTs of the operand kinds, by anyone (the operator's are most of them).
fn operand_reads(env: &Env) -> anyhow::Result<f64> {
    let kinds = [
        "daemonsets",
        "deployments",
        "services",
        "configmaps",
        "resourceclaimtemplates",
        "deviceclasses",
        "validatingadmissionpolicies",
        "validatingadmissionpolicybindings",
    ];
    kinds
        .iter()
        .map(|kind| apiserver_requests(env, &["GET", "LIST"], kind))
        .sum()
}

async fn apply_spec(gcs: &Api<GPUCluster>, spec: serde_json::Value) -> anyhow::Result<()> {
    let gc = json!({"apiVersion": "nvidia.com/v1alpha1", "kind": "GPUCluster",
                    "metadata": {"name": "gpu-cluster"}, "spec": spec});
    gcs.patch(
        "gpu-cluster",
        &PatchParams::apply("bench"),
        &Patch::Apply(gc),
    )
    .await?;
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let env = Env::from_env()?;
    let client = env.client().await?;
    install_crd(&client).await?;

    let lists = |env: &Env| apiserver_requests(env, &["LIST"], "resourceslices");
    let writes =
        |env: &Env| apiserver_requests(env, &["APPLY", "PATCH", "CREATE"], "resourceslices");
    let (lists_before, writes_before) = (lists(&env)?, writes(&env)?);
    let node = DraNode::start(&env, "gpu-node-0", "h100-sxm5-80gb", 8)?;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    for _ in 0..2 {
        slices
            .delete_collection(
                &DeleteParams::default(),
                &ListParams::default().fields("spec.nodeName=gpu-node-0"),
            )
            .await?;
        tokio::time::sleep(Duration::from_secs(10)).await;
    }
    let slice_lists = lists(&env)? - lists_before;
    let slice_writes = writes(&env)? - writes_before;
    drop(node);

    let operator = env.spawn(
        "gpu-operator",
        "bench-requests-operator",
        &[
            ("OPERATOR_NAMESPACE", "default"),
            ("HTTP_ENDPOINT", OPERATOR_METRICS),
            ("LEADER_ELECT", "false"),
        ],
    )?;
    let gcs: Api<GPUCluster> = Api::all(client.clone());
    apply_spec(&gcs, json!({})).await?;
    tokio::time::sleep(Duration::from_secs(30)).await;
    let before = metric(OPERATOR_METRICS, "gpu_operator_reconciles_total").await?;
    let reads_before = operand_reads(&env)?;
    apply_spec(&gcs, json!({"daemonsets": {"labels": {"bench": "1"}}})).await?;
    tokio::time::sleep(Duration::from_secs(20)).await;
    let reconciles = metric(OPERATOR_METRICS, "gpu_operator_reconciles_total").await? - before;
    let reads = operand_reads(&env)? - reads_before;
    gcs.delete("gpu-cluster", &DeleteParams::default()).await?;
    tokio::time::sleep(Duration::from_secs(10)).await;
    drop(operator);

    println!(
        "| {} | {slice_lists} | {slice_writes} | {reconciles} | {reads} |",
        env.bin_dir.display()
    );
    Ok(())
}
