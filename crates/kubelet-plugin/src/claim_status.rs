//! What a prepared claim holds, written to its `status.devices` (KEP-4817), so that
//! `kubectl describe resourceclaim` shows which GPU a pod got.
//!
//! After a claim is prepared the plugin applies one entry per device it prepared (driver, pool,
//! device and share id; a `Ready` condition; data naming the physical GPU: UUID, product,
//! memory, MIG parent and profile), with server-side apply under a field manager of its own
//! node, and at unprepare applies none, which removes exactly its entries. Writes run in order
//! on one background task: a prepare or unprepare never waits for them and never fails because
//! of them. Where the apiserver refuses (no permission, no such field) the plugin says so once
//! in its log and goes on preparing.

use crate::devices::{DeviceKind, DeviceTable, card_of};
use crate::types::{ClaimRef, DraBackend, PrepareResults, PreparedDevice, UnprepareResults};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

/// The `status.devices` entry of one prepared device; `now` is the condition's transition time
/// (RFC 3339).
pub fn device_status(
    driver: &str,
    device: &PreparedDevice,
    table: &DeviceTable,
    node: &str,
    now: &str,
) -> Value {
    let mut data = serde_json::Map::new();
    if let Some(d) = table.devices.get(card_of(&device.device)) {
        match &device.made_uuid {
            Some(made) => {
                data.insert("uuid".into(), json!(made));
            }
            None if !d.uuid.is_empty() => {
                data.insert("uuid".into(), json!(d.uuid));
            }
            None => {}
        }
        data.insert("productName".into(), json!(d.gpu.product_name));
        match &d.kind {
            DeviceKind::Gpu {
                memory_bytes: Some(bytes),
            } => {
                data.insert("memory".into(), json!(mebibytes(*bytes)));
            }
            DeviceKind::Mig(m) => {
                data.insert("memory".into(), json!(mebibytes(m.memory_bytes)));
                data.insert("parentUUID".into(), json!(d.gpu.gpu_uuid));
                data.insert("migProfile".into(), json!(m.profile));
            }
            DeviceKind::Partition(p) => {
                data.insert("memory".into(), json!(mebibytes(p.profile.memory_bytes)));
                data.insert("parentUUID".into(), json!(d.gpu.gpu_uuid));
                data.insert("migProfile".into(), json!(p.profile.name));
            }
            _ => {}
        }
        data.insert("pciBusID".into(), json!(d.gpu.pci_bus_id));
    }
    let mut entry = json!({
        "driver": driver,
        "pool": device.pool,
        "device": device.device,
        "conditions": [{
            "type": "Ready",
            "status": "True",
            "reason": "Prepared",
            "message": format!("prepared on node {node}"),
            "lastTransitionTime": now,
        }],
        "data": data,
    });
    if let Some(share) = &device.share_id {
        entry["shareID"] = json!(share);
    }
    entry
}

fn mebibytes(bytes: u64) -> String {
    format!("{}Mi", bytes >> 20)
}

/// The apply patch that sets this plugin's entries of `claim`'s `status.devices` to `entries`
/// (none: removes them).
pub fn apply_patch(claim: &ClaimRef, entries: Vec<Value>) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": claim.name, "namespace": claim.namespace, "uid": claim.uid},
        "status": {"devices": entries},
    })
}

/// One write to a claim's status.
#[derive(Debug)]
enum Write {
    Publish(ClaimRef, Vec<PreparedDevice>),
    Withdraw(ClaimRef),
}

/// Writes claims' `status.devices` in the background, in the order asked.
#[derive(Debug, Clone)]
pub struct StatusWriter {
    queue: mpsc::UnboundedSender<Write>,
    /// Claims whose entries were written since start (a repeated prepare writes nothing).
    published: Arc<Mutex<BTreeSet<String>>>,
}

