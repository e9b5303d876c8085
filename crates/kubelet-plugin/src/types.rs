//! Plain data shared by the gRPC layer, the prepare core and the checkpoint.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::future::Future;

/// Which DRA call.
#[derive(
    Debug, Clone, Copy, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelValue,
)]
pub enum Operation {
    /// `NodePrepareResources`, per claim.
    Prepare,
    /// `NodeUnprepareResources`, per claim.
    Unprepare,
}

/// A claim as the kubelet names it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ClaimRef {
    /// Namespace of the ResourceClaim.
    pub namespace: String,
    /// `metadata.uid` of the ResourceClaim.
    pub uid: String,
    /// Name of the ResourceClaim.
    pub name: String,
}

impl std::fmt::Display for ClaimRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{} (uid {})", self.namespace, self.name, self.uid)
    }
}

/// One device handed to a claim, as answered to the kubelet and kept in the checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreparedDevice {
    /// Requests (base names, no subrequest suffix) this device satisfies.
    pub request_names: Vec<String>,
    /// Pool of the device.
    pub pool: String,
    /// Device name in the pool.
    pub device: String,
    /// Fully qualified CDI device IDs.
    pub cdi_device_ids: Vec<String>,
    /// Allocated with admin access: exempt from the exclusive-use check.
    #[serde(default)]
    pub admin_access: bool,
    /// The share of a device many claims hold, as the allocation names it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share_id: Option<String>,
    /// The UUID of a device made for the claim at prepare (a MIG partition, `MIG-...`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub made_uuid: Option<String>,
}

/// Per-claim answers to a prepare call, keyed by claim UID; `Err` carries the message for the
/// kubelet.
pub type PrepareResults = BTreeMap<String, Result<Vec<PreparedDevice>, String>>;
/// Per-claim answers to an unprepare call, keyed by claim UID.
pub type UnprepareResults = BTreeMap<String, Result<(), String>>;

/// What serves the DRA calls behind the gRPC layer.
pub trait DraBackend: Send + Sync + 'static {
    /// Prepares every claim; the answer has one entry per claim UID.
    fn prepare(&self, claims: Vec<ClaimRef>) -> impl Future<Output = PrepareResults> + Send;
    /// Unprepares every claim; the answer has one entry per claim UID.
    fn unprepare(&self, claims: Vec<ClaimRef>) -> impl Future<Output = UnprepareResults> + Send;
}
