//! Time from creating the GPUCluster to `ready` with N fake GPU nodes (each with its own
//! gpu-kubelet-plugin on a mock NVML driver root), then the operator's idle RSS and writes.
//! Run on a cluster from `hack/cluster up` with NODES=N (see BENCHMARKS.md for the command).

use std::time::{Duration, Instant};

use api::gpucluster::State;
use e2e::dra_node::DraNode;
use e2e::{Env, eventually, install_crd, metric};
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let count: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(10);
    let idle = Duration::from_secs(
        std::env::args()
            .nth(2)
            .and_then(|a| a.parse().ok())
            .unwrap_or(60),
    );
    let env = Env::from_env()?;
    let client = env.client().await?;
    install_crd(&client).await?;
    let apply = PatchParams::apply("bench").force();
    let ns = "gpu-operator";
    Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .patch(
            ns,
            &apply,
            &Patch::Apply(
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
            ),
        )
        .await?;
    let accounts: Api<k8s_openapi::api::core::v1::ServiceAccount> =
        Api::namespaced(client.clone(), ns);
    for sa in [
        "nvidia-dra-driver-kubeletplugin",
        "nvidia-dra-driver-controller",
        "nvidia-dra-validator",
        "nvidia-dcgm-exporter",
    ] {
        accounts.patch(sa, &apply, &Patch::Apply(json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa, "namespace": ns}}))).await?;
    }
    let _labeler = env.spawn(
        "node-labeler",
        "ready-labeler",
        &[
            ("HTTP_ENDPOINT", "127.0.0.1:18381"),
            ("LEADER_ELECT", "false"),
            ("DEFAULT_GPU_ALLOCATION_MODE", "dra"),
        ],
    )?;
    let operator = env.spawn(
        "gpu-operator",
        "ready-operator",
        &[
            ("HTTP_ENDPOINT", "127.0.0.1:18382"),
            ("LEADER_ELECT", "false"),
            ("OPERATOR_NAMESPACE", ns),
        ],
    )?;
    let mut nodes = Vec::new();
    for i in 0..count {
        nodes.push(DraNode::start(
            &env,
            &format!("gpu-node-{i}"),
            "a100-sxm4-80gb",
            8,
        )?);
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    let gcs: Api<api::GPUCluster> = Api::all(client.clone());
    let created = Instant::now();
    gcs.patch("gpu-cluster", &apply, &Patch::Apply(json!({"apiVersion": "nvidia.com/v1alpha1", "kind": "GPUCluster", "metadata": {"name": "gpu-cluster"}, "spec": {}})))
        .await?;
    eventually(Duration::from_secs(300), "gpu-cluster ready", || async {
        let gc = gcs.get("gpu-cluster").await?;
        Ok((gc.status.and_then(|s| s.state) == Some(State::Ready)).then_some(()))
    })
    .await?;
    let ready = created.elapsed();
    let counters = [
        "gpu_operator_applies_total",
        "gpu_operator_status_writes_total",
        "gpu_operator_deletes_total",
    ];
    let mut before = 0.0;
    for c in counters {
        before += metric("127.0.0.1:18382", c).await?;
    }
    tokio::time::sleep(idle).await;
    let mut after = 0.0;
    for c in counters {
        after += metric("127.0.0.1:18382", c).await?;
    }
    println!(
        "| {count} GPU nodes | {:.1} s | {:.1} MiB | {} in {} s |",
        ready.as_secs_f64(),
        operator.rss_kib().unwrap_or_default() as f64 / 1024.0,
        after - before,
        idle.as_secs()
    );
    drop(nodes);
    Ok(())
}
