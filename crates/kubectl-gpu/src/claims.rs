//! `kubectl gpu claims`: each claim on our GPUs, the pods it serves and what it holds (the GPU's
//! UUID, product, MIG partition, share), from the claim's own status where the plugin wrote it and
//! from the ResourceSlices otherwise.

use api::contract::DRIVER_NAME;
use api::pending::{classes_wanted, selection};
use k8s_openapi::api::resource::v1::{
    AllocatedDeviceStatus, DeviceAttribute, DeviceRequestAllocationResult, ResourceClaim,
};
use kube::ResourceExt;
use serde::Serialize;
use serde_json::Value;

use crate::cluster::Cluster;
use crate::table::{Cell, Tone};

/// One device a claim holds, or a claim still waiting for one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimDevice {
    /// The claim's namespace.
    pub namespace: String,
    /// The claim.
    pub claim: String,
    /// The pods it is reserved for.
    pub pods: Vec<String>,
    /// The node whose device it holds (`None` while unallocated).
    pub node: Option<String>,
    /// The device's name in its ResourceSlice.
    pub device: Option<String>,
    /// The UUID of what the container sees: the GPU, or the MIG device.
    pub uuid: Option<String>,
    /// The physical GPU: its own UUID, or a MIG device's parent's.
    pub gpu_uuid: Option<String>,
    /// The product name.
    pub product: Option<String>,
    /// The MIG profile, for a MIG device.
    pub mig_profile: Option<String>,
    /// The share of the card, for a consumable-capacity allocation.
    pub share: Option<String>,
    /// Whether the claim reaches the device with admin access (operands such as DCGM), taking
    /// nothing from workloads.
    pub admin_access: bool,
}

/// Every device our driver allocated, one entry per claim and device; then the claims that ask
/// our DeviceClasses and wait for an allocation. Admin-access entries only when `admin`.
pub fn claim_devices(cluster: &Cluster, admin: bool) -> Vec<ClaimDevice> {
    let mut out = Vec::new();
    for claim in &cluster.claims {
        let base = ClaimDevice {
            namespace: claim.namespace().unwrap_or_default(),
            claim: claim.name_any(),
            pods: pods_of(claim, cluster),
            node: None,
            device: None,
            uuid: None,
            gpu_uuid: None,
            product: None,
            mig_profile: None,
            share: None,
            admin_access: false,
        };
        let results = allocation_results(claim);
        if results.is_empty() {
            if asks_our_classes(claim, cluster) {
                out.push(base);
            }
            continue;
        }
        for r in results.into_iter().filter(|r| r.driver == DRIVER_NAME) {
            let held = held(cluster, claim, r, base.clone());
            if admin || !held.admin_access {
                out.push(held);
            }
        }
    }
    out.sort_by(|a, b| (&a.namespace, &a.claim).cmp(&(&b.namespace, &b.claim)));
    out
}

/// The pods the claim is reserved for, or (before the scheduler reserved it) the live pods that
/// use it.
fn pods_of(claim: &ResourceClaim, cluster: &Cluster) -> Vec<String> {
    let reserved: Vec<String> = claim
        .status
        .iter()
        .flat_map(|s| s.reserved_for.iter().flatten())
        .filter(|r| r.resource == "pods")
        .map(|r| r.name.clone())
        .collect();
    if !reserved.is_empty() {
        return reserved;
    }
    let (ns, name) = (claim.namespace(), claim.name_any());
    cluster
        .pods
        .iter()
        .filter(|p| p.namespace() == ns && api::pods::claim_names(p).any(|c| c == name))
        .map(ResourceExt::name_any)
        .collect()
}

fn allocation_results(claim: &ResourceClaim) -> Vec<&DeviceRequestAllocationResult> {
    claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .map(|d| d.results.iter().flatten().collect())
        .unwrap_or_default()
}

fn asks_our_classes(claim: &ResourceClaim, cluster: &Cluster) -> bool {
    classes_wanted(claim)
        .keys()
        .any(|class| selection(class, &cluster.gpu_classes).is_some())
}

/// What one allocation result holds: the plugin's entry in the claim's status first, the
/// device's attributes in its ResourceSlice for what that lacks.
fn held(
    cluster: &Cluster,
    claim: &ResourceClaim,
    r: &DeviceRequestAllocationResult,
    base: ClaimDevice,
) -> ClaimDevice {
    let status: Option<&AllocatedDeviceStatus> = claim
        .status
        .iter()
        .flat_map(|s| s.devices.iter().flatten())
        .find(|d| {
            d.driver == r.driver
                && d.pool == r.pool
                && d.device == r.device
                && (r.share_id.is_none() || d.share_id == r.share_id)
        });
    let data = status.and_then(|s| s.data.as_ref()).map(|d| &d.0);
    let field = |name: &str| data.and_then(|d| d.get(name)).and_then(Value::as_str);
    let attribute = |name: &str| {
        slice_attribute(cluster, &r.pool, &r.device, name).and_then(|a| a.string.clone())
    };
    let uuid = field("uuid")
        .map(str::to_owned)
        .or_else(|| attribute("uuid"));
    let parent = field("parentUUID")
        .map(str::to_owned)
        .or_else(|| attribute("parentUUID"));
    ClaimDevice {
        node: Some(r.pool.clone()),
        device: Some(r.device.clone()),
        gpu_uuid: parent.or_else(|| uuid.clone()),
        uuid,
        product: field("productName")
            .map(str::to_owned)
            .or_else(|| attribute("productName")),
        mig_profile: field("migProfile")
            .map(str::to_owned)
            .or_else(|| attribute("profile")),
        share: r.share_id.clone(),
        admin_access: r.admin_access == Some(true),
        ..base
    }
}

