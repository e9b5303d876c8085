//! Answers to the kubelet's allocation calls, decided from a [`Resource`]: which devices to
//! prefer, and what a container gets for the devices it was given.

use crate::plan::Resource;
use crate::proto::{CdiDevice, ContainerAllocateResponse};
use api::contract::cdi::DEVICE_PLUGIN_KIND;
use std::collections::BTreeSet;

/// The fully qualified CDI name of the device with `uuid` in the device plugin's spec.
pub fn cdi_name(uuid: &str) -> String {
    format!("{DEVICE_PLUGIN_KIND}={uuid}")
}

/// Picks `size` devices for one container: every `must_include` first, then the available ones
/// that spread the container over the most distinct devices (for time-sliced replicas, replicas
/// of GPUs it does not have yet), in ID order. Returns fewer only when fewer are available.
pub fn preferred(
    resource: &Resource,
    available: &[String],
    must_include: &[String],
    size: usize,
) -> Vec<String> {
    let mut chosen: Vec<String> = must_include.iter().take(size).cloned().collect();
    let mut used: BTreeSet<&str> = chosen
        .iter()
        .filter_map(|id| resource.find(id).map(|d| d.uuid.as_str()))
        .collect();
    let mut rest: Vec<&String> = available.iter().filter(|id| !chosen.contains(id)).collect();
    rest.sort();
    rest.dedup();
    // First pass: one replica per device not used yet; second: anything left.
    for pass in 0..2 {
        for id in &rest {
            if chosen.len() >= size {
                return chosen;
            }
            if chosen.contains(id) {
                continue;
            }
            let uuid = resource.find(id).map_or(id.as_str(), |d| d.uuid.as_str());
            if pass == 0 && used.contains(uuid) {
                continue;
            }
            used.insert(uuid);
            chosen.push((*id).clone());
        }
    }
    chosen
}

/// Why an allocation was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocateError {
    /// An ID this resource does not list.
    #[error(
        "device {id} is not a {resource} device of this node; the kubelet's view is stale, it retries after the next ListAndWatch update"
    )]
    Unknown {
        /// The ID.
        id: String,
        /// The resource.
        resource: String,
    },
    /// More than one replica for a resource configured to refuse that.
    #[error(
        "{resource} is time-sliced with failRequestsGreaterThanOne: a container may ask for 1 replica, this one asked for {asked}; ask for 1 (more replicas of a shared GPU give no more compute)"
    )]
    TooManyReplicas {
        /// The resource.
        resource: String,
        /// Replicas asked.
        asked: usize,
    },
}

/// What one container gets for `ids`: the CDI devices of the distinct devices behind them, and
/// `NVIDIA_VISIBLE_DEVICES` naming those devices' UUIDs.
pub fn container(
    resource: &Resource,
    ids: &[String],
) -> Result<ContainerAllocateResponse, AllocateError> {
    if resource.one_replica_per_container && ids.len() > 1 {
        return Err(AllocateError::TooManyReplicas {
            resource: resource.name.clone(),
            asked: ids.len(),
        });
    }
    let mut uuids: Vec<&str> = Vec::new();
    for id in ids {
        let device = resource.find(id).ok_or_else(|| AllocateError::Unknown {
            id: id.clone(),
            resource: resource.name.clone(),
        })?;
        if !uuids.contains(&device.uuid.as_str()) {
            uuids.push(&device.uuid);
        }
    }
    Ok(ContainerAllocateResponse {
        envs: [("NVIDIA_VISIBLE_DEVICES".to_owned(), uuids.join(","))].into(),
        cdi_devices: uuids
            .iter()
            .map(|u| CdiDevice { name: cdi_name(u) })
            .collect(),
        ..ContainerAllocateResponse::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Listed;

    fn resource(devices: &[(&str, &str)], one_replica: bool) -> Resource {
        Resource {
            name: "nvidia.com/gpu".into(),
            devices: devices
                .iter()
                .map(|(id, uuid)| Listed {
                    id: (*id).into(),
                    uuid: (*uuid).into(),
                    gpu_uuid: (*uuid).into(),
                })
                .collect(),
            one_replica_per_container: one_replica,
        }
    }

    fn strings(s: &[&str]) -> Vec<String> {
        s.iter().map(|x| (*x).to_owned()).collect()
    }

    #[test]
    fn replicas_spread_over_gpus() {
        let r = resource(
            &[
                ("G0::0", "G0"),
                ("G0::1", "G0"),
                ("G1::0", "G1"),
                ("G1::1", "G1"),
            ],
            false,
        );
        let all = strings(&["G0::0", "G0::1", "G1::0", "G1::1"]);
        assert_eq!(preferred(&r, &all, &[], 2), ["G0::0", "G1::0"]);
        assert_eq!(
            preferred(&r, &all, &strings(&["G1::1"]), 2),
            ["G1::1", "G0::0"]
        );
        assert_eq!(preferred(&r, &all, &[], 3), ["G0::0", "G1::0", "G0::1"]);
        assert_eq!(preferred(&r, &strings(&["G0::1"]), &[], 2), ["G0::1"]);
    }

    #[test]
    fn a_container_gets_the_cdi_devices_of_its_gpus() {
        let r = resource(&[("GPU-a", "GPU-a"), ("GPU-b", "GPU-b")], false);
        let c = container(&r, &strings(&["GPU-b", "GPU-a"])).unwrap();
        assert_eq!(
            c.cdi_devices
                .iter()
                .map(|d| d.name.as_str())
                .collect::<Vec<_>>(),
            [
                "k8s.device-plugin.nvidia.com/gpu=GPU-b",
                "k8s.device-plugin.nvidia.com/gpu=GPU-a"
            ]
        );
        assert_eq!(c.envs["NVIDIA_VISIBLE_DEVICES"], "GPU-b,GPU-a");
        let err = container(&r, &strings(&["GPU-z"])).unwrap_err().to_string();
        assert!(
            err.contains("GPU-z is not a nvidia.com/gpu device"),
            "{err}"
        );
    }

    #[test]
    fn replicas_of_one_gpu_inject_it_once_or_are_refused() {
        let r = resource(&[("G0::0", "G0"), ("G0::1", "G0")], false);
        let c = container(&r, &strings(&["G0::0", "G0::1"])).unwrap();
        assert_eq!(c.cdi_devices.len(), 1);
        let strict = resource(&[("G0::0", "G0"), ("G0::1", "G0")], true);
        let err = container(&strict, &strings(&["G0::0", "G0::1"])).unwrap_err();
        assert!(matches!(
            err,
            AllocateError::TooManyReplicas { asked: 2, .. }
        ));
    }
}
