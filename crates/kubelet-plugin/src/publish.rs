//! Keeps the node's ResourceSlices in the API equal to [`crate::slices::desired_slices`]:
//! publishes at start, then re-checks on every slice event and periodically, so slices the
//! kubelet wiped (plugin gone for 30 s, kubelet restart) are published again.

use crate::devices::DeviceTable;
use crate::slices::{self, NodeRef};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::watcher;
use kube::{Api, Client};
use std::sync::Arc;
use std::time::Duration;

/// Field manager of the plugin's server-side applies.
pub const FIELD_MANAGER: &str = "gpu-kubelet-plugin";
/// Full re-check period, whatever the watch says.
pub const RESYNC: Duration = Duration::from_secs(60);
/// Wait after a failed reconcile.
pub const RETRY: Duration = Duration::from_secs(5);

/// What one reconcile did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The API already had the desired slices.
    Unchanged,
    /// Slices were written with this pool generation.
    Published(i64),
}

/// Publishes one node's slices.
#[derive(Clone)]
pub struct Publisher {
    client: Client,
    driver: String,
    node: NodeRef,
    table: Arc<DeviceTable>,
    last_generation: i64,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("driver", &self.driver)
            .field("node", &self.node)
            .field("last_generation", &self.last_generation)
            .finish_non_exhaustive()
    }
}

impl Publisher {
    /// A publisher for `node_name`'s slices, reading the Node's UID for the owner reference.
    pub async fn new(
        client: Client,
        driver: &str,
        node_name: &str,
        table: Arc<DeviceTable>,
    ) -> Result<Self, kube::Error> {
        let node: Node = Api::all(client.clone()).get(node_name).await?;
        let node = NodeRef {
            name: node_name.to_owned(),
            uid: node.metadata.uid.unwrap_or_default(),
        };
        Ok(Self {
            client,
            driver: driver.to_owned(),
            node,
            table,
            last_generation: 0,
        })
    }

    fn field_selector(&self) -> String {
        format!(
            "spec.nodeName={},spec.driver={}",
            self.node.name, self.driver
        )
    }

    /// Compares the API with the desired slices and writes what differs.
    pub async fn reconcile(&mut self) -> Result<Outcome, kube::Error> {
        let api: Api<ResourceSlice> = Api::all(self.client.clone());
        let existing = api
            .list(&ListParams::default().fields(&self.field_selector()))
            .await?
            .items;
        let current = existing
            .iter()
            .map(|s| s.spec.pool.generation)
            .max()
            .unwrap_or(self.last_generation);
        let probe = slices::desired_slices(&self.node, &self.driver, &self.table, current);
        if slices::up_to_date(&existing, &probe) {
            self.last_generation = current;
            return Ok(Outcome::Unchanged);
        }
        let generation = slices::next_generation(&existing, self.last_generation);
        let desired = slices::desired_slices(&self.node, &self.driver, &self.table, generation);
        let params = PatchParams::apply(FIELD_MANAGER).force();
        for slice in &desired {
            let name = slice.metadata.name.clone().unwrap_or_default();
            api.patch(&name, &params, &Patch::Apply(slice)).await?;
        }
        let wanted: Vec<_> = desired.iter().map(|s| s.metadata.name.clone()).collect();
        for stale in existing
            .iter()
            .filter(|s| !wanted.contains(&s.metadata.name))
        {
            if let Some(name) = &stale.metadata.name {
                match api.delete(name, &DeleteParams::default()).await {
                    Err(kube::Error::Api(s)) if s.is_not_found() => {}
                    other => {
                        other?;
                    }
                }
            }
        }
        self.last_generation = generation;
        Ok(Outcome::Published(generation))
    }

    /// Reconciles now, then on every event about this node's slices and every [`RESYNC`],
    /// forever; failures are logged and retried after [`RETRY`].
    pub async fn run(mut self) {
        let api: Api<ResourceSlice> = Api::all(self.client.clone());
        let config = watcher::Config::default().fields(&self.field_selector());
        let mut events = watcher(api, config).boxed();
        let mut resync = tokio::time::interval(RESYNC);
        loop {
            match self.reconcile().await {
                Ok(Outcome::Published(generation)) => {
                    tracing::info!(node = %self.node.name, generation, "published ResourceSlices");
                }
                Ok(Outcome::Unchanged) => {}
                Err(e) => {
                    tracing::warn!(node = %self.node.name, error = %e, "publishing ResourceSlices failed; retrying");
                    tokio::time::sleep(RETRY).await;
                    continue;
                }
            }
            tokio::select! {
                event = events.next() => {
                    match event {
                        Some(Ok(_)) => {}
                        Some(Err(e)) => {
                            tracing::debug!(error = %e, "ResourceSlice watch error");
                            tokio::time::sleep(RETRY).await;
                        }
                        None => tokio::time::sleep(RETRY).await,
                    }
                }
                _ = resync.tick() => {}
            }
        }
    }
}
