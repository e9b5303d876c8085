//! `kubectl gpu nodes`: each GPU node's plane and whether it is ready, its hand-over, its GPUs
//! healthy of total (the PhysicalGPUs), and how many of them pods use.

use std::collections::BTreeSet;

use api::contract::labels as l;
use api::handover::{Handover, Phase};
use api::physicalgpu::PhysicalGPU;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use serde::Serialize;

use crate::claims::claim_devices;
use crate::cluster::Cluster;
use crate::table::{Cell, Tone, age};

/// One GPU node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeRow {
    /// The node.
    pub node: String,
    /// The plane whose plugin is deployed on it ([`serving_plane`]).
    pub plane: Option<String>,
    /// The plane its allocation-mode label asks for (by plane policy or an admin).
    pub wanted: Option<String>,
    /// Whether that plane's validator passed on it.
    pub ready: bool,
    /// Its hand-over between the planes, if one is under way or was rolled back.
    pub handover: Option<Handover>,
    /// Its GPUs (PhysicalGPUs).
    pub gpus: usize,
    /// Those with no fault seen.
    pub healthy: usize,
    /// GPUs pods hold: cards with a DRA allocation (whole, MIG or share), plus the device
    /// plugin's devices given to pods.
    pub in_use: usize,
    /// The driver version its GPUs report.
    pub driver: Option<String>,
}

/// Whether the node has GPUs as the product sees them: the labeler marked it, a plane serves it,
/// or a plugin wrote PhysicalGPUs for it.
pub fn is_gpu_node(node: &Node, gpus: &[PhysicalGPU]) -> bool {
    let labels = node.labels();
    let name = node.name_any();
    labels.get(l::GPU_PRESENT).is_some_and(|v| v == "true")
        || labels.contains_key(l::ALLOCATION_MODE)
        || gpus.iter().any(|g| gpu_node(g) == Some(name.as_str()))
}

fn gpu_node(gpu: &PhysicalGPU) -> Option<&str> {
    gpu.status.as_ref().map(|s| s.node.as_str())
}

/// The plane whose plugin the node's deploy labels put there: `dra`, `device-plugin`, both
/// (`dra+device-plugin`, never for long) or `None`.
pub fn serving_plane(node: &Node) -> Option<String> {
    let on = |key: &str| node.labels().get(key).is_some_and(|v| v == "true");
    match (on(l::DEPLOY_DRA_DRIVER), on(l::DEPLOY_DEVICE_PLUGIN)) {
        (true, false) => Some("dra".into()),
        (false, true) => Some("device-plugin".into()),
        (true, true) => Some("dra+device-plugin".into()),
        (false, false) => None,
    }
}

/// The node's hand-over record, when it has one that parses.
pub fn handover(node: &Node) -> Option<Handover> {
    let raw = node.annotations().get(l::HANDOVER)?;
    serde_json::from_str(raw).ok()
}

/// A row for every GPU node, by name.
pub fn rows(cluster: &Cluster) -> Vec<NodeRow> {
    let held = claim_devices(cluster, false);
    let mut rows: Vec<NodeRow> = cluster
        .nodes
        .iter()
        .filter(|n| is_gpu_node(n, &cluster.gpus))
        .map(|node| {
            let name = node.name_any();
            let labels = node.labels();
            let gpus: Vec<&PhysicalGPU> = cluster
                .gpus
                .iter()
                .filter(|g| gpu_node(g) == Some(name.as_str()))
                .collect();
            let healthy = gpus.iter().filter(|g| healthy(g)).count();
            let dra_cards: BTreeSet<&str> = held
                .iter()
                .filter(|d| d.node.as_deref() == Some(name.as_str()))
                .filter_map(|d| d.gpu_uuid.as_deref().or(d.device.as_deref()))
                .collect();
            let device_plugin: i64 = cluster
                .pods
                .iter()
                .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(&name))
                .map(api::pods::device_plugin_gpus)
                .sum();
            NodeRow {
                plane: serving_plane(node),
                wanted: labels.get(l::ALLOCATION_MODE).cloned(),
                ready: labels
                    .get(l::GPU_SETUP_COMPLETE)
                    .is_some_and(|v| v == "true"),
                handover: handover(node),
                gpus: gpus.len(),
                healthy,
                in_use: dra_cards.len() + usize::try_from(device_plugin).unwrap_or(0),
                driver: gpus
                    .iter()
                    .filter_map(|g| g.status.as_ref())
                    .map(|s| s.driver_version.clone())
                    .find(|v| !v.is_empty()),
                node: name,
            }
        })
        .collect();
    rows.sort_by(|a, b| a.node.cmp(&b.node));
    rows
}

fn healthy(gpu: &PhysicalGPU) -> bool {
    gpu.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == "Healthy" && c.status == "True")
    })
}

/// How a hand-over reads in one cell: its step, where it goes and for how long, at `now` (Unix
/// seconds).
pub fn handover_text(h: &Handover, now: i64) -> String {
    match h.phase {
        Phase::Draining => format!("draining to {} ({})", h.to, age(now - h.since)),
        Phase::WaitingForPlane => format!("waiting for {} ({})", h.to, age(now - h.since)),
        Phase::RolledBack => format!("rolled back to {}", h.to),
    }
}

