//! The health of the node's devices as the scheduler and the kubelet see it: device taints in the
//! ResourceSlices, and the kubelet's health stream (`v1.DRAResourceHealth` for kubelet 1.37,
//! `v1alpha1.DRAResourceHealth` for 1.34 to 1.36: the same messages, both served).
//!
//! A GPU's health comes from `gpu_discovery::health` and holds for every device of that GPU, its
//! MIG devices included. Taints (keys in `api::contract::taints`):
//!
//! | fault | key | value | effect |
//! |---|---|---|---|
//! | XID 79, or NVML reports the GPU lost | `gpu.nvidia.com/gpu-lost` | `xid-79` / `nvml` | `NoExecute` |
//! | another fatal XID | `gpu.nvidia.com/xid` | the XID | `NoSchedule` |
//! | double-bit ECC | `gpu.nvidia.com/ecc` | `double-bit` | `NoSchedule` |
//! | NVML cannot read the GPU | `gpu.nvidia.com/unreadable` | | `NoSchedule` |
//!
//! A taint goes once the GPU has been read fine for the recovery period (not sticky). When NVML
//! itself fails, nothing is known: no taint is added or removed, and the health stream says
//! `UNKNOWN` for every device.

use crate::devices::DeviceTable;
use crate::devices::Share;
use crate::proto::{health_v1, health_v1alpha1 as pb};
use api::contract::taints;
use api::gpuclass::variants::SharedOffer;
use futures::StreamExt;
use gpu_discovery::health::{Fault, Severity};
use jiff::Timestamp;
use k8s_openapi::api::resource::v1::DeviceTaint;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::collections::BTreeMap;
use std::pin::Pin;
use std::time::Duration;
use tokio::sync::watch;
use tonic::{Request, Response, Status};

/// The `supported_versions` entries that tell the kubelet the health stream is served, newest
/// first: a kubelet takes the first it knows.
pub const SERVICE_NAMES: [&str; 2] = ["v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"];
/// How often the full list is sent again while nothing changes: the kubelet counts a device
/// whose health was not repeated for 30 s (its default timeout) as unknown.
pub const REPEAT: Duration = Duration::from_secs(10);

/// A GPU's fault and when it was first seen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuFault {
    /// What is wrong.
    pub fault: Fault,
    /// When the GPU turned unhealthy (or its fault got worse), to the second.
    pub since: Timestamp,
}

/// What is known of the node's GPUs now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HealthView {
    /// The unhealthy GPUs, by GPU UUID.
    pub faults: BTreeMap<String, GpuFault>,
    /// NVML failed at the last look: no GPU's health is known.
    pub unknown: bool,
}

/// The taint for a GPU's fault.
pub fn taint(fault: &GpuFault) -> DeviceTaint {
    let (key, value) = match &fault.fault {
        Fault::Xid(Some(79)) => (taints::GPU_LOST, Some("xid-79".to_owned())),
        Fault::Lost(_) => (taints::GPU_LOST, Some("nvml".to_owned())),
        Fault::Xid(Some(xid)) => (taints::XID, Some(xid.to_string())),
        Fault::Xid(None) => (taints::XID, Some("unknown".to_owned())),
        Fault::DoubleBitEcc => (taints::ECC, Some("double-bit".to_owned())),
        Fault::Unreadable(_) => (taints::UNREADABLE, None),
    };
    let effect = match fault.fault.severity() {
        Severity::Lost => "NoExecute",
        Severity::Degraded => "NoSchedule",
    };
    DeviceTaint {
        key: key.to_owned(),
        value,
        effect: effect.to_owned(),
        time_added: Some(Time(fault.since)),
    }
}

/// The taints of each tainted device of `table`, by device name.
pub fn device_taints(table: &DeviceTable, view: &HealthView) -> BTreeMap<String, Vec<DeviceTaint>> {
    table
        .devices
        .values()
        .filter_map(|d| {
            let fault = view.faults.get(&d.gpu.gpu_uuid)?;
            Some((d.name.clone(), vec![taint(fault)]))
        })
        .collect()
}

