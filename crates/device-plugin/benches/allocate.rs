//! `gpu-device-plugin` as the kubelet's device manager sees it, timed: the release binary on a fake
//! node with 8 mock A100s (NVML `dlopen`ed from the driver root), a stand-in kubelet registration
//! service, and the device manager's calls over the plugin's Unix socket. Prints start-up to
//! registration, the first `ListAndWatch` answer, `Allocate` p50/p99/max for 1 and 8 GPUs per
//! container, and the plugin's RSS idle and after the calls. `BENCH_ITERATIONS` (default 2000).
//!
//! `cargo bench -p device-plugin --bench allocate`

#[path = "../tests/support/mod.rs"]
mod support;

use device_plugin::proto::{AllocateRequest, ContainerAllocateRequest, Empty};
use serde_json::json;
use std::time::{Duration, Instant};
use support::{Plugin, serve_kubelet};
use tokio::sync::mpsc;

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1000.0)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let iterations: usize = std::env::var("BENCH_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let started = Instant::now();
    let mut plugin = Plugin::start_with(
        json!({"profile": "a100-sxm4-40gb", "gpu_count": 8}),
        None,
        "5",
    );
    let (tx, mut registrations) = mpsc::unbounded_channel();
    let _kubelet = serve_kubelet(&plugin.plugins_dir(), tx);
    let reg = plugin.next_registration(&mut registrations).await;
    let registered = started.elapsed();
    let mut client = plugin.connect(&reg.endpoint).await;
    let asked = Instant::now();
    let mut stream = client.list_and_watch(Empty {}).await.unwrap().into_inner();
    let first = stream.message().await.unwrap().unwrap();
    let listed = asked.elapsed();
    let ids: Vec<String> = first.devices.iter().map(|d| d.id.clone()).collect();
    assert_eq!(ids.len(), 8);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let pid = plugin.child.id();
    let idle = rss_kib(pid);

    println!("gpu-device-plugin, 8 mock A100s, {iterations} Allocate calls per row");
    println!("start to registered: {}", ms(registered));
    println!("first ListAndWatch answer: {}", ms(listed));
    println!("| Allocate | p50 | p99 | max |");
    println!("|---|---|---|---|");
    for per_container in [1usize, 8] {
        let mut times = Vec::with_capacity(iterations);
        for i in 0..iterations {
            let devices: Vec<String> = (0..per_container)
                .map(|k| ids[(i + k) % ids.len()].clone())
                .collect();
            let t = Instant::now();
            client
                .allocate(AllocateRequest {
                    container_requests: vec![ContainerAllocateRequest {
                        devices_ids: devices,
                    }],
                })
                .await
                .unwrap();
            times.push(t.elapsed());
        }
        times.sort();
        println!(
            "| {per_container} GPU(s) per container | {} | {} | {} |",
            ms(percentile(&times, 0.5)),
            ms(percentile(&times, 0.99)),
            ms(*times.last().unwrap())
        );
    }
    println!(
        "RSS: {:.1} MiB idle, {:.1} MiB after the calls",
        idle as f64 / 1024.0,
        rss_kib(pid) as f64 / 1024.0
    );
}
