//! Prepare/unprepare latency over the real DRA Unix socket, and the process's RSS while idle,
//! with 8 mock A100s read through NVML. Run: `cargo bench -p kubelet-plugin --bench prepare`.
//!
//! The claim GET is served from memory (no apiserver), so the figures cover the gRPC hop, the
//! checks, two checkpoint writes with fsync and the CDI spec write.

use gpu_discovery::testing::{FakeNode, mock_config};
use gpu_discovery::{InitMode, NvmlSession, root};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kubelet_plugin::cdi::CdiWriter;
use kubelet_plugin::checkpoint::CheckpointStore;
use kubelet_plugin::client::connect_unix;
use kubelet_plugin::devices::DeviceTable;
use kubelet_plugin::driver::{ClaimSource, Driver};
use kubelet_plugin::grpc::DraService;
use kubelet_plugin::proto::dra_v1::{
    Claim, NodePrepareResourcesRequest, NodeUnprepareResourcesRequest,
    dra_plugin_client::DraPluginClient,
};
use kubelet_plugin::registration::RegistrationService;
use kubelet_plugin::server::{SocketPaths, Sockets};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

const NODE: &str = "bench-node";

struct Claims(HashMap<String, ResourceClaim>);

impl ClaimSource for Claims {
    async fn get(&self, _: &str, name: &str) -> Result<ResourceClaim, String> {
        self.0.get(name).cloned().ok_or_else(|| "not found".into())
    }
}

fn claim(name: &str, gpus: u32) -> ResourceClaim {
    let results: Vec<_> = (0..gpus)
        .map(|m| serde_json::json!({"request": "gpu", "driver": "gpu.nvidia.com", "pool": NODE, "device": format!("gpu-{m}")}))
        .collect();
    serde_json::from_value(serde_json::json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"namespace": "bench", "name": name, "uid": name},
        "spec": {"devices": {}},
        "status": {"allocation": {"devices": {"results": results}}},
    }))
    .expect("claim")
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

fn report(what: &str, mut samples: Vec<Duration>) {
    samples.sort();
    println!(
        "{what:<28} n={:<5} p50={:>8.3} ms  p99={:>8.3} ms  max={:>8.3} ms",
        samples.len(),
        percentile(&samples, 0.5).as_secs_f64() * 1e3,
        percentile(&samples, 0.99).as_secs_f64() * 1e3,
        samples.last().unwrap().as_secs_f64() * 1e3,
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let iterations: usize = std::env::var("BENCH_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let fake = FakeNode::new();
    fake.install_host_driver(&mock_config("a100-sxm4-40gb", 8));
    let library = root::probe(&fake.settings())
        .expect("mock driver")
        .nvml_library;
    let table = {
        let session = NvmlSession::open(&library, InitMode::Full).expect("NVML");
        DeviceTable::from_inventory(&session.inventory().expect("inventory"))
    };
    assert_eq!(table.devices.len(), 8);

    let dir = tempfile::tempdir().expect("tempdir");
    let plugin_dir = dir.path().join("plugins/gpu.nvidia.com");
    std::fs::create_dir_all(&plugin_dir).unwrap();
    let mut claims = HashMap::new();
    for i in 0..iterations {
        claims.insert(format!("one-{i}"), claim(&format!("one-{i}"), 1));
        claims.insert(format!("eight-{i}"), claim(&format!("eight-{i}"), 8));
    }
    let (driver, _) = Driver::start(
        "gpu.nvidia.com",
        NODE,
        Claims(claims),
        table,
        CdiWriter::new(&dir.path().join("cdi"), std::path::Path::new("/")),
        CheckpointStore::new(&plugin_dir, "bench-boot"),
    )
    .expect("driver");
    let paths = SocketPaths::new(
        &dir.path().join("plugins_registry"),
        &dir.path().join("plugins"),
    );
    let sockets = Sockets::bind(&paths).expect("sockets");
    let registration = RegistrationService::new("gpu.nvidia.com", &paths.dra.to_string_lossy());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server =
        tokio::spawn(
            sockets.serve(registration, DraService::new(Arc::new(driver)), async {
                let _ = stopped.await;
            }),
        );

    tokio::time::sleep(Duration::from_millis(200)).await;
    println!("idle RSS with 8 GPUs, sockets served: {} KiB", rss_kib());

    let mut client = DraPluginClient::new(connect_unix(&paths.dra).await.expect("connect"));
    for (label, prefix) in [("1-GPU claim", "one"), ("8-GPU claim", "eight")] {
        let mut prepare = Vec::with_capacity(iterations);
        let mut unprepare = Vec::with_capacity(iterations);
        for i in 0..iterations {
            let c = Claim {
                namespace: "bench".into(),
                uid: format!("{prefix}-{i}"),
                name: format!("{prefix}-{i}"),
            };
            let started = Instant::now();
            let answer = client
                .node_prepare_resources(NodePrepareResourcesRequest {
                    claims: vec![c.clone()],
                })
                .await
                .expect("prepare")
                .into_inner();
            prepare.push(started.elapsed());
            assert_eq!(answer.claims[&c.uid].error, "");
            let started = Instant::now();
            client
                .node_unprepare_resources(NodeUnprepareResourcesRequest { claims: vec![c] })
                .await
                .expect("unprepare");
            unprepare.push(started.elapsed());
        }
        report(&format!("prepare, {label}"), prepare);
        report(&format!("unprepare, {label}"), unprepare);
    }
    println!("RSS after the runs: {} KiB", rss_kib());
    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
}
