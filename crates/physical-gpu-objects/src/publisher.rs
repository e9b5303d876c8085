//! Writes a node's `PhysicalGPU` objects: server-side apply of those that differ from the live
//! ones, deletion of those of GPUs the node no longer has. Nothing is written while nothing
//! changed.

use std::collections::BTreeMap;
use std::time::Duration;

use api::physicalgpu::{NODE_LABEL, PhysicalGPU};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use tokio::sync::watch;

use crate::render::{self, Observed};

/// How long a change waits for more before the objects are written, so a burst of claims
/// prepared at once costs one write per GPU.
const SETTLE: Duration = Duration::from_millis(500);
/// How long a failed write waits before it is tried again.
const RETRY: Duration = Duration::from_secs(5);
/// How often a missing PhysicalGPU CRD is looked for again.
const CRD_MISSING_RETRY: Duration = Duration::from_secs(60);

/// A node's PhysicalGPUs as last read or written.
#[derive(Debug)]
pub struct Publisher {
    api: Api<PhysicalGPU>,
    node: String,
    node_uid: String,
    field_manager: String,
    live: BTreeMap<String, PhysicalGPU>,
    writes: usize,
}

impl Publisher {
    /// Reads the Node and its live PhysicalGPUs. `field_manager` names the writer
    /// (`gpu-kubelet-plugin`, `gpu-device-plugin`).
    pub async fn start(
        client: kube::Client,
        node: &str,
        field_manager: &str,
    ) -> Result<Self, kube::Error> {
        let node_uid = Api::<Node>::all(client.clone())
            .get_metadata(node)
            .await?
            .uid()
            .unwrap_or_default();
        let api: Api<PhysicalGPU> = Api::all(client);
        let selector = format!("{NODE_LABEL}={node}");
        let live = api
            .list(&ListParams::default().labels(&selector))
            .await?
            .items
            .into_iter()
            .map(|o| (o.name_any(), o))
            .collect();
        Ok(Publisher {
            api,
            node: node.to_owned(),
            node_uid,
            field_manager: field_manager.to_owned(),
            live,
            writes: 0,
        })
    }

    /// The objects as last read or written, by name.
    pub fn live(&self) -> &BTreeMap<String, PhysicalGPU> {
        &self.live
    }

    /// API writes made so far.
    pub fn writes(&self) -> usize {
        self.writes
    }

    /// Makes the live objects `desired`: applies those that differ, deletes those not desired.
    pub async fn sync(
        &mut self,
        desired: BTreeMap<String, PhysicalGPU>,
    ) -> Result<(), kube::Error> {
        for (name, want) in &desired {
            if self
                .live
                .get(name)
                .is_some_and(|live| render::up_to_date(live, want))
            {
                continue;
            }
            let mut body = serde_json::to_value(want).expect("a PhysicalGPU serialises");
            body["apiVersion"] = "gpu-operator-rs.dev/v1alpha1".into();
            body["kind"] = "PhysicalGPU".into();
            let written = self
                .api
                .patch(
                    name,
                    &PatchParams::apply(&self.field_manager).force(),
                    &Patch::Apply(&body),
                )
                .await?;
            self.writes += 1;
            tracing::info!(physicalgpu = %name, phase = ?written.status.as_ref().map(|s| &s.phase), "written");
            self.live.insert(name.clone(), written);
        }
        let gone: Vec<String> = self
            .live
            .keys()
            .filter(|name| !desired.contains_key(*name))
            .cloned()
            .collect();
        for name in gone {
            match self.api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(status))
                    if status.code == 404
                        && status
                            .message
                            .contains("could not find the requested resource") => {}
                Err(e) => return Err(e),
            }
            self.writes += 1;
            tracing::info!(physicalgpu = %name, node = %self.node, "deleted: the node no longer has this GPU");
            self.live.remove(&name);
        }
        Ok(())
    }

    /// Keeps the node's PhysicalGPUs following `observed` until its sender is dropped. API
    /// failures are retried; they never stop the caller's plugin.
    pub async fn run(
        client: kube::Client,
        mut observed: watch::Receiver<Observed>,
        field_manager: &str,
    ) {
        let node = observed.borrow().node.clone();
        let mut told = false;
        let mut publisher = loop {
            match Publisher::start(client.clone(), &node, field_manager).await {
                Ok(p) => break p,
                // The CRD is not installed (a chart without it): said once, looked for again
                // every minute.
                Err(kube::Error::Api(status))
                    if status.code == 404
                        && status
                            .message
                            .contains("could not find the requested resource") =>
                {
                    if !told {
                        tracing::info!(%node, "the PhysicalGPU CRD is not installed; this node's PhysicalGPUs are not written until it is");
                        told = true;
                    }
                    tokio::time::sleep(CRD_MISSING_RETRY).await;
                }
                Err(e) => {
                    tracing::warn!(%node, error = %e, "reading this node's PhysicalGPUs failed; retrying");
                    tokio::time::sleep(RETRY).await;
                }
            }
        };
        loop {
            let mut now = observed.borrow_and_update().clone();
            now.node_uid = publisher.node_uid.clone();
            let desired = render::desired(&now, publisher.live(), Timestamp::now());
            if let Err(e) = publisher.sync(desired).await {
                tracing::warn!(%node, error = %e, "writing this node's PhysicalGPUs failed; retrying");
                tokio::time::sleep(RETRY).await;
                continue;
            }
            if observed.changed().await.is_err() {
                return;
            }
            tokio::time::sleep(SETTLE).await;
        }
    }
}