impl StatusWriter {
    /// Starts the writer for `node`'s devices of `driver` in `table`; `prepared` are the UIDs of
    /// the claims already prepared (their entries were written before a restart).
    pub fn spawn(
        client: kube::Client,
        driver: &str,
        node: &str,
        table: Arc<DeviceTable>,
        prepared: impl IntoIterator<Item = String>,
    ) -> Self {
        let (queue, mut writes) = mpsc::unbounded_channel();
        let manager = format!("{driver}/{node}");
        let (driver, node) = (driver.to_owned(), node.to_owned());
        let published = Arc::new(Mutex::new(prepared.into_iter().collect::<BTreeSet<_>>()));
        let written = Arc::clone(&published);
        tokio::spawn(async move {
            let mut refused_once = false;
            while let Some(write) = writes.recv().await {
                let publishing = matches!(write, Write::Publish(..));
                let (claim, entries) = match write {
                    Write::Publish(claim, devices) => {
                        let now = jiff::Timestamp::now().to_string();
                        let entries = devices
                            .iter()
                            .map(|d| device_status(&driver, d, &table, &node, &now))
                            .collect();
                        (claim, entries)
                    }
                    Write::Withdraw(claim) => (claim, Vec::new()),
                };
                let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), &claim.namespace);
                let params = PatchParams::apply(&manager).force();
                let patch = Patch::Apply(apply_patch(&claim, entries));
                match claims.patch_status(&claim.name, &params, &patch).await {
                    Ok(_) => tracing::debug!(%claim, "claim status written"),
                    Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {
                        tracing::debug!(%claim, reason = %s.message, "claim gone or replaced; its status is not written");
                    }
                    Err(e) => {
                        if publishing {
                            // Written again if the kubelet prepares the claim again.
                            written
                                .lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .remove(&claim.uid);
                        }
                        if refused_once {
                            tracing::debug!(%claim, error = %e, "claim status not written");
                        } else {
                            refused_once = true;
                            tracing::warn!(%claim, error = %e, "cannot write claims' status.devices (needs resourceclaims/status patch and, from 1.36, resourceclaims/driver associated-node:patch for this driver); preparing goes on without it, and this is said once");
                        }
                    }
                }
            }
        });
        Self { queue, published }
    }

    fn publish(&self, claim: &ClaimRef, devices: &[PreparedDevice]) {
        let fresh = self
            .published
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(claim.uid.clone());
        if fresh {
            let _ = self
                .queue
                .send(Write::Publish(claim.clone(), devices.to_vec()));
        }
    }

    /// Removes a claim's entries, if they were written (a repeated unprepare writes nothing).
    fn withdraw(&self, claim: &ClaimRef) {
        let written = self
            .published
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&claim.uid);
        if written {
            let _ = self.queue.send(Write::Withdraw(claim.clone()));
        }
    }
}

/// A backend whose prepared claims say what they hold: `inner`'s answers, with each claim it
/// prepared or unprepared handed to the [`StatusWriter`].
#[derive(Debug)]
pub struct WithClaimStatus<B> {
    inner: Arc<B>,
    writer: StatusWriter,
}

impl<B> WithClaimStatus<B> {
    /// Wraps `inner`.
    pub fn new(inner: Arc<B>, writer: StatusWriter) -> Self {
        Self { inner, writer }
    }
}

impl<B: DraBackend> DraBackend for WithClaimStatus<B> {
    async fn prepare(&self, claims: Vec<ClaimRef>) -> PrepareResults {
        let results = self.inner.prepare(claims.clone()).await;
        for claim in &claims {
            if let Some(Ok(devices)) = results.get(&claim.uid) {
                self.writer.publish(claim, devices);
            }
        }
        results
    }