/// The health of every device of `table` and of the `shares` published beside its GPUs, in pool
/// `pool`, as the stream sends it: a share is as healthy as its GPU.
pub fn stream_message(
    table: &DeviceTable,
    shares: &[Share],
    view: &HealthView,
    pool: &str,
    now: Timestamp,
) -> pb::NodeWatchResourcesResponse {
    let entry = |name: &str, gpu_uuid: &str| {
        let (health, message) = match (view.unknown, view.faults.get(gpu_uuid)) {
            (true, _) => (
                pb::HealthStatus::Unknown,
                "NVML is not answering".to_owned(),
            ),
            (false, Some(f)) => (pb::HealthStatus::Unhealthy, format!("GPU {}", f.fault)),
            (false, None) => (pb::HealthStatus::Healthy, String::new()),
        };
        pb::DeviceHealth {
            device: Some(pb::DeviceIdentifier {
                pool_name: pool.to_owned(),
                device_name: name.to_owned(),
            }),
            health: health.into(),
            last_updated_time: now.as_second(),
            health_check_timeout_seconds: 0,
            message,
        }
    };
    let devices = table
        .devices
        .values()
        .map(|d| entry(&d.name, &d.gpu.gpu_uuid));
    let shared = shares.iter().filter_map(|share| {
        let gpu = table.devices.get(&share.gpu)?;
        Some(entry(&share.name, &gpu.gpu.gpu_uuid))
    });
    pb::NodeWatchResourcesResponse {
        devices: devices.chain(shared).collect(),
    }
}

/// Serves the kubelet's health stream from the node's device table and the health view.
#[derive(Debug, Clone)]
pub struct HealthStream {
    table: std::sync::Arc<DeviceTable>,
    pool: String,
    view: watch::Receiver<HealthView>,
    offers: Option<watch::Receiver<Vec<SharedOffer>>>,
    stop: Option<watch::Receiver<bool>>,
}

impl HealthStream {
    /// A stream of `table`'s devices in pool `pool` (the node name), following `view`.
    pub fn new(
        table: std::sync::Arc<DeviceTable>,
        pool: &str,
        view: watch::Receiver<HealthView>,
    ) -> Self {
        Self {
            table,
            pool: pool.to_owned(),
            view,
            offers: None,
            stop: None,
        }
    }

    /// Lists the shares the GPU classes' `offers` publish too (the same offers the slices
    /// follow), so pods holding a share see their GPU's health.
    pub fn with_shares(mut self, offers: watch::Receiver<Vec<SharedOffer>>) -> Self {
        self.offers = Some(offers);
        self
    }

    /// Ends every open stream once `stop` turns true, so that a graceful shutdown of the
    /// server does not wait for the kubelet to hang up.
    pub fn stop_on(mut self, stop: watch::Receiver<bool>) -> Self {
        self.stop = Some(stop);
        self
    }

    /// The gRPC server of the v1alpha1 service.
    pub fn into_server(self) -> pb::dra_resource_health_server::DraResourceHealthServer<Self> {
        pb::dra_resource_health_server::DraResourceHealthServer::new(self)
    }

    /// The gRPC server of the v1 service.
    pub fn into_v1_server(
        self,
    ) -> health_v1::dra_resource_health_server::DraResourceHealthServer<Self> {
        health_v1::dra_resource_health_server::DraResourceHealthServer::new(self)
    }

    /// The stream's messages: the full list at once, then on every change and every [`REPEAT`],
    /// until the view's sender or the plugin stops.
    fn messages(&self) -> impl futures::Stream<Item = pb::NodeWatchResourcesResponse> + use<> {
        futures::stream::unfold((self.clone(), true), |(mut this, first)| async move {
            if !first {
                // A change, or the repeat that keeps the kubelet from timing the devices out;
                // the stream ends with the plugin.
                let mut stop = this.stop.clone();
                let stopping = async move {
                    match stop.as_mut() {
                        Some(stop) => {
                            let _ = stop.wait_for(|s| *s).await;
                        }
                        None => std::future::pending().await,
                    }
                };
                let mut offers = this.offers.clone();
                let offers_changed = async move {
                    if let Some(offers) = offers.as_mut()
                        && offers.changed().await.is_ok()
                    {
                        return;
                    }
                    std::future::pending::<()>().await;
                };
                tokio::select! {
                    changed = tokio::time::timeout(REPEAT, this.view.changed()) => {
                        if let Ok(Err(_)) = changed {
                            return None;
                        }
                    }
                    () = offers_changed => {}
                    () = stopping => return None,
                }
            }
            let shares = match this.offers.as_mut() {
                Some(offers) => crate::sharing::shares(&this.table, &offers.borrow_and_update()),
                None => Vec::new(),
            };
            let message = {
                let view = this.view.borrow_and_update();
                stream_message(&this.table, &shares, &view, &this.pool, Timestamp::now())
            };
            Some((message, (this, false)))
        })
    }
}

type Messages =
    Pin<Box<dyn futures::Stream<Item = Result<pb::NodeWatchResourcesResponse, Status>> + Send>>;

#[tonic::async_trait]
impl pb::dra_resource_health_server::DraResourceHealth for HealthStream {
    type NodeWatchResourcesStream = Messages;

