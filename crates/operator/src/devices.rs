//! One read of what decides who gets our devices: the DeviceClasses, the GPUClasses, the
//! ResourceSlices of our driver and every ResourceClaim. The pending-pod explainer and the fleet
//! gauges both reason over it (`api::pending`).

use api::GPUClass;
use api::contract::DRIVER_NAME;
use api::pending::World;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::api::ListParams;
use kube::{Api, ResourceExt};

/// The devices published and the claims on them, as read.
#[derive(Clone, Debug, Default)]
pub struct Devices {
    /// Names of the DeviceClasses.
    pub device_classes: Vec<String>,
    /// The GPUClasses (none without the CRD).
    pub gpu_classes: Vec<GPUClass>,
    /// ResourceSlices of `gpu.nvidia.com`.
    pub slices: Vec<ResourceSlice>,
    /// Every ResourceClaim.
    pub claims: Vec<ResourceClaim>,
}

impl Devices {
    /// Reads them; without the GPUClass CRD (or its read failing) only the built-in classes are
    /// ours.
    pub async fn read(client: &kube::Client) -> kube::Result<Self> {
        let all = ListParams::default();
        let device_classes = Api::<DeviceClass>::all(client.clone())
            .list(&all)
            .await?
            .items
            .iter()
            .map(ResourceExt::name_any)
            .collect();
        let gpu_classes = Api::<GPUClass>::all(client.clone())
            .list(&all)
            .await
            .map(|l| l.items)
            .unwrap_or_default();
        let slices = Api::<ResourceSlice>::all(client.clone())
            .list(&ListParams::default().fields(&format!("spec.driver={DRIVER_NAME}")))
            .await?
            .items;
        let claims = Api::<ResourceClaim>::all(client.clone())
            .list(&all)
            .await?
            .items;
        Ok(Self {
            device_classes,
            gpu_classes,
            slices,
            claims,
        })
    }

    /// As the pure explanations take it.
    pub fn world(&self) -> World<'_> {
        World {
            device_classes: &self.device_classes,
            gpu_classes: &self.gpu_classes,
            slices: &self.slices,
            claims: &self.claims,
        }
    }
}
