//! Prepare/unprepare latency over the real DRA Unix socket, and the process's RSS while idle,
//! with 8 mock A100s read through NVML. Run: `cargo bench -p kubelet-plugin --bench prepare`.
//!
//! The claim GET is served from memory (no apiserver), so the figures cover the gRPC hop, the
//! checks, two checkpoint writes (atomic, no fsync: see `checkpoint`) and the CDI spec write.

#[path = "../tests/support/mod.rs"]
mod support;

use kubelet_plugin::proto::dra_v1::{
    Claim, NodePrepareResourcesRequest, NodeUnprepareResourcesRequest,
    dra_plugin_client::DraPluginClient,
};
use std::time::{Duration, Instant};
use support::{Claims, NODE, Served, claim};

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
    let mut claims = Vec::new();
    for i in 0..iterations {
        let one = format!("one-{i}");
        let eight = format!("eight-{i}");
        let all: Vec<String> = (0..8).map(|m| format!("gpu-{m}")).collect();
        let all: Vec<(&str, &str)> = all.iter().map(|d| (NODE, d.as_str())).collect();
        claims.push(claim(&one, &one, &[(NODE, "gpu-0")]));
        claims.push(claim(&eight, &eight, &all));
    }
    let served = Served::start(Claims::of(claims)).await;

    tokio::time::sleep(Duration::from_millis(200)).await;
    println!("idle RSS with 8 GPUs, sockets served: {} KiB", rss_kib());

    let mut client = DraPluginClient::new(served.channel.clone());
    for (label, prefix) in [("1-GPU claim", "one"), ("8-GPU claim", "eight")] {
        let mut prepare = Vec::with_capacity(iterations);
        let mut unprepare = Vec::with_capacity(iterations);
        for i in 0..iterations {
            let c = Claim {
                namespace: "ns".into(),
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
    served.stop().await;
}