/// An attribute of device `device` in pool `pool` of our driver's slices.
fn slice_attribute<'a>(
    cluster: &'a Cluster,
    pool: &str,
    device: &str,
    name: &str,
) -> Option<&'a DeviceAttribute> {
    cluster
        .slices
        .iter()
        .filter(|s| s.spec.pool.name == pool)
        .flat_map(|s| s.spec.devices.iter().flatten())
        .find(|d| d.name == device)
        .and_then(|d| d.attributes.as_ref())
        .and_then(|a| a.get(name))
}

/// The table's headers.
pub const HEADERS: [&str; 8] = [
    "NAMESPACE",
    "CLAIM",
    "POD",
    "NODE",
    "DEVICE",
    "GPU",
    "PRODUCT",
    "PARTITION",
];

/// One table row per entry.
pub fn table_rows(devices: &[ClaimDevice]) -> Vec<Vec<Cell>> {
    devices
        .iter()
        .map(|d| {
            let partition = match (&d.mig_profile, &d.share) {
                (Some(p), _) => format!("mig {p}"),
                (None, Some(s)) => format!("share {s}"),
                (None, None) if d.admin_access => "admin access".into(),
                (None, None) => String::new(),
            };
            let device = match &d.device {
                Some(device) => Cell::plain(device.clone()),
                None => Cell::new("pending", Tone::Warn),
            };
            vec![
                Cell::plain(d.namespace.clone()),
                Cell::plain(d.claim.clone()),
                Cell::plain(d.pods.join(",")),
                Cell::plain(d.node.clone().unwrap_or_default()),
                device,
                Cell::plain(d.uuid.clone().unwrap_or_default()),
                Cell::plain(d.product.clone().unwrap_or_default()),
                Cell::plain(partition),
            ]
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn cluster(claims: Vec<serde_json::Value>) -> Cluster {
        let slice = json!({"metadata": {"name": "n1-gpu"}, "spec": {"driver": DRIVER_NAME, "nodeName": "n1",
            "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {"name": "gpu-0", "attributes": {"uuid": {"string": "GPU-0"}, "productName": {"string": "NVIDIA L4"}, "type": {"string": "gpu"}}},
                {"name": "gpu-1-mig-0", "attributes": {"uuid": {"string": "MIG-1"}, "parentUUID": {"string": "GPU-1"},
                    "productName": {"string": "NVIDIA A100"}, "profile": {"string": "1g.5gb"}, "type": {"string": "mig"}}}]}});
        Cluster {
            slices: vec![serde_json::from_value(slice).unwrap()],
            claims: claims
                .into_iter()
                .map(|c| serde_json::from_value(c).unwrap())
                .collect(),
            ..Cluster::default()
        }
    }

    fn claim(name: &str, class: &str, result: Option<serde_json::Value>) -> serde_json::Value {
        let mut c = json!({"metadata": {"name": name, "namespace": "team"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": class}}]}}});
        if let Some(r) = result {
            c["status"] = json!({"allocation": {"devices": {"results": [r]}},
                "reservedFor": [{"resource": "pods", "name": format!("{name}-pod"), "uid": "u"}]});
        }
        c
    }

    #[test]
    fn a_claim_shows_its_gpu_from_the_slices_and_prefers_its_own_status() {
        let result = |device: &str| json!({"request": "gpu", "driver": DRIVER_NAME, "pool": "n1", "device": device});
        let mut with_status = claim("b", "gpu.nvidia.com", Some(result("gpu-0")));
        with_status["status"]["devices"] = json!([{"driver": DRIVER_NAME, "pool": "n1", "device": "gpu-0",
            "data": {"uuid": "GPU-0", "productName": "NVIDIA L4 (from status)"}}]);
        let mut admin = claim("dcgm", "gpu.nvidia.com", Some(result("gpu-0")));
        admin["status"]["allocation"]["devices"]["results"][0]["adminAccess"] = json!(true);
        let c = cluster(vec![
            claim("a", "mig.nvidia.com", Some(result("gpu-1-mig-0"))),
            with_status,
            claim("c", "gpu.nvidia.com", None),
            claim("other", "example.com", None),
            admin,
        ]);
        let devices = claim_devices(&c, false);
        let names: Vec<&str> = devices.iter().map(|d| d.claim.as_str()).collect();
        assert_eq!(
            names,
            ["a", "b", "c"],
            "admin access and other drivers' claims left out"
        );
        assert_eq!(devices[0].uuid.as_deref(), Some("MIG-1"));
        assert_eq!(devices[0].gpu_uuid.as_deref(), Some("GPU-1"));
        assert_eq!(devices[0].mig_profile.as_deref(), Some("1g.5gb"));
        assert_eq!(devices[0].pods, ["a-pod"]);
        assert_eq!(
            devices[1].product.as_deref(),
            Some("NVIDIA L4 (from status)")
        );
        assert_eq!(devices[2].node, None, "waiting");
        let rows = table_rows(&devices);
        let texts: Vec<Vec<&str>> = rows
            .iter()
            .map(|r| r.iter().map(|c| c.text.as_str()).collect())
            .collect();
        assert_eq!(
            texts[0],
            [
                "team",
                "a",
                "a-pod",
                "n1",
                "gpu-1-mig-0",
                "MIG-1",
                "NVIDIA A100",
                "mig 1g.5gb"
            ]
        );
        assert_eq!(texts[2], ["team", "c", "-", "-", "pending", "-", "-", "-"]);
        assert_eq!(claim_devices(&c, true).len(), 4, "with --admin");
    }
}
