//! One read of what the views show: every list `kubectl gpu` needs, taken once per command (or
//! per refresh of `migration --watch`). The only module that talks to the API.

use api::contract::{DRIVER_NAME, GPU_CLUSTER_NAME};
use api::physicalgpu::PhysicalGPU;
use api::{GPUClass, GPUCluster};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::api::ListParams;
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;

/// What the cluster holds, as the views read it.
#[derive(Clone, Debug, Default)]
pub struct Cluster {
    /// Every node.
    pub nodes: Vec<Node>,
    /// Every PhysicalGPU (none without the CRD).
    pub gpus: Vec<PhysicalGPU>,
    /// ResourceSlices of our driver.
    pub slices: Vec<ResourceSlice>,
    /// Every ResourceClaim.
    pub claims: Vec<ResourceClaim>,
    /// Pods not yet Succeeded or Failed.
    pub pods: Vec<Pod>,
    /// The `gpu-cluster` GPUCluster, when there is one.
    pub gpu_cluster: Option<GPUCluster>,
    /// Names of the DeviceClasses.
    pub device_classes: Vec<String>,
    /// Every GPUClass (none without the CRD).
    pub gpu_classes: Vec<GPUClass>,
}

impl Cluster {
    /// Reads everything, the lists at once.
    pub async fn read(client: &Client) -> anyhow::Result<Self> {
        let live = ListParams::default().fields("status.phase!=Succeeded,status.phase!=Failed");
        let ours = ListParams::default().fields(&format!("spec.driver={DRIVER_NAME}"));
        let (nodes, gpus, slices, claims, pods, gpu_cluster, device_classes, gpu_classes) = tokio::try_join!(
            list::<Node>(client, ListParams::default()),
            optional_list::<PhysicalGPU>(client),
            list::<ResourceSlice>(client, ours),
            list::<ResourceClaim>(client, ListParams::default()),
            list::<Pod>(client, live),
            async {
                let api: Api<GPUCluster> = Api::all(client.clone());
                // Without the CRD there is no GPUCluster either.
                Ok(api.get_opt(GPU_CLUSTER_NAME).await.ok().flatten())
            },
            list::<DeviceClass>(client, ListParams::default()),
            optional_list::<GPUClass>(client),
        )?;
        Ok(Self {
            nodes,
            gpus,
            slices,
            claims,
            pods,
            gpu_cluster,
            device_classes: device_classes.iter().map(ResourceExt::name_any).collect(),
            gpu_classes,
        })
    }
}

async fn list<K>(client: &Client, params: ListParams) -> anyhow::Result<Vec<K>>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
    K::DynamicType: Default,
{
    read_list(client, params)
        .await
        .map_err(|e| anyhow::anyhow!("listing {}: {e}", K::plural(&Default::default())))
}

async fn read_list<K>(client: &Client, params: ListParams) -> kube::Result<Vec<K>>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
    K::DynamicType: Default,
{
    Api::<K>::all(client.clone())
        .list(&params)
        .await
        .map(|l| l.items)
}

/// A list of one of the product's own kinds: empty where its CRD is not installed.
async fn optional_list<K>(client: &Client) -> anyhow::Result<Vec<K>>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
    K::DynamicType: Default,
{
    match read_list::<K>(client, ListParams::default()).await {
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(vec![]),
        other => {
            other.map_err(|e| anyhow::anyhow!("listing {}: {e}", K::plural(&Default::default())))
        }
    }
}
