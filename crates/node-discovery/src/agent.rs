//! The agent's life: follow its own Node's metadata (a metadata-only watch of one object), scan
//! the node at start and every interval, and patch the labels when what the node says and what
//! was found differ. Steady state is the watch alone: no write when nothing changed.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch as KubePatch, PatchParams};
use kube::core::{ObjectMeta, PartialObjectMeta};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use service::http::Health;
use service::shutdown::Shutdown;

use crate::plan;
use crate::scan::{Scan, Scanner};

/// The agent's metrics.
#[derive(Debug, Clone, Default)]
pub struct Metrics {
    scans: Counter,
    scan_problems: Counter,
    writes: Counter,
    write_errors: Counter,
    gpus: Gauge,
}

impl Metrics {
    /// Registers the metrics in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("gpu_node_discovery");
        r.register(
            "scans",
            "Scans of the node's PCI bus and driver",
            self.scans.clone(),
        );
        r.register(
            "scan_problems",
            "Scans that met an unreadable PCI function or an NVML failure",
            self.scan_problems.clone(),
        );
        r.register(
            "label_writes",
            "Patches of the node's labels",
            self.writes.clone(),
        );
        r.register(
            "label_write_errors",
            "Patches of the node's labels the API refused or failed",
            self.write_errors.clone(),
        );
        r.register(
            "gpus",
            "NVIDIA GPUs on the node's PCI bus",
            self.gpus.clone(),
        );
    }
}

/// The agent of one node.
#[derive(Debug)]
pub struct Agent {
    /// Its node.
    pub node: String,
    /// How it looks at the node.
    pub scanner: Scanner,
    /// Time between scans.
    pub interval: Duration,
    /// Its metrics.
    pub metrics: Metrics,
}

impl Agent {
    /// Runs until `shutdown`.
    pub async fn run(mut self, client: kube::Client, health: Health, shutdown: Shutdown) {
        let metadata: Api<PartialObjectMeta<Node>> = Api::all(client.clone());
        let nodes: Api<Node> = Api::all(client);
        let config = watcher::Config::default().fields(&format!("metadata.name={}", self.node));
        let mut watch = std::pin::pin!(watcher::watcher(metadata, config).default_backoff());
        let mut ticks = tokio::time::interval(self.interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut node: Option<ObjectMeta> = None;
        let mut scan: Option<Scan> = None;
        let stop = shutdown.wait();
        tokio::pin!(stop);
        loop {
            tokio::select! {
                () = &mut stop => break,
                _ = ticks.tick() => {
                    scan = Some(self.scan().await);
                }
                event = watch.next() => match event {
                    Some(Ok(Event::Apply(meta) | Event::InitApply(meta))) => node = Some(meta.metadata),
                    Some(Ok(Event::Delete(_))) => node = None,
                    Some(Ok(Event::Init | Event::InitDone)) => {}
                    Some(Err(e)) => tracing::warn!(node = %self.node, error = %e, "watching the node"),
                    None => break,
                },
            }
            let (Some(meta), Some(found)) = (&node, &scan) else {
                continue;
            };
            match self.apply(&nodes, meta, &found.labels).await {
                Ok(Some(updated)) => node = Some(updated),
                Ok(None) => {}
                Err(e) => {
                    self.metrics.write_errors.inc();
                    tracing::warn!(node = %self.node, error = %e, "labelling the node; retried at the next change or scan");
                    // A conflict means the cached metadata is old: the watch brings the new one.
                    continue;
                }
            }
            health.set_ready(true);
        }
    }

    async fn scan(&mut self) -> Scan {
        let mut scanner = self.scanner.clone();
        let (scanner, found) = tokio::task::spawn_blocking(move || {
            let found = scanner.scan();
            (scanner, found)
        })
        .await
        .expect("the scan does not panic");
        self.scanner = scanner;
        self.metrics.scans.inc();
        self.metrics.gpus.set(found.gpus_on_bus as i64);
        if !found.problems.is_empty() {
            self.metrics.scan_problems.inc();
            tracing::warn!(node = %self.node, problems = ?found.problems, "scan");
        }
        found
    }

    /// Patches the node when `desired` differs from what it says; the node's new metadata when it
    /// wrote.
    async fn apply(
        &self,
        nodes: &Api<Node>,
        meta: &ObjectMeta,
        desired: &BTreeMap<String, String>,
    ) -> Result<Option<ObjectMeta>, kube::Error> {
        let empty = BTreeMap::new();
        let labels = meta.labels.as_ref().unwrap_or(&empty);
        let annotations = meta.annotations.as_ref().unwrap_or(&empty);
        let Some(patch) = plan::plan(labels, annotations, desired) else {
            return Ok(None);
        };
        let mut body = patch.to_merge_patch();
        // Optimistic concurrency: a decision made on old metadata is refused, not applied.
        body["metadata"]["resourceVersion"] = serde_json::json!(meta.resource_version);
        let updated: PartialObjectMeta<Node> = nodes
            .patch_metadata(
                &self.node,
                &PatchParams::default(),
                &KubePatch::Merge(&body),
            )
            .await?;
        self.metrics.writes.inc();
        tracing::info!(node = %self.node, changes = ?patch.labels, "labelled the node");
        Ok(Some(updated.metadata))
    }
}
