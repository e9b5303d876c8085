//! What a ResourceClaim asks of this node: the pure checks between the claim the kubelet names
//! and the devices to prepare.

use crate::devices::{DeviceKind, DeviceTable, NodeDevice};
use crate::mps::MpsDaemon;
use crate::opaque::{self, DeviceConfig, Interval, MpsConfig};
use crate::types::ClaimRef;
use api::gpuclass::variants::quantity_bytes;
use k8s_openapi::api::resource::v1::ResourceClaim;
use std::collections::BTreeMap;

/// One allocated device of this driver on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocated {
    /// Base request name (a `<main>/<sub>` subrequest is reported as `<main>`).
    pub request: String,
    /// Device name.
    pub device: String,
    /// Allocated with admin access.
    pub admin_access: bool,
    /// The share of a multi-allocatable device.
    pub share_id: Option<String>,
    /// Bytes of `memory` the allocation consumed (shares).
    pub consumed_memory: Option<u64>,
}

/// Why a claim cannot be prepared here; the message names the cause.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClaimError {
    /// The claim was replaced by another with the same name.
    #[error("UID mismatch: the kubelet asked for {expected}, the API has {found}")]
    UidMismatch {
        /// UID from the kubelet.
        expected: String,
        /// UID in the API.
        found: String,
    },
    /// No allocation.
    #[error("not allocated (status.allocation is empty)")]
    NotAllocated,
    /// Allocated, but nothing from this driver.
    #[error("the allocation has no device from driver {0}")]
    NoDevicesForDriver(String),
    /// Allocated from another node's pool.
    #[error("device {device} is allocated from pool {pool}, but this node serves pool {ours}")]
    OtherPool {
        /// Device name.
        device: String,
        /// Pool of the allocation.
        pool: String,
        /// This node's pool.
        ours: String,
    },
    /// A device the node does not have.
    #[error("device {0} is not one of this node's devices")]
    UnknownDevice(String),
    /// A configuration that cannot be applied.
    #[error("configuration for {device}: {reason}")]
    Config {
        /// Device name.
        device: String,
        /// What was wrong.
        reason: String,
    },
}

/// The devices `claim` has from `driver` in `pool`, after checking the UID and the allocation.
pub fn allocated_devices(
    claim: &ResourceClaim,
    expected: &ClaimRef,
    driver: &str,
    pool: &str,
) -> Result<Vec<Allocated>, ClaimError> {
    let found = claim.metadata.uid.clone().unwrap_or_default();
    if found != expected.uid {
        return Err(ClaimError::UidMismatch {
            expected: expected.uid.clone(),
            found,
        });
    }
    let allocation = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .ok_or(ClaimError::NotAllocated)?;
    let results = allocation
        .devices
        .as_ref()
        .and_then(|d| d.results.as_deref())
        .unwrap_or_default();
    let ours: Vec<_> = results.iter().filter(|r| r.driver == driver).collect();
    if ours.is_empty() {
        return Err(ClaimError::NoDevicesForDriver(driver.to_owned()));
    }
    ours.into_iter()
        .map(|r| {
            if r.pool != pool {
                return Err(ClaimError::OtherPool {
                    device: r.device.clone(),
                    pool: r.pool.clone(),
                    ours: pool.to_owned(),
                });
            }
            Ok(Allocated {
                request: base_request(&r.request).to_owned(),
                device: r.device.clone(),
                admin_access: r.admin_access.unwrap_or(false),
                share_id: r.share_id.clone(),
                consumed_memory: r
                    .consumed_capacity
                    .as_ref()
                    .and_then(|c| c.get("memory"))
                    .and_then(|q| quantity_bytes(&q.0))
                    .and_then(|b| u64::try_from(b).ok()),
            })
        })
        .collect()
}

/// `<main>/<sub>` → `<main>`.
pub fn base_request(request: &str) -> &str {
    request.split_once('/').map_or(request, |(main, _)| main)
}

/// What a claim's allocation comes to on this node.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Resolved {
    /// The devices, in allocation order.
    pub devices: Vec<NodeDevice>,
    /// The time-slice interval the configs ask for, by physical GPU UUID.
    pub time_slices: BTreeMap<String, Interval>,
    /// The MPS control daemon the configs ask for on the claim's devices.
    pub mps: Option<MpsDaemon>,
}