    async fn node_watch_resources(
        &self,
        _: Request<pb::NodeWatchResourcesRequest>,
    ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
        Ok(Response::new(Box::pin(self.messages().map(Ok))))
    }
}

#[tonic::async_trait]
impl health_v1::dra_resource_health_server::DraResourceHealth for HealthStream {
    type NodeWatchResourcesStream = Messages;

    async fn node_watch_resources(
        &self,
        request: Request<pb::NodeWatchResourcesRequest>,
    ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
        pb::dra_resource_health_server::DraResourceHealth::node_watch_resources(self, request).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::table;

    fn fault(fault: Fault) -> GpuFault {
        GpuFault {
            fault,
            since: Timestamp::from_second(1_700_000_000).unwrap(),
        }
    }

    #[test]
    fn a_lost_gpu_evicts_and_other_faults_only_keep_new_work_away() {
        let lost = taint(&fault(Fault::Xid(Some(79))));
        assert_eq!(
            (
                lost.key.as_str(),
                lost.value.as_deref(),
                lost.effect.as_str()
            ),
            ("gpu.nvidia.com/gpu-lost", Some("xid-79"), "NoExecute")
        );
        assert_eq!(
            lost.time_added,
            Some(Time(Timestamp::from_second(1_700_000_000).unwrap()))
        );
        let lost = taint(&fault(Fault::Lost("GPU is lost".into())));
        assert_eq!(lost.effect, "NoExecute");
        let xid = taint(&fault(Fault::Xid(Some(62))));
        assert_eq!(
            (xid.key.as_str(), xid.value.as_deref(), xid.effect.as_str()),
            ("gpu.nvidia.com/xid", Some("62"), "NoSchedule")
        );
        let ecc = taint(&fault(Fault::DoubleBitEcc));
        assert_eq!(
            (ecc.key.as_str(), ecc.effect.as_str()),
            ("gpu.nvidia.com/ecc", "NoSchedule")
        );
        let unreadable = taint(&fault(Fault::Unreadable("timeout".into())));
        assert_eq!(unreadable.value, None);
    }

    #[test]
    fn only_the_devices_of_the_faulty_gpu_are_tainted() {
        let t = table(4);
        let gpu2 = t.devices["gpu-2"].gpu.gpu_uuid.clone();
        let view = HealthView {
            faults: BTreeMap::from([(gpu2, fault(Fault::DoubleBitEcc))]),
            unknown: false,
        };
        let tainted = device_taints(&t, &view);
        assert_eq!(tainted.keys().collect::<Vec<_>>(), ["gpu-2"]);
        assert!(device_taints(&t, &HealthView::default()).is_empty());
    }

    #[test]
    fn the_stream_lists_every_device_healthy_unhealthy_or_unknown() {
        let t = table(2);
        let gpu1 = t.devices["gpu-1"].gpu.gpu_uuid.clone();
        let mut view = HealthView {
            faults: BTreeMap::from([(gpu1, fault(Fault::Xid(Some(79))))]),
            unknown: false,
        };
        let now = Timestamp::from_second(1_800_000_000).unwrap();
        let health = |m: &pb::NodeWatchResourcesResponse| {
            m.devices
                .iter()
                .map(|d| {
                    let id = d.device.as_ref().unwrap();
                    (format!("{}/{}", id.pool_name, id.device_name), d.health())
                })
                .collect::<Vec<_>>()
        };
        // The shares a GPU class publishes beside gpu-1 are in the stream too, as healthy as it.
        let shares = [Share {
            name: "gpu-1-shared-a100s".into(),
            gpu: "gpu-1".into(),
            class: "a100s".into(),
            card_bytes: 40 << 30,
            share_bytes: 20 << 30,
            strategy: api::gpuclass::SharingStrategy::TimeSlicing,
        }];
        let message = stream_message(&t, &shares, &view, "node-a", now);
        assert_eq!(
            health(&message),
            [
                ("node-a/gpu-0".to_owned(), pb::HealthStatus::Healthy),
                ("node-a/gpu-1".to_owned(), pb::HealthStatus::Unhealthy),
                (
                    "node-a/gpu-1-shared-a100s".to_owned(),
                    pb::HealthStatus::Unhealthy
                )
            ]
        );
        assert_eq!(message.devices[1].message, "GPU XID 79");
        assert_eq!(message.devices[2].message, "GPU XID 79");
        assert_eq!(message.devices[0].last_updated_time, 1_800_000_000);
        view.unknown = true;
        let message = stream_message(&t, &shares, &view, "node-a", now);
        assert!(
            message
                .devices
                .iter()
                .all(|d| d.health() == pb::HealthStatus::Unknown)
        );
    }
}