    async fn unprepare(&self, claims: Vec<ClaimRef>) -> UnprepareResults {
        let results = self.inner.unprepare(claims.clone()).await;
        for claim in &claims {
            if let Some(Ok(())) = results.get(&claim.uid) {
                self.writer.withdraw(claim);
            }
        }
        results
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::table;

    fn prepared(device: &str, share: Option<&str>) -> PreparedDevice {
        PreparedDevice {
            request_names: vec!["gpu".into()],
            pool: "node-a".into(),
            device: device.into(),
            cdi_device_ids: vec![],
            admin_access: false,
            share_id: share.map(str::to_owned),
            made_uuid: None,
        }
    }

    #[test]
    fn an_entry_names_the_physical_gpu_and_is_ready() {
        let entry = device_status(
            "gpu.nvidia.com",
            &prepared("gpu-1", None),
            &table(2),
            "node-a",
            "2026-12-06T20:00:00Z",
        );
        insta::assert_yaml_snapshot!(entry);
    }

    #[test]
    fn a_mig_device_names_its_parent_and_profile() {
        let mut table = table(2);
        let mut mig = crate::testutil::gpu(1);
        mig.name = "gpu-1-mig-1g5gb-19-6".into();
        mig.uuid = "MIG-1".into();
        mig.kind = DeviceKind::Mig(crate::testutil::mig("1g.5gb", 4864));
        table.devices.insert(mig.name.clone(), mig);
        let entry = device_status(
            "gpu.nvidia.com",
            &prepared("gpu-1-mig-1g5gb-19-6", None),
            &table,
            "node-a",
            "2026-12-06T20:00:00Z",
        );
        let data = &entry["data"];
        assert_eq!(
            (
                &data["uuid"],
                &data["parentUUID"],
                &data["migProfile"],
                &data["memory"]
            ),
            (
                &json!("MIG-1"),
                &json!("GPU-1"),
                &json!("1g.5gb"),
                &json!("4864Mi")
            )
        );
    }

    #[test]
    fn a_partition_made_at_prepare_shows_the_uuid_it_was_made_with() {
        let mut table = table(2);
        let mut partition = crate::testutil::gpu(1);
        partition.name = "gpu-1-mig-1g10gb-19-0".into();
        partition.uuid = String::new();
        partition.kind = DeviceKind::Partition(crate::devices::Partition {
            profile: gpu_discovery::MigProfile {
                index: 0,
                id: 19,
                name: "1g.10gb".into(),
                slices: 1,
                instances: 7,
                memory_bytes: 9984 << 20,
                multiprocessors: 16,
                copy_engines: 1,
                decoders: 1,
                encoders: 0,
                jpeg_engines: 1,
                ofa_engines: 0,
                placements: Vec::new(),
            },
            placement: gpu_discovery::MigPlacement { start: 0, size: 1 },
        });
        table.devices.insert(partition.name.clone(), partition);
        let mut made = prepared("gpu-1-mig-1g10gb-19-0", None);
        made.made_uuid = Some("MIG-made".into());
        let entry = device_status(
            "gpu.nvidia.com",
            &made,
            &table,
            "node-a",
            "2026-12-07T20:00:00Z",
        );
        let data = &entry["data"];
        assert_eq!(
            (
                &data["uuid"],
                &data["parentUUID"],
                &data["migProfile"],
                &data["memory"]
            ),
            (
                &json!("MIG-made"),
                &json!("GPU-1"),
                &json!("1g.10gb"),
                &json!("9984Mi")
            )
        );
    }

    #[test]
    fn a_share_carries_its_share_id_and_its_gpu() {
        let entry = device_status(
            "gpu.nvidia.com",
            &prepared("gpu-1", Some("0b5c7e39-7c52-4a5e-a9a2-cf4e2c3f5d10")),
            &table(2),
            "node-a",
            "2026-12-06T20:00:00Z",
        );
        assert_eq!(entry["shareID"], "0b5c7e39-7c52-4a5e-a9a2-cf4e2c3f5d10");
        assert_eq!(entry["data"]["uuid"], "GPU-1");
    }

    #[tokio::test]
    async fn writes_are_applies_of_the_nodes_own_entries_in_order_and_once() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&seen);
        let client = service::fake_api::client("default", move |method, path, body| {
            let body: Value = serde_json::from_slice(body).unwrap_or_default();
            log.lock()
                .unwrap()
                .push((method.to_string(), path.to_owned(), body));
            service::fake_api::failure(http::StatusCode::FORBIDDEN, "Forbidden", "no")
        });
        let writer = StatusWriter::spawn(
            client,
            "gpu.nvidia.com",
            "node-a",
            Arc::new(table(2)),
            ["u-before".to_owned()],
        );
        let claim = ClaimRef {
            namespace: "ns".into(),
            uid: "u1".into(),
            name: "c".into(),
        };
        writer.publish(&claim, &[prepared("gpu-0", None)]);
        writer.publish(&claim, &[prepared("gpu-0", None)]);
        writer.withdraw(&claim);
        writer.withdraw(&ClaimRef {
            uid: "u-never".into(),
            ..claim.clone()
        });
        writer.withdraw(&ClaimRef {
            uid: "u-before".into(),
            ..claim.clone()
        });
        let done = || seen.lock().unwrap().len() >= 3;
        for _ in 0..200 {
            if done() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let seen = seen.lock().unwrap();
        assert_eq!(
            seen.len(),
            3,
            "a repeated prepare, and the unprepare of a claim never written, write nothing: {seen:?}"
        );
        let (method, path, body) = &seen[0];
        assert_eq!(method, "PATCH");
        assert_eq!(
            path,
            "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c/status"
        );
        assert_eq!(body["status"]["devices"][0]["data"]["uuid"], "GPU-0");
        assert_eq!(seen[1].2["status"]["devices"], json!([]), "then withdrawn");
        assert_eq!(
            seen[2].2["metadata"]["uid"], "u-before",
            "a claim prepared before a restart"
        );
    }

    #[test]
    fn withdrawing_applies_no_entries_for_the_same_claim() {
        let claim = ClaimRef {
            namespace: "ns".into(),
            uid: "u1".into(),
            name: "c".into(),
        };
        let patch = apply_patch(&claim, Vec::new());
        assert_eq!(patch["status"]["devices"], json!([]));
        assert_eq!(
            patch["metadata"]["uid"], "u1",
            "a replaced claim is not written"
        );
    }
}