/// Looks up every allocated device (a share becomes its GPU with the share's use) and checks
/// the opaque configs of this driver that apply to it: the right kind for the device, and
/// settings this plugin honours; a share takes its sharing strategy from them, a full GPU or a
/// share the time-slice interval the last of them names.
pub fn resolve(
    claim: &ResourceClaim,
    allocated: &[Allocated],
    table: &DeviceTable,
    driver: &str,
) -> Result<Resolved, ClaimError> {
    let configs = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.config.as_ref())
        .map(Vec::as_slice)
        .unwrap_or_default();
    let mut resolved = Resolved::default();
    // The devices asking for MPS, with the settings each asks for.
    let mut mps: Vec<(&Allocated, String, MpsConfig)> = Vec::new();
    for a in allocated {
        let mut interval = None;
        let mut mps_config = None;
        let mut device = table
            .claimable(&a.device, a.share_id.as_deref(), a.consumed_memory)
            .ok_or_else(|| ClaimError::UnknownDevice(a.device.clone()))?;
        for config in configs {
            let Some(opaque) = config.opaque.as_ref().filter(|o| o.driver == driver) else {
                continue;
            };
            let applies = config.requests.as_ref().is_none_or(|reqs| {
                reqs.is_empty() || reqs.iter().any(|r| base_request(r) == a.request)
            });
            if !applies {
                continue;
            }
            let bytes = serde_json::to_vec(&opaque.parameters.0).unwrap_or_default();
            let bad = |reason: String| ClaimError::Config {
                device: a.device.clone(),
                reason,
            };
            let decoded = opaque::decode(&bytes).map_err(|e| bad(e.to_string()))?;
            let fits = matches!(
                (&decoded, &device.kind),
                (
                    DeviceConfig::Gpu(_),
                    DeviceKind::Gpu { .. } | DeviceKind::Share(_)
                ) | (
                    DeviceConfig::Mig(_),
                    DeviceKind::Mig(_) | DeviceKind::Partition(_)
                )
            );
            if !fits {
                return Err(bad(format!(
                    "{} does not apply to this kind of device",
                    decoded.kind()
                )));
            }
            if let DeviceKind::Share(share) = &mut device.kind {
                decoded
                    .check_supported_on_share()
                    .map_err(|e| bad(e.to_string()))?;
                if let Some(strategy) = decoded.strategy() {
                    share.strategy = strategy;
                }
            } else if a.share_id.is_some() && decoded.strategy() == Some(opaque::Strategy::Mps) {
                return Err(bad(
                    "MPS sharing is not supported on a device offered as consumable shares (as upstream)"
                        .into(),
                ));
            } else if matches!(device.kind, DeviceKind::Partition(_))
                && decoded.strategy() == Some(opaque::Strategy::Mps)
            {
                return Err(bad(
                    "MPS is not supported on a MIG partition made at prepare (dynamic MIG): \
                     time-slice it, or partition the GPU beforehand (static MIG) for MPS"
                        .into(),
                ));
            } else {
                decoded.check_supported().map_err(|e| bad(e.to_string()))?;
                mps_config = decoded.mps().or(mps_config);
            }
            interval = decoded.time_slice().or(interval);
        }
        if let Some(config) = mps_config.filter(|_| !a.admin_access) {
            mps.push((a, device.uuid.clone(), config));
        }
        if let Some(interval) = interval.filter(|_| {
            !a.admin_access && !matches!(device.kind, DeviceKind::Mig(_) | DeviceKind::Partition(_))
        }) {
            let gpu = device.gpu.gpu_uuid.clone();
            if let Some(other) = resolved.time_slices.insert(gpu, interval)
                && other != interval
            {
                return Err(ClaimError::Config {
                    device: a.device.clone(),
                    reason: format!(
                        "time-slicing intervals {other} and {interval} asked for one GPU"
                    ),
                });
            }
        }
        resolved.devices.push(device);
    }
    resolved.mps = mps_daemon(mps)?;
    Ok(resolved)
}