/// The table's headers.
pub const HEADERS: [&str; 8] = [
    "NODE", "PLANE", "WANTED", "READY", "HANDOVER", "GPUS", "IN-USE", "DRIVER",
];

/// One table row per node, at `now`.
pub fn table_rows(rows: &[NodeRow], now: i64) -> Vec<Vec<Cell>> {
    rows.iter()
        .map(|r| {
            let gpus_tone = match (r.gpus, r.healthy) {
                (0, _) => Tone::Warn,
                (n, h) if n == h => Tone::Good,
                _ => Tone::Bad,
            };
            let handover = match &r.handover {
                None => Cell::plain(""),
                Some(h) if h.phase == Phase::RolledBack => {
                    Cell::new(handover_text(h, now), Tone::Bad)
                }
                Some(h) => Cell::new(handover_text(h, now), Tone::Warn),
            };
            vec![
                Cell::plain(r.node.clone()),
                Cell::plain(r.plane.clone().unwrap_or_default()),
                Cell::plain(r.wanted.clone().unwrap_or_default()),
                if r.ready {
                    Cell::new("yes", Tone::Good)
                } else {
                    Cell::new("no", Tone::Bad)
                },
                handover,
                Cell::new(format!("{}/{}", r.healthy, r.gpus), gpus_tone),
                Cell::plain(r.in_use.to_string()),
                Cell::plain(r.driver.clone().unwrap_or_default()),
            ]
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn node(name: &str, labels: serde_json::Value, annotations: serde_json::Value) -> Node {
        serde_json::from_value(
            json!({"metadata": {"name": name, "labels": labels, "annotations": annotations}}),
        )
        .unwrap()
    }

    fn gpu(node: &str, uuid: &str, healthy: &str) -> PhysicalGPU {
        serde_json::from_value(json!({"apiVersion": "gpu-operator-rs.dev/v1alpha1", "kind": "PhysicalGPU",
            "metadata": {"name": format!("{node}-{uuid}")}, "spec": {},
            "status": {"node": node, "uuid": uuid, "pciBusID": "", "product": "NVIDIA L4", "architecture": "",
                "computeCapability": "", "memory": "", "driverVersion": "580.95.05", "cudaDriverVersion": "",
                "migMode": "", "migDevices": 0, "plane": "dra", "consumers": [], "phase": "Ready",
                "conditions": [{"type": "Healthy", "status": healthy, "reason": "r", "message": "",
                                "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}))
        .unwrap()
    }

    #[test]
    fn each_gpu_node_shows_its_plane_handover_health_and_use() {
        let draining = json!({l::HANDOVER: r#"{"from":"dra","to":"device-plugin","phase":"Draining","since":1000}"#});
        let cluster = Cluster {
            nodes: vec![
                node("cpu", json!({}), json!({})),
                node("dp", json!({l::GPU_PRESENT: "true", l::ALLOCATION_MODE: "device-plugin",
                                  l::DEPLOY_DEVICE_PLUGIN: "true", l::GPU_SETUP_COMPLETE: "true"}), json!({})),
                node("a", json!({l::GPU_PRESENT: "true", l::ALLOCATION_MODE: "device-plugin",
                                 l::DEPLOY_DRA_DRIVER: "true"}), draining),
            ],
            gpus: vec![gpu("a", "GPU-0", "True"), gpu("a", "GPU-1", "False"), gpu("dp", "GPU-2", "True")],
            slices: vec![serde_json::from_value(json!({"metadata": {"name": "a"}, "spec": {"driver": "gpu.nvidia.com",
                "nodeName": "a", "pool": {"name": "a", "generation": 1, "resourceSliceCount": 1},
                "devices": [{"name": "gpu-0", "attributes": {"uuid": {"string": "GPU-0"}}}]}})).unwrap()],
            claims: vec![serde_json::from_value(json!({"metadata": {"name": "c", "namespace": "ns"}, "spec": {},
                "status": {"allocation": {"devices": {"results": [
                    {"request": "r", "driver": "gpu.nvidia.com", "pool": "a", "device": "gpu-0"}]}}}})).unwrap()],
            pods: vec![serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "ns"},
                "spec": {"nodeName": "dp", "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}})).unwrap()],
            ..Cluster::default()
        };
        let rows = rows(&cluster);
        assert_eq!(
            rows.iter().map(|r| r.node.as_str()).collect::<Vec<_>>(),
            ["a", "dp"]
        );
        assert_eq!((rows[0].gpus, rows[0].healthy, rows[0].in_use), (2, 1, 1));
        assert_eq!((rows[1].gpus, rows[1].healthy, rows[1].in_use), (1, 1, 1));
        let table = crate::table::render(&HEADERS, &table_rows(&rows, 1065), false);
        assert_eq!(
            table,
            "NODE   PLANE           WANTED          READY   HANDOVER                           GPUS   IN-USE   DRIVER\n\
             a      dra             device-plugin   no      draining to device-plugin (1m5s)   1/2    1        580.95.05\n\
             dp     device-plugin   device-plugin   yes     -                                  1/1    1        580.95.05\n"
        );
    }
}
