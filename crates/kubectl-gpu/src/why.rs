//! `kubectl gpu why POD`: what the pod holds of the GPUs, or why it waits for them (the answer the
//! operator's `GPUsUnavailable` Event gives, computed now).

use api::pending::{World, explain, unschedulable};
use api::pods::{claim_names, device_plugin_gpus};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::ResourceExt;
use serde::Serialize;

use crate::claims::claim_devices;
use crate::cluster::Cluster;

/// The answer for one pod.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Answer {
    /// `namespace/name`.
    pub pod: String,
    /// The node it is bound to.
    pub node: Option<String>,
    /// `GPUsUnavailable` or `DeviceClassNotFound` while it waits for our devices.
    pub reason: Option<String>,
    /// The answer, a sentence a line.
    pub lines: Vec<String>,
}

/// What `pod` holds or waits for.
pub fn answer(pod: &Pod, cluster: &Cluster) -> Answer {
    let ns = pod.namespace().unwrap_or_default();
    let name = format!("{ns}/{}", pod.name_any());
    let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
    let names: Vec<&str> = claim_names(pod).collect();
    let own = |c: &&ResourceClaim| {
        c.namespace().as_deref() == Some(ns.as_str()) && names.contains(&c.name_any().as_str())
    };
    let plugin_gpus = device_plugin_gpus(pod);
    let mut lines = Vec::new();
    let mut reason = None;
    if let Some(node) = &node {
        lines.push(format!("pod {name} is bound to node {node}"));
        let held = claim_devices(cluster, true);
        for d in held
            .iter()
            .filter(|d| d.namespace == ns && names.contains(&d.claim.as_str()))
        {
            let what = [
                d.uuid.as_deref(),
                d.product.as_deref(),
                d.mig_profile.as_deref(),
            ]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .join(", ");
            match &d.device {
                Some(device) => lines.push(format!(
                    "claim {} holds device {device} ({what}) on node {}",
                    d.claim,
                    d.node.as_deref().unwrap_or("-")
                )),
                None => lines.push(format!("claim {} is not allocated yet", d.claim)),
            }
        }
        if plugin_gpus > 0 {
            lines.push(format!(
                "it holds {plugin_gpus} nvidia.com device(s) from the device plugin"
            ));
        }
        if lines.len() == 1 {
            lines.push("it holds no GPU".into());
        }
    } else {
        let pod_claims: Vec<ResourceClaim> = cluster.claims.iter().filter(own).cloned().collect();
        let world = World {
            device_classes: &cluster.device_classes,
            gpu_classes: &cluster.gpu_classes,
            slices: &cluster.slices,
            claims: &cluster.claims,
        };
        let tried = if unschedulable(pod) {
            "the scheduler found no node for it"
        } else {
            "the scheduler has not placed it yet"
        };
        lines.push(format!("pod {name} waits: {tried}"));
        match explain(&pod_claims, world) {
            Some(why) => {
                reason = Some(why.reason.to_owned());
                lines.extend(why.notes);
            }
            None if plugin_gpus > 0 => lines.push(format!(
                "it asks {plugin_gpus} nvidia.com device(s) of the device plugin; `kubectl gpu nodes` shows which nodes serve that plane"
            )),
            None => lines.push("it waits for no GPU of ours".into()),
        }
        if let Some(message) = scheduler_message(pod) {
            lines.push(format!("the scheduler says: {message}"));
        }
    }
    Answer {
        pod: name,
        node,
        reason,
        lines,
    }
}

fn scheduler_message(pod: &Pod) -> Option<String> {
    pod.status
        .as_ref()?
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False")?
        .message
        .clone()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(node: Option<&str>) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "ns"},
            "spec": {"nodeName": node, "containers": [],
                     "resourceClaims": [{"name": "g", "resourceClaimName": "c"}]},
            "status": {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                       "message": "0/3 nodes are available: 3 cannot allocate all claims."}]}}))
        .unwrap()
    }

    fn claim(allocated: bool) -> ResourceClaim {
        let mut c = json!({"metadata": {"name": "c", "namespace": "ns"},
            "spec": {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.co"}}]}}});
        if allocated {
            c["status"] = json!({"allocation": {"devices": {"results": [
                {"request": "g", "driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-0"}]}},
                "devices": [{"driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-0",
                             "data": {"uuid": "GPU-0", "productName": "NVIDIA L4"}}]});
        }
        serde_json::from_value(c).unwrap()
    }

    #[test]
    fn a_waiting_pod_is_told_why_and_a_bound_one_what_it_holds() {
        let cluster = Cluster {
            claims: vec![claim(false)],
            device_classes: vec!["gpu.nvidia.com".into()],
            ..Cluster::default()
        };
        let waiting = answer(&pod(None), &cluster);
        assert_eq!(waiting.reason.as_deref(), Some("DeviceClassNotFound"));
        assert_eq!(
            waiting.lines[0],
            "pod ns/p waits: the scheduler found no node for it"
        );
        assert!(
            waiting.lines[1].contains("did you mean gpu.nvidia.com?"),
            "{:?}",
            waiting.lines
        );
        assert!(waiting.lines[2].starts_with("the scheduler says: 0/3 nodes"));

        let cluster = Cluster {
            claims: vec![claim(true)],
            ..Cluster::default()
        };
        let bound = answer(&pod(Some("n1")), &cluster);
        assert_eq!(bound.reason, None);
        assert_eq!(
            bound.lines,
            [
                "pod ns/p is bound to node n1",
                "claim c holds device gpu-0 (GPU-0, NVIDIA L4) on node n1"
            ]
        );
    }
}