/// The one MPS control daemon of a claim whose devices ask for MPS: they must ask for the
/// same settings, which must make sense for those devices.
fn mps_daemon(
    asking: Vec<(&Allocated, String, MpsConfig)>,
) -> Result<Option<MpsDaemon>, ClaimError> {
    let Some((first, _, config)) = asking.first() else {
        return Ok(None);
    };
    if let Some((other, _, _)) = asking.iter().find(|(_, _, c)| c != config) {
        return Err(ClaimError::Config {
            device: other.device.clone(),
            reason: format!(
                "its mpsConfig differs from {}'s; a claim has one MPS control daemon, so its devices must ask for the same settings",
                first.device
            ),
        });
    }
    let devices = asking.iter().map(|(_, uuid, _)| uuid.clone()).collect();
    MpsDaemon::from_config(config, devices)
        .map(Some)
        .map_err(|reason| ClaimError::Config {
            device: first.device.clone(),
            reason,
        })
}

/// Claims that hold devices of `driver` in `pool` and are reserved for a consumer: what a
/// plugin that lost its checkpoint must consider prepared.
pub fn in_use_on_pool(claims: &[ResourceClaim], driver: &str, pool: &str) -> Vec<ClaimRef> {
    claims
        .iter()
        .filter(|c| {
            let status = c.status.as_ref();
            let reserved = status
                .and_then(|s| s.reserved_for.as_ref())
                .is_some_and(|r| !r.is_empty());
            let ours = status
                .and_then(|s| s.allocation.as_ref())
                .and_then(|a| a.devices.as_ref())
                .and_then(|d| d.results.as_ref())
                .is_some_and(|r| r.iter().any(|r| r.driver == driver && r.pool == pool));
            reserved && ours
        })
        .map(|c| ClaimRef {
            namespace: c.metadata.namespace.clone().unwrap_or_default(),
            uid: c.metadata.uid.clone().unwrap_or_default(),
            name: c.metadata.name.clone().unwrap_or_default(),
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod fixtures {
    use k8s_openapi::api::resource::v1::ResourceClaim;

    /// A claim `ns/name` with `uid`, allocated `(request, driver, pool, device, admin)` results.
    pub fn claim(
        name: &str,
        uid: &str,
        results: &[(&str, &str, &str, &str, bool)],
        config: serde_json::Value,
    ) -> ResourceClaim {
        let results: Vec<_> = results
            .iter()
            .map(|(request, driver, pool, device, admin)| {
                serde_json::json!({"request": request, "driver": driver, "pool": pool,
                                   "device": device, "adminAccess": admin})
            })
            .collect();
        let status = if results.is_empty() {
            serde_json::json!({})
        } else {
            serde_json::json!({"allocation": {"devices": {"results": results, "config": config}}})
        };
        serde_json::from_value(serde_json::json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"namespace": "ns", "name": name, "uid": uid},
            "spec": {"devices": {}},
            "status": status,
        }))
        .expect("a valid claim")
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::claim;
    use super::*;

    fn cref(uid: &str) -> ClaimRef {
        ClaimRef {
            namespace: "ns".into(),
            uid: uid.into(),
            name: "c".into(),
        }
    }

    #[test]
    fn results_of_this_driver_and_pool_are_taken() {
        let c = claim(
            "c",
            "u1",
            &[
                ("gpus/big", "gpu.nvidia.com", "node-a", "gpu-0", false),
                ("nic", "other.example.com", "node-a", "nic-0", false),
                ("mon", "gpu.nvidia.com", "node-a", "gpu-1", true),
            ],
            serde_json::json!([]),
        );
        let got = allocated_devices(&c, &cref("u1"), "gpu.nvidia.com", "node-a").unwrap();
        assert_eq!(
            got,
            [
                Allocated {
                    request: "gpus".into(),
                    device: "gpu-0".into(),
                    admin_access: false,
                    share_id: None,
                    consumed_memory: None,
                },
                Allocated {
                    request: "mon".into(),
                    device: "gpu-1".into(),
                    admin_access: true,
                    share_id: None,
                    consumed_memory: None,
                },
            ]
        );
    }

    #[test]
    fn claims_in_use_on_this_pool_are_found() {
        let mut reserved = claim(
            "mine",
            "u1",
            &[("gpu", "gpu.nvidia.com", "node-a", "gpu-0", false)],
            serde_json::json!([]),
        );
        reserved.status.as_mut().unwrap().reserved_for = Some(vec![
            serde_json::from_value(
                serde_json::json!({"resource": "pods", "name": "p", "uid": "pod-uid"}),
            )
            .unwrap(),
        ]);
        let mut elsewhere = reserved.clone();
        elsewhere.metadata.uid = Some("u2".into());
        elsewhere
            .status
            .as_mut()
            .unwrap()
            .allocation
            .as_mut()
            .unwrap()
            .devices
            .as_mut()
            .unwrap()
            .results
            .as_mut()
            .unwrap()[0]
            .pool = "node-b".into();
        let unreserved = claim(
            "idle",
            "u3",
            &[("gpu", "gpu.nvidia.com", "node-a", "gpu-1", false)],
            serde_json::json!([]),
        );
        let found = in_use_on_pool(
            &[reserved, elsewhere, unreserved],
            "gpu.nvidia.com",
            "node-a",
        );
        assert_eq!(
            found,
            [cref("u1")].map(|mut c| {
                c.name = "mine".into();
                c
            })
        );
    }

    #[test]
    fn each_refusal_names_its_cause() {
        let ok = [("gpu", "gpu.nvidia.com", "node-a", "gpu-0", false)];
        let c = claim("c", "u1", &ok, serde_json::json!([]));
        let check = |c: &ResourceClaim, uid: &str| {
            allocated_devices(c, &cref(uid), "gpu.nvidia.com", "node-a")
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            check(&c, "u2"),
            "UID mismatch: the kubelet asked for u2, the API has u1"
        );
        assert_eq!(
            check(&claim("c", "u1", &[], serde_json::json!([])), "u1"),
            "not allocated (status.allocation is empty)"
        );
        let other_driver = claim(
            "c",
            "u1",
            &[("gpu", "x.example.com", "node-a", "d", false)],
            serde_json::json!([]),
        );
        assert_eq!(
            check(&other_driver, "u1"),
            "the allocation has no device from driver gpu.nvidia.com"
        );
        let other_node = claim(
            "c",
            "u1",
            &[("gpu", "gpu.nvidia.com", "node-b", "gpu-0", false)],
            serde_json::json!([]),
        );
        assert_eq!(
            check(&other_node, "u1"),
            "device gpu-0 is allocated from pool node-b, but this node serves pool node-a"
        );
    }

    fn mps_config(request: &str, percentage: u32) -> serde_json::Value {
        serde_json::json!({"source": "FromClaim", "requests": [request], "opaque": {
            "driver": "gpu.nvidia.com", "parameters": {
                "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
                "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": percentage}}}}})
    }

    #[test]
    fn a_claim_has_one_mps_daemon_for_the_devices_that_ask_for_it() {
        let results = [
            ("a", "gpu.nvidia.com", "node-a", "gpu-1", false),
            ("b", "gpu.nvidia.com", "node-a", "gpu-2", false),
            ("c", "gpu.nvidia.com", "node-a", "gpu-3", false),
        ];
        let resolve_with = |configs: serde_json::Value| {
            let c = claim("c", "u1", &results, configs);
            let allocated = allocated_devices(&c, &cref("u1"), "gpu.nvidia.com", "node-a").unwrap();
            resolve(&c, &allocated, &crate::testutil::table(4), "gpu.nvidia.com")
        };
        let same = resolve_with(serde_json::json!([
            mps_config("a", 30),
            mps_config("b", 30)
        ]));
        let daemon = same.unwrap().mps.unwrap();
        assert_eq!(daemon.devices, ["GPU-1", "GPU-2"], "gpu-3 asked for no MPS");
        assert_eq!(daemon.active_thread_percentage, Some(30));
        let differing = resolve_with(serde_json::json!([
            mps_config("a", 30),
            mps_config("b", 60)
        ]));
        let message = differing.unwrap_err().to_string();
        assert!(
            message.starts_with("configuration for gpu-2: its mpsConfig differs from gpu-1's"),
            "{message}"
        );
        assert_eq!(resolve_with(serde_json::json!([])).unwrap().mps, None);
    }
}