/// How long a stopping plugin waits for its last write (that nothing serves its GPUs).
pub const FINAL_WRITE: Duration = Duration::from_secs(5);

/// A stopping plugin's last word: marks the observation stopped, closes it, and waits (at most
/// [`FINAL_WRITE`]) for `writer` (the [`Publisher::run`] task following it) to write it.
pub async fn stop_serving(observed: watch::Sender<Observed>, writer: tokio::task::JoinHandle<()>) {
    observed.send_modify(|o| o.stopped = true);
    drop(observed);
    if tokio::time::timeout(FINAL_WRITE, writer).await.is_err() {
        tracing::warn!("the PhysicalGPUs could not be marked unserved in time");
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use gpu_discovery::{CudaVersion, Gpu, MigMode};
    use http::{Method, StatusCode};
    use serde_json::{Value, json};
    use service::fake_api::{self, reply};

    use super::*;
    use crate::render::Plane;

    const PREFIX: &str = "/apis/gpu-operator-rs.dev/v1alpha1/physicalgpus";

    /// An API holding PhysicalGPUs, counting the writes it takes.
    #[derive(Clone, Default)]
    struct FakeApi {
        objects: Arc<Mutex<BTreeMap<String, Value>>>,
        writes: Arc<Mutex<usize>>,
    }

    impl FakeApi {
        fn client(&self) -> kube::Client {
            let api = self.clone();
            fake_api::client("default", move |method, path, body| {
                api.answer(method, path, body)
            })
        }

        fn answer(
            &self,
            method: &Method,
            path: &str,
            body: &[u8],
        ) -> http::Response<kube::client::Body> {
            let mut objects = self.objects.lock().unwrap();
            if path == "/api/v1/nodes/gpu-node-0" {
                return reply(
                    StatusCode::OK,
                    &json!({"apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": "gpu-node-0", "uid": "node-uid"}}),
                );
            }
            if path == PREFIX && method == Method::GET {
                let items: Vec<Value> = objects.values().cloned().collect();
                return reply(
                    StatusCode::OK,
                    &json!({"apiVersion": "gpu-operator-rs.dev/v1alpha1",
                    "kind": "PhysicalGPUList", "metadata": {}, "items": items}),
                );
            }
            let name = path
                .trim_start_matches(PREFIX)
                .trim_start_matches('/')
                .to_owned();
            *self.writes.lock().unwrap() += 1;
            match *method {
                Method::PATCH => {
                    let object: Value = serde_json::from_slice(body).unwrap();
                    objects.insert(name, object.clone());
                    reply(StatusCode::OK, &object)
                }
                Method::DELETE => {
                    objects.remove(&name);
                    reply(
                        StatusCode::OK,
                        &json!({"kind": "Status", "status": "Success"}),
                    )
                }
                _ => panic!("unexpected {method} {path}"),
            }
        }
    }

    fn observed(gpus: u32) -> Observed {
        Observed {
            node: "gpu-node-0".into(),
            node_uid: String::new(),
            plane: Plane::DevicePlugin,
            driver_version: "580.95.05".into(),
            cuda_driver_version: "13.0".into(),
            gpus: (0..gpus)
                .map(|i| Gpu {
                    index: i,
                    minor: i,
                    uuid: format!("GPU-{i}"),
                    product_name: "NVIDIA L4".into(),
                    brand: "Nvidia".into(),
                    architecture: "Ada Lovelace".into(),
                    cuda_compute_capability: CudaVersion { major: 8, minor: 9 },
                    memory_bytes: Some(23034 << 20),
                    pci_bus_id: format!("0000:0{i}:00.0"),
                    pcie_root: None,
                    addressing_mode: None,
                    mig_mode: MigMode::NotSupported,
                    mig_devices: Vec::new(),
                    mig_profiles: Vec::new(),
                })
                .collect(),
            faults: BTreeMap::new(),
            health_unknown: false,
            offered: true,
            consumers: BTreeMap::new(),
            stopped: false,
        }
    }

    async fn sync(publisher: &mut Publisher, observed: &Observed) {
        let mut observed = observed.clone();
        observed.node_uid = publisher.node_uid.clone();
        let desired = render::desired(&observed, publisher.live(), Timestamp::now());
        publisher.sync(desired).await.unwrap();
    }

    /// A plugin that stops (its pod deleted in a hand-over) leaves its node's PhysicalGPUs saying
    /// that nothing serves them, not `Ready` until the other plane writes them.
    #[tokio::test]
    async fn a_stopping_plugin_marks_its_gpus_unserved_before_it_goes() {
        let api = FakeApi::default();
        let (tx, rx) = watch::channel(observed(2));
        let writer = tokio::spawn(Publisher::run(api.client(), rx, "test"));
        let ready = |api: &FakeApi| {
            api.objects
                .lock()
                .unwrap()
                .values()
                .map(|o| {
                    o["status"]["conditions"][2]["reason"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned()
                })
                .collect::<Vec<_>>()
        };
        for _ in 0..100 {
            if ready(&api) == ["Offered", "Offered"] {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(ready(&api), ["Offered", "Offered"]);
        stop_serving(tx, writer).await;
        assert_eq!(ready(&api), ["NotServed", "NotServed"]);
    }

    #[tokio::test]
    async fn one_write_per_changed_gpu_none_when_idle_and_gone_gpus_deleted() {
        let api = FakeApi::default();
        let mut publisher = Publisher::start(api.client(), "gpu-node-0", "test")
            .await
            .unwrap();
        sync(&mut publisher, &observed(2)).await;
        assert_eq!(*api.writes.lock().unwrap(), 2, "one write per new GPU");
        sync(&mut publisher, &observed(2)).await;
        assert_eq!(
            *api.writes.lock().unwrap(),
            2,
            "nothing changed, nothing written"
        );

        // A restarted plugin reads the live objects and writes nothing either.
        let mut restarted = Publisher::start(api.client(), "gpu-node-0", "test")
            .await
            .unwrap();
        sync(&mut restarted, &observed(2)).await;
        assert_eq!(*api.writes.lock().unwrap(), 2, "a restart writes nothing");

        let mut sick = observed(2);
        sick.faults
            .insert("GPU-1".into(), "a double-bit ECC error".into());
        sync(&mut restarted, &sick).await;
        assert_eq!(
            *api.writes.lock().unwrap(),
            3,
            "only the sick GPU is written"
        );

        sync(&mut restarted, &observed(1)).await;
        let objects = api.objects.lock().unwrap();
        assert_eq!(
            objects.keys().collect::<Vec<_>>(),
            ["gpu-node-0-0000-00-00-0"]
        );
        assert_eq!(
            objects["gpu-node-0-0000-00-00-0"]["metadata"]["ownerReferences"][0]["uid"],
            "node-uid"
        );
    }
}
