//! `gpu-device-plugin` as the kubelet sees it: the real binary, NVML loaded by `dlopen` from a
//! fake driver root carrying the mock library, and a stand-in for the kubelet's `Registration`
//! service on a real Unix socket. The test dials the plugin's socket with the generated client,
//! as the kubelet's device manager does.

mod support;

use device_plugin::proto::{
    AllocateRequest, ContainerAllocateRequest, ContainerPreferredAllocationRequest, Empty,
    ListAndWatchResponse, PreferredAllocationRequest,
};
use gpu_discovery::testing::configure;
use serde_json::json;
use std::time::Duration;
use support::{Plugin, serve_kubelet};
use tokio::sync::mpsc;
use tonic::Streaming;

async fn next_list(stream: &mut Streaming<ListAndWatchResponse>) -> Vec<(String, String)> {
    let update = tokio::time::timeout(Duration::from_secs(15), stream.message())
        .await
        .expect("a ListAndWatch update within 15 s")
        .expect("stream healthy")
        .expect("stream open");
    update
        .devices
        .into_iter()
        .map(|d| (d.id, d.health))
        .collect()
}

fn uuids(list: &[(String, String)]) -> Vec<&str> {
    list.iter().map(|(id, _)| id.as_str()).collect()
}

fn unhealthy(list: &[(String, String)]) -> Vec<&str> {
    list.iter()
        .filter(|(_, h)| h == "Unhealthy")
        .map(|(id, _)| id.as_str())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_gpus_through_cdi_and_follows_their_health() {
    let mock = json!({"profile": "a100-sxm4-80gb", "gpu_count": 4});
    let mut plugin = Plugin::start(mock.clone(), None);
    let (tx, mut registrations) = mpsc::unbounded_channel();
    let _kubelet = serve_kubelet(&plugin.plugins_dir(), tx);

    let reg = plugin.next_registration(&mut registrations).await;
    assert_eq!(reg.version, "v1beta1");
    assert_eq!(reg.resource_name, "nvidia.com/gpu");
    assert_eq!(reg.endpoint, "nvidia-gpu.sock");
    assert!(reg.options.unwrap().get_preferred_allocation_available);

    let mut client = plugin.connect(&reg.endpoint).await;
    let mut stream = client.list_and_watch(Empty {}).await.unwrap().into_inner();
    let list = next_list(&mut stream).await;
    assert_eq!(list.len(), 4, "{list:?}");
    assert!(unhealthy(&list).is_empty(), "{list:?}");
    let ids: Vec<String> = uuids(&list).iter().map(|s| (*s).to_owned()).collect();

    // Allocate answers with the CDI device of the GPU, named by UUID, in the spec on disk.
    let response = client
        .allocate(AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: vec![ids[1].clone()],
            }],
        })
        .await
        .unwrap()
        .into_inner();
    let container = &response.container_responses[0];
    assert_eq!(
        container.cdi_devices[0].name,
        format!("k8s.device-plugin.nvidia.com/gpu={}", ids[1])
    );
    assert_eq!(container.envs["NVIDIA_VISIBLE_DEVICES"], ids[1]);
    let spec_path = plugin
        .dir
        .path()
        .join("cdi/k8s.device-plugin.nvidia.com-gpu.yaml");
    let spec: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(&spec_path).unwrap()).unwrap();
    assert_eq!(spec["kind"], "k8s.device-plugin.nvidia.com/gpu");
    let devices = spec["devices"].as_sequence().unwrap();
    assert_eq!(devices.len(), 4);
    let named: Vec<&str> = devices
        .iter()
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    assert!(named.contains(&ids[1].as_str()), "{named:?}");
    let mounts = spec["containerEdits"]["mounts"].as_sequence().unwrap();
    assert!(
        mounts.iter().any(|m| m["containerPath"]
            .as_str()
            .unwrap()
            .ends_with("libnvidia-ml.so.1")),
        "the driver's NVML is mounted: {mounts:?}"
    );

    // An unknown ID is refused with a message naming it.
    let err = client
        .allocate(AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: vec!["GPU-nope".into()],
            }],
        })
        .await
        .unwrap_err();
    assert!(err.message().contains("GPU-nope"), "{}", err.message());

    // A preferred allocation of 2 out of 4.
    let preferred = client
        .get_preferred_allocation(PreferredAllocationRequest {
            container_requests: vec![ContainerPreferredAllocationRequest {
                available_device_i_ds: ids.clone(),
                must_include_device_i_ds: vec![ids[3].clone()],
                allocation_size: 2,
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(preferred.container_responses[0].device_i_ds.len(), 2);
    assert_eq!(preferred.container_responses[0].device_i_ds[0], ids[3]);

    // GPU 2 falls off the bus: one update marks it unhealthy; it comes back after recovery.
    configure(
        &plugin.node.host_root(),
        &json!({"profile": "a100-sxm4-80gb", "gpu_count": 4, "faults": {"lost_gpus": [2]}}),
    );
    let list = next_list(&mut stream).await;
    assert_eq!(unhealthy(&list), [plugin.gpus[2].as_str()], "{list:?}");
    configure(&plugin.node.host_root(), &mock);
    let list = next_list(&mut stream).await;
    assert!(unhealthy(&list).is_empty(), "{list:?}");

    // XID 79 on GPU 0, an event rather than a failed probe.
    configure(
        &plugin.node.host_root(),
        &json!({"profile": "a100-sxm4-80gb", "gpu_count": 4,
                "faults": {"xid_events": [{"gpu": 0, "xid": 79}]}}),
    );
    let list = next_list(&mut stream).await;
    assert_eq!(unhealthy(&list), [plugin.gpus[0].as_str()], "{list:?}");
    configure(&plugin.node.host_root(), &mock);
    let list = next_list(&mut stream).await;
    assert!(unhealthy(&list).is_empty(), "{list:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registers_again_when_the_kubelet_restarts() {
    let mut plugin = Plugin::start(json!({"profile": "l4", "gpu_count": 2}), None);
    let (tx, mut registrations) = mpsc::unbounded_channel();
    let kubelet = serve_kubelet(&plugin.plugins_dir(), tx.clone());
    let first = plugin.next_registration(&mut registrations).await;
    let mut old_client = plugin.connect(&first.endpoint).await;
    let mut old_stream = old_client
        .list_and_watch(Empty {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(next_list(&mut old_stream).await.len(), 2);
    let socket = plugin.plugins_dir().join(&first.endpoint);

    // A restarting kubelet removes every socket in the directory, then serves kubelet.sock anew.
    let _ = kubelet.send(());
    for entry in std::fs::read_dir(plugin.plugins_dir()).unwrap() {
        std::fs::remove_file(entry.unwrap().path()).unwrap();
    }
    let _kubelet = serve_kubelet(&plugin.plugins_dir(), tx);
    let again = plugin.next_registration(&mut registrations).await;
    assert_eq!(again.endpoint, first.endpoint);
    // The file was removed above, so its presence means a new socket was bound (inode numbers
    // cannot tell: the filesystem may hand the freed one straight back).
    assert!(
        socket.exists(),
        "a new socket was bound at {}",
        socket.display()
    );
    // The server of the removed socket stopped: its watch ended.
    let ended = tokio::time::timeout(Duration::from_secs(10), old_stream.message()).await;
    assert!(
        matches!(ended, Ok(Ok(None)) | Ok(Err(_))),
        "the old ListAndWatch stream should end: {ended:?}"
    );
    let mut client = plugin.connect(&again.endpoint).await;
    let mut stream = client.list_and_watch(Empty {}).await.unwrap().into_inner();
    assert_eq!(next_list(&mut stream).await.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_mig_and_time_slicing_from_the_upstream_config_file() {
    let config = "version: v1\nflags:\n  migStrategy: mixed\nsharing:\n  timeSlicing:\n    renameByDefault: true\n    resources:\n    - name: nvidia.com/mig-1g.5gb\n      replicas: 3\n";
    let mut plugin = Plugin::start(
        json!({"profile": "a100-sxm4-40gb-mig-mixed", "gpu_count": 2}),
        Some(config),
    );
    let (tx, mut registrations) = mpsc::unbounded_channel();
    let _kubelet = serve_kubelet(&plugin.plugins_dir(), tx);
    let mut names = Vec::new();
    for _ in 0..3 {
        names.push(plugin.next_registration(&mut registrations).await);
    }
    names.sort_by(|a, b| a.resource_name.cmp(&b.resource_name));
    let resources: Vec<&str> = names.iter().map(|r| r.resource_name.as_str()).collect();
    assert_eq!(
        resources,
        [
            "nvidia.com/mig-1g.5gb.shared",
            "nvidia.com/mig-2g.10gb",
            "nvidia.com/mig-3g.20gb"
        ]
    );
    let shared = &names[0];
    assert_eq!(shared.endpoint, "nvidia-mig-1g.5gb.shared.sock");
    let mut client = plugin.connect(&shared.endpoint).await;
    let mut stream = client.list_and_watch(Empty {}).await.unwrap().into_inner();
    let list = next_list(&mut stream).await;
    // Two GPUs with one 1g.5gb device each, three replicas of each.
    assert_eq!(list.len(), 6, "{list:?}");
    assert!(
        list.iter()
            .all(|(id, _)| id.starts_with("MIG-") && id.contains("::"))
    );
    let response = client
        .allocate(AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: vec![list[0].0.clone()],
            }],
        })
        .await
        .unwrap()
        .into_inner();
    let uuid = list[0].0.split("::").next().unwrap();
    assert_eq!(
        response.container_responses[0].cdi_devices[0].name,
        format!("k8s.device-plugin.nvidia.com/gpu={uuid}")
    );
}
